//! The int8 vector index against brute-force f32 search.
//!
//! Failure budget (stated, and asserted): over the queries of each selectivity, mean recall@10
//! against exact f32 search over exactly the visible chunks ≥ 0.95 (the graph path) and ≥ 0.98
//! (the exact int8 path, after f32 rescoring); zero invisible chunks returned; never fewer than
//! `min(k, visible)` hits.

use airlock_acl::AllowSet;
use airlock_retrieval::vector::synth::{self, Rng};
use airlock_retrieval::vector::{
    PathChoice, SearchOptions, SearchPath, VectorError, VectorIndex, VectorParams,
};
use airlock_retrieval::{ChunkMap, Visibility};
use roaring::RoaringBitmap;

const DIM: usize = 96;
const CHUNKS_PER_DOC: u32 = 8;
const K: usize = 10;

struct Fixture {
    _dir: tempfile::TempDir,
    index: VectorIndex,
    vectors: Vec<Vec<f32>>,
    map: ChunkMap,
    queries: Vec<Vec<f32>>,
}

fn params() -> VectorParams {
    // Smaller than the production defaults (16 / 200): tests run unoptimised.
    VectorParams {
        m: 12,
        ef_construction: 64,
        capacity_hint: 10_000,
        ..VectorParams::default()
    }
}

fn fixture(n: usize) -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let vectors = synth::clustered(n, DIM, n / 40, 0.9, 42);
    let mut index = VectorIndex::create(dir.path(), DIM, params()).unwrap();
    let items: Vec<(u32, &[f32])> = vectors
        .iter()
        .enumerate()
        .map(|(i, v)| (i as u32, v.as_slice()))
        .collect();
    for batch in items.chunks(2500) {
        index.insert(batch).unwrap();
    }
    let mut map = ChunkMap::new();
    for c in 0..n as u32 {
        map.insert(c, c / CHUNKS_PER_DOC);
    }
    // Queries near (not on) indexed vectors, from every part of the collection.
    let sources: Vec<Vec<f32>> = vectors.iter().step_by(n / 20).cloned().collect();
    let queries = synth::noisy_copies(&sources, 20, 0.02, 9);
    Fixture {
        _dir: dir,
        index,
        vectors,
        map,
        queries,
    }
}

fn allow_fraction(n_docs: u32, frac: f64, seed: u64) -> AllowSet {
    let mut rng = Rng::new(seed);
    let want = ((f64::from(n_docs) * frac).round() as u32).max(1);
    let mut bits = RoaringBitmap::new();
    while bits.len() < u64::from(want) {
        bits.insert(rng.below(u64::from(n_docs)) as u32);
    }
    AllowSet::from_bitmap_for_tests(bits)
}

/// Runs every query; returns mean recall@K and the paths seen. Asserts the hard invariants.
fn check(f: &Fixture, vis: &Visibility<'_>, opts: &SearchOptions) -> (f64, Vec<SearchPath>) {
    let visible = vis.visible_chunks();
    let mut recall = 0.0;
    let mut paths = Vec::new();
    for q in &f.queries {
        let out = f.index.search(q, K, vis, opts).unwrap();
        let truth: Vec<u32> = synth::exact_top_k(&f.vectors, visible.iter(), q, K)
            .iter()
            .map(|t| t.0)
            .collect();
        let got: Vec<u32> = out.hits.iter().map(|h| h.0).collect();
        assert_eq!(
            got.len(),
            truth.len(),
            "short result on {:?} (visible {})",
            out.path,
            visible.len()
        );
        for c in &got {
            assert!(vis.visible(*c), "invisible chunk {c} returned");
        }
        assert!(
            out.hits.windows(2).all(|w| w[0].1 >= w[1].1),
            "hits sorted by score"
        );
        recall += synth::recall(&got, &truth);
        paths.push(out.path);
    }
    (recall / f.queries.len() as f64, paths)
}

#[test]
fn filtered_search_matches_exact_search_at_every_selectivity() {
    let n = 4000;
    let f = fixture(n);
    let n_docs = n as u32 / CHUNKS_PER_DOC;
    let dead = RoaringBitmap::new();
    for (i, frac) in [1.0, 0.5, 0.1, 0.02, 0.01, 0.001, 0.0001]
        .into_iter()
        .enumerate()
    {
        let allow = allow_fraction(n_docs, frac, 100 + i as u64);
        let vis = Visibility::new(&allow, &f.map, &dead);
        let (r, paths) = check(&f, &vis, &SearchOptions::default());
        let budget = if paths.iter().all(|p| *p == SearchPath::Exact) {
            0.98
        } else {
            0.95
        };
        assert!(
            r >= budget,
            "selectivity {frac}: recall@10 {r:.3} < {budget} ({paths:?})"
        );
        // The other strategy must hold the same budget (the crossover only trades speed).
        for path in [PathChoice::Exact, PathChoice::Graph] {
            let opts = SearchOptions {
                path,
                ..SearchOptions::default()
            };
            let (r, _) = check(&f, &vis, &opts);
            assert!(
                r >= 0.95,
                "selectivity {frac}, forced {path:?}: recall@10 {r:.3}"
            );
        }
    }
}

#[test]
fn graph_path_falls_back_instead_of_collapsing() {
    let f = fixture(4000);
    let allow = allow_fraction(500, 0.002, 5); // one document: 8 chunks < k
    let dead = RoaringBitmap::new();
    let vis = Visibility::new(&allow, &f.map, &dead);
    let opts = SearchOptions {
        path: PathChoice::Graph,
        ..SearchOptions::default()
    };
    let out = f.index.search(&f.queries[0], K, &vis, &opts).unwrap();
    assert_eq!(out.path, SearchPath::GraphThenExact);
    assert_eq!(out.hits.len(), CHUNKS_PER_DOC as usize);
    // With a wide filter the graph alone finds k.
    let all = allow_fraction(500, 1.0, 5);
    let vis = Visibility::new(&all, &f.map, &dead);
    let out = f.index.search(&f.queries[0], K, &vis, &opts).unwrap();
    assert_eq!((out.path, out.hits.len()), (SearchPath::Graph, K));
}

#[test]
fn a_wrong_cost_model_cannot_make_a_selective_query_walk_the_graph() {
    let f = fixture(4000);
    let allow = allow_fraction(500, 0.002, 5); // one document: 8 chunks
    let dead = RoaringBitmap::new();
    let vis = Visibility::new(&allow, &f.map, &dead);
    // A model that believes the graph is nearly free picks it even for 8 visible chunks...
    let fooled = SearchOptions {
        graph_evals_per_ef: 1e-6,
        exact_budget_ns: 0.0,
        ..SearchOptions::default()
    };
    let out = f.index.search(&f.queries[0], K, &vis, &fooled).unwrap();
    // ...but the graph search stops at the exact scan's estimated cost and scans.
    assert_eq!(out.path, SearchPath::GraphThenExact);
    let cap = (8.0 * fooled.exact_row_ns / fooled.graph_eval_ns).ceil() as usize;
    assert!(out.evals <= cap, "{} evaluations, cap {cap}", out.evals);
    assert_eq!(out.hits.len(), CHUNKS_PER_DOC as usize);
    // The same query uncapped walks far more of the graph.
    let forced = SearchOptions {
        path: PathChoice::Graph,
        ..fooled
    };
    let out = f.index.search(&f.queries[0], K, &vis, &forced).unwrap();
    assert!(out.evals > 10 * cap, "{} evaluations", out.evals);
    assert_eq!(out.hits.len(), CHUNKS_PER_DOC as usize);
}

#[test]
fn the_planner_scans_for_selective_users_and_walks_the_graph_for_broad_ones() {
    let f = fixture(4000);
    let dead = RoaringBitmap::new();
    // At 4,000 chunks the exact scan fits the latency budget for everyone: always exact.
    let allow = allow_fraction(500, 1.0, 9);
    let vis = Visibility::new(&allow, &f.map, &dead);
    let out = f
        .index
        .search(&f.queries[1], K, &vis, &SearchOptions::default())
        .unwrap();
    assert_eq!(out.path, SearchPath::Exact);
    // Costs alone (no budget), with ef 16: the graph wins for broad users.
    let opts = SearchOptions {
        ef: 16,
        exact_budget_ns: 0.0,
        ..SearchOptions::default()
    };
    for (frac, want) in [(1.0, SearchPath::Graph), (0.01, SearchPath::Exact)] {
        let allow = allow_fraction(500, frac, 9);
        let vis = Visibility::new(&allow, &f.map, &dead);
        let out = f.index.search(&f.queries[1], K, &vis, &opts).unwrap();
        assert_eq!(out.path, want, "{frac}");
        let visible = out.estimated_visible;
        let graph_wins = opts.graph_cost_ns(visible, 4000) < opts.exact_cost_ns(visible);
        assert_eq!(graph_wins, want == SearchPath::Graph, "{frac}");
    }
}

#[test]
fn dead_and_unmapped_chunks_are_never_returned() {
    let f = fixture(4000);
    let allow = allow_fraction(500, 1.0, 1);
    // Kill the exact top 10 of the first query and half of everything else.
    let q = &f.queries[0];
    let top = synth::exact_top_k(&f.vectors, 0..4000, q, K);
    let mut dead: RoaringBitmap = top.iter().map(|t| t.0).collect();
    dead.extend((0..4000).step_by(2));
    let vis = Visibility::new(&allow, &f.map, &dead);
    for path in [PathChoice::Auto, PathChoice::Exact, PathChoice::Graph] {
        let out = f
            .index
            .search(
                q,
                K,
                &vis,
                &SearchOptions {
                    path,
                    ..SearchOptions::default()
                },
            )
            .unwrap();
        assert_eq!(out.hits.len(), K);
        assert!(out.hits.iter().all(|h| !dead.contains(h.0)), "{path:?}");
    }
    let none = AllowSet::empty();
    let vis = Visibility::new(&none, &f.map, &dead);
    let out = f
        .index
        .search(q, K, &vis, &SearchOptions::default())
        .unwrap();
    assert_eq!((out.path, out.hits.len()), (SearchPath::Empty, 0));
}

#[test]
fn int8_with_rescoring_reaches_f32_exact_recall() {
    let f = fixture(3000);
    let allow = allow_fraction(375, 1.0, 3);
    let dead = RoaringBitmap::new();
    let vis = Visibility::new(&allow, &f.map, &dead);
    let exact = SearchOptions {
        path: PathChoice::Exact,
        ..SearchOptions::default()
    };
    let (rescored, _) = check(&f, &vis, &exact);
    assert!(
        rescored >= 0.99,
        "int8 exact + f32 rescoring recall@10 {rescored:.4}"
    );
    let (plain, _) = check(
        &f,
        &vis,
        &SearchOptions {
            rescore: false,
            ..exact
        },
    );
    assert!(
        plain <= rescored + 1e-9,
        "rescoring never hurts here: {plain:.4} vs {rescored:.4}"
    );
    // Rescored scores are the exact f32 dot products.
    let q = &f.queries[1];
    let out = f
        .index
        .search(q, K, &vis, &SearchOptions::default())
        .unwrap();
    let ids: Vec<u32> = out.hits.iter().map(|h| h.0).collect();
    let rs = f.index.rescore(q, &ids).unwrap();
    for (h, r) in out.hits.iter().zip(rs) {
        let want = synth::exact_top_k(&f.vectors, [h.0], q, 1)[0].1;
        assert!((r.unwrap() - want).abs() < 1e-5 && (h.1 - want).abs() < 1e-5);
    }
    assert_eq!(f.index.rescore(q, &[999_999]).unwrap(), vec![None]);
}

#[test]
fn insert_is_idempotent_by_chunk_id() {
    let dir = tempfile::tempdir().unwrap();
    let v = synth::clustered(300, DIM, 10, 0.9, 1);
    let mut idx = VectorIndex::create(dir.path(), DIM, params()).unwrap();
    let items: Vec<(u32, &[f32])> = v
        .iter()
        .enumerate()
        .map(|(i, x)| (i as u32 * 3, x.as_slice()))
        .collect();
    let r = idx.insert(&items[..200]).unwrap();
    assert_eq!((r.added, r.skipped), (200, 0));
    // Overlapping batch with a duplicate inside it and different vectors for known ids.
    let mut again = items[150..300].to_vec();
    again.push(items[299]);
    again[0].1 = &v[0];
    let r = idx.insert(&again).unwrap();
    assert_eq!((r.added, r.skipped), (100, 51));
    assert_eq!(idx.len(), 300);
    assert_eq!(
        idx.vector(450).unwrap(),
        v[150],
        "the first vector of an id is kept"
    );
    assert_eq!(idx.ids().len(), 300);
    assert!(idx.contains(897) && !idx.contains(898));
    let bad = vec![0.5f32; DIM - 1];
    assert!(matches!(
        idx.insert(&[(7, &bad)]),
        Err(VectorError::Dimension { chunk: 7, .. })
    ));
    let nan = vec![f32::NAN; DIM];
    assert!(matches!(
        idx.insert(&[(7, &nan)]),
        Err(VectorError::NonFinite(7))
    ));
}

fn ids_of(
    index: &VectorIndex,
    q: &[f32],
    vis: &Visibility<'_>,
    path: PathChoice,
) -> Vec<(u32, f32)> {
    index
        .search(
            q,
            K,
            vis,
            &SearchOptions {
                path,
                ..SearchOptions::default()
            },
        )
        .unwrap()
        .hits
}

#[test]
fn persists_reloads_without_rebuild_and_accepts_inserts_after_reload() {
    let dir = tempfile::tempdir().unwrap();
    let v = synth::clustered(3000, DIM, 60, 0.9, 8);
    let items: Vec<(u32, &[f32])> = v
        .iter()
        .enumerate()
        .map(|(i, x)| (i as u32, x.as_slice()))
        .collect();
    let mut map = ChunkMap::new();
    for c in 0..3000 {
        map.insert(c, c / CHUNKS_PER_DOC);
    }
    let allow = allow_fraction(375, 1.0, 2);
    let dead = RoaringBitmap::new();
    let vis = Visibility::new(&allow, &map, &dead);
    let q = synth::noisy_copies(&v[..1], 1, 0.02, 3).remove(0);

    let p = VectorParams {
        dump_min_new: 1000,
        ..params()
    };
    let mut idx = VectorIndex::create(dir.path(), DIM, p).unwrap();
    assert!(matches!(
        VectorIndex::create(dir.path(), DIM, p),
        Err(VectorError::AlreadyExists(_))
    ));
    idx.insert(&items[..2000]).unwrap();
    idx.flush().unwrap(); // dumps the graph (2000 new ≥ 1000)
    let before = ids_of(&idx, &q, &vis, PathChoice::Graph);
    let scale = idx.quantizer().unwrap().scale();
    drop(idx);

    let mut idx = VectorIndex::open(dir.path()).unwrap();
    assert_eq!(idx.len(), 2000);
    assert_eq!(idx.quantizer().unwrap().scale(), scale);
    assert_eq!(
        ids_of(&idx, &q, &vis, PathChoice::Graph),
        before,
        "same graph after reload"
    );
    // Inserts after reload; a small batch is durable but not dumped: reopen re-inserts it.
    idx.insert(&items[2000..2500]).unwrap();
    idx.flush().unwrap();
    idx.insert(&items[2500..2600]).unwrap(); // never flushed: dropped on reopen
    drop(idx);
    let mut idx = VectorIndex::open(dir.path()).unwrap();
    assert_eq!(idx.len(), 2500);
    assert!(idx.contains(2499) && !idx.contains(2500));
    idx.insert(&items[2500..]).unwrap();
    idx.checkpoint().unwrap();
    let all_graph = ids_of(&idx, &q, &vis, PathChoice::Graph);
    let all_exact = ids_of(&idx, &q, &vis, PathChoice::Exact);
    drop(idx);
    let idx = VectorIndex::open(dir.path()).unwrap();
    assert_eq!(idx.len(), 3000);
    assert_eq!(ids_of(&idx, &q, &vis, PathChoice::Graph), all_graph);
    assert_eq!(ids_of(&idx, &q, &vis, PathChoice::Exact), all_exact);
    let truth: Vec<u32> = synth::exact_top_k(&v, 0..3000, &q, K)
        .iter()
        .map(|t| t.0)
        .collect();
    let got: Vec<u32> = all_exact.iter().map(|h| h.0).collect();
    assert!(synth::recall(&got, &truth) >= 0.9);
    // Only the current graph dump is left behind.
    let dumps = std::fs::read_dir(dir.path())
        .unwrap()
        .filter(|e| {
            e.as_ref()
                .unwrap()
                .file_name()
                .to_string_lossy()
                .ends_with(".flat")
        })
        .count();
    assert_eq!(dumps, 1);
}

#[test]
fn corrupt_files_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let v = synth::clustered(500, DIM, 10, 0.9, 4);
    let items: Vec<(u32, &[f32])> = v
        .iter()
        .enumerate()
        .map(|(i, x)| (i as u32, x.as_slice()))
        .collect();
    let mut idx = VectorIndex::create(dir.path(), DIM, params()).unwrap();
    idx.insert(&items).unwrap();
    idx.checkpoint().unwrap();
    drop(idx);
    let flip = |name: &str, at: usize| {
        let p = dir.path().join(name);
        let mut b = std::fs::read(&p).unwrap();
        let i = at.min(b.len() - 1);
        b[i] ^= 0x20;
        std::fs::write(&p, &b).unwrap();
    };
    for (name, at) in [
        ("vectors.f32", 5000),
        ("vectors.i8", 900),
        ("chunks.u32", 70),
        ("graph-1.flat", 300),
        ("vector.meta", 200),
    ] {
        flip(name, at);
        let err = VectorIndex::open(dir.path())
            .err()
            .unwrap_or_else(|| panic!("{name}: corruption not detected"));
        assert!(matches!(err, VectorError::Corrupt { .. }), "{name}: {err}");
        flip(name, at); // restore
        VectorIndex::open(dir.path()).unwrap();
    }
}

/// The frozen format-version-1 index (64 vectors of dim 8, checkpointed) in
/// `tests/fixtures/vector-v1/`; regenerate only when bumping the format, with
/// `cargo test -p airlock-retrieval --test integration write_vector_v1_fixture -- --ignored`.
fn v1_fixture_dir() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/vector-v1")
}

#[test]
#[ignore = "writes the frozen fixture; run only when the format version changes"]
fn write_vector_v1_fixture() {
    let dir = v1_fixture_dir();
    let _ = std::fs::remove_dir_all(&dir);
    let v = synth::clustered(64, 8, 4, 0.5, 2024);
    let items: Vec<(u32, &[f32])> = v
        .iter()
        .enumerate()
        .map(|(i, x)| (i as u32 * 2, x.as_slice()))
        .collect();
    let mut idx = VectorIndex::create(
        &dir,
        8,
        VectorParams {
            capacity_hint: 64,
            ..VectorParams::default()
        },
    )
    .unwrap();
    idx.insert(&items).unwrap();
    idx.checkpoint().unwrap();
}

#[test]
fn frozen_v1_fixture_still_opens() {
    let tmp = tempfile::tempdir().unwrap();
    for e in std::fs::read_dir(v1_fixture_dir()).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), tmp.path().join(e.file_name())).unwrap();
    }
    let idx = VectorIndex::open(tmp.path()).unwrap();
    assert_eq!((idx.len(), idx.dim()), (64, 8));
    let mut map = ChunkMap::new();
    for c in 0..64 {
        map.insert(c * 2, c);
    }
    let dead = RoaringBitmap::new();
    let all = AllowSet::from_bitmap_for_tests((0..64).collect());
    let vis_all = Visibility::new(&all, &map, &dead);
    for id in [0u32, 10, 126] {
        let q = idx.vector(id).unwrap();
        for path in [PathChoice::Exact, PathChoice::Graph] {
            let hits = ids_of(&idx, &q, &vis_all, path);
            assert_eq!(hits[0].0, id, "{path:?}");
            assert!((hits[0].1 - 1.0).abs() < 1e-5);
        }
    }
    // The fixture's graph is an hnsw_rs dump: opening rebuilt the graph from the rows (above);
    // the next checkpoint writes the flat dump, drops the hnsw_rs files and names no hnsw_rs
    // graph in the meta any more (a binary from before would rebuild its own graph, not misread).
    let mut idx = idx;
    idx.checkpoint().unwrap();
    drop(idx);
    let names: Vec<String> = std::fs::read_dir(tmp.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(names.iter().any(|n| n.ends_with(".flat")), "{names:?}");
    assert!(!names.iter().any(|n| n.contains(".hnsw.")), "{names:?}");
    let meta = std::fs::read_to_string(tmp.path().join("vector.meta")).unwrap();
    assert!(meta.contains("\"graph\": null"), "{meta}");
    let idx = VectorIndex::open(tmp.path()).unwrap();
    let q = idx.vector(10).unwrap();
    assert_eq!(ids_of(&idx, &q, &vis_all, PathChoice::Graph)[0].0, 10);
}

#[test]
fn searches_run_while_a_batch_is_linked_and_a_dump_is_written() {
    use parking_lot::RwLock;
    use std::sync::atomic::{AtomicBool, Ordering};

    let f = fixture(4000);
    let more = synth::clustered(6000, DIM, 150, 0.9, 77);
    let index = RwLock::new(f.index);
    let allow = allow_fraction(500, 1.0, 3);
    let dead = RoaringBitmap::new();
    let vis = Visibility::new(&allow, &f.map, &dead);
    let opts = SearchOptions {
        path: PathChoice::Graph,
        ..SearchOptions::default()
    };
    let linking = AtomicBool::new(false);
    let done = AtomicBool::new(false);
    let mut during = 0;
    std::thread::scope(|s| {
        s.spawn(|| {
            let items: Vec<(u32, &[f32])> = more
                .iter()
                .enumerate()
                .map(|(i, v)| (4000 + i as u32, v.as_slice()))
                .collect();
            let (report, slots) = index.write().stage(&items).unwrap();
            assert_eq!(report.added, 6000);
            let guard = index.read();
            linking.store(true, Ordering::SeqCst);
            guard.link(slots);
            let prepared = guard.prepare_flush(true).unwrap();
            drop(guard);
            index.write().commit_flush(prepared).unwrap();
            done.store(true, Ordering::SeqCst);
        });
        while !linking.load(Ordering::SeqCst) {
            std::thread::yield_now();
        }
        // The writer holds a read lock for the whole link and dump: searches must complete
        // meanwhile (they would wait for the whole batch under a write lock).
        while !done.load(Ordering::SeqCst) {
            let out = index
                .read()
                .search(&f.queries[during % f.queries.len()], K, &vis, &opts);
            assert_eq!(out.unwrap().hits.len(), K);
            during += usize::from(!done.load(Ordering::SeqCst));
        }
    });
    assert!(during > 0, "no search completed while the batch was linked");
    let index = index.into_inner();
    assert_eq!(index.len(), 10_000);
    // The dump committed beside the searches reopens whole, with nothing left to re-insert.
    let reopened = VectorIndex::open(index.dir()).unwrap();
    assert_eq!(reopened.len(), 10_000);
    let q = &more[17];
    let hit = reopened
        .search(
            q,
            1,
            &Visibility::new(
                &AllowSet::from_bitmap_for_tests((0..1250).collect()),
                &{
                    let mut m = ChunkMap::new();
                    for c in 0..10_000u32 {
                        m.insert(c, c / CHUNKS_PER_DOC);
                    }
                    m
                },
                &dead,
            ),
            &SearchOptions::default(),
        )
        .unwrap();
    assert_eq!(hit.hits[0].0, 4017);
}

#[test]
fn compaction_drops_dead_rows_without_a_rebuild_and_reopens() {
    let f = fixture(4000);
    let n_docs = 4000 / CHUNKS_PER_DOC;
    let allow = allow_fraction(n_docs, 1.0, 5);
    // 5% of the chunks dead, as a reindex finds them (superseded or tombstoned).
    let dead: RoaringBitmap = (0..4000u32).filter(|c| c % 20 == 7).collect();
    let none = RoaringBitmap::new();
    let old_vis = Visibility::new(&allow, &f.map, &dead);
    let new_vis = Visibility::new(&allow, &f.map, &none);
    let out = tempfile::tempdir().unwrap();
    let dir = out.path().join("compacted");
    let (c, rep) = f
        .index
        .compact_into(&dir, &|id| !dead.contains(id))
        .unwrap();
    assert_eq!((rep.kept, rep.dropped), (3800, 200));
    assert_eq!(
        (f.index.dropped_since_build(), c.dropped_since_build()),
        (0, 200)
    );
    assert_eq!(c.len(), 3800);
    assert_eq!(c.params(), f.index.params());
    assert_eq!(
        c.quantizer(),
        f.index.quantizer(),
        "same scale: same int8 rows"
    );
    assert!(dead.iter().all(|d| !c.contains(d)));
    assert!(
        (0..4000)
            .filter(|x| !dead.contains(*x))
            .all(|x| c.contains(x))
    );
    assert_eq!(
        c.vector(8),
        f.index.vector(8),
        "f32 rows copied as they were"
    );
    // The source index is not changed.
    assert_eq!(f.index.len(), 4000);
    // Exact scans agree hit for hit (same rows, same scores); the repaired graph keeps recall.
    let kept: Vec<u32> = (0..4000u32).filter(|x| !dead.contains(*x)).collect();
    let mut recall = 0.0;
    for q in &f.queries {
        assert_eq!(
            ids_of(&c, q, &new_vis, PathChoice::Exact),
            ids_of(&f.index, q, &old_vis, PathChoice::Exact)
        );
        let truth: Vec<u32> = synth::exact_top_k(&f.vectors, kept.iter().copied(), q, K)
            .iter()
            .map(|t| t.0)
            .collect();
        let got: Vec<u32> = ids_of(&c, q, &new_vis, PathChoice::Graph)
            .iter()
            .map(|h| h.0)
            .collect();
        recall += synth::recall(&got, &truth);
    }
    let recall = recall / f.queries.len() as f64;
    assert!(recall >= 0.95, "graph recall after compaction {recall}");
    // The compacted graph was dumped (format 2, named apart in the meta): reopen rebuilds
    // nothing and finds the same; inserts continue on it and survive the next reopen.
    let graph_before = ids_of(&c, &f.queries[0], &new_vis, PathChoice::Graph);
    let meta = std::fs::read_to_string(dir.join("vector.meta")).unwrap();
    assert!(meta.contains("\"flat_graph_levels\""), "{meta}");
    assert!(meta.contains("\"flat_graph\": null"), "{meta}");
    drop(c);
    let mut c = VectorIndex::open(&dir).unwrap();
    assert_eq!(
        ids_of(&c, &f.queries[0], &new_vis, PathChoice::Graph),
        graph_before,
        "same graph after reopen"
    );
    c.insert(&[(7, f.vectors[7].as_slice())]).unwrap();
    c.checkpoint().unwrap();
    drop(c);
    let c = VectorIndex::open(&dir).unwrap();
    assert_eq!(c.len(), 3801);
    assert_eq!(c.dropped_since_build(), 200, "persisted");
    let again = out.path().join("again");
    let (c2, _) = c.compact_into(&again, &|id| id % 2 == 0).unwrap();
    assert_eq!(
        c2.dropped_since_build(),
        200 + (3801 - c2.len()) as u64,
        "accumulates"
    );
    drop(c2);
    assert!(c.contains(7));
    let hit = ids_of(&c, &f.vectors[7], &new_vis, PathChoice::Graph);
    assert_eq!(
        hit[0].0, 7,
        "a row inserted after compaction is found by the graph"
    );
    // A directory that holds an index already is refused, and nothing in it changes.
    let before = std::fs::read(dir.join("vector.meta")).unwrap();
    assert!(matches!(
        f.index.compact_into(&dir, &|_| true),
        Err(VectorError::AlreadyExists(_))
    ));
    assert_eq!(std::fs::read(dir.join("vector.meta")).unwrap(), before);
}
