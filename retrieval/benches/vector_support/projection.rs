//! The BENCH-ONLY embedder of `hybrid_latency` and `scale`: a fixed random projection of the bag
//! of words (texts that share words are close, like sentence embeddings), so that hundreds of
//! thousands of chunks can be ingested through the real engine on 2 cores (MiniLM would take
//! hours). Its vectors say nothing about retrieval quality; only the engine is timed.

use std::collections::HashMap;
use std::sync::Arc;

use airlock_retrieval::vector::synth::Rng;
use airlock_retrieval::{Embed, ModelError};
use parking_lot::Mutex;

pub const DIM: usize = 384;

/// BENCH-ONLY embedder: normalised sum of fixed random unit vectors, one per distinct word.
pub struct ProjectionEmbedder {
    words: Mutex<HashMap<String, Arc<Vec<f32>>>>,
}

fn spans(text: &str) -> Vec<(usize, usize)> {
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

impl ProjectionEmbedder {
    fn word(&self, w: &str) -> Arc<Vec<f32>> {
        let key = w.to_lowercase();
        if let Some(v) = self.words.lock().get(&key) {
            return Arc::clone(v);
        }
        let seed = key.bytes().fold(0xcbf29ce484222325u64, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x100000001b3)
        });
        let mut rng = Rng::new(seed);
        let mut v: Vec<f32> = (0..DIM).map(|_| rng.normal() as f32).collect();
        airlock_retrieval::vector::synth::normalize(&mut v);
        let v = Arc::new(v);
        self.words.lock().insert(key, Arc::clone(&v));
        v
    }
}

impl Embed for ProjectionEmbedder {
    fn dim(&self) -> usize {
        DIM
    }
    fn max_tokens(&self) -> usize {
        256
    }
    fn token_spans(&self, text: &str) -> Result<Vec<(usize, usize)>, ModelError> {
        Ok(spans(text))
    }
    fn embed(&self, texts: &[&str]) -> Result<Vec<Vec<f32>>, ModelError> {
        Ok(texts
            .iter()
            .map(|t| {
                let mut acc = vec![0f32; DIM];
                for (s, e) in spans(t).into_iter().take(254) {
                    let w = &t[s..e];
                    if w.len() > 2 && w.chars().all(char::is_alphanumeric) {
                        for (a, x) in acc.iter_mut().zip(self.word(w).iter()) {
                            *a += x;
                        }
                    }
                }
                acc[0] += 1e-3;
                airlock_retrieval::vector::synth::normalize(&mut acc);
                acc
            })
            .collect())
    }
}

impl ProjectionEmbedder {
    /// An embedder with an empty word cache (the word vectors are derived from the words).
    pub fn new() -> Self {
        Self {
            words: Mutex::new(HashMap::new()),
        }
    }
}
