//! OIDC sign-in (authorization code + PKCE S256): the `[oidc]` configuration, discovery and
//! JWKS from the issuer, the pre-login state kept server-side, and the ID-token checks behind
//! `GET /v1/auth/oidc/login` and `GET /v1/auth/oidc/callback` (the binary's routes). Its calls
//! to the provider go through the platform's egress client (`airlock_platform::egress::whole`).
//!
//! Not the `openidconnect` crate: without default features it still adds 74 crates to the
//! lock file, 15 of them second versions of crates already linked (digest, sha2, rand,
//! rand_core, hmac, pkcs8, spki, der, signature, base64, …) plus its own RSA, P-256 and
//! P-384 implementations, chrono and serde_with. The signature checks here use `ring`, which
//! rustls already links (docs/operations/oidc.md).
//!
//! Discovery and the JWKS are fetched when `airlock serve` starts, before the egress lockdown
//! (the token and JWKS endpoints' ports join its allowlist); the JWKS is fetched again when a
//! token names an unknown `kid`, at most once per [`JWKS_REFETCH_EVERY`].

use std::collections::{HashMap, VecDeque};
use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use ::http::{HeaderValue, Method, header};
use base64::Engine;
use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
use parking_lot::{Mutex, RwLock};
use serde::Deserialize;
use serde_json::Value;
use sha2::{Digest, Sha256};

use airlock_platform::egress::whole::{self as http, Call, Dns, Target};

use crate::jwt::{self, Jwk};

/// The route that starts a sign-in (what the UI links to).
pub const LOGIN_PATH: &str = "/v1/auth/oidc/login";
/// The callback route; `redirect_url` must end with it.
pub const CALLBACK_PATH: &str = "/v1/auth/oidc/callback";
/// The pre-login cookie (HttpOnly, SameSite=Lax: it must come back on the IdP's redirect).
pub const PRE_LOGIN_COOKIE: &str = "airlock_oidc";
/// How long a started sign-in may take at the identity provider.
pub const PRE_LOGIN_TTL: Duration = Duration::from_secs(600);
/// Sign-ins in progress kept at most (expired ones are dropped first, then the oldest).
pub const MAX_PENDING: usize = 10_000;
/// Sign-ins in progress kept per client address (an IPv6 client by its /64): a new one
/// forgets that address's oldest, so one client cannot crowd out the others.
pub const MAX_PENDING_PER_CLIENT: usize = 32;
/// Allowed clock difference with the identity provider.
pub const CLOCK_SKEW_SECS: i64 = 60;
/// At most one JWKS re-fetch for an unknown `kid` per this interval.
pub const JWKS_REFETCH_EVERY: Duration = Duration::from_secs(30);

fn d_groups() -> String {
    "groups".into()
}
fn d_user() -> String {
    "sub".into()
}
fn d_display() -> String {
    "single sign-on".into()
}
fn d_scopes() -> Vec<String> {
    vec!["openid".into()]
}
fn d_timeout() -> u64 {
    10
}

/// `[oidc]`: the bank's OpenID Provider (docs/operations/oidc.md).
#[derive(Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OidcConfig {
    /// The issuer URL, exactly as the provider names itself (`https://…`; `http://` only on
    /// loopback).
    pub issuer: String,
    /// Airlock's client id at the provider.
    pub client_id: String,
    /// File holding the client secret (one line; mode 0600 or stricter).
    pub client_secret_file: PathBuf,
    /// The callback URL registered at the provider: `https://airlock.bank/v1/auth/oidc/callback`.
    pub redirect_url: String,
    /// The claim holding the user's groups (a list of strings) [default: groups].
    #[serde(default = "d_groups")]
    pub groups_claim: String,
    /// The claim whose value is the Airlock user id [default: sub].
    #[serde(default = "d_user")]
    pub user_claim: String,
    /// PEM file of the CA(s) that issued the provider's certificate (required for https; the
    /// only trusted roots).
    #[serde(default)]
    pub ca_file: Option<PathBuf>,
    /// What the sign-in button says after "Sign in with" [default: single sign-on].
    #[serde(default = "d_display")]
    pub display_name: String,
    /// Scopes requested; must contain `openid` [default: ["openid"]].
    #[serde(default = "d_scopes")]
    pub scopes: Vec<String>,
    /// Seconds per request to the provider [default: 10].
    #[serde(default = "d_timeout")]
    pub timeout_secs: u64,
}

impl std::fmt::Debug for OidcConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OidcConfig")
            .field("issuer", &self.issuer)
            .field("client_id", &self.client_id)
            .field("redirect_url", &self.redirect_url)
            .field("user_claim", &self.user_claim)
            .field("groups_claim", &self.groups_claim)
            .field("scopes", &self.scopes)
            .finish_non_exhaustive()
    }
}

/// A refused setting (see [`crate::ldap::Invalid`]).
pub type Invalid = (&'static str, String);

fn invalid(field: &'static str, reason: impl Into<String>) -> Invalid {
    (field, reason.into())
}

impl OidcConfig {
    /// Checks the settings and that the secret and CA files are usable.
    pub fn validate(&self) -> Result<(), Invalid> {
        let issuer = Target::parse(&self.issuer).map_err(|e| invalid("oidc.issuer", e))?;
        issuer
            .check_scheme("the issuer")
            .map_err(|e| invalid("oidc.issuer", e))?;
        if self.issuer.contains('?') {
            return Err(invalid("oidc.issuer", "must not have a query"));
        }
        let redirect =
            Target::parse(&self.redirect_url).map_err(|e| invalid("oidc.redirect_url", e))?;
        redirect
            .check_scheme("the redirect URL")
            .map_err(|e| invalid("oidc.redirect_url", e))?;
        if !redirect.path_and_query.ends_with(CALLBACK_PATH) {
            return Err(invalid(
                "oidc.redirect_url",
                format!("must end with {CALLBACK_PATH} (Airlock's callback route)"),
            ));
        }
        match (&self.ca_file, issuer.tls) {
            (Some(ca), _) => {
                crate::ldap::tls_config(ca).map_err(|e| invalid("oidc.ca_file", e))?;
            }
            (None, true) => {
                return Err(invalid(
                    "oidc.ca_file",
                    "is required for an https issuer (the only trusted roots; no system store)",
                ));
            }
            (None, false) => {}
        }
        crate::ldap::read_secret(&self.client_secret_file)
            .map_err(|e| invalid("oidc.client_secret_file", e))?;
        for (field, v) in [
            ("oidc.client_id", &self.client_id),
            ("oidc.user_claim", &self.user_claim),
            ("oidc.groups_claim", &self.groups_claim),
            ("oidc.display_name", &self.display_name),
        ] {
            if v.trim().is_empty() || v.chars().any(char::is_control) || v.len() > 256 {
                return Err(invalid(
                    field,
                    "must be 1 to 256 bytes without control characters",
                ));
            }
        }
        if self.display_name.chars().count() > 64 {
            return Err(invalid(
                "oidc.display_name",
                "must be at most 64 characters",
            ));
        }
        if !self.scopes.iter().any(|s| s == "openid") {
            return Err(invalid("oidc.scopes", "must contain \"openid\""));
        }
        if let Some(s) = self
            .scopes
            .iter()
            .find(|s| s.is_empty() || s.chars().any(|c| c.is_whitespace() || c.is_control()))
        {
            return Err(invalid(
                "oidc.scopes",
                format!("{s:?} is not a scope token (no spaces)"),
            ));
        }
        if self.timeout_secs == 0 || self.timeout_secs > 120 {
            return Err(invalid("oidc.timeout_secs", "must be 1 to 120"));
        }
        Ok(())
    }

    fn tls(&self) -> Result<Option<Arc<rustls::ClientConfig>>, String> {
        self.ca_file
            .as_deref()
            .map(crate::ldap::tls_config)
            .transpose()
    }
}

/// Why a sign-in failed.
#[derive(Debug, thiserror::Error)]
pub enum OidcError {
    /// A check failed (state, code, token): nothing was changed.
    #[error("{0}")]
    Refused(String),
    /// The provider cannot be reached or failed (5xx, bad discovery).
    #[error("the identity provider is unavailable: {0}")]
    Unavailable(String),
}

fn refused(why: impl Into<String>) -> OidcError {
    OidcError::Refused(why.into())
}

/// The provider's metadata Airlock uses.
#[derive(Debug, Clone)]
pub struct Metadata {
    /// `issuer` (equal to the configured one).
    pub issuer: String,
    /// Where the browser is sent.
    pub authorization_endpoint: String,
    /// Where the code is exchanged.
    pub token_endpoint: String,
    /// The signing keys.
    pub jwks_uri: String,
    /// `client_secret_basic` (else `client_secret_post`).
    pub basic_auth: bool,
}

/// One started sign-in (server-side; the browser holds only the cookie naming it).
struct Pending {
    state: String,
    nonce: String,
    verifier: String,
    started: Instant,
}

/// Whom a pre-login entry counts against: the client address, an IPv6 one by its /64 (`None`:
/// the address is unknown, one bucket).
type ClientKey = Option<IpAddr>;

fn client_key(ip: Option<IpAddr>) -> ClientKey {
    ip.map(|ip| match ip {
        IpAddr::V4(_) => ip,
        IpAddr::V6(v6) => {
            let bits = u128::from(v6) & !((1u128 << 64) - 1);
            IpAddr::V6(bits.into())
        }
    })
}

/// The sign-ins in progress, and per client the keys of theirs in start order.
#[derive(Default)]
struct PendingTable {
    entries: HashMap<[u8; 32], Pending>,
    by_client: HashMap<ClientKey, VecDeque<[u8; 32]>>,
}

impl PendingTable {
    /// Makes room for one more entry of `client`: drops that client's used and expired keys
    /// and its oldest entries over [`MAX_PENDING_PER_CLIENT`]; when the table is full, the
    /// expired entries, then the oldest one.
    fn make_room(&mut self, client: ClientKey) {
        let PendingTable { entries, by_client } = self;
        let live = |entries: &HashMap<[u8; 32], Pending>, k: &[u8; 32]| {
            entries
                .get(k)
                .is_some_and(|p| p.started.elapsed() < PRE_LOGIN_TTL)
        };
        let queue = by_client.entry(client).or_default();
        queue.retain(|k| live(entries, k));
        while queue.len() >= MAX_PENDING_PER_CLIENT {
            if let Some(old) = queue.pop_front() {
                entries.remove(&old);
            }
        }
        if entries.len() >= MAX_PENDING {
            entries.retain(|_, p| p.started.elapsed() < PRE_LOGIN_TTL);
            if entries.len() >= MAX_PENDING
                && let Some(oldest) = entries
                    .iter()
                    .min_by_key(|(_, p)| p.started)
                    .map(|(k, _)| *k)
            {
                entries.remove(&oldest);
            }
        }
        if by_client.len() > MAX_PENDING {
            by_client.retain(|_, q| {
                q.retain(|k| live(entries, k));
                !q.is_empty()
            });
        }
    }
}

/// A verified sign-in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SignedIn {
    /// The Airlock user id (`user_claim`).
    pub user_id: String,
    /// The groups (`groups_claim`), sorted and deduplicated.
    pub groups: Vec<String>,
}

/// The query of the provider's redirect to the callback.
#[derive(Debug, Default, Deserialize)]
pub struct CallbackParams {
    /// The authorization code.
    pub code: Option<String>,
    /// The state sent in the authorization request.
    pub state: Option<String>,
    /// RFC 9207: the issuer of the response.
    pub iss: Option<String>,
    /// The provider's refusal (`access_denied`, …).
    pub error: Option<String>,
}

/// The configured provider, discovered.
pub struct Oidc {
    cfg: OidcConfig,
    meta: Metadata,
    tls: Option<Arc<rustls::ClientConfig>>,
    jwks: RwLock<Vec<Jwk>>,
    last_refetch: Mutex<Option<Instant>>,
    pending: Mutex<PendingTable>,
}

impl std::fmt::Debug for Oidc {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Oidc")
            .field("issuer", &self.meta.issuer)
            .finish_non_exhaustive()
    }
}

fn random_b64() -> String {
    let mut b = [0u8; 32];
    ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut b)
        .expect("the system random generator works");
    URL_SAFE_NO_PAD.encode(b)
}

fn now_secs() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64)
}

fn cookie_key(secret: &str) -> [u8; 32] {
    Sha256::digest(secret.as_bytes()).into()
}

/// Whether an on-demand JWKS re-fetch may run now (`last`: the previous one).
pub fn refetch_allowed(last: Option<Instant>, now: Instant) -> bool {
    last.is_none_or(|t| now.duration_since(t) >= JWKS_REFETCH_EVERY)
}

/// Reads `name` from the provider's error body (`{"error": "invalid_grant"}`), sanitised.
fn error_code(body: &[u8]) -> String {
    serde_json::from_slice::<Value>(body)
        .ok()
        .and_then(|v| v.get("error").and_then(Value::as_str).map(str::to_owned))
        .map(|e| {
            e.chars()
                .filter(|c| c.is_ascii_alphanumeric() || *c == '_')
                .take(64)
                .collect::<String>()
        })
        .filter(|e| !e.is_empty())
        .unwrap_or_else(|| "no error code".into())
}

impl Oidc {
    /// Fetches discovery and the JWKS (from the daemon's runtime).
    pub async fn discover(cfg: OidcConfig) -> Result<Self, OidcError> {
        Self::discover_with(cfg, Dns::Tokio).await
    }

    /// [`Oidc::discover`] on the calling thread, starting no thread (a current-thread runtime
    /// and inline name resolution): for `airlock serve` before its egress lockdown.
    pub fn discover_blocking(cfg: OidcConfig) -> Result<Self, OidcError> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_io()
            .enable_time()
            .build()
            .map_err(|e| OidcError::Unavailable(format!("a runtime for discovery: {e}")))?;
        rt.block_on(Self::discover_with(cfg, Dns::Inline))
    }

    async fn discover_with(cfg: OidcConfig, dns: Dns) -> Result<Self, OidcError> {
        let tls = cfg.tls().map_err(OidcError::Unavailable)?;
        let url = format!(
            "{}/.well-known/openid-configuration",
            cfg.issuer.trim_end_matches('/')
        );
        let timeout = Duration::from_secs(cfg.timeout_secs);
        let body = get_json(&url, tls.as_ref(), timeout, dns).await?;
        let meta = metadata(&cfg, &body)?;
        let jwks = get_jwks(&meta.jwks_uri, tls.as_ref(), timeout, dns).await?;
        tracing::info!(
            issuer = %meta.issuer,
            keys = jwks.len(),
            "OIDC provider discovered"
        );
        Ok(Oidc {
            cfg,
            meta,
            tls,
            jwks: RwLock::new(jwks),
            last_refetch: Mutex::new(None),
            pending: Mutex::new(PendingTable::default()),
        })
    }

    /// What the UI's button names (`[oidc] display_name`).
    pub fn display_name(&self) -> &str {
        &self.cfg.display_name
    }

    /// The route the UI links to.
    pub fn login_url(&self) -> &'static str {
        LOGIN_PATH
    }

    /// The discovered metadata.
    pub fn metadata(&self) -> &Metadata {
        &self.meta
    }

    /// The `(host, port)` pairs the daemon dials: the issuer, the token and the JWKS endpoint
    /// (the browser alone visits the authorization endpoint).
    pub fn endpoints(&self) -> Vec<(String, u16)> {
        let mut out: Vec<(String, u16)> = [
            &self.cfg.issuer,
            &self.meta.token_endpoint,
            &self.meta.jwks_uri,
        ]
        .into_iter()
        .filter_map(|u| Target::parse(u).ok())
        .map(|t| (t.host, t.port))
        .collect();
        out.sort();
        out.dedup();
        out
    }

    /// Sign-ins in progress (for tests and metrics).
    pub fn pending_len(&self) -> usize {
        self.pending.lock().entries.len()
    }

    /// Starts a sign-in from `client` (its address, when known): the pre-login cookie's secret
    /// and the authorization URL to redirect the browser to (state, nonce and the PKCE challenge
    /// in it; the verifier stays here). Never refused for room: the client's oldest entry
    /// over [`MAX_PENDING_PER_CLIENT`], or the table's oldest over [`MAX_PENDING`], is forgotten.
    pub fn begin(&self, client: Option<IpAddr>) -> Result<(String, String), OidcError> {
        let (secret, state, nonce, verifier) =
            (random_b64(), random_b64(), random_b64(), random_b64());
        let challenge = URL_SAFE_NO_PAD.encode(Sha256::digest(verifier.as_bytes()));
        {
            let client = client_key(client);
            let key = cookie_key(&secret);
            let mut p = self.pending.lock();
            p.make_room(client);
            p.by_client.entry(client).or_default().push_back(key);
            p.entries.insert(
                key,
                Pending {
                    state: state.clone(),
                    nonce: nonce.clone(),
                    verifier,
                    started: Instant::now(),
                },
            );
        }
        let scope = self.cfg.scopes.join(" ");
        let query = http::form(&[
            ("response_type", "code"),
            ("client_id", &self.cfg.client_id),
            ("redirect_uri", &self.cfg.redirect_url),
            ("scope", &scope),
            ("state", &state),
            ("nonce", &nonce),
            ("code_challenge", &challenge),
            ("code_challenge_method", "S256"),
        ]);
        let sep = if self.meta.authorization_endpoint.contains('?') {
            '&'
        } else {
            '?'
        };
        Ok((
            secret,
            format!("{}{sep}{query}", self.meta.authorization_endpoint),
        ))
    }

    /// Completes a sign-in: the pre-login entry named by `cookie` is taken (one use), the
    /// state compared, the code exchanged with the verifier, the ID token verified. Nothing
    /// is stored by this function; the caller creates the session.
    pub async fn finish(
        &self,
        cookie: Option<&str>,
        params: &CallbackParams,
    ) -> Result<SignedIn, OidcError> {
        let pending = cookie
            .and_then(|c| self.pending.lock().entries.remove(&cookie_key(c)))
            .ok_or_else(|| {
                refused("no sign-in in progress in this browser (missing, used or unknown pre-login cookie)")
            })?;
        if pending.started.elapsed() >= PRE_LOGIN_TTL {
            return Err(refused("the sign-in took too long; start again"));
        }
        let state = params.state.as_deref().unwrap_or("");
        if !jwt::constant_eq(state.as_bytes(), pending.state.as_bytes()) {
            return Err(refused("the state does not match this sign-in"));
        }
        if let Some(iss) = &params.iss
            && iss != &self.meta.issuer
        {
            return Err(refused("the response names another issuer (iss)"));
        }
        if let Some(e) = &params.error {
            let code = error_code(serde_json::json!({ "error": e }).to_string().as_bytes());
            return Err(refused(format!(
                "the identity provider refused the sign-in ({code})"
            )));
        }
        let code = params
            .code
            .as_deref()
            .filter(|c| !c.is_empty() && c.len() <= 4096)
            .ok_or_else(|| refused("the callback has no authorization code"))?;
        let id_token = self.exchange(code, &pending.verifier).await?;
        self.verify(&id_token, &pending.nonce).await
    }

    async fn exchange(&self, code: &str, verifier: &str) -> Result<String, OidcError> {
        let secret = crate::ldap::read_secret(&self.cfg.client_secret_file)
            .map_err(|e| OidcError::Unavailable(format!("client secret file: {e}")))?;
        let mut pairs = vec![
            ("grant_type", "authorization_code"),
            ("code", code),
            ("redirect_uri", self.cfg.redirect_url.as_str()),
            ("code_verifier", verifier),
        ];
        let mut headers = Vec::new();
        if self.meta.basic_auth {
            // RFC 6749 §2.3.1: both parts form-encoded before base64.
            let basic = STANDARD.encode(format!(
                "{}:{}",
                http::encode(&self.cfg.client_id),
                http::encode(&secret)
            ));
            headers.push((
                header::AUTHORIZATION,
                HeaderValue::from_str(&format!("Basic {basic}"))
                    .map_err(|e| OidcError::Unavailable(e.to_string()))?,
            ));
        } else {
            pairs.push(("client_id", &self.cfg.client_id));
            pairs.push(("client_secret", &secret));
        }
        let answer = Call {
            method: Method::POST,
            url: &self.meta.token_endpoint,
            headers,
            form: Some(http::form(&pairs)),
            timeout: Duration::from_secs(self.cfg.timeout_secs),
            tls: self.tls.as_ref(),
            dns: Dns::Tokio,
        }
        .send()
        .await
        .map_err(|e| OidcError::Unavailable(format!("token endpoint: {e}")))?;
        if answer.status.is_server_error() {
            return Err(OidcError::Unavailable(format!(
                "token endpoint answered {}",
                answer.status
            )));
        }
        if !answer.status.is_success() {
            return Err(refused(format!(
                "the identity provider refused the code ({})",
                error_code(&answer.body)
            )));
        }
        let v: Value = serde_json::from_slice(&answer.body)
            .map_err(|e| OidcError::Unavailable(format!("token endpoint answer: {e}")))?;
        v.get("id_token")
            .and_then(Value::as_str)
            .map(str::to_owned)
            .ok_or_else(|| refused("the token endpoint returned no ID token"))
    }

    /// Verifies an ID token: signature against the JWKS (re-fetched once for an unknown
    /// `kid`, rate-limited), then the claims, then reads the user id and groups.
    pub async fn verify(&self, token: &str, nonce: &str) -> Result<SignedIn, OidcError> {
        let parsed = jwt::parse(token).map_err(refused)?;
        let mut keys = self.candidates(&parsed);
        if keys.is_empty() && parsed.kid.is_some() {
            self.refetch_jwks().await?;
            keys = self.candidates(&parsed);
        }
        if keys.is_empty() {
            return Err(refused(
                "no key of the issuer's JWKS fits the ID token (unknown kid or algorithm)",
            ));
        }
        if !keys.iter().any(|k| parsed.verify_with(k)) {
            return Err(refused("the ID token's signature does not verify"));
        }
        jwt::check_claims(
            &parsed.claims,
            &jwt::Expect {
                issuer: &self.meta.issuer,
                client_id: &self.cfg.client_id,
                nonce,
                now: now_secs(),
                skew: CLOCK_SKEW_SECS,
            },
        )
        .map_err(refused)?;
        self.identity(&parsed.claims)
    }

    fn candidates(&self, p: &jwt::Parsed) -> Vec<Jwk> {
        self.jwks
            .read()
            .iter()
            .filter(|k| match (&p.kid, &k.kid) {
                (Some(want), Some(have)) => want == have,
                (Some(_), None) => true,
                (None, _) => true,
            })
            .filter(|k| jwt::fits(k, &p.alg))
            .cloned()
            .collect()
    }

    async fn refetch_jwks(&self) -> Result<(), OidcError> {
        {
            let mut last = self.last_refetch.lock();
            let now = Instant::now();
            if !refetch_allowed(*last, now) {
                tracing::warn!("OIDC: unknown kid; JWKS re-fetch rate-limited");
                return Ok(());
            }
            *last = Some(now);
        }
        let keys = get_jwks(
            &self.meta.jwks_uri,
            self.tls.as_ref(),
            Duration::from_secs(self.cfg.timeout_secs),
            Dns::Tokio,
        )
        .await?;
        tracing::info!(
            keys = keys.len(),
            "OIDC: JWKS re-fetched for an unknown kid"
        );
        *self.jwks.write() = keys;
        Ok(())
    }

    fn identity(&self, claims: &serde_json::Map<String, Value>) -> Result<SignedIn, OidcError> {
        let user_id = match claims.get(&self.cfg.user_claim) {
            Some(Value::String(s)) if !s.is_empty() => s.clone(),
            _ => {
                return Err(refused(format!(
                    "the ID token has no string claim {} (oidc.user_claim)",
                    self.cfg.user_claim
                )));
            }
        };
        let mut groups: Vec<String> = match claims.get(&self.cfg.groups_claim) {
            None | Some(Value::Null) => vec![],
            Some(Value::String(g)) => vec![g.clone()],
            Some(Value::Array(a)) => a
                .iter()
                .map(|v| v.as_str().map(str::to_owned))
                .collect::<Option<Vec<_>>>()
                .ok_or_else(|| {
                    refused(format!(
                        "the claim {} (oidc.groups_claim) is not a list of strings",
                        self.cfg.groups_claim
                    ))
                })?,
            Some(_) => {
                return Err(refused(format!(
                    "the claim {} (oidc.groups_claim) is not a list of strings",
                    self.cfg.groups_claim
                )));
            }
        };
        groups.sort();
        groups.dedup();
        Ok(SignedIn { user_id, groups })
    }
}

async fn get_json(
    url: &str,
    tls: Option<&Arc<rustls::ClientConfig>>,
    timeout: Duration,
    dns: Dns,
) -> Result<Value, OidcError> {
    let answer = Call {
        method: Method::GET,
        url,
        headers: vec![],
        form: None,
        timeout,
        tls,
        dns,
    }
    .send()
    .await
    .map_err(|e| OidcError::Unavailable(format!("{url}: {e}")))?;
    if !answer.status.is_success() {
        return Err(OidcError::Unavailable(format!(
            "{url} answered {}",
            answer.status
        )));
    }
    serde_json::from_slice(&answer.body)
        .map_err(|e| OidcError::Unavailable(format!("{url}: not JSON: {e}")))
}

async fn get_jwks(
    url: &str,
    tls: Option<&Arc<rustls::ClientConfig>>,
    timeout: Duration,
    dns: Dns,
) -> Result<Vec<Jwk>, OidcError> {
    let v = get_json(url, tls, timeout, dns).await?;
    jwt::parse_jwks(v.to_string().as_bytes()).map_err(OidcError::Unavailable)
}

/// The discovery document's fields, checked (OpenID Connect Discovery §4.3: its `issuer` is
/// the configured one; every endpoint obeys the https rule; S256 is offered if methods are
/// listed).
fn metadata(cfg: &OidcConfig, doc: &Value) -> Result<Metadata, OidcError> {
    let bad = |m: String| OidcError::Unavailable(format!("discovery: {m}"));
    let field = |name: &str| -> Result<String, OidcError> {
        doc.get(name)
            .and_then(Value::as_str)
            .map(str::to_owned)
            .ok_or_else(|| bad(format!("no {name}")))
    };
    let issuer = field("issuer")?;
    if issuer != cfg.issuer {
        return Err(bad(format!(
            "the provider names itself {issuer:?}, not the configured issuer {:?}",
            cfg.issuer
        )));
    }
    let mut endpoints = Vec::new();
    for name in ["authorization_endpoint", "token_endpoint", "jwks_uri"] {
        let url = field(name)?;
        Target::parse(&url)
            .and_then(|t| t.check_scheme(name))
            .map_err(bad)?;
        endpoints.push(url);
    }
    let list = |name: &str| -> Option<Vec<String>> {
        doc.get(name).and_then(Value::as_array).map(|a| {
            a.iter()
                .filter_map(Value::as_str)
                .map(str::to_owned)
                .collect()
        })
    };
    if let Some(m) = list("code_challenge_methods_supported")
        && !m.iter().any(|m| m == "S256")
    {
        return Err(bad("the provider does not offer PKCE S256".into()));
    }
    if let Some(a) = list("id_token_signing_alg_values_supported")
        && !a.iter().any(|a| jwt::SUPPORTED.contains(&a.as_str()))
    {
        return Err(bad(format!(
            "the provider signs ID tokens with {a:?} only; Airlock accepts {:?}",
            jwt::SUPPORTED
        )));
    }
    // RFC 8414: client_secret_basic when the list is absent.
    let basic_auth = match list("token_endpoint_auth_methods_supported") {
        None => true,
        Some(m) if m.iter().any(|m| m == "client_secret_basic") => true,
        Some(m) if m.iter().any(|m| m == "client_secret_post") => false,
        Some(m) => {
            return Err(bad(format!(
                "the token endpoint offers {m:?}; Airlock uses client_secret_basic or \
                 client_secret_post"
            )));
        }
    };
    let [authorization_endpoint, token_endpoint, jwks_uri] =
        <[String; 3]>::try_from(endpoints).expect("three endpoints");
    Ok(Metadata {
        issuer,
        authorization_endpoint,
        token_endpoint,
        jwks_uri,
        basic_auth,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn cfg(dir: &std::path::Path) -> OidcConfig {
        let secret = dir.join("secret");
        std::fs::write(&secret, "s3cret\n").unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o600)).unwrap();
        OidcConfig {
            issuer: "http://127.0.0.1:9/".into(),
            client_id: "airlock".into(),
            client_secret_file: secret,
            redirect_url: "http://127.0.0.1:8080/v1/auth/oidc/callback".into(),
            groups_claim: d_groups(),
            user_claim: d_user(),
            ca_file: None,
            display_name: "Bank SSO".into(),
            scopes: d_scopes(),
            timeout_secs: 5,
        }
    }

    #[test]
    fn settings_are_validated() {
        let dir = tempfile::tempdir().unwrap();
        let ok = cfg(dir.path());
        ok.validate().unwrap();
        let field = |c: OidcConfig| c.validate().unwrap_err().0;
        assert_eq!(
            field(OidcConfig {
                issuer: "http://idp.bank.internal".into(),
                ..ok.clone()
            }),
            "oidc.issuer"
        );
        assert_eq!(
            field(OidcConfig {
                issuer: "https://idp.bank.internal".into(),
                ..ok.clone()
            }),
            "oidc.ca_file",
            "https needs the CA"
        );
        assert_eq!(
            field(OidcConfig {
                redirect_url: "http://127.0.0.1/other".into(),
                ..ok.clone()
            }),
            "oidc.redirect_url"
        );
        assert_eq!(
            field(OidcConfig {
                scopes: vec!["profile".into()],
                ..ok.clone()
            }),
            "oidc.scopes"
        );
        assert_eq!(
            field(OidcConfig {
                client_id: " ".into(),
                ..ok.clone()
            }),
            "oidc.client_id"
        );
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(
            &ok.client_secret_file,
            std::fs::Permissions::from_mode(0o644),
        )
        .unwrap();
        assert_eq!(field(ok.clone()), "oidc.client_secret_file");
    }

    #[test]
    fn discovery_is_checked() {
        let dir = tempfile::tempdir().unwrap();
        let c = cfg(dir.path());
        let doc = json!({
            "issuer": "http://127.0.0.1:9/",
            "authorization_endpoint": "http://127.0.0.1:9/auth",
            "token_endpoint": "http://127.0.0.1:9/token",
            "jwks_uri": "http://127.0.0.1:9/jwks",
            "code_challenge_methods_supported": ["S256"],
            "token_endpoint_auth_methods_supported": ["client_secret_post"],
        });
        let m = metadata(&c, &doc).unwrap();
        assert!(!m.basic_auth);
        let with = |k: &str, v: Value| {
            let mut d = doc.clone();
            d[k] = v;
            metadata(&c, &d).unwrap_err().to_string()
        };
        assert!(with("issuer", json!("http://127.0.0.1:9")).contains("configured issuer"));
        assert!(with("token_endpoint", json!("http://10.0.0.1/token")).contains("https"));
        assert!(with("code_challenge_methods_supported", json!(["plain"])).contains("S256"));
        assert!(with("id_token_signing_alg_values_supported", json!(["HS256"])).contains("HS256"));
        assert!(
            with(
                "token_endpoint_auth_methods_supported",
                json!(["private_key_jwt"])
            )
            .contains("client_secret_basic")
        );
    }

    #[test]
    fn jwks_refetches_are_rate_limited() {
        let t0 = Instant::now();
        assert!(refetch_allowed(None, t0));
        assert!(!refetch_allowed(Some(t0), t0 + Duration::from_secs(29)));
        assert!(refetch_allowed(Some(t0), t0 + JWKS_REFETCH_EVERY));
    }
}
