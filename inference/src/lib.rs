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
pub mod stage;
pub mod tokenizer;

pub use catalogue::{Catalogue, GeneratorFiles, ModelEntry, Role};
pub use chat::{ChatMessage, ChatTemplate};
pub use embed::{EmbedTicket, EmbedWorker, Embedder, EmbedderConfig, EmbedderFiles};
pub use error::{Error, Result};
pub use rerank::{CrossEncoder, CrossEncoderConfig, CrossEncoderFiles, EmbeddingRescorer};

/// The CPU model, its logical processors and the SIMD flags that matter to the kernels
/// (`/proc/cpuinfo`): the line every benchmark prints with its numbers.
pub fn cpu_line() -> String {
    let info = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let field = |name: &str| {
        info.lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_once(':'))
            .map_or(String::new(), |(_, v)| v.trim().to_string())
    };
    let flags = field("flags");
    let simd: Vec<&str> = flags
        .split_whitespace()
        .filter(|f| f.starts_with("avx") || *f == "fma" || *f == "f16c" || f.starts_with("amx"))
        .collect();
    format!(
        "CPU: {} ({} logical); SIMD flags: {}",
        field("model name"),
        info.lines().filter(|l| l.starts_with("processor")).count(),
        simd.join(" ")
    )
}

/// The f32 micro-kernels of the `gemm` crate (candle's matmuls: the embedder and the
/// cross-encoder) on this CPU: `avx512f` (the workspace enables gemm's `x86-v4` feature),
/// `avx2+fma`, or `scalar`. gemm chooses at run time with the same tests, in this order, so a
/// CPU without AVX-512 (or a VM/emulator that masks it) runs the AVX2 kernels of the same binary.
/// `AIRLOCK_KERNEL_TIER` does not apply here: it forces the quantized generator kernels only.
pub fn gemm_kernels() -> &'static str {
    // The crate is a dependency only for its feature; this names it so the link is explicit.
    use gemm as _;
    #[cfg(target_arch = "x86_64")]
    {
        if is_x86_feature_detected!("avx512f") {
            return "avx512f";
        }
        if is_x86_feature_detected!("fma") {
            return "avx2+fma";
        }
    }
    "scalar"
}
