//! What one write costs the search snapshot at bank scale (issue 23 point 3): every committed
//! batch, delete or re-ingest publishes a new [`ChunkMap`] (chunk → document, document → its
//! chunks) beside the one searches are reading, so the cost of `clone` + the batch's changes is
//! paid per write and grows with the corpus if the clone copies the whole map.
//!
//! `cargo bench -p airlock-retrieval --bench chunk_map`
//! Env: `AIRLOCK_BENCH_CHUNKS` (default 1,000,000 and 5,000,000: a comma-separated list),
//! `AIRLOCK_BENCH_WRITES` (publishes timed per size, default 200). Each publish: clone the map,
//! add 32 new documents × 4 chunks (an ingest batch), re-ingest 8 existing documents (their old
//! chunks unmapped, 4 new ones each) and delete 2; the old map stays alive (a reader holds it).

mod vector_support;

use std::time::Instant;

use airlock_retrieval::ChunkMap;
use airlock_retrieval::vector::synth::Rng;

const CHUNKS_PER_DOC: u32 = 4;

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let sizes: Vec<u32> = std::env::var("AIRLOCK_BENCH_CHUNKS")
        .unwrap_or_else(|_| "1000000,5000000".into())
        .split(',')
        .map(|s| {
            s.trim()
                .parse()
                .expect("AIRLOCK_BENCH_CHUNKS: chunk counts")
        })
        .collect();
    let writes = vector_support::env_usize("AIRLOCK_BENCH_WRITES", 200);
    println!("cpu: {}", vector_support::cpu_desc());
    for n in sizes {
        let t0 = Instant::now();
        let mut map = ChunkMap::new();
        let docs = n / CHUNKS_PER_DOC;
        for c in 0..docs * CHUNKS_PER_DOC {
            map.insert(c, c / CHUNKS_PER_DOC);
        }
        let built = t0.elapsed();
        let mut next_chunk = docs * CHUNKS_PER_DOC;
        let mut next_doc = docs;
        let mut rng = Rng::new(7);
        let mut times = Vec::with_capacity(writes);
        let mut readers = Vec::new();
        for _ in 0..writes {
            let t = Instant::now();
            let mut m = map.clone();
            for _ in 0..32 {
                for _ in 0..CHUNKS_PER_DOC {
                    m.insert(next_chunk, next_doc);
                    next_chunk += 1;
                }
                next_doc += 1;
            }
            for _ in 0..8 {
                let d = rng.below(next_doc as u64) as u32;
                m.remove_doc(d);
                for _ in 0..CHUNKS_PER_DOC {
                    m.insert(next_chunk, d);
                    next_chunk += 1;
                }
            }
            for _ in 0..2 {
                m.remove_doc(rng.below(next_doc as u64) as u32);
            }
            times.push(t.elapsed().as_secs_f64() * 1e6);
            // A search still holds the previous snapshot while the next one is built.
            readers.push(std::mem::replace(&mut map, m));
            if readers.len() > 2 {
                readers.remove(0);
            }
        }
        times.sort_by(f64::total_cmp);
        let pct = |p: f64| times[((times.len() - 1) as f64 * p).round() as usize];
        println!(
            "chunk_map {n} chunks ({docs} docs): built in {:.2} s; per publish p50 {:.0} µs, p99 {:.0} µs (clone + 160 inserts + 10 document removals, {writes} publishes); mapped {}",
            built.as_secs_f64(),
            pct(0.5),
            pct(0.99),
            map.mapped_chunks()
        );
    }
}
