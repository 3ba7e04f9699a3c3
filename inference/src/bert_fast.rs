//! A padding-free ("varlen") BERT encoder forward pass, written for CPU throughput.
//!
//! candle-transformers' `BertModel` works on padded `[batch, len, hidden]` tensors: every padded
//! position costs as much as a real token, attention materialises one `[batch, heads, len, len]`
//! tensor (tens of MB for a batch of 32 × 256 tokens), and every elementwise step is a separate
//! pass over memory. [`FastBert`] computes the same post-LayerNorm BERT from the same weights
//! (erf GELU, absolute positions, token types) another way:
//!
//! - The tokens of all sequences of a batch are concatenated into one `[tokens, hidden]` matrix.
//!   All per-token work — embedding sum + LayerNorm, one fused Q/K/V projection against the
//!   concatenated weights, the attention output projection, the feed-forward block, residual adds
//!   and LayerNorms — runs on that matrix, so there is no padding work at all.
//! - Only attention is per sequence: for each (sequence, head) the scores of one block of query
//!   rows against all keys (at most `len` floats per row), softmax in place, times V, with small
//!   buffers reused across tasks; the Q/K/V biases are added while gathering one head.
//! - Bias adds are fused into the pass that reads a matmul result: bias + GELU, and bias +
//!   residual + LayerNorm.
//! - Matmuls are candle's (the `gemm` crate, which picks its SIMD kernels at run time); the rest
//!   is safe Rust over fixed-width chunks that the compiler vectorises, run in parallel on the
//!   rayon pool (`RAYON_NUM_THREADS`, like candle's matmuls).

use crate::bert::{Config, HiddenAct};
use candle_core::{Device, Storage, Tensor};
use candle_nn::VarBuilder;
use rayon::prelude::*;

/// Width of the independent accumulators in reductions and micro-tiles (one AVX register).
const LANES: usize = 8;
/// Query rows per attention micro-tile.
const ROW_BLOCK: usize = 4;
/// Key columns per score micro-tile.
const KEY_BLOCK: usize = 16;
/// Token rows per rayon task in the elementwise passes.
const ROWS_PER_TASK: usize = 16;

/// LayerNorm weights.
struct Norm {
    gamma: Vec<f32>,
    beta: Vec<f32>,
}

/// One encoder layer. Matmul weights are stored transposed, `[in, out]`, contiguous.
struct Layer {
    /// Query, key and value projections side by side: `[hidden, 3 * hidden]`.
    qkv_w: Tensor,
    qkv_b: Vec<f32>,
    out_w: Tensor,
    out_b: Vec<f32>,
    attn_norm: Norm,
    up_w: Tensor,
    up_b: Vec<f32>,
    down_w: Tensor,
    down_b: Vec<f32>,
    out_norm: Norm,
}

/// A BERT encoder with the padding-free forward pass (CPU, f32).
pub(crate) struct FastBert {
    hidden: usize,
    heads: usize,
    head_dim: usize,
    intermediate: usize,
    vocab: usize,
    max_positions: usize,
    type_vocab: usize,
    eps: f32,
    act: HiddenAct,
    /// Kernel tier (AVX2 + FMA when the CPU has it).
    isa: Isa,
    word: Vec<f32>,
    position: Vec<f32>,
    token_type: Vec<f32>,
    emb_norm: Norm,
    layers: Vec<Layer>,
}

/// The last hidden states of a packed batch: the rows of sequence `i` are
/// `starts[i]..starts[i + 1]`.
pub(crate) struct Hidden {
    data: Vec<f32>,
    hidden: usize,
    starts: Vec<usize>,
}

impl Hidden {
    /// The `[len, hidden]` rows of sequence `i`, row-major.
    pub(crate) fn rows(&self, i: usize) -> &[f32] {
        &self.data[self.starts[i] * self.hidden..self.starts[i + 1] * self.hidden]
    }

    /// The hidden state of the first token ([CLS]) of sequence `i`.
    pub(crate) fn first(&self, i: usize) -> &[f32] {
        &self.rows(i)[..self.hidden]
    }

    /// Number of sequences.
    pub(crate) fn len(&self) -> usize {
        self.starts.len() - 1
    }

    /// Mean over each sequence's tokens, L2-normalised (sentence-transformers pooling).
    pub(crate) fn mean_pooled_normalised(&self) -> Vec<Vec<f32>> {
        (0..self.len())
            .map(|i| {
                let rows = self.rows(i);
                let n = rows.len() / self.hidden;
                let mut v = vec![0f32; self.hidden];
                for row in rows.chunks_exact(self.hidden) {
                    for (a, &x) in v.iter_mut().zip(row) {
                        *a += x;
                    }
                }
                let inv_n = 1.0 / n as f32;
                for a in &mut v {
                    *a *= inv_n;
                }
                let norm = lane_sum_sq(&v).sqrt().max(1e-12);
                for a in &mut v {
                    *a /= norm;
                }
                v
            })
            .collect()
    }
}

fn to_vec(t: Tensor) -> candle_core::Result<Vec<f32>> {
    t.flatten_all()?.to_vec1::<f32>()
}

/// `nn.Linear` weight `[out, in]` → `[in, out]` contiguous, and its bias.
fn linear(vb: VarBuilder, inp: usize, out: usize) -> candle_core::Result<(Tensor, Vec<f32>)> {
    let w = vb.get((out, inp), "weight")?.t()?.contiguous()?;
    let b = to_vec(vb.get(out, "bias")?)?;
    Ok((w, b))
}

fn norm(vb: VarBuilder, size: usize) -> candle_core::Result<Norm> {
    // Old PyTorch checkpoints name LayerNorm parameters gamma/beta.
    let pick = |new: &'static str, old: &'static str| {
        if !vb.contains_tensor(new) && vb.contains_tensor(old) {
            old
        } else {
            new
        }
    };
    Ok(Norm {
        gamma: to_vec(vb.get(size, pick("weight", "gamma"))?)?,
        beta: to_vec(vb.get(size, pick("bias", "beta"))?)?,
    })
}

impl FastBert {
    /// Loads the encoder from Hugging Face BERT tensors (`embeddings.*`, `encoder.layer.N.*`),
    /// with or without a `bert.` (or `<model_type>.`) prefix, as candle's `BertModel` does.
    pub(crate) fn load(vb: VarBuilder, config: &Config) -> candle_core::Result<Self> {
        const PROBE: &str = "embeddings.word_embeddings.weight";
        let vb = if vb.contains_tensor(PROBE) {
            vb
        } else if vb.contains_tensor(&format!("bert.{PROBE}")) {
            vb.pp("bert")
        } else {
            match config.model_type.as_deref() {
                Some(mt) if vb.contains_tensor(&format!("{mt}.{PROBE}")) => vb.pp(mt),
                // Let the first `get` below report the missing tensor.
                _ => vb,
            }
        };
        let h = config.hidden_size;
        let heads = config.num_attention_heads;
        if heads == 0 || !h.is_multiple_of(heads) {
            candle_core::bail!("hidden_size {h} is not a multiple of num_attention_heads {heads}");
        }
        let emb = vb.pp("embeddings");
        let layers = (0..config.num_hidden_layers)
            .map(|i| {
                let l = vb.pp(format!("encoder.layer.{i}"));
                let sa = l.pp("attention.self");
                let get = |name: &str| -> candle_core::Result<(Tensor, Tensor)> {
                    let p = sa.pp(name);
                    Ok((p.get((h, h), "weight")?, p.get(h, "bias")?))
                };
                let (qw, qb) = get("query")?;
                let (kw, kb) = get("key")?;
                let (vw, vbias) = get("value")?;
                // Head-major output columns: [head][query | key | value][head_dim], so one
                // attention task reads one contiguous run of each row.
                let hd = h / heads;
                let by_head = |ts: [Tensor; 3], tail: &[usize]| -> candle_core::Result<Tensor> {
                    let parts = ts
                        .iter()
                        .map(|t| {
                            let mut shape = vec![heads, hd];
                            shape.extend_from_slice(tail);
                            t.reshape(shape)
                        })
                        .collect::<candle_core::Result<Vec<_>>>()?;
                    let mut shape = vec![3 * h];
                    shape.extend_from_slice(tail);
                    Tensor::cat(&parts, 1)?.reshape(shape)
                };
                let qkv_w = by_head([qw, kw, vw], &[h])?.t()?.contiguous()?;
                let qkv_b = to_vec(by_head([qb, kb, vbias], &[])?)?;
                let (out_w, out_b) = linear(l.pp("attention.output.dense"), h, h)?;
                let (up_w, up_b) = linear(l.pp("intermediate.dense"), h, config.intermediate_size)?;
                let (down_w, down_b) = linear(l.pp("output.dense"), config.intermediate_size, h)?;
                Ok(Layer {
                    qkv_w,
                    qkv_b,
                    out_w,
                    out_b,
                    attn_norm: norm(l.pp("attention.output.LayerNorm"), h)?,
                    up_w,
                    up_b,
                    down_w,
                    down_b,
                    out_norm: norm(l.pp("output.LayerNorm"), h)?,
                })
            })
            .collect::<candle_core::Result<Vec<_>>>()?;
        Ok(Self {
            hidden: h,
            heads,
            head_dim: h / heads,
            intermediate: config.intermediate_size,
            vocab: config.vocab_size,
            max_positions: config.max_position_embeddings,
            type_vocab: config.type_vocab_size,
            eps: config.layer_norm_eps as f32,
            act: config.hidden_act,
            isa: Isa::detect(),
            word: to_vec(emb.get((config.vocab_size, h), "word_embeddings.weight")?)?,
            position: to_vec(emb.get(
                (config.max_position_embeddings, h),
                "position_embeddings.weight",
            )?)?,
            token_type: to_vec(
                emb.get((config.type_vocab_size, h), "token_type_embeddings.weight")?,
            )?,
            emb_norm: norm(emb.pp("LayerNorm"), h)?,
            layers,
        })
    }

    /// Runs the encoder on `(token ids, token type ids)` sequences, packed without padding.
    pub(crate) fn forward(&self, seqs: &[(&[u32], &[u32])]) -> candle_core::Result<Hidden> {
        let h = self.hidden;
        let mut starts = Vec::with_capacity(seqs.len() + 1);
        starts.push(0usize);
        let mut tokens: Vec<(usize, usize, usize)> = Vec::new();
        for (ids, types) in seqs {
            if ids.is_empty() || ids.len() > self.max_positions || types.len() != ids.len() {
                candle_core::bail!(
                    "sequence of {} ids / {} type ids (allowed 1..={} each, equal)",
                    ids.len(),
                    types.len(),
                    self.max_positions
                );
            }
            for (pos, (&id, &ty)) in ids.iter().zip(*types).enumerate() {
                let (id, ty) = (id as usize, ty as usize);
                if id >= self.vocab || ty >= self.type_vocab {
                    candle_core::bail!("token id {id} / type {ty} out of range");
                }
                tokens.push((id, pos, ty));
            }
            starts.push(tokens.len());
        }
        let total = tokens.len();
        if total == 0 {
            return Ok(Hidden {
                data: Vec::new(),
                hidden: h,
                starts,
            });
        }
        let eps = self.eps;

        // Embeddings: word + token type + position, LayerNorm (candle's order of additions).
        let mut x = vec![0f32; total * h];
        x.par_chunks_mut(h)
            .zip(tokens.par_iter())
            .with_min_len(ROWS_PER_TASK)
            .for_each(|(row, &(id, pos, ty))| {
                let w = &self.word[id * h..][..h];
                let t = &self.token_type[ty * h..][..h];
                let p = &self.position[pos * h..][..h];
                for (((o, &a), &b), &c) in row.iter_mut().zip(w).zip(t).zip(p) {
                    *o = (a + b) + c;
                }
                layer_norm::<Plain>(row, &self.emb_norm, eps);
            });

        let mut by_head = vec![0f32; total * h];
        let mut ctx = vec![0f32; total * h];
        for layer in &self.layers {
            let qkv = matmul(&x, total, &layer.qkv_w)?;
            with_slice(&qkv, |qkv| {
                self.attention(qkv, &layer.qkv_b, &starts, &mut by_head);
            })?;
            heads_to_tokens(&by_head, &mut ctx, self.heads, self.head_dim, total);
            let attn = matmul(&ctx, total, &layer.out_w)?;
            let attn_pass = Rows::ResidualNorm {
                bias: &layer.out_b,
                norm: &layer.attn_norm,
                eps,
            };
            with_slice(&attn, |y| par_rows(self.isa, attn_pass, h, &mut x, y))?;
            let up = matmul(&x, total, &layer.up_w)?;
            let mut act = vec![0f32; total * self.intermediate];
            let act_pass = Rows::Activate {
                bias: &layer.up_b,
                act: self.act,
            };
            with_slice(&up, |u| {
                par_rows(self.isa, act_pass, self.intermediate, &mut act, u);
            })?;
            let down = Tensor::from_vec(act, (total, self.intermediate), &Device::Cpu)?
                .matmul(&layer.down_w)?;
            let out_pass = Rows::ResidualNorm {
                bias: &layer.down_b,
                norm: &layer.out_norm,
                eps,
            };
            with_slice(&down, |y| par_rows(self.isa, out_pass, h, &mut x, y))?;
        }
        Ok(Hidden {
            data: x,
            hidden: h,
            starts,
        })
    }

    /// Self-attention of every (head, sequence) pair. `qkv` is `[tokens, 3 * hidden]` without
    /// bias, columns `[head][query | key | value][head_dim]`; the result goes to `out`
    /// head-major: `[heads, tokens, head_dim]`.
    fn attention(&self, qkv: &[f32], bias: &[f32], starts: &[usize], out: &mut [f32]) {
        let total = *starts.last().unwrap_or(&0);
        let hd = self.head_dim;
        // Split each head's block by sequence, then order the tasks sequence by sequence so
        // the (parallel) tasks working at one time share the same rows of `qkv` in cache.
        let mut per_head: Vec<std::vec::IntoIter<&mut [f32]>> = out
            .chunks_exact_mut(total * hd)
            .map(|block| {
                let mut parts = Vec::with_capacity(starts.len() - 1);
                let mut rest = block;
                for w in starts.windows(2) {
                    let (mine, tail) = rest.split_at_mut((w[1] - w[0]) * hd);
                    parts.push(mine);
                    rest = tail;
                }
                parts.into_iter()
            })
            .collect();
        let mut tasks: Vec<(usize, usize, &mut [f32])> =
            Vec::with_capacity(self.heads * (starts.len() - 1));
        for &start in &starts[..starts.len() - 1] {
            for (head, parts) in per_head.iter_mut().enumerate() {
                let dst = parts.next().expect("one part per sequence");
                tasks.push((head, start, dst));
            }
        }
        let row = 3 * self.hidden;
        tasks
            .into_par_iter()
            .for_each_init(Scratch::default, |scratch, (head, start, dst)| {
                let len = dst.len() / hd;
                let task = Attend {
                    seq: &qkv[start * row..(start + len) * row],
                    bias,
                    hidden: self.hidden,
                    head_dim: hd,
                    head,
                    len,
                };
                task.run(self.isa, dst, scratch);
            });
    }
}

/// One attention task: one head of one sequence.
struct Attend<'a> {
    /// The sequence's rows of the Q/K/V projection, `[len, 3 * hidden]`, without bias.
    seq: &'a [f32],
    /// Q/K/V biases, `3 * hidden`.
    bias: &'a [f32],
    hidden: usize,
    head_dim: usize,
    head: usize,
    len: usize,
}

impl Attend<'_> {
    /// `dst` (`[len, head_dim]`) = softmax(Q Kᵀ / √d) V, with the widest kernels the CPU has.
    #[allow(unsafe_code)]
    fn run(&self, isa: Isa, dst: &mut [f32], s: &mut Scratch) {
        #[cfg(target_arch = "x86_64")]
        if isa == Isa::Avx2Fma {
            // SAFETY: `Isa::Avx2Fma` is only chosen after `is_x86_feature_detected!` confirmed
            // AVX2 and FMA; `run_avx2` has no other precondition.
            unsafe { self.run_avx2(dst, s) };
            return;
        }
        let _ = isa;
        self.run_with::<Plain>(dst, s);
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma")]
    fn run_avx2(&self, dst: &mut [f32], s: &mut Scratch) {
        self.run_with::<Fused>(dst, s);
    }

    #[inline(always)]
    fn run_with<M: Madd>(&self, dst: &mut [f32], s: &mut Scratch) {
        let (hd, len) = (self.head_dim, self.len);
        let lp = len.next_multiple_of(KEY_BLOCK);
        let lq = len.next_multiple_of(ROW_BLOCK);
        let scale = 1.0 / (hd as f32).sqrt();
        refill(&mut s.q, lq * hd);
        refill(&mut s.kt, hd * lp);
        refill(&mut s.v, len * hd);
        refill(&mut s.p, ROW_BLOCK * lp);
        refill(&mut s.pt, len * ROW_BLOCK);
        // This head's query, key and value columns are adjacent in each row (head-major
        // projection layout, see `FastBert::load`).
        let base = self.head * 3 * hd;
        let bias = &self.bias[base..base + 3 * hd];
        let (qb, rest) = bias.split_at(hd);
        let (kb, vb) = rest.split_at(hd);
        let row_len = 3 * self.hidden;
        for (i, (row, v)) in self
            .seq
            .chunks_exact(row_len)
            .zip(s.v.chunks_exact_mut(hd))
            .enumerate()
        {
            let (q, rest) = row[base..base + 3 * hd].split_at(hd);
            let (k, vr) = rest.split_at(hd);
            // queries of block i / ROW_BLOCK stored [head_dim][ROW_BLOCK]
            let qblk = &mut s.q[(i / ROW_BLOCK) * hd * ROW_BLOCK..][..hd * ROW_BLOCK];
            for (qt, (&x, &b)) in qblk[i % ROW_BLOCK..]
                .iter_mut()
                .step_by(ROW_BLOCK)
                .zip(q.iter().zip(qb))
            {
                *qt = (x + b) * scale;
            }
            for (kt, (&x, &b)) in s.kt[i..].iter_mut().step_by(lp).zip(k.iter().zip(kb)) {
                *kt = x + b;
            }
            for ((v, &x), &b) in v.iter_mut().zip(vr).zip(vb) {
                *v = x + b;
            }
        }
        for (blk, qt) in s.q.chunks_exact(ROW_BLOCK * hd).enumerate() {
            scores::<M>(qt, &s.kt, lp, &mut s.p);
            let mut inv = [0f32; ROW_BLOCK];
            for (p, inv) in s.p.chunks_exact_mut(lp).zip(&mut inv) {
                *inv = 1.0 / exp_shifted::<M>(&mut p[..len]);
            }
            transpose_block(&s.p, lp, &mut s.pt);
            let first = blk * ROW_BLOCK;
            let rows = (len - first).min(ROW_BLOCK);
            let out = &mut dst[first * hd..(first + rows) * hd];
            weighted_values::<M>(&s.pt, &s.v, hd, out);
            for (o, &inv) in out.chunks_exact_mut(hd).zip(&inv) {
                for x in o {
                    *x *= inv;
                }
            }
        }
    }
}

/// Instruction-set tier of the kernels in this file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Isa {
    /// Portable code (SSE2 on x86-64).
    Generic,
    /// AVX2 + FMA (x86-64 only; chosen after run-time detection).
    Avx2Fma,
}

impl Isa {
    fn detect() -> Self {
        static ISA: std::sync::OnceLock<Isa> = std::sync::OnceLock::new();
        *ISA.get_or_init(|| {
            #[cfg(target_arch = "x86_64")]
            if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") {
                return Isa::Avx2Fma;
            }
            Isa::Generic
        })
    }
}

/// `a · b + c`, fused (one rounding) in the FMA kernels, two operations in the portable ones.
trait Madd {
    fn madd(a: f32, b: f32, c: f32) -> f32;
}

struct Plain;

impl Madd for Plain {
    #[inline(always)]
    fn madd(a: f32, b: f32, c: f32) -> f32 {
        a * b + c
    }
}

struct Fused;

impl Madd for Fused {
    #[inline(always)]
    fn madd(a: f32, b: f32, c: f32) -> f32 {
        a.mul_add(b, c)
    }
}

/// Per-task attention buffers, reused across the tasks one rayon job runs.
#[derive(Default)]
struct Scratch {
    /// Scaled queries in blocks of `ROW_BLOCK` rows, each block `[head_dim, ROW_BLOCK]`
    /// (rows past the sequence end zero).
    q: Vec<f32>,
    /// Keys transposed, `[head_dim, len rounded up to KEY_BLOCK]` (extra columns zero).
    kt: Vec<f32>,
    /// Values, `[len, head_dim]`.
    v: Vec<f32>,
    /// Scores, then unnormalised probabilities, of one query block, `[ROW_BLOCK, len rounded
    /// up]`.
    p: Vec<f32>,
    /// The probabilities transposed, `[len, ROW_BLOCK]`.
    pt: Vec<f32>,
}

fn refill(buf: &mut Vec<f32>, n: usize) {
    buf.clear();
    buf.resize(n, 0.0);
}

/// One SIMD register's worth of floats.
type V8 = [f32; LANES];

/// `acc += s · x`, lane by lane (one vector FMA once vectorised).
#[inline(always)]
fn fma8<M: Madd>(acc: &mut V8, s: f32, x: &V8) {
    for (a, &x) in acc.iter_mut().zip(x) {
        *a = M::madd(s, x, *a);
    }
}

fn v8(xs: &[f32]) -> &V8 {
    xs[..LANES].try_into().expect("LANES floats")
}

/// `p[r][j] = q[r] · kt[:, j]` for the `ROW_BLOCK` query rows of `qt` (`[head_dim,
/// ROW_BLOCK]`) and all `lp` key columns of `kt` (`[head_dim, lp]`). The 4 × 16 tile of
/// accumulators is eight named vectors so that it stays in registers.
#[inline(always)]
fn scores<M: Madd>(qt: &[f32], kt: &[f32], lp: usize, p: &mut [f32]) {
    const _: () = assert!(ROW_BLOCK == 4 && KEY_BLOCK == 2 * LANES);
    for jb in (0..lp).step_by(KEY_BLOCK) {
        let z = [0f32; LANES];
        let (mut a0, mut a1, mut a2, mut a3) = (z, z, z, z);
        let (mut b0, mut b1, mut b2, mut b3) = (z, z, z, z);
        for (krow, qd) in kt.chunks_exact(lp).zip(qt.chunks_exact(ROW_BLOCK)) {
            let k = &krow[jb..jb + KEY_BLOCK];
            let (k0, k1) = (v8(k), v8(&k[LANES..]));
            let qd: &[f32; ROW_BLOCK] = qd.try_into().expect("ROW_BLOCK slice");
            fma8::<M>(&mut a0, qd[0], k0);
            fma8::<M>(&mut b0, qd[0], k1);
            fma8::<M>(&mut a1, qd[1], k0);
            fma8::<M>(&mut b1, qd[1], k1);
            fma8::<M>(&mut a2, qd[2], k0);
            fma8::<M>(&mut b2, qd[2], k1);
            fma8::<M>(&mut a3, qd[3], k0);
            fma8::<M>(&mut b3, qd[3], k1);
        }
        for (prow, (a, b)) in p
            .chunks_exact_mut(lp)
            .zip([(a0, b0), (a1, b1), (a2, b2), (a3, b3)])
        {
            prow[jb..jb + LANES].copy_from_slice(&a);
            prow[jb + LANES..jb + KEY_BLOCK].copy_from_slice(&b);
        }
    }
}

/// `pt[j][r] = p[r][j]` for the real keys `j < pt.len() / ROW_BLOCK`.
#[inline(always)]
fn transpose_block(p: &[f32], lp: usize, pt: &mut [f32]) {
    const _: () = assert!(ROW_BLOCK == 4);
    let (p0, rest) = p.split_at(lp);
    let (p1, rest) = rest.split_at(lp);
    let (p2, p3) = rest.split_at(lp);
    for ((((t, &a), &b), &c), &d) in pt
        .chunks_exact_mut(ROW_BLOCK)
        .zip(p0)
        .zip(p1)
        .zip(p2)
        .zip(p3)
    {
        t.copy_from_slice(&[a, b, c, d]);
    }
}

/// `out[r] = Σ_j pt[j][r] v[j]` for the first `out.len() / hd` rows of the block: 16 output
/// columns at a time (eight named accumulator vectors), then 8, then a scalar tail for head
/// sizes that are not a multiple of 8 (small test models).
#[inline(always)]
fn weighted_values<M: Madd>(pt: &[f32], v: &[f32], hd: usize, out: &mut [f32]) {
    const _: () = assert!(ROW_BLOCK == 4);
    let rows = out.len() / hd;
    let mut store = |dc: usize, accs: &[V8], width: usize| {
        for r in 0..rows {
            for (h, a) in accs[r * width..(r + 1) * width].iter().enumerate() {
                out[r * hd + dc + h * LANES..][..LANES].copy_from_slice(a);
            }
        }
    };
    let z = [0f32; LANES];
    let mut dc = 0;
    while dc + 2 * LANES <= hd {
        let (mut a0, mut a1, mut a2, mut a3) = (z, z, z, z);
        let (mut b0, mut b1, mut b2, mut b3) = (z, z, z, z);
        for (vrow, pj) in v.chunks_exact(hd).zip(pt.chunks_exact(ROW_BLOCK)) {
            let (v0, v1) = (v8(&vrow[dc..]), v8(&vrow[dc + LANES..]));
            let pj: &[f32; ROW_BLOCK] = pj.try_into().expect("ROW_BLOCK slice");
            fma8::<M>(&mut a0, pj[0], v0);
            fma8::<M>(&mut b0, pj[0], v1);
            fma8::<M>(&mut a1, pj[1], v0);
            fma8::<M>(&mut b1, pj[1], v1);
            fma8::<M>(&mut a2, pj[2], v0);
            fma8::<M>(&mut b2, pj[2], v1);
            fma8::<M>(&mut a3, pj[3], v0);
            fma8::<M>(&mut b3, pj[3], v1);
        }
        store(dc, &[a0, b0, a1, b1, a2, b2, a3, b3], 2);
        dc += 2 * LANES;
    }
    while dc + LANES <= hd {
        let (mut a0, mut a1, mut a2, mut a3) = (z, z, z, z);
        for (vrow, pj) in v.chunks_exact(hd).zip(pt.chunks_exact(ROW_BLOCK)) {
            let v0 = v8(&vrow[dc..]);
            let pj: &[f32; ROW_BLOCK] = pj.try_into().expect("ROW_BLOCK slice");
            fma8::<M>(&mut a0, pj[0], v0);
            fma8::<M>(&mut a1, pj[1], v0);
            fma8::<M>(&mut a2, pj[2], v0);
            fma8::<M>(&mut a3, pj[3], v0);
        }
        store(dc, &[a0, a1, a2, a3], 1);
        dc += LANES;
    }
    for d in dc..hd {
        for r in 0..rows {
            let mut a = 0f32;
            for (vrow, pj) in v.chunks_exact(hd).zip(pt.chunks_exact(ROW_BLOCK)) {
                a = M::madd(pj[r], vrow[d], a);
            }
            out[r * hd + d] = a;
        }
    }
}

/// `[heads, tokens, head_dim]` → `[tokens, heads * head_dim]`.
fn heads_to_tokens(by_head: &[f32], ctx: &mut [f32], heads: usize, hd: usize, total: usize) {
    let h = heads * hd;
    ctx.par_chunks_mut(h * ROWS_PER_TASK)
        .enumerate()
        .for_each(|(blk, rows)| {
            for (i, row) in rows.chunks_exact_mut(h).enumerate() {
                let t = blk * ROWS_PER_TASK + i;
                for (head, dst) in row.chunks_exact_mut(hd).enumerate() {
                    dst.copy_from_slice(&by_head[(head * total + t) * hd..][..hd]);
                }
            }
        });
}

/// `x` (`[rows, k]`) times `w` (`[k, n]`) with candle's CPU matmul.
fn matmul(x: &[f32], rows: usize, w: &Tensor) -> candle_core::Result<Tensor> {
    let k = x.len() / rows.max(1);
    Tensor::from_slice(x, (rows, k), &Device::Cpu)?.matmul(w)
}

/// Runs `f` on the contiguous f32 data of a CPU tensor.
fn with_slice<R>(t: &Tensor, f: impl FnOnce(&[f32]) -> R) -> candle_core::Result<R> {
    let (storage, layout) = t.storage_and_layout();
    let Storage::Cpu(cpu) = &*storage else {
        candle_core::bail!("the fast BERT forward runs on the CPU only");
    };
    let data = cpu.as_slice::<f32>()?;
    let Some((a, b)) = layout.contiguous_offsets() else {
        candle_core::bail!("matmul result is not contiguous");
    };
    Ok(f(&data[a..b]))
}

/// The elementwise passes over blocks of rows, each with a portable and an AVX2 + FMA build.
#[derive(Clone, Copy)]
enum Rows<'a> {
    /// `x = LayerNorm((y + bias) + x)` (BERT's post-LN residual); `y` is the matmul output.
    ResidualNorm {
        bias: &'a [f32],
        norm: &'a Norm,
        eps: f32,
    },
    /// `x = act(y + bias)`.
    Activate { bias: &'a [f32], act: HiddenAct },
}

impl Rows<'_> {
    /// Applies the pass to `xs` / `ys`, whole rows of `bias.len()` floats.
    #[allow(unsafe_code)]
    fn run(self, isa: Isa, xs: &mut [f32], ys: &[f32]) {
        #[cfg(target_arch = "x86_64")]
        if isa == Isa::Avx2Fma {
            // SAFETY: `Isa::Avx2Fma` is only chosen after `is_x86_feature_detected!` confirmed
            // AVX2 and FMA; `run_avx2` has no other precondition.
            unsafe { self.run_avx2(xs, ys) };
            return;
        }
        let _ = isa;
        self.run_with::<Plain>(xs, ys);
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma")]
    fn run_avx2(self, xs: &mut [f32], ys: &[f32]) {
        self.run_with::<Fused>(xs, ys);
    }

    #[inline(always)]
    fn run_with<M: Madd>(self, xs: &mut [f32], ys: &[f32]) {
        match self {
            Rows::ResidualNorm { bias, norm, eps } => {
                let h = bias.len();
                for (xr, yr) in xs.chunks_exact_mut(h).zip(ys.chunks_exact(h)) {
                    for ((a, &y), &b) in xr.iter_mut().zip(yr).zip(bias) {
                        *a += y + b;
                    }
                    layer_norm::<M>(xr, norm, eps);
                }
            }
            Rows::Activate { bias, act } => match act {
                HiddenAct::Gelu => map_bias(xs, ys, bias, gelu_erf::<M>),
                HiddenAct::GeluApproximate => map_bias(xs, ys, bias, gelu_tanh::<M>),
                HiddenAct::Relu => map_bias(xs, ys, bias, |x| x.max(0.0)),
            },
        }
    }
}

#[inline(always)]
fn map_bias(xs: &mut [f32], ys: &[f32], bias: &[f32], f: impl Fn(f32) -> f32) {
    let n = bias.len();
    for (or, ur) in xs.chunks_exact_mut(n).zip(ys.chunks_exact(n)) {
        for ((o, &x), &b) in or.iter_mut().zip(ur).zip(bias) {
            *o = f(x + b);
        }
    }
}

/// Runs a [`Rows`] pass over `x` and `y` (`[tokens, width]`) in parallel row blocks.
fn par_rows(isa: Isa, pass: Rows<'_>, width: usize, x: &mut [f32], y: &[f32]) {
    x.par_chunks_mut(width * ROWS_PER_TASK)
        .zip(y.par_chunks(width * ROWS_PER_TASK))
        .for_each(|(xs, ys)| pass.run(isa, xs, ys));
}

/// LayerNorm of one row in place (two-pass mean and variance).
#[inline(always)]
fn layer_norm<M: Madd>(row: &mut [f32], norm: &Norm, eps: f32) {
    let n = row.len() as f32;
    let mean = lane_sum(row) / n;
    let var = lane_sum_sq_dev(row, mean) / n;
    let inv = 1.0 / (var + eps).sqrt();
    for ((x, &g), &b) in row.iter_mut().zip(&norm.gamma).zip(&norm.beta) {
        *x = M::madd((*x - mean) * inv, g, b);
    }
}

/// Sum with `LANES` independent accumulators (vectorisable, unlike a sequential fold).
#[inline(always)]
fn lane_sum(xs: &[f32]) -> f32 {
    let mut acc = [0f32; LANES];
    let mut chunks = xs.chunks_exact(LANES);
    for c in &mut chunks {
        for (a, &x) in acc.iter_mut().zip(c) {
            *a += x;
        }
    }
    chunks.remainder().iter().sum::<f32>() + acc.iter().sum::<f32>()
}

#[inline(always)]
fn lane_sum_sq(xs: &[f32]) -> f32 {
    lane_sum_sq_dev(xs, 0.0)
}

#[inline(always)]
fn lane_sum_sq_dev(xs: &[f32], mean: f32) -> f32 {
    let mut acc = [0f32; LANES];
    let mut chunks = xs.chunks_exact(LANES);
    for c in &mut chunks {
        for (a, &x) in acc.iter_mut().zip(c) {
            let d = x - mean;
            *a += d * d;
        }
    }
    chunks
        .remainder()
        .iter()
        .map(|&x| (x - mean) * (x - mean))
        .sum::<f32>()
        + acc.iter().sum::<f32>()
}

#[inline(always)]
fn lane_max(xs: &[f32]) -> f32 {
    let mut acc = [f32::NEG_INFINITY; LANES];
    let mut chunks = xs.chunks_exact(LANES);
    for c in &mut chunks {
        for (a, &x) in acc.iter_mut().zip(c) {
            *a = a.max(x);
        }
    }
    chunks
        .remainder()
        .iter()
        .chain(&acc)
        .fold(f32::NEG_INFINITY, |m, &x| m.max(x))
}

/// `x = exp(x - max(row))` in place; returns the sum (softmax without the division).
#[inline(always)]
fn exp_shifted<M: Madd>(row: &mut [f32]) -> f32 {
    let max = lane_max(row);
    for x in row.iter_mut() {
        *x = exp::<M>(*x - max);
    }
    lane_sum(row)
}

/// `eˣ` for f32, branch-free so loops over it vectorise (Cephes `expf`: range reduction by
/// ln 2 in two parts, degree-5 polynomial, scaling by 2ⁿ through the exponent bits). Relative
/// error ≈ 1e-7; inputs are clamped to [-87, 88] (normal results).
#[inline(always)]
fn exp<M: Madd>(x: f32) -> f32 {
    // 1.5 · 2²³: adding it rounds to an integer held in the low mantissa bits.
    const MAGIC: f32 = 12_582_912.0;
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    let x = x.clamp(-87.0, 88.0);
    let t = M::madd(x, std::f32::consts::LOG2_E, MAGIC);
    let n = t - MAGIC;
    let n_bits = t.to_bits().wrapping_sub(MAGIC.to_bits());
    let r = M::madd(-n, LN2_LO, M::madd(-n, LN2_HI, x));
    let p = M::madd(1.987_569_1e-4, r, 1.398_199_9e-3);
    let p = M::madd(p, r, 8.333_452e-3);
    let p = M::madd(p, r, 4.166_579_6e-2);
    let p = M::madd(p, r, 1.666_666_5e-1);
    let p = M::madd(p, r, 0.5);
    let y = M::madd(p, r * r, r) + 1.0;
    y * f32::from_bits(n_bits.wrapping_add(127) << 23)
}

/// GELU with the exact erf form, `x Φ(x)`; `erfc` by Abramowitz & Stegun 7.1.26 (absolute
/// error ≤ 1.5e-7), branch-free.
#[inline(always)]
fn gelu_erf<M: Madd>(x: f32) -> f32 {
    const P: f32 = 0.327_591_1;
    const A: [f32; 5] = [
        0.254_829_6,
        -0.284_496_74,
        1.421_413_8,
        -1.453_152_1,
        1.061_405_4,
    ];
    let z = x.abs() * std::f32::consts::FRAC_1_SQRT_2;
    let t = 1.0 / M::madd(P, z, 1.0);
    let poly = M::madd(A[4], t, A[3]);
    let poly = M::madd(poly, t, A[2]);
    let poly = M::madd(poly, t, A[1]);
    let poly = M::madd(poly, t, A[0]) * t;
    // Φ(-|x|) = erfc(|x|/√2) / 2
    let tail = 0.5 * poly * exp::<M>(-z * z);
    let phi = if x >= 0.0 { 1.0 - tail } else { tail };
    x * phi
}

/// GELU, tanh approximation (`hidden_act: gelu_approximate`).
#[inline(always)]
fn gelu_tanh<M: Madd>(x: f32) -> f32 {
    const C: f32 = 0.797_884_6; // √(2/π)
    let u = C * M::madd(0.044_715 * x * x, x, x);
    let tanh = 1.0 - 2.0 / (exp::<M>(2.0 * u) + 1.0);
    0.5 * x * (1.0 + tanh)
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use candle_core::{DType, IndexOp};
    use candle_transformers::models::bert::BertModel;

    use super::*;

    /// erf in f64 from the series erf(x) = 2/√π e^{-x²} Σ 2ⁿ x^{2n+1} / (1·3·…·(2n+1)), which
    /// has only positive terms (no cancellation).
    fn erf64(x: f64) -> f64 {
        let (mut term, mut sum) = (x.abs(), x.abs());
        for n in 1..400 {
            term *= 2.0 * x * x / (2 * n + 1) as f64;
            sum += term;
            if term < 1e-18 * sum {
                break;
            }
        }
        let v = 2.0 / std::f64::consts::PI.sqrt() * (-x * x).exp() * sum;
        v.min(1.0).copysign(x)
    }

    fn check_exp<M: Madd>() {
        let mut worst = 0f64;
        for i in -8700..=8800 {
            let x = i as f32 / 100.0;
            let got = f64::from(exp::<M>(x));
            let want = f64::from(x).exp();
            worst = worst.max((got - want).abs() / want);
        }
        assert!(worst < 3e-7, "worst relative error {worst}");
        assert_eq!(exp::<M>(0.0), 1.0);
        assert!(exp::<M>(-1e30) > 0.0 && exp::<M>(-1e30) < 1e-37);
    }

    #[test]
    fn exp_is_accurate() {
        check_exp::<Plain>();
        check_exp::<Fused>();
    }

    fn check_gelu<M: Madd>() {
        let mut worst = 0f64;
        for i in -1200..=1200 {
            let x = f64::from(i as f32 / 100.0);
            let want = 0.5 * x * (1.0 + erf64(x / std::f64::consts::SQRT_2));
            let got = f64::from(gelu_erf::<M>(x as f32));
            worst = worst.max((got - want).abs());
        }
        assert!(worst < 1e-6, "worst absolute error {worst}");
        let t = gelu_tanh::<M>(1.0);
        assert!((t - 0.841_192).abs() < 1e-5, "{t}");
    }

    #[test]
    fn gelu_matches_the_erf_definition() {
        check_gelu::<Plain>();
        check_gelu::<Fused>();
    }

    #[test]
    fn softmax_and_layer_norm_match_naive() {
        let row: Vec<f32> = (0..37)
            .map(|i| ((i * 7919) % 23) as f32 * 0.37 - 4.0)
            .collect();
        let mut got = row.clone();
        let sum = exp_shifted::<Plain>(&mut got);
        for g in &mut got {
            *g /= sum;
        }
        let max = row.iter().fold(f32::MIN, |m, &x| m.max(x));
        let sum: f64 = row.iter().map(|&x| f64::from(x - max).exp()).sum();
        for (g, &x) in got.iter().zip(&row) {
            let want = f64::from(x - max).exp() / sum;
            assert!((f64::from(*g) - want).abs() < 1e-7, "{g} vs {want}");
        }
        let norm = Norm {
            gamma: (0..37).map(|i| 1.0 + i as f32 * 0.01).collect(),
            beta: (0..37).map(|i| i as f32 * -0.02).collect(),
        };
        let mut got = row.clone();
        layer_norm::<Fused>(&mut got, &norm, 1e-12);
        let mean: f64 = row.iter().map(|&x| f64::from(x)).sum::<f64>() / 37.0;
        let var: f64 = row
            .iter()
            .map(|&x| (f64::from(x) - mean).powi(2))
            .sum::<f64>()
            / 37.0;
        for (i, (g, &x)) in got.iter().zip(&row).enumerate() {
            let want = (f64::from(x) - mean) / (var + 1e-12).sqrt() * f64::from(norm.gamma[i])
                + f64::from(norm.beta[i]);
            assert!((f64::from(*g) - want).abs() < 1e-5, "{g} vs {want}");
        }
    }

    /// The same configuration as candle-transformers' (its extra fields at their defaults).
    fn candle_config(c: &Config) -> candle_transformers::models::bert::Config {
        let mut v = serde_json::to_value(c).unwrap();
        let m = v.as_object_mut().unwrap();
        m.insert("hidden_dropout_prob".into(), 0.1.into());
        m.insert("initializer_range".into(), 0.02.into());
        m.insert("pad_token_id".into(), 0.into());
        m.insert("classifier_dropout".into(), serde_json::Value::Null);
        serde_json::from_value(v).unwrap()
    }

    fn random_model(hidden: usize, heads: usize, act: HiddenAct) -> (Config, VarBuilder<'static>) {
        let config = Config {
            vocab_size: 50,
            hidden_size: hidden,
            num_hidden_layers: 2,
            num_attention_heads: heads,
            intermediate_size: 4 * hidden,
            hidden_act: act,
            max_position_embeddings: 300,
            type_vocab_size: 2,
            layer_norm_eps: 1e-12,
            // The tensors below are named `bert.…`, as candle's default config expects.
            model_type: Some("bert".into()),
        };
        let dev = Device::Cpu;
        let mut t: HashMap<String, Tensor> = HashMap::new();
        let mut put = |name: &str, shape: &[usize], std: f64, mean: f64| {
            let x = Tensor::randn(mean as f32, std as f32, shape, &dev).unwrap();
            t.insert(format!("bert.{name}"), x);
        };
        let (h, i) = (hidden, 4 * hidden);
        put("embeddings.word_embeddings.weight", &[50, h], 1.0, 0.0);
        put("embeddings.position_embeddings.weight", &[300, h], 0.5, 0.0);
        put("embeddings.token_type_embeddings.weight", &[2, h], 0.5, 0.0);
        put("embeddings.LayerNorm.weight", &[h], 0.1, 1.0);
        put("embeddings.LayerNorm.bias", &[h], 0.1, 0.0);
        for l in 0..2 {
            let p = format!("encoder.layer.{l}");
            for m in ["query", "key", "value"] {
                put(&format!("{p}.attention.self.{m}.weight"), &[h, h], 0.3, 0.0);
                put(&format!("{p}.attention.self.{m}.bias"), &[h], 0.1, 0.0);
            }
            put(
                &format!("{p}.attention.output.dense.weight"),
                &[h, h],
                0.2,
                0.0,
            );
            put(&format!("{p}.attention.output.dense.bias"), &[h], 0.1, 0.0);
            put(
                &format!("{p}.attention.output.LayerNorm.weight"),
                &[h],
                0.1,
                1.0,
            );
            put(
                &format!("{p}.attention.output.LayerNorm.bias"),
                &[h],
                0.1,
                0.0,
            );
            put(&format!("{p}.intermediate.dense.weight"), &[i, h], 0.2, 0.0);
            put(&format!("{p}.intermediate.dense.bias"), &[i], 0.1, 0.0);
            put(&format!("{p}.output.dense.weight"), &[h, i], 0.1, 0.0);
            put(&format!("{p}.output.dense.bias"), &[h], 0.1, 0.0);
            put(&format!("{p}.output.LayerNorm.weight"), &[h], 0.1, 1.0);
            put(&format!("{p}.output.LayerNorm.bias"), &[h], 0.1, 0.0);
        }
        (config, VarBuilder::from_tensors(t, DType::F32, &dev))
    }

    /// Every token's hidden state equals candle's `BertModel` on the same sequence alone
    /// (no padding), for random weights, lengths from 1 to 300 and both token types.
    fn check_against_candle(hidden: usize, heads: usize, act: HiddenAct) {
        let (config, vb) = random_model(hidden, heads, act);
        let mut fast = FastBert::load(vb.clone(), &config).unwrap();
        let reference = BertModel::load(vb, &candle_config(&config)).unwrap();
        let lens = [1usize, 2, 5, 16, 17, 63, 300];
        let mut seed = 12345u64;
        let mut next = |m: u32| {
            seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1);
            (seed >> 33) as u32 % m
        };
        let seqs: Vec<(Vec<u32>, Vec<u32>)> = lens
            .iter()
            .map(|&n| {
                let ids = (0..n).map(|_| next(50)).collect();
                let types = (0..n).map(|j| u32::from(j >= n / 2)).collect();
                (ids, types)
            })
            .collect();
        let refs: Vec<(&[u32], &[u32])> = seqs
            .iter()
            .map(|(a, b)| (a.as_slice(), b.as_slice()))
            .collect();
        // Every kernel tier this CPU has: the detected one, then the portable one.
        let mut tiers = vec![fast.isa];
        if fast.isa != Isa::Generic {
            tiers.push(Isa::Generic);
        }
        for isa in tiers {
            fast.isa = isa;
            let got = fast.forward(&refs).unwrap();
            check_hidden(&got, &seqs, &reference, hidden, &format!("{act:?} {isa:?}"));
        }
    }

    fn check_hidden(
        got: &Hidden,
        seqs: &[(Vec<u32>, Vec<u32>)],
        reference: &BertModel,
        hidden: usize,
        what: &str,
    ) {
        assert_eq!(got.len(), seqs.len());
        let mut worst = 0f32;
        for (i, (ids, types)) in seqs.iter().enumerate() {
            let n = ids.len();
            let ids_t = Tensor::new(ids.as_slice(), &Device::Cpu)
                .unwrap()
                .unsqueeze(0)
                .unwrap();
            let ty_t = Tensor::new(types.as_slice(), &Device::Cpu)
                .unwrap()
                .unsqueeze(0)
                .unwrap();
            let want = reference.forward(&ids_t, &ty_t, None).unwrap();
            let want: Vec<f32> = want.i(0).unwrap().flatten_all().unwrap().to_vec1().unwrap();
            let rows = got.rows(i);
            assert_eq!(rows.len(), n * hidden);
            for (a, b) in rows.iter().zip(&want) {
                worst = worst.max((a - b).abs());
            }
        }
        eprintln!("hidden {hidden}, {what}: max abs difference {worst:e}");
        assert!(
            worst < 2e-4,
            "max abs difference to candle's BertModel {worst}"
        );
    }

    #[test]
    fn equals_candle_bert_on_random_weights() {
        check_against_candle(64, 4, HiddenAct::Gelu);
        // head size 12: not a multiple of the SIMD width
        check_against_candle(36, 3, HiddenAct::GeluApproximate);
        check_against_candle(32, 2, HiddenAct::Relu);
    }

    /// The matmuls (`matmul` above: candle → gemm, whose f32 kernels are picked at run time:
    /// AVX-512 with the `x86-v4` feature, else AVX2+FMA) against an f64 reference, on the
    /// embedder's shapes and on ragged ones that leave partial micro-tiles on every edge.
    #[test]
    fn gemm_matmul_matches_an_f64_reference() {
        println!("gemm f32 kernels: {}", crate::gemm_kernels());
        for (m, k, n) in [
            (1, 1, 1),
            (5, 7, 13),
            (17, 33, 49),
            (37, 384, 1152),
            (250, 384, 384),
            (61, 1536, 384),
        ] {
            let x: Vec<f32> = (0..m * k)
                .map(|i| ((i * 7919 % 211) as f32 - 105.0) / 97.0)
                .collect();
            let w: Vec<f32> = (0..k * n)
                .map(|i| ((i * 104_729 % 193) as f32 - 96.0) / 89.0)
                .collect();
            let wt = Tensor::from_slice(&w, (k, n), &Device::Cpu).unwrap();
            let got = matmul(&x, m, &wt).unwrap().to_vec2::<f32>().unwrap();
            for (r, row) in got.iter().enumerate() {
                for (c, &g) in row.iter().enumerate() {
                    let (mut want, mut mag) = (0f64, 0f64);
                    for j in 0..k {
                        let p = f64::from(x[r * k + j]) * f64::from(w[j * n + c]);
                        want += p;
                        mag += p.abs();
                    }
                    // f32 accumulation: error ≤ k · ε · Σ|products| (bound with margin).
                    let tol = 4.0 * k as f64 * f64::from(f32::EPSILON) * mag + 1e-6;
                    assert!(
                        (f64::from(g) - want).abs() <= tol,
                        "{m}x{k}x{n} [{r},{c}]: {g} vs {want} (tol {tol})"
                    );
                }
            }
        }
    }

    #[test]
    fn rejects_bad_inputs() {
        let (config, vb) = random_model(32, 2, HiddenAct::Gelu);
        let fast = FastBert::load(vb, &config).unwrap();
        assert!(fast.forward(&[(&[], &[])]).is_err());
        assert!(fast.forward(&[(&[1, 50], &[0, 0])]).is_err());
        assert!(fast.forward(&[(&[1, 2], &[0, 2])]).is_err());
        assert!(fast.forward(&[(&[1, 2], &[0])]).is_err());
        let long = vec![1u32; 301];
        let zeros = vec![0u32; 301];
        assert!(fast.forward(&[(&long, &zeros)]).is_err());
        assert_eq!(fast.forward(&[]).unwrap().len(), 0);
        let ok = fast
            .forward(&[(&[1, 2, 3], &[0, 0, 1]), (&[4], &[0])])
            .unwrap();
        assert_eq!(ok.len(), 2);
        assert_eq!(ok.first(1).len(), 32);
        let pooled = ok.mean_pooled_normalised();
        for v in pooled {
            let norm: f32 = v.iter().map(|x| x * x).sum::<f32>().sqrt();
            assert!((norm - 1.0).abs() < 1e-5);
        }
    }
}
