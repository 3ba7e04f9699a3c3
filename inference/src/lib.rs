//! `airlock-inference`: tokenizers, the sentence embedder, the cross-encoder reranker, quantized
//! GGUF generators and the continuous-batching engine. Models load only from an installed,
//! verified bundle's catalogue paths; there is no network code.
#![warn(missing_docs)]

mod bert;
mod bert_fast;
pub mod catalogue;
pub mod chat;
pub mod embed;
pub mod error;
pub mod generate;
pub mod rerank;
pub mod tokenizer;

pub use catalogue::{Catalogue, GeneratorFiles, ModelEntry, Role};
pub use chat::{ChatMessage, ChatTemplate};
pub use embed::{EmbedTicket, EmbedWorker, Embedder, EmbedderConfig, EmbedderFiles};
pub use error::{Error, Result};
pub use rerank::{CrossEncoder, CrossEncoderConfig, CrossEncoderFiles, EmbeddingRescorer};
