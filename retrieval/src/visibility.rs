//! Which chunks a search may return: chunk → document map, the caller's `AllowSet`, and the
//! dead-chunk bitmap (tombstoned documents and superseded chunk versions).
//!
//! Shared by the BM25 collector and the vector index so both paths apply the same rule.

use std::sync::Arc;

use airlock_acl::AllowSet;
use roaring::RoaringBitmap;

use crate::cow_vec::CowVec;

/// Sentinel in [`ChunkMap`] for a chunk id with no (live) document.
const NO_DOC: u32 = u32::MAX;

/// Dense chunk id → document ordinal, and document ordinal → its current chunk ids.
///
/// Every write publishes a new map beside the one searches read, so it is a persistent
/// structure: both directions are [`CowVec`]s (one pointer per 16,384 entries to clone; a write
/// copies only the segments it touches) and a document's chunk list is an immutable shared
/// slice (`benches/chunk_map.rs`).
#[derive(Debug, Default, Clone)]
pub struct ChunkMap {
    chunk_doc: CowVec<u32>,
    doc_chunks: CowVec<Arc<[u32]>>,
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
            self.chunk_doc.grow(c + 1, NO_DOC);
        }
        let slot = self.chunk_doc.get_mut(c).expect("grown to cover the chunk");
        if *slot == NO_DOC {
            self.mapped += 1;
        }
        *slot = doc;
        self.docs.insert(doc);
        let d = doc as usize;
        if self.doc_chunks.len() <= d {
            self.doc_chunks.grow(d + 1, Arc::from([]));
        }
        let list = self
            .doc_chunks
            .get_mut(d)
            .expect("grown to cover the document");
        if let Err(pos) = list.binary_search(&chunk) {
            let mut with = Vec::with_capacity(list.len() + 1);
            with.extend_from_slice(&list[..pos]);
            with.push(chunk);
            with.extend_from_slice(&list[pos..]);
            *list = with.into();
        }
    }

    /// Forgets all chunks of `doc` (they stay mapped to nothing); returns them.
    pub fn remove_doc(&mut self, doc: u32) -> Vec<u32> {
        if self.chunks_of(doc).is_empty() {
            // Nothing mapped (and not in `docs`): no segment is copied.
            return Vec::new();
        }
        let list = self
            .doc_chunks
            .get_mut(doc as usize)
            .expect("a document with chunks is in the map");
        let removed = std::mem::replace(list, Arc::from([])).to_vec();
        for &c in &removed {
            if let Some(slot) = self.chunk_doc.get_mut(c as usize)
                && *slot == doc
            {
                *slot = NO_DOC;
                self.mapped -= 1;
            }
        }
        self.docs.remove(doc);
        removed
    }

    /// The document of `chunk`, if it has a live one.
    #[inline]
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
            .map(|l| &**l)
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

    /// Exactly the chunks [`Visibility::visible`] accepts, as a bitmap: a chunk of an allowed
    /// document that is still mapped to it and not dead. Costs O(allowed documents' chunks)
    /// (unlike [`Visibility::visible_chunks`], a chunk listed under an allowed document but
    /// mapped to another since is left out).
    pub fn visible_set(&self) -> RoaringBitmap {
        let docs = self.allow.bitmap() & self.map.docs_with_chunks();
        let mut ids: Vec<u32> = Vec::new();
        for doc in &docs {
            ids.extend(
                self.map
                    .chunks_of(doc)
                    .iter()
                    .copied()
                    .filter(|&c| self.map.doc_of(c) == Some(doc)),
            );
        }
        ids.sort_unstable();
        ids.dedup();
        let mut out = RoaringBitmap::from_sorted_iter(ids).expect("sorted, deduplicated");
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
        assert_eq!(v.visible_set().iter().collect::<Vec<_>>(), vec![0]);
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

    /// The map before it became persistent: plain vectors, cloned whole. The reference model.
    #[derive(Clone, Default)]
    struct Plain {
        chunk_doc: Vec<u32>,
        doc_chunks: Vec<Vec<u32>>,
        docs: std::collections::BTreeSet<u32>,
        mapped: u64,
    }

    impl Plain {
        fn insert(&mut self, chunk: u32, doc: u32) {
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
            if let Err(pos) = self.doc_chunks[d].binary_search(&chunk) {
                self.doc_chunks[d].insert(pos, chunk);
            }
        }

        fn remove_doc(&mut self, doc: u32) -> Vec<u32> {
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
            self.docs.remove(&doc);
            removed
        }

        fn assert_same(&self, m: &ChunkMap, what: &str) {
            assert_eq!(
                m.chunk_id_bound() as usize,
                self.chunk_doc.len(),
                "{what}: bound"
            );
            for (c, &d) in self.chunk_doc.iter().enumerate() {
                let want = (d != NO_DOC).then_some(d);
                assert_eq!(m.doc_of(c as u32), want, "{what}: doc of chunk {c}");
            }
            assert_eq!(
                m.doc_of(self.chunk_doc.len() as u32),
                None,
                "{what}: past the end"
            );
            for (d, list) in self.doc_chunks.iter().enumerate() {
                assert_eq!(
                    m.chunks_of(d as u32),
                    &list[..],
                    "{what}: chunks of doc {d}"
                );
            }
            assert!(m.chunks_of(self.doc_chunks.len() as u32).is_empty());
            assert_eq!(m.mapped_chunks(), self.mapped, "{what}: mapped");
            let docs: Vec<u32> = m.docs_with_chunks().iter().collect();
            assert_eq!(
                docs,
                self.docs.iter().copied().collect::<Vec<_>>(),
                "{what}: docs"
            );
        }
    }

    /// Each write clones the published map and changes the clone while searches read the old
    /// one: every earlier map must still read exactly as it did when it was published, and each
    /// must equal the plain model, across many segments of both directions.
    #[test]
    fn published_maps_never_change_and_match_the_plain_model() {
        let mut rng = crate::vector::synth::Rng::new(11);
        let (mut map, mut plain) = (ChunkMap::new(), Plain::default());
        let mut published: Vec<(ChunkMap, Plain)> = Vec::new();
        let (mut next_chunk, mut ids) = (0u32, Vec::new());
        for step in 0..300 {
            let (mut m, mut p) = (map.clone(), plain.clone());
            for _ in 0..rng.below(60) {
                let op = rng.below(10);
                if op <= 4 || ids.is_empty() {
                    // New chunk ids, with gaps, for documents spread over several segments.
                    next_chunk += 1 + rng.below(300) as u32;
                    let doc = rng.below(40_000) as u32;
                    ids.push((next_chunk, doc));
                    m.insert(next_chunk, doc);
                    p.insert(next_chunk, doc);
                    continue;
                }
                let (c, first) = ids[rng.below(ids.len() as u64) as usize];
                if op <= 6 {
                    // A mapped chunk id again, for another document (the first keeps it
                    // listed): removing the first document must not unmap it.
                    let doc = rng.below(40_000) as u32;
                    m.insert(c, doc);
                    p.insert(c, doc);
                } else {
                    // A chunk's current document, the document it was first inserted for (which
                    // may no longer own it), or any document.
                    let doc = match op {
                        7 => p.chunk_doc[c as usize],
                        8 => first,
                        _ => rng.below(41_000) as u32,
                    };
                    assert_eq!(m.remove_doc(doc), p.remove_doc(doc), "removed chunks");
                }
            }
            published.push((
                std::mem::replace(&mut map, m),
                std::mem::replace(&mut plain, p),
            ));
            if step % 60 == 59 {
                for (i, (m, p)) in published.iter().enumerate().step_by(7) {
                    p.assert_same(m, &format!("map published at step {i}"));
                }
            }
        }
        plain.assert_same(&map, "latest map");
        assert!(
            map.chunk_id_bound() as usize > 4 * 16_384,
            "several chunk segments"
        );
    }
}
