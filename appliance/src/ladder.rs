//! The degradation-ladder controller (DESIGN.md §6): pure logic over load observations, driven
//! by a clock the caller passes in (so tests replay synthetic load with a fake clock).
//!
//! Every observation folds the load signals into one *pressure* number: the largest of
//! in-flight work, queue depth, KV-cache use and the engine-wait EWMA, each divided by its
//! configured "full" level (pressure 1.0 = one signal at its full level). Rung `r` (1..=5) is
//! entered as soon as one observation reaches `step_down[r - 1]` (down fast, possibly several
//! rungs at once). The controller climbs back one rung at a time, and only after the pressure
//! has stayed below `recover_ratio × step_down[rung - 1]` for `recover_hold` without a break
//! (up slowly). The gap between the two thresholds is the hysteresis: a steady load sitting at a
//! threshold moves the ladder once and then holds it there.

use std::time::{Duration, Instant};

use crate::admission::MAX_RUNG;

/// The controller's tuning (all from configuration; see `docs/OPERATIONS.md`).
#[derive(Debug, Clone, PartialEq)]
pub struct LadderConfig {
    /// In-flight model-bound requests that count as full load (pressure 1.0).
    pub inflight_full: usize,
    /// Requests waiting for an engine (admission queue + engine queues) that count as full load.
    pub queue_full: usize,
    /// Fraction of the engines' KV-cache budget in use that counts as full load.
    pub kv_full: f64,
    /// Engine wait (submit → first token) EWMA that counts as full load.
    pub wait_full: Duration,
    /// Pressure at which rungs 1, 2, 3, 4 and 5 are entered (strictly increasing).
    pub step_down: [f64; MAX_RUNG as usize],
    /// The ladder climbs from rung `r` when pressure stays below `recover_ratio × step_down[r-1]`.
    pub recover_ratio: f64,
    /// How long the pressure must stay below the recovery threshold before climbing one rung.
    pub recover_hold: Duration,
    /// Weight of the newest engine-wait sample in the EWMA (0 < alpha ≤ 1).
    pub ewma_alpha: f64,
}

impl Default for LadderConfig {
    fn default() -> Self {
        LadderConfig {
            inflight_full: 16,
            queue_full: 8,
            kv_full: 0.85,
            // Above the unloaded TTFT of a full RAG prompt on a small box (a 6-chunk prompt
            // with SmolLM2 on the 2-core dev box: ~37 s), so one user's answer never reads as
            // overload; a wait of 4 s sent a single user to rung 4 there.
            wait_full: Duration::from_secs(60),
            step_down: [1.0, 1.5, 2.0, 3.0, 4.0],
            recover_ratio: 0.6,
            recover_hold: Duration::from_secs(10),
            ewma_alpha: 0.3,
        }
    }
}

impl LadderConfig {
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
    /// EWMA of the engine wait (submit → first token), if any sample exists.
    pub wait_ewma: Option<Duration>,
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

    /// The pressure of `s`: the largest signal relative to its full level.
    pub fn pressure(&self, s: &Signals) -> f64 {
        let c = &self.config;
        let wait = s
            .wait_ewma
            .map_or(0.0, |w| w.as_secs_f64() / c.wait_full.as_secs_f64());
        [
            s.inflight as f64 / c.inflight_full as f64,
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
        let l = Ladder::new(LadderConfig::default());
        let s = Signals {
            inflight: 8,
            queued: 4,
            kv_fraction: 0.85 * 1.2,
            wait_ewma: Some(Duration::from_secs(2)),
        };
        assert!((l.pressure(&s) - 1.2).abs() < 1e-9);
        assert_eq!(l.target(0.99), 0);
        assert_eq!(l.target(1.0), 1);
        assert_eq!(l.target(2.5), 3);
        assert_eq!(l.target(100.0), 5);
    }

    #[test]
    fn one_observation_descends_several_rungs() {
        let mut l = Ladder::new(LadderConfig::default());
        let t0 = Instant::now();
        let t = l.observe(&q(8 * 3), t0).unwrap();
        assert_eq!((t.from, t.to), (0, 4));
    }

    #[test]
    fn climbs_one_rung_per_calm_hold() {
        let cfg = LadderConfig::default();
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
        let mut l = Ladder::new(LadderConfig::default());
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
    fn config_checks() {
        LadderConfig::default().check().unwrap();
        let bad = LadderConfig {
            step_down: [1.0, 1.0, 2.0, 3.0, 4.0],
            ..LadderConfig::default()
        };
        assert!(bad.check().is_err());
        let bad = LadderConfig {
            recover_ratio: 1.0,
            ..LadderConfig::default()
        };
        assert!(bad.check().is_err());
    }
}
