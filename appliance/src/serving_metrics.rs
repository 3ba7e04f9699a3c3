//! The handles `airlock-serving` counts with, cloned from the ones [`Metrics`] registered (a
//! clone shares the registered metric).

use airlock_serving::metrics::AdmissionMetrics;

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
}
