//! The ingest queue: corpora ingested by the daemon in the background while it serves.
//!
//! `DATA/ingest-queue/` holds JSON-lines corpora (the `airlock ingest FILE.jsonl` format), one
//! file per job, and folders (`*.folder`: a copy of a folder with its `.acl.jsonl`, ingested as
//! `airlock ingest DIR` does, [`enqueue_folder`]), taken in name order. A job is written there
//! under a temporary name and renamed into place ([`enqueue`]), so the daemon never reads half
//! a file; only `*.jsonl` files and `*.folder` directories are jobs. The daemon's worker
//! ([`spawn`]) ingests each job in batches (every batch commits durably, as for `airlock
//! ingest`), then removes the file. A daemon stopped mid-job takes the job up again at its next
//! start: the documents already stored are unchanged and skipped by content hash, so only the
//! rest is embedded. The worker looks for new jobs every
//! [`POLL_INTERVAL`] while the daemon runs.
//!
//! Documents become readable as their batches commit, to the readers their grants name: the
//! grants (e.g. an IAM snapshot applied before the corpus is queued) may precede the documents,
//! as ordinals are shared by grants and documents. Progress is [`Status`], shown by `GET /v1/info`
//! (counts to operators, only "indexing or not" to everyone else) and the web UI's footer.
//!
//! Nothing of a document's content is logged: job names, counts and timings only.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::Context;
use parking_lot::Mutex;
use serde::Serialize;

/// The queue's directory beneath the data directory.
pub use airlock_platform::paths::QUEUE_DIR;
/// How often the worker looks for new jobs when the queue is empty.
pub const POLL_INTERVAL: Duration = Duration::from_secs(10);
/// How long the worker waits before retrying a job that failed (not a refused document: a
/// failure of the store or the embedder).
pub const RETRY_AFTER: Duration = Duration::from_secs(60);
/// Documents per ingest batch (each batch commits on its own).
pub const BATCH: usize = 128;
/// Longest job name (the file name without its sequence prefix and `.jsonl`), bytes.
pub const MAX_JOB_NAME: usize = 64;
/// Finished jobs kept in [`QueueStatus::finished`].
pub const FINISHED_KEPT: usize = 10;
/// Refusal reasons kept per job in [`FinishedJob::refusals`] (operators only).
pub const REFUSALS_KEPT: usize = 5;

/// The job in progress.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct JobStatus {
    /// The job's name (`bank-dev` for `001-bank-dev.jsonl`).
    pub name: String,
    /// Documents in the job.
    pub docs_total: usize,
    /// Documents done: stored, unchanged or refused.
    pub docs_done: usize,
    /// Documents refused so far.
    pub refused: usize,
    /// Chunks embedded so far.
    pub chunks_done: usize,
    /// Seconds since the job started.
    pub elapsed_s: f64,
    /// Chunks embedded per second so far.
    pub chunks_per_s: f64,
    /// Estimated seconds to the end of the job (from the documents' rate so far).
    pub eta_s: Option<f64>,
    /// The last failure of this job (it is retried after [`RETRY_AFTER`]).
    pub last_error: Option<String>,
    #[serde(skip)]
    started: Option<Instant>,
}

/// A finished job.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct FinishedJob {
    /// The job's name.
    pub name: String,
    /// Documents stored (new or changed) or unchanged.
    pub stored: usize,
    /// Documents refused.
    pub refused: usize,
    /// The first refusals' reasons (each names its document).
    pub refusals: Vec<String>,
    /// Seconds the job took.
    pub seconds: f64,
    /// When it finished, Unix seconds.
    pub finished_at: u64,
}

/// The queue as the worker sees it.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct QueueStatus {
    /// The job in progress, if any.
    pub job: Option<JobStatus>,
    /// Jobs waiting behind it.
    pub queued: usize,
    /// The last [`FINISHED_KEPT`] finished jobs, latest last.
    pub finished: Vec<FinishedJob>,
}

impl QueueStatus {
    /// True while a job is in progress or waiting.
    pub fn active(&self) -> bool {
        self.job.is_some() || self.queued > 0
    }
}

/// Shared progress of the worker.
#[derive(Debug, Default)]
pub struct Status(Mutex<QueueStatus>);

impl Status {
    /// A copy of the current status.
    pub fn snapshot(&self) -> QueueStatus {
        let mut s = self.0.lock().clone();
        if let Some(j) = s.job.as_mut()
            && let Some(t) = j.started
        {
            j.elapsed_s = t.elapsed().as_secs_f64();
        }
        s
    }

    fn update(&self, f: impl FnOnce(&mut QueueStatus)) {
        f(&mut self.0.lock());
    }
}

/// A queued job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Job {
    /// Its file (or folder).
    pub path: PathBuf,
    /// Its name (see [`JobStatus::name`]).
    pub name: String,
    /// A folder job (`NNN-name.folder/`), else a JSON-lines corpus.
    pub folder: bool,
}

/// Progress of a folder job, reported by its [`FolderIngest`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FolderProgress {
    /// Files in the folder.
    pub files_total: usize,
    /// Files done: stored, unchanged, skipped or refused.
    pub files_done: usize,
    /// Files (or JSONL lines) refused so far.
    pub refused: usize,
    /// Chunks embedded so far.
    pub chunks: usize,
}

/// What a folder job did.
#[derive(Debug, Clone, PartialEq)]
pub struct FolderReport {
    /// The counts.
    pub outcome: JobOutcome,
    /// Every refusal, naming its file.
    pub refusals: Vec<String>,
}

/// Runs a folder job: the folder ingest of `airlock ingest DIR` over `services` (grants from
/// the folder's `.acl.jsonl`), reporting progress. The command line provides it (the daemon's
/// and the demo's callers), so that this module does not depend on the command line.
pub type FolderIngest = dyn Fn(
        &crate::services::Services,
        &Path,
        &mut dyn FnMut(&FolderProgress),
    ) -> anyhow::Result<FolderReport>
    + Send
    + Sync;

/// The queue directory of `data`.
pub fn queue_dir(data: &Path) -> PathBuf {
    airlock_platform::paths::DataDir::new(data).ingest_queue()
}

/// Checks a job name: 1 to [`MAX_JOB_NAME`] bytes of ASCII letters, digits, `.`, `_`, `-`, not
/// starting with `.`.
pub fn check_name(name: &str) -> anyhow::Result<()> {
    let ok = !name.is_empty()
        && name.len() <= MAX_JOB_NAME
        && !name.starts_with('.')
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
    if ok {
        Ok(())
    } else {
        anyhow::bail!(
            "job name `{}` is not 1-{MAX_JOB_NAME} ASCII letters, digits, `.`, `_` or `-` (not starting with `.`)",
            name.escape_debug()
        )
    }
}

/// The jobs in the queue, in the order they run (file name order).
pub fn pending(data: &Path) -> anyhow::Result<Vec<Job>> {
    let dir = queue_dir(data);
    let entries = match std::fs::read_dir(&dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e).with_context(|| format!("reading {}", dir.display())),
    };
    let mut jobs = Vec::new();
    for entry in entries {
        let entry = entry.with_context(|| format!("reading {}", dir.display()))?;
        let file = entry.file_name();
        let Some(file) = file.to_str() else { continue };
        let (stem, folder) = match (file.strip_suffix(".jsonl"), file.strip_suffix(".folder")) {
            (Some(stem), _) => (stem, false),
            (None, Some(stem)) => (stem, true),
            (None, None) => continue,
        };
        let kind_ok = entry
            .file_type()
            .map(|t| if folder { t.is_dir() } else { t.is_file() })
            .unwrap_or(false);
        if stem.starts_with('.') || !kind_ok {
            continue;
        }
        // `NNN-name.jsonl`: the sequence prefix orders the jobs; the rest names them.
        let name = match stem.split_once('-') {
            Some((seq, rest)) if !seq.is_empty() && seq.bytes().all(|b| b.is_ascii_digit()) => rest,
            _ => stem,
        };
        jobs.push(Job {
            path: entry.path(),
            name: name.to_owned(),
            folder,
        });
    }
    jobs.sort_by(|a, b| a.path.cmp(&b.path));
    Ok(jobs)
}

/// Queues a copy of the JSON-lines corpus `source` as job `name`, after the jobs already queued.
/// Durable when it returns: written under a temporary name, synced, renamed into place and the
/// directory synced, so the worker never sees half a file.
pub fn enqueue(data: &Path, name: &str, source: &Path) -> anyhow::Result<Job> {
    let (dir, next) = next_slot(data, name)?;
    let path = dir.join(format!("{next:03}-{name}.jsonl"));
    let tmp = dir.join(format!(".{next:03}-{name}.jsonl.part"));
    let copy = || -> std::io::Result<()> {
        let mut from = std::fs::File::open(source)?;
        let mut to = std::fs::File::create(&tmp)?;
        std::io::copy(&mut from, &mut to)?;
        to.sync_all()?;
        std::fs::rename(&tmp, &path)?;
        sync_dir(&dir)
    };
    if let Err(e) = copy() {
        let _ = std::fs::remove_file(&tmp);
        return Err(e)
            .with_context(|| format!("queueing {} as {}", source.display(), path.display()));
    }
    Ok(Job {
        path,
        name: name.to_owned(),
        folder: false,
    })
}

/// Checks `name` and returns the queue directory (created) and the next sequence number.
fn next_slot(data: &Path, name: &str) -> anyhow::Result<(PathBuf, u32)> {
    check_name(name)?;
    let dir = queue_dir(data);
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let next = pending(data)?
        .iter()
        .filter_map(|j| {
            let f = j.path.file_name()?.to_str()?;
            f.split_once('-')?.0.parse::<u32>().ok()
        })
        .max()
        .map_or(1, |n| n + 1);
    Ok((dir, next))
}

/// Queues a copy of the folder `source` (its regular files beneath it, the top `.acl.jsonl`
/// included; symbolic links are not followed) as the folder job `name`, after the jobs already
/// queued. Durable when it returns: copied under a temporary name, every file synced, renamed
/// into place and the directory synced.
pub fn enqueue_folder(data: &Path, name: &str, source: &Path) -> anyhow::Result<Job> {
    let (dir, next) = next_slot(data, name)?;
    let path = dir.join(format!("{next:03}-{name}.folder"));
    let tmp = dir.join(format!(".{next:03}-{name}.folder.part"));
    let copy = || -> std::io::Result<()> {
        if tmp.exists() {
            std::fs::remove_dir_all(&tmp)?;
        }
        copy_tree(source, &tmp)?;
        std::fs::rename(&tmp, &path)?;
        sync_dir(&dir)
    };
    if let Err(e) = copy() {
        let _ = std::fs::remove_dir_all(&tmp);
        return Err(e)
            .with_context(|| format!("queueing {} as {}", source.display(), path.display()));
    }
    Ok(Job {
        path,
        name: name.to_owned(),
        folder: true,
    })
}

/// Copies the regular files and directories beneath `from` to `to` (created), syncing each.
fn copy_tree(from: &Path, to: &Path) -> std::io::Result<()> {
    std::fs::create_dir(to)?;
    for entry in std::fs::read_dir(from)? {
        let entry = entry?;
        let t = entry.file_type()?;
        let dst = to.join(entry.file_name());
        if t.is_dir() {
            copy_tree(&entry.path(), &dst)?;
        } else if t.is_file() {
            let mut src = std::fs::File::open(entry.path())?;
            let mut out = std::fs::File::create(&dst)?;
            std::io::copy(&mut src, &mut out)?;
            out.sync_all()?;
        }
    }
    sync_dir(to)
}

/// Makes a rename or removal in `dir` durable.
fn sync_dir(dir: &Path) -> std::io::Result<()> {
    std::fs::File::open(dir)?.sync_all()
}

/// The next job to run, with the count of those behind it recorded in `status`; `None` (and
/// nothing queued) when the queue is empty.
fn next_job(data: &Path, status: &Status) -> anyhow::Result<Option<Job>> {
    let jobs = pending(data)?;
    let queued = jobs.len().saturating_sub(1);
    status.update(|s| s.queued = queued);
    Ok(jobs.into_iter().next())
}

/// What [`run_job`] did.
#[derive(Debug, Clone, PartialEq)]
pub struct JobOutcome {
    /// Documents stored (new, changed or unchanged).
    pub stored: usize,
    /// Documents refused.
    pub refused: usize,
    /// Chunks embedded.
    pub chunks: usize,
}

/// Ingests one job into `services`, reporting progress into `status` and to `observe`, and
/// removes its file when every document is stored or refused. A failure (not a refused
/// document) leaves the file for a later attempt; the batches already committed stay.
///
/// A folder job is run by `folders` (refused without it) and its folder removed likewise.
pub fn run_job(
    services: &crate::services::Services,
    job: &Job,
    status: &Status,
    folders: Option<&FolderIngest>,
    observe: &mut dyn FnMut(&JobStatus),
) -> anyhow::Result<JobOutcome> {
    if job.folder {
        let folders = folders.context("this caller cannot run folder jobs")?;
        return run_folder_job(services, job, status, folders, observe);
    }
    let started = Instant::now();
    let retrieval = &services.retrieval;
    let file = std::fs::File::open(&job.path)
        .with_context(|| format!("opening {}", job.path.display()))?;
    let items = airlock_retrieval::ingest::parse_jsonl(
        &job.name,
        std::io::BufReader::new(file),
        retrieval.config().max_document_bytes,
    );
    let mut current = JobStatus {
        name: job.name.clone(),
        docs_total: items.len(),
        docs_done: 0,
        refused: items.iter().filter(|i| i.is_err()).count(),
        chunks_done: 0,
        elapsed_s: 0.0,
        chunks_per_s: 0.0,
        eta_s: None,
        last_error: None,
        started: Some(started),
    };
    current.docs_done = current.refused;
    status.update(|s| {
        s.job = Some(current.clone());
    });
    observe(&current);
    let (mut chunks_before, mut batch_docs) = (0usize, 0usize);
    let report = retrieval.ingest_items(items, BATCH, &mut |p| {
        use airlock_retrieval::Progress as P;
        match p {
            P::Prepared {
                docs,
                errors,
                unchanged,
                ..
            } => {
                batch_docs = docs;
                chunks_before = current.chunks_done;
                current.docs_done += errors + unchanged;
                current.refused += errors;
            }
            P::Embedded { done, .. } => current.chunks_done = chunks_before + done,
            P::Committed { .. } => current.docs_done += std::mem::take(&mut batch_docs),
            P::Bm25Indexed { .. } | P::Indexed { .. } => return,
        }
        let secs = started.elapsed().as_secs_f64().max(1e-3);
        current.elapsed_s = secs;
        current.chunks_per_s = current.chunks_done as f64 / secs;
        let left = current.docs_total.saturating_sub(current.docs_done);
        current.eta_s =
            (current.docs_done > 0).then(|| secs * left as f64 / current.docs_done as f64);
        let snap = current.clone();
        status.update(|s| s.job = Some(snap));
        observe(&current);
    })?;
    let outcome = JobOutcome {
        stored: report.outcomes.len(),
        refused: report.errors.len(),
        chunks: current.chunks_done,
    };
    let refusals = report
        .errors
        .iter()
        .take(REFUSALS_KEPT)
        .map(ToString::to_string)
        .collect();
    finish(job, status, started, outcome, refusals)
}

/// Runs a folder job with `folders`, progress in files.
fn run_folder_job(
    services: &crate::services::Services,
    job: &Job,
    status: &Status,
    folders: &FolderIngest,
    observe: &mut dyn FnMut(&JobStatus),
) -> anyhow::Result<JobOutcome> {
    let started = Instant::now();
    let mut current = JobStatus {
        name: job.name.clone(),
        docs_total: 0,
        docs_done: 0,
        refused: 0,
        chunks_done: 0,
        elapsed_s: 0.0,
        chunks_per_s: 0.0,
        eta_s: None,
        last_error: None,
        started: Some(started),
    };
    status.update(|s| s.job = Some(current.clone()));
    let report = folders(services, &job.path, &mut |p| {
        let secs = started.elapsed().as_secs_f64().max(1e-3);
        current.docs_total = p.files_total;
        current.docs_done = p.files_done;
        current.refused = p.refused;
        current.chunks_done = p.chunks;
        current.elapsed_s = secs;
        current.chunks_per_s = p.chunks as f64 / secs;
        let left = p.files_total.saturating_sub(p.files_done);
        current.eta_s = (p.files_done > 0).then(|| secs * left as f64 / p.files_done as f64);
        let snap = current.clone();
        status.update(|s| s.job = Some(snap));
        observe(&current);
    })?;
    finish(job, status, started, report.outcome, report.refusals)
}

/// Removes a job's file (or folder) once every document is stored or refused, and records it
/// as finished.
fn finish(
    job: &Job,
    status: &Status,
    started: Instant,
    outcome: JobOutcome,
    refusals: Vec<String>,
) -> anyhow::Result<JobOutcome> {
    let removed = if job.folder {
        std::fs::remove_dir_all(&job.path)
    } else {
        std::fs::remove_file(&job.path)
    };
    removed.with_context(|| format!("removing {}", job.path.display()))?;
    if let Some(dir) = job.path.parent() {
        sync_dir(dir).with_context(|| format!("syncing {}", dir.display()))?;
    }
    let finished = FinishedJob {
        name: job.name.clone(),
        stored: outcome.stored,
        refused: outcome.refused,
        refusals: refusals.into_iter().take(REFUSALS_KEPT).collect(),
        seconds: started.elapsed().as_secs_f64(),
        finished_at: SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs()),
    };
    status.update(|s| {
        s.job = None;
        s.finished.push(finished);
        let over = s.finished.len().saturating_sub(FINISHED_KEPT);
        s.finished.drain(..over);
    });
    Ok(outcome)
}

/// Runs every queued job now, in order, on the calling thread (`airlock demo --setup-only`).
/// Stops at the first failure.
pub fn drain(
    services: &crate::services::Services,
    data: &Path,
    status: &Status,
    folders: &FolderIngest,
    observe: &mut dyn FnMut(&Job, &JobStatus),
) -> anyhow::Result<Vec<(Job, JobOutcome)>> {
    let mut done = Vec::new();
    while let Some(job) = next_job(data, status)? {
        let outcome = run_job(services, &job, status, Some(folders), &mut |j| {
            observe(&job, j)
        })
        .with_context(|| format!("ingest job `{}`", job.name))?;
        done.push((job, outcome));
    }
    Ok(done)
}

/// Starts the daemon's worker thread: it runs the queued jobs in order and then looks for new
/// ones every [`POLL_INTERVAL`]. A failed job is logged, shown in the status and retried after
/// [`RETRY_AFTER`].
pub fn spawn(
    services: Arc<crate::services::Services>,
    data: PathBuf,
    status: Arc<Status>,
    folders: Arc<FolderIngest>,
) -> std::io::Result<std::thread::JoinHandle<()>> {
    std::thread::Builder::new()
        .name("airlock-ingest-queue".into())
        .spawn(move || {
            loop {
                let job = match next_job(&data, &status) {
                    Ok(Some(job)) => job,
                    Ok(None) => {
                        std::thread::sleep(POLL_INTERVAL);
                        continue;
                    }
                    Err(e) => {
                        tracing::error!(error = %format!("{e:#}"), "reading the ingest queue");
                        std::thread::sleep(RETRY_AFTER);
                        continue;
                    }
                };
                tracing::info!(job = %job.name, queued = status.snapshot().queued, "ingest job started");
                match run_job(&services, &job, &status, Some(&*folders), &mut |_| {}) {
                    Ok(o) => tracing::info!(
                        job = %job.name,
                        stored = o.stored,
                        refused = o.refused,
                        chunks = o.chunks,
                        "ingest job finished"
                    ),
                    Err(e) => {
                        let msg = format!("{e:#}");
                        tracing::error!(job = %job.name, error = %msg, "ingest job failed; retrying later");
                        status.update(|s| {
                            if let Some(j) = s.job.as_mut() {
                                j.last_error = Some(msg);
                            }
                        });
                        std::thread::sleep(RETRY_AFTER);
                    }
                }
            }
        })
}
