//! BM25 at bank scale (issue 23 point 5): the engine's tantivy index built with millions of
//! chunks, its size on disk and segment count, and the latency of the engine's BM25 search over
//! the caller's visible set (statistics over visible chunks, no post-filter) at 100%, 10% and 1%
//! visible.
//!
//! `cargo bench -p airlock-retrieval --bench bm25_scale -- [--chunks 5000000] [--data DIR]`
//!
//! Chunks are ~120-word windows of bank-dev documents (title line + text, like the engine's
//! chunks) with 30% of the words replaced by random words of the corpus vocabulary, so postings
//! lists grow with the corpus as real text would (not copies). Chunk `c` belongs to document
//! `c / 8`. Queries: the 400 bank-dev golden queries, one thread, k = 10. The built index is kept
//! (`--data`, default `target/bench-data/bm25-<chunks>`) so re-runs skip the build.

mod vector_support;

use std::path::{Path, PathBuf};
use std::time::Instant;

use airlock_retrieval::bench_api::Bm25;
use airlock_retrieval::vector::synth::Rng;
use airlock_retrieval::{Bm25Config, ChunkMap, Visibility};
use roaring::RoaringBitmap;
use vector_support::{
    bank_dev_corpus, cli_arg, corpus_words, cpu_desc, golden_queries, load_avg, percentile,
    random_allow, shared_dir,
};

const CHUNKS_PER_DOC: u32 = 8;
const WINDOW_WORDS: usize = 120;
const BATCH: usize = 50_000;

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let target: usize = cli_arg("--chunks").map_or(5_000_000, |s| s.parse().expect("--chunks"));
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    let shared = shared_dir();
    let data = cli_arg("--data")
        .map(PathBuf::from)
        .unwrap_or_else(|| manifest.join(format!("../target/bench-data/bm25-{target}")));
    println!("# bm25_scale: {target} chunks, load {}", load_avg());
    println!("# cpu: {}", cpu_desc());

    let cfg = Bm25Config::default();
    let index = Bm25::open(&data, &cfg).expect("open");
    if (index.num_docs() as usize) < target {
        build(&index, &shared, target);
    }
    let bytes = dir_bytes(&data);
    println!(
        "index: {} chunks, {} segments, {:.2} GiB on disk = {:.0} B per chunk (writer memory {} MiB, tantivy's default merge policy)",
        index.num_docs(),
        index.segments(),
        bytes as f64 / f64::from(1u32 << 30),
        bytes as f64 / index.num_docs().max(1) as f64,
        cfg.writer_memory_bytes >> 20
    );

    let n = index.num_docs() as u32;
    let mut map = ChunkMap::new();
    for c in 0..n {
        map.insert(c, c / CHUNKS_PER_DOC);
    }
    let n_docs = n.div_ceil(CHUNKS_PER_DOC);
    let dead = RoaringBitmap::new();
    let queries = golden_queries(&shared);
    println!(
        "\n{} queries, k = 10, one thread, load {}\n",
        queries.len(),
        load_avg()
    );
    println!("| visible | visible chunks | p50 ms | p99 ms | mean ms | max ms | mean hits |");
    println!("|---|---|---|---|---|---|---|");
    for (i, frac) in [1.0, 0.1, 0.01].into_iter().enumerate() {
        let allow = random_allow(n_docs, frac, 40 + i as u64);
        let vis = Visibility::new(&allow, &map, &dead);
        let visible = vis.visible_chunks().len();
        let mut lat = Vec::with_capacity(queries.len());
        let mut hits = 0usize;
        for q in &queries {
            let t = Instant::now();
            let out = index.search(q, 10, &vis, visible).expect("search");
            lat.push(t.elapsed().as_secs_f64() * 1e3);
            assert!(out.iter().all(|h| vis.visible(h.0)), "invisible chunk");
            hits += out.len();
        }
        let mean = lat.iter().sum::<f64>() / lat.len() as f64;
        lat.sort_by(f64::total_cmp);
        println!(
            "| {}% | {visible} | {:.2} | {:.2} | {mean:.2} | {:.2} | {:.1} |",
            frac * 100.0,
            percentile(&lat, 50.0),
            percentile(&lat, 99.0),
            lat[lat.len() - 1],
            hits as f64 / queries.len() as f64
        );
    }
    println!("\nload at end: {}", load_avg());
}

/// Writes chunks until the index holds `target`, in committed batches of [`BATCH`].
fn build(index: &Bm25, shared: &Path, target: usize) {
    let docs = bank_dev_corpus(shared);
    let (vocab, words) = corpus_words(&docs);
    let mut rng = Rng::new(5);
    let t0 = Instant::now();
    let mut next = index.num_docs() as usize;
    while next < target {
        let end = (next + BATCH).min(target);
        let batch: Vec<(u32, String)> = (next..end)
            .map(|c| {
                let d = rng.below(docs.len() as u64) as usize;
                let w = &words[d];
                let start = if w.len() > WINDOW_WORDS {
                    rng.below((w.len() - WINDOW_WORDS) as u64) as usize
                } else {
                    0
                };
                let mut text = docs[d].0.clone();
                text.push('\n');
                for word in &w[start..(start + WINDOW_WORDS).min(w.len())] {
                    let word = if rng.unit() < 0.3 {
                        vocab[rng.below(vocab.len() as u64) as usize]
                    } else {
                        word
                    };
                    text.push_str(word);
                    text.push(' ');
                }
                (c as u32, text)
            })
            .collect();
        index.write(&batch).expect("write");
        next = end;
        if next.is_multiple_of(500_000) || next == target {
            let s = t0.elapsed().as_secs_f64();
            println!(
                "built {next} chunks in {s:.0} s ({:.0} chunks/s), {} segments, load {}",
                next as f64 / s,
                index.segments(),
                load_avg()
            );
        }
    }
}

fn dir_bytes(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .map(|rd| {
            rd.filter_map(|e| e.ok())
                .filter_map(|e| e.metadata().ok())
                .filter(|m| m.is_file())
                .map(|m| m.len())
                .sum()
        })
        .unwrap_or(0)
}
