//! The degradation-ladder controller (DESIGN.md §6): pure logic over load observations, driven
//! by a clock the caller passes in (so tests replay synthetic load with a fake clock).
//!
//! Every observation folds the load signals into one *pressure* number: the largest of
//! in-flight work, queue depth, KV-cache use and the queue-wait EWMA, each divided by its
//! configured "full" level (pressure 1.0 = one signal at its full level). Rung `r` (1..=5) is
//! entered as soon as one observation reaches `step_down[r - 1]` (down fast, possibly several
//! rungs at once). The controller climbs back one rung at a time, and only after the pressure
//! has stayed below `recover_ratio × step_down[rung - 1]` for `recover_hold` without a break
//! (up slowly). The gap between the two thresholds is the hysteresis: a steady load sitting at a
//! threshold moves the ladder once and then holds it there.
//!
//! Rung 5 sheds only the excess: admission still admits interactive requests while fewer than
//! [`LadderConfig::shed_admit_inflight`] are in flight. Two rules keep that from fighting the
//! recovery logic:
//!
//! - the limit is below rung 5's recovery level ([`LadderConfig::check`]), so the work admitted
//!   at rung 5 cannot by itself hold the ladder at rung 5 once the demand is gone;
//! - the in-flight signal counts the demand that was shed ([`Signals::shed_ratio`], from
//!   [`ShedDemand`]): by Little's law, `inflight × (1 + shed/admitted)` is what would be in
//!   flight had the shed requests been admitted. A steady overload therefore keeps rung 5 (the
//!   ladder does not climb to rung 4, admit the excess and fall back to 5 every hold period),
//!   and a demand that rung 4 can carry lets it climb once and stay.

use std::time::{Duration, Instant};

/// The highest rung (shed: everything when forced or pinned, the excess when the load put the
/// ladder there).
pub const MAX_RUNG: u8 = 5;

/// Rung 4's (and the load-driven rung 5's) default wait limit before the first token
/// (`queue_deadline_ms`). It must exceed the unloaded time to first token of a full RAG prompt
/// on the target box (~37 s for a 6-chunk prompt with SmolLM2 on the 2-core dev box), or a lone
/// user is answered 504.
pub const DEFAULT_QUEUE_DEADLINE: Duration = Duration::from_secs(120);

/// The controller's tuning (all from configuration; see `docs/operations/capacity.md`).
#[derive(Debug, Clone, PartialEq)]
pub struct LadderConfig {
    /// In-flight model-bound requests that count as full load (pressure 1.0).
    pub inflight_full: usize,
    /// Requests waiting for an engine (admission queue + engine queues) that count as full load.
    pub queue_full: usize,
    /// Fraction of the engines' KV-cache budget in use that counts as full load.
    pub kv_full: f64,
    /// Queue-wait EWMA that counts as full load. The wait is pure queueing: from the submission
    /// to the engine until the engine admits the sequence into its running batch (the prompt's
    /// own prefill is not part of it), so an unloaded appliance waits ~0.
    pub wait_full: Duration,
    /// Pressure at which rungs 1, 2, 3, 4 and 5 are entered (strictly increasing).
    pub step_down: [f64; MAX_RUNG as usize],
    /// The ladder climbs from rung `r` when pressure stays below `recover_ratio × step_down[r-1]`.
    pub recover_ratio: f64,
    /// How long the pressure must stay below the recovery threshold before climbing one rung;
    /// also the time constant of the shed-demand estimate ([`ShedDemand`]).
    pub recover_hold: Duration,
    /// Weight of the newest queue-wait sample in the EWMA (0 < alpha ≤ 1).
    pub ewma_alpha: f64,
    /// Rung 5 (when the load put the ladder there) still admits an interactive request while
    /// fewer than this many admitted model-bound requests are in flight, and sheds the rest.
    /// Must stay below rung 5's recovery level ([`LadderConfig::max_shed_admit_inflight`]).
    pub shed_admit_inflight: usize,
}

impl Default for LadderConfig {
    fn default() -> Self {
        LadderConfig {
            // Sized by `cargo bench -p airlock --bench load` on the reference box (2 vCPU,
            // SmolLM2; docs/benchmarks/ladder.md): its engine shares the cores between
            // everything admitted, and two requests in flight are what it serves within the
            // TTFT objective. A bigger engine raises this (about the requests it serves at
            // once within the objective).
            inflight_full: 2,
            queue_full: 8,
            kv_full: 0.85,
            // Pure queueing before the engine starts a prompt: an idle appliance waits ~0 (the
            // ~37 s a lone RAG answer takes to its first token on the 2-core box is prefill,
            // not queueing, and no longer counts), so 2 s of queueing already means overload;
            // rung 5 is entered at an EWMA of 8 s.
            wait_full: Duration::from_secs(2),
            step_down: [1.0, 1.5, 2.0, 3.0, 4.0],
            recover_ratio: 0.6,
            // Measured with the 4x-overload bench on the reference box (5 s: rung 5 is left
            // about two holds after the excess ends).
            recover_hold: Duration::from_secs(5),
            ewma_alpha: 0.3,
            // 1.5 x inflight_full: rung 5 keeps the engine a little above its full level
            // and sheds the rest (measured best on the reference box: 3 in flight kept 101% of
            // the saturation goodput at 4x, 2 kept 81%).
            shed_admit_inflight: 3,
        }
    }
}

/// The largest `n` with `n / full < bound`.
fn largest_below(full: usize, bound: f64) -> usize {
    let ratio = |n: usize| n as f64 / full as f64;
    let mut n = (bound * full as f64).ceil().max(0.0) as usize;
    while n > 0 && ratio(n) >= bound {
        n -= 1;
    }
    n
}

impl LadderConfig {
    /// The pressure below which rung 5 starts its calm period.
    pub fn rung5_recover_level(&self) -> f64 {
        self.recover_ratio * self.step_down[usize::from(MAX_RUNG) - 1]
    }

    /// The largest rung-5 in-flight limit whose admitted work stays below rung 5's recovery
    /// level on both the in-flight and the queue signal (every admitted request may be waiting
    /// for the engine), so that the work rung 5 admits cannot by itself hold rung 5. 0 when even
    /// one request would.
    pub fn max_shed_admit_inflight(&self) -> usize {
        let level = self.rung5_recover_level();
        largest_below(self.inflight_full.max(1), level)
            .min(largest_below(self.queue_full.max(1), level))
    }

    /// The default rung-5 in-flight limit for these levels: 1.5 × `inflight_full`, rounded up
    /// (rung 5 keeps the engine a little above its full level), lowered to
    /// [`LadderConfig::max_shed_admit_inflight`] if the thresholds need it.
    pub fn default_shed_admit_inflight(&self) -> usize {
        (self.inflight_full * 3)
            .div_ceil(2)
            .min(self.max_shed_admit_inflight())
    }

    /// Checks the ranges; the message names what is wrong.
    pub fn check(&self) -> Result<(), String> {
        if self.inflight_full == 0 || self.queue_full == 0 {
            return Err("ladder full levels must be at least 1".into());
        }
        if !(self.kv_full > 0.0 && self.kv_full <= 1.0) {
            return Err("ladder KV full level must be in (0, 1]".into());
        }
        if self.wait_full.is_zero() {
            return Err("ladder wait full level must be positive".into());
        }
        if !self.step_down.iter().all(|t| t.is_finite() && *t > 0.0)
            || !self.step_down.windows(2).all(|w| w[0] < w[1])
        {
            return Err("ladder step-down thresholds must be positive and increasing".into());
        }
        if !(self.recover_ratio > 0.0 && self.recover_ratio < 1.0) {
            return Err("ladder recover ratio must be in (0, 1)".into());
        }
        if !(self.ewma_alpha > 0.0 && self.ewma_alpha <= 1.0) {
            return Err("ladder EWMA alpha must be in (0, 1]".into());
        }
        let max = self.max_shed_admit_inflight();
        if max == 0 {
            return Err(format!(
                "one request in flight already holds rung 5 (its recovery level is {:.2} x the \
                 full levels): raise the last step-down threshold or the recover ratio",
                self.rung5_recover_level()
            ));
        }
        if !(1..=max).contains(&self.shed_admit_inflight) {
            return Err(format!(
                "the rung-5 in-flight limit (ladder_shed_admit_inflight) is {}, it must be \
                 between 1 and {max}: above that, the work admitted at rung 5 alone reaches \
                 rung 5's recovery level ({:.2} x ladder_inflight_full or ladder_queue_full) \
                 and the ladder never leaves rung 5",
                self.shed_admit_inflight,
                self.rung5_recover_level()
            ));
        }
        Ok(())
    }
}

/// One observation of the load.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Signals {
    /// Admitted model-bound requests not yet finished.
    pub inflight: usize,
    /// Requests waiting for an engine (the larger of admission's and the engines' counts).
    pub queued: usize,
    /// KV-cache bytes in use over the engines' KV budget (0..=1).
    pub kv_fraction: f64,
    /// EWMA of the queue wait (submission → engine admission), if any sample exists.
    pub wait_ewma: Option<Duration>,
    /// Requests the load-driven rung 5 shed as excess per request admitted, over about the last
    /// `recover_hold` ([`ShedDemand::ratio`]; 0 when nothing was shed). The in-flight signal
    /// counts `inflight × (1 + shed_ratio)`: the work that would be in flight had the shed
    /// requests been admitted.
    pub shed_ratio: f64,
}

/// A rung change.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Transition {
    /// The rung before.
    pub from: u8,
    /// The rung after.
    pub to: u8,
    /// The pressure that caused it.
    pub pressure: f64,
}

/// The controller state.
#[derive(Debug, Clone)]
pub struct Ladder {
    config: LadderConfig,
    rung: u8,
    calm_since: Option<Instant>,
}

impl Ladder {
    /// A controller at rung 0.
    pub fn new(config: LadderConfig) -> Self {
        Ladder {
            config,
            rung: 0,
            calm_since: None,
        }
    }

    /// The tuning.
    pub fn config(&self) -> &LadderConfig {
        &self.config
    }

    /// The current rung.
    pub fn rung(&self) -> u8 {
        self.rung
    }

    /// Puts the controller at `rung` (an operator's override); it moves on from there.
    pub fn force(&mut self, rung: u8) {
        self.rung = rung.min(MAX_RUNG);
        self.calm_since = None;
    }

    /// The pressure of `s`: the largest signal relative to its full level. The in-flight
    /// signal includes the demand rung 5 shed (`inflight × (1 + shed_ratio)`).
    pub fn pressure(&self, s: &Signals) -> f64 {
        let c = &self.config;
        let wait = s
            .wait_ewma
            .map_or(0.0, |w| w.as_secs_f64() / c.wait_full.as_secs_f64());
        let demand = s.inflight as f64 * (1.0 + s.shed_ratio.max(0.0));
        [
            demand / c.inflight_full as f64,
            s.queued as f64 / c.queue_full as f64,
            s.kv_fraction / c.kv_full,
            wait,
        ]
        .into_iter()
        .fold(0.0, f64::max)
    }

    /// The rung a pressure calls for when descending.
    pub fn target(&self, pressure: f64) -> u8 {
        self.config
            .step_down
            .iter()
            .take_while(|t| pressure >= **t)
            .count() as u8
    }

    /// Feeds one observation taken at `now`; returns the transition it caused, if any.
    pub fn observe(&mut self, s: &Signals, now: Instant) -> Option<Transition> {
        let pressure = self.pressure(s);
        let from = self.rung;
        let target = self.target(pressure);
        if target > self.rung {
            self.rung = target;
            self.calm_since = None;
            return Some(Transition {
                from,
                to: target,
                pressure,
            });
        }
        if self.rung == 0 {
            return None;
        }
        let recover_below =
            self.config.recover_ratio * self.config.step_down[usize::from(self.rung) - 1];
        if pressure >= recover_below {
            self.calm_since = None;
            return None;
        }
        let since = *self.calm_since.get_or_insert(now);
        if now.saturating_duration_since(since) >= self.config.recover_hold {
            self.rung -= 1;
            // The next rung up needs its own full calm period.
            self.calm_since = Some(now);
            return Some(Transition {
                from,
                to: self.rung,
                pressure,
            });
        }
        None
    }
}

/// How much demand the load-driven rung 5 turned away, relative to what it admitted: two
/// exponentially decaying counts (time constant `tau`, the ladder's `recover_hold`) of admitted
/// requests and of requests shed as excess. Their ratio scales the in-flight signal
/// ([`Signals::shed_ratio`]): with the same mean time in flight, admitted work `a` per second
/// keeps `inflight` requests in flight, so `a + s` per second would keep
/// `inflight × (a + s) / a` (Little's law). The counts decay when nothing happens, so a
/// finished overload is forgotten within a few `tau`.
#[derive(Debug, Clone)]
pub struct ShedDemand {
    tau: f64,
    admitted: f64,
    shed: f64,
}

impl ShedDemand {
    /// Empty counts decaying with time constant `tau` (at least 1 ms).
    pub fn new(tau: Duration) -> Self {
        ShedDemand {
            tau: tau.as_secs_f64().max(1e-3),
            admitted: 0.0,
            shed: 0.0,
        }
    }

    /// Adds what happened during the last `dt`: `admitted` requests admitted (at any rung) and
    /// `shed` requests shed as excess by the load-driven rung 5.
    pub fn update(&mut self, admitted: u64, shed: u64, dt: Duration) {
        let keep = (-dt.as_secs_f64() / self.tau).exp();
        self.admitted = self.admitted * keep + admitted as f64;
        self.shed = self.shed * keep + shed as f64;
        for v in [&mut self.admitted, &mut self.shed] {
            if *v < 1e-3 {
                *v = 0.0;
            }
        }
    }

    /// Shed requests per admitted request in the recent past (0 when none were shed). Fewer
    /// than one admission in the window counts as one, so the ratio stays finite while the
    /// engine admits nothing (it is still large: rung 5 holds).
    pub fn ratio(&self) -> f64 {
        if self.shed == 0.0 {
            0.0
        } else {
            self.shed / self.admitted.max(1.0)
        }
    }
}

/// An exponentially weighted moving average of durations that decays toward zero when idle.
#[derive(Debug, Clone)]
pub struct Ewma {
    alpha: f64,
    value: Option<f64>,
    fresh: bool,
}

impl Ewma {
    /// An empty average with weight `alpha` for new samples.
    pub fn new(alpha: f64) -> Self {
        Ewma {
            alpha,
            value: None,
            fresh: false,
        }
    }

    /// Adds a sample. An empty average starts from zero (an idle appliance), not from its first
    /// sample: one cold or unusually long first request must not read as sustained overload
    /// (it sent the 2-core demo to rung 4 for ~40 s with a single user).
    pub fn record(&mut self, sample: Duration) {
        let x = sample.as_secs_f64();
        let v = self.value.unwrap_or(0.0);
        self.value = Some(v + self.alpha * (x - v));
        self.fresh = true;
    }

    /// Called once per controller tick: when nothing was recorded since the last tick and
    /// nothing is waiting, the average decays (an idle appliance must not keep an old latency).
    pub fn tick(&mut self, idle: bool) {
        if !self.fresh && idle {
            self.value = self.value.map(|v| v * (1.0 - self.alpha));
            if self.value.is_some_and(|v| v < 1e-4) {
                self.value = None;
            }
        }
        self.fresh = false;
    }

    /// The current average.
    pub fn get(&self) -> Option<Duration> {
        self.value.map(Duration::from_secs_f64)
    }
}

/// The thresholds the controller's unit tests were written against (the pre-benchmark defaults:
/// an engine that serves 16 requests at once within the objective), so they keep testing the
/// controller's logic whatever the shipped defaults are sized for.
#[cfg(test)]
pub(crate) fn wide() -> LadderConfig {
    LadderConfig {
        inflight_full: 16,
        shed_admit_inflight: 16,
        recover_hold: Duration::from_secs(10),
        ..LadderConfig::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q(queued: usize) -> Signals {
        Signals {
            queued,
            ..Signals::default()
        }
    }

    #[test]
    fn pressure_is_the_worst_signal() {
        let l = Ladder::new(wide());
        let s = Signals {
            inflight: 8,
            queued: 4,
            kv_fraction: 0.85 * 1.2,
            wait_ewma: Some(Duration::from_secs(2)),
            shed_ratio: 0.0,
        };
        assert!((l.pressure(&s) - 1.2).abs() < 1e-9);
        assert_eq!(l.target(0.99), 0);
        assert_eq!(l.target(1.0), 1);
        assert_eq!(l.target(2.5), 3);
        assert_eq!(l.target(100.0), 5);
    }

    #[test]
    fn one_observation_descends_several_rungs() {
        let mut l = Ladder::new(wide());
        let t0 = Instant::now();
        let t = l.observe(&q(8 * 3), t0).unwrap();
        assert_eq!((t.from, t.to), (0, 4));
    }

    #[test]
    fn climbs_one_rung_per_calm_hold() {
        let cfg = wide();
        let hold = cfg.recover_hold;
        let mut l = Ladder::new(cfg);
        let t0 = Instant::now();
        l.observe(&q(40), t0);
        assert_eq!(l.rung(), 5);
        l.observe(&q(0), t0 + Duration::from_secs(1));
        assert_eq!(l.rung(), 5, "no climb before the hold");
        l.observe(&q(0), t0 + Duration::from_secs(1) + hold);
        assert_eq!(l.rung(), 4);
        l.observe(&q(0), t0 + Duration::from_secs(2) + hold);
        assert_eq!(l.rung(), 4, "each rung needs its own hold");
        l.observe(&q(0), t0 + Duration::from_secs(1) + hold * 2);
        assert_eq!(l.rung(), 3);
    }

    #[test]
    fn a_spike_restarts_the_calm_period() {
        let mut l = Ladder::new(wide());
        let t0 = Instant::now();
        l.observe(&q(8), t0);
        assert_eq!(l.rung(), 1);
        l.observe(&q(0), t0 + Duration::from_secs(1));
        // Not over a step-down threshold, but above the recovery one: the calm period restarts.
        l.observe(&q(6), t0 + Duration::from_secs(9));
        l.observe(&q(0), t0 + Duration::from_secs(12));
        assert_eq!(l.rung(), 1);
        l.observe(&q(0), t0 + Duration::from_secs(22));
        assert_eq!(l.rung(), 0);
    }

    #[test]
    fn ewma_tracks_and_decays_when_idle() {
        let mut e = Ewma::new(0.5);
        assert_eq!(e.get(), None);
        // Starts from zero: 0 + 0.5·(2 − 0) = 1, then 1 + 0.5·(4 − 1) = 2.5.
        e.record(Duration::from_secs(2));
        assert_eq!(e.get(), Some(Duration::from_secs(1)));
        e.record(Duration::from_secs(4));
        assert_eq!(e.get(), Some(Duration::from_secs_f64(2.5)));
        e.tick(true);
        assert_eq!(
            e.get(),
            Some(Duration::from_secs_f64(2.5)),
            "fresh samples do not decay"
        );
        e.tick(false);
        assert_eq!(
            e.get(),
            Some(Duration::from_secs_f64(2.5)),
            "work waiting: no decay"
        );
        e.tick(true);
        assert_eq!(e.get(), Some(Duration::from_secs_f64(1.25)));
        for _ in 0..40 {
            e.tick(true);
        }
        assert_eq!(e.get(), None);
    }

    #[test]
    fn shed_demand_scales_the_inflight_signal() {
        let l = Ladder::new(wide());
        let s = Signals {
            inflight: 16,
            shed_ratio: 3.0,
            ..Signals::default()
        };
        // 16 in flight while three times as many were shed as admitted: 64 would be in flight.
        assert!((l.pressure(&s) - 4.0).abs() < 1e-9);
        assert_eq!(l.target(l.pressure(&s)), 5);
        let idle = Signals {
            shed_ratio: 3.0,
            ..Signals::default()
        };
        assert_eq!(l.pressure(&idle), 0.0, "nothing in flight: no demand left");
    }

    #[test]
    fn shed_demand_is_a_ratio_that_decays() {
        let mut d = ShedDemand::new(Duration::from_secs(10));
        assert_eq!(d.ratio(), 0.0);
        d.update(4, 12, Duration::ZERO);
        assert!((d.ratio() - 3.0).abs() < 1e-9);
        // One time constant later the old counts weigh e^-1; new admissions dilute the sheds.
        d.update(4, 0, Duration::from_secs(10));
        let e = (-1.0f64).exp();
        assert!((d.ratio() - 12.0 * e / (4.0 * e + 4.0)).abs() < 1e-9);
        // Nothing admitted for long: the ratio stays finite (fewer than one admission counts
        // as one) and large.
        let mut stuck = ShedDemand::new(Duration::from_secs(10));
        stuck.update(0, 20, Duration::from_millis(250));
        assert_eq!(stuck.ratio(), 20.0);
        for _ in 0..1000 {
            d.update(0, 0, Duration::from_secs(1));
        }
        assert_eq!(d.ratio(), 0.0, "a finished overload is forgotten");
    }

    #[test]
    fn the_rung_five_limit_stays_below_the_recovery_level() {
        let c = wide();
        // Recovery from rung 5 below 0.6 x 4 = 2.4 x full: 38 of 16 in flight, 19 of 8 queued.
        assert_eq!(c.max_shed_admit_inflight(), 19);
        assert_eq!(
            c.default_shed_admit_inflight(),
            19,
            "1.5 x 16 = 24, lowered to the maximum"
        );
        let small = LadderConfig {
            inflight_full: 1,
            ..wide()
        };
        assert_eq!(small.max_shed_admit_inflight(), 2, "2/1 < 2.4 <= 3/1");
        assert_eq!(
            small.default_shed_admit_inflight(),
            2,
            "1.5 x 1, rounded up"
        );
        // Exactly at the level is not below it: 0.5 x 4 = 2.0 x 5 full = 10 is refused.
        let exact = LadderConfig {
            inflight_full: 5,
            queue_full: 100,
            recover_ratio: 0.5,
            ..wide()
        };
        assert_eq!(exact.max_shed_admit_inflight(), 9);
        for (n, ok) in [(0, false), (1, true), (19, true), (20, false)] {
            let c = LadderConfig {
                shed_admit_inflight: n,
                ..wide()
            };
            assert_eq!(c.check().is_ok(), ok, "limit {n}: {:?}", c.check());
        }
        let hopeless = LadderConfig {
            inflight_full: 1,
            step_down: [0.1, 0.2, 0.3, 0.4, 0.5],
            recover_ratio: 0.5,
            shed_admit_inflight: 1,
            ..wide()
        };
        assert_eq!(hopeless.max_shed_admit_inflight(), 0);
        assert!(hopeless.check().unwrap_err().contains("one request"));
    }

    #[test]
    fn config_checks() {
        wide().check().unwrap();
        let bad = LadderConfig {
            step_down: [1.0, 1.0, 2.0, 3.0, 4.0],
            ..wide()
        };
        assert!(bad.check().is_err());
        let bad = LadderConfig {
            recover_ratio: 1.0,
            ..wide()
        };
        assert!(bad.check().is_err());
    }

    #[test]
    fn the_defaults_are_the_measured_box_profile() {
        let d = LadderConfig::default();
        d.check().unwrap();
        // docs/benchmarks/ladder.md: 2 in flight = full, 3 admitted at rung 5 (4x: 101% of the
        // saturation goodput), a 5 s calm period.
        assert_eq!((d.inflight_full, d.shed_admit_inflight), (2, 3));
        assert_eq!(d.recover_hold, Duration::from_secs(5));
        assert_eq!(d.shed_admit_inflight, d.default_shed_admit_inflight());
        assert!(d.shed_admit_inflight <= d.max_shed_admit_inflight());
    }
}
