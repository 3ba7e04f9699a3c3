//! `airlock-signing`: the appliance's root of trust.
//!
//! It owns Ed25519 key pairs and their files, key ids, the **keyring** (trusted public keys, a
//! signature threshold, revoked key ids, its own version), signature **envelopes** over exact
//! byte strings, and **key rotation** (a new keyring signed by a threshold of the current one).
//!
//! It does not know what it signs: the bundle crate hands it the exact bytes of `manifest.json`.
//! Every signature is made over a domain-separated message (`Purpose` prefix + the bytes), so a
//! signature over a keyring can never be replayed as a signature over a manifest.
//!
//! Private keys are written with mode 0600, are never logged (`Debug` is redacted) and a key file
//! readable by group or others is refused on load.
#![warn(missing_docs)]

mod envelope;
mod error;
#[doc(hidden)]
pub mod fuzzing;
mod key;
mod keyring;
mod rotation;
pub mod signed_file;

pub use envelope::{Purpose, SignatureEntry, SignatureEnvelope};
pub use error::Error;
pub use key::{KeyId, KeyPair, PublicKey};
pub use keyring::{Keyring, TrustedKey, write_atomic};
pub use rotation::{MAX_VERSION_STEP, SignedKeyring};

/// Result type of this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;
