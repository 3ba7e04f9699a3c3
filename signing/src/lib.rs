//! `airlock-signing`: Ed25519 keys, key ids, the keyring (trusted keys, threshold, revocations),
//! signature envelopes over canonical manifest bytes, and key rotation.
#![warn(missing_docs)]
