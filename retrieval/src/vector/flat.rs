//! An HNSW graph with a flat memory layout over the index's own int8 rows (issue 23 point 1).
//!
//! The index's graph (through `graph.rs`) since it replaced hnsw_rs; also measured on its own
//! side by side with hnswlib (`benches/flat_graph.rs`, docs/benchmarks/vector.md). The algorithm
//! is hnswlib's: a level per
//! point drawn with `1 / ln(M)`, a greedy descent to a local minimum on every upper layer, an
//! `ef_construction` search on each of the point's layers, neighbours chosen by the diversity
//! heuristic both for a new point's links and when a back-link overflows a list, links only on a
//! point's own layers, and the filtered search of the hnsw_rs fork's change (e).
//!
//! Layout, per point: its level (1 byte), its layer-0 list in one flat array (`1 + 2·M` `u32`s:
//! count, then slots), an offset into one flat array of upper-layer lists (`1 + M` per layer; only
//! the ≈ 1/M points above layer 0 have any), a one-byte lock. Vectors are not stored: every call
//! takes the index's int8 rows (`rows`, slot-major, `dim` per row), so the int8 data exist once.
//! At M = 16 that is ≈ 140 bytes per point against ≈ 3.5 KB in hnsw_rs.
//!
//! Concurrency: a point's lists are written under its lock; inserts read them under it (copied
//! out), queries read them without it. Links are `AtomicU32`s (relaxed ordering), so a query
//! beside a writer reads defined values: a list that may mix old and new neighbours, each a
//! reserved slot, which a search tolerates as it tolerates a point linked a moment later.
//! Searches prefetch a batch of neighbours' rows before computing their distances. Points enter
//! through [`FlatGraph::insert`] after [`FlatGraph::reserve`] (`&mut`) made room.
//!
//! Distances are negated int8 dot products (`i32`, exact): smaller is nearer.

use std::cell::RefCell;
use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::sync::atomic::{AtomicU32, Ordering::Relaxed};

use parking_lot::{Mutex, RwLock};
use rayon::prelude::*;

use super::kernels::{dot_i8, prefetch};

const NONE: u32 = u32::MAX;
const DUMP_MAGIC: &[u8; 8] = b"ALFLATG\0";
/// Format 1: levels follow from the slots ([`level_for`]). Format 2 (a compacted graph): the
/// levels are stored after the header, one byte per point, padded to a multiple of four.
const DUMP_VERSION: u32 = 1;
const DUMP_VERSION_LEVELS: u32 = 2;
/// Magic + eight `u32` fields.
const DUMP_HEADER: usize = 8 + 8 * 4;
/// Highest layer a point may get (as hnsw_rs: 16 layers).
const MAX_LEVEL: u8 = 15;

/// The graph. See the [module docs](self).
pub struct FlatGraph {
    dim: usize,
    m: usize,
    m0: usize,
    ef_construction: usize,
    levels: Vec<u8>,
    links0: Vec<AtomicU32>,
    upper_start: Vec<u32>,
    upper: Vec<AtomicU32>,
    locks: Vec<Mutex<()>>,
    /// `(entry slot, its level)`; `NONE` while empty.
    entry: RwLock<(u32, u8)>,
    /// Held by an insertion that raises the entry point, for its whole duration (hnswlib).
    top: Mutex<()>,
    /// Points linked so far (slots `0..inserted` may be searched once linked).
    inserted: AtomicU32,
    /// Some level was not drawn from its slot ([`level_for`]): a compacted graph renumbers its
    /// points, so its dumps store the levels (format 2).
    stored_levels: bool,
}

/// A level for `slot`: `floor(-ln(U) / ln(M))` with `U` from a hash of the slot (deterministic,
/// so a rebuild draws the same levels).
fn level_for(slot: u32, m: usize) -> u8 {
    let mut x = u64::from(slot).wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^= x >> 31;
    let u = ((x >> 11) as f64 + 0.5) / (1u64 << 53) as f64;
    let l = (-u.ln() / (m as f64).ln()).floor();
    l.min(f64::from(MAX_LEVEL)) as u8
}

thread_local! {
    /// Visited marks (epoch per slot) reused by this thread's searches.
    static VISITED: RefCell<(u32, Vec<u32>)> = const { RefCell::new((0, Vec::new())) };
}

/// Runs `f` with an empty visited set for `n` slots.
fn with_visited<R>(n: usize, f: impl FnOnce(&mut dyn FnMut(u32) -> bool) -> R) -> R {
    VISITED.with(|cell| match cell.try_borrow_mut() {
        Ok(mut v) => {
            let (epoch, marks) = &mut *v;
            if marks.len() < n {
                marks.resize(n, 0);
            }
            *epoch = epoch.wrapping_add(1);
            if *epoch == 0 {
                marks.iter_mut().for_each(|m| *m = 0);
                *epoch = 1;
            }
            let e = *epoch;
            f(&mut |slot| {
                let m = &mut marks[slot as usize];
                let fresh = *m != e;
                *m = e;
                fresh
            })
        }
        // A nested search on this thread (e.g. from a filter callback): a set of its own.
        Err(_) => {
            let mut marks = vec![false; n];
            f(&mut |slot| !std::mem::replace(&mut marks[slot as usize], true))
        }
    })
}

impl FlatGraph {
    /// An empty graph for `dim`-long rows, `m` links per upper-layer list (`2·m` on layer 0).
    pub fn new(dim: usize, m: usize, ef_construction: usize) -> Self {
        let m = m.max(2);
        Self {
            dim,
            m,
            m0: 2 * m,
            ef_construction: ef_construction.max(m),
            levels: Vec::new(),
            links0: Vec::new(),
            upper_start: Vec::new(),
            upper: Vec::new(),
            locks: Vec::new(),
            entry: RwLock::new((NONE, 0)),
            top: Mutex::new(()),
            inserted: AtomicU32::new(0),
            stored_levels: false,
        }
    }

    /// Makes room for slots `0..n` (their levels are drawn here).
    pub fn reserve(&mut self, n: usize) {
        let old = self.levels.len();
        if n <= old {
            return;
        }
        let m = self.m;
        self.push_levels((old..n).map(|slot| level_for(slot as u32, m)));
    }

    /// Appends points with the given levels (each `<= MAX_LEVEL`), unlinked.
    fn push_levels(&mut self, levels: impl ExactSizeIterator<Item = u8>) {
        let count = levels.len();
        self.links0
            .extend((0..count * (1 + self.m0)).map(|_| AtomicU32::new(0)));
        self.locks.extend((0..count).map(|_| Mutex::new(())));
        for level in levels {
            self.levels.push(level);
            if level == 0 {
                self.upper_start.push(NONE);
            } else {
                self.upper_start.push(self.upper.len() as u32);
                let len = usize::from(level) * (1 + self.m);
                self.upper.extend((0..len).map(|_| AtomicU32::new(0)));
            }
        }
    }

    /// Points linked into the graph.
    pub fn len(&self) -> usize {
        self.inserted.load(Relaxed) as usize
    }

    /// Whether no point is linked.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Heap bytes of the graph's own arrays (capacity-based; rows are the index's).
    pub fn memory_bytes(&self) -> usize {
        self.levels.capacity()
            + 4 * (self.links0.capacity() + self.upper_start.capacity() + self.upper.capacity())
            + std::mem::size_of::<Mutex<()>>() * self.locks.capacity()
    }

    fn list(&self, slot: u32, layer: u8) -> &[AtomicU32] {
        let s = slot as usize;
        if layer == 0 {
            let w = 1 + self.m0;
            &self.links0[s * w..(s + 1) * w]
        } else {
            let w = 1 + self.m;
            let start = self.upper_start[s] as usize + (usize::from(layer) - 1) * w;
            &self.upper[start..start + w]
        }
    }

    fn max_links(&self, layer: u8) -> usize {
        if layer == 0 { self.m0 } else { self.m }
    }

    /// Copies the links of `slot` on `layer` into `out` under the point's lock.
    fn read_links(&self, slot: u32, layer: u8, out: &mut Vec<u32>) {
        out.clear();
        let list = self.list(slot, layer);
        let _g = self.locks[slot as usize].lock();
        let n = list[0].load(Relaxed) as usize;
        out.extend(list[1..=n].iter().map(|a| a.load(Relaxed)));
    }

    /// Copies the links of `slot` on `layer` into `out` without the point's lock (queries). The
    /// words are atomics, so a read beside a writer is defined: it may mix the old and the new
    /// list (every word is a reserved slot, and the count is clamped to the list's capacity),
    /// which a search tolerates as it tolerates a point linked a moment later.
    fn read_links_unlocked(&self, slot: u32, layer: u8, out: &mut Vec<u32>) {
        out.clear();
        let list = self.list(slot, layer);
        let n = (list[0].load(Relaxed) as usize).min(list.len() - 1);
        out.extend(list[1..=n].iter().map(|a| a.load(Relaxed)));
    }

    /// [`read_links_unlocked`](Self::read_links_unlocked) for a `query`, else
    /// [`read_links`](Self::read_links).
    fn links_for(&self, slot: u32, layer: u8, query: bool, out: &mut Vec<u32>) {
        if query {
            self.read_links_unlocked(slot, layer, out);
        } else {
            self.read_links(slot, layer, out);
        }
    }

    fn write_links(list: &[AtomicU32], links: &[u32]) {
        for (a, &v) in list[1..].iter().zip(links) {
            a.store(v, Relaxed);
        }
        list[0].store(links.len() as u32, Relaxed);
    }

    #[inline]
    fn row<'r>(&self, rows: &'r [i8], slot: u32) -> &'r [i8] {
        let s = slot as usize * self.dim;
        &rows[s..s + self.dim]
    }

    #[inline]
    fn dist(&self, rows: &[i8], q: &[i8], slot: u32) -> i32 {
        -dot_i8(q, self.row(rows, slot))
    }

    /// Greedy walk on `layer` from `(cur, d)` to a local minimum; `query`: read lists without
    /// locks (see [`read_links_unlocked`](Self::read_links_unlocked)).
    fn greedy(
        &self,
        rows: &[i8],
        q: &[i8],
        (mut cur, mut d): (u32, i32),
        layer: u8,
        query: bool,
    ) -> (u32, i32) {
        let mut links = Vec::with_capacity(self.m);
        loop {
            let mut changed = false;
            self.links_for(cur, layer, query, &mut links);
            for &nb in &links {
                prefetch(self.row(rows, nb));
            }
            for &nb in &links {
                let dn = self.dist(rows, q, nb);
                if dn < d {
                    (cur, d) = (nb, dn);
                    changed = true;
                }
            }
            if !changed {
                return (cur, d);
            }
        }
    }

    /// The `ef` nearest points to `q` on `layer` reachable from `start` (ascending by distance),
    /// counting only points `allowed` accepts (all when `None`), at most `max_evals` distance
    /// evaluations. Also returns the evaluations and whether the search ended by its own rule.
    #[allow(clippy::too_many_arguments)]
    fn search_layer(
        &self,
        rows: &[i8],
        q: &[i8],
        start: (u32, i32),
        ef: usize,
        layer: u8,
        allowed: Option<&dyn Fn(u32) -> bool>,
        max_evals: usize,
    ) -> (Vec<(i32, u32)>, usize, bool) {
        let ef = ef.max(1);
        let start = (start.1, start.0); // heaps order by (distance, slot)
        let ok = |s: u32| allowed.is_none_or(|f| f(s));
        // Queries always pass a filter and read lists without locks; inserts pass none and read
        // under the point's lock (their heuristic must see a whole list).
        let query = allowed.is_some();
        with_visited(self.levels.len(), |visit| {
            let mut cands = BinaryHeap::with_capacity(ef * 2);
            let mut results: BinaryHeap<(i32, u32)> = BinaryHeap::with_capacity(ef + 1);
            let mut links = Vec::with_capacity(self.m0);
            let mut evals = 1usize;
            visit(start.1);
            cands.push(Reverse(start));
            if ok(start.1) {
                results.push(start);
            }
            let mut complete = true;
            'outer: while let Some(Reverse((d, c))) = cands.pop() {
                if results.len() >= ef && results.peek().is_some_and(|w| d > w.0) {
                    break;
                }
                self.links_for(c, layer, query, &mut links);
                // The unvisited neighbours first, their rows prefetched together, then the
                // distances: the row loads (the search's main cost once the rows outgrow the
                // cache) overlap instead of following one another.
                links.retain(|&nb| visit(nb));
                for &nb in &links {
                    prefetch(self.row(rows, nb));
                }
                for &nb in &links {
                    if evals >= max_evals {
                        complete = false;
                        break 'outer;
                    }
                    let dn = self.dist(rows, q, nb);
                    evals += 1;
                    if results.len() < ef || results.peek().is_some_and(|w| dn < w.0) {
                        cands.push(Reverse((dn, nb)));
                        if ok(nb) {
                            results.push((dn, nb));
                            if results.len() > ef {
                                results.pop();
                            }
                        }
                    }
                }
            }
            let mut out = results.into_vec();
            out.sort_unstable();
            (out, evals, complete)
        })
    }

    /// hnswlib's `getNeighborsByHeuristic2`: from candidates ascending by distance to the base
    /// point, keep one unless it is nearer to an already kept one than to the base point.
    /// The diversity heuristic's test: candidate `c` at distance `d` from the point is no nearer
    /// to any of `chosen` than to the point.
    fn diverse(
        &self,
        rows: &[i8],
        (d, c): (i32, u32),
        mut chosen: impl Iterator<Item = u32>,
    ) -> bool {
        let rc = self.row(rows, c);
        chosen.all(|k| -dot_i8(rc, self.row(rows, k)) >= d)
    }

    fn select(&self, rows: &[i8], cands: &[(i32, u32)], max: usize) -> Vec<u32> {
        let mut kept: Vec<u32> = Vec::with_capacity(max);
        for &(d, c) in cands {
            if kept.len() >= max {
                break;
            }
            if self.diverse(rows, (d, c), kept.iter().copied()) {
                kept.push(c);
            }
        }
        kept
    }

    /// Links `slots` (each `< reserve`d length, each inserted once) in parallel.
    pub fn insert(&self, rows: &[i8], slots: std::ops::Range<u32>) {
        slots.into_par_iter().for_each(|s| self.insert_one(rows, s));
    }

    fn insert_one(&self, rows: &[i8], slot: u32) {
        let q = self.row(rows, slot);
        let level = self.levels[slot as usize];
        let mut top_guard = None;
        let (mut ep, mut max_level) = *self.entry.read();
        if ep == NONE || level > max_level {
            top_guard = Some(self.top.lock());
            (ep, max_level) = *self.entry.read();
            if ep == NONE {
                *self.entry.write() = (slot, level);
                self.inserted.fetch_add(1, Relaxed);
                return;
            }
        }
        let mut cur = (ep, self.dist(rows, q, ep));
        for layer in (level + 1..=max_level).rev() {
            cur = self.greedy(rows, q, cur, layer, false);
        }
        for layer in (0..=level.min(max_level)).rev() {
            let (mut found, _, _) =
                self.search_layer(rows, q, cur, self.ef_construction, layer, None, usize::MAX);
            // A concurrent insert may already have linked to this point: never link to itself.
            found.retain(|&(_, s)| s != slot);
            let max = self.max_links(layer);
            let chosen = self.select(rows, &found, max);
            {
                let _g = self.locks[slot as usize].lock();
                Self::write_links(self.list(slot, layer), &chosen);
            }
            for &nb in &chosen {
                self.link_back(rows, nb, slot, layer);
            }
            if let Some(&best) = found.first() {
                cur = (best.1, best.0);
            }
        }
        if level > max_level {
            *self.entry.write() = (slot, level);
        }
        drop(top_guard);
        self.inserted.fetch_add(1, Relaxed);
    }

    /// Adds `new` to `nb`'s list on `layer`; an overflowing list is re-selected by the heuristic.
    fn link_back(&self, rows: &[i8], nb: u32, new: u32, layer: u8) {
        let max = self.max_links(layer);
        let list = self.list(nb, layer);
        let _g = self.locks[nb as usize].lock();
        let n = list[0].load(Relaxed) as usize;
        let current: Vec<u32> = list[1..=n].iter().map(|a| a.load(Relaxed)).collect();
        if current.contains(&new) {
            return;
        }
        if n < max {
            list[1 + n].store(new, Relaxed);
            list[0].store(n as u32 + 1, Relaxed);
            return;
        }
        let base = self.row(rows, nb);
        let mut cands: Vec<(i32, u32)> = current
            .iter()
            .chain(std::iter::once(&new))
            .map(|&c| (-dot_i8(base, self.row(rows, c)), c))
            .collect();
        cands.sort_unstable();
        let chosen = self.select(rows, &cands, max);
        Self::write_links(list, &chosen);
    }

    /// The `ef` nearest linked points to `q` (slot, negated dot), nearest first.
    pub fn search(&self, rows: &[i8], q: &[i8], ef: usize) -> Vec<(u32, i32)> {
        self.search_filtered(rows, q, ef, &|_| true, usize::MAX).0
    }

    /// Like [`search`](Self::search), counting only points `allowed` accepts (expanding through
    /// the others), capped at `max_evals` base-layer distance evaluations; also returns the
    /// evaluations and whether the search ended by its own rule.
    pub fn search_filtered(
        &self,
        rows: &[i8],
        q: &[i8],
        ef: usize,
        allowed: &dyn Fn(u32) -> bool,
        max_evals: usize,
    ) -> (Vec<(u32, i32)>, usize, bool) {
        let (ep, max_level) = *self.entry.read();
        if ep == NONE {
            return (Vec::new(), 0, true);
        }
        let mut cur = (ep, self.dist(rows, q, ep));
        for layer in (1..=max_level).rev() {
            cur = self.greedy(rows, q, cur, layer, true);
        }
        let (found, evals, complete) =
            self.search_layer(rows, q, cur, ef, 0, Some(allowed), max_evals);
        let hits = found.into_iter().map(|(d, s)| (s, d)).collect();
        (hits, evals, complete)
    }

    fn dump_version(&self) -> u32 {
        if self.stored_levels {
            DUMP_VERSION_LEVELS
        } else {
            DUMP_VERSION
        }
    }

    /// Whether dumps store the levels (format 2: a compacted graph or one read from such a dump).
    pub fn stores_levels(&self) -> bool {
        self.stored_levels
    }

    /// A copy without the points `keep` refuses, renumbered in slot order (point `i` of the copy
    /// is the `i`-th kept slot; `keep` has one entry per point), every point linked. Lists that
    /// named a dropped point are repaired much as FreshDiskANN consolidates deletes: the kept
    /// links stay, and the dropped ones are replaced by the kept neighbours of the dropped points,
    /// nearest first, those the diversity heuristic accepts first, up to the list's old length
    /// (so degrees and in-links survive). Points keep their levels (so dumps of the copy store them);
    /// the entry point is kept, or else a kept point of the highest level. `rows` are the rows
    /// of the current numbering; the caller copies the kept ones in the same order. Costs the
    /// repaired lists' distance evaluations, not a rebuild: at 1% dropped, about 1 in 5 lists.
    pub fn compacted(&self, rows: &[i8], keep: &[bool]) -> FlatGraph {
        let n = self.levels.len();
        assert_eq!(keep.len(), n, "one keep flag per point");
        let mut remap = vec![NONE; n];
        let mut kept = Vec::new();
        for (old, _) in keep.iter().enumerate().filter(|(_, k)| **k) {
            remap[old] = kept.len() as u32;
            kept.push(old as u32);
        }
        let mut g = FlatGraph::new(self.dim, self.m, self.ef_construction);
        g.push_levels(kept.iter().map(|&o| self.levels[o as usize]));
        g.stored_levels = true;
        kept.par_iter().enumerate().for_each(|(new, &old)| {
            let mut links = Vec::with_capacity(self.m0);
            for layer in 0..=self.levels[old as usize] {
                self.repaired_links(rows, old, layer, keep, &mut links);
                let mapped: Vec<u32> = links.iter().map(|&l| remap[l as usize]).collect();
                Self::write_links(g.list(new as u32, layer), &mapped);
            }
        });
        let (entry, _) = *self.entry.read();
        let new_entry = if entry != NONE && keep[entry as usize] {
            Some(entry)
        } else {
            // Highest level, then lowest slot.
            kept.iter()
                .copied()
                .max_by_key(|&o| (self.levels[o as usize], Reverse(o)))
        };
        if let Some(e) = new_entry {
            *g.entry.write() = (remap[e as usize], self.levels[e as usize]);
        }
        g.inserted.store(kept.len() as u32, Relaxed);
        self.connect_unreachable(&g, rows, &kept);
        g
    }

    /// Links every point of the compacted `g` that layer 0 no longer reaches from the entry (all
    /// its in-links came from dropped points) from its nearest reachable out-neighbour (else the
    /// entry): appended where the list has room, else in place of that list's farthest link;
    /// repeated until every point is reached (a replaced link can strand another point).
    fn connect_unreachable(&self, g: &FlatGraph, rows: &[i8], kept: &[u32]) {
        let n = kept.len();
        let (entry, _) = *g.entry.read();
        if n == 0 || entry == NONE {
            return;
        }
        let dist = |a: u32, b: u32| {
            -dot_i8(
                self.row(rows, kept[a as usize]),
                self.row(rows, kept[b as usize]),
            )
        };
        let mut links = Vec::with_capacity(g.m0);
        for _round in 0..8 {
            let mut seen = vec![false; n];
            let mut stack = Vec::new();
            g.mark_reachable(entry, &mut seen, &mut stack, &mut links);
            if seen.iter().all(|x| *x) {
                return;
            }
            for p in 0..n as u32 {
                if seen[p as usize] {
                    continue;
                }
                g.read_links(p, 0, &mut links);
                let from = links
                    .iter()
                    .copied()
                    .filter(|&t| seen[t as usize])
                    .min_by_key(|&t| (dist(p, t), t))
                    .unwrap_or(entry);
                g.read_links(from, 0, &mut links);
                if links.len() < g.m0 {
                    links.push(p);
                } else if let Some(far) =
                    (0..links.len()).max_by_key(|&i| (dist(from, links[i]), links[i]))
                {
                    links[far] = p;
                }
                Self::write_links(g.list(from, 0), &links);
                g.mark_reachable(p, &mut seen, &mut stack, &mut links);
            }
        }
    }

    /// Marks in `seen` what layer 0 reaches from `from` (depth first; `stack`, `links`: scratch).
    fn mark_reachable(
        &self,
        from: u32,
        seen: &mut [bool],
        stack: &mut Vec<u32>,
        links: &mut Vec<u32>,
    ) {
        stack.clear();
        stack.push(from);
        while let Some(s) = stack.pop() {
            if std::mem::replace(&mut seen[s as usize], true) {
                continue;
            }
            self.read_links(s, 0, links);
            stack.extend(links.iter().copied().filter(|&t| !seen[t as usize]));
        }
    }

    /// The links of `slot` on `layer` with dropped points replaced (see
    /// [`compacted`](Self::compacted)), in the current numbering.
    fn repaired_links(&self, rows: &[i8], slot: u32, layer: u8, keep: &[bool], out: &mut Vec<u32>) {
        self.read_links(slot, layer, out);
        if out.iter().all(|&l| keep[l as usize]) {
            return;
        }
        // The surviving links stay (they keep the kept points' in-links, hence reachability);
        // the dropped ones' own kept neighbours are the replacements, nearest first: first those
        // the diversity heuristic accepts beside the links already there, then the nearest of
        // the rest, up to the list's old length.
        let target = out.len().min(self.max_links(layer));
        let mut theirs = Vec::with_capacity(self.m0);
        let mut cands: Vec<u32> = Vec::with_capacity(2 * self.m0);
        for &l in out.iter().filter(|&&l| !keep[l as usize]) {
            self.read_links(l, layer, &mut theirs);
            cands.extend(
                theirs
                    .iter()
                    .copied()
                    .filter(|&t| t != slot && keep[t as usize]),
            );
        }
        out.retain(|&l| keep[l as usize]);
        cands.sort_unstable();
        cands.dedup();
        cands.retain(|c| !out.contains(c));
        let q = self.row(rows, slot);
        let mut scored: Vec<(i32, u32)> = cands
            .into_iter()
            .map(|c| (self.dist(rows, q, c), c))
            .collect();
        scored.sort_unstable();
        let mut rest = Vec::new();
        for &(d, c) in &scored {
            if out.len() >= target {
                break;
            }
            if self.diverse(rows, (d, c), out.iter().copied()) {
                out.push(c);
            } else {
                rest.push(c);
            }
        }
        let room = target.saturating_sub(out.len());
        out.extend(rest.into_iter().take(room));
    }

    /// Writes the graph (all reserved slots must be linked) in its little-endian dump format:
    /// magic, version, dim, M, ef_construction, points, entry slot and level, the upper-list
    /// array's length, [format 2: the levels, a byte each, padded to four], then the layer-0
    /// lists, the upper-list offsets and the upper lists. Format 1 (written unless the graph was
    /// compacted, so older binaries read it) stores no levels: they follow from the slot
    /// ([`level_for`]).
    pub fn write_to(&self, w: &mut impl std::io::Write) -> std::io::Result<()> {
        let (entry, entry_level) = *self.entry.read();
        let n = self.levels.len() as u32;
        let mut head = Vec::with_capacity(DUMP_HEADER);
        head.extend_from_slice(DUMP_MAGIC);
        for v in [
            self.dump_version(),
            self.dim as u32,
            self.m as u32,
            self.ef_construction as u32,
            n,
            entry,
            u32::from(entry_level),
            self.upper.len() as u32,
        ] {
            head.extend_from_slice(&v.to_le_bytes());
        }
        w.write_all(&head)?;
        if self.stored_levels {
            let mut levels = self.levels.clone();
            levels.resize(self.levels.len().next_multiple_of(4), 0);
            w.write_all(&levels)?;
        }
        let mut buf = Vec::with_capacity(1 << 16);
        let words = self
            .links0
            .iter()
            .map(|a| a.load(Relaxed))
            .chain(self.upper_start.iter().copied())
            .chain(self.upper.iter().map(|a| a.load(Relaxed)));
        for v in words {
            buf.extend_from_slice(&v.to_le_bytes());
            if buf.len() >= 1 << 16 {
                w.write_all(&buf)?;
                buf.clear();
            }
        }
        w.write_all(&buf)
    }

    /// Reads a dump written by [`write_to`](Self::write_to) for `dim`-long rows, checking every
    /// field (lengths, counts, slots, layers, offsets, entry point); never panics on bad bytes.
    pub fn read_from(bytes: &[u8], dim: usize) -> Result<Self, String> {
        let mut words = bytes.get(8..).unwrap_or_default().chunks_exact(4);
        if bytes.get(..8) != Some(&DUMP_MAGIC[..]) || !(bytes.len() - 8).is_multiple_of(4) {
            return Err("not a flat graph dump".into());
        }
        let mut next = || {
            words
                .next()
                .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .ok_or_else(|| "truncated".to_string())
        };
        let [version, d, m, efc, n, entry, entry_level, upper_len] = [(); 8].map(|()| next());
        let stored_levels = match version? {
            DUMP_VERSION => false,
            DUMP_VERSION_LEVELS => true,
            _ => return Err("unknown dump version".into()),
        };
        let (d, m, efc, n) = (d? as usize, m? as usize, efc? as usize, n? as usize);
        let (entry, entry_level, upper_len) = (entry?, entry_level?, upper_len? as usize);
        if d != dim || !(2..=256).contains(&m) || efc < m {
            return Err(format!("dim {d}, M {m}, ef_construction {efc}"));
        }
        let mut g = FlatGraph::new(dim, m, efc);
        let w0 = 1 + g.m0;
        let level_bytes = if stored_levels {
            n.next_multiple_of(4)
        } else {
            0
        };
        let want = n
            .checked_mul(w0 + 1)
            .and_then(|x| x.checked_add(upper_len))
            .and_then(|x| x.checked_mul(4))
            .and_then(|x| x.checked_add(DUMP_HEADER + level_bytes));
        if Some(bytes.len()) != want {
            return Err(format!("{} bytes, {want:?} expected", bytes.len()));
        }
        if stored_levels {
            let levels = &bytes[DUMP_HEADER..DUMP_HEADER + n];
            if let Some(l) = levels.iter().find(|&&l| l > MAX_LEVEL) {
                return Err(format!("level {l} above {MAX_LEVEL}"));
            }
            if bytes[DUMP_HEADER + n..DUMP_HEADER + level_bytes] != [0, 0, 0][..level_bytes - n] {
                return Err("level padding is not zero".into());
            }
            g.push_levels(levels.iter().copied());
            g.stored_levels = true;
            for _ in 0..level_bytes / 4 {
                next()?;
            }
        } else {
            g.reserve(n);
        }
        if g.upper.len() != upper_len {
            return Err("upper lists do not match the levels".into());
        }
        for a in g.links0.iter() {
            a.store(next()?, Relaxed);
        }
        for s in 0..n {
            if next()? != g.upper_start[s] {
                return Err(format!("slot {s}: upper offset"));
            }
        }
        for a in g.upper.iter() {
            a.store(next()?, Relaxed);
        }
        g.check()?;
        let top = g.levels.iter().copied().max();
        match top {
            None if entry == NONE => {}
            Some(l)
                if (entry as usize) < n
                    && g.levels[entry as usize] == l
                    && entry_level == u32::from(l) =>
            {
                *g.entry.write() = (entry, l);
            }
            _ => return Err(format!("entry point {entry} at level {entry_level}")),
        }
        g.inserted.store(n as u32, Relaxed);
        Ok(g)
    }

    /// Checks the structure: counts within bounds, links to reserved slots on their own layers.
    pub fn check(&self) -> Result<(), String> {
        let n = self.levels.len() as u32;
        for slot in 0..n {
            for layer in 0..=self.levels[slot as usize] {
                let list = self.list(slot, layer);
                let c = list[0].load(Relaxed) as usize;
                if c > self.max_links(layer) {
                    return Err(format!("slot {slot} layer {layer}: {c} links"));
                }
                for a in &list[1..=c] {
                    let t = a.load(Relaxed);
                    if t >= n || self.levels[t as usize] < layer || t == slot {
                        return Err(format!("slot {slot} layer {layer}: bad link {t}"));
                    }
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::vector::Quantizer;
    use crate::vector::synth;

    fn data(n: usize, dim: usize, seed: u64) -> (Vec<i8>, Vec<Vec<i8>>) {
        let v = synth::clustered(n, dim, n / 40, 0.9, seed);
        let q = Quantizer::calibrate(v.iter().map(Vec::as_slice)).unwrap();
        let rows: Vec<i8> = v.iter().flat_map(|x| q.quantize(x)).collect();
        let queries = synth::noisy_copies(&v[..100], 100, 0.05, seed + 1)
            .iter()
            .map(|x| q.quantize(x))
            .collect();
        (rows, queries)
    }

    fn brute(rows: &[i8], dim: usize, q: &[i8], k: usize, ok: &dyn Fn(u32) -> bool) -> Vec<u32> {
        let mut all: Vec<(i32, u32)> = rows
            .chunks(dim)
            .enumerate()
            .filter(|(i, _)| ok(*i as u32))
            .map(|(i, r)| (-dot_i8(q, r), i as u32))
            .collect();
        all.sort_unstable();
        all.into_iter().take(k).map(|x| x.1).collect()
    }

    fn build(rows: &[i8], dim: usize, serial: bool) -> FlatGraph {
        let n = rows.len() / dim;
        let mut g = FlatGraph::new(dim, 12, 64);
        g.reserve(n);
        if serial {
            for s in 0..n as u32 {
                g.insert_one(rows, s);
            }
        } else {
            g.insert(rows, 0..n as u32);
        }
        g
    }

    fn recall(
        g: &FlatGraph,
        rows: &[i8],
        dim: usize,
        qs: &[Vec<i8>],
        ef: usize,
        ok: &dyn Fn(u32) -> bool,
    ) -> f64 {
        let mut hits = 0;
        for q in qs {
            let (got, _, complete) = g.search_filtered(rows, q, ef, ok, usize::MAX);
            assert!(complete);
            assert!(got.iter().all(|h| ok(h.0)), "a refused point returned");
            assert!(got.windows(2).all(|w| w[0].1 <= w[1].1));
            let truth = brute(rows, dim, q, 10, ok);
            hits += got.iter().take(10).filter(|h| truth.contains(&h.0)).count();
        }
        hits as f64 / (10 * qs.len()) as f64
    }

    #[test]
    fn serial_and_parallel_builds_find_the_true_neighbours() {
        let dim = 48;
        let (rows, qs) = data(3000, dim, 1);
        for serial in [true, false] {
            let g = build(&rows, dim, serial);
            assert_eq!(g.len(), 3000);
            g.check().unwrap();
            let r = recall(&g, &rows, dim, &qs, 64, &|_| true);
            assert!(r >= 0.95, "serial {serial}: recall {r}");
        }
    }

    #[test]
    fn filtered_search_counts_only_allowed_points_and_honours_the_cap() {
        let dim = 48;
        let (rows, qs) = data(3000, dim, 2);
        let g = build(&rows, dim, false);
        for m in [2u32, 10] {
            let r = recall(&g, &rows, dim, &qs, 64, &|s| s.is_multiple_of(m));
            assert!(r >= 0.95, "1/{m} allowed: recall {r}");
        }
        let (found, evals, complete) =
            g.search_filtered(&rows, &qs[0], 64, &|s| s.is_multiple_of(500), 100);
        assert!(!complete && evals <= 100);
        assert!(found.iter().all(|h| h.0.is_multiple_of(500)));
        let (all, _, complete) =
            g.search_filtered(&rows, &qs[0], 64, &|s| s.is_multiple_of(500), usize::MAX);
        assert!(complete);
        assert_eq!(all.len(), 6, "every allowed point is reachable");
    }

    #[test]
    fn a_dump_reads_back_identical_and_corruption_is_refused() {
        let dim = 48;
        let (rows, qs) = data(2000, dim, 3);
        let g = build(&rows, dim, false);
        let mut bytes = Vec::new();
        g.write_to(&mut bytes).unwrap();
        let back = FlatGraph::read_from(&bytes, dim).unwrap();
        assert_eq!(back.len(), 2000);
        for q in &qs[..20] {
            assert_eq!(back.search(&rows, q, 50), g.search(&rows, q, 50));
        }
        let mut again = Vec::new();
        back.write_to(&mut again).unwrap();
        assert_eq!(again, bytes);
        assert!(FlatGraph::read_from(&bytes, dim + 1).is_err());
        for cut in [0, 7, 8, 39, 40, bytes.len() - 4] {
            assert!(
                FlatGraph::read_from(&bytes[..cut], dim).is_err(),
                "cut at {cut}"
            );
        }
        // A link to a slot out of range, a count over the limit, a wrong entry point.
        let first_link = 40 + 4;
        for (at, v) in [(first_link, 5000u32), (40, 99), (28, 1)] {
            let mut bad = bytes.clone();
            bad[at..at + 4].copy_from_slice(&v.to_le_bytes());
            assert!(FlatGraph::read_from(&bad, dim).is_err(), "byte {at} = {v}");
        }
        let mut rng = synth::Rng::new(9);
        for _ in 0..200 {
            let mut bad = bytes.clone();
            let i = rng.below(bad.len() as u64) as usize;
            bad[i] ^= 1 << rng.below(8);
            let _ = FlatGraph::read_from(&bad, dim); // must not panic
        }
    }

    /// The kept rows, renumbered in slot order (what the index copies beside a compaction).
    fn kept_rows(rows: &[i8], dim: usize, keep: &[bool]) -> Vec<i8> {
        rows.chunks(dim)
            .zip(keep)
            .filter(|(_, k)| **k)
            .flat_map(|(r, _)| r.iter().copied())
            .collect()
    }

    #[test]
    fn compaction_drops_points_repairs_lists_and_keeps_recall() {
        let dim = 48;
        let (rows, qs) = data(4000, dim, 5);
        let g = build(&rows, dim, false);
        let (entry, _) = *g.entry.read();
        for (name, keep) in [
            // 1% and 10% churn, scattered; a whole cluster's range (correlated deletes); the
            // entry point itself.
            (
                "1%",
                (0..4000u32)
                    .map(|s| !s.is_multiple_of(100))
                    .collect::<Vec<_>>(),
            ),
            ("10%", (0..4000u32).map(|s| !s.is_multiple_of(10)).collect()),
            (
                "range",
                (0..4000u32).map(|s| !(1000..1400).contains(&s)).collect(),
            ),
            ("entry", (0..4000u32).map(|s| s != entry).collect()),
        ] {
            let c = g.compacted(&rows, &keep);
            let kept = keep.iter().filter(|k| **k).count();
            assert_eq!(c.len(), kept, "{name}");
            c.check().unwrap(); // every link is to a kept (renumbered) point on its layer
            let (e, l) = *c.entry.read();
            assert_eq!(
                Some(&l),
                c.levels.iter().max(),
                "{name}: entry at the top level"
            );
            assert_eq!(c.levels[e as usize], l);
            let new_rows = kept_rows(&rows, dim, &keep);
            let r = recall(&c, &new_rows, dim, &qs, 64, &|_| true);
            assert!(r >= 0.95, "{name}: recall {r} after compaction");
            // Inserts continue after a compaction (new slots draw their levels).
            let mut c = c;
            let more = &rows[..100 * dim];
            let mut grown = new_rows.clone();
            grown.extend_from_slice(more);
            c.reserve(kept + 100);
            c.insert(&grown, kept as u32..(kept + 100) as u32);
            c.check().unwrap();
            assert_eq!(c.len(), kept + 100);
        }
        let none = g.compacted(&rows, &[false; 4000]);
        assert!(none.is_empty());
        assert_eq!(none.entry.read().0, NONE);
    }

    fn mean_degree0(g: &FlatGraph) -> f64 {
        let n = g.levels.len();
        (0..n as u32)
            .map(|s| g.list(s, 0)[0].load(Relaxed) as f64)
            .sum::<f64>()
            / n as f64
    }

    #[test]
    fn repair_keeps_lists_full_and_every_point_reachable() {
        // Dropping half the points: repaired lists stay about as full as before and every kept
        // point stays reachable on layer 0. Checked by mutation: merely removing the dropped
        // links halves the degree; without the connectivity pass 5 of 1,500 points are stranded.
        let dim = 48;
        let (rows, qs) = data(3000, dim, 6);
        let g = build(&rows, dim, false);
        let keep: Vec<bool> = (0..3000u32).map(|s| s % 4 != 0 && s % 4 != 1).collect();
        let c = g.compacted(&rows, &keep);
        let (before, after) = (mean_degree0(&g), mean_degree0(&c));
        let mut seen = vec![false; c.len()];
        let mut stack = vec![c.entry.read().0];
        let mut links = Vec::new();
        while let Some(s) = stack.pop() {
            if std::mem::replace(&mut seen[s as usize], true) {
                continue;
            }
            c.read_links(s, 0, &mut links);
            stack.extend(links.iter().copied());
        }
        assert!(seen.iter().all(|x| *x), "a kept point is unreachable");
        assert!(
            after >= 0.95 * before,
            "mean degree {before:.1} -> {after:.1}"
        );
        let new_rows = kept_rows(&rows, dim, &keep);
        let r = recall(&c, &new_rows, dim, &qs, 64, &|_| true);
        assert!(r >= 0.95, "recall {r}");
    }

    #[test]
    fn a_compacted_graph_dumps_its_levels_and_reads_back_identical() {
        let dim = 48;
        let (rows, qs) = data(2000, dim, 7);
        let g = build(&rows, dim, false);
        assert!(!g.stores_levels());
        let mut v1 = Vec::new();
        g.write_to(&mut v1).unwrap();
        assert_eq!(
            v1[8..12],
            DUMP_VERSION.to_le_bytes(),
            "uncompacted: format 1"
        );
        let keep: Vec<bool> = (0..2000u32).map(|s| !s.is_multiple_of(7)).collect();
        let c = g.compacted(&rows, &keep);
        assert!(c.stores_levels());
        // The renumbered points keep their own levels, which no longer follow from the slots.
        assert!((0..c.levels.len()).any(|s| c.levels[s] != level_for(s as u32, c.m)));
        let mut bytes = Vec::new();
        c.write_to(&mut bytes).unwrap();
        assert_eq!(bytes[8..12], DUMP_VERSION_LEVELS.to_le_bytes());
        let back = FlatGraph::read_from(&bytes, dim).unwrap();
        assert!(back.stores_levels());
        assert_eq!(back.levels, c.levels);
        let new_rows = kept_rows(&rows, dim, &keep);
        for q in &qs[..20] {
            assert_eq!(back.search(&new_rows, q, 50), c.search(&new_rows, q, 50));
        }
        let mut again = Vec::new();
        back.write_to(&mut again).unwrap();
        assert_eq!(again, bytes);
        for cut in [40, 41, 44, bytes.len() - 4] {
            assert!(
                FlatGraph::read_from(&bytes[..cut], dim).is_err(),
                "cut {cut}"
            );
        }
        let mut bad = bytes.clone();
        bad[DUMP_HEADER] = MAX_LEVEL + 1;
        assert!(
            FlatGraph::read_from(&bad, dim).is_err(),
            "level out of range"
        );
        let mut bad = bytes.clone();
        bad[DUMP_HEADER] ^= 1; // a level that disagrees with the upper lists
        assert!(FlatGraph::read_from(&bad, dim).is_err(), "level flipped");
    }

    #[test]
    fn levels_are_deterministic_and_geometric() {
        let l: Vec<u8> = (0..100_000).map(|s| level_for(s, 16)).collect();
        assert_eq!(
            l,
            (0..100_000).map(|s| level_for(s, 16)).collect::<Vec<_>>()
        );
        let above = l.iter().filter(|&&x| x > 0).count() as f64 / 1e5;
        assert!((above - 1.0 / 16.0).abs() < 0.01, "{above}");
    }

    #[test]
    fn the_heuristic_keeps_a_long_link_past_near_duplicates() {
        // Base at (100, 5); three near-duplicates at (100, 10 + i) and one point on the other
        // side at (100, -40), the farthest: plain distance order keeps two duplicates, the
        // heuristic keeps the nearest duplicate and the far side.
        let dim = 2;
        let rows: Vec<i8> = vec![100, 5, 100, 10, 100, 11, 100, 12, 100, -40];
        let g = FlatGraph::new(dim, 2, 8);
        let base = &rows[0..2];
        let mut cands: Vec<(i32, u32)> = (1..5u32)
            .map(|c| (-dot_i8(base, &rows[c as usize * 2..c as usize * 2 + 2]), c))
            .collect();
        cands.sort_unstable();
        let kept = g.select(&rows, &cands, 2);
        assert_eq!(kept, vec![3, 4]);
    }
}
