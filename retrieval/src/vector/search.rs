//! Filtered search that never collapses, at every selectivity: an exact int8 scan of the
//! visible chunks, or the HNSW graph searched with the visibility filter applied during the
//! traversal, whichever the cost model says is cheaper; f32 rescoring of the survivors.
//!
//! The graph path is hnswlib's filtered search (the fork's change (e), ACORN-style): it expands
//! through chunks the user cannot see and counts only visible ones, so it needs no oversampling;
//! its cost grows as `1 / visible fraction`. The exact scan costs a fixed amount per visible row.
//! The planner scans exactly whenever the scan fits a latency budget (recall 1.0) and otherwise
//! takes the cheaper estimate; under `Auto` the graph search is also capped at the exact scan's
//! estimated cost, after which it gives up and scans (so a query never costs more
//! than about twice the exact scan, whatever the layout of the user's documents in the graph).

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use super::kernels::{dot_f32, dot_i8};
use super::{VectorError, VectorIndex};
use crate::visibility::Visibility;

/// Which strategy to use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PathChoice {
    /// Pick by estimated cost, and cap the graph search at the exact scan's cost.
    #[default]
    Auto,
    /// Always scan the visible chunks exactly.
    Exact,
    /// Always search the graph, uncapped (still falls back to the exact scan when the graph
    /// cannot reach `k` visible chunks).
    Graph,
}

/// Search knobs. Defaults come from `docs/benchmarks/vector.md`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SearchOptions {
    /// HNSW result list size (`ef`) of the base-layer search; the filtered traversal collects
    /// `ef` *visible* chunks. Default 512, from `vector_build` at 200k real-MiniLM-based
    /// vectors: the graph needs it for recall@10 ≥ 0.95 there.
    pub ef: usize,
    /// Int8 candidates collected before rescoring (at least `k` are always collected).
    pub candidates: usize,
    /// Re-rank candidates by exact f32 dot products from the on-disk vectors.
    pub rescore: bool,
    /// Strategy override (benchmarks, tests).
    pub path: PathChoice,
    /// Cost model: nanoseconds per visible row of the exact scan (visible-set walk, slot lookup,
    /// 384-d int8 dot, top-k). `vector_filtered` at 200k, AVX2: 49 ns at 100% visible, 60 at
    /// 1%, 80–105 at 10–50% (docs/benchmarks/vector.md); the default is the upper end.
    pub exact_row_ns: f64,
    /// Cost model: nanoseconds per distance evaluation of the graph search (including its
    /// heaps, visited set and visibility filter). `vector_filtered` at 200k, AVX2, the flat
    /// graph: 205 ns unfiltered, 225–285 ns filtered at 10–50% visible (load 3–4; hnsw_rs's
    /// layout cost 520–700 ns).
    pub graph_eval_ns: f64,
    /// Cost model: distance evaluations of an unfiltered graph search per unit of `ef` (18 at
    /// 200k and ef 512).
    pub graph_evals_per_ef: f64,
    /// Cost model: a filtered graph search makes `1 / fraction^exponent` times the evaluations
    /// of an unfiltered one (0.81–0.85 measured at 10–50% visible, random and correlated ACLs).
    pub graph_fraction_exponent: f64,
    /// Scan exactly whenever the scan's estimated cost is within this budget (ns), even if the
    /// graph would be faster: the exact scan's recall is 1.0, the graph's is not. Default
    /// 10 ms, the p99 goal of a vector search (issue 23); 0 compares costs only.
    pub exact_budget_ns: f64,
}

impl Default for SearchOptions {
    fn default() -> Self {
        Self {
            ef: 512,
            candidates: 40,
            rescore: true,
            path: PathChoice::Auto,
            exact_row_ns: 90.0,
            graph_eval_ns: 230.0,
            graph_evals_per_ef: 18.0,
            graph_fraction_exponent: 0.85,
            exact_budget_ns: 10_000_000.0,
        }
    }
}

impl SearchOptions {
    /// Estimated cost (ns) of the exact scan over `visible` rows.
    pub fn exact_cost_ns(&self, visible: u64) -> f64 {
        visible as f64 * self.exact_row_ns
    }

    /// Estimated cost (ns) of the filtered graph search when `visible` of `n` chunks are
    /// visible: `ef × evals per ef / fraction^exponent × ns per evaluation`.
    pub fn graph_cost_ns(&self, visible: u64, n: usize) -> f64 {
        let frac = (visible as f64 / n.max(1) as f64).clamp(1e-9, 1.0);
        self.ef as f64 * self.graph_evals_per_ef / frac.powf(self.graph_fraction_exponent)
            * self.graph_eval_ns
    }
}

/// The strategy a search actually took.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SearchPath {
    /// Nothing to search (empty index, `k` = 0, or no visible chunk).
    Empty,
    /// Exact int8 scan over the visible chunks.
    Exact,
    /// HNSW searched with the visibility filter applied during the traversal.
    Graph,
    /// The graph search reached its cost cap, or could not reach `k` visible chunks: exact scan.
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
    /// `ef` of the graph search (0 for the exact path).
    pub ef: usize,
    /// Rows whose int8 distance was computed by the exact scan (0 for the graph path).
    pub scanned: usize,
    /// Distance evaluations of the graph search's base layer (0 for the exact path).
    pub evals: usize,
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
            evals: 0,
        };
        let Some(quant) = self.quant else {
            return Ok(empty);
        };
        if k == 0 || n == 0 || est == 0 {
            return Ok(empty);
        }
        let want = opts.candidates.max(k);
        let q8 = quant.quantize(query);
        let exact_ns = opts.exact_cost_ns(est);
        let exact = match opts.path {
            PathChoice::Auto => {
                exact_ns <= opts.exact_budget_ns || exact_ns <= opts.graph_cost_ns(est, n)
            }
            PathChoice::Exact => true,
            PathChoice::Graph => false,
        };
        let (cands, path, ef, scanned, evals) = if exact {
            let (c, scanned) = self.exact_scan(&q8, want, vis);
            (c, SearchPath::Exact, 0, scanned, 0)
        } else {
            let max_evals = match opts.path {
                PathChoice::Auto => (exact_ns / opts.graph_eval_ns.max(1e-3)).ceil() as usize,
                _ => usize::MAX,
            };
            let ef = opts.ef.max(want);
            match self.graph_search(&q8, k, want, ef, max_evals, vis) {
                (Some(c), evals) => (c, SearchPath::Graph, ef, 0, evals),
                (None, evals) => {
                    let (c, scanned) = self.exact_scan(&q8, want, vis);
                    (c, SearchPath::GraphThenExact, ef, scanned, evals)
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
            evals,
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

    /// The graph searched with the visibility filter during the traversal: the best `want`
    /// visible candidates and the distance evaluations made. `None` when the search hit
    /// `max_evals`, or ended with fewer than `k` visible chunks (the reachable part of the graph
    /// holds fewer): the caller scans exactly.
    fn graph_search(
        &self,
        q8: &[i8],
        k: usize,
        want: usize,
        ef: usize,
        max_evals: usize,
        vis: &Visibility<'_>,
    ) -> (Option<Vec<(u32, i32)>>, usize) {
        let allowed = |slot: usize| {
            self.slot_chunk
                .get(slot)
                .is_some_and(|&chunk| vis.visible(chunk))
        };
        let (found, evals, complete) =
            self.graph
                .search_filtered(&self.i8_data, q8, ef, &allowed, max_evals);
        if !complete || found.len() < k {
            return (None, evals);
        }
        let cands = found
            .into_iter()
            .take(want)
            .filter_map(|(slot, dot)| Some((*self.slot_chunk.get(slot)?, dot)))
            .collect();
        (Some(cands), evals)
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
