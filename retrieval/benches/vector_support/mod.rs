//! Shared data and timing helpers of the retrieval benchmarks (`vector_build`, `vector_filtered`,
//! `bm25_scale`, `hybrid_latency`, `scale`).
//!
//! Data set ("noisy200k", the peers' scale proxy of `shared/peers/bench_ann.py`): a base set of
//! 10,419 unit vectors (real MiniLM embeddings of Cranfield docs + bank-dev chunks when
//! `target/vector-bench/real-base.f32` exists, otherwise synthetic clustered vectors), cycled to
//! 200,000 copies each plus N(0, 0.05²) per component, renormalised (seed 7). Queries: 550
//! (`real-queries.f32` when present, otherwise base vectors plus fresh N(0, 0.05²) noise).
//! Ground truth: exact f32 top-10, computed once and cached. Everything is cached under
//! `target/vector-bench/` (raw little-endian f32 / u32 files) so the hnswlib peer script reads
//! the very same vectors.
#![allow(dead_code)]

pub mod projection;

use std::fs;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use airlock_acl::AllowSet;
use airlock_retrieval::vector::synth;
use rayon::prelude::*;
use roaring::RoaringBitmap;

pub const DIM: usize = 384;
pub const BASE_N: usize = 10_419;
pub const NQ: usize = 550;
pub const K: usize = 10;
pub const SIGMA: f32 = 0.05;

pub fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// `target/vector-bench/` (or `$AIRLOCK_VECTOR_BENCH_DIR`).
pub fn work_dir() -> PathBuf {
    let d = std::env::var_os("AIRLOCK_VECTOR_BENCH_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/vector-bench"));
    fs::create_dir_all(&d).expect("create bench dir");
    d
}

pub fn write_f32(path: &Path, rows: &[Vec<f32>]) {
    let mut f = std::io::BufWriter::new(fs::File::create(path).expect("create"));
    for r in rows {
        for x in r {
            f.write_all(&x.to_le_bytes()).expect("write");
        }
    }
}

pub fn read_f32(path: &Path, dim: usize) -> Option<Vec<Vec<f32>>> {
    let b = fs::read(path).ok()?;
    if b.len() % (4 * dim) != 0 {
        return None;
    }
    Some(
        b.chunks_exact(4 * dim)
            .map(|r| {
                r.chunks_exact(4)
                    .map(|x| f32::from_le_bytes([x[0], x[1], x[2], x[3]]))
                    .collect()
            })
            .collect(),
    )
}

fn write_u32(path: &Path, v: &[u32]) {
    fs::write(
        path,
        v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>(),
    )
    .expect("write");
}

fn read_u32(path: &Path) -> Option<Vec<u32>> {
    let b = fs::read(path).ok()?;
    Some(
        b.chunks_exact(4)
            .map(|x| u32::from_le_bytes([x[0], x[1], x[2], x[3]]))
            .collect(),
    )
}

pub struct DataSet {
    pub source: &'static str,
    pub vectors: Vec<Vec<f32>>,
    pub queries: Vec<Vec<f32>>,
    /// Exact top-K over all vectors, per query.
    pub truth: Vec<Vec<u32>>,
    pub dir: PathBuf,
}

/// Loads (or builds and caches) noisy copies of the base set, `n` vectors.
pub fn noisy(n: usize) -> DataSet {
    let dir = work_dir();
    let real_base = read_f32(&dir.join("real-base.f32"), DIM);
    let real_q = read_f32(&dir.join("real-queries.f32"), DIM);
    let source = if real_base.is_some() && real_q.is_some() {
        "MiniLM (Cranfield + bank-dev)"
    } else {
        "synthetic clustered"
    };
    let tag = format!("{}-{n}", if real_base.is_some() { "real" } else { "synth" });
    let vpath = dir.join(format!("noisy-{tag}.f32"));
    let qpath = dir.join(format!("queries-{tag}.f32"));
    let tpath = dir.join(format!("truth-{tag}.u32"));
    if let (Some(vectors), Some(queries), Some(t)) = (
        read_f32(&vpath, DIM),
        read_f32(&qpath, DIM),
        read_u32(&tpath),
    ) && vectors.len() == n
        && t.len() == queries.len() * K
    {
        let truth = t.chunks(K).map(<[u32]>::to_vec).collect();
        return DataSet {
            source,
            vectors,
            queries,
            truth,
            dir,
        };
    }
    let t0 = Instant::now();
    let base = real_base.unwrap_or_else(|| synth::clustered(BASE_N, DIM, 400, 0.8, 1));
    let vectors = synth::noisy_copies(&base, n, SIGMA, 7);
    let queries = match real_q {
        Some(q) => q,
        None => {
            let mut rng = synth::Rng::new(3);
            let src: Vec<Vec<f32>> = (0..NQ)
                .map(|_| base[rng.below(base.len() as u64) as usize].clone())
                .collect();
            synth::noisy_copies(&src, NQ, SIGMA, 11)
        }
    };
    let truth = exact_truth(&vectors, &queries, None);
    write_f32(&vpath, &vectors);
    write_f32(&qpath, &queries);
    write_u32(&tpath, &truth.concat());
    eprintln!(
        "[data] built {tag} ({source}) + ground truth in {:.1} s",
        t0.elapsed().as_secs_f64()
    );
    DataSet {
        source,
        vectors,
        queries,
        truth,
        dir,
    }
}

/// Exact f32 top-K of each query over `ids` (all when `None`), in parallel.
pub fn exact_truth(
    vectors: &[Vec<f32>],
    queries: &[Vec<f32>],
    ids: Option<&[u32]>,
) -> Vec<Vec<u32>> {
    queries
        .par_iter()
        .map(|q| {
            let top = match ids {
                Some(ids) => synth::exact_top_k(vectors, ids.iter().copied(), q, K),
                None => synth::exact_top_k(vectors, 0..vectors.len() as u32, q, K),
            };
            top.into_iter().map(|t| t.0).collect()
        })
        .collect()
}

pub fn mean_recall(got: &[Vec<u32>], truth: &[Vec<u32>]) -> f64 {
    got.iter()
        .zip(truth)
        .map(|(g, t)| synth::recall(g, t))
        .sum::<f64>()
        / truth.len().max(1) as f64
}

/// Percentile (0..=100) of durations in ms.
pub fn percentile(sorted_ms: &[f64], p: f64) -> f64 {
    if sorted_ms.is_empty() {
        return f64::NAN;
    }
    let i = ((sorted_ms.len() - 1) as f64 * p / 100.0).round() as usize;
    sorted_ms[i]
}

pub fn load_avg() -> String {
    fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

/// The CPU model and the SIMD flags that matter to both libraries' distance kernels
/// (from /proc/cpuinfo), so that numbers from different boxes are not compared unknowingly.
pub fn cpu_desc() -> String {
    let info = fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let field = |name: &str| {
        info.lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_once(':'))
            .map(|(_, v)| v.trim().to_string())
            .unwrap_or_default()
    };
    let flags = field("flags");
    let simd: Vec<&str> = [
        "sse4_2",
        "avx2",
        "fma",
        "avx512f",
        "avx512bw",
        "avx512_vnni",
    ]
    .into_iter()
    .filter(|f| flags.split_whitespace().any(|x| x == *f))
    .collect();
    let cpus = info.lines().filter(|l| l.starts_with("processor")).count();
    format!("{} × {cpus}, flags {}", field("model name"), simd.join(" "))
}

/// `(RssAnon, RssFile)` of this process in KiB (/proc/self/status): heap and touched mapped
/// file pages.
pub fn rss_kib() -> (u64, u64) {
    let status = fs::read_to_string("/proc/self/status").unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    (field("RssAnon:"), field("RssFile:"))
}

/// The tag `noisy(n)` stores its files under (`real-<n>` or `synth-<n>`), without loading them.
pub fn data_tag(n: usize) -> String {
    let dir = work_dir();
    let real = dir.join("real-base.f32").exists();
    format!("{}-{n}", if real { "real" } else { "synth" })
}

/// The bank-dev golden set's queries (`datasets/bank-dev/golden.jsonl` under `shared`).
pub fn golden_queries(shared: &Path) -> Vec<String> {
    let f = std::fs::File::open(shared.join("datasets/bank-dev/golden.jsonl")).expect("golden");
    BufReader::new(f)
        .lines()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(&l.expect("line")).expect("json");
            v["query"].as_str().expect("query").to_owned()
        })
        .collect()
}

/// Each of `n_docs` documents allowed with probability `frac` (seeded).
pub fn random_allow(n_docs: u32, frac: f64, seed: u64) -> AllowSet {
    let mut rng = synth::Rng::new(seed);
    let mut b = RoaringBitmap::new();
    for d in 0..n_docs {
        if rng.unit() < frac {
            b.insert(d);
        }
    }
    AllowSet::from_bitmap_for_tests(b)
}

/// One of our build + search runs: `(ef, (recall, q/s) int8, (recall, q/s) rescored)`.
pub type OurRow = (usize, (f64, f64), (f64, f64));

/// Runs hnswlib on the same files (`scripts/peers/hnswlib_side.py`, M 16, ef_c 200) and prints
/// its table and the two summary lines tooling reads (`build ratio (ours / hnswlib): X×`, `q/s
/// at the first ef with recall@10 ≥ …`). Skipped with `AIRLOCK_BENCH_PEER=0`.
pub fn compare_with_hnswlib(
    data: &DataSet,
    tag: &str,
    threads: usize,
    our_inserts_per_s: f64,
    ours: &[OurRow],
    efs: &[usize],
) {
    if std::env::var("AIRLOCK_BENCH_PEER").as_deref() == Ok("0") {
        return;
    }
    let script =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/peers/hnswlib_side.py");
    let out = Command::new(std::env::var("PYTHON").unwrap_or_else(|_| "python3".into()))
        .arg(&script)
        .arg("--vectors")
        .arg(data.dir.join(format!("noisy-{tag}.f32")))
        .arg("--queries")
        .arg(data.dir.join(format!("queries-{tag}.f32")))
        .arg("--truth")
        .arg(data.dir.join(format!("truth-{tag}.u32")))
        .arg("--threads")
        .arg(threads.to_string())
        .arg("--efs")
        .arg(
            efs.iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(","),
        )
        .output();
    let json = match out {
        Ok(o) if o.status.success() => String::from_utf8_lossy(&o.stdout).to_string(),
        Ok(o) => {
            println!(
                "\nhnswlib peer failed: {}",
                String::from_utf8_lossy(&o.stderr)
            );
            return;
        }
        Err(e) => {
            println!("\nhnswlib peer not run ({e}); `pip install numpy hnswlib`");
            return;
        }
    };
    let peer: serde_json::Value = serde_json::from_str(json.trim()).expect("peer json");
    let peer_ips = peer["inserts_per_s"].as_f64().unwrap_or(f64::NAN);
    println!(
        "\nhnswlib (same vectors, M 16, ef_c 200, {threads} threads): build {} s = {peer_ips:.0} inserts/s; load {}",
        peer["build_s"],
        load_avg()
    );
    println!(
        "build ratio (ours / hnswlib): {:.2}×",
        our_inserts_per_s / peer_ips
    );
    println!("\n| ef | hnswlib recall@10 | hnswlib q/s |");
    println!("|---|---|---|");
    let rows = peer["rows"].as_array().cloned().unwrap_or_default();
    for r in &rows {
        println!("| {} | {} | {} |", r["ef"], r["recall"], r["qps"]);
    }
    let first = |target: f64| -> (Option<f64>, Option<f64>, Option<f64>) {
        let o = ours.iter().find(|r| r.1.0 >= target).map(|r| r.1.1);
        let or = ours.iter().find(|r| r.2.0 >= target).map(|r| r.2.1);
        let p = rows
            .iter()
            .find(|r| r["recall"].as_f64().unwrap_or(0.0) >= target)
            .and_then(|r| r["qps"].as_f64());
        (o, or, p)
    };
    for target in [0.9, 0.95] {
        let (o, or, p) = first(target);
        let ratio = |x: Option<f64>| match (x, p) {
            (Some(a), Some(b)) => format!("{:.0} q/s = {:.2}×", a, a / b),
            _ => "not reached".into(),
        };
        println!(
            "q/s at the first ef with recall@10 ≥ {target}: hnswlib {}; ours int8 {}; ours + rescore {}",
            p.map_or("not reached".into(), |x| format!("{x:.0}")),
            ratio(o),
            ratio(or)
        );
    }
}

/// The value after `--name` on the command line (`--bench` and the program name skipped).
pub fn cli_arg(name: &str) -> Option<String> {
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| a != "--bench")
        .collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1).cloned())
}

/// `../shared` beside the checkout (or `$AIRLOCK_SHARED_DIR`).
pub fn shared_dir() -> PathBuf {
    std::env::var_os("AIRLOCK_SHARED_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared"))
}

/// Times `run(false)` (int8 top 10) and `run(true)` (f32-rescored) over all queries, prints the
/// `| ef | recall | q/s | recall | q/s |` row and returns it.
pub fn ef_row(ef: usize, data: &DataSet, mut run: impl FnMut(bool) -> Vec<Vec<u32>>) -> OurRow {
    let mut cells = Vec::new();
    for rescore in [false, true] {
        let t = Instant::now();
        let got = run(rescore);
        let secs = t.elapsed().as_secs_f64();
        cells.push((
            mean_recall(&got, &data.truth),
            data.queries.len() as f64 / secs,
        ));
    }
    println!(
        "| {ef} | {:.4} | {:.0} | {:.4} | {:.0} |",
        cells[0].0, cells[0].1, cells[1].0, cells[1].1
    );
    (ef, cells[0], cells[1])
}

/// `(title, text)` of every bank-dev document (`shared/datasets/bank-dev/corpus.jsonl`).
pub fn bank_dev_corpus(shared: &Path) -> Vec<(String, String)> {
    let f = fs::File::open(shared.join("datasets/bank-dev/corpus.jsonl")).expect("corpus");
    BufReader::new(f)
        .lines()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(&l.expect("line")).expect("json");
            (
                v["title"].as_str().unwrap_or_default().to_owned(),
                v["text"].as_str().unwrap_or_default().to_owned(),
            )
        })
        .collect()
}

/// The corpus's vocabulary (sorted, distinct words) and each document's words, as the
/// text-perturbing benches (`bm25_scale`, `scale`) draw on them.
pub fn corpus_words(docs: &[(String, String)]) -> (Vec<&str>, Vec<Vec<&str>>) {
    let mut vocab: Vec<&str> = docs
        .iter()
        .flat_map(|(_, t)| t.split_whitespace())
        .collect();
    vocab.sort_unstable();
    vocab.dedup();
    let words = docs
        .iter()
        .map(|(_, t)| t.split_whitespace().collect())
        .collect();
    (vocab, words)
}
