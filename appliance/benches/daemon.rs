//! Per-stage latency of `/v1/retrieve` and `/v1/chat/completions` through the real router
//! (`app()` + `oneshot`: routing, auth, JSON, admission, retrieval, re-check, prompt, engine) on
//! a bank-dev subset with `iam_v1`, MiniLM and SmolLM2. Prints p50/p99 per stage.
//!
//! `cargo bench -p airlock --bench daemon` (env: `AIRLOCK_BENCH_DOCS` documents, default 600;
//! `AIRLOCK_BENCH_QUERIES` retrieve queries, default 200; `AIRLOCK_BENCH_CHATS` chats, default 20;
//! `AIRLOCK_MODELS_DIR`, `AIRLOCK_SHARED_DIR` as in the tests).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use airlock::generator::Generator;
use airlock::services::ModelCard;
use airlock::{AppState, Config, Services, app};
use airlock_acl::{Acl, NewUser, Role};
use airlock_inference::generate::EngineConfig;
use airlock_inference::{Catalogue, Embedder, EmbedderConfig, EmbedderFiles};
use airlock_retrieval::{DocumentInput, Retrieval, RetrievalConfig};
use axum::body::Body;
use axum::http::{Request, header};
use http_body_util::BodyExt;
use serde_json::{Value, json};
use tower::ServiceExt;

fn env_usize(k: &str, d: usize) -> usize {
    std::env::var(k)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(d)
}

fn dir(var: &str, rel: &str) -> PathBuf {
    std::env::var_os(var)
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(rel))
}

fn pct(v: &mut [f64], p: f64) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    let i = ((v.len() as f64 - 1.0) * p).round() as usize;
    v[i]
}

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
    let models = dir("AIRLOCK_MODELS_DIR", "../models-cache/models");
    let staging = models.join("../staging");
    let data = dir("AIRLOCK_SHARED_DIR", "../../shared").join("datasets/bank-dev");
    let n_docs = env_usize("AIRLOCK_BENCH_DOCS", 600);
    let n_queries = env_usize("AIRLOCK_BENCH_QUERIES", 200);
    let n_chats = env_usize("AIRLOCK_BENCH_CHATS", 20);

    let tmp = tempfile::tempdir().unwrap();
    let db = tmp.path().join("airlock.db");
    let embedder = Arc::new(
        Embedder::load(
            &EmbedderFiles::in_dir(&models.join("minilm")),
            EmbedderConfig::default(),
        )
        .unwrap(),
    );
    let acl = Arc::new(Acl::open(&db).unwrap());
    let retrieval = Arc::new(
        Retrieval::open(
            &db,
            &tmp.path().join("index"),
            RetrievalConfig::default(),
            Arc::new(airlock::models::EmbedAdapter(embedder.clone())),
            None,
        )
        .unwrap(),
    );
    let cat = Catalogue::from_bundle_dir(&staging).unwrap();
    let entry = cat.by_id("smollm2").unwrap();
    let generator = Arc::new(
        Generator::load(
            "airlock-small",
            "smollm2",
            &cat.generator_files(entry).unwrap(),
            EngineConfig::default(),
        )
        .unwrap(),
    );

    // Corpus subset (in file order) and the IAM snapshot.
    let t = Instant::now();
    let docs: Vec<DocumentInput> = std::fs::read_to_string(data.join("corpus.jsonl"))
        .unwrap()
        .lines()
        .take(n_docs)
        .map(|l| {
            let v: Value = serde_json::from_str(l).unwrap();
            DocumentInput::new(
                v["doc_id"].as_str().unwrap(),
                v["title"].as_str().unwrap(),
                v["text"].as_str().unwrap(),
            )
        })
        .collect();
    let ids: std::collections::HashSet<String> = docs.iter().map(|d| d.doc_id.clone()).collect();
    let report_ingest = retrieval.upsert(docs, &mut |_| {}).unwrap();
    let chunks = retrieval.stats().live_chunks;
    println!(
        "ingested {} docs ({chunks} chunks) in {:.1} s",
        report_ingest.outcomes.len(),
        t.elapsed().as_secs_f64()
    );
    let iam = std::fs::File::open(data.join("iam_v1.jsonl")).unwrap();
    acl.sync_snapshot("bench", std::io::BufReader::new(iam))
        .unwrap();

    // Queries whose relevant documents are in the subset.
    let cases: Vec<(String, String)> = std::fs::read_to_string(data.join("golden.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .filter(|c| c["phase"] == "v1")
        .filter(|c| {
            c["relevant_doc_ids"]
                .as_array()
                .unwrap()
                .iter()
                .all(|d| ids.contains(d.as_str().unwrap()))
        })
        .map(|c| {
            (
                c["user"].as_str().unwrap().to_string(),
                c["query"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    let mut tokens = BTreeMap::new();
    for (u, _) in &cases {
        if !tokens.contains_key(u) {
            tokens.insert(u.clone(), acl.issue_token("bench", u).unwrap());
        }
    }
    let _admin = acl
        .add_user(
            "bench",
            "admin",
            &NewUser {
                groups: vec![],
                roles: vec![Role::Admin],
                local: true,
            },
        )
        .unwrap();
    let cards = vec![ModelCard {
        id: "airlock-small".into(),
        object: "model",
        created: 0,
        owned_by: "airlock",
        role: "generator".into(),
        model: "smollm2".into(),
    }];
    let services = Services::new(
        acl,
        retrieval,
        embedder,
        cards,
        vec![generator],
        "bench".into(),
    );
    let router = app(AppState::ready(Config::default(), services));
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
