//! BM25 over chunks with tantivy, scored over the caller's visible set.
//!
//! One tantivy document per chunk: `chunk_id` (u64, indexed for idempotent replace, fast for the
//! filter) and `text` (title line + chunk text, analysed: simple tokenizer, lowercase, optional
//! stop words, optional Snowball English stemming). Nothing is stored: texts live in SQLite.
//!
//! A search reads the postings of the query's terms itself (tantivy's index, not its query
//! scorer): a document's `chunk_id` comes from the fast field and is kept only if
//! [`ChunkFilter::visible`] says so, so a selective user never gets fewer than `k` results while
//! `k` visible matches exist (no post-filter). Document frequencies and `N` are counted over the
//! visible chunks only and the average length is a constant, so nothing a caller sees depends on
//! chunks they cannot read (see [`Bm25Index::search`]). Document frequencies come from cached
//! per-segment chunk bitmaps of each term intersected with the caller's visible set, and the top
//! `k` from MaxScore pruning, so a search no longer reads every posting (issue 45).

use std::cmp::{Ordering, Reverse};
use std::collections::{BinaryHeap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use parking_lot::Mutex;
use roaring::RoaringBitmap;
use tantivy::index::SegmentId;
use tantivy::postings::{Postings, SegmentPostings};
use tantivy::query::Bm25Weight;
use tantivy::schema::{
    FAST, Field, INDEXED, IndexRecordOption, Schema, TextFieldIndexing, TextOptions,
};
use tantivy::tokenizer::{
    Language, LowerCaser, RemoveLongFilter, SimpleTokenizer, Stemmer, StopWordFilter, TextAnalyzer,
};
use tantivy::{
    DocSet, Index, IndexReader, IndexWriter, InvertedIndexReader, ReloadPolicy, SegmentReader,
    TERMINATED, TantivyDocument, Term,
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
    /// Per segment and term: its chunk ids and largest term frequencies ([`SegTerm`]).
    terms: Mutex<TermCache>,
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
            terms: Mutex::new(TermCache::default()),
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
    /// ascending chunk id. `visible_chunks` is the number of chunks `filter` lets through and
    /// `visible` must hold exactly the chunk ids `filter` accepts (ids the index does not hold
    /// may be in it or not: they meet no posting).
    ///
    /// The BM25 statistics are those of the caller's visible set, never of the whole index:
    /// a term's document frequency counts only visible chunks, `N` is `visible_chunks`, and the
    /// average chunk length is the configured constant [`Bm25Config::avg_chunk_tokens`]. A
    /// chunk's score is summed over the query's terms in query order, so it is bit-identical
    /// whatever the segment layout. Together: scores, order and the result set depend only on
    /// the chunks the caller may read (issue 19, F2).
    ///
    /// Cost (issue 45): the visible document frequency of a term is `|term's chunks ∩ visible|`,
    /// a roaring-bitmap intersection count over the term's chunk ids per segment, which are read
    /// from its postings once and cached ([`SegTerm`]; keyed by segment, its delete count and the
    /// term, so writes and merges never serve stale ones). The top `k` are then found exactly by
    /// MaxScore over the postings (tantivy's skip lists, `seek`): terms are ordered by the
    /// largest score any of their postings in the segment can have (from the cached maximum
    /// term frequency per length), and a document is only considered while the terms it
    /// could still match might lift it to the current `k`-th score; visibility is checked only
    /// for documents that are considered. Results and scores are those of the exhaustive pass
    /// this replaced (the test oracle `search_exhaustive`, property `pruned_search_equals_…`).
    pub(crate) fn search(
        &self,
        query: &str,
        k: usize,
        filter: &dyn ChunkFilter,
        visible: &RoaringBitmap,
        visible_chunks: u64,
    ) -> Result<Vec<(u32, f32)>> {
        // MaxScore prunes once the k-th visible score is high, which comes fast when much is
        // visible; for a selective caller few visible documents meet the postings, the threshold
        // stays low and pruning visits about every posting at a higher cost per posting than the
        // exhaustive pass (`scale` bench at 200k: slower at 1% and 10% visible, faster at 100%).
        // Both are exact, so which one runs changes only the time. The cut (half the index
        // visible) is not tuned: nothing between 10% and 100% was measured.
        if visible_chunks.saturating_mul(2) < self.num_docs() {
            return self.search_exhaustive(query, k, filter, visible_chunks);
        }
        self.search_pruned(query, k, filter, visible, visible_chunks)
    }

    /// The MaxScore search of [`Bm25Index::search`] (always, whatever the visible share).
    pub(crate) fn search_pruned(
        &self,
        query: &str,
        k: usize,
        filter: &dyn ChunkFilter,
        visible: &RoaringBitmap,
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
        let segments = searcher.segment_readers();
        // Per segment and term: the cached postings summary and its visible count.
        let mut per_seg: Vec<SegRow> = Vec::with_capacity(segments.len());
        let mut df = vec![0u64; terms.len()];
        for seg in segments {
            let inv = seg.inverted_index(self.f_text).map_err(|e| self.err(e))?;
            let mut row = Vec::with_capacity(terms.len());
            for (i, term) in terms.iter().enumerate() {
                let st = self.seg_term(seg, &inv, term)?;
                row.push(st.map(|st| {
                    let n = st.chunks.intersection_len(visible);
                    df[i] += n;
                    (st, n)
                }));
            }
            per_seg.push(row);
        }
        let df_max = df.iter().copied().max().unwrap_or(0);
        if df_max == 0 {
            return Ok(Vec::new());
        }
        // `N ≥ df` always holds (every visible chunk is a mapped chunk); the `max` only keeps a
        // transiently inconsistent count from tripping tantivy's assertion.
        let n = visible_chunks.max(df_max);
        let weights: Vec<Option<Bm25Weight>> = df
            .iter()
            .map(|&d| (d > 0).then(|| Bm25Weight::for_one_term_without_explain(d, n, self.avg_len)))
            .collect();
        let mut top = TopK::new(k);
        for (seg, row) in segments.iter().zip(&per_seg) {
            self.max_score_segment(seg, &terms, &weights, row, filter, &mut top)?;
        }
        Ok(top
            .into_sorted()
            .into_iter()
            .map(|h| (h.chunk, h.score))
            .collect())
    }

    /// The cursors of a MaxScore pass over one segment: the query terms that can score a
    /// visible document here (weight known, visible postings here), with their postings and
    /// the largest score of any of them, in query order.
    fn max_score_cursors(
        &self,
        seg: &SegmentReader,
        terms: &[Term],
        weights: &[Option<Bm25Weight>],
        row: &[Option<(Arc<SegTerm>, u64)>],
    ) -> Result<Vec<MaxScoreCursor>> {
        let inv = seg.inverted_index(self.f_text).map_err(|e| self.err(e))?;
        let mut cursors: Vec<MaxScoreCursor> = Vec::new();
        for (i, (w, st)) in weights.iter().zip(row).enumerate() {
            let (Some(w), Some((st, visible_here))) = (w, st) else {
                continue;
            };
            if *visible_here == 0 {
                // Every posting here is of a chunk the caller cannot read.
                continue;
            }
            let Some(postings) = inv
                .read_postings(&terms[i], IndexRecordOption::WithFreqs)
                .map_err(|e| self.err(e.into()))?
            else {
                continue;
            };
            let ub = st
                .max_tf
                .iter()
                .map(|&(norm, tf)| w.score(norm, tf))
                .fold(0f32, f32::max);
            cursors.push(MaxScoreCursor {
                term: i,
                weight: w.clone(),
                ub,
                postings,
            });
        }
        Ok(cursors)
    }

    /// MaxScore over one segment's postings of the query's terms, offering every visible
    /// document that could enter the top `k` to `top` with its exact score.
    fn max_score_segment(
        &self,
        seg: &SegmentReader,
        terms: &[Term],
        weights: &[Option<Bm25Weight>],
        row: &[Option<(Arc<SegTerm>, u64)>],
        filter: &dyn ChunkFilter,
        top: &mut TopK,
    ) -> Result<()> {
        let mut cursors = self.max_score_cursors(seg, terms, weights, row)?;
        if cursors.is_empty() {
            return Ok(());
        }
        // Ascending upper bound: a prefix of cursors is "non-essential" while the sum of their
        // bounds cannot reach the current k-th score.
        cursors.sort_by(|a, b| a.ub.total_cmp(&b.ub).then(a.term.cmp(&b.term)));
        let mut prefix = vec![0f64; cursors.len() + 1];
        for (i, c) in cursors.iter().enumerate() {
            prefix[i + 1] = prefix[i] + f64::from(c.ub);
        }
        // The f32 sum of at most `len` term scores exceeds the exact sum of their bounds by at
        // most `len` roundings; bounds are inflated by that (and then some) before any pruning.
        let slack = 1.0 + (cursors.len() as f64 + 1.0) * f64::from(f32::EPSILON);
        let below = |bound: f64, threshold: Option<f32>| {
            threshold.is_some_and(|t| bound * slack < f64::from(t))
        };
        let norms = seg
            .get_fieldnorms_reader(self.f_text)
            .map_err(|e| self.err(e))?;
        let ids = seg.fast_fields().u64(F_CHUNK).map_err(|e| self.err(e))?;
        let n_terms = weights.len();
        let mut contrib: Vec<Option<f32>> = vec![None; n_terms];
        let mut threshold = top.threshold();
        let mut essential = essential_from(&prefix, threshold, &below);
        loop {
            // The next candidate: the smallest document among the essential lists.
            let mut doc = TERMINATED;
            for c in &cursors[essential..] {
                doc = doc.min(c.postings.doc());
            }
            if doc == TERMINATED {
                break;
            }
            let norm = norms.fieldnorm_id(doc);
            let mut partial = 0f64;
            for c in &cursors[essential..] {
                if c.postings.doc() == doc {
                    let s = c.weight.score(norm, c.postings.term_freq());
                    contrib[c.term] = Some(s);
                    partial += f64::from(s);
                }
            }
            let mut keep = !below(partial + prefix[essential], threshold)
                && !seg.is_deleted(doc)
                && ids
                    .first(doc)
                    .and_then(|c| u32::try_from(c).ok())
                    .is_some_and(|c| filter.visible(c));
            if keep {
                // Non-essential terms, largest bound first, while the document can still make it.
                for i in (0..essential).rev() {
                    if below(partial + prefix[i + 1], threshold) {
                        keep = false;
                        break;
                    }
                    let c = &mut cursors[i];
                    if c.postings.doc() < doc {
                        c.postings.seek(doc);
                    }
                    if c.postings.doc() == doc {
                        let s = c.weight.score(norm, c.postings.term_freq());
                        contrib[c.term] = Some(s);
                        partial += f64::from(s);
                    }
                }
            }
            if keep {
                // The exact score: summed in query-term order, as the exhaustive pass did.
                let mut score = 0f32;
                for s in contrib.iter().flatten() {
                    score += *s;
                }
                let chunk = ids
                    .first(doc)
                    .and_then(|c| u32::try_from(c).ok())
                    .expect("checked above");
                if top.offer(Hit { score, chunk }) {
                    let t = top.threshold();
                    if t != threshold {
                        threshold = t;
                        essential = essential_from(&prefix, threshold, &below);
                    }
                }
            }
            contrib.iter_mut().for_each(|c| *c = None);
            for c in &mut cursors[essential..] {
                if c.postings.doc() == doc {
                    c.postings.advance();
                }
            }
        }
        Ok(())
    }

    /// The cached summary of `term`'s postings in `seg`, built on first use.
    fn seg_term(
        &self,
        seg: &SegmentReader,
        inv: &InvertedIndexReader,
        term: &Term,
    ) -> Result<Option<Arc<SegTerm>>> {
        let key = (
            seg.segment_id(),
            seg.num_deleted_docs(),
            term.serialized_value_bytes().to_vec(),
        );
        if let Some(st) = self.terms.lock().get(&key) {
            return Ok(Some(st));
        }
        let Some(mut p) = inv
            .read_postings(term, IndexRecordOption::WithFreqs)
            .map_err(|e| self.err(e.into()))?
        else {
            return Ok(None);
        };
        let norms = seg
            .get_fieldnorms_reader(self.f_text)
            .map_err(|e| self.err(e))?;
        let ids = seg.fast_fields().u64(F_CHUNK).map_err(|e| self.err(e))?;
        let mut chunks = Vec::new();
        let mut max_tf = [0u32; 256];
        let mut doc = p.doc();
        while doc != TERMINATED {
            if !seg.is_deleted(doc)
                && let Some(chunk) = ids.first(doc).and_then(|c| u32::try_from(c).ok())
            {
                chunks.push(chunk);
                let slot = &mut max_tf[usize::from(norms.fieldnorm_id(doc))];
                *slot = (*slot).max(p.term_freq());
            }
            doc = p.advance();
        }
        chunks.sort_unstable();
        chunks.dedup();
        let chunks = RoaringBitmap::from_sorted_iter(chunks).expect("sorted, deduplicated");
        let max_tf: Vec<(u8, u32)> = (0..=255u8).zip(max_tf).filter(|&(_, tf)| tf > 0).collect();
        let st = Arc::new(SegTerm { chunks, max_tf });
        self.terms.lock().insert(key, Arc::clone(&st));
        Ok(Some(st))
    }

    /// The exhaustive search (the only one before issue 45, and the test oracle of
    /// [`Bm25Index::search_pruned`]): every posting of the query's terms is read and filtered,
    /// visible postings counted, then scored.
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
    pub(crate) fn search_exhaustive(
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

    /// Whether chunks of `visible` hold every term the index's own analysis makes of `word`
    /// (lower case, stop words, stemming): `None` when the analysis leaves no term (a stop
    /// word). Reads the same cached per-segment chunk bitmaps as a search's document
    /// frequencies, so only visible chunks decide.
    pub(crate) fn mentioned(&self, word: &str, visible: &RoaringBitmap) -> Result<Option<bool>> {
        let terms = self.query_terms(word)?;
        if terms.is_empty() {
            return Ok(None);
        }
        let searcher = self.reader.searcher();
        let segments = searcher.segment_readers();
        for term in &terms {
            let mut found = false;
            for seg in segments {
                let inv = seg.inverted_index(self.f_text).map_err(|e| self.err(e))?;
                if self
                    .seg_term(seg, &inv, term)?
                    .is_some_and(|st| !st.chunks.is_disjoint(visible))
                {
                    found = true;
                    break;
                }
            }
            if !found {
                return Ok(Some(false));
            }
        }
        Ok(Some(true))
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

/// A query term in a MaxScore pass over one segment.
struct MaxScoreCursor {
    /// Position of the term in the query (score summation order).
    term: usize,
    weight: Bm25Weight,
    /// Largest score of any of its postings in this segment.
    ub: f32,
    postings: SegmentPostings,
}

/// What a search needs of one term's postings in one segment, read once: the chunk ids of its
/// live documents (for visible document frequencies by intersection) and, per fieldnorm id, the
/// largest term frequency (BM25 grows with the term frequency at a given length, so the largest
/// score of the term's postings under any weight is the largest of these pairs' scores).
struct SegTerm {
    chunks: RoaringBitmap,
    max_tf: Vec<(u8, u32)>,
}

impl SegTerm {
    fn bytes(&self) -> usize {
        self.chunks.serialized_size() + self.max_tf.len() * 8 + 64
    }
}

/// Per query term: its summary in one segment and how many of its chunks there are visible.
type SegRow = Vec<Option<(Arc<SegTerm>, u64)>>;

/// (segment, its deleted-document count, term bytes). A segment's documents never change and
/// its deletions only grow, so the count pins its live set: a write or merge makes new keys,
/// never stale hits.
type TermKey = (SegmentId, u32, Vec<u8>);

/// Bound of [`TermCache`]: the least recently used entries go beyond it.
const TERM_CACHE_BYTES: usize = 256 << 20;

#[derive(Default)]
struct TermCache {
    map: HashMap<TermKey, (Arc<SegTerm>, u64)>,
    bytes: usize,
    tick: u64,
}

impl TermCache {
    fn get(&mut self, key: &TermKey) -> Option<Arc<SegTerm>> {
        self.tick += 1;
        let tick = self.tick;
        self.map.get_mut(key).map(|e| {
            e.1 = tick;
            Arc::clone(&e.0)
        })
    }

    fn insert(&mut self, key: TermKey, st: Arc<SegTerm>) {
        self.tick += 1;
        self.bytes += st.bytes() + key.2.len();
        let key_len = key.2.len();
        if let Some((old, _)) = self.map.insert(key, (st, self.tick)) {
            self.bytes -= old.bytes() + key_len;
        }
        if self.bytes > TERM_CACHE_BYTES {
            let mut by_age: Vec<(u64, TermKey)> =
                self.map.iter().map(|(k, v)| (v.1, k.clone())).collect();
            by_age.sort_unstable_by_key(|e| e.0);
            for (_, k) in by_age {
                if self.bytes <= TERM_CACHE_BYTES / 4 * 3 {
                    break;
                }
                if let Some((old, _)) = self.map.remove(&k) {
                    self.bytes -= old.bytes() + k.2.len();
                }
            }
        }
    }
}

/// The best `k` hits seen so far.
struct TopK {
    k: usize,
    heap: BinaryHeap<Reverse<Hit>>,
}

impl TopK {
    fn new(k: usize) -> Self {
        Self {
            k,
            heap: BinaryHeap::with_capacity(k + 1),
        }
    }

    /// The `k`-th best score once `k` hits are held: a document scoring below it cannot enter
    /// (one scoring equal can, with a lower chunk id).
    fn threshold(&self) -> Option<f32> {
        (self.heap.len() >= self.k)
            .then(|| self.heap.peek().map(|w| w.0.score))
            .flatten()
    }

    /// Keeps `h` if it is among the best `k`; whether it was kept.
    fn offer(&mut self, h: Hit) -> bool {
        if self.heap.len() < self.k {
            self.heap.push(Reverse(h));
            return true;
        }
        match self.heap.peek() {
            Some(worst) if h > worst.0 => {
                self.heap.pop();
                self.heap.push(Reverse(h));
                true
            }
            _ => false,
        }
    }

    /// Best first.
    fn into_sorted(self) -> Vec<Hit> {
        let mut v: Vec<Hit> = self.heap.into_iter().map(|r| r.0).collect();
        v.sort_unstable_by(|a, b| b.cmp(a));
        v
    }
}

/// How many of the cursors (ascending bound, `prefix` their running bound sums) cannot lift a
/// document to `threshold` on their own.
fn essential_from(
    prefix: &[f64],
    threshold: Option<f32>,
    below: &impl Fn(f64, Option<f32>) -> bool,
) -> usize {
    let mut e = 0;
    while e + 1 < prefix.len() && below(prefix[e + 1], threshold) {
        e += 1;
    }
    e
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

/// One visible posting of a query term (the exhaustive search's).
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

    impl Bm25Index {
        /// [`Bm25Index::search`] with `filter`'s own bitmap as the visible set.
        fn search_only(
            &self,
            query: &str,
            k: usize,
            filter: &Only,
            visible_chunks: u64,
        ) -> Result<Vec<(u32, f32)>> {
            self.search(query, k, filter, &filter.0, visible_chunks)
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
            .search_only("layer flutter", 10, &Only(allowed.clone()), 3)
            .unwrap();
        let got: RoaringBitmap = hits.iter().map(|h| h.0).collect();
        assert_eq!(got, allowed);
        // Stemming + lowercase: "LAYERS" matches "layers" and "layer".
        let all = Only((0..50).collect());
        assert_eq!(idx.search_only("LAYER", 100, &all, 50).unwrap().len(), 50);
        // Stop words only: no match (not "everything"); syntax characters are plain text.
        assert!(
            idx.search_only("the with", 10, &all, 50)
                .unwrap()
                .is_empty()
        );
        assert_eq!(
            idx.search_only("flutter: \"(AND", 5, &all, 50)
                .unwrap()
                .len(),
            5
        );
        assert!(idx.search_only("text:flutter", 5, &all, 50).unwrap().len() == 5);
        assert!(idx.search_only("*", 5, &all, 50).unwrap().is_empty());
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
            let ours = idx.search_only(q, 40, &all, 40).unwrap();
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

    /// A random corpus in several segments (batches, replacements and deletes), with ties.
    fn random_index(
        seed: u64,
        docs: u32,
        vocab: usize,
        avg: f32,
    ) -> (tempfile::TempDir, Bm25Index, Vec<u32>) {
        let mut rng = crate::vector::synth::Rng::new(seed);
        let dir = tempfile::tempdir().unwrap();
        let cfg = Bm25Config {
            avg_chunk_tokens: avg,
            ..Bm25Config::default()
        };
        let idx = Bm25Index::open(dir.path(), &cfg).unwrap();
        // Chunk ids sparse and out of order (a segment's documents are not in chunk order).
        let mut ids: Vec<u32> = (0..docs).map(|i| i * 3 + (rng.below(3) as u32)).collect();
        for i in (1..ids.len()).rev() {
            ids.swap(i, rng.below(i as u64 + 1) as usize);
        }
        let text = |rng: &mut crate::vector::synth::Rng| {
            // Zipf-like: low word indices much more frequent; short texts give equal scores.
            let short = rng.unit() < 0.3;
            let len = 1 + rng.below(if short { 3 } else { 40 }) as usize;
            (0..len)
                .map(|_| {
                    let r = rng.unit();
                    format!("w{}", ((r * r * r) * vocab as f64) as usize)
                })
                .collect::<Vec<_>>()
                .join(" ")
        };
        let mut live: Vec<u32> = Vec::new();
        for batch in ids.chunks(1 + rng.below(u64::from(docs)) as usize) {
            let add: Vec<(u32, String)> = batch.iter().map(|&c| (c, text(&mut rng))).collect();
            idx.write(&add, &[]).unwrap();
            live.extend(batch);
            // Replace a few (old versions become deleted documents) and delete a few.
            let mut again: Vec<(u32, String)> = Vec::new();
            for _ in 0..rng.below(4) {
                // Distinct ids (the engine never writes one chunk twice in a batch).
                let c = live[rng.below(live.len() as u64) as usize];
                if again.iter().all(|a| a.0 != c) {
                    again.push((c, text(&mut rng)));
                }
            }
            let gone: Vec<u32> = (0..rng.below(3))
                .map(|_| live[rng.below(live.len() as u64) as usize])
                .filter(|c| again.iter().all(|a| a.0 != *c))
                .collect();
            idx.write(&again, &gone).unwrap();
            live.retain(|c| !gone.contains(c));
        }
        (dir, idx, live)
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(40))]

        /// The pruned search returns exactly what the exhaustive one did: same chunk ids in the
        /// same order, scores equal to the bit, for random corpora, visible sets and queries
        /// (and so does `search`, whichever of the two it runs).
        #[test]
        fn pruned_search_equals_the_exhaustive_one(
            seed in 0u64..u64::MAX,
            docs in 1u32..400,
            vocab in 2usize..60,
            avg in proptest::sample::select(vec![5.0f32, 20.0, 100.0]),
        ) {
            let (_dir, idx, live) = random_index(seed, docs, vocab, avg);
            let mut rng = crate::vector::synth::Rng::new(seed ^ 0xabcdef);
            for _ in 0..6 {
                // Visible: a fraction of the live chunks, plus ids the index does not hold.
                let frac = [0.0, 0.01, 0.1, 0.5, 1.0][rng.below(5) as usize];
                let mut vis: RoaringBitmap =
                    live.iter().copied().filter(|_| rng.unit() < frac).collect();
                let visible_chunks = vis.len() + rng.below(3);
                vis.insert(docs * 3 + 10);
                let filter = Only(vis.clone());
                for _ in 0..8 {
                    let n = 1 + rng.below(6) as usize;
                    let q: Vec<String> = (0..n)
                        .map(|_| format!("w{}", rng.below(vocab as u64 + 3)))
                        .collect();
                    let q = q.join(" ");
                    let k = 1 + rng.below(25) as usize;
                    let want = idx.search_exhaustive(&q, k, &filter, visible_chunks).unwrap();
                    let got = idx
                        .search_pruned(&q, k, &filter, &vis, visible_chunks)
                        .unwrap();
                    let routed = idx.search(&q, k, &filter, &vis, visible_chunks).unwrap();
                    let bits = |v: &[(u32, f32)]| -> Vec<(u32, u32)> {
                        v.iter().map(|h| (h.0, h.1.to_bits())).collect()
                    };
                    proptest::prop_assert_eq!(bits(&got), bits(&want), "query {:?} k {}", q, k);
                    proptest::prop_assert_eq!(bits(&routed), bits(&want), "query {:?} k {}", q, k);
                }
            }
        }
    }
}
