//! Integration tests of `airlock-inference` against the real model files and the reference
//! fixtures (see `../shared/fixtures/README.md`).

mod common;
mod embed;
mod generate;
mod generate_engine;
mod gguf_tokenizer;
mod rerank;
