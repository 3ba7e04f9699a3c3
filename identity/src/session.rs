//! Sign-in sessions, what is not HTTP about them: the `[sessions]` lifetimes and the in-memory
//! limits on failed sign-ins. The cookie and the CSRF header are the server's (the appliance's
//! `session`); the sessions themselves (hashed, in SQLite) belong to the ACL
//! (`airlock_acl::session`).

use std::collections::HashMap;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use serde::Deserialize;

/// The session cookie's name.
pub const COOKIE: &str = "airlock_session";

/// `[sessions]`: how long a sign-in lasts.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SessionConfig {
    /// A session unused this long ends [default: 1800 s].
    pub idle_secs: Option<u64>,
    /// A session ends this long after sign-in, used or not [default: 28800 s, 8 h].
    pub absolute_secs: Option<u64>,
}

impl SessionConfig {
    /// The idle lifetime.
    pub fn idle(&self) -> Duration {
        Duration::from_secs(self.idle_secs.unwrap_or(1800))
    }

    /// The absolute lifetime.
    pub fn absolute(&self) -> Duration {
        Duration::from_secs(self.absolute_secs.unwrap_or(28_800))
    }

    /// Checks the ranges: the refused setting and why.
    pub fn validate(&self) -> Result<(), (&'static str, String)> {
        let invalid = |field, reason: &str| (field, reason.to_string());
        if self.idle().is_zero() {
            return Err(invalid("sessions.idle_secs", "must be at least 1"));
        }
        if self.absolute() < self.idle() {
            return Err(invalid(
                "sessions.absolute_secs",
                "must be at least sessions.idle_secs",
            ));
        }
        if self.absolute() > Duration::from_secs(30 * 86_400) {
            return Err(invalid("sessions.absolute_secs", "must be at most 30 days"));
        }
        Ok(())
    }
}

/// Failed sign-ins per username and per client address in a sliding window. A refused attempt
/// (over a limit) is not counted and reaches no directory.
#[derive(Debug, Default)]
pub struct LoginLimiter {
    failures: Mutex<HashMap<String, Vec<Instant>>>,
}

/// Which limit refused an attempt, and when to retry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Refused {
    /// Until the oldest counted failure leaves the window.
    pub retry_after: Duration,
}

impl LoginLimiter {
    fn keys(username: &str, address: &str) -> [String; 2] {
        // Usernames are compared case-insensitively (directories are).
        [
            format!("u:{}", username.to_lowercase()),
            format!("a:{address}"),
        ]
    }

    /// Refuses the attempt if either key reached its limit within `window`.
    pub fn check(
        &self,
        username: &str,
        address: &str,
        limits: (u32, u32),
        window: Duration,
    ) -> Result<(), Refused> {
        let now = Instant::now();
        let mut f = self.failures.lock();
        for (key, limit) in Self::keys(username, address)
            .into_iter()
            .zip([limits.0, limits.1])
        {
            if let Some(v) = f.get_mut(&key) {
                v.retain(|t| now.duration_since(*t) < window);
                if v.len() >= limit as usize {
                    let oldest = v.first().copied().unwrap_or(now);
                    return Err(Refused {
                        retry_after: window.saturating_sub(now.duration_since(oldest)),
                    });
                }
            }
        }
        // Bounded memory: forget keys with no failure left in the window.
        if f.len() > 100_000 {
            f.retain(|_, v| v.iter().any(|t| now.duration_since(*t) < window));
        }
        Ok(())
    }

    /// Counts a failed attempt against both keys.
    pub fn failed(&self, username: &str, address: &str) {
        let now = Instant::now();
        let mut f = self.failures.lock();
        for key in Self::keys(username, address) {
            f.entry(key).or_default().push(now);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_count_failures_per_user_and_address() {
        let l = LoginLimiter::default();
        let w = Duration::from_secs(60);
        for _ in 0..2 {
            assert!(l.check("Alice", "1.2.3.4", (2, 3), w).is_ok());
            l.failed("Alice", "1.2.3.4");
        }
        assert!(l.check("alice", "5.6.7.8", (2, 3), w).is_err(), "per user");
        assert!(l.check("bob", "1.2.3.4", (2, 3), w).is_ok());
        l.failed("bob", "1.2.3.4");
        assert!(
            l.check("carol", "1.2.3.4", (2, 3), w).is_err(),
            "per address"
        );
        assert!(l.check("carol", "9.9.9.9", (2, 3), w).is_ok());
        assert!(
            l.check("x", "1.2.3.4", (2, 3), Duration::ZERO).is_ok(),
            "window"
        );
    }
}
