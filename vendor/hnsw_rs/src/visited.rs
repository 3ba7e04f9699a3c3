//! Airlock fork: the visited set of a layer search, a reusable epoch array per thread instead
//! of a fresh `HashMap<PointId, Arc<Point>>` per search (AIRLOCK.md, change (d)).
//!
//! A point is visited in the current search when its mark equals the current epoch; starting a
//! search bumps the epoch, so nothing is cleared between searches (all marks are reset only
//! when the epoch counter wraps). Marks are indexed by the point's `PointId`: its layer and its
//! rank in that layer, dense within each layer (also after a reload, which keeps `PointId`s).

use std::cell::Cell;

use crate::hnsw::{NB_LAYER_MAX, PointId};

/// Marks per layer and the current epoch.
pub(crate) struct VisitedSet {
    epoch: u32,
    marks: Vec<Vec<u32>>,
}

thread_local! {
    /// The set this thread's searches reuse; taken out for the length of one search.
    static CACHED: Cell<Option<Box<VisitedSet>>> = const { Cell::new(None) };
}

impl VisitedSet {
    fn new() -> Self {
        VisitedSet {
            epoch: 0,
            marks: (0..NB_LAYER_MAX).map(|_| Vec::new()).collect(),
        }
    }

    /// Starts a search: this thread's set (or a new one if it is in use, e.g. a filter that
    /// searches from its callback), emptied.
    pub(crate) fn start() -> VisitedGuard {
        let mut set = CACHED
            .with(Cell::take)
            .unwrap_or_else(|| Box::new(VisitedSet::new()));
        set.next_epoch();
        VisitedGuard { set: Some(set) }
    }

    fn next_epoch(&mut self) {
        self.epoch = self.epoch.wrapping_add(1);
        if self.epoch == 0 {
            for m in &mut self.marks {
                m.fill(0);
            }
            self.epoch = 1;
        }
    }

    /// Marks `p` visited; true if it was not visited yet in this search.
    #[inline]
    pub(crate) fn insert(&mut self, p: PointId) -> bool {
        let marks = &mut self.marks[p.0 as usize];
        let rank = p.1 as usize;
        if rank >= marks.len() {
            let len = (rank + 1).max(marks.len() * 2).max(1024);
            marks.resize(len, 0);
        }
        let fresh = marks[rank] != self.epoch;
        marks[rank] = self.epoch;
        fresh
    }
}

/// A search's visited set; gives it back to the thread when dropped.
pub(crate) struct VisitedGuard {
    set: Option<Box<VisitedSet>>,
}

impl std::ops::Deref for VisitedGuard {
    type Target = VisitedSet;
    fn deref(&self) -> &VisitedSet {
        self.set.as_ref().expect("visited set present until drop")
    }
}

impl std::ops::DerefMut for VisitedGuard {
    fn deref_mut(&mut self) -> &mut VisitedSet {
        self.set.as_mut().expect("visited set present until drop")
    }
}

impl Drop for VisitedGuard {
    fn drop(&mut self) {
        if let Some(set) = self.set.take() {
            // ignores a failure to give it back when the thread is exiting
            let _ = CACHED.try_with(|c| {
                let previous = c.replace(Some(set));
                drop(previous);
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn marks_once_per_search_and_forgets_between_searches() {
        let mut v = VisitedSet::start();
        assert!(v.insert(PointId(0, 5)));
        assert!(!v.insert(PointId(0, 5)));
        assert!(v.insert(PointId(1, 5)), "layers are separate");
        assert!(v.insert(PointId(0, 100_000)), "grows on demand");
        assert!(!v.insert(PointId(0, 100_000)));
        drop(v);
        let mut v = VisitedSet::start();
        assert!(v.insert(PointId(0, 5)), "a new search starts empty");
        // a nested search on the same thread gets its own set
        let mut inner = VisitedSet::start();
        assert!(inner.insert(PointId(0, 5)));
        assert!(!v.insert(PointId(0, 5)));
    }

    #[test]
    fn epoch_wrap_clears_the_marks() {
        let mut v = VisitedSet::new();
        v.next_epoch();
        assert!(v.insert(PointId(2, 3)));
        v.epoch = u32::MAX;
        assert!(v.insert(PointId(2, 4)));
        v.next_epoch(); // wraps: every mark reset, epoch 1
        assert_eq!(v.epoch, 1);
        assert!(
            v.insert(PointId(2, 3)),
            "a mark from before the wrap must not count"
        );
        assert!(v.insert(PointId(2, 4)));
    }
}
