//! `[[remote_generators]]`: a generator on the bank's inference rack, reached over its
//! OpenAI-compatible API (vLLM, llm-d, llama.cpp's server). TOML only.

use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

use airlock_platform::egress::Upstream;

/// One `[[remote_generators]]` entry.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct RemoteGeneratorConfig {
    /// The model name clients use (`"model": "airlock-rack"`); must not be a bundle alias.
    pub alias: String,
    /// The upstream's protocol: only `openai-compatible`.
    pub kind: String,
    /// One URL per replica, each ending in the API root (`http://10.1.2.3:8000/v1`).
    pub base_urls: Vec<String>,
    /// The upstream's model id, as its `/v1/models` lists it.
    pub model: String,
    /// A file holding the bearer token sent upstream (read once at start-up).
    #[serde(default)]
    pub api_key_file: Option<PathBuf>,
    /// A PEM file of the CA that signs the upstream's certificate (https upstreams).
    #[serde(default)]
    pub ca_file: Option<PathBuf>,
    /// Milliseconds to open a TCP connection to a replica [default: 2000].
    #[serde(default)]
    pub connect_timeout_ms: Option<u64>,
    /// Milliseconds from sending a request to its first token [default: 60000].
    #[serde(default)]
    pub first_token_timeout_ms: Option<u64>,
    /// Milliseconds the upstream stream may stay silent between two tokens [default: 30000].
    #[serde(default)]
    pub idle_timeout_ms: Option<u64>,
    /// Requests Airlock keeps in flight to one replica [default: 4; 1 for llama-cpp-python's
    /// server, which runs one request at a time].
    #[serde(default)]
    pub max_inflight_per_replica: Option<usize>,
    /// Requests that may wait for a replica slot; more are shed (503 + Retry-After) or fall
    /// back [default: 16; 0: no queue].
    #[serde(default)]
    pub queue_capacity: Option<usize>,
    /// Milliseconds a request may wait for a replica slot [default: 10000].
    #[serde(default)]
    pub queue_timeout_ms: Option<u64>,
    /// A replica whose measured time to first token (EWMA) is above this many milliseconds
    /// takes half its in-flight limit [default: 10000].
    #[serde(default)]
    pub ttft_full_ms: Option<u64>,
    /// `conversation` (a thread's turns go to the same healthy replica, for the engine's prefix
    /// cache) or `least-loaded` [default: conversation].
    #[serde(default)]
    pub routing: Option<String>,
    /// Error share over the last `breaker_window` requests that opens a replica's breaker
    /// [default: 0.5].
    #[serde(default)]
    pub breaker_error_rate: Option<f64>,
    /// Outcomes the breaker needs before it may open [default: 4].
    #[serde(default)]
    pub breaker_min_requests: Option<usize>,
    /// Outcomes the breaker remembers [default: 20].
    #[serde(default)]
    pub breaker_window: Option<usize>,
    /// Seconds an open breaker keeps a replica out before one trial request [default: 15].
    #[serde(default)]
    pub breaker_open_secs: Option<u64>,
    /// When the rack is saturated or unhealthy, answer with the bundle's small local model
    /// instead of 503 (`X-Airlock-Model-Fallback: true`, `airlock_model_fallback_total`)
    /// [default: false].
    #[serde(default)]
    pub fallback_to_local: Option<bool>,
    /// Send `stream_options.include_usage` upstream (servers that reject it: false)
    /// [default: true].
    #[serde(default)]
    pub request_usage: Option<bool>,
    /// The engine's own load from its Prometheus `/metrics`: `vllm`
    /// (`vllm:num_requests_waiting`, `vllm:num_requests_running`), `llamacpp` (`llama-server
    /// --metrics`: `llamacpp:requests_deferred`, `llamacpp:requests_processing`) or `none`
    /// [default: none].
    #[serde(default)]
    pub engine_metrics: Option<String>,
    /// One metrics URL per replica, in `base_urls` order [default: each base URL's
    /// `scheme://host:port` + `/metrics`].
    #[serde(default)]
    pub metrics_urls: Option<Vec<String>>,
    /// A replica whose engine reports more waiting requests than this counts as full
    /// [default: 0].
    #[serde(default)]
    pub engine_waiting_full: Option<u64>,
    /// Milliseconds between two scrapes of each replica's metrics [default: 1000]; a scrape
    /// older than three intervals is ignored.
    #[serde(default)]
    pub engine_metrics_interval_ms: Option<u64>,
}

/// The one kind implemented.
pub const KIND: &str = "openai-compatible";

/// How requests are spread across replicas.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Routing {
    /// The same thread to the same replica while it is healthy and has room.
    Conversation,
    /// The replica with the fewest requests in flight.
    LeastLoaded,
}

impl RemoteGeneratorConfig {
    /// Connect timeout.
    pub fn connect_timeout(&self) -> Duration {
        Duration::from_millis(self.connect_timeout_ms.unwrap_or(2000))
    }
    /// First-token timeout.
    pub fn first_token_timeout(&self) -> Duration {
        Duration::from_millis(self.first_token_timeout_ms.unwrap_or(60_000))
    }
    /// Between-token timeout.
    pub fn idle_timeout(&self) -> Duration {
        Duration::from_millis(self.idle_timeout_ms.unwrap_or(30_000))
    }
    /// In-flight limit per replica.
    pub fn max_inflight(&self) -> usize {
        self.max_inflight_per_replica.unwrap_or(4)
    }
    /// Waiting-room size.
    pub fn queue_capacity(&self) -> usize {
        self.queue_capacity.unwrap_or(16)
    }
    /// Waiting-room deadline.
    pub fn queue_timeout(&self) -> Duration {
        Duration::from_millis(self.queue_timeout_ms.unwrap_or(10_000))
    }
    /// TTFT above which a replica counts as saturated.
    pub fn ttft_full(&self) -> Duration {
        Duration::from_millis(self.ttft_full_ms.unwrap_or(10_000))
    }
    /// Routing policy.
    pub fn routing(&self) -> Routing {
        match self.routing.as_deref() {
            Some("least-loaded") => Routing::LeastLoaded,
            _ => Routing::Conversation,
        }
    }
    /// Breaker error share.
    pub fn breaker_error_rate(&self) -> f64 {
        self.breaker_error_rate.unwrap_or(0.5)
    }
    /// Breaker minimum outcomes.
    pub fn breaker_min_requests(&self) -> usize {
        self.breaker_min_requests.unwrap_or(4)
    }
    /// Breaker memory.
    pub fn breaker_window(&self) -> usize {
        self.breaker_window.unwrap_or(20)
    }
    /// Breaker open time.
    pub fn breaker_open(&self) -> Duration {
        Duration::from_secs(self.breaker_open_secs.unwrap_or(15))
    }
    /// Whether saturation or ill health falls back to the local small model.
    pub fn fallback_to_local(&self) -> bool {
        self.fallback_to_local.unwrap_or(false)
    }
    /// Whether `stream_options.include_usage` is sent.
    pub fn request_usage(&self) -> bool {
        self.request_usage.unwrap_or(true)
    }

    /// Which engine metrics are scraped (`None`: none).
    pub fn engine_metrics(&self) -> Option<super::engine_metrics::EngineKind> {
        self.engine_metrics
            .as_deref()
            .and_then(super::engine_metrics::EngineKind::parse)
            .flatten()
    }
    /// The waiting count above which a replica is full.
    pub fn engine_waiting_full(&self) -> u64 {
        self.engine_waiting_full.unwrap_or(0)
    }
    /// Scrape interval.
    pub fn engine_metrics_interval(&self) -> Duration {
        Duration::from_millis(self.engine_metrics_interval_ms.unwrap_or(1000))
    }

    /// The replicas' endpoints (validated).
    pub fn upstreams(&self) -> Result<Vec<Upstream>, String> {
        self.base_urls.iter().map(|u| Upstream::parse(u)).collect()
    }

    /// Each replica's metrics endpoint (validated), when engine metrics are scraped.
    pub fn metrics_upstreams(&self) -> Result<Vec<Upstream>, String> {
        if self.engine_metrics().is_none() {
            return Ok(Vec::new());
        }
        match &self.metrics_urls {
            Some(urls) => urls.iter().map(|u| Upstream::parse(u)).collect(),
            None => self
                .upstreams()?
                .into_iter()
                .map(|u| {
                    let scheme = if u.tls { "https" } else { "http" };
                    Upstream::parse(&format!("{scheme}://{}/metrics", u.authority()))
                })
                .collect(),
        }
    }

    /// Checks every value; the error names the field.
    pub fn check(&self) -> Result<(), (&'static str, String)> {
        let bad = |f: &'static str, r: &str| Err((f, format!("`{}`: {r}", self.alias)));
        if self.alias.is_empty() || self.alias.len() > 64 {
            return bad("remote_generators.alias", "must be 1 to 64 characters");
        }
        if self.kind != KIND {
            return bad(
                "remote_generators.kind",
                &format!("`{}` is not `{KIND}`", self.kind),
            );
        }
        if self.base_urls.is_empty() || self.base_urls.len() > 64 {
            return bad("remote_generators.base_urls", "needs 1 to 64 replica URLs");
        }
        let ups = self.upstreams().map_err(|r| {
            (
                "remote_generators.base_urls",
                format!("`{}`: {r}", self.alias),
            )
        })?;
        if ups.iter().any(|u| u.tls) && self.ca_file.is_none() {
            return bad(
                "remote_generators.ca_file",
                "an https upstream needs the CA that signs its certificate (no system roots)",
            );
        }
        if self.model.is_empty() {
            return bad("remote_generators.model", "must not be empty");
        }
        self.check_limits()?;
        self.check_breaker()?;
        self.check_engine_metrics()
    }

    /// The in-flight, queue and timeout limits and the routing.
    fn check_limits(&self) -> Result<(), (&'static str, String)> {
        let bad = |f: &'static str, r: &str| Err((f, format!("`{}`: {r}", self.alias)));
        if !(1..=4096).contains(&self.max_inflight()) {
            return bad(
                "remote_generators.max_inflight_per_replica",
                "must be between 1 and 4096",
            );
        }
        if self.queue_capacity() > 1 << 16 {
            return bad("remote_generators.queue_capacity", "must be at most 65536");
        }
        for (f, v) in [
            (
                "remote_generators.connect_timeout_ms",
                self.connect_timeout_ms,
            ),
            (
                "remote_generators.first_token_timeout_ms",
                self.first_token_timeout_ms,
            ),
            ("remote_generators.idle_timeout_ms", self.idle_timeout_ms),
            ("remote_generators.queue_timeout_ms", self.queue_timeout_ms),
            ("remote_generators.ttft_full_ms", self.ttft_full_ms),
            (
                "remote_generators.breaker_open_secs",
                self.breaker_open_secs,
            ),
        ] {
            if v == Some(0) {
                return bad(f, "must be at least 1");
            }
        }
        match self.routing.as_deref() {
            None | Some("conversation") | Some("least-loaded") => Ok(()),
            Some(_) => bad(
                "remote_generators.routing",
                "must be `conversation` or `least-loaded`",
            ),
        }
    }

    /// The circuit breaker's settings.
    fn check_breaker(&self) -> Result<(), (&'static str, String)> {
        let bad = |f: &'static str, r: &str| Err((f, format!("`{}`: {r}", self.alias)));
        if !(self.breaker_error_rate() > 0.0 && self.breaker_error_rate() <= 1.0) {
            return bad("remote_generators.breaker_error_rate", "must be in (0, 1]");
        }
        if self.breaker_min_requests() == 0 || self.breaker_min_requests() > self.breaker_window() {
            return bad(
                "remote_generators.breaker_min_requests",
                "must be between 1 and breaker_window",
            );
        }
        if self.breaker_window() > 10_000 {
            return bad("remote_generators.breaker_window", "must be at most 10000");
        }
        Ok(())
    }

    /// The engine-metrics scrape: its kind, URLs and interval.
    fn check_engine_metrics(&self) -> Result<(), (&'static str, String)> {
        let bad = |f: &'static str, r: &str| Err((f, format!("`{}`: {r}", self.alias)));
        if let Some(v) = &self.engine_metrics
            && super::engine_metrics::EngineKind::parse(v).is_none()
        {
            return bad(
                "remote_generators.engine_metrics",
                "must be `vllm`, `llamacpp` or `none`",
            );
        }
        if self.metrics_urls.is_some() && self.engine_metrics().is_none() {
            return bad(
                "remote_generators.metrics_urls",
                "set engine_metrics (`vllm` or `llamacpp`) to scrape them",
            );
        }
        if let Some(urls) = &self.metrics_urls
            && urls.len() != self.base_urls.len()
        {
            return bad(
                "remote_generators.metrics_urls",
                "needs one URL per base_urls entry, in the same order",
            );
        }
        let metrics = self.metrics_upstreams().map_err(|r| {
            (
                "remote_generators.metrics_urls",
                format!("`{}`: {r}", self.alias),
            )
        })?;
        if metrics.iter().any(|u| u.tls) && self.ca_file.is_none() {
            return bad(
                "remote_generators.ca_file",
                "an https metrics URL needs the CA that signs its certificate",
            );
        }
        if !(100..=600_000).contains(&self.engine_metrics_interval().as_millis()) {
            return bad(
                "remote_generators.engine_metrics_interval_ms",
                "must be between 100 and 600000",
            );
        }
        if self.engine_waiting_full() > 1 << 20 {
            return bad(
                "remote_generators.engine_waiting_full",
                "must be at most 1048576",
            );
        }
        Ok(())
    }
}

/// Checks every `[[remote_generators]]` entry and that no alias is configured twice; the error
/// names the field.
pub fn check_all(entries: &[RemoteGeneratorConfig]) -> Result<(), (&'static str, String)> {
    for (i, r) in entries.iter().enumerate() {
        r.check()?;
        if entries[..i].iter().any(|o| o.alias == r.alias) {
            return Err((
                "remote_generators.alias",
                format!("`{}` is configured twice", r.alias),
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use serde::Deserialize;

    use super::{RemoteGeneratorConfig, check_all};

    const ISSUE: &str = r#"
[[remote_generators]]
alias = "airlock-rack"                       # the model name clients use
kind = "openai-compatible"
base_urls = ["http://10.1.2.3:8000/v1"]      # one or more replicas
model = "qwen2.5-7b-instruct"                # the upstream's model id
api_key_file = "/etc/airlock/rack.key"       # optional
ca_file = "/etc/airlock/bank-ca.pem"         # optional, for https upstreams
first_token_timeout_ms = 30000
"#;

    /// The section as the root config file holds it.
    #[derive(Deserialize)]
    struct File {
        remote_generators: Vec<RemoteGeneratorConfig>,
    }

    fn load(text: &str) -> Result<Vec<RemoteGeneratorConfig>, String> {
        let f: File = toml::from_str(text).map_err(|e| e.to_string())?;
        check_all(&f.remote_generators).map_err(|(field, reason)| format!("{field}: {reason}"))?;
        Ok(f.remote_generators)
    }

    fn refused(text: &str) -> String {
        match load(text) {
            Err(e) => e,
            Ok(_) => panic!("accepted:\n{text}"),
        }
    }

    #[test]
    fn the_issue_form_parses_and_validates() {
        let c = load(ISSUE).unwrap();
        let r = &c[0];
        assert_eq!(r.alias, "airlock-rack");
        assert_eq!(r.model, "qwen2.5-7b-instruct");
        assert_eq!(r.first_token_timeout().as_millis(), 30_000);
        assert_eq!(r.upstreams().unwrap()[0].authority(), "10.1.2.3:8000");
    }

    #[test]
    fn bad_entries_are_refused_by_name() {
        let e = refused(&ISSUE.replace("kind = \"openai-compatible\"", "kind = \"grpc\""));
        assert!(e.contains("remote_generators.kind"), "{e}");
        let e = refused(&format!("{ISSUE}retries = 3\n"));
        assert!(e.contains("unknown field `retries`"), "{e}");
        let e = refused(
            &ISSUE
                .replace("http://10.1.2.3", "https://10.1.2.3")
                .replace("ca_file = \"/etc/airlock/bank-ca.pem\"", ""),
        );
        assert!(e.contains("remote_generators.ca_file"), "{e}");
        let e = refused(&format!("{ISSUE}{ISSUE}"));
        assert!(e.contains("configured twice"), "{e}");
        let e = refused(&ISSUE.replace("http://10.1.2.3:8000/v1", "10.1.2.3:8000"));
        assert!(e.contains("remote_generators.base_urls"), "{e}");
        let e = refused(&format!("{ISSUE}routing = \"random\"\n"));
        assert!(e.contains("remote_generators.routing"), "{e}");
        let e = refused(&format!("{ISSUE}engine_metrics = \"tgi\"\n"));
        assert!(e.contains("remote_generators.engine_metrics"), "{e}");
        let e = refused(&format!(
            "{ISSUE}metrics_urls = [\"http://10.1.2.3:8000/metrics\"]\n"
        ));
        assert!(e.contains("set engine_metrics"), "{e}");
        let e = refused(&format!(
            "{ISSUE}engine_metrics = \"vllm\"\nmetrics_urls = [\"http://a:1/m\", \"http://b:1/m\"]\n"
        ));
        assert!(e.contains("one URL per base_urls entry"), "{e}");
        let e = refused(&format!(
            "{ISSUE}engine_metrics = \"vllm\"\nengine_metrics_interval_ms = 10\n"
        ));
        assert!(e.contains("engine_metrics_interval_ms"), "{e}");
    }

    #[test]
    fn engine_metrics_default_to_each_replica_s_origin() {
        let c = load(&format!(
            "{}engine_metrics = \"vllm\"\n",
            ISSUE.replace(
                "[\"http://10.1.2.3:8000/v1\"]",
                "[\"http://10.1.2.3:8000/v1\", \"http://10.1.2.4:8001/v1\"]"
            )
        ))
        .unwrap();
        let r = &c[0];
        let m: Vec<String> = r
            .metrics_upstreams()
            .unwrap()
            .iter()
            .map(|u| format!("{}{}", u.authority(), u.root))
            .collect();
        assert_eq!(m, ["10.1.2.3:8000/metrics", "10.1.2.4:8001/metrics"]);
        assert_eq!(r.engine_waiting_full(), 0);
    }
}
