//! Vector index build throughput and unfiltered recall/QPS, side by side with hnswlib on the same
//! vectors (M 16, ef_construction 200, build on 2 threads, search on 1).
//!
//! `cargo bench -p airlock-retrieval --bench vector_build`
//! Env: `AIRLOCK_BENCH_N` (vectors, default 200000), `AIRLOCK_BENCH_PEER=0` skips hnswlib,
//! `AIRLOCK_BENCH_M` / `AIRLOCK_BENCH_EFC` override the build parameters (the saved index used by
//! `vector_filtered` is only written for the defaults).
//! The built index is checkpointed to `target/vector-bench/index-<set>/` for `vector_filtered`.

mod vector_support;

use std::time::Instant;

use airlock_acl::AllowSet;
use airlock_retrieval::vector::{PathChoice, SearchOptions, VectorIndex, VectorParams};
use airlock_retrieval::{ChunkMap, Visibility};
use roaring::RoaringBitmap;
use vector_support::*;

const EFS: [usize; 7] = [16, 32, 64, 128, 256, 512, 1024];

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return; // `cargo bench -- --list` / `cargo test --benches`: nothing to enumerate
    }
    let n = env_usize("AIRLOCK_BENCH_N", 200_000);
    let m = env_usize("AIRLOCK_BENCH_M", 16);
    let efc = env_usize("AIRLOCK_BENCH_EFC", 200);
    let data = noisy(n);
    println!(
        "# vector_build: {n} × {DIM} ({}), {} queries, load {}",
        data.source,
        data.queries.len(),
        load_avg()
    );
    println!("# cpu: {}", cpu_desc());

    let tag = format!(
        "{}-{n}",
        if data.source.starts_with("MiniLM") {
            "real"
        } else {
            "synth"
        }
    );
    let default_params = m == 16 && efc == 200;
    let idx_dir = data.dir.join(if default_params {
        format!("index-{tag}")
    } else {
        format!("index-{tag}-m{m}-efc{efc}")
    });
    let _ = std::fs::remove_dir_all(&idx_dir);
    let params = VectorParams {
        m,
        ef_construction: efc,
        capacity_hint: n,
        ..VectorParams::default()
    };
    let mut index = VectorIndex::create(&idx_dir, DIM, params).expect("create");
    let threads = rayon::current_num_threads();
    let t0 = Instant::now();
    for (b, batch) in data.vectors.chunks(20_000).enumerate() {
        let items: Vec<(u32, &[f32])> = batch
            .iter()
            .enumerate()
            .map(|(i, v)| ((b * 20_000 + i) as u32, v.as_slice()))
            .collect();
        index.insert(&items).expect("insert");
    }
    let build = t0.elapsed().as_secs_f64();
    let t1 = Instant::now();
    index.checkpoint().expect("checkpoint");
    let dump = t1.elapsed().as_secs_f64();
    let t2 = Instant::now();
    drop(index);
    let index = VectorIndex::open(&idx_dir).expect("reopen");
    let reopen = t2.elapsed().as_secs_f64();
    println!(
        "\nbuild (m {m}, ef_c {efc}, {threads} threads): {build:.1} s = {:.0} inserts/s; checkpoint {dump:.1} s; reopen (verify + reload, no rebuild) {reopen:.1} s; load {}",
        n as f64 / build,
        load_avg()
    );

    let mut map = ChunkMap::new();
    for c in 0..n as u32 {
        map.insert(c, c / 8);
    }
    let allow = AllowSet::from_bitmap_for_tests((0..n.div_ceil(8) as u32).collect());
    let dead = RoaringBitmap::new();
    let vis = Visibility::new(&allow, &map, &dead);
    println!("\n| ef | recall@10 int8 graph | q/s | recall@10 + f32 rescore of top 40 | q/s |");
    println!("|---|---|---|---|---|");
    let mut ours = Vec::new();
    for ef in EFS {
        let plain = SearchOptions {
            ef,
            candidates: K,
            rescore: false,
            path: PathChoice::Graph,
            ..SearchOptions::default()
        };
        let resc = SearchOptions {
            candidates: 40,
            rescore: true,
            ..plain
        };
        ours.push(ef_row(ef, &data, |rescore| {
            let opts = if rescore { resc } else { plain };
            data.queries
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
                .collect()
        }));
    }

    compare_with_hnswlib(&data, &tag, threads, n as f64 / build, &ours, &EFS);
}
