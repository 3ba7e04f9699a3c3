//! `airlock ingest|delete|reconcile|reindex`: document administration on the data directory
//! (offline: stop the daemon first, or use the HTTP API while it runs; the index writer is
//! single-process).

use std::path::PathBuf;

use airlock_retrieval::DeleteOutcome;
use anyhow::Context;
use indicatif::ProgressBar;

use crate::config::Config;
use crate::startup;

/// Where the appliance lives and which keyring verifies its bundle.
#[derive(Debug, Clone, clap::Args)]
pub struct StoreArgs {
    /// The appliance's data directory.
    #[arg(long = "data", env = "AIRLOCK_DATA", default_value = "./airlock-data")]
    pub data: PathBuf,
    /// Trusted keyring [default: <data>/keys/trusted.json].
    #[arg(long, env = "AIRLOCK_KEYRING")]
    pub keyring: Option<PathBuf>,
}

impl StoreArgs {
    fn config(&self) -> Config {
        Config {
            data: Some(self.data.clone()),
            keyring: self.keyring.clone(),
            ..Config::default()
        }
    }

    /// Verifies the bundle, loads its embedder and opens the document store.
    pub(super) fn retrieval(&self) -> anyhow::Result<std::sync::Arc<airlock_retrieval::Retrieval>> {
        let bundle = startup::verify_bundle(&self.config())?;
        let embedder = startup::load_embedder(&bundle)?;
        startup::check_embedder(&self.data, &bundle)?;
        let retrieval = startup::open_retrieval(&self.data, embedder)?;
        startup::mark_release(&self.data, &bundle.version)?;
        Ok(retrieval)
    }
}

/// `airlock ingest PATH...`.
#[derive(Debug, clap::Args)]
pub struct IngestArgs {
    /// Data directory and keyring.
    #[command(flatten)]
    pub store: StoreArgs,
    /// Files or directories (.txt, .md, .html, .jsonl, .pdf, .docx, .xlsx/.xlsm, .pptx, .eml,
    /// .csv; a .msg, a scan or an encrypted file is refused per file with its reason). A file
    /// in a directory gets its path relative to it as document id; `DIR/.acl.jsonl` (if
    /// present) maps path globs to grants; a file already stored under its id with the same
    /// SHA-256 is skipped (re-run an interrupted ingest as it was).
    #[arg(required = true)]
    pub paths: Vec<PathBuf>,
    /// Documents per transaction.
    #[arg(long, default_value_t = 64)]
    pub batch: usize,
    /// Append one JSON line per committed transaction to this file (created if absent),
    /// written and fsynced right after the commit: every document it names is stored.
    #[arg(long, value_name = "PATH")]
    pub ack_file: Option<PathBuf>,
    /// Write a JSON report (counts and every refused file with its reason) to this file.
    #[arg(long, value_name = "FILE")]
    pub report: Option<PathBuf>,
    /// The daemon's configuration file, for its `[extract]` limits [default: the built-in
    /// limits].
    #[arg(long = "config", env = "AIRLOCK_CONFIG", value_name = "FILE")]
    pub config: Option<PathBuf>,
}

/// The acknowledgement file of `airlock ingest --ack-file`: one JSON line per committed
/// transaction, appended with one write, then fsynced (a regular file) before the batch is
/// indexed. A last line without its newline was cut short by a crash and acknowledges nothing.
pub(super) struct AckFile {
    path: PathBuf,
    file: std::fs::File,
    sync: bool,
}

impl AckFile {
    pub(super) fn open(path: &std::path::Path) -> anyhow::Result<Self> {
        let existed = path.exists();
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .with_context(|| format!("opening the acknowledgement file {}", path.display()))?;
        let sync = file.metadata()?.is_file();
        if sync && !existed {
            // The new directory entry must survive a power cut along with the lines.
            let dir = path
                .parent()
                .filter(|p| !p.as_os_str().is_empty())
                .unwrap_or(std::path::Path::new("."));
            std::fs::File::open(dir)
                .and_then(|d| d.sync_all())
                .with_context(|| format!("syncing {}", dir.display()))?;
        }
        Ok(Self {
            path: path.to_path_buf(),
            file,
            sync,
        })
    }

    /// Appends one acknowledgement line and makes it durable.
    pub(super) fn write(
        &mut self,
        source: &std::path::Path,
        batch: usize,
        outcomes: &[airlock_retrieval::UpsertOutcome],
    ) -> anyhow::Result<()> {
        use std::io::Write;
        let line = serde_json::json!({
            "path": source,
            "batch": batch,
            "documents": outcomes,
        });
        let mut buf = serde_json::to_vec(&line)?;
        buf.push(b'\n');
        self.file
            .write_all(&buf)
            .and_then(|()| {
                if self.sync {
                    self.file.sync_data()
                } else {
                    Ok(())
                }
            })
            .with_context(|| format!("writing the acknowledgement file {}", self.path.display()))
    }
}

/// The ingest failpoints (`AIRLOCK_FAILPOINT`, crash tests): `STAGE` stops in the first batch,
/// `STAGE@N` in the N-th batch of the run (1-based). Stages: `ingest-after-embed` (embedded,
/// nothing of the batch committed), `ingest-after-commit` (committed and acknowledged, not
/// indexed), `ingest-after-bm25` (in BM25, not in the vector index).
pub(super) fn failpoint(stage: &str, batch: usize) {
    if batch == 1 {
        super::bundle::stop_at(stage);
    }
    super::bundle::stop_at(&format!("{stage}@{batch}"));
}

/// `airlock delete DOC_ID...`.
#[derive(Debug, clap::Args)]
pub struct DeleteArgs {
    /// Data directory and keyring.
    #[command(flatten)]
    pub store: StoreArgs,
    /// Document ids to tombstone.
    #[arg(required = true)]
    pub doc_ids: Vec<String>,
}

/// `airlock reconcile --source-ids FILE`.
#[derive(Debug, clap::Args)]
pub struct ReconcileArgs {
    /// Data directory and keyring.
    #[command(flatten)]
    pub store: StoreArgs,
    /// The source's current document ids: one per line, or a JSON array.
    #[arg(long)]
    pub source_ids: PathBuf,
    /// Accept an empty list (tombstones every document).
    #[arg(long)]
    pub allow_empty: bool,
}

/// `airlock purge`.
#[derive(Debug, clap::Args)]
pub struct PurgeArgs {
    /// Data directory and keyring.
    #[command(flatten)]
    pub store: StoreArgs,
    /// Only documents tombstoned at least this long ago: seconds, or a number with s, m, h or
    /// d (`30d`). Default 0: every tombstoned document.
    #[arg(long, default_value = "0", value_parser = parse_retention)]
    pub retention: std::time::Duration,
}

fn parse_retention(s: &str) -> Result<std::time::Duration, String> {
    let (num, unit) = match s.find(|c: char| !c.is_ascii_digit()) {
        Some(i) => s.split_at(i),
        None => (s, "s"),
    };
    let n: u64 = num
        .parse()
        .map_err(|_| format!("`{s}`: expected a whole number with s, m, h or d"))?;
    let secs = match unit {
        "s" => Some(n),
        "m" => n.checked_mul(60),
        "h" => n.checked_mul(3600),
        "d" => n.checked_mul(86_400),
        _ => None,
    }
    .ok_or_else(|| format!("`{s}`: expected a whole number with s, m, h or d"))?;
    Ok(std::time::Duration::from_secs(secs))
}

/// Removes tombstoned documents for good and prints the purge record.
pub fn purge(args: PurgeArgs) -> anyhow::Result<bool> {
    let retrieval = args.store.retrieval()?;
    let acl = startup::open_acl(&args.store.data)?;
    let conversations =
        airlock_evidence::feedback::FeedbackStore::open(&startup::db_path(&args.store.data))?;
    let record = crate::routes::documents::purge_documents(
        &acl,
        &retrieval,
        Some(&conversations),
        airlock_acl::Actor::from(crate::cli::users::ACTOR),
        args.retention,
    )
    .map_err(|e| anyhow::anyhow!("{}", e.problem().detail))?;
    println!("{}", serde_json::to_string_pretty(&record)?);
    Ok(true)
}

/// `airlock reindex`.
#[derive(Debug, clap::Args)]
pub struct ReindexArgs {
    /// Data directory and keyring.
    #[command(flatten)]
    pub store: StoreArgs,
}

/// Ingests files; exit code 1 if any document was refused.
pub fn ingest(args: IngestArgs) -> anyhow::Result<bool> {
    super::ingest_dir::run(args)
}

/// Tombstones documents; exit code 1 if an id was never seen.
pub fn delete(args: DeleteArgs) -> anyhow::Result<bool> {
    let retrieval = args.store.retrieval()?;
    let mut ok = true;
    for id in &args.doc_ids {
        match retrieval.delete(id)? {
            DeleteOutcome::Deleted => println!("{id}: deleted"),
            DeleteOutcome::AlreadyDeleted => println!("{id}: already deleted"),
            DeleteOutcome::NotFound => {
                eprintln!("{id}: no such document");
                ok = false;
            }
        }
    }
    Ok(ok)
}

/// Reads a list of ids: a JSON array or one id per line.
pub fn read_ids(path: &std::path::Path) -> anyhow::Result<Vec<String>> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    if text.trim_start().starts_with('[') {
        return serde_json::from_str(&text).with_context(|| format!("parsing {}", path.display()));
    }
    Ok(text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .map(str::to_owned)
        .collect())
}

/// Tombstones live documents the source no longer has; prints the report as JSON.
pub fn reconcile(args: ReconcileArgs) -> anyhow::Result<bool> {
    let ids = read_ids(&args.source_ids)?;
    let retrieval = args.store.retrieval()?;
    let report = retrieval.reconcile(&ids, args.allow_empty)?;
    println!("{}", serde_json::to_string_pretty(&report)?);
    Ok(true)
}

/// Remakes every index without dead chunks (see `Retrieval::reindex`).
pub fn reindex(args: ReindexArgs) -> anyhow::Result<bool> {
    let retrieval = args.store.retrieval()?;
    let spinner = ProgressBar::new_spinner();
    spinner.set_message("reindexing");
    spinner.enable_steady_tick(std::time::Duration::from_millis(200));
    let report = retrieval.reindex()?;
    spinner.finish_and_clear();
    println!("{}", serde_json::to_string_pretty(&report)?);
    Ok(true)
}
