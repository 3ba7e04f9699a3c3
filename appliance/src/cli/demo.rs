//! `airlock demo`: a working appliance in one command — a demo signing key and keyring, the demo
//! bundle built from the staged models and installed, the demo's permissions, three generated
//! files (PDF, XLSX, DOCX), demo users with tokens in `DIR/demo/tokens.json`, the sample corpora
//! queued in `DIR/ingest-queue/`, then `airlock serve`, which serves at once and ingests the
//! queued corpora in the background (airlock_serving::ingest_queue; progress in the web UI's footer).
//! With `--setup-only` nothing serves, so the queued corpora are ingested before it exits.
//!
//! The corpus: the sample datasets (bank-dev and Cranfield, `--sample-data`) when that folder
//! exists; otherwise (a fresh clone) the repository's own real-document sets
//! (`--repo-corpus`, golden-sets/real/: manual pages and handbook chapters as HTML and PDF),
//! each queued as a folder job that `airlock ingest DIR` ingests (grants from its
//! `docs/.acl.jsonl`), with the set's users and groups (`iam_v1.jsonl`) as the demo users.
//!
//! Every step is idempotent: a re-run reuses the key, the installed bundle, the ingested corpus
//! (unchanged documents are skipped by content hash), the queue and the tokens file.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use airlock_acl::{NewUser, Role};
use anyhow::{Context, bail};
use clap::{Args, Parser};
use indicatif::{ProgressBar, ProgressStyle};
use serde_json::{Value, json};

use super::DataArgs;
use super::bundle::{BuildArgs, BundleCommand, InstallArgs};
use super::keys::{KeygenArgs, KeyringArgs, KeyringCommand, pinned_keyring};
use super::serve::init_tracing;
use crate::config::Config;

/// The demo's bundle version (bump when the staged models change).
pub const DEMO_VERSION: &str = "0.1.0";
/// Actor recorded in the audit log for the demo's set-up.
const ACTOR: &str = "airlock-demo";
/// Group that reads the Cranfield corpus (every demo user is in it).
const CRANFIELD_GROUP: &str = "demo-cranfield";
/// Group that reads the generated files on the repository corpus (every demo user is in it).
const FILES_GROUP: &str = "demo-files";
/// The operator account the demo creates.
const ADMIN: &str = "admin";
/// The second operator account: its approvals let `admin` make changes that need four eyes
/// (crate::approvals), e.g. a token for a user with access.
const APPROVER: &str = "approver";

/// `airlock demo`.
#[derive(Debug, Args)]
pub struct DemoArgs {
    /// The appliance's data directory.
    #[command(flatten)]
    pub data: DataArgs,
    /// Port to serve on.
    #[arg(long, default_value_t = 8080)]
    pub port: u16,
    /// Set everything up, then exit instead of serving.
    #[arg(long)]
    pub setup_only: bool,
    /// Install without ingesting anything and without demo users (tokens.json holds only the
    /// two operators, `admin` and `approver`).
    #[arg(long)]
    pub no_sample_data: bool,
    /// The staged models (made by scripts/fetch-models.sh).
    #[arg(long, env = "AIRLOCK_STAGING", default_value = "models-cache/staging")]
    pub staging: PathBuf,
    /// The sample datasets (`bank-dev/`, `cranfield/`).
    /// When this folder does not exist, the demo ingests `--repo-corpus` instead.
    #[arg(
        long,
        env = "AIRLOCK_SAMPLE_DATA",
        default_value = "../shared/datasets"
    )]
    pub sample_data: PathBuf,
    /// The repository's real-document sets ingested when `--sample-data` does not exist (each
    /// a folder with `docs/`, its `docs/.acl.jsonl` and `iam_v1.jsonl`; golden-sets/real/).
    #[arg(
        long,
        env = "AIRLOCK_REPO_CORPUS",
        value_delimiter = ',',
        default_value = "golden-sets/real/systemd-openssh,golden-sets/real/debian-handbook"
    )]
    pub repo_corpus: Vec<PathBuf>,
    /// Generated documents to ingest as files (a PDF, an XLSX rate sheet, a DOCX policy, from
    /// scripts/gen-doc-fixtures.py), readable by every demo user, so answers cite pages and
    /// sheets; skipped when the folder is absent.
    #[arg(
        long,
        env = "AIRLOCK_SAMPLE_FILES",
        default_value = "extract/tests/fixtures"
    )]
    pub sample_files: PathBuf,
}

/// The generated documents the demo ingests as files (see [`DemoArgs::sample_files`]).
const SAMPLE_FILES: [&str; 3] = ["table-two-pages.pdf", "rates.xlsx", "policy.docx"];

fn step(msg: &str) {
    eprintln!("==> {msg}");
}

/// Runs `airlock demo`.
///
/// Lockdown order (issue 19 F7): the set-up runs under an egress lockdown applied first, while
/// the process is single-threaded (no outbound TCP; writes only beneath the data directory,
/// which the set-up fills: key, keyring, bundle, database). To serve, the process then execs
/// `airlock serve`, which starts single-threaded again and applies the daemon's own lockdown
/// (keyring and bundles read-only) before its runtime, engine and ladder threads exist — the
/// set-up's worker threads (ingest, model loading) never serve.
pub fn run(args: DemoArgs) -> anyhow::Result<bool> {
    let data = args.data.data.clone();
    let demo = data.join("demo");
    std::fs::create_dir_all(&demo).with_context(|| format!("creating {}", demo.display()))?;
    let mut config = demo_config(&data, args.port)?;
    init_tracing(config.json_logs());
    // The set-up never dials the rack or the directory (the `airlock serve` exec'd afterwards
    // does, with the same AIRLOCK_CONFIG), but Landlock domains survive exec: the set-up's must
    // already allow their ports, or the daemon's could not. The same for the OIDC provider's
    // endpoints (discovered here, before the lockdown).
    let oidc = super::serve::discover_oidc(&config)?;
    let rack_ports = super::serve::egress_ports(&config, oidc.as_deref());
    config.remote_generators.clear();
    lock_down_setup(&data, &rack_ports, config.require_sandbox())?;

    // 1. Demo signing key and the pinned keyring (root of trust).
    let key = ensure_keys(&args, &data, &demo)?;
    // 2. Build, sign and install the demo bundle (once).
    ensure_bundle(&args, &data, &demo, &key)?;

    let tokens_path = demo.join("tokens.json");
    let mut opened: Option<crate::Services> = None;
    if !tokens_path.exists() {
        opened = Some(set_up_users(&args, &data, &config, &tokens_path)?);
    } else {
        step(&format!("reusing {}", tokens_path.display()));
    }

    let queued = airlock_serving::ingest_queue::pending(&data)?;
    if args.setup_only {
        // Nothing will serve: ingest the queued corpora here, now.
        if !queued.is_empty() {
            let services = match opened {
                Some(s) => s,
                None => crate::startup::open(&config).context("opening the appliance")?,
            };
            ingest_queued_now(&services, &data, &config)?;
        }
        step("set-up complete (--setup-only)");
        return Ok(true);
    }
    drop(opened);
    if !queued.is_empty() {
        let names: Vec<&str> = queued.iter().map(|j| j.name.as_str()).collect();
        step(&format!(
            "serving now; {} ingest in the background (progress in the web UI's footer)",
            names.join(" and ")
        ));
    }
    let bind = config.addr();
    eprintln!(
        "\nAirlock is starting on http://{bind}/ — sign in with a token from {}\n",
        tokens_path.display()
    );
    exec_serve(&data, args.port)
}

/// The demo signing key (generated once) and the pinned keyring of its public key; the key's
/// path.
fn ensure_keys(args: &DemoArgs, data: &Path, demo: &Path) -> anyhow::Result<PathBuf> {
    let key = demo.join("keys").join("demo.key");
    if !key.exists() {
        step("generating the demo signing key");
        super::keys::keygen(KeygenArgs {
            out: demo.join("keys"),
            name: "demo".into(),
        })?;
    }
    if !pinned_keyring(data).exists() {
        step("pinning the demo keyring (threshold 1)");
        super::keys::keyring(KeyringCommand::Init {
            keys: vec![demo.join("keys").join("demo.pub")],
            threshold: 1,
            out: None,
            data: args.data.clone(),
        })?;
    }
    Ok(key)
}

/// The demo bundle built from the staged models, signed with `key` and installed, unless a
/// bundle is installed already.
fn ensure_bundle(args: &DemoArgs, data: &Path, demo: &Path, key: &Path) -> anyhow::Result<()> {
    let store = airlock_bundle::Store::open(data)
        .with_context(|| format!("opening the bundle store in {}", data.display()))?;
    if store.current()?.is_none() {
        if !args.staging.join("catalogue.json").is_file() {
            bail!(
                "{} has no staged models: run scripts/fetch-models.sh first",
                args.staging.display()
            );
        }
        let file = demo.join(format!("airlock-demo-{DEMO_VERSION}.tar.zst"));
        step(&format!(
            "building and signing the demo bundle {DEMO_VERSION}"
        ));
        super::bundle::bundle(BundleCommand::Build(BuildArgs {
            from: args.staging.clone(),
            version: DEMO_VERSION.parse().context("demo version")?,
            sign: vec![key.to_path_buf()],
            out: file.clone(),
            name: "airlock-demo".into(),
            binary: None,
            zstd_level: 3,
            min_previous: None,
            created: None,
        }))?;
        step("verifying and installing the bundle");
        super::bundle::install(InstallArgs {
            file,
            keyring: KeyringArgs { keyring: None },
            data: args.data.clone(),
        })?;
    } else {
        step("a verified bundle is already installed");
    }
    Ok(())
}

/// Step 3: opens the appliance exactly as the daemon does (verifies the bundle, loads models),
/// makes the two local admins and, unless told not to, the sample data and its users, and
/// writes every user's token to `tokens_path`; the open appliance.
fn set_up_users(
    args: &DemoArgs,
    data: &Path,
    config: &Config,
    tokens_path: &Path,
) -> anyhow::Result<crate::Services> {
    step("opening the appliance (verifying the bundle, loading the embedder)");
    let services = crate::startup::open(config).context("opening the appliance")?;
    let mut tokens = BTreeMap::new();
    tokens.insert(ADMIN.to_owned(), local_admin_token(&services, ADMIN)?);
    tokens.insert(APPROVER.to_owned(), local_admin_token(&services, APPROVER)?);
    if !args.no_sample_data {
        for u in load_sample_data(args, &services, data)? {
            let t = services.acl.issue_token(ACTOR, &u)?;
            tokens.insert(u, t);
        }
    }
    write_private(tokens_path, &serde_json::to_vec_pretty(&tokens)?)?;
    step(&format!(
        "{} tokens written to {}",
        tokens.len(),
        tokens_path.display()
    ));
    Ok(services)
}

/// A token of the local admin `user`, made (admin and operator) if missing.
fn local_admin_token(services: &crate::Services, user: &str) -> anyhow::Result<String> {
    Ok(match services.acl.user(user) {
        Some(_) => services.acl.issue_token(ACTOR, user)?,
        None => services.acl.add_user(
            ACTOR,
            user,
            &NewUser {
                groups: vec![],
                roles: vec![Role::Admin, Role::Operator],
                local: true,
            },
        )?,
    })
}

/// Permissions first (grants may name documents not stored yet), then the three files
/// (seconds), then the corpora queued: the daemon ingests them while it serves. The sample
/// datasets when present, else the repository's documents; the users the permissions name.
fn load_sample_data(
    args: &DemoArgs,
    services: &crate::Services,
    data: &Path,
) -> anyhow::Result<Vec<String>> {
    Ok(if args.sample_data.exists() {
        step(&format!(
            "corpus: the sample datasets in {} (bank-dev, Cranfield)",
            args.sample_data.display()
        ));
        let users = apply_sample_permissions(services, &args.sample_data)?;
        load_sample_files(services, &args.sample_files, CRANFIELD_GROUP)?;
        queue_sample_corpora(data, &args.sample_data)?;
        users
    } else {
        step(&format!(
            "corpus: no sample datasets at {}; using the repository's real documents ({})",
            args.sample_data.display(),
            args.repo_corpus
                .iter()
                .map(|p| p.display().to_string())
                .collect::<Vec<_>>()
                .join(", ")
        ));
        let users = apply_repo_permissions(services, &args.repo_corpus)?;
        load_sample_files(services, &args.sample_files, FILES_GROUP)?;
        queue_repo_corpus(data, &args.repo_corpus)?;
        users
    })
}

/// Ingests [`SAMPLE_FILES`] from `dir` as files (originals kept), each with its grant to
/// `group` in one transaction.
fn load_sample_files(services: &crate::Services, dir: &Path, group: &str) -> anyhow::Result<()> {
    if !dir.join(SAMPLE_FILES[0]).is_file() {
        step(&format!(
            "no generated documents in {}: skipped",
            dir.display()
        ));
        return Ok(());
    }
    step(&format!(
        "ingesting {} generated documents as files ({})",
        SAMPLE_FILES.len(),
        SAMPLE_FILES.join(", ")
    ));
    let grants = airlock_acl::DocGrants {
        users: vec![],
        groups: vec![group.to_owned()],
    };
    let max = services.retrieval.config().max_document_bytes;
    for name in SAMPLE_FILES {
        let path = dir.join(name);
        let bytes = std::fs::read(&path).with_context(|| format!("reading {}", path.display()))?;
        let format = airlock_retrieval::SourceFormat::from_extension(
            path.extension().and_then(|e| e.to_str()).unwrap_or(""),
        )
        .with_context(|| format!("{name}: not a known format"))?;
        let mut doc = airlock_retrieval::ingest::parse_document(name, None, &bytes, format, max)?;
        doc.original = Some(airlock_retrieval::Original::new(format.media_type(), bytes));
        let staged = services.retrieval.stage(doc)?;
        crate::routes::documents::store_with_grant(
            &services.acl,
            &services.retrieval,
            airlock_acl::Actor::from(ACTOR),
            name,
            &grants,
            staged,
        )
        .map_err(|e| anyhow::anyhow!("{name}: {}", e.problem().detail))?;
    }
    Ok(())
}

/// The set-up's lockdown: on the still single-threaded process (refused otherwise), writes only
/// beneath `data` (and `/dev/null`), no outbound TCP. Not enforced: a warning, or with
/// `require_sandbox` a refusal, as for `airlock serve`.
fn lock_down_setup(data: &Path, rack_ports: &[u16], require: bool) -> anyhow::Result<()> {
    if let Some(threads) = airlock_platform::sandbox::process_threads()
        && threads > 1
    {
        return Err(anyhow::Error::new(
            airlock_platform::sandbox::SandboxError::NotSingleThreaded { threads },
        ))
        .context("refusing to start the demo");
    }
    let dev_null = Path::new("/dev/null");
    let mut writable = vec![data];
    if dev_null.exists() {
        writable.push(dev_null);
    }
    match airlock_platform::sandbox::lock_down_allowing(&writable, rack_ports, require) {
        Ok(r) if r.fully_enforced() => {
            tracing::info!(landlock = %r.detail, "demo set-up locked down (no outbound TCP, writes beneath the data directory only)");
            Ok(())
        }
        Ok(r) => {
            tracing::warn!(landlock = %r.detail, "demo set-up lockdown incomplete");
            Ok(())
        }
        Err(e) if require => {
            Err(anyhow::Error::new(e).context("refusing to start (require_sandbox = true)"))
        }
        Err(e) => {
            tracing::warn!(error = %e, "demo set-up lockdown not applied");
            Ok(())
        }
    }
}

/// Replaces this process with `airlock serve --data DATA --port PORT` (the same environment, so
/// the same `AIRLOCK_*` settings), which locks itself down before it starts any thread.
fn exec_serve(data: &Path, port: u16) -> anyhow::Result<bool> {
    use std::os::unix::process::CommandExt;
    let exe = std::env::current_exe().context("locating the airlock binary")?;
    let err = std::process::Command::new(&exe)
        .arg("serve")
        .arg("--data")
        .arg(data)
        .arg("--port")
        .arg(port.to_string())
        .exec();
    Err(anyhow::Error::new(err).context(format!("starting {} serve", exe.display())))
}

fn demo_config(data: &Path, port: u16) -> anyhow::Result<Config> {
    #[derive(Parser)]
    struct Wrap {
        #[command(flatten)]
        config: Config,
    }
    let data = data.to_string_lossy().into_owned();
    let port = port.to_string();
    let w = Wrap::try_parse_from(["airlock", "--data", &data, "--port", &port])
        .context("demo settings")?;
    Ok(w.config.load()?)
}

fn write_private(path: &Path, bytes: &[u8]) -> anyhow::Result<()> {
    use std::io::Write;
    #[cfg(unix)]
    use std::os::unix::fs::OpenOptionsExt;
    let tmp = path.with_extension("tmp");
    let mut opts = std::fs::OpenOptions::new();
    opts.write(true).create(true).truncate(true);
    #[cfg(unix)]
    opts.mode(0o600);
    let mut f = opts
        .open(&tmp)
        .with_context(|| format!("writing {}", tmp.display()))?;
    f.write_all(bytes)?;
    f.sync_all()?;
    std::fs::rename(&tmp, path)?;
    Ok(())
}

/// A progress bar on a terminal; on a pipe or log file, one line every few seconds instead.
fn bar(len: u64, msg: &str) -> ProgressBar {
    use std::io::IsTerminal;
    let b = if std::io::stderr().is_terminal() {
        ProgressBar::new(len)
    } else {
        ProgressBar::with_draw_target(
            Some(len),
            indicatif::ProgressDrawTarget::term_like_with_hz(Box::new(LineTerm::default()), 1),
        )
    };
    b.set_style(
        ProgressStyle::with_template("{msg:>18} [{bar:40}] {pos}/{len} {per_sec} eta {eta}")
            .expect("static template")
            .progress_chars("=> "),
    );
    b.set_message(msg.to_owned());
    b.enable_steady_tick(Duration::from_millis(500));
    b
}

/// The sample corpora, in the order they are ingested.
const SAMPLE_CORPORA: [&str; 2] = ["bank-dev", "cranfield"];

fn sample_corpus(dir: &Path, name: &str) -> anyhow::Result<PathBuf> {
    let path = dir.join(name).join("corpus.jsonl");
    if !path.is_file() {
        bail!(
            "{} not found: pass --sample-data DIR (the folder holding bank-dev/ and cranfield/) or --no-sample-data",
            path.display()
        );
    }
    Ok(path)
}

/// Queues bank-dev and Cranfield in `DATA/ingest-queue/` (airlock_serving::ingest_queue).
fn queue_sample_corpora(data: &Path, dir: &Path) -> anyhow::Result<()> {
    for name in SAMPLE_CORPORA {
        let job = airlock_serving::ingest_queue::enqueue(data, name, &sample_corpus(dir, name)?)?;
        step(&format!(
            "queued {name} for ingest ({})",
            job.path.display()
        ));
    }
    Ok(())
}

/// Queues the real-document sets' `docs/` folders in `DATA/ingest-queue/` as folder jobs, named
/// after their sets.
fn queue_repo_corpus(data: &Path, sets: &[PathBuf]) -> anyhow::Result<()> {
    for set in sets {
        let name = set_name(set)?;
        let job = airlock_serving::ingest_queue::enqueue_folder(data, &name, &set.join("docs"))?;
        step(&format!(
            "queued {name} for ingest ({})",
            job.path.display()
        ));
    }
    Ok(())
}

/// A real-document set's name (its folder's), after checking it holds `docs/.acl.jsonl` and
/// `iam_v1.jsonl`.
fn set_name(set: &Path) -> anyhow::Result<String> {
    for need in ["docs/.acl.jsonl", "iam_v1.jsonl"] {
        if !set.join(need).is_file() {
            bail!(
                "{} not found: run the demo from the repository's top folder, pass --repo-corpus \
                 SET (a folder of golden-sets/real/) or --sample-data DIR (the folder holding \
                 bank-dev/ and cranfield/), or --no-sample-data",
                set.join(need).display()
            );
        }
    }
    let name = set
        .canonicalize()
        .ok()
        .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
        .with_context(|| format!("{}: no folder name", set.display()))?;
    airlock_serving::ingest_queue::check_name(&name)?;
    Ok(name)
}

/// Applies the real-document sets' permissions (their `iam_v1.jsonl` in one snapshot: a user of
/// several sets gets the groups of all, and every user reads the generated files through
/// [`FILES_GROUP`]) and returns the demo users.
fn apply_repo_permissions(
    services: &crate::Services,
    sets: &[PathBuf],
) -> anyhow::Result<Vec<String>> {
    let mut users: BTreeMap<String, std::collections::BTreeSet<String>> = BTreeMap::new();
    let mut grants = String::new();
    for set in sets {
        set_name(set)?;
        let iam = set.join("iam_v1.jsonl");
        let f = std::fs::File::open(&iam).with_context(|| format!("opening {}", iam.display()))?;
        for line in BufReader::new(f).lines() {
            let line = line?;
            if line.trim().is_empty() {
                continue;
            }
            let v: Value =
                serde_json::from_str(&line).with_context(|| format!("{}", iam.display()))?;
            match v.get("user").and_then(Value::as_str) {
                Some(u) => {
                    let groups = users.entry(u.to_owned()).or_default();
                    for g in v
                        .get("groups")
                        .and_then(Value::as_array)
                        .into_iter()
                        .flatten()
                    {
                        if let Some(g) = g.as_str() {
                            groups.insert(g.to_owned());
                        }
                    }
                }
                None => {
                    grants.push_str(&v.to_string());
                    grants.push('\n');
                }
            }
        }
    }
    let mut snapshot = String::new();
    for (u, groups) in &mut users {
        groups.insert(FILES_GROUP.to_owned());
        snapshot.push_str(&json!({"user": u, "groups": groups}).to_string());
        snapshot.push('\n');
    }
    snapshot.push_str(&grants);
    step(
        "applying permissions (the sets' iam_v1.jsonl; every demo user reads the generated files)",
    );
    let counts = services
        .acl
        .sync_snapshot(ACTOR, snapshot.as_bytes())
        .context("applying the demo permissions")?;
    step(&format!(
        "{} users, {} grants changed",
        counts.users_added, counts.grants_changed
    ));
    for (u, groups) in &users {
        let groups: Vec<&str> = groups.iter().map(String::as_str).collect();
        step(&format!("demo user {u}: {}", groups.join(" ")));
    }
    Ok(users.into_keys().collect())
}

/// Runs the queued ingest jobs on this thread with a progress bar (`--setup-only`); folder jobs
/// as `airlock ingest DIR` runs them, with `config`'s limits.
fn ingest_queued_now(
    services: &crate::Services,
    data: &Path,
    config: &Config,
) -> anyhow::Result<()> {
    let status = airlock_serving::ingest_queue::Status::default();
    let folders = super::ingest_dir::folder_ingest(config);
    let mut current: Option<(String, ProgressBar)> = None;
    let done =
        airlock_serving::ingest_queue::drain(services, data, &status, &*folders, &mut |job, s| {
            if current.as_ref().map(|(n, _)| n.as_str()) != Some(job.name.as_str()) {
                if let Some((_, pb)) = current.take() {
                    pb.finish_and_clear();
                }
                step(&format!(
                    "ingesting {}: {} documents",
                    job.name, s.docs_total
                ));
                current = Some((job.name.clone(), bar(s.docs_total as u64, "documents")));
            }
            if let Some((_, pb)) = &current {
                pb.set_length(s.docs_total as u64);
                pb.set_position(s.docs_done as u64);
                pb.set_message(format!("{:.0} chunks/s", s.chunks_per_s));
            }
        })?;
    if let Some((_, pb)) = current.take() {
        pb.finish_and_clear();
    }
    for (job, o) in done {
        step(&format!(
            "{}: {} stored, {} refused, {} chunks embedded",
            job.name, o.stored, o.refused, o.chunks
        ));
    }
    Ok(())
}

/// Applies the demo's permissions (bank-dev's IAM snapshot, every user also reading Cranfield)
/// and returns the demo users. The documents may come later: grants and documents share
/// ordinals, so each document is readable by its grantees from the moment it is stored.
fn apply_sample_permissions(services: &crate::Services, dir: &Path) -> anyhow::Result<Vec<String>> {
    let bank = dir.join("bank-dev");
    let cran = dir.join("cranfield");
    for name in SAMPLE_CORPORA {
        sample_corpus(dir, name)?;
    }

    // One snapshot: bank-dev's iam_v1, every user also in the Cranfield readers' group, and every
    // Cranfield document granted to that group.
    let mut snapshot = String::new();
    let mut users = Vec::new();
    let iam = bank.join("iam_v1.jsonl");
    let f = std::fs::File::open(&iam).with_context(|| format!("opening {}", iam.display()))?;
    for line in BufReader::new(f).lines() {
        let line = line?;
        if line.trim().is_empty() {
            continue;
        }
        let mut v: Value =
            serde_json::from_str(&line).with_context(|| format!("{}", iam.display()))?;
        if let Some(u) = v.get("user").and_then(Value::as_str) {
            users.push(u.to_owned());
            if let Some(g) = v.get_mut("groups").and_then(Value::as_array_mut) {
                g.push(json!(CRANFIELD_GROUP));
            }
        }
        snapshot.push_str(&v.to_string());
        snapshot.push('\n');
    }
    let corpus = cran.join("corpus.jsonl");
    let f = std::fs::File::open(&corpus)?;
    for line in BufReader::new(f).lines() {
        let v: Value = serde_json::from_str(&line?)?;
        if let Some(id) = v.get("_id").and_then(Value::as_str) {
            snapshot.push_str(
                &json!({"doc": id, "users": [], "groups": [CRANFIELD_GROUP]}).to_string(),
            );
            snapshot.push('\n');
        }
    }
    step("applying permissions (bank-dev iam_v1 + Cranfield for all demo users)");
    let counts = services
        .acl
        .sync_snapshot(ACTOR, snapshot.as_bytes())
        .context("applying the demo permissions")?;
    step(&format!(
        "{} users, {} grants changed",
        counts.users_added, counts.grants_changed
    ));
    Ok(users)
}

/// A `TermLike` for pipes: a redraw becomes one plain line, at most every ten seconds.
#[derive(Debug, Default)]
struct LineTerm {
    last: std::sync::Mutex<Option<Instant>>,
}

impl LineTerm {
    fn line(&self, s: &str) {
        let mut last = self.last.lock().unwrap_or_else(|e| e.into_inner());
        if s.trim().is_empty() || last.is_some_and(|t| t.elapsed() < Duration::from_secs(10)) {
            return;
        }
        *last = Some(Instant::now());
        eprintln!("{}", s.trim_end());
    }
}

impl indicatif::TermLike for LineTerm {
    fn width(&self) -> u16 {
        100
    }
    fn move_cursor_up(&self, _: usize) -> std::io::Result<()> {
        Ok(())
    }
    fn move_cursor_down(&self, _: usize) -> std::io::Result<()> {
        Ok(())
    }
    fn move_cursor_right(&self, _: usize) -> std::io::Result<()> {
        Ok(())
    }
    fn move_cursor_left(&self, _: usize) -> std::io::Result<()> {
        Ok(())
    }
    fn write_line(&self, s: &str) -> std::io::Result<()> {
        self.line(s);
        Ok(())
    }
    fn write_str(&self, s: &str) -> std::io::Result<()> {
        self.line(s);
        Ok(())
    }
    fn clear_line(&self) -> std::io::Result<()> {
        Ok(())
    }
    fn flush(&self) -> std::io::Result<()> {
        Ok(())
    }
}
