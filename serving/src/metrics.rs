//! The metric handles serving updates. The binary owns the Prometheus registry: it creates
//! these handles (or hands over clones of the ones it registered) and encodes them; serving only
//! counts. Labels carry bounded, non-sensitive values only.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;

use parking_lot::Mutex;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;

/// Labels of `airlock_ladder_rung_seconds_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RungLabel {
    /// The rung (0..=5).
    pub rung: u8,
}

/// Labels of `airlock_shed_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PriorityLabel {
    /// `interactive` or `batch`.
    pub priority: &'static str,
}

/// Labels of `airlock_rate_limited_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct QuotaKind {
    /// `requests` or `tokens`.
    pub quota: &'static str,
}

/// How many recent sheds [`AdmissionMetrics::recent_sheds`] keeps.
pub const RECENT_SHEDS: usize = 50;

/// What admission and the ladder count (cheap to clone: every handle is an `Arc` inside).
#[derive(Clone, Default)]
pub struct AdmissionMetrics {
    /// `airlock_queue_depth`: requests admitted and waiting for the engine.
    pub queue_depth: Gauge,
    /// `airlock_inflight`: admitted model-bound requests being served.
    pub inflight: Gauge,
    /// `airlock_ladder_rung`: the current degradation rung.
    pub ladder_rung: Gauge,
    /// `airlock_rung_transitions_total`.
    pub rung_transitions: Counter,
    /// `airlock_ladder_rung_seconds_total{rung}`: time spent at each rung.
    pub rung_seconds_total: Family<RungLabel, Counter<f64, AtomicU64>>,
    /// `airlock_ladder_pressure`: the controller's last load observation (1.0 = full).
    pub ladder_pressure: Gauge<f64, AtomicU64>,
    /// `airlock_shed_total{priority}`: requests shed by the ladder.
    pub shed_total: Family<PriorityLabel, Counter>,
    /// `airlock_rate_limited_total{quota}`: requests refused by a per-user quota.
    pub rate_limited_total: Family<QuotaKind, Counter>,
    /// The last [`RECENT_SHEDS`] sheds: (Unix seconds, priority).
    pub recent_sheds: Arc<Mutex<VecDeque<(f64, &'static str)>>>,
}

impl AdmissionMetrics {
    /// Adds `seconds` spent at `rung`.
    pub fn rung_seconds(&self, rung: u8, seconds: f64) {
        self.rung_seconds_total
            .get_or_create(&RungLabel { rung })
            .inc_by(seconds);
    }

    /// Counts one shed request.
    pub fn shed(&self, priority: &'static str) {
        self.shed_total
            .get_or_create(&PriorityLabel { priority })
            .inc();
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs_f64())
            .unwrap_or(0.0);
        let mut recent = self.recent_sheds.lock();
        if recent.len() == RECENT_SHEDS {
            recent.pop_front();
        }
        recent.push_back((now, priority));
    }

    /// Counts one request refused by the `quota` (`requests` or `tokens`) quota.
    pub fn rate_limited(&self, quota: &'static str) {
        self.rate_limited_total
            .get_or_create(&QuotaKind { quota })
            .inc();
    }
}
