//! `airlock ingest PATH...` over folders that may hold a file-share export: a streaming walk
//! (one directory's entries at a time, never the whole tree in memory), a progress bar on a
//! terminal (files, bytes, chunks/s, ETA) and progress lines otherwise, resume by SHA-256 (a
//! file already stored under its id with the same digest is skipped), grants from the folder's
//! sidecar `.acl.jsonl` written in the document's own transaction, per-file refusals that never
//! stop the run, listed at the end and in the `--report` JSON.
//!
//! Whoever can write into a folder of the share controls only that folder: a JSONL file's
//! documents get ids under the file's own path (`public/x.jsonl/<id>`, never another file's id)
//! and the JSONL file's grant; a permissions sidecar anywhere but the top of the folder stops
//! the run before anything is written (it would not be applied); sidecar globs treat case as
//! `sidecar_glob_case` says.

use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use airlock_acl::{Acl, Actor, DocGrants};
use airlock_retrieval::ingest::{self, ExtractLimits, SourceFormat};
use airlock_retrieval::sidecar::{GlobCase, SIDECAR_NAME, Sidecar};
use airlock_retrieval::{DocumentInput, Error, Original, Progress, Retrieval, UpsertStatus};
use anyhow::Context;
use indicatif::{ProgressBar, ProgressStyle};
use serde::Serialize;

use super::ingest::{AckFile, IngestArgs, failpoint};
use crate::config::Config;
use airlock_serving::extraction::{ExtractFailure, Extractor};

/// A batch is written once its files hold this many bytes, whatever `--batch` says, so memory
/// stays bounded by about this much plus one file.
const BATCH_BYTES: usize = 64 << 20;

/// Plain progress lines (no terminal) come at most this often.
const LINE_EVERY: Duration = Duration::from_secs(5);

/// The regular files beneath a directory, depth first in name order, reading one directory's
/// entries at a time. Names starting with `.` (the sidecar, `.git`, ...) are skipped, and so are
/// symbolic links (not followed) and special files. A permissions sidecar other than the top
/// one (`DIR/.acl.jsonl`, exactly so spelled) is noted in `stray_sidecars` when its directory
/// is listed, before any file of that directory is returned.
struct Walk {
    root: PathBuf,
    stack: Vec<std::vec::IntoIter<(PathBuf, bool)>>,
    stray_sidecars: Vec<PathBuf>,
}

impl Walk {
    fn new(root: &Path) -> anyhow::Result<Self> {
        let mut w = Self {
            root: root.to_path_buf(),
            stack: Vec::new(),
            stray_sidecars: Vec::new(),
        };
        w.push(root)?;
        Ok(w)
    }

    /// Fails when a permissions sidecar was found that would not be applied.
    fn check_sidecars(&self) -> anyhow::Result<()> {
        match self.stray_sidecars.first() {
            None => Ok(()),
            Some(p) => anyhow::bail!(
                "{}: a permissions sidecar is applied only as {} (exactly so named, at the top \
                 of the folder); move its rules there (paths relative to the folder) or remove \
                 it; stopped before storing anything under it",
                p.display(),
                self.root.join(SIDECAR_NAME).display()
            ),
        }
    }

    fn push(&mut self, dir: &Path) -> anyhow::Result<()> {
        let mut entries = Vec::new();
        for e in std::fs::read_dir(dir).with_context(|| format!("listing {}", dir.display()))? {
            let e = e.with_context(|| format!("listing {}", dir.display()))?;
            let name = e.file_name();
            let name = name.to_string_lossy();
            if name.eq_ignore_ascii_case(SIDECAR_NAME) && (name != SIDECAR_NAME || dir != self.root)
            {
                self.stray_sidecars.push(e.path());
            }
            if name.starts_with('.') {
                continue;
            }
            let t = e.file_type()?;
            if t.is_dir() || t.is_file() {
                entries.push((e.path(), t.is_dir()));
            }
        }
        entries.sort();
        self.stack.push(entries.into_iter());
        Ok(())
    }
}

impl Iterator for Walk {
    type Item = anyhow::Result<PathBuf>;

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            let top = self.stack.last_mut()?;
            match top.next() {
                None => {
                    self.stack.pop();
                }
                Some((p, true)) => {
                    if let Err(e) = self.push(&p) {
                        return Some(Err(e));
                    }
                }
                Some((p, false)) => return Some(Ok(p)),
            }
        }
    }
}

/// The document id of `file` found under `root`: its relative path, `/`-separated.
fn rel_id(root: &Path, file: &Path) -> String {
    file.strip_prefix(root)
        .unwrap_or(file)
        .components()
        .map(|c| c.as_os_str().to_string_lossy())
        .collect::<Vec<_>>()
        .join("/")
}

/// The id of a document of the JSONL file `file_id` (its path in the folder) whose line names
/// `line_id`: `file_id/line_id`, so that a JSONL file can neither name nor replace another
/// file's document. `line_id` must be a relative path without empty, `.` or `..` segments.
fn jsonl_member_id(file_id: &str, line_id: &str) -> airlock_retrieval::Result<String> {
    if line_id
        .split('/')
        .any(|s| s.is_empty() || s == "." || s == "..")
    {
        return Err(Error::InvalidDocumentId {
            doc_id: format!("{file_id}/{line_id}").chars().take(80).collect(),
            reason: "a JSONL line's id in a folder must be a relative path without empty, `.` \
                     or `..` segments",
        });
    }
    let id = format!("{file_id}/{line_id}");
    ingest::validate_doc_id(&id)?;
    Ok(id)
}

/// One refused file (or JSONL line) of the report.
#[derive(Debug, Serialize)]
struct Refused {
    /// The file, relative to its folder (or as given).
    file: String,
    /// A stable code: the extractor's (`no_text_layer`, `encrypted`, `limit_exceeded`,
    /// `malformed`, `unsupported`, `empty`, `extraction_failed`) or `unsupported_format`,
    /// `too_large`, `invalid_utf8`, `invalid_id`, `invalid_jsonl`, `unreadable`,
    /// `acl_case_dependent`.
    code: &'static str,
    /// Why, for a person.
    reason: String,
}

fn code_of(e: &Error) -> &'static str {
    match e {
        Error::Extraction { code, .. } => code,
        Error::UnsupportedFormat { .. } => "unsupported_format",
        Error::DocumentTooLarge { .. } => "too_large",
        Error::InvalidUtf8 { .. } => "invalid_utf8",
        Error::EmptyDocument { .. } => "empty",
        Error::InvalidDocumentId { .. } => "invalid_id",
        Error::InvalidJsonl { .. } => "invalid_jsonl",
        Error::Io { .. } => "unreadable",
        _ => "refused",
    }
}

/// The `--report` file.
#[derive(Debug, Default, Serialize)]
struct Report {
    paths: Vec<PathBuf>,
    files: u64,
    bytes: u64,
    /// Documents written (created or replaced).
    stored: u64,
    /// Documents whose content equalled the stored version (nothing written).
    unchanged: u64,
    /// Files skipped: stored under their id with the same SHA-256.
    skipped: u64,
    refused: u64,
    chunks: u64,
    elapsed_secs: f64,
    chunks_per_sec: f64,
    errors: Vec<Refused>,
}

/// Progress on a terminal (a bar) or as lines on stderr.
struct Meter {
    bar: Option<ProgressBar>,
    /// Neither bar nor lines (a queue job in the daemon: its progress is the queue's status).
    quiet: bool,
    started: Instant,
    last_line: Instant,
    files_total: u64,
    bytes_total: u64,
}

impl Meter {
    fn new(files_total: u64, bytes_total: u64, quiet: bool) -> Self {
        let bar = (!quiet && std::io::stderr().is_terminal()).then(|| {
            let b = ProgressBar::new(bytes_total.max(1));
            b.set_style(
                ProgressStyle::with_template(
                    "{spinner} [{bar:30}] {binary_bytes}/{binary_total_bytes} {msg} ETA {eta}",
                )
                .unwrap_or_else(|_| ProgressStyle::default_bar())
                .progress_chars("=> "),
            );
            b.enable_steady_tick(Duration::from_millis(200));
            b
        });
        let now = Instant::now();
        Self {
            bar,
            quiet,
            started: now,
            last_line: now,
            files_total,
            bytes_total,
        }
    }

    fn update(&mut self, r: &Report, done: bool) {
        if self.quiet {
            return;
        }
        let secs = self.started.elapsed().as_secs_f64().max(1e-3);
        let rate = r.chunks as f64 / secs;
        let msg = format!(
            "files {}/{}, {} chunks, {rate:.1} chunks/s",
            r.files, self.files_total, r.chunks
        );
        if let Some(b) = &self.bar {
            b.set_position(r.bytes);
            b.set_message(msg);
            return;
        }
        if !done && self.last_line.elapsed() < LINE_EVERY {
            return;
        }
        self.last_line = Instant::now();
        let eta = if r.bytes == 0 || done {
            String::new()
        } else {
            let left = secs * (self.bytes_total.saturating_sub(r.bytes)) as f64 / r.bytes as f64;
            format!(", ETA {}s", left.round())
        };
        eprintln!(
            "ingest: {msg}, {:.1}/{:.1} MiB{eta}",
            r.bytes as f64 / 1048576.0,
            self.bytes_total as f64 / 1048576.0
        );
    }

    fn finish(&self) {
        if let Some(b) = &self.bar {
            b.finish_and_clear();
        }
    }
}

/// A source given on the command line.
struct Source {
    path: PathBuf,
    dir: bool,
    sidecar: Option<Sidecar>,
}

/// One run's state.
struct Run<'a> {
    /// Documents per transaction.
    batch: usize,
    /// Who the audit log names for the grants written.
    actor: &'static str,
    retrieval: &'a Retrieval,
    acl: Option<std::sync::Arc<Acl>>,
    limits: ExtractLimits,
    glob_case: GlobCase,
    /// Budgeted worker processes (`[extract]` of the config, else the defaults).
    extractor: &'a Extractor,
    ack: Option<AckFile>,
    /// The source an acknowledgement line names for a document stored with its grant.
    ack_source: PathBuf,
    ack_error: Option<anyhow::Error>,
    batch_no: usize,
    report: Report,
    meter: Meter,
    /// Told the report after every file and batch (the ingest queue's progress).
    observe: &'a mut dyn FnMut(&Report),
    /// Documents waiting for the next transaction, and their file bytes.
    pending: Vec<DocumentInput>,
    pending_bytes: usize,
}

pub(super) fn run(args: IngestArgs) -> anyhow::Result<bool> {
    let config = match &args.config {
        Some(path) => Config {
            config_file: Some(path.clone()),
            ..Config::default()
        }
        .load()
        .with_context(|| format!("reading {}", path.display()))?,
        None => Config::default(),
    };
    let limits = config.extract_limits();
    let extractor = config.extractor();
    let glob_case = config.sidecar_glob_case();
    // Every sidecar is read and checked before anything is written.
    let mut sources = Vec::new();
    for path in &args.paths {
        let meta =
            std::fs::metadata(path).with_context(|| format!("reading {}", path.display()))?;
        let sidecar = if meta.is_dir() {
            read_sidecar(path)?
        } else {
            None
        };
        sources.push(Source {
            path: path.clone(),
            dir: meta.is_dir(),
            sidecar,
        });
    }
    // Totals for the progress (metadata only, streaming); a sidecar that would not be applied
    // stops everything here, before anything is written.
    let (mut files_total, mut bytes_total) = (0u64, 0u64);
    for s in &sources {
        if s.dir {
            let (files, bytes) = folder_totals(&s.path)?;
            files_total += files;
            bytes_total += bytes;
        } else {
            files_total += 1;
            bytes_total += std::fs::metadata(&s.path).map(|m| m.len()).unwrap_or(0);
        }
    }
    let retrieval = args.store.retrieval()?;
    let acl = if sources.iter().any(|s| s.sidecar.is_some()) {
        Some(crate::startup::open_acl(&args.store.data)?)
    } else {
        None
    };
    let ack = args.ack_file.as_deref().map(AckFile::open).transpose()?;
    let mut run = Run {
        batch: args.batch,
        actor: super::users::ACTOR,
        retrieval: &retrieval,
        acl,
        limits,
        glob_case,
        extractor: &extractor,
        ack,
        ack_source: args.paths.first().cloned().unwrap_or_default(),
        ack_error: None,
        batch_no: 0,
        report: Report {
            paths: args.paths.clone(),
            ..Report::default()
        },
        meter: Meter::new(files_total, bytes_total, false),
        observe: &mut |_: &Report| {},
        pending: Vec::new(),
        pending_bytes: 0,
    };
    for s in &sources {
        if s.dir {
            run.folder(&s.path, s.sidecar.as_ref())?;
        } else {
            let id = s
                .path
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            run.file(&s.path, &s.path, id, None, false)?;
        }
        run.flush(&s.path)?;
    }
    run.report.elapsed_secs = run.meter.started.elapsed().as_secs_f64();
    run.report.chunks_per_sec = run.report.chunks as f64 / run.report.elapsed_secs.max(1e-3);
    run.meter.update(&run.report, true);
    run.meter.finish();
    let r = &run.report;
    println!(
        "{} documents stored, {} refused",
        r.stored + r.unchanged + r.skipped,
        r.refused
    );
    eprintln!(
        "{} files, {:.1} MiB: {} written, {} unchanged, {} skipped (same SHA-256 already \
         stored), {} refused; {} chunks in {:.1} s ({:.1} chunks/s)",
        r.files,
        r.bytes as f64 / 1048576.0,
        r.stored,
        r.unchanged,
        r.skipped,
        r.refused,
        r.chunks,
        r.elapsed_secs,
        r.chunks_per_sec
    );
    for e in &r.errors {
        eprintln!("refused: {}: {}", e.file, e.reason);
    }
    if let Some(path) = &args.report {
        write_report(path, r)?;
    }
    if let Some(e) = run.ack_error {
        return Err(e.context("documents committed after this are stored but not acknowledged"));
    }
    Ok(r.refused == 0)
}

/// The folder's permissions sidecar (`DIR/.acl.jsonl`), read and checked, if it has one.
fn read_sidecar(dir: &Path) -> anyhow::Result<Option<Sidecar>> {
    let file = dir.join(SIDECAR_NAME);
    match std::fs::read(&file) {
        Ok(bytes) => Ok(Some(Sidecar::parse(&file.display().to_string(), &bytes)?)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e).with_context(|| format!("reading {}", file.display())),
    }
}

/// The files beneath `dir` and their bytes (metadata only, streaming); a sidecar that would not
/// be applied fails here, before anything is written.
fn folder_totals(dir: &Path) -> anyhow::Result<(u64, u64)> {
    let (mut files, mut bytes) = (0u64, 0u64);
    let mut walk = Walk::new(dir)?;
    for f in walk.by_ref() {
        let f = f?;
        files += 1;
        bytes += std::fs::metadata(&f).map(|m| m.len()).unwrap_or(0);
    }
    walk.check_sidecars()?;
    Ok((files, bytes))
}

/// Ingests a folder job of the ingest queue (airlock_serving::ingest_queue): this folder ingest, as
/// `airlock ingest DIR` runs it (grants from the folder's `.acl.jsonl` in each document's own
/// transaction, files extracted by `services.extractor`, a file stored with the same SHA-256
/// skipped), over the daemon's own stores, without bar or progress lines: progress goes to
/// `observe`. `limits` and `glob_case` are the daemon's configuration's.
pub(crate) fn queue_folder(
    services: &crate::Services,
    dir: &Path,
    limits: ExtractLimits,
    glob_case: GlobCase,
    observe: &mut dyn FnMut(&airlock_serving::ingest_queue::FolderProgress),
) -> anyhow::Result<airlock_serving::ingest_queue::FolderReport> {
    let sidecar = read_sidecar(dir)?;
    let (files_total, bytes_total) = folder_totals(dir)?;
    let files_total = usize::try_from(files_total).unwrap_or(usize::MAX);
    let mut tell = |r: &Report| {
        observe(&airlock_serving::ingest_queue::FolderProgress {
            files_total,
            files_done: usize::try_from(r.files).unwrap_or(usize::MAX),
            refused: usize::try_from(r.refused).unwrap_or(usize::MAX),
            chunks: usize::try_from(r.chunks).unwrap_or(usize::MAX),
        })
    };
    let mut run = Run {
        batch: airlock_serving::ingest_queue::BATCH,
        actor: QUEUE_ACTOR,
        retrieval: &services.retrieval,
        acl: Some(services.acl.clone()),
        limits,
        glob_case,
        extractor: &services.extractor,
        ack: None,
        ack_source: dir.to_path_buf(),
        ack_error: None,
        batch_no: 0,
        report: Report {
            paths: vec![dir.to_path_buf()],
            ..Report::default()
        },
        meter: Meter::new(files_total as u64, bytes_total, true),
        observe: &mut tell,
        pending: Vec::new(),
        pending_bytes: 0,
    };
    run.folder(dir, sidecar.as_ref())?;
    run.flush(dir)?;
    let r = std::mem::take(&mut run.report);
    let report = airlock_serving::ingest_queue::FolderReport {
        outcome: airlock_serving::ingest_queue::JobOutcome {
            stored: usize::try_from(r.stored + r.unchanged + r.skipped).unwrap_or(usize::MAX),
            refused: usize::try_from(r.refused).unwrap_or(usize::MAX),
            chunks: usize::try_from(r.chunks).unwrap_or(usize::MAX),
        },
        refusals: r
            .errors
            .iter()
            .map(|e| format!("{}: {}", e.file, e.reason))
            .collect(),
    };
    Ok(report)
}

/// The ingest queue's runner of folder jobs ([`queue_folder`] with `config`'s `[extract]`
/// limits and `sidecar_glob_case`).
pub(crate) fn folder_ingest(
    config: &Config,
) -> std::sync::Arc<airlock_serving::ingest_queue::FolderIngest> {
    let (limits, glob_case) = (config.extract_limits(), config.sidecar_glob_case());
    std::sync::Arc::new(
        move |services: &crate::Services,
              dir: &Path,
              observe: &mut dyn FnMut(&airlock_serving::ingest_queue::FolderProgress)| {
            queue_folder(services, dir, limits.clone(), glob_case, observe)
        },
    )
}

/// Who the audit log names for the grants of a queued folder's documents.
const QUEUE_ACTOR: &str = "ingest-queue";

/// Writes the report durably (temporary file, fsync, rename).
fn write_report(path: &Path, r: &Report) -> anyhow::Result<()> {
    use std::io::Write;
    let tmp = path.with_extension("partial");
    let mut f =
        std::fs::File::create(&tmp).with_context(|| format!("writing {}", tmp.display()))?;
    serde_json::to_writer_pretty(&mut f, r)?;
    f.write_all(b"\n")?;
    f.sync_all()?;
    std::fs::rename(&tmp, path).with_context(|| format!("writing {}", path.display()))?;
    Ok(())
}

impl Run<'_> {
    /// Ingests the files beneath `dir` with the grants of its `sidecar` (written in order; a
    /// batch of ungranted documents may wait for [`Run::flush`]).
    fn folder(&mut self, dir: &Path, sidecar: Option<&Sidecar>) -> anyhow::Result<()> {
        let mut walk = Walk::new(dir)?;
        while let Some(f) = walk.next() {
            // One that appeared since the first pass: what was stored stays, nothing more.
            walk.check_sidecars()?;
            let f = f?;
            let id = rel_id(dir, &f);
            self.file(dir, &f, id, sidecar, true)?;
        }
        walk.check_sidecars()?;
        Ok(())
    }

    fn progress(&mut self) {
        self.meter.update(&self.report, false);
        (self.observe)(&self.report);
    }

    fn refuse(&mut self, file: String, e: &Error) {
        let reason = match e {
            Error::Extraction { reason, .. } => reason.clone(),
            e => e.to_string(),
        };
        self.refuse_with(file, code_of(e), reason);
    }

    fn refuse_with(&mut self, file: String, code: &'static str, reason: String) {
        self.report.refused += 1;
        self.report.errors.push(Refused { file, code, reason });
    }

    /// Reads, checks and extracts one file; queues its document (or writes it at once with
    /// its grant). `in_folder`: the file was found in a folder (a JSONL file's documents then
    /// get ids under its path).
    fn file(
        &mut self,
        source: &Path,
        file: &Path,
        doc_id: String,
        sidecar: Option<&Sidecar>,
        in_folder: bool,
    ) -> anyhow::Result<()> {
        let size = std::fs::metadata(file).map(|m| m.len()).unwrap_or(0);
        self.report.files += 1;
        let grants = match sidecar.map(|s| s.rule_with(&doc_id, self.glob_case)) {
            None | Some(Ok(None)) => None,
            Some(Ok(Some(r))) => Some(r.grants.clone()),
            Some(Err(depends)) => {
                self.report.bytes += size;
                self.refuse_with(doc_id, "acl_case_dependent", depends.to_string());
                self.progress();
                return Ok(());
            }
        };
        // `None`: skipped (already stored with the same SHA-256).
        let outcome = match self.read(file, &doc_id, size, in_folder) {
            Ok(Read::Skipped) => Ok(None),
            Ok(Read::Docs(docs)) => Ok(Some(docs)),
            Err(e) => Err(e),
            Ok(Read::Extract {
                format,
                bytes,
                sha256,
            }) => {
                let max = self.retrieval.config().max_document_bytes;
                match self
                    .extractor
                    .document(&doc_id, None, &bytes, format, max, &self.limits)
                {
                    Ok(mut d) => {
                        d.original = Some(Original {
                            sha256,
                            media_type: format.media_type().to_owned(),
                            bytes,
                        });
                        Ok(Some(vec![Ok(d)]))
                    }
                    Err(ExtractFailure::Document(e)) => Err(e),
                    // No worker: not this file's fault, and the next would fare no better.
                    Err(e) => return Err(anyhow::Error::new(e).context(doc_id)),
                }
            }
        };
        self.report.bytes += size;
        match outcome {
            Err(e) if e.is_user_error() || matches!(e, Error::Io { .. }) => self.refuse(doc_id, &e),
            Err(e) => return Err(e.into()),
            Ok(None) => self.report.skipped += 1,
            Ok(Some(docs)) => {
                for d in docs {
                    match d {
                        Err(e) if e.is_user_error() => self.refuse(doc_id.clone(), &e),
                        Err(e) => return Err(e.into()),
                        Ok(d) => match &grants {
                            Some(g) => self.with_grant(d, g)?,
                            None => {
                                self.pending_bytes +=
                                    d.original.as_ref().map_or(d.text.len(), |o| o.bytes.len());
                                self.pending.push(d);
                                if self.pending.len() >= self.batch.max(1)
                                    || self.pending_bytes >= BATCH_BYTES
                                {
                                    self.flush(source)?;
                                }
                            }
                        },
                    }
                }
            }
        }
        self.progress();
        Ok(())
    }

    fn read(
        &self,
        file: &Path,
        doc_id: &str,
        size: u64,
        in_folder: bool,
    ) -> airlock_retrieval::Result<Read> {
        let max = self.retrieval.config().max_document_bytes;
        let ext = file.extension().and_then(|e| e.to_str()).unwrap_or("");
        if matches!(ext.to_ascii_lowercase().as_str(), "jsonl" | "ndjson") {
            let f = std::fs::File::open(file).map_err(|e| io_err(file, e))?;
            let mut docs = ingest::parse_jsonl(doc_id, std::io::BufReader::new(f), max);
            if in_folder {
                for d in &mut docs {
                    if let Ok(doc) = d {
                        match jsonl_member_id(doc_id, &doc.doc_id) {
                            Ok(id) => doc.doc_id = id,
                            Err(e) => *d = Err(e),
                        }
                    }
                }
            }
            return Ok(Read::Docs(docs));
        }
        let Some(format) = SourceFormat::from_extension(ext) else {
            return Err(Error::UnsupportedFormat {
                path: PathBuf::from(doc_id),
            });
        };
        ingest::validate_doc_id(doc_id)?;
        if size > max as u64 {
            return Err(Error::DocumentTooLarge {
                doc_id: doc_id.to_owned(),
                bytes: usize::try_from(size).unwrap_or(usize::MAX),
                limit: max,
            });
        }
        let bytes = std::fs::read(file).map_err(|e| io_err(file, e))?;
        let sha256 = airlock_retrieval::sha256_hex(&bytes);
        if self.retrieval.original_digest(doc_id)?.as_deref() == Some(sha256.as_str()) {
            return Ok(Read::Skipped);
        }
        Ok(Read::Extract {
            format,
            bytes,
            sha256,
        })
    }

    /// Stores one document and its sidecar grant in one transaction.
    fn with_grant(&mut self, doc: DocumentInput, grants: &DocGrants) -> anyhow::Result<()> {
        let acl = self.acl.clone().context("a sidecar needs the ACL store")?;
        let id = doc.doc_id.clone();
        let staged = match self.retrieval.stage(doc) {
            Ok(s) => s,
            Err(e) if e.is_user_error() => {
                self.refuse(id, &e);
                return Ok(());
            }
            Err(e) => return Err(e.into()),
        };
        let outcome = crate::routes::documents::store_with_grant(
            &acl,
            self.retrieval,
            Actor::from(self.actor),
            &id,
            grants,
            staged,
        )
        .map_err(|e| anyhow::anyhow!("{id}: {}", e.problem().detail))?;
        self.batch_no += 1;
        self.count(std::slice::from_ref(&outcome));
        if let Some(a) = self.ack.as_mut().filter(|_| self.ack_error.is_none()) {
            self.ack_error = a
                .write(
                    &self.ack_source,
                    self.batch_no,
                    std::slice::from_ref(&outcome),
                )
                .err();
        }
        Ok(())
    }

    fn count(&mut self, outcomes: &[airlock_retrieval::UpsertOutcome]) {
        for o in outcomes {
            match o.status {
                UpsertStatus::Unchanged => self.report.unchanged += 1,
                UpsertStatus::Created | UpsertStatus::Replaced => {
                    self.report.stored += 1;
                    self.report.chunks += o.chunks as u64;
                }
            }
        }
    }

    /// Writes the queued documents in one transaction.
    fn flush(&mut self, source: &Path) -> anyhow::Result<()> {
        if self.pending.is_empty() {
            return Ok(());
        }
        let docs = std::mem::take(&mut self.pending);
        self.pending_bytes = 0;
        let (ack, ack_error, batch_no) = (&mut self.ack, &mut self.ack_error, &mut self.batch_no);
        let r = self
            .retrieval
            .upsert(docs, &mut |p| match p {
                Progress::Prepared { .. } => *batch_no += 1,
                Progress::Embedded { done, total } => {
                    if done == total {
                        failpoint("ingest-after-embed", *batch_no);
                    }
                }
                Progress::Committed { outcomes, .. } => {
                    // The transaction is durable: acknowledge it before indexing. After a
                    // failed write the rest is still stored, but no longer acknowledged.
                    if let Some(a) = ack.as_mut().filter(|_| ack_error.is_none()) {
                        *ack_error = a.write(source, *batch_no, &outcomes).err();
                    }
                    failpoint("ingest-after-commit", *batch_no);
                }
                Progress::Bm25Indexed { .. } => failpoint("ingest-after-bm25", *batch_no),
                Progress::Indexed { .. } => {}
            })
            .with_context(|| format!("ingesting {}", source.display()))?;
        self.count(&r.outcomes);
        for e in &r.errors {
            let file = match e {
                Error::DocumentTooLarge { doc_id, .. }
                | Error::EmptyDocument { doc_id }
                | Error::InvalidDocumentId { doc_id, .. } => doc_id.clone(),
                _ => String::new(),
            };
            self.refuse(file, e);
        }
        self.progress();
        Ok(())
    }
}

enum Read {
    Skipped,
    Docs(Vec<airlock_retrieval::Result<DocumentInput>>),
    /// A file to extract (its SHA-256 not stored under its id yet).
    Extract {
        format: SourceFormat,
        bytes: Vec<u8>,
        sha256: String,
    },
}

fn io_err(path: &Path, e: std::io::Error) -> Error {
    Error::Io {
        path: path.to_path_buf(),
        source: e,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_walk_streams_files_in_name_order_and_skips_hidden_ones() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        for p in [
            "b/z.txt",
            "b/a.pdf",
            "a.csv",
            ".acl.jsonl",
            ".git/x",
            "c/.hidden",
        ] {
            let f = d.join(p);
            std::fs::create_dir_all(f.parent().unwrap()).unwrap();
            std::fs::write(&f, "x").unwrap();
        }
        let mut walk = Walk::new(d).unwrap();
        let ids: Vec<String> = walk.by_ref().map(|f| rel_id(d, &f.unwrap())).collect();
        assert_eq!(ids, ["a.csv", "b/a.pdf", "b/z.txt"]);
        walk.check_sidecars().unwrap();
    }

    #[test]
    fn a_sidecar_below_the_top_or_misspelt_is_noted_before_its_files() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        for p in ["a.txt", "hr/.acl.jsonl", "hr/pay.txt", "z/.ACL.jsonl"] {
            let f = d.join(p);
            std::fs::create_dir_all(f.parent().unwrap()).unwrap();
            std::fs::write(&f, "x").unwrap();
        }
        let mut walk = Walk::new(d).unwrap();
        assert!(walk.next().unwrap().unwrap().ends_with("a.txt"));
        walk.check_sidecars().unwrap();
        let next = walk.next().unwrap().unwrap();
        assert!(next.ends_with("hr/pay.txt"));
        let e = walk.check_sidecars().unwrap_err().to_string();
        assert!(
            e.contains("hr/.acl.jsonl: a permissions sidecar is applied only as"),
            "{e}"
        );
        walk.by_ref().for_each(drop);
        assert_eq!(walk.stray_sidecars.len(), 2);
        // At the top, only the exact spelling is the sidecar.
        std::fs::write(d.join(".Acl.jsonl"), "").unwrap();
        std::fs::write(d.join(".acl.jsonl"), "").unwrap();
        let mut walk = Walk::new(d).unwrap();
        walk.by_ref().for_each(drop);
        let mut strays: Vec<String> = walk.stray_sidecars.iter().map(|p| rel_id(d, p)).collect();
        strays.sort();
        assert_eq!(strays, [".Acl.jsonl", "hr/.acl.jsonl", "z/.ACL.jsonl"]);
    }

    #[test]
    fn a_jsonl_in_a_folder_names_documents_under_its_own_path() {
        assert_eq!(
            jsonl_member_id("public/x.jsonl", "hr/salaries.txt").unwrap(),
            "public/x.jsonl/hr/salaries.txt"
        );
        for bad in [
            "../hr/salaries.txt",
            "/hr/salaries.txt",
            "a//b",
            "a/./b",
            "a/",
        ] {
            assert!(
                matches!(
                    jsonl_member_id("public/x.jsonl", bad),
                    Err(Error::InvalidDocumentId { .. })
                ),
                "{bad}"
            );
        }
        let long = "a".repeat(ingest::MAX_DOC_ID_BYTES);
        assert!(jsonl_member_id("p.jsonl", &long).is_err());
    }
}
