//! Admission: the one component every model-bound request passes before it costs anything.
//!
//! It picks the degradation rung for the request and turns it into a [`RungPlan`] (what the
//! request path may do at that rung). The load-driven controller of the degradation ladder
//! (DESIGN.md §6) plugs in here behind [`Admission::current_rung`]; until it lands the
//! controller reports rung 0 and only an admin can force a rung per request. The bookkeeping the
//! controller will read (in-flight work, queue depth) is kept here already.

use std::sync::Arc;
use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering};
use std::time::Duration;

use crate::error::ApiError;
use crate::metrics::Metrics;

/// The highest rung (shed everything).
pub const MAX_RUNG: u8 = 5;

/// What a request may do at its rung.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RungPlan {
    /// The rung (0 = full quality).
    pub rung: u8,
    /// Whether the cross-encoder rerank stage runs (rung 0 only).
    pub rerank: bool,
    /// Upper bound on chunks placed in the prompt, if the rung shrinks it (rung ≥ 2).
    pub max_prompt_chunks: Option<usize>,
    /// Whether the small generator replaces the large one (rung ≥ 3).
    pub small_model: bool,
    /// How long a request may wait for the engine before its first token (rung ≥ 4).
    pub queue_deadline: Option<Duration>,
}

impl RungPlan {
    /// The plan of `rung` (must be ≤ [`MAX_RUNG`]; rung 5 never gets a plan, it is shed).
    pub fn for_rung(rung: u8) -> Self {
        RungPlan {
            rung,
            rerank: rung == 0,
            max_prompt_chunks: (rung >= 2).then_some(3),
            small_model: rung >= 3,
            queue_deadline: (rung >= 4).then_some(Duration::from_secs(5)),
        }
    }
}

#[derive(Debug, Default)]
struct Load {
    inflight: AtomicUsize,
    queued: AtomicUsize,
}

/// The admission component (cheap to clone).
#[derive(Clone)]
pub struct Admission {
    load: Arc<Load>,
    rung: Arc<AtomicU8>,
    metrics: Metrics,
}

/// A request's admission: its plan, and its slot in the in-flight count until dropped.
#[derive(Debug)]
pub struct Ticket {
    /// What the request may do.
    pub plan: RungPlan,
    load: Arc<Load>,
    metrics_inflight: prometheus_client::metrics::gauge::Gauge,
}

impl Drop for Ticket {
    fn drop(&mut self) {
        self.load.inflight.fetch_sub(1, Ordering::Relaxed);
        self.metrics_inflight.dec();
    }
}

/// Marks a request as waiting for the engine; dropping it ends the wait.
#[derive(Debug)]
pub struct QueueSlot {
    load: Arc<Load>,
    gauge: prometheus_client::metrics::gauge::Gauge,
}

impl Drop for QueueSlot {
    fn drop(&mut self) {
        self.load.queued.fetch_sub(1, Ordering::Relaxed);
        self.gauge.dec();
    }
}

impl Admission {
    /// A controller at rung 0.
    pub fn new(metrics: Metrics) -> Self {
        metrics.ladder_rung.set(0);
        Admission {
            load: Arc::new(Load::default()),
            rung: Arc::new(AtomicU8::new(0)),
            metrics,
        }
    }

    /// The rung the controller currently assigns to new requests.
    pub fn current_rung(&self) -> u8 {
        self.rung.load(Ordering::Relaxed)
    }

    /// Moves the controller to `rung` (recorded in metrics). The ladder controller calls this.
    pub fn set_rung(&self, rung: u8) {
        let rung = rung.min(MAX_RUNG);
        let from = self.rung.swap(rung, Ordering::Relaxed);
        if from != rung {
            self.metrics.rung_transitions.inc();
            self.metrics.ladder_rung.set(i64::from(rung));
        }
    }

    /// Admits a request at the controller's rung, or at `forced` (admin only, checked by the
    /// caller). Rung 5 sheds: 503 `capacity-unavailable` with `Retry-After`.
    pub fn admit(&self, forced: Option<u8>) -> Result<Ticket, ApiError> {
        let rung = forced.unwrap_or_else(|| self.current_rung());
        if rung > MAX_RUNG {
            return Err(ApiError::InvalidRequest(format!(
                "airlock.rung must be between 0 and {MAX_RUNG}"
            )));
        }
        if rung == MAX_RUNG {
            return Err(ApiError::CapacityUnavailable {
                retry_after: Duration::from_secs(5),
            });
        }
        self.load.inflight.fetch_add(1, Ordering::Relaxed);
        self.metrics.inflight.inc();
        Ok(Ticket {
            plan: RungPlan::for_rung(rung),
            load: self.load.clone(),
            metrics_inflight: self.metrics.inflight.clone(),
        })
    }

    /// Marks one request as queued for the engine until the slot is dropped.
    pub fn enqueue(&self) -> QueueSlot {
        self.load.queued.fetch_add(1, Ordering::Relaxed);
        self.metrics.queue_depth.inc();
        QueueSlot {
            load: self.load.clone(),
            gauge: self.metrics.queue_depth.clone(),
        }
    }

    /// Admitted requests not yet finished.
    pub fn inflight(&self) -> usize {
        self.load.inflight.load(Ordering::Relaxed)
    }

    /// Requests waiting for the engine.
    pub fn queued(&self) -> usize {
        self.load.queued.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plans_follow_the_ladder() {
        assert!(RungPlan::for_rung(0).rerank);
        assert!(!RungPlan::for_rung(1).rerank);
        assert_eq!(RungPlan::for_rung(1).max_prompt_chunks, None);
        assert_eq!(RungPlan::for_rung(2).max_prompt_chunks, Some(3));
        assert!(!RungPlan::for_rung(2).small_model);
        assert!(RungPlan::for_rung(3).small_model);
        assert!(RungPlan::for_rung(4).queue_deadline.is_some());
    }

    #[test]
    fn tickets_count_inflight_and_rung_five_sheds() {
        let a = Admission::new(Metrics::new());
        let t = a.admit(None).unwrap();
        assert_eq!(t.plan.rung, 0);
        assert_eq!(a.inflight(), 1);
        drop(t);
        assert_eq!(a.inflight(), 0);
        assert!(matches!(
            a.admit(Some(5)),
            Err(ApiError::CapacityUnavailable { .. })
        ));
        assert!(matches!(a.admit(Some(6)), Err(ApiError::InvalidRequest(_))));
        a.set_rung(2);
        assert_eq!(a.admit(None).unwrap().plan.rung, 2);
    }
}
