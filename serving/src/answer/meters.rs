//! The metric handles the answer core counts with. The binary registers them in its Prometheus
//! registry (names, help and order are its own) and hands over clones: the core only counts.

use std::sync::Arc;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::histogram::Histogram;

use crate::rack_metrics::RackMetrics;

/// What an answer counts (cheap to clone: every handle is an `Arc` inside).
#[derive(Clone)]
pub struct AnswerMetrics {
    /// `airlock_ttft_seconds`: time from request to the first generated token.
    pub ttft: Histogram,
    /// `airlock_tpot_seconds`: time per output token after the first.
    pub tpot: Histogram,
    /// `airlock_no_source_answers_total`: answers given without generation because no
    /// readable source was relevant enough.
    pub no_source_answers: Counter,
    /// `airlock_unsupported_answers_total`: generated answers whose own content no source
    /// supports (counted by the route, which finds the cited sources).
    pub unsupported_answers: Counter,
    /// `airlock_generation_cancelled_total`: sequences cancelled because the client went away.
    pub cancelled: Counter,
    /// `airlock_generated_tokens_total`.
    pub generated_tokens: Counter,
    /// `airlock_prompt_tokens_total`.
    pub prompt_tokens: Counter,
    /// The inference rack's metrics (tokens by backend, sheds, fallbacks).
    pub rack: RackMetrics,
    /// Where the answer path reports its counts (the re-check, source selection) and its
    /// stages' durations (`airlock_retrieval_stage_seconds{stage}`, also `first_token`,
    /// `queue_wait` and `prefill` of a generation).
    pub meter: Arc<dyn airlock_rag::Meter + Send + Sync>,
}
