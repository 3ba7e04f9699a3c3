//! Retrieval quality on real data with the real MiniLM embedder: Cranfield dev (BEIR layout,
//! qrels) and bank-dev golden cases (per-user ACL from `iam_v1.jsonl`), for every search mode and
//! several chunk sizes. Prints Markdown tables (see docs/benchmarks/retrieval.md).
//!
//! `cargo bench -p airlock --bench quality -- [--sets cranfield,bank] [--chunk-tokens 128,256]
//! [--bm25-only] [--bm25-avg-tokens 64,100]` (the last: BM25's constant average chunk length,
//! one run per value; default the configured one)
//! Data: `$AIRLOCK_SHARED_DIR` (default `../shared` next to the workspace), models:
//! `$AIRLOCK_MODELS_DIR` (default `models-cache/models`).

use std::collections::{HashMap, HashSet};
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use airlock_acl::{Acl, AllowSet};
use airlock_inference::{Embedder, EmbedderConfig, EmbedderFiles};
use airlock_retrieval::ingest::parse_jsonl;
use airlock_retrieval::{Embed, ModelError, Retrieval, RetrievalConfig, SearchMode, SearchRequest};
use airlock_serving::models::EmbedAdapter;
use anyhow::{Context, Result};
use serde_json::Value;

/// (label, mode, rescore)
const MODES: &[(&str, SearchMode, bool)] = &[
    ("bm25", SearchMode::Bm25, false),
    ("vector (int8)", SearchMode::Vector, false),
    ("vector + f32 rescoring", SearchMode::Vector, true),
    ("hybrid RRF k=60", SearchMode::Hybrid, false),
    ("hybrid RRF k=60 + f32 rescoring", SearchMode::Hybrid, true),
];

struct Query {
    text: String,
    user: Option<String>,
    relevant: HashSet<String>,
}

#[derive(Default)]
struct Scores {
    ndcg10: f64,
    recall: f64,
    mrr10: f64,
    n: usize,
    lat_total: Vec<f64>,
    lat_embed: Vec<f64>,
}

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| a != "--bench")
        .collect();
    let arg = |name: &str, default: &str| -> String {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1).cloned())
            .unwrap_or_else(|| default.to_owned())
    };
    let sets = arg("--sets", "cranfield");
    let bm25_only = args.iter().any(|a| a == "--bm25-only");
    let sizes: Vec<usize> = arg("--chunk-tokens", "256")
        .split(',')
        .map(|s| s.parse().context("--chunk-tokens"))
        .collect::<Result<_>>()?;
    let avgs: Vec<Option<f32>> = match args.iter().position(|a| a == "--bm25-avg-tokens") {
        Some(_) => arg("--bm25-avg-tokens", "")
            .split(',')
            .map(|s| s.parse().map(Some).context("--bm25-avg-tokens"))
            .collect::<Result<_>>()?,
        None => vec![None],
    };
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let shared = std::env::var_os("AIRLOCK_SHARED_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join("../shared"));
    let models = std::env::var_os("AIRLOCK_MODELS_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join("models-cache/models"));
    let embedder = Arc::new(Embedder::load(
        &EmbedderFiles::in_dir(&models.join("minilm")),
        EmbedderConfig {
            name: "minilm".into(),
            ..EmbedderConfig::default()
        },
    )?);
    println!(
        "threads: RAYON_NUM_THREADS={:?}",
        std::env::var("RAYON_NUM_THREADS").ok()
    );
    for set in sets.split(',') {
        for &size in &sizes {
            for &avg in &avgs {
                run(set, size, avg, &shared, &embedder, bm25_only)?;
            }
        }
    }
    Ok(())
}

/// BENCH-ONLY: MiniLM's tokenizer for chunking, a constant vector instead of the forward pass,
/// so BM25-only runs take seconds (vector modes are skipped with it).
struct TokenizerOnly(EmbedAdapter);

impl Embed for TokenizerOnly {
    fn dim(&self) -> usize {
        self.0.dim()
    }
    fn max_tokens(&self) -> usize {
        self.0.max_tokens()
    }
    fn token_spans(&self, text: &str) -> Result<Vec<(usize, usize)>, ModelError> {
        self.0.token_spans(text)
    }
    fn embed(&self, texts: &[&str]) -> Result<Vec<Vec<f32>>, ModelError> {
        let mut v = vec![0.0; self.dim()];
        v[0] = 1.0;
        Ok(vec![v; texts.len()])
    }
}

fn run(
    set: &str,
    chunk_tokens: usize,
    avg_tokens: Option<f32>,
    shared: &Path,
    embedder: &Arc<Embedder>,
    bm25_only: bool,
) -> Result<()> {
    let dir = tempfile::tempdir()?;
    let db = dir.path().join("airlock.db");
    let mut cfg = RetrievalConfig::default();
    cfg.chunk.target_tokens = chunk_tokens;
    cfg.search.candidates = 100;
    if let Some(a) = avg_tokens {
        cfg.bm25.avg_chunk_tokens = a;
    }
    let avg_label = cfg.bm25.avg_chunk_tokens;
    let adapter = EmbedAdapter(Arc::clone(embedder));
    let eng = if bm25_only {
        Retrieval::open_bm25_only(
            &db,
            &dir.path().join("index"),
            cfg,
            Arc::new(TokenizerOnly(adapter)),
            None,
        )?
    } else {
        Retrieval::open(&db, &dir.path().join("index"), cfg, Arc::new(adapter), None)?
    };
    let (corpus, k_docs, metric_k) = match set {
        "cranfield" => (shared.join("datasets/cranfield/corpus.jsonl"), 100, 100),
        "bank" => (shared.join("datasets/bank-dev/corpus.jsonl"), 10, 10),
        other => anyhow::bail!("unknown set {other}"),
    };
    let t = Instant::now();
    let f = std::fs::File::open(&corpus).with_context(|| corpus.display().to_string())?;
    let items = parse_jsonl("corpus", BufReader::new(f), 1 << 24);
    let report = eng.ingest_items(items, 256, &mut |_| {})?;
    for e in &report.errors {
        println!("refused: {e}");
    }
    let ingest_s = t.elapsed().as_secs_f64();
    let stats = eng.stats();
    println!(
        "\n### {set}, chunk target {chunk_tokens} tokens, BM25 average chunk length {avg_label}: {} docs, {} chunks, ingest {ingest_s:.1} s ({:.1} chunks/s)\n",
        stats.live_docs,
        stats.live_chunks,
        stats.live_chunks as f64 / ingest_s
    );
    // Who may read what.
    let acl = Acl::open(&db)?;
    let queries = match set {
        "cranfield" => {
            let mut snap = String::from("{\"user\": \"bench\", \"groups\": [\"all\"]}\n");
            for o in &report.outcomes {
                snap.push_str(&format!(
                    "{{\"doc\": {}, \"users\": [], \"groups\": [\"all\"]}}\n",
                    serde_json::to_string(&o.doc_id)?
                ));
            }
            acl.sync_snapshot("bench", snap.as_bytes())?;
            cranfield_queries(shared)?
        }
        _ => {
            let iam = std::fs::File::open(shared.join("datasets/bank-dev/iam_v1.jsonl"))?;
            acl.sync_snapshot("bench", BufReader::new(iam))?;
            bank_queries(shared)?
        }
    };
    println!(
        "| mode | nDCG@10 | recall@{metric_k} | MRR@10 | mean ms | p50 ms | p99 ms | of which embed p50 ms |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    for &(label, mode, rescore) in MODES {
        if bm25_only && mode != SearchMode::Bm25 {
            continue;
        }
        let mut s = Scores::default();
        let mut allow_cache: HashMap<String, AllowSet> = HashMap::new();
        for q in &queries {
            let user = q.user.as_deref().unwrap_or("bench");
            let allow = allow_cache
                .entry(user.to_owned())
                .or_insert_with(|| acl.allow_set(user))
                .clone();
            let req = SearchRequest {
                query: &q.text,
                k: k_docs.max(30),
                mode,
                rescore,
                rerank: false,
            };
            let r = eng.search(&req, &allow)?;
            let mut seen = HashSet::new();
            let docs: Vec<&str> = r
                .results
                .iter()
                .map(|x| x.doc_id.as_str())
                .filter(|d| seen.insert(*d))
                .collect();
            score(&mut s, &docs, &q.relevant, metric_k);
            s.lat_total.push(r.timings.total_ms);
            s.lat_embed.push(r.timings.embed_ms);
        }
        let n = s.n as f64;
        println!(
            "| {label} | {:.4} | {:.4} | {:.4} | {:.2} | {:.2} | {:.2} | {:.2} |",
            s.ndcg10 / n,
            s.recall / n,
            s.mrr10 / n,
            s.lat_total.iter().sum::<f64>() / n,
            pct(&mut s.lat_total, 0.5),
            pct(&mut s.lat_total, 0.99),
            pct(&mut s.lat_embed, 0.5),
        );
    }
    Ok(())
}

fn score(s: &mut Scores, ranked_docs: &[&str], relevant: &HashSet<String>, recall_k: usize) {
    let dcg: f64 = ranked_docs
        .iter()
        .take(10)
        .enumerate()
        .filter(|(_, d)| relevant.contains(**d))
        .map(|(i, _)| 1.0 / ((i + 2) as f64).log2())
        .sum();
    let idcg: f64 = (0..relevant.len().min(10))
        .map(|i| 1.0 / ((i + 2) as f64).log2())
        .sum();
    s.ndcg10 += if idcg > 0.0 { dcg / idcg } else { 0.0 };
    let hits = ranked_docs
        .iter()
        .take(recall_k)
        .filter(|d| relevant.contains(**d))
        .count();
    s.recall += hits as f64 / relevant.len() as f64;
    s.mrr10 += ranked_docs
        .iter()
        .take(10)
        .position(|d| relevant.contains(*d))
        .map_or(0.0, |i| 1.0 / (i + 1) as f64);
    s.n += 1;
}

fn pct(v: &mut [f64], p: f64) -> f64 {
    v.sort_by(f64::total_cmp);
    let i = ((v.len() as f64 - 1.0) * p).round() as usize;
    v[i]
}

fn cranfield_queries(shared: &Path) -> Result<Vec<Query>> {
    let base = shared.join("datasets/cranfield");
    let mut rel: HashMap<String, HashSet<String>> = HashMap::new();
    let qrels = std::fs::read_to_string(base.join("qrels/dev.tsv"))?;
    for line in qrels.lines().skip(1) {
        let f: Vec<&str> = line.split('\t').collect();
        if f.len() >= 3 && f[2].trim() != "0" {
            rel.entry(f[0].to_owned())
                .or_default()
                .insert(f[1].to_owned());
        }
    }
    let mut out = Vec::new();
    for line in BufReader::new(std::fs::File::open(base.join("queries.jsonl"))?).lines() {
        let v: Value = serde_json::from_str(&line?)?;
        let id = v["_id"].as_str().context("query _id")?.to_owned();
        if let Some(r) = rel.remove(&id) {
            out.push(Query {
                text: v["text"].as_str().context("query text")?.to_owned(),
                user: None,
                relevant: r,
            });
        }
    }
    Ok(out)
}

/// bank-dev golden cases valid in phase v1 that have relevant documents, asked as their user.
fn bank_queries(shared: &Path) -> Result<Vec<Query>> {
    let path = shared.join("datasets/bank-dev/golden.jsonl");
    let mut out = Vec::new();
    for line in BufReader::new(std::fs::File::open(path)?).lines() {
        let v: Value = serde_json::from_str(&line?)?;
        let v1 = v["valid_phases"]
            .as_array()
            .is_some_and(|p| p.iter().any(|x| x == "v1"));
        let relevant: HashSet<String> = v["relevant_doc_ids"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|x| x.as_str().map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default();
        if !v1 || relevant.is_empty() {
            continue;
        }
        out.push(Query {
            text: v["query"].as_str().context("query")?.to_owned(),
            user: v["user"].as_str().map(str::to_owned),
            relevant,
        });
    }
    Ok(out)
}
