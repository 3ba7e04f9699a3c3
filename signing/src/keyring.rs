//! The keyring: trusted public keys, a signature threshold, revoked key ids and a version.

use std::collections::BTreeSet;
use std::fs;
use std::io::Write;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::envelope::{Purpose, SignatureEnvelope};
use crate::{Error, KeyId, PublicKey, Result};

const KEYRING_FORMAT: &str = "airlock-keyring/v1";

/// A trusted public key.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TrustedKey {
    /// The key's id (must match `public_key`).
    pub key_id: KeyId,
    /// The Ed25519 public key (hex).
    pub public_key: PublicKey,
}

/// The root of trust. Invariants (checked on every load and edit): the format tag is known,
/// `threshold ≥ 1`, each key id matches its key, no key is listed twice, no trusted key is
/// also revoked, and at least `threshold` keys are trusted.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Keyring {
    format: String,
    version: u64,
    threshold: u32,
    keys: Vec<TrustedKey>,
    #[serde(default)]
    revoked: Vec<KeyId>,
}

impl Keyring {
    /// A version-1 keyring trusting `keys` with signature threshold `threshold`.
    pub fn new(threshold: u32, keys: &[PublicKey]) -> Result<Keyring> {
        let ring = Keyring {
            format: KEYRING_FORMAT.into(),
            version: 1,
            threshold,
            keys: keys
                .iter()
                .map(|k| TrustedKey {
                    key_id: k.key_id(),
                    public_key: *k,
                })
                .collect(),
            revoked: Vec::new(),
        };
        ring.validate()?;
        Ok(ring)
    }

    /// The keyring's own version (rotation requires a strictly higher one).
    pub fn version(&self) -> u64 {
        self.version
    }

    /// How many distinct trusted keys must sign.
    pub fn threshold(&self) -> u32 {
        self.threshold
    }

    /// The trusted keys.
    pub fn keys(&self) -> &[TrustedKey] {
        &self.keys
    }

    /// Revoked key ids (never trusted again by this keyring or its successors made by `revoke`).
    pub fn revoked(&self) -> &[KeyId] {
        &self.revoked
    }

    fn validate(&self) -> Result<()> {
        let bad = |reason: String| Error::Malformed {
            what: "keyring",
            reason,
        };
        if self.format != KEYRING_FORMAT {
            return Err(bad(format!("unknown format {:?}", self.format)));
        }
        if self.threshold == 0 {
            return Err(bad("threshold must be at least 1".into()));
        }
        let mut seen = BTreeSet::new();
        for k in &self.keys {
            if k.public_key.key_id() != k.key_id {
                return Err(bad(format!(
                    "key_id {} does not match its public key",
                    k.key_id
                )));
            }
            if !seen.insert(&k.key_id) {
                return Err(bad(format!("key {} listed twice", k.key_id)));
            }
        }
        let revoked: BTreeSet<_> = self.revoked.iter().collect();
        if revoked.len() != self.revoked.len() {
            return Err(bad("a revoked key id is listed twice".into()));
        }
        if let Some(k) = self.keys.iter().find(|k| revoked.contains(&k.key_id)) {
            return Err(bad(format!("key {} is both trusted and revoked", k.key_id)));
        }
        if self.keys.len() < self.threshold as usize {
            return Err(bad(format!(
                "threshold {} exceeds the {} trusted key(s)",
                self.threshold,
                self.keys.len()
            )));
        }
        Ok(())
    }

    /// Parses and validates keyring JSON.
    pub fn from_json(bytes: &[u8]) -> Result<Keyring> {
        let ring: Keyring = serde_json::from_slice(bytes).map_err(|e| Error::Malformed {
            what: "keyring",
            reason: e.to_string(),
        })?;
        ring.validate()?;
        Ok(ring)
    }

    /// Deterministic pretty JSON with a trailing newline.
    pub fn to_json(&self) -> Vec<u8> {
        let mut v = serde_json::to_vec_pretty(self).expect("serialising a keyring");
        v.push(b'\n');
        v
    }

    /// Reads and validates a keyring file.
    pub fn load(path: &Path) -> Result<Keyring> {
        let bytes = fs::read(path).map_err(|e| Error::io(path, e))?;
        Keyring::from_json(&bytes).map_err(|e| Error::invalid(path, e.to_string()))
    }

    /// Writes the keyring to `path` atomically (temp file, fsync, rename, fsync of the directory).
    pub fn save(&self, path: &Path) -> Result<()> {
        write_atomic(path, &self.to_json())
    }

    /// Whether `id` is trusted (listed and not revoked).
    pub fn is_trusted(&self, id: &KeyId) -> bool {
        self.keys.iter().any(|k| &k.key_id == id) && !self.revoked.contains(id)
    }

    /// Adds a trusted key and bumps the version. Refuses a revoked or already trusted key.
    pub fn add_key(&mut self, key: PublicKey) -> Result<()> {
        let id = key.key_id();
        if self.revoked.contains(&id) {
            return Err(Error::Keyring(format!(
                "key {id} is revoked and cannot be trusted again"
            )));
        }
        if self.keys.iter().any(|k| k.key_id == id) {
            return Err(Error::Keyring(format!("key {id} is already trusted")));
        }
        self.keys.push(TrustedKey {
            key_id: id,
            public_key: key,
        });
        self.version += 1;
        self.validate()
    }

    /// Revokes a key (removes it from the trusted set, records its id) and bumps the version.
    /// Refuses when fewer than `threshold` trusted keys would remain.
    pub fn revoke(&mut self, id: &KeyId) -> Result<()> {
        if self.revoked.contains(id) {
            return Err(Error::Keyring(format!("key {id} is already revoked")));
        }
        let mut next = self.clone();
        next.keys.retain(|k| &k.key_id != id);
        next.revoked.push(id.clone());
        next.revoked.sort();
        next.version += 1;
        next.validate()
            .map_err(|e| Error::Keyring(format!("cannot revoke {id}: {e}")))?;
        *self = next;
        Ok(())
    }

    /// Changes the threshold and bumps the version.
    pub fn set_threshold(&mut self, threshold: u32) -> Result<()> {
        let mut next = self.clone();
        next.threshold = threshold;
        next.version += 1;
        next.validate()?;
        *self = next;
        Ok(())
    }

    /// Checks that at least `threshold` distinct trusted, non-revoked keys signed `message` for
    /// `purpose`. Returns the ids of the keys whose signatures verified, sorted.
    ///
    /// Signatures from keys this keyring does not know, or has revoked, are ignored (they never
    /// count). A signature from a trusted key that does not verify is an error, as is the same
    /// key appearing twice.
    pub fn verify(
        &self,
        purpose: Purpose,
        message: &[u8],
        envelope: &SignatureEnvelope,
    ) -> Result<Vec<KeyId>> {
        let mut seen = BTreeSet::new();
        let mut valid = Vec::new();
        let (mut revoked, mut unknown) = (Vec::new(), Vec::new());
        for entry in &envelope.signatures {
            if !seen.insert(entry.key_id.clone()) {
                return Err(Error::DuplicateSignature {
                    key_id: entry.key_id.clone(),
                });
            }
            if self.revoked.contains(&entry.key_id) {
                revoked.push(entry.key_id.clone());
                continue;
            }
            let Some(key) = self.keys.iter().find(|k| k.key_id == entry.key_id) else {
                unknown.push(entry.key_id.clone());
                continue;
            };
            let sig = entry.signature_bytes()?;
            if !key.public_key.verify(purpose, message, &sig) {
                return Err(Error::BadSignature {
                    key_id: entry.key_id.clone(),
                });
            }
            valid.push(entry.key_id.clone());
        }
        if valid.len() < self.threshold as usize {
            return Err(Error::BelowThreshold {
                valid: valid.len(),
                threshold: self.threshold,
                revoked,
                unknown,
            });
        }
        valid.sort();
        Ok(valid)
    }
}

/// Writes `bytes` to `path` via a temp file in the same directory, fsync, rename, fsync(dir).
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tmp = dir.join(format!(".{name}.tmp-{}", std::process::id()));
    let result = (|| {
        let mut f = fs::File::create(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        fs::rename(&tmp, path)?;
        fs::File::open(dir)?.sync_all()
    })();
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result.map_err(|e| Error::io(path, e))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::KeyPair;

    fn pairs(n: u8) -> Vec<KeyPair> {
        (1..=n).map(|i| KeyPair::from_seed([i; 32])).collect()
    }

    fn sign_all(keys: &[&KeyPair], msg: &[u8]) -> SignatureEnvelope {
        SignatureEnvelope::new(
            keys.iter()
                .map(|k| k.sign(Purpose::Manifest, msg))
                .collect(),
        )
    }

    fn ring(keys: &[KeyPair], k: u32) -> Keyring {
        Keyring::new(k, &keys.iter().map(KeyPair::public).collect::<Vec<_>>()).unwrap()
    }

    #[test]
    fn threshold_of_distinct_trusted_keys_is_required() {
        let ks = pairs(3);
        let r = ring(&ks, 2);
        let msg = b"manifest bytes";
        let ok = r
            .verify(Purpose::Manifest, msg, &sign_all(&[&ks[0], &ks[2]], msg))
            .unwrap();
        assert_eq!(ok.len(), 2);
        let err = r
            .verify(Purpose::Manifest, msg, &sign_all(&[&ks[1]], msg))
            .unwrap_err();
        assert!(
            matches!(
                err,
                Error::BelowThreshold {
                    valid: 1,
                    threshold: 2,
                    ..
                }
            ),
            "{err}"
        );
    }

    #[test]
    fn the_same_key_twice_is_refused() {
        let ks = pairs(2);
        let r = ring(&ks, 2);
        let err = r
            .verify(Purpose::Manifest, b"m", &sign_all(&[&ks[0], &ks[0]], b"m"))
            .unwrap_err();
        assert!(matches!(err, Error::DuplicateSignature { .. }), "{err}");
    }

    #[test]
    fn unknown_keys_do_not_count() {
        let ks = pairs(3);
        let r = ring(&ks[..2], 1);
        let err = r
            .verify(Purpose::Manifest, b"m", &sign_all(&[&ks[2]], b"m"))
            .unwrap_err();
        match err {
            Error::BelowThreshold {
                valid: 0, unknown, ..
            } => assert_eq!(unknown, vec![ks[2].key_id()]),
            other => panic!("{other}"),
        }
    }

    #[test]
    fn revoked_keys_do_not_count() {
        let ks = pairs(2);
        let mut r = ring(&ks, 1);
        r.revoke(&ks[0].key_id()).unwrap();
        assert_eq!(r.version(), 2);
        let err = r
            .verify(Purpose::Manifest, b"m", &sign_all(&[&ks[0]], b"m"))
            .unwrap_err();
        match err {
            Error::BelowThreshold {
                valid: 0, revoked, ..
            } => assert_eq!(revoked, vec![ks[0].key_id()]),
            other => panic!("{other}"),
        }
        assert!(err_text(&r, &ks[0]).contains("revoked"));
        // A revoked key can never be trusted again.
        assert!(matches!(r.add_key(ks[0].public()), Err(Error::Keyring(_))));
    }

    fn err_text(r: &Keyring, k: &KeyPair) -> String {
        r.verify(Purpose::Manifest, b"m", &sign_all(&[k], b"m"))
            .unwrap_err()
            .to_string()
    }

    #[test]
    fn a_bad_signature_from_a_trusted_key_is_refused() {
        let ks = pairs(1);
        let r = ring(&ks, 1);
        let env = sign_all(&[&ks[0]], b"original");
        let err = r.verify(Purpose::Manifest, b"tampered", &env).unwrap_err();
        assert!(matches!(err, Error::BadSignature { .. }), "{err}");
    }

    #[test]
    fn revoking_below_threshold_is_refused() {
        let ks = pairs(2);
        let mut r = ring(&ks, 2);
        assert!(matches!(r.revoke(&ks[0].key_id()), Err(Error::Keyring(_))));
        assert_eq!(
            r.version(),
            1,
            "a refused edit leaves the keyring unchanged"
        );
    }

    #[test]
    fn invalid_keyrings_are_refused() {
        let ks = pairs(2);
        assert!(Keyring::new(0, &[ks[0].public()]).is_err());
        assert!(Keyring::new(3, &[ks[0].public(), ks[1].public()]).is_err());
        assert!(Keyring::new(1, &[ks[0].public(), ks[0].public()]).is_err());
        let mut json: serde_json::Value = serde_json::from_slice(&ring(&ks, 1).to_json()).unwrap();
        json["keys"][0]["key_id"] = serde_json::json!(ks[1].key_id().as_str());
        assert!(Keyring::from_json(json.to_string().as_bytes()).is_err());
        json["format"] = serde_json::json!("airlock-keyring/v9");
        assert!(Keyring::from_json(json.to_string().as_bytes()).is_err());
    }

    #[test]
    fn save_and_load_round_trip() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("keys/trusted.json");
        let r = ring(&pairs(2), 1);
        r.save(&path).unwrap();
        assert_eq!(Keyring::load(&path).unwrap(), r);
        assert_eq!(
            fs::read_dir(dir.path().join("keys")).unwrap().count(),
            1,
            "no temp files left"
        );
    }
}
