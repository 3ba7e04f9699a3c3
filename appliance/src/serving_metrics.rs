//! The handles `airlock-serving` counts with, cloned from the ones [`Metrics`] registered (a
//! clone shares the registered metric).

use airlock_serving::metrics::AdmissionMetrics;
use airlock_serving::services::Services;

use crate::metrics::Metrics;

impl Metrics {
    /// Admission's and the ladder's handles.
    pub fn admission(&self) -> AdmissionMetrics {
        AdmissionMetrics {
            queue_depth: self.queue_depth.clone(),
            inflight: self.inflight.clone(),
            ladder_rung: self.ladder_rung.clone(),
            rung_transitions: self.rung_transitions.clone(),
            rung_seconds_total: self.rung_seconds_total.clone(),
            ladder_pressure: self.ladder_pressure.clone(),
            shed_total: self.shed_total.clone(),
            rate_limited_total: self.rate_limited_total.clone(),
            recent_sheds: self.recent_sheds.clone(),
        }
    }

    /// Copies the engines' counters and the rack's replica gauges into the metrics (before an
    /// exposition).
    pub fn refresh_engines(&self, services: &Services) {
        let (active, kv, hits, saved) = services.engine_totals();
        self.engine_active.set(active);
        self.kv_bytes.set(kv);
        self.prefix_hits.set(hits);
        self.prefix_tokens_saved.set(saved);
        for r in &services.remotes {
            r.refresh_gauges(&self.rack);
        }
    }
}
