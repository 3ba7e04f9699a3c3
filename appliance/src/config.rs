//! The daemon's configuration: one struct read from the command line, `AIRLOCK_*` environment
//! variables and an optional TOML file underneath, validated once at start-up.
//!
//! Precedence: command line > environment > TOML file > built-in default. Every field is an
//! `Option` so that layering can tell "not given" from "given the default"; the accessors apply
//! the defaults. Unknown keys in the file are errors (`deny_unknown_fields`). Secrets are
//! redacted in `Debug`. There are no network defaults: the daemon binds loopback and reads local
//! paths only.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

/// Default bind address (loopback only).
pub const DEFAULT_BIND: IpAddr = IpAddr::V4(Ipv4Addr::LOCALHOST);
/// Default TCP port.
pub const DEFAULT_PORT: u16 = 8080;
/// Default data directory.
pub const DEFAULT_DATA_DIR: &str = "./airlock-data";
/// Default body limit for ordinary endpoints (1 MiB).
pub const DEFAULT_BODY_LIMIT: usize = 1 << 20;
/// Default body limit for document uploads and IAM syncs (32 MiB).
pub const DEFAULT_UPLOAD_LIMIT: usize = 32 << 20;
/// Default `engine_decode_stall_factor`: a long prompt arriving costs decoding streams at most
/// twice their time per token.
pub const DEFAULT_DECODE_STALL_FACTOR: f64 = 2.0;

/// Errors found while loading or validating the configuration (user mistakes, exit code 2).
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The TOML file could not be read.
    #[error("cannot read config file {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// The TOML file is malformed or has unknown keys.
    #[error("invalid config file {path}: {message}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// What the parser said.
        message: String,
    },
    /// A value is out of its allowed range.
    #[error("invalid setting `{field}`: {reason}")]
    Invalid {
        /// The setting's name as written in the TOML file.
        field: &'static str,
        /// Why it is refused.
        reason: String,
    },
}

/// Everything `airlock serve` can be told.
///
/// Fields are named identically in TOML (snake_case), on the command line (`--kebab-case`) and
/// in the environment (`AIRLOCK_UPPER_CASE`).
#[derive(Clone, Default, Deserialize, clap::Args)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// TOML configuration file (its settings sit below flags and environment variables).
    #[arg(long = "config", env = "AIRLOCK_CONFIG")]
    #[serde(skip)]
    pub config_file: Option<PathBuf>,

    /// The appliance's data directory [default: ./airlock-data].
    #[arg(long = "data", env = "AIRLOCK_DATA")]
    pub data: Option<PathBuf>,

    /// Address to bind [default: 127.0.0.1].
    #[arg(long, env = "AIRLOCK_BIND")]
    pub bind: Option<IpAddr>,

    /// TCP port [default: 8080].
    #[arg(long, env = "AIRLOCK_PORT")]
    pub port: Option<u16>,

    /// Trusted keyring for bundle verification [default: the data dir's pinned keyring].
    #[arg(long, env = "AIRLOCK_KEYRING")]
    pub keyring: Option<PathBuf>,

    /// Body limit in bytes for ordinary endpoints [default: 1 MiB].
    #[arg(long, env = "AIRLOCK_BODY_LIMIT")]
    pub body_limit: Option<usize>,

    /// Body limit in bytes for document uploads and IAM syncs [default: 32 MiB].
    #[arg(long, env = "AIRLOCK_UPLOAD_LIMIT")]
    pub upload_limit: Option<usize>,

    /// Send per-stage timings (`timings_ms`) to non-admin callers too [default: false]. Stage
    /// timings grow with postings of documents the caller cannot read, so they tell a word that
    /// occurs only in forbidden documents from an absent one: on only for scratch instances such
    /// as the eval runner's own daemon (docs/operations/side-channels.md).
    #[arg(long, env = "AIRLOCK_STAGE_TIMINGS_FOR_USERS")]
    pub stage_timings_for_users: Option<bool>,

    /// Milliseconds: a non-admin's retrieval (search and re-check, in `/v1/retrieve` and chat)
    /// ends on a multiple of this, so its duration does not tell how many documents the caller
    /// cannot read contain the query's words [default: 25; 0: off; at most 1000].
    #[arg(long, env = "AIRLOCK_RETRIEVAL_TIME_QUANTUM_MS")]
    pub retrieval_time_quantum_ms: Option<u64>,

    /// Seconds a non-streaming request may take [default: 600: a non-streaming RAG answer from
    /// the large model takes ~3 minutes on the 2-core reference box (streaming requests are
    /// bounded by the stream idle timeout instead)].
    #[arg(long, env = "AIRLOCK_REQUEST_TIMEOUT_SECS")]
    pub request_timeout_secs: Option<u64>,

    /// Seconds a stream may stay silent between two chunks before it is ended; a chat stream
    /// is ended when its generation makes no progress (no token and no engine step) that long
    /// [default: 60].
    #[arg(long, env = "AIRLOCK_STREAM_IDLE_TIMEOUT_SECS")]
    pub stream_idle_timeout_secs: Option<u64>,

    /// Seconds without a chat SSE event after which a `: keep-alive` comment is sent (while the
    /// request queues or prefills); must be below the stream idle timeout [default: 15, or half
    /// the stream idle timeout if that is shorter].
    #[arg(long, env = "AIRLOCK_SSE_KEEP_ALIVE_SECS")]
    pub sse_keep_alive_secs: Option<u64>,

    /// Seconds a shutdown waits for in-flight requests and streams to finish [default: 30].
    #[arg(long, env = "AIRLOCK_SHUTDOWN_GRACE_SECS")]
    pub shutdown_grace_secs: Option<u64>,

    /// Seconds a client has to send a request head (request line and headers), counted from
    /// the connection's start or the end of the previous response on a kept-alive connection;
    /// an idle connection is closed after this long too [default: 10].
    #[arg(long, env = "AIRLOCK_HEADER_READ_TIMEOUT_SECS")]
    pub header_read_timeout_secs: Option<u64>,

    /// Seconds a request body may take to arrive once its handler starts reading it (after
    /// authentication); a body still incomplete then is `408 request-timeout` [default: 60].
    #[arg(long, env = "AIRLOCK_BODY_READ_TIMEOUT_SECS")]
    pub body_read_timeout_secs: Option<u64>,

    /// Client connections open at once; more are refused (`503 too-many-connections`)
    /// [default: 256].
    #[arg(long, env = "AIRLOCK_MAX_CONNECTIONS")]
    pub max_connections: Option<usize>,

    /// Client connections open at once from one IP address; more are refused [default: 64, or
    /// max_connections when that is lower].
    #[arg(long, env = "AIRLOCK_MAX_CONNECTIONS_PER_IP")]
    pub max_connections_per_ip: Option<usize>,

    /// Largest request head (request line and headers) in bytes, at most 256 KiB; larger is
    /// `431 headers-too-large` [default: 16384].
    #[arg(long, env = "AIRLOCK_MAX_HEADER_BYTES")]
    pub max_header_bytes: Option<usize>,

    /// Longest request target (path and query) in bytes; longer is `414 uri-too-long`
    /// [default: 8192].
    #[arg(long, env = "AIRLOCK_MAX_URI_BYTES")]
    pub max_uri_bytes: Option<usize>,

    /// Default number of chunks placed in a chat prompt [default: 6].
    #[arg(long, env = "AIRLOCK_TOP_K")]
    pub top_k: Option<usize>,

    /// Chunks whose f32 rescoring similarity to the question (cosine, -1..1) is below this are
    /// not placed in a chat prompt; when none is left the model is told no source is available
    /// and abstains. -1 keeps every chunk. Calibrated for the demo's MiniLM embedder on bank-dev
    /// and Cranfield (docs/EVALS.md) [default: 0.40].
    #[arg(
        long,
        env = "AIRLOCK_MIN_SOURCE_SIMILARITY",
        allow_hyphen_values = true
    )]
    pub min_source_similarity: Option<f32>,

    /// Answer "cannot find" without generation when the question names something (a vendor,
    /// person, project, place: a capitalised word inside a sentence) that none of its sources
    /// mentions: the sources are then about something else, however similar [default: true].
    #[arg(long, env = "AIRLOCK_ABSTAIN_ON_UNMATCHED_NAMES")]
    pub abstain_on_unmatched_names: Option<bool>,

    /// Answer "cannot find" without generation when the question names a term of art (a
    /// capitalised name inside a sentence, an identifier such as `run0`, `OnCalendar` or
    /// `modprobe.d`, or a word far from the embedder's vocabulary such as `autossh`) that no
    /// document the caller may read mentions anywhere (docs/operations/answer-sources.md)
    /// [default: true].
    #[arg(long, env = "AIRLOCK_ABSTAIN_ON_UNKNOWN_TERMS")]
    pub abstain_on_unknown_terms: Option<bool>,

    /// Withhold a generated (non-streaming) answer whose own content words no source supports
    /// (a figure or name the model made up; `cited_by: unsupported`) and answer "cannot find"
    /// instead; a stream cannot take back what it sent and only reports it [default: true].
    #[arg(long, env = "AIRLOCK_WITHHOLD_UNSUPPORTED_ANSWERS")]
    pub withhold_unsupported_answers: Option<bool>,

    /// Follow an answer that cites a source with that source's own sentence (or table row)
    /// that best matches the question and the answer, as a `> ` quote with its `[n]`, unless
    /// the answer already says all of it (docs/operations/answer-sources.md) [default: true].
    #[arg(long, env = "AIRLOCK_QUOTE_SUPPORTING_PASSAGE")]
    pub quote_supporting_passage: Option<bool>,

    /// When the installed bundle carries the appliance binary (`bundle build --binary`) and the
    /// running binary's SHA-256 differs from the signed one: `refuse` to start, or `warn` and
    /// start (docs/operations/upgrade-and-rollback.md) [default: refuse].
    #[arg(long, env = "AIRLOCK_BINARY_CHECK", value_enum)]
    pub binary_check: Option<BinaryCheck>,

    /// Source focus: a chat prompt keeps only the documents whose best sentence matches the
    /// question's distinguishing words at least this share as well as the best document does
    /// (near-copies about another customer segment, person or branch are set aside); 0 keeps
    /// every source, 1 only the best-matching documents (docs/operations/answer-sources.md) [default: 0.9].
    #[arg(long, env = "AIRLOCK_SOURCE_FOCUS")]
    pub source_focus: Option<f32>,

    /// Source focus sets a document aside only when it is a near-copy of a document it keeps:
    /// the share of content words their retrieved chunks have in common (Jaccard) is at least
    /// this. Focus exists for near-copies (the same letter for two branches); a page of a
    /// manual that merely scores lower is not one, and stays a source. 0: focus may set aside
    /// any document (docs/operations/answer-sources.md) [default: 0.2].
    #[arg(long, env = "AIRLOCK_SOURCE_FOCUS_NEAR_COPY")]
    pub source_focus_near_copy: Option<f32>,

    /// Add a semantic judgement to source focus at the full-pipeline rung: each candidate
    /// sentence is embedded and its cosine with the question added to the lexical score, so a
    /// source saying the same thing in other words is kept (costs ~0.5 CPU-s per chat on 2
    /// cores; the "skip reranker" rung and above skip it) [default: true].
    #[arg(long, env = "AIRLOCK_SEMANTIC_FOCUS")]
    pub semantic_focus: Option<bool>,

    /// Retrieve a chat question that asks the same thing about two subjects ("the rate for X,
    /// and what is it for Y", "compare A with that of B", "for both X and Y") once per subject,
    /// and give the model both subjects' sources (one more retrieval for such questions)
    /// [default: true].
    #[arg(long, env = "AIRLOCK_FACET_RETRIEVAL")]
    pub facet_retrieval: Option<bool>,

    /// How a conversation becomes the retrieval query: `carry` (a follow-up such as "And for
    /// X?" or "… that deal?" is rewritten from the previous question's names, years and
    /// codes), `rewrite` (the generator rewrites a follow-up into a stand-alone question; one
    /// short generation per follow-up), `concat` (previous and last user message) or `last`
    /// (the last user message only) [default: carry].
    #[arg(long, env = "AIRLOCK_FOLLOW_UP_QUERY", value_parser = parse_follow_ups)]
    pub follow_up_query: Option<airlock_rag::FollowUps>,

    /// Days a server-kept conversation is kept after its last turn (1-3650) [default: 90].
    #[arg(long, env = "AIRLOCK_CONVERSATION_RETENTION_DAYS")]
    pub conversation_retention_days: Option<u32>,

    /// How the globs of a folder ingest's `.acl.jsonl` treat case: `sensitive`, `insensitive`
    /// (a share from SMB/NTFS, where `HR/` is the `hr/` folder) or `refuse` (match exactly and
    /// refuse a file whose grant would differ ignoring case) [default: refuse]; TOML only, read
    /// by `airlock ingest --config`.
    #[arg(skip)]
    pub sidecar_glob_case: Option<airlock_retrieval::sidecar::GlobCase>,

    /// Default `max_tokens` of a chat completion [default: 256].
    #[arg(long, env = "AIRLOCK_MAX_TOKENS")]
    pub max_tokens: Option<u32>,

    /// Model-bound requests (chat, retrieve, embeddings) one user may make per minute; 0 = no
    /// per-user budget [default: 0].
    #[arg(long, env = "AIRLOCK_USER_REQUESTS_PER_MINUTE")]
    pub user_requests_per_minute: Option<u32>,

    /// Model tokens (prompt + completion) one ordinary user may use per minute; reserved at
    /// admission, unused part refunded; 0 = unlimited [default: 0].
    #[arg(long, env = "AIRLOCK_USER_TOKENS_PER_MINUTE")]
    pub user_tokens_per_minute: Option<u32>,

    /// Model-bound requests per minute for users with the admin role; 0 = unlimited [default: 0].
    #[arg(long, env = "AIRLOCK_ADMIN_REQUESTS_PER_MINUTE")]
    pub admin_requests_per_minute: Option<u32>,

    /// Model tokens per minute for users with the admin role; 0 = unlimited [default: 0].
    #[arg(long, env = "AIRLOCK_ADMIN_TOKENS_PER_MINUTE")]
    pub admin_tokens_per_minute: Option<u32>,

    /// Whether the load-driven degradation ladder runs (off: rung 0 unless forced) [default: true].
    #[arg(long, env = "AIRLOCK_LADDER")]
    pub ladder: Option<bool>,

    /// Ladder: in-flight model-bound requests that count as full load [default: 2, sized by the
    /// load bench on the 2-core reference box; about the requests your engine serves at once
    /// within the TTFT objective].
    #[arg(long, env = "AIRLOCK_LADDER_INFLIGHT_FULL")]
    pub ladder_inflight_full: Option<usize>,

    /// Ladder: requests waiting for the engine that count as full load [default: 8].
    #[arg(long, env = "AIRLOCK_LADDER_QUEUE_FULL")]
    pub ladder_queue_full: Option<usize>,

    /// Ladder: fraction of the KV-cache budget in use that counts as full load [default: 0.85].
    #[arg(long, env = "AIRLOCK_LADDER_KV_FULL")]
    pub ladder_kv_full: Option<f64>,

    /// Ladder: queue-wait EWMA in ms (submission to the engine until the engine admits the
    /// sequence; the prompt's prefill is not included) that counts as full load [default: 2000].
    #[arg(long, env = "AIRLOCK_LADDER_WAIT_FULL_MS")]
    pub ladder_wait_full_ms: Option<u64>,

    /// Ladder: pressures at which rungs 1..=5 are entered, increasing [default: 1,1.5,2,3,4].
    #[arg(long, env = "AIRLOCK_LADDER_STEP_DOWN", value_delimiter = ',')]
    pub ladder_step_down: Option<Vec<f64>>,

    /// Ladder: climb from rung r when pressure stays below this times rung r's threshold
    /// [default: 0.6].
    #[arg(long, env = "AIRLOCK_LADDER_RECOVER_RATIO")]
    pub ladder_recover_ratio: Option<f64>,

    /// Ladder: seconds the pressure must stay low before climbing one rung [default: 5].
    #[arg(long, env = "AIRLOCK_LADDER_RECOVER_HOLD_SECS")]
    pub ladder_recover_hold_secs: Option<u64>,

    /// Ladder: milliseconds between two load observations [default: 250].
    #[arg(long, env = "AIRLOCK_LADDER_TICK_MS")]
    pub ladder_tick_ms: Option<u64>,

    /// Ladder: at rung 5 reached under load, interactive requests are still admitted while
    /// fewer than this many admitted model-bound requests are in flight (the rest are shed);
    /// must keep rung 5's admitted work below its recovery level [default: 1.5 x
    /// ladder_inflight_full rounded up (3), lowered to that level's limit if needed].
    #[arg(long, env = "AIRLOCK_LADDER_SHED_ADMIT_INFLIGHT")]
    pub ladder_shed_admit_inflight: Option<usize>,

    /// Rungs 4 and 5: milliseconds a request may wait for its first token before 504
    /// [default: 120000].
    #[arg(long, env = "AIRLOCK_QUEUE_DEADLINE_MS")]
    pub queue_deadline_ms: Option<u64>,

    /// `Retry-After` seconds of a shed (503) response [default: 5].
    #[arg(long, env = "AIRLOCK_SHED_RETRY_AFTER_SECS")]
    pub shed_retry_after_secs: Option<u64>,

    /// Batch requests (`X-Airlock-Priority: batch`) are shed from this rung on [default: 3].
    #[arg(long, env = "AIRLOCK_BATCH_SHED_RUNG")]
    pub batch_shed_rung: Option<u8>,

    /// Engine: sequences each generator decodes together in one step [default: 16].
    #[arg(long, env = "AIRLOCK_ENGINE_MAX_BATCH")]
    pub engine_max_batch: Option<usize>,

    /// Engine: interactive requests that may wait for a generator's admission; more are
    /// answered 503 [default: 64].
    #[arg(long, env = "AIRLOCK_ENGINE_QUEUE_CAPACITY")]
    pub engine_queue_capacity: Option<usize>,

    /// Engine: batch requests that may wait for admission, counted apart from interactive ones;
    /// at most engine_queue_capacity [default: 16, or engine_queue_capacity if smaller].
    #[arg(long, env = "AIRLOCK_ENGINE_BATCH_QUEUE_CAPACITY")]
    pub engine_batch_queue_capacity: Option<usize>,

    /// Engine: a queued batch request that has waited this many engine steps is promoted and
    /// admitted in arrival order with interactive ones; 0 = plain FIFO [default: 128].
    #[arg(long, env = "AIRLOCK_ENGINE_BATCH_MAX_WAIT_STEPS")]
    pub engine_batch_max_wait_steps: Option<u64>,

    /// Engine: while streams decode, a step's prefill is capped so the step takes at most this
    /// many times a decode-only step (a long prompt arriving slows running streams at most
    /// this much per token; its own first token comes later instead); 1 to 100 [default: 2].
    #[arg(long, env = "AIRLOCK_ENGINE_DECODE_STALL_FACTOR")]
    pub engine_decode_stall_factor: Option<f64>,

    /// Refuse to start unless the egress lockdown (landlock) is fully enforced [default: false].
    #[arg(long, env = "AIRLOCK_REQUIRE_SANDBOX")]
    pub require_sandbox: Option<bool>,

    /// Trusted-header mode: the header an SSO proxy sets to the authenticated user id. Off
    /// unless set; requires `trusted_header_secret`.
    #[arg(long, env = "AIRLOCK_TRUSTED_HEADER")]
    pub trusted_header: Option<String>,

    /// Shared secret the SSO proxy sends in `X-Airlock-Proxy-Secret`; requests in trusted-header
    /// mode without it are refused.
    #[arg(long, env = "AIRLOCK_TRUSTED_HEADER_SECRET", hide_env_values = true)]
    pub trusted_header_secret: Option<String>,

    /// `[ldap]`: directory sign-in (`POST /v1/auth/login`) and membership sync; TOML only.
    #[arg(skip)]
    pub ldap: Option<airlock_identity::ldap::LdapConfig>,

    /// `[oidc]`: OIDC sign-in (`GET /v1/auth/oidc/login`); TOML only.
    #[arg(skip)]
    pub oidc: Option<airlock_identity::oidc::OidcConfig>,

    /// `[extract]`: the limits every extracted file (PDF, Office, e-mail, CSV, HTML) is read
    /// under, and the budget of the worker process it is read in (memory, CPU, deadline,
    /// workers at once), in the API and in `airlock ingest`; absent fields keep their defaults
    /// (docs/operations/ingest.md, "Extraction limits"); TOML only.
    #[arg(skip)]
    pub extract: Option<airlock_serving::extraction::ExtractConfig>,

    /// `[sessions]`: sign-in session lifetimes; TOML only.
    #[arg(skip)]
    pub sessions: Option<crate::session::SessionConfig>,

    /// `[audit_sink]`: every audit entry appended to a rotated JSON-lines file for a SIEM;
    /// TOML only (docs/operations/siem.md).
    #[arg(skip)]
    pub audit_sink: Option<airlock_evidence::audit_sink::AuditSinkConfig>,

    /// Directory of eval reports (one subdirectory per run with its `report.json`, as
    /// `airlock eval run --out` writes them) that the operator console lists [default: none].
    #[arg(long, env = "AIRLOCK_EVAL_REPORTS_DIR")]
    pub eval_reports_dir: Option<PathBuf>,

    /// Log format: `text` or `json` [default: text].
    #[arg(long, env = "AIRLOCK_LOG_FORMAT")]
    pub log_format: Option<String>,

    /// Generators on the bank's inference rack (`[[remote_generators]]`, TOML only; see
    /// docs/operations/rack.md).
    #[arg(skip)]
    pub remote_generators: Vec<airlock_serving::remote::RemoteGeneratorConfig>,

    /// Sources synced with their permissions (`[[connectors]]`, TOML only; see
    /// docs/operations/connectors.md).
    #[arg(skip)]
    pub connectors: Vec<crate::connectors::ConnectorConfig>,

    /// Serve plain HTTP on an address that is not loopback (only behind a TLS-terminating proxy
    /// on a trusted segment) [default: false: refuse to start].
    #[arg(long, env = "AIRLOCK_ALLOW_PLAIN_HTTP")]
    pub allow_plain_http: Option<bool>,

    /// HTTPS (`[tls]` in the file).
    #[command(flatten)]
    pub tls: crate::tls::TlsSettings,
}

impl fmt::Debug for Config {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Config")
            .field("config_file", &self.config_file)
            .field("data", &self.data)
            .field("bind", &self.bind)
            .field("port", &self.port)
            .field("keyring", &self.keyring)
            .field("body_limit", &self.body_limit)
            .field("upload_limit", &self.upload_limit)
            .field("request_timeout_secs", &self.request_timeout_secs)
            .field("retrieval_time_quantum_ms", &self.retrieval_time_quantum_ms)
            .field("stage_timings_for_users", &self.stage_timings_for_users)
            .field("stream_idle_timeout_secs", &self.stream_idle_timeout_secs)
            .field("sse_keep_alive_secs", &self.sse_keep_alive_secs)
            .field("shutdown_grace_secs", &self.shutdown_grace_secs)
            .field("header_read_timeout_secs", &self.header_read_timeout_secs)
            .field("body_read_timeout_secs", &self.body_read_timeout_secs)
            .field("max_connections", &self.max_connections)
            .field("max_connections_per_ip", &self.max_connections_per_ip)
            .field("max_header_bytes", &self.max_header_bytes)
            .field("max_uri_bytes", &self.max_uri_bytes)
            .field("top_k", &self.top_k)
            .field("min_source_similarity", &self.min_source_similarity)
            .field("source_focus", &self.source_focus)
            .field("source_focus_near_copy", &self.source_focus_near_copy)
            .field("semantic_focus", &self.semantic_focus)
            .field("facet_retrieval", &self.facet_retrieval)
            .field("follow_up_query", &self.follow_up_query)
            .field(
                "conversation_retention_days",
                &self.conversation_retention_days,
            )
            .field("sidecar_glob_case", &self.sidecar_glob_case)
            .field(
                "abstain_on_unmatched_names",
                &self.abstain_on_unmatched_names,
            )
            .field("abstain_on_unknown_terms", &self.abstain_on_unknown_terms)
            .field(
                "withhold_unsupported_answers",
                &self.withhold_unsupported_answers,
            )
            .field("quote_supporting_passage", &self.quote_supporting_passage)
            .field("binary_check", &self.binary_check)
            .field("max_tokens", &self.max_tokens)
            .field("user_requests_per_minute", &self.user_requests_per_minute)
            .field("user_tokens_per_minute", &self.user_tokens_per_minute)
            .field("admin_requests_per_minute", &self.admin_requests_per_minute)
            .field("admin_tokens_per_minute", &self.admin_tokens_per_minute)
            .field("ladder", &self.ladder)
            .field("ladder_inflight_full", &self.ladder_inflight_full)
            .field("ladder_queue_full", &self.ladder_queue_full)
            .field("ladder_kv_full", &self.ladder_kv_full)
            .field("ladder_wait_full_ms", &self.ladder_wait_full_ms)
            .field("ladder_step_down", &self.ladder_step_down)
            .field("ladder_recover_ratio", &self.ladder_recover_ratio)
            .field("ladder_recover_hold_secs", &self.ladder_recover_hold_secs)
            .field("ladder_tick_ms", &self.ladder_tick_ms)
            .field(
                "ladder_shed_admit_inflight",
                &self.ladder_shed_admit_inflight,
            )
            .field("queue_deadline_ms", &self.queue_deadline_ms)
            .field("shed_retry_after_secs", &self.shed_retry_after_secs)
            .field("batch_shed_rung", &self.batch_shed_rung)
            .field("engine_max_batch", &self.engine_max_batch)
            .field("engine_queue_capacity", &self.engine_queue_capacity)
            .field(
                "engine_batch_queue_capacity",
                &self.engine_batch_queue_capacity,
            )
            .field(
                "engine_batch_max_wait_steps",
                &self.engine_batch_max_wait_steps,
            )
            .field(
                "engine_decode_stall_factor",
                &self.engine_decode_stall_factor,
            )
            .field("require_sandbox", &self.require_sandbox)
            .field("trusted_header", &self.trusted_header)
            .field(
                "trusted_header_secret",
                &self.trusted_header_secret.as_ref().map(|_| "[redacted]"),
            )
            .field("log_format", &self.log_format)
            .field("remote_generators", &self.remote_generators)
            .field("connectors", &self.connectors)
            .field("ldap", &self.ldap)
            .field("oidc", &self.oidc)
            .field("sessions", &self.sessions)
            .field("extract", &self.extract)
            .field("audit_sink", &self.audit_sink)
            .field("eval_reports_dir", &self.eval_reports_dir)
            .field("allow_plain_http", &self.allow_plain_http)
            .field("tls", &self.tls)
            .finish()
    }
}

impl Config {
    /// Parses a TOML document (unknown keys are errors).
    pub fn from_toml(text: &str, path: &Path) -> Result<Self, ConfigError> {
        toml::from_str(text).map_err(|e| ConfigError::Parse {
            path: path.to_path_buf(),
            message: e.message().to_string(),
        })
    }

    /// Reads the TOML file named by `config_file` (if any), layers `self` over it and validates
    /// the result.
    pub fn load(self) -> Result<Self, ConfigError> {
        let merged = match &self.config_file {
            Some(path) => {
                let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
                    path: path.clone(),
                    source,
                })?;
                let file = Self::from_toml(&text, path)?;
                self.over(file)
            }
            None => self,
        };
        merged.validate()?;
        Ok(merged)
    }

    /// `self` with every unset field taken from `lower`.
    pub fn over(self, lower: Config) -> Config {
        Config {
            config_file: self.config_file.or(lower.config_file),
            data: self.data.or(lower.data),
            bind: self.bind.or(lower.bind),
            port: self.port.or(lower.port),
            keyring: self.keyring.or(lower.keyring),
            body_limit: self.body_limit.or(lower.body_limit),
            upload_limit: self.upload_limit.or(lower.upload_limit),
            request_timeout_secs: self.request_timeout_secs.or(lower.request_timeout_secs),
            stage_timings_for_users: self
                .stage_timings_for_users
                .or(lower.stage_timings_for_users),
            retrieval_time_quantum_ms: self
                .retrieval_time_quantum_ms
                .or(lower.retrieval_time_quantum_ms),
            stream_idle_timeout_secs: self
                .stream_idle_timeout_secs
                .or(lower.stream_idle_timeout_secs),
            sse_keep_alive_secs: self.sse_keep_alive_secs.or(lower.sse_keep_alive_secs),
            shutdown_grace_secs: self.shutdown_grace_secs.or(lower.shutdown_grace_secs),
            header_read_timeout_secs: self
                .header_read_timeout_secs
                .or(lower.header_read_timeout_secs),
            body_read_timeout_secs: self.body_read_timeout_secs.or(lower.body_read_timeout_secs),
            max_connections: self.max_connections.or(lower.max_connections),
            max_connections_per_ip: self.max_connections_per_ip.or(lower.max_connections_per_ip),
            max_header_bytes: self.max_header_bytes.or(lower.max_header_bytes),
            max_uri_bytes: self.max_uri_bytes.or(lower.max_uri_bytes),
            top_k: self.top_k.or(lower.top_k),
            min_source_similarity: self.min_source_similarity.or(lower.min_source_similarity),
            source_focus: self.source_focus.or(lower.source_focus),
            source_focus_near_copy: self.source_focus_near_copy.or(lower.source_focus_near_copy),
            semantic_focus: self.semantic_focus.or(lower.semantic_focus),
            facet_retrieval: self.facet_retrieval.or(lower.facet_retrieval),
            follow_up_query: self.follow_up_query.or(lower.follow_up_query),
            conversation_retention_days: self
                .conversation_retention_days
                .or(lower.conversation_retention_days),
            sidecar_glob_case: self.sidecar_glob_case.or(lower.sidecar_glob_case),
            abstain_on_unmatched_names: self
                .abstain_on_unmatched_names
                .or(lower.abstain_on_unmatched_names),
            abstain_on_unknown_terms: self
                .abstain_on_unknown_terms
                .or(lower.abstain_on_unknown_terms),
            withhold_unsupported_answers: self
                .withhold_unsupported_answers
                .or(lower.withhold_unsupported_answers),
            quote_supporting_passage: self
                .quote_supporting_passage
                .or(lower.quote_supporting_passage),
            binary_check: self.binary_check.or(lower.binary_check),
            max_tokens: self.max_tokens.or(lower.max_tokens),
            user_requests_per_minute: self
                .user_requests_per_minute
                .or(lower.user_requests_per_minute),
            user_tokens_per_minute: self.user_tokens_per_minute.or(lower.user_tokens_per_minute),
            admin_requests_per_minute: self
                .admin_requests_per_minute
                .or(lower.admin_requests_per_minute),
            admin_tokens_per_minute: self
                .admin_tokens_per_minute
                .or(lower.admin_tokens_per_minute),
            ladder: self.ladder.or(lower.ladder),
            ladder_inflight_full: self.ladder_inflight_full.or(lower.ladder_inflight_full),
            ladder_queue_full: self.ladder_queue_full.or(lower.ladder_queue_full),
            ladder_kv_full: self.ladder_kv_full.or(lower.ladder_kv_full),
            ladder_wait_full_ms: self.ladder_wait_full_ms.or(lower.ladder_wait_full_ms),
            ladder_step_down: self.ladder_step_down.or(lower.ladder_step_down),
            ladder_recover_ratio: self.ladder_recover_ratio.or(lower.ladder_recover_ratio),
            ladder_recover_hold_secs: self
                .ladder_recover_hold_secs
                .or(lower.ladder_recover_hold_secs),
            ladder_tick_ms: self.ladder_tick_ms.or(lower.ladder_tick_ms),
            ladder_shed_admit_inflight: self
                .ladder_shed_admit_inflight
                .or(lower.ladder_shed_admit_inflight),
            queue_deadline_ms: self.queue_deadline_ms.or(lower.queue_deadline_ms),
            shed_retry_after_secs: self.shed_retry_after_secs.or(lower.shed_retry_after_secs),
            batch_shed_rung: self.batch_shed_rung.or(lower.batch_shed_rung),
            engine_max_batch: self.engine_max_batch.or(lower.engine_max_batch),
            engine_decode_stall_factor: self
                .engine_decode_stall_factor
                .or(lower.engine_decode_stall_factor),
            engine_queue_capacity: self.engine_queue_capacity.or(lower.engine_queue_capacity),
            engine_batch_queue_capacity: self
                .engine_batch_queue_capacity
                .or(lower.engine_batch_queue_capacity),
            engine_batch_max_wait_steps: self
                .engine_batch_max_wait_steps
                .or(lower.engine_batch_max_wait_steps),
            require_sandbox: self.require_sandbox.or(lower.require_sandbox),
            trusted_header: self.trusted_header.or(lower.trusted_header),
            trusted_header_secret: self.trusted_header_secret.or(lower.trusted_header_secret),
            ldap: self.ldap.or(lower.ldap),
            oidc: self.oidc.or(lower.oidc),
            sessions: self.sessions.or(lower.sessions),
            extract: self.extract.or(lower.extract),
            audit_sink: self.audit_sink.or(lower.audit_sink),
            eval_reports_dir: self.eval_reports_dir.or(lower.eval_reports_dir),
            log_format: self.log_format.or(lower.log_format),
            remote_generators: if self.remote_generators.is_empty() {
                lower.remote_generators
            } else {
                self.remote_generators
            },
            connectors: if self.connectors.is_empty() {
                lower.connectors
            } else {
                self.connectors
            },
            allow_plain_http: self.allow_plain_http.or(lower.allow_plain_http),
            tls: self.tls.over(lower.tls),
        }
    }

    /// Checks every range and combination; called by [`Config::load`].
    pub fn validate(&self) -> Result<(), ConfigError> {
        fn invalid(field: &'static str, reason: impl Into<String>) -> ConfigError {
            ConfigError::Invalid {
                field,
                reason: reason.into(),
            }
        }
        if self.body_limit() < 1024 {
            return Err(invalid("body_limit", "must be at least 1024 bytes"));
        }
        if let Some(Err(why)) = self.audit_sink.as_ref().map(|s| s.validate()) {
            return Err(invalid("audit_sink", why));
        }
        if self.upload_limit() < self.body_limit() {
            return Err(invalid("upload_limit", "must be at least body_limit"));
        }
        if self.retrieval_time_quantum_ms.is_some_and(|q| q > 1000) {
            return Err(invalid(
                "retrieval_time_quantum_ms",
                "must be at most 1000 milliseconds",
            ));
        }
        if self.upload_limit() > 1 << 30 {
            return Err(invalid("upload_limit", "must be at most 1 GiB"));
        }
        if self
            .conversation_retention_days
            .is_some_and(|d| !(1..=3650).contains(&d))
        {
            return Err(invalid(
                "conversation_retention_days",
                "must be between 1 and 3650 days",
            ));
        }
        for (field, v) in [
            ("request_timeout_secs", self.request_timeout_secs),
            ("stream_idle_timeout_secs", self.stream_idle_timeout_secs),
            ("sse_keep_alive_secs", self.sse_keep_alive_secs),
            ("shutdown_grace_secs", self.shutdown_grace_secs),
        ] {
            if v == Some(0) {
                return Err(invalid(field, "must be at least 1 second"));
            }
        }
        self.validate_http_limits()?;
        if self.sse_keep_alive() >= self.stream_idle_timeout() {
            return Err(invalid(
                "sse_keep_alive_secs",
                "must be shorter than stream_idle_timeout_secs",
            ));
        }
        self.validate_answer()?;
        self.validate_trusted_header()?;
        if let Some(l) = &self.ldap {
            l.validate().map_err(|(f, r)| invalid(f, r))?;
        }
        if let Some(o) = &self.oidc {
            o.validate().map_err(|(f, r)| invalid(f, r))?;
        }
        self.sessions().validate().map_err(|(f, r)| invalid(f, r))?;
        if let Some(field) = zero_limit(&self.extract_limits()) {
            return Err(invalid(
                "extract",
                format!("{field} must be positive (a zero limit refuses every file)"),
            ));
        }
        self.extract_budget()
            .check()
            .map_err(|(field, why)| invalid("extract", format!("{field} {why}")))?;
        self.admission()
            .validate()
            .map_err(|(field, reason)| invalid(field, reason))?;
        self.validate_engine()?;
        self.tls
            .check()
            .map_err(|(field, reason)| invalid(field, reason))?;
        if !self.tls.enabled() && !self.addr().ip().is_loopback() && !self.allow_plain_http() {
            return Err(invalid(
                "bind",
                format!(
                    "{} is not a loopback address and HTTPS is off: set [tls] cert and key, or \
                     allow_plain_http = true when a TLS-terminating proxy sits in front",
                    self.addr().ip()
                ),
            ));
        }
        match self.log_format.as_deref() {
            None | Some("text") | Some("json") => {}
            Some(other) => {
                return Err(invalid(
                    "log_format",
                    format!("`{other}` is not `text` or `json`"),
                ));
            }
        }
        airlock_serving::remote::config::check_all(&self.remote_generators)
            .map_err(|(field, reason)| invalid(field, reason))?;
        crate::connectors::config::check_all(&self.connectors)
            .map_err(|(field, reason)| invalid(field, reason))?;
        Ok(())
    }

    /// The data directory.
    pub fn data_dir(&self) -> PathBuf {
        self.data
            .clone()
            .unwrap_or_else(|| PathBuf::from(DEFAULT_DATA_DIR))
    }

    /// Whether plain HTTP may be served on an address that is not loopback.
    pub fn allow_plain_http(&self) -> bool {
        self.allow_plain_http.unwrap_or(false)
    }

    /// The socket address to bind.
    pub fn addr(&self) -> SocketAddr {
        SocketAddr::new(
            self.bind.unwrap_or(DEFAULT_BIND),
            self.port.unwrap_or(DEFAULT_PORT),
        )
    }

    /// Body limit for ordinary endpoints.
    pub fn body_limit(&self) -> usize {
        self.body_limit.unwrap_or(DEFAULT_BODY_LIMIT)
    }

    /// Body limit for document uploads and IAM syncs.
    pub fn upload_limit(&self) -> usize {
        self.upload_limit.unwrap_or(DEFAULT_UPLOAD_LIMIT)
    }

    /// Whether a response to this caller carries per-stage timings: admins always, others only
    /// with `stage_timings_for_users`.
    pub fn shows_stage_timings(&self, admin: bool) -> bool {
        admin || self.stage_timings_for_users.unwrap_or(false)
    }

    /// The quantum a caller's retrieval time is rounded up to: zero (off) for admins, who see
    /// per-stage timings anyway, and when configured off.
    pub fn retrieval_time_quantum_for(&self, admin: bool) -> Duration {
        if admin {
            return Duration::ZERO;
        }
        Duration::from_millis(self.retrieval_time_quantum_ms.unwrap_or(25))
    }

    /// Time limit of a non-streaming request.
    pub fn request_timeout(&self) -> Duration {
        Duration::from_secs(self.request_timeout_secs.unwrap_or(600))
    }

    /// Longest silence between two chunks of a stream.
    pub fn stream_idle_timeout(&self) -> Duration {
        Duration::from_secs(self.stream_idle_timeout_secs.unwrap_or(60))
    }

    /// Longest gap between two chat SSE events before a `: keep-alive` comment is sent: the
    /// setting, else 15 s, or half the stream idle timeout when that is shorter (at least 1 s).
    pub fn sse_keep_alive(&self) -> Duration {
        let secs = self.sse_keep_alive_secs.unwrap_or_else(|| {
            let idle = self.stream_idle_timeout().as_secs();
            (idle / 2).clamp(1, 15)
        });
        Duration::from_secs(secs)
    }

    /// The extraction limits (`[extract]`, defaults when absent).
    pub fn extract_limits(&self) -> airlock_retrieval::ingest::ExtractLimits {
        self.extract.clone().unwrap_or_default().limits
    }

    /// The extraction workers' budget (`[extract]`, defaults when absent).
    pub fn extract_budget(&self) -> airlock_serving::extraction::ExtractBudget {
        self.extract.clone().unwrap_or_default().budget
    }

    /// The extractor of files from outside: budgeted worker processes running this binary.
    pub fn extractor(&self) -> airlock_serving::extraction::Extractor {
        airlock_serving::extraction::Extractor::Child(
            airlock_serving::extraction::ChildExtractor::new(
                airlock_serving::extraction::ChildProgram::this_binary(self.require_sandbox()),
                self.extract_budget(),
            ),
        )
    }

    /// The `[sessions]` lifetimes (defaults when absent).
    pub fn sessions(&self) -> crate::session::SessionConfig {
        self.sessions.clone().unwrap_or_default()
    }

    /// How long a shutdown waits for in-flight work.
    pub fn shutdown_grace(&self) -> Duration {
        Duration::from_secs(self.shutdown_grace_secs.unwrap_or(30))
    }

    /// Time allowed for a request head (also the idle limit of a kept-alive connection).
    pub fn header_read_timeout(&self) -> Duration {
        Duration::from_secs(self.header_read_timeout_secs.unwrap_or(10))
    }

    /// Time allowed for a whole request body once its handler reads it.
    pub fn body_read_timeout(&self) -> Duration {
        Duration::from_secs(self.body_read_timeout_secs.unwrap_or(60))
    }

    /// Client connections open at once.
    pub fn max_connections(&self) -> usize {
        self.max_connections.unwrap_or(256)
    }

    /// Client connections open at once from one IP address (unset: 64, or `max_connections`
    /// when that is lower).
    pub fn max_connections_per_ip(&self) -> usize {
        self.max_connections_per_ip
            .unwrap_or_else(|| self.max_connections().min(64))
    }

    /// Largest request head in bytes.
    pub fn max_header_bytes(&self) -> usize {
        self.max_header_bytes.unwrap_or(16 << 10)
    }

    /// Longest request target in bytes.
    pub fn max_uri_bytes(&self) -> usize {
        self.max_uri_bytes.unwrap_or(8 << 10)
    }

    /// A setting's value out of its range.
    fn invalid(field: &'static str, reason: impl Into<String>) -> ConfigError {
        ConfigError::Invalid {
            field,
            reason: reason.into(),
        }
    }

    /// The answer path's settings: sources, focus and the generation length.
    fn validate_answer(&self) -> Result<(), ConfigError> {
        if !(1..=64).contains(&self.top_k()) {
            return Err(Self::invalid("top_k", "must be between 1 and 64"));
        }
        if !(-1.0..=1.0).contains(&self.min_source_similarity()) {
            return Err(Self::invalid(
                "min_source_similarity",
                "must be a cosine between -1 and 1 (-1 keeps every chunk)",
            ));
        }
        if !(0.0..=1.0).contains(&self.source_focus()) {
            return Err(Self::invalid(
                "source_focus",
                "must be a share between 0 and 1 (0 keeps every source)",
            ));
        }
        if !(0.0..=1.0).contains(&self.source_focus_near_copy()) {
            return Err(Self::invalid(
                "source_focus_near_copy",
                "must be a share between 0 and 1 (0: focus may set aside any document)",
            ));
        }
        if !(1..=8192).contains(&self.max_tokens()) {
            return Err(Self::invalid("max_tokens", "must be between 1 and 8192"));
        }
        Ok(())
    }

    /// Trusted-header mode: the header's name and its shared secret come together.
    fn validate_trusted_header(&self) -> Result<(), ConfigError> {
        match (&self.trusted_header, &self.trusted_header_secret) {
            (Some(h), Some(s)) => {
                if axum::http::HeaderName::try_from(h.as_str()).is_err() {
                    return Err(Self::invalid(
                        "trusted_header",
                        "not a valid HTTP header name",
                    ));
                }
                if s.len() < 16 {
                    return Err(Self::invalid(
                        "trusted_header_secret",
                        "must be at least 16 characters",
                    ));
                }
            }
            (Some(_), None) => {
                return Err(Self::invalid(
                    "trusted_header_secret",
                    "required when trusted_header is set",
                ));
            }
            (None, Some(_)) => {
                return Err(Self::invalid(
                    "trusted_header",
                    "trusted_header_secret is set but trusted-header mode is off",
                ));
            }
            (None, None) => {}
        }
        Ok(())
    }

    /// The generation engines' settings.
    fn validate_engine(&self) -> Result<(), ConfigError> {
        let engine = self.engine_config();
        if !(1..engine.step_token_budget).contains(&engine.max_batch) {
            return Err(Self::invalid(
                "engine_max_batch",
                format!(
                    "must be between 1 and {} (below the engine's step token budget)",
                    engine.step_token_budget - 1
                ),
            ));
        }
        if engine
            .decode_stall_factor
            .is_some_and(|f| !(1.0..=100.0).contains(&f))
        {
            return Err(Self::invalid(
                "engine_decode_stall_factor",
                "must be between 1 and 100",
            ));
        }
        if !(1..=1 << 16).contains(&engine.queue_capacity) {
            return Err(Self::invalid(
                "engine_queue_capacity",
                "must be between 1 and 65536",
            ));
        }
        if !(1..=engine.queue_capacity).contains(&engine.batch_queue_capacity) {
            return Err(Self::invalid(
                "engine_batch_queue_capacity",
                "must be between 1 and engine_queue_capacity",
            ));
        }
        Ok(())
    }

    /// The connection and request-head limits (`server.rs`, `head.rs`).
    fn validate_http_limits(&self) -> Result<(), ConfigError> {
        let invalid = |field, reason: &str| ConfigError::Invalid {
            field,
            reason: reason.into(),
        };
        for (field, v) in [
            ("header_read_timeout_secs", self.header_read_timeout_secs),
            ("body_read_timeout_secs", self.body_read_timeout_secs),
        ] {
            if v == Some(0) {
                return Err(invalid(field, "must be at least 1 second"));
            }
        }
        if self.max_connections() == 0 {
            return Err(invalid("max_connections", "must be at least 1"));
        }
        if !(1..=self.max_connections()).contains(&self.max_connections_per_ip()) {
            return Err(invalid(
                "max_connections_per_ip",
                "must be between 1 and max_connections",
            ));
        }
        // Below hyper's read buffer (~400 KiB), so hyper never refuses a head checked here.
        if !(1024..=256 << 10).contains(&self.max_header_bytes()) {
            return Err(invalid(
                "max_header_bytes",
                "must be between 1024 bytes and 256 KiB",
            ));
        }
        if !(64..self.max_header_bytes()).contains(&self.max_uri_bytes()) {
            return Err(invalid(
                "max_uri_bytes",
                "must be at least 64 bytes and below max_header_bytes",
            ));
        }
        Ok(())
    }

    /// Default number of prompt chunks.
    pub fn top_k(&self) -> usize {
        self.top_k.unwrap_or(6)
    }

    /// The similarity floor of prompt chunks (see the field).
    pub fn min_source_similarity(&self) -> f32 {
        self.min_source_similarity.unwrap_or(0.40)
    }

    /// The source-focus ratio of chat prompts (see the field).
    pub fn source_focus(&self) -> f32 {
        self.source_focus.unwrap_or(0.9)
    }

    /// The word overlap from which focus may set a document aside (see the field).
    pub fn source_focus_near_copy(&self) -> f32 {
        self.source_focus_near_copy.unwrap_or(0.2)
    }

    /// Whether source focus adds the embedder's judgement at rung 0 (see the field).
    pub fn semantic_focus(&self) -> bool {
        self.semantic_focus.unwrap_or(true)
    }

    /// Whether a two-subject question is retrieved once per subject (see the field).
    pub fn facet_retrieval(&self) -> bool {
        self.facet_retrieval.unwrap_or(true)
    }

    /// How long a conversation is kept after its last turn.
    pub fn conversation_retention(&self) -> std::time::Duration {
        let days = self
            .conversation_retention_days
            .unwrap_or(90)
            .clamp(1, 3650);
        std::time::Duration::from_secs(u64::from(days) * 86_400)
    }

    /// How folder-ingest sidecar globs treat case (see the field).
    pub fn sidecar_glob_case(&self) -> airlock_retrieval::sidecar::GlobCase {
        self.sidecar_glob_case.unwrap_or_default()
    }

    /// How a conversation becomes the retrieval query (see the field).
    pub fn follow_up_query(&self) -> airlock_rag::FollowUps {
        self.follow_up_query.unwrap_or_default()
    }

    /// Whether a question naming something no source mentions is answered "cannot find".
    pub fn abstain_on_unmatched_names(&self) -> bool {
        self.abstain_on_unmatched_names.unwrap_or(true)
    }

    /// Whether a question naming a term of art no readable document mentions is answered
    /// "cannot find".
    pub fn abstain_on_unknown_terms(&self) -> bool {
        self.abstain_on_unknown_terms.unwrap_or(true)
    }

    /// Whether a non-streaming answer no source supports is replaced by "cannot find".
    pub fn withhold_unsupported_answers(&self) -> bool {
        self.withhold_unsupported_answers.unwrap_or(true)
    }

    /// Whether an answer that cites a source is followed by its supporting quote.
    pub fn quote_supporting_passage(&self) -> bool {
        self.quote_supporting_passage.unwrap_or(true)
    }

    /// What a running binary other than the bundle's signed one does at start.
    pub fn binary_check(&self) -> BinaryCheck {
        self.binary_check.unwrap_or_default()
    }

    /// Default completion length.
    pub fn max_tokens(&self) -> u32 {
        self.max_tokens.unwrap_or(256)
    }

    /// Admission's section (quotas, ladder, shedding): its keys sit at the file's top level
    /// and on the command line like the others; its defaults and checks are
    /// `airlock-serving`'s.
    pub fn admission(&self) -> airlock_serving::admission::AdmissionSettings {
        airlock_serving::admission::AdmissionSettings {
            user_requests_per_minute: self.user_requests_per_minute,
            user_tokens_per_minute: self.user_tokens_per_minute,
            admin_requests_per_minute: self.admin_requests_per_minute,
            admin_tokens_per_minute: self.admin_tokens_per_minute,
            ladder: self.ladder,
            ladder_inflight_full: self.ladder_inflight_full,
            ladder_queue_full: self.ladder_queue_full,
            ladder_kv_full: self.ladder_kv_full,
            ladder_wait_full_ms: self.ladder_wait_full_ms,
            ladder_step_down: self.ladder_step_down.clone(),
            ladder_recover_ratio: self.ladder_recover_ratio,
            ladder_recover_hold_secs: self.ladder_recover_hold_secs,
            ladder_tick_ms: self.ladder_tick_ms,
            ladder_shed_admit_inflight: self.ladder_shed_admit_inflight,
            queue_deadline_ms: self.queue_deadline_ms,
            shed_retry_after_secs: self.shed_retry_after_secs,
            batch_shed_rung: self.batch_shed_rung,
        }
    }

    /// The generation engines' settings: the defaults of [`EngineConfig`] with the `engine_*`
    /// settings over them (the batch queue defaults to at most the interactive one).
    ///
    /// [`EngineConfig`]: airlock_inference::generate::EngineConfig
    pub fn engine_config(&self) -> airlock_inference::generate::EngineConfig {
        let d = airlock_inference::generate::EngineConfig::default();
        let queue_capacity = self.engine_queue_capacity.unwrap_or(d.queue_capacity);
        airlock_inference::generate::EngineConfig {
            max_batch: self.engine_max_batch.unwrap_or(d.max_batch),
            queue_capacity,
            batch_queue_capacity: self
                .engine_batch_queue_capacity
                .unwrap_or(d.batch_queue_capacity.min(queue_capacity)),
            batch_max_wait_steps: self
                .engine_batch_max_wait_steps
                .unwrap_or(d.batch_max_wait_steps),
            // A long prompt arriving costs decoding streams at most 2x per token.
            decode_stall_factor: Some(
                self.engine_decode_stall_factor
                    .unwrap_or(DEFAULT_DECODE_STALL_FACTOR),
            ),
            ..d
        }
    }

    /// Whether start-up must fail when the egress lockdown cannot be fully enforced.
    pub fn require_sandbox(&self) -> bool {
        self.require_sandbox.unwrap_or(false)
    }

    /// Whether logs are JSON lines.
    pub fn json_logs(&self) -> bool {
        self.log_format.as_deref() == Some("json")
    }
}

/// What a running binary other than the installed bundle's signed one does at start
/// (`binary_check`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BinaryCheck {
    /// Refuse to start.
    #[default]
    Refuse,
    /// Log a warning and start.
    Warn,
}

fn parse_follow_ups(s: &str) -> Result<airlock_rag::FollowUps, String> {
    match s {
        "carry" => Ok(airlock_rag::FollowUps::Carry),
        "concat" => Ok(airlock_rag::FollowUps::Concat),
        "last" => Ok(airlock_rag::FollowUps::Last),
        "rewrite" => Ok(airlock_rag::FollowUps::Rewrite),
        other => Err(format!(
            "`{other}`: expected carry, rewrite, concat or last"
        )),
    }
}

/// The first field of `limits` set to zero (`max_attachments` may be 0: no attachment is read).
fn zero_limit(limits: &airlock_retrieval::ingest::ExtractLimits) -> Option<String> {
    let serde_json::Value::Object(fields) = serde_json::to_value(limits).ok()? else {
        return None;
    };
    fields
        .into_iter()
        .find(|(k, v)| k != "max_attachments" && v.as_u64() == Some(0))
        .map(|(k, _)| k)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sidecar_glob_case_is_refuse_unless_set() {
        use airlock_retrieval::sidecar::GlobCase;
        let p = std::path::Path::new("airlock.toml");
        assert_eq!(Config::default().sidecar_glob_case(), GlobCase::Refuse);
        for (text, want) in [
            ("insensitive", GlobCase::Insensitive),
            ("sensitive", GlobCase::Sensitive),
            ("refuse", GlobCase::Refuse),
        ] {
            let c = Config::from_toml(&format!("sidecar_glob_case = \"{text}\"\n"), p).unwrap();
            assert_eq!(c.sidecar_glob_case(), want);
        }
        assert!(Config::from_toml("sidecar_glob_case = \"ignore\"\n", p).is_err());
    }

    #[test]
    fn remote_generators_are_toml_only_and_checked_by_their_section() {
        let p = std::path::Path::new("airlock.toml");
        let entry = "[[remote_generators]]\nalias = \"airlock-rack\"\nkind = \"openai-compatible\"\n\
                     base_urls = [\"http://10.1.2.3:8000/v1\"]\nmodel = \"m\"\n";
        let c = Config::from_toml(entry, p).unwrap();
        c.validate().unwrap();
        // Flags and environment cannot erase it.
        let layered = Config::default().over(c.clone());
        assert_eq!(layered.remote_generators, c.remote_generators);
        let twice = Config::from_toml(&format!("{entry}{entry}"), p).unwrap();
        let e = twice.validate().unwrap_err().to_string();
        assert!(
            e.contains("remote_generators.alias") && e.contains("twice"),
            "{e}"
        );
    }

    #[test]
    fn extract_limits_come_from_the_extract_table() {
        let p = std::path::Path::new("airlock.toml");
        let c = Config::from_toml("[extract]\nmax_pages = 10\n", p).unwrap();
        c.validate().unwrap();
        let l = c.extract_limits();
        assert_eq!(l.max_pages, 10);
        let d = airlock_retrieval::ingest::ExtractLimits::default();
        assert_eq!(
            (l.max_sheets, l.max_zip_ratio),
            (d.max_sheets, d.max_zip_ratio)
        );
        assert_eq!(Config::default().extract_limits(), d);
        assert!(Config::from_toml("[extract]\nmax_pagez = 1\n", p).is_err());
        let zero = Config::from_toml("[extract]\nmax_pages = 0\n", p).unwrap();
        let e = zero.validate().unwrap_err().to_string();
        assert!(e.contains("max_pages must be positive"), "{e}");
        let no_attachments = Config::from_toml("[extract]\nmax_attachments = 0\n", p).unwrap();
        no_attachments.validate().unwrap();
        // The worker's budget sits in the same table.
        let c = Config::from_toml("[extract]\nmax_pages = 3\ndeadline_secs = 9\n", p).unwrap();
        c.validate().unwrap();
        assert_eq!(
            (
                c.extract_limits().max_pages,
                c.extract_budget().deadline_secs
            ),
            (3, 9)
        );
        assert_eq!(
            Config::default().extract_budget(),
            airlock_serving::extraction::ExtractBudget::default()
        );
        assert!(Config::from_toml("[extract]\ndeadline_sec = 1\n", p).is_err());
        let e = Config::from_toml("[extract]\nmax_concurrent = 0\n", p)
            .unwrap()
            .validate()
            .unwrap_err()
            .to_string();
        assert!(e.contains("max_concurrent must be between 1 and 64"), "{e}");
    }

    #[test]
    fn defaults_are_loopback_and_local() {
        let c = Config::default();
        c.validate().unwrap();
        assert_eq!(c.addr().to_string(), "127.0.0.1:8080");
        assert_eq!(c.data_dir(), PathBuf::from("./airlock-data"));
        assert_eq!(c.body_limit(), 1 << 20);
        assert_eq!(c.upload_limit(), 32 << 20);
    }

    #[test]
    fn sse_keep_alive_defaults_below_the_idle_timeout() {
        let secs = |c: Config| {
            c.validate().unwrap();
            c.sse_keep_alive().as_secs()
        };
        assert_eq!(secs(Config::default()), 15);
        let short_idle = Config {
            stream_idle_timeout_secs: Some(10),
            ..Config::default()
        };
        assert_eq!(secs(short_idle), 5);
        let tiny_idle = Config {
            stream_idle_timeout_secs: Some(1),
            ..Config::default()
        };
        assert!(
            tiny_idle.validate().is_err(),
            "a 1 s idle timeout leaves no keep-alive room"
        );
        let toml = Config::from_toml("sse_keep_alive_secs = 3\n", Path::new("a.toml")).unwrap();
        assert_eq!(secs(toml), 3);
    }

    #[test]
    fn toml_rejects_unknown_keys() {
        let err = Config::from_toml("port = 9000\nprot = 1\n", Path::new("a.toml")).unwrap_err();
        assert!(err.to_string().contains("prot"), "{err}");
    }

    #[test]
    fn flags_override_file() {
        let file =
            Config::from_toml("port = 9000\nbind = \"0.0.0.0\"\n", Path::new("a.toml")).unwrap();
        let cli = Config {
            port: Some(9100),
            ..Config::default()
        };
        let c = cli.over(file);
        assert_eq!(c.addr().to_string(), "0.0.0.0:9100");
    }

    #[test]
    fn ladder_and_quota_settings_come_from_toml() {
        let c = Config::from_toml(
            "ladder_step_down = [1.0, 2.0, 3.0, 4.0, 5.0]\nladder_recover_hold_secs = 30\n\
             user_tokens_per_minute = 6000\nadmin_requests_per_minute = 100\n\
             queue_deadline_ms = 2500\n",
            Path::new("a.toml"),
        )
        .unwrap();
        c.validate().unwrap();
        let l = c.admission().ladder_config();
        assert_eq!(l.step_down, [1.0, 2.0, 3.0, 4.0, 5.0]);
        assert_eq!(l.recover_hold, Duration::from_secs(30));
        assert_eq!(l.inflight_full, 2, "unset fields keep their defaults");
        let q = c.admission().quotas();
        assert_eq!(q.user.tokens_per_minute, 6000);
        assert_eq!(q.user.requests_per_minute, 0);
        assert_eq!(q.admin.requests_per_minute, 100);
        assert_eq!(c.admission().queue_deadline(), Duration::from_millis(2500));
        assert!(c.admission().ladder_enabled());
        assert!(!c.require_sandbox());
        assert_eq!(c.admission().batch_shed_rung(), 3);
    }

    #[test]
    fn the_rung_five_limit_defaults_from_the_full_level_and_is_validated() {
        let c = Config::default();
        assert_eq!(c.admission().ladder_config().shed_admit_inflight, 3);
        assert_eq!(
            c.admission().ladder_config().wait_full,
            Duration::from_secs(2)
        );
        // Unset: 1.5 x ladder_inflight_full (and stays below rung 5's recovery level).
        let small = Config {
            ladder_inflight_full: Some(1),
            ..Config::default()
        };
        small.validate().unwrap();
        assert_eq!(small.admission().ladder_config().shed_admit_inflight, 2);
        let wide = Config {
            ladder_inflight_full: Some(10),
            ..Config::default()
        };
        wide.validate().unwrap();
        assert_eq!(wide.admission().ladder_config().shed_admit_inflight, 15);
        let tight_queue = Config {
            ladder_inflight_full: Some(16),
            ladder_queue_full: Some(2),
            ..Config::default()
        };
        tight_queue.validate().unwrap();
        assert_eq!(
            tight_queue.admission().ladder_config().shed_admit_inflight,
            4,
            "5 queued / 2 full = 2.5 would hold rung 5"
        );
        let toml = Config::from_toml(
            "ladder_inflight_full = 1
ladder_shed_admit_inflight = 2
",
            Path::new("a.toml"),
        )
        .unwrap();
        toml.validate().unwrap();
        assert_eq!(toml.admission().ladder_config().shed_admit_inflight, 2);
        let field = |c: Config| match c.validate() {
            Err(ConfigError::Invalid { field, .. }) => field,
            other => panic!("{other:?}"),
        };
        for bad in [0, 3] {
            let c = Config {
                ladder_shed_admit_inflight: Some(bad),
                ..toml.clone()
            };
            assert_eq!(field(c), "ladder_shed_admit_inflight", "limit {bad}");
        }
        // Thresholds where one request already holds rung 5 are the ladder's fault.
        let hopeless = Config {
            ladder_inflight_full: Some(1),
            ladder_step_down: Some(vec![0.1, 0.2, 0.3, 0.4, 0.5]),
            ..Config::default()
        };
        assert_eq!(field(hopeless), "ladder");
    }

    #[test]
    fn the_2core_bench_profile_is_valid() {
        let c = Config::from_toml(
            include_str!("../benches/load-2core.toml"),
            Path::new("load-2core.toml"),
        )
        .unwrap();
        c.validate().unwrap();
        let l = c.admission().ladder_config();
        assert_eq!((l.inflight_full, l.shed_admit_inflight), (2, 3));
        assert!(l.shed_admit_inflight <= l.max_shed_admit_inflight());
    }

    #[test]
    fn engine_priority_settings_reach_the_engine_config() {
        use airlock_inference::generate::EngineConfig;
        assert_eq!(
            Config::default().engine_config(),
            EngineConfig {
                decode_stall_factor: Some(DEFAULT_DECODE_STALL_FACTOR),
                ..EngineConfig::default()
            }
        );
        let c = Config::from_toml(
            "engine_max_batch = 2
engine_queue_capacity = 8
engine_batch_max_wait_steps = 0
",
            Path::new("a.toml"),
        )
        .unwrap();
        c.validate().unwrap();
        let e = c.engine_config();
        assert_eq!(
            (
                e.max_batch,
                e.queue_capacity,
                e.batch_queue_capacity,
                e.batch_max_wait_steps
            ),
            (2, 8, 8, 0),
            "the batch queue defaults to at most the interactive one"
        );
        assert_eq!(e.kv_budget_bytes, EngineConfig::default().kv_budget_bytes);
        // Flags over the file, as for every other setting.
        #[derive(clap::Parser)]
        struct Wrap {
            #[command(flatten)]
            config: Config,
        }
        let cli = <Wrap as clap::Parser>::try_parse_from([
            "airlock",
            "--engine-batch-queue-capacity",
            "4",
            "--engine-batch-max-wait-steps",
            "32",
            "--ladder-shed-admit-inflight",
            "4",
        ])
        .unwrap()
        .config;
        let merged = cli.over(c);
        merged.validate().unwrap();
        let e = merged.engine_config();
        assert_eq!(
            (e.max_batch, e.batch_queue_capacity, e.batch_max_wait_steps),
            (2, 4, 32)
        );
        assert_eq!(merged.admission().ladder_config().shed_admit_inflight, 4);
        let field = |c: Config| match c.validate() {
            Err(ConfigError::Invalid { field, .. }) => field,
            other => panic!("{other:?}"),
        };
        let bad = |f: fn(&mut Config)| {
            let mut c = Config::default();
            f(&mut c);
            field(c)
        };
        assert_eq!(bad(|c| c.engine_max_batch = Some(0)), "engine_max_batch");
        for f in [0.5, f64::NAN, 101.0] {
            let c = Config {
                engine_decode_stall_factor: Some(f),
                ..Config::default()
            };
            assert_eq!(field(c), "engine_decode_stall_factor");
        }
        assert_eq!(bad(|c| c.engine_max_batch = Some(256)), "engine_max_batch");
        assert_eq!(
            bad(|c| c.engine_queue_capacity = Some(0)),
            "engine_queue_capacity"
        );
        assert_eq!(
            bad(|c| c.engine_batch_queue_capacity = Some(0)),
            "engine_batch_queue_capacity"
        );
        assert_eq!(
            bad(|c| {
                c.engine_queue_capacity = Some(4);
                c.engine_batch_queue_capacity = Some(5);
            }),
            "engine_batch_queue_capacity"
        );
    }

    #[test]
    fn secrets_are_redacted() {
        let c = Config {
            trusted_header: Some("X-Remote-User".into()),
            trusted_header_secret: Some("very-secret-proxy-value".into()),
            ..Config::default()
        };
        c.validate().unwrap();
        let dbg = format!("{c:?}");
        assert!(!dbg.contains("very-secret"), "{dbg}");
        assert!(dbg.contains("[redacted]"));
    }

    #[test]
    fn validation_refuses_bad_values() {
        let cases = [
            Config {
                body_limit: Some(10),
                ..Config::default()
            },
            Config {
                upload_limit: Some(1024),
                body_limit: Some(4096),
                ..Config::default()
            },
            Config {
                stream_idle_timeout_secs: Some(0),
                ..Config::default()
            },
            Config {
                min_source_similarity: Some(1.5),
                ..Config::default()
            },
            Config {
                min_source_similarity: Some(f32::NAN),
                ..Config::default()
            },
            Config {
                source_focus: Some(1.5),
                ..Config::default()
            },
            Config {
                source_focus: Some(-0.1),
                ..Config::default()
            },
            Config {
                source_focus: Some(f32::NAN),
                ..Config::default()
            },
            Config {
                source_focus_near_copy: Some(1.5),
                ..Config::default()
            },
            Config {
                source_focus_near_copy: Some(f32::NAN),
                ..Config::default()
            },
            Config {
                sse_keep_alive_secs: Some(0),
                ..Config::default()
            },
            Config {
                sse_keep_alive_secs: Some(60),
                ..Config::default()
            },
            Config {
                sse_keep_alive_secs: Some(20),
                stream_idle_timeout_secs: Some(10),
                ..Config::default()
            },
            Config {
                trusted_header: Some("X-User".into()),
                ..Config::default()
            },
            Config {
                trusted_header_secret: Some("0123456789abcdef".into()),
                ..Config::default()
            },
            Config {
                log_format: Some("xml".into()),
                ..Config::default()
            },
            Config {
                top_k: Some(0),
                ..Config::default()
            },
            Config {
                ladder_step_down: Some(vec![1.0, 2.0]),
                ..Config::default()
            },
            Config {
                ladder_step_down: Some(vec![1.0, 3.0, 2.0, 4.0, 5.0]),
                ..Config::default()
            },
            Config {
                ladder_recover_ratio: Some(1.5),
                ..Config::default()
            },
            Config {
                batch_shed_rung: Some(0),
                ..Config::default()
            },
            Config {
                queue_deadline_ms: Some(0),
                ..Config::default()
            },
        ];
        for c in cases {
            assert!(c.validate().is_err(), "{c:?} should be refused");
        }
    }
    #[test]
    fn http_limits_are_checked() {
        let c = Config::default();
        assert_eq!(c.header_read_timeout(), Duration::from_secs(10));
        assert_eq!(c.body_read_timeout(), Duration::from_secs(60));
        assert_eq!((c.max_connections(), c.max_connections_per_ip()), (256, 64));
        assert_eq!((c.max_header_bytes(), c.max_uri_bytes()), (16384, 8192));
        let refused = [
            Config {
                header_read_timeout_secs: Some(0),
                ..Config::default()
            },
            Config {
                body_read_timeout_secs: Some(0),
                ..Config::default()
            },
            Config {
                max_connections: Some(0),
                ..Config::default()
            },
            Config {
                max_connections: Some(8),
                max_connections_per_ip: Some(9),
                ..Config::default()
            },
            Config {
                max_connections_per_ip: Some(0),
                ..Config::default()
            },
            Config {
                max_header_bytes: Some(512),
                ..Config::default()
            },
            Config {
                max_header_bytes: Some((256 << 10) + 1),
                ..Config::default()
            },
            Config {
                max_header_bytes: Some(4096),
                max_uri_bytes: Some(4096),
                ..Config::default()
            },
        ];
        for c in refused {
            assert!(c.validate().is_err(), "{c:?} should be refused");
        }
        let ok = Config {
            max_connections: Some(8),
            max_connections_per_ip: Some(8),
            max_header_bytes: Some(4096),
            max_uri_bytes: Some(1024),
            ..Config::default()
        };
        ok.validate().unwrap();
        let lower = Config {
            max_connections: Some(8),
            ..Config::default()
        };
        lower.validate().unwrap();
        assert_eq!(lower.max_connections_per_ip(), 8);
    }
}
