//! Admission's settings as the operator gives them (flags, environment, TOML keys of the root
//! file): the per-role quotas, the ladder's tuning and the shedding limits; defaults applied by
//! the accessors, values checked by [`AdmissionSettings::validate`].

use std::time::Duration;

use crate::ladder::{DEFAULT_QUEUE_DEADLINE, LadderConfig, MAX_RUNG};
use crate::quota::{Limits, QuotaConfig};

/// Admission's section. Every field is an `Option` so that layering can tell "not given" from
/// "given the default" (each is documented on the root configuration's flag of the same name).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct AdmissionSettings {
    /// Model-bound requests one user may make per minute; 0 = none [default: 0].
    pub user_requests_per_minute: Option<u32>,
    /// Model tokens one ordinary user may use per minute; 0 = unlimited [default: 0].
    pub user_tokens_per_minute: Option<u32>,
    /// Model-bound requests per minute for admins; 0 = unlimited [default: 0].
    pub admin_requests_per_minute: Option<u32>,
    /// Model tokens per minute for admins; 0 = unlimited [default: 0].
    pub admin_tokens_per_minute: Option<u32>,
    /// Whether the load-driven ladder runs [default: true].
    pub ladder: Option<bool>,
    /// In-flight requests that count as full load.
    pub ladder_inflight_full: Option<usize>,
    /// Requests waiting for the engine that count as full load.
    pub ladder_queue_full: Option<usize>,
    /// Share of the KV-cache budget in use that counts as full load.
    pub ladder_kv_full: Option<f64>,
    /// Queue-wait EWMA (ms) that counts as full load.
    pub ladder_wait_full_ms: Option<u64>,
    /// Pressures at which rungs 1..=5 are entered (five, increasing).
    pub ladder_step_down: Option<Vec<f64>>,
    /// Climb from rung r below this times rung r's threshold.
    pub ladder_recover_ratio: Option<f64>,
    /// Seconds the pressure must stay low before climbing one rung.
    pub ladder_recover_hold_secs: Option<u64>,
    /// Milliseconds between two load observations [default: 250].
    pub ladder_tick_ms: Option<u64>,
    /// The load-driven rung 5's in-flight limit for interactive requests.
    pub ladder_shed_admit_inflight: Option<usize>,
    /// Rungs 4 and 5: wait for the first token before 504 (ms).
    pub queue_deadline_ms: Option<u64>,
    /// `Retry-After` of a shed response [default: 5].
    pub shed_retry_after_secs: Option<u64>,
    /// Batch requests are shed from this rung on [default: 3].
    pub batch_shed_rung: Option<u8>,
}

impl AdmissionSettings {
    /// Checks every value; the error names the setting.
    pub fn validate(&self) -> Result<(), (&'static str, String)> {
        if self.ladder_step_down.as_ref().is_some_and(|v| v.len() != 5) {
            return Err((
                "ladder_step_down",
                "needs exactly five thresholds (rungs 1 to 5)".into(),
            ));
        }
        // The other ladder settings first (with the rung-5 limit they would default to), then
        // the limit as given, so the error names the setting at fault.
        let ladder = self.ladder_config();
        LadderConfig {
            shed_admit_inflight: ladder.default_shed_admit_inflight(),
            ..ladder.clone()
        }
        .check()
        .map_err(|reason| ("ladder", reason))?;
        ladder
            .check()
            .map_err(|reason| ("ladder_shed_admit_inflight", reason))?;
        for (field, v) in [
            ("ladder_tick_ms", self.ladder_tick_ms),
            ("queue_deadline_ms", self.queue_deadline_ms),
            ("shed_retry_after_secs", self.shed_retry_after_secs),
            ("ladder_recover_hold_secs", self.ladder_recover_hold_secs),
        ] {
            if v == Some(0) {
                return Err((field, "must be at least 1".into()));
            }
        }
        if !(1..=MAX_RUNG).contains(&self.batch_shed_rung()) {
            return Err(("batch_shed_rung", "must be between 1 and 5".into()));
        }
        Ok(())
    }

    /// Per-user budget of model-bound requests per minute (0 = none).
    pub fn user_requests_per_minute(&self) -> u32 {
        self.user_requests_per_minute.unwrap_or(0)
    }

    /// Per-role quotas (requests and model tokens per minute; 0 = unlimited).
    pub fn quotas(&self) -> QuotaConfig {
        QuotaConfig {
            user: Limits {
                requests_per_minute: self.user_requests_per_minute(),
                tokens_per_minute: self.user_tokens_per_minute.unwrap_or(0),
            },
            admin: Limits {
                requests_per_minute: self.admin_requests_per_minute.unwrap_or(0),
                tokens_per_minute: self.admin_tokens_per_minute.unwrap_or(0),
            },
        }
    }

    /// Whether the load-driven ladder runs.
    pub fn ladder_enabled(&self) -> bool {
        self.ladder.unwrap_or(true)
    }

    /// The ladder controller's tuning (defaults where unset; a wrong-length step list is
    /// refused by [`AdmissionSettings::validate`] and replaced by the default here).
    pub fn ladder_config(&self) -> LadderConfig {
        let d = LadderConfig::default();
        let c = LadderConfig {
            inflight_full: self.ladder_inflight_full.unwrap_or(d.inflight_full),
            queue_full: self.ladder_queue_full.unwrap_or(d.queue_full),
            kv_full: self.ladder_kv_full.unwrap_or(d.kv_full),
            wait_full: self
                .ladder_wait_full_ms
                .map_or(d.wait_full, Duration::from_millis),
            step_down: self
                .ladder_step_down
                .as_deref()
                .and_then(|v| <[f64; 5]>::try_from(v).ok())
                .unwrap_or(d.step_down),
            recover_ratio: self.ladder_recover_ratio.unwrap_or(d.recover_ratio),
            recover_hold: self
                .ladder_recover_hold_secs
                .map_or(d.recover_hold, Duration::from_secs),
            ewma_alpha: d.ewma_alpha,
            shed_admit_inflight: d.shed_admit_inflight,
        };
        LadderConfig {
            shed_admit_inflight: self
                .ladder_shed_admit_inflight
                .unwrap_or_else(|| c.default_shed_admit_inflight()),
            ..c
        }
    }

    /// Time between two ladder observations.
    pub fn ladder_tick(&self) -> Duration {
        Duration::from_millis(self.ladder_tick_ms.unwrap_or(250))
    }

    /// Rung 4's (and the load-driven rung 5's) wait limit before the first token.
    pub fn queue_deadline(&self) -> Duration {
        self.queue_deadline_ms
            .map_or(DEFAULT_QUEUE_DEADLINE, Duration::from_millis)
    }

    /// `Retry-After` of shed responses.
    pub fn shed_retry_after(&self) -> Duration {
        Duration::from_secs(self.shed_retry_after_secs.unwrap_or(5))
    }

    /// The rung from which batch requests are shed.
    pub fn batch_shed_rung(&self) -> u8 {
        self.batch_shed_rung.unwrap_or(3)
    }
}
