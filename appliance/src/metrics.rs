//! Prometheus metrics (names per API.md), exposed at `GET /metrics` in the text format.
//!
//! Labels carry only bounded, non-sensitive values (route templates, status codes, stage names,
//! bundle version): never prompt, answer or document text, user ids or document ids.

use std::sync::Arc;
use std::sync::atomic::AtomicU64;

use parking_lot::Mutex;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

/// Labels of `airlock_requests_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RouteStatus {
    /// The matched route template (e.g. `/v1/documents/{doc_id}`), or `unmatched`.
    pub route: String,
    /// The response status code.
    pub status: u16,
}

/// Labels of `airlock_request_duration_seconds`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RouteLabel {
    /// The matched route template (e.g. `/v1/documents/{doc_id}`), or `unmatched`.
    pub route: String,
}

/// Labels of `airlock_retrieval_stage_seconds`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct Stage {
    /// The stage name (auth, embed, bm25, vector, fusion, rescore, rerank, recheck, prefill,
    /// first_token).
    pub stage: &'static str,
}

// The ladder's, shedding's and quotas' labels are `airlock-serving`'s (it counts them).
pub use airlock_serving::metrics::{PriorityLabel, QuotaKind, RECENT_SHEDS, RungLabel};

/// Labels of `airlock_feedback_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RatingLabel {
    /// `up` or `down`.
    pub rating: &'static str,
}

/// Labels of `airlock_connections_refused_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct LimitLabel {
    /// `global` (`max_connections`) or `per_ip` (`max_connections_per_ip`).
    pub limit: &'static str,
}

/// Labels of `airlock_bundle_info`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct BundleVersion {
    /// The installed bundle's version.
    pub version: String,
}

/// Every metric the daemon exports. Cheap to clone (all handles are `Arc`s inside).
#[derive(Clone)]
pub struct Metrics {
    registry: Arc<Mutex<Registry>>,
    /// `airlock_requests_total{route,status}`.
    pub requests: Family<RouteStatus, Counter>,
    /// `airlock_request_duration_seconds{route}`: time to the response head, by route template.
    pub request_duration: Family<RouteLabel, Histogram>,
    /// `airlock_iam_sync_last_success_timestamp_seconds`: when the last full IAM sync (snapshot
    /// or directory) was applied, Unix seconds; 0 when none ever was.
    pub iam_sync_last_success: Gauge<f64, AtomicU64>,
    /// `airlock_ttft_seconds`: time from request to the first generated token.
    pub ttft: Histogram,
    /// `airlock_tpot_seconds`: time per output token after the first.
    pub tpot: Histogram,
    /// `airlock_queue_depth`: requests admitted and waiting for the engine.
    pub queue_depth: Gauge,
    /// `airlock_inflight`: HTTP requests being served.
    pub inflight: Gauge,
    /// `airlock_ladder_rung`: the current degradation rung.
    pub ladder_rung: Gauge,
    /// `airlock_rung_transitions_total`.
    pub rung_transitions: Counter,
    /// `airlock_ladder_rung_seconds_total{rung}`: time spent at each rung.
    pub rung_seconds_total: Family<RungLabel, Counter<f64, AtomicU64>>,
    /// `airlock_ladder_pressure`: the controller's last load observation (1.0 = full).
    pub ladder_pressure: Gauge<f64, AtomicU64>,
    /// `airlock_shed_total{priority}`: requests shed by the ladder.
    pub shed_total: Family<PriorityLabel, Counter>,
    /// `airlock_rate_limited_total{quota}`: requests refused by a per-user quota.
    pub rate_limited_total: Family<QuotaKind, Counter>,
    /// `airlock_retrieval_stage_seconds{stage}`.
    pub stage_seconds: Family<Stage, Histogram>,
    /// `airlock_recheck_drops_total`: chunks dropped by the pre-prompt ACL/tombstone re-check.
    pub recheck_drops: Counter,
    /// `airlock_break_glass_total`: access changes applied without a second person's approval
    /// (`X-Airlock-Break-Glass`, crate::approvals); each one also has an audit entry.
    pub break_glass: Counter,
    /// `airlock_sources_below_floor_total`: retrieved chunks kept out of a chat prompt because
    /// their similarity to the question is below `min_source_similarity`.
    pub below_floor: Counter,
    /// `airlock_no_source_answers_total`: chat answers given without generation because no
    /// readable source was relevant enough.
    pub no_source_answers: Counter,
    /// `airlock_unmatched_names_total`: chat questions whose sources were all set aside
    /// because the question names something none of them mentions.
    pub unmatched_names: Counter,
    /// `airlock_unknown_terms_total`: chat questions (or facets) whose sources were all set
    /// aside because the question names a term of art no readable document mentions.
    pub unknown_terms: Counter,
    /// `airlock_unsupported_answers_total`: generated chat answers whose own content no source
    /// supports (`cited_by: unsupported`); non-streaming ones are withheld unless
    /// `withhold_unsupported_answers` is off.
    pub unsupported_answers: Counter,
    /// `airlock_sources_out_of_focus_total`: retrieved chunks kept out of a chat prompt because
    /// their document misses a name of the question another document has, or matches the
    /// question's distinguishing words less well than another (`source_focus`).
    pub out_of_focus: Counter,
    /// `airlock_focus_sentences_embedded_total`: candidate sentences embedded for source
    /// focus's semantic judgement (`semantic_focus`; its cost).
    pub focus_sentences: Counter,
    /// `airlock_facet_questions_total`: chat questions about two subjects, retrieved once per
    /// subject (`facet_retrieval`).
    pub facet_questions: Counter,
    /// `airlock_generation_cancelled_total`: sequences cancelled because the client went away.
    pub cancelled: Counter,
    /// `airlock_engine_active_sequences`.
    pub engine_active: Gauge,
    /// `airlock_kv_bytes`: KV cache bytes held by the engine.
    pub kv_bytes: Gauge,
    /// `airlock_prefix_cache_hits`: requests whose shared system-prompt prefix KV was reused
    /// (since start; a gauge copied from the engines' counters).
    pub prefix_hits: Gauge,
    /// `airlock_prefix_cache_tokens_saved`: prompt tokens not prefilled thanks to it.
    pub prefix_tokens_saved: Gauge,
    /// `airlock_generated_tokens_total`.
    pub generated_tokens: Counter,
    /// `airlock_prompt_tokens_total`.
    pub prompt_tokens: Counter,
    /// `airlock_bundle_info{version}` = 1.
    pub bundle_info: Family<BundleVersion, Gauge>,
    /// `airlock_feedback_total{rating}`: answer ratings stored (new and replaced).
    pub feedback_total: Family<RatingLabel, Counter>,
    /// `airlock_connections_open`: client connections held.
    pub connections_open: Gauge,
    /// `airlock_connections_refused_total{limit}`: connections refused at a connection limit.
    pub connections_refused: Family<LimitLabel, Counter>,
    /// The inference rack's metrics (remote generators, tokens by backend, fallbacks).
    pub rack: airlock_serving::rack_metrics::RackMetrics,
    /// The connectors' metrics (`[[connectors]]`: syncs, failures, items by change kind).
    pub connectors: crate::connector_metrics::ConnectorMetrics,
    /// The last [`RECENT_SHEDS`] sheds (Unix seconds, priority), oldest first: the operator
    /// console's capacity page (not exported).
    pub recent_sheds: Arc<Mutex<std::collections::VecDeque<(f64, &'static str)>>>,
}

/// The stages reported in `airlock_retrieval_stage_seconds` (created at start so every scrape
/// lists them).
pub const STAGES: [&str; 13] = [
    "auth",
    "embed",
    "bm25",
    "vector",
    "fusion",
    "rescore",
    "rerank",
    "fetch",
    "recheck",
    "retrieval_total",
    "prefill",
    "first_token",
    "queue_wait",
];

/// Number of buckets of [`latency_histogram`].
pub const LATENCY_BUCKETS: u16 = 22;

/// Latency buckets from 0.5 ms doubling to ~1049 s: queue waits and times to first token under
/// overload reach minutes (the admission queue waits up to 600 s), and a wait beyond the last
/// finite bucket would make every quantile above it unknown.
fn latency_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.0005, 2.0, LATENCY_BUCKETS))
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// Creates and registers every metric.
    pub fn new() -> Self {
        let mut r = Registry::with_prefix("airlock");
        let m = Metrics {
            registry: Arc::new(Mutex::new(Registry::default())),
            requests: Family::default(),
            request_duration: Family::new_with_constructor(latency_histogram),
            iam_sync_last_success: Gauge::default(),
            recent_sheds: Arc::default(),
            ttft: latency_histogram(),
            tpot: Histogram::new(exponential_buckets(0.001, 2.0, 14)),
            queue_depth: Gauge::default(),
            inflight: Gauge::default(),
            ladder_rung: Gauge::default(),
            rung_transitions: Counter::default(),
            rung_seconds_total: Family::default(),
            ladder_pressure: Gauge::default(),
            shed_total: Family::default(),
            rate_limited_total: Family::default(),
            stage_seconds: Family::new_with_constructor(latency_histogram),
            recheck_drops: Counter::default(),
            break_glass: Counter::default(),
            below_floor: Counter::default(),
            no_source_answers: Counter::default(),
            unmatched_names: Counter::default(),
            unknown_terms: Counter::default(),
            out_of_focus: Counter::default(),
            focus_sentences: Counter::default(),
            facet_questions: Counter::default(),
            unsupported_answers: Counter::default(),
            cancelled: Counter::default(),
            engine_active: Gauge::default(),
            kv_bytes: Gauge::default(),
            prefix_hits: Gauge::default(),
            prefix_tokens_saved: Gauge::default(),
            generated_tokens: Counter::default(),
            prompt_tokens: Counter::default(),
            bundle_info: Family::default(),
            feedback_total: Family::default(),
            connections_open: Gauge::default(),
            connections_refused: Family::default(),
            rack: airlock_serving::rack_metrics::RackMetrics::new(),
            connectors: crate::connector_metrics::ConnectorMetrics::default(),
        };
        m.rack.register(&mut r);
        m.connectors.register(&mut r);
        m.register_http(&mut r);
        m.register_ladder(&mut r);
        m.register_answers(&mut r);
        m.register_engine(&mut r);
        m.register_service(&mut r);
        for limit in ["global", "per_ip"] {
            drop(m.connections_refused.get_or_create(&LimitLabel { limit }));
        }
        for rating in ["up", "down"] {
            drop(m.feedback_total.get_or_create(&RatingLabel { rating }));
        }
        for stage in STAGES {
            drop(m.stage_seconds.get_or_create(&Stage { stage }));
        }
        *m.registry.lock() = r;
        m
    }

    /// HTTP serving: requests, their latency, the IAM sync and the generation queue.
    fn register_http(&self, r: &mut Registry) {
        r.register(
            "requests",
            "HTTP requests by route template and status",
            self.requests.clone(),
        );
        r.register(
            "request_duration_seconds",
            "Time from request to response head (a stream's start), by route template",
            self.request_duration.clone(),
        );
        r.register(
        "iam_sync_last_success_timestamp_seconds",
        "When the last full IAM sync (snapshot or directory) was applied, Unix seconds (0: never)",
        self.iam_sync_last_success.clone(),
    );
        r.register(
            "ttft_seconds",
            "Time to first token of chat completions",
            self.ttft.clone(),
        );
        r.register(
            "tpot_seconds",
            "Time per output token after the first",
            self.tpot.clone(),
        );
        r.register(
            "queue_depth",
            "Requests waiting for the generation engine",
            self.queue_depth.clone(),
        );
        r.register(
            "inflight",
            "HTTP requests being served",
            self.inflight.clone(),
        );
    }

    /// Degradation ladder, shedding and quotas.
    fn register_ladder(&self, r: &mut Registry) {
        r.register(
            "ladder_rung",
            "Current degradation ladder rung (0 = full quality)",
            self.ladder_rung.clone(),
        );
        r.register(
            "rung_transitions",
            "Ladder rung changes",
            self.rung_transitions.clone(),
        );
        r.register(
            "ladder_rung_seconds",
            "Seconds spent at each ladder rung",
            self.rung_seconds_total.clone(),
        );
        r.register(
            "ladder_pressure",
            "Last load observation of the ladder controller (1.0 = one signal at its full level)",
            self.ladder_pressure.clone(),
        );
        r.register(
            "shed",
            "Requests shed by the ladder (503)",
            self.shed_total.clone(),
        );
        r.register(
            "rate_limited",
            "Requests refused by a per-user quota (429)",
            self.rate_limited_total.clone(),
        );
    }

    /// The answer path: retrieval stages, access re-check, source selection, cancellation.
    fn register_answers(&self, r: &mut Registry) {
        r.register(
            "retrieval_stage_seconds",
            "Latency of each request stage",
            self.stage_seconds.clone(),
        );
        r.register(
            "recheck_drops",
            "Chunks dropped by the access re-check just before the prompt",
            self.recheck_drops.clone(),
        );
        r.register(
            "break_glass",
            "Access changes applied by break-glass, without a second person's approval",
            self.break_glass.clone(),
        );
        r.register(
            "sources_below_floor",
            "Retrieved chunks kept out of a chat prompt: similarity below min_source_similarity",
            self.below_floor.clone(),
        );
        r.register(
            "no_source_answers",
            "Chat answers given without generation: no readable source was relevant enough",
            self.no_source_answers.clone(),
        );
        r.register(
            "unsupported_answers",
            "Generated chat answers whose own content no source supports",
            self.unsupported_answers.clone(),
        );
        r.register(
        "unmatched_names",
        "Chat questions naming something none of their sources mentions (answered without sources)",
        self.unmatched_names.clone(),
    );
        r.register(
        "unknown_terms",
        "Chat questions naming a term of art no document the caller may read mentions (answered without sources)",
        self.unknown_terms.clone(),
    );
        r.register(
        "sources_out_of_focus",
        "Retrieved chunks kept out of a chat prompt: their document misses a name of the question another has, or matches the question less well than another (source_focus)",
        self.out_of_focus.clone(),
    );
        r.register(
            "focus_sentences_embedded",
            "Candidate sentences embedded for source focus's semantic judgement (semantic_focus)",
            self.focus_sentences.clone(),
        );
        r.register(
            "facet_questions",
            "Chat questions about two subjects, retrieved once per subject (facet_retrieval)",
            self.facet_questions.clone(),
        );
        r.register(
            "generation_cancelled",
            "Generations cancelled because the client went away",
            self.cancelled.clone(),
        );
    }

    /// The local generation engine.
    fn register_engine(&self, r: &mut Registry) {
        r.register(
            "engine_active_sequences",
            "Sequences the engine is decoding",
            self.engine_active.clone(),
        );
        r.register(
            "kv_bytes",
            "Bytes of KV cache held by the engine",
            self.kv_bytes.clone(),
        );
        r.register(
            "prefix_cache_hits",
            "Requests that reused the shared system-prompt prefix KV (since start)",
            self.prefix_hits.clone(),
        );
        r.register(
            "prefix_cache_tokens_saved",
            "Prompt tokens not prefilled thanks to the shared system-prompt prefix (since start)",
            self.prefix_tokens_saved.clone(),
        );
        r.register(
            "generated_tokens",
            "Completion tokens generated",
            self.generated_tokens.clone(),
        );
        r.register(
            "prompt_tokens",
            "Prompt tokens prefilled",
            self.prompt_tokens.clone(),
        );
    }

    /// The installed bundle, client connections and feedback.
    fn register_service(&self, r: &mut Registry) {
        r.register(
            "bundle_info",
            "The installed bundle (value 1, version label)",
            self.bundle_info.clone(),
        );
        r.register(
            "connections_open",
            "Client connections held",
            self.connections_open.clone(),
        );
        r.register(
            "connections_refused",
            "Client connections refused at a connection limit (503), by limit",
            self.connections_refused.clone(),
        );
        r.register(
            "feedback",
            "Answer ratings stored through POST /v1/feedback (new or replaced), by rating",
            self.feedback_total.clone(),
        );
    }

    /// Records the latency of one stage.
    pub fn observe_stage(&self, stage: &'static str, seconds: f64) {
        self.stage_seconds
            .get_or_create(&Stage { stage })
            .observe(seconds);
    }

    /// Adds `seconds` to the time spent at `rung`.
    pub fn rung_seconds(&self, rung: u8, seconds: f64) {
        self.rung_seconds_total
            .get_or_create(&RungLabel { rung })
            .inc_by(seconds);
    }

    /// Records that a full IAM sync was applied at `unix_seconds`.
    pub fn iam_synced_at(&self, unix_seconds: f64) {
        if unix_seconds > self.iam_sync_last_success.get() {
            self.iam_sync_last_success.set(unix_seconds);
        }
    }

    /// Records that a full IAM sync was applied now.
    pub fn iam_synced_now(&self) {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs_f64())
            .unwrap_or(0.0);
        self.iam_synced_at(now);
    }

    /// Counts one shed request.
    pub fn shed(&self, priority: &'static str) {
        self.shed_total
            .get_or_create(&PriorityLabel { priority })
            .inc();
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs_f64())
            .unwrap_or(0.0);
        let mut recent = self.recent_sheds.lock();
        if recent.len() == RECENT_SHEDS {
            recent.pop_front();
        }
        recent.push_back((now, priority));
    }

    /// Counts one request refused by the `quota` (`requests` or `tokens`) quota.
    pub fn rate_limited(&self, quota: &'static str) {
        self.rate_limited_total
            .get_or_create(&QuotaKind { quota })
            .inc();
    }

    /// Counts one stored answer rating (`up` or `down`).
    pub fn feedback(&self, rating: &'static str) {
        self.feedback_total
            .get_or_create(&RatingLabel { rating })
            .inc();
    }

    /// Sets `airlock_bundle_info{version}` to 1.
    pub fn set_bundle(&self, version: &str) {
        self.bundle_info.clear();
        self.bundle_info
            .get_or_create(&BundleVersion {
                version: version.to_string(),
            })
            .set(1);
    }

    /// The Prometheus text exposition (format 0.0.4).
    pub fn encode(&self) -> String {
        let mut out = String::new();
        let r = self.registry.lock();
        // Writing to a String cannot fail.
        let _ = prometheus_client::encoding::prometheus_text::encode(&mut out, &r);
        out
    }
}

/// The `Content-Type` of [`Metrics::encode`].
pub const CONTENT_TYPE: &str = prometheus_client::encoding::prometheus_text::CONTENT_TYPE;

impl Metrics {
    /// The handles the answer core counts with (clones of the registered ones).
    pub fn answer(&self) -> airlock_serving::answer::AnswerMetrics {
        airlock_serving::answer::AnswerMetrics {
            ttft: self.ttft.clone(),
            tpot: self.tpot.clone(),
            no_source_answers: self.no_source_answers.clone(),
            unsupported_answers: self.unsupported_answers.clone(),
            cancelled: self.cancelled.clone(),
            generated_tokens: self.generated_tokens.clone(),
            prompt_tokens: self.prompt_tokens.clone(),
            rack: self.rack.clone(),
            meter: Arc::new(self.clone()),
        }
    }
}

impl airlock_rag::Meter for Metrics {
    fn count(&self, what: airlock_rag::Count, n: u64) {
        use airlock_rag::Count as C;
        let counter = match what {
            C::RecheckDrops => &self.recheck_drops,
            C::BelowFloor => &self.below_floor,
            C::UnmatchedNames => &self.unmatched_names,
            C::UnknownTerms => &self.unknown_terms,
            C::OutOfFocus => &self.out_of_focus,
            C::FocusSentences => &self.focus_sentences,
            C::FacetQuestions => &self.facet_questions,
        };
        counter.inc_by(n);
    }

    fn stage(&self, stage: &'static str, seconds: f64) {
        self.observe_stage(stage, seconds);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exposition_has_the_contract_names() {
        let m = Metrics::new();
        m.requests
            .get_or_create(&RouteStatus {
                route: "/healthz".into(),
                status: 200,
            })
            .inc();
        m.observe_stage("bm25", 0.001);
        m.set_bundle("1.2.3");
        let text = m.encode();
        for name in [
            "airlock_requests_total{route=\"/healthz\",status=\"200\"} 1",
            "airlock_ttft_seconds_bucket",
            "airlock_tpot_seconds_bucket",
            "airlock_queue_depth ",
            "airlock_inflight ",
            "airlock_ladder_rung ",
            "airlock_rung_transitions_total",
            "airlock_retrieval_stage_seconds_bucket{stage=\"bm25\",le=",
            "airlock_recheck_drops_total ",
            "airlock_break_glass_total ",
            "airlock_sources_below_floor_total ",
            "airlock_no_source_answers_total ",
            "airlock_unmatched_names_total ",
            "airlock_unknown_terms_total ",
            "airlock_unsupported_answers_total ",
            "airlock_facet_questions_total ",
            "airlock_generation_cancelled_total ",
            "airlock_engine_active_sequences ",
            "airlock_kv_bytes ",
            "airlock_bundle_info{version=\"1.2.3\"} 1",
            "airlock_feedback_total{rating=\"up\"} 0",
            "airlock_feedback_total{rating=\"down\"} 0",
        ] {
            assert!(text.contains(name), "missing {name} in\n{text}");
        }
    }
}
