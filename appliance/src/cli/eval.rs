//! `airlock eval run|gate|baseline|report`: golden-set evaluation of a running appliance over its
//! public API, and the release gate.

use std::path::{Path, PathBuf};
use std::time::Duration;

use airlock_eval::client::Client;
use airlock_eval::gate::{self, Baseline, Report};
use airlock_eval::runner::{self, GoldenSet, RunOptions, Tokens};
use anyhow::{Context, bail};
use clap::{Args, Subcommand};
use indicatif::{ProgressBar, ProgressStyle};

/// Eval commands.
#[derive(Debug, Subcommand)]
pub enum EvalCommand {
    /// Run a golden set (bank layout) or a BEIR retrieval set against a daemon.
    Run(RunArgs),
    /// Decide whether a report may ship against a baseline (exit 1 if not).
    Gate(GateArgs),
    /// Write a baseline from an accepted report.
    Baseline(BaselineArgs),
    /// Render a report (JSON) as Markdown and HTML.
    Report(ReportArgs),
}

/// `airlock eval run`.
#[derive(Debug, Args)]
pub struct RunArgs {
    /// The set directory: bank layout (`golden.jsonl`, `corpus.jsonl`, `iam_v*.jsonl`,
    /// `deletions.json`) or BEIR layout (`corpus.jsonl`, `queries.jsonl`, `qrels/`).
    #[arg(long)]
    pub set: PathBuf,
    /// Base URL of the daemon, e.g. http://127.0.0.1:8080.
    #[arg(long)]
    pub against: String,
    /// JSON file of tokens (`{"admin": "...", "u001": "..."}`, as written by `airlock demo`).
    #[arg(long)]
    pub tokens: PathBuf,
    /// Ladder rung to force (0-5), or `all` for rungs 0-3 one after another.
    #[arg(long)]
    pub rung: Option<String>,
    /// Output directory for report.json, report.md and report.html.
    #[arg(long, default_value = "eval-out")]
    pub out: PathBuf,
    /// Requests in flight at once.
    #[arg(long, default_value_t = 2)]
    pub concurrency: usize,
    /// Retrieval mode: hybrid, bm25 or vector.
    #[arg(long, default_value = "hybrid")]
    pub mode: String,
    /// Chunks retrieved per query (BEIR sets retrieve at least 100 for recall@100).
    #[arg(long, default_value_t = 10)]
    pub top_k: usize,
    /// Score retrieval only (no chat completions).
    #[arg(long)]
    pub no_answers: bool,
    /// The corpus, ACLs and users are already in place: do not ingest, sync or issue tokens.
    #[arg(long)]
    pub no_setup: bool,
    /// qrels split of a BEIR set.
    #[arg(long, default_value = "dev")]
    pub split: String,
    /// Model alias for answers (default: the daemon's).
    #[arg(long)]
    pub model: Option<String>,
    /// Answer length limit.
    #[arg(long, default_value_t = 160)]
    pub max_tokens: u32,
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
        EvalCommand::Run(a) => run_set(a).map(|()| true),
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
    let mut tokens: Tokens = gate::read_json(&a.tokens)
        .with_context(|| format!("reading tokens from {}", a.tokens.display()))?;
    let client = Client::new(&a.against, Duration::from_secs(600));
    if !client.ready() {
        bail!(
            "{} is not ready (GET /readyz did not return 200)",
            a.against
        );
    }
    let bar = ProgressBar::new(0);
    bar.set_style(
        ProgressStyle::with_template("{msg:>12} [{bar:40}] {pos}/{len} eta {eta}")
            .expect("static template")
            .progress_chars("=> "),
    );
    let progress = |what: &str, done: usize, total: usize| {
        bar.set_message(what.to_owned());
        bar.set_length(total as u64);
        bar.set_position(done as u64);
    };
    let mut opts = RunOptions {
        rung: None,
        concurrency: a.concurrency,
        top_k: a.top_k,
        mode: a.mode.clone(),
        answers: !a.no_answers,
        max_tokens: a.max_tokens,
        model: a.model.clone(),
        setup: !a.no_setup,
    };
    let golden = runner::is_golden_set(&a.set);
    let set = if golden {
        Some(GoldenSet::read(&a.set)?)
    } else {
        None
    };
    let mut per_rung = Vec::new();
    for (i, rung) in rungs.iter().enumerate() {
        opts.rung = *rung;
        let report = match &set {
            Some(set) if i == 0 => runner::run_golden(&client, set, &mut tokens, &opts, &progress)?,
            Some(set) => runner::run_golden_final_state(&client, set, &tokens, &opts, &progress)?,
            None => runner::run_beir(&client, &a.set, &a.split, &mut tokens, &opts, &progress)?,
        };
        // Later rungs reuse the state the first run set up.
        opts.setup = false;
        let dir = match rung {
            Some(r) if rungs.len() > 1 => a.out.join(format!("rung-{r}")),
            _ => a.out.clone(),
        };
        write_reports(&dir, &report)?;
        bar.println(format!(
            "{}: {} cases, {} leaking -> {}",
            rung.map_or("auto rung".into(), |r| format!("rung {r}")),
            report.overall.cases,
            report.leaks(),
            dir.display()
        ));
        per_rung.push(report);
    }
    bar.finish_and_clear();
    if per_rung.len() > 1 {
        let table = rung_table(&per_rung);
        std::fs::write(a.out.join("rungs.md"), &table)?;
        std::fs::write(
            a.out.join("rungs.html"),
            airlock_eval::html::render_rungs(&per_rung),
        )?;
        print!("{table}");
    }
    let leaks: usize = per_rung.iter().map(Report::leaks).sum();
    if leaks > 0 {
        bail!("{leaks} case(s) leaked forbidden material (see the reports)");
    }
    Ok(())
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
