//! `airlock eval export` and `airlock eval verify-export`: the signed, content-free eval summary
//! that may leave the box, approved by two people (four eyes) and recorded in the audit log.
//!
//! Four eyes: the export is requested by one operator (or admin) and approved by another; each
//! proves who they are with their own bearer token (`--token-file`, `--approver-token-file`:
//! files, so no secret is on a command line or in the shell history). Both tokens are checked
//! against the data directory's users, the two must be different people, and the approval is
//! appended to the audit log (requester, approver, the export's SHA-256) before the file is
//! written. A refused export writes nothing and records nothing.

use std::path::{Path, PathBuf};

use airlock_acl::{Principal, Role};
use airlock_eval::export::{self, Approval, ExportContext, ExportSummary, GateInfo};
use airlock_eval::gate::{self, Baseline, Report};
use anyhow::{Context, bail};
use sha2::{Digest, Sha256};

use crate::startup;

/// `airlock eval export`.
#[derive(Debug, clap::Args)]
pub struct ExportArgs {
    /// The appliance's data directory (users, audit log, appliance key, installed bundle).
    #[arg(long = "data", env = "AIRLOCK_DATA", default_value = "./airlock-data")]
    pub data: PathBuf,
    /// The run's output directory (its `report.json`) or the report file itself.
    #[arg(long)]
    pub report: PathBuf,
    /// The golden set the report was made from (its digest goes into the export).
    #[arg(long)]
    pub set: PathBuf,
    /// A baseline: the gate's verdict against it goes into the export.
    #[arg(long)]
    pub baseline: Option<PathBuf>,
    /// Tolerated drop of any headline metric (with --baseline).
    #[arg(long, default_value_t = 0.01)]
    pub epsilon: f64,
    /// The requester's bearer token, in a file.
    #[arg(long)]
    pub token_file: PathBuf,
    /// The approver (a second operator or admin) by user id.
    #[arg(long)]
    pub approved_by: String,
    /// The approver's bearer token, in a file.
    #[arg(long)]
    pub approver_token_file: PathBuf,
    /// Where to write the signed export (refused if it exists).
    #[arg(long)]
    pub out: PathBuf,
}

/// `airlock eval verify-export`.
#[derive(Debug, clap::Args)]
pub struct VerifyExportArgs {
    /// The export file.
    pub file: PathBuf,
    /// The appliance's public key (`DATA/keys/appliance.pub` of the box that made it).
    #[arg(long)]
    pub appliance_key: PathBuf,
}

/// The golden-set files a set digest covers, in this order, when present.
pub const SET_FILES: [&str; 7] = [
    "golden.jsonl",
    "followups.jsonl",
    "corpus.jsonl",
    "iam_v1.jsonl",
    "iam_v2.jsonl",
    "deletions.json",
    "queries.jsonl",
];

/// `sha256:<hex>` over the set's files: each present file's name, a NUL, its length as 8
/// little-endian bytes and its bytes (so moving bytes between files changes the digest).
pub fn set_digest(dir: &Path) -> anyhow::Result<String> {
    let mut h = Sha256::new();
    let mut any = false;
    for name in SET_FILES {
        let p = dir.join(name);
        if !p.exists() {
            continue;
        }
        let bytes = std::fs::read(&p).with_context(|| format!("reading {}", p.display()))?;
        h.update(name.as_bytes());
        h.update([0]);
        h.update((bytes.len() as u64).to_le_bytes());
        h.update(&bytes);
        any = true;
    }
    if !any {
        bail!(
            "{} holds no golden-set file ({})",
            dir.display(),
            SET_FILES.join(", ")
        );
    }
    Ok(format!("sha256:{}", hex::encode(h.finalize())))
}

fn file_digest(path: &Path) -> anyhow::Result<String> {
    let bytes = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    Ok(format!("sha256:{}", hex::encode(Sha256::digest(&bytes))))
}

fn read_token(path: &Path) -> anyhow::Result<String> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let token = text.trim();
    if token.is_empty() {
        bail!("{} is empty", path.display());
    }
    Ok(token.to_string())
}

/// Evals are an operator's work; an admin may request or approve one too.
fn may_approve(p: &Principal) -> bool {
    p.roles.contains(&Role::Admin) || p.roles.contains(&Role::Operator)
}

/// Runs `airlock eval export`.
pub fn export(a: ExportArgs) -> anyhow::Result<bool> {
    if a.out.exists() {
        bail!("{} exists; an export is never overwritten", a.out.display());
    }
    let report_path = if a.report.is_dir() {
        a.report.join("report.json")
    } else {
        a.report.clone()
    };
    let report: Report = gate::read_json(&report_path)?;
    let set_digest = set_digest(&a.set)?;
    let acl = startup::open_acl(&a.data)?;
    let requester = acl
        .authenticate(&read_token(&a.token_file)?)
        .context("the requester's token (--token-file) is not valid on this appliance")?;
    let approver = acl
        .authenticate(&read_token(&a.approver_token_file)?)
        .context("the approver's token (--approver-token-file) is not valid on this appliance")?;
    if approver.user_id != a.approved_by {
        bail!(
            "the approver's token belongs to another user than --approved-by {}",
            a.approved_by
        );
    }
    if requester.user_id == approver.user_id {
        bail!(
            "four eyes: the export must be approved by a second person (requester and approver are both {})",
            requester.user_id
        );
    }
    for (who, p) in [("requester", &requester), ("approver", &approver)] {
        if !may_approve(p) {
            bail!(
                "the {who} {} holds neither the operator nor the admin role",
                p.user_id
            );
        }
    }
    let gate = match &a.baseline {
        Some(b) => {
            let baseline: Baseline = gate::read_json(b)?;
            let verdict = gate::gate(&report, &baseline, a.epsilon, &[]);
            Some(GateInfo::of(&verdict, file_digest(b)?))
        }
        None => None,
    };
    let store = airlock_bundle::Store::open(&a.data)?;
    let manifest_digest = match store.current()? {
        Some(installed) => Some(file_digest(&installed.dir.join("manifest.json"))?),
        None => None,
    };
    let key = airlock_evidence::appliance_key::load(&a.data)?;
    let summary = ExportSummary::of(
        &report,
        ExportContext {
            appliance_id: key.key_id().as_str().to_string(),
            created_at: airlock_evidence::feedback::rfc3339_us(now_us()),
            set_digest,
            manifest_digest,
            gate,
            approval: Approval {
                requested_by: requester.user_id.clone(),
                approved_by: approver.user_id.clone(),
            },
        },
    );
    let bytes = export::sign(&summary, &key);
    let digest = format!("sha256:{}", hex::encode(Sha256::digest(&bytes)));
    // The approval is on record before the file exists.
    acl.audit_admin(
        requester.user_id.as_str(),
        serde_json::json!({
            "action": "eval_export",
            "approved_by": approver.user_id,
            "export_sha256": digest,
            "set_digest": summary.set.digest,
            "cases": summary.set.cases,
        }),
    )?;
    write_new(&a.out, &bytes)?;
    println!(
        "export written to {} ({digest}), signed by appliance key {}; verify off-box with \
         `airlock eval verify-export {} --appliance-key {}`",
        a.out.display(),
        key.key_id(),
        a.out.display(),
        airlock_evidence::appliance_key::public_path(&a.data).display()
    );
    Ok(true)
}

fn now_us() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_micros() as i64)
        .unwrap_or(0)
}

fn write_new(path: &Path, bytes: &[u8]) -> anyhow::Result<()> {
    use std::io::Write;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(path)
        .with_context(|| format!("creating {}", path.display()))?;
    f.write_all(bytes)?;
    f.sync_all()?;
    Ok(())
}

/// Runs `airlock eval verify-export`: prints the verified summary's headline, exit 1 when the
/// file does not verify.
pub fn verify(a: VerifyExportArgs) -> anyhow::Result<bool> {
    let key = airlock_signing::PublicKey::load(&a.appliance_key)?;
    let len = std::fs::metadata(&a.file)
        .with_context(|| format!("reading {}", a.file.display()))?
        .len();
    if len > export::MAX_EXPORT_BYTES as u64 {
        eprintln!("refused: {}", export::ExportError::TooLarge(len as usize));
        return Ok(false);
    }
    let bytes = std::fs::read(&a.file).with_context(|| format!("reading {}", a.file.display()))?;
    match export::verify(&bytes, &key) {
        Ok(s) => {
            println!(
                "verified: appliance {}, set {} ({}, {} cases), bundle {}, made {}, requested by {}, approved by {}",
                s.appliance_id,
                s.set.name,
                s.set.digest,
                s.set.cases,
                s.bundle.version.as_deref().unwrap_or("unknown"),
                s.created_at,
                s.approval.requested_by,
                s.approval.approved_by,
            );
            println!(
                "leaking cases {}, failed cases {}, gate {}",
                s.overall.leaking_cases,
                s.overall.failed_cases,
                match &s.gate {
                    Some(g) if g.passed => "passed",
                    Some(_) => "refused",
                    None => "not run",
                }
            );
            for (name, e) in &s.overall.metrics {
                println!(
                    "{name} {:.4} [{:.4}, {:.4}] (n {})",
                    e.mean, e.lo, e.hi, e.n
                );
            }
            Ok(true)
        }
        Err(e) => {
            eprintln!("refused: {e}");
            Ok(false)
        }
    }
}
