//! `airlock eval run|gate|baseline|report`: golden-set evaluation of an appliance over its public
//! API, and the release gate.
//!
//! `eval run` either drives an operator's running daemon (`--against URL --tokens FILE`) or owns
//! one: it links the bundle installed in the configured data directory into a scratch data
//! directory (the production stores are never written), starts the daemon in-process on an
//! ephemeral loopback port with the same start-up path as `airlock serve` (bundle re-verified
//! against the pinned keyring, egress lockdown), creates a local admin, lets the runner ingest
//! the set and create its users from the IAM snapshots, then drains and removes the scratch
//! directory.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use airlock_acl::{NewUser, Role};
use airlock_eval::client::{Client, Priority, TlsOptions};
use airlock_eval::gate::{self, Baseline, Report};
use airlock_eval::runner::{self, GoldenSet, RunOptions, Tokens};
use anyhow::{Context, bail};
use clap::{Args, Parser, Subcommand};
use indicatif::{ProgressBar, ProgressStyle};

use crate::config::Config;
use crate::server::{self, Drained};
use crate::startup;
use crate::state::AppState;

/// Eval commands.
#[derive(Debug, Subcommand)]
pub enum EvalCommand {
    /// Run a golden set (bank layout) or a BEIR retrieval set, against an operator's daemon
    /// (`--against URL --tokens FILE`) or a daemon it starts itself on a scratch copy of the
    /// installed bundle (the default).
    Run(Box<RunArgs>),
    /// Decide whether a report may ship against a baseline (exit 1 if not).
    Gate(GateArgs),
    /// Write a baseline from an accepted report.
    Baseline(BaselineArgs),
    /// Render a report (JSON) as Markdown and HTML.
    Report(ReportArgs),
    /// Write the signed, content-free summary of a run that may leave the box (metrics with
    /// intervals, leak and failure counts, gate verdict, bundle and set digests), approved by a
    /// second admin (four eyes) and recorded in the audit log.
    Export(Box<super::export::ExportArgs>),
    /// Verify an export off-box against the appliance's public key (exit 1 if it does not).
    VerifyExport(super::export::VerifyExportArgs),
}

/// `airlock eval run`.
#[derive(Debug, Args)]
pub struct RunArgs {
    /// The set directory: bank layout (`golden.jsonl`, `corpus.jsonl`, `iam_v*.jsonl`,
    /// `deletions.json`) or BEIR layout (`corpus.jsonl`, `queries.jsonl`, `qrels/`).
    #[arg(long)]
    pub set: PathBuf,
    /// Base URL of an operator's running daemon, e.g. http://127.0.0.1:8080. Without it the
    /// runner owns a daemon: see --data, --config and --scratch.
    #[arg(long, requires = "tokens")]
    pub against: Option<String>,
    /// With --against: JSON file of tokens (`{"admin": "...", "approver": "...", "u001":
    /// "..."}`, as written by `airlock demo`); users missing from it get tokens issued with the
    /// admin token, approved with the approver's (a second admin: four eyes).
    #[arg(long, requires = "against")]
    pub tokens: Option<PathBuf>,
    /// With an `https://` --against: the CA certificate(s) (PEM) the daemon's certificate must
    /// chain to; nothing else is trusted.
    #[arg(long, env = "AIRLOCK_CA_FILE", requires = "against")]
    pub ca_file: Option<PathBuf>,
    /// With --against a daemon with `tls.client_ca`: the client certificate (PEM) shown for the
    /// operator routes (mTLS).
    #[arg(
        long,
        env = "AIRLOCK_CLIENT_CERT",
        requires = "against",
        requires = "client_key"
    )]
    pub client_cert: Option<PathBuf>,
    /// The client certificate's private key (PEM).
    #[arg(long, env = "AIRLOCK_CLIENT_KEY", requires = "client_cert")]
    pub client_key: Option<PathBuf>,
    /// Owned daemon: the data directory whose installed bundle is evaluated (only read; env
    /// AIRLOCK_DATA) [default: ./airlock-data].
    #[arg(long, conflicts_with = "against")]
    pub data: Option<PathBuf>,
    /// Owned daemon: the `airlock serve` TOML configuration (data dir, keyring, timeouts; env
    /// AIRLOCK_CONFIG). Quotas and the load-driven ladder are off in an owned daemon.
    #[arg(long, conflicts_with = "against")]
    pub config: Option<PathBuf>,
    /// Owned daemon: trusted keyring [default: the data dir's pinned keyring].
    #[arg(long, conflicts_with = "against")]
    pub keyring: Option<PathBuf>,
    /// Owned daemon: the scratch data directory (bundle hard-linked in, the set's corpus, users
    /// and indexes); put it on the data dir's file system so the models are linked, not copied
    /// [default: OUT/scratch-data].
    #[arg(long, conflicts_with = "against")]
    pub scratch: Option<PathBuf>,
    /// Owned daemon: keep the scratch data directory after the run (for inspection).
    #[arg(long, conflicts_with = "against")]
    pub keep_scratch: bool,
    /// Ladder rung to evaluate at (0-5), or `all` for rungs 0-3 one after another: pinned on an
    /// owned daemon (0 when not given); with --against, sent with each chat request (the daemon
    /// accepts it from admin-role tokens only).
    #[arg(long)]
    pub rung: Option<String>,
    /// Output directory for report.json, report.md and report.html.
    #[arg(long, default_value = "eval-out")]
    pub out: PathBuf,
    /// Requests in flight at once (the runner's worker threads; ingest and cases alike).
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u16).range(1..=256))]
    pub concurrency: u16,
    /// Retrieval mode: hybrid, bm25 or vector.
    #[arg(long, default_value = "hybrid")]
    pub mode: String,
    /// Chunks retrieved per query (BEIR sets retrieve at least 100 for recall@100).
    #[arg(long, default_value_t = 10)]
    pub top_k: usize,
    /// Score retrieval only (no chat completions): answer, citation and abstention metrics are
    /// not measured; leaks still are.
    #[arg(long)]
    pub no_answers: bool,
    /// Ask for answers on at most N cases per phase, spread evenly over the phase (every
    /// len/N-th case in set order, so each kind appears in about its share); retrieval only
    /// for the rest: a sampled run when every answer costs a long prefill.
    #[arg(long, value_name = "N")]
    pub answer_cases: Option<usize>,
    /// Keep each answer's text in report.json (to read why a case failed). Off by default:
    /// answers quote the bank's documents. The retrieved and cited document ids are always
    /// recorded.
    #[arg(long)]
    pub record_answers: bool,
    /// With --against: the corpus and the `iam_v1` permissions are already in place (as after
    /// `airlock demo`): do not ingest, sync `iam_v1` or issue the v1 users' tokens. The set's
    /// phase transitions (`iam_v2`, deletions) are still applied, so the daemon ends in the
    /// set's final state.
    #[arg(long, requires = "against")]
    pub no_setup: bool,
    /// Owned daemon: start from a copy of the document store and indexes of this data
    /// directory (`airlock.db` and `index/`; no daemon may be serving it) instead of ingesting
    /// the set: it must already hold the set's corpus with the `iam_v1` permissions, e.g. a copy
    /// of the demo's data dir taken after `airlock demo --setup-only`. Like --no-setup, the
    /// set's later phases (`iam_v2`, deletions) are applied to the copy only; DIR is not changed.
    #[arg(long, value_name = "DIR", conflicts_with = "against")]
    pub from_state: Option<PathBuf>,
    /// qrels split of a BEIR set.
    #[arg(long, default_value = "dev")]
    pub split: String,
    /// Model alias for answers (default: the daemon's).
    #[arg(long)]
    pub model: Option<String>,
    /// Answer length limit.
    #[arg(long, default_value_t = 160)]
    pub max_tokens: u32,
    /// Also answer every answered case with the plain baseline: the same retrieval (the top
    /// --plain-top-k chunks the user may read, full text) and the same model in LangChain's
    /// stuff-documents prompt, none of the answer path's rules. Reported beside the answer
    /// path (report.md "Beside the plain baseline"; report.json `plain_baseline`).
    #[arg(long, conflicts_with = "no_answers")]
    pub plain_baseline: bool,
    /// Chunks in the plain baseline's prompt.
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u64).range(1..=100))]
    pub plain_top_k: u64,
    /// Instead of answers, score the chunks the chat would place in each answered case's
    /// prompt (`POST /v1/retrieve` with `prompt_sources`): citation recall is then an answering
    /// document among them, abstention no such chunk (the answer path abstains without
    /// generating). No generation: a source-selection rule measured on a whole set in minutes;
    /// not release evidence (no answer metrics, the gate refuses it).
    #[arg(long, conflicts_with_all = ["no_answers", "plain_baseline"])]
    pub sources_only: bool,
    /// How long one request may take before the run fails, in seconds. An answer from the
    /// large model on a 2-core appliance takes minutes (a ~1,400-token prefill at a few tokens
    /// per second, more with --concurrency above 1). An owned daemon's own request timeout is
    /// raised to match.
    #[arg(long, default_value_t = 1800, value_parser = clap::value_parser!(u64).range(1..=86_400))]
    pub request_timeout_secs: u64,
    /// `X-Airlock-Priority` of every request: `batch` yields to employees (an eval never
    /// competes with them); `interactive` for latency measurements.
    #[arg(long, value_enum, default_value_t = PriorityArg::Batch)]
    pub priority: PriorityArg,
}

/// `--priority`.
#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum PriorityArg {
    /// Yields to interactive traffic.
    Batch,
    /// Served like an employee's request.
    Interactive,
}

/// `airlock eval gate`.
#[derive(Debug, Args)]
pub struct GateArgs {
    /// The baseline (from `airlock eval baseline`).
    #[arg(long)]
    pub baseline: PathBuf,
    /// The candidate's report.json.
    #[arg(long)]
    pub report: PathBuf,
    /// Tolerated drop of any headline metric.
    #[arg(long, default_value_t = 0.01)]
    pub epsilon: f64,
    /// Frozen regression set: case ids (one per line) that must pass.
    #[arg(long)]
    pub regressions: Option<PathBuf>,
}

/// `airlock eval baseline`.
#[derive(Debug, Args)]
pub struct BaselineArgs {
    /// The accepted report.json.
    #[arg(long)]
    pub report: PathBuf,
    /// Where to write the baseline.
    #[arg(long)]
    pub out: PathBuf,
}

/// `airlock eval report`.
#[derive(Debug, Args)]
pub struct ReportArgs {
    /// A report.json.
    #[arg(long)]
    pub report: PathBuf,
    /// Output directory (report.md, report.html).
    #[arg(long)]
    pub out: PathBuf,
}

/// Runs an eval command. `Ok(false)` means the gate refused (exit code 1).
pub fn run(cmd: EvalCommand) -> anyhow::Result<bool> {
    match cmd {
        EvalCommand::Run(a) => run_set(*a).map(|()| true),
        EvalCommand::Gate(a) => {
            let report: Report = gate::read_json(&a.report)?;
            let baseline: Baseline = gate::read_json(&a.baseline)?;
            let regressions = match &a.regressions {
                Some(p) => gate::read_regressions(p)?,
                None => Vec::new(),
            };
            let verdict = gate::gate(&report, &baseline, a.epsilon, &regressions);
            print!("{}", verdict.render(&report, &baseline));
            Ok(verdict.passed())
        }
        EvalCommand::Baseline(a) => {
            let report: Report = gate::read_json(&a.report)?;
            write_json(&a.out, &Baseline::from_report(&report))?;
            println!("baseline written to {}", a.out.display());
            Ok(true)
        }
        EvalCommand::Report(a) => {
            let report: Report = gate::read_json(&a.report)?;
            write_reports(&a.out, &report)?;
            Ok(true)
        }
        EvalCommand::Export(a) => super::export::export(*a),
        EvalCommand::VerifyExport(a) => super::export::verify(a),
    }
}

fn parse_rungs(rung: Option<&str>) -> anyhow::Result<Vec<Option<u8>>> {
    match rung {
        None => Ok(vec![None]),
        Some("all") => Ok((0..=3).map(Some).collect()),
        Some(r) => match r.parse::<u8>() {
            Ok(n) if n <= 5 => Ok(vec![Some(n)]),
            _ => bail!("--rung must be 0-5 or `all`, not {r:?}"),
        },
    }
}

fn run_set(a: RunArgs) -> anyhow::Result<()> {
    let rungs = parse_rungs(a.rung.as_deref())?;
    // Set when Ctrl-C or SIGTERM stops an owned daemon: the runner starts no further case and
    // ends without a report.
    let interrupted = Arc::new(AtomicBool::new(false));
    let (client, mut tokens, owned) = connect(&a, &interrupted)?;
    let bar = progress_bar();
    let priority = match a.priority {
        PriorityArg::Batch => Priority::Batch,
        PriorityArg::Interactive => Priority::Interactive,
    };
    let retry_bar = bar.clone();
    let client = client
        .with_priority(priority)
        .with_retry_log(Arc::new(move |line| {
            retry_bar.suspend(|| eprintln!("{line}"))
        }));
    let progress = progress_reporter(&bar);
    let mut opts = run_options(&a, owned.is_none(), &interrupted);
    let golden = runner::is_golden_set(&a.set);
    let set = if golden {
        Some(GoldenSet::read(&a.set)?)
    } else {
        None
    };
    let mut per_rung = Vec::new();
    let (mut leaks, mut failed) = (0, 0);
    // Whatever failed after a stop (a set-up request cut by the draining daemon) is the stop.
    let stopped = |e: runner::RunError| {
        if interrupted.load(Ordering::Relaxed) {
            runner::RunError::Interrupted
        } else {
            e
        }
    };
    for (i, rung) in rungs.iter().enumerate() {
        opts.rung = *rung;
        if let Some(d) = &owned {
            // The owned daemon's ladder is off: it serves at the pinned rung, 0 unless forced,
            // and the report says so.
            let pinned = rung.unwrap_or(0);
            d.state.admission().set_rung(pinned);
            opts.rung = Some(pinned);
        }
        let mut report = match &set {
            Some(set) if i == 0 => {
                runner::run_golden(&client, set, &mut tokens, &opts, &progress).map_err(stopped)?
            }
            Some(set) => runner::run_golden_final_state(&client, set, &tokens, &opts, &progress)
                .map_err(stopped)?,
            None => runner::run_beir(&client, &a.set, &a.split, &mut tokens, &opts, &progress)
                .map_err(stopped)?,
        };
        report.sources_only = a.sources_only;
        // Later rungs reuse the state the first run set up.
        opts.setup = false;
        let dir = match rung {
            Some(r) if rungs.len() > 1 => a.out.join(format!("rung-{r}")),
            _ => a.out.clone(),
        };
        write_reports(&dir, &report)?;
        let line = report_line(opts.rung, "", &report, &dir);
        bar.suspend(|| eprintln!("{line}"));
        leaks += report.leaks();
        failed += report.failed();
        // A golden set's first pass walks the phases, the later rungs can only be scored on the
        // state the phases leave: the first rung gets a final-state pass too, so every row of
        // the rung table covers the same cases (and, sampled, the same answered cases).
        if let (Some(set), 0, true) = (&set, i, rungs.len() > 1) {
            let same = runner::run_golden_final_state(&client, set, &tokens, &opts, &progress)
                .map_err(stopped)?;
            let fs_dir = dir.join("final-state");
            write_reports(&fs_dir, &same)?;
            leaks += same.leaks();
            failed += same.failed();
            let line = report_line(opts.rung, "final state, ", &same, &fs_dir);
            bar.suspend(|| eprintln!("{line}"));
            per_rung.push(same);
        } else {
            per_rung.push(report);
        }
    }
    bar.finish_and_clear();
    if let Some(d) = owned {
        d.stop()?;
    }
    if per_rung.len() > 1 {
        write_rung_tables(&a.out, &per_rung, set.is_some())?;
    }
    if leaks > 0 {
        bail!("{leaks} case(s) leaked forbidden material (see the reports)");
    }
    if failed > 0 {
        bail!("{failed} case(s) failed: their requests got no answer (see `error` in report.json)");
    }
    Ok(())
}

/// The daemon: an operator's (`--against` with `--tokens`, checked ready), or one this process
/// owns on a scratch data directory, with its admin and approver tokens.
fn connect(
    a: &RunArgs,
    interrupted: &Arc<AtomicBool>,
) -> anyhow::Result<(Client, Tokens, Option<OwnedDaemon>)> {
    Ok(match (&a.against, &a.tokens) {
        (Some(url), Some(path)) => {
            let tokens: Tokens = gate::read_json(path)
                .with_context(|| format!("reading tokens from {}", path.display()))?;
            let tls = TlsOptions {
                ca_file: a.ca_file.clone(),
                client_cert: a.client_cert.clone(),
                client_key: a.client_key.clone(),
            };
            if url.starts_with("https://") && tls.ca_file.is_none() {
                bail!("{url}: --ca-file (or AIRLOCK_CA_FILE) is required to verify the daemon");
            }
            let client = Client::with_tls(url, Duration::from_secs(a.request_timeout_secs), &tls)
                .map_err(anyhow::Error::msg)?;
            if let Err(e) = client.probe_ready() {
                bail!("{url} is not ready (GET /readyz did not return 200): {e}");
            }
            (client, tokens, None)
        }
        _ => {
            let daemon = OwnedDaemon::start(a, interrupted.clone())?;
            let client = Client::new(&daemon.base, Duration::from_secs(a.request_timeout_secs));
            if !client.ready() {
                bail!("the owned daemon on {} is not ready", daemon.base);
            }
            let tokens = Tokens::from([
                ("admin".to_owned(), daemon.admin_token.clone()),
                ("approver".to_owned(), daemon.approver_token.clone()),
            ]);
            (client, tokens, Some(daemon))
        }
    })
}

fn progress_bar() -> ProgressBar {
    let bar = ProgressBar::new(0);
    bar.set_style(
        ProgressStyle::with_template("{msg:>12} [{bar:40}] {pos}/{len} {per_sec} eta {eta}")
            .expect("static template")
            .progress_chars("=> "),
    );
    bar
}

/// The runner's progress callback: the bar, and on a pipe or log file (where the bar is
/// hidden) a plain line per step every ten seconds and when the step completes.
fn progress_reporter(bar: &ProgressBar) -> impl Fn(&str, usize, usize) + Sync + '_ {
    let lines = (!std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .then(|| std::sync::Mutex::new(std::time::Instant::now()));
    move |what: &str, done: usize, total: usize| {
        let new_step = bar.message() != what;
        if new_step {
            bar.set_message(what.to_owned());
            bar.reset();
        }
        bar.set_length(total as u64);
        bar.set_position(done as u64);
        if let Some(last) = &lines {
            let mut last = last.lock().unwrap_or_else(|e| e.into_inner());
            if new_step {
                *last = std::time::Instant::now();
            }
            if done == total || last.elapsed() >= Duration::from_secs(10) {
                *last = std::time::Instant::now();
                eprintln!(
                    "{what}: {done}/{total}, {:.1}/s, eta {}",
                    bar.per_sec(),
                    indicatif::HumanDuration(bar.eta())
                );
            }
        }
    }
}

/// The runner's options from the command line (`rung` set per pass).
fn run_options(a: &RunArgs, operators: bool, interrupted: &Arc<AtomicBool>) -> RunOptions {
    RunOptions {
        rung: None,
        // An owned daemon's rung is pinned on the daemon itself (below), so eval users need no
        // admin role; an operator's daemon accepts a forced rung from admin tokens only.
        rung_in_requests: operators,
        concurrency: usize::from(a.concurrency),
        top_k: a.top_k,
        mode: a.mode.clone(),
        answers: !a.no_answers,
        answer_cases: a.answer_cases,
        max_tokens: a.max_tokens,
        record_answers: a.record_answers,
        model: a.model.clone(),
        setup: !a.no_setup && a.from_state.is_none(),
        stop: Some(interrupted.clone()),
        plain_baseline: a.plain_baseline,
        plain_top_k: a.plain_top_k as usize,
        sources_only: a.sources_only,
    }
}

/// The line announcing a pass's report (`pass`: `""`, or `"final state, "`).
fn report_line(rung: Option<u8>, pass: &str, report: &Report, dir: &Path) -> String {
    format!(
        "{}: {pass}{} cases, {} leaking, {} failed -> {}",
        rung.map_or("auto rung".into(), |r| format!("rung {r}")),
        report.overall.cases,
        report.leaks(),
        report.failed(),
        dir.display()
    )
}

/// The rung table of a run over several rungs: `rungs.md` (printed too) and `rungs.html`.
fn write_rung_tables(out: &Path, per_rung: &[Report], golden: bool) -> anyhow::Result<()> {
    let mut table = rung_table(per_rung);
    if golden {
        table = format!(
            "Cases valid in the set's final state (after `iam_v2` and the deletions), the \
             same cases at every rung.\n\n{table}"
        );
    }
    std::fs::write(out.join("rungs.md"), &table)?;
    std::fs::write(
        out.join("rungs.html"),
        airlock_eval::html::render_rungs(per_rung),
    )?;
    print!("{table}");
    Ok(())
}

/// The local admin an owned daemon creates for the runner (outside any IAM snapshot).
const EVAL_ADMIN: &str = "airlock-eval-admin";
/// The second local admin, whose approvals let the runner issue the set's users their tokens
/// (four eyes, crate::approvals).
const EVAL_APPROVER: &str = "airlock-eval-approver";
/// Actor recorded in the scratch audit log.
const ACTOR: &str = "airlock-eval";
/// Marks a directory as an eval scratch directory, so a later run may replace it.
const SCRATCH_MARKER: &str = ".airlock-eval-scratch";

/// A daemon this process runs for one eval on a scratch data directory.
struct OwnedDaemon {
    /// `http://127.0.0.1:PORT`.
    base: String,
    /// The local admin's bearer token.
    admin_token: String,
    /// The second local admin's token (approvals).
    approver_token: String,
    /// The daemon's state (the runner pins the ladder rung through it).
    state: AppState,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<anyhow::Result<Drained>>>,
    scratch: PathBuf,
    keep: bool,
    /// Shut down and cleaned up already.
    done: bool,
}

/// The operator's settings exactly as `airlock serve` reads them (flags, `AIRLOCK_*`, TOML).
fn operator_config(a: &RunArgs) -> anyhow::Result<Config> {
    #[derive(Parser)]
    struct Wrap {
        #[command(flatten)]
        config: Config,
    }
    let mut argv = vec!["airlock".into()];
    for (flag, value) in [
        ("--config", &a.config),
        ("--data", &a.data),
        ("--keyring", &a.keyring),
    ] {
        if let Some(v) = value {
            argv.push(flag.into());
            argv.push(v.clone().into_os_string());
        }
    }
    let w = Wrap::try_parse_from::<_, std::ffi::OsString>(argv).context("daemon settings")?;
    Ok(w.config.load()?)
}

/// Hard-links (or, across file systems, copies) the tree `from` to `to`.
fn link_tree(from: &Path, to: &Path) -> anyhow::Result<()> {
    mirror_tree(from, to, true)
}

/// Recreates the tree `from` under `to`: files hard-linked when `link` (copied where linking
/// fails), copied otherwise (state the daemon will write to must not be shared).
fn mirror_tree(from: &Path, to: &Path, link: bool) -> anyhow::Result<()> {
    std::fs::create_dir_all(to).with_context(|| format!("creating {}", to.display()))?;
    for entry in std::fs::read_dir(from).with_context(|| format!("reading {}", from.display()))? {
        let entry = entry?;
        let (src, dst) = (entry.path(), to.join(entry.file_name()));
        let kind = entry.file_type()?;
        if kind.is_dir() {
            mirror_tree(&src, &dst, link)?;
        } else if kind.is_file() {
            if !link || std::fs::hard_link(&src, &dst).is_err() {
                std::fs::copy(&src, &dst)
                    .with_context(|| format!("copying {} to {}", src.display(), dst.display()))?;
            }
        } else {
            bail!(
                "{} is neither a file nor a directory (refusing to link it)",
                src.display()
            );
        }
    }
    Ok(())
}

/// Prepares `scratch` as a data directory holding only the bundle installed in `source`.
fn prepare_scratch(source: &Path, scratch: &Path) -> anyhow::Result<String> {
    if !source.join("bundles").is_dir() {
        bail!(
            "no bundle is installed in {} (install one with `airlock install`, or pass --data)",
            source.display()
        );
    }
    if scratch.exists() && !scratch.join(SCRATCH_MARKER).is_file() {
        bail!(
            "{} exists and is not an eval scratch directory: pass another --scratch",
            scratch.display()
        );
    }
    let installed = airlock_bundle::Store::open(source)?
        .current()?
        .with_context(|| format!("no bundle is installed in {}", source.display()))?;
    if scratch.exists() {
        std::fs::remove_dir_all(scratch)
            .with_context(|| format!("removing the old scratch {}", scratch.display()))?;
    }
    std::fs::create_dir_all(scratch).with_context(|| format!("creating {}", scratch.display()))?;
    let (src, dst) = (source.canonicalize()?, scratch.canonicalize()?);
    if dst.starts_with(&src) || src.starts_with(&dst) {
        let _ = std::fs::remove_dir(scratch);
        bail!(
            "the scratch directory {} must lie outside the data directory {}",
            scratch.display(),
            source.display()
        );
    }
    std::fs::write(scratch.join(SCRATCH_MARKER), b"")?;
    let version = installed.version.clone();
    let bundles = scratch.join("bundles");
    link_tree(&installed.dir, &bundles.join(version.to_string()))?;
    let mut state = airlock_bundle::State::default();
    state.current = Some(version.clone());
    state.highest_installed = Some(version.clone());
    std::fs::write(
        bundles.join("state.json"),
        serde_json::to_vec_pretty(&state)?,
    )?;
    Ok(version.to_string())
}

/// Copies the document store (with its write-ahead log) and the indexes of the data directory
/// `from` into the scratch directory `to`.
fn copy_state(from: &Path, to: &Path) -> anyhow::Result<()> {
    let layout = airlock_platform::paths::DataDir::new(from);
    if !layout.db().is_file() || !layout.index().is_dir() {
        bail!(
            "{} holds no document store and indexes (airlock.db and index/)",
            from.display()
        );
    }
    // A corpus still queued for the background ingest would make the copy a partial corpus.
    let queued = airlock_serving::ingest_queue::pending(from)?;
    if !queued.is_empty() {
        let names: Vec<&str> = queued.iter().map(|j| j.name.as_str()).collect();
        bail!(
            "{} still has {} corpora queued for ingest ({}, in {}): let its daemon finish them (`GET /v1/info` shows `indexing`) or run `airlock demo --setup-only` there first",
            from.display(),
            queued.len(),
            names.join(", "),
            airlock_serving::ingest_queue::queue_dir(from).display()
        );
    }
    for name in airlock_platform::paths::SQLITE_FILES {
        let src = from.join(name);
        if src.is_file() {
            std::fs::copy(&src, to.join(name))
                .with_context(|| format!("copying {}", src.display()))?;
        }
    }
    mirror_tree(
        &layout.index(),
        &airlock_platform::paths::DataDir::new(to).index(),
        false,
    )
}

/// Logs warnings only (the progress bar owns the terminal), unless `AIRLOCK_LOG` says otherwise.
fn init_quiet_tracing(json: bool) {
    if std::env::var_os("AIRLOCK_LOG").is_none() {
        let builder = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::new("warn"))
            .with_writer(std::io::stderr);
        let _ = if json {
            builder.json().try_init()
        } else {
            builder.try_init()
        };
    } else {
        super::serve::init_tracing(json);
    }
}

impl OwnedDaemon {
    /// Prepares the scratch data directory and starts the daemon on `127.0.0.1:0`.
    fn start(a: &RunArgs, interrupted: Arc<AtomicBool>) -> anyhow::Result<Self> {
        let operator = operator_config(a)?;
        init_quiet_tracing(operator.json_logs());
        let source = operator.data_dir();
        let scratch = a
            .scratch
            .clone()
            .unwrap_or_else(|| a.out.join("scratch-data"));
        let version = prepare_scratch(&source, &scratch)?;
        if let Some(state) = &a.from_state {
            copy_state(state, &scratch)?;
            eprintln!(
                "==> owned daemon: documents, indexes and permissions copied from {}",
                state.display()
            );
        }
        eprintln!(
            "==> owned daemon: bundle {version} from {} linked into the scratch data dir {}",
            source.display(),
            scratch.display()
        );
        let config = Config {
            config_file: None,
            data: Some(scratch.clone()),
            keyring: Some(startup::keyring_path(&operator)),
            bind: Some(IpAddr::V4(Ipv4Addr::LOCALHOST)),
            port: Some(0),
            // Eval traffic must not be throttled or degraded by its own load: rungs are pinned
            // per pass by the runner.
            ladder: Some(false),
            // The runner's batch-priority requests must not be shed at a pinned rung 3 or 4
            // (rung 5 sheds everything anyway).
            batch_shed_rung: Some(airlock_serving::ladder::MAX_RUNG),
            user_requests_per_minute: Some(0),
            user_tokens_per_minute: Some(0),
            admin_requests_per_minute: Some(0),
            admin_tokens_per_minute: Some(0),
            // A scratch instance: the report's per-stage latencies need the users' timings.
            stage_timings_for_users: Some(true),
            trusted_header: None,
            trusted_header_secret: None,
            // Plain HTTP on loopback, whatever the operator's daemon serves.
            tls: crate::tls::TlsSettings::default(),
            // The daemon must not cut an answer the runner is still willing to wait for.
            request_timeout_secs: Some(
                operator
                    .request_timeout()
                    .as_secs()
                    .max(a.request_timeout_secs),
            ),
            ..operator
        };
        config.validate()?;
        let mut daemon = OwnedDaemon {
            base: String::new(),
            admin_token: String::new(),
            approver_token: String::new(),
            state: AppState::starting(config.clone()),
            stop: None,
            thread: None,
            scratch,
            keep: a.keep_scratch,
            done: false,
        };
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        daemon.stop = Some(stop_tx);
        let thread = std::thread::Builder::new()
            .name("airlock-eval-daemon".into())
            .spawn(move || serve_owned(config, ready_tx, stop_rx, interrupted))
            .context("starting the daemon thread")?;
        daemon.thread = Some(thread);
        eprintln!("==> verifying the bundle and loading the models");
        match ready_rx.recv() {
            Ok((addr, (token, approver), state)) => {
                daemon.base = format!("http://{addr}");
                daemon.admin_token = token;
                daemon.approver_token = approver;
                daemon.state = state;
                eprintln!("==> owned daemon ready on {}", daemon.base);
                Ok(daemon)
            }
            // The thread ended before it was ready: its result says why.
            Err(_) => match daemon.thread.take().map(std::thread::JoinHandle::join) {
                Some(Ok(Err(e))) => Err(e.context("starting the owned daemon")),
                _ => bail!("the owned daemon's thread ended before it was ready"),
            },
        }
    }

    /// Drains the daemon, then removes the scratch directory (unless kept).
    fn stop(mut self) -> anyhow::Result<()> {
        let drained = self.shutdown()?;
        if drained == Drained::DeadlineExceeded {
            eprintln!("warning: the owned daemon stopped after its drain deadline");
        }
        Ok(())
    }

    fn shutdown(&mut self) -> anyhow::Result<Drained> {
        self.done = true;
        drop(self.stop.take());
        let drained = match self.thread.take() {
            Some(t) => t
                .join()
                .map_err(|_| anyhow::anyhow!("the owned daemon's thread panicked"))
                .and_then(|r| r),
            None => Ok(Drained::Clean),
        };
        if self.keep {
            eprintln!("==> scratch data dir kept at {}", self.scratch.display());
        } else {
            std::fs::remove_dir_all(&self.scratch)
                .with_context(|| format!("removing {}", self.scratch.display()))?;
        }
        drained
    }
}

impl Drop for OwnedDaemon {
    fn drop(&mut self) {
        if !self.done {
            let _ = self.shutdown();
        }
    }
}

/// What the daemon thread hands back once it serves: its address, the admin's and the
/// approver's tokens, its state.
type Ready = (SocketAddr, (String, String), AppState);

/// The owned daemon's thread: egress lockdown (this thread and the ones it starts), start-up as
/// `airlock serve` does it, a local admin, then serving until `stop` resolves or is dropped.
fn serve_owned(
    config: Config,
    ready: std::sync::mpsc::Sender<Ready>,
    stop: tokio::sync::oneshot::Receiver<()>,
    interrupted: Arc<AtomicBool>,
) -> anyhow::Result<Drained> {
    crate::cli::serve::lock_down(&config)?;
    let services = startup::open(&config)?;
    // The runner's own two operators; a kept scratch directory given as --from-state already
    // holds them (from the run that kept it): they get new tokens.
    let operator = |user: &str, roles: Vec<Role>| match services.acl.user(user) {
        Some(_) => services.acl.issue_token(ACTOR, user),
        None => services.acl.add_user(
            ACTOR,
            user,
            &NewUser {
                groups: vec![],
                roles,
                local: true,
            },
        ),
    };
    let admin = operator(EVAL_ADMIN, vec![Role::Admin, Role::Operator])?;
    let approver = operator(EVAL_APPROVER, vec![Role::Admin])?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("airlock-eval-http")
        .build()
        .context("starting the async runtime")?;
    let grace = config.shutdown_grace();
    let addr = config.addr();
    let listener = runtime
        .block_on(server::bind(addr))
        .with_context(|| format!("binding {addr}"))?;
    let local = listener.local_addr()?;
    let state = AppState::ready(config, services);
    if ready
        .send((local, (admin, approver), state.clone()))
        .is_err()
    {
        return Ok(Drained::Clean);
    }
    let drained = runtime.block_on(server::serve(
        listener,
        state,
        async move {
            // Ctrl-C or SIGTERM also drains the daemon and stops the runner (no further case
            // starts; the run ends without a report), and the scratch directory is removed on
            // the way out.
            tokio::select! {
                _ = stop => {}
                () = server::shutdown_signal() => {
                    interrupted.store(true, Ordering::Relaxed);
                    tracing::warn!("interrupted: stopping the owned daemon");
                }
            }
        },
        grace,
    ))?;
    Ok(drained)
}

/// The per-rung quality table: what each rung of the ladder costs.
pub fn rung_table(reports: &[Report]) -> String {
    let mut s = String::from("| rung | cases | leaks |");
    for m in gate::HEADLINE {
        s.push_str(&format!(" {m} |"));
    }
    s.push_str("\n|---|---|---|");
    s.push_str(&"---|".repeat(gate::HEADLINE.len()));
    s.push('\n');
    for r in reports {
        s.push_str(&format!(
            "| {} | {} | {} |",
            r.rung.map_or("auto".into(), |x| x.to_string()),
            r.overall.cases,
            r.leaks()
        ));
        for m in gate::HEADLINE {
            match r.overall.metrics.get(m) {
                Some(e) => s.push_str(&format!(" {:.3} |", e.mean)),
                None => s.push_str(" – |"),
            }
        }
        s.push('\n');
    }
    s
}

fn write_json<T: serde::Serialize>(path: &Path, value: &T) -> anyhow::Result<()> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::write(path, serde_json::to_vec_pretty(value)?)
        .with_context(|| format!("writing {}", path.display()))
}

fn write_reports(dir: &Path, report: &Report) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    write_json(&dir.join("report.json"), report)?;
    std::fs::write(dir.join("report.md"), report.to_markdown())?;
    std::fs::write(dir.join("report.html"), airlock_eval::html::render(report))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rungs_parse_one_all_or_none() {
        assert_eq!(parse_rungs(None).unwrap(), [None]);
        assert_eq!(parse_rungs(Some("2")).unwrap(), [Some(2)]);
        assert_eq!(
            parse_rungs(Some("all")).unwrap(),
            [Some(0), Some(1), Some(2), Some(3)]
        );
        assert!(parse_rungs(Some("6")).is_err());
        assert!(parse_rungs(Some("x")).is_err());
    }

    #[test]
    fn scratch_refuses_foreign_directories_and_missing_bundles() {
        let tmp = tempfile::tempdir().unwrap();
        let data = tmp.path().join("data");
        let scratch = tmp.path().join("scratch");
        std::fs::create_dir_all(&data).unwrap();
        let err = prepare_scratch(&data, &scratch).unwrap_err().to_string();
        assert!(err.contains("no bundle is installed"), "{err}");
        assert!(!scratch.exists() && !data.join("bundles").exists());

        // Someone's directory is never replaced.
        std::fs::create_dir_all(data.join("bundles")).unwrap();
        std::fs::create_dir_all(&scratch).unwrap();
        std::fs::write(scratch.join("precious.txt"), "keep").unwrap();
        let err = prepare_scratch(&data, &scratch).unwrap_err().to_string();
        assert!(err.contains("not an eval scratch directory"), "{err}");
        assert!(scratch.join("precious.txt").is_file());

        // A store with nothing current.
        std::fs::write(scratch.join(SCRATCH_MARKER), "").unwrap();
        let err = prepare_scratch(&data, &scratch).unwrap_err().to_string();
        assert!(err.contains("no bundle is installed"), "{err}");
    }

    #[test]
    fn link_tree_hard_links_every_file() {
        use std::os::unix::fs::MetadataExt;
        let tmp = tempfile::tempdir().unwrap();
        let from = tmp.path().join("from");
        std::fs::create_dir_all(from.join("a/b")).unwrap();
        std::fs::write(from.join("top.bin"), b"1").unwrap();
        std::fs::write(from.join("a/b/deep.bin"), b"2").unwrap();
        let to = tmp.path().join("to");
        link_tree(&from, &to).unwrap();
        for f in ["top.bin", "a/b/deep.bin"] {
            let (x, y) = (
                std::fs::metadata(from.join(f)).unwrap(),
                std::fs::metadata(to.join(f)).unwrap(),
            );
            assert_eq!((x.dev(), x.ino()), (y.dev(), y.ino()), "{f}");
        }
    }

    #[test]
    fn copy_state_copies_the_store_and_indexes_and_shares_nothing() {
        use std::os::unix::fs::MetadataExt;
        let tmp = tempfile::tempdir().unwrap();
        let from = tmp.path().join("data");
        let to = tmp.path().join("scratch");
        std::fs::create_dir_all(&to).unwrap();
        // Not a data dir with state: refused.
        std::fs::create_dir_all(&from).unwrap();
        let e = copy_state(&from, &to).unwrap_err().to_string();
        assert!(e.contains("no document store"), "{e}");
        std::fs::create_dir_all(from.join("index/0/bm25")).unwrap();
        std::fs::write(from.join("airlock.db"), b"db").unwrap();
        std::fs::write(from.join("airlock.db-wal"), b"wal").unwrap();
        // A corpus still queued for ingest: refused, nothing copied.
        let corpus = tmp.path().join("c.jsonl");
        std::fs::write(&corpus, b"{}\n").unwrap();
        let job = airlock_serving::ingest_queue::enqueue(&from, "bank-dev", &corpus).unwrap();
        let e = copy_state(&from, &to).unwrap_err().to_string();
        assert!(e.contains("corpora queued for ingest (bank-dev"), "{e}");
        assert!(!to.join("airlock.db").exists());
        std::fs::remove_file(&job.path).unwrap();
        std::fs::write(from.join("index/0/bm25/seg"), b"seg").unwrap();
        std::fs::write(from.join("unrelated.txt"), b"x").unwrap();
        copy_state(&from, &to).unwrap();
        for f in ["airlock.db", "airlock.db-wal", "index/0/bm25/seg"] {
            let (x, y) = (
                std::fs::metadata(from.join(f)).unwrap(),
                std::fs::metadata(to.join(f)).unwrap(),
            );
            assert_ne!((x.dev(), x.ino()), (y.dev(), y.ino()), "{f} is shared");
            assert_eq!(
                std::fs::read(from.join(f)).unwrap(),
                std::fs::read(to.join(f)).unwrap()
            );
        }
        assert!(!to.join("airlock.db-shm").exists());
        assert!(!to.join("unrelated.txt").exists());
    }
}
