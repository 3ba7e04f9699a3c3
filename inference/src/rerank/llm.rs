//! A generator as relevance judge: the chat template asks "is the document relevant to the
//! query?" and the score is `logsumexp(yes logits) - logsumexp(no logits)` at the first answer
//! position. It runs on the engine's own decoder ([`DecoderModel`]: our quantized kernels, one
//! thread pool, llama and qwen2 architectures). The prompt prefix (system message and query) is
//! prefilled once per query; each passage continues from a copy of that KV cache, and the
//! passages are prefilled together, [`PASSAGES_PER_FORWARD`] per batched forward, so every
//! weight is read once for the group.

use tokenizers::Tokenizer;

use crate::catalogue::GeneratorFiles;
use crate::chat::{ChatMessage, ChatTemplate};
use crate::error::{Error, Result};
use crate::generate::{DecoderModel, SeqChunk};
use crate::tokenizer;

/// Settings of the LLM relevance scorer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LlmScorerConfig {
    /// Name for errors and reports.
    pub name: String,
    /// Passages are cut to this many tokens (the judge's cost is linear in it).
    pub max_passage_tokens: usize,
}

impl Default for LlmScorerConfig {
    fn default() -> Self {
        Self {
            name: "llm-yes-no".into(),
            max_passage_tokens: 192,
        }
    }
}

/// Passages prefilled together in one batched forward (bounds the step's activations:
/// ≤ 8 × (max_passage_tokens + suffix) rows).
pub const PASSAGES_PER_FORWARD: usize = 8;

const SYSTEM: &str = "You judge search results. Answer only yes or no.";
const PLACEHOLDER: &str = "\u{1}PASSAGE\u{1}";

/// A GGUF generator (SmolLM2, Qwen2.5) used as a yes/no relevance judge.
pub struct LlmRelevanceScorer {
    model: DecoderModel,
    tokenizer: Tokenizer,
    template: ChatTemplate,
    yes_ids: Vec<u32>,
    no_ids: Vec<u32>,
    cfg: LlmScorerConfig,
}

impl std::fmt::Debug for LlmRelevanceScorer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LlmRelevanceScorer")
            .field("name", &self.cfg.name)
            .finish_non_exhaustive()
    }
}

impl LlmRelevanceScorer {
    /// Loads a generator from its bundle files.
    pub fn load(files: &GeneratorFiles, cfg: LlmScorerConfig) -> Result<Self> {
        if cfg.max_passage_tokens == 0 {
            return Err(Error::InvalidInput(
                "LLM scorer: max_passage_tokens must be at least 1".into(),
            ));
        }
        let model = DecoderModel::load(&files.gguf)?;
        let tokenizer = tokenizer::load_plain(&files.tokenizer)?;
        let source = std::fs::read_to_string(&files.chat_template)
            .map_err(|e| Error::io(&files.chat_template, e))?;
        let template = ChatTemplate::new(&cfg.name, &source, "", "")?;
        let first_id = |word: &str| -> Result<u32> {
            let enc = tokenizer
                .encode(word, false)
                .map_err(|e| Error::tokenizer(&cfg.name, e))?;
            match enc.get_ids() {
                [id] => Ok(*id),
                ids => Err(Error::tokenizer(
                    &cfg.name,
                    format!("{word:?} is {} tokens, expected one", ids.len()),
                )),
            }
        };
        let yes_ids = vec![first_id("yes")?, first_id("Yes")?];
        let no_ids = vec![first_id("no")?, first_id("No")?];
        Ok(Self {
            model,
            tokenizer,
            template,
            yes_ids,
            no_ids,
            cfg,
        })
    }

    /// One score per passage (log-odds of "yes" over "no"), in order.
    pub fn score(&self, query: &str, passages: &[&str]) -> Result<Vec<f32>> {
        let _span = tracing::debug_span!("llm-rerank", model = %self.cfg.name, n = passages.len())
            .entered();
        if passages.is_empty() {
            return Ok(Vec::new());
        }
        let user = format!(
            "Query: {query}\nDocument:\n{PLACEHOLDER}\nIs the document relevant to the query?"
        );
        let rendered = self.template.render(
            &[
                ChatMessage::new("system", SYSTEM),
                ChatMessage::new("user", user),
            ],
            true,
        )?;
        let (prefix, suffix) = rendered
            .split_once(PLACEHOLDER)
            .ok_or_else(|| Error::InvalidInput("query contains the placeholder".into()))?;
        let encode = |text: &str, add_special: bool| -> Result<Vec<u32>> {
            Ok(self
                .tokenizer
                .encode(text, add_special)
                .map_err(|e| Error::tokenizer(&self.cfg.name, e))?
                .get_ids()
                .to_vec())
        };
        let prefix_ids = encode(prefix, true)?;
        let suffix_ids = encode(suffix, false)?;
        let mut base = self.model.new_cache();
        self.model.forward(&mut [SeqChunk {
            tokens: &prefix_ids,
            cache: &mut base,
            want_logits: false,
        }])?;
        let mut inputs = Vec::with_capacity(passages.len());
        for p in passages {
            let mut ids = encode(p, false)?;
            ids.truncate(self.cfg.max_passage_tokens);
            ids.extend_from_slice(&suffix_ids);
            inputs.push(ids);
        }
        let mut out = Vec::with_capacity(passages.len());
        for group in inputs.chunks(PASSAGES_PER_FORWARD) {
            let mut caches: Vec<_> = group.iter().map(|_| base.clone()).collect();
            let mut chunks: Vec<SeqChunk<'_>> = group
                .iter()
                .zip(caches.iter_mut())
                .map(|(ids, cache)| SeqChunk {
                    tokens: ids,
                    cache,
                    want_logits: true,
                })
                .collect();
            for logits in self.model.forward(&mut chunks)? {
                let logits = logits.ok_or_else(|| {
                    Error::InvalidInput("LLM scorer: the model returned no logits".into())
                })?;
                out.push(log_sum_exp(&logits, &self.yes_ids) - log_sum_exp(&logits, &self.no_ids));
            }
        }
        Ok(out)
    }
}

fn log_sum_exp(logits: &[f32], ids: &[u32]) -> f32 {
    let vals: Vec<f32> = ids.iter().map(|&i| logits[i as usize]).collect();
    let max = vals.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    max + vals.iter().map(|v| (v - max).exp()).sum::<f32>().ln()
}

#[cfg(test)]
mod tests {
    #[test]
    fn log_sum_exp_is_stable() {
        let l = [1000.0f32, 1000.0, -5.0];
        let v = super::log_sum_exp(&l, &[0, 1]);
        assert!((v - (1000.0 + 2f32.ln())).abs() < 1e-3);
        assert_eq!(super::log_sum_exp(&l, &[2]), -5.0);
    }
}
