//! `airlock bundle build|stage|verify|inspect|list|sbom|verify-installed`, `airlock install` and
//! `airlock rollback`: the signed-bundle supply chain on the command line.

use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::time::Duration;

use airlock_bundle::{
    BuildOptions, InstallOptions, InstallOutcome, InstallStage, Limits, Progress, Store, build,
    inspect_file, verify_file,
};
use airlock_inference::catalogue::Role as ModelRole;
use airlock_inference::stage::StageModel;
use airlock_signing::KeyPair;
use anyhow::Context;
use clap::{Args, Subcommand};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use super::DataArgs;
use super::keys::KeyringArgs;

/// Environment variable naming a stage at which the process stops dead (crash tests): an
/// install stage, or an ingest stage (`airlock ingest`, see [`super::ingest`]).
pub const FAILPOINT_ENV: &str = "AIRLOCK_FAILPOINT";

/// `airlock bundle ...`.
#[derive(Debug, Subcommand)]
pub enum BundleCommand {
    /// Build a signed bundle from every regular file under a directory.
    #[command(disable_version_flag = true)]
    Build(BuildArgs),
    /// Stage models for `bundle build`: compile each GGUF generator's tokenizer and chat
    /// template and write the model catalogue (docs/operations/release-bundle.md, "Packaging your own model").
    Stage(StageArgs),
    /// Verify a bundle file (signatures, then every entry) without installing it.
    Verify {
        /// The bundle file.
        file: PathBuf,
        /// Keyring to check signatures against.
        #[command(flatten)]
        keyring: KeyringArgs,
        /// The data directory.
        #[command(flatten)]
        data: DataArgs,
    },
    /// Show a bundle's manifest and signers WITHOUT verifying anything.
    Inspect {
        /// The bundle file.
        file: PathBuf,
        /// Print the manifest as JSON.
        #[arg(long)]
        json: bool,
    },
    /// List installed bundles (current, previous) and the rollback floor.
    List {
        /// The data directory.
        #[command(flatten)]
        data: DataArgs,
    },
    /// Print this binary's software bill of materials (CycloneDX 1.5 JSON): the crates linked
    /// into it, with versions, licences and Cargo.lock checksums. `bundle build` writes the
    /// same document into every bundle as sbom.cdx.json.
    Sbom,
    /// Re-check the current bundle's signature and every file's digest.
    VerifyInstalled {
        /// Keyring to check signatures against.
        #[command(flatten)]
        keyring: KeyringArgs,
        /// The data directory.
        #[command(flatten)]
        data: DataArgs,
    },
}

/// `airlock bundle build`.
#[derive(Debug, Args)]
pub struct BuildArgs {
    /// Source directory (regular files only; `catalogue.json` becomes the model catalogue).
    #[arg(long, value_name = "DIR")]
    pub from: PathBuf,
    /// Bundle version (semver, e.g. 1.4.0).
    #[arg(long)]
    pub version: airlock_bundle::Version,
    /// Private key file(s) to sign with (at least the keyring's threshold).
    #[arg(long = "sign", value_name = "KEY", required = true)]
    pub sign: Vec<PathBuf>,
    /// Output bundle file.
    #[arg(long, value_name = "FILE")]
    pub out: PathBuf,
    /// Bundle name.
    #[arg(long, default_value = "airlock")]
    pub name: String,
    /// Carry this appliance binary as bin/airlock.
    #[arg(long, value_name = "PATH")]
    pub binary: Option<PathBuf>,
    /// zstd level (1-19).
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(i32).range(1..=19))]
    pub zstd_level: i32,
    /// Refuse installation over a current version below this one.
    #[arg(long, value_name = "VERSION")]
    pub min_previous: Option<airlock_bundle::Version>,
    /// Creation time, RFC 3339 (default: $SOURCE_DATE_EPOCH if set, else now) — fix it for
    /// reproducible builds.
    #[arg(long)]
    pub created: Option<String>,
}

/// `airlock bundle stage`.
#[derive(Debug, Args)]
pub struct StageArgs {
    /// The staging directory: one subdirectory per model, named by its id
    /// (`ID/model.gguf` for a generator; `ID/model.safetensors`, `ID/config.json`,
    /// `ID/tokenizer.json` for an embedder).
    #[arg(long, value_name = "DIR")]
    pub staging: PathBuf,
    /// An embedder to stage, `ID=ALIAS` (repeatable).
    #[arg(long = "embedder", value_name = "ID=ALIAS")]
    pub embedders: Vec<String>,
    /// A generator to stage, `ID=ALIAS` (repeatable).
    #[arg(long = "generator", value_name = "ID=ALIAS")]
    pub generators: Vec<String>,
    /// Stage the demo bundle's models (`scripts/fetch-models.sh` lays them out) instead.
    #[arg(long, conflicts_with_all = ["embedders", "generators"])]
    pub demo: bool,
    /// JSON object mapping each model id to its provenance (package, version, digests,
    /// licence), kept in the catalogue; every staged id must have an entry.
    #[arg(long, value_name = "FILE")]
    pub provenance: Option<PathBuf>,
}

impl StageArgs {
    /// The models these arguments name.
    fn models(&self) -> anyhow::Result<Vec<StageModel>> {
        if self.demo {
            return Ok(airlock_inference::stage::demo_models());
        }
        let mut out = Vec::new();
        for (role, specs) in [
            (ModelRole::Embedder, &self.embedders),
            (ModelRole::Generator, &self.generators),
        ] {
            for spec in specs {
                let (id, alias) = spec
                    .split_once('=')
                    .filter(|(id, alias)| !id.is_empty() && !alias.is_empty())
                    .ok_or_else(|| anyhow::anyhow!("{spec:?}: expected ID=ALIAS"))?;
                if id.contains(['/', '\\']) || id.starts_with('.') {
                    anyhow::bail!(
                        "{id:?}: a model id is a subdirectory name of the staging directory"
                    );
                }
                out.push(StageModel {
                    id: id.to_string(),
                    role,
                    alias: alias.to_string(),
                    upstream: None,
                });
            }
        }
        if out.is_empty() {
            anyhow::bail!(
                "name the models to stage (--embedder ID=ALIAS, --generator ID=ALIAS) or --demo"
            );
        }
        Ok(out)
    }
}

/// `airlock install`.
#[derive(Debug, Args)]
pub struct InstallArgs {
    /// The bundle file.
    pub file: PathBuf,
    /// Keyring to check signatures against.
    #[command(flatten)]
    pub keyring: KeyringArgs,
    /// The data directory.
    #[command(flatten)]
    pub data: DataArgs,
}

/// `airlock rollback`.
#[derive(Debug, Args)]
pub struct RollbackArgs {
    /// Keyring to check signatures against.
    #[command(flatten)]
    pub keyring: KeyringArgs,
    /// The data directory.
    #[command(flatten)]
    pub data: DataArgs,
    /// Roll back to a release that never started on this data directory (its schema support
    /// is unknown). A release whose binary cannot read the database is refused all the same.
    #[arg(long)]
    pub force: bool,
}

/// A progress bar on stderr, drawn only when stderr is a terminal.
pub struct Bar(ProgressBar);

impl Bar {
    /// A new, empty bar.
    pub fn new() -> Bar {
        let target = if std::io::stderr().is_terminal() {
            ProgressDrawTarget::stderr()
        } else {
            ProgressDrawTarget::hidden()
        };
        let bar = ProgressBar::with_draw_target(Some(0), target);
        bar.set_style(
            ProgressStyle::with_template(
                "{msg:>12} [{bar:40}] {bytes}/{total_bytes} {bytes_per_sec} eta {eta}",
            )
            .expect("static template")
            .progress_chars("=> "),
        );
        Bar(bar)
    }
}

impl Default for Bar {
    fn default() -> Self {
        Bar::new()
    }
}

impl Progress for Bar {
    fn begin(&self, message: &str, total: u64) {
        self.0.reset();
        self.0.set_length(total);
        self.0.set_message(message.to_owned());
    }
    fn advance(&self, bytes: u64) {
        self.0.inc(bytes);
    }
    fn finish(&self) {
        self.0.finish_and_clear();
    }
}

fn created(arg: Option<&str>) -> anyhow::Result<time::OffsetDateTime> {
    use time::format_description::well_known::Rfc3339;
    if let Some(s) = arg {
        return time::OffsetDateTime::parse(s, &Rfc3339)
            .with_context(|| format!("--created {s:?} is not RFC 3339"));
    }
    if let Ok(epoch) = std::env::var("SOURCE_DATE_EPOCH") {
        let secs: i64 = epoch
            .trim()
            .parse()
            .context("SOURCE_DATE_EPOCH is not an integer")?;
        return Ok(time::OffsetDateTime::from_unix_timestamp(secs)?);
    }
    let now = time::OffsetDateTime::now_utc();
    Ok(now.replace_nanosecond(0).unwrap_or(now))
}

/// Writes this binary's SBOM to a temporary file next to `out` (the builder reads files).
fn sbom_file(out: &std::path::Path) -> anyhow::Result<PathBuf> {
    let dir = match out.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_owned(),
        _ => PathBuf::from("."),
    };
    let name = out
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let path = dir.join(format!(".{name}.sbom-{}", std::process::id()));
    std::fs::write(&path, crate::sbom::cyclonedx())
        .with_context(|| format!("writing {}", path.display()))?;
    Ok(path)
}

/// Whether `path` has the same bytes as the running executable.
fn same_binary(path: &std::path::Path) -> bool {
    let digest = |p: &std::path::Path| crate::startup::sha256_file(p).ok();
    match (std::env::current_exe().ok(), digest(path)) {
        (Some(me), Some(theirs)) => digest(&me) == Some(theirs),
        _ => false,
    }
}

fn human(bytes: u64) -> String {
    indicatif::HumanBytes(bytes).to_string()
}

/// Runs `airlock bundle ...`.
pub fn bundle(cmd: BundleCommand) -> anyhow::Result<bool> {
    match cmd {
        BundleCommand::Build(args) => build_bundle(args)?,
        BundleCommand::Verify {
            file,
            keyring,
            data,
        } => verify_bundle(&file, &keyring, &data)?,
        BundleCommand::Inspect { file, json } => inspect_bundle(&file, json)?,
        BundleCommand::Stage(args) => stage_models(&args)?,
        BundleCommand::Sbom => {
            use std::io::Write;
            std::io::stdout().write_all(&crate::sbom::cyclonedx())?;
        }
        BundleCommand::List { data } => list_bundles(&data)?,
        BundleCommand::VerifyInstalled { keyring, data } => {
            let ring = keyring.trusted(&data)?;
            let installed = Store::open(&data.data)?.verify_installed(&ring, &Bar::new())?;
            println!(
                "ok {} {}: {} files, {} verified in {}",
                installed.manifest.name,
                installed.version,
                installed.manifest.files.len(),
                human(installed.manifest.total_size()),
                installed.dir.display()
            );
        }
    }
    Ok(true)
}

/// `airlock bundle build`: the bundle, carrying the SBOM of this binary.
fn build_bundle(args: BuildArgs) -> anyhow::Result<()> {
    let keys = args
        .sign
        .iter()
        .map(|p| Ok(KeyPair::load(p)?))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let signers: Vec<&KeyPair> = keys.iter().collect();
    let mut options = BuildOptions::new(args.name, args.version);
    options.created = created(args.created.as_deref())?;
    options.binary = args.binary;
    options.zstd_level = args.zstd_level;
    options.min_previous_version = args.min_previous;
    // Every bundle carries the SBOM of the airlock binary that built it (issue 19).
    let sbom = sbom_file(&args.out)?;
    options
        .extra_files
        .push((crate::sbom::SBOM_PATH.into(), sbom.clone()));
    if let Some(bin) = &options.binary
        && !same_binary(bin)
    {
        eprintln!(
            "warning: {} is not this airlock binary; {} describes the binary that built \
             the bundle (build with the binary you ship)",
            bin.display(),
            crate::sbom::SBOM_PATH
        );
    }
    let built = build(&args.from, &options, &signers, &args.out, &Bar::new());
    let _ = std::fs::remove_file(&sbom);
    let manifest = built?;
    println!(
        "built {} {} {}: {} files, {}, {} model(s), signed by {}",
        args.out.display(),
        manifest.name,
        manifest.version,
        manifest.files.len(),
        human(manifest.total_size()),
        manifest.models.len(),
        signers
            .iter()
            .map(|k| k.key_id().to_string())
            .collect::<Vec<_>>()
            .join(", ")
    );
    Ok(())
}

/// `airlock bundle verify`.
fn verify_bundle(file: &Path, keyring: &KeyringArgs, data: &DataArgs) -> anyhow::Result<()> {
    let ring = keyring.load(data)?;
    let v = verify_file(file, &ring, &Limits::default(), &Bar::new())?;
    println!(
        "ok {}: {} {}, {} files, {}, signed by {} of threshold {} ({})",
        file.display(),
        v.manifest.name,
        v.manifest.version,
        v.manifest.files.len(),
        human(v.manifest.total_size()),
        v.signers.len(),
        ring.threshold(),
        v.signers
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(", ")
    );
    Ok(())
}

/// `airlock bundle inspect`: the manifest, unverified, as JSON or as text.
fn inspect_bundle(file: &Path, json: bool) -> anyhow::Result<()> {
    let u = inspect_file(file, &Limits::default())?;
    if json {
        println!("{}", serde_json::to_string_pretty(&u.manifest)?);
        return Ok(());
    }
    let m = &u.manifest;
    println!(
        "{} (NOT verified; use `airlock bundle verify`)",
        file.display()
    );
    println!("name      {}", m.name);
    println!("version   {}", m.version);
    println!("created   {}", m.created);
    if let Some(min) = &m.min_previous_version {
        println!("requires  current >= {min}");
    }
    println!("files     {} ({})", m.files.len(), human(m.total_size()));
    for f in &m.files {
        println!("  {:>10}  {}  {}", human(f.size), &f.sha256[..16], f.path);
    }
    for model in &m.models {
        println!(
            "model     {} ({:?}) alias {} [{}]",
            model.id,
            model.role,
            model.alias,
            model.files.join(", ")
        );
    }
    if let Some(b) = &m.binary {
        println!("binary    {} sha256 {}", b.path, b.sha256);
    }
    for s in &u.signatures.signatures {
        println!("signed by {}", s.key_id);
    }
    Ok(())
}

/// `airlock bundle stage`: the models' catalogue in the staging directory.
fn stage_models(args: &StageArgs) -> anyhow::Result<()> {
    let models = args.models()?;
    let provenance = match &args.provenance {
        None => None,
        Some(p) => {
            let bytes = std::fs::read(p)
                .map_err(|e| anyhow::anyhow!("cannot read {}: {e}", p.display()))?;
            let v: serde_json::Map<String, serde_json::Value> = serde_json::from_slice(&bytes)
                .map_err(|e| anyhow::anyhow!("{}: not a JSON object: {e}", p.display()))?;
            Some(v)
        }
    };
    let (path, lines) =
        airlock_inference::stage::stage(&args.staging, &models, provenance.as_ref())?;
    for l in lines {
        println!("{l}");
    }
    println!("wrote {}", path.display());
    Ok(())
}

/// `airlock bundle list`: the installed bundles and the rollback floor.
fn list_bundles(data: &DataArgs) -> anyhow::Result<()> {
    let (state, bundles) = Store::open(&data.data)?.list()?;
    if bundles.is_empty() {
        println!("no bundles installed in {}", data.data.display());
    }
    for b in &bundles {
        let role = if b.is_current {
            "current"
        } else if b.is_previous {
            "previous"
        } else {
            ""
        };
        let (name, created) = b
            .manifest
            .as_ref()
            .map(|m| (m.name.as_str(), m.created.as_str()))
            .unwrap_or(("?", "?"));
        println!("{:<12} {:<8} {name} {created}", b.version.to_string(), role);
    }
    if let Some(h) = &state.highest_installed {
        println!("rollback floor: installs must be above {h}");
    }
    Ok(())
}

/// Stops the process at the install stage named by `AIRLOCK_FAILPOINT`.
fn failpoint(stage: InstallStage) {
    stop_at(stage.name());
}

/// Stops the process if `AIRLOCK_FAILPOINT` is `name`: announces it on stderr, then waits to
/// be killed (tests send SIGKILL), aborting after a minute if nobody does.
pub(crate) fn stop_at(name: &str) {
    if std::env::var(FAILPOINT_ENV).ok().as_deref() == Some(name) {
        eprintln!("failpoint {name} reached");
        std::thread::sleep(Duration::from_secs(60));
        std::process::abort();
    }
}

/// Runs `airlock install`.
pub fn install(args: InstallArgs) -> anyhow::Result<bool> {
    // Issue 19 F5: with a pinned keyring, `--keyring FILE` of another key set is refused before
    // anything is read, so a bundle the appliance does not trust can never become current or
    // raise the rollback floor.
    let ring = args.keyring.trusted(&args.data)?;
    let store = Store::open(&args.data.data)?;
    let bar = Bar::new();
    let options = InstallOptions {
        progress: &bar,
        on_stage: &failpoint,
    };
    match store.install(&args.file, &ring, &options)? {
        InstallOutcome::Installed {
            version,
            previous,
            signers,
        } => {
            let previous = previous
                .map(|p| p.to_string())
                .unwrap_or_else(|| "none".into());
            println!(
                "installed {version} (previous: {previous}), signed by {}",
                signers
                    .iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join(", ")
            );
        }
        InstallOutcome::AlreadyCurrent { version } => {
            println!("{version} is already current; nothing to do")
        }
    }
    // The box's own identity for what leaves it (eval exports, receipts): made once.
    let key = airlock_evidence::appliance_key::ensure(&args.data.data)?;
    println!(
        "appliance key {} ({})",
        key.key_id(),
        airlock_evidence::appliance_key::public_path(&args.data.data).display()
    );
    Ok(true)
}

/// Runs `airlock rollback`.
pub fn rollback(args: RollbackArgs) -> anyhow::Result<bool> {
    let ring = args.keyring.trusted(&args.data)?;
    let store = Store::open(&args.data.data)?;
    // The previous release's binary must be able to read the database as it is now: a
    // migration applied since it last ran has no way back (airlock_evidence::upgrade).
    if let Some(previous) = store.state()?.previous
        && let Some(why) = airlock_evidence::upgrade::rollback_refusal(
            &args.data.data,
            &previous.to_string(),
            args.force,
        )?
    {
        anyhow::bail!("refusing to roll back to {previous}: {why}");
    }
    let (from, to) = store.rollback(&ring)?;
    let from = from.map(|v| v.to_string()).unwrap_or_else(|| "none".into());
    println!("rolled back from {from} to {to}");
    Ok(true)
}
