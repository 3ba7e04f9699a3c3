//! A growable vector in fixed-size segments behind `Arc`s, for state that is copied on every
//! write while readers keep using the previous copy (the search snapshot's [`ChunkMap`]):
//! cloning copies one pointer per segment, and a write copies only the segment it touches, and
//! only while an older copy still shares it. At 1M chunks a clone is 62 pointers instead of
//! 4 MB, and a write batch copies the one or two segments it appends to.
//!
//! [`ChunkMap`]: crate::visibility::ChunkMap

use std::sync::Arc;

/// log2 of the entries per segment (16,384: 64 KiB of `u32`).
const SEG_BITS: usize = 14;
const SEG_LEN: usize = 1 << SEG_BITS;
const SEG_MASK: usize = SEG_LEN - 1;

/// See the module documentation. Grows only (there is no removal of entries).
#[derive(Debug, Clone)]
pub(crate) struct CowVec<T> {
    /// Every segment but the last holds exactly `SEG_LEN` entries.
    segs: Vec<Arc<Vec<T>>>,
    len: usize,
}

impl<T> Default for CowVec<T> {
    fn default() -> Self {
        Self {
            segs: Vec::new(),
            len: 0,
        }
    }
}

impl<T: Clone> CowVec<T> {
    /// Number of entries.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Entry `i`, if `i < len`.
    #[inline]
    pub(crate) fn get(&self, i: usize) -> Option<&T> {
        if i >= self.len {
            return None;
        }
        self.segs[i >> SEG_BITS].get(i & SEG_MASK)
    }

    /// Entry `i` for writing, if `i < len`; copies its segment first if another clone shares it.
    pub(crate) fn get_mut(&mut self, i: usize) -> Option<&mut T> {
        if i >= self.len {
            return None;
        }
        Arc::make_mut(&mut self.segs[i >> SEG_BITS]).get_mut(i & SEG_MASK)
    }

    /// Grows to `new_len` entries, the new ones `fill`; never shrinks.
    pub(crate) fn grow(&mut self, new_len: usize, fill: T) {
        while self.len < new_len {
            let s = self.len >> SEG_BITS;
            if s == self.segs.len() {
                self.segs.push(Arc::new(Vec::new()));
            }
            let seg = Arc::make_mut(&mut self.segs[s]);
            let take = (SEG_LEN - seg.len()).min(new_len - self.len);
            seg.resize(seg.len() + take, fill.clone());
            self.len += take;
        }
    }

    /// Whether segment `s` of `self` and `other` is the same allocation (tests).
    #[cfg(test)]
    fn shares_segment(&self, other: &Self, s: usize) -> bool {
        Arc::ptr_eq(&self.segs[s], &other.segs[s])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grows_across_segments_and_reads_back() {
        let mut v = CowVec::default();
        assert_eq!((v.len(), v.get(0)), (0, None));
        v.grow(3, 7u32);
        v.grow(2, 9); // never shrinks, never overwrites
        assert_eq!(v.len(), 3);
        v.grow(2 * SEG_LEN + 5, 1);
        assert_eq!(v.len(), 2 * SEG_LEN + 5);
        assert_eq!(v.segs.len(), 3);
        assert_eq!(v.get(2), Some(&7));
        assert_eq!(v.get(3), Some(&1));
        assert_eq!(v.get(2 * SEG_LEN + 4), Some(&1));
        assert_eq!(v.get(2 * SEG_LEN + 5), None);
        *v.get_mut(SEG_LEN).unwrap() = 42;
        assert_eq!(v.get(SEG_LEN), Some(&42));
        assert_eq!(v.get(SEG_LEN - 1), Some(&1));
        assert!(v.get_mut(2 * SEG_LEN + 5).is_none());
    }

    #[test]
    fn a_clone_shares_untouched_segments_and_never_sees_later_writes() {
        let mut a = CowVec::default();
        a.grow(3 * SEG_LEN, 0u32);
        for i in 0..a.len() {
            *a.get_mut(i).unwrap() = i as u32;
        }
        let before = a.clone();
        *a.get_mut(SEG_LEN + 3).unwrap() = 99;
        a.grow(3 * SEG_LEN + 10, 5);
        assert!(a.shares_segment(&before, 0), "untouched segment copied");
        assert!(
            !a.shares_segment(&before, 1),
            "written segment still shared"
        );
        assert!(
            a.shares_segment(&before, 2),
            "full segment copied by a grow"
        );
        assert_eq!(before.get(SEG_LEN + 3), Some(&(SEG_LEN as u32 + 3)));
        assert_eq!(before.len(), 3 * SEG_LEN);
        assert_eq!(before.get(3 * SEG_LEN), None);
        assert_eq!(a.get(SEG_LEN + 3), Some(&99));
        assert_eq!(a.get(3 * SEG_LEN + 9), Some(&5));
        // A write to the copy's own (unshared) segment does not copy it again.
        let p = Arc::as_ptr(&a.segs[1]);
        *a.get_mut(SEG_LEN + 4).unwrap() = 100;
        assert_eq!(Arc::as_ptr(&a.segs[1]), p);
    }
}
