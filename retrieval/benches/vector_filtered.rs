//! Filtered search at 200k vectors: recall@10 against exact search over exactly the visible
//! chunks, p50/p99 latency and graph distance evaluations, per selectivity, with random and
//! correlated ACLs, for the automatic planner and for each strategy forced (which is how the
//! cost model's constants are read off). Also int8 + rescoring recall vs f32 exact.
//!
//! `cargo bench -p airlock-retrieval --bench vector_filtered`
//! Reuses the index checkpointed by `vector_build` (opened, not rebuilt), or builds it.
//! Env: `AIRLOCK_BENCH_N` (default 200000), `AIRLOCK_BENCH_NQ` (queries per selectivity, 200),
//! `AIRLOCK_BENCH_PATHS=auto` (only the planner's rows: the forced strategies are slow at 1M+),
//! `AIRLOCK_BENCH_LATENCY_ONLY=1` (only the everyone-visible latency with and without rescoring,
//! on the saved index, without loading the vectors: see `latency_only`).

mod vector_support;

use std::path::Path;
use std::time::Instant;

use airlock_acl::AllowSet;
use airlock_retrieval::vector::synth::Rng;
use airlock_retrieval::vector::{PathChoice, SearchOptions, VectorIndex, VectorParams};
use airlock_retrieval::{ChunkMap, Visibility};
use roaring::RoaringBitmap;
use vector_support::*;

const CHUNKS_PER_DOC: u32 = 8;

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let n = env_usize("AIRLOCK_BENCH_N", 200_000);
    let nq = env_usize("AIRLOCK_BENCH_NQ", 200);
    // The index is opened before the bench's own data are loaded, so that the process's heap
    // growth over the open is the index's resident memory.
    let tag = data_tag(n);
    let idx_dir = work_dir().join(format!("index-{tag}"));
    let (anon0, _) = rss_kib();
    let t0 = Instant::now();
    let opened = VectorIndex::open(&idx_dir).ok().filter(|i| i.len() == n);
    let reopen_s = t0.elapsed().as_secs_f64();
    let (anon1, file1) = rss_kib();
    if env_usize("AIRLOCK_BENCH_LATENCY_ONLY", 0) != 0 {
        let index = opened.expect("AIRLOCK_BENCH_LATENCY_ONLY needs vector_build's saved index");
        latency_only(&index, &tag, nq);
        return;
    }
    let data = noisy(n);
    let index = match opened {
        Some(i) => {
            let (rows, maps, graph) = i.memory_bytes();
            println!(
                "# accounting per chunk: int8 row {:.0} B, slot maps {:.0} B, graph {:.0} B",
                rows as f64 / n as f64,
                maps as f64 / n as f64,
                graph as f64 / n as f64
            );
            println!(
                "# index reopened in {reopen_s:.2} s (verify + reload, no rebuild); resident after open: heap {:.0} MiB = {:.0} B per chunk, mapped files {:.0} MiB",
                (anon1 - anon0) as f64 / 1024.0,
                (anon1 - anon0) as f64 * 1024.0 / n as f64,
                file1 as f64 / 1024.0
            );
            i
        }
        None => {
            eprintln!("[index] building {n} vectors (run vector_build first to reuse its index)");
            let _ = std::fs::remove_dir_all(&idx_dir);
            let mut i = VectorIndex::create(
                &idx_dir,
                DIM,
                VectorParams {
                    capacity_hint: n,
                    ..VectorParams::default()
                },
            )
            .expect("create");
            let items: Vec<(u32, &[f32])> = data
                .vectors
                .iter()
                .enumerate()
                .map(|(c, v)| (c as u32, v.as_slice()))
                .collect();
            for b in items.chunks(20_000) {
                i.insert(b).expect("insert");
            }
            i.checkpoint().expect("checkpoint");
            i
        }
    };
    println!(
        "# vector_filtered: {n} × {DIM} ({}), {nq} queries per row, load {}",
        data.source,
        load_avg()
    );

    let mut map = ChunkMap::new();
    for c in 0..n as u32 {
        map.insert(c, c / CHUNKS_PER_DOC);
    }
    let n_docs = (n as u32).div_ceil(CHUNKS_PER_DOC);
    let dead = RoaringBitmap::new();
    let queries = &data.queries[..nq.min(data.queries.len())];
    let defaults = SearchOptions::default();
    println!("# cpu: {}", cpu_desc());
    println!(
        "\nDefaults: ef {}, candidates {} (f32-rescored); cost model: exact {} ns/row, graph {} ns/evaluation × {} evaluations per ef / visible fraction^{}; exact whenever it fits {} ms; under auto the graph is capped at the exact scan's cost.\n",
        defaults.ef,
        defaults.candidates,
        defaults.exact_row_ns,
        defaults.graph_eval_ns,
        defaults.graph_evals_per_ef,
        defaults.graph_fraction_exponent,
        defaults.exact_budget_ns / 1e6,
    );
    println!(
        "Random ACLs: documents drawn uniformly. Correlated ACLs: the documents nearest (by their first chunk) to a random document, like a department whose documents are near each other; the queries are the same for both, so most ask about something outside a correlated user's documents.\n"
    );
    println!(
        "| allowed | acl | visible chunks | strategy | recall@10 | p50 ms | p99 ms | mean ms | mean evals | paths |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|");
    let strategies: Vec<(&str, PathChoice)> = match std::env::var("AIRLOCK_BENCH_PATHS").as_deref()
    {
        Ok("auto") => vec![("auto", PathChoice::Auto)],
        _ => vec![
            ("auto", PathChoice::Auto),
            ("exact", PathChoice::Exact),
            ("graph", PathChoice::Graph),
        ],
    };
    for (i, pct) in [100.0, 50.0, 25.0, 10.0, 1.0, 0.1, 0.01]
        .into_iter()
        .enumerate()
    {
        let want_docs = ((f64::from(n_docs) * pct / 100.0).round() as u64).max(1);
        for acl in ["random", "correlated"] {
            if pct >= 100.0 && acl == "correlated" {
                continue;
            }
            let bits = if acl == "random" {
                random_docs(n_docs, want_docs, 11 + i as u64)
            } else {
                nearby_docs(&data.vectors, n_docs, want_docs, 23 + i as u64)
            };
            let allow = AllowSet::from_bitmap_for_tests(bits);
            let vis = Visibility::new(&allow, &map, &dead);
            let visible: Vec<u32> = vis.visible_chunks().iter().collect();
            let truth = if pct >= 100.0 {
                data.truth[..queries.len()].to_vec()
            } else {
                exact_truth(&data.vectors, queries, Some(&visible))
            };
            for &(name, path) in &strategies {
                let opts = SearchOptions { path, ..defaults };
                let mut lat = Vec::with_capacity(queries.len());
                let mut got = Vec::with_capacity(queries.len());
                let mut evals = 0usize;
                let mut paths = std::collections::BTreeMap::<&str, usize>::new();
                for q in queries {
                    let t = Instant::now();
                    let out = index.search(q, K, &vis, &opts).expect("search");
                    lat.push(t.elapsed().as_secs_f64() * 1e3);
                    assert!(
                        out.hits.iter().all(|h| vis.visible(h.0)),
                        "invisible chunk returned"
                    );
                    assert_eq!(out.hits.len(), K.min(visible.len()), "short result");
                    evals += out.evals;
                    *paths.entry(out.path.name()).or_default() += 1;
                    got.push(out.hits.iter().map(|h| h.0).collect::<Vec<u32>>());
                }
                let mean = lat.iter().sum::<f64>() / lat.len() as f64;
                lat.sort_by(f64::total_cmp);
                let paths: Vec<String> = paths.iter().map(|(k, v)| format!("{k} {v}")).collect();
                println!(
                    "| {pct}% | {acl} | {} | {name} | {:.4} | {:.3} | {:.3} | {mean:.3} | {} | {} |",
                    visible.len(),
                    mean_recall(&got, &truth),
                    percentile(&lat, 50.0),
                    percentile(&lat, 99.0),
                    evals / queries.len(),
                    paths.join(", ")
                );
            }
        }
    }

    // int8 (+ rescoring) vs f32 exact, all visible, exact int8 scan: quantization error only.
    let allow = AllowSet::from_bitmap_for_tests((0..n_docs).collect());
    let vis = Visibility::new(&allow, &map, &dead);
    let nq_q = queries.len().min(100);
    println!(
        "\nint8 quantization (exact int8 scan over all {n}, {nq_q} queries), recall@10 vs f32 exact:"
    );
    for (label, rescore, candidates) in [
        ("int8 only", false, K),
        ("int8 top 20 → f32 rescore", true, 20),
        ("int8 top 40 → f32 rescore", true, 40),
        ("int8 top 100 → f32 rescore", true, 100),
    ] {
        let opts = SearchOptions {
            path: PathChoice::Exact,
            rescore,
            candidates,
            ..defaults
        };
        let got: Vec<Vec<u32>> = queries[..nq_q]
            .iter()
            .map(|q| {
                index
                    .search(q, K, &vis, &opts)
                    .expect("search")
                    .hits
                    .iter()
                    .map(|h| h.0)
                    .collect()
            })
            .collect();
        println!("- {label}: {:.4}", mean_recall(&got, &data.truth[..nq_q]));
    }
    drop(index);
    search_during_ingest(&idx_dir, &data, &map, n_docs);
    println!("\nload at end: {}", load_avg());
}

/// Latency of the `auto` search per visible fraction (random ACLs; 100% also without f32
/// rescoring), cold then warm, with nothing but the index in the process (no in-heap copy of the
/// vectors, no data file in the page cache, as in the daemon): tells whether a p99 of the full
/// run is the rescoring's page faults under the bench's own memory pressure. No recall (no
/// ground truth is loaded); the full run measures it.
fn latency_only(index: &VectorIndex, tag: &str, nq: usize) {
    let queries = read_f32(&work_dir().join(format!("queries-{tag}.f32")), DIM)
        .expect("queries file (run vector_build first)");
    let queries = &queries[..nq.min(queries.len())];
    let n = index.len() as u32;
    let mut map = ChunkMap::new();
    for c in 0..n {
        map.insert(c, c / CHUNKS_PER_DOC);
    }
    let n_docs = n.div_ceil(CHUNKS_PER_DOC);
    let dead = RoaringBitmap::new();
    println!(
        "# vector_filtered, latency only: {n} × {DIM}, {} queries per row, random ACLs, auto, load {}",
        queries.len(),
        load_avg()
    );
    println!("# cpu: {}", cpu_desc());
    println!("\n| allowed | rescore | pass | p50 ms | p99 ms | max ms | mean ms | paths | load |");
    println!("|---|---|---|---|---|---|---|---|---|");
    let rows = [
        (100.0, true),
        (100.0, false),
        (50.0, true),
        (25.0, true),
        (10.0, true),
        (1.0, true),
    ];
    for (i, (pct, rescore)) in rows.into_iter().enumerate() {
        let want = ((f64::from(n_docs) * pct / 100.0).round() as u64).max(1);
        let allow = AllowSet::from_bitmap_for_tests(random_docs(n_docs, want, 11 + i as u64));
        let vis = Visibility::new(&allow, &map, &dead);
        for pass in ["first", "second"] {
            let opts = SearchOptions {
                rescore,
                ..SearchOptions::default()
            };
            let mut paths = std::collections::BTreeMap::<&str, usize>::new();
            let mut lat: Vec<f64> = queries
                .iter()
                .map(|q| {
                    let t = Instant::now();
                    let out = index.search(q, K, &vis, &opts).expect("search");
                    let ms = t.elapsed().as_secs_f64() * 1e3;
                    assert_eq!(out.hits.len(), K);
                    *paths.entry(out.path.name()).or_default() += 1;
                    ms
                })
                .collect();
            let mean = lat.iter().sum::<f64>() / lat.len() as f64;
            lat.sort_by(f64::total_cmp);
            let paths: Vec<String> = paths.iter().map(|(k, v)| format!("{k} {v}")).collect();
            println!(
                "| {pct}% | {rescore} | {pass} | {:.2} | {:.2} | {:.2} | {mean:.2} | {} | {} |",
                percentile(&lat, 50.0),
                percentile(&lat, 99.0),
                lat.last().copied().unwrap_or_default(),
                paths.join(", "),
                load_avg()
            );
        }
    }
}

/// Search latency (everything visible, default options) alone and while another thread ingests
/// batches as the engine does (insert + flush per committed batch): with the old protocol (write
/// lock for the whole insert and flush) and with the current one (write lock only to stage and
/// to commit; linking and the dump under the read lock). Runs on a copy of the index directory
/// (removed afterwards), so the benchmark's saved index stays as `vector_build` wrote it.
fn search_during_ingest(idx_dir: &Path, data: &DataSet, map: &ChunkMap, n_docs: u32) {
    use parking_lot::{Mutex, RwLock};
    use std::sync::atomic::{AtomicBool, Ordering};

    let copy = idx_dir.with_extension("ingest-copy");
    let _ = std::fs::remove_dir_all(&copy);
    std::fs::create_dir_all(&copy).expect("create copy");
    for e in std::fs::read_dir(idx_dir).expect("read index dir") {
        let e = e.expect("dir entry");
        std::fs::copy(e.path(), copy.join(e.file_name())).expect("copy index file");
    }
    let index = VectorIndex::open(&copy).expect("open copy");
    let batches = env_usize("AIRLOCK_BENCH_INGEST_BATCHES", 16);
    let batch = env_usize("AIRLOCK_BENCH_INGEST_BATCH", 512);
    let n = index.len();
    let allow = AllowSet::from_bitmap_for_tests((0..n_docs).collect());
    let dead = RoaringBitmap::new();
    let vis = Visibility::new(&allow, map, &dead);
    let opts = SearchOptions::default();
    let index = RwLock::new(index);
    let writer = Mutex::new(());
    let measure = |label: &str, ingest: Option<bool>, first_id: u32| {
        let done = AtomicBool::new(ingest.is_none());
        let mut lat = Vec::new();
        let t0 = Instant::now();
        std::thread::scope(|s| {
            if let Some(old_protocol) = ingest {
                let (index, writer, done) = (&index, &writer, &done);
                s.spawn(move || {
                    for b in 0..batches {
                        let items: Vec<(u32, &[f32])> = (0..batch)
                            .map(|i| {
                                let k = b * batch + i;
                                (first_id + k as u32, data.vectors[k % n].as_slice())
                            })
                            .collect();
                        let _w = writer.lock();
                        if old_protocol {
                            index.write().insert(&items).expect("insert");
                            index.write().flush().expect("flush");
                        } else {
                            let (_, slots) = index.write().stage(&items).expect("stage");
                            index.read().link(slots);
                            let p = index.read().prepare_flush(false).expect("prepare");
                            index.write().commit_flush(p).expect("commit");
                        }
                    }
                    done.store(true, Ordering::SeqCst);
                });
            }
            let mut i = 0;
            while lat.len() < 200 || !done.load(Ordering::SeqCst) {
                let q = &data.queries[i % data.queries.len()];
                i += 1;
                let t = Instant::now();
                index.read().search(q, K, &vis, &opts).expect("search");
                lat.push(t.elapsed().as_secs_f64() * 1e3);
            }
        });
        let secs = t0.elapsed().as_secs_f64();
        lat.sort_by(f64::total_cmp);
        println!(
            "| {label} | {} | {:.3} | {:.3} | {:.3} | {:.1} |",
            lat.len(),
            percentile(&lat, 50.0),
            percentile(&lat, 99.0),
            lat[lat.len() - 1],
            if ingest.is_some() {
                (batches * batch) as f64 / secs
            } else {
                0.0
            }
        );
    };
    println!(
        "\nSearch latency while ingesting ({batches} batches × {batch} vectors, insert + flush per batch as the engine does; searches: everything visible, defaults, one thread):\n"
    );
    println!("| ingest | searches | p50 ms | p99 ms | max ms | inserts/s |");
    println!("|---|---|---|---|---|---|");
    measure("none", None, 0);
    let extra = (batches * batch) as u32;
    measure(
        "old protocol: write lock for insert and flush",
        Some(true),
        n as u32,
    );
    measure("stage/link + prepare/commit", Some(false), n as u32 + extra);
    drop(index);
    let _ = std::fs::remove_dir_all(&copy);
}

/// `want` documents drawn uniformly.
fn random_docs(n_docs: u32, want: u64, seed: u64) -> RoaringBitmap {
    let mut rng = Rng::new(seed);
    let mut bits = RoaringBitmap::new();
    if want >= u64::from(n_docs) {
        bits.insert_range(0..n_docs);
    }
    while bits.len() < want {
        bits.insert(rng.below(u64::from(n_docs)) as u32);
    }
    bits
}

/// The `want` documents whose first chunk is nearest to a random document's first chunk.
fn nearby_docs(vectors: &[Vec<f32>], n_docs: u32, want: u64, seed: u64) -> RoaringBitmap {
    let mut rng = Rng::new(seed);
    let first = |d: u32| &vectors[(d * CHUNKS_PER_DOC) as usize];
    let centre = first(rng.below(u64::from(n_docs)) as u32);
    let mut by_sim: Vec<(f32, u32)> = (0..n_docs)
        .map(|d| (first(d).iter().zip(centre).map(|(a, b)| a * b).sum(), d))
        .collect();
    by_sim.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
    by_sim
        .into_iter()
        .take(want as usize)
        .map(|x| x.1)
        .collect()
}
