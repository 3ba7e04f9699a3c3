//! The checks shared by every file the appliance key signs (the eval export, answer receipts):
//! a pretty-printed JSON document `{<body>, "signature": …}` ending in a newline, accepted only
//! byte for byte in that canonical form, signed by the expected key over the body's compact
//! JSON for one [`Purpose`]. Parsing and the format version stay with each file's owner.

use crate::{PublicKey, Purpose, SignatureEntry};

/// The canonical bytes of a signed file: pretty JSON and a final newline.
pub fn canonical<T: serde::Serialize>(signed: &T) -> Vec<u8> {
    let mut out = serde_json::to_vec_pretty(signed).expect("a signed file serializes");
    out.push(b'\n');
    out
}

/// Why a parsed signed file was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// Parsed, but not byte for byte in its canonical form.
    Altered,
    /// Signed by another key.
    WrongKey {
        /// The file's key id.
        signed_by: String,
        /// The given key's id.
        expected: String,
    },
    /// The signature does not verify.
    BadSignature,
}

/// Checks a parsed signed file: `bytes` (as read) equal `canonical` (as re-written from the
/// parse), and `signature` is `key`'s over `message` (the body's signed bytes) for `purpose`.
pub fn check(
    bytes: &[u8],
    canonical: &[u8],
    signature: &SignatureEntry,
    key: &PublicKey,
    purpose: Purpose,
    message: &[u8],
) -> Result<(), Refusal> {
    if canonical != bytes {
        return Err(Refusal::Altered);
    }
    let expected = key.key_id();
    if signature.key_id != expected {
        return Err(Refusal::WrongKey {
            signed_by: signature.key_id.as_str().to_string(),
            expected: expected.as_str().to_string(),
        });
    }
    let sig = signature
        .signature_bytes()
        .map_err(|_| Refusal::BadSignature)?;
    if key.verify(purpose, message, &sig) {
        Ok(())
    } else {
        Err(Refusal::BadSignature)
    }
}
