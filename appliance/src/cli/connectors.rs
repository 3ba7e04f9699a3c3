//! `airlock connectors status|sync|verify|holdings`: the connectors of a running daemon, through
//! its API (`GET /v1/connectors`, `POST /v1/connectors/{alias}/sync|verify`,
//! `GET /v1/connectors/{alias}/holdings`, operator role). The daemon is
//! the one writer of its data directory, so the CLI never syncs by itself: it asks.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::Context;
use serde_json::Value;

/// `airlock connectors ...`.
#[derive(Debug, clap::Subcommand)]
pub enum ConnectorsCommand {
    /// Each source's state: running, last success, last run's error and counts, per-item
    /// errors, unknown principals (JSON).
    Status(DaemonArgs),
    /// Start a sync of one source now; with --wait, wait for it and fail if it fails.
    Sync(SyncArgs),
    /// The drift check: a fresh crawl compared with the grants Airlock holds, user by user;
    /// prints the report and fails on any mismatch.
    Verify(VerifyArgs),
    /// What this appliance holds of one source (documents, content versions, readers) as one
    /// digest: equal on two appliances that synced the same source to the same point (JSON).
    Holdings(VerifyArgs),
}

/// `airlock connectors verify ALIAS` and `airlock connectors holdings ALIAS`.
#[derive(Debug, clap::Args)]
pub struct VerifyArgs {
    /// The source's alias.
    pub alias: String,
    /// The daemon.
    #[command(flatten)]
    pub daemon: DaemonArgs,
}

/// How to reach the running daemon.
#[derive(Debug, clap::Args)]
pub struct DaemonArgs {
    /// The daemon's base URL.
    #[arg(long, env = "AIRLOCK_URL", default_value = "http://127.0.0.1:8080")]
    pub url: String,
    /// File holding an operator's bearer token (mode 600).
    #[arg(long, env = "AIRLOCK_TOKEN_FILE")]
    pub token_file: PathBuf,
    /// PEM file of the CA the daemon's HTTPS certificate chains to (https URLs).
    #[arg(long, env = "AIRLOCK_CA_FILE")]
    pub ca_file: Option<PathBuf>,
}

/// `airlock connectors sync ALIAS`.
#[derive(Debug, clap::Args)]
pub struct SyncArgs {
    /// The source's alias (`[[connectors]]` `alias`).
    pub alias: String,
    /// Wait until the sync ends (at most this many seconds) and report it.
    #[arg(long, value_name = "SECS")]
    pub wait: Option<u64>,
    /// The daemon.
    #[command(flatten)]
    pub daemon: DaemonArgs,
}

fn client(
    a: &DaemonArgs,
    timeout: Duration,
) -> anyhow::Result<(airlock_eval::client::Client, String)> {
    let token = airlock_platform::secrets::read_secret(&a.token_file)
        .map_err(|e| anyhow::anyhow!("--token-file: {e}"))?;
    let tls = airlock_eval::client::TlsOptions {
        ca_file: a.ca_file.clone(),
        ..Default::default()
    };
    let client = airlock_eval::client::Client::with_tls(&a.url, timeout, &tls)
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    Ok((client, token))
}

fn source<'v>(status: &'v Value, alias: &str) -> Option<&'v Value> {
    status["data"]
        .as_array()?
        .iter()
        .find(|s| s["alias"] == alias)
}

/// `METHOD /v1/connectors/{alias}/{action}` on the daemon; prints the answer and returns it.
fn print_call(
    a: &VerifyArgs,
    method: &'static str,
    action: &str,
    timeout: Duration,
) -> anyhow::Result<Value> {
    let (c, token) = client(&a.daemon, timeout)?;
    let path = format!("/v1/connectors/{}/{action}", a.alias);
    let answer = c
        .call(method, &path, &token, None)
        .with_context(|| format!("{method} {path}"))?;
    println!("{}", serde_json::to_string_pretty(&answer)?);
    Ok(answer)
}

/// Runs a connectors command; `Ok(false)`: the awaited sync failed.
pub fn run(cmd: ConnectorsCommand) -> anyhow::Result<bool> {
    match cmd {
        ConnectorsCommand::Status(a) => {
            let (c, token) = client(&a, Duration::from_secs(60))?;
            let status = c
                .call("GET", "/v1/connectors", &token, None)
                .context("GET /v1/connectors")?;
            println!("{}", serde_json::to_string_pretty(&status)?);
            Ok(true)
        }
        ConnectorsCommand::Sync(a) => {
            let (c, token) = client(&a.daemon, Duration::from_secs(60))?;
            let before = c
                .call("GET", "/v1/connectors", &token, None)
                .context("GET /v1/connectors")?;
            let last = source(&before, &a.alias)
                .and_then(|s| s["last_run"]["finished_at"].as_u64())
                .unwrap_or(0);
            let path = format!("/v1/connectors/{}/sync", a.alias);
            c.call("POST", &path, &token, None)
                .with_context(|| format!("POST {path}"))?;
            eprintln!("sync of `{}` requested", a.alias);
            let Some(wait) = a.wait else { return Ok(true) };
            let deadline = Instant::now() + Duration::from_secs(wait);
            loop {
                std::thread::sleep(Duration::from_secs(1));
                let now = c
                    .call("GET", "/v1/connectors", &token, None)
                    .context("GET /v1/connectors")?;
                let s = source(&now, &a.alias)
                    .with_context(|| format!("`{}` is no longer listed", a.alias))?;
                let finished = s["last_run"]["finished_at"].as_u64().unwrap_or(0);
                if finished > last && s["running"] == false {
                    println!("{}", serde_json::to_string_pretty(&s["last_run"])?);
                    return Ok(s["last_run"]["error"].is_null());
                }
                if Instant::now() > deadline {
                    anyhow::bail!("the sync of `{}` did not end within {wait} s", a.alias);
                }
            }
        }
        ConnectorsCommand::Verify(a) => {
            // A crawl of the whole share: minutes on a large one.
            let report = print_call(&a, "POST", "verify", Duration::from_secs(3600))?;
            Ok(report["leaks"] == 0 && report["missing"] == 0)
        }
        ConnectorsCommand::Holdings(a) => {
            print_call(&a, "GET", "holdings", Duration::from_secs(600))?;
            Ok(true)
        }
    }
}
