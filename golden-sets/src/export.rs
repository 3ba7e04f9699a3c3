//! The signed eval export: what may leave the box ("results are the only thing that leaves —
//! with the customer's approval").
//!
//! An [`ExportSummary`] holds metrics with their intervals (overall, per kind, per phase),
//! latency percentiles, leak and failure counts, the gate's verdict, the bundle's version and
//! manifest digest, the golden set's digest, the appliance id, the time and who requested and
//! approved the export. It never holds a query, an answer, a title, a document id or a case id:
//! it is built from a [`Report`]'s aggregates only, never from its cases (a test feeds a report
//! whose cases carry all of those and checks none of them is in the file).
//!
//! The file is the canonical pretty JSON of `{"summary": …, "signature": …}`; the signature is
//! made by the appliance key over the summary's compact JSON with the
//! [`Purpose::EvalExport`] tag. [`verify`] refuses a file that is not byte-for-byte in that
//! canonical form, so any changed byte is either a parse error, a non-canonical file or a
//! signature that no longer verifies.

use std::collections::BTreeMap;

use airlock_signing::signed_file::Refusal;
use airlock_signing::{KeyPair, PublicKey, Purpose, SignatureEntry};
use serde::{Deserialize, Serialize};

use crate::gate::{GateFailure, Report, Summary, Verdict};

/// The export format tag.
pub const EXPORT_FORMAT: &str = "airlock-eval-export/v1";
/// Largest export file [`verify`] reads.
pub const MAX_EXPORT_BYTES: usize = 4 << 20;

/// The golden set evaluated.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SetInfo {
    /// The set's name (its directory name).
    pub name: String,
    /// `sha256:<hex>` over the set's case files (`airlock eval export` documents which).
    pub digest: String,
    /// Cases in the report.
    pub cases: usize,
}

/// The bundle evaluated.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BundleInfo {
    /// Version the daemon reported.
    pub version: Option<String>,
    /// `sha256:<hex>` of the installed bundle's signed `manifest.json`.
    pub manifest_digest: Option<String>,
}

/// The gate's verdict against a baseline, without case ids.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GateInfo {
    /// `sha256:<hex>` of the baseline file.
    pub baseline_digest: String,
    /// Whether the candidate may ship.
    pub passed: bool,
    /// One line per metric-level reason (leaks, failed cases, metric drops, missing metrics).
    pub failures: Vec<String>,
    /// Frozen regression cases that now fail (counted; their ids stay on the box).
    pub regressions_failed: usize,
}

impl GateInfo {
    /// The content-free form of `verdict`.
    pub fn of(verdict: &Verdict, baseline_digest: String) -> Self {
        let mut failures = Vec::new();
        let mut regressions_failed = 0;
        for f in &verdict.failures {
            match f {
                GateFailure::Leaks(n) => failures.push(format!("{n} leaking cases")),
                GateFailure::FailedCases(n) => failures.push(format!("{n} failed cases")),
                GateFailure::MetricDrop {
                    metric,
                    baseline,
                    candidate,
                } => failures.push(format!(
                    "{metric} fell from {baseline:.4} to {candidate:.4}"
                )),
                GateFailure::MetricMissing(m) => failures.push(format!("{m} missing")),
                GateFailure::Regression(_) => regressions_failed += 1,
            }
        }
        GateInfo {
            baseline_digest,
            passed: verdict.passed(),
            failures,
            regressions_failed,
        }
    }
}

/// Who asked for the export and who approved it (four eyes: two different people).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Approval {
    /// The user who requested the export.
    pub requested_by: String,
    /// The second admin or operator who approved it.
    pub approved_by: String,
}

/// The content-free summary of one eval run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExportSummary {
    /// [`EXPORT_FORMAT`].
    pub format: String,
    /// The appliance key's id (the appliance's identity).
    pub appliance_id: String,
    /// When the export was made (RFC 3339, UTC).
    pub created_at: String,
    /// The set.
    pub set: SetInfo,
    /// The bundle.
    pub bundle: BundleInfo,
    /// Ladder rung the run was pinned at, if any.
    pub rung: Option<u8>,
    /// All cases: counts and metrics with 95% intervals.
    pub overall: Summary,
    /// Per case kind.
    pub per_kind: BTreeMap<String, Summary>,
    /// Per phase.
    pub per_phase: BTreeMap<String, Summary>,
    /// Latency percentiles per stage (ms).
    pub latency_ms: BTreeMap<String, BTreeMap<String, f64>>,
    /// The gate's verdict, when a baseline was given.
    pub gate: Option<GateInfo>,
    /// Requester and approver.
    pub approval: Approval,
}

/// What is known about a run besides its report.
#[derive(Debug, Clone)]
pub struct ExportContext {
    /// The appliance key's id.
    pub appliance_id: String,
    /// RFC 3339 time of the export.
    pub created_at: String,
    /// `sha256:<hex>` of the set's case files.
    pub set_digest: String,
    /// `sha256:<hex>` of the bundle manifest.
    pub manifest_digest: Option<String>,
    /// The gate's verdict.
    pub gate: Option<GateInfo>,
    /// Requester and approver.
    pub approval: Approval,
}

impl ExportSummary {
    /// The summary of `report`: its aggregates only, never its cases.
    pub fn of(report: &Report, ctx: ExportContext) -> Self {
        ExportSummary {
            format: EXPORT_FORMAT.into(),
            appliance_id: ctx.appliance_id,
            created_at: ctx.created_at,
            set: SetInfo {
                name: report.set.clone(),
                digest: ctx.set_digest,
                cases: report.overall.cases,
            },
            bundle: BundleInfo {
                version: report.bundle_version.clone(),
                manifest_digest: ctx.manifest_digest,
            },
            rung: report.rung,
            overall: report.overall.clone(),
            per_kind: report.per_kind.clone(),
            per_phase: report.per_phase.clone(),
            latency_ms: report.latency_ms.clone(),
            gate: ctx.gate,
            approval: ctx.approval,
        }
    }
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct SignedExport {
    summary: ExportSummary,
    signature: SignatureEntry,
}

fn summary_bytes(s: &ExportSummary) -> Vec<u8> {
    serde_json::to_vec(s).expect("an export summary serializes")
}

fn canonical(signed: &SignedExport) -> Vec<u8> {
    airlock_signing::signed_file::canonical(signed)
}

/// The export file of `summary`, signed by `key` (the appliance key).
pub fn sign(summary: &ExportSummary, key: &KeyPair) -> Vec<u8> {
    let signature = key.sign(Purpose::EvalExport, &summary_bytes(summary));
    canonical(&SignedExport {
        summary: summary.clone(),
        signature,
    })
}

/// Why an export file was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ExportError {
    /// Larger than [`MAX_EXPORT_BYTES`].
    #[error("the export is {0} bytes; at most {MAX_EXPORT_BYTES} are read")]
    TooLarge(usize),
    /// Not an export file.
    #[error("not an eval export: {0}")]
    Malformed(String),
    /// Another format version.
    #[error("unknown export format `{0}` (this build reads {EXPORT_FORMAT})")]
    Format(String),
    /// Parsed, but not byte-for-byte as it was signed.
    #[error("the export was altered: it is not in the form it was signed in")]
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
    #[error("the signature does not verify: the summary was altered after signing")]
    BadSignature,
}

/// Verifies an export file against the appliance's public key; the summary it vouches for.
pub fn verify(bytes: &[u8], key: &PublicKey) -> Result<ExportSummary, ExportError> {
    if bytes.len() > MAX_EXPORT_BYTES {
        return Err(ExportError::TooLarge(bytes.len()));
    }
    let signed: SignedExport =
        serde_json::from_slice(bytes).map_err(|e| ExportError::Malformed(e.to_string()))?;
    if signed.summary.format != EXPORT_FORMAT {
        return Err(ExportError::Format(signed.summary.format));
    }
    airlock_signing::signed_file::check(
        bytes,
        &canonical(&signed),
        &signed.signature,
        key,
        Purpose::EvalExport,
        &summary_bytes(&signed.summary),
    )
    .map_err(|r| match r {
        Refusal::Altered => ExportError::Altered,
        Refusal::WrongKey {
            signed_by,
            expected,
        } => ExportError::WrongKey {
            signed_by,
            expected,
        },
        Refusal::BadSignature => ExportError::BadSignature,
    })?;
    Ok(signed.summary)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::CaseScore;

    fn case(id: &str, kind: &str, hit: Option<bool>, abstained: Option<bool>) -> CaseScore {
        CaseScore {
            id: id.into(),
            kind: kind.into(),
            phase: "v1".into(),
            ndcg_10: Some(0.5),
            recall_10: Some(1.0),
            recall_100: None,
            mrr_10: Some(0.5),
            answer_hit: hit,
            citation_precision: Some(1.0),
            citation_recall: Some(1.0),
            abstained,
            leaks: Vec::new(),
            error: None,
            retrieved: vec!["doc-secret-0042".into()],
            cited: vec!["doc-secret-0042".into()],
            answer: Some("The Fairhaven covenant is 4.10x".into()),
            invented_values: None,
            answer_words: None,
        }
    }

    fn report() -> Report {
        let cases = vec![
            case("hb-0001", "answerable", Some(true), None),
            case("hb-0002", "answerable", Some(false), None),
            case("hb-0003", "acl_denied", None, Some(true)),
        ];
        let mut lat = BTreeMap::new();
        lat.insert("chat".to_string(), vec![100.0, 200.0, 300.0]);
        Report::new("bank-dev", Some("0.1.0".into()), Some(0), cases, &lat)
    }

    fn ctx(key: &KeyPair) -> ExportContext {
        ExportContext {
            appliance_id: key.key_id().as_str().to_string(),
            created_at: "2026-12-01T18:00:00Z".into(),
            set_digest: "sha256:00".into(),
            manifest_digest: Some("sha256:11".into()),
            gate: None,
            approval: Approval {
                requested_by: "olga".into(),
                approved_by: "adam".into(),
            },
        }
    }

    #[test]
    fn an_export_holds_no_case_content_and_verifies() {
        let key = KeyPair::from_seed([7; 32]);
        let summary = ExportSummary::of(&report(), ctx(&key));
        let bytes = sign(&summary, &key);
        let text = String::from_utf8(bytes.clone()).unwrap();
        for secret in ["hb-0001", "doc-secret-0042", "Fairhaven", "4.10x"] {
            assert!(!text.contains(secret), "{secret} leaked into the export");
        }
        let back = verify(&bytes, &key.public()).unwrap();
        assert_eq!(back, summary);
        assert_eq!(back.overall.cases, 3);
        assert!(back.per_kind.contains_key("acl_denied"));
    }

    #[test]
    fn a_tampered_byte_a_flipped_metric_or_another_key_is_refused() {
        let key = KeyPair::from_seed([7; 32]);
        let bytes = sign(&ExportSummary::of(&report(), ctx(&key)), &key);
        // Every single-byte change is refused, whatever it hits.
        let mut refused = 0;
        for at in (0..bytes.len()).step_by(7) {
            let mut t = bytes.clone();
            t[at] ^= 0x01;
            assert!(
                verify(&t, &key.public()).is_err(),
                "byte {at} changed, still verifies"
            );
            refused += 1;
        }
        assert!(refused > 50);
        // A metric changed and the file re-written canonically: the signature fails.
        let mut signed: SignedExport = serde_json::from_slice(&bytes).unwrap();
        signed
            .summary
            .overall
            .metrics
            .get_mut("answer_hit_rate")
            .unwrap()
            .mean = 0.99;
        assert_eq!(
            verify(&canonical(&signed), &key.public()),
            Err(ExportError::BadSignature)
        );
        // Whitespace added: not the signed form.
        let mut spaced = bytes.clone();
        spaced.insert(1, b' ');
        assert_eq!(verify(&spaced, &key.public()), Err(ExportError::Altered));
        // Another appliance's key.
        let other = KeyPair::from_seed([8; 32]);
        assert!(matches!(
            verify(&bytes, &other.public()),
            Err(ExportError::WrongKey { .. })
        ));
        assert!(matches!(
            verify(b"{}", &key.public()),
            Err(ExportError::Malformed(_))
        ));
    }

    #[test]
    fn the_gate_is_exported_without_case_ids() {
        let v = Verdict {
            failures: vec![
                GateFailure::Regression("hb-0007".into()),
                GateFailure::MetricDrop {
                    metric: "answer_hit_rate".into(),
                    baseline: 0.6,
                    candidate: 0.5,
                },
            ],
        };
        let g = GateInfo::of(&v, "sha256:22".into());
        assert!(!g.passed);
        assert_eq!(g.regressions_failed, 1);
        assert_eq!(g.failures, ["answer_hit_rate fell from 0.6000 to 0.5000"]);
    }
}
