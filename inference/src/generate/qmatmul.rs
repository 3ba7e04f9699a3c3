//! Quantized weight matrices: `y = x · Wᵀ` for a stack of activation rows.
//!
//! K-quants go through candle's `QMatMul` (AVX-512-VNNI repacked kernels, activations in Q8_K
//! as in ggml). `Q4_1` and `Q8_0` get their own kernels here because candle's differ from ggml
//! in ways that change greedy tokens:
//! - its Q8_1 activation blocks store the block sum as `f16(sum) * f16(d)` (two roundings, in
//!   half precision) where ggml stores `f16(d * sum)`, and every Q4_1 block's min term is
//!   multiplied by that sum: on SmolLM2 (all Q4_1) this flipped a token with a 0.33 margin;
//! - its repacked Q8_0 kernel quantizes activations in 256-wide Q8_K blocks where ggml uses
//!   32-wide Q8_0 blocks (SmolLM2's tied lm_head is Q8_0).
//!
//! These kernels quantize activations exactly as ggml's x86 `quantize_row_q8_1`/`_q8_0`
//! (d = max/127, scale 127/max, round half to even, s = f16(d·Σq)) and accumulate
//! `(d_w·d_a)·Σq_w·q_a (+ m_w·s_a)` per block like `ggml_vec_dot_q4_1_q8_1`/`_q8_0_q8_0`.

use candle_core::quantized::{GgmlDType, QMatMul, QTensor};
use candle_core::{Device, Module, Tensor};
use half::f16;
use rayon::prelude::*;

/// Values per Q4_1 / Q8_1 block.
const QK: usize = 32;
/// Bytes of one Q4_1 block in GGUF: f16 d, f16 m, 16 bytes of nibbles.
const Q4_1_BYTES: usize = 20;
/// Bytes of one Q8_0 block: f16 d, 32 signed bytes.
const Q8_0_BYTES: usize = 34;
/// Output columns per parallel work item.
const COL_TILE: usize = 16;
/// Activation rows accumulated together in one pass over a weight row.
const ROW_GROUP: usize = 4;

/// A weight matrix `[n, k]` (`n` outputs) in whichever form runs it fastest and faithfully.
pub(crate) enum Weight {
    Candle(QMatMul),
    Own(OwnWeight),
}

impl Weight {
    pub(crate) fn new(t: QTensor) -> candle_core::Result<Self> {
        match t.dtype() {
            GgmlDType::Q4_1 | GgmlDType::Q8_0 => Ok(Self::Own(OwnWeight::from_qtensor(&t)?)),
            _ => Ok(Self::Candle(QMatMul::from_qtensor(t)?)),
        }
    }

    /// A weight shared with the token embedding (tied lm_head).
    pub(crate) fn shared(t: &std::sync::Arc<QTensor>) -> candle_core::Result<Self> {
        match t.dtype() {
            GgmlDType::Q4_1 | GgmlDType::Q8_0 => Ok(Self::Own(OwnWeight::from_qtensor(t)?)),
            _ => Ok(Self::Candle(QMatMul::from_arc(t.clone())?)),
        }
    }

    /// `x` is `[rows, k]` row-major; returns `[rows, n]`.
    pub(crate) fn matmul(&self, x: &[f32], rows: usize) -> candle_core::Result<Vec<f32>> {
        match self {
            Self::Candle(m) => {
                let k = x.len() / rows;
                let t = Tensor::from_slice(x, (rows, k), &Device::Cpu)?;
                m.forward(&t)?.flatten_all()?.to_vec1::<f32>()
            }
            Self::Own(w) => Ok(w.matmul(x, rows)),
        }
    }
}

/// A Q4_1 or Q8_0 matrix unpacked into struct-of-arrays form, multiplied by our own kernels.
pub(crate) struct OwnWeight {
    n: usize,
    k: usize,
    kind: Kind,
}

enum Kind {
    /// Per block: scale `d`, min `m`, 16 bytes (low nibbles = values 0..16, high = 16..32).
    Q4_1 {
        d: Vec<f32>,
        m: Vec<f32>,
        qs: Vec<u8>,
    },
    /// Per block: scale `d`, 32 signed bytes.
    Q8_0 { d: Vec<f32>, qs: Vec<i8> },
}

/// Activation rows quantized to ggml's Q8_1 (Q8_0 is the same without the sum `s`).
struct Q8Rows {
    q: Vec<i8>,
    d: Vec<f32>,
    s: Vec<f32>,
}

/// ggml's x86 `quantize_row_q8_1` / `quantize_row_q8_0`: d = max/127 rounded to f16, values
/// scaled by 127/max and rounded half to even, s = f16(d · Σq) (d before its f16 rounding).
fn quantize_q8(x: &[f32]) -> Q8Rows {
    let nb = x.len() / QK;
    let mut out = Q8Rows {
        q: vec![0; x.len()],
        d: Vec::with_capacity(nb),
        s: Vec::with_capacity(nb),
    };
    for (block, q) in x.chunks_exact(QK).zip(out.q.chunks_exact_mut(QK)) {
        let max = block.iter().fold(0f32, |m, v| m.max(v.abs()));
        let d = max / 127.0;
        let id = if max != 0.0 { 127.0 / max } else { 0.0 };
        let mut sum = 0i32;
        for (qv, &v) in q.iter_mut().zip(block) {
            let r = (v * id).round_ties_even() as i32;
            *qv = r as i8;
            sum += r;
        }
        out.d.push(f16::from_f32(d).to_f32());
        out.s.push(f16::from_f32(d * sum as f32).to_f32());
    }
    out
}

impl OwnWeight {
    fn from_qtensor(t: &QTensor) -> candle_core::Result<Self> {
        let (n, k) = t.shape().dims2()?;
        if k % QK != 0 {
            candle_core::bail!("row width {k} is not a multiple of {QK}");
        }
        let data = t.data()?;
        let nb = n * k / QK;
        let block_bytes = match t.dtype() {
            GgmlDType::Q4_1 => Q4_1_BYTES,
            GgmlDType::Q8_0 => Q8_0_BYTES,
            other => candle_core::bail!("no own kernel for {other:?}"),
        };
        if data.len() != nb * block_bytes {
            candle_core::bail!(
                "tensor has {} bytes, expected {}",
                data.len(),
                nb * block_bytes
            );
        }
        let half_at = |b: &[u8], i: usize| f16::from_le_bytes([b[i], b[i + 1]]).to_f32();
        let kind = if block_bytes == Q4_1_BYTES {
            let (mut d, mut m, mut qs) = (
                Vec::with_capacity(nb),
                Vec::with_capacity(nb),
                Vec::with_capacity(nb * 16),
            );
            for b in data.chunks_exact(Q4_1_BYTES) {
                d.push(half_at(b, 0));
                m.push(half_at(b, 2));
                qs.extend_from_slice(&b[4..20]);
            }
            Kind::Q4_1 { d, m, qs }
        } else {
            let (mut d, mut qs) = (Vec::with_capacity(nb), Vec::with_capacity(nb * QK));
            for b in data.chunks_exact(Q8_0_BYTES) {
                d.push(half_at(b, 0));
                qs.extend(b[2..34].iter().map(|&v| v as i8));
            }
            Kind::Q8_0 { d, qs }
        };
        Ok(Self { n, k, kind })
    }

    /// Weight row `col` as 8-bit values (Q4_1 nibbles widened, Q8_0 copied) into `out`.
    #[inline(always)]
    fn unpack_row(&self, col: usize, out: &mut [i8]) {
        let kb = self.k / QK;
        match &self.kind {
            Kind::Q4_1 { qs, .. } => {
                let src = &qs[col * kb * 16..(col + 1) * kb * 16];
                for (blk, dst) in src.chunks_exact(16).zip(out.chunks_exact_mut(QK)) {
                    // Written as zipped iterators (no indices) so that it vectorizes.
                    let (lo, hi) = dst.split_at_mut(16);
                    for ((l, h), &b) in lo.iter_mut().zip(hi.iter_mut()).zip(blk) {
                        *l = (b & 0x0F) as i8;
                        *h = (b >> 4) as i8;
                    }
                }
            }
            Kind::Q8_0 { qs, .. } => out.copy_from_slice(&qs[col * self.k..(col + 1) * self.k]),
        }
    }

    /// Dot products of one unpacked weight row with every activation row, block by block as
    /// ggml's `vec_dot_q4_1_q8_1` / `vec_dot_q8_0_q8_0`: `Σ (d_w·d_a)·Σq_w·q_a (+ m_w·s_a)`.
    /// `sum_block` computes one block's exact integer dot product (portable or SIMD: integer
    /// sums are exact, so every implementation gives the same `i32`); the float accumulation
    /// order is the same for all of them.
    #[inline(always)]
    fn dot_rows(
        &self,
        col: usize,
        w: &[i8],
        a: &Q8Rows,
        out: &mut [f32],
        sum_block: impl Fn(&[i8], &[i8]) -> i32,
    ) {
        let kb = self.k / QK;
        let wb = col * kb;
        let dw = match &self.kind {
            Kind::Q4_1 { d, .. } | Kind::Q8_0 { d, .. } => &d[wb..wb + kb],
        };
        let mw = match &self.kind {
            Kind::Q4_1 { m, .. } => Some(&m[wb..wb + kb]),
            Kind::Q8_0 { .. } => None,
        };
        // Four activation rows at a time: four independent accumulation chains hide the float
        // add latency; each row's own operations and their order are unchanged.
        for (g, group) in out.chunks_mut(ROW_GROUP).enumerate() {
            let first = g * ROW_GROUP;
            let mut acc = [0f32; ROW_GROUP];
            for (b, qw) in w.chunks_exact(QK).enumerate() {
                for (i, acc) in acc.iter_mut().enumerate().take(group.len()) {
                    let ab = (first + i) * kb + b;
                    let sumi = sum_block(qw, &a.q[ab * QK..(ab + 1) * QK]);
                    *acc += (dw[b] * a.d[ab]) * sumi as f32;
                }
            }
            if let Some(mw) = mw {
                for (i, acc) in acc.iter_mut().enumerate().take(group.len()) {
                    let ab = (first + i) * kb;
                    let mut summs = 0f32;
                    for (m, s) in mw.iter().zip(&a.s[ab..ab + kb]) {
                        summs += m * s;
                    }
                    *acc += summs;
                }
            }
            group.copy_from_slice(&acc[..group.len()]);
        }
    }

    /// One tile of output columns (`out` is `[cols][rows]`) with a given block dot product.
    #[inline(always)]
    fn tile_with(
        &self,
        first_col: usize,
        a: &Q8Rows,
        rows: usize,
        out: &mut [f32],
        sum_block: impl Fn(&[i8], &[i8]) -> i32 + Copy,
    ) {
        let mut w = vec![0i8; self.k];
        for (c, col_out) in out.chunks_exact_mut(rows).enumerate() {
            self.unpack_row(first_col + c, &mut w);
            self.dot_rows(first_col + c, &w, a, col_out, sum_block);
        }
    }

    /// The portable tile (the reference every SIMD tier must match bit for bit).
    #[inline(always)]
    fn tile_generic(&self, first_col: usize, a: &Q8Rows, rows: usize, out: &mut [f32]) {
        self.tile_with(first_col, a, rows, out, sum_block_generic)
    }

    /// The tile with AVX2 block dot products (`vpmaddubsw` + `vpmaddwd`, as ggml's x86 code).
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma")]
    fn tile_avx2(&self, first_col: usize, a: &Q8Rows, rows: usize, out: &mut [f32]) {
        self.tile_with(first_col, a, rows, out, |w, x| sum_block_avx2(w, x))
    }

    /// The same for CPUs with AVX-512 (the AVX2 block dot, compiled with the wider ISA enabled).
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma")]
    fn tile_avx512(&self, first_col: usize, a: &Q8Rows, rows: usize, out: &mut [f32]) {
        self.tile_with(first_col, a, rows, out, |w, x| sum_block_avx2(w, x))
    }

    /// Runs one tile with the widest instruction set the CPU has. Integer sums are exact and
    /// the float operations happen in the same order in every tier, so all tiers give
    /// bit-identical results (tested).
    #[allow(unsafe_code)]
    fn tile(&self, tier: Tier, first_col: usize, a: &Q8Rows, rows: usize, out: &mut [f32]) {
        match tier {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: `Tier::Avx512` is only chosen after `is_x86_feature_detected!` confirmed
            // every feature `tile_avx512` enables; it has no other precondition.
            Tier::Avx512 => unsafe { self.tile_avx512(first_col, a, rows, out) },
            #[cfg(target_arch = "x86_64")]
            // SAFETY: as above, for AVX2 and FMA.
            Tier::Avx2 => unsafe { self.tile_avx2(first_col, a, rows, out) },
            _ => self.tile_generic(first_col, a, rows, out),
        }
    }

    fn matmul_with(&self, tier: Tier, x: &[f32], rows: usize) -> Vec<f32> {
        debug_assert_eq!(x.len(), rows * self.k);
        let a = quantize_q8(x);
        // Column tiles in parallel; each weight row is unpacked once and meets every activation
        // row while it is in L1, so the weights are streamed once per call.
        let mut by_col = vec![0f32; self.n * rows];
        by_col
            .par_chunks_mut(COL_TILE * rows)
            .enumerate()
            .for_each(|(t, out)| self.tile(tier, t * COL_TILE, &a, rows, out));
        let mut y = vec![0f32; rows * self.n];
        for (col, vals) in by_col.chunks_exact(rows).enumerate() {
            for (r, &v) in vals.iter().enumerate() {
                y[r * self.n + col] = v;
            }
        }
        y
    }

    fn matmul(&self, x: &[f32], rows: usize) -> Vec<f32> {
        self.matmul_with(Tier::detect(), x, rows)
    }
}

/// One block's integer dot product `Σ w[j]·a[j]` over `QK` values, portable code.
#[inline(always)]
fn sum_block_generic(w: &[i8], a: &[i8]) -> i32 {
    w.iter()
        .zip(a)
        .map(|(&x, &y)| i32::from(x) * i32::from(y))
        .sum()
}

/// The same with AVX2, exactly (no saturation can occur): `vpmaddubsw` multiplies |w| (as u8)
/// by a with w's sign and adds pairs into i16 (|pair| ≤ 2·128·127 = 32,512 < 32,767), `vpmaddwd`
/// widens to eight i32 lanes, which are summed. ggml's `mul_sum_i8_pairs` does the same.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
#[inline]
#[allow(unsafe_code)]
fn sum_block_avx2(w: &[i8], a: &[i8]) -> i32 {
    use std::arch::x86_64::{
        __m256i, _mm_add_epi32, _mm_cvtsi128_si32, _mm_shuffle_epi32, _mm256_castsi256_si128,
        _mm256_extracti128_si256, _mm256_loadu_si256, _mm256_madd_epi16, _mm256_maddubs_epi16,
        _mm256_set1_epi16, _mm256_sign_epi8,
    };
    assert!(w.len() >= QK && a.len() >= QK);
    // SAFETY: both slices hold at least 32 bytes (asserted above) and `loadu` has no alignment
    // requirement.
    let (vw, va) = unsafe {
        (
            _mm256_loadu_si256(w.as_ptr().cast::<__m256i>()),
            _mm256_loadu_si256(a.as_ptr().cast::<__m256i>()),
        )
    };
    let abs_w = _mm256_sign_epi8(vw, vw);
    let signed_a = _mm256_sign_epi8(va, vw);
    let pairs = _mm256_maddubs_epi16(abs_w, signed_a);
    let quads = _mm256_madd_epi16(pairs, _mm256_set1_epi16(1));
    let s = _mm_add_epi32(
        _mm256_castsi256_si128(quads),
        _mm256_extracti128_si256::<1>(quads),
    );
    let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b01_00_11_10>(s));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b10_11_00_01>(s));
    _mm_cvtsi128_si32(s)
}

/// Instruction-set tier of the own kernels, detected once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Tier {
    Generic,
    #[cfg(target_arch = "x86_64")]
    Avx2,
    #[cfg(target_arch = "x86_64")]
    Avx512,
}

impl Tier {
    fn detect() -> Self {
        static TIER: std::sync::OnceLock<Tier> = std::sync::OnceLock::new();
        *TIER.get_or_init(|| {
            #[cfg(target_arch = "x86_64")]
            {
                let f = |name: &str| match name {
                    "avx512" => {
                        is_x86_feature_detected!("avx512f")
                            && is_x86_feature_detected!("avx512bw")
                            && is_x86_feature_detected!("avx512vl")
                            && is_x86_feature_detected!("avx512vnni")
                    }
                    _ => is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma"),
                };
                if f("avx512") && f("avx2") {
                    return Tier::Avx512;
                }
                if f("avx2") {
                    return Tier::Avx2;
                }
            }
            Tier::Generic
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn own_kernels_match_dequantized_reference() {
        for dtype in [GgmlDType::Q4_1, GgmlDType::Q8_0] {
            check_against_dequantized(dtype);
        }
    }

    fn check_against_dequantized(dtype: GgmlDType) {
        let (n, k, rows) = (40, 96, 3);
        let w: Vec<f32> = (0..n * k)
            .map(|i| ((i * 37 % 101) as f32 - 50.0) / 40.0)
            .collect();
        let x: Vec<f32> = (0..rows * k)
            .map(|i| ((i * 13 % 29) as f32 - 14.0) / 7.0)
            .collect();
        let wt = Tensor::from_vec(w, (n, k), &Device::Cpu).unwrap();
        let q = QTensor::quantize(&wt, dtype).unwrap();
        let deq = q
            .dequantize(&Device::Cpu)
            .unwrap()
            .to_vec2::<f32>()
            .unwrap();
        let weight = Weight::new(q).unwrap();
        assert!(matches!(weight, Weight::Own(_)));
        let y = weight.matmul(&x, rows).unwrap();
        for r in 0..rows {
            for c in 0..n {
                let want: f32 = (0..k).map(|i| x[r * k + i] * deq[c][i]).sum();
                let got = y[r * n + c];
                // Activations are quantized to 8 bits: allow that rounding.
                assert!(
                    (got - want).abs() < 0.05 * (1.0 + want.abs()),
                    "{r},{c}: {got} vs {want}"
                );
            }
        }
    }

    #[test]
    fn every_tier_is_bit_identical_to_the_generic_code() {
        let tiers = [Tier::Generic, Tier::detect()];
        for dtype in [GgmlDType::Q4_1, GgmlDType::Q8_0] {
            for (n, k, rows) in [(48, 64, 1), (40, 96, 5), (16, 32, 17)] {
                let w: Vec<f32> = (0..n * k)
                    .map(|i| ((i * 7919 % 257) as f32 - 128.0) / 50.0)
                    .collect();
                let x: Vec<f32> = (0..rows * k)
                    .map(|i| ((i * 104_729 % 211) as f32 - 105.0) / 9.0)
                    .collect();
                let wt = Tensor::from_vec(w, (n, k), &Device::Cpu).unwrap();
                let Weight::Own(own) = Weight::new(QTensor::quantize(&wt, dtype).unwrap()).unwrap()
                else {
                    panic!("own kernel expected")
                };
                let outs: Vec<Vec<f32>> = tiers
                    .iter()
                    .map(|&t| own.matmul_with(t, &x, rows))
                    .collect();
                assert_eq!(
                    outs[0], outs[1],
                    "{dtype:?} {n}x{k} rows {rows} tier {:?}",
                    tiers[1]
                );
            }
        }
    }

    #[test]
    #[allow(unsafe_code)]
    fn simd_block_dot_is_exact_at_the_extremes() {
        #[cfg(target_arch = "x86_64")]
        if is_x86_feature_detected!("avx2") {
            let mut cases: Vec<([i8; QK], [i8; QK])> = vec![
                ([-128; QK], [127; QK]),
                ([-128; QK], [-127; QK]),
                ([127; QK], [127; QK]),
                ([15; QK], [-127; QK]),
                ([0; QK], [-128; QK]),
            ];
            let mut x = 0x2545_f491_4f6c_dd1du64;
            for _ in 0..2000 {
                let mut w = [0i8; QK];
                let mut a = [0i8; QK];
                for j in 0..QK {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    w[j] = x as i8;
                    a[j] = ((x >> 8) as i8).max(-127);
                }
                cases.push((w, a));
            }
            for (w, a) in &cases {
                // SAFETY: AVX2 was detected just above.
                let simd = unsafe { sum_block_avx2(w, a) };
                assert_eq!(simd, sum_block_generic(w, a), "{w:?} · {a:?}");
            }
        }
    }

    #[test]
    fn q8_1_block_sum_is_rounded_once() {
        let x: Vec<f32> = (0..32).map(|i| i as f32 * 0.37 + 0.01).collect();
        let a = quantize_q8(&x);
        let max = x.iter().fold(0f32, |m, v| m.max(v.abs()));
        let d = max / 127.0;
        let sum: i32 = a.q.iter().map(|&v| i32::from(v)).sum();
        assert_eq!(a.q[31], 127);
        assert_eq!(a.s[0], f16::from_f32(d * sum as f32).to_f32());
    }
}
