//! Overload benchmark of the degradation ladder (issue 7): the real daemon on a loopback socket
//! (`airlock::server::serve`, the real router, admission, retrieval and the SmolLM2 engine) over
//! a bank-dev subset with `iam_v1`, driven by real HTTP clients (ureq, one thread per request)
//! streaming chat completions over SSE.
//!
//! 1. **Capacity**: closed-loop clients at each concurrency of `AIRLOCK_LOAD_CONCURRENCY` with the
//!    ladder off; capacity = the highest sustained completion rate. The concurrency-1 run gives
//!    the unloaded TTFT, from which the TTFT SLO is derived (3 × its p50, at least 1 s, unless
//!    `AIRLOCK_LOAD_SLO_MS` sets it).
//! 2. **Overload**: open-loop Poisson arrivals at each multiple of the capacity
//!    (`AIRLOCK_LOAD_MULTIPLES`, default 0.5,1,2,4) for `AIRLOCK_LOAD_SECS` each, with the ladder on
//!    and off, against a fresh daemon per phase (same models and stores, rung 0 at the start).
//!    Clients give up after `AIRLOCK_LOAD_CLIENT_TIMEOUT_SECS` (a person leaving).
//!
//! Per phase: offered/completed/503/504/429 counts, goodput (completed with TTFT ≤ SLO, per second
//! of the arrival window), TTFT and TPOT p50/p99, 503 latency p99, the `X-Airlock-Rung`
//! histogram, the completions served at rung 5 (the load-driven rung 5 sheds only the excess
//! over `ladder_shed_admit_inflight` and serves the rest), the share of time the controller
//! spent at each rung, the largest admission queue, and the peak RSS of the process (VmRSS
//! sampled every 100 ms; the clients are threads of the same process, their share is small).
//!
//! `cargo bench -p airlock --bench load` (≈ 10 min on the 2-core box; results and why the
//! defaults use a plain chat turn in `docs/benchmarks/ladder.md`). Env: `AIRLOCK_LOAD_DOCS`
//! (default 10), `AIRLOCK_LOAD_SECS` (60 per phase), `AIRLOCK_LOAD_CAP_SECS` (30 per
//! concurrency), `AIRLOCK_LOAD_CONCURRENCY` (1,4), `AIRLOCK_LOAD_MAX_TOKENS` (16),
//! `AIRLOCK_LOAD_TOP_K` (0 = no retrieval, a plain chat turn; n = a RAG prompt of n chunks),
//! `AIRLOCK_LOAD_CAPACITY` (req/s: use instead of the measured capacity), `AIRLOCK_LOAD_SLO_MS`,
//! `AIRLOCK_LOAD_CLIENT_TIMEOUT_SECS` (30), `AIRLOCK_LOAD_MULTIPLES` (0.5,1,2,4),
//! `AIRLOCK_LOAD_MODES` (on,off), `AIRLOCK_LOAD_CONFIG` (a daemon TOML file, e.g.
//! `appliance/benches/load-2core.toml`; the off mode sets `ladder = false` over it; `engine_*`
//! settings are refused: the bench loads its generator once, with the engine defaults),
//! `AIRLOCK_LOAD_SEED` (7, + the multiple's index); `AIRLOCK_MODELS_DIR`, `AIRLOCK_SHARED_DIR`.
//!
//! **The rack** (issue 25), `AIRLOCK_LOAD_RACK=1`: the same phases against a remote generator.
//! The bench starts a real llama.cpp server (`python3 -m llama_cpp.server`, PyPI
//! `llama-cpp-python[server]`) serving SmolLM2's GGUF on a free loopback port with
//! `AIRLOCK_LOAD_RACK_THREADS` threads (default 1), points the first `[[remote_generators]]`
//! entry of the config file (default `appliance/benches/load-rack.toml`) at it, and every chat
//! names that alias. Each phase connects a fresh remote generator (idle replica, closed breaker).
//! Ladder off also lifts the rack's own admission (`max_inflight_per_replica` 4096,
//! `queue_capacity` 0: every request goes to the engine, whose queue then grows); after each
//! phase the bench waits until the engine has drained (its `/v1/models` waits behind every
//! queued generation). Extra columns: 503s from the rack's admission, answers that fell back to
//! the local model (`X-Airlock-Model-Fallback`), the most requests Airlock had in flight to the
//! replica and waiting for it.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, mpsc};
use std::time::{Duration, Instant};

use airlock::{AppState, Config};
use airlock_serving::admission::MAX_RUNG;
use airlock_serving::remote::{BackendLabel, FallbackLabel, RemoteGenerator};
use serde_json::{Value, json};

#[path = "support/bank.rs"]
mod bank;

use bank::{Bank, cpu_line, env_usize, pct};

fn env_f64(key: &str) -> Option<f64> {
    std::env::var(key).ok().and_then(|v| v.parse().ok())
}

fn env_list<T: std::str::FromStr>(key: &str, default: &str) -> Vec<T> {
    std::env::var(key)
        .unwrap_or_else(|_| default.into())
        .split(',')
        .filter_map(|x| x.trim().parse().ok())
        .collect()
}

/// The run's settings (from the environment).
struct Knobs {
    docs: usize,
    secs: f64,
    cap_secs: f64,
    concurrency: Vec<usize>,
    max_tokens: usize,
    top_k: usize,
    capacity: Option<f64>,
    slo_ms: Option<f64>,
    client_timeout: Duration,
    multiples: Vec<f64>,
    modes: Vec<bool>,
    config: Config,
    seed: u64,
    /// The rack alias every chat names (rack mode).
    rack: Option<String>,
    rack_threads: usize,
}

impl Knobs {
    fn from_env() -> Knobs {
        let rack = std::env::var("AIRLOCK_LOAD_RACK").is_ok_and(|v| v == "1");
        let file = std::env::var_os("AIRLOCK_LOAD_CONFIG").or_else(|| {
            rack.then(|| {
                Path::new(env!("CARGO_MANIFEST_DIR"))
                    .join("benches/load-rack.toml")
                    .into_os_string()
            })
        });
        let config = match file {
            Some(p) => {
                let path = Path::new(&p);
                let text = std::fs::read_to_string(path).expect("read AIRLOCK_LOAD_CONFIG");
                Config::from_toml(&text, path).expect("parse AIRLOCK_LOAD_CONFIG")
            }
            None => Config::default(),
        };
        let modes = std::env::var("AIRLOCK_LOAD_MODES")
            .unwrap_or_else(|_| "on,off".into())
            .split(',')
            .map(|m| match m.trim() {
                "on" => true,
                "off" => false,
                other => panic!("AIRLOCK_LOAD_MODES: `{other}` is not on/off"),
            })
            .collect();
        Knobs {
            docs: env_usize("AIRLOCK_LOAD_DOCS", 10),
            secs: env_f64("AIRLOCK_LOAD_SECS").unwrap_or(60.0),
            cap_secs: env_f64("AIRLOCK_LOAD_CAP_SECS").unwrap_or(30.0),
            concurrency: env_list("AIRLOCK_LOAD_CONCURRENCY", "1,4"),
            max_tokens: env_usize("AIRLOCK_LOAD_MAX_TOKENS", 16),
            top_k: env_usize("AIRLOCK_LOAD_TOP_K", 0),
            capacity: env_f64("AIRLOCK_LOAD_CAPACITY"),
            slo_ms: env_f64("AIRLOCK_LOAD_SLO_MS"),
            client_timeout: Duration::from_secs(
                env_usize("AIRLOCK_LOAD_CLIENT_TIMEOUT_SECS", 30) as u64
            ),
            multiples: env_list("AIRLOCK_LOAD_MULTIPLES", "0.5,1,2,4"),
            modes,
            rack: rack.then(|| {
                config
                    .remote_generators
                    .first()
                    .expect("AIRLOCK_LOAD_RACK=1 needs a [[remote_generators]] entry in the config")
                    .alias
                    .clone()
            }),
            config,
            seed: env_usize("AIRLOCK_LOAD_SEED", 7) as u64,
            rack_threads: env_usize("AIRLOCK_LOAD_RACK_THREADS", 1),
        }
    }

    /// The daemon's configuration for one mode.
    fn daemon_config(&self, ladder: bool) -> Config {
        // The generator is loaded once for every phase (support/bank.rs), with the engine's
        // defaults: an `engine_*` setting in the file would silently not apply.
        assert_eq!(
            self.config.engine_config(),
            airlock_inference::generate::EngineConfig::default(),
            "AIRLOCK_LOAD_CONFIG sets engine_* settings, which this bench does not apply"
        );
        let mut c = Config {
            ladder: Some(ladder),
            // Quotas stay off (the default, 0 = unlimited) unless the TOML file sets them: this
            // bench measures the ladder, not the per-user buckets.
            ..self.config.clone()
        };
        if !ladder {
            // No admission on the rack either: every request goes to the engine at once.
            for r in &mut c.remote_generators {
                r.max_inflight_per_replica = Some(4096);
                r.queue_capacity = Some(0);
            }
        }
        c.validate().expect("valid daemon config");
        c
    }
}

/// How one request ended.
#[derive(Debug, Clone, Copy)]
enum Outcome {
    /// 200 and a full stream up to `[DONE]`.
    Completed { ttft_ms: f64, tpot_ms: Option<f64> },
    /// An HTTP error status, answered after `ms`.
    Status { code: u16, ms: f64 },
    /// The client gave up (no complete answer within the client timeout).
    ClientTimeout,
    /// A transport error or an `error` event in the stream.
    Failed,
}

#[derive(Debug, Clone, Copy)]
struct Sample {
    outcome: Outcome,
    rung: Option<u8>,
    /// Answered by the local model instead of the rack (`X-Airlock-Model-Fallback`).
    fallback: bool,
}

/// One streaming chat completion over the socket, timed from the client's side.
fn chat(agent: &ureq::Agent, base: &str, token: &str, query: &str, k: &Knobs) -> Sample {
    let (max_tokens, timeout) = (k.max_tokens, k.client_timeout);
    let mut body = json!({
        "messages": [{"role": "user", "content": query}],
        "max_tokens": max_tokens,
        "stream": true,
        // top_k 0: no retrieval (a plain chat turn, for machines where a RAG prompt's prefill
        // would take most of a phase).
        "airlock": if k.top_k == 0 {
            json!({"retrieval": false})
        } else {
            json!({"top_k": k.top_k})
        },
    });
    if let Some(alias) = &k.rack {
        body["model"] = alias.as_str().into();
    }
    let body = body.to_string();
    let t0 = Instant::now();
    let failed = |t0: Instant, why: &dyn std::fmt::Display| {
        // The first few failures are shown (a bench that only counts them hides bugs).
        static SHOWN: AtomicUsize = AtomicUsize::new(0);
        if SHOWN.fetch_add(1, Ordering::Relaxed) < 5 {
            eprintln!("request failed after {:?}: {why}", t0.elapsed());
        }
        if t0.elapsed() + Duration::from_millis(50) >= timeout {
            Outcome::ClientTimeout
        } else {
            Outcome::Failed
        }
    };
    let resp = agent
        .post(format!("{base}/v1/chat/completions"))
        .config()
        .timeout_global(Some(timeout))
        .build()
        .header("Authorization", format!("Bearer {token}"))
        .header("Content-Type", "application/json")
        .header("X-Airlock-Priority", "interactive")
        .send(body);
    let resp = match resp {
        Ok(r) => r,
        Err(e) => {
            return Sample {
                outcome: failed(t0, &e),
                rung: None,
                fallback: false,
            };
        }
    };
    let rung = resp
        .headers()
        .get("x-airlock-rung")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok());
    let fallback = resp.headers().contains_key("x-airlock-model-fallback");
    let code = resp.status().as_u16();
    if code != 200 {
        let ms = t0.elapsed().as_secs_f64() * 1e3;
        let body = resp.into_body().read_to_string().unwrap_or_default();
        if ![429, 503, 504].contains(&code) {
            eprintln!("unexpected {code}: {body}");
        }
        return Sample {
            outcome: Outcome::Status { code, ms },
            rung,
            fallback,
        };
    }
    let (mut first, mut last, mut tokens) = (None::<Instant>, None::<Instant>, None::<u64>);
    let (mut done, mut error) = (false, false);
    for line in BufReader::new(resp.into_body().into_reader()).lines() {
        let line = match line {
            Ok(l) => l,
            Err(e) => {
                return Sample {
                    outcome: failed(t0, &e),
                    rung,
                    fallback,
                };
            }
        };
        if line.starts_with("event:") && line.contains("error") {
            error = true;
            continue;
        }
        let Some(data) = line.strip_prefix("data:").map(str::trim_start) else {
            continue;
        };
        if data == "[DONE]" {
            done = true;
            break;
        }
        let Ok(v) = serde_json::from_str::<Value>(data) else {
            continue;
        };
        if v["choices"][0]["delta"]["content"]
            .as_str()
            .is_some_and(|c| !c.is_empty())
        {
            let now = Instant::now();
            first.get_or_insert(now);
            last = Some(now);
        }
        if let Some(n) = v["usage"]["completion_tokens"].as_u64() {
            tokens = Some(n);
        }
    }
    if !done || error {
        let why = if error {
            "an error event in the stream"
        } else {
            "the stream ended before [DONE]"
        };
        return Sample {
            outcome: failed(t0, &why),
            rung,
            fallback,
        };
    }
    let end = Instant::now();
    let first = first.unwrap_or(end);
    let tpot_ms = match (last, tokens) {
        (Some(last), Some(n)) if n >= 2 => {
            Some(last.duration_since(first).as_secs_f64() * 1e3 / (n - 1) as f64)
        }
        _ => None,
    };
    Sample {
        outcome: Outcome::Completed {
            ttft_ms: first.duration_since(t0).as_secs_f64() * 1e3,
            tpot_ms,
        },
        rung,
        fallback,
    }
}

/// A daemon on `127.0.0.1:0` until stopped.
struct Daemon {
    base: String,
    state: AppState,
    stop: tokio::sync::oneshot::Sender<()>,
    handle: tokio::task::JoinHandle<std::io::Result<airlock::server::Drained>>,
}

impl Daemon {
    fn start(rt: &tokio::runtime::Runtime, config: Config, bank: &Bank) -> Daemon {
        let grace = config.shutdown_grace();
        // A fresh remote generator per phase: idle replica, closed breaker, no TTFT history.
        let remotes = rt.block_on(async {
            let mut out = Vec::new();
            for c in &config.remote_generators {
                out.push(RemoteGenerator::connect(c.clone()).await.expect("the rack"));
            }
            out
        });
        let state = AppState::ready(config, bank.services().with_remotes(remotes));
        let listener = rt
            .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
            .unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let (stop, rx) = tokio::sync::oneshot::channel::<()>();
        let handle = rt.spawn(airlock::server::serve(
            listener,
            state.clone(),
            async move {
                let _ = rx.await;
            },
            grace,
        ));
        Daemon {
            base,
            state,
            stop,
            handle,
        }
    }

    /// Stops the daemon and waits until the engine has no sequence left.
    fn stop(self, rt: &tokio::runtime::Runtime, bank: &Bank) {
        let _ = self.stop.send(());
        rt.block_on(self.handle).unwrap().unwrap();
        let t = Instant::now();
        loop {
            let m = bank.generator.engine().counters().snapshot();
            if m.queue_depth == 0 && m.active_sequences == 0 {
                break;
            }
            assert!(
                t.elapsed() < Duration::from_secs(120),
                "engine not idle: {m:?}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// The rack's engine (rack mode): `python3 -m llama_cpp.server` serving SmolLM2's GGUF on a
/// free loopback port, as the rack tests start it; killed on drop.
struct Upstream {
    child: std::process::Child,
    port: u16,
    log: std::path::PathBuf,
    _dir: tempfile::TempDir,
}

impl Upstream {
    fn start(model_alias: &str, threads: usize) -> Upstream {
        let gguf =
            bank::dir("AIRLOCK_MODELS_DIR", "../models-cache/models").join("smollm2/model.gguf");
        assert!(gguf.exists(), "{} is missing", gguf.display());
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("llama-server.log");
        let out = std::fs::File::create(&log).unwrap();
        let child = std::process::Command::new("python3")
            .args(["-m", "llama_cpp.server", "--model"])
            .arg(&gguf)
            .args(["--model_alias", model_alias])
            .args(["--host", "127.0.0.1", "--port", &port.to_string()])
            .args(["--n_ctx", "2048", "--n_threads", &threads.to_string()])
            // As in the rack tests: interrupt_requests would end a running stream with [DONE]
            // as soon as another request arrives.
            .args(["--logits_all", "false", "--interrupt_requests", "false"])
            .args(["--verbose", "false"])
            .stdin(std::process::Stdio::null())
            .stdout(out.try_clone().unwrap())
            .stderr(out)
            .spawn()
            .expect("python3 -m llama_cpp.server (pip install 'llama-cpp-python[server]')");
        let mut u = Upstream {
            child,
            port,
            log,
            _dir: dir,
        };
        let t = Instant::now();
        while !u.models_answer(Duration::from_secs(2)) {
            if let Some(st) = u.child.try_wait().unwrap() {
                panic!(
                    "llama_cpp.server exited ({st}):\n{}",
                    std::fs::read_to_string(&u.log).unwrap_or_default()
                );
            }
            assert!(
                t.elapsed() < Duration::from_secs(180),
                "llama_cpp.server did not start"
            );
            std::thread::sleep(Duration::from_millis(200));
        }
        u
    }

    fn base_url(&self) -> String {
        format!("http://127.0.0.1:{}/v1", self.port)
    }

    fn models_answer(&self, within: Duration) -> bool {
        agent()
            .get(format!("{}/models", self.base_url()))
            .config()
            .timeout_global(Some(within))
            .build()
            .call()
            .is_ok_and(|r| r.status() == 200)
    }

    /// Waits until the engine has nothing queued or running: its `/v1/models` takes the same
    /// lock as a generation, so it answers after every queued one.
    fn wait_idle(&self) {
        let t = Instant::now();
        while !self.models_answer(Duration::from_secs(300)) {
            assert!(
                t.elapsed() < Duration::from_secs(600),
                "the engine never drained"
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }
}

impl Drop for Upstream {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn rss_kib(field: &str) -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with(field))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse().ok())
        })
        .unwrap_or(0)
}

/// What the sampler saw during a phase.
#[derive(Debug, Default)]
struct Observed {
    peak_rss_kib: u64,
    rung_ticks: [u64; MAX_RUNG as usize + 1],
    max_queued: usize,
    max_inflight: usize,
    /// Rack mode: the most requests Airlock had in flight to the replicas, and waiting for one.
    max_rack_inflight: usize,
    max_rack_waiting: i64,
    /// Rack mode: 503s of the rack's admission, and answers that fell back to the local model.
    rack_shed: u64,
    rack_fallbacks: u64,
}

/// Samples RSS and the controller every 100 ms until `stop` is set.
fn sampler(state: AppState, stop: Arc<AtomicBool>) -> std::thread::JoinHandle<Observed> {
    std::thread::spawn(move || {
        let mut o = Observed::default();
        while !stop.load(Ordering::Relaxed) {
            o.peak_rss_kib = o.peak_rss_kib.max(rss_kib("VmRSS:"));
            let a = state.admission();
            o.rung_ticks[usize::from(a.current_rung().min(MAX_RUNG))] += 1;
            o.max_queued = o.max_queued.max(a.queued());
            o.max_inflight = o.max_inflight.max(a.inflight());
            if let Ok(services) = state.services() {
                for r in &services.remotes {
                    let n = r.replicas().iter().map(|p| p.inflight()).sum::<usize>();
                    o.max_rack_inflight = o.max_rack_inflight.max(n);
                    let label = BackendLabel {
                        backend: r.alias.clone(),
                    };
                    let w = state.metrics().rack.waiting.get_or_create(&label).get();
                    o.max_rack_waiting = o.max_rack_waiting.max(w);
                }
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        if let Ok(services) = state.services() {
            let rack = &state.metrics().rack;
            for r in &services.remotes {
                let label = BackendLabel {
                    backend: r.alias.clone(),
                };
                o.rack_shed += rack.shed.get_or_create(&label).get();
                for reason in ["saturated", "unhealthy", "failed"] {
                    let label = FallbackLabel {
                        from: r.alias.clone(),
                        reason,
                    };
                    o.rack_fallbacks += rack.fallbacks.get_or_create(&label).get();
                }
            }
        }
        o
    })
}

/// SplitMix64: deterministic arrival times without another dependency.
struct Rng(u64);

impl Rng {
    /// Uniform in (0, 1].
    fn unit(&mut self) -> f64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        ((z >> 11) as f64 + 1.0) / (1u64 << 53) as f64
    }
}

fn agent() -> ureq::Agent {
    ureq::Agent::config_builder()
        .http_status_as_error(false)
        .max_idle_connections(1024)
        .max_idle_connections_per_host(1024)
        .build()
        .new_agent()
}

/// Open loop: Poisson arrivals at `rate` per second for `secs`, one thread per request.
fn open_loop(base: &str, bank: &Bank, k: &Arc<Knobs>, rate: f64, seed: u64) -> Vec<Sample> {
    let agent = agent();
    let (tx, rx) = mpsc::channel();
    let mut rng = Rng(seed);
    let start = Instant::now();
    let mut t = 0.0;
    let mut handles = Vec::new();
    for i in 0.. {
        t += -rng.unit().ln() / rate;
        if t >= k.secs {
            break;
        }
        let at = start + Duration::from_secs_f64(t);
        if let Some(wait) = at.checked_duration_since(Instant::now()) {
            std::thread::sleep(wait);
        }
        let (user, query) = bank.cases[i % bank.cases.len()].clone();
        let token = bank.tokens[&user].clone();
        let (agent, base, tx) = (agent.clone(), base.to_string(), tx.clone());
        let k = Arc::clone(k);
        handles.push(std::thread::spawn(move || {
            let s = chat(&agent, &base, &token, &query, &k);
            let _ = tx.send(s);
        }));
    }
    drop(tx);
    for h in handles {
        h.join().unwrap();
    }
    rx.into_iter().collect()
}

/// Closed loop: `conc` clients back to back for `secs`; returns the samples and the wall time.
fn closed_loop(base: &str, bank: &Bank, k: &Knobs, conc: usize) -> (Vec<Sample>, f64) {
    let agent = agent();
    let next = AtomicUsize::new(0);
    let start = Instant::now();
    let samples = std::thread::scope(|s| {
        let workers: Vec<_> = (0..conc)
            .map(|_| {
                s.spawn(|| {
                    let mut out = Vec::new();
                    while start.elapsed().as_secs_f64() < k.cap_secs {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        let (user, query) = &bank.cases[i % bank.cases.len()];
                        out.push(chat(&agent, base, &bank.tokens[user], query, k));
                    }
                    out
                })
            })
            .collect();
        workers
            .into_iter()
            .flat_map(|w| w.join().unwrap())
            .collect::<Vec<_>>()
    });
    (samples, start.elapsed().as_secs_f64())
}

/// The summary of one phase.
struct Row {
    label: String,
    offered: f64,
    window: f64,
    sent: usize,
    completed: usize,
    good: usize,
    /// Completions served at rung 5 (below its in-flight limit).
    ok_at_5: usize,
    s503: usize,
    s504: usize,
    s429: usize,
    client_timeout: usize,
    other: usize,
    /// Answers with `X-Airlock-Model-Fallback`.
    fallbacks: usize,
    ttft: (f64, f64),
    tpot: (f64, f64),
    shed_p99: Option<f64>,
    rungs: BTreeMap<String, usize>,
    observed: Observed,
    wall: f64,
}

impl Row {
    fn new(label: String, offered: f64, window: f64, samples: &[Sample], slo_ms: f64) -> Row {
        let (mut ttft, mut tpot, mut shed) = (Vec::new(), Vec::new(), Vec::new());
        let mut r = Row {
            label,
            offered,
            window,
            sent: samples.len(),
            completed: 0,
            good: 0,
            ok_at_5: 0,
            s503: 0,
            s504: 0,
            s429: 0,
            client_timeout: 0,
            other: 0,
            fallbacks: 0,
            ttft: (0.0, 0.0),
            tpot: (0.0, 0.0),
            shed_p99: None,
            rungs: BTreeMap::new(),
            observed: Observed::default(),
            wall: 0.0,
        };
        for s in samples {
            let key = s.rung.map_or_else(|| "-".to_string(), |x| x.to_string());
            *r.rungs.entry(key).or_default() += 1;
            r.fallbacks += usize::from(s.fallback);
            match s.outcome {
                Outcome::Completed { ttft_ms, tpot_ms } => {
                    r.completed += 1;
                    r.good += usize::from(ttft_ms <= slo_ms);
                    r.ok_at_5 += usize::from(s.rung == Some(MAX_RUNG));
                    ttft.push(ttft_ms);
                    tpot.extend(tpot_ms);
                }
                Outcome::Status { code: 503, ms } => {
                    r.s503 += 1;
                    shed.push(ms);
                }
                Outcome::Status { code: 504, .. } => r.s504 += 1,
                Outcome::Status { code: 429, .. } => r.s429 += 1,
                Outcome::Status { .. } | Outcome::Failed => r.other += 1,
                Outcome::ClientTimeout => r.client_timeout += 1,
            }
        }
        r.ttft = (pct(&mut ttft, 0.5), pct(&mut ttft, 0.99));
        r.tpot = (pct(&mut tpot, 0.5), pct(&mut tpot, 0.99));
        r.shed_p99 = (!shed.is_empty()).then(|| pct(&mut shed, 0.99));
        r
    }

    fn goodput(&self) -> f64 {
        self.good as f64 / self.window
    }

    fn header() {
        println!(
            "| phase | offered r/s | sent | ok | ok ≤ SLO | ok at rung 5 | goodput r/s | 503 | \
             504 | 429 | gave up | other | TTFT p50 / p99 ms | TPOT p50 / p99 ms | 503 p99 ms | \
             X-Airlock-Rung | time at rung | max queued | peak RSS MiB | rack 503 | fallback | \
             max rack in flight / waiting |"
        );
        println!(
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---|---:|---:|---:|---:|---:|"
        );
    }

    fn print(&self) {
        let rungs: Vec<String> = self.rungs.iter().map(|(k, v)| format!("{k}:{v}")).collect();
        let ticks: u64 = self.observed.rung_ticks.iter().sum();
        let time: Vec<String> = self
            .observed
            .rung_ticks
            .iter()
            .enumerate()
            .filter(|(_, t)| **t > 0)
            .map(|(r, t)| format!("{r}:{:.0}%", 100.0 * *t as f64 / ticks.max(1) as f64))
            .collect();
        println!(
            "| {} | {:.2} | {} | {} | {} | {} | {:.2} | {} | {} | {} | {} | {} | {:.0} / {:.0} | \
             {:.1} / {:.1} | {} | {} | {} | {} | {:.0} | {} | {} ({}) | {} / {} |",
            self.label,
            self.offered,
            self.sent,
            self.completed,
            self.good,
            self.ok_at_5,
            self.goodput(),
            self.s503,
            self.s504,
            self.s429,
            self.client_timeout,
            self.other,
            self.ttft.0,
            self.ttft.1,
            self.tpot.0,
            self.tpot.1,
            self.shed_p99.map_or("–".into(), |v| format!("{v:.1}")),
            rungs.join(" "),
            time.join(" "),
            self.observed.max_queued,
            self.observed.peak_rss_kib as f64 / 1024.0,
            self.observed.rack_shed,
            self.fallbacks,
            self.observed.rack_fallbacks,
            self.observed.max_rack_inflight,
            self.observed.max_rack_waiting,
        );
    }
}

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

/// Runs `f` against a fresh daemon with the sampler on; returns its result and what was seen.
fn phase<T>(
    rt: &tokio::runtime::Runtime,
    bank: &Bank,
    upstream: Option<&Upstream>,
    config: Config,
    f: impl FnOnce(&str) -> T,
) -> (T, Observed, f64) {
    let d = Daemon::start(rt, config, bank);
    let stop = Arc::new(AtomicBool::new(false));
    let s = sampler(d.state.clone(), stop.clone());
    let t = Instant::now();
    let out = f(&d.base);
    let wall = t.elapsed().as_secs_f64();
    stop.store(true, Ordering::Relaxed);
    let observed = s.join().unwrap();
    d.stop(rt, bank);
    if let Some(u) = upstream {
        u.wait_idle();
    }
    (out, observed, wall)
}

fn main() {
    // Logs go to stderr: stdout is the report.
    let _ = tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(std::env::var("RUST_LOG").unwrap_or_else(|_| "warn".into()))
        .try_init();
    let mut k = Knobs::from_env();
    let started = Instant::now();
    println!("{}", cpu_line());
    println!("load average at start: {}", loadavg());
    let upstream = k.rack.as_ref().map(|alias| {
        let r = k.config.remote_generators.first_mut().unwrap();
        let u = Upstream::start(&r.model, k.rack_threads);
        r.base_urls = vec![u.base_url()];
        println!(
            "rack: `{alias}` -> llama_cpp.server {} ({} thread(s)), model `{}`; ladder on: {:?}",
            u.base_url(),
            k.rack_threads,
            r.model,
            r
        );
        u
    });
    let upstream = upstream.as_ref();
    let k = Arc::new(k);
    let bank = Bank::load(k.docs);
    println!(
        "{} cases, {} users; max_tokens {}, top_k {}, client timeout {} s, window {} s per phase",
        bank.cases.len(),
        bank.tokens.len(),
        k.max_tokens,
        k.top_k,
        k.client_timeout.as_secs(),
        k.secs
    );
    let on = k.daemon_config(true);
    println!(
        "ladder: {:?}, tick {:?}, queue deadline {:?}",
        on.admission().ladder_config(),
        on.admission().ladder_tick(),
        on.admission().queue_deadline()
    );
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();

    // Warm-up (first-use allocations, page cache), not recorded.
    phase(&rt, &bank, upstream, k.daemon_config(false), |base| {
        let a = agent();
        for (u, q) in bank.cases.iter().take(3) {
            chat(&a, base, &bank.tokens[u], q, &k);
        }
    });

    // 1. Capacity: closed loop, ladder off.
    println!(
        "\n## Capacity (closed loop, ladder off, {} s each)\n",
        k.cap_secs
    );
    println!("| clients | completed | throughput r/s | TTFT p50 / p99 ms | TPOT p50 ms | errors |");
    println!("|---:|---:|---:|---:|---:|---:|");
    let mut cap_runs = Vec::new();
    for &c in &k.concurrency {
        let ((samples, secs), _, _) = phase(&rt, &bank, upstream, k.daemon_config(false), |base| {
            closed_loop(base, &bank, &k, c)
        });
        let mut ttft = Vec::new();
        let mut tpot = Vec::new();
        for s in &samples {
            if let Outcome::Completed { ttft_ms, tpot_ms } = s.outcome {
                ttft.push(ttft_ms);
                tpot.extend(tpot_ms);
            }
        }
        let errors = samples.len() - ttft.len();
        let rate = ttft.len() as f64 / secs;
        let p50 = pct(&mut ttft.clone(), 0.5);
        println!(
            "| {c} | {} | {rate:.2} | {p50:.0} / {:.0} | {:.1} | {errors} |",
            ttft.len(),
            pct(&mut ttft, 0.99),
            pct(&mut tpot, 0.5)
        );
        cap_runs.push((c, rate, p50, samples, secs));
    }
    let measured = cap_runs.iter().map(|r| r.1).fold(0.0, f64::max);
    let capacity = k.capacity.unwrap_or(measured);
    let unloaded = cap_runs
        .iter()
        .find(|r| r.0 == 1)
        .map_or(cap_runs.first().map_or(1000.0, |r| r.2), |r| r.2);
    let slo = k
        .slo_ms
        .unwrap_or_else(|| ((3.0 * unloaded / 100.0).ceil() * 100.0).max(1000.0));
    // Saturation goodput: the best rate of SLO-meeting completions the closed loop reached.
    let sat_goodput = cap_runs
        .iter()
        .map(|(_, _, _, samples, secs)| {
            samples
                .iter()
                .filter(
                    |s| matches!(s.outcome, Outcome::Completed { ttft_ms, .. } if ttft_ms <= slo),
                )
                .count() as f64
                / secs
        })
        .fold(0.0, f64::max);
    println!(
        "\ncapacity {capacity:.2} r/s (measured {measured:.2}); unloaded TTFT p50 {unloaded:.0} ms; \
         SLO: TTFT ≤ {slo:.0} ms; saturation goodput {sat_goodput:.2} r/s"
    );

    // 2. Open loop at multiples of the capacity, ladder on and off.
    let mut rows = Vec::new();
    println!("\n## Open loop ({} s Poisson arrivals per phase)\n", k.secs);
    Row::header();
    for (i, &m) in k.multiples.iter().enumerate() {
        for &ladder in &k.modes {
            let rate = capacity * m;
            let seed = k.seed + i as u64;
            let (samples, observed, wall) =
                phase(&rt, &bank, upstream, k.daemon_config(ladder), |base| {
                    open_loop(base, &bank, &k, rate, seed)
                });
            let label = format!("{m}× ladder {}", if ladder { "on" } else { "off" });
            let mut row = Row::new(label, rate, k.secs, &samples, slo);
            row.observed = observed;
            row.wall = wall;
            row.print();
            rows.push(row);
        }
    }

    println!("\n## Summary\n");
    println!(
        "capacity {capacity:.2} r/s, SLO TTFT ≤ {slo:.0} ms, saturation goodput {sat_goodput:.2} r/s, \
         max_tokens {}, {} docs",
        k.max_tokens, k.docs
    );
    Row::header();
    for r in &rows {
        r.print();
    }
    for r in &rows {
        let share = if sat_goodput > 0.0 {
            format!("{:.0}%", 100.0 * r.goodput() / sat_goodput)
        } else {
            "– (no capacity run)".into()
        };
        println!(
            "{}: goodput {:.2} r/s = {share} of saturation goodput; phase wall {:.0} s",
            r.label,
            r.goodput(),
            r.wall
        );
    }
    println!(
        "\npeak RSS of the whole run (VmHWM) {:.0} MiB; load average at end: {}; total {:.0} s",
        rss_kib("VmHWM:") as f64 / 1024.0,
        loadavg(),
        started.elapsed().as_secs_f64()
    );
}
