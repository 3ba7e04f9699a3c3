//! BERT cross-encoder (`BertForSequenceClassification` safetensors layout).

use std::path::{Path, PathBuf};

use candle_core::{Device, IndexOp, Module, Tensor};
use candle_nn::Linear;
use tokenizers::Tokenizer;

use crate::bert;
use crate::bert_fast::FastBert;
use crate::error::{Error, Result};
use crate::tokenizer;

/// The files of a cross-encoder model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CrossEncoderFiles {
    /// `model.safetensors` with `bert.*` (or unprefixed), `[bert.]pooler.dense.*` and
    /// `classifier.*` tensors.
    pub weights: PathBuf,
    /// Hugging Face `config.json` (BERT fields plus optional `num_labels` / `id2label`).
    pub config: PathBuf,
    /// WordPiece `tokenizer.json` with a pair template (`[CLS] A [SEP] B [SEP]`).
    pub tokenizer: PathBuf,
}

impl CrossEncoderFiles {
    /// The conventional names inside one model directory.
    pub fn in_dir(dir: &Path) -> Self {
        Self {
            weights: dir.join("model.safetensors"),
            config: dir.join("config.json"),
            tokenizer: dir.join("tokenizer.json"),
        }
    }
}

/// Cross-encoder settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CrossEncoderConfig {
    /// Name for errors and stage reports.
    pub name: String,
    /// Maximum tokens per pair, special tokens included (longest side truncated first).
    pub max_tokens: usize,
    /// Maximum pairs per forward pass.
    pub batch_size: usize,
}

impl Default for CrossEncoderConfig {
    fn default() -> Self {
        Self {
            name: "cross-encoder".into(),
            max_tokens: 512,
            batch_size: 16,
        }
    }
}

/// A loaded cross-encoder.
pub struct CrossEncoder {
    bert: FastBert,
    pooler: Linear,
    classifier: Linear,
    num_labels: usize,
    tokenizer: Tokenizer,
    hidden: usize,
    cfg: CrossEncoderConfig,
}

impl std::fmt::Debug for CrossEncoder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CrossEncoder")
            .field("name", &self.cfg.name)
            .field("num_labels", &self.num_labels)
            .finish_non_exhaustive()
    }
}

impl CrossEncoder {
    /// Loads the model (CPU, f32).
    pub fn load(files: &CrossEncoderFiles, cfg: CrossEncoderConfig) -> Result<Self> {
        let device = Device::Cpu;
        let config = bert::read_config(&files.config)?;
        let raw: serde_json::Value = serde_json::from_slice(
            &std::fs::read(&files.config).map_err(|e| Error::io(&files.config, e))?,
        )
        .map_err(|e| Error::invalid(&files.config, e.to_string()))?;
        let num_labels = raw["num_labels"]
            .as_u64()
            .map(|n| n as usize)
            .or_else(|| raw["id2label"].as_object().map(serde_json::Map::len))
            .unwrap_or(1);
        if cfg.max_tokens < 4 || cfg.max_tokens > config.max_position_embeddings {
            return Err(Error::invalid(
                &files.config,
                format!(
                    "max_tokens {} outside 4..={}",
                    cfg.max_tokens, config.max_position_embeddings
                ),
            ));
        }
        let vb = bert::read_weights(&files.weights, &device)?;
        let invalid = |e: candle_core::Error| Error::invalid(&files.weights, e.to_string());
        let h = config.hidden_size;
        // Hugging Face checkpoints prefix the encoder with `bert.`; sentence-transformers
        // exports of the same layout sometimes do not.
        let base = if vb.contains_tensor("bert.embeddings.word_embeddings.weight") {
            vb.pp("bert")
        } else {
            vb.clone()
        };
        let bert = FastBert::load(base.clone(), &config).map_err(invalid)?;
        let pooler = candle_nn::linear(h, h, base.pp("pooler.dense")).map_err(invalid)?;
        let classifier = candle_nn::linear(h, num_labels, vb.pp("classifier")).map_err(invalid)?;
        let tokenizer = tokenizer::load_with_limit(&files.tokenizer, cfg.max_tokens)?;
        if cfg.batch_size == 0 {
            return Err(Error::InvalidInput("cross-encoder batch_size 0".into()));
        }
        Ok(Self {
            bert,
            pooler,
            classifier,
            num_labels,
            tokenizer,
            hidden: h,
            cfg,
        })
    }

    /// The configured name.
    pub fn name(&self) -> &str {
        &self.cfg.name
    }

    /// One relevance score per passage, in order: the classifier logit (with two or more labels,
    /// the logit of the last label, "relevant", minus the first).
    pub fn score(&self, query: &str, passages: &[&str]) -> Result<Vec<f32>> {
        let _span =
            tracing::debug_span!("rerank", model = %self.cfg.name, n = passages.len()).entered();
        let encs = passages
            .iter()
            .map(|p| self.tokenizer.encode((query, *p), true))
            .collect::<std::result::Result<Vec<_>, _>>()
            .map_err(|e| Error::tokenizer(&self.cfg.name, e))?;
        let lens: Vec<usize> = encs.iter().map(|e| e.get_ids().len()).collect();
        let cap = self.cfg.batch_size * self.cfg.max_tokens;
        let mut out = Vec::with_capacity(passages.len());
        for batch in bert::token_batches(&lens, self.cfg.batch_size, cap) {
            let rows: Vec<(&[u32], &[u32])> = encs[batch]
                .iter()
                .map(|e| (e.get_ids(), e.get_type_ids()))
                .collect();
            let scores = self
                .forward_batch(&rows)
                .map_err(Error::tensor(&self.cfg.name))?;
            out.extend(scores);
        }
        Ok(out)
    }

    fn forward_batch(&self, rows: &[(&[u32], &[u32])]) -> candle_core::Result<Vec<f32>> {
        let hidden = self.bert.forward(rows)?;
        let cls: Vec<f32> = (0..hidden.len())
            .flat_map(|i| hidden.first(i).iter().copied())
            .collect();
        let cls = Tensor::from_vec(cls, (rows.len(), self.hidden), &Device::Cpu)?;
        let pooled = self.pooler.forward(&cls)?.tanh()?;
        let logits = self.classifier.forward(&pooled)?;
        let logits: Tensor = if self.num_labels == 1 {
            logits.squeeze(1)?
        } else {
            (logits.i((.., self.num_labels - 1))? - logits.i((.., 0))?)?
        };
        logits.to_vec1::<f32>()
    }
}
