//! The inference rack (issue 25): a remote OpenAI-compatible generator behind the same answer
//! path, tested against a real llama.cpp server (`llama-cpp-python[server]` serving SmolLM2 on
//! loopback; see `llama_server.rs`).

use std::time::{Duration, Instant};

use airlock_serving::remote::{RemoteGenerator, RemoteGeneratorConfig};
use axum::http::{Method, StatusCode};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::llama_server::{LlamaServer, UPSTREAM_MODEL, free_port};
use crate::support::{TestApp, test_config};

const ALIAS: &str = "airlock-rack";

fn rack_config(base_urls: Vec<String>) -> RemoteGeneratorConfig {
    toml::from_str::<RemoteGeneratorConfig>(&format!(
        "alias = \"{ALIAS}\"\nkind = \"openai-compatible\"\nbase_urls = {base_urls:?}\n\
         model = \"{UPSTREAM_MODEL}\"\nmax_inflight_per_replica = 1\n\
         first_token_timeout_ms = 300000\nidle_timeout_ms = 120000\n"
    ))
    .unwrap()
}

async fn app_with(configs: Vec<RemoteGeneratorConfig>) -> TestApp {
    let mut remotes = Vec::new();
    for c in configs {
        remotes.push(RemoteGenerator::connect(c).await.expect("connect the rack"));
    }
    TestApp::with_remotes(test_config(), remotes)
}

/// Two documents in two groups; returns (rita: risk, hank: hr).
async fn seed(t: &TestApp) -> (String, String) {
    for (id, title, text, group) in [
        (
            "doc-risk",
            "Liquidity buffer policy",
            "The liquidity buffer must stay above 15 percent of deposits at all times.",
            "risk",
        ),
        (
            "doc-hr",
            "Parental leave",
            "Parental leave lasts twenty weeks at full pay for all staff.",
            "hr",
        ),
    ] {
        let r = t
            .call(
                Method::PUT,
                &format!("/v1/documents/{id}"),
                Some(&t.admin),
                Some(json!({"title": title, "text": text,
                            "acl": {"users": [], "groups": [group]}})),
            )
            .await;
        assert_eq!(r.status, StatusCode::CREATED, "{}", r.text);
    }
    (t.user("rita", &["risk"]), t.user("hank", &["hr"]))
}

fn question(extra: Value) -> Value {
    let mut body = json!({
        "model": ALIAS,
        "messages": [{"role": "user", "content": "What is the minimum liquidity buffer?"}],
        "max_tokens": 24,
    });
    body.as_object_mut()
        .unwrap()
        .extend(extra.as_object().unwrap().clone());
    body
}

/// A long plain-chat generation (no retrieval), to have something to cancel or kill.
fn long_chat(stream: bool) -> Value {
    json!({
        "model": ALIAS,
        "messages": [{"role": "user", "content":
            "Write a very long story about a lighthouse keeper and his cat. Make it at least 2000 words."}],
        "max_tokens": 600,
        "stream": stream,
        "airlock": {"retrieval": false},
    })
}

/// The JSON `data:` events of a raw SSE body.
fn data_events(raw: &str) -> Vec<Value> {
    raw.lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter(|d| d.starts_with('{'))
        .map(|d| serde_json::from_str(d).unwrap())
        .collect()
}

fn metric(text: &str, prefix: &str) -> f64 {
    text.lines()
        .find(|l| l.starts_with(prefix))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0)
}

async fn metrics(t: &TestApp) -> String {
    t.call(Method::GET, "/metrics", Some(&t.admin), None)
        .await
        .text
}

/// Opens a raw streaming chat request on a real socket; returns the socket after the response
/// head and `n` data events arrived, and what was read.
async fn open_stream(
    base: &str,
    token: &str,
    body: &Value,
    n: usize,
) -> (tokio::net::TcpStream, String) {
    let addr = base.trim_start_matches("http://");
    let body = body.to_string();
    let mut sock = tokio::net::TcpStream::connect(addr).await.unwrap();
    let req = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {token}\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    sock.write_all(req.as_bytes()).await.unwrap();
    let mut buf = Vec::new();
    let mut tmp = [0u8; 8192];
    while String::from_utf8_lossy(&buf).matches("data: ").count() < n {
        let k = tokio::time::timeout(Duration::from_secs(300), sock.read(&mut tmp))
            .await
            .expect("read timed out")
            .unwrap();
        if k == 0 {
            break;
        }
        buf.extend_from_slice(&tmp[..k]);
    }
    (sock, String::from_utf8_lossy(&buf).into_owned())
}

/// Reads until the server closes or `[DONE]` arrives.
async fn read_rest(sock: &mut tokio::net::TcpStream, mut text: String) -> String {
    let mut tmp = [0u8; 8192];
    while !text.contains("data: [DONE]") {
        let k = tokio::time::timeout(Duration::from_secs(300), sock.read(&mut tmp))
            .await
            .expect("read timed out")
            .unwrap();
        if k == 0 {
            break;
        }
        text.push_str(&String::from_utf8_lossy(&tmp[..k]));
    }
    text
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rack_chat_cites_readable_sources_streaming_and_not() {
    if !LlamaServer::available("rack_chat_cites_readable_sources_streaming_and_not") {
        return;
    }
    let server = LlamaServer::start();
    let t = app_with(vec![rack_config(vec![server.base_url()])]).await;
    let (rita, hank) = seed(&t).await;

    // Listed as a generator.
    let models = t.call(Method::GET, "/v1/models", Some(&rita), None).await;
    let card = models.json["data"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["id"] == ALIAS)
        .cloned()
        .unwrap_or_else(|| panic!("{}", models.text));
    assert_eq!(card["role"], "generator");
    assert_eq!(card["model"], UPSTREAM_MODEL);

    // Non-streaming: the answer came from the rack, with Airlock's citations.
    let r = t
        .call(
            Method::POST,
            "/v1/chat/completions",
            Some(&rita),
            Some(question(json!({}))),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert_eq!(r.json["model"], ALIAS, "{}", r.text);
    assert!(r.headers.get("x-airlock-model-fallback").is_none());
    let cites = r.json["airlock"]["citations"].as_array().unwrap();
    assert!(!cites.is_empty(), "{}", r.text);
    assert!(
        cites.iter().all(|c| c["doc_id"] == "doc-risk"),
        "{}",
        r.text
    );
    assert!(r.json["airlock"]["cited_by"].is_string(), "{}", r.text);
    let content = r.json["choices"][0]["message"]["content"].as_str().unwrap();
    assert!(!content.is_empty(), "{}", r.text);
    let usage = &r.json["usage"];
    let completion = usage["completion_tokens"].as_u64().unwrap();
    assert!((1..=24).contains(&completion), "{}", r.text);
    // The prompt held the system prompt and the source, not just the 8-word question.
    assert!(usage["prompt_tokens"].as_u64().unwrap() > 60, "{}", r.text);
    // The upstream generated it: the tokens are counted for the rack's backend label.
    let m = metrics(&t).await;
    let counted = metric(
        &m,
        &format!("airlock_backend_tokens_total{{backend=\"{ALIAS}\",kind=\"completion\"}}"),
    );
    assert_eq!(counted as u64, completion, "{m}");

    // A caller who cannot read doc-risk never gets it cited (nor sent upstream).
    let r = t
        .call(
            Method::POST,
            "/v1/chat/completions",
            Some(&hank),
            Some(question(json!({}))),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert!(
        !r.text.contains("doc-risk") && !r.text.contains("15 percent"),
        "{}",
        r.text
    );

    // Streaming: the first event carries the citations, then text, then the end with usage.
    let r = t
        .call(
            Method::POST,
            "/v1/chat/completions",
            Some(&rita),
            Some(question(json!({"stream": true}))),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    let events = data_events(&r.text);
    assert!(r.text.trim_end().ends_with("data: [DONE]"), "{}", r.text);
    let first = &events[0];
    assert_eq!(first["model"], ALIAS);
    assert_eq!(
        first["airlock"]["citations"][0]["doc_id"], "doc-risk",
        "{}",
        r.text
    );
    let text: String = events
        .iter()
        .filter_map(|e| e["choices"][0]["delta"]["content"].as_str())
        .collect();
    assert!(!text.is_empty(), "{}", r.text);
    let last = events.last().unwrap();
    assert!(
        last["choices"][0]["finish_reason"].is_string(),
        "{}",
        r.text
    );
    assert!(last["airlock"]["cited_by"].is_string(), "{}", r.text);
    assert!(last["usage"]["completion_tokens"].as_u64().unwrap() >= 1);
    drop(server);
}

/// The official `openai` Python client against Airlock, naming the rack alias.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn official_openai_client_talks_to_the_rack() {
    if !LlamaServer::available("official_openai_client_talks_to_the_rack") {
        return;
    }
    let has_client = std::process::Command::new("python3")
        .args(["-c", "import openai"])
        .status()
        .is_ok_and(|s| s.success());
    if !has_client {
        assert!(
            std::env::var("AIRLOCK_REQUIRE_OPENAI").as_deref() != Ok("1"),
            "python3 with the openai package is required"
        );
        eprintln!("SKIPPED: python3 -c 'import openai' failed (pip install openai to run this)");
        return;
    }
    let server = LlamaServer::start();
    let t = app_with(vec![rack_config(vec![server.base_url()])]).await;
    let (rita, _) = seed(&t).await;
    let served = t.serve().await;
    let script =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/openai_rack_client.py");
    let base = served.base.clone();
    let out = tokio::task::spawn_blocking(move || {
        std::process::Command::new("python3")
            .arg(script)
            .arg(base)
            .arg(rita)
            .arg(ALIAS)
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    assert!(
        out.status.success(),
        "openai client failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    served.shutdown().await;
    drop(server);
}

/// At start-up the upstream's `/v1/models` must list the model, else the daemon does not
/// become ready; an unreachable upstream is refused too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn startup_refuses_an_upstream_that_does_not_list_the_model() {
    if !LlamaServer::available("startup_refuses_an_upstream_that_does_not_list_the_model") {
        return;
    }
    let server = LlamaServer::start();
    let mut c = rack_config(vec![server.base_url()]);
    c.model = "qwen2.5-7b-instruct".into();
    let config = airlock::Config {
        remote_generators: vec![c],
        ..test_config()
    };
    config.validate().unwrap();
    let err = tokio::task::spawn_blocking(move || airlock::startup::connect_remotes(&config))
        .await
        .unwrap()
        .expect_err("an upstream without the model was accepted");
    let msg = err.to_string();
    assert!(
        msg.contains("remote generator `airlock-rack`")
            && msg.contains("does not list model `qwen2.5-7b-instruct`")
            && msg.contains(UPSTREAM_MODEL)
            && msg.contains("refusing to become ready"),
        "{msg}"
    );
    // The right model is accepted by the same path.
    let ok = airlock::Config {
        remote_generators: vec![rack_config(vec![server.base_url()])],
        ..test_config()
    };
    let remotes = tokio::task::spawn_blocking(move || airlock::startup::connect_remotes(&ok))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(remotes.len(), 1);
    drop(server);
    // Nothing listening: refused with the address.
    let dead = format!("http://127.0.0.1:{}/v1", free_port());
    let err = RemoteGenerator::connect(rack_config(vec![dead.clone()]))
        .await
        .expect_err("a dead upstream was accepted");
    assert!(err.to_string().contains("connect to 127.0.0.1"), "{err}");
}

/// A client that disconnects mid-stream closes the upstream stream at once, and the upstream
/// stops generating: its CPU use falls to idle, and the next request is served at once
/// instead of after the abandoned 600-token generation.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_disconnect_stops_the_upstream_generation() {
    if !LlamaServer::available("client_disconnect_stops_the_upstream_generation") {
        return;
    }
    let server = LlamaServer::start();
    let t = app_with(vec![rack_config(vec![server.base_url()])]).await;
    let (rita, _) = seed(&t).await;
    let served = t.serve().await;
    let (sock, head) = open_stream(&served.base, &rita, &long_chat(true), 6).await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    // Busy: the server's CPU while it generates.
    let (c0, t0) = (server.cpu_seconds(), Instant::now());
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let busy = (server.cpu_seconds() - c0) / t0.elapsed().as_secs_f64();
    drop(sock);
    // Give the disconnect a moment to travel (Airlock → upstream socket → the server's next
    // token), then measure again.
    tokio::time::sleep(Duration::from_millis(700)).await;
    let (c1, t1) = (server.cpu_seconds(), Instant::now());
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let idle = (server.cpu_seconds() - c1) / t1.elapsed().as_secs_f64();
    eprintln!("upstream CPU: {busy:.2} while generating, {idle:.2} after the disconnect");
    assert!(busy > 0.2, "the upstream was not generating: {busy:.2} CPU");
    assert!(
        idle < busy / 4.0,
        "the upstream kept generating after the disconnect: {idle:.2} CPU vs {busy:.2} busy\n{}",
        server.log_text()
    );
    // The replica slot is free again and the next request starts at once.
    let started = Instant::now();
    let (mut sock, head) = open_stream(
        &served.base,
        &rita,
        &question(json!({"stream": true,
        "max_tokens": 4})),
        2,
    )
    .await;
    let all = read_rest(&mut sock, head).await;
    assert!(all.contains("data: [DONE]"), "{all}");
    assert!(
        started.elapsed() < Duration::from_secs(60),
        "the next request waited {:?}",
        started.elapsed()
    );
    let m = metrics(&t).await;
    assert!(
        metric(&m, "airlock_generation_cancelled_total") >= 1.0,
        "{m}"
    );
    served.shutdown().await;
    drop(server);
}

/// The upstream dies mid-stream: the client gets a clean SSE error event (502
/// upstream-failed) and `[DONE]`, the replica's breaker opens, and the next request is
/// answered by the local small model where fallback is enabled (header, metric), or refused
/// 503 + Retry-After where it is not: never silently.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_killed_mid_stream_opens_the_breaker_and_falls_back() {
    if !LlamaServer::available("upstream_killed_mid_stream_opens_the_breaker_and_falls_back") {
        return;
    }
    let mut server = LlamaServer::start();
    let mut with_fallback = rack_config(vec![server.base_url()]);
    with_fallback.breaker_min_requests = Some(1);
    with_fallback.breaker_open_secs = Some(600);
    with_fallback.fallback_to_local = Some(true);
    let mut strict = with_fallback.clone();
    strict.alias = "airlock-rack-strict".into();
    strict.fallback_to_local = Some(false);
    let t = app_with(vec![with_fallback, strict]).await;
    let (rita, _) = seed(&t).await;
    let served = t.serve().await;
    let (mut sock, head) = open_stream(&served.base, &rita, &long_chat(true), 4).await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    server.kill();
    let all = read_rest(&mut sock, head).await;
    assert!(all.contains("event: error"), "{all}");
    let problem: Value = serde_json::from_str(
        all.lines()
            .skip_while(|l| *l != "event: error")
            .nth(1)
            .unwrap()
            .strip_prefix("data: ")
            .unwrap(),
    )
    .unwrap();
    assert_eq!(problem["status"], 502, "{all}");
    assert_eq!(
        problem["type"],
        "https://airlock.local/problems/upstream-failed"
    );
    // `[DONE]` after the error event (the raw body is chunked: compare positions).
    assert!(
        all.rfind("data: [DONE]") > all.find("event: error"),
        "{all}"
    );
    let m = metrics(&t).await;
    assert_eq!(
        metric(
            &m,
            &format!("airlock_remote_breaker_opened_total{{backend=\"{ALIAS}\"")
        ),
        1.0,
        "{m}"
    );
    assert!(
        m.contains(&format!(
            "airlock_remote_breaker_open{{backend=\"{ALIAS}\",replica=\"127.0.0.1:{}\"}} 1",
            server.port
        )),
        "{m}"
    );

    // Breaker open + fallback enabled: the local small model answers, and says so.
    let r = t
        .call(
            Method::POST,
            "/v1/chat/completions",
            Some(&rita),
            Some(question(json!({}))),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert_eq!(r.headers.get("x-airlock-model-fallback").unwrap(), "true");
    assert_eq!(r.json["model"], "airlock-small", "{}", r.text);
    assert_eq!(
        r.json["airlock"]["citations"][0]["doc_id"], "doc-risk",
        "{}",
        r.text
    );
    let m = metrics(&t).await;
    assert_eq!(
        metric(
            &m,
            &format!("airlock_model_fallback_total{{from=\"{ALIAS}\",reason=\"unhealthy\"}}")
        ),
        1.0,
        "{m}"
    );

    // Without fallback the request is refused, visibly: nothing listens any more, so the
    // streaming request fails before its first byte (502), and that opens this breaker too,
    // after which requests are shed (503 + Retry-After).
    let strict_q = |stream: bool| {
        let mut q = question(json!({"stream": stream}));
        q["model"] = "airlock-rack-strict".into();
        q
    };
    let r = t
        .call(
            Method::POST,
            "/v1/chat/completions",
            Some(&rita),
            Some(strict_q(true)),
        )
        .await;
    r.assert_problem(
        502,
        "upstream-failed",
        "the request could not be completed; the cause is logged under its request id",
    );
    let r = t
        .call(
            Method::POST,
            "/v1/chat/completions",
            Some(&rita),
            Some(strict_q(false)),
        )
        .await;
    assert_eq!(r.status, StatusCode::SERVICE_UNAVAILABLE, "{}", r.text);
    let retry: u64 = r.headers["retry-after"].to_str().unwrap().parse().unwrap();
    assert!((500..=600).contains(&retry), "{retry}");
    served.shutdown().await;
}

/// The rack's admission: one request in flight per replica (llama-cpp-python runs one at a
/// time), one waiting; the next is shed at once with 503 + Retry-After.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_saturated_rack_sheds_with_503_and_retry_after() {
    if !LlamaServer::available("a_saturated_rack_sheds_with_503_and_retry_after") {
        return;
    }
    let server = LlamaServer::start();
    let mut c = rack_config(vec![server.base_url()]);
    c.queue_capacity = Some(1);
    c.queue_timeout_ms = Some(120_000);
    let t = app_with(vec![c]).await;
    let (rita, _) = seed(&t).await;
    let served = t.serve().await;
    // One generating…
    let (running, head) = open_stream(&served.base, &rita, &long_chat(true), 3).await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    // …one waiting for the replica (no response head until it gets a slot)…
    let waiting = {
        let base = served.base.clone();
        let rita = rita.clone();
        tokio::spawn(async move { open_stream(&base, &rita, &long_chat(true), 1).await })
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    while metric(
        &metrics(&t).await,
        &format!("airlock_remote_waiting{{backend=\"{ALIAS}\"}}"),
    ) < 1.0
    {
        assert!(Instant::now() < deadline, "the second request never queued");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // …and the third is shed immediately.
    let t0 = Instant::now();
    let r = t
        .call(
            Method::POST,
            "/v1/chat/completions",
            Some(&rita),
            Some(question(json!({}))),
        )
        .await;
    assert!(t0.elapsed() < Duration::from_secs(5), "{:?}", t0.elapsed());
    r.assert_problem(
        503,
        "capacity-unavailable",
        "the appliance is at capacity; retry later",
    );
    assert_eq!(r.headers["retry-after"], "120");
    let m = metrics(&t).await;
    assert_eq!(
        metric(
            &m,
            &format!("airlock_remote_shed_total{{backend=\"{ALIAS}\"}}")
        ),
        1.0,
        "{m}"
    );
    assert!(
        m.contains(&format!(
            "airlock_remote_inflight{{backend=\"{ALIAS}\",replica=\"127.0.0.1:{}\"}} 1",
            server.port
        )),
        "{m}"
    );
    // Cancel the running one: the waiting one gets the replica.
    drop(running);
    let (mut sock, head) = tokio::time::timeout(Duration::from_secs(120), waiting)
        .await
        .expect("the queued request never started")
        .unwrap();
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    drop(sock.shutdown().await);
    served.shutdown().await;
    drop(server);
}

/// A non-streaming request whose replica cannot be reached (never reached an engine) is
/// retried on another replica; the dead one's failure counts against its breaker.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreached_replica_is_retried_elsewhere_for_non_streaming_requests() {
    if !LlamaServer::available(
        "an_unreached_replica_is_retried_elsewhere_for_non_streaming_requests",
    ) {
        return;
    }
    let server = LlamaServer::start();
    // Replica 0 is a loopback proxy to the server, closed after start-up: connects to it are
    // refused from then on.
    let proxy = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let proxy_port = proxy.local_addr().unwrap().port();
    let upstream_port = server.port;
    let proxy_task = tokio::spawn(async move {
        loop {
            let Ok((mut c, _)) = proxy.accept().await else {
                return;
            };
            tokio::spawn(async move {
                let mut u = tokio::net::TcpStream::connect(("127.0.0.1", upstream_port))
                    .await
                    .unwrap();
                let _ = tokio::io::copy_bidirectional(&mut c, &mut u).await;
            });
        }
    });
    let mut c = rack_config(vec![
        format!("http://127.0.0.1:{proxy_port}/v1"),
        server.base_url(),
    ]);
    c.routing = Some("least-loaded".into());
    let t = app_with(vec![c]).await;
    let (rita, _) = seed(&t).await;
    proxy_task.abort();
    let _ = proxy_task.await;
    // Streaming: not retried (502 upstream-failed from replica 0, the first least-loaded).
    let r = t
        .call(
            Method::POST,
            "/v1/chat/completions",
            Some(&rita),
            Some(question(json!({"stream": true}))),
        )
        .await;
    assert_eq!(r.status.as_u16(), 502, "{}", r.text);
    // Non-streaming: retried on replica 1 and answered.
    let r = t
        .call(
            Method::POST,
            "/v1/chat/completions",
            Some(&rita),
            Some(question(json!({}))),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert_eq!(r.json["model"], ALIAS);
    let m = metrics(&t).await;
    assert_eq!(
        metric(
            &m,
            &format!("airlock_remote_retries_total{{backend=\"{ALIAS}\"}}")
        ),
        1.0,
        "{m}"
    );
    assert_eq!(
        metric(
            &m,
            &format!(
                "airlock_remote_errors_total{{backend=\"{ALIAS}\",replica=\"127.0.0.1:{proxy_port}\"}}"
            )
        ),
        2.0,
        "{m}"
    );
    drop(server);
}

/// The lockdown with an allowed port: a locked-down thread reaches a listener on that port and
/// is denied on any other (skipped, loudly, where Landlock cannot enforce network rules).
#[test]
fn the_lockdown_allows_only_the_rack_ports() {
    let allowed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let other = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let (a, o) = (allowed.local_addr().unwrap(), other.local_addr().unwrap());
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().to_path_buf();
    let outcome = std::thread::spawn(move || {
        let report =
            airlock_platform::sandbox::lock_down_allowing(&[p.as_path()], &[a.port()], false)
                .unwrap();
        if !report.fully_enforced() {
            return Err(report);
        }
        let t = Duration::from_secs(5);
        Ok((
            std::net::TcpStream::connect_timeout(&a, t).map(|_| ()),
            std::net::TcpStream::connect_timeout(&o, t).map(|_| ()),
        ))
    })
    .join()
    .unwrap();
    let (to_allowed, to_other) = match outcome {
        Ok(r) => r,
        Err(report) => {
            eprintln!("SKIPPED: this kernel cannot enforce the lockdown ({report:?})");
            return;
        }
    };
    to_allowed.expect("the rack's port must stay reachable");
    let err = to_other.expect_err("a port outside the allowlist was reached");
    assert_eq!(err.kind(), std::io::ErrorKind::PermissionDenied, "{err}");
}

/// The real binary under strace (`airlock demo` execs `airlock serve`, lockdown required) with
/// a rack in its config: every IPv4/IPv6 connect goes to the rack's host:port (the start-up
/// model check and the chat), nothing else is contacted.
#[test]
fn the_daemon_connects_only_to_the_configured_rack() {
    use crate::sandbox::{STRACE, http, inet_connects, stop_traced};
    if !std::path::Path::new(STRACE).exists() {
        eprintln!("SKIPPED: {STRACE} is not installed (.ci/run must install strace)");
        return;
    }
    if !LlamaServer::available("the_daemon_connects_only_to_the_configured_rack") {
        return;
    }
    let server = LlamaServer::start();
    let dir = tempfile::tempdir().unwrap();
    let staging = dir.path().join("staging");
    crate::support::small_staging(&staging);
    let data = dir.path().join("data");
    let toml_path = dir.path().join("rack.toml");
    std::fs::write(
        &toml_path,
        format!(
            "[[remote_generators]]\nalias = \"{ALIAS}\"\nkind = \"openai-compatible\"\n\
             base_urls = [\"{}\"]\nmodel = \"{UPSTREAM_MODEL}\"\nmax_inflight_per_replica = 1\n\
             first_token_timeout_ms = 300000\n",
            server.base_url()
        ),
    )
    .unwrap();
    let log = dir.path().join("strace.txt");
    let port = free_port();
    let (mut strace, logs) =
        crate::sandbox::traced_demo_ready(&log, &data, &staging, &toml_path, port);
    let base = format!("http://127.0.0.1:{port}");
    let tokens: Value =
        serde_json::from_slice(&std::fs::read(data.join("demo/tokens.json")).unwrap()).unwrap();
    let admin = tokens["admin"].as_str().unwrap().to_string();
    let (s, body) = http(
        "PUT",
        &format!("{base}/v1/documents/doc-1"),
        // A second operator grants the admin the document (a grant to oneself needs four eyes).
        tokens["approver"].as_str().unwrap(),
        Some(json!({
            "title": "Liquidity buffer",
            "text": "The liquidity buffer must stay above fifteen percent of deposits.",
            "acl": {"users": ["admin"], "groups": []},
        })),
    );
    assert_eq!(s, 201, "{body}");
    let (s, body) = http(
        "POST",
        &format!("{base}/v1/chat/completions"),
        &admin,
        Some(json!({
            "model": ALIAS,
            "messages": [{"role": "user", "content": "What is the liquidity buffer?"}],
            "max_tokens": 8,
        })),
    );
    assert_eq!(s, 200, "{body}");
    assert_eq!(body["model"], ALIAS, "{body}");
    assert_eq!(body["airlock"]["citations"][0]["doc_id"], "doc-1", "{body}");
    stop_traced(&mut strace);
    let logs = logs.join().unwrap();
    assert!(
        logs.lines()
            .any(|l| l.contains("egress lockdown active") && l.contains(&server.port.to_string())),
        "the daemon must log its lockdown with the rack's port:\n{logs}"
    );
    let trace = std::fs::read_to_string(&log).unwrap();
    let inet = inet_connects(&trace);
    let rack = format!("sin_port=htons({})", server.port);
    assert!(
        inet.len() >= 2,
        "expected the start-up check and the chat:\n{trace}"
    );
    for l in &inet {
        assert!(
            l.contains(&rack) && l.contains("127.0.0.1"),
            "a connect outside the rack:\n{l}"
        );
    }
    eprintln!("{} connects, all to 127.0.0.1:{}", inet.len(), server.port);
    drop(server);
}

/// `openssl s_server` on a free loopback port with `pair`: a real TLS endpoint, stopped on drop.
struct SServer(std::process::Child, u16);

impl SServer {
    fn start(pair: &crate::tls::Pair) -> Self {
        let port = free_port();
        let child = std::process::Command::new("openssl")
            .args(["s_server", "-quiet", "-www", "-accept"])
            .arg(format!("127.0.0.1:{port}"))
            .arg("-cert")
            .arg(&pair.cert)
            .arg("-key")
            .arg(&pair.key)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("openssl s_server");
        let deadline = Instant::now() + Duration::from_secs(20);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(Instant::now() < deadline, "openssl s_server did not listen");
            std::thread::sleep(Duration::from_millis(50));
        }
        SServer(child, port)
    }
}

impl Drop for SServer {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// An https rack (`ca_file`): the real llama.cpp server behind TLS (uvicorn's own, with a
/// certificate from a test "bank CA" made by openssl) serves a chat through Airlock, streaming
/// and not; the same server is refused at start-up when `ca_file` is another CA, and a bank-CA
/// certificate for another host name is refused too (no system roots, no bypass).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_https_rack_is_verified_against_the_bank_ca_only() {
    use crate::tls::{KeyForm, Pki};
    if !LlamaServer::available("an_https_rack_is_verified_against_the_bank_ca_only") {
        return;
    }
    let pki = Pki::new();
    let bank_ca = pki.ca("bank-ca");
    let other_ca = pki.ca("other-ca");
    let leaf = pki.leaf(&bank_ca, "rack", KeyForm::EcPkcs8, false);
    let server = LlamaServer::start_tls(&leaf);
    let mut c = rack_config(vec![server.base_url()]);
    assert!(c.base_urls[0].starts_with("https://127.0.0.1:"));
    c.ca_file = Some(bank_ca.cert.clone());

    let t = app_with(vec![c.clone()]).await;
    let (rita, _) = seed(&t).await;
    let r = t
        .call(
            Method::POST,
            "/v1/chat/completions",
            Some(&rita),
            Some(question(json!({}))),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert_eq!(r.json["model"], ALIAS, "{}", r.text);
    assert_eq!(
        r.json["airlock"]["citations"][0]["doc_id"], "doc-risk",
        "{}",
        r.text
    );
    assert!(
        !r.json["choices"][0]["message"]["content"]
            .as_str()
            .unwrap()
            .is_empty()
    );
    let r = t
        .call(
            Method::POST,
            "/v1/chat/completions",
            Some(&rita),
            Some(question(json!({"stream": true}))),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert!(r.text.trim_end().ends_with("data: [DONE]"), "{}", r.text);
    assert!(!r.text.contains("event: error"), "{}", r.text);

    // By DNS name (sent as SNI): the certificate names localhost too.
    let mut by_name = c.clone();
    by_name.base_urls = vec![format!("https://localhost:{}/v1", server.port)];
    RemoteGenerator::connect(by_name)
        .await
        .expect("https://localhost is in the certificate");

    // The same server, trusted through another CA: refused at start-up, saying why.
    let mut wrong_ca = c.clone();
    wrong_ca.ca_file = Some(other_ca.cert.clone());
    let config = airlock::Config {
        remote_generators: vec![wrong_ca],
        ..test_config()
    };
    config.validate().unwrap();
    let err = tokio::task::spawn_blocking(move || airlock::startup::connect_remotes(&config))
        .await
        .unwrap()
        .expect_err("a certificate from another CA was accepted");
    let msg = format!("{err:#}");
    eprintln!("another CA: {msg}");
    assert!(
        msg.contains("remote generator `airlock-rack`")
            && msg.contains("invalid peer certificate")
            && msg.contains("UnknownIssuer")
            && msg.contains(&other_ca.cert.display().to_string()),
        "{msg}"
    );

    // A bank-CA certificate for another host: refused for the name, by IP and by DNS name.
    let elsewhere = pki.server_leaf_for(&bank_ca, "elsewhere", "DNS:rack.bank.internal");
    let s = SServer::start(&elsewhere);
    for host in ["127.0.0.1", "localhost"] {
        let mut wrong_host = c.clone();
        wrong_host.base_urls = vec![format!("https://{host}:{}/v1", s.1)];
        let err = RemoteGenerator::connect(wrong_host)
            .await
            .expect_err("a certificate for another host name was accepted");
        let msg = err.to_string();
        eprintln!("wrong host {host}: {msg}");
        assert!(
            msg.contains("invalid peer certificate")
                && msg.contains("not valid for name")
                && msg.contains(&format!("name `{host}`")),
            "{msg}"
        );
    }
    // Plain http to the https port gets no answer: nothing is sent in clear.
    let mut plain = c.clone();
    plain.base_urls = vec![format!("http://127.0.0.1:{}/v1", server.port)];
    plain.ca_file = None;
    plain.first_token_timeout_ms = Some(5000);
    assert!(RemoteGenerator::connect(plain).await.is_err());
    drop(server);
}

/// `python3 -m http.server` serving a directory on a free loopback port (the engine's
/// `/metrics` is the file `metrics` in it), stopped on drop.
struct FileServer(std::process::Child, u16, tempfile::TempDir);

impl FileServer {
    fn start(metrics: &str) -> Self {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("metrics"), metrics).unwrap();
        let port = free_port();
        let child = std::process::Command::new("python3")
            .args([
                "-m",
                "http.server",
                &port.to_string(),
                "--bind",
                "127.0.0.1",
            ])
            .arg("--directory")
            .arg(dir.path())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("python3 -m http.server");
        let deadline = Instant::now() + Duration::from_secs(20);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(Instant::now() < deadline, "http.server did not listen");
            std::thread::sleep(Duration::from_millis(50));
        }
        FileServer(child, port, dir)
    }

    fn url(&self) -> String {
        format!("http://127.0.0.1:{}/metrics", self.1)
    }

    /// Replaces the served text atomically (a scrape never sees half a file).
    fn set(&self, metrics: &str) {
        let tmp = self.2.path().join("metrics.tmp");
        std::fs::write(&tmp, metrics).unwrap();
        std::fs::rename(tmp, self.2.path().join("metrics")).unwrap();
    }
}

impl Drop for FileServer {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn vllm_metrics(waiting: u32, running: u32) -> String {
    format!(
        "# HELP vllm:num_requests_running Number of requests currently running on GPU.\n\
         # TYPE vllm:num_requests_running gauge\n\
         vllm:num_requests_running{{engine=\"0\",model_name=\"{UPSTREAM_MODEL}\"}} {running}.0\n\
         # HELP vllm:num_requests_waiting Number of requests waiting to be processed.\n\
         # TYPE vllm:num_requests_waiting gauge\n\
         vllm:num_requests_waiting{{engine=\"0\",model_name=\"{UPSTREAM_MODEL}\"}} {waiting}.0\n\
         vllm:num_requests_waiting{{engine=\"0\",model_name=\"another-model\"}} 50.0\n"
    )
}

/// Engine metrics feed admission (issue 25 point 2): the upstream is the real llama.cpp
/// server; its metrics endpoint is a file served over real HTTP in vLLM's format (vLLM cannot
/// run here: tested by contract, the exact series names of vLLM's `/metrics`). While the engine
/// reports more waiting requests than `engine_waiting_full`, the replica counts as full: the
/// request is shed 503 + Retry-After, or answered by the local model where fallback is on; when
/// the queue drains, the rack answers again. A wrong engine kind or a URL without the series is
/// a start-up error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn engine_metrics_saturate_the_rack_and_recover() {
    if !LlamaServer::available("engine_metrics_saturate_the_rack_and_recover") {
        return;
    }
    let server = LlamaServer::start();
    let metrics_server = FileServer::start(&vllm_metrics(0, 1));
    let mut strict = rack_config(vec![server.base_url()]);
    strict.engine_metrics = Some("vllm".into());
    strict.metrics_urls = Some(vec![metrics_server.url()]);
    strict.engine_waiting_full = Some(2);
    strict.engine_metrics_interval_ms = Some(100);
    strict.queue_timeout_ms = Some(1000);
    let mut with_fallback = strict.clone();
    with_fallback.alias = "airlock-rack-fb".into();
    with_fallback.fallback_to_local = Some(true);
    let t = app_with(vec![strict.clone(), with_fallback]).await;
    let (rita, _) = seed(&t).await;
    let ask = |alias: &str| {
        let mut q = question(json!({}));
        q["model"] = alias.into();
        q
    };
    let waiting_gauge = format!(
        "airlock_remote_engine_waiting{{backend=\"{ALIAS}\",replica=\"127.0.0.1:{}\"}}",
        server.port
    );
    let wait_for_gauge = |want: f64| {
        let t = &t;
        let g = waiting_gauge.clone();
        async move {
            let deadline = Instant::now() + Duration::from_secs(20);
            loop {
                let m = metrics(t).await;
                if metric(&m, &g) == want {
                    return m;
                }
                assert!(Instant::now() < deadline, "{g} never became {want}:\n{m}");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    };

    // Waiting 0 (another model's 50 are not this model's queue): the rack answers.
    let m = wait_for_gauge(0.0).await;
    assert!(
        m.contains(&format!(
            "airlock_remote_engine_running{{backend=\"{ALIAS}\",replica=\"127.0.0.1:{}\"}} 1",
            server.port
        )),
        "{m}"
    );
    let r = t
        .call(
            Method::POST,
            "/v1/chat/completions",
            Some(&rita),
            Some(ask(ALIAS)),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert_eq!(r.json["model"], ALIAS, "{}", r.text);

    // The engine's queue is over the bound: no slot on the replica.
    metrics_server.set(&vllm_metrics(5, 8));
    wait_for_gauge(5.0).await;
    let t0 = Instant::now();
    let r = t
        .call(
            Method::POST,
            "/v1/chat/completions",
            Some(&rita),
            Some(ask(ALIAS)),
        )
        .await;
    r.assert_problem(
        503,
        "capacity-unavailable",
        "the appliance is at capacity; retry later",
    );
    assert!(r.headers.contains_key("retry-after"));
    assert!(t0.elapsed() < Duration::from_secs(10), "{:?}", t0.elapsed());
    let r = t
        .call(
            Method::POST,
            "/v1/chat/completions",
            Some(&rita),
            Some(ask("airlock-rack-fb")),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert_eq!(r.headers.get("x-airlock-model-fallback").unwrap(), "true");
    assert_eq!(r.json["model"], "airlock-small", "{}", r.text);
    let m = metrics(&t).await;
    assert_eq!(
        metric(
            &m,
            "airlock_model_fallback_total{from=\"airlock-rack-fb\",reason=\"saturated\"}"
        ),
        1.0,
        "{m}"
    );
    assert_eq!(
        metric(
            &m,
            &format!("airlock_remote_shed_total{{backend=\"{ALIAS}\"}}")
        ),
        1.0,
        "{m}"
    );

    // At the bound (2 waiting) the replica has room again.
    metrics_server.set(&vllm_metrics(2, 8));
    wait_for_gauge(2.0).await;
    let r = t
        .call(
            Method::POST,
            "/v1/chat/completions",
            Some(&rita),
            Some(ask(ALIAS)),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert_eq!(r.json["model"], ALIAS, "{}", r.text);

    // The metrics endpoint dies: after three intervals the stale load says nothing and the
    // rack is admitted on Airlock's own signals.
    metrics_server.set(&vllm_metrics(9, 8));
    wait_for_gauge(9.0).await;
    drop(metrics_server);
    wait_for_gauge(-1.0).await;
    let r = t
        .call(
            Method::POST,
            "/v1/chat/completions",
            Some(&rita),
            Some(ask(ALIAS)),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);

    // Start-up: the wrong engine kind for the text, and a URL without metrics, are refused.
    let again = FileServer::start(&vllm_metrics(0, 0));
    let mut wrong_kind = strict.clone();
    wrong_kind.metrics_urls = Some(vec![again.url()]);
    wrong_kind.engine_metrics = Some("llamacpp".into());
    let err = RemoteGenerator::connect(wrong_kind)
        .await
        .expect_err("a metrics endpoint without the llama.cpp series was accepted");
    let msg = err.to_string();
    assert!(
        msg.contains("engine_metrics = \"llamacpp\"")
            && msg.contains("has no `llamacpp:requests_deferred` series"),
        "{msg}"
    );
    let mut no_metrics = strict.clone();
    no_metrics.metrics_urls = None; // the default: the replica's own /metrics
    let err = RemoteGenerator::connect(no_metrics)
        .await
        .expect_err("an engine without /metrics was accepted");
    let msg = err.to_string();
    assert!(
        msg.contains(&format!(
            "http://127.0.0.1:{}/metrics answered 404",
            server.port
        )),
        "{msg}"
    );
    drop(server);
}
