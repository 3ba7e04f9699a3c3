//! One appliance at scale (issue 45): the real engine (SQLite, tantivy BM25, the int8 vector
//! index, RRF and f32 rescoring) over N chunks, at one ACL selectivity, with a random and a
//! department-correlated allow set.
//!
//! `cargo bench -p airlock-retrieval --bench scale -- --chunks N --shards S --visible P
//!  [--queries Q] [--recall-queries R] [--data DIR]`
//!
//! Prints human-readable lines (each prefixed `# `), then ONE JSON object as the last line:
//! `chunks`, `shards`, `visible`, `ram_bytes_per_chunk`, `hybrid_p50_ms`, `hybrid_p99_ms`,
//! `bm25_p99_ms`, `recall_at_10`, `reopen_s`, `cpu` (the top-level latencies are the worse and the
//! recall the lower of the two ACL kinds; `acl` has both), plus the load average.
//!
//! Data (built once per N through [`Retrieval::upsert`], kept in `target/bench-data/scale-N`
//! unless `--data` says otherwise): documents of 8 sections, each section a heading plus a
//! ~55-word window of a bank-dev document with 30% of its words replaced by random corpus words
//! (the perturbation of `bm25_scale`, so postings grow with the corpus as real text would); the
//! chunker cuts at the headings, so a document is 8 chunks. Vectors come from the BENCH-ONLY
//! projection embedder (`vector_support::projection`; MiniLM would take days). Document `s<i>`
//! belongs to department `i % 100` and draws all its sections from the bank-dev documents of that
//! department (`j % 100`), so a department's documents share vocabulary and vector
//! neighbourhoods: the department ACL is correlated with content, the random one is not.
//!
//! ACLs at fraction P: `random` allows each document with probability P (seeded);
//! `department` allows whole departments, `max(1, round(100 P))` of the 100, chosen at random.
//!
//! Measured: hybrid (`SearchRequest::new`: BM25 + vector + RRF + f32 rescoring, no rerank, k 10)
//! p50/p99 wall time of `Retrieval::search` over the bank-dev golden queries after a warm-up;
//! BM25-only p99 the same way; recall@10 of the engine's vector search (with its f32 rescoring)
//! against an exact f32 scan of the visible chunks (`VectorIndex::rescore` over every visible
//! chunk id); RAM of the vector tier (see [`vector_ram`]); reopen time (see `main`).
//! `--shards S`: the store has no shards yet, so only S = 1 runs; S > 1 exits with status 2.

mod vector_support;

use std::collections::HashSet;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use airlock_acl::AllowSet;
use airlock_retrieval::vector::VectorIndex;
use airlock_retrieval::vector::synth::Rng;
use airlock_retrieval::{
    DocumentInput, Retrieval, RetrievalConfig, SearchMode, SearchRequest, stored_index_generation,
};
use roaring::RoaringBitmap;
use vector_support::projection::ProjectionEmbedder;
use vector_support::{
    bank_dev_corpus, cli_arg, corpus_words, cpu_desc, golden_queries, load_avg, percentile,
    rss_kib, shared_dir,
};

const SECTIONS: usize = 8;
const WINDOW_WORDS: usize = 55;
const DEPARTMENTS: u32 = 100;
const BATCH_DOCS: usize = 500;
const K: usize = 10;
/// Marks a data directory whose build finished (its content: the chunk target).
const DONE: &str = "scale.done";
/// `(ordinal, department)` of every document, little-endian u32 pairs.
const DEPTS: &str = "departments.u32";

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let target: u64 = cli_arg("--chunks").map_or(200_000, |s| s.parse().expect("--chunks"));
    let shards: u32 = cli_arg("--shards").map_or(1, |s| s.parse().expect("--shards"));
    let frac: f64 = cli_arg("--visible").map_or(0.1, |s| s.parse().expect("--visible"));
    if shards != 1 {
        eprintln!(
            "scale: --shards {shards}: the store has no shards yet (one SQLite file, one BM25 \
             index, one vector index per appliance); only --shards 1 can be measured"
        );
        std::process::exit(2);
    }
    if !(frac > 0.0 && frac <= 1.0) {
        eprintln!("scale: --visible must be in (0, 1], got {frac}");
        std::process::exit(2);
    }
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    let shared = shared_dir();
    let data = cli_arg("--data")
        .map(PathBuf::from)
        .unwrap_or_else(|| manifest.join(format!("../target/bench-data/scale-{target}")));
    let cpu = cpu_desc();
    let load_start = load_avg();
    println!("# scale: {target} chunks, {shards} shard, {frac} visible, load {load_start}");
    println!("# cpu: {cpu}");

    let mut build_s = None;
    let done = std::fs::read_to_string(data.join(DONE)).ok();
    if done.as_deref().map(str::trim) != Some(target.to_string().as_str()) {
        if data.exists() {
            println!("# data dir {} incomplete: rebuilt", data.display());
            std::fs::remove_dir_all(&data).expect("remove incomplete data dir");
        }
        std::fs::create_dir_all(&data).expect("data dir");
        let t = Instant::now();
        build(&data, &shared, target);
        build_s = Some(t.elapsed().as_secs_f64());
        std::fs::write(data.join(DONE), target.to_string()).expect("done marker");
    } else {
        println!("# reusing {}", data.display());
    }

    // 1. RAM of the vector tier, with nothing else of the engine in the process.
    let db = data.join("airlock.db");
    let generation = stored_index_generation(&db).expect("index generation");
    let chunk_bound: u32 = rusqlite::Connection::open(&db)
        .and_then(|c| {
            c.query_row("SELECT COALESCE(MAX(id), -1) + 1 FROM chunks", [], |r| {
                r.get(0)
            })
        })
        .expect("chunk id bound");
    let vec_dir = data.join(format!("index/{generation}/vector"));
    let ram = vector_ram(&vec_dir);

    // 2. Reopen: the engine from its files until the first hybrid query has answered. The
    // files were just read by the build or by step 1, so the page cache is warm (no root here
    // to drop it): this is a daemon restart, not a cold boot.
    let queries = golden_queries(&shared);
    let t = Instant::now();
    let eng = open_engine(&data);
    let open_s = t.elapsed().as_secs_f64();
    let everyone = AllowSet::from_bitmap_for_tests(eng_docs(&data));
    eng.search(&SearchRequest::new(&queries[0], K), &everyone)
        .expect("first query");
    let reopen_s = t.elapsed().as_secs_f64();
    let st = eng.stats();
    println!(
        "# reopen: {reopen_s:.2} s to the first answered hybrid query (open {open_s:.2} s, repair: {:?}); {} docs, {} live chunks = {:.2} chunks per doc",
        eng.last_repair(),
        st.live_docs,
        st.live_chunks,
        st.live_chunks as f64 / st.live_docs.max(1) as f64
    );

    // 3. Latency and the vector tier's answers, per ACL kind.
    let n_q: usize = cli_arg("--queries").map_or(queries.len(), |s| s.parse().expect("--queries"));
    let n_r: usize =
        cli_arg("--recall-queries").map_or(100, |s| s.parse().expect("--recall-queries"));
    let queries = &queries[..n_q.min(queries.len())];
    let recall_q = &queries[..n_r.min(queries.len())];
    let depts = read_depts(&data);
    let mut kinds = Vec::new();
    for kind in ["random", "department"] {
        let allow = acl(kind, &depts, frac);
        let visible: RoaringBitmap = (0..chunk_bound)
            .filter(|&c| eng.is_visible(c, &allow))
            .collect();
        println!(
            "# acl {kind}: {} of {} documents, {} visible chunks; load {}",
            allow.len(),
            depts.len(),
            visible.len(),
            load_avg()
        );
        let hybrid = time_mode(&eng, queries, &allow, SearchMode::Hybrid, true);
        let bm25 = time_mode(&eng, queries, &allow, SearchMode::Bm25, false);
        let got: Vec<Vec<Vec<u32>>> = [true, false]
            .into_iter()
            .map(|rescore| {
                recall_q
                    .iter()
                    .map(|q| {
                        let r = eng
                            .search(&request(q, SearchMode::Vector, rescore), &allow)
                            .expect("vector search");
                        r.results.iter().map(|h| h.chunk_id).collect()
                    })
                    .collect()
            })
            .collect();
        kinds.push((kind, allow.len(), visible, hybrid, bm25, got));
    }
    drop(eng);

    // 4. Exact f32 top 10 over the visible chunks (the vector index alone again).
    let embedder = ProjectionEmbedder::new();
    let qvecs: Vec<Vec<f32>> = {
        use airlock_retrieval::Embed;
        let refs: Vec<&str> = recall_q.iter().map(String::as_str).collect();
        embedder.embed(&refs).expect("embed queries")
    };
    let index = VectorIndex::open(&vec_dir).expect("vector index");
    let mut acl_json = serde_json::Map::new();
    let (mut worst_p50, mut worst_p99, mut worst_bm25, mut min_recall) =
        (0f64, 0f64, 0f64, f64::INFINITY);
    for (kind, allowed, visible, hybrid, bm25, got) in kinds {
        let ids: Vec<u32> = visible.iter().collect();
        let t = Instant::now();
        let truth: Vec<Vec<u32>> = qvecs.iter().map(|q| exact_top(&index, q, &ids)).collect();
        let exact_s = t.elapsed().as_secs_f64();
        let recall = mean_recall(&got[0], &truth);
        let recall_int8 = mean_recall(&got[1], &truth);
        println!(
            "# acl {kind}: hybrid p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms (bm25 stage mean {:.2}, vector stage mean {:.2}); bm25 only p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms; vector recall@10 {recall:.4} with rescoring, {recall_int8:.4} int8 only ({} queries, exact scan {exact_s:.1} s)",
            hybrid.p50,
            hybrid.p99,
            hybrid.max,
            hybrid.bm25_mean,
            hybrid.vector_mean,
            bm25.p50,
            bm25.p99,
            bm25.max,
            truth.len()
        );
        worst_p50 = worst_p50.max(hybrid.p50);
        worst_p99 = worst_p99.max(hybrid.p99);
        worst_bm25 = worst_bm25.max(bm25.p99);
        min_recall = min_recall.min(recall);
        acl_json.insert(
            kind.to_string(),
            serde_json::json!({
                "allowed_docs": allowed,
                "visible_chunks": visible.len(),
                "hybrid_p50_ms": round2(hybrid.p50),
                "hybrid_p99_ms": round2(hybrid.p99),
                "hybrid_max_ms": round2(hybrid.max),
                "bm25_p50_ms": round2(bm25.p50),
                "bm25_p99_ms": round2(bm25.p99),
                "recall_at_10": round4(recall),
                "recall_at_10_int8": round4(recall_int8),
            }),
        );
    }
    let load_end = load_avg();
    println!("# load at end: {load_end}");
    let out = serde_json::json!({
        "chunks": st.live_chunks,
        "shards": shards,
        "visible": frac,
        "ram_bytes_per_chunk": ram.round(),
        "hybrid_p50_ms": round2(worst_p50),
        "hybrid_p99_ms": round2(worst_p99),
        "bm25_p99_ms": round2(worst_bm25),
        "recall_at_10": round4(min_recall),
        "reopen_s": round2(reopen_s),
        "cpu": cpu,
        "docs": st.live_docs,
        "queries": queries.len(),
        "recall_queries": recall_q.len(),
        "build_s": build_s.map(round2),
        "load_start": load_start,
        "load_end": load_end,
        "acl": acl_json,
    });
    println!("{out}");
}

fn round2(x: f64) -> f64 {
    (x * 100.0).round() / 100.0
}

fn round4(x: f64) -> f64 {
    (x * 10_000.0).round() / 10_000.0
}

/// Resident memory of the vector tier per chunk, as the growth of the process's anonymous RSS
/// (`RssAnon`: heap) across `VectorIndex::open` with nothing else of the engine loaded: the int8
/// rows, the HNSW graph, the slot maps and the allocator's overhead on them. NOT counted: the
/// f32 rows (`vectors.f32`, memory-mapped, read from the page cache for rescoring only; shown
/// separately as the `RssFile` growth, which is the checksum pass's touch of the mapped files),
/// BM25 (tantivy, memory-mapped) and SQLite.
fn vector_ram(dir: &Path) -> f64 {
    let (anon0, file0) = rss_kib();
    let t = Instant::now();
    let index = VectorIndex::open(dir).expect("vector index");
    let open_s = t.elapsed().as_secs_f64();
    let (anon1, file1) = rss_kib();
    let n = index.len().max(1) as f64;
    let (rows, maps, graph) = index.memory_bytes();
    let per_chunk = (anon1.saturating_sub(anon0)) as f64 * 1024.0 / n;
    println!(
        "# vector tier alone: {} chunks, opened in {open_s:.2} s; heap +{:.0} MiB = {per_chunk:.0} B per chunk (accounting: int8 row {:.0} B, slot maps {:.0} B, graph {:.0} B); mapped files touched +{:.0} MiB (f32 rows, not counted)",
        index.len(),
        (anon1.saturating_sub(anon0)) as f64 / 1024.0,
        rows as f64 / n,
        maps as f64 / n,
        graph as f64 / n,
        (file1.saturating_sub(file0)) as f64 / 1024.0,
    );
    per_chunk
}

fn exact_top(index: &VectorIndex, q: &[f32], ids: &[u32]) -> Vec<u32> {
    let scores = index.rescore(q, ids).expect("rescore");
    let mut all: Vec<(f32, u32)> = ids
        .iter()
        .zip(scores)
        .filter_map(|(&c, s)| s.map(|s| (s, c)))
        .collect();
    let k = K.min(all.len());
    if k == 0 {
        return Vec::new();
    }
    let cmp = |a: &(f32, u32), b: &(f32, u32)| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1));
    all.select_nth_unstable_by(k - 1, cmp);
    all.truncate(k);
    all.sort_by(cmp);
    all.into_iter().map(|t| t.1).collect()
}

fn mean_recall(got: &[Vec<u32>], truth: &[Vec<u32>]) -> f64 {
    let sum: f64 = got
        .iter()
        .zip(truth)
        .map(|(g, t)| {
            if t.is_empty() {
                return 1.0;
            }
            let t: HashSet<u32> = t.iter().copied().collect();
            g.iter().filter(|c| t.contains(c)).count() as f64 / t.len() as f64
        })
        .sum();
    sum / truth.len().max(1) as f64
}

struct Lat {
    p50: f64,
    p99: f64,
    max: f64,
    bm25_mean: f64,
    vector_mean: f64,
}

/// Wall time of `Retrieval::search` per query (k 10, no rerank), after a warm-up pass over the
/// first 50 queries.
fn time_mode(
    eng: &Retrieval,
    queries: &[String],
    allow: &AllowSet,
    mode: SearchMode,
    rescore: bool,
) -> Lat {
    for q in queries.iter().take(50) {
        eng.search(&request(q, mode, rescore), allow)
            .expect("search");
    }
    let mut lat = Vec::with_capacity(queries.len());
    let (mut bm, mut ve) = (0.0, 0.0);
    for q in queries {
        let t = Instant::now();
        let r = eng
            .search(&request(q, mode, rescore), allow)
            .expect("search");
        lat.push(t.elapsed().as_secs_f64() * 1e3);
        bm += r.timings.bm25_ms;
        ve += r.timings.vector_ms;
        assert!(r.results.len() <= K);
    }
    let n = lat.len().max(1) as f64;
    lat.sort_by(f64::total_cmp);
    Lat {
        p50: percentile(&lat, 50.0),
        p99: percentile(&lat, 99.0),
        max: lat.last().copied().unwrap_or(f64::NAN),
        bm25_mean: bm / n,
        vector_mean: ve / n,
    }
}

fn request(query: &str, mode: SearchMode, rescore: bool) -> SearchRequest<'_> {
    SearchRequest {
        query,
        k: K,
        mode,
        rescore,
        rerank: false,
    }
}

/// The allow set of `kind` at fraction `frac` of the documents.
fn acl(kind: &str, depts: &[(u32, u32)], frac: f64) -> AllowSet {
    let mut rng = Rng::new(45);
    let bits: RoaringBitmap = match kind {
        "random" => depts
            .iter()
            .filter(|_| rng.unit() < frac)
            .map(|d| d.0)
            .collect(),
        _ => {
            let want = ((f64::from(DEPARTMENTS) * frac).round() as u32).clamp(1, DEPARTMENTS);
            let mut order: Vec<u32> = (0..DEPARTMENTS).collect();
            for i in (1..order.len()).rev() {
                order.swap(i, rng.below(i as u64 + 1) as usize);
            }
            let chosen: HashSet<u32> = order[..want as usize].iter().copied().collect();
            depts
                .iter()
                .filter(|d| chosen.contains(&d.1))
                .map(|d| d.0)
                .collect()
        }
    };
    AllowSet::from_bitmap_for_tests(bits)
}

fn read_depts(data: &Path) -> Vec<(u32, u32)> {
    let b = std::fs::read(data.join(DEPTS)).expect("departments file");
    b.chunks_exact(8)
        .map(|x| {
            (
                u32::from_le_bytes([x[0], x[1], x[2], x[3]]),
                u32::from_le_bytes([x[4], x[5], x[6], x[7]]),
            )
        })
        .collect()
}

fn eng_docs(data: &Path) -> RoaringBitmap {
    read_depts(data).into_iter().map(|d| d.0).collect()
}

fn config() -> RetrievalConfig {
    let mut cfg = RetrievalConfig::default();
    // A section (heading + ~55 words) fits, two do not: the chunker cuts at every heading.
    cfg.chunk.target_tokens = 128;
    cfg
}

fn open_engine(data: &Path) -> Retrieval {
    Retrieval::open(
        &data.join("airlock.db"),
        &data.join("index"),
        config(),
        Arc::new(ProjectionEmbedder::new()),
        None,
    )
    .expect("open engine")
}

/// Ingests documents of [`SECTIONS`] sections through the engine until `target` chunks are live.
fn build(data: &Path, shared: &Path, target: u64) {
    let base = bank_dev_corpus(shared);
    let (vocab, words) = corpus_words(&base);
    // Source documents per department.
    let pools: Vec<Vec<usize>> = (0..DEPARTMENTS as usize)
        .map(|d| {
            (0..base.len())
                .filter(|j| j % DEPARTMENTS as usize == d && !words[*j].is_empty())
                .collect()
        })
        .collect();
    let eng = open_engine(data);
    let mut depts =
        std::io::BufWriter::new(std::fs::File::create(data.join(DEPTS)).expect("departments file"));
    let t0 = Instant::now();
    let mut next_doc = 0u64;
    let mut live = 0u64;
    let mut last_print = 0u64;
    while live < target {
        let n = ((target - live).div_ceil(SECTIONS as u64) as usize).clamp(1, BATCH_DOCS);
        let batch: Vec<DocumentInput> = (next_doc..next_doc + n as u64)
            .map(|i| {
                let mut rng = Rng::new(0x5ca1e ^ i.wrapping_mul(0x9e37_79b9_7f4a_7c15));
                let pool = &pools[(i % u64::from(DEPARTMENTS)) as usize];
                let mut text = String::new();
                let mut title = String::new();
                for s in 0..SECTIONS {
                    let src = pool[rng.below(pool.len() as u64) as usize];
                    if s == 0 {
                        title = base[src].0.clone();
                    }
                    text.push_str(&format!("## Part {}\n\n", s + 1));
                    let w = &words[src];
                    let start = if w.len() > WINDOW_WORDS {
                        rng.below((w.len() - WINDOW_WORDS) as u64) as usize
                    } else {
                        0
                    };
                    for word in &w[start..(start + WINDOW_WORDS).min(w.len())] {
                        let word = if rng.unit() < 0.3 {
                            vocab[rng.below(vocab.len() as u64) as usize]
                        } else {
                            word
                        };
                        text.push_str(word);
                        text.push(' ');
                    }
                    text.push_str("\n\n");
                }
                DocumentInput::new(format!("s{i}"), title, text)
            })
            .collect();
        let report = eng.upsert(batch, &mut |_| {}).expect("upsert");
        assert!(report.errors.is_empty(), "{:?}", report.errors.first());
        for o in &report.outcomes {
            let i: u64 = o.doc_id[1..].parse().expect("doc id");
            let dept = (i % u64::from(DEPARTMENTS)) as u32;
            depts
                .write_all(&o.ordinal.to_le_bytes())
                .and_then(|()| depts.write_all(&dept.to_le_bytes()))
                .expect("departments file");
            live += o.chunks as u64;
        }
        next_doc += n as u64;
        if last_print == 0 || live - last_print >= 100_000 || live >= target {
            last_print = live;
            let s = t0.elapsed().as_secs_f64();
            println!(
                "# built {live} chunks ({next_doc} docs, {:.2} chunks per doc) in {s:.0} s = {:.0} chunks/s, load {}",
                live as f64 / next_doc as f64,
                live as f64 / s,
                load_avg()
            );
        }
    }
    depts.flush().expect("departments file");
}
