//! BM25 over chunks with tantivy, the visibility filter applied inside the collector.
//!
//! One tantivy document per chunk: `chunk_id` (u64, indexed for idempotent replace, fast for the
//! filter) and `text` (title line + chunk text, analysed: simple tokenizer, lowercase, optional
//! stop words, optional Snowball English stemming). Nothing is stored: texts live in SQLite.
//!
//! The collector reads each matching document's `chunk_id` from the fast field and keeps it only
//! if [`ChunkFilter::visible`] says so, so a selective user costs no more than a broad one and
//! never gets fewer than `k` results while `k` visible matches exist (no post-filter).

use std::cmp::{Ordering, Reverse};
use std::collections::BinaryHeap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use parking_lot::Mutex;
use roaring::RoaringBitmap;
use tantivy::collector::{Collector, SegmentCollector};
use tantivy::columnar::Column;
use tantivy::query::BooleanQuery;
use tantivy::schema::{
    FAST, Field, INDEXED, IndexRecordOption, Schema, TextFieldIndexing, TextOptions,
};
use tantivy::tokenizer::{
    Language, LowerCaser, RemoveLongFilter, SimpleTokenizer, Stemmer, StopWordFilter, TextAnalyzer,
};
use tantivy::{
    DocId, Index, IndexReader, IndexWriter, ReloadPolicy, Score, SegmentOrdinal, SegmentReader,
    TantivyDocument, Term,
};

use crate::config::{Bm25Config, StopWords};
use crate::error::{Error, Result};

const TOKENIZER: &str = "airlock_en";
const F_CHUNK: &str = "chunk_id";
const F_TEXT: &str = "text";

/// Decides per chunk id whether a search may return it. `'static` because tantivy's segment
/// collectors are.
pub(crate) trait ChunkFilter: Send + Sync + 'static {
    fn visible(&self, chunk: u32) -> bool;
}

/// The tantivy side of the engine.
pub(crate) struct Bm25Index {
    path: PathBuf,
    index: Index,
    reader: IndexReader,
    writer: Mutex<IndexWriter>,
    f_chunk: Field,
    f_text: Field,
}

impl Bm25Index {
    /// Opens the index in `dir`, creating it (and `dir`) if absent.
    pub(crate) fn open(dir: &Path, cfg: &Bm25Config) -> Result<Self> {
        std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
        let err = |source| Error::Bm25 {
            path: dir.to_path_buf(),
            source,
        };
        let mut schema = Schema::builder();
        schema.add_u64_field(F_CHUNK, INDEXED | FAST);
        let indexing = TextFieldIndexing::default()
            .set_tokenizer(TOKENIZER)
            .set_index_option(IndexRecordOption::WithFreqs);
        schema.add_text_field(
            F_TEXT,
            TextOptions::default().set_indexing_options(indexing),
        );
        let schema = schema.build();
        let directory = tantivy::directory::MmapDirectory::open(dir).map_err(|e| err(e.into()))?;
        let index = Index::open_or_create(directory, schema).map_err(err)?;
        index.tokenizers().register(TOKENIZER, analyzer(cfg));
        let schema = index.schema();
        let f_chunk = schema.get_field(F_CHUNK).map_err(err)?;
        let f_text = schema.get_field(F_TEXT).map_err(err)?;
        let writer = index
            .writer_with_num_threads(1, cfg.writer_memory_bytes)
            .map_err(err)?;
        let reader = index
            .reader_builder()
            .reload_policy(ReloadPolicy::Manual)
            .try_into()
            .map_err(err)?;
        Ok(Self {
            path: dir.to_path_buf(),
            index,
            reader,
            writer: Mutex::new(writer),
            f_chunk,
            f_text,
        })
    }

    fn err(&self, source: tantivy::TantivyError) -> Error {
        Error::Bm25 {
            path: self.path.clone(),
            source,
        }
    }

    /// The chunk ids of every live tantivy document (for crash repair).
    pub(crate) fn chunk_ids(&self) -> Result<RoaringBitmap> {
        let searcher = self.reader.searcher();
        let mut out = RoaringBitmap::new();
        for seg in searcher.segment_readers() {
            let col = seg.fast_fields().u64(F_CHUNK).map_err(|e| self.err(e))?;
            for doc in 0..seg.max_doc() {
                if seg.is_deleted(doc) {
                    continue;
                }
                if let Some(c) = col.first(doc) {
                    out.insert(c as u32);
                }
            }
        }
        Ok(out)
    }

    /// Adds (or replaces, by chunk id) chunks and deletes others, then commits and reloads.
    pub(crate) fn write(&self, add: &[(u32, String)], delete: &[u32]) -> Result<()> {
        if add.is_empty() && delete.is_empty() {
            return Ok(());
        }
        let mut w = self.writer.lock();
        for &c in delete.iter().chain(add.iter().map(|(c, _)| c)) {
            w.delete_term(Term::from_field_u64(self.f_chunk, u64::from(c)));
        }
        for (c, text) in add {
            let mut doc = TantivyDocument::default();
            doc.add_u64(self.f_chunk, u64::from(*c));
            doc.add_text(self.f_text, text);
            w.add_document(doc).map_err(|e| self.err(e))?;
        }
        w.commit().map_err(|e| self.err(e))?;
        drop(w);
        self.reader.reload().map_err(|e| self.err(e))
    }

    /// Top `k` visible chunks for `query` as `(chunk id, BM25 score)`, best first; ties broken by
    /// ascending chunk id. Query syntax errors are tolerated (lenient parsing).
    pub(crate) fn search(
        &self,
        query: &str,
        k: usize,
        filter: Arc<dyn ChunkFilter>,
    ) -> Result<Vec<(u32, f32)>> {
        if k == 0 {
            return Ok(Vec::new());
        }
        let terms = self.query_terms(query)?;
        if terms.is_empty() {
            return Ok(Vec::new());
        }
        let q = BooleanQuery::new_multiterms_query(terms);
        let searcher = self.reader.searcher();
        let hits = searcher
            .search(&q, &FilteredTopK { k, filter })
            .map_err(|e| self.err(e))?;
        Ok(hits.into_iter().map(|h| (h.chunk, h.score)).collect())
    }

    /// The query's distinct terms after the index's own analysis. Queries are natural language:
    /// no query syntax (fields, phrases, operators) is interpreted, so nothing a user types can
    /// fail to parse or widen the search.
    fn query_terms(&self, query: &str) -> Result<Vec<Term>> {
        let mut analyzer = self
            .index
            .tokenizer_for_field(self.f_text)
            .map_err(|e| self.err(e))?;
        let mut stream = analyzer.token_stream(query);
        let mut seen = std::collections::HashSet::new();
        let mut terms = Vec::new();
        while stream.advance() {
            let text = &stream.token().text;
            if seen.insert(text.clone()) {
                terms.push(Term::from_field_text(self.f_text, text));
            }
        }
        Ok(terms)
    }

    /// Number of live tantivy documents.
    pub(crate) fn num_docs(&self) -> u64 {
        self.reader.searcher().num_docs()
    }
}

fn analyzer(cfg: &Bm25Config) -> TextAnalyzer {
    let mut b = TextAnalyzer::builder(SimpleTokenizer::default())
        .filter(RemoveLongFilter::limit(40))
        .filter(LowerCaser)
        .dynamic();
    match &cfg.stop_words {
        StopWords::English => {
            if let Some(f) = StopWordFilter::new(Language::English) {
                b = b.filter_dynamic(f);
            }
        }
        StopWords::None => {}
        StopWords::Custom(words) => {
            b = b.filter_dynamic(StopWordFilter::remove(
                words.iter().map(|w| w.to_lowercase()),
            ));
        }
    }
    if cfg.stemming {
        b = b.filter_dynamic(Stemmer::new(Language::English));
    }
    b.build()
}

#[derive(Debug, Clone, Copy)]
struct Hit {
    score: f32,
    chunk: u32,
}

/// Best first: higher score, then lower chunk id.
impl Ord for Hit {
    fn cmp(&self, o: &Self) -> Ordering {
        self.score
            .total_cmp(&o.score)
            .then_with(|| o.chunk.cmp(&self.chunk))
    }
}
impl PartialOrd for Hit {
    fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}
impl PartialEq for Hit {
    fn eq(&self, o: &Self) -> bool {
        self.cmp(o) == Ordering::Equal
    }
}
impl Eq for Hit {}

struct FilteredTopK {
    k: usize,
    filter: Arc<dyn ChunkFilter>,
}

struct SegmentTopK {
    k: usize,
    filter: Arc<dyn ChunkFilter>,
    chunk_ids: Column<u64>,
    heap: BinaryHeap<Reverse<Hit>>,
}

impl Collector for FilteredTopK {
    type Fruit = Vec<Hit>;
    type Child = SegmentTopK;

    fn for_segment(
        &self,
        _ord: SegmentOrdinal,
        segment: &SegmentReader,
    ) -> tantivy::Result<SegmentTopK> {
        Ok(SegmentTopK {
            k: self.k,
            filter: Arc::clone(&self.filter),
            chunk_ids: segment.fast_fields().u64(F_CHUNK)?,
            heap: BinaryHeap::with_capacity(self.k + 1),
        })
    }

    fn requires_scoring(&self) -> bool {
        true
    }

    fn merge_fruits(&self, fruits: Vec<Vec<Hit>>) -> tantivy::Result<Vec<Hit>> {
        let mut all: Vec<Hit> = fruits.into_iter().flatten().collect();
        all.sort_unstable_by(|a, b| b.cmp(a));
        all.truncate(self.k);
        Ok(all)
    }
}

impl SegmentCollector for SegmentTopK {
    type Fruit = Vec<Hit>;

    fn collect(&mut self, doc: DocId, score: Score) {
        if self.heap.len() == self.k
            && self
                .heap
                .peek()
                .is_some_and(|Reverse(min)| score < min.score)
        {
            return;
        }
        let Some(chunk) = self.chunk_ids.first(doc) else {
            return;
        };
        let Ok(chunk) = u32::try_from(chunk) else {
            return;
        };
        if !self.filter.visible(chunk) {
            return;
        }
        let hit = Hit { score, chunk };
        if self.heap.len() < self.k {
            self.heap.push(Reverse(hit));
        } else if self.heap.peek().is_some_and(|Reverse(min)| hit > *min) {
            self.heap.pop();
            self.heap.push(Reverse(hit));
        }
    }

    fn harvest(self) -> Vec<Hit> {
        self.heap.into_iter().map(|Reverse(h)| h).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Only(RoaringBitmap);
    impl ChunkFilter for Only {
        fn visible(&self, c: u32) -> bool {
            self.0.contains(c)
        }
    }

    #[test]
    fn filter_runs_inside_the_collector_and_ids_are_idempotent() {
        let dir = tempfile::tempdir().unwrap();
        let idx = Bm25Index::open(dir.path(), &Bm25Config::default()).unwrap();
        let docs: Vec<(u32, String)> = (0..50)
            .map(|i| {
                (
                    i,
                    format!("Wing flutter experiments number {i} with the boundary layers"),
                )
            })
            .collect();
        idx.write(&docs, &[]).unwrap();
        // Re-adding the same ids replaces, never duplicates.
        idx.write(&docs[..10], &[]).unwrap();
        assert_eq!(idx.num_docs(), 50);
        assert_eq!(idx.chunk_ids().unwrap().len(), 50);
        // Only 3 of 50 visible: still exactly those 3 come back, though all 50 match.
        let allowed: RoaringBitmap = [5u32, 17, 42].into_iter().collect();
        let hits = idx
            .search("layer flutter", 10, Arc::new(Only(allowed.clone())))
            .unwrap();
        let got: RoaringBitmap = hits.iter().map(|h| h.0).collect();
        assert_eq!(got, allowed);
        // Stemming + lowercase: "LAYERS" matches "layers" and "layer".
        let all = Arc::new(Only((0..50).collect()));
        assert_eq!(idx.search("LAYER", 100, all.clone()).unwrap().len(), 50);
        // Stop words only: no match (not "everything"); syntax characters are plain text.
        assert!(idx.search("the with", 10, all.clone()).unwrap().is_empty());
        assert_eq!(
            idx.search("flutter: \"(AND", 5, all.clone()).unwrap().len(),
            5
        );
        assert!(idx.search("text:flutter", 5, all.clone()).unwrap().len() == 5);
        assert!(idx.search("*", 5, all.clone()).unwrap().is_empty());
        idx.write(&[], &[0, 1, 2]).unwrap();
        assert_eq!(idx.num_docs(), 47);
    }
}
