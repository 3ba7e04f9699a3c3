//! Generators on the bank's inference rack: an OpenAI-compatible engine (vLLM, llm-d,
//! llama.cpp's server) reached over HTTP inside the bank network, behind the same answer path
//! as a local model. Airlock keeps access control, retrieval, the re-check, the prompt and the
//! citations; the upstream gets only the final prompt (system prompt + re-checked sources +
//! question) and streams the answer back.
//!
//! Per replica: requests in flight, the measured time to first token and a circuit breaker
//! ([`replica`]). A request takes a replica slot (conversation-affine or least-loaded), waits
//! in a bounded room when every replica is full, and is refused ([`Refusal`]) when the room is
//! full, its wait runs out or every breaker is open: the chat route then falls back to the
//! local small model where configured, or answers 503 + `Retry-After`. Only a request that
//! never reached an engine (no connection) and is not streaming is retried, on another
//! replica.

use std::hash::{Hash, Hasher};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use airlock_inference::generate::SamplingParams;
use airlock_platform::egress::{self, Call, Method, SendError};
use airlock_rag::Role;
use parking_lot::Mutex;
use prometheus_client::metrics::gauge::Gauge;

pub use crate::rack_metrics::{BackendLabel, FallbackLabel, RackMetrics, ReplicaLabel, TokenLabel};

pub mod config;
pub mod engine_metrics;
pub mod replica;
pub mod stream;
pub mod tls;

pub use config::{RemoteGeneratorConfig, Routing};
use replica::{BreakerConfig, Health, Replica};
pub use stream::{Lease, RemoteStream};

/// The response header set when a request for a remote generator was answered by the local
/// small model.
pub const FALLBACK_HEADER: &str = "x-airlock-model-fallback";

/// Why a remote generator is not used (start-up).
#[derive(Debug, thiserror::Error)]
#[error("remote generator `{alias}`: {reason}")]
pub struct ConnectError {
    /// The alias.
    pub alias: String,
    /// What is wrong.
    pub reason: String,
}

/// Why a request gets no upstream stream.
#[derive(Debug)]
pub enum Refusal {
    /// Every replica is full and the waiting room is full or the wait ran out.
    Saturated {
        /// Suggested `Retry-After`.
        retry_after: Duration,
    },
    /// Every replica's breaker is open.
    Unhealthy {
        /// Until the first breaker lets a trial through.
        retry_after: Duration,
    },
    /// The upstream could not be reached or failed before the first token.
    Failed(String),
    /// The upstream refused the request (4xx): not the rack's health.
    Refused(String),
}

impl Refusal {
    /// The fallback metric's reason.
    pub fn reason(&self) -> &'static str {
        match self {
            Refusal::Saturated { .. } => "saturated",
            Refusal::Unhealthy { .. } => "unhealthy",
            Refusal::Failed(_) | Refusal::Refused(_) => "failed",
        }
    }
}

/// A generator on the rack.
pub struct RemoteGenerator {
    /// The alias clients use.
    pub alias: String,
    /// Its settings.
    pub config: RemoteGeneratorConfig,
    api_key: Option<String>,
    tls: Option<tls::TlsConnector>,
    replicas: Vec<Arc<Replica>>,
    /// Each replica's metrics endpoint (empty without `engine_metrics`).
    metrics: Vec<egress::Upstream>,
    pick: Mutex<()>,
    waiting: AtomicUsize,
    freed: tokio::sync::Notify,
}

impl std::fmt::Debug for RemoteGenerator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RemoteGenerator")
            .field("alias", &self.alias)
            .field("model", &self.config.model)
            .field("base_urls", &self.config.base_urls)
            .field("api_key", &self.api_key.as_ref().map(|_| "[redacted]"))
            .finish_non_exhaustive()
    }
}

impl RemoteGenerator {
    /// Builds the generator (reads the key and CA files) and checks that every replica's
    /// `/v1/models` lists the model: a replica that does not is a start-up error, as is one
    /// that cannot be reached.
    pub async fn connect(config: RemoteGeneratorConfig) -> Result<Arc<Self>, ConnectError> {
        let g = Self::build(config)?;
        for r in &g.replicas {
            let listed = g.list_models(r).await.map_err(|reason| ConnectError {
                alias: g.alias.clone(),
                reason,
            })?;
            if !listed.iter().any(|m| m == &g.config.model) {
                return Err(ConnectError {
                    alias: g.alias.clone(),
                    reason: format!(
                        "{}/models does not list model `{}` (it lists {listed:?}); refusing to \
                         become ready",
                        r.upstream.url, g.config.model
                    ),
                });
            }
            tracing::info!(backend = %g.alias, replica = %r.upstream.authority(),
                model = %g.config.model, "remote generator replica checked");
        }
        if let Some(kind) = g.config.engine_metrics() {
            // The engine must expose what admission is told to read: a wrong kind or URL is a
            // start-up error, not a signal silently missing.
            for (r, m) in g.replicas.iter().zip(&g.metrics) {
                let load = g.scrape(m, kind).await.map_err(|reason| ConnectError {
                    alias: g.alias.clone(),
                    reason: format!("engine_metrics = \"{}\": {reason}", kind.name()),
                })?;
                r.set_engine_load(load, Instant::now());
                tracing::info!(backend = %g.alias, replica = %r.upstream.authority(),
                    metrics = %m.url, waiting = load.waiting, "engine metrics checked");
            }
            // A thread of its own (not the caller's runtime, which may be a start-up one):
            // it ends at the first round after the generator is dropped.
            let weak = Arc::downgrade(&g);
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|e| ConnectError {
                    alias: g.alias.clone(),
                    reason: format!("starting the metrics scraper: {e}"),
                })?;
            std::thread::Builder::new()
                .name("airlock-rack-metrics".into())
                .spawn(move || runtime.block_on(scrape_loop(weak, kind)))
                .map_err(|e| ConnectError {
                    alias: g.alias.clone(),
                    reason: format!("starting the metrics scraper: {e}"),
                })?;
        }
        Ok(g)
    }

    /// One scrape of an engine's metrics endpoint.
    async fn scrape(
        &self,
        m: &egress::Upstream,
        kind: engine_metrics::EngineKind,
    ) -> Result<engine_metrics::EngineLoad, String> {
        let within = self
            .config
            .engine_metrics_interval()
            .max(Duration::from_secs(1));
        let open = Call {
            upstream: m,
            method: Method::GET,
            path: "",
            api_key: self.api_key.as_deref(),
            body: None,
            connect_timeout: self.config.connect_timeout(),
            head_timeout: within,
            tls: self.tls.as_ref(),
        }
        .send()
        .await
        .map_err(|e| format!("{}: {e}", m.url))?;
        let status = open.status();
        let body = egress::read_body(open, 8 << 20, within)
            .await
            .map_err(|e| format!("{}: {e}", m.url))?;
        if !status.is_success() {
            return Err(format!("{} answered {status}", m.url));
        }
        engine_metrics::parse(&body, kind, &self.config.model).ok_or_else(|| {
            format!(
                "{} has no `{}` series (for model `{}`)",
                m.url,
                kind.waiting_metric(),
                self.config.model
            )
        })
    }

    /// Whether the engine behind `r` reports more waiting requests than the bound (a scrape
    /// older than three intervals says nothing).
    fn engine_full(&self, r: &Replica, now: Instant) -> bool {
        let max_age = self.config.engine_metrics_interval() * 3;
        r.engine_load(now, max_age)
            .is_some_and(|l| l.waiting > self.config.engine_waiting_full() as f64)
    }

    /// Builds the generator from its settings (reads the key and CA files; no network).
    pub fn build(config: RemoteGeneratorConfig) -> Result<Arc<Self>, ConnectError> {
        let alias = config.alias.clone();
        let err = |reason: String| ConnectError {
            alias: alias.clone(),
            reason,
        };
        config.check().map_err(|(_, r)| err(r))?;
        let upstreams = config.upstreams().map_err(err)?;
        let metrics = config.metrics_upstreams().map_err(err)?;
        let api_key = match &config.api_key_file {
            Some(p) => {
                let k = std::fs::read_to_string(p)
                    .map_err(|e| err(format!("reading api_key_file {}: {e}", p.display())))?;
                let k = k.trim().to_string();
                if k.is_empty() || k.contains(['\r', '\n']) {
                    return Err(err(format!(
                        "api_key_file {} must hold one non-empty line",
                        p.display()
                    )));
                }
                Some(k)
            }
            None => None,
        };
        let any_tls = upstreams.iter().chain(&metrics).any(|u| u.tls);
        let tls = match (&config.ca_file, any_tls) {
            (Some(ca), true) => Some(tls::TlsConnector::from_ca_file(ca).map_err(err)?),
            _ => None,
        };
        let breaker = BreakerConfig {
            error_rate: config.breaker_error_rate(),
            min_requests: config.breaker_min_requests(),
            window: config.breaker_window(),
            open_for: config.breaker_open(),
        };
        let replicas = upstreams
            .into_iter()
            .enumerate()
            .map(|(i, u)| Arc::new(Replica::new(u, i, breaker)))
            .collect();
        Ok(Arc::new(RemoteGenerator {
            alias: config.alias.clone(),
            config,
            api_key,
            tls,
            replicas,
            metrics,
            pick: Mutex::new(()),
            waiting: AtomicUsize::new(0),
            freed: tokio::sync::Notify::new(),
        }))
    }

    /// The replicas.
    pub fn replicas(&self) -> &[Arc<Replica>] {
        &self.replicas
    }

    /// The `host:port` pairs the daemon connects to (the egress allowlist): the replicas and
    /// their metrics endpoints.
    pub fn endpoints(config: &RemoteGeneratorConfig) -> Vec<(String, u16)> {
        config
            .upstreams()
            .unwrap_or_default()
            .into_iter()
            .chain(config.metrics_upstreams().unwrap_or_default())
            .map(|u| (u.host, u.port))
            .collect()
    }

    async fn list_models(&self, r: &Replica) -> Result<Vec<String>, String> {
        let open = Call {
            upstream: &r.upstream,
            method: Method::GET,
            path: "/models",
            api_key: self.api_key.as_deref(),
            body: None,
            connect_timeout: self.config.connect_timeout(),
            head_timeout: self.config.first_token_timeout(),
            tls: self.tls.as_ref(),
        }
        .send()
        .await
        .map_err(|e| format!("{}/models: {e}", r.upstream.url))?;
        let status = open.status();
        let body = egress::read_body(open, 1 << 20, self.config.first_token_timeout())
            .await
            .map_err(|e| format!("{}/models: {e}", r.upstream.url))?;
        if !status.is_success() {
            return Err(format!(
                "{}/models answered {status}: {}",
                r.upstream.url,
                String::from_utf8_lossy(&body[..body.len().min(200)])
            ));
        }
        let v: serde_json::Value = serde_json::from_slice(&body)
            .map_err(|e| format!("{}/models: not JSON: {e}", r.upstream.url))?;
        Ok(v.get("data")
            .and_then(|d| d.as_array())
            .map(|d| {
                d.iter()
                    .filter_map(|m| m.get("id").and_then(|i| i.as_str()).map(str::to_string))
                    .collect()
            })
            .unwrap_or_default())
    }

    /// A replica slot was given back: wake the waiting room.
    pub(crate) fn slot_freed(&self) {
        self.freed.notify_waiters();
    }

    /// The in-flight limit of `r` now: halved while its measured TTFT is above `ttft_full`.
    fn limit(&self, r: &Replica) -> usize {
        let max = self.config.max_inflight();
        match r.ttft() {
            Some(t) if t > self.config.ttft_full() => (max / 2).max(1),
            _ => max,
        }
    }

    /// Takes a slot on the best replica with room, skipping `exclude`.
    fn try_pick(
        self: &Arc<Self>,
        affinity: Option<&str>,
        exclude: &[usize],
    ) -> Result<Option<Lease>, Refusal> {
        let _g = self.pick.lock();
        let now = Instant::now();
        let usable: Vec<&Arc<Replica>> = self
            .replicas
            .iter()
            .filter(|r| !exclude.contains(&r.index) && r.health(now) != Health::Open)
            .collect();
        if usable.is_empty() {
            let retry_after = self
                .replicas
                .iter()
                .filter_map(|r| r.open_remaining(now))
                .min()
                .unwrap_or(Duration::from_secs(1));
            return Err(Refusal::Unhealthy {
                retry_after: retry_after.max(Duration::from_secs(1)),
            });
        }
        let room = |r: &Arc<Replica>| r.inflight() < self.limit(r) && !self.engine_full(r, now);
        let preferred = match (self.config.routing(), affinity) {
            (Routing::Conversation, Some(key)) => {
                let mut h = std::collections::hash_map::DefaultHasher::new();
                key.hash(&mut h);
                let i = (h.finish() % self.replicas.len() as u64) as usize;
                usable
                    .iter()
                    .copied()
                    .find(|r| r.index == i)
                    .filter(|r| room(r))
            }
            _ => None,
        };
        let chosen = preferred.or_else(|| {
            usable.iter().copied().filter(|r| room(r)).min_by(|a, b| {
                a.inflight()
                    .cmp(&b.inflight())
                    .then(a.ttft().cmp(&b.ttft()))
                    .then(a.index.cmp(&b.index))
            })
        });
        Ok(chosen.map(|r| {
            r.take(now);
            Lease {
                generator: self.clone(),
                replica: r.clone(),
                settled: false,
            }
        }))
    }

    /// Waits for a replica slot in the bounded waiting room.
    pub async fn acquire(
        self: &Arc<Self>,
        affinity: Option<&str>,
        exclude: &[usize],
        metrics: &RackMetrics,
    ) -> Result<Lease, Refusal> {
        if let Some(l) = self.try_pick(affinity, exclude)? {
            return Ok(l);
        }
        let retry_after = self.config.queue_timeout().max(Duration::from_secs(1));
        if self.waiting.fetch_add(1, Ordering::SeqCst) >= self.config.queue_capacity() {
            self.waiting.fetch_sub(1, Ordering::SeqCst);
            return Err(Refusal::Saturated { retry_after });
        }
        let label = BackendLabel {
            backend: self.alias.clone(),
        };
        metrics.waiting.get_or_create(&label).inc();
        struct Waiting<'a>(&'a AtomicUsize, Gauge);
        impl Drop for Waiting<'_> {
            fn drop(&mut self) {
                self.0.fetch_sub(1, Ordering::SeqCst);
                self.1.dec();
            }
        }
        let _w = Waiting(&self.waiting, metrics.waiting.get_or_create(&label).clone());
        let until = tokio::time::Instant::now() + self.config.queue_timeout();
        loop {
            let freed = self.freed.notified();
            tokio::pin!(freed);
            freed.as_mut().enable();
            if let Some(l) = self.try_pick(affinity, exclude)? {
                return Ok(l);
            }
            if tokio::time::timeout_at(until, freed).await.is_err() {
                return Err(Refusal::Saturated { retry_after });
            }
        }
    }

    /// Sends the final prompt to the leased replica and waits for the response head.
    pub async fn start(
        &self,
        mut lease: Lease,
        conversation: &[(Role, String)],
        params: &SamplingParams,
        metrics: &RackMetrics,
    ) -> Result<RemoteStream, (Refusal, bool)> {
        let messages: Vec<serde_json::Value> = conversation
            .iter()
            .map(|(r, t)| serde_json::json!({"role": r.as_str(), "content": t}))
            .collect();
        let mut body = serde_json::json!({
            "model": self.config.model,
            "messages": messages,
            "stream": true,
            "max_tokens": params.max_tokens,
            "temperature": params.temperature,
            "top_p": params.top_p,
        });
        if let Some(seed) = params.seed {
            body["seed"] = seed.into();
        }
        if !params.stop_strings.is_empty() {
            body["stop"] = params.stop_strings.clone().into();
        }
        if self.config.request_usage() {
            body["stream_options"] = serde_json::json!({"include_usage": true});
        }
        let prompt_estimate = estimate_tokens(conversation);
        let sent_at = Instant::now();
        let sent = Call {
            upstream: &lease.replica.upstream,
            method: Method::POST,
            path: "/chat/completions",
            api_key: self.api_key.as_deref(),
            body: Some(serde_json::to_vec(&body).unwrap_or_default()),
            connect_timeout: self.config.connect_timeout(),
            head_timeout: self.config.first_token_timeout(),
            tls: self.tls.as_ref(),
        }
        .send()
        .await;
        let open = match sent {
            Ok(o) => o,
            Err(e) => {
                let unreached = matches!(e, SendError::Unreached(_));
                tracing::warn!(backend = %self.alias,
                    replica = %lease.replica.upstream.authority(), error = %e,
                    "upstream request failed");
                lease.settle(true, metrics);
                return Err((Refusal::Failed(e.to_string()), unreached));
            }
        };
        let status = open.status();
        if !status.is_success() {
            let within = Duration::from_secs(5);
            let text = egress::read_body(open, 4096, within)
                .await
                .unwrap_or_default();
            let text = String::from_utf8_lossy(&text).into_owned();
            tracing::warn!(backend = %self.alias, replica = %lease.replica.upstream.authority(),
                %status, body = %text, "upstream refused the request");
            // 5xx and 429 are the rack's trouble; another 4xx is this request's.
            if status.is_server_error() || status.as_u16() == 429 {
                lease.settle(true, metrics);
                // A 503/429 is the engine refusing before it started: never reached it.
                let unreached = matches!(status.as_u16(), 503 | 429);
                return Err((Refusal::Failed(format!("upstream {status}")), unreached));
            }
            lease.settle(false, metrics);
            return Err((
                Refusal::Refused(format!("upstream {status}: {text}")),
                false,
            ));
        }
        Ok(RemoteStream {
            open,
            lease,
            metrics: metrics.clone(),
            sent_at,
            first_token_timeout: self.config.first_token_timeout(),
            idle_timeout: self.config.idle_timeout(),
            prompt_estimate,
            buf: Vec::new(),
            pending: Default::default(),
            tokens: 0,
            last_token_at: sent_at,
            finish: None,
            usage: None,
            ended: false,
        })
    }

    /// Acquires a slot and starts the generation; a non-streaming request whose upstream was
    /// never reached is retried once per other replica.
    pub async fn open(
        self: &Arc<Self>,
        affinity: Option<&str>,
        conversation: &[(Role, String)],
        params: &SamplingParams,
        retry: bool,
        metrics: &RackMetrics,
    ) -> Result<RemoteStream, Refusal> {
        let mut tried: Vec<usize> = Vec::new();
        loop {
            let lease = self.acquire(affinity, &tried, metrics).await?;
            let index = lease.replica.index;
            match self.start(lease, conversation, params, metrics).await {
                Ok(s) => return Ok(s),
                Err((refusal, unreached)) => {
                    tried.push(index);
                    if retry && unreached && tried.len() < self.replicas.len() {
                        metrics
                            .retries
                            .get_or_create(&BackendLabel {
                                backend: self.alias.clone(),
                            })
                            .inc();
                        continue;
                    }
                    return Err(refusal);
                }
            }
        }
    }

    /// Copies the replicas' gauges into the metrics (before an exposition).
    pub fn refresh_gauges(&self, metrics: &RackMetrics) {
        let now = Instant::now();
        for r in &self.replicas {
            let label = ReplicaLabel {
                backend: self.alias.clone(),
                replica: r.upstream.authority(),
            };
            metrics
                .inflight
                .get_or_create(&label)
                .set(r.inflight() as i64);
            metrics
                .breaker_open
                .get_or_create(&label)
                .set(i64::from(r.is_open(now)));
            if self.config.engine_metrics().is_some() {
                let max_age = self.config.engine_metrics_interval() * 3;
                let load = r.engine_load(now, max_age);
                // -1: no fresh scrape (admission then uses Airlock's own signals only).
                let (waiting, running) = load.map_or((-1, -1), |l| {
                    (l.waiting as i64, l.running.map_or(-1, |v| v as i64))
                });
                metrics.engine_waiting.get_or_create(&label).set(waiting);
                metrics.engine_running.get_or_create(&label).set(running);
            }
        }
    }
}

/// Scrapes every replica's engine metrics each interval while the generator lives; wakes the
/// waiting room after each round (a replica may have room again).
async fn scrape_loop(g: std::sync::Weak<RemoteGenerator>, kind: engine_metrics::EngineKind) {
    let mut failing: Vec<bool> = Vec::new();
    loop {
        let interval = match g.upgrade() {
            Some(g) => g.config.engine_metrics_interval(),
            None => return,
        };
        tokio::time::sleep(interval).await;
        let Some(g) = g.upgrade() else { return };
        failing.resize(g.replicas.len(), false);
        for (i, (r, m)) in g.replicas.iter().zip(&g.metrics).enumerate() {
            match g.scrape(m, kind).await {
                Ok(load) => {
                    r.set_engine_load(load, Instant::now());
                    failing[i] = false;
                }
                Err(e) => {
                    // Logged once per failing run, not every interval.
                    if !failing[i] {
                        tracing::warn!(backend = %g.alias, replica = %r.upstream.authority(),
                            error = %e, "engine metrics scrape failed; admission uses \
                            Airlock's own signals for this replica until it recovers");
                    }
                    failing[i] = true;
                }
            }
        }
        g.slot_freed();
    }
}

/// An upper estimate of a conversation's prompt tokens before the upstream's usage is known
/// (the quota reservation; settled with the real count): one token per 3 bytes plus the
/// template's few tokens per message.
pub fn estimate_tokens(conversation: &[(Role, String)]) -> usize {
    conversation.iter().map(|(_, t)| t.len() / 3 + 8).sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rack(routing: &str, replicas: usize, max: usize) -> Arc<RemoteGenerator> {
        let urls: Vec<String> = (0..replicas)
            .map(|i| format!("http://127.0.0.1:{}/v1", 9000 + i))
            .collect();
        let c: RemoteGeneratorConfig = toml::from_str(&format!(
            "alias = \"r\"\nkind = \"openai-compatible\"\nbase_urls = {urls:?}\n\
             model = \"m\"\nrouting = \"{routing}\"\nmax_inflight_per_replica = {max}\n"
        ))
        .unwrap();
        RemoteGenerator::build(c).unwrap()
    }

    fn pick(g: &Arc<RemoteGenerator>, key: Option<&str>) -> Option<Lease> {
        g.try_pick(key, &[]).unwrap()
    }

    #[test]
    fn a_thread_stays_on_its_replica_while_it_has_room() {
        let g = rack("conversation", 3, 2);
        let first = pick(&g, Some("thread-a")).unwrap();
        let home = first.replica().index;
        // Its replica is now the busiest, yet the thread's next turn goes there.
        let second = pick(&g, Some("thread-a")).unwrap();
        assert_eq!(second.replica().index, home);
        // Full (2 in flight): the next turn goes to the least-loaded other replica.
        let third = pick(&g, Some("thread-a")).unwrap();
        assert_ne!(third.replica().index, home);
        drop((first, second));
        assert_eq!(pick(&g, Some("thread-a")).unwrap().replica().index, home);
    }

    #[test]
    fn least_loaded_spreads_and_a_full_rack_has_no_slot() {
        let g = rack("least-loaded", 2, 1);
        let a = pick(&g, Some("thread-a")).unwrap();
        let b = pick(&g, Some("thread-a")).unwrap();
        assert_ne!(a.replica().index, b.replica().index);
        assert!(pick(&g, None).is_none());
        drop(a);
        assert!(pick(&g, None).is_some());
    }

    #[test]
    fn open_breakers_make_the_rack_unhealthy_and_skip_the_replica() {
        let g = rack("least-loaded", 2, 4);
        for _ in 0..4 {
            g.replicas[0].record(true);
        }
        for _ in 0..3 {
            assert_eq!(pick(&g, None).unwrap().replica().index, 1);
        }
        for _ in 0..4 {
            g.replicas[1].record(true);
        }
        match g.try_pick(None, &[]) {
            Err(Refusal::Unhealthy { retry_after }) => {
                assert!(retry_after >= Duration::from_secs(1))
            }
            other => panic!("{:?}", other.map(|l| l.map(|l| l.replica().index))),
        }
    }

    #[test]
    fn a_slow_replica_takes_half_its_limit() {
        let g = rack("least-loaded", 1, 4);
        g.replicas[0].observe_ttft(Duration::from_secs(30));
        let held: Vec<Lease> = std::iter::from_fn(|| pick(&g, None)).take(10).collect();
        assert_eq!(held.len(), 2);
    }

    #[test]
    fn the_estimate_is_above_a_real_tokenizer_count_for_english() {
        // SmolLM2's tokenizer gives ~1 token per 4.3 bytes of English prose.
        let text = "The liquidity buffer must stay above 15 percent of deposits at all times.";
        assert!(estimate_tokens(&[(Role::User, text.into())]) >= text.len() / 4);
    }
}
