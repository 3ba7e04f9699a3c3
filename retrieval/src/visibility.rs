//! Which chunks a search may return: chunk → document map, the caller's `AllowSet`, and the
//! dead-chunk bitmap (tombstoned documents and superseded chunk versions).
//!
//! Shared by the BM25 collector and the vector index so both paths apply the same rule.

use airlock_acl::AllowSet;
use roaring::RoaringBitmap;

/// Sentinel in [`ChunkMap`] for a chunk id with no (live) document.
const NO_DOC: u32 = u32::MAX;

/// Dense chunk id → document ordinal, and document ordinal → its current chunk ids.
#[derive(Debug, Default, Clone)]
pub struct ChunkMap {
    chunk_doc: Vec<u32>,
    doc_chunks: Vec<Vec<u32>>,
    /// Documents with at least one mapped chunk (for [`Visibility::estimate_visible`]).
    docs: RoaringBitmap,
    /// Number of mapped chunks.
    mapped: u64,
}

impl ChunkMap {
    /// An empty map.
    pub fn new() -> Self {
        Self::default()
    }

    /// Records that `chunk` belongs to `doc`.
    pub fn insert(&mut self, chunk: u32, doc: u32) {
        let c = chunk as usize;
        if self.chunk_doc.len() <= c {
            self.chunk_doc.resize(c + 1, NO_DOC);
        }
        if self.chunk_doc[c] == NO_DOC {
            self.mapped += 1;
        }
        self.chunk_doc[c] = doc;
        self.docs.insert(doc);
        let d = doc as usize;
        if self.doc_chunks.len() <= d {
            self.doc_chunks.resize_with(d + 1, Vec::new);
        }
        let list = &mut self.doc_chunks[d];
        if let Err(pos) = list.binary_search(&chunk) {
            list.insert(pos, chunk);
        }
    }

    /// Forgets all chunks of `doc` (they stay mapped to nothing); returns them.
    pub fn remove_doc(&mut self, doc: u32) -> Vec<u32> {
        let Some(list) = self.doc_chunks.get_mut(doc as usize) else {
            return Vec::new();
        };
        let removed = std::mem::take(list);
        for &c in &removed {
            if self.chunk_doc[c as usize] == doc {
                self.chunk_doc[c as usize] = NO_DOC;
                self.mapped -= 1;
            }
        }
        self.docs.remove(doc);
        removed
    }

    /// The document of `chunk`, if it has a live one.
    pub fn doc_of(&self, chunk: u32) -> Option<u32> {
        match self.chunk_doc.get(chunk as usize) {
            Some(&d) if d != NO_DOC => Some(d),
            _ => None,
        }
    }

    /// The current chunk ids of `doc`, sorted.
    pub fn chunks_of(&self, doc: u32) -> &[u32] {
        self.doc_chunks
            .get(doc as usize)
            .map(Vec::as_slice)
            .unwrap_or(&[])
    }

    /// Number of chunks currently mapped to a document.
    pub fn mapped_chunks(&self) -> u64 {
        self.mapped
    }

    /// Documents that currently have at least one chunk.
    pub fn docs_with_chunks(&self) -> &RoaringBitmap {
        &self.docs
    }

    /// One past the largest chunk id ever inserted.
    pub fn chunk_id_bound(&self) -> u32 {
        self.chunk_doc.len() as u32
    }
}

/// The visibility rule for one search: allowed document, live chunk.
#[derive(Clone, Copy)]
pub struct Visibility<'a> {
    allow: &'a AllowSet,
    map: &'a ChunkMap,
    dead: &'a RoaringBitmap,
}

impl<'a> Visibility<'a> {
    /// Combines the caller's allow set, the chunk map and the dead-chunk bitmap.
    pub fn new(allow: &'a AllowSet, map: &'a ChunkMap, dead: &'a RoaringBitmap) -> Self {
        Self { allow, map, dead }
    }

    /// Whether `chunk` may be returned.
    #[inline]
    pub fn visible(&self, chunk: u32) -> bool {
        !self.dead.contains(chunk)
            && self
                .map
                .doc_of(chunk)
                .is_some_and(|d| self.allow.contains(d))
    }

    /// The exact set of visible chunks. Costs O(allowed documents): use for selective users
    /// (see [`Visibility::estimate`]).
    pub fn visible_chunks(&self) -> RoaringBitmap {
        let mut out = RoaringBitmap::new();
        for doc in self.allow.bitmap() {
            out.extend(self.map.chunks_of(doc).iter().copied());
        }
        out -= self.dead;
        out
    }

    /// Upper-bound estimate of the number of visible chunks without materialising them.
    pub fn estimate(&self, avg_chunks_per_doc: f64) -> u64 {
        (self.allow.len() as f64 * avg_chunks_per_doc).ceil() as u64
    }

    /// Estimate of the number of visible chunks in O(bitmap containers), without materialising
    /// them: |allowed ∩ documents with chunks| × mean chunks per document, minus nothing for
    /// dead chunks (an upper bound when few chunks are dead). Used by the vector index to pick
    /// exact scan vs graph search.
    pub fn estimate_visible(&self) -> u64 {
        let docs = self.map.docs_with_chunks();
        if docs.is_empty() {
            return 0;
        }
        let allowed_docs = self.allow.bitmap().intersection_len(docs);
        let mean = self.map.mapped_chunks() as f64 / docs.len() as f64;
        (allowed_docs as f64 * mean).ceil() as u64
    }

    /// The dead-chunk bitmap in use.
    pub fn dead(&self) -> &RoaringBitmap {
        self.dead
    }

    /// The allow set in use.
    pub fn allow(&self) -> &AllowSet {
        self.allow
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn visibility_requires_allowed_doc_and_live_chunk() {
        let mut m = ChunkMap::new();
        m.insert(0, 10);
        m.insert(1, 10);
        m.insert(2, 11);
        let allow = AllowSet::from_bitmap_for_tests([10u32].into_iter().collect());
        let mut dead = RoaringBitmap::new();
        dead.insert(1);
        let v = Visibility::new(&allow, &m, &dead);
        assert!(v.visible(0));
        assert!(!v.visible(1), "dead chunk");
        assert!(!v.visible(2), "document not allowed");
        assert!(!v.visible(99), "unknown chunk");
        assert_eq!(v.visible_chunks().iter().collect::<Vec<_>>(), vec![0]);
        assert_eq!(
            v.estimate_visible(),
            2,
            "one allowed doc × 1.5 chunks per doc, rounded up"
        );
        m.remove_doc(10);
        let v = Visibility::new(&allow, &m, &dead);
        assert!(!v.visible(0), "removed document");
        assert_eq!((m.mapped_chunks(), v.estimate_visible()), (1, 0));
    }
}
