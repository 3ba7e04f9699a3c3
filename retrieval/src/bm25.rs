//! BM25 over chunks with tantivy, scored over the caller's visible set.
//!
//! One tantivy document per chunk: `chunk_id` (u64, indexed for idempotent replace, fast for the
//! filter) and `text` (title line + chunk text, analysed: simple tokenizer, lowercase, optional
//! stop words, optional Snowball English stemming). Nothing is stored: texts live in SQLite.
//!
//! A search reads the postings of the query's terms itself (tantivy's index, not its query
//! scorer): each posting's `chunk_id` comes from the fast field and is kept only if
//! [`ChunkFilter::visible`] says so, so a selective user never gets fewer than `k` results while
//! `k` visible matches exist (no post-filter). Document frequencies and `N` are counted over the
//! visible chunks only and the average length is a constant, so nothing a caller sees depends on
//! chunks they cannot read (see [`Bm25Index::search`]).

use std::cmp::Ordering;
use std::path::{Path, PathBuf};

use parking_lot::Mutex;
use roaring::RoaringBitmap;
use tantivy::postings::Postings;
use tantivy::query::Bm25Weight;
use tantivy::schema::{
    FAST, Field, INDEXED, IndexRecordOption, Schema, TextFieldIndexing, TextOptions,
};
use tantivy::tokenizer::{
    Language, LowerCaser, RemoveLongFilter, SimpleTokenizer, Stemmer, StopWordFilter, TextAnalyzer,
};
use tantivy::{
    DocSet, Index, IndexReader, IndexWriter, ReloadPolicy, TERMINATED, TantivyDocument, Term,
};

use crate::config::{Bm25Config, StopWords};
use crate::error::{Error, Result};
use crate::visibility::Visibility;

const TOKENIZER: &str = "airlock_en";
const F_CHUNK: &str = "chunk_id";
const F_TEXT: &str = "text";

/// Decides per chunk id whether a search may return it.
pub(crate) trait ChunkFilter {
    fn visible(&self, chunk: u32) -> bool;
}

impl ChunkFilter for Visibility<'_> {
    fn visible(&self, chunk: u32) -> bool {
        Visibility::visible(self, chunk)
    }
}

/// The tantivy side of the engine.
pub(crate) struct Bm25Index {
    path: PathBuf,
    index: Index,
    reader: IndexReader,
    writer: Mutex<IndexWriter>,
    f_chunk: Field,
    f_text: Field,
    /// The constant average chunk length (tokens) of the BM25 length normalisation.
    avg_len: f32,
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
            avg_len: cfg.avg_chunk_tokens,
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
    /// ascending chunk id. `visible_chunks` is the number of chunks `filter` lets through.
    ///
    /// The BM25 statistics are those of the caller's visible set, never of the whole index:
    /// a term's document frequency counts only visible chunks, `N` is `visible_chunks`, and the
    /// average chunk length is the configured constant [`Bm25Config::avg_chunk_tokens`]. A
    /// chunk's score is summed over the query's terms in query order, so it is bit-identical
    /// whatever the segment layout. Together: scores, order and the result set depend only on
    /// the chunks the caller may read (issue 19, F2). The cost is one pass over the postings of
    /// the query's terms, as before.
    pub(crate) fn search(
        &self,
        query: &str,
        k: usize,
        filter: &dyn ChunkFilter,
        visible_chunks: u64,
    ) -> Result<Vec<(u32, f32)>> {
        if k == 0 || visible_chunks == 0 {
            return Ok(Vec::new());
        }
        let terms = self.query_terms(query)?;
        if terms.is_empty() {
            return Ok(Vec::new());
        }
        let searcher = self.reader.searcher();
        // Pass 1: the visible postings of each term, addressed by (segment base + doc).
        let mut postings: Vec<Vec<Posting>> = vec![Vec::new(); terms.len()];
        let mut base = 0u32;
        for seg in searcher.segment_readers() {
            let inv = seg.inverted_index(self.f_text).map_err(|e| self.err(e))?;
            let norms = seg
                .get_fieldnorms_reader(self.f_text)
                .map_err(|e| self.err(e))?;
            let ids = seg.fast_fields().u64(F_CHUNK).map_err(|e| self.err(e))?;
            // Per document, decided once for all terms: 0 not yet, 1 not visible, else chunk + 2.
            let mut seen: Vec<u32> = Vec::new();
            for (term, out) in terms.iter().zip(postings.iter_mut()) {
                let Some(mut p) = inv
                    .read_postings(term, IndexRecordOption::WithFreqs)
                    .map_err(|e| self.err(e.into()))?
                else {
                    continue;
                };
                if seen.is_empty() {
                    seen = vec![0; seg.max_doc() as usize];
                }
                let mut doc = p.doc();
                while doc != TERMINATED {
                    let slot = &mut seen[doc as usize];
                    if *slot == 0 {
                        *slot = if !seg.is_deleted(doc)
                            && let Some(chunk) = ids.first(doc).and_then(|c| u32::try_from(c).ok())
                            && filter.visible(chunk)
                        {
                            chunk.checked_add(2).unwrap_or(1)
                        } else {
                            1
                        };
                    }
                    if *slot > 1 {
                        out.push(Posting {
                            addr: base + doc,
                            chunk: *slot - 2,
                            tf: p.term_freq(),
                            norm: norms.fieldnorm_id(doc),
                        });
                    }
                    doc = p.advance();
                }
            }
            base += seg.max_doc();
        }
        // Pass 2: per-term weights from visible statistics, scores summed in term order.
        let df_max = postings.iter().map(Vec::len).max().unwrap_or(0) as u64;
        if df_max == 0 {
            return Ok(Vec::new());
        }
        // `N ≥ df` always holds (every visible chunk is a mapped chunk); the `max` only keeps a
        // transiently inconsistent count from tripping tantivy's assertion.
        let n = visible_chunks.max(df_max);
        let mut acc = vec![0f32; base as usize];
        let mut touched: Vec<(u32, u32)> = Vec::new();
        for list in postings.iter().filter(|l| !l.is_empty()) {
            let w = Bm25Weight::for_one_term_without_explain(list.len() as u64, n, self.avg_len);
            for p in list {
                let s = &mut acc[p.addr as usize];
                if *s == 0.0 {
                    // BM25 term scores are > 0, so 0 means "not seen yet".
                    touched.push((p.addr, p.chunk));
                }
                *s += w.score(p.norm, p.tf);
            }
        }
        let mut hits: Vec<Hit> = touched
            .into_iter()
            .map(|(addr, chunk)| Hit {
                score: acc[addr as usize],
                chunk,
            })
            .collect();
        if hits.len() > k {
            hits.select_nth_unstable_by(k - 1, |a, b| b.cmp(a));
            hits.truncate(k);
        }
        hits.sort_unstable_by(|a, b| b.cmp(a));
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

    /// Segments of the current searcher (benchmarks: the merge policy's effect).
    pub(crate) fn segment_count(&self) -> usize {
        self.reader.searcher().segment_readers().len()
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

/// One visible posting of a query term.
#[derive(Debug, Clone, Copy)]
struct Posting {
    /// Segment base + tantivy doc id: a dense address for the score accumulator.
    addr: u32,
    chunk: u32,
    tf: u32,
    norm: u8,
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
    fn filter_applies_to_every_posting_and_ids_are_idempotent() {
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
            .search("layer flutter", 10, &Only(allowed.clone()), 3)
            .unwrap();
        let got: RoaringBitmap = hits.iter().map(|h| h.0).collect();
        assert_eq!(got, allowed);
        // Stemming + lowercase: "LAYERS" matches "layers" and "layer".
        let all = Only((0..50).collect());
        assert_eq!(idx.search("LAYER", 100, &all, 50).unwrap().len(), 50);
        // Stop words only: no match (not "everything"); syntax characters are plain text.
        assert!(idx.search("the with", 10, &all, 50).unwrap().is_empty());
        assert_eq!(idx.search("flutter: \"(AND", 5, &all, 50).unwrap().len(), 5);
        assert!(idx.search("text:flutter", 5, &all, 50).unwrap().len() == 5);
        assert!(idx.search("*", 5, &all, 50).unwrap().is_empty());
        idx.write(&[], &[0, 1, 2]).unwrap();
        assert_eq!(idx.num_docs(), 47);
    }

    /// With everything visible and the configured average set to the index's own, the scores
    /// are tantivy's BM25 (the formula is tantivy's `Bm25Weight`; only the statistics differ).
    #[test]
    fn scores_equal_tantivys_bm25_under_the_same_statistics() {
        use tantivy::collector::TopDocs;
        use tantivy::query::BooleanQuery;
        let dir = tempfile::tempdir().unwrap();
        let words = [
            "wing", "flutter", "boundary", "layer", "shock", "heat", "plate",
        ];
        let docs: Vec<(u32, String)> = (0..40u32)
            .map(|i| {
                let n = 3 + (i as usize * 7) % 11;
                let text: Vec<&str> = (0..n).map(|j| words[(i as usize + j * j) % 7]).collect();
                (i, text.join(" "))
            })
            .collect();
        let probe = Bm25Index::open(dir.path(), &Bm25Config::default()).unwrap();
        probe.write(&docs, &[]).unwrap();
        let searcher = probe.reader.searcher();
        let tokens: u64 = searcher
            .segment_readers()
            .iter()
            .map(|s| s.inverted_index(probe.f_text).unwrap().total_num_tokens())
            .sum();
        let avg = tokens as f32 / 40.0;
        drop((searcher, probe));
        let cfg = Bm25Config {
            avg_chunk_tokens: avg,
            ..Bm25Config::default()
        };
        let idx = Bm25Index::open(dir.path(), &cfg).unwrap();
        let all = Only((0..40).collect());
        for q in [
            "wing flutter",
            "boundary layer heat",
            "plate",
            "shock wing plate heat",
        ] {
            let ours = idx.search(q, 40, &all, 40).unwrap();
            let terms = idx.query_terms(q).unwrap();
            let searcher = idx.reader.searcher();
            let top = searcher
                .search(
                    &BooleanQuery::new_multiterms_query(terms),
                    &TopDocs::with_limit(40).order_by_score(),
                )
                .unwrap();
            assert_eq!(ours.len(), top.len(), "{q}");
            let mut theirs: Vec<(u32, f32)> = top
                .iter()
                .map(|(s, a)| {
                    let seg = searcher.segment_reader(a.segment_ord);
                    let c = seg
                        .fast_fields()
                        .u64(F_CHUNK)
                        .unwrap()
                        .first(a.doc_id)
                        .unwrap();
                    (c as u32, *s)
                })
                .collect();
            theirs.sort_by_key(|t| t.0);
            let mut mine = ours.clone();
            mine.sort_by_key(|t| t.0);
            for (a, b) in mine.iter().zip(&theirs) {
                assert_eq!(a.0, b.0, "{q}");
                assert!(
                    (a.1 - b.1).abs() < 1e-5,
                    "{q}: chunk {} {} vs {}",
                    a.0,
                    a.1,
                    b.1
                );
            }
        }
    }
}
