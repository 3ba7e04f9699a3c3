//! Hybrid retrieve latency at scale: ~200k chunks (bank-dev text, perturbed copies), BM25 +
//! int8 vector index + RRF + f32 rescoring, no rerank, at several ACL selectivities.
//!
//! `cargo bench -p airlock-retrieval --bench hybrid_latency -- [--chunks 200000] [--data DIR]`
//!
//! The vectors come from a BENCH-ONLY embedder (a fixed random projection of bag-of-words, so
//! texts that share words are close, like sentence embeddings; MiniLM would take hours to embed
//! 200k chunks on 2 cores). What is timed is the engine: BM25, vector search, fusion, rescoring
//! and the SQLite fetch; the real query embedding cost is measured separately (quality bench,
//! `embed_ms`). The built data directory is kept (`--data`, default
//! `target/bench-data/hybrid-<chunks>`) so re-runs skip the ingest.

mod vector_support;

use std::io::BufReader;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use airlock_retrieval::ingest::parse_jsonl;
use airlock_retrieval::vector::synth::Rng;
use airlock_retrieval::{DocumentInput, Retrieval, RetrievalConfig, SearchMode, SearchRequest};
use vector_support::projection::ProjectionEmbedder;
use vector_support::{cli_arg, golden_queries, random_allow, shared_dir};

fn main() {
    let target: u64 = cli_arg("--chunks").map_or(200_000, |s| s.parse().expect("--chunks"));
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    let shared = shared_dir();
    let data = cli_arg("--data")
        .map(PathBuf::from)
        .unwrap_or_else(|| manifest.join(format!("../target/bench-data/hybrid-{target}")));
    std::fs::create_dir_all(&data).expect("data dir");
    let embedder = Arc::new(ProjectionEmbedder::new());
    let mut cfg = RetrievalConfig::default();
    cfg.chunk.target_tokens = 256;
    let eng = Retrieval::open(
        &data.join("airlock.db"),
        &data.join("index"),
        cfg,
        embedder,
        None,
    )
    .expect("open");
    let corpus = shared.join("datasets/bank-dev/corpus.jsonl");
    let base: Vec<DocumentInput> = parse_jsonl(
        "corpus",
        BufReader::new(std::fs::File::open(&corpus).expect("bank-dev corpus")),
        1 << 24,
    )
    .into_iter()
    .map(|d| d.expect("corpus line"))
    .collect();
    if eng.stats().live_chunks < target {
        ingest(&eng, &base, target);
    }
    let st = eng.stats();
    println!(
        "corpus: {} docs, {} live chunks (data dir {})",
        st.live_docs,
        st.live_chunks,
        data.display()
    );
    let queries = golden_queries(&shared);
    let n_docs = st.live_docs as u32;
    println!(
        "\n| mode | allowed | queries | mean ms | p50 ms | p99 ms | max ms | bm25 mean | vector mean | rescore mean | fetch mean |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|");
    for (label, frac) in [("100%", 1.0), ("10%", 0.1), ("1%", 0.01)] {
        let allow = random_allow(n_docs, frac, 11);
        for (mode_label, mode, rescore) in [
            ("hybrid + rescore", SearchMode::Hybrid, true),
            ("bm25", SearchMode::Bm25, false),
            ("vector + rescore", SearchMode::Vector, true),
        ] {
            // Warm-up pass (page cache, lazy structures), then the timed pass.
            for q in queries.iter().take(50) {
                eng.search(&req(q, mode, rescore), &allow).expect("search");
            }
            let mut total = Vec::new();
            let (mut bm, mut ve, mut re, mut fe) = (0.0, 0.0, 0.0, 0.0);
            for q in &queries {
                let r = eng.search(&req(q, mode, rescore), &allow).expect("search");
                assert_eq!(
                    r.results.len(),
                    10,
                    "k results whenever k visible chunks exist"
                );
                total.push(r.timings.total_ms);
                bm += r.timings.bm25_ms;
                ve += r.timings.vector_ms;
                re += r.timings.rescore_ms;
                fe += r.timings.fetch_ms;
            }
            let n = total.len() as f64;
            total.sort_by(f64::total_cmp);
            let p = |x: f64| total[((n - 1.0) * x).round() as usize];
            println!(
                "| {mode_label} | {label} | {} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} |",
                total.len(),
                total.iter().sum::<f64>() / n,
                p(0.5),
                p(0.99),
                p(1.0),
                bm / n,
                ve / n,
                re / n,
                fe / n
            );
        }
    }
}

fn req(q: &str, mode: SearchMode, rescore: bool) -> SearchRequest<'_> {
    SearchRequest {
        query: q,
        k: 10,
        mode,
        rescore,
        rerank: false,
    }
}

/// Copies of the bank corpus, each word replaced with probability 0.3 by a random corpus word
/// (so copies are near-duplicates, not identical), until `target` chunks are live.
fn ingest(eng: &Retrieval, base: &[DocumentInput], target: u64) {
    let vocab: Vec<String> = {
        let mut v: Vec<String> = base
            .iter()
            .flat_map(|d| d.text.split_whitespace().map(str::to_owned))
            .collect();
        v.sort();
        v.dedup();
        v
    };
    let t = Instant::now();
    let mut rng = Rng::new(7);
    let mut copy = eng.stats().live_docs as usize / base.len();
    while eng.stats().live_chunks < target {
        for batch in base.chunks(500) {
            let docs: Vec<DocumentInput> = batch
                .iter()
                .map(|d| {
                    let text: Vec<&str> = d
                        .text
                        .split_inclusive(char::is_whitespace)
                        .map(|w| {
                            if copy > 0 && rng.unit() < 0.3 {
                                vocab[rng.below(vocab.len() as u64) as usize].as_str()
                            } else {
                                w
                            }
                        })
                        .collect();
                    let mut out = DocumentInput::new(
                        format!("{}-c{copy}", d.doc_id),
                        d.title.clone(),
                        text.join(" "),
                    );
                    out.metadata = d.metadata.clone();
                    out
                })
                .collect();
            eng.upsert(docs, &mut |_| {}).expect("upsert");
            if eng.stats().live_chunks >= target {
                break;
            }
        }
        copy += 1;
        let st = eng.stats();
        println!(
            "ingested copy {copy}: {} chunks, {:.0} chunks/s",
            st.live_chunks,
            st.live_chunks as f64 / t.elapsed().as_secs_f64()
        );
    }
}
