//! Ed25519 key pairs, public keys, key ids and their files.

use std::fmt;
use std::fs;
use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use ed25519_dalek::{Signature, Signer, SigningKey, VerifyingKey};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::envelope::{Purpose, SignatureEntry};
use crate::{Error, Result};

const PRIVATE_FORMAT: &str = "airlock-private-key/v1";
const PUBLIC_FORMAT: &str = "airlock-public-key/v1";

/// A key id: lowercase hex of the first 16 bytes of SHA-256 over the 32-byte public key.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct KeyId(String);

impl KeyId {
    /// The id of a public key.
    pub fn of(public: &VerifyingKey) -> KeyId {
        let digest = Sha256::digest(public.as_bytes());
        KeyId(hex::encode(&digest[..16]))
    }

    /// Parses a key id (32 lowercase hex digits).
    pub fn parse(s: &str) -> Result<KeyId> {
        if s.len() == 32
            && s.bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        {
            Ok(KeyId(s.to_owned()))
        } else {
            Err(Error::Malformed {
                what: "key id",
                reason: format!("{s:?} is not 32 lowercase hex digits"),
            })
        }
    }

    /// The hex text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl TryFrom<String> for KeyId {
    type Error = Error;
    fn try_from(s: String) -> Result<KeyId> {
        KeyId::parse(&s)
    }
}

impl From<KeyId> for String {
    fn from(id: KeyId) -> String {
        id.0
    }
}

impl fmt::Display for KeyId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// An Ed25519 public key (serialised as 64 hex digits).
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct PublicKey(VerifyingKey);

impl PublicKey {
    /// This key's id.
    pub fn key_id(&self) -> KeyId {
        KeyId::of(&self.0)
    }

    /// Lowercase hex of the 32 key bytes.
    pub fn to_hex(&self) -> String {
        hex::encode(self.0.as_bytes())
    }

    /// Parses 64 hex digits into a public key (rejects weak/invalid points).
    pub fn from_hex(s: &str) -> Result<PublicKey> {
        let bad = |reason: String| Error::Malformed {
            what: "public key",
            reason,
        };
        let bytes = hex::decode(s).map_err(|e| bad(e.to_string()))?;
        let arr: [u8; 32] = bytes
            .try_into()
            .map_err(|_| bad("expected 32 bytes".into()))?;
        let key = VerifyingKey::from_bytes(&arr).map_err(|e| bad(e.to_string()))?;
        if key.is_weak() {
            return Err(bad("weak (small-order) key".into()));
        }
        Ok(PublicKey(key))
    }

    /// Checks `sig` over `message` for `purpose` (strict Ed25519 verification).
    pub fn verify(&self, purpose: Purpose, message: &[u8], sig: &[u8; 64]) -> bool {
        let sig = Signature::from_bytes(sig);
        self.0
            .verify_strict(&purpose.message(message), &sig)
            .is_ok()
    }

    /// Reads a public key file written by [`KeyPair::write_files`].
    pub fn load(path: &Path) -> Result<PublicKey> {
        let text = fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
        let file: PublicFile =
            serde_json::from_str(&text).map_err(|e| Error::invalid(path, e.to_string()))?;
        if file.format != PUBLIC_FORMAT {
            return Err(Error::invalid(
                path,
                format!("unknown format {:?}", file.format),
            ));
        }
        let key = PublicKey::from_hex(&file.public_key)
            .map_err(|e| Error::invalid(path, e.to_string()))?;
        if key.key_id() != file.key_id {
            return Err(Error::invalid(path, "key_id does not match the public key"));
        }
        Ok(key)
    }
}

impl fmt::Debug for PublicKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PublicKey({})", self.key_id())
    }
}

impl Serialize for PublicKey {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.serialize_str(&self.to_hex())
    }
}

impl<'de> Deserialize<'de> for PublicKey {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        PublicKey::from_hex(&s).map_err(serde::de::Error::custom)
    }
}

/// An Ed25519 signing key. `Debug` shows only the key id; the secret is never formatted.
pub struct KeyPair {
    signing: SigningKey,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct PrivateFile {
    format: String,
    key_id: KeyId,
    secret_key: String,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct PublicFile {
    format: String,
    key_id: KeyId,
    public_key: String,
}

impl KeyPair {
    /// A fresh key from the operating system's CSPRNG.
    pub fn generate() -> KeyPair {
        let mut rng = rand::rng();
        KeyPair {
            signing: SigningKey::generate(&mut rng),
        }
    }

    /// A key derived from a 32-byte seed (deterministic; for tests and fixtures).
    pub fn from_seed(seed: [u8; 32]) -> KeyPair {
        KeyPair {
            signing: SigningKey::from_bytes(&seed),
        }
    }

    /// The public half.
    pub fn public(&self) -> PublicKey {
        PublicKey(self.signing.verifying_key())
    }

    /// The key id.
    pub fn key_id(&self) -> KeyId {
        self.public().key_id()
    }

    /// Signs `message` for `purpose`.
    pub fn sign(&self, purpose: Purpose, message: &[u8]) -> SignatureEntry {
        let sig = self.signing.sign(&purpose.message(message));
        SignatureEntry::new(self.key_id(), sig.to_bytes())
    }

    /// Writes `<dir>/<name>.key` (mode 0600, never overwritten) and `<dir>/<name>.pub`.
    /// Returns both paths (private, public).
    pub fn write_files(&self, dir: &Path, name: &str) -> Result<(PathBuf, PathBuf)> {
        if name.is_empty() || name.contains('/') || name.starts_with('.') {
            return Err(Error::invalid(dir, format!("bad key file name {name:?}")));
        }
        fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
        let private = dir.join(format!("{name}.key"));
        let public = dir.join(format!("{name}.pub"));
        for p in [&private, &public] {
            if p.exists() {
                return Err(Error::AlreadyExists { path: p.clone() });
            }
        }
        let private_doc = PrivateFile {
            format: PRIVATE_FORMAT.into(),
            key_id: self.key_id(),
            secret_key: hex::encode(self.signing.to_bytes()),
        };
        let mut text = serde_json::to_string_pretty(&private_doc).expect("serialising a key file");
        text.push('\n');
        let mut file = fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&private)
            .map_err(|e| Error::io(&private, e))?;
        file.write_all(text.as_bytes())
            .and_then(|()| file.sync_all())
            .map_err(|e| Error::io(&private, e))?;
        drop(text);

        let public_doc = PublicFile {
            format: PUBLIC_FORMAT.into(),
            key_id: self.key_id(),
            public_key: self.public().to_hex(),
        };
        let mut text = serde_json::to_string_pretty(&public_doc).expect("serialising a key file");
        text.push('\n');
        let mut file = fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o644)
            .open(&public)
            .map_err(|e| Error::io(&public, e))?;
        file.write_all(text.as_bytes())
            .and_then(|()| file.sync_all())
            .map_err(|e| Error::io(&public, e))?;
        Ok((private, public))
    }

    /// Reads a private key file; refuses one that group or others can read.
    pub fn load(path: &Path) -> Result<KeyPair> {
        let meta = fs::metadata(path).map_err(|e| Error::io(path, e))?;
        let mode = meta.permissions().mode() & 0o777;
        if mode & 0o077 != 0 {
            return Err(Error::InsecureKeyFile {
                path: path.to_owned(),
                mode,
            });
        }
        let text = fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
        // Never echo the parse error's excerpt of a secret: report only the position.
        let file: PrivateFile = serde_json::from_str(&text).map_err(|e| {
            Error::invalid(
                path,
                format!(
                    "not a private key file (line {}, column {})",
                    e.line(),
                    e.column()
                ),
            )
        })?;
        if file.format != PRIVATE_FORMAT {
            return Err(Error::invalid(
                path,
                format!("unknown format {:?}", file.format),
            ));
        }
        let bytes = hex::decode(&file.secret_key)
            .map_err(|_| Error::invalid(path, "secret_key is not hex"))?;
        let seed: [u8; 32] = bytes
            .try_into()
            .map_err(|_| Error::invalid(path, "secret_key is not 32 bytes"))?;
        let pair = KeyPair::from_seed(seed);
        if pair.key_id() != file.key_id {
            return Err(Error::invalid(path, "key_id does not match the secret key"));
        }
        Ok(pair)
    }
}

impl fmt::Debug for KeyPair {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "KeyPair({}, secret redacted)", self.key_id())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_id_is_first_16_bytes_of_sha256_of_public_key() {
        let pair = KeyPair::from_seed([7; 32]);
        let digest = Sha256::digest(pair.public().0.as_bytes());
        assert_eq!(pair.key_id().as_str(), hex::encode(&digest[..16]));
        assert_eq!(pair.key_id().as_str().len(), 32);
    }

    #[test]
    fn files_round_trip_with_private_mode_0600() {
        let dir = tempfile::tempdir().unwrap();
        let pair = KeyPair::generate();
        let (private, public) = pair.write_files(dir.path(), "ops").unwrap();
        assert_eq!(
            fs::metadata(&private).unwrap().permissions().mode() & 0o777,
            0o600
        );
        let loaded = KeyPair::load(&private).unwrap();
        assert_eq!(loaded.key_id(), pair.key_id());
        assert_eq!(PublicKey::load(&public).unwrap(), pair.public());
        // Never overwritten.
        assert!(matches!(
            pair.write_files(dir.path(), "ops"),
            Err(Error::AlreadyExists { .. })
        ));
    }

    #[test]
    fn group_readable_private_key_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let (private, _) = KeyPair::generate().write_files(dir.path(), "k").unwrap();
        fs::set_permissions(&private, fs::Permissions::from_mode(0o640)).unwrap();
        assert!(matches!(
            KeyPair::load(&private),
            Err(Error::InsecureKeyFile { mode: 0o640, .. })
        ));
    }

    #[test]
    fn debug_never_shows_the_secret() {
        let pair = KeyPair::from_seed([9; 32]);
        let shown = format!("{pair:?}");
        assert!(!shown.contains(&hex::encode(pair.signing.to_bytes())));
        assert!(shown.contains(pair.key_id().as_str()));
    }

    #[test]
    fn signatures_are_bound_to_their_purpose() {
        let pair = KeyPair::from_seed([1; 32]);
        let entry = pair.sign(Purpose::Manifest, b"bytes");
        let sig = entry.signature_bytes().unwrap();
        assert!(pair.public().verify(Purpose::Manifest, b"bytes", &sig));
        assert!(!pair.public().verify(Purpose::Keyring, b"bytes", &sig));
        assert!(!pair.public().verify(Purpose::Manifest, b"bytez", &sig));
    }

    #[test]
    fn key_id_parse_rejects_non_hex() {
        assert!(KeyId::parse("zz").is_err());
        assert!(KeyId::parse(&"A".repeat(32)).is_err());
        assert!(KeyId::parse(&"a".repeat(32)).is_ok());
    }
}
