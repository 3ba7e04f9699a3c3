//! Choosing the next token (greedy, temperature, top-p with a per-request seed) and deciding
//! when a sequence stops (stop tokens, stop strings, max tokens).

use std::sync::Arc;

/// Turns token ids into text (e.g. a `tokenizers::Tokenizer`'s decode with special tokens
/// skipped). Needed for text pieces and stop strings.
pub type Detokenizer = Arc<dyn Fn(&[u32]) -> String + Send + Sync>;

/// How one request samples and when it stops.
#[derive(Debug, Clone, PartialEq)]
pub struct SamplingParams {
    /// 0 (or below) means greedy: the argmax of the logits.
    pub temperature: f32,
    /// Nucleus sampling: keep the smallest set of most likely tokens whose probability mass
    /// reaches `top_p` (1.0 keeps everything). Ignored when greedy.
    pub top_p: f32,
    /// Seed of the request's random stream; the same seed, prompt and parameters give the same
    /// tokens. `None` picks a seed from the clock.
    pub seed: Option<u64>,
    /// Maximum number of generated tokens (the stop token, if any, is not counted).
    pub max_tokens: usize,
    /// Token ids that end generation (not emitted). Empty means the model's end-of-generation
    /// ids.
    pub stop_token_ids: Vec<u32>,
    /// Strings that end generation; the text up to the match is emitted, the match is not.
    /// Needs a detokenizer on the engine.
    pub stop_strings: Vec<String>,
}

impl Default for SamplingParams {
    fn default() -> Self {
        Self {
            temperature: 0.0,
            top_p: 1.0,
            seed: None,
            max_tokens: 256,
            stop_token_ids: Vec::new(),
            stop_strings: Vec::new(),
        }
    }
}

impl SamplingParams {
    /// Greedy decoding of at most `max_tokens` tokens.
    pub fn greedy(max_tokens: usize) -> Self {
        Self {
            max_tokens,
            ..Self::default()
        }
    }
}

/// SplitMix64: a tiny, fully specified generator, so a seed gives the same stream on every
/// build (no dependence on a library's unspecified "standard" generator).
#[derive(Debug, Clone)]
pub(crate) struct Rng(u64);

impl Rng {
    pub(crate) fn new(seed: u64) -> Self {
        Self(seed)
    }

    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// Index of the largest logit (the first one on ties, as llama.cpp's greedy sampler).
pub fn argmax(logits: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &v) in logits.iter().enumerate() {
        if v > logits[best] {
            best = i;
        }
    }
    best as u32
}

/// Candidates examined before falling back to a full sort in top-p.
const TOP_P_WINDOW: usize = 256;

/// Samples one token from `logits` under `params`, drawing from `rng` unless greedy.
pub(crate) fn sample(logits: &[f32], params: &SamplingParams, rng: &mut Rng) -> u32 {
    if params.temperature <= 0.0 || logits.len() < 2 {
        return argmax(logits);
    }
    let t = f64::from(params.temperature);
    let max = f64::from(logits[argmax(logits) as usize]);
    let mut probs: Vec<(f64, u32)> = logits
        .iter()
        .enumerate()
        .map(|(i, &l)| (((f64::from(l) - max) / t).exp(), i as u32))
        .collect();
    let total: f64 = probs.iter().map(|p| p.0).sum();
    let by_prob_desc = |a: &(f64, u32), b: &(f64, u32)| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1));
    let top_p = f64::from(params.top_p.clamp(0.0, 1.0));
    let kept: &mut [(f64, u32)] = if top_p >= 1.0 {
        &mut probs
    } else {
        // The nucleus is almost always within the few hundred most likely tokens: select them
        // in O(n), sort only those, and fall back to a full sort when they do not reach top_p.
        let window = TOP_P_WINDOW.min(probs.len());
        if window < probs.len() {
            probs.select_nth_unstable_by(window - 1, by_prob_desc);
        }
        probs[..window].sort_unstable_by(by_prob_desc);
        let mut mass = 0.0;
        let mut cut = None;
        for (i, p) in probs[..window].iter().enumerate() {
            mass += p.0 / total;
            if mass >= top_p {
                cut = Some(i + 1);
                break;
            }
        }
        let cut = match cut {
            Some(c) => c,
            None => {
                probs.sort_unstable_by(by_prob_desc);
                let mut mass = 0.0;
                probs
                    .iter()
                    .position(|p| {
                        mass += p.0 / total;
                        mass >= top_p
                    })
                    .map_or(probs.len(), |i| i + 1)
            }
        };
        &mut probs[..cut.max(1)]
    };
    let kept_total: f64 = kept.iter().map(|p| p.0).sum();
    let mut x = rng.next_f64() * kept_total;
    for p in kept.iter() {
        x -= p.0;
        if x < 0.0 {
            return p.1;
        }
    }
    kept[kept.len() - 1].1
}

/// Incremental detokenization with stop-string matching.
///
/// Text is produced by decoding a sliding window of ids (so multi-byte characters split across
/// tokens come out whole), and any tail that could still become a stop string is held back until
/// it is decided.
pub(crate) struct TextStream {
    detok: Detokenizer,
    stops: Vec<String>,
    ids: Vec<u32>,
    prefix_offset: usize,
    read_offset: usize,
    /// Decoded text not yet released (it may be the start of a stop string).
    pending: String,
}

/// What one new token did to the text.
pub(crate) struct TextStep {
    /// Text released to the client with this token (may be empty).
    pub piece: String,
    /// A stop string matched: generation ends, the match and what follows are dropped.
    pub stopped: bool,
}

impl TextStream {
    pub(crate) fn new(detok: Detokenizer, stops: Vec<String>) -> Self {
        Self {
            detok,
            stops: stops.into_iter().filter(|s| !s.is_empty()).collect(),
            ids: Vec::new(),
            prefix_offset: 0,
            read_offset: 0,
            pending: String::new(),
        }
    }

    pub(crate) fn push(&mut self, id: u32) -> TextStep {
        self.ids.push(id);
        let prefix = (self.detok)(&self.ids[self.prefix_offset..self.read_offset]);
        let full = (self.detok)(&self.ids[self.prefix_offset..]);
        if full.len() > prefix.len()
            && !full.ends_with('\u{FFFD}')
            && full.is_char_boundary(prefix.len())
        {
            self.pending.push_str(&full[prefix.len()..]);
            self.prefix_offset = self.read_offset;
            self.read_offset = self.ids.len();
        }
        if let Some(at) = self
            .stops
            .iter()
            .filter_map(|s| self.pending.find(s.as_str()))
            .min()
        {
            let piece = self.pending[..at].to_string();
            self.pending.clear();
            return TextStep {
                piece,
                stopped: true,
            };
        }
        // Hold back the longest tail that is a proper prefix of some stop string.
        let hold = self
            .stops
            .iter()
            .map(|s| longest_suffix_prefix(&self.pending, s))
            .max()
            .unwrap_or(0);
        let release = self.pending.len() - hold;
        let piece: String = self.pending.drain(..release).collect();
        TextStep {
            piece,
            stopped: false,
        }
    }

    /// Text held back at the end of generation (no stop string matched).
    pub(crate) fn finish(&mut self) -> String {
        std::mem::take(&mut self.pending)
    }
}

/// Length of the longest suffix of `text` that is a proper prefix of `stop`.
fn longest_suffix_prefix(text: &str, stop: &str) -> usize {
    let max = (stop.len() - 1).min(text.len());
    (1..=max)
        .rev()
        .find(|&n| {
            text.is_char_boundary(text.len() - n) && stop.starts_with(&text[text.len() - n..])
        })
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(temperature: f32, top_p: f32) -> SamplingParams {
        SamplingParams {
            temperature,
            top_p,
            ..SamplingParams::default()
        }
    }

    #[test]
    fn greedy_is_argmax_first_on_ties() {
        let mut rng = Rng::new(1);
        assert_eq!(
            sample(&[0.1, 3.0, 3.0, -1.0], &params(0.0, 1.0), &mut rng),
            1
        );
    }

    #[test]
    fn same_seed_same_tokens_and_distribution_follows_temperature() {
        let logits: Vec<f32> = (0..10).map(|i| i as f32 * 0.3).collect();
        let p = params(1.0, 1.0);
        let draw = |seed| {
            let mut rng = Rng::new(seed);
            (0..200)
                .map(|_| sample(&logits, &p, &mut rng))
                .collect::<Vec<_>>()
        };
        assert_eq!(draw(7), draw(7));
        assert_ne!(draw(7), draw(8));
        // Frequencies follow the softmax within sampling noise.
        let mut rng = Rng::new(3);
        let mut counts = [0usize; 10];
        let n = 20_000;
        for _ in 0..n {
            counts[sample(&logits, &p, &mut rng) as usize] += 1;
        }
        let z: f64 = (0..10).map(|i| (i as f64 * 0.3).exp()).sum();
        for (i, &c) in counts.iter().enumerate() {
            let want = (i as f64 * 0.3).exp() / z;
            assert!((c as f64 / n as f64 - want).abs() < 0.015, "token {i}");
        }
    }

    #[test]
    fn top_p_keeps_only_the_nucleus() {
        // probabilities ~ 0.6, 0.3, 0.1 (and tiny rest): top_p 0.8 keeps the first two only.
        let mut logits = vec![-30.0f32; 1000];
        logits[5] = (0.6f32).ln();
        logits[9] = (0.3f32).ln();
        logits[2] = (0.1f32).ln();
        let p = params(1.0, 0.8);
        let mut rng = Rng::new(11);
        let mut seen = std::collections::BTreeSet::new();
        for _ in 0..2000 {
            seen.insert(sample(&logits, &p, &mut rng));
        }
        assert_eq!(seen.into_iter().collect::<Vec<_>>(), vec![5, 9]);
        // A tiny top_p degenerates to greedy.
        let p = params(1.0, 0.01);
        assert!((0..100).all(|_| sample(&logits, &p, &mut rng) == 5));
    }

    #[test]
    fn top_p_falls_back_to_full_sort_for_flat_distributions() {
        let logits = vec![0.0f32; 2000];
        let p = params(1.0, 0.9);
        let mut rng = Rng::new(5);
        let distinct: std::collections::BTreeSet<u32> =
            (0..3000).map(|_| sample(&logits, &p, &mut rng)).collect();
        assert!(distinct.len() > 500);
    }

    fn char_detok() -> Detokenizer {
        // Token i is the i-th char of this table; 100 and 101 are the two halves of "é".
        Arc::new(|ids: &[u32]| {
            let mut bytes = Vec::new();
            for &id in ids {
                match id {
                    100 => bytes.push(0xC3),
                    101 => bytes.push(0xA9),
                    _ => bytes.push(id as u8),
                }
            }
            String::from_utf8_lossy(&bytes).into_owned()
        })
    }

    #[test]
    fn text_stream_joins_split_characters() {
        let mut s = TextStream::new(char_detok(), vec![]);
        assert_eq!(s.push(b'a' as u32).piece, "a");
        assert_eq!(s.push(100).piece, "");
        assert_eq!(s.push(101).piece, "é");
        assert_eq!(s.push(b'b' as u32).piece, "b");
        assert_eq!(s.finish(), "");
    }

    #[test]
    fn stop_strings_cut_and_hold_back() {
        let mut s = TextStream::new(char_detok(), vec!["END".into()]);
        let mut out = String::new();
        for c in "abE".bytes() {
            let step = s.push(u32::from(c));
            assert!(!step.stopped);
            out.push_str(&step.piece);
        }
        // "E" might start "END": held back.
        assert_eq!(out, "ab");
        let step = s.push(u32::from(b'x'));
        assert_eq!(step.piece, "Ex");
        for c in "yEN".bytes() {
            out.push_str(&s.push(u32::from(c)).piece);
        }
        let step = s.push(u32::from(b'D'));
        assert!(step.stopped);
        assert_eq!(step.piece, "");
        // Without a match, the held tail is released at the end.
        let mut s = TextStream::new(char_detok(), vec!["END".into()]);
        assert_eq!(s.push(u32::from(b'E')).piece, "");
        assert_eq!(s.finish(), "E");
    }
}
