//! Start-up: verify the installed bundle against the pinned keyring (refusing an unverified or
//! tampered one), read its model catalogue, load the models it names, open the ACL state, the
//! document store, the indexes and the feedback tables. Only after all of that succeeds does
//! the daemon turn ready.
//!
//! Blocking (file hashing, SQLite, model loading): run it on a blocking thread.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use airlock_acl::Acl;
use airlock_bundle::{NoProgress, Store};
use airlock_evidence::feedback::{FeedbackError, FeedbackStore};
use airlock_evidence::upgrade::SchemaVersions;
use airlock_inference::catalogue::{Catalogue, ModelEntry, Role};
use airlock_inference::{CrossEncoder, Embedder};
use airlock_retrieval::{Retrieval, RetrievalConfig};
use airlock_signing::Keyring;

use crate::config::Config;
use airlock_serving::generator::Generator;
use airlock_serving::models::{EmbedAdapter, RerankAdapter};
use airlock_serving::services::{ModelCard, Services};

/// Why the daemon refuses to start.
#[derive(Debug, thiserror::Error)]
pub enum StartupError {
    /// The pinned keyring is missing or unreadable.
    #[error("cannot load the trusted keyring {path}: {source}")]
    Keyring {
        /// The keyring file.
        path: PathBuf,
        /// Cause.
        source: airlock_signing::Error,
    },
    /// `--keyring FILE` names another keyring than the data directory's pinned one.
    #[error(
        "refusing to serve: --keyring {given} is not the pinned keyring {pinned}; a data \
         directory with a pinned keyring is checked against it only (drop --keyring; trust \
         changes only through `airlock keyring rotate`)"
    )]
    KeyringNotPinned {
        /// The keyring named by `--keyring` / `AIRLOCK_KEYRING`.
        given: PathBuf,
        /// The data directory's pinned keyring.
        pinned: PathBuf,
    },
    /// No bundle is installed, or the installed one fails verification.
    #[error(
        "refusing to serve: the installed bundle under {data} failed verification: {source} \
         (install a signed bundle with `airlock install`, or roll back with `airlock rollback`)"
    )]
    Bundle {
        /// The data directory.
        data: PathBuf,
        /// Cause.
        source: Box<airlock_bundle::Error>,
    },
    /// The installed bundle carries the appliance binary and the running one is another
    /// (`binary_check = "refuse"`, the default).
    #[error(
        "refusing to serve: this binary ({exe}, sha256 {actual}) is not the one bundle {version} \
         carries (signed sha256 {expected}); run the bundle's own binary \
         (<data>/bundles/{version}/bin/airlock), or set binary_check = \"warn\""
    )]
    BinaryMismatch {
        /// The bundle version.
        version: String,
        /// The running binary.
        exe: PathBuf,
        /// Its SHA-256 (hex).
        actual: String,
        /// The signed SHA-256 (hex).
        expected: String,
    },
    /// The `[audit_sink]` file cannot be opened or read.
    #[error("refusing to start: {0}")]
    AuditSink(String),
    /// The appliance key (which signs receipts) cannot be read or created.
    #[error("the appliance key: {0}")]
    ApplianceKey(String),
    /// The index's embedder or the schema marks ([`airlock_evidence::upgrade`]).
    #[error("refusing to start: {0}")]
    Upgrade(String),
    /// The bundle's model catalogue is invalid or lacks a required model.
    #[error("bundle {version}: model catalogue: {reason}")]
    Catalogue {
        /// The bundle version.
        version: String,
        /// What is wrong.
        reason: String,
    },
    /// A model failed to load.
    #[error("bundle {version}: loading model {model}: {source}")]
    Model {
        /// The bundle version.
        version: String,
        /// The catalogue id.
        model: String,
        /// Cause.
        source: Box<airlock_inference::Error>,
    },
    /// The ACL database could not be opened.
    #[error("opening the ACL state: {0}")]
    Acl(Box<airlock_acl::Error>),
    /// The document store or its indexes could not be opened.
    #[error("opening the document store and indexes: {0}")]
    Retrieval(Box<airlock_retrieval::Error>),
    /// The chat-completion and feedback tables could not be opened.
    #[error("opening the feedback store: {0}")]
    Feedback(Box<FeedbackError>),
    /// A `[[remote_generators]]` upstream is unreachable or does not serve its model.
    #[error("{0}")]
    Remote(Box<airlock_serving::remote::ConnectError>),
}

impl StartupError {
    /// The error of loading catalogue entry `entry` of bundle `version` (for `map_err`).
    fn model(version: &str, entry: &ModelEntry) -> impl Fn(airlock_inference::Error) -> Self {
        move |source| StartupError::Model {
            version: version.to_owned(),
            model: entry.id.clone(),
            source: Box::new(source),
        }
    }
}

/// The pinned keyring path: `--keyring`, else `<data>/keys/trusted.json`.
pub fn keyring_path(config: &Config) -> PathBuf {
    config
        .keyring
        .clone()
        .unwrap_or_else(|| pinned_keyring(&config.data_dir()))
}

/// The data directory's pinned keyring, `<data>/keys/trusted.json`.
pub fn pinned_keyring(data: &Path) -> PathBuf {
    airlock_platform::paths::DataDir::new(data).pinned_keyring()
}

/// The keyring start-up verifies against: the pinned one whenever it exists (`--keyring` may
/// only name that same file), else `--keyring` (a data directory not yet pinned).
fn trusted_keyring_path(config: &Config) -> Result<PathBuf, StartupError> {
    let pinned = pinned_keyring(&config.data_dir());
    match &config.keyring {
        Some(given) if pinned.exists() => {
            let same = matches!((given.canonicalize(), pinned.canonicalize()),
                (Ok(a), Ok(b)) if a == b);
            if !same {
                return Err(StartupError::KeyringNotPinned {
                    given: given.clone(),
                    pinned,
                });
            }
            Ok(pinned)
        }
        _ => Ok(keyring_path(config)),
    }
}

/// The SQLite file shared by the ACL and the document store.
pub fn db_path(data: &Path) -> PathBuf {
    airlock_platform::paths::DataDir::new(data).db()
}

/// The index root.
pub fn index_root(data: &Path) -> PathBuf {
    airlock_platform::paths::DataDir::new(data).index()
}

/// The verified installed bundle and its model catalogue.
pub struct VerifiedBundle {
    /// The bundle version.
    pub version: String,
    /// The catalogue rooted at the bundle directory.
    pub catalogue: Catalogue,
    /// The bundle's creation time (Unix seconds).
    pub created: u64,
    /// `sha256:<hex>` of its signed `manifest.json` (named in receipts).
    pub manifest_digest: String,
    /// Each payload file's `sha256:<hex>`, by its path on disk (the manifest's digests).
    pub file_digests: std::collections::HashMap<PathBuf, String>,
}

/// Re-verifies the installed bundle (signature and every file digest) against the pinned
/// keyring and reads its catalogue. Refuses an unverified or tampered bundle, and a
/// `--keyring` other than the pinned one. Writes nothing: a refused bundle leaves
/// `state.json` (current, previous, rollback floor) as it was.
pub fn verify_bundle(config: &Config) -> Result<VerifiedBundle, StartupError> {
    let t = Instant::now();
    let data = config.data_dir();
    let kpath = trusted_keyring_path(config)?;
    let keyring = Keyring::load(&kpath).map_err(|source| StartupError::Keyring {
        path: kpath.clone(),
        source,
    })?;
    let store = Store::open(&data).map_err(|source| StartupError::Bundle {
        data: data.clone(),
        source: Box::new(source),
    })?;
    let installed = store
        .verify_installed(&keyring, &NoProgress)
        .map_err(|source| StartupError::Bundle {
            data: data.clone(),
            source: Box::new(source),
        })?;
    let version = installed.version.to_string();
    tracing::info!(bundle.version = %version, elapsed_ms = t.elapsed().as_millis() as u64,
        "installed bundle verified (signature and every file digest)");
    check_binary(config, &version, installed.manifest.binary.as_ref())?;
    let value =
        serde_json::to_value(&installed.manifest.models).map_err(|e| StartupError::Catalogue {
            version: version.clone(),
            reason: e.to_string(),
        })?;
    let catalogue =
        Catalogue::from_json(&installed.dir, value).map_err(|e| StartupError::Catalogue {
            version: version.clone(),
            reason: e.to_string(),
        })?;
    let manifest = installed.dir.join("manifest.json");
    let manifest_digest = std::fs::read(&manifest)
        .map(|b| airlock_evidence::receipts::sha256(&b))
        .map_err(|e| StartupError::Catalogue {
            version: version.clone(),
            reason: format!("reading {}: {e}", manifest.display()),
        })?;
    let file_digests = installed
        .manifest
        .files
        .iter()
        .map(|f| (installed.dir.join(&f.path), format!("sha256:{}", f.sha256)))
        .collect();
    Ok(VerifiedBundle {
        version,
        created: manifest_created(&installed.manifest.created),
        catalogue,
        manifest_digest,
        file_digests,
    })
}

/// The running binary against the one the bundle carries (signed): equal, or refused / warned
/// per `binary_check`. A bundle without a binary is not checked (logged).
fn check_binary(
    config: &Config,
    version: &str,
    signed: Option<&airlock_bundle::BinaryEntry>,
) -> Result<(), StartupError> {
    let Some(signed) = signed else {
        tracing::info!(bundle.version = %version,
            "the bundle carries no appliance binary: the running binary is not checked");
        return Ok(());
    };
    let exe = std::env::current_exe().unwrap_or_else(|_| PathBuf::from("/proc/self/exe"));
    let actual = sha256_file(&exe).unwrap_or_else(|e| format!("unreadable ({e})"));
    if actual.eq_ignore_ascii_case(&signed.sha256) {
        tracing::info!(bundle.version = %version, "the running binary is the bundle's signed one");
        return Ok(());
    }
    let err = StartupError::BinaryMismatch {
        version: version.to_owned(),
        exe,
        actual,
        expected: signed.sha256.clone(),
    };
    match config.binary_check() {
        crate::config::BinaryCheck::Refuse => Err(err),
        crate::config::BinaryCheck::Warn => {
            tracing::warn!(bundle.version = %version, "binary_check = warn: {err}");
            Ok(())
        }
    }
}

/// The lower-case hex SHA-256 of a file, read in 1 MiB blocks.
pub fn sha256_file(path: &Path) -> std::io::Result<String> {
    use sha2::Digest;
    use std::io::Read;
    let mut f = std::fs::File::open(path)?;
    let mut h = sha2::Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        match f.read(&mut buf)? {
            0 => break,
            n => h.update(&buf[..n]),
        }
    }
    Ok(hex::encode(h.finalize()))
}

/// Loads the bundle's embedder.
pub fn load_embedder(bundle: &VerifiedBundle) -> Result<Arc<Embedder>, StartupError> {
    let entry = bundle
        .catalogue
        .first_with_role(Role::Embedder)
        .ok_or_else(|| StartupError::Catalogue {
            version: bundle.version.clone(),
            reason: "no embedder in the catalogue".into(),
        })?;
    let e = bundle
        .catalogue
        .load_embedder(entry)
        .map_err(StartupError::model(&bundle.version, entry))?;
    Ok(Arc::new(e))
}

/// Loads the bundle's reranker: the first catalogue entry with the `reranker` role, by its
/// `params.kind`: `cross-encoder` (the default) is a BERT cross-encoder run as the rerank
/// stage; `bi-encoder-rescore` (the demo's fallback: the embedder's f32 cosine) is what the
/// rescoring stage of every search already computes from the stored vectors, so no stage is
/// added for it. Any other kind is refused.
pub fn load_reranker(bundle: &VerifiedBundle) -> Result<Option<Arc<CrossEncoder>>, StartupError> {
    let Some(entry) = bundle.catalogue.first_with_role(Role::Reranker) else {
        return Ok(None);
    };
    match entry.params.get("kind").and_then(serde_json::Value::as_str) {
        None | Some("cross-encoder") => {}
        Some("bi-encoder-rescore") => {
            tracing::info!(model = %entry.id, alias = %entry.alias,
                "reranker is the embedder's f32 rescoring, which every search runs already");
            return Ok(None);
        }
        Some(other) => {
            return Err(StartupError::Catalogue {
                version: bundle.version.clone(),
                reason: format!(
                    "reranker {:?} has unknown kind {other:?} (expected \"cross-encoder\" or \"bi-encoder-rescore\")",
                    entry.id
                ),
            });
        }
    }
    let ce = bundle
        .catalogue
        .load_cross_encoder(entry)
        .map_err(StartupError::model(&bundle.version, entry))?;
    tracing::info!(model = %entry.id, alias = %entry.alias, "reranker loaded");
    Ok(Some(Arc::new(ce)))
}

/// Opens the ACL state (no bundle needed: user and IAM commands work before an install).
pub fn open_acl(data: &Path) -> Result<Arc<Acl>, StartupError> {
    std::fs::create_dir_all(data).map_err(|e| {
        StartupError::Acl(Box::new(airlock_acl::Error::Corrupt {
            detail: format!("cannot create {}: {e}", data.display()),
        }))
    })?;
    Acl::open(db_path(data))
        .map(Arc::new)
        .map_err(|e| StartupError::Acl(Box::new(e)))
}

/// Opens the document store and indexes with `embedder`.
pub fn open_retrieval(
    data: &Path,
    embedder: Arc<Embedder>,
) -> Result<Arc<Retrieval>, StartupError> {
    open_retrieval_with(data, embedder, None)
}

/// [`open_retrieval`] with the bundle's reranker (the rerank stage runs only when a request's
/// rung allows it).
pub fn open_retrieval_with(
    data: &Path,
    embedder: Arc<Embedder>,
    reranker: Option<Arc<CrossEncoder>>,
) -> Result<Arc<Retrieval>, StartupError> {
    Retrieval::open(
        &db_path(data),
        &index_root(data),
        RetrievalConfig::default(),
        Arc::new(EmbedAdapter(embedder)),
        reranker.map(|r| Arc::new(RerankAdapter(r)) as Arc<dyn airlock_retrieval::Rerank>),
    )
    .map(Arc::new)
    .map_err(|e| StartupError::Retrieval(Box::new(e)))
}

/// Refuses an index whose vectors another embedder made, and records the bundle's embedder
/// for a new index ([`airlock_evidence::upgrade::check_embedder`]). Call before opening retrieval.
pub fn check_embedder(data: &Path, bundle: &VerifiedBundle) -> Result<(), StartupError> {
    let Some(entry) = bundle.catalogue.first_with_role(Role::Embedder) else {
        return Ok(()); // load_embedder refuses a catalogue without one
    };
    let files: Vec<(&str, &str)> = entry
        .files
        .iter()
        .map(|f| {
            let digest = bundle
                .file_digests
                .iter()
                .find(|(p, _)| p.ends_with(f))
                .map_or("unknown", |(_, d)| d.as_str());
            (f.as_str(), digest)
        })
        .collect();
    let identity = airlock_evidence::upgrade::EmbedderIdentity::new(&entry.id, files);
    airlock_evidence::upgrade::check_embedder(data, &identity)
        .map_err(|e| StartupError::Upgrade(crate::error::error_chain(&e)))
}

/// The schema versions this binary reads and writes, per table family of `airlock.db`.
pub fn schema_versions() -> SchemaVersions {
    SchemaVersions {
        acl: airlock_acl::SCHEMA_VERSION,
        retrieval: airlock_retrieval::SCHEMA_VERSION,
        appliance: airlock_evidence::feedback::SCHEMA_VERSION,
    }
}

/// Records that this release's binary (bundle `version`) runs on `data`, with the schema
/// versions it migrated the database to ([`airlock_evidence::upgrade::record_mark`]). Call
/// after opening the stores.
pub fn mark_release(data: &Path, version: &str) -> Result<(), StartupError> {
    airlock_evidence::upgrade::record_mark(data, version, schema_versions())
        .map_err(|e| StartupError::Upgrade(crate::error::error_chain(&e)))
}

/// Opens the served-completion and feedback tables (in `airlock.db`).
pub fn open_feedback(data: &Path) -> Result<Arc<FeedbackStore>, StartupError> {
    FeedbackStore::open(&db_path(data))
        .map(Arc::new)
        .map_err(|e| StartupError::Feedback(Box::new(e)))
}

/// Verifies the bundle and opens everything; returns the ready services.
pub fn open(config: &Config) -> Result<Services, StartupError> {
    let t = Instant::now();
    let data = config.data_dir();
    let bundle = verify_bundle(config)?;
    let version = bundle.version.clone();
    let catalogue = &bundle.catalogue;
    let cards = catalogue
        .entries()
        .iter()
        .map(|e| ModelCard {
            id: e.alias.clone(),
            object: "model",
            created: bundle.created,
            owned_by: "airlock",
            role: role_name(e.role).to_string(),
            model: e.id.clone(),
        })
        .collect();
    let embedder = load_embedder(&bundle)?;
    let mut generators = Vec::new();
    for entry in catalogue
        .entries()
        .iter()
        .filter(|e| e.role == Role::Generator)
    {
        let model_err = StartupError::model(&version, entry);
        let files = catalogue.generator_files(entry).map_err(&model_err)?;
        let mut g = Generator::load(&entry.alias, &entry.id, &files, config.engine_config())
            .map_err(model_err)?;
        if let Some(d) = bundle.file_digests.get(&files.gguf) {
            g = g.with_file_digest(d.clone());
        }
        // The fixed system prompt's KV is computed once and shared by every request (platform
        // text only: nothing a user typed is ever shared across requests).
        let prefix_len = match g.shared_prefix_ids() {
            Ok(prefix) => {
                let n = prefix.len();
                g.engine().set_shared_prefix(prefix);
                n
            }
            Err(e) => {
                tracing::warn!(model = %entry.id, error = %e, "no shared prompt prefix");
                0
            }
        };
        tracing::info!(model = %entry.id, alias = %entry.alias, n_ctx = g.engine().n_ctx(),
            shared_prefix_tokens = prefix_len, "generator loaded");
        generators.push(Arc::new(g));
    }
    if generators.is_empty() {
        return Err(StartupError::Catalogue {
            version,
            reason: "no generator in the catalogue".into(),
        });
    }
    check_embedder(&data, &bundle)?;
    let acl = open_acl(&data)?;
    if let Some(sink) = &config.audit_sink {
        airlock_evidence::audit_sink::attach(&acl, sink)
            .map_err(|e| StartupError::AuditSink(crate::error::error_chain(&e)))?;
    }
    let reranker = load_reranker(&bundle)?;
    let retrieval = open_retrieval_with(&data, embedder.clone(), reranker)?;
    let feedback = open_feedback(&data)?;
    mark_release(&data, &version)?;
    let remotes = connect_remotes(config)?;
    // Receipts are signed with the appliance key, made by `airlock install`. It is only read
    // here: `keys/` is read-only under the lockdown. Without one, receipts are still recorded
    // (no answer goes without its receipt) but `GET /v1/receipts/{id}` cannot sign them.
    let key = if airlock_evidence::appliance_key::private_path(&data).exists() {
        Some(
            airlock_evidence::appliance_key::load(&data)
                .map_err(|e| StartupError::ApplianceKey(crate::error::error_chain(&e)))?,
        )
    } else {
        tracing::warn!(data = %data.display(),
            "no appliance key (DATA/keys/appliance.key, made by `airlock install`): receipts are \
             recorded but GET /v1/receipts answers 503 until one exists");
        None
    };
    tracing::info!(
        elapsed_ms = t.elapsed().as_millis() as u64,
        "start-up complete"
    );
    let services = Services::new(acl, retrieval, embedder, cards, generators, version)
        .with_feedback(feedback)
        .with_remotes(remotes)
        .with_bundle_digest(bundle.manifest_digest.clone())
        .with_extractor(config.extractor());
    Ok(match key {
        Some(k) => services.with_appliance_key(k),
        None => services,
    })
}

/// Checks every `[[remote_generators]]` upstream (its `/v1/models` must list the model).
/// Called on a blocking thread of the daemon's runtime (or with none: a runtime of its own).
pub fn connect_remotes(
    config: &Config,
) -> Result<Vec<Arc<airlock_serving::remote::RemoteGenerator>>, StartupError> {
    if config.remote_generators.is_empty() {
        return Ok(Vec::new());
    }
    let all = async {
        let mut out = Vec::new();
        for r in &config.remote_generators {
            out.push(airlock_serving::remote::RemoteGenerator::connect(r.clone()).await?);
        }
        Ok::<_, airlock_serving::remote::ConnectError>(out)
    };
    let connected = match tokio::runtime::Handle::try_current() {
        Ok(h) => h.block_on(all),
        Err(_) => tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| {
                StartupError::Remote(Box::new(airlock_serving::remote::ConnectError {
                    alias: String::new(),
                    reason: format!("starting a runtime: {e}"),
                }))
            })?
            .block_on(all),
    };
    connected.map_err(|e| StartupError::Remote(Box::new(e)))
}

fn role_name(r: Role) -> &'static str {
    match r {
        Role::Embedder => "embedder",
        Role::Reranker => "reranker",
        Role::Generator => "generator",
    }
}

fn manifest_created(rfc3339: &str) -> u64 {
    time::OffsetDateTime::parse(rfc3339, &time::format_description::well_known::Rfc3339)
        .map(|t| t.unix_timestamp().max(0) as u64)
        .unwrap_or(0)
}
