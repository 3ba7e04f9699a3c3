//! The crate's single error type.

use std::path::PathBuf;

use crate::KeyId;

/// Everything that can go wrong while handling keys, keyrings and signatures.
///
/// Variants up to `Io` are faults of the input (a bad file, a refused signature); `Io` carries
/// the path that could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A key, keyring or envelope file is not valid.
    #[error("{path}: {reason}")]
    InvalidFile {
        /// The offending file.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// A keyring or envelope document is malformed (not tied to a file).
    #[error("malformed {what}: {reason}")]
    Malformed {
        /// What was being parsed ("keyring", "signature envelope", ...).
        what: &'static str,
        /// The parse or validation failure.
        reason: String,
    },
    /// A private key file can be read by group or others.
    #[error(
        "{path}: private key file is readable by group or others (mode {mode:o}); chmod 600 it"
    )]
    InsecureKeyFile {
        /// The key file.
        path: PathBuf,
        /// Its permission bits.
        mode: u32,
    },
    /// A file that must not be overwritten already exists.
    #[error("{path}: already exists, refusing to overwrite")]
    AlreadyExists {
        /// The existing file.
        path: PathBuf,
    },
    /// A trusted, non-revoked key's signature does not verify over the signed bytes.
    #[error("signature by key {key_id} does not verify")]
    BadSignature {
        /// The key whose signature failed.
        key_id: KeyId,
    },
    /// The same key signed more than once in one envelope.
    #[error("key {key_id} appears more than once in the signature envelope")]
    DuplicateSignature {
        /// The repeated key.
        key_id: KeyId,
    },
    /// Fewer than `threshold` distinct trusted, non-revoked keys signed.
    #[error(
        "{valid} valid signature(s) from trusted keys, threshold is {threshold}{}{}",
        if revoked.is_empty() { String::new() } else { format!("; ignored revoked key(s) {}", join(revoked)) },
        if unknown.is_empty() { String::new() } else { format!("; ignored unknown key(s) {}", join(unknown)) }
    )]
    BelowThreshold {
        /// Distinct trusted keys whose signatures verified.
        valid: usize,
        /// Required number.
        threshold: u32,
        /// Signers that are revoked in this keyring.
        revoked: Vec<KeyId>,
        /// Signers this keyring does not know.
        unknown: Vec<KeyId>,
    },
    /// A keyring edit or rotation is not allowed.
    #[error("keyring: {0}")]
    Keyring(String),
    /// A rotation's new keyring does not have a higher version than the current one.
    #[error("new keyring version {new} is not higher than the current version {current}")]
    RotationNotNewer {
        /// Version of the pinned keyring.
        current: u64,
        /// Version of the offered keyring.
        new: u64,
    },
    /// A rotation's new keyring trusts a key the current one revoked.
    #[error(
        "new keyring trusts key {key_id}, which the current keyring revoked; a revoked key is never trusted again"
    )]
    RotationRetrustsRevoked {
        /// The revoked key the new keyring lists as trusted.
        key_id: KeyId,
    },
    /// A rotation's new keyring forgets a revocation of the current one.
    #[error("new keyring drops the revocation of key {key_id}; revocations are permanent")]
    RotationDropsRevocation {
        /// The key id missing from the new keyring's revoked list.
        key_id: KeyId,
    },
    /// A rotation's new keyring jumps too far ahead (it would freeze later rotations).
    #[error(
        "new keyring version {new} is more than {max_step} above the current version {current}"
    )]
    RotationTooFar {
        /// Version of the pinned keyring.
        current: u64,
        /// Version of the offered keyring.
        new: u64,
        /// The largest accepted step.
        max_step: u64,
    },
    /// Reading or writing a file failed.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
}

fn join(ids: &[KeyId]) -> String {
    ids.iter().map(KeyId::as_str).collect::<Vec<_>>().join(", ")
}

impl Error {
    pub(crate) fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Error::Io {
            path: path.into(),
            source,
        }
    }

    pub(crate) fn invalid(path: impl Into<PathBuf>, reason: impl Into<String>) -> Self {
        Error::InvalidFile {
            path: path.into(),
            reason: reason.into(),
        }
    }
}
