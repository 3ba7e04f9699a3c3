//! The connectors' metrics (`airlock_connector_*`): a leaf module, so that both the daemon's
//! metric registry (`metrics.rs`) and the connectors' scheduler (`connectors/`) use it without
//! importing each other.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

/// Labels `{source}`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct SourceLabel {
    /// The connector's alias.
    pub source: String,
}

/// Labels `{source, kind}`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ChangeLabel {
    /// The connector's alias.
    pub source: String,
    /// `upsert`, `unchanged_content`, `permissions`, `moved`, `delete` or `failed`.
    pub kind: &'static str,
}

/// The change kinds of [`ChangeLabel`].
pub const CHANGE_KINDS: [&str; 6] = [
    "upsert",
    "unchanged_content",
    "permissions",
    "moved",
    "delete",
    "failed",
];

/// The connectors' metrics (registered with the daemon's others).
#[derive(Clone, Default)]
pub struct ConnectorMetrics {
    /// `airlock_connector_syncs_total{source}`: sync runs started.
    pub runs: Family<SourceLabel, Counter>,
    /// `airlock_connector_sync_failures_total{source}`: runs that failed as a whole.
    pub failures: Family<SourceLabel, Counter>,
    /// `airlock_connector_items_total{source,kind}`: items by change kind.
    pub items: Family<ChangeLabel, Counter>,
    /// `airlock_connector_last_success_timestamp_seconds{source}`.
    pub last_success: Family<SourceLabel, Gauge>,
    /// `airlock_connector_running{source}`: 1 while a sync runs.
    pub running: Family<SourceLabel, Gauge>,
}

impl ConnectorMetrics {
    /// Creates every series of `source` (so scrapes list them before its first sync).
    pub fn init_source(&self, source: &str) {
        let s = SourceLabel {
            source: source.to_owned(),
        };
        drop(self.runs.get_or_create(&s));
        drop(self.failures.get_or_create(&s));
        drop(self.last_success.get_or_create(&s));
        drop(self.running.get_or_create(&s));
        for kind in CHANGE_KINDS {
            drop(self.items.get_or_create(&ChangeLabel {
                source: source.to_owned(),
                kind,
            }));
        }
    }

    /// Registers every family (prefix `airlock_` from the registry).
    pub fn register(&self, r: &mut Registry) {
        r.register(
            "connector_syncs",
            "Connector sync runs started, by source",
            self.runs.clone(),
        );
        r.register(
            "connector_sync_failures",
            "Connector sync runs that failed as a whole (nothing of the run's listing applied \
             after the failure; the state kept is the last success's), by source",
            self.failures.clone(),
        );
        r.register(
            "connector_items",
            "Connector items by change kind (upsert, unchanged_content, permissions, moved, \
             delete, failed), by source",
            self.items.clone(),
        );
        r.register(
            "connector_last_success_timestamp_seconds",
            "Unix time of the source's last successful sync (0: none since start)",
            self.last_success.clone(),
        );
        r.register(
            "connector_running",
            "1 while the source's sync runs",
            self.running.clone(),
        );
    }
}
