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

use candle_core::{Device, Storage, Tensor};
use candle_nn::VarBuilder;
use candle_transformers::models::bert::{Config, HiddenAct};
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
                let qkv_w = Tensor::cat(&[qw, kw, vw], 0)?.t()?.contiguous()?;
                let qkv_b = to_vec(Tensor::cat(&[qb, kb, vbias], 0)?)?;
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
                layer_norm(row, &self.emb_norm, eps);
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
            with_slice(&attn, |y| {
                residual_norm(&mut x, y, &layer.out_b, &layer.attn_norm, eps);
            })?;
            let up = matmul(&x, total, &layer.up_w)?;
            let act = with_slice(&up, |u| activate(u, &layer.up_b, self.act))?;
            let down = Tensor::from_vec(act, (total, self.intermediate), &Device::Cpu)?
                .matmul(&layer.down_w)?;
            with_slice(&down, |y| {
                residual_norm(&mut x, y, &layer.down_b, &layer.out_norm, eps);
            })?;
        }
        Ok(Hidden {
            data: x,
            hidden: h,
            starts,
        })
    }

    /// Self-attention of every (head, sequence) pair. `qkv` is `[tokens, 3 * hidden]` without
    /// bias; the result goes to `out` head-major: `[heads, tokens, head_dim]`.
    fn attention(&self, qkv: &[f32], bias: &[f32], starts: &[usize], out: &mut [f32]) {
        let total = *starts.last().unwrap_or(&0);
        let hd = self.head_dim;
        let mut tasks: Vec<(usize, usize, &mut [f32])> =
            Vec::with_capacity(self.heads * (starts.len() - 1));
        for (head, block) in out.chunks_exact_mut(total * hd).enumerate() {
            let mut rest = block;
            for w in starts.windows(2) {
                let (mine, tail) = rest.split_at_mut((w[1] - w[0]) * hd);
                tasks.push((head, w[0], mine));
                rest = tail;
            }
        }
        let row = 3 * self.hidden;
        tasks
            .into_par_iter()
            .for_each_init(Scratch::default, |scratch, (head, start, dst)| {
                let len = dst.len() / hd;
                let seq = &qkv[start * row..(start + len) * row];
                self.attend(seq, bias, head, len, dst, scratch);
            });
    }

    /// One head of one sequence: `dst` (`[len, head_dim]`) = softmax(Q Kᵀ / √d) V.
    fn attend(
        &self,
        seq: &[f32],
        bias: &[f32],
        head: usize,
        len: usize,
        dst: &mut [f32],
        s: &mut Scratch,
    ) {
        let (h, hd) = (self.hidden, self.head_dim);
        let lp = len.next_multiple_of(KEY_BLOCK);
        let lq = len.next_multiple_of(ROW_BLOCK);
        let scale = 1.0 / (hd as f32).sqrt();
        refill(&mut s.q, lq * hd);
        refill(&mut s.kt, hd * lp);
        refill(&mut s.v, len * hd);
        refill(&mut s.p, ROW_BLOCK * lp);
        let (qo, ko, vo) = (head * hd, h + head * hd, 2 * h + head * hd);
        let (qb, kb, vb) = (&bias[qo..qo + hd], &bias[ko..ko + hd], &bias[vo..vo + hd]);
        for (i, ((row, q), v)) in seq
            .chunks_exact(3 * h)
            .zip(s.q.chunks_exact_mut(hd))
            .zip(s.v.chunks_exact_mut(hd))
            .enumerate()
        {
            for ((q, &x), &b) in q.iter_mut().zip(&row[qo..qo + hd]).zip(qb) {
                *q = (x + b) * scale;
            }
            for ((v, &x), &b) in v.iter_mut().zip(&row[vo..vo + hd]).zip(vb) {
                *v = x + b;
            }
            for (d, (&x, &b)) in row[ko..ko + hd].iter().zip(kb).enumerate() {
                s.kt[d * lp + i] = x + b;
            }
        }
        for (blk, q) in s.q.chunks_exact(ROW_BLOCK * hd).enumerate() {
            scores(q, &s.kt, hd, lp, &mut s.p);
            for p in s.p.chunks_exact_mut(lp) {
                softmax(&mut p[..len]);
            }
            let first = blk * ROW_BLOCK;
            let rows = (len - first).min(ROW_BLOCK);
            weighted_values(
                &s.p,
                lp,
                &s.v,
                hd,
                &mut dst[first * hd..(first + rows) * hd],
            );
        }
    }
}

/// Per-task attention buffers, reused across the tasks one rayon job runs.
#[derive(Default)]
struct Scratch {
    /// Scaled queries, `[len rounded up to ROW_BLOCK, head_dim]` (extra rows zero).
    q: Vec<f32>,
    /// Keys transposed, `[head_dim, len rounded up to KEY_BLOCK]` (extra columns zero).
    kt: Vec<f32>,
    /// Values, `[len, head_dim]`.
    v: Vec<f32>,
    /// Scores / probabilities of one query block, `[ROW_BLOCK, len rounded up]`.
    p: Vec<f32>,
}

fn refill(buf: &mut Vec<f32>, n: usize) {
    buf.clear();
    buf.resize(n, 0.0);
}

/// `p[r][j] = q[r] · kt[:, j]` for the `ROW_BLOCK` query rows of `q` and all `lp` key columns.
#[inline]
fn scores(q: &[f32], kt: &[f32], hd: usize, lp: usize, p: &mut [f32]) {
    for jb in (0..lp).step_by(KEY_BLOCK) {
        let mut acc = [[0f32; KEY_BLOCK]; ROW_BLOCK];
        for d in 0..hd {
            let k: &[f32; KEY_BLOCK] = kt[d * lp + jb..][..KEY_BLOCK]
                .try_into()
                .expect("KEY_BLOCK slice");
            for (r, a) in acc.iter_mut().enumerate() {
                let qv = q[r * hd + d];
                for (a, &k) in a.iter_mut().zip(k) {
                    *a += qv * k;
                }
            }
        }
        for (r, a) in acc.iter().enumerate() {
            p[r * lp + jb..][..KEY_BLOCK].copy_from_slice(a);
        }
    }
}

/// `out[r] = Σ_j p[r][j] v[j]` for the first `out.len() / hd` rows of the probability block
/// (`v` has one row per key, so only the real keys take part).
#[inline]
fn weighted_values(p: &[f32], lp: usize, v: &[f32], hd: usize, out: &mut [f32]) {
    let rows = out.len() / hd;
    let mut dc = 0;
    while dc + LANES <= hd {
        let mut acc = [[0f32; LANES]; ROW_BLOCK];
        for (j, vrow) in v.chunks_exact(hd).enumerate() {
            let vv: &[f32; LANES] = vrow[dc..dc + LANES].try_into().expect("LANES slice");
            for (r, a) in acc.iter_mut().enumerate() {
                let pr = p[r * lp + j];
                for (a, &x) in a.iter_mut().zip(vv) {
                    *a += pr * x;
                }
            }
        }
        for (r, a) in acc.iter().take(rows).enumerate() {
            out[r * hd + dc..][..LANES].copy_from_slice(a);
        }
        dc += LANES;
    }
    // Head sizes that are not a multiple of LANES (small test models): scalar tail.
    for d in dc..hd {
        for r in 0..rows {
            let mut a = 0f32;
            for (j, vrow) in v.chunks_exact(hd).enumerate() {
                a += p[r * lp + j] * vrow[d];
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

/// `x = LayerNorm((y + bias) + x)` row by row (BERT's post-LN residual).
fn residual_norm(x: &mut [f32], y: &[f32], bias: &[f32], norm: &Norm, eps: f32) {
    let h = bias.len();
    x.par_chunks_mut(h * ROWS_PER_TASK)
        .zip(y.par_chunks(h * ROWS_PER_TASK))
        .for_each(|(xs, ys)| {
            for (xr, yr) in xs.chunks_exact_mut(h).zip(ys.chunks_exact(h)) {
                for ((a, &y), &b) in xr.iter_mut().zip(yr).zip(bias) {
                    *a += y + b;
                }
                layer_norm(xr, norm, eps);
            }
        });
}

/// `act(u + bias)` into a new buffer.
fn activate(u: &[f32], bias: &[f32], act: HiddenAct) -> Vec<f32> {
    match act {
        HiddenAct::Gelu => map_bias(u, bias, gelu_erf),
        HiddenAct::GeluApproximate => map_bias(u, bias, gelu_tanh),
        HiddenAct::Relu => map_bias(u, bias, |x| x.max(0.0)),
    }
}

fn map_bias(u: &[f32], bias: &[f32], f: impl Fn(f32) -> f32 + Sync + Copy) -> Vec<f32> {
    let n = bias.len();
    let mut out = vec![0f32; u.len()];
    out.par_chunks_mut(n * ROWS_PER_TASK)
        .zip(u.par_chunks(n * ROWS_PER_TASK))
        .for_each(|(os, us)| {
            for (or, ur) in os.chunks_exact_mut(n).zip(us.chunks_exact(n)) {
                for ((o, &x), &b) in or.iter_mut().zip(ur).zip(bias) {
                    *o = f(x + b);
                }
            }
        });
    out
}

/// LayerNorm of one row in place (two-pass mean and variance).
#[inline]
fn layer_norm(row: &mut [f32], norm: &Norm, eps: f32) {
    let n = row.len() as f32;
    let mean = lane_sum(row) / n;
    let var = lane_sum_sq_dev(row, mean) / n;
    let inv = 1.0 / (var + eps).sqrt();
    for ((x, &g), &b) in row.iter_mut().zip(&norm.gamma).zip(&norm.beta) {
        *x = (*x - mean) * inv * g + b;
    }
}

/// Sum with `LANES` independent accumulators (vectorisable, unlike a sequential fold).
#[inline]
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

#[inline]
fn lane_sum_sq(xs: &[f32]) -> f32 {
    lane_sum_sq_dev(xs, 0.0)
}

#[inline]
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

#[inline]
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

/// Softmax of one row in place.
#[inline]
fn softmax(row: &mut [f32]) {
    let max = lane_max(row);
    for x in row.iter_mut() {
        *x = exp(*x - max);
    }
    let inv = 1.0 / lane_sum(row);
    for x in row.iter_mut() {
        *x *= inv;
    }
}

/// `eˣ` for f32, branch-free so loops over it vectorise (Cephes `expf`: range reduction by
/// ln 2 in two parts, degree-5 polynomial, scaling by 2ⁿ through the exponent bits). Relative
/// error ≈ 1e-7; inputs are clamped to [-87, 88] (normal results).
#[inline(always)]
fn exp(x: f32) -> f32 {
    // 1.5 · 2²³: adding it rounds to an integer held in the low mantissa bits.
    const MAGIC: f32 = 12_582_912.0;
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    let x = x.clamp(-87.0, 88.0);
    let t = x * std::f32::consts::LOG2_E + MAGIC;
    let n = t - MAGIC;
    let n_bits = t.to_bits().wrapping_sub(MAGIC.to_bits());
    let r = x - n * LN2_HI - n * LN2_LO;
    let p = 1.987_569_1e-4;
    let p = p * r + 1.398_199_9e-3;
    let p = p * r + 8.333_452e-3;
    let p = p * r + 4.166_579_6e-2;
    let p = p * r + 1.666_666_5e-1;
    let p = p * r + 0.5;
    let y = p * r * r + r + 1.0;
    y * f32::from_bits(n_bits.wrapping_add(127) << 23)
}

/// GELU with the exact erf form, `x Φ(x)`; `erfc` by Abramowitz & Stegun 7.1.26 (absolute
/// error ≤ 1.5e-7), branch-free.
#[inline(always)]
fn gelu_erf(x: f32) -> f32 {
    const P: f32 = 0.327_591_1;
    const A: [f32; 5] = [
        0.254_829_6,
        -0.284_496_74,
        1.421_413_8,
        -1.453_152_1,
        1.061_405_4,
    ];
    let z = x.abs() * std::f32::consts::FRAC_1_SQRT_2;
    let t = 1.0 / (1.0 + P * z);
    let poly = ((((A[4] * t + A[3]) * t + A[2]) * t + A[1]) * t + A[0]) * t;
    // Φ(-|x|) = erfc(|x|/√2) / 2
    let tail = 0.5 * poly * exp(-z * z);
    let phi = if x >= 0.0 { 1.0 - tail } else { tail };
    x * phi
}

/// GELU, tanh approximation (`hidden_act: gelu_approximate`).
#[inline(always)]
fn gelu_tanh(x: f32) -> f32 {
    const C: f32 = 0.797_884_6; // √(2/π)
    let u = C * (x + 0.044_715 * x * x * x);
    let tanh = 1.0 - 2.0 / (exp(2.0 * u) + 1.0);
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

    #[test]
    fn exp_is_accurate() {
        let mut worst = 0f64;
        for i in -8700..=8800 {
            let x = i as f32 / 100.0;
            let got = f64::from(exp(x));
            let want = f64::from(x).exp();
            worst = worst.max((got - want).abs() / want);
        }
        assert!(worst < 3e-7, "worst relative error {worst}");
        assert_eq!(exp(0.0), 1.0);
        assert!(exp(-1e30) > 0.0 && exp(-1e30) < 1e-37);
    }

    #[test]
    fn gelu_matches_the_erf_definition() {
        let mut worst = 0f64;
        for i in -1200..=1200 {
            let x = f64::from(i as f32 / 100.0);
            let want = 0.5 * x * (1.0 + erf64(x / std::f64::consts::SQRT_2));
            let got = f64::from(gelu_erf(x as f32));
            worst = worst.max((got - want).abs());
        }
        assert!(worst < 1e-6, "worst absolute error {worst}");
        let t = gelu_tanh(1.0);
        assert!((t - 0.841_192).abs() < 1e-5, "{t}");
    }

    #[test]
    fn softmax_and_layer_norm_match_naive() {
        let row: Vec<f32> = (0..37)
            .map(|i| ((i * 7919) % 23) as f32 * 0.37 - 4.0)
            .collect();
        let mut got = row.clone();
        softmax(&mut got);
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
        layer_norm(&mut got, &norm, 1e-12);
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
            ..Config::default()
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
        let fast = FastBert::load(vb.clone(), &config).unwrap();
        let reference = BertModel::load(vb, &config).unwrap();
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
        let got = fast.forward(&refs).unwrap();
        assert_eq!(got.len(), lens.len());
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
        eprintln!("hidden {hidden} heads {heads} {act:?}: max abs difference {worst:e}");
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
