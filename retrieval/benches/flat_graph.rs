//! The flat-layout HNSW graph (`vector::flat`, not yet the index's graph) side by side with
//! hnswlib on the same vectors: build inserts/s on 2 threads, heap bytes per point, unfiltered
//! recall@10 and q/s per `ef` on one thread (int8, and f32 rescoring of the top 40), then the
//! same summary lines as `vector_build`.
//!
//! `cargo bench -p airlock-retrieval --bench flat_graph`
//! Env: `AIRLOCK_BENCH_N` (vectors, default 200000), `AIRLOCK_BENCH_M` / `AIRLOCK_BENCH_EFC`
//! (16 / 200), `AIRLOCK_BENCH_PEER=0` skips hnswlib. Data as `vector_build` (cached in
//! `target/vector-bench/`).

mod vector_support;

use std::time::Instant;

use airlock_retrieval::vector::Quantizer;
use airlock_retrieval::vector::flat::FlatGraph;
use airlock_retrieval::vector::kernels::dot_f32;
use vector_support::*;

const EFS: [usize; 7] = [16, 32, 64, 128, 256, 512, 1024];

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let n = env_usize("AIRLOCK_BENCH_N", 200_000);
    let m = env_usize("AIRLOCK_BENCH_M", 16);
    let efc = env_usize("AIRLOCK_BENCH_EFC", 200);
    let data = noisy(n);
    let tag = data_tag(n);
    println!(
        "# flat_graph: {n} × {DIM} ({}), {} queries, load {}",
        data.source,
        data.queries.len(),
        load_avg()
    );
    println!("# cpu: {}", cpu_desc());

    // Quantized as the index does: one scale from (at most) the first 20,000 vectors.
    let quant = Quantizer::calibrate(data.vectors.iter().take(20_000).map(Vec::as_slice))
        .expect("calibrate");
    let rows: Vec<i8> = data
        .vectors
        .iter()
        .flat_map(|v| quant.quantize(v))
        .collect();
    let queries: Vec<Vec<i8>> = data.queries.iter().map(|q| quant.quantize(q)).collect();

    let (anon0, _) = rss_kib();
    let threads = rayon::current_num_threads();
    let mut graph = FlatGraph::new(DIM, m, efc);
    let t0 = Instant::now();
    graph.reserve(n);
    graph.insert(&rows, 0..n as u32);
    let build = t0.elapsed().as_secs_f64();
    let (anon1, _) = rss_kib();
    graph.check().expect("graph structure");
    println!(
        "\nbuild (m {m}, ef_c {efc}, {threads} threads): {build:.1} s = {:.0} inserts/s; graph arrays {:.0} B per point (+ the int8 row {DIM} B, shared with the exact scan); process heap growth {:.0} B per point; load {}",
        n as f64 / build,
        graph.memory_bytes() as f64 / n as f64,
        (anon1.saturating_sub(anon0)) as f64 * 1024.0 / n as f64,
        load_avg()
    );

    println!("\n| ef | recall@10 int8 graph | q/s | recall@10 + f32 rescore of top 40 | q/s |");
    println!("|---|---|---|---|---|");
    let mut ours: Vec<OurRow> = Vec::new();
    for ef in EFS {
        ours.push(ef_row(ef, &data, |rescore| {
            let want = if rescore { 40 } else { K };
            data.queries
                .iter()
                .zip(&queries)
                .map(|(qf, q8)| {
                    let hits = graph.search(&rows, q8, ef.max(want));
                    if !rescore {
                        return hits.iter().take(K).map(|h| h.0).collect();
                    }
                    let mut r: Vec<(f32, u32)> = hits
                        .iter()
                        .take(want)
                        .map(|&(s, _)| (dot_f32(qf, &data.vectors[s as usize]), s))
                        .collect();
                    r.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
                    r.into_iter().take(K).map(|x| x.1).collect()
                })
                .collect()
        }));
    }
    compare_with_hnswlib(&data, &tag, threads, n as f64 / build, &ours, &EFS);
}
