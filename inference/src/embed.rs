//! The sentence embedder: a BERT encoder (all-MiniLM-L6-v2 layout), mean pooling over the
//! attention mask, L2 normalisation; inputs batched by length so padding stays small.
//!
//! [`Embedder`] is synchronous and runs on the calling thread (candle's matmuls fan out over the
//! rayon pool, `RAYON_NUM_THREADS`). [`EmbedWorker`] owns a dedicated thread fed by a bounded
//! queue and answers through a future, so an async runtime never blocks on a matmul.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::mpsc;

use candle_core::{D, DType, Device, Tensor};
use candle_transformers::models::bert::BertModel;
use tokenizers::Tokenizer;

use crate::bert;
use crate::error::{Error, Result};
use crate::tokenizer;

/// The files of a sentence-transformers BERT model, as listed in the bundle catalogue.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EmbedderFiles {
    /// `model.safetensors` (tensor names with or without a `bert.` prefix).
    pub weights: PathBuf,
    /// Hugging Face `config.json`.
    pub config: PathBuf,
    /// `tokenizer.json` (WordPiece).
    pub tokenizer: PathBuf,
}

impl EmbedderFiles {
    /// The conventional names inside one model directory.
    pub fn in_dir(dir: &Path) -> Self {
        Self {
            weights: dir.join("model.safetensors"),
            config: dir.join("config.json"),
            tokenizer: dir.join("tokenizer.json"),
        }
    }
}

/// Embedder settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EmbedderConfig {
    /// A short name for errors and stage reports (the catalogue id).
    pub name: String,
    /// Maximum tokens per input, [CLS] and [SEP] included (sentence-transformers: 256 for
    /// all-MiniLM-L6-v2). Longer inputs are truncated.
    pub max_tokens: usize,
    /// Maximum texts per forward pass.
    pub batch_size: usize,
    /// Maximum padded tokens per forward pass (bounds activation memory).
    pub max_batch_tokens: usize,
}

impl Default for EmbedderConfig {
    fn default() -> Self {
        Self {
            name: "embedder".to_string(),
            max_tokens: 256,
            batch_size: 32,
            max_batch_tokens: 32 * 256,
        }
    }
}

/// A loaded sentence embedder.
pub struct Embedder {
    model: BertModel,
    /// Truncating tokenizer (what the model sees).
    tokenizer: Tokenizer,
    /// The same tokenizer without truncation, for [`Embedder::token_spans`].
    spans_tokenizer: Tokenizer,
    dim: usize,
    pad_id: u32,
    cfg: EmbedderConfig,
    device: Device,
}

impl std::fmt::Debug for Embedder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Embedder")
            .field("name", &self.cfg.name)
            .field("dim", &self.dim)
            .field("max_tokens", &self.cfg.max_tokens)
            .finish_non_exhaustive()
    }
}

impl Embedder {
    /// Loads the model from explicit files (CPU, f32).
    pub fn load(files: &EmbedderFiles, cfg: EmbedderConfig) -> Result<Self> {
        let device = Device::Cpu;
        let config = bert::read_config(&files.config)?;
        if cfg.max_tokens == 0 || cfg.max_tokens > config.max_position_embeddings {
            return Err(Error::invalid(
                &files.config,
                format!(
                    "max_tokens {} outside 1..={} (max_position_embeddings)",
                    cfg.max_tokens, config.max_position_embeddings
                ),
            ));
        }
        if cfg.batch_size == 0 || cfg.max_batch_tokens < cfg.max_tokens {
            return Err(Error::InvalidInput(format!(
                "embedder batch limits too small: batch_size {} max_batch_tokens {}",
                cfg.batch_size, cfg.max_batch_tokens
            )));
        }
        let vb = bert::read_weights(&files.weights, &device)?;
        let model = BertModel::load(vb, &config)
            .map_err(|e| Error::invalid(&files.weights, format!("BERT weights: {e}")))?;
        let tokenizer = tokenizer::load_with_limit(&files.tokenizer, cfg.max_tokens)?;
        let spans_tokenizer = tokenizer::load_plain(&files.tokenizer)?;
        Ok(Self {
            model,
            tokenizer,
            spans_tokenizer,
            dim: config.hidden_size,
            pad_id: config.pad_token_id as u32,
            cfg,
            device,
        })
    }

    /// Vector dimension (384 for MiniLM-L6).
    pub fn dim(&self) -> usize {
        self.dim
    }

    /// Maximum tokens per input including special tokens.
    pub fn max_tokens(&self) -> usize {
        self.cfg.max_tokens
    }

    /// The configured name.
    pub fn name(&self) -> &str {
        &self.cfg.name
    }

    /// Byte spans `(start, end)` in `text` of its word-piece tokens, without special tokens and
    /// without truncation (the chunker cuts on these).
    pub fn token_spans(&self, text: &str) -> Result<Vec<(usize, usize)>> {
        let enc = self
            .spans_tokenizer
            .encode(text, false)
            .map_err(|e| Error::tokenizer(&self.cfg.name, e))?;
        Ok(enc.get_offsets().to_vec())
    }

    /// The ids the model sees for `text`: [CLS] … [SEP], truncated to [`Self::max_tokens`].
    pub fn input_ids(&self, text: &str) -> Result<Vec<u32>> {
        let enc = self
            .tokenizer
            .encode(text, true)
            .map_err(|e| Error::tokenizer(&self.cfg.name, e))?;
        Ok(enc.get_ids().to_vec())
    }

    /// Embeds `texts`: one L2-normalised vector of [`Self::dim`] floats per text, in order.
    pub fn embed(&self, texts: &[&str]) -> Result<Vec<Vec<f32>>> {
        let _span =
            tracing::debug_span!("embed", model = %self.cfg.name, n = texts.len()).entered();
        let ids = texts
            .iter()
            .map(|t| self.input_ids(t))
            .collect::<Result<Vec<_>>>()?;
        self.embed_ids(&ids)
    }

    /// Embeds pre-tokenized inputs (each already [CLS] … [SEP] and within the limit).
    pub fn embed_ids(&self, ids: &[Vec<u32>]) -> Result<Vec<Vec<f32>>> {
        if let Some(bad) = ids
            .iter()
            .find(|r| r.is_empty() || r.len() > self.cfg.max_tokens)
        {
            return Err(Error::InvalidInput(format!(
                "token row of length {} (allowed 1..={})",
                bad.len(),
                self.cfg.max_tokens
            )));
        }
        let lens: Vec<usize> = ids.iter().map(Vec::len).collect();
        let mut out = vec![Vec::new(); ids.len()];
        for batch in bert::length_batches(&lens, self.cfg.batch_size, self.cfg.max_batch_tokens) {
            let rows: Vec<(&[u32], &[u32])> = batch
                .iter()
                .map(|&i| (ids[i].as_slice(), &ZEROS[..ids[i].len()]))
                .collect();
            let vecs = self
                .forward_batch(&rows)
                .map_err(Error::tensor(&self.cfg.name))?;
            for (slot, v) in batch.into_iter().zip(vecs) {
                out[slot] = v;
            }
        }
        Ok(out)
    }

    fn forward_batch(&self, rows: &[(&[u32], &[u32])]) -> candle_core::Result<Vec<Vec<f32>>> {
        let padded = bert::pad(rows, self.pad_id, &self.device)?;
        let hidden = self
            .model
            .forward(&padded.ids, &padded.type_ids, Some(&padded.mask))?;
        let mask = padded.mask.to_dtype(DType::F32)?.unsqueeze(2)?;
        let summed = hidden.broadcast_mul(&mask)?.sum(1)?;
        let counts = mask.sum(1)?;
        let mean = summed.broadcast_div(&counts)?;
        l2_normalise(&mean)?.to_vec2::<f32>()
    }
}

/// Segment ids are all 0 for single texts; a shared zero row avoids allocating one per input.
static ZEROS: [u32; 512] = [0; 512];

/// Divides each row by its L2 norm (rows of zeros stay zero).
pub(crate) fn l2_normalise(x: &Tensor) -> candle_core::Result<Tensor> {
    let norm = x
        .sqr()?
        .sum_keepdim(D::Minus1)?
        .sqrt()?
        .clamp(1e-12f32, f32::MAX)?;
    x.broadcast_div(&norm)
}

type Reply = futures::channel::oneshot::Sender<Result<Vec<Vec<f32>>>>;

struct Job {
    texts: Vec<String>,
    reply: Reply,
    span: tracing::Span,
}

/// A dedicated embedding thread with a bounded queue.
///
/// [`EmbedWorker::submit`] never blocks: it either queues the job or fails with
/// [`Error::QueueFull`]. The returned [`EmbedTicket`] is a future (await it from async code) or
/// can be waited on synchronously. Dropping the worker drains the queue and joins the thread.
pub struct EmbedWorker {
    embedder: Arc<Embedder>,
    tx: Option<mpsc::SyncSender<Job>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl std::fmt::Debug for EmbedWorker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EmbedWorker")
            .field("embedder", &self.embedder)
            .finish_non_exhaustive()
    }
}

impl EmbedWorker {
    /// Starts the thread; at most `queue` jobs wait behind the running one.
    pub fn spawn(embedder: Arc<Embedder>, queue: usize) -> Result<Self> {
        let (tx, rx) = mpsc::sync_channel::<Job>(queue);
        let model = Arc::clone(&embedder);
        let thread = std::thread::Builder::new()
            .name(format!("embed-{}", embedder.name()))
            .spawn(move || {
                while let Ok(job) = rx.recv() {
                    let _g = job.span.enter();
                    if job.reply.is_canceled() {
                        continue;
                    }
                    let refs: Vec<&str> = job.texts.iter().map(String::as_str).collect();
                    // The receiver may have gone meanwhile; nothing to do then.
                    let _ = job.reply.send(model.embed(&refs));
                }
            })
            .map_err(|e| Error::WorkerGone(format!("{}: spawn failed: {e}", embedder.name())))?;
        Ok(Self {
            embedder,
            tx: Some(tx),
            thread: Some(thread),
        })
    }

    /// The embedder (for `dim`, `max_tokens`, `token_spans`, which are cheap and thread-safe).
    pub fn embedder(&self) -> &Arc<Embedder> {
        &self.embedder
    }

    /// Queues `texts` for embedding without blocking.
    pub fn submit(&self, texts: Vec<String>) -> Result<EmbedTicket> {
        let (reply, rx) = futures::channel::oneshot::channel();
        let job = Job {
            texts,
            reply,
            span: tracing::Span::current(),
        };
        let tx = self
            .tx
            .as_ref()
            .ok_or_else(|| Error::WorkerGone(self.embedder.name().to_string()))?;
        tx.try_send(job).map_err(|e| match e {
            mpsc::TrySendError::Full(_) => Error::QueueFull(self.embedder.name().to_string()),
            mpsc::TrySendError::Disconnected(_) => {
                Error::WorkerGone(self.embedder.name().to_string())
            }
        })?;
        Ok(EmbedTicket {
            rx,
            name: self.embedder.name().to_string(),
        })
    }
}

impl Drop for EmbedWorker {
    fn drop(&mut self) {
        drop(self.tx.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The pending answer of an [`EmbedWorker::submit`] call.
#[derive(Debug)]
pub struct EmbedTicket {
    rx: futures::channel::oneshot::Receiver<Result<Vec<Vec<f32>>>>,
    name: String,
}

impl EmbedTicket {
    /// Blocks the current thread until the vectors are ready (not for async contexts).
    pub fn wait(self) -> Result<Vec<Vec<f32>>> {
        futures::executor::block_on(self)
    }
}

impl std::future::Future for EmbedTicket {
    type Output = Result<Vec<Vec<f32>>>;

    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Self::Output> {
        let name = self.name.clone();
        std::pin::Pin::new(&mut self.rx)
            .poll(cx)
            .map(|r| r.unwrap_or_else(|_| Err(Error::WorkerGone(name))))
    }
}
