//! What each reranker option does to Cranfield dev nDCG@10 over exact dense top-50 (bench
//! binary; metrics as in `../shared/peers/bench_quality.py`: binary gain, log2 discount, ideal
//! from qrels, mean over queries with judgements).
//!
//! `RAYON_NUM_THREADS=2 cargo bench -p airlock-inference --bench rerank_eval [-- LLM_QUERIES]`
//!
//! Options measured:
//! 1. exact dense f32 top-50 (the baseline, no reranking);
//! 2. an int8 first stage (per-vector symmetric scalar quantization, as an ANN index would hold)
//!    and then f32 rescoring of its top-50 with the embedder (what `EmbeddingRescorer` does);
//! 3. the LLM yes/no judge (`AIRLOCK_BENCH_JUDGE`: `qwen` (default) or `smollm2`) reranking the
//!    dense top-`AIRLOCK_BENCH_JUDGE_DEPTH` (default 20), on the first
//!    `LLM_QUERIES` judged queries (default 30: it costs ~20 s per query on 2 cores), alone and
//!    fused with the dense rank by reciprocal-rank fusion.
//!
//! The cross-encoder code path has no trained weights in the bundle, so it has no quality row.

#[path = "util/mod.rs"]
mod util;

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Instant;

use airlock_inference::EmbeddingRescorer;
use airlock_inference::catalogue::GeneratorFiles;
use airlock_inference::rerank::{LlmRelevanceScorer, LlmScorerConfig};

const DEPTH: usize = 50;

fn ndcg10(ranked: &[usize], ids: &[String], rel: &HashSet<String>) -> f64 {
    let dcg: f64 = ranked
        .iter()
        .take(10)
        .enumerate()
        .filter(|(_, d)| rel.contains(&ids[**d]))
        .map(|(i, _)| 1.0 / ((i + 2) as f64).log2())
        .sum();
    let idcg: f64 = (0..rel.len().min(10))
        .map(|i| 1.0 / ((i + 2) as f64).log2())
        .sum();
    dcg / idcg
}

fn top_k(scores: &[f32], k: usize) -> Vec<usize> {
    let mut idx: Vec<usize> = (0..scores.len()).collect();
    idx.sort_by(|&a, &b| scores[b].total_cmp(&scores[a]).then(a.cmp(&b)));
    idx.truncate(k);
    idx
}

fn dot(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

fn quantize(v: &[f32]) -> (Vec<i8>, f32) {
    let max = v.iter().fold(0f32, |m, x| m.max(x.abs())).max(1e-12);
    let scale = max / 127.0;
    (
        v.iter()
            .map(|x| (x / scale).round().clamp(-127.0, 127.0) as i8)
            .collect(),
        scale,
    )
}

fn main() {
    let llm_queries: usize = std::env::args()
        .skip(1)
        .find(|a| !a.starts_with('-'))
        .map(|a| a.parse().expect("LLM_QUERIES is a number"))
        .unwrap_or(30);
    println!(
        "RAYON_NUM_THREADS={} load={}",
        util::threads(),
        util::load_avg()
    );
    let emb = Arc::new(util::embedder());
    let cran = util::cranfield();
    let t0 = Instant::now();
    let docs: Vec<&str> = cran.docs.iter().map(String::as_str).collect();
    let dvec = emb.embed(&docs).unwrap();
    let queries: Vec<&str> = cran.queries.iter().map(String::as_str).collect();
    let qvec = emb.embed(&queries).unwrap();
    println!(
        "embedded {} docs + {} queries in {:.1} s",
        docs.len(),
        queries.len(),
        t0.elapsed().as_secs_f64()
    );
    let dq: Vec<(Vec<i8>, f32)> = dvec.iter().map(|v| quantize(v)).collect();

    // Sanity: the rescorer's scores are the cosines of the stored vectors.
    let rescorer = EmbeddingRescorer::new(Arc::clone(&emb));
    let check = rescorer.score(queries[0], &docs[..5]).unwrap();
    for (d, s) in check.iter().enumerate() {
        assert!((s - dot(&qvec[0], &dvec[d])).abs() < 1e-4);
    }

    let judged: Vec<usize> = (0..queries.len())
        .filter(|&q| cran.qrels.contains_key(&cran.query_ids[q]))
        .collect();
    let mut dense = Vec::new();
    let mut int8 = Vec::new();
    let mut int8_rescored = Vec::new();
    let mut dense_runs = Vec::new();
    for &q in &judged {
        let rel = &cran.qrels[&cran.query_ids[q]];
        let f32_scores: Vec<f32> = dvec.iter().map(|d| dot(&qvec[q], d)).collect();
        let run = top_k(&f32_scores, DEPTH);
        dense.push(ndcg10(&run, &cran.doc_ids, rel));
        dense_runs.push(run);
        let (qq, qs) = quantize(&qvec[q]);
        let i8_scores: Vec<f32> = dq
            .iter()
            .map(|(d, s)| {
                d.iter()
                    .zip(&qq)
                    .map(|(a, b)| i32::from(*a) * i32::from(*b))
                    .sum::<i32>() as f32
                    * s
                    * qs
            })
            .collect();
        let run8 = top_k(&i8_scores, DEPTH);
        int8.push(ndcg10(&run8, &cran.doc_ids, rel));
        let mut rescored = run8.clone();
        rescored.sort_by(|&a, &b| f32_scores[b].total_cmp(&f32_scores[a]).then(a.cmp(&b)));
        int8_rescored.push(ndcg10(&rescored, &cran.doc_ids, rel));
    }
    let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len() as f64;
    println!("queries with judgements: {}", judged.len());
    println!(
        "NDCG10 dense f32 exact top-{DEPTH} (baseline): {:.4} (peer dense exact MiniLM: 0.382)",
        mean(&dense)
    );
    println!("NDCG10 int8 first stage top-{DEPTH}: {:.4}", mean(&int8));
    println!(
        "NDCG10 int8 first stage + f32 rescoring: {:.4}",
        mean(&int8_rescored)
    );

    if llm_queries == 0 {
        return;
    }
    let judge = std::env::var("AIRLOCK_BENCH_JUDGE").unwrap_or_else(|_| "qwen".into());
    let depth: usize = std::env::var("AIRLOCK_BENCH_JUDGE_DEPTH")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20)
        .clamp(1, DEPTH);
    let dir = util::models_dir().join(&judge);
    let staged = tempfile::tempdir().unwrap();
    airlock_inference::tokenizer::gguf::write_artifacts(&dir.join("model.gguf"), staged.path())
        .unwrap();
    let llm = LlmRelevanceScorer::load(
        &GeneratorFiles {
            gguf: dir.join("model.gguf"),
            tokenizer: staged.path().join("tokenizer.json"),
            chat_template: staged.path().join("chat_template.jinja"),
        },
        LlmScorerConfig::default(),
    )
    .unwrap();
    let n = llm_queries.min(judged.len());
    let (mut base, mut alone, mut fused) = (Vec::new(), Vec::new(), Vec::new());
    let t0 = Instant::now();
    for (i, &q) in judged.iter().take(n).enumerate() {
        let rel = &cran.qrels[&cran.query_ids[q]];
        let run = &dense_runs[i];
        let head: Vec<&str> = run[..depth].iter().map(|&d| docs[d]).collect();
        let s = llm.score(queries[q], &head).unwrap();
        let order = top_k(&s, depth);
        let mut llm_run: Vec<usize> = order.iter().map(|&j| run[j]).collect();
        llm_run.extend_from_slice(&run[depth..]);
        // RRF (k = 60) of the dense rank and the LLM rank over the head.
        let mut rrf: Vec<(f64, usize)> = (0..depth)
            .map(|j| {
                let llm_rank = order.iter().position(|&o| o == j).unwrap();
                (1.0 / (61 + j) as f64 + 1.0 / (61 + llm_rank) as f64, run[j])
            })
            .collect();
        rrf.sort_by(|a, b| b.0.total_cmp(&a.0));
        let mut fused_run: Vec<usize> = rrf.iter().map(|x| x.1).collect();
        fused_run.extend_from_slice(&run[depth..]);
        base.push(ndcg10(run, &cran.doc_ids, rel));
        alone.push(ndcg10(&llm_run, &cran.doc_ids, rel));
        fused.push(ndcg10(&fused_run, &cran.doc_ids, rel));
    }
    let per_q = t0.elapsed().as_secs_f64() / n as f64;
    println!(
        "LLM judge {judge} on the first {n} judged queries (top-{depth} reranked, {per_q:.1} s/query):"
    );
    println!(
        "NDCG10 dense baseline (same {n} queries): {:.4}",
        mean(&base)
    );
    println!("NDCG10 LLM yes/no rerank: {:.4}", mean(&alone));
    println!("NDCG10 RRF(dense, LLM): {:.4}", mean(&fused));
    println!("load={}", util::load_avg());
}
