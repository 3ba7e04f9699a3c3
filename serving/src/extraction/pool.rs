//! The parent's side: at most `max_concurrent` workers, a wall-clock deadline per file, and the
//! verdict when a worker dies over its budget.

use std::collections::HashMap;
use std::io::{BufReader, Read};
use std::os::unix::process::ExitStatusExt;
use std::path::PathBuf;
use std::process::{Child, ChildStderr, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use airlock_retrieval::DocumentInput;
use airlock_retrieval::ingest::{ExtractLimits, SourceFormat};
use parking_lot::{Condvar, Mutex};

use super::wire::{self, Answer, FrameError, Hello, Refused, Request};
use super::{ExtractBudget, ExtractFailure};

/// A worker is retired (and a fresh one started for the next file) once its resident memory is
/// above this after a file, so one large file's heap is not kept by an idle process.
const RETIRE_RSS_BYTES: u64 = 128 << 20;

/// A worker is retired after this many files.
const RETIRE_JOBS: u32 = 1_000;

/// What [`ChildExtractor`] runs: the program and how.
#[derive(Debug, Clone)]
pub struct ChildProgram {
    /// The `airlock` binary (`/proc/self/exe` in the daemon: the very binary running, even if
    /// the file was replaced since).
    pub path: PathBuf,
    /// Workers exit unless their Landlock sandbox is fully enforced (`require_sandbox`).
    pub require_sandbox: bool,
}

impl ChildProgram {
    /// This process's own binary.
    pub fn this_binary(require_sandbox: bool) -> Self {
        let path = if cfg!(target_os = "linux") {
            PathBuf::from("/proc/self/exe")
        } else {
            std::env::current_exe().unwrap_or_else(|_| PathBuf::from("airlock"))
        };
        Self {
            path,
            require_sandbox,
        }
    }
}

/// Extraction in budgeted worker processes (see the module docs of `crate::extraction`).
pub struct ChildExtractor {
    inner: Arc<Inner>,
}

struct Inner {
    program: ChildProgram,
    budget: ExtractBudget,
    state: Mutex<State>,
    /// A worker was released (or the extractor closed).
    freed: Condvar,
    /// A job started (or the extractor closed): the deadline thread looks again.
    tick: Condvar,
    /// Whether the workers' sandbox status has been logged (once per extractor).
    logged: AtomicBool,
}

struct State {
    idle: Vec<Worker>,
    busy: usize,
    /// The workers in use, by job: shutdown kills them, the deadline thread kills those past
    /// their deadline.
    running: HashMap<u64, Running>,
    next_job: u64,
    closed: bool,
    /// Whether the deadline thread runs.
    watching: bool,
}

struct Running {
    child: Arc<Mutex<Child>>,
    deadline: Instant,
    /// Killed by the deadline thread.
    fired: bool,
}

struct Worker {
    child: Arc<Mutex<Child>>,
    pid: u32,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
    stderr: ChildStderr,
    jobs: u32,
    /// The limits it holds (sent with an earlier request).
    limits: Option<ExtractLimits>,
}

impl Worker {
    /// Ends the worker and reaps it; what it wrote on stderr (at most 4 KiB) and how it ended.
    fn end(self) -> (String, Option<std::process::ExitStatus>) {
        let Worker {
            child,
            stdin,
            stdout,
            mut stderr,
            ..
        } = self;
        drop(stdin);
        drop(stdout);
        let mut child = child.lock();
        let _ = child.kill();
        let status = child.wait().ok();
        drop(child);
        let mut tail = Vec::new();
        let _ = (&mut stderr).take(4096).read_to_end(&mut tail);
        (String::from_utf8_lossy(&tail).into_owned(), status)
    }
}

/// A worker's answer (the head and the text), or why there is none.
type Answered = Result<(Answer, Vec<u8>), ExtractFailure>;

/// How a worker that did not answer ended.
struct Ended {
    /// The deadline timer killed it.
    timed_out: bool,
    /// The extractor was shut down meanwhile.
    closed: bool,
    /// What the exchange ran into.
    failed: Option<FrameError>,
    /// The end of what it wrote on stderr.
    stderr: String,
    /// Its exit status.
    status: Option<std::process::ExitStatus>,
    /// How long the file had run.
    elapsed: Duration,
}

/// How one exchange with a worker went.
enum Exchange {
    Answered(Answer, Vec<u8>),
    Failed(FrameError),
}

impl ChildExtractor {
    /// An extractor running `program` under `budget` (workers start when first needed).
    pub fn new(program: ChildProgram, budget: ExtractBudget) -> Self {
        Self {
            inner: Arc::new(Inner {
                program,
                budget,
                state: Mutex::new(State {
                    idle: Vec::new(),
                    busy: 0,
                    running: HashMap::new(),
                    next_job: 0,
                    closed: false,
                    watching: false,
                }),
                freed: Condvar::new(),
                tick: Condvar::new(),
                logged: AtomicBool::new(false),
            }),
        }
    }

    /// The budget workers run under.
    pub fn budget(&self) -> &ExtractBudget {
        &self.inner.budget
    }

    /// The process ids of the workers alive now (idle or extracting), for diagnostics.
    pub fn workers(&self) -> Vec<u32> {
        let st = self.inner.state.lock();
        let mut pids: Vec<u32> = st.idle.iter().map(|w| w.pid).collect();
        pids.extend(st.running.values().map(|r| r.child.lock().id()));
        pids.sort_unstable();
        pids
    }

    /// Kills every worker, running or idle, and refuses new files.
    pub fn shutdown(&self) {
        self.inner.shutdown();
    }

    /// Extracts one file in a worker (the caller has checked the id and the size).
    pub(super) fn document(
        &self,
        doc_id: &str,
        title: Option<&str>,
        bytes: &[u8],
        format: SourceFormat,
        max_bytes: usize,
        limits: &ExtractLimits,
    ) -> Result<DocumentInput, ExtractFailure> {
        let inner = &self.inner;
        let (job, worker) = {
            let mut st = inner.state.lock();
            loop {
                if st.closed {
                    return Err(stopping());
                }
                if st.busy < inner.budget.max_concurrent as usize {
                    break;
                }
                inner.freed.wait(&mut st);
            }
            if !st.watching {
                let watched = self.inner.clone();
                std::thread::Builder::new()
                    .name("airlock-extract-deadline".into())
                    .spawn(move || watched.watch())
                    .map_err(|e| {
                        ExtractFailure::Unavailable(format!("starting the deadline thread: {e}"))
                    })?;
                st.watching = true;
            }
            st.busy += 1;
            st.next_job += 1;
            (st.next_job, st.idle.pop())
        };
        // A worker keeps the limits of its previous file: sent only when they differ.
        let same = worker
            .as_ref()
            .is_some_and(|w| w.limits.as_ref() == Some(limits));
        let request = Request {
            doc_id: doc_id.to_owned(),
            title: title.map(str::to_owned),
            media_type: format.media_type().to_owned(),
            max_bytes,
            limits: (!same).then(|| limits.clone()),
            cpu_secs: inner.budget.max_cpu_secs,
        };
        let (result, keep) = inner.run(job, worker, &request, bytes);
        let mut st = inner.state.lock();
        st.busy -= 1;
        let retire = match keep {
            Some(w) if !st.closed && st.idle.len() < inner.budget.max_concurrent as usize => {
                st.idle.push(w);
                None
            }
            other => other,
        };
        drop(st);
        inner.freed.notify_one();
        if let Some(w) = retire {
            w.end();
        }
        let answer = result?;
        to_document(doc_id, answer)
    }
}

impl Inner {
    fn shutdown(&self) {
        let idle = {
            let mut st = self.state.lock();
            st.closed = true;
            for r in st.running.values() {
                let _ = r.child.lock().kill();
            }
            std::mem::take(&mut st.idle)
        };
        for w in idle {
            w.end();
        }
        self.freed.notify_all();
        self.tick.notify_all();
    }

    /// The deadline thread: kills each running worker at its deadline, until the extractor is
    /// shut down. A worker is killed only while its job is registered (under the state lock),
    /// so it is never one already reaped.
    fn watch(&self) {
        let mut st = self.state.lock();
        loop {
            if st.closed {
                return;
            }
            let now = Instant::now();
            let mut next: Option<Instant> = None;
            for r in st.running.values_mut().filter(|r| !r.fired) {
                if r.deadline <= now {
                    let _ = r.child.lock().kill();
                    r.fired = true;
                } else {
                    next = Some(next.map_or(r.deadline, |n| n.min(r.deadline)));
                }
            }
            // With nothing running, look again a deadline from now: a job registered meanwhile
            // has a later deadline, so jobs need not wake this thread (only shutdown does).
            let at = next.unwrap_or(now + Duration::from_secs(self.budget.deadline_secs));
            self.tick.wait_until(&mut st, at);
        }
    }

    /// Runs one request in `worker` (or a fresh one) under the deadline. Returns the answer and
    /// the worker when it may serve again.
    fn run(
        &self,
        job: u64,
        worker: Option<Worker>,
        request: &Request,
        bytes: &[u8],
    ) -> (Answered, Option<Worker>) {
        let started = Instant::now();
        let fresh = worker.is_none();
        let mut worker = match worker {
            Some(w) => w,
            None => match self.spawn() {
                Ok(w) => w,
                Err(e) => return (Err(ExtractFailure::Unavailable(e)), None),
            },
        };
        // The deadline: the deadline thread kills the worker then, which ends any read or write
        // below.
        {
            let mut st = self.state.lock();
            if st.closed {
                drop(st);
                worker.end();
                return (Err(stopping()), None);
            }
            let deadline = started + Duration::from_secs(self.budget.deadline_secs);
            st.running.insert(
                job,
                Running {
                    child: worker.child.clone(),
                    deadline,
                    fired: false,
                },
            );
        }
        let hello = if fresh {
            self.hello(&mut worker)
        } else {
            Ok(())
        };
        let exchange = match &hello {
            Ok(()) => Some(exchange(&mut worker, request, bytes)),
            Err(_) => None,
        };
        let (timed_out, closed) = {
            let mut st = self.state.lock();
            let fired = st.running.remove(&job).is_some_and(|r| r.fired);
            (fired, st.closed)
        };
        let elapsed = started.elapsed();
        if let Err(why) = hello {
            let (stderr, status) = worker.end();
            return (
                Err(ExtractFailure::Unavailable(format!(
                    "the extraction worker {} did not start: {why}{}{}",
                    self.program.path.display(),
                    status.map(|s| format!(" ({s})")).unwrap_or_default(),
                    first_line(&stderr)
                        .map(|l| format!("; it said: {l}"))
                        .unwrap_or_default(),
                ))),
                None,
            );
        }
        match exchange {
            Some(Exchange::Answered(answer, text)) if !timed_out => {
                worker.jobs += 1;
                if let Some(l) = &request.limits {
                    worker.limits = Some(l.clone());
                }
                // Its memory is looked at after a file that may have grown it (a long one, a
                // large one) and every 64 files: reading /proc costs as much as a small file.
                let look = elapsed > Duration::from_millis(50)
                    || bytes.len() + text.len() > 1 << 20
                    || worker.jobs % 64 == 0;
                let keep = worker.jobs < RETIRE_JOBS
                    && !(look && rss_bytes(worker.pid).is_some_and(|r| r > RETIRE_RSS_BYTES));
                let worker = if keep {
                    Some(worker)
                } else {
                    worker.end();
                    None
                };
                (Ok((answer, text)), worker)
            }
            exchange => {
                let failed = match exchange {
                    Some(Exchange::Failed(e)) => Some(e),
                    _ => None,
                };
                let (stderr, status) = worker.end();
                let ended = Ended {
                    timed_out,
                    closed,
                    failed,
                    stderr,
                    status,
                    elapsed,
                };
                (
                    Err(self.verdict(&request.doc_id, ended, request.max_bytes)),
                    None,
                )
            }
        }
    }

    fn spawn(&self) -> Result<Worker, String> {
        let mut cmd = Command::new(&self.program.path);
        cmd.arg("extract")
            .arg("--child")
            .arg("--max-memory-mib")
            .arg(self.budget.max_memory_mib.to_string());
        if self.program.require_sandbox {
            cmd.arg("--require-sandbox");
        }
        let mut child = cmd
            .env_clear()
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| format!("starting {}: {e}", self.program.path.display()))?;
        let (Some(stdin), Some(stdout), Some(stderr)) =
            (child.stdin.take(), child.stdout.take(), child.stderr.take())
        else {
            let _ = child.kill();
            let _ = child.wait();
            return Err("the worker's pipes are missing".into());
        };
        Ok(Worker {
            pid: child.id(),
            child: Arc::new(Mutex::new(child)),
            stdin,
            stdout: BufReader::with_capacity(1 << 16, stdout),
            stderr,
            jobs: 0,
            limits: None,
        })
    }

    /// Reads a fresh worker's greeting; logs its sandbox status once.
    fn hello(&self, worker: &mut Worker) -> Result<(), String> {
        let (hello, _): (Hello, _) =
            wire::read_frame(&mut worker.stdout, 1 << 16, 0).map_err(|e| e.to_string())?;
        if hello.protocol != wire::PROTOCOL {
            return Err(format!(
                "it speaks {}, not {}",
                hello.protocol,
                wire::PROTOCOL
            ));
        }
        if !self.logged.swap(true, Ordering::Relaxed) {
            if hello.sandboxed {
                tracing::info!(
                    landlock = %hello.sandbox,
                    max_memory_mib = self.budget.max_memory_mib,
                    max_cpu_secs = self.budget.max_cpu_secs,
                    deadline_secs = self.budget.deadline_secs,
                    max_concurrent = self.budget.max_concurrent,
                    "extraction workers: no file system, no TCP, budget enforced"
                );
            } else {
                tracing::warn!(
                    landlock = %hello.sandbox,
                    "extraction workers run without their Landlock sandbox (the kernel cannot \
                     enforce it); their memory, CPU and deadline limits still hold"
                );
            }
        }
        Ok(())
    }

    /// Why a worker did not answer: an overrun of its budget (the document's `limit_exceeded`
    /// refusal), another abnormal end (`extraction_failed`), or the daemon stopping.
    fn verdict(&self, doc_id: &str, ended: Ended, max_bytes: usize) -> ExtractFailure {
        let Ended {
            timed_out,
            closed,
            failed,
            stderr,
            status,
            elapsed,
        } = ended;
        let b = &self.budget;
        let refuse = |reason: String, code: &'static str| {
            ExtractFailure::Document(airlock_retrieval::Error::Extraction {
                doc_id: doc_id.to_owned(),
                reason,
                code,
            })
        };
        let signal = status.and_then(|s| s.signal());
        if timed_out {
            return refuse(
                format!(
                    "limit exceeded: deadline_secs (still running after {} s; limit {} s)",
                    elapsed.as_secs(),
                    b.deadline_secs
                ),
                "limit_exceeded",
            );
        }
        if closed {
            return stopping();
        }
        if signal == Some(libc_sig::XCPU) {
            return refuse(
                format!(
                    "limit exceeded: max_cpu_secs (more than {} s of CPU)",
                    b.max_cpu_secs
                ),
                "limit_exceeded",
            );
        }
        if stderr.contains("memory allocation of") {
            return refuse(
                format!(
                    "limit exceeded: max_memory_mib (needed more than {} MiB)",
                    b.max_memory_mib
                ),
                "limit_exceeded",
            );
        }
        if let Some(FrameError::TooLong(n)) = failed {
            return ExtractFailure::Document(airlock_retrieval::Error::DocumentTooLarge {
                doc_id: doc_id.to_owned(),
                bytes: usize::try_from(n).unwrap_or(usize::MAX),
                limit: max_bytes,
            });
        }
        let how = match (signal, status) {
            (Some(s), _) => format!("signal {s}"),
            (None, Some(s)) => s.to_string(),
            (None, None) => failed.map_or_else(|| "no answer".into(), |e| e.to_string()),
        };
        tracing::warn!(how = %how, "an extraction worker ended abnormally; the file is refused");
        refuse(
            format!("the extractor stopped abnormally ({how})"),
            "extraction_failed",
        )
    }
}

impl Drop for ChildExtractor {
    /// The workers are ended and reaped with their extractor (no zombie, no orphan), and the
    /// deadline thread stops.
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// Signal numbers (Linux, every architecture the appliance ships for).
mod libc_sig {
    /// CPU time limit exceeded.
    pub const XCPU: i32 = 24;
}

fn stopping() -> ExtractFailure {
    ExtractFailure::Stopping
}

fn first_line(s: &str) -> Option<&str> {
    s.lines().map(str::trim).find(|l| !l.is_empty())
}

/// Sends the request and reads the answer.
fn exchange(worker: &mut Worker, request: &Request, bytes: &[u8]) -> Exchange {
    if let Err(e) = wire::write_frame(&mut worker.stdin, request, bytes) {
        return Exchange::Failed(FrameError::Io(e));
    }
    // The text is at most `max_bytes`. A region covers at least one byte of it and two of
    // separator and takes at most 45 bytes; the tables of paths and strings repeat text.
    let max_text = request.max_bytes as u64;
    let max_json = max_text.saturating_mul(4).saturating_add(1 << 20);
    let max_bytes = max_text.saturating_mul(16).saturating_add(1 << 20);
    match wire::read_frame(&mut worker.stdout, max_json, max_bytes) {
        Ok((answer, text)) => Exchange::Answered(answer, text),
        Err(e) => Exchange::Failed(e),
    }
}

/// The document of an answer, or its refusal as the per-document error.
fn to_document(
    doc_id: &str,
    (answer, text): (Answer, Vec<u8>),
) -> Result<DocumentInput, ExtractFailure> {
    use airlock_retrieval::Error as E;
    let id = || doc_id.to_owned();
    let refusal = match answer {
        Answer::Document {
            title,
            text_len,
            regions,
        } => {
            let bad = |what: &str| ExtractFailure::Unavailable(format!("the worker sent {what}"));
            let mut text = text;
            if text_len > text.len() {
                return Err(bad("a text shorter than it said"));
            }
            let regions = wire::decode_regions(&regions, &text[text_len..])
                .ok_or_else(|| bad("malformed regions"))?;
            text.truncate(text_len);
            let text = String::from_utf8(text).map_err(|_| bad("text that is not UTF-8"))?;
            let mut doc = DocumentInput::new(doc_id, title, text);
            doc.regions = regions;
            return Ok(doc);
        }
        Answer::Refused(r) => r,
    };
    Err(ExtractFailure::Document(match refusal {
        Refused::Extraction { reason, code } => E::Extraction {
            doc_id: id(),
            reason,
            code: static_code(&code),
        },
        Refused::InvalidUtf8 { offset } => E::InvalidUtf8 {
            doc_id: id(),
            offset,
        },
        Refused::Empty => E::EmptyDocument { doc_id: id() },
        Refused::TooLarge { bytes, limit } => E::DocumentTooLarge {
            doc_id: id(),
            bytes,
            limit,
        },
        Refused::Unrenderable { reason } => E::InvalidJsonl {
            source_name: id(),
            line: 0,
            reason,
        },
        Refused::InvalidId { reason } => E::Extraction {
            doc_id: id(),
            reason,
            code: "invalid_id",
        },
        Refused::Panicked { location } => {
            tracing::error!(at = %location, "the extractor panicked; the file is refused");
            E::Extraction {
                doc_id: id(),
                reason: "the extractor failed on this file".into(),
                code: "extraction_failed",
            }
        }
    }))
}

/// The extractor's refusal codes (docs/EXTRACTION.md "Refusals").
fn static_code(code: &str) -> &'static str {
    match code {
        "no_text_layer" => "no_text_layer",
        "encrypted" => "encrypted",
        "unsupported" => "unsupported",
        "limit_exceeded" => "limit_exceeded",
        "empty" => "empty",
        "extraction_failed" => "extraction_failed",
        _ => "malformed",
    }
}

/// Resident memory of process `pid` (`VmRSS` of `/proc/PID/status`, in KiB there), if it can
/// be read.
fn rss_bytes(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}
