//! Per-stage latency of `/v1/retrieve` and `/v1/chat/completions` through the real router
//! (`app()` + `oneshot`: routing, auth, JSON, admission, retrieval, re-check, prompt, engine) on
//! a bank-dev subset with `iam_v1`, MiniLM and SmolLM2. Prints p50/p99 per stage.
//!
//! `cargo bench -p airlock --bench daemon` (env: `AIRLOCK_BENCH_DOCS` documents, default 600;
//! `AIRLOCK_BENCH_QUERIES` retrieve queries, default 200; `AIRLOCK_BENCH_CHATS` chats, default 20;
//! `AIRLOCK_MODELS_DIR`, `AIRLOCK_SHARED_DIR` as in the tests).

use std::collections::BTreeMap;
use std::time::Instant;

use airlock::{AppState, Config, app};
use axum::body::Body;
use axum::http::{Request, header};
use http_body_util::BodyExt;
use serde_json::{Value, json};
use tower::ServiceExt;

#[path = "support/bank.rs"]
mod bank;

use bank::{Bank, env_usize, pct};

fn report(title: &str, stages: &BTreeMap<String, Vec<f64>>) {
    println!("\n{title}");
    println!("| stage | p50 ms | p99 ms | n |");
    println!("|---|---:|---:|---:|");
    for (k, v) in stages {
        let mut v = v.clone();
        let n = v.len();
        println!(
            "| {k} | {:.2} | {:.2} | {n} |",
            pct(&mut v, 0.5),
            pct(&mut v, 0.99)
        );
    }
}

fn collect(prefix: &str, v: &Value, out: &mut BTreeMap<String, Vec<f64>>) {
    if let Some(obj) = v.as_object() {
        for (k, x) in obj {
            let key = if prefix.is_empty() {
                k.clone()
            } else {
                format!("{prefix}.{k}")
            };
            if let Some(f) = x.as_f64() {
                out.entry(key).or_default().push(f);
            } else {
                collect(&key, x, out);
            }
        }
    }
}

async fn call(router: &axum::Router, token: &str, path: &str, body: Value) -> (f64, Value) {
    let req = Request::post(path)
        .header(header::AUTHORIZATION, format!("Bearer {token}"))
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from(body.to_string()))
        .unwrap();
    let t = Instant::now();
    let resp = router.clone().oneshot(req).await.unwrap();
    let status = resp.status();
    let bytes = resp.into_body().collect().await.unwrap().to_bytes();
    let ms = t.elapsed().as_secs_f64() * 1e3;
    assert!(
        status.is_success(),
        "{status}: {}",
        String::from_utf8_lossy(&bytes)
    );
    (ms, serde_json::from_slice(&bytes).unwrap())
}

fn main() {
    let n_docs = env_usize("AIRLOCK_BENCH_DOCS", 600);
    let n_queries = env_usize("AIRLOCK_BENCH_QUERIES", 200);
    let n_chats = env_usize("AIRLOCK_BENCH_CHATS", 20);
    println!("{}", bank::cpu_line());
    let bank = Bank::load(n_docs);
    let (cases, tokens) = (&bank.cases, &bank.tokens);
    // Stage latency at rung 0: the load-driven ladder is off (it is measured by the `load`
    // bench; a slow answer on 2 cores would otherwise step it down to the rung-4 deadline), so
    // every request runs the full pipeline. Quotas are off by default.
    let config = Config {
        ladder: Some(false),
        ..Config::default()
    };
    let router = app(AppState::ready(config, bank.services()));
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    println!(
        "{} cases usable; running {n_queries} retrieves and {n_chats} chats",
        cases.len()
    );

    rt.block_on(async {
        // Warm-up.
        for (u, q) in cases.iter().take(5) {
            call(&router, &tokens[u], "/v1/retrieve", json!({"query": q})).await;
        }
        let mut stages: BTreeMap<String, Vec<f64>> = BTreeMap::new();
        for (u, q) in cases.iter().cycle().take(n_queries) {
            let (ms, v) = call(
                &router,
                &tokens[u],
                "/v1/retrieve",
                json!({"query": q, "top_k": 10}),
            )
            .await;
            collect("", &v["timings_ms"], &mut stages);
            stages.entry("end_to_end".into()).or_default().push(ms);
        }
        report("POST /v1/retrieve (hybrid, top_k 10)", &stages);

        let mut stages: BTreeMap<String, Vec<f64>> = BTreeMap::new();
        for (u, q) in cases.iter().cycle().take(n_chats) {
            let (ms, v) = call(
                &router,
                &tokens[u],
                "/v1/chat/completions",
                json!({"messages": [{"role": "user", "content": q}], "max_tokens": 32}),
            )
            .await;
            collect("", &v["airlock"]["timings_ms"], &mut stages);
            stages.entry("end_to_end".into()).or_default().push(ms);
            stages
                .entry("prompt_tokens".into())
                .or_default()
                .push(v["usage"]["prompt_tokens"].as_f64().unwrap());
            stages
                .entry("completion_tokens".into())
                .or_default()
                .push(v["usage"]["completion_tokens"].as_f64().unwrap());
        }
        report(
            "POST /v1/chat/completions (SmolLM2, top_k 6, max_tokens 32, sequential)",
            &stages,
        );
    });
}
