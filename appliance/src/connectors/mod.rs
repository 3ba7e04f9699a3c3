//! The daemon's connectors (issue 43): sources that keep their permissions (`[[connectors]]`,
//! an SMB share with its Active Directory, through `airlock-connectors`), synced by the daemon
//! itself — the one writer of its data directory — and nothing else.
//!
//! Per source, one task ([`Connectors::spawn`]): a first sync at start, then one every
//! `interval_minutes`, or earlier on demand ([`Connectors::request_sync`], `POST
//! /v1/connectors/{alias}/sync`); never two syncs of one source at a time. A sync
//! (`sync.rs`) reads the directory and lists the share; a failure of either changes nothing.
//! Its changes go through the daemon's own write paths: an upsert is fetched, extracted within
//! `[extract]`'s budget and stored with its grant in one transaction
//! (`document_write::store_with_grant`), a permission change is an ACL update alone (no
//! extraction, no embedding), a deletion a tombstone. The source's state
//! (`DATA/connectors/connectors.db`, `store.rs`) is written only after every change.
//!
//! Grants name users by their `sAMAccountName`, the name the same users sign in with through
//! `[ldap]` when its `user_id_attr` is `sAMAccountName` (docs/operations/connectors.md).
//!
//! Nothing of a document's content is logged: aliases, paths' counts and reasons only.

pub mod config;
mod drift;
pub mod holdings;
pub mod scope;
pub mod store;
mod sync;

use std::path::Path;
use std::sync::Arc;

use parking_lot::Mutex;
use serde::Serialize;

pub use config::{ConnectorConfig, ShareAcl};
pub use drift::{Drift, DriftReport};
pub use holdings::{Holdings, HoldingsError};
pub use store::{LastRun, RunCounts, Store, StoreError};

use crate::connector_metrics::{ConnectorMetrics, SourceLabel};
use airlock_serving::services::Services;

/// Most per-item errors and unknown principals `GET /v1/connectors` lists per source.
pub const LISTED: usize = 100;

/// What a sync needs from the daemon besides the services.
#[derive(Clone)]
pub struct SyncLimits {
    /// `[extract]`'s limits.
    pub extract: airlock_retrieval::ingest::ExtractLimits,
}

/// Why an on-demand sync was refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum TriggerError {
    /// No such `[[connectors]]` entry.
    #[error("no connector `{0}`")]
    Unknown(String),
    /// A sync of this source is running or already requested.
    #[error("connector `{0}` is already syncing (or a sync is requested); try again when it ends")]
    AlreadyRunning(String),
}

#[derive(Debug, Default, Clone)]
struct Live {
    running: bool,
    requested: bool,
    started_at: Option<u64>,
    runs: u64,
}

struct Source {
    config: ConnectorConfig,
    live: Mutex<Live>,
    wake: tokio::sync::Notify,
}

/// The configured sources and their tasks.
pub struct Connectors {
    sources: Vec<Arc<Source>>,
    store: Arc<Store>,
    metrics: ConnectorMetrics,
}

/// One source as `GET /v1/connectors` shows it.
#[derive(Debug, Clone, Serialize)]
pub struct SourceStatus {
    /// The alias.
    pub alias: String,
    /// `smb`.
    pub kind: String,
    /// `//host:port/share/path`.
    pub location: String,
    /// Minutes between syncs.
    pub interval_minutes: u64,
    /// A sync is running now.
    pub running: bool,
    /// An on-demand sync is waiting to start.
    pub requested: bool,
    /// Unix seconds the running sync started.
    pub running_since: Option<u64>,
    /// Syncs ended (succeeded or failed) since the daemon started.
    pub runs: u64,
    /// Unix seconds of the last successful sync.
    pub last_success: Option<u64>,
    /// The last run (success or failure) with its counts.
    pub last_run: Option<LastRun>,
    /// Files the source holds as documents (after the last success).
    pub items: usize,
    /// Files the last successful sync could not handle (count).
    pub item_errors: usize,
    /// The first [`LISTED`] of them: `{path, reason}`.
    pub item_errors_listed: Vec<ItemError>,
    /// Principals the share's ACLs name that the directory does not know (they grant nobody).
    pub unknown_principals: Vec<String>,
}

/// A file a sync could not handle.
#[derive(Debug, Clone, Serialize)]
pub struct ItemError {
    /// Its path in the share.
    pub path: String,
    /// Why.
    pub reason: String,
}

fn now_secs() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

impl Connectors {
    /// Opens the connectors' state in `data_dir` for `configs` (already checked).
    pub fn open(
        data_dir: &Path,
        configs: &[ConnectorConfig],
        metrics: ConnectorMetrics,
    ) -> Result<Connectors, StoreError> {
        let store = Store::open(&airlock_platform::paths::DataDir::new(data_dir).connectors_db())?;
        for c in configs {
            metrics.init_source(&c.alias);
            if let Ok(Some(run)) = store.state(&c.alias).map(|s| s.last_success) {
                metrics
                    .last_success
                    .get_or_create(&SourceLabel {
                        source: c.alias.clone(),
                    })
                    .set(i64::try_from(run).unwrap_or(i64::MAX));
            }
        }
        Ok(Connectors {
            sources: configs
                .iter()
                .map(|c| {
                    Arc::new(Source {
                        config: c.clone(),
                        live: Mutex::default(),
                        wake: tokio::sync::Notify::new(),
                    })
                })
                .collect(),
            store: Arc::new(store),
            metrics,
        })
    }

    /// Whether any source is configured.
    pub fn is_empty(&self) -> bool {
        self.sources.is_empty()
    }

    /// Starts one task per source on the current tokio runtime: a first sync now, then every
    /// interval or on demand.
    pub fn spawn(self: &Arc<Self>, services: Arc<Services>, limits: SyncLimits) {
        for source in &self.sources {
            let source = source.clone();
            let this = self.clone();
            let services = services.clone();
            let limits = limits.clone();
            tokio::spawn(async move {
                loop {
                    this.run(&source, &services, &limits).await;
                    tokio::select! {
                        () = tokio::time::sleep(source.config.interval()) => {}
                        () = source.wake.notified() => {}
                    }
                }
            });
        }
    }

    /// Asks for a sync of `alias` now (it starts when its task is free).
    pub fn request_sync(&self, alias: &str) -> Result<(), TriggerError> {
        let source = self
            .sources
            .iter()
            .find(|s| s.config.alias == alias)
            .ok_or_else(|| TriggerError::Unknown(alias.to_owned()))?;
        {
            let mut live = source.live.lock();
            if live.running || live.requested {
                return Err(TriggerError::AlreadyRunning(alias.to_owned()));
            }
            live.requested = true;
        }
        source.wake.notify_one();
        Ok(())
    }

    /// A drift check of `alias` now: a fresh crawl compared with the grants Airlock holds
    /// (nothing is written). Refused while a sync of it runs (its writes would show as drift).
    /// The inner `Err`: the crawl failed.
    pub async fn verify(
        &self,
        alias: &str,
        services: Arc<Services>,
    ) -> Result<Result<DriftReport, String>, TriggerError> {
        let source = self
            .sources
            .iter()
            .find(|s| s.config.alias == alias)
            .ok_or_else(|| TriggerError::Unknown(alias.to_owned()))?;
        if source.live.lock().running {
            return Err(TriggerError::AlreadyRunning(alias.to_owned()));
        }
        Ok(drift::check(&source.config, services, self.store.clone()).await)
    }

    /// What this appliance holds of `alias` (its documents' ids, content versions and readers)
    /// as one digest, to compare with another appliance syncing the same source. Reads the
    /// stores: call off the async threads.
    pub fn holdings(
        &self,
        alias: &str,
        services: &Services,
    ) -> Result<Result<Holdings, HoldingsError>, TriggerError> {
        if !self.sources.iter().any(|s| s.config.alias == alias) {
            return Err(TriggerError::Unknown(alias.to_owned()));
        }
        Ok(holdings::holdings(
            alias,
            &services.retrieval,
            &services.acl,
        ))
    }

    /// Every source's status (reads the connectors' file: call off the async threads).
    pub fn status(&self) -> Result<Vec<SourceStatus>, StoreError> {
        let mut out = Vec::with_capacity(self.sources.len());
        for s in &self.sources {
            let c = &s.config;
            let state = self.store.state(&c.alias)?;
            let last_run = self.store.last_run(&c.alias)?;
            let live = s.live.lock().clone();
            let root = c.root();
            out.push(SourceStatus {
                alias: c.alias.clone(),
                kind: c.kind.clone(),
                location: format!(
                    "//{}:{}/{}{}{}",
                    c.host,
                    c.port(),
                    c.share,
                    if root.is_empty() { "" } else { "/" },
                    root
                ),
                interval_minutes: c.interval().as_secs() / 60,
                running: live.running,
                requested: live.requested,
                running_since: live.started_at.filter(|_| live.running),
                runs: live.runs,
                last_success: state.last_success,
                last_run,
                items: state.items.len(),
                item_errors: state.errors.len(),
                item_errors_listed: state
                    .errors
                    .iter()
                    .take(LISTED)
                    .map(|(path, reason)| ItemError {
                        path: path.clone(),
                        reason: reason.clone(),
                    })
                    .collect(),
                unknown_principals: state
                    .unknown_principals
                    .iter()
                    .take(LISTED)
                    .cloned()
                    .collect(),
            });
        }
        Ok(out)
    }

    /// One sync of `source`, recorded (state, last run, metrics, audit rows).
    async fn run(&self, source: &Source, services: &Arc<Services>, limits: &SyncLimits) {
        let alias = source.config.alias.clone();
        let label = SourceLabel {
            source: alias.clone(),
        };
        let started_at = now_secs();
        {
            let mut live = source.live.lock();
            live.running = true;
            live.requested = false;
            live.started_at = Some(started_at);
        }
        self.metrics.runs.get_or_create(&label).inc();
        self.metrics.running.get_or_create(&label).set(1);
        let actor = sync::actor(&alias);
        audit(
            services,
            &actor,
            serde_json::json!({"action": "connector_sync_started", "source": alias}),
        )
        .await;
        tracing::info!(source = %alias, "connector sync started");
        let t0 = std::time::Instant::now();
        let outcome = sync::sync(
            &source.config,
            services.clone(),
            self.store.clone(),
            limits.clone(),
            started_at,
        )
        .await;
        let (counts, error) = match outcome {
            Ok(counts) => (counts, None),
            Err((counts, e)) => (counts, Some(e)),
        };
        for (kind, n) in [
            ("upsert", counts.upserted),
            ("unchanged_content", counts.unchanged_content),
            ("permissions", counts.permissions),
            ("moved", counts.moved),
            ("delete", counts.deleted),
            ("failed", counts.failed),
        ] {
            self.metrics
                .items
                .get_or_create(&crate::connector_metrics::ChangeLabel {
                    source: alias.clone(),
                    kind,
                })
                .inc_by(n as u64);
        }
        let run = LastRun {
            started_at,
            finished_at: now_secs(),
            error: error.clone(),
            counts: counts.clone(),
        };
        match &error {
            None => {
                self.metrics
                    .last_success
                    .get_or_create(&label)
                    .set(i64::try_from(run.finished_at).unwrap_or(i64::MAX));
                tracing::info!(source = %alias, seconds = t0.elapsed().as_secs_f64(),
                    items = counts.items, upserted = counts.upserted,
                    permissions = counts.permissions, deleted = counts.deleted,
                    failed = counts.failed, "connector sync finished");
            }
            Some(e) => {
                self.metrics.failures.get_or_create(&label).inc();
                tracing::warn!(source = %alias, error = %e, "connector sync failed; nothing after the failure was applied");
                // The state stays the last success's; only the run is recorded.
                let store = self.store.clone();
                let (a, r) = (alias.clone(), run.clone());
                match tokio::task::spawn_blocking(move || store.failed(&a, &r)).await {
                    Ok(Ok(())) => {}
                    Ok(Err(e)) => {
                        tracing::error!(source = %alias, error = %e, "recording a failed connector sync")
                    }
                    Err(e) => {
                        tracing::error!(source = %alias, error = %e, "recording a failed connector sync")
                    }
                }
            }
        }
        audit(
            services,
            &actor,
            serde_json::json!({"action": "connector_sync_finished", "source": alias,
                "ok": error.is_none(), "error": error, "counts": counts,
                "seconds": t0.elapsed().as_secs()}),
        )
        .await;
        self.metrics.running.get_or_create(&label).set(0);
        let mut live = source.live.lock();
        live.running = false;
        live.started_at = None;
        live.runs += 1;
    }
}

/// Appends an audit row (a failure to is logged: the sync itself is recorded in its state).
async fn audit(services: &Arc<Services>, actor: &str, detail: serde_json::Value) {
    let (s, a) = (services.clone(), actor.to_owned());
    let r = tokio::task::spawn_blocking(move || s.acl.audit_admin(a.as_str(), detail)).await;
    match r {
        Ok(Ok(())) => {}
        Ok(Err(e)) => tracing::error!(error = %e, "writing a connector audit row"),
        Err(e) => tracing::error!(error = %e, "writing a connector audit row"),
    }
}
