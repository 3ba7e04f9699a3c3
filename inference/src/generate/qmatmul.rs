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
                    for j in 0..16 {
                        dst[j] = (blk[j] & 0x0F) as i8;
                        dst[j + 16] = (blk[j] >> 4) as i8;
                    }
                }
            }
            Kind::Q8_0 { qs, .. } => out.copy_from_slice(&qs[col * self.k..(col + 1) * self.k]),
        }
    }

    /// Dot products of one unpacked weight row with every activation row, block by block as
    /// ggml's `vec_dot_q4_1_q8_1` / `vec_dot_q8_0_q8_0`: `Σ (d_w·d_a)·Σq_w·q_a (+ m_w·s_a)`.
    #[inline(always)]
    fn dot_rows(&self, col: usize, w: &[i8], a: &Q8Rows, out: &mut [f32]) {
        let kb = self.k / QK;
        let wb = col * kb;
        for (row, o) in out.iter_mut().enumerate() {
            let ab = row * kb;
            let mut acc = 0f32;
            for b in 0..kb {
                let qw = &w[b * QK..(b + 1) * QK];
                let qa = &a.q[(ab + b) * QK..(ab + b + 1) * QK];
                let mut sumi = 0i32;
                for j in 0..QK {
                    sumi += i32::from(qw[j]) * i32::from(qa[j]);
                }
                let d = match &self.kind {
                    Kind::Q4_1 { d, .. } | Kind::Q8_0 { d, .. } => d[wb + b],
                };
                acc += (d * a.d[ab + b]) * sumi as f32;
            }
            if let Kind::Q4_1 { m, .. } = &self.kind {
                let mut summs = 0f32;
                for b in 0..kb {
                    summs += m[wb + b] * a.s[ab + b];
                }
                acc += summs;
            }
            *o = acc;
        }
    }

    /// One tile of output columns (`out` is `[cols][rows]`), the code every tier compiles.
    #[inline(always)]
    fn tile_generic(&self, first_col: usize, a: &Q8Rows, rows: usize, out: &mut [f32]) {
        let mut w = vec![0i8; self.k];
        for (c, col_out) in out.chunks_exact_mut(rows).enumerate() {
            self.unpack_row(first_col + c, &mut w);
            self.dot_rows(first_col + c, &w, a, col_out);
        }
    }

    /// The same code compiled for AVX2.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma")]
    fn tile_avx2(&self, first_col: usize, a: &Q8Rows, rows: usize, out: &mut [f32]) {
        self.tile_generic(first_col, a, rows, out)
    }

    /// The same code compiled for AVX-512 (BW for the 8/16-bit lanes, VNNI for the i16 dot).
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma")]
    fn tile_avx512(&self, first_col: usize, a: &Q8Rows, rows: usize, out: &mut [f32]) {
        self.tile_generic(first_col, a, rows, out)
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
