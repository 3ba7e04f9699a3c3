//! One replica's health and load: requests in flight, the measured time to first token (EWMA)
//! and a circuit breaker on the error share of its recent requests.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use super::engine_metrics::EngineLoad;
use airlock_platform::egress::Upstream;

/// A replica of a remote generator.
#[derive(Debug)]
pub struct Replica {
    /// Its endpoint.
    pub upstream: Upstream,
    /// Its position in `base_urls`.
    pub index: usize,
    inflight: AtomicUsize,
    ttft: Mutex<Option<f64>>,
    breaker: Mutex<Breaker>,
    /// The engine's last good metrics scrape and when it was taken.
    engine: Mutex<Option<(EngineLoad, Instant)>>,
}

/// The breaker's tuning.
#[derive(Debug, Clone, Copy)]
pub struct BreakerConfig {
    /// Error share that opens it.
    pub error_rate: f64,
    /// Outcomes needed before it may open.
    pub min_requests: usize,
    /// Outcomes remembered.
    pub window: usize,
    /// How long it stays open before a trial request.
    pub open_for: Duration,
}

/// Closed (requests flow), open (none until `until`), or half-open (one trial request).
#[derive(Debug)]
struct Breaker {
    config: BreakerConfig,
    /// Recent outcomes, `true` = error.
    outcomes: VecDeque<bool>,
    open_until: Option<Instant>,
    trial_out: bool,
}

/// What the breaker says about a new request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Health {
    /// Requests flow.
    Closed,
    /// No request until the open period ends.
    Open,
    /// The open period is over: one trial request may go.
    Trial,
}

impl Breaker {
    fn health(&self, now: Instant) -> Health {
        match self.open_until {
            None => Health::Closed,
            Some(t) if now < t || self.trial_out => Health::Open,
            Some(_) => Health::Trial,
        }
    }

    fn record(&mut self, error: bool, now: Instant) -> bool {
        if self.open_until.is_some() {
            self.trial_out = false;
            if error {
                self.open_until = Some(now + self.config.open_for);
            } else {
                self.open_until = None;
                self.outcomes.clear();
            }
            return error;
        }
        self.outcomes.push_back(error);
        while self.outcomes.len() > self.config.window {
            self.outcomes.pop_front();
        }
        let n = self.outcomes.len();
        let errors = self.outcomes.iter().filter(|e| **e).count();
        if n >= self.config.min_requests && errors as f64 >= self.config.error_rate * n as f64 {
            self.open_until = Some(now + self.config.open_for);
            self.outcomes.clear();
            return true;
        }
        false
    }
}

impl Replica {
    /// A closed, idle replica.
    pub fn new(upstream: Upstream, index: usize, breaker: BreakerConfig) -> Self {
        Replica {
            upstream,
            index,
            inflight: AtomicUsize::new(0),
            ttft: Mutex::new(None),
            engine: Mutex::new(None),
            breaker: Mutex::new(Breaker {
                config: breaker,
                outcomes: VecDeque::new(),
                open_until: None,
                trial_out: false,
            }),
        }
    }

    /// Requests in flight.
    pub fn inflight(&self) -> usize {
        self.inflight.load(Ordering::SeqCst)
    }

    /// The time-to-first-token EWMA.
    pub fn ttft(&self) -> Option<Duration> {
        self.ttft.lock().map(Duration::from_secs_f64)
    }

    /// The breaker's state.
    pub fn health(&self, now: Instant) -> Health {
        self.breaker.lock().health(now)
    }

    /// Whether the breaker is open (or a trial is out).
    pub fn is_open(&self, now: Instant) -> bool {
        self.health(now) != Health::Closed
    }

    /// When an open breaker lets a trial through.
    pub fn open_remaining(&self, now: Instant) -> Option<Duration> {
        self.breaker
            .lock()
            .open_until
            .map(|t| t.saturating_duration_since(now))
    }

    /// Takes a slot (the caller checked the limit under the pick lock); a half-open breaker
    /// gives its one trial.
    pub(super) fn take(&self, now: Instant) {
        let mut b = self.breaker.lock();
        if b.health(now) == Health::Trial {
            b.trial_out = true;
        }
        self.inflight.fetch_add(1, Ordering::SeqCst);
    }

    /// Gives a slot back.
    pub(super) fn release(&self) {
        self.inflight.fetch_sub(1, Ordering::SeqCst);
    }

    /// Records a request's outcome; returns whether this opened (or re-opened) the breaker.
    pub fn record(&self, error: bool) -> bool {
        self.breaker.lock().record(error, Instant::now())
    }

    /// A request ended without an outcome (the client went away): a trial it held is freed.
    pub fn abandoned(&self) {
        self.breaker.lock().trial_out = false;
    }

    /// Records a scrape of the engine's metrics.
    pub fn set_engine_load(&self, load: EngineLoad, at: Instant) {
        *self.engine.lock() = Some((load, at));
    }

    /// The engine's load from a scrape no older than `max_age`.
    pub fn engine_load(&self, now: Instant, max_age: Duration) -> Option<EngineLoad> {
        self.engine
            .lock()
            .filter(|(_, at)| now.saturating_duration_since(*at) <= max_age)
            .map(|(l, _)| l)
    }

    /// Adds a time-to-first-token sample (EWMA, α = 0.3).
    pub fn observe_ttft(&self, d: Duration) {
        let mut t = self.ttft.lock();
        let s = d.as_secs_f64();
        *t = Some(match *t {
            None => s,
            Some(prev) => 0.7 * prev + 0.3 * s,
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn replica(min: usize) -> Replica {
        Replica::new(
            Upstream::parse("http://127.0.0.1:9/v1").unwrap(),
            0,
            BreakerConfig {
                error_rate: 0.5,
                min_requests: min,
                window: 4,
                open_for: Duration::from_millis(50),
            },
        )
    }

    #[test]
    fn the_breaker_opens_on_the_error_share_and_closes_after_a_good_trial() {
        let r = replica(4);
        let now = Instant::now();
        assert!(!r.record(true));
        assert!(!r.record(false));
        assert!(!r.record(false));
        assert_eq!(r.health(now), Health::Closed);
        // 2 of 4 errors: at the share.
        assert!(r.record(true));
        assert_eq!(r.health(Instant::now()), Health::Open);
        std::thread::sleep(Duration::from_millis(60));
        assert_eq!(r.health(Instant::now()), Health::Trial);
        r.take(Instant::now());
        // The trial is out: nobody else goes.
        assert_eq!(r.health(Instant::now()), Health::Open);
        // A failed trial re-opens it.
        assert!(r.record(true));
        r.release();
        std::thread::sleep(Duration::from_millis(60));
        r.take(Instant::now());
        assert!(!r.record(false));
        r.release();
        assert_eq!(r.health(Instant::now()), Health::Closed);
    }

    #[test]
    fn the_ttft_is_an_ewma() {
        let r = replica(1);
        r.observe_ttft(Duration::from_secs(1));
        r.observe_ttft(Duration::from_secs(2));
        let t = r.ttft().unwrap().as_secs_f64();
        assert!((t - 1.3).abs() < 1e-9, "{t}");
    }
}
