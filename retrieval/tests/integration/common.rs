//! Shared test fixtures: a deterministic test embedder and engine helpers.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use airlock_acl::AllowSet;
use airlock_retrieval::{Embed, ModelError, Retrieval, RetrievalConfig};
use roaring::RoaringBitmap;

/// TEST-ONLY embedder: words (alphanumeric runs) are the tokens, each punctuation character is a
/// token too; a text's vector is the normalised sum of one-hot-by-hash word vectors. Texts sharing
/// words are similar, which is all the engine tests need. The daemon uses the real MiniLM.
pub struct HashEmbedder {
    pub dim: usize,
    pub max_tokens: usize,
}

impl Default for HashEmbedder {
    fn default() -> Self {
        Self {
            dim: 64,
            max_tokens: 256,
        }
    }
}

pub fn word_spans(text: &str) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    let mut start: Option<usize> = None;
    for (i, c) in text.char_indices() {
        if c.is_alphanumeric() {
            start.get_or_insert(i);
            continue;
        }
        if let Some(s) = start.take() {
            out.push((s, i));
        }
        if !c.is_whitespace() {
            out.push((i, i + c.len_utf8()));
        }
    }
    if let Some(s) = start {
        out.push((s, text.len()));
    }
    out
}

/// The vector component a word of `text` adds to in [`HashEmbedder`] of dimension `dim`.
pub fn bucket(word: &str, dim: usize) -> usize {
    (fnv(word) % dim as u64) as usize
}

fn fnv(s: &str) -> u64 {
    let mut h: u64 = 0xcbf29ce484222325;
    for b in s.to_lowercase().bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x100000001b3);
    }
    h
}

impl Embed for HashEmbedder {
    fn dim(&self) -> usize {
        self.dim
    }
    fn max_tokens(&self) -> usize {
        self.max_tokens
    }
    fn token_spans(&self, text: &str) -> Result<Vec<(usize, usize)>, ModelError> {
        Ok(word_spans(text))
    }
    fn embed(&self, texts: &[&str]) -> Result<Vec<Vec<f32>>, ModelError> {
        Ok(texts
            .iter()
            .map(|t| {
                let mut v = vec![0f32; self.dim];
                for (s, e) in word_spans(t) {
                    let w = &t[s..e];
                    if w.chars().all(char::is_alphanumeric) {
                        v[bucket(w, self.dim)] += 1.0;
                    }
                }
                let n = v.iter().map(|x| x * x).sum::<f32>().sqrt();
                if n > 0.0 {
                    v.iter_mut().for_each(|x| *x /= n);
                } else {
                    v[0] = 1.0;
                }
                v
            })
            .collect())
    }
}

pub fn test_config() -> RetrievalConfig {
    let mut c = RetrievalConfig::default();
    c.bm25.writer_memory_bytes = 15 << 20;
    c
}

pub struct Env {
    pub dir: tempfile::TempDir,
}

impl Env {
    pub fn new() -> Self {
        Self {
            dir: tempfile::tempdir().unwrap(),
        }
    }
    pub fn index(&self) -> PathBuf {
        self.dir.path().join("index")
    }
    pub fn open_bm25(&self, cfg: RetrievalConfig) -> Retrieval {
        open_bm25_at(self.dir.path(), cfg)
    }
    pub fn open(&self, cfg: RetrievalConfig) -> Retrieval {
        open_at(self.dir.path(), cfg)
    }
}

/// Full engine (BM25 + int8 vector index) with the test embedder.
pub fn open_at(dir: &Path, cfg: RetrievalConfig) -> Retrieval {
    Retrieval::open(
        &dir.join("airlock.db"),
        &dir.join("index"),
        cfg,
        Arc::new(HashEmbedder::default()),
        None,
    )
    .unwrap()
}

pub fn open_bm25_at(dir: &Path, cfg: RetrievalConfig) -> Retrieval {
    Retrieval::open_bm25_only(
        &dir.join("airlock.db"),
        &dir.join("index"),
        cfg,
        Arc::new(HashEmbedder::default()),
        None,
    )
    .unwrap()
}

pub fn allow(ordinals: impl IntoIterator<Item = u32>) -> AllowSet {
    AllowSet::from_bitmap_for_tests(ordinals.into_iter().collect::<RoaringBitmap>())
}

pub fn allow_all() -> AllowSet {
    let mut b = RoaringBitmap::new();
    b.insert_range(0..1_000_000);
    AllowSet::from_bitmap_for_tests(b)
}

/// `$AIRLOCK_SHARED_DIR` or `<repo>/../shared`.
pub fn shared_dir() -> PathBuf {
    std::env::var_os("AIRLOCK_SHARED_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared"))
}
