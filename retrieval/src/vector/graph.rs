//! The HNSW graph over int8 vectors (hnsw_rs), its dump and reload.
//!
//! hnsw_rs quirks handled here: a reloaded `Hnsw` borrows the `HnswIo` that loaded it, so the
//! loader is leaked (a few hundred bytes per [`Graph::load`], no file handles or mmaps: reload
//! runs without hnsw_rs's data mmap); dump/reload report some failures by panicking, so they run
//! under `catch_unwind`; reload switches `extend_candidates` on, which we switch back off so that
//! inserts after a reload build the graph the same way as before.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::{Path, PathBuf};

use hnsw_rs::api::AnnT;
use hnsw_rs::hnsw::Hnsw;
use hnsw_rs::hnswio::HnswIo;

use super::VectorError;
use super::quant::DistI8Dot;

/// hnsw_rs's layer cap (it clamps to 16 layers).
const MAX_LAYERS: usize = 16;

/// An HNSW graph whose data ids are row slots.
pub(crate) struct Graph {
    hnsw: Hnsw<'static, i8, DistI8Dot>,
}

fn panic_text(p: Box<dyn std::any::Any + Send>) -> String {
    p.downcast_ref::<String>()
        .cloned()
        .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_else(|| "panic".into())
}

impl Graph {
    /// An empty graph.
    pub fn new(m: usize, ef_construction: usize, capacity_hint: usize) -> Self {
        let hnsw = Hnsw::new(
            m,
            capacity_hint.max(1024),
            MAX_LAYERS,
            ef_construction,
            DistI8Dot,
        );
        Self { hnsw }
    }

    /// Reloads the dump `dir/basename.hnsw.{graph,data}`.
    pub fn load(dir: &Path, basename: &str) -> Result<Self, VectorError> {
        let io: &'static mut HnswIo = Box::leak(Box::new(HnswIo::new(dir, basename)));
        let loaded = catch_unwind(AssertUnwindSafe(move || {
            let io = io; // moved: the closure is FnOnce, so the loaded graph may borrow `io` for 'static
            io.load_hnsw::<i8, DistI8Dot>()
        }));
        let mut hnsw = match loaded {
            Ok(Ok(h)) => h,
            Ok(Err(e)) => {
                return Err(VectorError::Graph {
                    path: dir.join(basename),
                    detail: format!("reload: {e}"),
                });
            }
            Err(p) => {
                return Err(VectorError::Graph {
                    path: dir.join(basename),
                    detail: format!("reload: {}", panic_text(p)),
                });
            }
        };
        hnsw.set_extend_candidates(false);
        Ok(Self { hnsw })
    }

    /// Dumps to `dir/<basename or a unique variant>.hnsw.{graph,data}`; returns the basename used.
    pub fn dump(&self, dir: &Path, basename: &str) -> Result<String, VectorError> {
        match catch_unwind(AssertUnwindSafe(|| self.hnsw.file_dump(dir, basename))) {
            Ok(Ok(name)) => Ok(name),
            Ok(Err(e)) => Err(VectorError::Graph {
                path: dir.join(basename),
                detail: format!("dump: {e}"),
            }),
            Err(p) => Err(VectorError::Graph {
                path: dir.join(basename),
                detail: format!("dump: {}", panic_text(p)),
            }),
        }
    }

    /// The two files of a dump.
    pub fn dump_files(dir: &Path, basename: &str) -> [PathBuf; 2] {
        [
            dir.join(format!("{basename}.hnsw.graph")),
            dir.join(format!("{basename}.hnsw.data")),
        ]
    }

    /// Inserts rows (int8 vector, slot) in parallel (rayon).
    pub fn insert(&self, rows: &[(&[i8], usize)]) {
        if rows.len() < 64 {
            for &(v, slot) in rows {
                self.hnsw.insert_slice((v, slot));
            }
        } else {
            self.hnsw.parallel_insert_slice(&rows.to_vec());
        }
    }

    /// Up to `ef` nearest slots that `allowed` accepts, nearest first, by hnswlib's filtered
    /// traversal (the fork's `search_filter_capped`: expands through refused points, counts
    /// only accepted ones). Also returns the distance evaluations made and whether the search
    /// ended by its own rule (`false`: `max_evals` cut it short).
    pub fn search_filtered(
        &self,
        query: &[i8],
        ef: usize,
        allowed: &dyn Fn(usize) -> bool,
        max_evals: usize,
    ) -> (Vec<(usize, f32)>, usize, bool) {
        let filter = |slot: &usize| allowed(*slot);
        let (found, evals, complete) = self
            .hnsw
            .search_filter_capped(query, ef, ef, &filter, max_evals);
        let found = found.into_iter().map(|n| (n.d_id, n.distance)).collect();
        (found, evals, complete)
    }

    /// Points in the graph.
    pub fn len(&self) -> usize {
        self.hnsw.get_nb_point()
    }
}
