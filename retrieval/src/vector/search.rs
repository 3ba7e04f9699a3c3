//! Filtered search that never collapses: exact int8 scan below a crossover, unfiltered HNSW with
//! oversampling + filter + widening above it, f32 rescoring of the survivors.
//!
//! Why not hnsw_rs's own filter: with a selective filter its search never exits early and walks
//! most of the graph (100–380 ms per query at 1% allowed on 100k vectors, see STACK.md), while an
//! exact scan of the allowed rows costs ~0.1 µs per row.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use super::kernels::{dot_f32, dot_i8};
use super::{VectorError, VectorIndex};
use crate::visibility::Visibility;

/// Which strategy to use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PathChoice {
    /// Pick by the estimated visible fraction (the crossover).
    #[default]
    Auto,
    /// Always scan the visible chunks exactly.
    Exact,
    /// Always search the graph (still falls back to the exact scan when widening cannot find `k`).
    Graph,
}

/// Search knobs. Defaults come from `docs/benchmarks/vector.md`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SearchOptions {
    /// Base HNSW candidate list (`ef`) for an unfiltered search. Default 512, from
    /// `vector_build` at 200k real-MiniLM-based vectors: hnsw_rs's graph needs it for recall@10
    /// ≥ 0.95 there (ef 96: 0.72; 256: 0.93; 512: 0.97 after rescoring) at ~2.7 ms per query
    /// on one core.
    pub ef: usize,
    /// Cap on `ef` while widening; past it the search falls back to the exact scan.
    pub max_ef: usize,
    /// Crossover: scan exactly when the estimated visible chunks are at most this fraction of
    /// the index. Default 0.25, from `vector_filtered` (40k vectors): the exact scan wins by 70×
    /// at 10% visible (0.24 vs 17 ms p50, since the filtered graph search needs `ef` ≈ 600) and
    /// loses by 1.6× at 50% (1.56 vs 0.95 ms).
    pub exact_fraction: f64,
    /// Int8 candidates collected before rescoring (at least `k` are always collected).
    pub candidates: usize,
    /// Re-rank candidates by exact f32 dot products from the on-disk vectors.
    pub rescore: bool,
    /// `ef` is sized to `candidates / visible fraction × oversample` for filtered graph searches.
    pub oversample: f64,
    /// Strategy override (benchmarks, tests).
    pub path: PathChoice,
}

impl Default for SearchOptions {
    fn default() -> Self {
        Self {
            ef: 512,
            max_ef: 4096,
            exact_fraction: 0.25,
            candidates: 40,
            rescore: true,
            oversample: 1.5,
            path: PathChoice::Auto,
        }
    }
}

/// The strategy a search actually took.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SearchPath {
    /// Nothing to search (empty index, `k` = 0, or no visible chunk).
    Empty,
    /// Exact int8 scan over the visible chunks.
    Exact,
    /// Unfiltered HNSW, then the visibility filter.
    Graph,
    /// The graph could not find `k` visible chunks even after widening: exact scan.
    GraphThenExact,
}

impl SearchPath {
    /// Short name for timings and stage scores.
    pub fn name(self) -> &'static str {
        match self {
            SearchPath::Empty => "empty",
            SearchPath::Exact => "exact",
            SearchPath::Graph => "hnsw",
            SearchPath::GraphThenExact => "hnsw+exact",
        }
    }
}

/// Result of [`VectorIndex::search`].
#[derive(Debug, Clone, PartialEq)]
pub struct SearchOutcome {
    /// `(chunk id, score)`, best first, at most `k`. Scores are f32 dot products (cosine for
    /// normalised vectors) when rescored, else the int8 approximation of it.
    pub hits: Vec<(u32, f32)>,
    /// Strategy taken.
    pub path: SearchPath,
    /// The visible-chunk estimate that drove the choice.
    pub estimated_visible: u64,
    /// Final `ef` of the graph search (0 for the exact path).
    pub ef: usize,
    /// Rows whose int8 distance was computed by the exact scan (0 for the graph path).
    pub scanned: usize,
}

/// Keeps the `k` largest `(score, chunk)`; ties prefer the smaller chunk id.
struct TopK {
    k: usize,
    heap: BinaryHeap<Reverse<(i32, Reverse<u32>)>>,
}

impl TopK {
    fn new(k: usize) -> Self {
        Self {
            k,
            heap: BinaryHeap::with_capacity(k + 1),
        }
    }

    #[inline]
    fn push(&mut self, score: i32, chunk: u32) {
        let item = Reverse((score, Reverse(chunk)));
        if self.heap.len() < self.k {
            self.heap.push(item);
        } else if let Some(min) = self.heap.peek()
            && item < *min
        {
            self.heap.pop();
            self.heap.push(item);
        }
    }

    fn into_sorted(self) -> Vec<(u32, i32)> {
        let mut v: Vec<(u32, i32)> = self
            .heap
            .into_iter()
            .map(|Reverse((s, Reverse(c)))| (c, s))
            .collect();
        v.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
        v
    }
}

impl VectorIndex {
    /// The top `k` chunks visible under `vis` by similarity to `query` (normalised f32, `dim`
    /// long). Returns `k` hits whenever `k` visible chunks are indexed. See [`SearchOptions`].
    pub fn search(
        &self,
        query: &[f32],
        k: usize,
        vis: &Visibility<'_>,
        opts: &SearchOptions,
    ) -> Result<SearchOutcome, VectorError> {
        self.check_query(query)?;
        let n = self.len();
        let est = vis.estimate_visible().min(n as u64);
        let empty = SearchOutcome {
            hits: Vec::new(),
            path: SearchPath::Empty,
            estimated_visible: est,
            ef: 0,
            scanned: 0,
        };
        let Some(quant) = self.quant else {
            return Ok(empty);
        };
        if k == 0 || n == 0 || est == 0 {
            return Ok(empty);
        }
        let want = opts.candidates.max(k);
        let q8 = quant.quantize(query);
        let frac = est as f64 / n as f64;
        let exact = match opts.path {
            PathChoice::Auto => frac <= opts.exact_fraction,
            PathChoice::Exact => true,
            PathChoice::Graph => false,
        };
        let (cands, path, ef, scanned) = if exact {
            let (c, scanned) = self.exact_scan(&q8, want, vis);
            (c, SearchPath::Exact, 0, scanned)
        } else {
            match self.graph_search(&q8, k, want, frac, vis, opts) {
                (Some(c), ef) => (c, SearchPath::Graph, ef, 0),
                (None, ef) => {
                    let (c, scanned) = self.exact_scan(&q8, want, vis);
                    (c, SearchPath::GraphThenExact, ef, scanned)
                }
            }
        };
        let hits = self.finish(query, cands, k, opts.rescore, quant);
        Ok(SearchOutcome {
            hits,
            path,
            estimated_visible: est,
            ef,
            scanned,
        })
    }

    /// Exact int8 scan over exactly the visible chunks; returns the top `want` and rows scanned.
    fn exact_scan(&self, q8: &[i8], want: usize, vis: &Visibility<'_>) -> (Vec<(u32, i32)>, usize) {
        let mut top = TopK::new(want);
        let mut scanned = 0;
        for chunk in vis.visible_chunks() {
            if let Some(slot) = self.slot_of(chunk) {
                top.push(dot_i8(q8, self.i8_row(slot)), chunk);
                scanned += 1;
            }
        }
        (top.into_sorted(), scanned)
    }

    /// Unfiltered graph search, filtered afterwards, widening `ef` until `want` candidates
    /// survive. `None` when even the widest search finds fewer than `k`.
    fn graph_search(
        &self,
        q8: &[i8],
        k: usize,
        want: usize,
        frac: f64,
        vis: &Visibility<'_>,
        opts: &SearchOptions,
    ) -> (Option<Vec<(u32, i32)>>, usize) {
        let n = self.len();
        let max_ef = opts.max_ef.max(want).min(n);
        let sized = (want as f64 / frac.max(1e-9) * opts.oversample).ceil() as usize;
        let mut ef = opts.ef.max(want).max(sized).min(max_ef);
        let offset = 128 * 128 * self.dim as i64;
        loop {
            let found = self.graph.search(q8, ef);
            let exhausted = found.len() < ef;
            let survivors: Vec<(u32, i32)> = found
                .into_iter()
                .filter_map(|(slot, dist)| {
                    let chunk = *self.slot_chunk.get(slot)?;
                    vis.visible(chunk)
                        .then_some((chunk, (offset - dist as i64) as i32))
                })
                .take(want)
                .collect();
            if survivors.len() >= want || ((exhausted || ef >= max_ef) && survivors.len() >= k) {
                return (Some(survivors), ef);
            }
            if exhausted || ef >= max_ef {
                return (None, ef);
            }
            ef = (ef * 4).min(max_ef);
        }
    }

    /// Rescoring (or int8 scores) → best `k`.
    fn finish(
        &self,
        query: &[f32],
        cands: Vec<(u32, i32)>,
        k: usize,
        rescore: bool,
        quant: super::Quantizer,
    ) -> Vec<(u32, f32)> {
        let mut hits: Vec<(u32, f32)> = if rescore {
            let mut row = vec![0f32; self.dim];
            cands
                .into_iter()
                .filter_map(|(c, _)| {
                    let slot = self.slot_of(c)?;
                    self.read_f32_row(slot, &mut row);
                    Some((c, dot_f32(query, &row)))
                })
                .collect()
        } else {
            cands
                .into_iter()
                .map(|(c, s)| (c, quant.dot_to_f32(s)))
                .collect()
        };
        hits.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        hits.truncate(k);
        hits
    }
}
