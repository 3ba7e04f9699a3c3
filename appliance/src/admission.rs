//! Admission: the one component every model-bound request passes before it costs anything.
//!
//! It sheds what the ladder says to shed (503 `capacity-unavailable`, batch traffic first),
//! applies the per-user quotas of [`crate::quota`] (429 `rate-limited`), picks the degradation
//! rung for the request and turns it into a [`RungPlan`] (what the request path may do at that
//! rung). The load-driven controller of [`crate::ladder`] runs on a small thread that observes
//! in-flight work, queue depth, the engines' KV-cache use and an EWMA of the engine wait every
//! tick, and moves the rung every new request gets; an admin can still force a rung per request.

use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use airlock_inference::generate::EngineCounters;
use parking_lot::Mutex;

use crate::auth::Caller;
use crate::config::Config;
use crate::error::ApiError;
use crate::ladder::{Ewma, Ladder, LadderConfig, Signals, Transition};
use crate::metrics::Metrics;
use crate::quota::{QuotaConfig, Quotas, TokenReservation};
use crate::services::Services;

/// The highest rung (shed everything).
pub const MAX_RUNG: u8 = 5;

/// The request header that marks batch/eval traffic (`batch`) or interactive (`interactive`,
/// the default).
pub const PRIORITY_HEADER: &str = "x-airlock-priority";

/// Rung 4's default wait limit before the first token (`queue_deadline_ms`). It must exceed
/// the unloaded time to first token of a full RAG prompt on the target box (~37 s for a 6-chunk
/// prompt with SmolLM2 on the 2-core dev box), or a lone user is answered 504.
pub const DEFAULT_QUEUE_DEADLINE: Duration = Duration::from_secs(120);

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
    /// The plan of `rung` (must be ≤ [`MAX_RUNG`]; rung 5 never gets a plan, it is shed), with
    /// the default rung-4 deadline ([`DEFAULT_QUEUE_DEADLINE`]).
    pub fn for_rung(rung: u8) -> Self {
        RungPlan {
            rung,
            rerank: rung == 0,
            max_prompt_chunks: (rung >= 2).then_some(3),
            small_model: rung >= 3,
            queue_deadline: (rung >= 4).then_some(DEFAULT_QUEUE_DEADLINE),
        }
    }
}

/// How urgent a request is: batch/eval traffic is shed before interactive traffic, and the
/// engine admits queued interactive requests before batch ones ([`Priority::engine`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Priority {
    /// A person is waiting (the default).
    #[default]
    Interactive,
    /// Batch or eval traffic (`X-Airlock-Priority: batch`).
    Batch,
}

impl Priority {
    /// The metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            Priority::Interactive => "interactive",
            Priority::Batch => "batch",
        }
    }

    /// The engine's admission class: interactive sequences are prefilled before queued batch
    /// ones, and batch has its own, smaller queue limit (see
    /// [`airlock_inference::generate::EngineConfig`]).
    pub fn engine(self) -> airlock_inference::generate::Priority {
        match self {
            Priority::Interactive => airlock_inference::generate::Priority::Interactive,
            Priority::Batch => airlock_inference::generate::Priority::Batch,
        }
    }
}

impl<S: Send + Sync> axum::extract::FromRequestParts<S> for Priority {
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        _state: &S,
    ) -> Result<Self, Self::Rejection> {
        match parts.headers.get(PRIORITY_HEADER).map(|v| v.to_str()) {
            None => Ok(Priority::Interactive),
            Some(Ok(v)) if v.eq_ignore_ascii_case("interactive") => Ok(Priority::Interactive),
            Some(Ok(v)) if v.eq_ignore_ascii_case("batch") => Ok(Priority::Batch),
            Some(_) => Err(ApiError::InvalidRequest(
                "X-Airlock-Priority must be `interactive` or `batch`".into(),
            )),
        }
    }
}

/// Everything admission is told at start-up (see [`AdmissionConfig::from_config`]).
#[derive(Debug, Clone)]
pub struct AdmissionConfig {
    /// The controller's tuning; `None` = no load-driven ladder (rung 0 unless forced).
    pub ladder: Option<LadderConfig>,
    /// Period of the controller thread; `None` = no thread (the owner calls
    /// [`Admission::tick`], as tests do with a fake clock).
    pub tick: Option<Duration>,
    /// Rung 4's wait limit before the first token.
    pub queue_deadline: Duration,
    /// `Retry-After` of shed responses.
    pub shed_retry_after: Duration,
    /// Batch requests are shed from this rung on.
    pub batch_shed_rung: u8,
    /// Per-role quotas.
    pub quotas: QuotaConfig,
}

impl AdmissionConfig {
    /// The settings of a validated [`Config`].
    pub fn from_config(c: &Config) -> Self {
        AdmissionConfig {
            ladder: c.ladder_enabled().then(|| c.ladder_config()),
            tick: Some(c.ladder_tick()),
            queue_deadline: c.queue_deadline(),
            shed_retry_after: c.shed_retry_after(),
            batch_shed_rung: c.batch_shed_rung(),
            quotas: c.quotas(),
        }
    }
}

impl Default for AdmissionConfig {
    fn default() -> Self {
        Self::from_config(&Config::default())
    }
}

#[derive(Debug, Default)]
struct Load {
    inflight: AtomicUsize,
    queued: AtomicUsize,
}

struct EngineProbe {
    counters: Arc<EngineCounters>,
    kv_budget: usize,
}

/// The controller's shared state; the ticking thread holds it weakly and stops when the last
/// [`Admission`] is gone.
struct Control {
    enabled: bool,
    ladder: Mutex<Ladder>,
    wait: Mutex<Ewma>,
    engines: Mutex<Vec<EngineProbe>>,
    last_tick: Mutex<Instant>,
    load: Arc<Load>,
    rung: Arc<AtomicU8>,
    metrics: Metrics,
}

impl Control {
    fn apply(&self, rung: u8) {
        let from = self.rung.swap(rung, Ordering::Relaxed);
        if from != rung {
            self.metrics.rung_transitions.inc();
            self.metrics.ladder_rung.set(i64::from(rung));
        }
    }

    fn signals(&self) -> Signals {
        let (mut engine_queued, mut kv, mut budget) = (0usize, 0usize, 0usize);
        for p in self.engines.lock().iter() {
            let m = p.counters.snapshot();
            engine_queued += m.queue_depth;
            kv += m.kv_bytes;
            budget += p.kv_budget;
        }
        let queued = self.load.queued.load(Ordering::Relaxed).max(engine_queued);
        let mut wait = self.wait.lock();
        wait.tick(queued == 0);
        Signals {
            inflight: self.load.inflight.load(Ordering::Relaxed),
            queued,
            kv_fraction: if budget == 0 {
                0.0
            } else {
                kv as f64 / budget as f64
            },
            wait_ewma: wait.get(),
        }
    }

    fn tick(&self, now: Instant) -> Option<Transition> {
        let signals = self.signals();
        let mut ladder = self.ladder.lock();
        {
            let mut last = self.last_tick.lock();
            let dt = now.saturating_duration_since(*last);
            *last = now;
            self.metrics.rung_seconds(ladder.rung(), dt.as_secs_f64());
        }
        if !self.enabled {
            return None;
        }
        self.metrics.ladder_pressure.set(ladder.pressure(&signals));
        let step = ladder.observe(&signals, now)?;
        self.apply(step.to);
        tracing::info!(
            from = step.from,
            to = step.to,
            pressure = step.pressure,
            inflight = signals.inflight,
            queued = signals.queued,
            kv_fraction = signals.kv_fraction,
            wait_ewma_ms = signals.wait_ewma.map(|w| w.as_millis() as u64),
            "ladder rung changed"
        );
        Some(step)
    }
}

fn spawn_ticker(control: Weak<Control>, period: Duration) {
    let spawned = std::thread::Builder::new()
        .name("airlock-ladder".into())
        .spawn(move || {
            loop {
                std::thread::sleep(period);
                let Some(c) = control.upgrade() else { break };
                c.tick(Instant::now());
            }
        });
    if let Err(e) = spawned {
        tracing::error!(error = %e, "cannot start the ladder thread: the rung stays where it is");
    }
}

/// The admission component (cheap to clone).
#[derive(Clone)]
pub struct Admission {
    load: Arc<Load>,
    rung: Arc<AtomicU8>,
    quotas: Arc<Quotas>,
    control: Arc<Control>,
    queue_deadline: Duration,
    shed_retry_after: Duration,
    batch_shed_rung: u8,
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

/// Marks a request as waiting for the engine; dropping it (at the first token, or when the
/// request ends before one) ends the wait and feeds its length to the ladder's wait EWMA.
pub struct QueueSlot {
    control: Arc<Control>,
    since: Instant,
}

impl std::fmt::Debug for QueueSlot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QueueSlot")
            .field("since", &self.since)
            .finish_non_exhaustive()
    }
}

impl Drop for QueueSlot {
    fn drop(&mut self) {
        self.control.load.queued.fetch_sub(1, Ordering::Relaxed);
        self.control.metrics.queue_depth.dec();
        self.control.wait.lock().record(self.since.elapsed());
    }
}

impl Admission {
    /// A controller at rung 0 with the given settings; starts the ladder thread when
    /// `config.ladder` and `config.tick` are both set.
    pub fn new(metrics: Metrics, config: AdmissionConfig) -> Self {
        metrics.ladder_rung.set(0);
        let load = Arc::new(Load::default());
        let rung = Arc::new(AtomicU8::new(0));
        let ladder_config = config.ladder.clone().unwrap_or_default();
        let control = Arc::new(Control {
            enabled: config.ladder.is_some(),
            wait: Mutex::new(Ewma::new(ladder_config.ewma_alpha)),
            ladder: Mutex::new(Ladder::new(ladder_config)),
            engines: Mutex::new(Vec::new()),
            last_tick: Mutex::new(Instant::now()),
            load: load.clone(),
            rung: rung.clone(),
            metrics: metrics.clone(),
        });
        if let (Some(_), Some(period)) = (&config.ladder, config.tick) {
            spawn_ticker(Arc::downgrade(&control), period);
        }
        Admission {
            load,
            rung,
            quotas: Arc::new(Quotas::new(config.quotas)),
            control,
            queue_deadline: config.queue_deadline,
            shed_retry_after: config.shed_retry_after,
            batch_shed_rung: config.batch_shed_rung,
            metrics,
        }
    }

    /// The settings of a validated [`Config`] (ladder thread included when enabled).
    pub fn from_config(metrics: Metrics, config: &Config) -> Self {
        Self::new(metrics, AdmissionConfig::from_config(config))
    }

    /// Lets the controller read the engines' queue depth and KV-cache use (called when the
    /// services are installed).
    pub fn watch_engines(&self, services: &Services) {
        let probes = services
            .generators
            .iter()
            .map(|g| EngineProbe {
                counters: g.engine().counters(),
                kv_budget: g.engine().config().kv_budget_bytes,
            })
            .collect();
        *self.control.engines.lock() = probes;
    }

    /// One controller observation at `now` (the ladder thread calls this every tick; tests
    /// call it with a fake clock). Returns the rung change it caused.
    pub fn tick(&self, now: Instant) -> Option<Transition> {
        self.control.tick(now)
    }

    /// The signals the controller would observe now (diagnostics and tests).
    pub fn signals(&self) -> Signals {
        self.control.signals()
    }

    /// The rung the controller currently assigns to new requests.
    pub fn current_rung(&self) -> u8 {
        self.rung.load(Ordering::Relaxed)
    }

    /// Moves the controller to `rung` (recorded in metrics); with the ladder running it moves
    /// on from there at the next observation.
    pub fn set_rung(&self, rung: u8) {
        let rung = rung.min(MAX_RUNG);
        self.control.ladder.lock().force(rung);
        self.control.apply(rung);
    }

    /// Admits `caller`'s request at the controller's rung, or at `forced` (admin only, checked
    /// by the caller). Shed first, at no cost (rung 5, or batch traffic from the batch shedding
    /// rung on): 503 `capacity-unavailable`. Then the request quota: 429 `rate-limited`. Both
    /// with `Retry-After`.
    pub fn admit(
        &self,
        caller: &Caller,
        forced: Option<u8>,
        priority: Priority,
    ) -> Result<Ticket, ApiError> {
        let rung = forced.unwrap_or_else(|| self.current_rung());
        if rung > MAX_RUNG {
            return Err(ApiError::InvalidRequest(format!(
                "airlock.rung must be between 0 and {MAX_RUNG}"
            )));
        }
        let shed = rung == MAX_RUNG
            || (forced.is_none() && priority == Priority::Batch && rung >= self.batch_shed_rung);
        if shed {
            self.metrics.shed(priority.as_str());
            return Err(ApiError::CapacityUnavailable {
                retry_after: self.shed_retry_after,
            });
        }
        self.quotas
            .take_request(&caller.user_id, caller.admin, Instant::now())
            .map_err(|retry_after| {
                self.metrics.rate_limited("requests");
                ApiError::RateLimited { retry_after }
            })?;
        self.load.inflight.fetch_add(1, Ordering::Relaxed);
        self.metrics.inflight.inc();
        let mut plan = RungPlan::for_rung(rung);
        plan.queue_deadline = plan.queue_deadline.map(|_| self.queue_deadline);
        Ok(Ticket {
            plan,
            load: self.load.clone(),
            metrics_inflight: self.metrics.inflight.clone(),
        })
    }

    /// Reserves `tokens` model tokens (prompt + `max_tokens`) from `caller`'s token quota:
    /// 429 `rate-limited` with `Retry-After` when they are not available. Settle the
    /// reservation with the tokens actually used when the request ends.
    pub fn reserve_tokens(
        &self,
        caller: &Caller,
        tokens: usize,
    ) -> Result<TokenReservation, ApiError> {
        self.quotas
            .reserve_tokens(&caller.user_id, caller.admin, tokens, Instant::now())
            .map_err(|retry_after| {
                self.metrics.rate_limited("tokens");
                ApiError::RateLimited { retry_after }
            })
    }

    /// The quotas (diagnostics and tests).
    pub fn quotas(&self) -> &Arc<Quotas> {
        &self.quotas
    }

    /// Marks one request as queued for the engine until the slot is dropped.
    pub fn enqueue(&self) -> QueueSlot {
        self.load.queued.fetch_add(1, Ordering::Relaxed);
        self.metrics.queue_depth.inc();
        QueueSlot {
            control: self.control.clone(),
            since: Instant::now(),
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

    fn caller(id: &str) -> Caller {
        Caller {
            user_id: id.into(),
            admin: false,
        }
    }

    fn manual(ladder: bool) -> AdmissionConfig {
        AdmissionConfig {
            ladder: ladder.then(LadderConfig::default),
            tick: None,
            ..AdmissionConfig::default()
        }
    }

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
        let a = Admission::new(Metrics::new(), manual(false));
        let u = caller("u");
        let t = a.admit(&u, None, Priority::Interactive).unwrap();
        assert_eq!(t.plan.rung, 0);
        assert_eq!(a.inflight(), 1);
        drop(t);
        assert_eq!(a.inflight(), 0);
        assert!(matches!(
            a.admit(&u, Some(5), Priority::Interactive),
            Err(ApiError::CapacityUnavailable { .. })
        ));
        assert!(matches!(
            a.admit(&u, Some(6), Priority::Interactive),
            Err(ApiError::InvalidRequest(_))
        ));
        a.set_rung(2);
        assert_eq!(
            a.admit(&u, None, Priority::Interactive).unwrap().plan.rung,
            2
        );
        let t4 = a.admit(&u, Some(4), Priority::Interactive).unwrap();
        assert_eq!(t4.plan.queue_deadline, Some(DEFAULT_QUEUE_DEADLINE));
    }

    #[test]
    fn batch_is_shed_first() {
        let a = Admission::new(Metrics::new(), manual(false));
        let u = caller("u");
        a.set_rung(2);
        assert!(a.admit(&u, None, Priority::Batch).is_ok());
        a.set_rung(3);
        assert!(matches!(
            a.admit(&u, None, Priority::Batch),
            Err(ApiError::CapacityUnavailable { .. })
        ));
        assert!(a.admit(&u, None, Priority::Interactive).is_ok());
        assert!(
            a.admit(&u, Some(3), Priority::Batch).is_ok(),
            "a forced rung (evals) is not shed"
        );
        assert_eq!(a.inflight(), 0);
    }

    #[test]
    fn shed_requests_cost_no_quota() {
        let a = Admission::new(
            Metrics::new(),
            AdmissionConfig {
                quotas: QuotaConfig {
                    user: crate::quota::Limits {
                        requests_per_minute: 1,
                        tokens_per_minute: 0,
                    },
                    ..QuotaConfig::default()
                },
                ..manual(false)
            },
        );
        let u = caller("u");
        a.set_rung(5);
        assert!(a.admit(&u, None, Priority::Interactive).is_err());
        a.set_rung(0);
        a.admit(&u, None, Priority::Interactive).unwrap();
        assert!(matches!(
            a.admit(&u, None, Priority::Interactive),
            Err(ApiError::RateLimited { .. })
        ));
    }

    #[test]
    fn the_controller_reads_admission_load() {
        let a = Admission::new(Metrics::new(), manual(true));
        let u = caller("u");
        let t0 = Instant::now();
        let slots: Vec<QueueSlot> = (0..12).map(|_| a.enqueue()).collect();
        let step = a.tick(t0).unwrap();
        assert_eq!((step.from, step.to), (0, 2), "12 queued / 8 full = 1.5");
        assert_eq!(
            a.admit(&u, None, Priority::Interactive).unwrap().plan.rung,
            2
        );
        drop(slots);
        assert_eq!(a.queued(), 0);
        // The waits were short: the EWMA is far below the wait threshold. Recovery needs the hold.
        assert!(a.tick(t0 + Duration::from_secs(1)).is_none());
        assert_eq!(a.tick(t0 + Duration::from_secs(12)).unwrap().to, 1);
        assert_eq!(a.tick(t0 + Duration::from_secs(23)).unwrap().to, 0);
    }
}
