//! ID-token verification with `ring` (the crypto provider rustls already links): the JWS
//! compact form, the issuer's JWKS (RSA and EC P-256/P-384 public keys), and the OpenID
//! Connect Core §3.1.3.7 claim checks.
//!
//! Accepted algorithms: RS256, RS384, RS512, PS256, PS384, PS512, ES256, ES384. `none` and
//! every symmetric algorithm (HS256, …) are refused: an HMAC "verified" with the issuer's
//! public key as the secret is the classic algorithm-confusion forgery, and this module never
//! computes an HMAC at all. A key is used only for the algorithm family of its type (and for
//! its own `alg` when the JWKS names one).

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use ring::signature::{self, RsaPublicKeyComponents, UnparsedPublicKey};
use serde::Deserialize;
use serde_json::{Map, Value};

/// A public signing key from the JWKS.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Jwk {
    /// `kid`, when the JWKS names one.
    pub kid: Option<String>,
    /// `alg`, when the JWKS pins one.
    pub alg: Option<String>,
    /// The key.
    pub key: PublicKey,
}

/// The key material.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PublicKey {
    /// RSA: modulus and exponent, big-endian, without leading zeros.
    Rsa {
        /// Modulus.
        n: Vec<u8>,
        /// Public exponent.
        e: Vec<u8>,
    },
    /// EC P-256 or P-384: the uncompressed point `04 || x || y`.
    Ec {
        /// `P-256` or `P-384`.
        curve: &'static str,
        /// The point.
        point: Vec<u8>,
    },
}

fn b64(s: &str) -> Result<Vec<u8>, String> {
    URL_SAFE_NO_PAD
        .decode(s.trim_end_matches('='))
        .map_err(|e| format!("not base64url: {e}"))
}

#[derive(Deserialize)]
struct RawJwk {
    kty: String,
    #[serde(default)]
    kid: Option<String>,
    #[serde(default)]
    alg: Option<String>,
    #[serde(default, rename = "use")]
    use_: Option<String>,
    #[serde(default)]
    n: Option<String>,
    #[serde(default)]
    e: Option<String>,
    #[serde(default)]
    crv: Option<String>,
    #[serde(default)]
    x: Option<String>,
    #[serde(default)]
    y: Option<String>,
}

fn strip_zeros(mut v: Vec<u8>) -> Vec<u8> {
    let lead = v.iter().take_while(|b| **b == 0).count();
    v.drain(..lead.min(v.len().saturating_sub(1)));
    v
}

/// The signing keys of a JWKS document (`{"keys": [...]}`). Keys for encryption
/// (`"use": "enc"`), of other types (`oct`, `OKP`) or malformed are skipped; a document with no
/// usable key is an error.
pub fn parse_jwks(body: &[u8]) -> Result<Vec<Jwk>, String> {
    #[derive(Deserialize)]
    struct Doc {
        keys: Vec<Value>,
    }
    let doc: Doc = serde_json::from_slice(body).map_err(|e| format!("JWKS: {e}"))?;
    let mut out = Vec::new();
    for v in doc.keys {
        let Ok(k) = serde_json::from_value::<RawJwk>(v) else {
            continue;
        };
        if k.use_.as_deref().is_some_and(|u| u != "sig") {
            continue;
        }
        let key = match k.kty.as_str() {
            "RSA" => match (&k.n, &k.e) {
                (Some(n), Some(e)) => match (b64(n), b64(e)) {
                    (Ok(n), Ok(e)) if n.len() >= 256 => PublicKey::Rsa {
                        n: strip_zeros(n),
                        e: strip_zeros(e),
                    },
                    _ => continue,
                },
                _ => continue,
            },
            "EC" => {
                let (curve, len) = match k.crv.as_deref() {
                    Some("P-256") => ("P-256", 32),
                    Some("P-384") => ("P-384", 48),
                    _ => continue,
                };
                match (k.x.as_deref().map(b64), k.y.as_deref().map(b64)) {
                    (Some(Ok(x)), Some(Ok(y))) if x.len() == len && y.len() == len => {
                        let mut point = vec![4u8];
                        point.extend_from_slice(&x);
                        point.extend_from_slice(&y);
                        PublicKey::Ec { curve, point }
                    }
                    _ => continue,
                }
            }
            _ => continue,
        };
        out.push(Jwk {
            kid: k.kid,
            alg: k.alg,
            key,
        });
    }
    if out.is_empty() {
        return Err("the JWKS has no usable signing key (RSA or EC P-256/P-384)".into());
    }
    Ok(out)
}

/// Why a token was refused. The text is for the log and the problem detail (no token
/// contents).
pub type Refusal = &'static str;

/// A token split and decoded, signature not yet checked.
#[derive(Debug)]
pub struct Parsed {
    /// The header's `alg`.
    pub alg: String,
    /// The header's `kid`.
    pub kid: Option<String>,
    /// The claims.
    pub claims: Map<String, Value>,
    signing_input: Vec<u8>,
    signature: Vec<u8>,
}

/// Splits a compact JWS and checks its header: a supported asymmetric algorithm, no `crit`.
pub fn parse(token: &str) -> Result<Parsed, Refusal> {
    let parts: Vec<&str> = token.split('.').collect();
    let [h, p, s] = parts.as_slice() else {
        return Err(if parts.len() == 5 {
            "encrypted ID tokens (JWE) are not supported"
        } else {
            "the ID token is not a compact JWS"
        });
    };
    let header: Map<String, Value> = b64(h)
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .ok_or("the ID token's header is not base64url JSON")?;
    let alg = header
        .get("alg")
        .and_then(Value::as_str)
        .ok_or("the ID token's header has no alg")?
        .to_string();
    if alg.eq_ignore_ascii_case("none") {
        return Err("unsigned ID tokens (alg none) are refused");
    }
    if alg.starts_with("HS") {
        return Err("symmetric ID-token signatures (HS256/384/512) are refused");
    }
    if !SUPPORTED.contains(&alg.as_str()) {
        return Err("the ID token's signature algorithm is not supported");
    }
    if header.contains_key("crit") {
        return Err("the ID token's header has critical extensions (crit)");
    }
    let kid = match header.get("kid") {
        None => None,
        Some(Value::String(k)) => Some(k.clone()),
        Some(_) => return Err("the ID token's kid is not a string"),
    };
    let claims: Map<String, Value> = b64(p)
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .ok_or("the ID token's claims are not base64url JSON")?;
    let signature = b64(s).map_err(|_| "the ID token's signature is not base64url")?;
    Ok(Parsed {
        alg,
        kid,
        claims,
        signing_input: format!("{h}.{p}").into_bytes(),
        signature,
    })
}

/// The algorithms accepted.
pub const SUPPORTED: [&str; 8] = [
    "RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384",
];

/// Whether `key` may verify `alg` (its type and curve fit, and its own `alg` if pinned).
pub fn fits(key: &Jwk, alg: &str) -> bool {
    if key.alg.as_deref().is_some_and(|a| a != alg) {
        return false;
    }
    match &key.key {
        PublicKey::Rsa { .. } => alg.starts_with("RS") || alg.starts_with("PS"),
        PublicKey::Ec { curve, .. } => {
            matches!((alg, *curve), ("ES256", "P-256") | ("ES384", "P-384"))
        }
    }
}

impl Parsed {
    /// Verifies the signature with `key` (which must [`fits`] the algorithm).
    pub fn verify_with(&self, key: &Jwk) -> bool {
        if !fits(key, &self.alg) {
            return false;
        }
        let (msg, sig) = (self.signing_input.as_slice(), self.signature.as_slice());
        match &key.key {
            PublicKey::Rsa { n, e } => {
                let params: &signature::RsaParameters = match self.alg.as_str() {
                    "RS256" => &signature::RSA_PKCS1_2048_8192_SHA256,
                    "RS384" => &signature::RSA_PKCS1_2048_8192_SHA384,
                    "RS512" => &signature::RSA_PKCS1_2048_8192_SHA512,
                    "PS256" => &signature::RSA_PSS_2048_8192_SHA256,
                    "PS384" => &signature::RSA_PSS_2048_8192_SHA384,
                    "PS512" => &signature::RSA_PSS_2048_8192_SHA512,
                    _ => return false,
                };
                RsaPublicKeyComponents { n, e }
                    .verify(params, msg, sig)
                    .is_ok()
            }
            PublicKey::Ec { point, .. } => {
                let alg: &dyn signature::VerificationAlgorithm = match self.alg.as_str() {
                    "ES256" => &signature::ECDSA_P256_SHA256_FIXED,
                    "ES384" => &signature::ECDSA_P384_SHA384_FIXED,
                    _ => return false,
                };
                UnparsedPublicKey::new(alg, point).verify(msg, sig).is_ok()
            }
        }
    }
}

/// What the claims must match.
#[derive(Debug, Clone)]
pub struct Expect<'a> {
    /// The issuer (exactly).
    pub issuer: &'a str,
    /// Our client id (in `aud`; `azp` when present or when `aud` has several entries).
    pub client_id: &'a str,
    /// The nonce sent in the authorization request.
    pub nonce: &'a str,
    /// Now, in seconds since the epoch.
    pub now: i64,
    /// Allowed clock difference, seconds.
    pub skew: i64,
}

fn num(claims: &Map<String, Value>, name: &str) -> Result<Option<i64>, Refusal> {
    match claims.get(name) {
        None => Ok(None),
        Some(v) => v
            .as_i64()
            .or_else(|| v.as_f64().map(|f| f as i64))
            .map(Some)
            .ok_or("a time claim (exp, iat, nbf) is not a number"),
    }
}

/// OpenID Connect Core §3.1.3.7: `iss`, `aud`, `azp`, `exp`, `iat`, `nbf`, `nonce`.
pub fn check_claims(claims: &Map<String, Value>, x: &Expect<'_>) -> Result<(), Refusal> {
    if claims.get("iss").and_then(Value::as_str) != Some(x.issuer) {
        return Err("the ID token's issuer (iss) is not the configured issuer");
    }
    let aud: Vec<&str> = match claims.get("aud") {
        Some(Value::String(a)) => vec![a.as_str()],
        Some(Value::Array(a)) => a.iter().filter_map(Value::as_str).collect(),
        _ => return Err("the ID token has no audience (aud)"),
    };
    if !aud.contains(&x.client_id) {
        return Err("the ID token is for another client (aud does not contain client_id)");
    }
    match claims.get("azp") {
        Some(Value::String(azp)) if azp != x.client_id => {
            return Err("the ID token was issued to another party (azp is not client_id)");
        }
        Some(Value::String(_)) => {}
        None if aud.len() > 1 => {
            return Err("the ID token has several audiences but no authorized party (azp)");
        }
        None => {}
        Some(_) => return Err("the ID token's azp is not a string"),
    }
    let exp = num(claims, "exp")?.ok_or("the ID token has no expiry (exp)")?;
    if x.now >= exp.saturating_add(x.skew) {
        return Err("the ID token has expired");
    }
    let iat = num(claims, "iat")?.ok_or("the ID token has no issue time (iat)")?;
    if iat > x.now.saturating_add(x.skew) {
        return Err("the ID token was issued in the future (iat)");
    }
    if let Some(nbf) = num(claims, "nbf")?
        && nbf > x.now.saturating_add(x.skew)
    {
        return Err("the ID token is not valid yet (nbf)");
    }
    match claims.get("nonce").and_then(Value::as_str) {
        Some(n) if constant_eq(n.as_bytes(), x.nonce.as_bytes()) => Ok(()),
        Some(_) => Err("the ID token's nonce does not match this sign-in"),
        None => Err("the ID token has no nonce"),
    }
}

/// Equality in time independent of where the inputs differ.
pub fn constant_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;
    use ring::rand::SystemRandom;
    use ring::signature::{ECDSA_P256_SHA256_FIXED_SIGNING, EcdsaKeyPair, KeyPair};
    use serde_json::json;

    fn enc(v: &Value) -> String {
        URL_SAFE_NO_PAD.encode(serde_json::to_vec(v).unwrap())
    }

    /// An ES256 key made here (ring cannot make RSA keys; RS256 is proven against the real
    /// provider in the integration tests).
    fn es256() -> (EcdsaKeyPair, Jwk) {
        let rng = SystemRandom::new();
        let pkcs8 = EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, &rng).unwrap();
        let kp = EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, pkcs8.as_ref(), &rng)
            .unwrap();
        let point = kp.public_key().as_ref().to_vec();
        let jwks = json!({"keys": [{"kty": "EC", "crv": "P-256", "kid": "e1",
            "x": URL_SAFE_NO_PAD.encode(&point[1..33]), "y": URL_SAFE_NO_PAD.encode(&point[33..])}]});
        let keys = parse_jwks(jwks.to_string().as_bytes()).unwrap();
        (kp, keys[0].clone())
    }

    fn sign(kp: &EcdsaKeyPair, header: &Value, claims: &Value) -> String {
        let input = format!("{}.{}", enc(header), enc(claims));
        let sig = kp.sign(&SystemRandom::new(), input.as_bytes()).unwrap();
        format!("{input}.{}", URL_SAFE_NO_PAD.encode(sig.as_ref()))
    }

    fn expect() -> Expect<'static> {
        Expect {
            issuer: "https://idp",
            client_id: "airlock",
            nonce: "n1",
            now: 1_000_000,
            skew: 60,
        }
    }

    fn claims() -> Value {
        json!({"iss": "https://idp", "aud": "airlock", "exp": 1_000_300, "iat": 1_000_000,
               "nonce": "n1", "sub": "alice"})
    }

    #[test]
    fn es256_signatures_verify_and_other_keys_or_bytes_do_not() {
        let (kp, jwk) = es256();
        let (_, other) = es256();
        let t = sign(&kp, &json!({"alg": "ES256", "kid": "e1"}), &claims());
        let p = parse(&t).unwrap();
        assert!(p.verify_with(&jwk));
        assert!(!p.verify_with(&other), "another key");
        // The same token claiming ES384 fits no P-256 key.
        let mut q = parse(&t).unwrap();
        q.alg = "ES384".into();
        assert!(!q.verify_with(&jwk));
        // A key pinned to another alg is not used.
        let pinned = Jwk {
            alg: Some("ES384".into()),
            ..jwk.clone()
        };
        assert!(!p.verify_with(&pinned));
        // Changed claims under the old signature.
        let (h, _) = t.split_once('.').unwrap();
        let sig = t.rsplit('.').next().unwrap();
        let mut c = claims();
        c["sub"] = json!("mallory");
        let forged = format!("{h}.{}.{sig}", enc(&c));
        assert!(!parse(&forged).unwrap().verify_with(&jwk));
    }

    #[test]
    fn none_hmac_jwe_and_crit_are_refused_before_any_key() {
        let c = enc(&claims());
        for (header, why) in [
            (json!({"alg": "none"}), "alg none"),
            (json!({"alg": "None"}), "alg none"),
            (json!({"alg": "HS256", "kid": "k1"}), "HS256"),
            (json!({"alg": "EdDSA"}), "not supported"),
            (json!({"alg": "RS256", "crit": ["exp"]}), "crit"),
        ] {
            let err = parse(&format!("{}.{c}.AAAA", enc(&header))).unwrap_err();
            assert!(
                err.contains(why) || err.contains("HS256"),
                "{header}: {err}"
            );
        }
        assert!(parse("a.b.c.d.e").unwrap_err().contains("JWE"));
        assert!(parse("abc").is_err());
    }

    #[test]
    fn claims_are_checked_per_oidc_core() {
        let x = expect();
        assert!(check_claims(claims().as_object().unwrap(), &x).is_ok());
        let bad = |patch: Value| {
            let mut c = claims();
            for (k, v) in patch.as_object().unwrap() {
                if v.is_null() {
                    c.as_object_mut().unwrap().remove(k);
                } else {
                    c[k] = v.clone();
                }
            }
            check_claims(c.as_object().unwrap(), &x).unwrap_err()
        };
        assert!(bad(json!({"iss": "https://evil"})).contains("iss"));
        assert!(bad(json!({"aud": "other"})).contains("aud"));
        assert!(bad(json!({"aud": ["other", "airlock"]})).contains("azp"));
        assert!(bad(json!({"aud": ["other", "airlock"], "azp": "other"})).contains("azp"));
        assert!(bad(json!({"azp": "other"})).contains("azp"));
        assert!(bad(json!({"exp": 999_940})).contains("expired"));
        assert!(bad(json!({"exp": null})).contains("exp"));
        assert!(bad(json!({"iat": 1_000_061})).contains("future"));
        assert!(bad(json!({"nbf": 1_000_100})).contains("nbf"));
        assert!(bad(json!({"nonce": "n2"})).contains("nonce"));
        assert!(bad(json!({"nonce": null})).contains("nonce"));
        // Within the skew.
        let mut c = claims();
        c["exp"] = json!(999_950);
        c["aud"] = json!(["airlock", "other"]);
        c["azp"] = json!("airlock");
        assert!(check_claims(c.as_object().unwrap(), &x).is_ok());
    }

    #[test]
    fn jwks_keep_signing_keys_only() {
        let n = URL_SAFE_NO_PAD.encode([&[0u8][..], &[0xc5; 256][..]].concat());
        let doc = json!({"keys": [
            {"kty": "RSA", "kid": "r1", "n": n, "e": "AQAB"},
            {"kty": "RSA", "kid": "enc", "use": "enc", "n": n, "e": "AQAB"},
            {"kty": "RSA", "kid": "short", "n": "AQAB", "e": "AQAB"},
            {"kty": "oct", "kid": "h", "k": "c2VjcmV0"},
            {"kty": "EC", "crv": "P-521", "x": "AA", "y": "AA"}
        ]});
        let keys = parse_jwks(doc.to_string().as_bytes()).unwrap();
        assert_eq!(keys.len(), 1);
        assert_eq!(keys[0].kid.as_deref(), Some("r1"));
        let PublicKey::Rsa { n, .. } = &keys[0].key else {
            panic!()
        };
        assert_eq!(n.len(), 256, "leading zero stripped");
        assert!(parse_jwks(br#"{"keys": [{"kty": "oct", "k": "x"}]}"#).is_err());
    }
}
