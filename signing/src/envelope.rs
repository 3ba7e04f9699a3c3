//! Signature envelopes: the list of `{key_id, sig}` stored next to the signed bytes.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as B64;
use serde::{Deserialize, Serialize};

use crate::{Error, KeyId, Result};

const ENVELOPE_FORMAT: &str = "airlock-signatures/v1";

/// What a signature is for. The purpose's tag is prepended to the signed bytes, so a signature
/// made for one purpose never verifies for another.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Purpose {
    /// The exact bytes of a bundle's `manifest.json`.
    Manifest,
    /// The exact bytes of a keyring offered in a rotation.
    Keyring,
    /// The exact bytes of a content-free eval summary leaving the box (`airlock eval export`),
    /// signed by the appliance key.
    EvalExport,
    /// The exact bytes of a per-answer receipt, signed by the appliance key.
    Receipt,
}

impl Purpose {
    fn tag(self) -> &'static [u8] {
        match self {
            Purpose::Manifest => b"airlock/bundle-manifest/v1\0",
            Purpose::Keyring => b"airlock/keyring-rotation/v1\0",
            Purpose::EvalExport => b"airlock/eval-export/v1\0",
            Purpose::Receipt => b"airlock/answer-receipt/v1\0",
        }
    }

    /// The message actually signed: the purpose tag followed by `bytes`.
    pub(crate) fn message(self, bytes: &[u8]) -> Vec<u8> {
        let tag = self.tag();
        let mut m = Vec::with_capacity(tag.len() + bytes.len());
        m.extend_from_slice(tag);
        m.extend_from_slice(bytes);
        m
    }
}

/// One signature: the signer's key id and the 64-byte Ed25519 signature (base64 in JSON).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SignatureEntry {
    /// Id of the signing key.
    pub key_id: KeyId,
    /// Standard base64 of the signature bytes.
    pub sig: String,
}

impl SignatureEntry {
    pub(crate) fn new(key_id: KeyId, sig: [u8; 64]) -> Self {
        SignatureEntry {
            key_id,
            sig: B64.encode(sig),
        }
    }

    /// Decodes the signature bytes.
    pub fn signature_bytes(&self) -> Result<[u8; 64]> {
        let bad = |reason: String| Error::Malformed {
            what: "signature",
            reason,
        };
        let bytes = B64
            .decode(&self.sig)
            .map_err(|e| bad(format!("key {}: {e}", self.key_id)))?;
        bytes
            .try_into()
            .map_err(|_| bad(format!("key {}: not 64 bytes", self.key_id)))
    }
}

/// The contents of a signature file such as `manifest.sig.json`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SignatureEnvelope {
    /// Always `airlock-signatures/v1`.
    pub format: String,
    /// The signatures, one per key.
    pub signatures: Vec<SignatureEntry>,
}

impl SignatureEnvelope {
    /// An envelope holding `signatures`.
    pub fn new(signatures: Vec<SignatureEntry>) -> Self {
        SignatureEnvelope {
            format: ENVELOPE_FORMAT.into(),
            signatures,
        }
    }

    /// Parses and checks the format tag and that every signature decodes.
    pub fn from_json(bytes: &[u8]) -> Result<Self> {
        let bad = |reason: String| Error::Malformed {
            what: "signature envelope",
            reason,
        };
        let env: SignatureEnvelope =
            serde_json::from_slice(bytes).map_err(|e| bad(e.to_string()))?;
        if env.format != ENVELOPE_FORMAT {
            return Err(bad(format!("unknown format {:?}", env.format)));
        }
        for entry in &env.signatures {
            entry.signature_bytes()?;
        }
        Ok(env)
    }

    /// Deterministic pretty JSON with a trailing newline.
    pub fn to_json(&self) -> Vec<u8> {
        let mut v = serde_json::to_vec_pretty(self).expect("serialising an envelope");
        v.push(b'\n');
        v
    }
}
