//! Per-user quotas: two token buckets per user, requests per minute and model tokens per minute,
//! with limits per role (API.md: 429 `rate-limited` with `Retry-After`).
//!
//! A bucket holds up to one minute's worth and refills continuously. Requests take one unit at
//! admission. Model tokens are *reserved* before generation (prompt + `max_tokens`, the most the
//! request can cost) and the unused part is refunded when the stream ends, so a burst of long
//! requests cannot overrun the budget while they are still generating. A request larger than the
//! whole bucket is admitted when the bucket is full and leaves it in debt (it would otherwise
//! never run); the debt is repaid by the refill before the user's next request.
//!
//! The implementation is a small float bucket rather than `governor`: governor's GCRA cells
//! cannot hand back a refund, which the reservation needs.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

/// The limits of one role; 0 means unlimited.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Limits {
    /// Model-bound requests per minute.
    pub requests_per_minute: u32,
    /// Model tokens (prompt + completion) per minute.
    pub tokens_per_minute: u32,
}

/// Limits by role.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct QuotaConfig {
    /// Ordinary users.
    pub user: Limits,
    /// Users with the admin role (operators, eval runners).
    pub admin: Limits,
}

impl QuotaConfig {
    fn limits(&self, admin: bool) -> Limits {
        if admin { self.admin } else { self.user }
    }
}

/// Users whose buckets are tracked before full (uninformative) ones are forgotten.
const MAX_TRACKED: usize = 100_000;

#[derive(Debug, Clone, Copy)]
struct Bucket {
    level: f64,
    at: Instant,
}

impl Bucket {
    fn full(cap: u32, now: Instant) -> Self {
        Bucket {
            level: f64::from(cap),
            at: now,
        }
    }

    /// Refills for the time since the last update (rate: `cap` per minute, up to `cap`).
    fn refill(&mut self, cap: u32, now: Instant) {
        let cap = f64::from(cap);
        let dt = now.saturating_duration_since(self.at).as_secs_f64();
        self.level = (self.level + dt * cap / 60.0).min(cap);
        self.at = now;
    }

    /// Takes `n` if available (or, for `n` over the capacity, if the bucket is full); else the
    /// time until it would be.
    fn take(&mut self, cap: u32, n: f64, now: Instant) -> Result<(), Duration> {
        self.refill(cap, now);
        let need = n.min(f64::from(cap));
        if self.level + 1e-9 >= need {
            self.level -= n;
            Ok(())
        } else {
            let rate = f64::from(cap) / 60.0;
            Err(Duration::from_secs_f64((need - self.level) / rate))
        }
    }

    fn is_full(&self, cap: u32, now: Instant) -> bool {
        let mut b = *self;
        b.refill(cap, now);
        b.level >= f64::from(cap)
    }
}

#[derive(Debug, Default)]
struct UserBuckets {
    requests: Option<Bucket>,
    tokens: Option<Bucket>,
}

/// Every user's buckets (cheap to share behind an `Arc`).
#[derive(Debug)]
pub struct Quotas {
    config: QuotaConfig,
    users: Mutex<HashMap<String, UserBuckets>>,
}

impl Quotas {
    /// Quotas with the given limits.
    pub fn new(config: QuotaConfig) -> Self {
        Quotas {
            config,
            users: Mutex::new(HashMap::new()),
        }
    }

    /// The limits.
    pub fn config(&self) -> &QuotaConfig {
        &self.config
    }

    fn with_user<R>(&self, user: &str, now: Instant, f: impl FnOnce(&mut UserBuckets) -> R) -> R {
        let mut users = self.users.lock();
        if users.len() > MAX_TRACKED {
            let c = self.config;
            users.retain(|_, b| {
                // Keep the admin limits' view conservative: a bucket is forgotten only when it
                // is full under both roles' capacities.
                let full = |bucket: &Option<Bucket>, cap: fn(&Limits) -> u32| {
                    bucket.is_none_or(|b| b.is_full(cap(&c.user).max(cap(&c.admin)), now))
                };
                !(full(&b.requests, |l| l.requests_per_minute)
                    && full(&b.tokens, |l| l.tokens_per_minute))
            });
        }
        f(users.entry(user.to_string()).or_default())
    }

    /// Takes one request from `user`'s request bucket, or returns how long until one is free.
    pub fn take_request(&self, user: &str, admin: bool, now: Instant) -> Result<(), Duration> {
        let cap = self.config.limits(admin).requests_per_minute;
        if cap == 0 {
            return Ok(());
        }
        self.with_user(user, now, |b| {
            b.requests
                .get_or_insert_with(|| Bucket::full(cap, now))
                .take(cap, 1.0, now)
        })
    }

    /// Reserves `tokens` model tokens for `user`, or returns how long until they are free.
    /// Settle the reservation with [`TokenReservation::settle`] when the request ends.
    pub fn reserve_tokens(
        self: &Arc<Self>,
        user: &str,
        admin: bool,
        tokens: usize,
        now: Instant,
    ) -> Result<TokenReservation, Duration> {
        let cap = self.config.limits(admin).tokens_per_minute;
        if cap > 0 {
            self.with_user(user, now, |b| {
                b.tokens
                    .get_or_insert_with(|| Bucket::full(cap, now))
                    .take(cap, tokens as f64, now)
            })?;
        }
        Ok(TokenReservation {
            quotas: (cap > 0).then(|| self.clone()),
            user: user.to_string(),
            cap,
            reserved: tokens,
        })
    }

    /// Tokens `user` could reserve right now (for tests and diagnostics; `None` = unlimited).
    pub fn tokens_available(&self, user: &str, admin: bool, now: Instant) -> Option<f64> {
        let cap = self.config.limits(admin).tokens_per_minute;
        if cap == 0 {
            return None;
        }
        Some(self.with_user(user, now, |b| {
            let bucket = b.tokens.get_or_insert_with(|| Bucket::full(cap, now));
            bucket.refill(cap, now);
            bucket.level
        }))
    }
}

/// Tokens reserved for one request. Dropping it without [`settle`](Self::settle) keeps the whole
/// reservation charged.
#[derive(Debug)]
pub struct TokenReservation {
    quotas: Option<Arc<Quotas>>,
    user: String,
    cap: u32,
    reserved: usize,
}

impl TokenReservation {
    /// Tokens reserved.
    pub fn reserved(&self) -> usize {
        self.reserved
    }

    /// Ends the reservation: the request used `used` tokens; the rest goes back to the bucket.
    pub fn settle(mut self, used: usize) {
        let refund = self.reserved.saturating_sub(used);
        if let Some(q) = self.quotas.take()
            && refund > 0
        {
            let cap = self.cap;
            q.with_user(&self.user, Instant::now(), |b| {
                if let Some(bucket) = b.tokens.as_mut() {
                    bucket.level = (bucket.level + refund as f64).min(f64::from(cap));
                }
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn quotas(rpm: u32, tpm: u32) -> Arc<Quotas> {
        Arc::new(Quotas::new(QuotaConfig {
            user: Limits {
                requests_per_minute: rpm,
                tokens_per_minute: tpm,
            },
            admin: Limits::default(),
        }))
    }

    #[test]
    fn requests_per_minute_refill_continuously() {
        let q = quotas(2, 0);
        let t0 = Instant::now();
        q.take_request("a", false, t0).unwrap();
        q.take_request("a", false, t0).unwrap();
        let wait = q.take_request("a", false, t0).unwrap_err();
        assert!((wait.as_secs_f64() - 30.0).abs() < 0.01, "{wait:?}");
        q.take_request("b", false, t0)
            .expect("buckets are per user");
        q.take_request("a", true, t0)
            .expect("admins have their own limits");
        q.take_request("a", false, t0 + Duration::from_secs(31))
            .expect("refilled after 30 s");
    }

    #[test]
    fn tokens_are_reserved_then_refunded() {
        let q = quotas(0, 1000);
        let t0 = Instant::now();
        let r1 = q.reserve_tokens("a", false, 600, t0).unwrap();
        assert_eq!(q.tokens_available("a", false, t0), Some(400.0));
        let wait = q.reserve_tokens("a", false, 600, t0).unwrap_err();
        // 200 missing at 1000/min: 12 s.
        assert!((wait.as_secs_f64() - 12.0).abs() < 0.01, "{wait:?}");
        r1.settle(100);
        let now = q.tokens_available("a", false, t0).unwrap();
        assert!((now - 900.0).abs() < 1.0, "500 refunded: {now}");
        q.reserve_tokens("a", false, 600, t0).unwrap().settle(600);
        let left = q.tokens_available("a", false, t0).unwrap();
        assert!(
            (left - 300.0).abs() < 1.0,
            "fully used: nothing refunded: {left}"
        );
    }

    #[test]
    fn a_dropped_reservation_stays_charged() {
        let q = quotas(0, 1000);
        let t0 = Instant::now();
        drop(q.reserve_tokens("a", false, 700, t0).unwrap());
        assert_eq!(q.tokens_available("a", false, t0), Some(300.0));
    }

    #[test]
    fn oversized_requests_run_from_a_full_bucket_and_leave_debt() {
        let q = quotas(0, 100);
        let t0 = Instant::now();
        q.reserve_tokens("a", false, 250, t0).unwrap().settle(250);
        assert_eq!(q.tokens_available("a", false, t0), Some(-150.0));
        let wait = q.reserve_tokens("a", false, 10, t0).unwrap_err();
        assert!((wait.as_secs_f64() - 96.0).abs() < 0.01, "{wait:?}");
    }

    #[test]
    fn unlimited_roles_do_not_track() {
        let q = quotas(0, 0);
        let t0 = Instant::now();
        for _ in 0..1000 {
            q.take_request("a", false, t0).unwrap();
            q.reserve_tokens("a", false, 1 << 20, t0).unwrap();
        }
        assert_eq!(q.tokens_available("a", false, t0), None);
        assert!(q.users.lock().is_empty());
    }
}
