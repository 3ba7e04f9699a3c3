//! The continuous-batching engine: one scheduler thread owns a [`DecoderModel`] and serves many
//! streams at once.
//!
//! - Requests enter a **bounded** queue ([`Engine::submit`] fails with
//!   [`SubmitError::QueueFull`] instead of waiting) and get their events on their own channel.
//! - Each request has a [`Priority`]. Interactive requests are admitted before batch ones
//!   (FIFO within a class), and each class has its own queue limit, so queued batch work never
//!   makes an interactive request bounce. A batch request that waited
//!   [`EngineConfig::batch_max_wait_steps`] engine steps is promoted: it then competes with
//!   interactive requests by arrival order, so batch traffic is delayed, never starved.
//! - Every engine step runs **one** batched forward: one decode row for each running sequence,
//!   plus prefill chunks of newly admitted prompts under a per-step token budget, so a long
//!   prompt is spread over several steps while running streams keep getting a token per step.
//! - New sequences join between steps. A stream whose receiver was dropped is noticed at the
//!   next step and its KV cache freed.
//! - KV memory is accounted per sequence (whole blocks, see [`KV_BLOCK_TOKENS`]) against a
//!   budget: a request that could never fit is refused at submit
//!   ([`SubmitError::OverBudget`]); admission waits while the budget is used; when growth during
//!   decode would exceed it, the most recently admitted sequence is preempted (its KV dropped,
//!   re-prefilled later from prompt + generated tokens), never the oldest.
//! - **Shared prefix KV cache**: [`Engine::set_shared_prefix`] registers the token ids of the
//!   platform's fixed system-prompt prefix (identical for every user, never user content). The
//!   first request whose prompt starts with it fills the prefix's KV once; every later request
//!   starting with it copies that KV and prefills only the rest (bit-identical to a cold run: a
//!   position's keys and values depend only on the tokens up to it, and the forward is
//!   batch- and chunk-invariant). Nothing else is ever reused across requests, so one user's
//!   prompt cannot change another's timing. The cached prefix is bounded (at most a quarter of
//!   the KV budget) and counted in the KV bytes; hits and saved tokens are counted.
//! - [`EngineCounters`] are atomics readable from any thread for the daemon's metrics.
//!
//! [`KV_BLOCK_TOKENS`]: super::KV_BLOCK_TOKENS

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::thread::JoinHandle;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use parking_lot::{Condvar, Mutex};
use rayon::prelude::*;
use tokio::sync::mpsc::{UnboundedReceiver, UnboundedSender, unbounded_channel};

use super::kv::{KV_BLOCK_TOKENS, KvCache, reserved_for};
use super::model::{DecoderModel, ModelConfig, SeqChunk};
use super::sampling::{self, Detokenizer, Rng, SamplingParams, TextStream};

/// Engine limits. All are validated by [`Engine::start`].
#[derive(Debug, Clone, PartialEq)]
pub struct EngineConfig {
    /// Interactive requests that may wait for admission; more are refused with
    /// [`SubmitError::QueueFull`]. Batch requests do not count against it.
    pub queue_capacity: usize,
    /// Batch requests ([`Priority::Batch`]) that may wait for admission, counted separately
    /// (capped at `queue_capacity` by [`Engine::start`]): the queue holds at most `queue_capacity +
    /// batch_queue_capacity` requests, and interactive requests are never refused because of
    /// queued batch work.
    pub batch_queue_capacity: usize,
    /// Anti-starvation: a batch request that has waited this many engine steps is promoted and
    /// admitted by arrival order alongside interactive requests (0 = batch is never
    /// deprioritized, plain FIFO).
    pub batch_max_wait_steps: u64,
    /// Sequences decoded together in one step.
    pub max_batch: usize,
    /// Rows (decode tokens + prefill tokens) one step may process. Must exceed `max_batch`, so
    /// prefill always progresses while a full batch decodes.
    pub step_token_budget: usize,
    /// Largest prefill chunk of one sequence in one step.
    pub prefill_chunk: usize,
    /// Decode protection: while sequences are decoding, a step's prefill rows are capped so the
    /// step takes at most this many times a decode-only step, from the step times measured so
    /// far (at least [`MIN_PREFILL_ROWS`] rows, so a prompt always progresses). A long prompt
    /// arriving then costs the running streams at most this factor per token, and takes longer
    /// to its own first token instead. `None`: only `step_token_budget` and `prefill_chunk`
    /// bound a step (the step plan is then independent of timing).
    pub decode_stall_factor: Option<f64>,
    /// KV-cache memory all sequences together may hold.
    pub kv_budget_bytes: usize,
    /// Context cap (prompt + generated tokens); the model's trained context caps it further.
    pub n_ctx: usize,
}

impl Default for EngineConfig {
    fn default() -> Self {
        Self {
            queue_capacity: 64,
            batch_queue_capacity: 16,
            batch_max_wait_steps: 128,
            max_batch: 16,
            step_token_budget: 256,
            prefill_chunk: 128,
            decode_stall_factor: None,
            kv_budget_bytes: 1 << 30,
            n_ctx: 4096,
        }
    }
}

/// The fewest prefill rows a step gives a pending prompt under
/// [`EngineConfig::decode_stall_factor`].
pub const MIN_PREFILL_ROWS: usize = 8;

/// How urgently a request wants the engine (see [`Engine::submit_with_priority`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Hash)]
pub enum Priority {
    /// A person is waiting for the first token (the default).
    #[default]
    Interactive,
    /// Batch or eval traffic: admitted after interactive requests, until it has waited
    /// [`EngineConfig::batch_max_wait_steps`].
    Batch,
}

/// A generation request: prompt token ids (already templated and tokenized) and sampling.
#[derive(Debug, Clone)]
pub struct GenerateRequest {
    /// Prompt token ids.
    pub prompt: Vec<u32>,
    /// Sampling and stopping.
    pub params: SamplingParams,
}

/// Why a stream ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FinishReason {
    /// A stop token or stop string ended generation.
    Stop,
    /// `max_tokens` (or the context cap) was reached.
    Length,
    /// The engine shut down before the request finished.
    Cancelled,
    /// An internal fault while running the model (logged; the text is for logs, not clients).
    Error(String),
}

/// Token counts of a finished request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Usage {
    /// Prompt tokens.
    pub prompt_tokens: usize,
    /// Generated tokens (the stop token not included).
    pub completion_tokens: usize,
}

/// What a stream receives.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// The request left the admission queue: the engine admitted it into the running batch and
    /// starts its prefill at `step`. Sent once, before any token (a preempted sequence that is
    /// re-admitted does not get a second one). Queue wait = submit → this event; prefill = this
    /// event → the first token.
    Admitted {
        /// The first engine step that processes the sequence (steps are numbered from 1).
        step: u64,
    },
    /// One generated token.
    Token {
        /// Token id.
        id: u32,
        /// Text released with this token when the engine has a detokenizer (may be empty while
        /// a multi-byte character or a possible stop string is incomplete).
        text: Option<String>,
        /// The engine step that produced it (steps are numbered from 1).
        step: u64,
    },
    /// The sequence lost its KV cache to memory pressure and will be re-prefilled; tokens keep
    /// coming afterwards, unchanged for greedy requests.
    Preempted {
        /// The step before which it was preempted.
        step: u64,
    },
    /// The last event of every stream.
    Done {
        /// Why it ended.
        reason: FinishReason,
        /// Token counts.
        usage: Usage,
        /// Text held back until the end (a possible stop-string prefix that did not match), when
        /// the engine has a detokenizer.
        text: Option<String>,
    },
}

/// Why a request was refused at [`Engine::submit`] (each maps to one HTTP problem).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SubmitError {
    /// The admission queue of the request's priority class is full (→ 503
    /// capacity-unavailable).
    #[error("queue full ({capacity} requests waiting)")]
    QueueFull {
        /// The configured capacity of the class (`queue_capacity` or `batch_queue_capacity`).
        capacity: usize,
    },
    /// Prompt plus `max_tokens` exceeds the context (→ 400 context-too-long).
    #[error(
        "prompt of {prompt_tokens} tokens + max_tokens {max_tokens} exceeds the context of {n_ctx}"
    )]
    ContextTooLong {
        /// Prompt tokens.
        prompt_tokens: usize,
        /// Requested maximum of generated tokens.
        max_tokens: usize,
        /// The engine's context cap.
        n_ctx: usize,
    },
    /// The request's KV cache at full length would exceed the whole KV budget.
    #[error("request needs {needed_bytes} KV bytes, the budget is {budget_bytes}")]
    OverBudget {
        /// KV bytes the request needs at full length.
        needed_bytes: usize,
        /// The configured KV budget.
        budget_bytes: usize,
    },
    /// The request itself is malformed (empty prompt, token outside the vocabulary, zero
    /// `max_tokens`, stop strings without a detokenizer).
    #[error("invalid request: {0}")]
    Invalid(String),
    /// The engine is shut down.
    #[error("engine stopped")]
    Stopped,
}

/// The receiving end of one request.
#[derive(Debug)]
pub struct Stream {
    id: u64,
    rx: UnboundedReceiver<Event>,
}

impl Stream {
    /// The engine-assigned request id.
    pub fn id(&self) -> u64 {
        self.id
    }

    /// The next event (async); `None` after `Done`.
    pub async fn recv(&mut self) -> Option<Event> {
        self.rx.recv().await
    }

    /// The next event, blocking the thread (not for async contexts).
    pub fn blocking_recv(&mut self) -> Option<Event> {
        self.rx.blocking_recv()
    }

    /// The next event if one is ready (never blocks); `None` when none is ready or the stream
    /// is over.
    pub fn try_recv(&mut self) -> Option<Event> {
        self.rx.try_recv().ok()
    }

    /// The underlying channel, e.g. to wrap it in a `Stream` for SSE.
    pub fn into_receiver(self) -> UnboundedReceiver<Event> {
        self.rx
    }
}

/// Live engine counters, readable from any thread.
#[derive(Debug, Default)]
pub struct EngineCounters {
    queue_depth: AtomicUsize,
    active_sequences: AtomicUsize,
    kv_bytes: AtomicUsize,
    tokens_generated: AtomicU64,
    prompt_tokens_processed: AtomicU64,
    steps: AtomicU64,
    preemptions: AtomicU64,
    cancellations: AtomicU64,
    prefix_hits: AtomicU64,
    prefix_tokens_saved: AtomicU64,
    tokens_per_second_bits: AtomicU64,
}

/// A copy of [`EngineCounters`] at one moment.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct EngineMetrics {
    /// Requests waiting for admission (including preempted ones waiting to resume).
    pub queue_depth: usize,
    /// Sequences holding a KV cache.
    pub active_sequences: usize,
    /// KV-cache bytes held by all sequences.
    pub kv_bytes: usize,
    /// Tokens generated since start.
    pub tokens_generated: u64,
    /// Prompt (and re-prefill) tokens processed since start.
    pub prompt_tokens_processed: u64,
    /// Engine steps (batched forwards) since start.
    pub steps: u64,
    /// Sequences preempted for memory since start.
    pub preemptions: u64,
    /// Streams cancelled by their client since start.
    pub cancellations: u64,
    /// Requests (and re-admissions) that started from the shared prefix's cached KV.
    pub prefix_hits: u64,
    /// Prompt tokens whose prefill those hits skipped.
    pub prefix_tokens_saved: u64,
    /// Generated tokens per second over the last few seconds of work.
    pub tokens_per_second: f64,
}

impl EngineCounters {
    /// A snapshot of every counter.
    pub fn snapshot(&self) -> EngineMetrics {
        let r = Ordering::Relaxed;
        EngineMetrics {
            queue_depth: self.queue_depth.load(r),
            active_sequences: self.active_sequences.load(r),
            kv_bytes: self.kv_bytes.load(r),
            tokens_generated: self.tokens_generated.load(r),
            prompt_tokens_processed: self.prompt_tokens_processed.load(r),
            steps: self.steps.load(r),
            preemptions: self.preemptions.load(r),
            cancellations: self.cancellations.load(r),
            prefix_hits: self.prefix_hits.load(r),
            prefix_tokens_saved: self.prefix_tokens_saved.load(r),
            tokens_per_second: f64::from_bits(self.tokens_per_second_bits.load(r)),
        }
    }
}

struct Pending {
    id: u64,
    req: GenerateRequest,
    tx: UnboundedSender<Event>,
    span: tracing::Span,
    /// Completed engine steps when it was queued (for batch promotion).
    queued_at_step: u64,
}

/// The waiting requests, one FIFO per priority class.
#[derive(Default)]
struct Queue {
    interactive: VecDeque<Pending>,
    batch: VecDeque<Pending>,
    shutdown: bool,
}

impl Queue {
    fn len(&self) -> usize {
        self.interactive.len() + self.batch.len()
    }

    fn is_empty(&self) -> bool {
        self.interactive.is_empty() && self.batch.is_empty()
    }

    fn class_mut(&mut self, p: Priority) -> &mut VecDeque<Pending> {
        match p {
            Priority::Interactive => &mut self.interactive,
            Priority::Batch => &mut self.batch,
        }
    }

    /// The class whose front request is admitted next at completed step `step`.
    fn next_class(&self, step: u64, batch_max_wait_steps: u64) -> Option<Priority> {
        pick_class(
            self.interactive.front().map(|p| (p.id, p.queued_at_step)),
            self.batch.front().map(|p| (p.id, p.queued_at_step)),
            step,
            batch_max_wait_steps,
        )
    }
}

/// The admission rule on the fronts of the two FIFOs, each `(arrival id, queued at step)`:
/// interactive first; a batch request that has waited `batch_max_wait_steps` steps (or any
/// batch request when it is 0) is promoted and goes first if it arrived before the interactive
/// front.
fn pick_class(
    interactive: Option<(u64, u64)>,
    batch: Option<(u64, u64)>,
    step: u64,
    batch_max_wait_steps: u64,
) -> Option<Priority> {
    match (interactive, batch) {
        (None, None) => None,
        (Some(_), None) => Some(Priority::Interactive),
        (None, Some(_)) => Some(Priority::Batch),
        (Some((i_id, _)), Some((b_id, b_step))) => {
            let promoted = step.saturating_sub(b_step) >= batch_max_wait_steps;
            if promoted && b_id < i_id {
                Some(Priority::Batch)
            } else {
                Some(Priority::Interactive)
            }
        }
    }
}

struct Shared {
    queue: Mutex<Queue>,
    wake: Condvar,
    counters: Arc<EngineCounters>,
    /// The registered shared prefix (see [`Engine::set_shared_prefix`]).
    prefix: Mutex<Arc<Vec<u32>>>,
}

/// A running engine. Dropping it stops the scheduler (open streams end with `Cancelled`).
pub struct Engine {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
    config: EngineConfig,
    model_config: ModelConfig,
    n_ctx: usize,
    vocab_size: usize,
    has_detokenizer: bool,
    next_id: AtomicU64,
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("config", &self.config)
            .field("n_ctx", &self.n_ctx)
            .finish_non_exhaustive()
    }
}

impl Engine {
    /// Starts a scheduler thread that owns `model`. `detokenizer` enables text pieces and stop
    /// strings.
    pub fn start(
        model: DecoderModel,
        detokenizer: Option<Detokenizer>,
        config: EngineConfig,
    ) -> crate::Result<Self> {
        let invalid =
            |what: &str| Err(crate::Error::InvalidInput(format!("engine config: {what}")));
        if config.queue_capacity == 0 || config.max_batch == 0 || config.prefill_chunk == 0 {
            return invalid("queue_capacity, max_batch and prefill_chunk must be > 0");
        }
        if config.batch_queue_capacity == 0 {
            return invalid("batch_queue_capacity must be > 0");
        }
        let mut config = config;
        config.batch_queue_capacity = config.batch_queue_capacity.min(config.queue_capacity);
        if config.step_token_budget <= config.max_batch {
            return invalid("step_token_budget must exceed max_batch");
        }
        if config.n_ctx < 2 {
            return invalid("n_ctx must be at least 2");
        }
        if config
            .decode_stall_factor
            .is_some_and(|f| !f.is_finite() || f < 1.0)
        {
            return invalid("decode_stall_factor must be a finite number >= 1");
        }
        let model_config = model.config().clone();
        let n_ctx = config.n_ctx.min(model_config.n_ctx_train);
        let shared = Arc::new(Shared {
            queue: Mutex::new(Queue::default()),
            wake: Condvar::new(),
            counters: Arc::new(EngineCounters::default()),
            prefix: Mutex::new(Arc::new(Vec::new())),
        });
        let name = model
            .path()
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_default();
        let mut scheduler = Scheduler {
            eog: model.special_tokens().end_of_generation.clone(),
            model,
            detok: detokenizer.clone(),
            config: config.clone(),
            n_ctx,
            shared: shared.clone(),
            active: Vec::new(),
            resume: VecDeque::new(),
            next_admit: 0,
            step: 0,
            rate_window: VecDeque::new(),
            prefix: SharedPrefix::default(),
            decode_step_ms: None,
            prefill_row_ms: None,
        };
        let thread = std::thread::Builder::new()
            .name(format!("airlock-gen-{name}"))
            .spawn(move || scheduler.run())
            .map_err(|e| crate::Error::InvalidInput(format!("cannot spawn engine thread: {e}")))?;
        Ok(Self {
            shared,
            thread: Some(thread),
            config,
            vocab_size: model_config.vocab_size,
            model_config,
            n_ctx,
            has_detokenizer: detokenizer.is_some(),
            next_id: AtomicU64::new(1),
        })
    }

    /// Queues an interactive request; events arrive on the returned [`Stream`]. Never blocks on
    /// the model. Same as [`Engine::submit_with_priority`] with [`Priority::Interactive`].
    pub fn submit(&self, req: GenerateRequest) -> Result<Stream, SubmitError> {
        self.submit_with_priority(req, Priority::Interactive)
    }

    /// Queues a request of the given priority: interactive requests are admitted before batch
    /// ones, each class has its own queue limit (`queue_capacity`, `batch_queue_capacity`).
    pub fn submit_with_priority(
        &self,
        req: GenerateRequest,
        priority: Priority,
    ) -> Result<Stream, SubmitError> {
        let p = &req.params;
        if req.prompt.is_empty() {
            return Err(SubmitError::Invalid("empty prompt".into()));
        }
        if p.max_tokens == 0 {
            return Err(SubmitError::Invalid("max_tokens must be at least 1".into()));
        }
        if let Some(&t) = req.prompt.iter().find(|&&t| t as usize >= self.vocab_size) {
            return Err(SubmitError::Invalid(format!(
                "token id {t} outside the vocabulary"
            )));
        }
        if !p.stop_strings.is_empty() && !self.has_detokenizer {
            return Err(SubmitError::Invalid(
                "stop strings need an engine with a detokenizer".into(),
            ));
        }
        let total = req.prompt.len().saturating_add(p.max_tokens);
        if total > self.n_ctx {
            return Err(SubmitError::ContextTooLong {
                prompt_tokens: req.prompt.len(),
                max_tokens: p.max_tokens,
                n_ctx: self.n_ctx,
            });
        }
        let needed_bytes = reserved_for(total) * self.model_config.kv_bytes_per_token();
        if needed_bytes > self.config.kv_budget_bytes {
            return Err(SubmitError::OverBudget {
                needed_bytes,
                budget_bytes: self.config.kv_budget_bytes,
            });
        }
        let (tx, rx) = unbounded_channel();
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        {
            let mut q = self.shared.queue.lock();
            if q.shutdown {
                return Err(SubmitError::Stopped);
            }
            let capacity = match priority {
                Priority::Interactive => self.config.queue_capacity,
                Priority::Batch => self.config.batch_queue_capacity,
            };
            let class = q.class_mut(priority);
            if class.len() >= capacity {
                return Err(SubmitError::QueueFull { capacity });
            }
            class.push_back(Pending {
                id,
                req,
                tx,
                span: tracing::Span::current(),
                queued_at_step: self.shared.counters.steps.load(Ordering::Relaxed),
            });
            self.shared
                .counters
                .queue_depth
                .fetch_add(1, Ordering::Relaxed);
        }
        self.shared.wake.notify_one();
        Ok(Stream { id, rx })
    }

    /// Registers the token ids of the platform's fixed system-prompt prefix (the templated
    /// system prompt every chat request starts with; empty disables the cache). Its KV is
    /// computed once, by the first request that starts with it, and copied into every later
    /// one. Only pass text that is the same for every user: the cached KV is shared across
    /// all requests. A new prefix replaces the old one (its KV is dropped).
    pub fn set_shared_prefix(&self, tokens: Vec<u32>) {
        *self.shared.prefix.lock() = Arc::new(tokens);
        self.shared.wake.notify_one();
    }

    /// The live counters (cheap to clone and keep, e.g. in the daemon's metrics registry).
    pub fn counters(&self) -> Arc<EngineCounters> {
        self.shared.counters.clone()
    }

    /// A snapshot of the counters.
    pub fn metrics(&self) -> EngineMetrics {
        self.shared.counters.snapshot()
    }

    /// The effective context cap (config cap and model context, whichever is smaller).
    pub fn n_ctx(&self) -> usize {
        self.n_ctx
    }

    /// The served model's hyper-parameters.
    pub fn model_config(&self) -> &ModelConfig {
        &self.model_config
    }

    /// The engine's limits.
    pub fn config(&self) -> &EngineConfig {
        &self.config
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        self.shared.queue.lock().shutdown = true;
        self.shared.wake.notify_all();
        if let Some(t) = self.thread.take()
            && t.join().is_err()
        {
            tracing::error!("generation engine thread panicked");
        }
    }
}

/// A sequence holding (or about to hold) a KV cache.
struct Seq {
    id: u64,
    /// Prompt followed by the generated tokens.
    tokens: Vec<u32>,
    prompt_len: usize,
    generated: usize,
    params: SamplingParams,
    rng: Rng,
    text: Option<TextStream>,
    tx: UnboundedSender<Event>,
    cache: KvCache,
    /// Order of first admission: preemption takes the largest.
    admit_order: u64,
    span: tracing::Span,
}

impl Seq {
    fn remaining(&self) -> usize {
        self.tokens.len() - self.cache.len()
    }

    fn usage(&self) -> Usage {
        Usage {
            prompt_tokens: self.prompt_len,
            completion_tokens: self.generated,
        }
    }

    fn finish(&mut self, reason: FinishReason) {
        let text = self.text.as_mut().map(TextStream::finish);
        let _ = self.tx.send(Event::Done {
            reason,
            usage: self.usage(),
            text,
        });
    }
}

struct Scheduler {
    model: DecoderModel,
    eog: Vec<u32>,
    detok: Option<Detokenizer>,
    config: EngineConfig,
    n_ctx: usize,
    shared: Arc<Shared>,
    /// Admitted sequences, oldest admission first.
    active: Vec<Seq>,
    /// Preempted sequences waiting to be re-admitted, oldest admission first.
    resume: VecDeque<Seq>,
    next_admit: u64,
    step: u64,
    /// (time, tokens generated) of recent steps, for the tokens/s estimate.
    rate_window: VecDeque<(Instant, usize)>,
    /// The shared system-prompt prefix and its cached KV.
    prefix: SharedPrefix,
    /// Step-time model for [`EngineConfig::decode_stall_factor`]: milliseconds of a decode-only
    /// step and of one prefill row, moving averages of measured steps.
    decode_step_ms: Option<f64>,
    prefill_row_ms: Option<f64>,
}

/// The engine thread's copy of the shared prefix and, once filled, its KV.
#[derive(Default)]
struct SharedPrefix {
    tokens: Arc<Vec<u32>>,
    kv: Option<KvCache>,
    /// The prefix did not fit its share of the KV budget (logged once, never cached).
    too_big: bool,
}

impl SharedPrefix {
    /// Whether `tokens` starts with the prefix and goes beyond it (the last prompt token must
    /// be computed for its logits).
    fn covers(&self, tokens: &[u32]) -> bool {
        let p = self.tokens.len();
        p > 0 && tokens.len() > p && tokens[..p] == self.tokens[..]
    }
}

/// Seconds of history behind the tokens/s estimate.
const RATE_WINDOW_SECS: f64 = 5.0;

impl Scheduler {
    fn counters(&self) -> &EngineCounters {
        &self.shared.counters
    }

    fn run(&mut self) {
        loop {
            if !self.wait_for_work() {
                break;
            }
            self.drop_cancelled();
            self.admit();
            if self.active.is_empty() {
                // Nothing admissible right now (all waiting requests were cancelled).
                self.publish(0);
                continue;
            }
            self.step();
        }
        // Shutdown: end every stream.
        for mut s in self.active.drain(..).chain(self.resume.drain(..)) {
            s.finish(FinishReason::Cancelled);
        }
        let mut q = self.shared.queue.lock();
        let q = &mut *q;
        for p in q.interactive.drain(..).chain(q.batch.drain(..)) {
            let _ = p.tx.send(Event::Done {
                reason: FinishReason::Cancelled,
                usage: Usage {
                    prompt_tokens: p.req.prompt.len(),
                    completion_tokens: 0,
                },
                text: None,
            });
        }
        self.counters().queue_depth.store(0, Ordering::Relaxed);
    }

    /// Blocks while there is nothing to do; false on shutdown.
    fn wait_for_work(&mut self) -> bool {
        let mut q = self.shared.queue.lock();
        loop {
            if q.shutdown {
                return false;
            }
            if !self.active.is_empty() || !self.resume.is_empty() || !q.is_empty() {
                return true;
            }
            self.shared.wake.wait(&mut q);
        }
    }

    fn cancel(&self, s: &Seq) {
        self.counters()
            .cancellations
            .fetch_add(1, Ordering::Relaxed);
        s.span
            .in_scope(|| tracing::debug!(id = s.id, "stream closed by client; freed"));
    }

    /// Frees every sequence whose receiver is gone (client disconnected).
    fn drop_cancelled(&mut self) {
        let (gone, kept): (Vec<Seq>, Vec<Seq>) =
            self.active.drain(..).partition(|s| s.tx.is_closed());
        self.active = kept;
        for s in &gone {
            self.cancel(s);
        }
        let (gone, kept): (VecDeque<Seq>, VecDeque<Seq>) =
            self.resume.drain(..).partition(|s| s.tx.is_closed());
        self.resume = kept;
        for s in &gone {
            self.cancel(s);
        }
    }

    fn kv_used(&self) -> usize {
        let prefix = self.prefix.kv.as_ref().map_or(0, KvCache::bytes);
        prefix + self.active.iter().map(|s| s.cache.bytes()).sum::<usize>()
    }

    /// Picks up a newly registered shared prefix (dropping the old one's KV).
    fn sync_prefix(&mut self) {
        let registered = self.shared.prefix.lock().clone();
        if !Arc::ptr_eq(&registered, &self.prefix.tokens) {
            self.prefix = SharedPrefix {
                tokens: registered,
                kv: None,
                too_big: false,
            };
        }
    }

    /// A cache starting with the shared prefix's KV for a sequence of `tokens`, if it has the
    /// prefix and the prefix is cached (counted as a hit).
    fn prefix_start(&self, tokens: &[u32]) -> Option<KvCache> {
        let kv = self.prefix.kv.as_ref()?;
        if !self.prefix.covers(tokens) {
            return None;
        }
        let c = self.counters();
        c.prefix_hits.fetch_add(1, Ordering::Relaxed);
        c.prefix_tokens_saved
            .fetch_add(kv.len() as u64, Ordering::Relaxed);
        Some(kv.prefix_copy(kv.len()))
    }

    /// After a step: fills the shared prefix's KV from the first sequence that has computed it.
    fn fill_prefix(&mut self) {
        if self.prefix.kv.is_some() || self.prefix.too_big || self.prefix.tokens.is_empty() {
            return;
        }
        let p = self.prefix.tokens.len();
        let Some(s) = self
            .active
            .iter()
            .find(|s| s.cache.len() >= p && self.prefix.covers(&s.tokens))
        else {
            return;
        };
        let bytes = reserved_for(p) * self.model.config().kv_bytes_per_token();
        if bytes > self.config.kv_budget_bytes / 4 {
            self.prefix.too_big = true;
            tracing::warn!(
                tokens = p,
                bytes,
                "shared prefix exceeds a quarter of the KV budget; not cached"
            );
            return;
        }
        self.prefix.kv = Some(s.cache.prefix_copy(p));
    }

    /// Moves sequences into the batch while there is room: preempted ones first, then the queue
    /// (interactive before batch, see [`pick_class`]).
    /// A sequence is admitted only if its whole pending input (prompt, or prompt + generated on
    /// resume) plus one token fits the free KV budget.
    fn admit(&mut self) {
        self.sync_prefix();
        let bpt = self.model.config().kv_bytes_per_token();
        while self.active.len() < self.config.max_batch {
            // Keep a block of growth room per running sequence, so an admission is not undone
            // by a preemption a few steps later.
            let headroom = self.active.len() * KV_BLOCK_TOKENS * bpt;
            let free = self
                .config
                .kv_budget_bytes
                .saturating_sub(self.kv_used() + headroom);
            if let Some(s) = self.resume.front() {
                if reserved_for(s.tokens.len() + 1) * bpt > free {
                    return;
                }
                let mut s = self.resume.pop_front().expect("front exists");
                if s.cache.is_empty()
                    && let Some(c) = self.prefix_start(&s.tokens)
                {
                    s.cache = c;
                }
                self.active.push(s);
                self.active.sort_by_key(|s| s.admit_order);
                continue;
            }
            let mut q = self.shared.queue.lock();
            let step = self.counters().steps.load(Ordering::Relaxed);
            let Some(class) = q.next_class(step, self.config.batch_max_wait_steps) else {
                return;
            };
            let queue = q.class_mut(class);
            let front = queue.front().expect("the picked class is not empty");
            if front.tx.is_closed() {
                let p = queue.pop_front().expect("front exists");
                self.counters().queue_depth.fetch_sub(1, Ordering::Relaxed);
                drop(q);
                self.counters()
                    .cancellations
                    .fetch_add(1, Ordering::Relaxed);
                p.span
                    .in_scope(|| tracing::debug!(id = p.id, "cancelled while queued"));
                continue;
            }
            if reserved_for(front.req.prompt.len() + 1) * bpt > free {
                return;
            }
            let p = queue.pop_front().expect("front exists");
            self.counters().queue_depth.fetch_sub(1, Ordering::Relaxed);
            drop(q);
            let seed = p.req.params.seed.unwrap_or_else(|| {
                SystemTime::now()
                    .duration_since(UNIX_EPOCH)
                    .map_or(p.id, |d| d.as_nanos() as u64 ^ p.id)
            });
            let text = self
                .detok
                .clone()
                .map(|d| TextStream::new(d, p.req.params.stop_strings.clone()));
            // A receiver gone since the check above is dropped at the next step.
            let _ = p.tx.send(Event::Admitted {
                step: self.step + 1,
            });
            let cache = self
                .prefix_start(&p.req.prompt)
                .unwrap_or_else(|| self.model.new_cache());
            self.active.push(Seq {
                id: p.id,
                prompt_len: p.req.prompt.len(),
                tokens: p.req.prompt,
                generated: 0,
                rng: Rng::new(seed),
                params: p.req.params,
                text,
                tx: p.tx,
                cache,
                admit_order: self.next_admit,
                span: p.span,
            });
            self.next_admit += 1;
        }
    }

    /// Rows each active sequence processes this step (0 = not scheduled).
    fn plan(&self) -> Vec<usize> {
        let mut budget = self.config.step_token_budget;
        let mut rows = vec![0; self.active.len()];
        // Running streams first: one decode row each.
        for (r, s) in rows.iter_mut().zip(&self.active) {
            if s.remaining() == 1 {
                *r = 1;
                budget -= 1;
            }
        }
        // Decode protection: while streams decode, prefill only what keeps the step within the
        // stall factor of a decode-only step.
        let decoding = self.config.step_token_budget - budget;
        if decoding > 0 {
            budget = budget.min(self.prefill_cap());
        }
        // Then prefill chunks, oldest admission first, with what is left.
        for (r, s) in rows.iter_mut().zip(&self.active) {
            if s.remaining() > 1 && budget > 0 {
                *r = s.remaining().min(self.config.prefill_chunk).min(budget);
                budget -= *r;
            }
        }
        rows
    }

    /// The prefill rows a step with decoding streams may take ([`EngineConfig::decode_stall_factor`]).
    fn prefill_cap(&self) -> usize {
        let (Some(factor), Some(decode), Some(row)) = (
            self.config.decode_stall_factor,
            self.decode_step_ms,
            self.prefill_row_ms,
        ) else {
            return usize::MAX;
        };
        let rows = ((factor - 1.0).max(0.0) * decode / row.max(1e-6)).floor();
        (rows as usize).max(MIN_PREFILL_ROWS)
    }

    /// Updates the step-time model with a step of `rows` rows, `prompt_rows` of them prefill.
    fn learn_step_time(&mut self, ms: f64, rows: usize, prompt_rows: usize) {
        const ALPHA: f64 = 0.2;
        let avg = |old: Option<f64>, new: f64| Some(old.map_or(new, |o| o + ALPHA * (new - o)));
        if prompt_rows == 0 {
            self.decode_step_ms = avg(self.decode_step_ms, ms);
        } else if rows > prompt_rows {
            if let Some(decode) = self.decode_step_ms {
                let per_row = (ms - decode).max(0.0) / prompt_rows as f64;
                self.prefill_row_ms = avg(self.prefill_row_ms, per_row);
            }
        } else {
            self.prefill_row_ms = avg(self.prefill_row_ms, ms / prompt_rows as f64);
        }
    }

    /// Preempts the most recently admitted sequences until the planned step fits the budget.
    fn fit_memory(&mut self, rows: &mut Vec<usize>) {
        loop {
            let prefix = self.prefix.kv.as_ref().map_or(0, KvCache::bytes);
            let need: usize = prefix
                + self
                    .active
                    .iter()
                    .zip(rows.iter())
                    .map(|(s, &r)| s.cache.bytes_after(r))
                    .sum::<usize>();
            if need <= self.config.kv_budget_bytes || self.active.len() <= 1 {
                return;
            }
            let newest = self
                .active
                .iter()
                .enumerate()
                .max_by_key(|(_, s)| s.admit_order)
                .map(|(i, _)| i)
                .expect("at least two active");
            let mut s = self.active.remove(newest);
            rows.remove(newest);
            s.cache.clear();
            let _ = s.tx.send(Event::Preempted {
                step: self.step + 1,
            });
            s.span
                .in_scope(|| tracing::debug!(id = s.id, "preempted for KV memory"));
            self.counters().preemptions.fetch_add(1, Ordering::Relaxed);
            let at = self
                .resume
                .iter()
                .position(|r| r.admit_order > s.admit_order)
                .unwrap_or(self.resume.len());
            self.resume.insert(at, s);
            // Re-plan: the freed budget may let a pending prefill take a bigger chunk.
            *rows = self.plan();
        }
    }

    fn step(&mut self) {
        let mut rows = self.plan();
        self.fit_memory(&mut rows);
        self.step += 1;
        let step = self.step;

        let mut prompt_rows = 0;
        let mut chunks = Vec::new();
        let mut owners = Vec::new();
        for (i, (s, &r)) in self.active.iter_mut().zip(rows.iter()).enumerate() {
            if r == 0 {
                continue;
            }
            let start = s.cache.len();
            if r > 1 || s.cache.len() < s.tokens.len() - 1 {
                prompt_rows += r;
            }
            chunks.push(SeqChunk {
                tokens: &s.tokens[start..start + r],
                cache: &mut s.cache,
                want_logits: start + r == s.tokens.len(),
            });
            owners.push(i);
        }
        let total_rows: usize = chunks.iter().map(|c| c.tokens.len()).sum();
        let forward_started = Instant::now();
        let result = self.model.forward(&mut chunks);
        drop(chunks);
        if self.config.decode_stall_factor.is_some() && total_rows > 0 {
            let ms = forward_started.elapsed().as_secs_f64() * 1e3;
            self.learn_step_time(ms, total_rows, prompt_rows);
        }
        let logits = match result {
            Ok(l) => l,
            Err(e) => {
                tracing::error!(error = %e, "engine step failed; ending its sequences");
                let failed: Vec<usize> = owners.clone();
                for &i in failed.iter().rev() {
                    let mut s = self.active.remove(i);
                    s.finish(FinishReason::Error(e.to_string()));
                }
                self.publish(0);
                return;
            }
        };
        self.counters()
            .prompt_tokens_processed
            .fetch_add(prompt_rows as u64, Ordering::Relaxed);
        self.fill_prefix();

        let nexts = self.sample(&owners, logits);
        let (finished, generated) = self.append_tokens(nexts, step);
        self.end_finished(finished, generated);
    }

    /// The next token of every sequence that got logits (`owners[j]` owns `logits[j]`), by
    /// sequence index. Sampled in parallel: temperature / top-p sampling walks the whole
    /// vocabulary (152k logits for Qwen), ~1 ms per sequence, which done in turn on this
    /// thread left the second core idle for a noticeable part of a many-stream step. Each
    /// sequence uses only its own logits and random stream, so the tokens are the same.
    fn sample(&mut self, owners: &[usize], logits: Vec<Option<Vec<f32>>>) -> Vec<Option<u32>> {
        let mut by_seq: Vec<Option<Vec<f32>>> = vec![None; self.active.len()];
        for (&i, l) in owners.iter().zip(logits) {
            by_seq[i] = l;
        }
        self.active
            .par_iter_mut()
            .zip(by_seq.par_iter())
            .map(|(s, l)| {
                l.as_ref()
                    .map(|l| sampling::sample(l, &s.params, &mut s.rng))
            })
            .collect()
    }

    /// Appends each sampled token to its sequence and streams it; returns the sequences that
    /// end in this step, with how (None: the client hung up), and the tokens generated.
    fn append_tokens(
        &mut self,
        nexts: Vec<Option<u32>>,
        step: u64,
    ) -> (Vec<(usize, Option<FinishReason>)>, usize) {
        let mut finished: Vec<(usize, Option<FinishReason>)> = Vec::new();
        let mut generated = 0;
        for (i, next) in nexts.into_iter().enumerate() {
            let Some(next) = next else { continue };
            let s = &mut self.active[i];
            if self.eog.contains(&next) || s.params.stop_token_ids.contains(&next) {
                finished.push((i, Some(FinishReason::Stop)));
                continue;
            }
            s.tokens.push(next);
            s.generated += 1;
            generated += 1;
            let (text, stopped) = match s.text.as_mut() {
                Some(t) => {
                    let st = t.push(next);
                    (Some(st.piece), st.stopped)
                }
                None => (None, false),
            };
            let sent = s.tx.send(Event::Token {
                id: next,
                text,
                step,
            });
            if sent.is_err() {
                self.counters()
                    .cancellations
                    .fetch_add(1, Ordering::Relaxed);
                finished.push((i, None));
            } else if stopped {
                if let Some(t) = s.text.as_mut() {
                    // The match and anything after it are dropped.
                    t.finish();
                }
                finished.push((i, Some(FinishReason::Stop)));
            } else if s.generated >= s.params.max_tokens || s.tokens.len() >= self.n_ctx {
                finished.push((i, Some(FinishReason::Length)));
            }
        }
        (finished, generated)
    }

    /// Removes the sequences that ended, publishes the step's counters, then sends their
    /// final events: a client that has seen its stream end also sees counters that include
    /// its last step.
    fn end_finished(&mut self, mut finished: Vec<(usize, Option<FinishReason>)>, generated: usize) {
        finished.sort_unstable_by_key(|&(i, _)| i);
        let mut ended = Vec::with_capacity(finished.len());
        for (i, reason) in finished.into_iter().rev() {
            ended.push((self.active.remove(i), reason));
        }
        self.counters().steps.fetch_add(1, Ordering::Relaxed);
        self.publish(generated);
        for (mut s, reason) in ended {
            if let Some(reason) = reason {
                s.finish(reason);
            }
            s.span
                .in_scope(|| tracing::debug!(id = s.id, generated = s.generated, "finished"));
        }
    }

    /// Updates the gauges and the tokens/s estimate after a step.
    fn publish(&mut self, generated: usize) {
        let c = &self.shared.counters;
        c.tokens_generated
            .fetch_add(generated as u64, Ordering::Relaxed);
        c.active_sequences
            .store(self.active.len(), Ordering::Relaxed);
        c.kv_bytes.store(self.kv_used(), Ordering::Relaxed);
        {
            let q = self.shared.queue.lock();
            c.queue_depth
                .store(q.len() + self.resume.len(), Ordering::Relaxed);
        }
        let now = Instant::now();
        self.rate_window.push_back((now, generated));
        while let Some(&(t, _)) = self.rate_window.front() {
            if now.duration_since(t).as_secs_f64() > RATE_WINDOW_SECS {
                self.rate_window.pop_front();
            } else {
                break;
            }
        }
        let rate = match self.rate_window.front() {
            Some(&(t0, _)) if self.rate_window.len() > 1 => {
                let secs = now.duration_since(t0).as_secs_f64();
                // Tokens produced after the window's first step, over the time since it.
                let toks: usize = self.rate_window.iter().skip(1).map(|&(_, n)| n).sum();
                if secs > 0.0 { toks as f64 / secs } else { 0.0 }
            }
            _ => 0.0,
        };
        c.tokens_per_second_bits
            .store(rate.to_bits(), Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::{Priority, pick_class};

    #[test]
    fn interactive_goes_first_until_batch_is_promoted() {
        // Batch #1 queued at step 10, interactive #2 queued later; promotion after 5 steps.
        let (i, b) = (Some((2, 12)), Some((1, 10)));
        assert_eq!(pick_class(i, b, 10, 5), Some(Priority::Interactive));
        assert_eq!(pick_class(i, b, 14, 5), Some(Priority::Interactive));
        // Waited 5 steps: promoted, and it arrived before the interactive front.
        assert_eq!(pick_class(i, b, 15, 5), Some(Priority::Batch));
        // A promoted batch request does not overtake an interactive one that arrived earlier.
        assert_eq!(
            pick_class(Some((1, 10)), Some((2, 10)), 100, 5),
            Some(Priority::Interactive)
        );
        // 0 = plain FIFO across classes.
        assert_eq!(pick_class(i, b, 10, 0), Some(Priority::Batch));
        // A lone class is served whatever its priority.
        assert_eq!(pick_class(None, b, 10, 5), Some(Priority::Batch));
        assert_eq!(pick_class(i, None, 10, 5), Some(Priority::Interactive));
        assert_eq!(pick_class(None, None, 10, 5), None);
    }
}
