//! Text generation with quantized GGUF decoders (llama and qwen2 layouts) on the CPU.
//!
//! - [`DecoderModel`]: our own batched forward over per-sequence KV caches ([`KvCache`]), so
//!   sequences at different positions decode in one step with the weights read once.
//!
//! Chat templates and tokenizers live in [`crate::tokenizer`]; this module works on token ids.

mod kv;
mod model;
mod ops;
mod qmatmul;

pub use kv::{KV_BLOCK_TOKENS, KvCache};
pub use model::{Arch, DecoderModel, ModelConfig, SeqChunk, SpecialTokens};
pub use ops::RopeStyle;
