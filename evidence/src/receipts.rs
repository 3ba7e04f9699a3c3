//! Per-answer receipts: for every chat answer, an audit record of what it was built from — who
//! asked, when, the bundle and its digest, the model alias and its file digest, the index
//! generation, the ACL state, the document ids and versions shown and cited, and the SHA-256 of
//! the exact prompt the generator was given. Ids, versions and digests only: never a question,
//! a prompt or document text.
//!
//! A receipt is one or two `receipt` entries of the audit log, keyed by `receipt_id`:
//! - `served`, written before the answer's first byte reaches the client (non-streaming: before
//!   the response; SSE: before the first event). If it cannot be written the answer is refused
//!   (`503 receipt-unrecorded`): no answer is served without its receipt. An abstention without
//!   generation ("no readable source") is complete in this one entry.
//! - `completed`, written when the generation ends, before the answer is acknowledged as complete
//!   (non-streaming: before the response; SSE: before the event with the finish reason). It adds
//!   the cited sources and the finish reason. If it cannot be written, a non-streaming answer is
//!   refused (503) and a stream ends with an `error` event instead of its finish event; the
//!   receipt then stays `incomplete` (it still names everything the prompt showed).
//!
//! `GET /v1/receipts/{id}` merges the entries and signs the result with the appliance key: the
//! file is the canonical pretty JSON of `{"receipt": …, "signature": …}`, the signature made over
//! the receipt's compact JSON with the [`Purpose::Receipt`] tag (the scheme of the eval export);
//! [`verify`] refuses any file not byte-for-byte in that form.

use airlock_acl::AuditEntry;
use airlock_signing::signed_file::Refusal;
use airlock_signing::{KeyPair, PublicKey, Purpose, SignatureEntry};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// The receipt format tag.
pub const RECEIPT_FORMAT: &str = "airlock-receipt/v1";
/// Every receipt id starts with this.
pub const ID_PREFIX: &str = "rcpt-";
/// Largest receipt file [`verify`] reads.
pub const MAX_RECEIPT_BYTES: usize = 1 << 20;

/// A fresh receipt id: `rcpt-` and 32 lowercase hex digits (128 random bits).
pub fn new_id() -> String {
    format!("{ID_PREFIX}{}", uuid::Uuid::new_v4().simple())
}

/// Whether `id` has the form of a receipt id.
pub fn valid_id(id: &str) -> bool {
    id.strip_prefix(ID_PREFIX).is_some_and(|h| {
        h.len() == 32
            && h.bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    })
}

/// `sha256:<hex>` of `bytes`.
pub fn sha256(bytes: &[u8]) -> String {
    format!("sha256:{}", hex::encode(Sha256::digest(bytes)))
}

/// The installed bundle an answer came from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BundleRef {
    /// Its version.
    pub version: String,
    /// `sha256:<hex>` of its signed `manifest.json` (`None`: not served from an installed bundle,
    /// e.g. a test daemon).
    pub digest: Option<String>,
}

/// The generator that answered.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelRef {
    /// The alias the answer was served under (`airlock-large`, a rack alias, …).
    pub alias: String,
    /// The catalogue (or rack) model id.
    pub model_id: String,
    /// `sha256:<hex>` of the model's weights file as the signed bundle pins it (`None` for a rack
    /// generator: its weights are not on this box).
    pub file_digest: Option<String>,
    /// `local` (this appliance's engine) or `rack` (a remote generator).
    pub served_by: String,
}

/// A prompt source: the document shown as source `n`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DocRef {
    /// The source number in the prompt (`[n]`), from 1.
    pub n: usize,
    /// The document id.
    pub doc_id: String,
    /// The document's version (content hash) when the prompt was built.
    pub version: Option<String>,
    /// The chunk shown.
    pub chunk_id: u32,
}

/// The detail of a `served` entry.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Served {
    /// The receipt id.
    pub receipt_id: String,
    /// Always `served`.
    pub phase: String,
    /// The bundle.
    pub bundle: BundleRef,
    /// The generator (the one the answer was routed to).
    pub model: ModelRef,
    /// The retrieval index generation searched.
    pub index_generation: u64,
    /// [`airlock_acl::Acl::state_seq`] when the sources were chosen.
    pub acl_state_seq: i64,
    /// `sha256:<hex>` of the exact prompt given to the generator (`None`: no generation).
    pub prompt_sha256: Option<String>,
    /// The sources shown, in prompt order.
    pub shown: Vec<DocRef>,
    /// Set when the answer is final at once (an abstention without generation): the source
    /// numbers cited (none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cited: Option<Vec<usize>>,
    /// How `cited` was found, when final at once (`no_source`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cited_by: Option<String>,
}

/// The detail of a `completed` entry.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Completed {
    /// The receipt id.
    pub receipt_id: String,
    /// Always `completed`.
    pub phase: String,
    /// The source numbers the answer used.
    pub cited: Vec<usize>,
    /// How they were found (`markers`, `support`, `unsupported`; `None` without retrieval).
    pub cited_by: Option<String>,
    /// The finish reason (`stop`, `length`).
    pub finish: String,
}

/// A receipt as `GET /v1/receipts/{id}` signs it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Receipt {
    /// Always [`RECEIPT_FORMAT`].
    pub format: String,
    /// The receipt id (the answer's `airlock.receipt_id`).
    pub receipt_id: String,
    /// The appliance key's id (who signs).
    pub appliance_id: String,
    /// The answer's request id (its completion id).
    pub request_id: String,
    /// Who asked.
    pub user_id: String,
    /// When the answer was served (RFC 3339, UTC, microseconds): the `served` entry's time.
    pub served_at: String,
    /// When it completed (`None`: not completed, see `outcome`).
    pub completed_at: Option<String>,
    /// `answered`, `abstained` (no source was shown, or the answer was withheld as unsupported)
    /// or `incomplete` (cancelled, failed or still streaming: nothing was acknowledged as
    /// complete).
    pub outcome: String,
    /// The bundle.
    pub bundle: BundleRef,
    /// The generator.
    pub model: ModelRef,
    /// The retrieval index generation.
    pub index_generation: u64,
    /// The ACL state version (an audit `seq`).
    pub acl_state_seq: i64,
    /// `sha256:<hex>` of the exact prompt (`None`: no generation).
    pub prompt_sha256: Option<String>,
    /// The documents shown (prompt order).
    pub shown: Vec<DocRef>,
    /// The documents the answer cited (`None` while incomplete).
    pub cited: Option<Vec<DocRef>>,
    /// How the cited sources were found.
    pub cited_by: Option<String>,
    /// The finish reason (`None` for an abstention without generation or while incomplete).
    pub finish: Option<String>,
    /// The audit entries (`seq`) it is made of.
    pub audit_seq: Vec<i64>,
}

fn rfc3339(t: time::OffsetDateTime) -> String {
    crate::feedback::rfc3339_us((t.unix_timestamp_nanos() / 1000) as i64)
}

fn pick(shown: &[DocRef], ns: &[usize]) -> Vec<DocRef> {
    ns.iter()
        .filter_map(|n| shown.iter().find(|d| d.n == *n).cloned())
        .collect()
}

/// The receipt made of `entries` (the `receipt` entries of one id, oldest first).
pub fn merge(appliance_id: &str, entries: &[AuditEntry]) -> Result<Receipt, String> {
    let first = entries.first().ok_or("no receipt entry")?;
    let served: Served = serde_json::from_value(first.detail.clone())
        .map_err(|e| format!("receipt entry {}: {e}", first.seq))?;
    if served.phase != "served" {
        return Err(format!("receipt entry {} is not a served entry", first.seq));
    }
    let completed = entries
        .iter()
        .skip(1)
        .map(|e| {
            serde_json::from_value::<Completed>(e.detail.clone())
                .map(|c| (e, c))
                .map_err(|err| format!("receipt entry {}: {err}", e.seq))
        })
        .next()
        .transpose()?;
    let (completed_at, cited, cited_by, finish) = match (&completed, &served.cited) {
        (Some((e, c)), _) => (
            Some(rfc3339(e.at)),
            Some(c.cited.clone()),
            c.cited_by.clone(),
            Some(c.finish.clone()),
        ),
        (None, Some(cited)) => (
            Some(rfc3339(first.at)),
            Some(cited.clone()),
            served.cited_by.clone(),
            None,
        ),
        (None, None) => (None, None, None, None),
    };
    let outcome = match (&cited, cited_by.as_deref()) {
        (None, _) => "incomplete",
        (Some(_), Some("no_source" | "unsupported")) => "abstained",
        (Some(_), _) if served.shown.is_empty() && served.prompt_sha256.is_none() => "abstained",
        _ => "answered",
    };
    Ok(Receipt {
        format: RECEIPT_FORMAT.into(),
        receipt_id: served.receipt_id.clone(),
        appliance_id: appliance_id.to_string(),
        request_id: first.request_id.clone().unwrap_or_default(),
        user_id: first.user_id.clone().unwrap_or_default(),
        served_at: rfc3339(first.at),
        completed_at,
        outcome: outcome.into(),
        bundle: served.bundle,
        model: served.model,
        index_generation: served.index_generation,
        acl_state_seq: served.acl_state_seq,
        prompt_sha256: served.prompt_sha256,
        cited: cited.map(|ns| pick(&served.shown, &ns)),
        shown: served.shown,
        cited_by,
        finish,
        audit_seq: entries
            .iter()
            .take(1 + usize::from(completed.is_some()))
            .map(|e| e.seq)
            .collect(),
    })
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct SignedReceipt {
    receipt: Receipt,
    signature: SignatureEntry,
}

fn receipt_bytes(r: &Receipt) -> Vec<u8> {
    serde_json::to_vec(r).expect("a receipt serializes")
}

fn canonical(signed: &SignedReceipt) -> Vec<u8> {
    airlock_signing::signed_file::canonical(signed)
}

/// The receipt file of `receipt`, signed by `key` (the appliance key).
pub fn sign(receipt: &Receipt, key: &KeyPair) -> Vec<u8> {
    let signature = key.sign(Purpose::Receipt, &receipt_bytes(receipt));
    canonical(&SignedReceipt {
        receipt: receipt.clone(),
        signature,
    })
}

/// Why a receipt file was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReceiptError {
    /// Larger than [`MAX_RECEIPT_BYTES`].
    #[error("the receipt is {0} bytes; at most {MAX_RECEIPT_BYTES} are read")]
    TooLarge(usize),
    /// Not a receipt file.
    #[error("not an answer receipt: {0}")]
    Malformed(String),
    /// Another format version.
    #[error("unknown receipt format `{0}` (this build reads {RECEIPT_FORMAT})")]
    Format(String),
    /// Parsed, but not byte-for-byte as it was signed.
    #[error("the receipt was altered: it is not in the form it was signed in")]
    Altered,
    /// Signed by another key.
    #[error("signed by key {signed_by}, not by the given appliance key {expected}")]
    WrongKey {
        /// The file's key id.
        signed_by: String,
        /// The given key's id.
        expected: String,
    },
    /// The signature does not verify.
    #[error("the signature does not verify: the receipt was altered after signing")]
    BadSignature,
}

/// Verifies a receipt file against the appliance's public key; the receipt it vouches for.
pub fn verify(bytes: &[u8], key: &PublicKey) -> Result<Receipt, ReceiptError> {
    if bytes.len() > MAX_RECEIPT_BYTES {
        return Err(ReceiptError::TooLarge(bytes.len()));
    }
    let signed: SignedReceipt =
        serde_json::from_slice(bytes).map_err(|e| ReceiptError::Malformed(e.to_string()))?;
    if signed.receipt.format != RECEIPT_FORMAT {
        return Err(ReceiptError::Format(signed.receipt.format));
    }
    airlock_signing::signed_file::check(
        bytes,
        &canonical(&signed),
        &signed.signature,
        key,
        Purpose::Receipt,
        &receipt_bytes(&signed.receipt),
    )
    .map_err(|r| match r {
        Refusal::Altered => ReceiptError::Altered,
        Refusal::WrongKey {
            signed_by,
            expected,
        } => ReceiptError::WrongKey {
            signed_by,
            expected,
        },
        Refusal::BadSignature => ReceiptError::BadSignature,
    })?;
    Ok(signed.receipt)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn receipt() -> Receipt {
        Receipt {
            format: RECEIPT_FORMAT.into(),
            receipt_id: new_id(),
            appliance_id: "k".into(),
            request_id: "req-1".into(),
            user_id: "u017".into(),
            served_at: "2026-01-01T00:00:00.000000Z".into(),
            completed_at: None,
            outcome: "incomplete".into(),
            bundle: BundleRef {
                version: "1.0.0".into(),
                digest: None,
            },
            model: ModelRef {
                alias: "airlock-small".into(),
                model_id: "smollm2".into(),
                file_digest: Some(sha256(b"w")),
                served_by: "local".into(),
            },
            index_generation: 3,
            acl_state_seq: 7,
            prompt_sha256: Some(sha256(b"p")),
            shown: vec![DocRef {
                n: 1,
                doc_id: "doc-1".into(),
                version: Some("v1".into()),
                chunk_id: 4,
            }],
            cited: None,
            cited_by: None,
            finish: None,
            audit_seq: vec![9],
        }
    }

    #[test]
    fn ids_have_one_form() {
        let id = new_id();
        assert!(valid_id(&id), "{id}");
        assert_ne!(id, new_id());
        for bad in [
            "",
            "rcpt-",
            "rcpt-XYZ",
            &id.to_uppercase(),
            &format!("{id}0"),
            &id.replacen("rcpt-", "rcpt_", 1),
            "rcpt-0123456789abcdef0123456789abcdeg",
        ] {
            assert!(!valid_id(bad), "{bad}");
        }
    }

    #[test]
    fn a_signed_receipt_verifies_and_any_change_is_refused() {
        let key = KeyPair::from_seed([3; 32]);
        let r = receipt();
        let bytes = sign(&r, &key);
        assert_eq!(verify(&bytes, &key.public()), Ok(r.clone()));
        let mut flipped = bytes.clone();
        let at = flipped.iter().position(|b| *b == b'7').unwrap();
        flipped[at] = b'8';
        assert!(verify(&flipped, &key.public()).is_err());
        let mut signed: SignedReceipt = serde_json::from_slice(&bytes).unwrap();
        signed.receipt.shown[0].version = Some("v2".into());
        assert_eq!(
            verify(&canonical(&signed), &key.public()),
            Err(ReceiptError::BadSignature)
        );
        let mut spaced = bytes.clone();
        spaced.insert(1, b' ');
        assert_eq!(verify(&spaced, &key.public()), Err(ReceiptError::Altered));
        assert!(matches!(
            verify(&bytes, &KeyPair::from_seed([4; 32]).public()),
            Err(ReceiptError::WrongKey { .. })
        ));
    }
}
