//! Deletes compacted out of the vector index ([`VectorIndex::compact_into`], what `reindex` does
//! while at most 20% of the entries are dead) against a rebuild of the same kept rows: wall time
//! and unfiltered recall@10 / q/s of the int8 graph at fixed `ef`, round after round of churn.
//!
//! `cargo bench -p airlock-retrieval --bench vector_compact`
//! Env: `AIRLOCK_BENCH_N` (vectors, default 200000), `AIRLOCK_BENCH_ROUNDS` (rounds of 1% churn,
//! default 5; a 20% and a 40% round follow: `reindex` rebuilds past 20%), `AIRLOCK_BENCH_REBUILD=0` skips the rebuilds. Data as
//! `vector_build` (cached in `target/vector-bench/`); the indexes are written to
//! `target/vector-bench/compact-<set>/` and removed at the end. Build on 2 threads (M 16,
//! ef_construction 200), compaction on the same pool, search on 1 thread.

mod vector_support;

use std::path::Path;
use std::time::Instant;

use airlock_acl::AllowSet;
use airlock_retrieval::vector::{PathChoice, SearchOptions, VectorIndex, VectorParams};
use airlock_retrieval::{ChunkMap, Visibility};
use roaring::RoaringBitmap;
use vector_support::*;

/// Low `ef`s, where a weaker graph shows first (the synthetic base saturates above).
const EFS: [usize; 3] = [16, 32, 64];

fn build(dir: &Path, data: &DataSet, live: &[bool]) -> (VectorIndex, f64) {
    let _ = std::fs::remove_dir_all(dir);
    let params = VectorParams {
        capacity_hint: data.vectors.len(),
        ..VectorParams::default()
    };
    let mut index = VectorIndex::create(dir, DIM, params).expect("create");
    let t = Instant::now();
    let ids: Vec<u32> = (0..data.vectors.len() as u32)
        .filter(|&c| live[c as usize])
        .collect();
    for batch in ids.chunks(20_000) {
        let items: Vec<(u32, &[f32])> = batch
            .iter()
            .map(|&c| (c, data.vectors[c as usize].as_slice()))
            .collect();
        index.insert(&items).expect("insert");
    }
    index.checkpoint().expect("checkpoint");
    (index, t.elapsed().as_secs_f64())
}

/// `(ef, recall@10, q/s)` of the unfiltered int8 graph search over the live rows.
fn eval(index: &VectorIndex, data: &DataSet, live: &[bool]) -> Vec<(usize, f64, f64)> {
    let ids: Vec<u32> = (0..data.vectors.len() as u32)
        .filter(|&c| live[c as usize])
        .collect();
    let truth = exact_truth(&data.vectors, &data.queries, Some(&ids));
    let n = data.vectors.len() as u32;
    let mut map = ChunkMap::new();
    for c in 0..n {
        map.insert(c, c / 8);
    }
    let allow = AllowSet::from_bitmap_for_tests((0..n.div_ceil(8)).collect());
    let dead = RoaringBitmap::new();
    let vis = Visibility::new(&allow, &map, &dead);
    EFS.iter()
        .map(|&ef| {
            let opts = SearchOptions {
                ef,
                candidates: K,
                rescore: false,
                path: PathChoice::Graph,
                ..SearchOptions::default()
            };
            let t = Instant::now();
            let got: Vec<Vec<u32>> = data
                .queries
                .iter()
                .map(|q| {
                    let hits = index.search(q, K, &vis, &opts).expect("search").hits;
                    hits.iter().map(|h| h.0).collect()
                })
                .collect();
            let qps = data.queries.len() as f64 / t.elapsed().as_secs_f64();
            (ef, mean_recall(&got, &truth), qps)
        })
        .collect()
}

fn row(what: &str, live: usize, secs: f64, evals: &[(usize, f64, f64)]) {
    let cells: Vec<String> = evals
        .iter()
        .map(|(_, r, q)| format!("{r:.3} / {q:.0}"))
        .collect();
    println!(
        "| {what} | {live} | {secs:.1} s | {} | {} |",
        cells.join(" | "),
        load_avg()
    );
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let n = env_usize("AIRLOCK_BENCH_N", 200_000);
    let rounds = env_usize("AIRLOCK_BENCH_ROUNDS", 5);
    let rebuild = env_usize("AIRLOCK_BENCH_REBUILD", 1) != 0;
    let data = noisy(n);
    println!(
        "# vector_compact: {n} × {DIM} ({}), {} queries, {} threads, load {}",
        data.source,
        data.queries.len(),
        rayon::current_num_threads(),
        load_avg()
    );
    println!("# cpu: {}", cpu_desc());
    let root = data.dir.join(format!("compact-{}", data_tag(n)));
    let _ = std::fs::remove_dir_all(&root);
    std::fs::create_dir_all(&root).expect("bench dir");

    let mut live = vec![true; n];
    let (mut index, secs) = build(&root.join("0"), &data, &live);
    println!(
        "\n| step | live rows | wall time | {} | load |",
        EFS.map(|e| format!("recall@10 / q/s at ef {e}"))
            .join(" | ")
    );
    println!("|---|---|---|{}---|", "---|".repeat(EFS.len()));
    row("build", n, secs, &eval(&index, &data, &live));

    let mut rng = airlock_retrieval::vector::synth::Rng::new(99);
    let steps: Vec<f64> = std::iter::repeat_n(0.01, rounds)
        .chain([0.20, 0.40])
        .collect();
    for (i, frac) in steps.iter().enumerate() {
        let alive: Vec<u32> = (0..n as u32).filter(|&c| live[c as usize]).collect();
        let drop_n = (alive.len() as f64 * frac).round() as usize;
        let mut dropped = 0;
        while dropped < drop_n {
            let c = alive[rng.below(alive.len() as u64) as usize] as usize;
            if std::mem::replace(&mut live[c], false) {
                dropped += 1;
            }
        }
        let dir = root.join(format!("{}", i + 1));
        let t = Instant::now();
        let (next, rep) = index
            .compact_into(&dir, &|c| live[c as usize])
            .expect("compact");
        let secs = t.elapsed().as_secs_f64();
        assert_eq!(rep.dropped, drop_n);
        let old_dir = index.dir().to_path_buf();
        drop(index);
        let _ = std::fs::remove_dir_all(old_dir);
        index = next;
        let kept = n - live.iter().filter(|l| !**l).count();
        row(
            &format!(
                "compact round {} ({:.0}% of the live rows dropped)",
                i + 1,
                frac * 100.0
            ),
            kept,
            secs,
            &eval(&index, &data, &live),
        );
        if rebuild && (i == 0 || i + 1 == steps.len()) {
            let (fresh, secs) = build(&root.join("rebuild"), &data, &live);
            row(
                &format!("rebuild of the same {kept} rows"),
                kept,
                secs,
                &eval(&fresh, &data, &live),
            );
            drop(fresh);
            let _ = std::fs::remove_dir_all(root.join("rebuild"));
        }
    }
    drop(index);
    let _ = std::fs::remove_dir_all(&root);
}
