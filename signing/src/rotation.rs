//! Key rotation: a new keyring, signed by a threshold of the current one.

use std::fs;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::envelope::{Purpose, SignatureEnvelope};
use crate::keyring::write_atomic;
use crate::{Error, KeyPair, Keyring, Result};

const SIGNED_FORMAT: &str = "airlock-signed-keyring/v1";

/// The largest version step one rotation may take. Versions only grow, so a rotation to
/// `u64::MAX` (signed by a compromised threshold, or by mistake) would leave no version for any
/// later rotation: the keyring would be frozen. Edits bump the version by one each, so an
/// honest rotation moves by a handful.
pub const MAX_VERSION_STEP: u64 = 1000;

/// A proposed keyring plus signatures over its exact JSON text, as carried to the appliance.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SignedKeyring {
    format: String,
    /// The exact JSON text of the proposed keyring (the signed bytes).
    keyring: String,
    /// Signatures by keys of the keyring being replaced.
    signatures: SignatureEnvelope,
}

impl SignedKeyring {
    /// Signs `next` with `signers` (keys of the keyring it is meant to replace).
    pub fn sign(next: &Keyring, signers: &[&KeyPair]) -> SignedKeyring {
        let text = String::from_utf8(next.to_json()).expect("keyring JSON is UTF-8");
        let sigs = signers
            .iter()
            .map(|k| k.sign(Purpose::Keyring, text.as_bytes()))
            .collect();
        SignedKeyring {
            format: SIGNED_FORMAT.into(),
            keyring: text,
            signatures: SignatureEnvelope::new(sigs),
        }
    }

    /// Accepts the proposed keyring if a threshold of `current`'s trusted, non-revoked keys
    /// signed it, it is a valid keyring, its version is higher than `current`'s by at most
    /// [`MAX_VERSION_STEP`], and it keeps every revocation of `current` (a revoked key id is
    /// neither trusted again nor dropped from the revoked list).
    pub fn accept(&self, current: &Keyring) -> Result<Keyring> {
        if self.format != SIGNED_FORMAT {
            return Err(Error::Malformed {
                what: "signed keyring",
                reason: format!("unknown format {:?}", self.format),
            });
        }
        current.verify(Purpose::Keyring, self.keyring.as_bytes(), &self.signatures)?;
        let next = Keyring::from_json(self.keyring.as_bytes())?;
        if next.version() <= current.version() {
            return Err(Error::RotationNotNewer {
                current: current.version(),
                new: next.version(),
            });
        }
        if next.version() - current.version() > MAX_VERSION_STEP {
            return Err(Error::RotationTooFar {
                current: current.version(),
                new: next.version(),
                max_step: MAX_VERSION_STEP,
            });
        }
        for id in current.revoked() {
            if next.keys().iter().any(|k| &k.key_id == id) {
                return Err(Error::RotationRetrustsRevoked { key_id: id.clone() });
            }
            if !next.revoked().contains(id) {
                return Err(Error::RotationDropsRevocation { key_id: id.clone() });
            }
        }
        Ok(next)
    }

    /// Reads a signed keyring file.
    pub fn load(path: &Path) -> Result<SignedKeyring> {
        let bytes = fs::read(path).map_err(|e| Error::io(path, e))?;
        serde_json::from_slice(&bytes).map_err(|e| Error::invalid(path, e.to_string()))
    }

    /// Writes this signed keyring to `path` atomically.
    pub fn save(&self, path: &Path) -> Result<()> {
        let mut v = serde_json::to_vec_pretty(self).expect("serialising a signed keyring");
        v.push(b'\n');
        write_atomic(path, &v)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn setup() -> (Vec<KeyPair>, Keyring) {
        let ks: Vec<KeyPair> = (1..=4).map(|i| KeyPair::from_seed([i; 32])).collect();
        let current = Keyring::new(2, &[ks[0].public(), ks[1].public(), ks[2].public()]).unwrap();
        (ks, current)
    }

    #[test]
    fn rotation_signed_by_threshold_of_current_is_accepted() {
        let (ks, current) = setup();
        let mut next = current.clone();
        next.add_key(ks[3].public()).unwrap();
        next.revoke(&ks[0].key_id()).unwrap();
        let signed = SignedKeyring::sign(&next, &[&ks[1], &ks[2]]);
        let accepted = signed.accept(&current).unwrap();
        assert_eq!(accepted, next);
        assert!(!accepted.is_trusted(&ks[0].key_id()));
        assert!(accepted.is_trusted(&ks[3].key_id()));
    }

    #[test]
    fn rotation_below_threshold_is_refused() {
        let (ks, current) = setup();
        let mut next = current.clone();
        next.add_key(ks[3].public()).unwrap();
        // The new key signing for itself does not count: it is not in the current keyring.
        let signed = SignedKeyring::sign(&next, &[&ks[1], &ks[3]]);
        assert!(matches!(
            signed.accept(&current),
            Err(Error::BelowThreshold { valid: 1, .. })
        ));
    }

    #[test]
    fn rotation_to_same_or_lower_version_is_refused() {
        let (ks, current) = setup();
        let signed = SignedKeyring::sign(&current, &[&ks[0], &ks[1]]);
        assert!(matches!(
            signed.accept(&current),
            Err(Error::RotationNotNewer { current: 1, new: 1 })
        ));
    }

    #[test]
    fn tampered_rotation_is_refused() {
        let (ks, current) = setup();
        let mut next = current.clone();
        next.set_threshold(1).unwrap();
        let mut signed = SignedKeyring::sign(&next, &[&ks[0], &ks[1]]);
        signed.keyring = signed
            .keyring
            .replace("\"threshold\": 1", "\"threshold\": 2");
        assert!(matches!(
            signed.accept(&current),
            Err(Error::BadSignature { .. })
        ));
    }

    #[test]
    fn a_manifest_signature_cannot_authorise_a_rotation() {
        let (ks, current) = setup();
        let mut next = current.clone();
        next.add_key(ks[3].public()).unwrap();
        let text = next.to_json();
        let sigs = vec![
            ks[0].sign(Purpose::Manifest, &text),
            ks[1].sign(Purpose::Manifest, &text),
        ];
        let forged = SignedKeyring {
            format: SIGNED_FORMAT.into(),
            keyring: String::from_utf8(text).unwrap(),
            signatures: SignatureEnvelope::new(sigs),
        };
        assert!(matches!(
            forged.accept(&current),
            Err(Error::BadSignature { .. })
        ));
    }

    /// A keyring JSON edited by hand (what a compromised or careless signer could produce).
    fn edited(ring: &Keyring, edit: impl FnOnce(&mut serde_json::Value)) -> Keyring {
        let mut json: serde_json::Value = serde_json::from_slice(&ring.to_json()).unwrap();
        edit(&mut json);
        Keyring::from_json(json.to_string().as_bytes()).unwrap()
    }

    #[test]
    fn rotation_that_trusts_a_revoked_key_again_is_refused() {
        let (ks, current) = setup();
        let mut revoked = current.clone();
        revoked.revoke(&ks[0].key_id()).unwrap();
        let pinned = SignedKeyring::sign(&revoked, &[&ks[1], &ks[2]])
            .accept(&current)
            .unwrap();
        // Remove the id from `revoked` and list the key as trusted again, version bumped.
        let key0 = serde_json::json!({
            "key_id": ks[0].key_id().as_str(),
            "public_key": serde_json::to_value(ks[0].public()).unwrap(),
        });
        let retrusted = edited(&pinned, |j| {
            j["version"] = serde_json::json!(pinned.version() + 1);
            j["revoked"] = serde_json::json!([]);
            j["keys"].as_array_mut().unwrap().push(key0);
        });
        let signed = SignedKeyring::sign(&retrusted, &[&ks[1], &ks[2]]);
        let err = signed.accept(&pinned).unwrap_err();
        assert!(
            matches!(&err, Error::RotationRetrustsRevoked { key_id } if key_id == &ks[0].key_id()),
            "{err}"
        );
        // Dropping the revocation without trusting the key is refused too (a later rotation
        // could then add it back).
        let forgotten = edited(&pinned, |j| {
            j["version"] = serde_json::json!(pinned.version() + 1);
            j["revoked"] = serde_json::json!([]);
        });
        let err = SignedKeyring::sign(&forgotten, &[&ks[1], &ks[2]])
            .accept(&pinned)
            .unwrap_err();
        assert!(
            matches!(err, Error::RotationDropsRevocation { .. }),
            "{err}"
        );
    }

    #[test]
    fn rotation_that_jumps_the_version_too_far_is_refused() {
        let (ks, current) = setup();
        for (new, ok) in [
            (current.version() + MAX_VERSION_STEP, true),
            (current.version() + MAX_VERSION_STEP + 1, false),
            (u64::MAX, false),
        ] {
            let next = edited(&current, |j| j["version"] = serde_json::json!(new));
            let result = SignedKeyring::sign(&next, &[&ks[0], &ks[1]]).accept(&current);
            if ok {
                assert_eq!(result.unwrap().version(), new);
            } else {
                assert!(
                    matches!(
                        result,
                        Err(Error::RotationTooFar {
                            max_step: MAX_VERSION_STEP,
                            ..
                        })
                    ),
                    "{new}: {result:?}"
                );
            }
        }
    }

    #[test]
    fn save_and_load_round_trip() {
        let (ks, current) = setup();
        let mut next = current.clone();
        next.set_threshold(3).unwrap();
        let signed = SignedKeyring::sign(&next, &[&ks[0], &ks[1]]);
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("rotation.json");
        signed.save(&path).unwrap();
        assert_eq!(
            SignedKeyring::load(&path)
                .unwrap()
                .accept(&current)
                .unwrap(),
            next
        );
    }
}
