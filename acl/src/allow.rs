//! The `AllowSet`: an immutable snapshot of the documents one user may read.

use std::sync::Arc;

use roaring::RoaringBitmap;

/// The documents (by ordinal) one user may read, as materialised at one point in time.
///
/// Cheap to clone (an `Arc`). Only `airlock-acl` can construct one, so every search signature
/// that takes `&AllowSet` is access-controlled by construction.
#[derive(Clone, Debug)]
pub struct AllowSet {
    bits: Arc<RoaringBitmap>,
}

impl AllowSet {
    /// Wraps a materialised bitmap. Crate-private: callers get sets from the ACL state.
    pub(crate) fn from_arc(bits: Arc<RoaringBitmap>) -> Self {
        Self { bits }
    }

    /// The empty set: readable by nobody (deny by default).
    pub fn empty() -> Self {
        Self::from_arc(Arc::new(RoaringBitmap::new()))
    }

    /// Builds a set from an explicit bitmap. Only for tests of other crates (`testing` feature).
    #[cfg(any(test, feature = "testing"))]
    pub fn from_bitmap_for_tests(bits: RoaringBitmap) -> Self {
        Self::from_arc(Arc::new(bits))
    }

    /// The readable document ordinals.
    pub fn bitmap(&self) -> &RoaringBitmap {
        &self.bits
    }

    /// Whether the document with this ordinal is readable.
    pub fn contains(&self, doc_ordinal: u32) -> bool {
        self.bits.contains(doc_ordinal)
    }

    /// Number of readable documents.
    pub fn len(&self) -> u64 {
        self.bits.len()
    }

    /// Whether nothing is readable.
    pub fn is_empty(&self) -> bool {
        self.bits.is_empty()
    }
}
