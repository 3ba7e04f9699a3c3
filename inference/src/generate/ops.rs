//! The non-matmul pieces of a decoder layer on plain `f32` slices: RMS norm, rotary embeddings,
//! SiLU gating and causal attention over one sequence's KV cache.
//!
//! The matmuls go through candle's quantized kernels; everything here is small per row, so it is
//! written as plain loops (with several accumulators so the compiler can vectorise the
//! reductions) instead of many tiny candle ops, whose per-op overhead would dominate a decode
//! step with many sequences.

use std::cell::RefCell;

use half::f16;
use half::slice::HalfFloatSliceExt;

/// RMS norm of every `width`-wide row of `x` into `out`: `x / sqrt(mean(x²) + eps) * weight`.
///
/// The sum of squares is accumulated in `f64`, as ggml does, so the scale matches llama.cpp's to
/// the last bit on long rows.
pub(crate) fn rms_norm(x: &[f32], weight: &[f32], eps: f32, out: &mut [f32]) {
    let width = weight.len();
    debug_assert_eq!(x.len(), out.len());
    for (row, out_row) in x.chunks_exact(width).zip(out.chunks_exact_mut(width)) {
        let sum: f64 = row.iter().map(|&v| f64::from(v) * f64::from(v)).sum();
        let mean = (sum / width as f64) as f32;
        let scale = 1.0 / (mean + eps).sqrt();
        for ((o, &v), &w) in out_row.iter_mut().zip(row).zip(weight) {
            *o = v * scale * w;
        }
    }
}

/// How a model pairs the dimensions it rotates.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RopeStyle {
    /// Adjacent pairs `(2i, 2i+1)`: llama-architecture GGUFs (the converter permutes Q/K for it).
    Interleaved,
    /// Halves `(i, i + d/2)`: "NEOX" style, used by qwen2.
    Halves,
}

/// Rotary position tables for one row position: `(cos, sin)` per rotated pair.
///
/// The angles are computed as ggml's `rope_cache_init` does (`theta = pos`, then
/// `theta *= base^(-2/dims)` once per pair, in `f32`), not as `pos * base^(-2i/dims)`: the two
/// differ in the last bits and that is enough to flip a near-tied greedy token.
pub(crate) fn rope_angles(pos: usize, rope_dims: usize, base: f32, out: &mut Vec<(f32, f32)>) {
    out.clear();
    let theta_scale = base.powf(-2.0 / rope_dims as f32);
    let mut theta = pos as f32;
    for _ in 0..rope_dims / 2 {
        out.push((theta.cos(), theta.sin()));
        theta *= theta_scale;
    }
}

/// Rotates every head of one row (`heads * head_dim` values) in place.
pub(crate) fn apply_rope(
    row: &mut [f32],
    head_dim: usize,
    rope_dims: usize,
    style: RopeStyle,
    angles: &[(f32, f32)],
) {
    for head in row.chunks_exact_mut(head_dim) {
        match style {
            RopeStyle::Interleaved => {
                for (pair, &(c, s)) in head[..rope_dims].chunks_exact_mut(2).zip(angles) {
                    let (x0, x1) = (pair[0], pair[1]);
                    pair[0] = x0 * c - x1 * s;
                    pair[1] = x0 * s + x1 * c;
                }
            }
            RopeStyle::Halves => {
                let half = rope_dims / 2;
                let (lo, hi) = head[..rope_dims].split_at_mut(half);
                for ((a, b), &(c, s)) in lo.iter_mut().zip(hi.iter_mut()).zip(angles) {
                    let (x0, x1) = (*a, *b);
                    *a = x0 * c - x1 * s;
                    *b = x0 * s + x1 * c;
                }
            }
        }
    }
}

/// `gate = silu(gate) * up`, element-wise.
pub(crate) fn silu_mul(gate: &mut [f32], up: &[f32]) {
    for (g, &u) in gate.iter_mut().zip(up) {
        let x = *g;
        *g = x / (1.0 + (-x).exp()) * u;
    }
}

/// Dot product with eight independent accumulators (vectorisable without fast-math).
#[inline(always)]
pub(crate) fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0f32; 8];
    let mut ca = a.chunks_exact(8);
    let mut cb = b.chunks_exact(8);
    for (x, y) in (&mut ca).zip(&mut cb) {
        for i in 0..8 {
            acc[i] += x[i] * y[i];
        }
    }
    let mut tail = 0f32;
    for (x, y) in ca.remainder().iter().zip(cb.remainder()) {
        tail += x * y;
    }
    (acc[0] + acc[4]) + (acc[1] + acc[5]) + (acc[2] + acc[6]) + (acc[3] + acc[7]) + tail
}

thread_local! {
    static SCORES: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// Keys and values of one layer, token-major (`[pos][kv_head][head_dim]`): as the cache
/// stores them (f16, widened to f32 exactly when read), or already widened (a prefill chunk
/// widens its layer once for all its rows; the values are the same).
#[derive(Clone, Copy)]
pub(crate) enum Kv<'a> {
    F16 { keys: &'a [f16], values: &'a [f16] },
    F32 { keys: &'a [f32], values: &'a [f32] },
}

/// Where one attention head reads its keys and values: a token-major cache
/// (`kv_stride = n_kv_head * head_dim`) and the KV head to use.
pub(crate) struct HeadView<'a> {
    pub kv: Kv<'a>,
    pub kv_stride: usize,
    pub kv_offset: usize,
    /// Number of cached positions this query may attend to (causal: its own position + 1).
    pub ctx: usize,
}

/// Softmax attention of one query head over `view.ctx` cached positions, written to `out`: the
/// one-head reference that [`attend_group`] must equal bit for bit (tests).
#[cfg(test)]
pub(crate) fn attend(q: &[f32], view: &HeadView<'_>, scale: f32, out: &mut [f32]) {
    let hd = q.len();
    SCORES.with(|cell| {
        let mut scores = cell.borrow_mut();
        scores.clear();
        scores.reserve(view.ctx);
        let mut max = f32::NEG_INFINITY;
        let mut row = vec![0f32; hd];
        let (keys, values) = view.widened();
        for t in 0..view.ctx {
            let base = t * view.kv_stride + view.kv_offset;
            row.copy_from_slice(&keys[base..base + hd]);
            let s = dot(q, &row) * scale;
            max = max.max(s);
            scores.push(s);
        }
        let mut sum = 0f32;
        for s in scores.iter_mut() {
            *s = (*s - max).exp();
            sum += *s;
        }
        let inv = 1.0 / sum;
        out.fill(0.0);
        for (t, &p) in scores.iter().enumerate() {
            let base = t * view.kv_stride + view.kv_offset;
            // Probabilities stay f32 (rounding them to f16 as ggml's non-flash path does made
            // one Qwen fixture diverge at a 0.10 margin; the fixtures match fully without it).
            let w = p * inv;
            row.copy_from_slice(&values[base..base + hd]);
            for (o, &v) in out.iter_mut().zip(&row) {
                *o += w * v;
            }
        }
    });
}

/// [`attend`] for the `q.len() / head_dim` query heads that share one KV head (grouped-query
/// attention), each written to its `head_dim` slice of `out`. Every key and value vector is
/// loaded once for the whole group instead of once per head; each head's own operations and
/// their order are exactly [`attend`]'s, so the results are bit-identical to one call per head.
///
/// On a CPU with AVX2 the same code runs compiled for it (eight-wide vectors instead of
/// baseline x86-64's four-wide ones): the operations and their order per value are unchanged
/// (no FMA: every multiply and add is rounded on its own, as in the baseline build), so the
/// results are the same bits.
#[allow(unsafe_code)]
pub(crate) fn attend_group(
    q: &[f32],
    head_dim: usize,
    view: &HeadView<'_>,
    scale: f32,
    out: &mut [f32],
) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: AVX2 was detected just above; the function has no other precondition.
        return unsafe { attend_group_avx2(q, head_dim, view, scale, out) };
    }
    attend_group_portable(q, head_dim, view, scale, out)
}

/// [`attend_group`] compiled with AVX2 (and without FMA).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn attend_group_avx2(q: &[f32], head_dim: usize, view: &HeadView<'_>, scale: f32, out: &mut [f32]) {
    attend_group_portable(q, head_dim, view, scale, out)
}

impl HeadView<'_> {
    /// The whole layer's keys and values as f32 (test reference).
    #[cfg(test)]
    fn widened(&self) -> (Vec<f32>, Vec<f32>) {
        match self.kv {
            Kv::F16 { keys, values } => (keys.to_f32_vec(), values.to_f32_vec()),
            Kv::F32 { keys, values } => (keys.to_vec(), values.to_vec()),
        }
    }
}

#[inline(always)]
fn attend_group_portable(
    q: &[f32],
    head_dim: usize,
    view: &HeadView<'_>,
    scale: f32,
    out: &mut [f32],
) {
    let heads = q.len() / head_dim;
    let ctx = view.ctx;
    // The buffer is taken out of the thread-local for the work (not used inside a closure
    // passed to `LocalKey::with`, which would be compiled without the caller's AVX2).
    let mut scores = SCORES.with(|cell| std::mem::take(&mut *cell.borrow_mut()));
    scores.clear();
    scores.resize(heads * ctx, 0.0);
    // Scores, head-major: scores[h * ctx + t]. Each key is widened to f32 once for the whole
    // group (exact: the f32 values the cache was filled from), or read as widened. (No
    // closures in the loops: they would be compiled without the caller's AVX2.)
    let (stride, offset) = (view.kv_stride, view.kv_offset);
    let mut row = vec![0f32; head_dim];
    for t in 0..ctx {
        let base = t * stride + offset;
        let key = match view.kv {
            Kv::F16 { keys, .. } => {
                keys[base..base + head_dim].convert_to_f32_slice(&mut row);
                &row[..]
            }
            Kv::F32 { keys, .. } => &keys[base..base + head_dim],
        };
        for (h, qh) in q.chunks_exact(head_dim).enumerate() {
            scores[h * ctx + t] = dot(qh, key) * scale;
        }
    }
    let mut inv = Vec::with_capacity(heads);
    for row in scores.chunks_exact_mut(ctx) {
        let max = row.iter().fold(f32::NEG_INFINITY, |m, &s| m.max(s));
        let mut sum = 0f32;
        for s in row.iter_mut() {
            *s = (*s - max).exp();
            sum += *s;
        }
        inv.push(1.0 / sum);
    }
    // Every output value: 0, then `+= w·v` position by position (`w = p·inv`).
    out.fill(0.0);
    match view.kv {
        Kv::F16 { values, .. } => {
            for t in 0..ctx {
                let base = t * stride + offset;
                values[base..base + head_dim].convert_to_f32_slice(&mut row);
                for (h, o) in out.chunks_exact_mut(head_dim).enumerate() {
                    let w = scores[h * ctx + t] * inv[h];
                    for (o, &v) in o.iter_mut().zip(&row) {
                        *o += w * v;
                    }
                }
            }
        }
        // Widened values: head by head, so a head's outputs stay in registers over all
        // positions (the same operations per value, in the same order).
        Kv::F32 { values, .. } => {
            let values = &values[offset..];
            for (h, o) in out.chunks_exact_mut(head_dim).enumerate() {
                let (p, inv) = (&scores[h * ctx..(h + 1) * ctx], inv[h]);
                if let Ok(o) = <&mut [f32; 64]>::try_from(&mut *o) {
                    weighted_sum::<64>(o, p, inv, values, stride);
                } else {
                    for (t, &p) in p.iter().enumerate() {
                        let w = p * inv;
                        for (o, &v) in o.iter_mut().zip(&values[t * stride..][..head_dim]) {
                            *o += w * v;
                        }
                    }
                }
            }
        }
    }
    SCORES.with(|cell| *cell.borrow_mut() = scores);
}

/// `out += (p[t]·inv)·values[t·stride..][..N]` for every position `t` in order, `N` outputs
/// held in a local array (registers) for the whole sum.
#[inline(always)]
fn weighted_sum<const N: usize>(
    out: &mut [f32; N],
    p: &[f32],
    inv: f32,
    values: &[f32],
    stride: usize,
) {
    let mut acc = *out;
    for (t, &p) in p.iter().enumerate() {
        let w = p * inv;
        let v: &[f32; N] = values[t * stride..][..N]
            .try_into()
            .expect("a value row of the head's width");
        for i in 0..N {
            acc[i] += w * v[i];
        }
    }
    *out = acc;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rms_norm_matches_definition() {
        let x = [1.0f32, -2.0, 3.0, 0.5, 4.0, 4.0, 4.0, 4.0];
        let w = [1.0f32, 0.5, 2.0, 1.0];
        let mut out = [0f32; 8];
        rms_norm(&x, &w, 1e-6, &mut out);
        let ms = (1.0 + 4.0 + 9.0 + 0.25) / 4.0f32;
        let s = 1.0 / (ms + 1e-6).sqrt();
        assert!((out[0] - s).abs() < 1e-6);
        assert!((out[1] + 2.0 * s * 0.5).abs() < 1e-6);
        assert!((out[2] - 3.0 * s * 2.0).abs() < 1e-6);
        // a constant row normalises to the weight
        assert!((out[4] - 1.0).abs() < 1e-5 && (out[6] - 2.0).abs() < 1e-5);
    }

    #[test]
    fn rope_preserves_norm_and_is_identity_at_zero() {
        let mut angles = Vec::new();
        rope_angles(0, 8, 10000.0, &mut angles);
        let orig: Vec<f32> = (0..16).map(|i| i as f32 * 0.3 - 1.0).collect();
        for style in [RopeStyle::Interleaved, RopeStyle::Halves] {
            let mut row = orig.clone();
            apply_rope(&mut row, 8, 8, style, &angles);
            assert_eq!(row, orig);
        }
        rope_angles(37, 8, 10000.0, &mut angles);
        for style in [RopeStyle::Interleaved, RopeStyle::Halves] {
            let mut row = orig.clone();
            apply_rope(&mut row, 8, 8, style, &angles);
            assert_ne!(row, orig);
            let n0: f32 = orig.iter().map(|v| v * v).sum();
            let n1: f32 = row.iter().map(|v| v * v).sum();
            assert!((n0 - n1).abs() < 1e-3, "{n0} vs {n1}");
        }
    }

    #[test]
    fn rope_pairs_follow_the_style() {
        let mut angles = Vec::new();
        rope_angles(1, 4, 10000.0, &mut angles);
        // Interleaved rotates (0,1) by angle 0 and (2,3) by angle 1.
        let mut row = vec![1.0f32, 0.0, 0.0, 0.0];
        apply_rope(&mut row, 4, 4, RopeStyle::Interleaved, &angles);
        assert!((row[0] - angles[0].0).abs() < 1e-7 && (row[1] - angles[0].1).abs() < 1e-7);
        // Halves rotates (0,2) by angle 0 and (1,3) by angle 1.
        let mut row = vec![1.0f32, 0.0, 0.0, 0.0];
        apply_rope(&mut row, 4, 4, RopeStyle::Halves, &angles);
        assert!((row[0] - angles[0].0).abs() < 1e-7 && (row[2] - angles[0].1).abs() < 1e-7);
        assert_eq!(row[1], 0.0);
    }

    #[test]
    fn dot_matches_naive_sum_for_all_lengths() {
        for n in 0..40 {
            let a: Vec<f32> = (0..n).map(|i| (i as f32).sin()).collect();
            let b: Vec<f32> = (0..n).map(|i| (i as f32 * 0.7).cos()).collect();
            let naive: f64 = a.iter().zip(&b).map(|(x, y)| f64::from(x * y)).sum();
            assert!((f64::from(dot(&a, &b)) - naive).abs() < 1e-4, "n={n}");
        }
    }

    #[test]
    fn attention_matches_naive_softmax() {
        let hd = 4;
        let (n_kv, ctx) = (2, 5);
        let stride = n_kv * hd;
        let keys: Vec<f16> = (0..ctx * stride)
            .map(|i| f16::from_f32(((i * 7 % 11) as f32) * 0.1))
            .collect();
        let values: Vec<f16> = (0..ctx * stride)
            .map(|i| f16::from_f32(((i * 5 % 13) as f32) * 0.2))
            .collect();
        let q = [0.3f32, -0.2, 0.5, 1.0];
        for kvh in 0..n_kv {
            for c in 1..=ctx {
                let view = HeadView {
                    kv: Kv::F16 {
                        keys: &keys,
                        values: &values,
                    },
                    kv_stride: stride,
                    kv_offset: kvh * hd,
                    ctx: c,
                };
                let mut out = [0f32; 4];
                attend(&q, &view, 0.5, &mut out);
                let s: Vec<f64> = (0..c)
                    .map(|t| {
                        let k = &keys[t * stride + kvh * hd..][..hd];
                        0.5 * q
                            .iter()
                            .zip(k)
                            .map(|(a, b)| f64::from(a * b.to_f32()))
                            .sum::<f64>()
                    })
                    .collect();
                let m = s.iter().cloned().fold(f64::MIN, f64::max);
                let z: f64 = s.iter().map(|v| (v - m).exp()).sum();
                for d in 0..hd {
                    let want: f64 = (0..c)
                        .map(|t| {
                            (s[t] - m).exp() / z
                                * f64::from(values[t * stride + kvh * hd + d].to_f32())
                        })
                        .sum();
                    assert!((f64::from(out[d]) - want).abs() < 1e-5);
                }
            }
        }
    }

    #[test]
    fn grouped_attention_is_bit_identical_to_one_head_at_a_time() {
        // Head width 64 (the register path for widened values) and 8 (the generic one); the
        // cache as stored (f16) and widened once (f32, as a prefill chunk reads it).
        for hd in [8, 64] {
            let (n_kv, heads, ctx) = (2, 3, 37);
            let stride = n_kv * hd;
            let keys: Vec<f16> = (0..ctx * stride)
                .map(|i| f16::from_f32(((i * 7919 % 101) as f32 - 50.0) * 0.031))
                .collect();
            let values: Vec<f16> = (0..ctx * stride)
                .map(|i| f16::from_f32(((i * 104_729 % 97) as f32 - 48.0) * 0.017))
                .collect();
            let (keys32, values32) = (keys.to_f32_vec(), values.to_f32_vec());
            let q: Vec<f32> = (0..heads * hd)
                .map(|i| ((i * 31 % 23) as f32 - 11.0) * 0.2)
                .collect();
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            for kvh in 0..n_kv {
                for c in [1, 2, 17, ctx] {
                    let view = |kv| HeadView {
                        kv,
                        kv_stride: stride,
                        kv_offset: kvh * hd,
                        ctx: c,
                    };
                    let stored = view(Kv::F16 {
                        keys: &keys,
                        values: &values,
                    });
                    let widened = view(Kv::F32 {
                        keys: &keys32,
                        values: &values32,
                    });
                    let mut grouped = vec![0f32; heads * hd];
                    attend_group(&q, hd, &stored, 0.35, &mut grouped);
                    let mut grouped32 = vec![0f32; heads * hd];
                    attend_group(&q, hd, &widened, 0.35, &mut grouped32);
                    assert_eq!(bits(&grouped), bits(&grouped32), "{hd} {kvh} {c}");
                    for h in 0..heads {
                        let mut one = vec![0f32; hd];
                        attend(&q[h * hd..(h + 1) * hd], &stored, 0.35, &mut one);
                        assert_eq!(
                            bits(&grouped[h * hd..(h + 1) * hd]),
                            bits(&one),
                            "{hd} {kvh} {c} {h}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn silu_mul_matches_definition() {
        let mut g = [0.0f32, 1.0, -3.0];
        silu_mul(&mut g, &[2.0, 2.0, 1.0]);
        assert_eq!(g[0], 0.0);
        assert!((g[1] - 2.0 / (1.0 + (-1.0f32).exp())).abs() < 1e-6);
        assert!((g[2] + 3.0 / (1.0 + 3.0f32.exp())).abs() < 1e-6);
    }
}
