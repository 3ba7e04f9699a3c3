//! A quantized decoder (llama and qwen2 GGUF layouts) with a batched forward over per-sequence
//! KV caches.
//!
//! One call to [`DecoderModel::forward`] takes any mix of sequences, each contributing a chunk of
//! tokens at its own position (a 1-token decode step or a prefill chunk). The rows of all chunks
//! are stacked so every weight matrix (Q/K/V, O, gate/up/down, lm_head) is applied once per call
//! over `[rows, hidden]`; attention then runs per sequence over its own cache with its own RoPE
//! positions, causally within a chunk.
//!
//! Written against llama.cpp's graph (`llm_build_llama`, `llm_build_qwen2`) rather than
//! candle-transformers' models (which keep one cache with a scalar offset): RMS norm summed in
//! f64, RoPE angles computed the ggml way, GQA by head grouping, tied embeddings when the file
//! has no `output.weight`.

use std::fs::File;
use std::io::BufReader;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use candle_core::quantized::QTensor;
use candle_core::quantized::gguf_file::{self, Value};
use candle_core::{Device, Tensor};
use half::slice::HalfFloatSliceExt;
use rayon::prelude::*;

use super::kv::KvCache;
use super::ops::{self, HeadView, Kv, RopeStyle};
use super::qmatmul::{SharedActs, Weight};
use crate::Error;

/// Decoder architectures this module can run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arch {
    /// `general.architecture = llama` (SmolLM2, Llama 2/3, Mistral).
    Llama,
    /// `general.architecture = qwen2` (Qwen2, Qwen2.5): biases on Q/K/V, NEOX-style RoPE.
    Qwen2,
}

/// Hyper-parameters read from the GGUF metadata.
#[derive(Debug, Clone)]
pub struct ModelConfig {
    /// Architecture.
    pub arch: Arch,
    /// Number of transformer blocks.
    pub n_layer: usize,
    /// Hidden width.
    pub n_embd: usize,
    /// Query heads.
    pub n_head: usize,
    /// Key/value heads (grouped-query attention when smaller than `n_head`).
    pub n_kv_head: usize,
    /// Width of one head.
    pub head_dim: usize,
    /// Dimensions of each head that RoPE rotates.
    pub rope_dims: usize,
    /// RoPE frequency base.
    pub rope_base: f32,
    /// RMS norm epsilon.
    pub rms_eps: f32,
    /// Context length the model was trained with.
    pub n_ctx_train: usize,
    /// Vocabulary size (rows of the output matrix).
    pub vocab_size: usize,
    /// Whether the output matrix is the token embedding (no `output.weight` in the file).
    pub tied_embeddings: bool,
}

impl ModelConfig {
    /// `n_kv_head * head_dim`: floats per position per layer in K (and in V).
    pub fn kv_dim(&self) -> usize {
        self.n_kv_head * self.head_dim
    }

    /// KV-cache bytes per position of one sequence (all layers, K and V, `f16`).
    pub fn kv_bytes_per_token(&self) -> usize {
        super::kv::bytes_per_token(self.n_layer, self.kv_dim())
    }

    fn rope_style(&self) -> RopeStyle {
        match self.arch {
            Arch::Llama => RopeStyle::Interleaved,
            Arch::Qwen2 => RopeStyle::Halves,
        }
    }
}

/// Special token ids read from the GGUF tokenizer metadata.
#[derive(Debug, Clone, Default)]
pub struct SpecialTokens {
    /// `tokenizer.ggml.bos_token_id`.
    pub bos: Option<u32>,
    /// `tokenizer.ggml.eos_token_id`.
    pub eos: Option<u32>,
    /// Whether the GGUF asks for BOS to be prepended (`tokenizer.ggml.add_bos_token`).
    pub add_bos: bool,
    /// End-of-generation ids: EOS, EOT, plus the control tokens llama.cpp also treats as end of
    /// generation (`<|im_end|>`, `<|endoftext|>`, `<|eot_id|>`, `<end_of_turn>`, ...).
    pub end_of_generation: Vec<u32>,
}

struct Layer {
    attn_norm: Vec<f32>,
    wq: Weight,
    wk: Weight,
    wv: Weight,
    bq: Option<Vec<f32>>,
    bk: Option<Vec<f32>>,
    bv: Option<Vec<f32>>,
    wo: Weight,
    ffn_norm: Vec<f32>,
    w_gate: Weight,
    w_up: Weight,
    w_down: Weight,
}

/// One sequence's part of a batched forward call.
pub struct SeqChunk<'a> {
    /// Tokens to append at positions `cache.len()..cache.len() + tokens.len()`.
    pub tokens: &'a [u32],
    /// The sequence's cache; the tokens' keys and values are appended to it.
    pub cache: &'a mut KvCache,
    /// Whether to return the logits after the chunk's last token.
    pub want_logits: bool,
}

/// A quantized GGUF decoder loaded on the CPU.
pub struct DecoderModel {
    cfg: ModelConfig,
    special: SpecialTokens,
    path: PathBuf,
    tok_embd: Arc<QTensor>,
    layers: Vec<Layer>,
    out_norm: Vec<f32>,
    lm_head: Weight,
}

impl std::fmt::Debug for DecoderModel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DecoderModel")
            .field("path", &self.path)
            .field("cfg", &self.cfg)
            .finish_non_exhaustive()
    }
}

fn md_uint(v: &Value) -> Option<u64> {
    match *v {
        Value::U8(x) => Some(x.into()),
        Value::U16(x) => Some(x.into()),
        Value::U32(x) => Some(x.into()),
        Value::U64(x) => Some(x),
        Value::I8(x) => u64::try_from(x).ok(),
        Value::I16(x) => u64::try_from(x).ok(),
        Value::I32(x) => u64::try_from(x).ok(),
        Value::I64(x) => u64::try_from(x).ok(),
        _ => None,
    }
}

fn md_float(v: &Value) -> Option<f32> {
    match *v {
        Value::F32(x) => Some(x),
        Value::F64(x) => Some(x as f32),
        _ => md_uint(v).map(|x| x as f32),
    }
}

/// Control-token texts llama.cpp adds to its end-of-generation set when present in the vocabulary.
const EOG_TEXTS: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<|eom_id|>",
    "<EOT>",
    "_<EOT>",
    "<｜end▁of▁sentence｜>",
];

impl DecoderModel {
    /// Loads a llama or qwen2 GGUF file from `path` (a catalogue path of an installed bundle).
    pub fn load(path: impl AsRef<Path>) -> crate::Result<Self> {
        let path = path.as_ref().to_path_buf();
        // A kernel tier forced by AIRLOCK_KERNEL_TIER that this CPU cannot run is refused here.
        super::qmatmul::kernel_tier().map_err(Error::InvalidInput)?;
        let file = File::open(&path).map_err(|e| Error::io(&path, e))?;
        let mut reader = BufReader::new(file);
        let ct = gguf_file::Content::read(&mut reader)
            .map_err(|e| Error::invalid(&path, format!("not a GGUF file: {e}")))?;
        let bad = |reason: String| Error::invalid(&path, reason);
        // `vocab_size` and `tied_embeddings` are set from the tensors below.
        let mut cfg = read_config(&ct, &path)?;
        let n_embd = cfg.n_embd;

        let special = read_special_tokens(&ct);
        let mut ld = Loader {
            ct: &ct,
            reader: &mut reader,
            path: &path,
        };
        let tok_embd = Arc::new(ld.qtensor("token_embd.weight")?);
        let (vocab_size, embd_width) = tok_embd
            .shape()
            .dims2()
            .map_err(|e| Error::invalid(&path, format!("token_embd.weight: {e}")))?;
        if embd_width != n_embd {
            return Err(bad(format!("token_embd width {embd_width} != {n_embd}")));
        }
        let has_output = ct.tensor_infos.contains_key("output.weight");
        let lm_head = if has_output {
            ld.qmm("output.weight")?
        } else {
            Weight::shared(&tok_embd).map_err(|e| bad(format!("lm_head: {e}")))?
        };
        let out_norm = ld.vector("output_norm.weight", n_embd)?;
        let mut layers = Vec::with_capacity(cfg.n_layer);
        for i in 0..cfg.n_layer {
            layers.push(ld.layer(&cfg, i)?);
        }
        cfg.vocab_size = vocab_size;
        cfg.tied_embeddings = !has_output;
        tracing::debug!(path = %path.display(), ?cfg, "loaded GGUF decoder");
        Ok(Self {
            cfg,
            special,
            path,
            tok_embd,
            layers,
            out_norm,
            lm_head,
        })
    }

    /// The model's hyper-parameters.
    pub fn config(&self) -> &ModelConfig {
        &self.cfg
    }

    /// Special token ids from the GGUF metadata.
    pub fn special_tokens(&self) -> &SpecialTokens {
        &self.special
    }

    /// The file the model was loaded from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// A new, empty KV cache shaped for this model.
    pub fn new_cache(&self) -> KvCache {
        KvCache::new(self.cfg.n_layer, self.cfg.kv_dim())
    }

    fn tensor_err(&self) -> impl Fn(candle_core::Error) -> Error + '_ {
        |source| Error::Tensor {
            model: self.path.display().to_string(),
            source,
        }
    }

    /// Runs one batched step. Each chunk's tokens are appended to its cache; for every chunk with
    /// `want_logits`, the logits (`vocab_size` floats) after its last token are returned at the
    /// chunk's index (`None` for the others).
    ///
    /// All rows share every weight read; attention is per chunk over its own cache. A chunk may
    /// not be empty, and the caches must belong to this model ([`DecoderModel::new_cache`]).
    pub fn forward(&self, chunks: &mut [SeqChunk<'_>]) -> crate::Result<Vec<Option<Vec<f32>>>> {
        let cfg = &self.cfg;
        let terr = self.tensor_err();
        if chunks.iter().any(|c| c.tokens.is_empty()) {
            return Err(Error::InvalidInput("empty chunk in a forward step".into()));
        }
        if let Some(&bad) = chunks
            .iter()
            .flat_map(|c| c.tokens.iter())
            .find(|&&t| t as usize >= cfg.vocab_size)
        {
            return Err(Error::InvalidInput(format!(
                "token id {bad} out of vocabulary"
            )));
        }
        let (h, hd, nh) = (cfg.n_embd, cfg.head_dim, cfg.n_head);
        let kv_dim = cfg.kv_dim();
        // Row layout: rows of chunk i are [row_start[i], row_start[i] + len_i).
        let mut row_start = Vec::with_capacity(chunks.len());
        let mut positions = Vec::new();
        let mut ids = Vec::new();
        for c in chunks.iter_mut() {
            row_start.push(positions.len());
            let start = c.cache.len();
            positions.extend(start..start + c.tokens.len());
            ids.extend_from_slice(c.tokens);
            c.cache.reserve(c.tokens.len());
        }
        let rows = positions.len();

        let ids_t = Tensor::new(ids.as_slice(), &Device::Cpu).map_err(&terr)?;
        let mut x = self
            .tok_embd
            .embedding(&ids_t)
            .and_then(|t| t.flatten_all())
            .and_then(|t| t.to_vec1::<f32>())
            .map_err(&terr)?;

        let mut angles = Vec::with_capacity(rows);
        let mut buf = Vec::new();
        for &p in &positions {
            ops::rope_angles(p, cfg.rope_dims, cfg.rope_base, &mut buf);
            angles.push(buf.clone());
        }
        let style = cfg.rope_style();
        let scale = 1.0 / (hd as f32).sqrt();
        let group = nh / cfg.n_kv_head;
        let mut normed = vec![0f32; rows * h];
        let mut attn = vec![0f32; rows * nh * hd];

        // The element-wise steps run on the rayon pool for prefill-sized calls (per row or per
        // slice: each value's operations are unchanged, so the results are too).
        let par = rows >= PAR_ROWS;
        // Matmul outputs, their allocations reused layer after layer.
        let (mut q, mut k, mut v, mut o) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        let (mut gate, mut up, mut down) = (Vec::new(), Vec::new(), Vec::new());
        for (li, layer) in self.layers.iter().enumerate() {
            rms_norm_rows(&x, &layer.attn_norm, cfg.rms_eps, &mut normed, par);
            // Q, K and V read the same input, quantized once.
            let mut acts = SharedActs::new(&normed, rows);
            layer.wq.matmul_shared(&mut acts, &mut q).map_err(&terr)?;
            layer.wk.matmul_shared(&mut acts, &mut k).map_err(&terr)?;
            layer.wv.matmul_shared(&mut acts, &mut v).map_err(&terr)?;
            drop(acts);
            add_bias(&mut q, layer.bq.as_deref());
            add_bias(&mut k, layer.bk.as_deref());
            add_bias(&mut v, layer.bv.as_deref());
            // RoPE, then llama.cpp's rounding: its default cache holds K and V in f16 and
            // multiplies Q in f16, so round the same values the same way and near-tied tokens
            // fall the same side.
            let rope = |row: &mut [f32], angles: &[(f32, f32)]| {
                ops::apply_rope(row, hd, cfg.rope_dims, style, angles);
                round_f16(row);
            };
            if par {
                q.par_chunks_mut(nh * hd)
                    .zip(angles.par_iter())
                    .for_each(|(row, a)| rope(row, &a[..]));
                k.par_chunks_mut(kv_dim)
                    .zip(angles.par_iter())
                    .for_each(|(row, a)| rope(row, &a[..]));
            } else {
                for (row, a) in q.chunks_mut(nh * hd).zip(&angles) {
                    rope(row, &a[..]);
                }
                for (row, a) in k.chunks_mut(kv_dim).zip(&angles) {
                    rope(row, &a[..]);
                }
            }
            round_f16(&mut v);
            for (ci, c) in chunks.iter_mut().enumerate() {
                let (a, b) = (
                    row_start[ci] * kv_dim,
                    (row_start[ci] + c.tokens.len()) * kv_dim,
                );
                c.cache.append(li, &k[a..b], &v[a..b]);
            }
            // A chunk of several rows reads its layer widened to f32 once (every position is
            // read by each row after it); a decode row reads the f16 cache as it is.
            let wide: Vec<Option<(Vec<f32>, Vec<f32>)>> = chunks
                .iter()
                .map(|c| {
                    let (keys, values) = c.cache.layer(li);
                    (c.tokens.len() >= WIDEN_KV_ROWS)
                        .then(|| (keys.to_f32_vec(), values.to_f32_vec()))
                })
                .collect();
            // Row r's cache view, and how many positions it may see (causal within its chunk).
            let views: Vec<(Kv<'_>, usize)> = chunks
                .iter()
                .zip(&wide)
                .enumerate()
                .flat_map(|(ci, (c, wide))| {
                    let kv = match wide {
                        Some((keys, values)) => Kv::F32 { keys, values },
                        None => {
                            let (keys, values) = c.cache.layer(li);
                            Kv::F16 { keys, values }
                        }
                    };
                    let start = positions[row_start[ci]];
                    (0..c.tokens.len()).map(move |j| (kv, start + j + 1))
                })
                .collect();
            // One task per (row, KV head): the query heads sharing a KV head are contiguous in
            // `q` and `attn` (head = kv_head · group + j) and read each key and value once.
            attn.par_chunks_mut(group * hd)
                .enumerate()
                .for_each(|(idx, out)| {
                    let (r, kvh) = (idx / cfg.n_kv_head, idx % cfg.n_kv_head);
                    let (kv, ctx) = views[r];
                    let view = HeadView {
                        kv,
                        kv_stride: kv_dim,
                        kv_offset: kvh * hd,
                        ctx,
                    };
                    let qs = &q[r * nh * hd + kvh * group * hd..][..group * hd];
                    ops::attend_group(qs, hd, &view, scale, out);
                });
            layer
                .wo
                .matmul_shared(&mut SharedActs::new(&attn, rows), &mut o)
                .map_err(&terr)?;
            add_assign(&mut x, &o);

            rms_norm_rows(&x, &layer.ffn_norm, cfg.rms_eps, &mut normed, par);
            let mut acts = SharedActs::new(&normed, rows);
            layer
                .w_gate
                .matmul_shared(&mut acts, &mut gate)
                .map_err(&terr)?;
            layer
                .w_up
                .matmul_shared(&mut acts, &mut up)
                .map_err(&terr)?;
            drop(acts);
            if par {
                let w = up.len() / rows;
                gate.par_chunks_mut(w)
                    .zip(up.par_chunks(w))
                    .for_each(|(g, u)| ops::silu_mul(g, u));
            } else {
                ops::silu_mul(&mut gate, &up);
            }
            layer
                .w_down
                .matmul_shared(&mut SharedActs::new(&gate, rows), &mut down)
                .map_err(&terr)?;
            add_assign(&mut x, &down);
        }
        for c in chunks.iter_mut() {
            c.cache.commit(c.tokens.len());
        }

        // Final norm and lm_head only for the rows whose logits are wanted.
        let wanted: Vec<usize> = chunks
            .iter()
            .enumerate()
            .filter(|(_, c)| c.want_logits)
            .map(|(ci, _)| ci)
            .collect();
        let mut result = vec![None; chunks.len()];
        if wanted.is_empty() {
            return Ok(result);
        }
        let mut last = Vec::with_capacity(wanted.len() * h);
        for &ci in &wanted {
            let r = row_start[ci] + chunks[ci].tokens.len() - 1;
            last.extend_from_slice(&x[r * h..(r + 1) * h]);
        }
        let mut last_normed = vec![0f32; last.len()];
        ops::rms_norm(&last, &self.out_norm, cfg.rms_eps, &mut last_normed);
        let logits = self
            .lm_head
            .matmul(&last_normed, wanted.len())
            .map_err(&terr)?;
        let vocab = logits.len() / wanted.len();
        for (i, &ci) in wanted.iter().enumerate() {
            result[ci] = Some(logits[i * vocab..(i + 1) * vocab].to_vec());
        }
        Ok(result)
    }
}

/// The hyper-parameters in a GGUF file's metadata, checked for consistency; `vocab_size` and
/// `tied_embeddings` (which the tensors tell) left 0 and false.
fn read_config(ct: &gguf_file::Content, path: &Path) -> crate::Result<ModelConfig> {
    let bad = |reason: String| Error::invalid(path, reason);
    let arch_name = ct
        .metadata
        .get("general.architecture")
        .and_then(|v| v.to_string().ok())
        .cloned()
        .unwrap_or_default();
    let arch = match arch_name.as_str() {
        "llama" => Arch::Llama,
        "qwen2" => Arch::Qwen2,
        other => return Err(bad(format!("unsupported architecture {other:?}"))),
    };
    let key = |k: &str| format!("{arch_name}.{k}");
    let uint = |k: &str| -> crate::Result<usize> {
        ct.metadata
            .get(&key(k))
            .and_then(md_uint)
            .map(|v| v as usize)
            .ok_or_else(|| Error::invalid(path, format!("missing metadata {}", key(k))))
    };
    let n_layer = uint("block_count")?;
    let n_embd = uint("embedding_length")?;
    let n_head = uint("attention.head_count")?;
    let n_kv_head = uint("attention.head_count_kv").unwrap_or(n_head);
    let n_ctx_train = uint("context_length")?;
    if n_head == 0 || n_kv_head == 0 || n_embd % n_head != 0 || n_head % n_kv_head != 0 {
        return Err(bad(format!(
            "inconsistent heads: n_embd {n_embd}, n_head {n_head}, n_kv_head {n_kv_head}"
        )));
    }
    let head_dim = n_embd / n_head;
    let rope_dims = uint("rope.dimension_count").unwrap_or(head_dim);
    let rope_base = ct
        .metadata
        .get(&key("rope.freq_base"))
        .and_then(md_float)
        .unwrap_or(10_000.0);
    let rms_eps = ct
        .metadata
        .get(&key("attention.layer_norm_rms_epsilon"))
        .and_then(md_float)
        .ok_or_else(|| {
            bad(format!(
                "missing {}",
                key("attention.layer_norm_rms_epsilon")
            ))
        })?;
    if rope_dims > head_dim || rope_dims % 2 != 0 {
        return Err(bad(format!("rope dims {rope_dims} vs head dim {head_dim}")));
    }
    Ok(ModelConfig {
        arch,
        n_layer,
        n_embd,
        n_head,
        n_kv_head,
        head_dim,
        rope_dims,
        rope_base,
        rms_eps,
        n_ctx_train,
        vocab_size: 0,
        tied_embeddings: false,
    })
}

/// Reads named tensors out of an open GGUF file.
struct Loader<'a, 'r> {
    ct: &'a gguf_file::Content,
    reader: &'r mut BufReader<File>,
    path: &'a Path,
}

impl Loader<'_, '_> {
    fn qtensor(&mut self, name: &str) -> crate::Result<QTensor> {
        self.ct
            .tensor(self.reader, name, &Device::Cpu)
            .map_err(|e| Error::invalid(self.path, format!("tensor {name}: {e}")))
    }

    fn qmm(&mut self, name: &str) -> crate::Result<Weight> {
        let t = self.qtensor(name)?;
        Weight::new(t).map_err(|e| Error::invalid(self.path, format!("{name}: {e}")))
    }

    /// A small tensor (norm weight, bias) as `f32`, checked to hold `len` values.
    fn vector(&mut self, name: &str, len: usize) -> crate::Result<Vec<f32>> {
        let v = self
            .qtensor(name)?
            .dequantize(&Device::Cpu)
            .and_then(|t| t.flatten_all())
            .and_then(|t| t.to_vec1::<f32>())
            .map_err(|e| Error::invalid(self.path, format!("{name}: {e}")))?;
        if v.len() != len {
            return Err(Error::invalid(
                self.path,
                format!("{name} has {} values, expected {len}", v.len()),
            ));
        }
        Ok(v)
    }

    /// The weights of block `i` (Q/K/V biases for Qwen2).
    fn layer(&mut self, cfg: &ModelConfig, i: usize) -> crate::Result<Layer> {
        let n_embd = cfg.n_embd;
        let kv_dim = cfg.n_kv_head * cfg.head_dim;
        let p = format!("blk.{i}");
        let bias = |ld: &mut Self, name: &str, len: usize| {
            if cfg.arch == Arch::Qwen2 {
                ld.vector(&format!("{p}.{name}.bias"), len).map(Some)
            } else {
                Ok(None)
            }
        };
        Ok(Layer {
            bq: bias(self, "attn_q", n_embd)?,
            bk: bias(self, "attn_k", kv_dim)?,
            bv: bias(self, "attn_v", kv_dim)?,
            attn_norm: self.vector(&format!("{p}.attn_norm.weight"), n_embd)?,
            ffn_norm: self.vector(&format!("{p}.ffn_norm.weight"), n_embd)?,
            wq: self.qmm(&format!("{p}.attn_q.weight"))?,
            wk: self.qmm(&format!("{p}.attn_k.weight"))?,
            wv: self.qmm(&format!("{p}.attn_v.weight"))?,
            wo: self.qmm(&format!("{p}.attn_output.weight"))?,
            w_gate: self.qmm(&format!("{p}.ffn_gate.weight"))?,
            w_up: self.qmm(&format!("{p}.ffn_up.weight"))?,
            w_down: self.qmm(&format!("{p}.ffn_down.weight"))?,
        })
    }
}

/// Rows from which a forward call runs its element-wise steps on the rayon pool.
const PAR_ROWS: usize = 8;
/// Rows of one chunk from which its attention reads the layer's keys and values widened to
/// f32 once, not converted position by position for every row and KV head.
const WIDEN_KV_ROWS: usize = 2;

/// [`ops::rms_norm`] of every row, in parallel when `par`.
fn rms_norm_rows(x: &[f32], weight: &[f32], eps: f32, out: &mut [f32], par: bool) {
    let w = weight.len();
    if par {
        x.par_chunks(w)
            .zip(out.par_chunks_mut(w))
            .for_each(|(x, o)| ops::rms_norm(x, weight, eps, o));
    } else {
        ops::rms_norm(x, weight, eps, out);
    }
}

fn round_f16(x: &mut [f32]) {
    for v in x {
        *v = half::f16::from_f32(*v).to_f32();
    }
}

fn add_bias(x: &mut [f32], bias: Option<&[f32]>) {
    if let Some(b) = bias {
        for row in x.chunks_exact_mut(b.len()) {
            add_assign(row, b);
        }
    }
}

fn add_assign(x: &mut [f32], y: &[f32]) {
    for (a, &b) in x.iter_mut().zip(y) {
        *a += b;
    }
}

fn read_special_tokens(ct: &gguf_file::Content) -> SpecialTokens {
    let id = |k: &str| ct.metadata.get(k).and_then(md_uint).map(|v| v as u32);
    let bos = id("tokenizer.ggml.bos_token_id");
    let eos = id("tokenizer.ggml.eos_token_id");
    let add_bos = matches!(
        ct.metadata.get("tokenizer.ggml.add_bos_token"),
        Some(Value::Bool(true))
    );
    let mut eog: Vec<u32> = [
        eos,
        id("tokenizer.ggml.eot_token_id"),
        id("tokenizer.ggml.eom_token_id"),
    ]
    .into_iter()
    .flatten()
    .collect();
    if let Some(Ok(tokens)) = ct.metadata.get("tokenizer.ggml.tokens").map(|v| v.to_vec()) {
        for (i, t) in tokens.iter().enumerate() {
            if let Ok(s) = t.to_string()
                && EOG_TEXTS.contains(&s.as_str())
            {
                eog.push(i as u32);
            }
        }
    }
    eog.sort_unstable();
    eog.dedup();
    SpecialTokens {
        bos,
        eos,
        add_bos,
        end_of_generation: eog,
    }
}
