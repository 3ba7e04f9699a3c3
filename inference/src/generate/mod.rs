//! Text generation with quantized GGUF decoders (llama and qwen2 layouts) on the CPU.
//!
//! - [`DecoderModel`]: our own batched forward over per-sequence KV caches ([`KvCache`]), so
//!   sequences at different positions decode in one step with the weights read once. Greedy
//!   output equals llama.cpp's on the fixtures (see `tests/integration/generate.rs`).
//! - [`SamplingParams`]: greedy, temperature, top-p, per-request seed, stop tokens, stop strings
//!   and `max_tokens`.
//! - [`Engine`]: the continuous-batching scheduler (bounded queue with per-[`Priority`] limits,
//!   interactive requests admitted before batch ones with promotion of long-waiting batch
//!   requests, chunked prefill interleaved with decode, cancellation on a dropped receiver, KV
//!   budget with preemption of the newest sequence, counters for metrics).
//!
//! Chat templates and tokenizers live in [`crate::chat`] and [`crate::tokenizer`]; this module
//! works on token ids, and takes an optional [`Detokenizer`] for text and stop strings. Models
//! load from file paths the caller takes from an installed bundle's catalogue; nothing here
//! touches the network.

mod engine;
mod kv;
mod model;
mod ops;
mod qmatmul;
mod sampling;

pub use engine::{
    Engine, EngineConfig, EngineCounters, EngineMetrics, Event, FinishReason, GenerateRequest,
    MIN_PREFILL_ROWS, Priority, Stream, SubmitError, Usage,
};
pub use kv::{KV_BLOCK_TOKENS, KvCache};
pub use model::{Arch, DecoderModel, ModelConfig, SeqChunk, SpecialTokens};
pub use ops::RopeStyle;
pub use qmatmul::{KERNEL_TIER_ENV, kernel_tier};
pub use sampling::{Detokenizer, SamplingParams, argmax};
