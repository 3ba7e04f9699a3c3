//! Admission: the one component every model-bound request passes before it costs anything.
//!
//! It sheds what the ladder says to shed (503 `capacity-unavailable`, batch traffic first),
//! applies the per-user quotas of [`crate::quota`] (429 `rate-limited`), picks the degradation
//! rung for the request and turns it into a [`RungPlan`] (what the request path may do at that
//! rung). The load-driven controller of [`crate::ladder`] runs on a small thread that observes
//! in-flight work, queue depth, the engines' KV-cache use, an EWMA of the queue wait
//! (submission → engine admission) and the demand rung 5 shed, every tick, and moves the rung
//! every new request gets; an admin can still force a rung per request.
//!
//! Rung 5 has two meanings. Reached by the load, it sheds only the excess: an interactive
//! request is still admitted while fewer than `shed_admit_inflight` admitted requests are in
//! flight (it gets rung 4's plan and reports rung 5). Forced by an admin
//! (`"airlock": {"rung": 5}`) or pinned by the operator ([`Admission::set_rung`]), it sheds
//! every request.

use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use airlock_inference::generate::EngineCounters;
use parking_lot::Mutex;

use airlock_identity::caller::Caller;

use crate::generator::Generator;
pub use crate::ladder::{DEFAULT_QUEUE_DEADLINE, MAX_RUNG};
use crate::ladder::{Ewma, Ladder, LadderConfig, ShedDemand, Signals, Transition};
use crate::metrics::AdmissionMetrics;
use crate::quota::{QuotaConfig, Quotas, TokenReservation};

mod settings;
pub use settings::AdmissionSettings;

/// Why a request is not admitted (the binary maps it to its HTTP problem).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AdmissionError {
    /// Shed by the ladder (503 `capacity-unavailable`).
    #[error("capacity unavailable; retry after {}s", retry_after.as_secs())]
    Shed {
        /// Suggested `Retry-After`.
        retry_after: Duration,
    },
    /// Over a per-user quota (429 `rate-limited`).
    #[error("rate limited; retry after {}s", retry_after.as_secs())]
    RateLimited {
        /// Suggested `Retry-After`.
        retry_after: Duration,
    },
    /// The request asked for something admission cannot give (400 `invalid-request`).
    #[error("{0}")]
    Invalid(String),
}

/// The request header that marks batch/eval traffic (`batch`) or interactive (`interactive`,
/// the default).
pub const PRIORITY_HEADER: &str = "x-airlock-priority";

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
    /// How long a request may wait for its first token before 504 (rung ≥ 4).
    pub queue_deadline: Option<Duration>,
}

impl RungPlan {
    /// The plan of `rung` (must be ≤ [`MAX_RUNG`]), with the default rung-4 deadline
    /// ([`DEFAULT_QUEUE_DEADLINE`]). Rung 5's plan is rung 4's (no rerank, ≤ 3 chunks, small
    /// model, bounded wait for the first token) with `rung` = 5: what the load-driven rung 5 admits below its
    /// in-flight limit runs like rung 4, so nothing admitted at rung 5 queues without bound, and
    /// the response reports the rung the controller is at.
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

impl Priority {
    /// The priority an `X-Airlock-Priority` header value asks for (`None`: no header).
    pub fn from_header(value: Option<&[u8]>) -> Result<Self, AdmissionError> {
        match value.map(std::str::from_utf8) {
            None => Ok(Priority::Interactive),
            Some(Ok(v)) if v.eq_ignore_ascii_case("interactive") => Ok(Priority::Interactive),
            Some(Ok(v)) if v.eq_ignore_ascii_case("batch") => Ok(Priority::Batch),
            Some(_) => Err(AdmissionError::Invalid(
                "X-Airlock-Priority must be `interactive` or `batch`".into(),
            )),
        }
    }
}

/// Everything admission is told at start-up (see [`AdmissionConfig::from_settings`]).
#[derive(Debug, Clone)]
pub struct AdmissionConfig {
    /// The controller's tuning; `None` = no load-driven ladder (rung 0 unless forced).
    pub ladder: Option<LadderConfig>,
    /// Period of the controller thread; `None` = no thread (the owner calls
    /// [`Admission::tick`], as tests do with a fake clock).
    pub tick: Option<Duration>,
    /// Rung 4's (and the load-driven rung 5's) wait limit before the first token.
    pub queue_deadline: Duration,
    /// `Retry-After` of shed responses.
    pub shed_retry_after: Duration,
    /// Batch requests are shed from this rung on.
    pub batch_shed_rung: u8,
    /// Per-role quotas.
    pub quotas: QuotaConfig,
}

impl AdmissionConfig {
    /// The settings of a validated [`AdmissionSettings`].
    pub fn from_settings(c: &AdmissionSettings) -> Self {
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
        Self::from_settings(&AdmissionSettings::default())
    }
}

#[derive(Debug, Default)]
struct Load {
    inflight: AtomicUsize,
    queued: AtomicUsize,
    /// Requests admitted since the last tick (for the shed-demand estimate).
    admitted: AtomicU64,
    /// Requests the load-driven rung 5 shed as excess since the last tick.
    shed_excess: AtomicU64,
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
    demand: Mutex<ShedDemand>,
    /// The operator pinned rung 5 ([`Admission::set_rung`]): shed everything until the
    /// controller moves the rung.
    pinned_shed: AtomicBool,
    engines: Mutex<Vec<EngineProbe>>,
    last_tick: Mutex<Instant>,
    load: Arc<Load>,
    rung: Arc<AtomicU8>,
    metrics: AdmissionMetrics,
}

impl Control {
    fn apply(&self, rung: u8) {
        let from = self.rung.swap(rung, Ordering::Relaxed);
        if from != rung {
            self.metrics.rung_transitions.inc();
            self.metrics.ladder_rung.set(i64::from(rung));
        }
    }

    /// The current signals (no side effect).
    fn signals(&self) -> Signals {
        let (mut engine_queued, mut kv, mut budget) = (0usize, 0usize, 0usize);
        for p in self.engines.lock().iter() {
            let m = p.counters.snapshot();
            engine_queued += m.queue_depth;
            kv += m.kv_bytes;
            budget += p.kv_budget;
        }
        Signals {
            inflight: self.load.inflight.load(Ordering::Relaxed),
            queued: self.load.queued.load(Ordering::Relaxed).max(engine_queued),
            kv_fraction: if budget == 0 {
                0.0
            } else {
                kv as f64 / budget as f64
            },
            wait_ewma: self.wait.lock().get(),
            shed_ratio: self.demand.lock().ratio(),
        }
    }

    fn tick(&self, now: Instant) -> Option<Transition> {
        let mut ladder = self.ladder.lock();
        let dt = {
            let mut last = self.last_tick.lock();
            let dt = now.saturating_duration_since(*last);
            *last = now;
            dt
        };
        self.metrics.rung_seconds(ladder.rung(), dt.as_secs_f64());
        self.demand.lock().update(
            self.load.admitted.swap(0, Ordering::Relaxed),
            self.load.shed_excess.swap(0, Ordering::Relaxed),
            dt,
        );
        let before = self.signals();
        // The wait EWMA decays while nothing waits (an idle appliance forgets old waits).
        let wait_ewma = {
            let mut wait = self.wait.lock();
            wait.tick(before.queued == 0);
            wait.get()
        };
        let signals = Signals {
            wait_ewma,
            ..before
        };
        if !self.enabled {
            return None;
        }
        self.metrics.ladder_pressure.set(ladder.pressure(&signals));
        let step = ladder.observe(&signals, now)?;
        // The controller moved: an operator's rung-5 pin (shed everything) ends here.
        self.pinned_shed.store(false, Ordering::Relaxed);
        self.apply(step.to);
        tracing::info!(
            from = step.from,
            to = step.to,
            pressure = step.pressure,
            inflight = signals.inflight,
            queued = signals.queued,
            kv_fraction = signals.kv_fraction,
            wait_ewma_ms = signals.wait_ewma.map(|w| w.as_millis() as u64),
            shed_ratio = signals.shed_ratio,
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
    /// The load-driven rung 5's in-flight limit (`None`: no load-driven ladder, rung 5 can only
    /// be forced or pinned and sheds everything).
    shed_admit_inflight: Option<usize>,
    metrics: AdmissionMetrics,
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

/// Marks a request as waiting for the engine; dropping it ends the wait and feeds its length to
/// the ladder's queue-wait EWMA. The request path drops it when the engine admits the sequence
/// into its running batch (or when the request ends before that), so the signal is pure
/// queueing, not the prompt's own prefill.
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
    pub fn new(metrics: AdmissionMetrics, config: AdmissionConfig) -> Self {
        metrics.ladder_rung.set(0);
        let load = Arc::new(Load::default());
        let rung = Arc::new(AtomicU8::new(0));
        let ladder_config = config.ladder.clone().unwrap_or_default();
        let control = Arc::new(Control {
            enabled: config.ladder.is_some(),
            wait: Mutex::new(Ewma::new(ladder_config.ewma_alpha)),
            demand: Mutex::new(ShedDemand::new(ladder_config.recover_hold)),
            pinned_shed: AtomicBool::new(false),
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
            shed_admit_inflight: config.ladder.as_ref().map(|l| l.shed_admit_inflight),
            metrics,
        }
    }

    /// The settings of a validated [`AdmissionSettings`] (ladder thread included when enabled).
    pub fn from_settings(metrics: AdmissionMetrics, settings: &AdmissionSettings) -> Self {
        Self::new(metrics, AdmissionConfig::from_settings(settings))
    }

    /// Lets the controller read the engines' queue depth and KV-cache use (called when the
    /// services are installed).
    pub fn watch_engines(&self, generators: &[Arc<Generator>]) {
        let probes = generators
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
    /// on from there at the next observation. An operator's pin: rung 5 set this way sheds
    /// every request (as a request forcing `airlock.rung = 5` is shed) until the controller
    /// moves the rung; only a rung 5 the load put the ladder at sheds just the excess.
    pub fn set_rung(&self, rung: u8) {
        let rung = rung.min(MAX_RUNG);
        let mut ladder = self.control.ladder.lock();
        ladder.force(rung);
        self.control
            .pinned_shed
            .store(rung == MAX_RUNG, Ordering::Relaxed);
        self.control.apply(rung);
    }

    fn shed(&self, priority: Priority) -> AdmissionError {
        self.metrics.shed(priority.as_str());
        AdmissionError::Shed {
            retry_after: self.shed_retry_after,
        }
    }

    /// Admits `caller`'s request at the controller's rung, or at `forced` (admin only, checked
    /// by the caller). Shed first, at no cost: 503 `capacity-unavailable` for every request at
    /// a forced or pinned rung 5, for batch traffic from the batch shedding rung on (unless the
    /// rung is forced), and at the load-driven rung 5 for the interactive requests beyond its
    /// in-flight limit ([`LadderConfig::shed_admit_inflight`]); an interactive request below
    /// the limit is admitted with rung 5's plan (rung 4's behaviour, [`RungPlan::for_rung`]).
    /// Then the request quota: 429 `rate-limited`. Both with `Retry-After`.
    pub fn admit(
        &self,
        caller: &Caller,
        forced: Option<u8>,
        priority: Priority,
    ) -> Result<Ticket, AdmissionError> {
        let rung = forced.unwrap_or_else(|| self.current_rung());
        if rung > MAX_RUNG {
            return Err(AdmissionError::Invalid(format!(
                "airlock.rung must be between 0 and {MAX_RUNG}"
            )));
        }
        let load_driven = forced.is_none();
        // The load-driven rung 5's limit; `None` where rung 5 sheds everything.
        let excess_limit = match (rung == MAX_RUNG, load_driven) {
            (false, _) => None,
            (true, false) => return Err(self.shed(priority)),
            (true, true) => match self.shed_admit_inflight {
                Some(limit) if !self.control.pinned_shed.load(Ordering::Relaxed) => Some(limit),
                _ => return Err(self.shed(priority)),
            },
        };
        if load_driven && priority == Priority::Batch && rung >= self.batch_shed_rung {
            return Err(self.shed(priority));
        }
        match excess_limit {
            // Take an in-flight slot only below the limit (one atomic step: concurrent
            // requests cannot overshoot it).
            Some(limit) => {
                let taken =
                    self.load
                        .inflight
                        .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                            (n < limit).then_some(n + 1)
                        });
                if taken.is_err() {
                    self.load.shed_excess.fetch_add(1, Ordering::Relaxed);
                    return Err(self.shed(priority));
                }
            }
            None => {
                self.load.inflight.fetch_add(1, Ordering::Relaxed);
            }
        }
        if let Err(retry_after) =
            self.quotas
                .take_request(&caller.user_id, caller.admin, Instant::now())
        {
            self.load.inflight.fetch_sub(1, Ordering::Relaxed);
            self.metrics.rate_limited("requests");
            return Err(AdmissionError::RateLimited { retry_after });
        }
        self.load.admitted.fetch_add(1, Ordering::Relaxed);
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
    ) -> Result<TokenReservation, AdmissionError> {
        self.reserve(caller, tokens)
            .map_err(|retry_after| AdmissionError::RateLimited { retry_after })
    }

    /// [`Admission::reserve_tokens`] without the HTTP error: when the tokens are not
    /// available, the wait before a retry (counted as rate-limited).
    pub fn reserve(&self, caller: &Caller, tokens: usize) -> Result<TokenReservation, Duration> {
        self.quotas
            .reserve_tokens(&caller.user_id, caller.admin, tokens, Instant::now())
            .inspect_err(|_| self.metrics.rate_limited("tokens"))
    }

    /// The quotas (diagnostics and tests).
    pub fn quotas(&self) -> &Arc<Quotas> {
        &self.quotas
    }

    /// Marks one request as queued for the engine until the slot is dropped (see [`QueueSlot`]:
    /// drop it when the engine admits the sequence).
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

    use crate::ladder::wide;
    use crate::metrics::PriorityLabel;

    fn caller(id: &str) -> Caller {
        Caller {
            user_id: id.into(),
            admin: false,
            roles: vec![],
        }
    }

    fn manual(ladder: bool) -> AdmissionConfig {
        AdmissionConfig {
            ladder: ladder.then(wide),
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
        // What the load-driven rung 5 admits runs like rung 4 and reports rung 5.
        assert_eq!(
            RungPlan::for_rung(5),
            RungPlan {
                rung: 5,
                ..RungPlan::for_rung(4)
            }
        );
    }

    #[test]
    fn tickets_count_inflight_and_rung_five_sheds() {
        let a = Admission::new(AdmissionMetrics::default(), manual(false));
        let u = caller("u");
        let t = a.admit(&u, None, Priority::Interactive).unwrap();
        assert_eq!(t.plan.rung, 0);
        assert_eq!(a.inflight(), 1);
        drop(t);
        assert_eq!(a.inflight(), 0);
        assert!(matches!(
            a.admit(&u, Some(5), Priority::Interactive),
            Err(AdmissionError::Shed { .. })
        ));
        assert!(matches!(
            a.admit(&u, Some(6), Priority::Interactive),
            Err(AdmissionError::Invalid(_))
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
        let a = Admission::new(AdmissionMetrics::default(), manual(false));
        let u = caller("u");
        a.set_rung(2);
        assert!(a.admit(&u, None, Priority::Batch).is_ok());
        a.set_rung(3);
        assert!(matches!(
            a.admit(&u, None, Priority::Batch),
            Err(AdmissionError::Shed { .. })
        ));
        assert!(a.admit(&u, None, Priority::Interactive).is_ok());
        assert!(
            a.admit(&u, Some(3), Priority::Batch).is_ok(),
            "a forced rung (evals) is not shed"
        );
        assert_eq!(a.inflight(), 0);
    }

    /// `base` with ordinary users limited to one request per minute.
    fn one_request_per_minute(base: AdmissionConfig) -> AdmissionConfig {
        AdmissionConfig {
            quotas: QuotaConfig {
                user: crate::quota::Limits {
                    requests_per_minute: 1,
                    tokens_per_minute: 0,
                },
                ..QuotaConfig::default()
            },
            ..base
        }
    }

    #[test]
    fn shed_requests_cost_no_quota() {
        let a = Admission::new(
            AdmissionMetrics::default(),
            one_request_per_minute(manual(false)),
        );
        let u = caller("u");
        a.set_rung(5);
        assert!(a.admit(&u, None, Priority::Interactive).is_err());
        a.set_rung(0);
        a.admit(&u, None, Priority::Interactive).unwrap();
        assert!(matches!(
            a.admit(&u, None, Priority::Interactive),
            Err(AdmissionError::RateLimited { .. })
        ));
    }

    /// A ladder whose rung 5 admits up to 3 in flight (full at 4 in flight; the queue signal
    /// far away), driven by hand with a fake clock.
    fn excess_config() -> AdmissionConfig {
        AdmissionConfig {
            ladder: Some(LadderConfig {
                inflight_full: 4,
                queue_full: 8,
                shed_admit_inflight: 3,
                ..wide()
            }),
            tick: None,
            ..AdmissionConfig::default()
        }
    }

    fn is_shed<T: std::fmt::Debug>(r: &Result<T, AdmissionError>) -> bool {
        matches!(r, Err(AdmissionError::Shed { .. }))
    }

    #[test]
    fn load_driven_rung_five_sheds_only_the_excess() {
        let a = Admission::new(AdmissionMetrics::default(), excess_config());
        let u = caller("u");
        let t0 = Instant::now();
        let slots: Vec<QueueSlot> = (0..40).map(|_| a.enqueue()).collect();
        assert_eq!(a.tick(t0).unwrap().to, 5, "40 queued / 8 full = 5");
        drop(slots);
        let held: Vec<Ticket> = (0..3)
            .map(|_| a.admit(&u, None, Priority::Interactive).unwrap())
            .collect();
        for t in &held {
            assert_eq!(
                t.plan,
                RungPlan {
                    rung: 5,
                    queue_deadline: Some(DEFAULT_QUEUE_DEADLINE),
                    ..RungPlan::for_rung(4)
                },
                "rung 4's plan (bounded wait), reported as rung 5"
            );
        }
        assert_eq!(a.inflight(), 3);
        assert!(
            is_shed(&a.admit(&u, None, Priority::Interactive)),
            "the excess"
        );
        assert!(is_shed(&a.admit(&u, None, Priority::Batch)), "batch always");
        assert_eq!(a.inflight(), 3, "shed requests hold no slot");
        // An admin forcing rung 5 is shed below the limit too; forcing a lower rung (evals) is
        // not limited.
        drop(held);
        assert!(is_shed(&a.admit(&u, Some(5), Priority::Interactive)));
        let forced: Vec<Ticket> = (0..5)
            .map(|_| a.admit(&u, Some(4), Priority::Batch).unwrap())
            .collect();
        assert_eq!(forced[0].plan.rung, 4);
        assert!(is_shed(&a.admit(&u, None, Priority::Interactive)));
        drop(forced);
        let t = a.admit(&u, None, Priority::Interactive).unwrap();
        assert_eq!(t.plan.rung, 5);
        // The excess shed here (2 interactive) is counted against what was admitted (3 + 5 + 1):
        // the next observation sees the demand.
        a.tick(t0 + Duration::from_millis(250));
        let ratio = a.signals().shed_ratio;
        assert!(
            (ratio - 2.0 / 9.0).abs() < 1e-6,
            "2 shed / 9 admitted: {ratio}"
        );
        let shed = |priority| {
            a.metrics
                .shed_total
                .get_or_create(&PriorityLabel { priority })
                .get()
        };
        assert_eq!((shed("interactive"), shed("batch")), (3, 1));
    }

    #[test]
    fn concurrent_requests_at_rung_five_never_overshoot_the_limit() {
        let a = Admission::new(AdmissionMetrics::default(), excess_config());
        let slots: Vec<QueueSlot> = (0..40).map(|_| a.enqueue()).collect();
        a.tick(Instant::now());
        assert_eq!(a.current_rung(), 5);
        let barrier = std::sync::Barrier::new(16);
        let admitted = std::thread::scope(|s| {
            let handles: Vec<_> = (0..16)
                .map(|i| {
                    let (a, barrier) = (&a, &barrier);
                    s.spawn(move || {
                        barrier.wait();
                        a.admit(&caller(&format!("u{i}")), None, Priority::Interactive)
                            .ok()
                    })
                })
                .collect();
            handles
                .into_iter()
                .filter_map(|h| h.join().unwrap())
                .collect::<Vec<Ticket>>()
        });
        assert_eq!(admitted.len(), 3, "exactly the limit");
        assert_eq!(a.inflight(), 3);
        drop((admitted, slots));
        assert_eq!(a.inflight(), 0);
    }

    #[test]
    fn a_quota_refusal_at_rung_five_gives_its_slot_back() {
        let a = Admission::new(
            AdmissionMetrics::default(),
            one_request_per_minute(excess_config()),
        );
        let slots: Vec<QueueSlot> = (0..40).map(|_| a.enqueue()).collect();
        a.tick(Instant::now());
        let u = caller("u");
        let t = a.admit(&u, None, Priority::Interactive).unwrap();
        assert!(matches!(
            a.admit(&u, None, Priority::Interactive),
            Err(AdmissionError::RateLimited { .. })
        ));
        assert_eq!(a.inflight(), 1);
        drop((t, slots));
    }

    #[test]
    fn a_pinned_rung_five_sheds_everything_until_the_controller_moves() {
        let a = Admission::new(AdmissionMetrics::default(), excess_config());
        let u = caller("u");
        let t0 = Instant::now();
        a.set_rung(5);
        assert_eq!(a.inflight(), 0);
        assert!(is_shed(&a.admit(&u, None, Priority::Interactive)));
        // Calm: the controller climbs after the hold, and the pin ends with it.
        assert!(a.tick(t0).is_none());
        assert_eq!(a.tick(t0 + Duration::from_secs(11)).unwrap().to, 4);
        let slots: Vec<QueueSlot> = (0..40).map(|_| a.enqueue()).collect();
        assert_eq!(a.tick(t0 + Duration::from_secs(12)).unwrap().to, 5);
        assert_eq!(
            a.admit(&u, None, Priority::Interactive).unwrap().plan.rung,
            5,
            "rung 5 from the load admits below the limit"
        );
        drop(slots);
    }

    /// A deterministic load on a fake clock: `rate` arrivals per 250 ms tick (fractions
    /// accumulate), each admitted request in flight for `hold_ticks` ticks.
    struct Sim {
        a: Admission,
        t0: Instant,
        tick: u64,
        owed: f64,
        running: std::collections::VecDeque<(u64, Ticket)>,
        admitted: usize,
        shed: usize,
    }

    impl Sim {
        fn new(config: AdmissionConfig) -> Sim {
            Sim {
                a: Admission::new(AdmissionMetrics::default(), config),
                t0: Instant::now(),
                tick: 0,
                owed: 0.0,
                running: Default::default(),
                admitted: 0,
                shed: 0,
            }
        }

        /// Runs `ticks` ticks; returns the rung after each.
        fn run(&mut self, ticks: u64, rate: f64, hold_ticks: u64) -> Vec<u8> {
            let u = caller("u");
            (0..ticks)
                .map(|_| {
                    self.tick += 1;
                    while self
                        .running
                        .front()
                        .is_some_and(|(end, _)| *end <= self.tick)
                    {
                        self.running.pop_front();
                    }
                    self.owed += rate;
                    while self.owed >= 1.0 {
                        self.owed -= 1.0;
                        match self.a.admit(&u, None, Priority::Interactive) {
                            Ok(t) => {
                                self.admitted += 1;
                                self.running.push_back((self.tick + hold_ticks, t));
                            }
                            Err(_) => self.shed += 1,
                        }
                    }
                    self.a
                        .tick(self.t0 + Duration::from_millis(250 * self.tick));
                    self.a.current_rung()
                })
                .collect()
        }
    }

    fn changes(rungs: &[u8]) -> usize {
        rungs.windows(2).filter(|w| w[0] != w[1]).count()
    }

    /// (tick, new rung) of every change, for failure messages.
    fn steps(rungs: &[u8]) -> Vec<(usize, u8)> {
        (1..rungs.len())
            .filter(|&i| rungs[i] != rungs[i - 1])
            .map(|i| (i, rungs[i]))
            .collect()
    }

    #[test]
    fn steady_overload_holds_rung_five_without_flapping_and_recovery_follows_the_demand() {
        // Full at 4 in flight, rung 5 admits 4 (= full, the default rule), the queue signal
        // out of the way. Requests stay 10 ticks (2.5 s); recovery holds 10 s = 40 ticks.
        let mut sim = Sim::new(AdmissionConfig {
            ladder: Some(LadderConfig {
                inflight_full: 4,
                queue_full: 1000,
                shed_admit_inflight: 4,
                ..wide()
            }),
            tick: None,
            ..AdmissionConfig::default()
        });
        // 1. Ten minutes of 5x overload (demand 20 in flight): down to rung 5 within a few
        //    ticks, then rung 5 for good, the engine kept at its limit, the rest shed.
        let rungs = sim.run(2400, 2.0, 10);
        let entered = rungs.iter().position(|r| *r == 5).unwrap();
        assert!(entered < 10, "entered rung 5 at tick {entered}");
        assert_eq!(
            changes(&rungs[entered..]),
            0,
            "flapping: {:?}",
            steps(&rungs)
        );
        assert_eq!(sim.a.inflight(), 4);
        // Served at rung 5: 4 requests per 10 ticks, ~0.4 per tick.
        let served = sim.admitted;
        assert!((900..=1000).contains(&served), "admitted {served}");
        // 2. Demand 12 in flight (pressure 3.0 with it all admitted): above rung 5's recovery
        //    level (0.6 x 4 = 2.4), so rung 5 holds and keeps shedding the excess.
        let before = sim.shed;
        let rungs = sim.run(1200, 1.2, 10);
        assert!(rungs.iter().all(|r| *r == 5), "{:?}", steps(&rungs));
        assert!(sim.shed > before);
        // 3. Demand 8 (pressure 2.0): below rung 5's recovery level but above rung 4's (1.8):
        //    one climb to rung 4 once the shed demand has decayed, then rung 4 for good (it
        //    admits everything: 8 in flight, pressure 2.0 < rung 5's 4.0).
        let rungs = sim.run(2400, 0.8, 10);
        assert_eq!(changes(&rungs), 1, "{:?}", steps(&rungs));
        let climbed = rungs.iter().position(|r| *r == 4).unwrap();
        assert!(
            (40..400).contains(&climbed),
            "climbed to rung 4 at tick {climbed}"
        );
        assert_eq!(*rungs.last().unwrap(), 4);
        assert_eq!(sim.a.inflight(), 8);
        // 4. Back to rung 5 by a burst, then a demand at the limit itself (4 in flight): the
        //    work admitted at rung 5 does not hold it there; the ladder climbs one rung per
        //    hold to rung 2, where pressure 1.0 stays above rung 2's recovery level (0.9).
        sim.run(20, 4.0, 10);
        assert_eq!(sim.a.current_rung(), 5);
        let rungs = sim.run(2400, 0.4, 10);
        assert_eq!(
            changes(&rungs),
            3,
            "5 -> 2 one at a time: {:?}",
            steps(&rungs)
        );
        assert_eq!(*rungs.last().unwrap(), 2);
        // 5. Idle: back to rung 0.
        let rungs = sim.run(400, 0.0, 10);
        assert_eq!(*rungs.last().unwrap(), 0);
    }

    #[test]
    fn the_controller_reads_admission_load() {
        let a = Admission::new(AdmissionMetrics::default(), manual(true));
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
