//! The inference rack's metrics (`airlock_backend_tokens_total`, `airlock_remote_*`,
//! `airlock_model_fallback_total`): a leaf module, so that both the daemon's metric registry
//! (`metrics.rs`) and the remote generators (`remote/`) use it without importing each other.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
/// Labels `{backend}`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct BackendLabel {
    /// The generator's alias.
    pub backend: String,
}

/// Labels `{backend, replica}`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReplicaLabel {
    /// The generator's alias.
    pub backend: String,
    /// The replica's `host:port`.
    pub replica: String,
}

/// Labels `{backend, kind}`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TokenLabel {
    /// The alias of the generator that produced them (local or remote).
    pub backend: String,
    /// `prompt` or `completion`.
    pub kind: &'static str,
}

/// Labels `{from, reason}`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct FallbackLabel {
    /// The remote generator the request named.
    pub from: String,
    /// `saturated`, `unhealthy` or `failed`.
    pub reason: &'static str,
}

/// The rack's metrics (registered with the daemon's others).
#[derive(Clone)]
pub struct RackMetrics {
    /// `airlock_backend_tokens_total{backend,kind}`.
    pub tokens: Family<TokenLabel, Counter>,
    /// `airlock_model_fallback_total{from,reason}`.
    pub fallbacks: Family<FallbackLabel, Counter>,
    /// `airlock_remote_errors_total{backend,replica}`.
    pub errors: Family<ReplicaLabel, Counter>,
    /// `airlock_remote_breaker_opened_total{backend,replica}`.
    pub breaker_opened: Family<ReplicaLabel, Counter>,
    /// `airlock_remote_breaker_open{backend,replica}`: 1 while open.
    pub breaker_open: Family<ReplicaLabel, Gauge>,
    /// `airlock_remote_inflight{backend,replica}`.
    pub inflight: Family<ReplicaLabel, Gauge>,
    /// `airlock_remote_waiting{backend}`: requests waiting for a replica slot.
    pub waiting: Family<BackendLabel, Gauge>,
    /// `airlock_remote_shed_total{backend}`: refused for saturation or ill health.
    pub shed: Family<BackendLabel, Counter>,
    /// `airlock_remote_retries_total{backend}`.
    pub retries: Family<BackendLabel, Counter>,
    /// `airlock_remote_ttft_seconds{backend}`: request sent → first token.
    pub ttft: Family<BackendLabel, Histogram>,
    /// `airlock_remote_engine_waiting{backend,replica}`: the engine's own waiting count from
    /// its metrics (-1: no fresh scrape).
    pub engine_waiting: Family<ReplicaLabel, Gauge>,
    /// `airlock_remote_engine_running{backend,replica}`: the engine's running count (-1: none).
    pub engine_running: Family<ReplicaLabel, Gauge>,
}

fn ttft_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.005, 2.0, 16))
}

impl Default for RackMetrics {
    fn default() -> Self {
        Self::new()
    }
}

impl RackMetrics {
    /// New, with the TTFT histogram's buckets.
    pub fn new() -> Self {
        RackMetrics {
            tokens: Family::default(),
            fallbacks: Family::default(),
            errors: Family::default(),
            breaker_opened: Family::default(),
            breaker_open: Family::default(),
            inflight: Family::default(),
            waiting: Family::default(),
            shed: Family::default(),
            retries: Family::default(),
            ttft: Family::new_with_constructor(ttft_histogram),
            engine_waiting: Family::default(),
            engine_running: Family::default(),
        }
    }

    /// Registers every family (prefix `airlock_` from the registry).
    pub fn register(&self, r: &mut Registry) {
        r.register(
            "backend_tokens",
            "Model tokens by generator and kind (prompt, completion)",
            self.tokens.clone(),
        );
        r.register(
            "model_fallback",
            "Requests for a remote generator answered by the local small model",
            self.fallbacks.clone(),
        );
        r.register(
            "remote_errors",
            "Failed upstream requests by replica",
            self.errors.clone(),
        );
        r.register(
            "remote_breaker_opened",
            "Circuit-breaker openings by replica",
            self.breaker_opened.clone(),
        );
        r.register(
            "remote_breaker_open",
            "1 while a replica's circuit breaker is open",
            self.breaker_open.clone(),
        );
        r.register(
            "remote_inflight",
            "Requests in flight to each replica",
            self.inflight.clone(),
        );
        r.register(
            "remote_waiting",
            "Requests waiting for a replica slot",
            self.waiting.clone(),
        );
        r.register(
            "remote_shed",
            "Requests refused because the rack was saturated or unhealthy",
            self.shed.clone(),
        );
        r.register(
            "remote_retries",
            "Non-streaming requests retried on another replica (never reached an engine)",
            self.retries.clone(),
        );
        r.register(
            "remote_ttft_seconds",
            "Upstream time to first token (request sent to first content delta)",
            self.ttft.clone(),
        );
        r.register(
            "remote_engine_waiting",
            "Requests waiting in each replica's engine, from its metrics (-1: no fresh scrape)",
            self.engine_waiting.clone(),
        );
        r.register(
            "remote_engine_running",
            "Requests running in each replica's engine, from its metrics (-1: not reported)",
            self.engine_running.clone(),
        );
    }

    /// Counts tokens of one generation.
    pub fn count_tokens(&self, backend: &str, prompt: usize, completion: usize) {
        for (kind, n) in [("prompt", prompt), ("completion", completion)] {
            self.tokens
                .get_or_create(&TokenLabel {
                    backend: backend.to_string(),
                    kind,
                })
                .inc_by(n as u64);
        }
    }
}
