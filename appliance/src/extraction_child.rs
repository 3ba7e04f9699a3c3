//! The worker: `airlock extract --child`, started by the daemon or `airlock ingest`, never by
//! a person (the parent's side, the pool and the frames are `airlock_serving::extraction`). It limits itself before it reads a byte, then extracts one file per request until
//! its stdin closes.

use std::io::{BufReader, BufWriter};
use std::sync::Mutex;

use airlock_retrieval::ingest::{ExtractLimits, SourceFormat};

use airlock_serving::extraction::wire::{self, Answer, Hello, Refused, Request};

/// Arguments of `airlock extract --child` (hidden: the daemon passes them).
#[derive(Debug, clap::Args)]
pub struct ChildArgs {
    /// Serve extraction requests on stdin/stdout (the only mode).
    #[arg(long)]
    pub child: bool,
    /// Address space this process may map above its size at start, MiB.
    #[arg(long)]
    pub max_memory_mib: u64,
    /// Exit unless the Landlock sandbox is fully enforced.
    #[arg(long)]
    pub require_sandbox: bool,
}

/// Largest request: the file plus its JSON head (the daemon never sends more than its upload
/// or file limit; this only bounds a confused parent).
const MAX_REQUEST_BYTES: u64 = 1 << 30;

/// Where the last panic happened (file:line), for the answer; the panic's message is not kept,
/// as it may quote the file.
static PANIC_AT: Mutex<Option<String>> = Mutex::new(None);

/// Runs the worker until its stdin closes. Errors (a limit or the sandbox that cannot be set,
/// a broken pipe) end the process; the parent reports them.
pub fn run_child(args: ChildArgs) -> anyhow::Result<bool> {
    anyhow::ensure!(
        args.child,
        "`airlock extract` is internal: it runs as `--child` only"
    );
    limit_self(args.max_memory_mib)?;
    let report = airlock_platform::sandbox::lock_down_worker(args.require_sandbox)?;
    std::panic::set_hook(Box::new(|info| {
        let at = info
            .location()
            .map(|l| format!("{}:{}", l.file(), l.line()))
            .unwrap_or_default();
        if let Ok(mut slot) = PANIC_AT.lock() {
            *slot = Some(at);
        }
    }));
    let mut input = BufReader::with_capacity(1 << 16, std::io::stdin().lock());
    let mut output = BufWriter::with_capacity(1 << 16, std::io::stdout().lock());
    let hello = Hello {
        protocol: wire::PROTOCOL.to_owned(),
        sandboxed: report.fully_enforced(),
        sandbox: report.detail,
    };
    wire::write_frame(&mut output, &hello, &[])?;
    let mut limits = None;
    loop {
        let (mut req, bytes): (Request, Vec<u8>) =
            match wire::read_frame(&mut input, 1 << 20, MAX_REQUEST_BYTES) {
                Ok(r) => r,
                Err(wire::FrameError::Eof) => return Ok(true),
                Err(e) => return Err(e.into()),
            };
        if let Some(l) = req.limits.take() {
            limits = Some(l);
        }
        let limits = limits
            .as_ref()
            .ok_or_else(|| anyhow::anyhow!("a first request without limits"))?;
        limit_cpu(req.cpu_secs)?;
        let (answer, text) = extract(&req, limits, &bytes);
        drop(bytes);
        wire::write_frame(&mut output, &answer, &text)?;
    }
}

/// The answer to `req` and the frame's bytes (the text and the regions).
fn extract(req: &Request, limits: &ExtractLimits, bytes: &[u8]) -> (Answer, Vec<u8>) {
    let Some(format) = SourceFormat::from_media_type(&req.media_type) else {
        return (
            Answer::Refused(Refused::Extraction {
                reason: format!("unknown format {}", req.media_type),
                code: "unsupported".into(),
            }),
            Vec::new(),
        );
    };
    let run = std::panic::catch_unwind(|| {
        airlock_retrieval::ingest::parse_document_with(
            &req.doc_id,
            req.title.as_deref(),
            bytes,
            format,
            req.max_bytes,
            limits,
        )
    });
    use airlock_retrieval::Error as E;
    let refused = match run {
        Ok(Ok(doc)) => {
            let text_len = doc.text.len();
            let mut bytes = doc.text.into_bytes();
            let regions = wire::encode_regions(doc.regions, &mut bytes);
            return (
                Answer::Document {
                    title: doc.title,
                    text_len,
                    regions,
                },
                bytes,
            );
        }
        Ok(Err(E::Extraction { reason, code, .. })) => Refused::Extraction {
            reason,
            code: code.to_owned(),
        },
        Ok(Err(E::InvalidUtf8 { offset, .. })) => Refused::InvalidUtf8 { offset },
        Ok(Err(E::EmptyDocument { .. })) => Refused::Empty,
        Ok(Err(E::DocumentTooLarge { bytes, limit, .. })) => Refused::TooLarge { bytes, limit },
        Ok(Err(E::InvalidJsonl { reason, .. })) => Refused::Unrenderable { reason },
        Ok(Err(E::InvalidDocumentId { reason, .. })) => Refused::InvalidId {
            reason: reason.to_owned(),
        },
        Ok(Err(e)) => Refused::Extraction {
            reason: e.to_string(),
            code: "malformed".into(),
        },
        Err(_) => Refused::Panicked {
            location: PANIC_AT
                .lock()
                .ok()
                .and_then(|mut s| s.take())
                .unwrap_or_default(),
        },
    };
    (Answer::Refused(refused), Vec::new())
}

/// No core dumps; the address space capped at this process's size now plus `max_memory_mib`
/// (what the binary itself maps does not count against the file).
fn limit_self(max_memory_mib: u64) -> anyhow::Result<()> {
    use rustix::process::{Resource, Rlimit, setrlimit};
    setrlimit(
        Resource::Core,
        Rlimit {
            current: Some(0),
            maximum: Some(0),
        },
    )?;
    let status = std::fs::read_to_string("/proc/self/status")?;
    let base_kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmSize:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .ok_or_else(|| anyhow::anyhow!("no VmSize in /proc/self/status"))?;
    let cap = (base_kib << 10).saturating_add(max_memory_mib << 20);
    setrlimit(
        Resource::As,
        Rlimit {
            current: Some(cap),
            maximum: Some(cap),
        },
    )?;
    Ok(())
}

/// The soft `RLIMIT_CPU` at the CPU time used so far plus `secs`: past it the kernel sends
/// `SIGXCPU`, which ends the process. The hard limit is left as inherited (unlimited unless the
/// service manager set one), so the next file can be given its own allowance.
fn limit_cpu(secs: u64) -> anyhow::Result<()> {
    use rustix::process::{Resource, Rlimit, getrlimit, setrlimit};
    let used = rustix::time::clock_gettime(rustix::time::ClockId::ProcessCPUTime);
    let used = u64::try_from(used.tv_sec).unwrap_or(0);
    let hard = getrlimit(Resource::Cpu).maximum;
    let soft = (used + secs.max(1) + 1).min(hard.unwrap_or(u64::MAX));
    setrlimit(
        Resource::Cpu,
        Rlimit {
            current: Some(soft),
            maximum: hard,
        },
    )?;
    Ok(())
}
