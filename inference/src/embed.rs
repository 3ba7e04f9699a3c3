//! The sentence embedder: a BERT encoder (all-MiniLM-L6-v2 layout), mean pooling over each
//! input's tokens, L2 normalisation. Inputs are packed into batches without padding and run
//! through the padding-free forward pass of [`crate::bert_fast`].
//!
//! [`Embedder`] is synchronous and runs on the calling thread (matmuls and attention fan out
//! over the rayon pool, `RAYON_NUM_THREADS`). [`EmbedWorker`] owns a dedicated thread fed by a bounded
//! queue and answers through a future, so an async runtime never blocks on a matmul.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::mpsc;

use candle_core::Device;
use tokenizers::Tokenizer;

use crate::bert;
use crate::bert_fast::FastBert;
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
    /// Maximum tokens per forward pass (inputs are packed without padding; bounds activation
    /// memory and keeps the per-pass buffers cache- and allocator-friendly).
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
    model: FastBert,
    /// Truncating tokenizer (what the model sees).
    tokenizer: Tokenizer,
    /// The same tokenizer without truncation, for [`Embedder::token_spans`].
    spans_tokenizer: Tokenizer,
    dim: usize,
    cfg: EmbedderConfig,
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
        let vb = bert::read_weights(&files.weights, &Device::Cpu)?;
        let model = FastBert::load(vb, &config)
            .map_err(|e| Error::invalid(&files.weights, format!("BERT weights: {e}")))?;
        let tokenizer = tokenizer::load_with_limit(&files.tokenizer, cfg.max_tokens)?;
        let spans_tokenizer = tokenizer::load_plain(&files.tokenizer)?;
        Ok(Self {
            model,
            tokenizer,
            spans_tokenizer,
            dim: config.hidden_size,
            cfg,
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
        let mut out = Vec::with_capacity(ids.len());
        // Segment ids are all 0 for single texts.
        let zeros = vec![0u32; self.cfg.max_tokens];
        for batch in bert::token_batches(&lens, self.cfg.batch_size, self.cfg.max_batch_tokens) {
            let rows: Vec<(&[u32], &[u32])> = ids[batch]
                .iter()
                .map(|r| (r.as_slice(), &zeros[..r.len()]))
                .collect();
            let hidden = self
                .model
                .forward(&rows)
                .map_err(Error::tensor(&self.cfg.name))?;
            out.extend(hidden.mean_pooled_normalised());
        }
        Ok(out)
    }
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
