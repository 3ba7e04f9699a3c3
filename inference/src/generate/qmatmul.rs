//! Quantized weight matrices: `y = x · Wᵀ` for a stack of activation rows (one decode row per
//! running sequence, or a prefill chunk), on our own kernels.
//!
//! Every call quantizes the activation rows once (ggml's Q8_0/Q8_1 blocks of 32 for Q4_1, Q5_0
//! and Q8_0 weights; ggml's Q8_K blocks of 256 for Q4_K and Q6_K), then runs column tiles of the
//! weight matrix in parallel on rayon (the pool every other step of the forward uses). Each weight
//! row is read once per call and meets every activation row while it is in L1, several activation
//! rows per pass (independent accumulators sharing each weight-block load): Q4_1/Q5_0 rows are
//! unpacked to bytes once per call and row block (Q8_0 rows are read in place); K-quant rows are
//! unpacked in registers chunk by chunk for each group of four rows, as ggml does. Big calls
//! (prefill chunks) are split into row blocks that stay in L2 while all column tiles pass over
//! them; the tiles' outputs are assembled into row-major order in parallel.
//!
//! The AVX2 tier's prefill kernels are register tiles whose float steps stay per output:
//! Q5_0/Q8_0 run four activation rows × two weight rows ([`lanes_micro`]: eight lane
//! accumulators, the `d_w·d_a` products computed eight blocks per multiply before the loop, so
//! the loop is `vpsignb` + `vpmaddubsw` + `vpmaddwd` + convert + FMA per block and pair);
//! Q4_1 runs eight activation rows per register ([`block_micro`]: its per-block order is
//! one scalar chain per output, so eight outputs share each vector step). On the AVX2-only AMD
//! EPYC (2 vCPUs) they took Qwen2.5-0.5B's prefill of 450 tokens from ~3.9 to ~3.4 CPU-seconds
//! (Q5_0 is 70% of its multiply-adds) and SmolLM2's (all Q4_1) from ~2.3 to ~1.25 (see
//! the history of docs/benchmarks/inference-generate.md). An earlier four × two tile that kept the scale
//! multiply and broadcast in the loop and the accumulators in memory was no faster than four ×
//! one. ggml's AVX-512 VNNI path (`vpdpbusd`) does the two integer steps in one instruction on
//! 64 bytes; the `avx512` tier below uses it.
//!
//! Candle's kernels are not used for these types because they differ from ggml in ways that
//! change greedy tokens, are slow, or run on a second thread pool:
//! - its Q8_1 activation blocks store the block sum as `f16(sum) * f16(d)` (two roundings, in
//!   half precision) where ggml stores `f16(d * sum)`, and every Q4_1 block's min term is
//!   multiplied by that sum: on SmolLM2 (all Q4_1) this flipped a token with a 0.33 margin;
//! - its repacked Q8_0 kernel quantizes activations in 256-wide Q8_K blocks where ggml uses
//!   32-wide Q8_0 blocks (SmolLM2's tied lm_head is Q8_0);
//! - its `Q5_0` dot product has no SIMD path at all (scalar), and Q5_0 is what llama.cpp's
//!   Q4_K_M falls back to for every tensor whose rows are not a multiple of 256 wide (all of
//!   Qwen2.5-0.5B's 896-wide Q/K/V/O/gate/up matrices and its token embedding);
//! - its K-quant matmuls run on candle's own barrier pool, whose idle threads spin while rayon's
//!   work (and the other way round): on two cores that halved the decode speed.
//!
//! Activations are quantized exactly as ggml's x86 `quantize_row_q8_1`/`_q8_0` (d = max/127,
//! scale 127/max, round half to even, s = f16(d·Σq)) and `quantize_row_q8_K_ref` (iscale =
//! −127/max of the signed largest value, round half to even, d = 1/iscale, 16-value sums). Each
//! block's integer products are summed exactly (`vpmaddubsw` + `vpmaddwd`: eight i32 lanes of
//! four products each, weighted by the 16-bit sub-block scales for K-quants), then accumulated
//! in one of these float orders:
//! - **lanes** (Q5_0, Q8_0): ggml's AVX2 `ggml_vec_dot_q5_0_q8_0` / `_q8_0_q8_0` and llamafile's
//!   tinyBLAS (llama.cpp's prefill path for these types): the lanes are converted to f32 and
//!   accumulated with one fused multiply-add each per 32-value block, `acc = fma(d_w·d_a, lane,
//!   acc)`, and summed at the end of the row in `hsum_float_8`'s order;
//! - **super-block lanes** (Q4_K, Q6_K): ggml's AVX2 `ggml_vec_dot_q4_K_q8_K` / `_q6_K_q8_K`:
//!   the same per 256-value super-block (`d = d_a·d_w`), plus for Q4_K four min lanes
//!   `acc_m = fma(−d_a·dmin_w, m_{2t}·s_{2t} + m_{2t+1}·s_{2t+1}, acc_m)` summed as
//!   `(m0+m2)+(m1+m3)` and added after `hsum_float_8`;
//! - **per block** (Q4_1): the block's eight lanes are summed as integers and accumulated as
//!   `acc += (d_w·d_a)·Σq_w·q_a` (ggml's scalar reference order), plus `Σ m_w·s_a` at the end.
//!   ggml's AVX2 Q4_1 kernel uses the lanes order too, but with it SmolLM2's greedy output leaves
//!   llama.cpp's fixture at a 0.19-margin step, while the per-block order matches it (the
//!   remaining difference from llama.cpp's logits, ~0.07 on average per step, is the same in
//!   both orders and comes from elsewhere; see `docs/benchmarks/inference-generate.md`).
//!
//! The AVX-512 VNNI tier (`avx512f+bw+vl+vnni`) computes the same exact integer lanes with
//! `vpdpbusd` on 64 bytes (two blocks or chunks per instruction; unsigned × signed bytes, so
//! signed weights meet activations biased by +128 and an accumulator that starts at −128 × the
//! weights' four-value sums) and applies the K-quant sub-block scales with `vpdpwssd`; its
//! float steps are the AVX2 tier's, in the same order. Its prefill-sized Q4_1/Q5_0/Q8_0 calls run
//! the AVX2 tier's register tiles with `vpdpbusd` (on 32 bytes) for the integer lanes (the
//! tiles are generic over the tier's [`BlockInts`]). Q5_0/Q8_0 calls of at least
//! [`V4_MIN_ROWS`] rows run [`lanes_micro_vnni4`] instead: four activation rows × four weight
//! rows (sixteen accumulators in the tier's 32 vector registers), the weights biased by +128 as
//! the unsigned operand of one `vpdpbusd` per block and pair, everything laid out block-major so
//! one pointer per operand reaches a whole tile (with the attention and buffer changes of the
//! same pass it took Qwen2.5-0.5B's 450-token prefill on the 2-vCPU AVX-512 EPYC from 2.4–2.7 s
//! to 2.0–2.6 s in alternating runs; the history of docs/benchmarks/inference-generate.md).
//! `AIRLOCK_KERNEL_TIER=portable|avx2|avx512` forces a tier ([`KERNEL_TIER_ENV`]); a tier the
//! CPU lacks is refused at model load.
//!
//! The portable tier does the same operations lane by lane (`f32::mul_add` is a correctly
//! rounded FMA everywhere), so every tier gives bit-identical results, whatever the register
//! tiling (each output's own operations and their order do not depend on it).

use candle_core::quantized::k_quants::QK_K;
use candle_core::quantized::{GgmlDType, QMatMul, QTensor};
use candle_core::{Device, Module, Tensor};
use half::f16;
use rayon::prelude::*;

/// Values per Q4_1 / Q5_0 / Q8_0 / Q8_1 block (and per K-quant sub-block chunk).
const QK: usize = 32;
/// Bytes of one Q4_1 block in GGUF: f16 d, f16 m, 16 bytes of nibbles.
const Q4_1_BYTES: usize = 20;
/// Bytes of one Q5_0 block in GGUF: f16 d, 4 bytes of fifth bits, 16 bytes of nibbles.
const Q5_0_BYTES: usize = 22;
/// Bytes of one Q8_0 block: f16 d, 32 signed bytes.
const Q8_0_BYTES: usize = 34;
/// Bytes of one Q4_K super-block: f16 d, f16 dmin, 12 bytes of 6-bit scales and mins, 128 bytes
/// of nibbles.
const Q4_K_BYTES: usize = 144;
/// Bytes of one Q6_K super-block: 128 bytes of low nibbles, 64 of high bit pairs, 16 signed
/// 8-bit scales, f16 d.
const Q6_K_BYTES: usize = 210;
/// 32-value chunks per K-quant super-block.
const CHUNKS: usize = QK_K / QK;
/// Float lanes of one accumulator (one `__m256`, as ggml's AVX2 kernels).
const LANES: usize = 8;

/// Eight f32 accumulators; lane `j` accumulates the products of values `4j..4j+4` of each block.
type Lanes = [f32; LANES];

/// `HBIT[b]` spreads the 8 bits of `b` into 8 bytes, `0x10` for a set bit, `0` otherwise (byte
/// `i` of the little-endian `u64` for bit `i`): Q5_0's fifth bits, ready to OR onto nibbles.
const HBIT: [u64; 256] = {
    let mut t = [0u64; 256];
    let mut b = 0;
    while b < 256 {
        let mut i = 0;
        while i < 8 {
            if b >> i & 1 == 1 {
                t[b] |= 0x10 << (8 * i);
            }
            i += 1;
        }
        b += 1;
    }
    t
};
/// Output columns per parallel work item (Q4_1, Q5_0, Q8_0).
const COL_TILE: usize = 16;
/// Output columns per parallel work item for K-quants (an unpacked column is twice the bytes:
/// values plus 16-bit scales).
const KCOL_TILE: usize = 8;
/// Activation rows accumulated together in one pass over a weight row.
const ROW_GROUP: usize = 4;
/// Bytes of quantized activations one row block may hold: the block stays in L2 while every
/// column tile passes over it.
const ROW_BLOCK_BYTES: usize = 192 * 1024;
/// Activation rows whose outputs share one register in the AVX2 per-block (Q4_1) kernel: one
/// lane per row, so the per-block float steps of eight rows are one vector operation each.
const BLOCK_T: usize = 8;
/// Register tile of the AVX2 lanes-order kernel (Q5_0, Q8_0): activation rows × weight rows,
/// one eight-lane accumulator each (eight of the sixteen `ymm` registers).
const LANES_R: usize = 4;
const LANES_C: usize = 2;

/// A weight matrix `[n, k]` (`n` outputs) in whichever form runs it fastest and faithfully.
pub(crate) enum Weight {
    Candle(QMatMul),
    Own(OwnWeight),
}

impl Weight {
    pub(crate) fn new(t: QTensor) -> candle_core::Result<Self> {
        Self::shared(&std::sync::Arc::new(t))
    }

    /// A weight that may be shared with the token embedding (tied lm_head).
    pub(crate) fn shared(t: &std::sync::Arc<QTensor>) -> candle_core::Result<Self> {
        match t.dtype() {
            GgmlDType::Q4_1
            | GgmlDType::Q5_0
            | GgmlDType::Q8_0
            | GgmlDType::Q4K
            | GgmlDType::Q6K => Ok(Self::Own(OwnWeight::from_qtensor(t)?)),
            _ => Ok(Self::Candle(QMatMul::from_arc(t.clone())?)),
        }
    }

    /// `x` is `[rows, k]` row-major; returns `[rows, n]`.
    pub(crate) fn matmul(&self, x: &[f32], rows: usize) -> candle_core::Result<Vec<f32>> {
        match self {
            Self::Candle(m) => Self::candle_matmul(m, x, rows),
            Self::Own(w) => Ok(w.matmul(x, rows)),
        }
    }

    /// [`Self::matmul`] of the input `acts` holds, into `y` (its allocation reused): the weights
    /// that read the same input (Q/K/V, gate/up) share its quantized form, quantized once.
    pub(crate) fn matmul_shared(
        &self,
        acts: &mut SharedActs<'_>,
        y: &mut Vec<f32>,
    ) -> candle_core::Result<()> {
        match self {
            Self::Candle(m) => {
                *y = Self::candle_matmul(m, acts.x, acts.rows)?;
                Ok(())
            }
            Self::Own(w) => {
                w.matmul_into(Tier::detect(), acts, y);
                Ok(())
            }
        }
    }

    fn candle_matmul(m: &QMatMul, x: &[f32], rows: usize) -> candle_core::Result<Vec<f32>> {
        let k = x.len() / rows;
        let t = Tensor::from_slice(x, (rows, k), &Device::Cpu)?;
        m.forward(&t)?.flatten_all()?.to_vec1::<f32>()
    }
}

/// One matmul input (`rows` rows of `x`) and its quantized forms, made on first use by a weight
/// that reads them and reused by the next (ggml's Q8_0/Q8_1 blocks; ggml's Q8_K).
pub(crate) struct SharedActs<'x> {
    x: &'x [f32],
    rows: usize,
    q8: Option<Acts>,
    q8k: Option<Acts>,
}

impl<'x> SharedActs<'x> {
    pub(crate) fn new(x: &'x [f32], rows: usize) -> Self {
        Self {
            x,
            rows,
            q8: None,
            q8k: None,
        }
    }
}

/// A quantized matrix in the form our kernels read (still packed: Q4_1/Q5_0 keep their nibbles
/// and fifth bits, K-quants their GGUF super-blocks).
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
    /// Per block: scale `d`, fifth bits `qh` (bit `j` for value `j`), 16 bytes of nibbles
    /// (low = values 0..16, high = 16..32); value = `(nibble | fifth bit << 4) − 16`.
    Q5_0 {
        d: Vec<f32>,
        qh: Vec<u32>,
        qs: Vec<u8>,
    },
    /// Per block: scale `d`, 32 signed bytes.
    Q8_0 { d: Vec<f32>, qs: Vec<i8> },
    /// GGUF Q4_K super-blocks, as in the file.
    Q4K { blocks: Vec<u8> },
    /// GGUF Q6_K super-blocks, as in the file.
    Q6K { blocks: Vec<u8> },
}

/// Activation rows quantized to ggml's Q8_1 (Q8_0 is the same without the sum `s`).
struct Q8Rows {
    q: Vec<i8>,
    d: Vec<f32>,
    s: Vec<f32>,
    /// `d` and `s` of groups of [`BLOCK_T`] rows transposed (`[group][block][row in group]`,
    /// zero past the last row) for the AVX2 per-block kernel, which holds one output per row
    /// of a group in the lanes of one register; empty otherwise.
    dt: Vec<f32>,
    st: Vec<f32>,
    /// The same rows laid out for the VNNI tier's lanes tile ([`lanes_micro_vnni4`]); `None`
    /// otherwise.
    v4: Option<Vnni4Rows>,
}

/// Activation rows laid out for [`lanes_micro_vnni4`]: groups of [`V4`] rows, block-major
/// (`[group][block][row in group]`), zero past the last row, so that one pointer with constant
/// offsets reaches every row of a group.
struct Vnni4Rows {
    /// The signed values, [`QK`] per block.
    q: Vec<i8>,
    /// Per block, −128 × each of its eight four-value sums: the accumulator `vpdpbusd` starts
    /// from when it multiplies weights biased by +128 (as `u8`) with these signed values.
    init: Vec<i32>,
    /// The block scales.
    d: Vec<f32>,
}

/// Rows and weight rows of the VNNI tier's lanes tile ([`lanes_micro_vnni4`]).
const V4: usize = 4;
/// Rows from which a call runs the VNNI tier's 4 × 4 lanes tile: it re-lays out each tile's
/// weights per row block, which a few rows (decode steps) do not repay; those keep the 4 × 2
/// tile on the activations biased once per call.
const V4_MIN_ROWS: usize = 32;

impl Vnni4Rows {
    /// `rows` rows of `kb` blocks of `a` in the tile's layout.
    fn new(a: &Q8Rows, rows: usize, kb: usize) -> Self {
        let groups = rows.div_ceil(V4);
        let per = kb * V4;
        let (mut q, mut init, mut d) = (
            vec![0i8; groups * per * QK],
            vec![0i32; groups * per * LANES],
            vec![0f32; groups * per],
        );
        q.par_chunks_mut(per * QK)
            .zip(init.par_chunks_mut(per * LANES))
            .zip(d.par_chunks_mut(per))
            .enumerate()
            .with_min_len(16)
            .for_each(|(g, ((q, init), d))| {
                for t in 0..V4.min(rows - g * V4) {
                    let r = g * V4 + t;
                    for b in 0..kb {
                        let src = &a.q[(r * kb + b) * QK..][..QK];
                        let i = b * V4 + t;
                        q[i * QK..(i + 1) * QK].copy_from_slice(src);
                        for (o, four) in init[i * LANES..(i + 1) * LANES]
                            .iter_mut()
                            .zip(src.chunks_exact(4))
                        {
                            *o = -128 * four.iter().map(|&v| i32::from(v)).sum::<i32>();
                        }
                        d[i] = a.d[r * kb + b];
                    }
                }
            });
        Self { q, init, d }
    }
}

impl Q8Rows {
    /// Fills [`Q8Rows::dt`] and [`Q8Rows::st`] for `rows` rows of `kb` blocks.
    fn transpose_scales(&mut self, rows: usize, kb: usize) {
        let groups = rows.div_ceil(BLOCK_T);
        self.dt = vec![0f32; groups * kb * BLOCK_T];
        self.st = vec![0f32; groups * kb * BLOCK_T];
        for r in 0..rows {
            let (g, t) = (r / BLOCK_T, r % BLOCK_T);
            for b in 0..kb {
                self.dt[(g * kb + b) * BLOCK_T + t] = self.d[r * kb + b];
                self.st[(g * kb + b) * BLOCK_T + t] = self.s[r * kb + b];
            }
        }
    }
}

/// Activation rows quantized to ggml's Q8_K: per 256-value super-block a scale `d` and, per
/// 32-value sub-block, the sum of its values (ggml's pairwise sums of the 16-value `bsums`).
struct Q8KRows {
    q: Vec<i8>,
    d: Vec<f32>,
    sums: Vec<i16>,
}

/// A call's quantized activations.
enum Acts {
    Q8(Q8Rows),
    Q8K(Q8KRows),
}

/// ggml's x86 `quantize_row_q8_1` / `quantize_row_q8_0` for one row: d = max/127 rounded to
/// f16, values scaled by 127/max and rounded half to even, s = f16(d · Σq) (d before its f16
/// rounding).
#[inline(always)]
fn quantize_q8_row(x: &[f32], q: &mut [i8], ds: &mut [f32], ss: &mut [f32]) {
    for (((block, q), d_out), s_out) in x
        .chunks_exact(QK)
        .zip(q.chunks_exact_mut(QK))
        .zip(ds.iter_mut())
        .zip(ss.iter_mut())
    {
        let max = block.iter().fold(0f32, |m, v| m.max(v.abs()));
        let d = max / 127.0;
        let id = if max != 0.0 { 127.0 / max } else { 0.0 };
        let mut sum = 0i32;
        for (qv, &v) in q.iter_mut().zip(block) {
            let r = round_half_even(v * id);
            *qv = r as i8;
            sum += r;
        }
        *d_out = f16::from_f32(d).to_f32();
        *s_out = f16::from_f32(d * sum as f32).to_f32();
    }
}

/// ggml's `quantize_row_q8_K_ref` for one row: per super-block the signed value of largest
/// magnitude (the first one on ties), iscale = −127/max, values `min(127, round(iscale·x))`
/// half to even (ggml's `nearest_int`), d = 1/iscale; plus each 32-value sub-block's sum.
#[inline(always)]
fn quantize_q8k_row(x: &[f32], q: &mut [i8], ds: &mut [f32], sums: &mut [i16]) {
    for (((block, q), d_out), s_out) in x
        .chunks_exact(QK_K)
        .zip(q.chunks_exact_mut(QK_K))
        .zip(ds.iter_mut())
        .zip(sums.chunks_exact_mut(CHUNKS))
    {
        let (mut max, mut amax) = (0f32, 0f32);
        for &v in block {
            if v.abs() > amax {
                amax = v.abs();
                max = v;
            }
        }
        if amax == 0.0 {
            q.fill(0);
            s_out.fill(0);
            *d_out = 0.0;
            continue;
        }
        let iscale = -127.0 / max;
        for (qv, &v) in q.iter_mut().zip(block) {
            *qv = round_half_even(iscale * v).min(127) as i8;
        }
        for (s, c) in s_out.iter_mut().zip(q.chunks_exact(QK)) {
            *s = c.iter().map(|&v| i16::from(v)).sum();
        }
        *d_out = 1.0 / iscale;
    }
}

/// `x` rounded to the nearest integer, ties to even, for |x| ≤ 2²² (ggml's `nearest_int`: the
/// addition rounds away the fraction, the subtraction is exact) — the same as
/// `f32::round_ties_even`, without the libm call it becomes on baseline x86-64.
#[inline(always)]
fn round_half_even(x: f32) -> i32 {
    const MAGIC: f32 = 12_582_912.0; // 1.5 · 2²³
    ((x + MAGIC) - MAGIC) as i32
}

/// Rows from which the activations are quantized in parallel.
const PAR_QUANT_ROWS: usize = 8;

/// Quantizes `rows` rows of width `k` with `f`, in parallel for big calls.
#[inline(always)]
fn quantize_rows<S: Send + Copy + Default>(
    x: &[f32],
    rows: usize,
    (qb, db, sb): (usize, usize, usize),
    f: impl Fn(&[f32], &mut [i8], &mut [f32], &mut [S]) + Sync,
) -> (Vec<i8>, Vec<f32>, Vec<S>) {
    let k = x.len() / rows;
    let (mut q, mut d, mut s) = (
        vec![0i8; x.len()],
        vec![0f32; rows * k / db],
        vec![S::default(); rows * k / sb],
    );
    let _ = qb;
    if rows >= PAR_QUANT_ROWS {
        q.par_chunks_mut(k)
            .zip(d.par_chunks_mut(k / db))
            .zip(s.par_chunks_mut(k / sb))
            .zip(x.par_chunks(k))
            .for_each(|(((q, d), s), x)| f(x, q, d, s));
    } else {
        for (((q, d), s), x) in q
            .chunks_mut(k)
            .zip(d.chunks_mut(k / db))
            .zip(s.chunks_mut(k / sb))
            .zip(x.chunks(k))
        {
            f(x, q, d, s);
        }
    }
    (q, d, s)
}

/// All rows of a call in ggml's Q8_0/Q8_1 form (portable code; see [`OwnWeight::quantize`]).
#[inline(always)]
fn quantize_q8_generic(x: &[f32], rows: usize) -> Q8Rows {
    let (q, d, s) = quantize_rows(x, rows, (1, QK, QK), quantize_q8_row);
    Q8Rows {
        q,
        d,
        s,
        dt: Vec::new(),
        st: Vec::new(),
        v4: None,
    }
}

/// All rows of a call in ggml's Q8_K form.
#[inline(always)]
fn quantize_q8k_generic(x: &[f32], rows: usize) -> Q8KRows {
    let (q, d, sums) = quantize_rows(x, rows, (1, QK_K, QK), quantize_q8k_row);
    Q8KRows { q, d, sums }
}

/// Test helper: one call's Q8_0/Q8_1 activations with the portable code.
#[cfg(test)]
fn quantize_q8(x: &[f32]) -> Q8Rows {
    quantize_q8_generic(x, x.len() / QK)
}

/// The same with each row compiled for AVX2 (the rows run in closures on the rayon pool, which
/// do not inherit the caller's target features, so each calls a row function that has them).
///
/// # Safety
/// The CPU has AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[allow(unsafe_code)]
unsafe fn quantize_q8_avx2(x: &[f32], rows: usize) -> Q8Rows {
    #[target_feature(enable = "avx2,fma")]
    fn row(x: &[f32], q: &mut [i8], ds: &mut [f32], ss: &mut [f32]) {
        quantize_q8_row(x, q, ds, ss)
    }
    // SAFETY: the CPU has AVX2 and FMA (this function's contract).
    let (q, d, s) = quantize_rows(x, rows, (1, QK, QK), |x, q, d, s| unsafe {
        row(x, q, d, s)
    });
    Q8Rows {
        q,
        d,
        s,
        dt: Vec::new(),
        st: Vec::new(),
        v4: None,
    }
}

/// [`quantize_q8k_generic`] with each row compiled for AVX2 (see [`quantize_q8_avx2`]).
///
/// # Safety
/// The CPU has AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[allow(unsafe_code)]
unsafe fn quantize_q8k_avx2(x: &[f32], rows: usize) -> Q8KRows {
    #[target_feature(enable = "avx2,fma")]
    fn row(x: &[f32], q: &mut [i8], ds: &mut [f32], sums: &mut [i16]) {
        quantize_q8k_row(x, q, ds, sums)
    }
    // SAFETY: the CPU has AVX2 and FMA (this function's contract).
    let (q, d, sums) = quantize_rows(x, rows, (1, QK_K, QK), |x, q, d, s| unsafe {
        row(x, q, d, s)
    });
    Q8KRows { q, d, sums }
}

/// One column tile's K-quant weight rows, unpacked: values as bytes in value order (Q4_K
/// nibbles 0..15, Q6_K `q − 32`), per 32-value chunk the 16-bit scales of its two 16-value
/// halves (Q4_K: the chunk's 6-bit scale twice; Q6_K: the two 8-bit scales), per super-block
/// `d` (and for Q4_K `dmin` and the eight 6-bit mins).
struct KTile {
    vals: Vec<i8>,
    scales: Vec<i16>,
    d: Vec<f32>,
    dmin: Vec<f32>,
    mins: Vec<i16>,
}

/// ggml's `get_scale_min_k4`: scale and min of sub-block `j` from a Q4_K block's 12 bytes.
#[inline(always)]
fn scale_min_k4(j: usize, q: &[u8]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        (
            (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4),
            (q[j + 4] >> 4) | ((q[j] >> 6) << 4),
        )
    }
}

/// The 256 values of one Q4_K (`q4k`) or Q6_K super-block `b` in value order, portable code.
#[inline(always)]
fn unpack_k_values_generic(b: &[u8], q4k: bool, vals: &mut [i8]) {
    if q4k {
        for (q, v) in b[16..144].chunks_exact(QK).zip(vals.chunks_exact_mut(64)) {
            let (lo, hi) = v.split_at_mut(QK);
            for ((l, h), &byte) in lo.iter_mut().zip(hi.iter_mut()).zip(q) {
                *l = (byte & 0xF) as i8;
                *h = (byte >> 4) as i8;
            }
        }
    } else {
        for n in 0..2 {
            let (ql, qh) = (&b[64 * n..64 * n + 64], &b[128 + 32 * n..160 + 32 * n]);
            let v = &mut vals[128 * n..128 * n + 128];
            for l in 0..32 {
                let h = qh[l];
                v[l] = ((ql[l] & 0xF) | ((h & 3) << 4)) as i8 - 32;
                v[l + 32] = ((ql[l + 32] & 0xF) | (((h >> 2) & 3) << 4)) as i8 - 32;
                v[l + 64] = ((ql[l] >> 4) | (((h >> 4) & 3) << 4)) as i8 - 32;
                v[l + 96] = ((ql[l + 32] >> 4) | (((h >> 6) & 3) << 4)) as i8 - 32;
            }
        }
    }
}

impl KTile {
    /// Unpacks weight rows `first..first + cols` of a Q4_K (`q4k`) or Q6_K matrix, with a given
    /// value unpacker (portable or SIMD; they give the same bytes).
    #[inline(always)]
    fn unpack_with(
        blocks: &[u8],
        q4k: bool,
        k: usize,
        first: usize,
        cols: usize,
        values: impl Fn(&[u8], bool, &mut [i8]),
    ) -> Self {
        let nsb = k / QK_K;
        let bytes = if q4k { Q4_K_BYTES } else { Q6_K_BYTES };
        let half_at = |b: &[u8], i: usize| f16::from_le_bytes([b[i], b[i + 1]]).to_f32();
        let mut t = Self {
            vals: vec![0; cols * k],
            scales: Vec::with_capacity(cols * k / 16),
            d: Vec::with_capacity(cols * nsb),
            dmin: Vec::with_capacity(if q4k { cols * nsb } else { 0 }),
            mins: Vec::with_capacity(if q4k { cols * nsb * CHUNKS } else { 0 }),
        };
        let src = &blocks[first * nsb * bytes..(first + cols) * nsb * bytes];
        for (b, vals) in src.chunks_exact(bytes).zip(t.vals.chunks_exact_mut(QK_K)) {
            values(b, q4k, vals);
            if q4k {
                t.d.push(half_at(b, 0));
                t.dmin.push(half_at(b, 2));
                for j in 0..CHUNKS {
                    let (scale, min) = scale_min_k4(j, &b[4..16]);
                    t.scales.extend([i16::from(scale); 2]);
                    t.mins.push(i16::from(min));
                }
            } else {
                t.d.push(half_at(b, 208));
                t.scales
                    .extend(b[192..208].iter().map(|&s| i16::from(s as i8)));
            }
        }
        t
    }

    /// The scale of value `u` of super-block `sb` in column `c`.
    #[inline(always)]
    fn scale(&self, c: usize, k: usize, sb: usize, u: usize) -> i16 {
        self.scales[c * k / 16 + sb * 16 + u / 16]
    }
}

impl OwnWeight {
    fn from_qtensor(t: &QTensor) -> candle_core::Result<Self> {
        let (n, k) = t.shape().dims2()?;
        let data = t.data()?;
        let (block_values, block_bytes) = match t.dtype() {
            GgmlDType::Q4_1 => (QK, Q4_1_BYTES),
            GgmlDType::Q5_0 => (QK, Q5_0_BYTES),
            GgmlDType::Q8_0 => (QK, Q8_0_BYTES),
            GgmlDType::Q4K => (QK_K, Q4_K_BYTES),
            GgmlDType::Q6K => (QK_K, Q6_K_BYTES),
            other => candle_core::bail!("no own kernel for {other:?}"),
        };
        if k % block_values != 0 {
            candle_core::bail!("row width {k} is not a multiple of {block_values}");
        }
        let nb = n * k / block_values;
        if data.len() != nb * block_bytes {
            candle_core::bail!(
                "tensor has {} bytes, expected {}",
                data.len(),
                nb * block_bytes
            );
        }
        let half_at = |b: &[u8], i: usize| f16::from_le_bytes([b[i], b[i + 1]]).to_f32();
        let kind = match t.dtype() {
            GgmlDType::Q5_0 => {
                let (mut d, mut qh, mut qs) = (
                    Vec::with_capacity(nb),
                    Vec::with_capacity(nb),
                    Vec::with_capacity(nb * 16),
                );
                for b in data.chunks_exact(Q5_0_BYTES) {
                    d.push(half_at(b, 0));
                    qh.push(u32::from_le_bytes([b[2], b[3], b[4], b[5]]));
                    qs.extend_from_slice(&b[6..22]);
                }
                Kind::Q5_0 { d, qh, qs }
            }
            GgmlDType::Q4_1 => {
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
            }
            GgmlDType::Q8_0 => {
                let (mut d, mut qs) = (Vec::with_capacity(nb), Vec::with_capacity(nb * QK));
                for b in data.chunks_exact(Q8_0_BYTES) {
                    d.push(half_at(b, 0));
                    qs.extend(b[2..34].iter().map(|&v| v as i8));
                }
                Kind::Q8_0 { d, qs }
            }
            GgmlDType::Q4K => Kind::Q4K {
                blocks: data.to_vec(),
            },
            _ => Kind::Q6K {
                blocks: data.to_vec(),
            },
        };
        Ok(Self { n, k, kind })
    }

    /// Weight row `col` as 8-bit values (Q4_1 nibbles widened, Q5_0 nibbles with their fifth
    /// bits minus 16, Q8_0 copied) into `out`, with the portable Q5_0 block unpacker.
    #[cfg(test)]
    fn unpack_row(&self, col: usize, out: &mut [i8]) {
        self.unpack_row_with(col, out, unpack_q5_0_generic, unpack_q4_1_generic);
    }

    /// [`Self::unpack_row`] with given Q5_0 and Q4_1 block unpackers (portable or SIMD; they
    /// give the same bytes).
    #[inline(always)]
    fn unpack_row_with(
        &self,
        col: usize,
        out: &mut [i8],
        q5_block: impl Fn(&[u8], u32, &mut [i8]),
        q4_block: impl Fn(&[u8], &mut [i8]),
    ) {
        let kb = self.k / QK;
        match &self.kind {
            Kind::Q4_1 { qs, .. } => {
                let src = &qs[col * kb * 16..(col + 1) * kb * 16];
                for (blk, dst) in src.chunks_exact(16).zip(out.chunks_exact_mut(QK)) {
                    q4_block(blk, dst);
                }
            }
            Kind::Q5_0 { qh, qs, .. } => {
                let src = &qs[col * kb * 16..(col + 1) * kb * 16];
                let hs = &qh[col * kb..(col + 1) * kb];
                for ((blk, &h), dst) in src.chunks_exact(16).zip(hs).zip(out.chunks_exact_mut(QK)) {
                    q5_block(blk, h, dst);
                }
            }
            Kind::Q8_0 { qs, .. } => out.copy_from_slice(&qs[col * self.k..(col + 1) * self.k]),
            Kind::Q4K { .. } | Kind::Q6K { .. } => {
                unreachable!("K-quant rows are unpacked by KTile")
            }
        }
    }

    /// Per-block scales of the 32-value block types.
    fn block_scales(&self) -> &[f32] {
        match &self.kind {
            Kind::Q4_1 { d, .. } | Kind::Q5_0 { d, .. } | Kind::Q8_0 { d, .. } => d,
            Kind::Q4K { .. } | Kind::Q6K { .. } => &[],
        }
    }

    /// Dot products of one unpacked weight row with activation rows `first..first + out.len()`
    /// (portable reference): per block, `fma_block` adds `(d_w·d_a)·lane` to eight lane
    /// accumulators (lane `j` = the exact integer sum of the block's products `4j..4j+4`) with
    /// one FMA each, or, in the per-block order, `(d_w·d_a)·Σq_w·q_a` to lane 0 (the other
    /// lanes stay 0); the lanes are then summed in `hsum_float_8`'s order, plus `Σ m_w·s_a` for
    /// Q4_1. `fma_block` is the portable or a SIMD version of the same exact operations, so
    /// every tier gives the same bits.
    #[inline(always)]
    fn dot_rows(
        &self,
        col: usize,
        w: &[i8],
        a: &Q8Rows,
        first: usize,
        out: &mut [f32],
        fma_block: impl Fn(&mut Lanes, f32, &[i8], &[i8], bool) + Copy,
    ) {
        let kb = self.k / QK;
        let wb = col * kb;
        let dw = &self.block_scales()[wb..wb + kb];
        let lanes = self.lanes_order();
        // Four activation rows at a time: four independent accumulators hide the FMA latency
        // and share each weight block load; each row's own operations and their order are
        // unchanged. Leftover rows go one at a time.
        let full = out.len() / ROW_GROUP * ROW_GROUP;
        let (grouped, rest) = out.split_at_mut(full);
        for (g, group) in grouped.chunks_exact_mut(ROW_GROUP).enumerate() {
            let acc =
                group_lanes::<ROW_GROUP>(first + g * ROW_GROUP, kb, w, dw, a, fma_block, lanes);
            for (o, l) in group.iter_mut().zip(&acc) {
                *o = hsum_lanes(l);
            }
        }
        for (i, o) in rest.iter_mut().enumerate() {
            let [acc] = group_lanes::<1>(first + full + i, kb, w, dw, a, fma_block, lanes);
            *o = hsum_lanes(&acc);
        }
        self.add_min_terms(col, a, first, out);
    }

    /// Q4_1's `+ Σ m_w·s_a` (summed block by block after the scaled products), for activation
    /// rows `first..first + out.len()`; nothing for the other types.
    #[inline(always)]
    fn add_min_terms(&self, col: usize, a: &Q8Rows, first: usize, out: &mut [f32]) {
        let kb = self.k / QK;
        let wb = col * kb;
        if let Kind::Q4_1 { m, .. } = &self.kind {
            let mw = &m[wb..wb + kb];
            for (r, o) in out.iter_mut().enumerate() {
                let ar = first + r;
                let mut summs = 0f32;
                for (m, s) in mw.iter().zip(&a.s[ar * kb..(ar + 1) * kb]) {
                    summs += m * s;
                }
                *o += summs;
            }
        }
    }

    /// Whether blocks accumulate in ggml's AVX2 lanes order (`true`) or per block (see the
    /// module doc for why Q4_1 keeps the per-block order).
    fn lanes_order(&self) -> bool {
        !matches!(self.kind, Kind::Q4_1 { .. })
    }

    /// One tile of output columns of a 32-value block type, one weight row at a time, with a
    /// given block kernel and Q5_0 block unpacker (the portable reference, and the Q4_1 path of
    /// every tier). `out` is `[rows][cols]` for activation rows `first..first + rows`. Q8_0
    /// rows are used in place; the others are unpacked once per column and then meet every
    /// activation row.
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    fn tile_by_column(
        &self,
        first_col: usize,
        a: &Q8Rows,
        first: usize,
        rows: usize,
        out: &mut [f32],
        fma_block: impl Fn(&mut Lanes, f32, &[i8], &[i8], bool) + Copy,
        q5_block: impl Fn(&[u8], u32, &mut [i8]) + Copy,
        q4_block: impl Fn(&[u8], &mut [i8]) + Copy,
    ) {
        let cols = out.len() / rows;
        let mut buf = vec![0i8; self.k];
        let mut vals = vec![0f32; rows];
        for c in 0..cols {
            let col = first_col + c;
            let w: &[i8] = match &self.kind {
                Kind::Q8_0 { qs, .. } => &qs[col * self.k..(col + 1) * self.k],
                _ => {
                    self.unpack_row_with(col, &mut buf, q5_block, q4_block);
                    &buf
                }
            };
            self.dot_rows(col, w, a, first, &mut vals, fma_block);
            for (r, &v) in vals.iter().enumerate() {
                out[r * cols + c] = v;
            }
        }
    }

    /// One tile of K-quant output columns, portable code: per (row, column) and super-block,
    /// eight exact integer lanes (lane `j`: Σ over the chunks of scale · Σ of products
    /// `4j..4j+4`), one FMA each into the lane accumulators; for Q4_K the four min lanes too.
    fn tile_k_generic(
        &self,
        first_col: usize,
        a: &Q8KRows,
        first: usize,
        rows: usize,
        out: &mut [f32],
    ) {
        let (blocks, q4k) = match &self.kind {
            Kind::Q4K { blocks } => (blocks, true),
            Kind::Q6K { blocks } => (blocks, false),
            _ => unreachable!("K-quant tile on a block type"),
        };
        let (k, nsb) = (self.k, self.k / QK_K);
        let cols = out.len() / rows;
        let t = KTile::unpack_with(blocks, q4k, k, first_col, cols, unpack_k_values_generic);
        for c in 0..cols {
            let wv = &t.vals[c * k..(c + 1) * k];
            for r in 0..rows {
                let ar = first + r;
                let av = &a.q[ar * k..(ar + 1) * k];
                let (mut acc, mut acc_m) = ([0f32; LANES], [0f32; 4]);
                for sb in 0..nsb {
                    let mut sumi = [0i32; LANES];
                    for (u, (&w, &x)) in wv[sb * QK_K..(sb + 1) * QK_K]
                        .iter()
                        .zip(&av[sb * QK_K..(sb + 1) * QK_K])
                        .enumerate()
                    {
                        let s = t.scale(c, k, sb, u);
                        sumi[(u % QK) / 4] += i32::from(s) * i32::from(w) * i32::from(x);
                    }
                    let da = a.d[ar * nsb + sb];
                    let d = da * t.d[c * nsb + sb];
                    for (l, &s) in acc.iter_mut().zip(&sumi) {
                        *l = d.mul_add(s as f32, *l);
                    }
                    if q4k {
                        let dmin = -da * t.dmin[c * nsb + sb];
                        let m = &t.mins[(c * nsb + sb) * CHUNKS..][..CHUNKS];
                        let s = &a.sums[(ar * nsb + sb) * CHUNKS..][..CHUNKS];
                        for (j, l) in acc_m.iter_mut().enumerate() {
                            let prod = i32::from(m[2 * j]) * i32::from(s[2 * j])
                                + i32::from(m[2 * j + 1]) * i32::from(s[2 * j + 1]);
                            *l = dmin.mul_add(prod as f32, *l);
                        }
                    }
                }
                let mut v = hsum_lanes(&acc);
                if q4k {
                    v += (acc_m[0] + acc_m[2]) + (acc_m[1] + acc_m[3]);
                }
                out[r * cols + c] = v;
            }
        }
    }

    /// The portable tile (the reference every SIMD tier must match bit for bit).
    fn tile_generic(&self, first_col: usize, a: &Acts, first: usize, rows: usize, out: &mut [f32]) {
        match a {
            Acts::Q8(a) => self.tile_by_column(
                first_col,
                a,
                first,
                rows,
                out,
                fma_block_generic,
                unpack_q5_0_generic,
                unpack_q4_1_generic,
            ),
            Acts::Q8K(a) => self.tile_k_generic(first_col, a, first, rows, out),
        }
    }

    /// The tile with AVX2 kernels (`vpmaddubsw` + `vpmaddwd` + `vfmadd`, as ggml's x86 code):
    /// Q5_0/Q8_0 and the K-quants in register tiles, Q4_1 one weight row at a time.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma")]
    fn tile_avx2(&self, first_col: usize, a: &Acts, first: usize, rows: usize, out: &mut [f32]) {
        let k = self.k;
        let cols = out.len() / rows;
        match (&self.kind, a) {
            // A K-quant weight row is unpacked in registers, chunk by chunk, for each group of
            // four activation rows (ggml's unpacking; it costs a fraction of the four rows'
            // products). Unpacking whole tiles into memory first was measured slower: the weight
            // stream from memory then alternates with compute-only phases instead of
            // overlapping them.
            (Kind::Q4K { blocks } | Kind::Q6K { blocks }, Acts::Q8K(a)) => {
                let q4k = matches!(self.kind, Kind::Q4K { .. });
                let row_bytes = blocks.len() / self.n;
                for c in 0..cols {
                    let col = first_col + c;
                    let w = &blocks[col * row_bytes..(col + 1) * row_bytes];
                    if q4k {
                        k_tile_avx2::<true>(w, a, first, rows, k, out, c);
                    } else {
                        k_tile_avx2::<false>(w, a, first, rows, k, out, c);
                    }
                }
            }
            (Kind::Q4_1 { .. }, Acts::Q8(a)) => {
                self.block_tile_avx2(first_col, a, first, rows, out)
            }
            // Decode-sized calls (memory-bound) keep one weight row at a time, each unpacked
            // right before use: unpacking a whole tile first cost ~15% of Qwen's decode speed.
            (_, Acts::Q8(a)) if rows < LANES_R => self.tile_by_column(
                first_col,
                a,
                first,
                rows,
                out,
                |acc, d, w, x, f| fma_block_avx2(acc, d, w, x, f),
                |qs, qh, dst| unpack_q5_0_avx2(qs, qh, dst),
                |qs, dst| unpack_q4_1_avx2(qs, dst),
            ),
            (_, Acts::Q8(a)) => self.lanes_tile_avx2(first_col, a, first, rows, out),
            (_, Acts::Q8K(_)) => unreachable!("Q8_K activations for a block type"),
        }
    }

    /// The tile's weight rows as bytes, unpacked once (Q8_0 rows in place) into `buf`.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma")]
    fn tile_rows_avx2<'a>(
        &'a self,
        first_col: usize,
        cols: usize,
        buf: &'a mut Vec<i8>,
    ) -> &'a [i8] {
        let k = self.k;
        if let Kind::Q8_0 { qs, .. } = &self.kind {
            return &qs[first_col * k..(first_col + cols) * k];
        }
        buf.clear();
        buf.resize(cols * k, 0);
        for (c, dst) in buf.chunks_exact_mut(k).enumerate() {
            self.unpack_row_with(
                first_col + c,
                dst,
                |qs, qh, dst| unpack_q5_0_avx2(qs, qh, dst),
                |qs, dst| unpack_q4_1_avx2(qs, dst),
            );
        }
        buf
    }

    /// Q5_0 / Q8_0 (lanes order) in register tiles of [`LANES_R`] activation rows ×
    /// [`LANES_C`] weight rows ([`lanes_micro`]): each weight block load feeds four rows, each
    /// activation block load two weight rows. The tile's weight rows are unpacked once; the
    /// activation rows of a tile stay in L1 while it passes over the tile's weight rows. `aq`:
    /// the activation bytes the tier `I` reads (the signed values, or biased for VNNI).
    ///
    /// # Safety
    /// The CPU has AVX2, FMA and whatever `I`'s operations enable (the caller's tier).
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    #[allow(unsafe_code, clippy::too_many_arguments)]
    unsafe fn lanes_tile_with<I: BlockInts>(
        &self,
        first_col: usize,
        aq_all: &[I::Act],
        a: &Q8Rows,
        first: usize,
        rows: usize,
        out: &mut [f32],
    ) {
        let (k, kb) = (self.k, self.k / QK);
        let cols = out.len() / rows;
        let mut buf = Vec::new();
        // SAFETY: the caller's CPU has AVX2 and FMA (this function's contract).
        let w = unsafe { self.tile_rows_avx2(first_col, cols, &mut buf) };
        let dw = &self.block_scales()[first_col * kb..(first_col + cols) * kb];
        let mut dp = Vec::new();
        let mut r = 0;
        while r < rows {
            let nr = LANES_R.min(rows - r);
            let ar = first + r;
            let (aq, ad) = (
                &aq_all[ar * k..(ar + nr) * k],
                &a.d[ar * kb..(ar + nr) * kb],
            );
            let mut c = 0;
            while c < cols {
                let nc = LANES_C.min(cols - c);
                let (wc, dc) = (&w[c * k..(c + nc) * k], &dw[c * kb..(c + nc) * kb]);
                macro_rules! run {
                    ($r:literal, $c:literal) => {{
                        // SAFETY: as above (this function's contract).
                        let v = unsafe { lanes_micro::<I, $r, $c>(wc, dc, aq, ad, kb, &mut dp) };
                        for (ci, col) in v.iter().enumerate() {
                            for (ri, &x) in col.iter().enumerate() {
                                out[(r + ri) * cols + c + ci] = x;
                            }
                        }
                    }};
                }
                match (nr, nc) {
                    (4, 2) => run!(4, 2),
                    (4, _) => run!(4, 1),
                    (3, 2) => run!(3, 2),
                    (3, _) => run!(3, 1),
                    (2, 2) => run!(2, 2),
                    (2, _) => run!(2, 1),
                    (_, 2) => run!(1, 2),
                    _ => run!(1, 1),
                }
                c += nc;
            }
            r += nr;
        }
    }

    /// [`Self::lanes_tile_with`] on AVX2 (`vpmaddubsw` + `vpmaddwd`).
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma")]
    #[allow(unsafe_code)]
    fn lanes_tile_avx2(
        &self,
        first_col: usize,
        a: &Q8Rows,
        first: usize,
        rows: usize,
        out: &mut [f32],
    ) {
        // SAFETY: this function is compiled for (and only called on) AVX2 + FMA.
        unsafe { self.lanes_tile_with::<Avx2Ints>(first_col, &a.q, a, first, rows, out) }
    }

    /// [`Self::lanes_tile_with`] on AVX-512 VNNI (`vpdpbusd` on the biased activations).
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma")]
    #[allow(unsafe_code, clippy::too_many_arguments)]
    fn lanes_tile_vnni(
        &self,
        first_col: usize,
        a: &Q8Rows,
        biased: &[u8],
        first: usize,
        rows: usize,
        out: &mut [f32],
    ) {
        // SAFETY: this function is compiled for (and only called on) the VNNI tier's features.
        unsafe { self.lanes_tile_with::<VnniInts>(first_col, biased, a, first, rows, out) }
    }

    /// Q5_0 / Q8_0 (lanes order) on AVX-512 VNNI in register tiles of [`V4`] activation rows ×
    /// [`V4`] weight rows ([`lanes_micro_vnni4`], sixteen accumulators: the tier has 32 vector
    /// registers). The tile's weight rows are unpacked once, biased by +128 and laid out
    /// block-major per group of four; the activations come laid out the same way
    /// ([`Q8Rows::v4`]).
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma")]
    #[allow(unsafe_code)]
    fn lanes_tile_vnni4(
        &self,
        first_col: usize,
        a: &Q8Rows,
        first: usize,
        rows: usize,
        out: &mut [f32],
    ) {
        let v =
            a.v4.as_ref()
                .expect("the VNNI lanes tile reads activations laid out for it");
        use std::arch::x86_64::{
            __m256i, _mm256_loadu_si256, _mm256_set1_epi8, _mm256_storeu_si256, _mm256_xor_si256,
        };
        let kb = self.k / QK;
        let per = kb * V4;
        let cols = out.len() / rows;
        let col_groups = cols.div_ceil(V4);
        // w[((g·kb + b)·4 + c)·32 ..]: block b of column 4g + c, as the bytes of `u8` =
        // value + 128 (unpacked or copied straight into place, then flipped in place).
        let mut w = vec![0i8; col_groups * per * QK];
        let mut dw = vec![0f32; col_groups * per];
        let scales = self.block_scales();
        let flip = _mm256_set1_epi8(0x80u8 as i8);
        for c in 0..cols {
            let col = first_col + c;
            let (g, t) = (c / V4, c % V4);
            for b in 0..kb {
                let i = (g * kb + b) * V4 + t;
                let dst = &mut w[i * QK..(i + 1) * QK];
                let src = col * kb + b;
                match &self.kind {
                    Kind::Q8_0 { qs, .. } => dst.copy_from_slice(&qs[src * QK..(src + 1) * QK]),
                    Kind::Q5_0 { qh, qs, .. } => {
                        unpack_q5_0_avx2(&qs[src * 16..(src + 1) * 16], qh[src], dst)
                    }
                    _ => unreachable!("lanes tile on another type"),
                }
                // SAFETY: `dst` holds 32 bytes; `loadu`/`storeu` have no alignment requirement.
                unsafe {
                    let v = _mm256_loadu_si256(dst.as_ptr().cast::<__m256i>());
                    _mm256_storeu_si256(
                        dst.as_mut_ptr().cast::<__m256i>(),
                        _mm256_xor_si256(v, flip),
                    );
                }
                dw[i] = scales[src];
            }
        }
        debug_assert!(first.is_multiple_of(V4));
        let mut dp = vec![0f32; kb * V4 * V4];
        for r in (0..rows).step_by(V4) {
            let nr = V4.min(rows - r);
            let g = (first + r) / V4;
            let (aq, ai, ad) = (
                &v.q[g * per * QK..(g + 1) * per * QK],
                &v.init[g * per * LANES..(g + 1) * per * LANES],
                &v.d[g * per..(g + 1) * per],
            );
            for cg in 0..col_groups {
                let nc = V4.min(cols - cg * V4);
                // SAFETY: this function is compiled for (and only called on) the VNNI tier's
                // features, which are the kernel's.
                let res = unsafe {
                    lanes_micro_vnni4(
                        &w[cg * per * QK..(cg + 1) * per * QK],
                        &dw[cg * per..(cg + 1) * per],
                        aq,
                        ai,
                        ad,
                        kb,
                        &mut dp,
                    )
                };
                for (ci, col) in res.iter().enumerate().take(nc) {
                    for (ri, &x) in col.iter().enumerate().take(nr) {
                        out[(r + ri) * cols + cg * V4 + ci] = x;
                    }
                }
            }
        }
    }

    /// Q4_1 (per-block order): groups of [`BLOCK_T`] activation rows against one weight row at
    /// a time ([`block_micro`], one row per lane, so each per-block float step is one vector
    /// operation for eight rows and eight independent chains); leftover rows one at a time
    /// ([`BlockInts::block_row`]). The tile's weight rows are unpacked once.
    ///
    /// # Safety
    /// The CPU has AVX2, FMA and whatever `I`'s operations enable (the caller's tier).
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    #[allow(unsafe_code)]
    unsafe fn block_tile_with<I: BlockInts>(
        &self,
        first_col: usize,
        a: &Q8Rows,
        first: usize,
        rows: usize,
        out: &mut [f32],
    ) {
        let Kind::Q4_1 { d, m, .. } = &self.kind else {
            unreachable!("per-block tile on another type")
        };
        let (k, kb) = (self.k, self.k / QK);
        let cols = out.len() / rows;
        let mut buf = Vec::new();
        // SAFETY: the caller's CPU has AVX2 and FMA (this function's contract).
        let w = unsafe { self.tile_rows_avx2(first_col, cols, &mut buf) };
        let grouped = if a.dt.is_empty() {
            0
        } else {
            rows / BLOCK_T * BLOCK_T
        };
        debug_assert!(grouped == 0 || first.is_multiple_of(BLOCK_T));
        for g in (0..grouped).step_by(BLOCK_T) {
            let ar = first + g;
            let gi = ar / BLOCK_T;
            let (dt, st) = (
                &a.dt[gi * kb * BLOCK_T..(gi + 1) * kb * BLOCK_T],
                &a.st[gi * kb * BLOCK_T..(gi + 1) * kb * BLOCK_T],
            );
            let aq = &a.q[ar * k..(ar + BLOCK_T) * k];
            for c in 0..cols {
                let col = first_col + c;
                // SAFETY: as above (this function's contract).
                let v = unsafe {
                    block_micro::<I>(
                        &w[c * k..(c + 1) * k],
                        &d[col * kb..(col + 1) * kb],
                        &m[col * kb..(col + 1) * kb],
                        aq,
                        dt,
                        st,
                        kb,
                    )
                };
                for (t, &x) in v.iter().enumerate() {
                    out[(g + t) * cols + c] = x;
                }
            }
        }
        let rest = rows - grouped;
        if rest > 0 {
            let mut vals = vec![0f32; rest];
            for c in 0..cols {
                let col = first_col + c;
                let dw = &d[col * kb..(col + 1) * kb];
                for (i, v) in vals.iter_mut().enumerate() {
                    let ar = first + grouped + i;
                    let aq = &a.q[ar * k..(ar + 1) * k];
                    // SAFETY: as above (this function's contract).
                    *v = unsafe {
                        I::block_row(&w[c * k..(c + 1) * k], dw, aq, &a.d[ar * kb..(ar + 1) * kb])
                    };
                }
                self.add_min_terms(col, a, first + grouped, &mut vals);
                for (i, &v) in vals.iter().enumerate() {
                    out[(grouped + i) * cols + c] = v;
                }
            }
        }
    }

    /// [`Self::block_tile_with`] on AVX2.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma")]
    #[allow(unsafe_code)]
    fn block_tile_avx2(
        &self,
        first_col: usize,
        a: &Q8Rows,
        first: usize,
        rows: usize,
        out: &mut [f32],
    ) {
        // SAFETY: this function is compiled for (and only called on) AVX2 + FMA.
        unsafe { self.block_tile_with::<Avx2Ints>(first_col, a, first, rows, out) }
    }

    /// [`Self::block_tile_with`] on AVX-512 VNNI.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma")]
    #[allow(unsafe_code)]
    fn block_tile_vnni(
        &self,
        first_col: usize,
        a: &Q8Rows,
        first: usize,
        rows: usize,
        out: &mut [f32],
    ) {
        // SAFETY: this function is compiled for (and only called on) the VNNI tier's features.
        unsafe { self.block_tile_with::<VnniInts>(first_col, a, first, rows, out) }
    }

    /// The tile with AVX-512 VNNI kernels: the same exact integer sums as the AVX2 tier, each
    /// from `vpdpbusd` on 64 bytes (two 32-value blocks or chunks) instead of `vpmaddubsw` +
    /// `vpmaddwd` on 32, and for K-quants the 16-bit scales applied by `vpdpwssd`; the float
    /// steps (conversions, FMAs, horizontal sums) are the AVX2 tier's, in its order, so the
    /// results are bit-identical. `biased` holds the activation bytes `+ 128` (as `u8`) for
    /// the types with signed weights (Q5_0, Q8_0, Q6_K; see [`lanes_micro_vnni`]), empty
    /// otherwise.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma")]
    #[allow(clippy::too_many_arguments)]
    fn tile_avx512(
        &self,
        first_col: usize,
        a: &Acts,
        biased: &[u8],
        first: usize,
        rows: usize,
        out: &mut [f32],
    ) {
        let k = self.k;
        let cols = out.len() / rows;
        let put = |out: &mut [f32], c: usize, r0: usize, v: &[f32]| {
            for (i, &v) in v.iter().enumerate() {
                out[(r0 + i) * cols + c] = v;
            }
        };
        match (&self.kind, a) {
            // Prefill-sized calls: the AVX2 tier's register tiles with `vpdpbusd` lanes.
            (Kind::Q4_1 { .. }, Acts::Q8(a)) if rows >= BLOCK_T => {
                self.block_tile_vnni(first_col, a, first, rows, out)
            }
            // (Laid out for the 4 × 4 tile when the whole call has at least `V4_MIN_ROWS` rows:
            // a row block's remainder may have fewer.)
            (Kind::Q5_0 { .. } | Kind::Q8_0 { .. }, Acts::Q8(a)) if a.v4.is_some() => {
                self.lanes_tile_vnni4(first_col, a, first, rows, out)
            }
            (Kind::Q5_0 { .. } | Kind::Q8_0 { .. }, Acts::Q8(a)) if rows >= LANES_R => {
                self.lanes_tile_vnni(first_col, a, biased, first, rows, out)
            }
            // Decode-sized Q8_0 calls (the weights read in place, memory-bound): the AVX2 tier's
            // one-row kernel, measured faster here than `vpdpbusd` on 64 bytes (one row of an
            // 8192 × 896 matrix, three alternations on a 2-vCPU AVX-512 EPYC: 28.7 / 29.5 / 36.5
            // against 26.1 / 25.7 / 28.2 GMAC/s).
            (Kind::Q8_0 { .. }, Acts::Q8(_)) if rows < LANES_R => {
                self.tile_avx2(first_col, a, first, rows, out)
            }
            (Kind::Q4K { blocks } | Kind::Q6K { blocks }, Acts::Q8K(a)) => {
                let q4k = matches!(self.kind, Kind::Q4K { .. });
                let row_bytes = blocks.len() / self.n;
                for c in 0..cols {
                    let col = first_col + c;
                    let w = &blocks[col * row_bytes..(col + 1) * row_bytes];
                    macro_rules! run {
                        ($q4k:literal) => {{
                            let mut r = 0;
                            while r + ROW_GROUP <= rows {
                                let v = k_micro_vnni::<ROW_GROUP, $q4k>(w, a, biased, first + r, k);
                                put(out, c, r, &v);
                                r += ROW_GROUP;
                            }
                            match rows - r {
                                3 => put(
                                    out,
                                    c,
                                    r,
                                    &k_micro_vnni::<3, $q4k>(w, a, biased, first + r, k),
                                ),
                                2 => put(
                                    out,
                                    c,
                                    r,
                                    &k_micro_vnni::<2, $q4k>(w, a, biased, first + r, k),
                                ),
                                1 => put(
                                    out,
                                    c,
                                    r,
                                    &k_micro_vnni::<1, $q4k>(w, a, biased, first + r, k),
                                ),
                                _ => {}
                            }
                        }};
                    }
                    if q4k { run!(true) } else { run!(false) }
                }
            }
            (Kind::Q4_1 { d, .. }, Acts::Q8(a)) => {
                let kb = k / QK;
                let mut buf = vec![0i8; k];
                let mut vals = vec![0f32; rows];
                for c in 0..cols {
                    let col = first_col + c;
                    self.unpack_row_with(
                        col,
                        &mut buf,
                        |qs, qh, dst| unpack_q5_0_avx2(qs, qh, dst),
                        |qs, dst| unpack_q4_1_avx2(qs, dst),
                    );
                    let dw = &d[col * kb..(col + 1) * kb];
                    for (r, v) in vals.iter_mut().enumerate() {
                        let ar = first + r;
                        let aq = &a.q[ar * k..(ar + 1) * k];
                        *v = block_order_row_vnni(&buf, dw, aq, &a.d[ar * kb..(ar + 1) * kb]);
                    }
                    self.add_min_terms(col, a, first, &mut vals);
                    put(out, c, 0, &vals);
                }
            }
            (Kind::Q5_0 { .. } | Kind::Q8_0 { .. }, Acts::Q8(a)) => {
                let kb = k / QK;
                let mut buf = vec![0i8; k];
                for c in 0..cols {
                    let col = first_col + c;
                    let w: &[i8] = match &self.kind {
                        Kind::Q8_0 { qs, .. } => &qs[col * k..(col + 1) * k],
                        _ => {
                            self.unpack_row_with(
                                col,
                                &mut buf,
                                |qs, qh, dst| unpack_q5_0_avx2(qs, qh, dst),
                                |qs, dst| unpack_q4_1_avx2(qs, dst),
                            );
                            &buf
                        }
                    };
                    let dw = &self.block_scales()[col * kb..(col + 1) * kb];
                    let mut r = 0;
                    while r + ROW_GROUP <= rows {
                        let v = lanes_micro_vnni::<ROW_GROUP>(w, dw, a, biased, first + r, k);
                        put(out, c, r, &v);
                        r += ROW_GROUP;
                    }
                    match rows - r {
                        3 => put(
                            out,
                            c,
                            r,
                            &lanes_micro_vnni::<3>(w, dw, a, biased, first + r, k),
                        ),
                        2 => put(
                            out,
                            c,
                            r,
                            &lanes_micro_vnni::<2>(w, dw, a, biased, first + r, k),
                        ),
                        1 => put(
                            out,
                            c,
                            r,
                            &lanes_micro_vnni::<1>(w, dw, a, biased, first + r, k),
                        ),
                        _ => {}
                    }
                }
            }
            _ => unreachable!("activation form does not match the weight type"),
        }
    }

    /// Whether the VNNI tier reads the activations biased by 128 (signed weight values).
    fn needs_biased_acts(&self) -> bool {
        matches!(
            self.kind,
            Kind::Q5_0 { .. } | Kind::Q8_0 { .. } | Kind::Q6K { .. }
        )
    }

    /// Runs one tile with the widest instruction set the CPU has. Integer sums are exact, each
    /// lane's FMA is one correctly rounded operation in every tier and the float operations
    /// happen in the same order, so all tiers give bit-identical results (tested).
    #[allow(unsafe_code, clippy::too_many_arguments)]
    fn tile(
        &self,
        tier: Tier,
        first_col: usize,
        a: &Acts,
        biased: &[u8],
        first: usize,
        rows: usize,
        out: &mut [f32],
    ) {
        match tier {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: a `Tier::Avx512` value only exists after `is_x86_feature_detected!`
            // confirmed every feature `tile_avx512` enables (`Tier::supported`); it has no
            // other precondition.
            Tier::Avx512 => unsafe { self.tile_avx512(first_col, a, biased, first, rows, out) },
            #[cfg(target_arch = "x86_64")]
            // SAFETY: as above, for AVX2 and FMA.
            Tier::Avx2 => unsafe { self.tile_avx2(first_col, a, first, rows, out) },
            _ => self.tile_generic(first_col, a, first, rows, out),
        }
    }

    /// Quantizes a call's activation rows for this weight type (the tiers give the same bytes:
    /// the SIMD ones only compile the same code with rounding instructions available).
    #[allow(unsafe_code)]
    fn quantize(&self, tier: Tier, x: &[f32], rows: usize) -> Acts {
        let k_quant = matches!(self.kind, Kind::Q4K { .. } | Kind::Q6K { .. });
        match tier {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: both tiers are only chosen after `is_x86_feature_detected!` confirmed
            // AVX2 and FMA; the functions have no other precondition.
            Tier::Avx2 | Tier::Avx512 => unsafe {
                if k_quant {
                    Acts::Q8K(quantize_q8k_avx2(x, rows))
                } else {
                    Acts::Q8(quantize_q8_avx2(x, rows))
                }
            },
            _ if k_quant => Acts::Q8K(quantize_q8k_generic(x, rows)),
            _ => Acts::Q8(quantize_q8_generic(x, rows)),
        }
    }

    fn matmul_with(&self, tier: Tier, x: &[f32], rows: usize) -> Vec<f32> {
        let mut y = Vec::new();
        self.matmul_into(tier, &mut SharedActs::new(x, rows), &mut y);
        y
    }

    /// `y = x · Wᵀ` for the input of `acts`, quantized there if no earlier weight did (the same
    /// bytes whichever weight quantizes them; the tier-specific layouts below are added once).
    fn matmul_into(&self, tier: Tier, acts: &mut SharedActs<'_>, y: &mut Vec<f32>) {
        let (x, rows) = (acts.x, acts.rows);
        debug_assert_eq!(x.len(), rows * self.k);
        let n = self.n;
        let slot = if matches!(self.kind, Kind::Q4K { .. } | Kind::Q6K { .. }) {
            &mut acts.q8k
        } else {
            &mut acts.q8
        };
        let a = slot.get_or_insert_with(|| self.quantize(tier, x, rows));
        #[cfg(target_arch = "x86_64")]
        if let (Tier::Avx2 | Tier::Avx512, Kind::Q4_1 { .. }, Acts::Q8(q)) =
            (tier, &self.kind, &mut *a)
            && rows >= BLOCK_T
            && q.dt.is_empty()
        {
            q.transpose_scales(rows, self.k / QK);
        }
        // The VNNI tier's 4 × 4 lanes tile (Q5_0, Q8_0, prefill-sized calls) reads its own
        // layout; smaller calls keep the 4 × 2 tile on biased activations.
        #[cfg(target_arch = "x86_64")]
        let v4 = if let (Tier::Avx512, Kind::Q5_0 { .. } | Kind::Q8_0 { .. }, Acts::Q8(q)) =
            (tier, &self.kind, &mut *a)
            && rows >= V4_MIN_ROWS
        {
            if q.v4.is_none() {
                q.v4 = Some(Vnni4Rows::new(q, rows, self.k / QK));
            }
            true
        } else {
            false
        };
        let a = &*a;
        #[cfg(target_arch = "x86_64")]
        let biased: Vec<u8> = if tier == Tier::Avx512 && self.needs_biased_acts() && !v4 {
            let q = match a {
                Acts::Q8(a) => &a.q,
                Acts::Q8K(a) => &a.q,
            };
            q.iter().map(|&v| v as u8 ^ 0x80).collect()
        } else {
            Vec::new()
        };
        #[cfg(not(target_arch = "x86_64"))]
        let biased: Vec<u8> = Vec::new();
        let ct = match self.kind {
            Kind::Q4K { .. } | Kind::Q6K { .. } => KCOL_TILE,
            _ => COL_TILE,
        };
        // Row blocks that stay in L2 while all column tiles pass over them; each tile unpacks
        // its weight rows once per row block and meets every row of the block.
        // (A multiple of `BLOCK_T`, so that every row block starts a group of the transposed
        // scales; also a multiple of `ROW_GROUP`.)
        let block_rows = (ROW_BLOCK_BYTES / self.k / BLOCK_T * BLOCK_T).max(BLOCK_T);
        if rows == 1 {
            // One row: the tiles' `[1][cols]` layout is the output's.
            y.clear();
            y.resize(n, 0.0);
            y.par_chunks_mut(ct)
                .enumerate()
                .for_each(|(t, out)| self.tile(tier, t * ct, a, &biased, 0, 1, out));
            return;
        }
        // Each column tile of a row block fills its `[nr][cols]` outputs in a buffer of its
        // thread's (hot in cache) and copies them straight into the rows of `y`: every output
        // is written exactly once, so `y` needs no zeroing and no second pass.
        y.clear();
        y.reserve(rows * n);
        let dst = OutPtr(y.as_mut_ptr());
        let tiles = n.div_ceil(ct);
        for first in (0..rows).step_by(block_rows) {
            let nr = block_rows.min(rows - first);
            (0..tiles)
                .into_par_iter()
                .for_each_init(Vec::new, |buf: &mut Vec<f32>, t| {
                    let cols = ct.min(n - t * ct);
                    buf.resize(nr * cols, 0.0);
                    self.tile(tier, t * ct, a, &biased, first, nr, &mut buf[..nr * cols]);
                    for (r, src) in buf[..nr * cols].chunks_exact(cols).enumerate() {
                        // SAFETY: row `first + r`, columns `t·ct .. t·ct + cols` lie inside
                        // `y`'s `rows · n` allocated values, and this task is the only one
                        // writing them (tiles cover disjoint columns, row blocks disjoint rows).
                        #[allow(unsafe_code)]
                        unsafe {
                            std::ptr::copy_nonoverlapping(
                                src.as_ptr(),
                                dst.at((first + r) * n + t * ct),
                                cols,
                            );
                        }
                    }
                });
        }
        // SAFETY: the loops above wrote all `rows · n` values (every row block, every tile)
        // into `y`'s reserved capacity.
        #[allow(unsafe_code)]
        unsafe {
            y.set_len(rows * n)
        };
    }

    fn matmul(&self, x: &[f32], rows: usize) -> Vec<f32> {
        self.matmul_with(Tier::detect(), x, rows)
    }
}

/// The output of one matmul call, written by its column tiles in parallel (each only its own
/// columns of its own rows).
#[derive(Clone, Copy)]
struct OutPtr(*mut f32);

// SAFETY: the tasks sharing an `OutPtr` write disjoint values (see `OwnWeight::matmul_with`).
#[allow(unsafe_code)]
unsafe impl Send for OutPtr {}
#[allow(unsafe_code)]
unsafe impl Sync for OutPtr {}

impl OutPtr {
    /// The address of value `i` (in bounds of the allocation: the caller's contract).
    fn at(self, i: usize) -> *mut f32 {
        self.0.wrapping_add(i)
    }
}

/// Lane accumulators of `R` activation rows (`first..first + R`) against one unpacked weight
/// row (`kb` blocks with scales `dw`), block by block.
#[inline(always)]
fn group_lanes<const R: usize>(
    first: usize,
    kb: usize,
    w: &[i8],
    dw: &[f32],
    a: &Q8Rows,
    fma_block: impl Fn(&mut Lanes, f32, &[i8], &[i8], bool),
    lanes: bool,
) -> [Lanes; R] {
    let mut acc = [[0f32; LANES]; R];
    for (b, (qw, &d)) in w.chunks_exact(QK).zip(dw).enumerate() {
        for (i, acc) in acc.iter_mut().enumerate() {
            let ab = (first + i) * kb + b;
            fma_block(acc, d * a.d[ab], qw, &a.q[ab * QK..(ab + 1) * QK], lanes);
        }
    }
    acc
}

/// The first 32 bytes of `s` (`i8` or `u8` values) into a register.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
#[inline]
#[allow(unsafe_code)]
fn load_256<T: Copy>(s: &[T]) -> std::arch::x86_64::__m256i {
    assert!(std::mem::size_of_val(s) >= 32);
    // SAFETY: `s` holds at least 32 bytes (asserted above); `loadu` has no alignment
    // requirement.
    unsafe { std::arch::x86_64::_mm256_loadu_si256(s.as_ptr().cast()) }
}

/// The first 16 bytes of `s` (sixteen `u8` or eight `i16`) into a register.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
#[inline]
#[allow(unsafe_code)]
fn load_128<T: Copy>(s: &[T]) -> std::arch::x86_64::__m128i {
    assert!(std::mem::size_of_val(s) >= 16);
    // SAFETY: `s` holds at least 16 bytes (asserted above); `loadu` has no alignment
    // requirement.
    unsafe { std::arch::x86_64::_mm_loadu_si128(s.as_ptr().cast()) }
}

/// ggml's `hsum_float_8`, in registers: `((l0+l4) + (l2+l6)) + ((l1+l5) + (l3+l7))`, the same
/// additions as [`hsum_lanes`].
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
#[inline]
fn hsum_avx(x: std::arch::x86_64::__m256) -> f32 {
    use std::arch::x86_64::{
        _mm_add_ps, _mm_add_ss, _mm_cvtss_f32, _mm_movehdup_ps, _mm_movehl_ps,
        _mm256_castps256_ps128, _mm256_extractf128_ps,
    };
    let r = _mm_add_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps::<1>(x));
    let r = _mm_add_ps(r, _mm_movehl_ps(r, r));
    _mm_cvtss_f32(_mm_add_ss(r, _mm_movehdup_ps(r)))
}

/// The four min lanes of ggml's Q4_K kernel summed as it does: `(m0+m2) + (m1+m3)`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
#[inline]
fn hsum4_avx(x: std::arch::x86_64::__m128) -> f32 {
    use std::arch::x86_64::{
        _mm_add_ps, _mm_add_ss, _mm_cvtss_f32, _mm_movehdup_ps, _mm_movehl_ps,
    };
    let r = _mm_add_ps(x, _mm_movehl_ps(x, x));
    _mm_cvtss_f32(_mm_add_ss(r, _mm_movehdup_ps(r)))
}

/// One weight row against one activation row in the per-block order (Q4_1, without its min
/// terms): `acc += (d_w·d_a)·Σ_b` block after block, as `fma_block_avx2`'s per-block mode, but
/// the exact integer sums of eight blocks come out of one `vphaddd` tree and their scales and
/// products out of two `vmulps`, instead of a horizontal sum, two scalar multiplies and a
/// conversion per block. The additions into `acc` stay one per block, in block order.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
#[inline]
fn block_order_row_avx2(w: &[i8], dw: &[f32], a: &[i8], da: &[f32]) -> f32 {
    use std::arch::x86_64::{
        _mm256_add_epi32, _mm256_cvtepi32_ps, _mm256_hadd_epi32, _mm256_madd_epi16,
        _mm256_maddubs_epi16, _mm256_mul_ps, _mm256_permute2x128_si256, _mm256_set1_epi16,
        _mm256_sign_epi8,
    };
    let kb = dw.len();
    assert!(w.len() >= kb * QK && a.len() >= kb * QK && da.len() >= kb);
    let ones = _mm256_set1_epi16(1);
    let quads = |b: usize| {
        let (wv, av) = (load_256(&w[b * QK..]), load_256(&a[b * QK..]));
        let p = _mm256_maddubs_epi16(_mm256_sign_epi8(wv, wv), _mm256_sign_epi8(av, wv));
        _mm256_madd_epi16(p, ones)
    };
    let mut acc = 0f32;
    let full = kb / 8 * 8;
    for b0 in (0..full).step_by(8) {
        let s01 = _mm256_hadd_epi32(quads(b0), quads(b0 + 1));
        let s23 = _mm256_hadd_epi32(quads(b0 + 2), quads(b0 + 3));
        let s45 = _mm256_hadd_epi32(quads(b0 + 4), quads(b0 + 5));
        let s67 = _mm256_hadd_epi32(quads(b0 + 6), quads(b0 + 7));
        let (lo, hi) = (_mm256_hadd_epi32(s01, s23), _mm256_hadd_epi32(s45, s67));
        // Lane j: the sum of block b0 + j's 32 products.
        let sums = _mm256_add_epi32(
            _mm256_permute2x128_si256::<0x20>(lo, hi),
            _mm256_permute2x128_si256::<0x31>(lo, hi),
        );
        let d = _mm256_mul_ps(load_f32x8(&dw[b0..]), load_f32x8(&da[b0..]));
        let mut p = [0f32; 8];
        store_f32x8(&mut p, _mm256_mul_ps(d, _mm256_cvtepi32_ps(sums)));
        for v in p {
            acc += v;
        }
    }
    for b in full..kb {
        let s: i32 = w[b * QK..(b + 1) * QK]
            .iter()
            .zip(&a[b * QK..(b + 1) * QK])
            .map(|(&x, &y)| i32::from(x) * i32::from(y))
            .sum();
        acc += (dw[b] * da[b]) * s as f32;
    }
    acc
}

/// [`LANES_R`]-style register tile for the lanes order (Q5_0, Q8_0): `R` activation rows
/// (`a`, `R` rows of `kb` blocks, scales `da`) against `C` unpacked weight rows (`w`, scales
/// `dw`), one eight-lane accumulator per (weight row, activation row). Per block and pair the
/// tier `I` gives the eight exact four-product lanes ([`BlockInts::signed`]: `vpsignb` +
/// `vpmaddubsw` + `vpmaddwd` on AVX2 as in [`fma_block_avx2`], one `vpdpbusd` on VNNI),
/// converted and fused-multiply-added with `d_w·d_a` — the same float
/// operations in the same order as every other tier, per output. The `d_w·d_a` products are
/// computed eight blocks per multiply before the main loop (into `dp`), so the loop only
/// broadcasts them. Returns `[weight row][activation row]`.
///
/// # Safety
/// The CPU has AVX2, FMA and whatever `I`'s operations enable.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
// The row and column indices also address the weights, activations and scale products.
#[allow(unsafe_code, clippy::needless_range_loop)]
unsafe fn lanes_micro<I: BlockInts, const R: usize, const C: usize>(
    w: &[i8],
    dw: &[f32],
    a: &[I::Act],
    da: &[f32],
    kb: usize,
    dp: &mut Vec<f32>,
) -> [[f32; R]; C] {
    use std::arch::x86_64::{
        __m256i, _mm256_broadcast_ss, _mm256_cvtepi32_ps, _mm256_fmadd_ps, _mm256_loadu_si256,
        _mm256_mul_ps, _mm256_setzero_ps,
    };
    const { assert!(std::mem::size_of::<I::Act>() == 1) };
    let k = kb * QK;
    assert!(w.len() >= C * k && dw.len() >= C * kb && a.len() >= R * k && da.len() >= R * kb);
    // dp[(c·R + r)·kb + b] = d_w[c][b] · d_a[r][b] (the multiply each tier does per block).
    dp.clear();
    dp.resize(C * R * kb, 0.0);
    let full = kb / 8 * 8;
    for c in 0..C {
        let x = &dw[c * kb..(c + 1) * kb];
        for r in 0..R {
            let y = &da[r * kb..(r + 1) * kb];
            let o = &mut dp[(c * R + r) * kb..(c * R + r + 1) * kb];
            for b in (0..full).step_by(8) {
                // SAFETY: AVX2 (this function's contract).
                unsafe {
                    store_f32x8(
                        &mut o[b..],
                        _mm256_mul_ps(load_f32x8(&x[b..]), load_f32x8(&y[b..])),
                    )
                };
            }
            for b in full..kb {
                o[b] = x[b] * y[b];
            }
        }
    }
    // SAFETY (every block below): the CPU has the features the intrinsics and `I`'s operations
    // need (this function's contract); each pointer offset is in bounds as noted.
    let mut acc = [[unsafe { _mm256_setzero_ps() }; R]; C];
    let (wp, ap, dpp) = (w.as_ptr(), a.as_ptr().cast::<u8>(), dp.as_ptr());
    for b in 0..kb {
        // `c·k + b·32 + 32 ≤ C·k ≤ w.len()` (asserted above); `loadu` has no alignment
        // requirement.
        let wb: [I::Prep; C] = std::array::from_fn(|c| unsafe {
            I::prep(_mm256_loadu_si256(wp.add(c * k + b * QK).cast::<__m256i>()))
        });
        for r in 0..R {
            // `r·k + b·32 + 32 ≤ R·k ≤ a.len()` (asserted above; one byte per value).
            let av = unsafe { _mm256_loadu_si256(ap.add(r * k + b * QK).cast::<__m256i>()) };
            for c in 0..C {
                unsafe {
                    let lanes = I::signed(wb[c], av);
                    // `(c·R + r)·kb + b < C·R·kb = dp.len()`.
                    let d = _mm256_broadcast_ss(&*dpp.add((c * R + r) * kb + b));
                    acc[c][r] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(lanes), acc[c][r]);
                }
            }
        }
    }
    let mut out = [[0f32; R]; C];
    for c in 0..C {
        for r in 0..R {
            out[c][r] = unsafe { hsum_avx(acc[c][r]) };
        }
    }
    out
}

/// The VNNI tier's register tile for the lanes order (Q5_0, Q8_0): [`V4`] activation rows
/// against [`V4`] weight rows, one eight-lane accumulator per pair (sixteen of the 32 vector
/// registers; the four weight blocks, four activation blocks and their four start values of a
/// block stay in registers too). Per block and pair one `vpdpbusd` gives the eight exact
/// four-product lanes: the weights biased by +128 as `u8` (`w`) times the signed activations,
/// starting from −128 × the activations' four-value sums (`init`), which removes the bias
/// exactly; then the same convert and fused multiply-add with `d_w·d_a` as every other tier,
/// per output in block order. Everything is block-major (`w`: `[block][weight row][32]`, `dw`:
/// `[block][weight row]`; `a`, `init`, `da` the same per activation row), so the loop reaches
/// every operand through four pointers with constant offsets. The `d_w·d_a` products are
/// computed before the loop (`dp[block][weight row][activation row]`, four per multiply).
/// Returns `[weight row][activation row]`.
///
/// # Safety
/// The CPU has AVX-512 F/BW/VL/VNNI, AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma")]
#[allow(unsafe_code, clippy::needless_range_loop)]
unsafe fn lanes_micro_vnni4(
    w: &[i8],
    dw: &[f32],
    a: &[i8],
    init: &[i32],
    da: &[f32],
    kb: usize,
    dp: &mut [f32],
) -> [[f32; V4]; V4] {
    use std::arch::x86_64::{
        __m256i, _mm_loadu_ps, _mm_mul_ps, _mm_set1_ps, _mm_storeu_ps, _mm256_broadcast_ss,
        _mm256_cvtepi32_ps, _mm256_dpbusd_epi32, _mm256_fmadd_ps, _mm256_loadu_si256,
        _mm256_setzero_ps,
    };
    const P: usize = V4 * V4;
    assert!(w.len() >= kb * V4 * QK && a.len() >= kb * V4 * QK);
    assert!(init.len() >= kb * V4 * LANES && dw.len() >= kb * V4 && da.len() >= kb * V4);
    assert!(dp.len() >= kb * P);
    // SAFETY (every block below): the CPU has the features (this function's contract); each
    // offset is in bounds by the lengths asserted above.
    for b in 0..kb {
        let d4 = unsafe { _mm_loadu_ps(da.as_ptr().add(b * V4)) };
        for c in 0..V4 {
            let p = _mm_mul_ps(_mm_set1_ps(dw[b * V4 + c]), d4);
            unsafe { _mm_storeu_ps(dp.as_mut_ptr().add(b * P + c * V4), p) };
        }
    }
    let mut acc = [[_mm256_setzero_ps(); V4]; V4];
    let (wp, ap, ip, dpp) = (w.as_ptr(), a.as_ptr(), init.as_ptr(), dp.as_ptr());
    for b in 0..kb {
        let wv: [__m256i; V4] = std::array::from_fn(|c| unsafe {
            _mm256_loadu_si256(wp.add((b * V4 + c) * QK).cast::<__m256i>())
        });
        for r in 0..V4 {
            let (av, iv) = unsafe {
                (
                    _mm256_loadu_si256(ap.add((b * V4 + r) * QK).cast::<__m256i>()),
                    _mm256_loadu_si256(ip.add((b * V4 + r) * LANES).cast::<__m256i>()),
                )
            };
            for c in 0..V4 {
                let lanes = _mm256_dpbusd_epi32(iv, wv[c], av);
                let d = unsafe { _mm256_broadcast_ss(&*dpp.add(b * P + c * V4 + r)) };
                acc[c][r] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(lanes), acc[c][r]);
            }
        }
    }
    let mut out = [[0f32; V4]; V4];
    for c in 0..V4 {
        for r in 0..V4 {
            out[c][r] = hsum_avx(acc[c][r]);
        }
    }
    out
}

/// The per-block order (Q4_1) for [`BLOCK_T`] activation rows (`a`: eight consecutive rows of
/// `kb` blocks; `dt`, `st`: their scales and sums transposed, `[block][row]`) against one
/// unpacked weight row `w` (scales `dw`, mins `mw`), one row per lane: per block the eight
/// rows' exact integer sums come out of one `vphaddd` tree (as in [`block_order_row_avx2`],
/// which does the same for eight blocks of one row), then `acc += (d_w·d_a)·Σ` and
/// `summs += m_w·s_a` are one vector multiply and add each, block after block; the result is
/// `acc + summs`. Every lane performs exactly the scalar operations of the other tiers, in
/// their order. The tier `I` gives each row's exact lanes ([`BlockInts::unsigned`]).
///
/// # Safety
/// The CPU has AVX2, FMA and whatever `I`'s operations enable.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
#[allow(unsafe_code, unused_unsafe)]
unsafe fn block_micro<I: BlockInts>(
    w: &[i8],
    dw: &[f32],
    mw: &[f32],
    a: &[i8],
    dt: &[f32],
    st: &[f32],
    kb: usize,
) -> [f32; BLOCK_T] {
    use std::arch::x86_64::{
        __m256i, _mm256_add_epi32, _mm256_add_ps, _mm256_cvtepi32_ps, _mm256_hadd_epi32,
        _mm256_loadu_si256, _mm256_mul_ps, _mm256_permute2x128_si256, _mm256_set1_ps,
        _mm256_setzero_ps,
    };
    let k = kb * QK;
    assert!(w.len() >= k && dw.len() >= kb && mw.len() >= kb && a.len() >= BLOCK_T * k);
    assert!(dt.len() >= kb * BLOCK_T && st.len() >= kb * BLOCK_T);
    debug_assert!(w[..k].iter().all(|&v| (0..16).contains(&v)));
    // SAFETY (the whole body): the CPU has the features the intrinsics and `I`'s operations
    // need (this function's contract); each pointer offset is in bounds as noted.
    unsafe {
        let (wp, ap) = (w.as_ptr(), a.as_ptr());
        let (mut acc, mut summs) = (_mm256_setzero_ps(), _mm256_setzero_ps());
        for b in 0..kb {
            // `b·32 + 32 ≤ k ≤ w.len()` (asserted above); `loadu` has no alignment requirement.
            let wv = _mm256_loadu_si256(wp.add(b * QK).cast::<__m256i>());
            // Row t's eight four-product lanes of block b (the nibbles are unsigned: no sign step).
            let quads = |t: usize| {
                // `t·k + b·32 + 32 ≤ 8·k ≤ a.len()` (asserted above).
                let av = _mm256_loadu_si256(ap.add(t * k + b * QK).cast::<__m256i>());
                I::unsigned(wv, av)
            };
            let s01 = _mm256_hadd_epi32(quads(0), quads(1));
            let s23 = _mm256_hadd_epi32(quads(2), quads(3));
            let s45 = _mm256_hadd_epi32(quads(4), quads(5));
            let s67 = _mm256_hadd_epi32(quads(6), quads(7));
            let (lo, hi) = (_mm256_hadd_epi32(s01, s23), _mm256_hadd_epi32(s45, s67));
            // Lane t: the sum of row t's 32 products of block b.
            let sums = _mm256_add_epi32(
                _mm256_permute2x128_si256::<0x20>(lo, hi),
                _mm256_permute2x128_si256::<0x31>(lo, hi),
            );
            let d = _mm256_mul_ps(_mm256_set1_ps(dw[b]), load_f32x8(&dt[b * BLOCK_T..]));
            acc = _mm256_add_ps(acc, _mm256_mul_ps(d, _mm256_cvtepi32_ps(sums)));
            let ms = _mm256_mul_ps(_mm256_set1_ps(mw[b]), load_f32x8(&st[b * BLOCK_T..]));
            summs = _mm256_add_ps(summs, ms);
        }
        let mut out = [0f32; BLOCK_T];
        store_f32x8(&mut out, _mm256_add_ps(acc, summs));
        out
    }
}

/// How a SIMD tier computes the exact integer lanes of one 32-value block against an
/// activation block (lane `j`: the sum of the four products of values `4j..4j + 4`), for the
/// register tiles shared by the AVX2 and VNNI tiers ([`lanes_micro`], [`block_micro`]). Both
/// tiers give the same integers, so the tiles' float steps, and the results, are the same.
#[cfg(target_arch = "x86_64")]
#[allow(unsafe_code)]
trait BlockInts {
    /// The activation bytes the tier's signed-weight lanes read: the signed values, or (VNNI)
    /// the values biased by 128 as `u8` (see [`lanes_micro_vnni`]).
    type Act: Copy;
    /// A signed weight block, prepared once for every activation row it meets.
    type Prep: Copy;
    /// Prepares a signed weight block (Q5_0, Q8_0).
    ///
    /// # Safety
    /// The CPU has the tier's features.
    unsafe fn prep(wv: std::arch::x86_64::__m256i) -> Self::Prep;
    /// The lanes of a prepared signed weight block against an activation block (`Act` bytes).
    ///
    /// # Safety
    /// The CPU has the tier's features.
    unsafe fn signed(w: Self::Prep, av: std::arch::x86_64::__m256i) -> std::arch::x86_64::__m256i;
    /// The lanes of an unsigned weight block (Q4_1's nibbles) against a signed activation block.
    ///
    /// # Safety
    /// The CPU has the tier's features.
    unsafe fn unsigned(
        wv: std::arch::x86_64::__m256i,
        av: std::arch::x86_64::__m256i,
    ) -> std::arch::x86_64::__m256i;
    /// One unpacked Q4_1 weight row against one activation row in the per-block order, without
    /// the min terms ([`block_order_row_avx2`] or [`block_order_row_vnni`]).
    ///
    /// # Safety
    /// The CPU has the tier's features.
    unsafe fn block_row(w: &[i8], dw: &[f32], a: &[i8], da: &[f32]) -> f32;
}

/// The AVX2 tier's lanes: `vpmaddubsw` + `vpmaddwd` (signed weights through `vpsignb`).
#[cfg(target_arch = "x86_64")]
struct Avx2Ints;

#[cfg(target_arch = "x86_64")]
#[allow(unsafe_code)]
impl BlockInts for Avx2Ints {
    type Act = i8;
    /// The block and its absolute values.
    type Prep = (std::arch::x86_64::__m256i, std::arch::x86_64::__m256i);
    #[target_feature(enable = "avx2")]
    #[inline]
    unsafe fn prep(wv: std::arch::x86_64::__m256i) -> Self::Prep {
        (wv, std::arch::x86_64::_mm256_sign_epi8(wv, wv))
    }
    #[target_feature(enable = "avx2")]
    #[inline]
    unsafe fn signed(
        (wv, wabs): Self::Prep,
        av: std::arch::x86_64::__m256i,
    ) -> std::arch::x86_64::__m256i {
        use std::arch::x86_64::{
            _mm256_madd_epi16, _mm256_maddubs_epi16, _mm256_set1_epi16, _mm256_sign_epi8,
        };
        _mm256_madd_epi16(
            _mm256_maddubs_epi16(wabs, _mm256_sign_epi8(av, wv)),
            _mm256_set1_epi16(1),
        )
    }
    #[target_feature(enable = "avx2")]
    #[inline]
    unsafe fn unsigned(
        wv: std::arch::x86_64::__m256i,
        av: std::arch::x86_64::__m256i,
    ) -> std::arch::x86_64::__m256i {
        use std::arch::x86_64::{_mm256_madd_epi16, _mm256_maddubs_epi16, _mm256_set1_epi16};
        _mm256_madd_epi16(_mm256_maddubs_epi16(wv, av), _mm256_set1_epi16(1))
    }
    #[target_feature(enable = "avx2,fma")]
    #[inline]
    unsafe fn block_row(w: &[i8], dw: &[f32], a: &[i8], da: &[f32]) -> f32 {
        block_order_row_avx2(w, dw, a, da)
    }
}

/// The VNNI tier's lanes: one `vpdpbusd` (unsigned × signed bytes; signed weights meet the
/// biased activations, the accumulator starting at `−128 ×` the weights' four-value sums).
#[cfg(target_arch = "x86_64")]
struct VnniInts;

#[cfg(target_arch = "x86_64")]
#[allow(unsafe_code)]
impl BlockInts for VnniInts {
    type Act = u8;
    /// The block and `−128 ×` its four-value sums.
    type Prep = (std::arch::x86_64::__m256i, std::arch::x86_64::__m256i);
    #[target_feature(enable = "avx512f,avx512vl,avx512vnni,avx2")]
    #[inline]
    unsafe fn prep(wv: std::arch::x86_64::__m256i) -> Self::Prep {
        use std::arch::x86_64::{
            _mm256_dpbusd_epi32, _mm256_set1_epi8, _mm256_setzero_si256, _mm256_sub_epi32,
        };
        let zero = _mm256_setzero_si256();
        let bias = _mm256_set1_epi8(0x80u8 as i8);
        (
            wv,
            _mm256_sub_epi32(zero, _mm256_dpbusd_epi32(zero, bias, wv)),
        )
    }
    #[target_feature(enable = "avx512f,avx512vl,avx512vnni,avx2")]
    #[inline]
    unsafe fn signed(
        (wv, init): Self::Prep,
        av: std::arch::x86_64::__m256i,
    ) -> std::arch::x86_64::__m256i {
        std::arch::x86_64::_mm256_dpbusd_epi32(init, av, wv)
    }
    #[target_feature(enable = "avx512f,avx512vl,avx512vnni,avx2")]
    #[inline]
    unsafe fn unsigned(
        wv: std::arch::x86_64::__m256i,
        av: std::arch::x86_64::__m256i,
    ) -> std::arch::x86_64::__m256i {
        use std::arch::x86_64::{_mm256_dpbusd_epi32, _mm256_setzero_si256};
        _mm256_dpbusd_epi32(_mm256_setzero_si256(), wv, av)
    }
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma")]
    #[inline]
    unsafe fn block_row(w: &[i8], dw: &[f32], a: &[i8], da: &[f32]) -> f32 {
        block_order_row_vnni(w, dw, a, da)
    }
}

/// Eight `f32` from the start of `s` into a register.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
#[inline]
#[allow(unsafe_code)]
fn load_f32x8(s: &[f32]) -> std::arch::x86_64::__m256 {
    assert!(s.len() >= 8);
    // SAFETY: `s` holds at least 8 values (asserted above); `loadu` has no alignment
    // requirement.
    unsafe { std::arch::x86_64::_mm256_loadu_ps(s.as_ptr()) }
}

/// A register into the first eight values of `s`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
#[inline]
#[allow(unsafe_code)]
fn store_f32x8(s: &mut [f32], v: std::arch::x86_64::__m256) {
    assert!(s.len() >= 8);
    // SAFETY: `s` holds at least 8 values (asserted above); `storeu` has no alignment
    // requirement.
    unsafe { std::arch::x86_64::_mm256_storeu_ps(s.as_mut_ptr(), v) }
}

/// K-quant register tile: `R` activation rows × one weight row (`blocks`: its super-blocks as
/// in the file), unpacked in registers chunk by chunk as ggml does and used right away by the
/// `R` rows. Per (row, chunk): `vpmaddubsw` (Q4_K's nibbles are unsigned; Q6_K's signed values
/// go through `vpsignb` first) + `vpmaddwd` with the chunk's 16-bit scales, summed into eight
/// i32 lanes; per super-block one FMA with `d_a·d_w`, and for Q4_K the min lanes (`vpmaddwd` of
/// the mins with the activation sub-block sums, one FMA with `−d_a·dmin`) — the steps of
/// ggml's `ggml_vec_dot_q4_K_q8_K` / `_q6_K_q8_K`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
#[inline]
fn k_micro_avx2<const R: usize, const Q4K: bool>(
    blocks: &[u8],
    a: &Q8KRows,
    first: usize,
    k: usize,
) -> [f32; R] {
    use std::arch::x86_64::*;
    let nsb = k / QK_K;
    let bytes = if Q4K { Q4_K_BYTES } else { Q6_K_BYTES };
    assert_eq!(blocks.len(), nsb * bytes);
    let half_at = |b: &[u8], i: usize| f16::from_le_bytes([b[i], b[i + 1]]).to_f32();
    let ar: [&[i8]; R] = std::array::from_fn(|r| &a.q[(first + r) * k..(first + r + 1) * k]);
    let (m4, m2, m32) = (
        _mm256_set1_epi8(0x0F),
        _mm256_set1_epi8(3),
        _mm256_set1_epi8(32),
    );
    let mut acc = [_mm256_setzero_ps(); R];
    let mut acc_m = [_mm_setzero_ps(); R];
    for (sb, b) in blocks.chunks_exact(bytes).enumerate() {
        let mut sumi = [_mm256_setzero_si256(); R];
        // One 32-value chunk `ch` of weights `w` with 16-bit pair scales `s` into every row.
        macro_rules! chunk {
            ($ch:expr, $w:expr, $s:expr) => {{
                let (o, w, s) = (sb * QK_K + $ch * QK, $w, $s);
                let wa = if Q4K { w } else { _mm256_sign_epi8(w, w) };
                for r in 0..R {
                    let x = load_256(&ar[r][o..]);
                    let x = if Q4K { x } else { _mm256_sign_epi8(x, w) };
                    let p = _mm256_madd_epi16(s, _mm256_maddubs_epi16(wa, x));
                    sumi[r] = _mm256_add_epi32(sumi[r], p);
                }
            }};
        }
        let mut mins = _mm_setzero_si128();
        if Q4K {
            // ggml's `utmp` unpacking of the 6-bit scales (bytes 0-7) and mins (bytes 8-15).
            let u = |i: usize| u32::from_le_bytes([b[4 + i], b[5 + i], b[6 + i], b[7 + i]]);
            let (u0, u1, u2) = (u(0), u(4), u(8));
            let (k1, k2, k3) = (0x3f3f_3f3fu32, 0x0f0f_0f0fu32, 0x0303_0303u32);
            let t3 = ((u2 >> 4) & k2) | (((u1 >> 6) & k3) << 4);
            let t1 = (u2 & k2) | (((u0 >> 6) & k3) << 4);
            let (t0, t2) = (u0 & k1, u1 & k1);
            let sm =
                _mm256_cvtepu8_epi16(_mm_set_epi32(t3 as i32, t2 as i32, t1 as i32, t0 as i32));
            let sc128 = _mm256_castsi256_si128(sm);
            mins = _mm256_extracti128_si256::<1>(sm);
            let scales = _mm256_set_m128i(sc128, sc128);
            for j in 0..4 {
                let q = load_256(&b[16 + 32 * j..]);
                let s0 = _mm256_shuffle_epi8(
                    scales,
                    _mm256_set1_epi16(0x0100 + 0x0202 * (2 * j as i16)),
                );
                let s1 = _mm256_shuffle_epi8(
                    scales,
                    _mm256_set1_epi16(0x0100 + 0x0202 * (2 * j as i16 + 1)),
                );
                chunk!(2 * j, _mm256_and_si256(q, m4), s0);
                let hi = _mm256_and_si256(_mm256_srli_epi16::<4>(q), m4);
                chunk!(2 * j + 1, hi, s1);
            }
        } else {
            let scales = load_128(&b[192..]);
            // Pair scales of chunk c: byte 2c eight times, then byte 2c + 1 eight times.
            let sc = |c: usize| {
                let lo = 0x0101_0101_0101_0101u64 * (2 * c) as u64;
                let hi = 0x0101_0101_0101_0101u64 * (2 * c + 1) as u64;
                _mm256_cvtepi8_epi16(_mm_shuffle_epi8(
                    scales,
                    _mm_set_epi64x(hi as i64, lo as i64),
                ))
            };
            for n in 0..2 {
                let q1 = load_256(&b[64 * n..]);
                let q2 = load_256(&b[64 * n + 32..]);
                let h = load_256(&b[128 + 32 * n..]);
                // Bit pair `m` of each high byte, moved to bits 4-5 (masked before the 16-bit
                // shift, so nothing crosses into the neighbouring byte).
                let high = [
                    h,
                    _mm256_srli_epi16::<2>(h),
                    _mm256_srli_epi16::<4>(h),
                    _mm256_srli_epi16::<6>(h),
                ]
                .map(|v| _mm256_slli_epi16::<4>(_mm256_and_si256(v, m2)));
                let low = [
                    _mm256_and_si256(q1, m4),
                    _mm256_and_si256(q2, m4),
                    _mm256_and_si256(_mm256_srli_epi16::<4>(q1), m4),
                    _mm256_and_si256(_mm256_srli_epi16::<4>(q2), m4),
                ];
                for m in 0..4 {
                    let w = _mm256_sub_epi8(_mm256_or_si256(low[m], high[m]), m32);
                    let c = 4 * n + m;
                    chunk!(c, w, sc(c));
                }
            }
        }
        let dw = half_at(b, if Q4K { 0 } else { 208 });
        for r in 0..R {
            let da = a.d[(first + r) * nsb + sb];
            acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(da * dw), _mm256_cvtepi32_ps(sumi[r]), acc[r]);
        }
        if Q4K {
            let dmin = half_at(b, 2);
            for (r, acc_m) in acc_m.iter_mut().enumerate() {
                let ab = (first + r) * nsb + sb;
                let prod = _mm_madd_epi16(mins, load_128(&a.sums[ab * CHUNKS..]));
                *acc_m = _mm_fmadd_ps(_mm_set1_ps(-a.d[ab] * dmin), _mm_cvtepi32_ps(prod), *acc_m);
            }
        }
    }
    let mut out = [0f32; R];
    for r in 0..R {
        out[r] = hsum_avx(acc[r]);
        if Q4K {
            out[r] += hsum4_avx(acc_m[r]);
        }
    }
    out
}

/// One K-quant weight row (`blocks`) against activation rows `first..first + rows`, into
/// column `c0` of `out` (`[rows][out.len() / rows]`), four activation rows at a time.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn k_tile_avx2<const Q4K: bool>(
    blocks: &[u8],
    a: &Q8KRows,
    first: usize,
    rows: usize,
    k: usize,
    out: &mut [f32],
    c0: usize,
) {
    let stride = out.len() / rows;
    let mut put = |r0: usize, v: &[f32]| {
        for (i, &v) in v.iter().enumerate() {
            out[(r0 + i) * stride + c0] = v;
        }
    };
    let mut r = 0;
    while r + ROW_GROUP <= rows {
        put(r, &k_micro_avx2::<ROW_GROUP, Q4K>(blocks, a, first + r, k));
        r += ROW_GROUP;
    }
    match rows - r {
        3 => put(r, &k_micro_avx2::<3, Q4K>(blocks, a, first + r, k)),
        2 => put(r, &k_micro_avx2::<2, Q4K>(blocks, a, first + r, k)),
        1 => put(r, &k_micro_avx2::<1, Q4K>(blocks, a, first + r, k)),
        _ => {}
    }
}

/// The first 64 bytes of `s` (`i8` or `u8` values) into a register.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
#[inline]
#[allow(unsafe_code)]
fn load_512<T: Copy>(s: &[T]) -> std::arch::x86_64::__m512i {
    assert!(std::mem::size_of_val(s) >= 64);
    // SAFETY: `s` holds at least 64 bytes (asserted above); `loadu` has no alignment
    // requirement.
    unsafe { std::arch::x86_64::_mm512_loadu_si512(s.as_ptr().cast()) }
}

/// The low and high 256-bit halves of a 512-bit register of floats (AVX-512F only: the
/// `f32x8` extract would need AVX-512DQ).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
#[inline]
fn halves_ps(
    v: std::arch::x86_64::__m512,
) -> (std::arch::x86_64::__m256, std::arch::x86_64::__m256) {
    use std::arch::x86_64::{
        _mm256_castpd_ps, _mm512_castps_pd, _mm512_castps512_ps256, _mm512_extractf64x4_pd,
    };
    (
        _mm512_castps512_ps256(v),
        _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(v))),
    )
}

/// The lanes-order dot products (Q5_0, Q8_0) of `R` activation rows (`first..first + R`)
/// against one unpacked weight row `w` (block scales `dw`), with AVX-512 VNNI. Lane `j` of a
/// block is `Σ_{t<4} w[4j+t]·a[4j+t]`, exactly as in the other tiers, computed as
/// `vpdpbusd(−128·Σ w, a + 128, w)`: `vpdpbusd` multiplies unsigned by signed bytes, so the
/// activations come biased to `u8` (`biased`, in `[1, 255]`) and the accumulator starts at
/// minus the bias times the weights' four-value sums (one `vpdpbusd` per weight block, shared
/// by the `R` rows). The integer result is exact (|Σ| ≤ 4·255·128), so it equals the AVX2
/// tier's `vpmaddubsw` + `vpmaddwd` lanes; then per block one FMA with `d_w·d_a` into the
/// lane accumulators, block after block, and `hsum_float_8` — the AVX2 tier's float steps.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma")]
#[inline]
fn lanes_micro_vnni<const R: usize>(
    w: &[i8],
    dw: &[f32],
    a: &Q8Rows,
    biased: &[u8],
    first: usize,
    k: usize,
) -> [f32; R] {
    use std::arch::x86_64::*;
    let kb = k / QK;
    assert!(w.len() >= k && dw.len() >= kb && biased.len() >= (first + R) * k);
    let ar: [&[u8]; R] = std::array::from_fn(|r| &biased[(first + r) * k..(first + r + 1) * k]);
    let ad: [&[f32]; R] = std::array::from_fn(|r| &a.d[(first + r) * kb..(first + r + 1) * kb]);
    let mut acc = [_mm256_setzero_ps(); R];
    let (zero, bias) = (_mm512_setzero_si512(), _mm512_set1_epi8(0x80u8 as i8));
    let pairs = kb / 2;
    for p in 0..pairs {
        let b = 2 * p;
        let wv = load_512(&w[b * QK..]);
        let init = _mm512_sub_epi32(zero, _mm512_dpbusd_epi32(zero, bias, wv));
        for r in 0..R {
            let lanes = _mm512_dpbusd_epi32(init, load_512(&ar[r][b * QK..]), wv);
            let (lo, hi) = halves_ps(_mm512_cvtepi32_ps(lanes));
            acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(dw[b] * ad[r][b]), lo, acc[r]);
            acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(dw[b + 1] * ad[r][b + 1]), hi, acc[r]);
        }
    }
    if kb % 2 == 1 {
        let b = kb - 1;
        let (zero, bias) = (_mm256_setzero_si256(), _mm256_set1_epi8(0x80u8 as i8));
        let wv = load_256(&w[b * QK..]);
        let init = _mm256_sub_epi32(zero, _mm256_dpbusd_epi32(zero, bias, wv));
        for r in 0..R {
            let lanes = _mm256_dpbusd_epi32(init, load_256(&ar[r][b * QK..]), wv);
            acc[r] = _mm256_fmadd_ps(
                _mm256_set1_ps(dw[b] * ad[r][b]),
                _mm256_cvtepi32_ps(lanes),
                acc[r],
            );
        }
    }
    acc.map(|v| hsum_avx(v))
}

/// [`block_order_row_avx2`] with AVX-512 VNNI: each pair of blocks' eight-lane integer sums
/// from one `vpdpbusd` (Q4_1's unpacked nibbles are unsigned, so no bias is needed), the same
/// `vphaddd` tree per eight blocks and the same float steps.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma")]
#[inline]
fn block_order_row_vnni(w: &[i8], dw: &[f32], a: &[i8], da: &[f32]) -> f32 {
    use std::arch::x86_64::*;
    let kb = dw.len();
    assert!(w.len() >= kb * QK && a.len() >= kb * QK && da.len() >= kb);
    debug_assert!(w[..kb * QK].iter().all(|&v| v >= 0));
    let zero = _mm512_setzero_si512();
    // Lanes of blocks b and b + 1.
    let quads2 = |b: usize| {
        let q = _mm512_dpbusd_epi32(zero, load_512(&w[b * QK..]), load_512(&a[b * QK..]));
        (_mm512_castsi512_si256(q), _mm512_extracti64x4_epi64::<1>(q))
    };
    let mut acc = 0f32;
    let full = kb / 8 * 8;
    for b0 in (0..full).step_by(8) {
        let (q0, q1) = quads2(b0);
        let (q2, q3) = quads2(b0 + 2);
        let (q4, q5) = quads2(b0 + 4);
        let (q6, q7) = quads2(b0 + 6);
        let s01 = _mm256_hadd_epi32(q0, q1);
        let s23 = _mm256_hadd_epi32(q2, q3);
        let s45 = _mm256_hadd_epi32(q4, q5);
        let s67 = _mm256_hadd_epi32(q6, q7);
        let (lo, hi) = (_mm256_hadd_epi32(s01, s23), _mm256_hadd_epi32(s45, s67));
        let sums = _mm256_add_epi32(
            _mm256_permute2x128_si256::<0x20>(lo, hi),
            _mm256_permute2x128_si256::<0x31>(lo, hi),
        );
        let d = _mm256_mul_ps(load_f32x8(&dw[b0..]), load_f32x8(&da[b0..]));
        let mut p = [0f32; 8];
        store_f32x8(&mut p, _mm256_mul_ps(d, _mm256_cvtepi32_ps(sums)));
        for v in p {
            acc += v;
        }
    }
    for b in full..kb {
        let s: i32 = w[b * QK..(b + 1) * QK]
            .iter()
            .zip(&a[b * QK..(b + 1) * QK])
            .map(|(&x, &y)| i32::from(x) * i32::from(y))
            .sum();
        acc += (dw[b] * da[b]) * s as f32;
    }
    acc
}

/// [`k_micro_avx2`] with AVX-512 VNNI: two 32-value chunks per 512-bit register. Per (row,
/// chunk pair) one `vpdpbusd` gives each chunk's eight exact four-product lanes (Q4_K: the
/// unsigned nibbles times the signed activations; Q6_K: the biased activations `a + 128`
/// times the signed values `q − 32`, the accumulator starting at `−128·Σ q` as in
/// [`lanes_micro_vnni`]), and one `vpdpwssd` multiplies them by the lanes' 16-bit scales and
/// adds them into the sums (each lane is below 2¹⁵ in magnitude, so its low 16 bits are the
/// value; the scales' high 16 bits are zero). Per super-block the two chunks' halves are added
/// (integers: the same sums as the AVX2 tier's) and the float steps are the AVX2 tier's.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma")]
#[inline]
fn k_micro_vnni<const R: usize, const Q4K: bool>(
    blocks: &[u8],
    a: &Q8KRows,
    biased: &[u8],
    first: usize,
    k: usize,
) -> [f32; R] {
    use std::arch::x86_64::*;
    let nsb = k / QK_K;
    let bytes = if Q4K { Q4_K_BYTES } else { Q6_K_BYTES };
    assert_eq!(blocks.len(), nsb * bytes);
    assert!(Q4K || biased.len() >= (first + R) * k);
    let half_at = |b: &[u8], i: usize| f16::from_le_bytes([b[i], b[i + 1]]).to_f32();
    let ar: [&[i8]; R] = std::array::from_fn(|r| &a.q[(first + r) * k..(first + r + 1) * k]);
    let ab: [&[u8]; R] = std::array::from_fn(|r| {
        if Q4K {
            &[][..]
        } else {
            &biased[(first + r) * k..(first + r + 1) * k]
        }
    });
    let zero = _mm512_setzero_si512();
    let (m4, m3, m32, bias) = (
        _mm512_set1_epi8(0x0F),
        _mm512_set1_epi8(3),
        _mm512_set1_epi8(32),
        _mm512_set1_epi8(0x80u8 as i8),
    );
    let mut acc = [_mm256_setzero_ps(); R];
    let mut acc_m = [_mm_setzero_ps(); R];
    for (sb, b) in blocks.chunks_exact(bytes).enumerate() {
        let mut sumi = [zero; R];
        let mut mins = _mm_setzero_si128();
        if Q4K {
            // ggml's `utmp` unpacking, as in `k_micro_avx2`.
            let u = |i: usize| u32::from_le_bytes([b[4 + i], b[5 + i], b[6 + i], b[7 + i]]);
            let (u0, u1, u2) = (u(0), u(4), u(8));
            let (k1, k2, k3) = (0x3f3f_3f3fu32, 0x0f0f_0f0fu32, 0x0303_0303u32);
            let t3 = ((u2 >> 4) & k2) | (((u1 >> 6) & k3) << 4);
            let t1 = (u2 & k2) | (((u0 >> 6) & k3) << 4);
            let (t0, t2) = (u0 & k1, u1 & k1);
            let sm = _mm_set_epi32(t3 as i32, t2 as i32, t1 as i32, t0 as i32);
            mins = _mm256_extracti128_si256::<1>(_mm256_cvtepu8_epi16(sm));
            // The eight chunk scales as 32-bit lanes (high halves zero).
            let scales = _mm512_castsi256_si512(_mm256_cvtepu8_epi32(sm));
            for j in 0..4 {
                // Chunk 2j (low nibbles) in lanes 0-7, chunk 2j + 1 (high nibbles) in 8-15.
                let idx = _mm512_set_epi64(
                    0x0000_0001_0000_0001 * (2 * j as i64 + 1),
                    0x0000_0001_0000_0001 * (2 * j as i64 + 1),
                    0x0000_0001_0000_0001 * (2 * j as i64 + 1),
                    0x0000_0001_0000_0001 * (2 * j as i64 + 1),
                    0x0000_0001_0000_0001 * (2 * j as i64),
                    0x0000_0001_0000_0001 * (2 * j as i64),
                    0x0000_0001_0000_0001 * (2 * j as i64),
                    0x0000_0001_0000_0001 * (2 * j as i64),
                );
                let s = _mm512_permutexvar_epi32(idx, scales);
                let q = load_256(&b[16 + 32 * j..]);
                let w = _mm512_and_si512(
                    _mm512_inserti64x4::<1>(_mm512_castsi256_si512(q), _mm256_srli_epi16::<4>(q)),
                    m4,
                );
                for r in 0..R {
                    let x = load_512(&ar[r][sb * QK_K + 64 * j..]);
                    let p = _mm512_dpbusd_epi32(zero, w, x);
                    sumi[r] = _mm512_dpwssd_epi32(sumi[r], p, s);
                }
            }
        } else {
            // Sixteen signed 8-bit scales as 32-bit lanes: low 16 bits the signed scale, high
            // 16 bits zero.
            let scales = _mm512_and_si512(
                _mm512_cvtepi8_epi32(load_128(&b[192..])),
                _mm512_set1_epi32(0xFFFF),
            );
            for n in 0..2 {
                let ql = load_512(&b[64 * n..]);
                let h = load_256(&b[128 + 32 * n..]);
                let h2 =
                    _mm512_inserti64x4::<1>(_mm512_castsi256_si512(h), _mm256_srli_epi16::<2>(h));
                // Chunks 4n, 4n + 1 (low nibbles, bit pairs 0 and 1) and 4n + 2, 4n + 3 (high
                // nibbles, bit pairs 2 and 3).
                let pairs = [
                    (
                        _mm512_and_si512(ql, m4),
                        _mm512_slli_epi16::<4>(_mm512_and_si512(h2, m3)),
                    ),
                    (
                        _mm512_and_si512(_mm512_srli_epi16::<4>(ql), m4),
                        _mm512_slli_epi16::<4>(_mm512_and_si512(_mm512_srli_epi16::<4>(h2), m3)),
                    ),
                ];
                for (p, (low, high)) in pairs.into_iter().enumerate() {
                    let c = 4 * n + 2 * p;
                    let w = _mm512_sub_epi8(_mm512_or_si512(low, high), m32);
                    let init = _mm512_sub_epi32(zero, _mm512_dpbusd_epi32(zero, bias, w));
                    // Lanes 0-3 scale 2c, 4-7 scale 2c + 1, 8-11 scale 2c + 2, 12-15 scale 2c + 3.
                    let e = |i: usize| (0x0000_0001_0000_0001 * (2 * c + i) as u64) as i64;
                    let idx = _mm512_set_epi64(e(3), e(3), e(2), e(2), e(1), e(1), e(0), e(0));
                    let s = _mm512_permutexvar_epi32(idx, scales);
                    for r in 0..R {
                        let x = load_512(&ab[r][sb * QK_K + c * QK..]);
                        let q = _mm512_dpbusd_epi32(init, x, w);
                        sumi[r] = _mm512_dpwssd_epi32(sumi[r], q, s);
                    }
                }
            }
        }
        let dw = half_at(b, if Q4K { 0 } else { 208 });
        for r in 0..R {
            let da = a.d[(first + r) * nsb + sb];
            let s = _mm256_add_epi32(
                _mm512_castsi512_si256(sumi[r]),
                _mm512_extracti64x4_epi64::<1>(sumi[r]),
            );
            acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(da * dw), _mm256_cvtepi32_ps(s), acc[r]);
        }
        if Q4K {
            let dmin = half_at(b, 2);
            for (r, acc_m) in acc_m.iter_mut().enumerate() {
                let ab = (first + r) * nsb + sb;
                let prod = _mm_madd_epi16(mins, load_128(&a.sums[ab * CHUNKS..]));
                *acc_m = _mm_fmadd_ps(_mm_set1_ps(-a.d[ab] * dmin), _mm_cvtepi32_ps(prod), *acc_m);
            }
        }
    }
    let mut out = [0f32; R];
    for r in 0..R {
        out[r] = hsum_avx(acc[r]);
        if Q4K {
            out[r] += hsum4_avx(acc_m[r]);
        }
    }
    out
}

/// One Q5_0 block (16 bytes of nibbles `qs`, fifth bits `qh`) as 32 values
/// `(nibble | fifth bit << 4) − 16`, portable code: the fifth bits become 0x10 / 0 bytes by four
/// table lookups.
#[inline(always)]
fn unpack_q5_0_generic(qs: &[u8], qh: u32, out: &mut [i8]) {
    let mut hb = [0u8; QK];
    for (i, c) in hb.chunks_exact_mut(8).enumerate() {
        c.copy_from_slice(&HBIT[(qh >> (8 * i)) as u8 as usize].to_le_bytes());
    }
    let (lo, hi) = out[..QK].split_at_mut(16);
    let (hlo, hhi) = hb.split_at(16);
    for ((((l, h), &b), &bl), &bh) in lo.iter_mut().zip(hi.iter_mut()).zip(qs).zip(hlo).zip(hhi) {
        // At most 31 before the subtraction: no overflow.
        *l = ((b & 0x0F) | bl) as i8 - 16;
        *h = ((b >> 4) | bh) as i8 - 16;
    }
}

/// One Q4_1 block's 16 bytes of nibbles as 32 values (low nibbles = values 0..16, high =
/// 16..32), portable code.
#[inline(always)]
fn unpack_q4_1_generic(qs: &[u8], out: &mut [i8]) {
    let (lo, hi) = out[..QK].split_at_mut(16);
    for ((l, h), &b) in lo.iter_mut().zip(hi.iter_mut()).zip(&qs[..16]) {
        *l = (b & 0x0F) as i8;
        *h = (b >> 4) as i8;
    }
}

/// The same with AVX2 (ggml's `bytes_from_nibbles_32`): one load, shift, mask and store
/// instead of 32 byte operations (the portable loop did not vectorize inside the tile).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
#[inline]
#[allow(unsafe_code)]
fn unpack_q4_1_avx2(qs: &[u8], out: &mut [i8]) {
    use std::arch::x86_64::{
        __m128i, __m256i, _mm_loadu_si128, _mm_srli_epi16, _mm256_and_si256, _mm256_set_m128i,
        _mm256_set1_epi8, _mm256_storeu_si256,
    };
    assert!(qs.len() >= 16 && out.len() >= QK);
    // SAFETY: `qs` holds at least 16 bytes (asserted above); `loadu` has no alignment
    // requirement.
    let packed = unsafe { _mm_loadu_si128(qs.as_ptr().cast::<__m128i>()) };
    let nibbles = _mm256_and_si256(
        _mm256_set_m128i(_mm_srli_epi16::<4>(packed), packed),
        _mm256_set1_epi8(0x0F),
    );
    // SAFETY: `out` holds at least 32 bytes (asserted above); `storeu` has no alignment
    // requirement.
    unsafe { _mm256_storeu_si256(out.as_mut_ptr().cast::<__m256i>(), nibbles) }
}

/// The same with AVX2, as ggml's `bytes_from_nibbles_32` + `bytes_from_bits_32`: a byte whose
/// fifth bit is clear gets `0xF0` OR-ed onto its nibble, which as `i8` is `nibble − 16`; a set
/// fifth bit leaves `nibble` = `nibble + 16 − 16`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
#[inline]
#[allow(unsafe_code)]
fn unpack_q5_0_avx2(qs: &[u8], qh: u32, out: &mut [i8]) {
    use std::arch::x86_64::{
        __m128i, __m256i, _mm_loadu_si128, _mm_srli_epi16, _mm256_and_si256, _mm256_andnot_si256,
        _mm256_cmpeq_epi8, _mm256_or_si256, _mm256_set_epi64x, _mm256_set_m128i, _mm256_set1_epi8,
        _mm256_set1_epi32, _mm256_set1_epi64x, _mm256_shuffle_epi8, _mm256_storeu_si256,
    };
    assert!(qs.len() >= 16 && out.len() >= QK);
    // SAFETY: `qs` holds at least 16 bytes (asserted above); `loadu` has no alignment
    // requirement.
    let packed = unsafe { _mm_loadu_si128(qs.as_ptr().cast::<__m128i>()) };
    let nibbles = _mm256_and_si256(
        _mm256_set_m128i(_mm_srli_epi16::<4>(packed), packed),
        _mm256_set1_epi8(0x0F),
    );
    // Byte i gets byte i/8 of qh, OR-ed with a mask that leaves only bit i%8 clear: all ones
    // exactly when that bit is set.
    let spread = _mm256_shuffle_epi8(
        _mm256_set1_epi32(qh as i32),
        _mm256_set_epi64x(
            0x0303_0303_0303_0303,
            0x0202_0202_0202_0202,
            0x0101_0101_0101_0101,
            0,
        ),
    );
    let set = _mm256_cmpeq_epi8(
        _mm256_or_si256(spread, _mm256_set1_epi64x(0x7fbf_dfef_f7fb_fdfe)),
        _mm256_set1_epi64x(-1),
    );
    let high = _mm256_andnot_si256(set, _mm256_set1_epi8(0xF0u8 as i8));
    // SAFETY: `out` holds at least 32 bytes (asserted above); `storeu` has no alignment
    // requirement.
    unsafe {
        _mm256_storeu_si256(
            out.as_mut_ptr().cast::<__m256i>(),
            _mm256_or_si256(nibbles, high),
        )
    }
}

/// ggml's `hsum_float_8`: `((l0+l4) + (l2+l6)) + ((l1+l5) + (l3+l7))`.
#[inline(always)]
fn hsum_lanes(l: &Lanes) -> f32 {
    let r = [l[0] + l[4], l[1] + l[5], l[2] + l[6], l[3] + l[7]];
    (r[0] + r[2]) + (r[1] + r[3])
}

/// One block into the lane accumulators, portable code. Lanes order: lane `j` +=
/// `d · Σ_{t<4} w[4j+t]·a[4j+t]` with a single rounding (`mul_add` is a correctly rounded fused
/// multiply-add on every target). Per-block order: lane 0 += `d · Σ w·a` (multiply, then add).
#[inline(always)]
fn fma_block_generic(acc: &mut Lanes, d: f32, w: &[i8], a: &[i8], lanes: bool) {
    if !lanes {
        let s: i32 = w
            .iter()
            .zip(a)
            .map(|(&x, &y)| i32::from(x) * i32::from(y))
            .sum();
        acc[0] += d * s as f32;
        return;
    }
    for ((l, w4), a4) in acc.iter_mut().zip(w.chunks_exact(4)).zip(a.chunks_exact(4)) {
        let s: i32 = w4
            .iter()
            .zip(a4)
            .map(|(&x, &y)| i32::from(x) * i32::from(y))
            .sum();
        *l = d.mul_add(s as f32, *l);
    }
}

/// The same with AVX2 + FMA, exactly (no saturation can occur): `vpmaddubsw` multiplies |w|
/// (as u8) by a with w's sign and adds pairs into i16 (|pair| ≤ 2·128·127 = 32,512 < 32,767),
/// `vpmaddwd` against ones widens to the eight i32 lanes, which are converted to f32 (exact:
/// |lane| < 2²⁴) and fused-multiply-added — ggml's `mul_sum_i8_pairs_float` + `_mm256_fmadd_ps`
/// — or, in the per-block order, summed as integers first (`hsum_i32_8`). The prefill kernels
/// ([`lanes_micro`], [`block_micro`]) do these steps in register tiles; decode-sized
/// calls use this one.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
#[inline]
#[allow(unsafe_code)]
fn fma_block_avx2(acc: &mut Lanes, d: f32, w: &[i8], a: &[i8], lanes: bool) {
    use std::arch::x86_64::{
        __m256i, _mm_add_epi32, _mm_cvtsi128_si32, _mm_shuffle_epi32, _mm256_castsi256_si128,
        _mm256_cvtepi32_ps, _mm256_extracti128_si256, _mm256_fmadd_ps, _mm256_loadu_ps,
        _mm256_loadu_si256, _mm256_madd_epi16, _mm256_maddubs_epi16, _mm256_set1_epi16,
        _mm256_set1_ps, _mm256_sign_epi8, _mm256_storeu_ps,
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
    if lanes {
        // SAFETY: `acc` is 8 floats; `loadu`/`storeu` have no alignment requirement.
        unsafe {
            let r = _mm256_fmadd_ps(
                _mm256_set1_ps(d),
                _mm256_cvtepi32_ps(quads),
                _mm256_loadu_ps(acc.as_ptr()),
            );
            _mm256_storeu_ps(acc.as_mut_ptr(), r);
        }
    } else {
        let s = _mm_add_epi32(
            _mm256_castsi256_si128(quads),
            _mm256_extracti128_si256::<1>(quads),
        );
        let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b01_00_11_10>(s));
        let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b10_11_00_01>(s));
        acc[0] += d * _mm_cvtsi128_si32(s) as f32;
    }
}

/// Instruction-set tier of the own kernels, detected once (or forced by
/// [`KERNEL_TIER_ENV`]). A value other than `Generic` only exists for a CPU that has every
/// feature of its kernels ([`Tier::supported`]), which is what makes calling them sound.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Tier {
    Generic,
    #[cfg(target_arch = "x86_64")]
    Avx2,
    #[cfg(target_arch = "x86_64")]
    Avx512,
}

/// Environment variable forcing a kernel tier: `portable`, `avx2` or `avx512` (AVX-512
/// F/BW/VL + VNNI). A tier the CPU lacks is refused: [`kernel_tier`] returns the error (model
/// loading fails with it) and the kernels never run instructions the CPU does not have.
pub const KERNEL_TIER_ENV: &str = "AIRLOCK_KERNEL_TIER";

impl Tier {
    /// The name used by [`KERNEL_TIER_ENV`] and in bench output.
    fn name(self) -> &'static str {
        match self {
            Tier::Generic => "portable",
            #[cfg(target_arch = "x86_64")]
            Tier::Avx2 => "avx2",
            #[cfg(target_arch = "x86_64")]
            Tier::Avx512 => "avx512",
        }
    }

    /// Every tier this CPU can run, the portable one first and the widest last.
    fn supported() -> Vec<Tier> {
        #[allow(unused_mut)]
        let mut tiers = vec![Tier::Generic];
        #[cfg(target_arch = "x86_64")]
        if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") {
            tiers.push(Tier::Avx2);
            if is_x86_feature_detected!("avx512f")
                && is_x86_feature_detected!("avx512bw")
                && is_x86_feature_detected!("avx512vl")
                && is_x86_feature_detected!("avx512vnni")
            {
                tiers.push(Tier::Avx512);
            }
        }
        tiers
    }

    /// The tier named by `request` (`None`: the widest supported one).
    fn choose(request: Option<&str>) -> Result<Tier, String> {
        let supported = Self::supported();
        let Some(name) = request.map(str::trim).filter(|s| !s.is_empty()) else {
            return Ok(*supported.last().unwrap_or(&Tier::Generic));
        };
        let known = ["portable", "avx2", "avx512"];
        if !known.contains(&name) {
            return Err(format!(
                "{KERNEL_TIER_ENV}={name:?} is not a kernel tier (one of {})",
                known.join(", ")
            ));
        }
        supported
            .iter()
            .copied()
            .find(|t| t.name() == name)
            .ok_or_else(|| {
                format!(
                    "{KERNEL_TIER_ENV}={name}: this CPU lacks the instructions of that tier \
                     (supported: {})",
                    supported
                        .iter()
                        .map(|t| t.name())
                        .collect::<Vec<_>>()
                        .join(", ")
                )
            })
    }

    /// The tier every call uses: [`KERNEL_TIER_ENV`] if set and supported, else the widest.
    fn detect() -> Self {
        match Self::selected() {
            Ok(t) => *t,
            // Refused (logged once, and `DecoderModel::load` fails with the message): the widest
            // supported tier, so nothing unsupported can run whatever the caller does.
            Err(_) => *Self::supported().last().unwrap_or(&Tier::Generic),
        }
    }

    fn selected() -> &'static Result<Tier, String> {
        static TIER: std::sync::OnceLock<Result<Tier, String>> = std::sync::OnceLock::new();
        TIER.get_or_init(|| {
            let request = std::env::var(KERNEL_TIER_ENV).ok();
            let t = Self::choose(request.as_deref());
            match &t {
                Ok(t) => tracing::debug!(tier = t.name(), "quantized kernel tier"),
                Err(e) => tracing::error!("{e}"),
            }
            t
        })
    }
}

/// The quantized-kernel tier in use (`portable`, `avx2` or `avx512`), or why the one forced by
/// [`KERNEL_TIER_ENV`] is refused.
pub fn kernel_tier() -> Result<&'static str, String> {
    Tier::selected().clone().map(Tier::name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn own_kernels_match_dequantized_reference() {
        for dtype in [GgmlDType::Q4_1, GgmlDType::Q5_0, GgmlDType::Q8_0] {
            check_against_dequantized(dtype, 96);
        }
        for dtype in [GgmlDType::Q4K, GgmlDType::Q6K] {
            check_against_dequantized(dtype, 512);
        }
    }

    fn check_against_dequantized(dtype: GgmlDType, k: usize) {
        let (n, rows) = (40, 3);
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
                // Activations are quantized to 8 bits: each value moves by at most half a step
                // (max|x|/127 / 2), plus the f16 rounding of the Q8_0 scale (< 0.07 step at
                // |q| ≤ 127), times the weight it meets.
                let step = x[r * k..(r + 1) * k]
                    .iter()
                    .fold(0f32, |m, v| m.max(v.abs()))
                    / 127.0;
                let bound = 0.6 * step * deq[c].iter().map(|v| v.abs()).sum::<f32>() + 1e-4;
                assert!(
                    (got - want).abs() <= bound,
                    "{dtype:?} {r},{c}: {got} vs {want} (bound {bound})"
                );
            }
        }
    }

    /// The SIMD tiers this CPU has, with a clear note for the ones it lacks.
    fn simd_tiers() -> Vec<Tier> {
        let tiers = Tier::supported();
        #[cfg(target_arch = "x86_64")]
        {
            if !tiers.contains(&Tier::Avx2) {
                println!("skipped: no AVX2+FMA");
            }
            if !tiers.contains(&Tier::Avx512) {
                println!("skipped: no AVX-512 VNNI (avx512f+bw+vl+vnni)");
            }
        }
        tiers.into_iter().filter(|&t| t != Tier::Generic).collect()
    }

    #[test]
    fn every_tier_is_bit_identical_to_the_generic_code() {
        for tier in simd_tiers() {
            every_tier_case(tier);
        }
    }

    fn every_tier_case(tier: Tier) {
        let tiers = [Tier::Generic, tier];
        // Shapes with leftover rows (1-3 after groups of four), leftover columns (odd counts,
        // partial column tiles), calls big enough for the VNNI 4 × 4 tile (45, 219 rows) and,
        // for the last of each, more rows than one row block.
        let blocks = [
            (48, 64, 1),
            (40, 96, 5),
            (16, 32, 17),
            (24, 896, 6),
            (7, 64, 45),
            (5, 896, 219),
        ];
        let k_quants = [
            (48, 256, 1),
            (13, 512, 5),
            (16, 256, 17),
            (9, 768, 6),
            (5, 512, 40),
            (3, 4864, 43),
        ];
        for (dtype, shapes) in [
            (GgmlDType::Q4_1, &blocks),
            (GgmlDType::Q5_0, &blocks),
            (GgmlDType::Q8_0, &blocks),
            (GgmlDType::Q4K, &k_quants),
            (GgmlDType::Q6K, &k_quants),
        ] {
            for &(n, k, rows) in shapes {
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

    /// xorshift64 stream for the random-block tests.
    fn xorshift(seed: u64) -> impl FnMut() -> u64 {
        let mut x = seed;
        move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        }
    }

    /// A weight of `dtype` made of random bytes (every bit pattern of the values, the fifth
    /// bits and the K-quant scales; the f16 scales random but finite), not a quantized matrix.
    fn random_weight(
        dtype: GgmlDType,
        n: usize,
        k: usize,
        next: &mut impl FnMut() -> u64,
    ) -> OwnWeight {
        let scale = |next: &mut dyn FnMut() -> u64| {
            // A finite f16 between 2⁻¹⁴ and 2, either sign.
            let bits = ((next() as u16) & 0x83ff) | (((next() % 15) as u16 + 1) << 10);
            f16::from_bits(bits)
        };
        let bytes = |len: usize, next: &mut dyn FnMut() -> u64| -> Vec<u8> {
            (0..len).map(|_| next() as u8).collect()
        };
        let nb = n * k / QK;
        let kind = match dtype {
            GgmlDType::Q4_1 => Kind::Q4_1 {
                d: (0..nb).map(|_| scale(next).to_f32()).collect(),
                m: (0..nb).map(|_| scale(next).to_f32()).collect(),
                qs: bytes(nb * 16, next),
            },
            GgmlDType::Q5_0 => Kind::Q5_0 {
                d: (0..nb).map(|_| scale(next).to_f32()).collect(),
                qh: (0..nb).map(|_| next() as u32).collect(),
                qs: bytes(nb * 16, next),
            },
            GgmlDType::Q8_0 => Kind::Q8_0 {
                d: (0..nb).map(|_| scale(next).to_f32()).collect(),
                qs: bytes(nb * QK, next).into_iter().map(|b| b as i8).collect(),
            },
            GgmlDType::Q4K | GgmlDType::Q6K => {
                let q4k = dtype == GgmlDType::Q4K;
                let size = if q4k { Q4_K_BYTES } else { Q6_K_BYTES };
                let mut blocks = bytes(n * k / QK_K * size, next);
                for b in blocks.chunks_exact_mut(size) {
                    let at = if q4k { [0, 2] } else { [208, 208] };
                    for i in at {
                        b[i..i + 2].copy_from_slice(&scale(next).to_le_bytes());
                    }
                }
                if q4k {
                    Kind::Q4K { blocks }
                } else {
                    Kind::Q6K { blocks }
                }
            }
            other => panic!("{other:?}"),
        };
        OwnWeight { n, k, kind }
    }

    #[test]
    fn every_tier_is_bit_identical_on_random_blocks() {
        let tiers = simd_tiers();
        let mut next = xorshift(0x243f_6a88_85a3_08d3);
        let blocks = [
            (1, 32, 1),
            (17, 96, 3),
            (9, 160, 7),
            (33, 896, 5),
            (8, 64, 70),
        ];
        let k_quants = [(1, 256, 1), (9, 256, 2), (17, 768, 7), (5, 512, 70)];
        for (dtype, shapes) in [
            (GgmlDType::Q4_1, &blocks[..]),
            (GgmlDType::Q5_0, &blocks[..]),
            (GgmlDType::Q8_0, &blocks[..]),
            (GgmlDType::Q4K, &k_quants[..]),
            (GgmlDType::Q6K, &k_quants[..]),
        ] {
            for &(n, k, rows) in shapes {
                for rep in 0..3 {
                    let own = random_weight(dtype, n, k, &mut next);
                    // Activations of mixed magnitudes, with an outlier per row (the quantized
                    // values then reach ±127 and the small ones round to few bits).
                    let x: Vec<f32> = (0..rows * k)
                        .map(|i| {
                            let v = ((next() >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 8.0;
                            if i % k == (rep * 37) % k { v * 40.0 } else { v }
                        })
                        .collect();
                    let want = own.matmul_with(Tier::Generic, &x, rows);
                    for &tier in &tiers {
                        let got = own.matmul_with(tier, &x, rows);
                        let same = got
                            .iter()
                            .zip(&want)
                            .all(|(g, w)| g.to_bits() == w.to_bits());
                        assert!(
                            same,
                            "{dtype:?} {n}x{k} rows {rows} tier {tier:?}: {got:?} vs {want:?}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn forced_tier_is_refused_when_unknown_or_unsupported() {
        assert_eq!(Tier::choose(Some("portable")), Ok(Tier::Generic));
        assert_eq!(Tier::choose(None), Ok(*Tier::supported().last().unwrap()));
        let e = Tier::choose(Some("avx9000")).unwrap_err();
        assert!(e.contains("not a kernel tier"), "{e}");
        for name in ["avx2", "avx512"] {
            match Tier::supported().iter().find(|t| t.name() == name) {
                Some(&t) => assert_eq!(Tier::choose(Some(name)), Ok(t)),
                None => {
                    let e = Tier::choose(Some(name)).unwrap_err();
                    assert!(e.contains("lacks"), "{e}");
                }
            }
        }
    }

    #[test]
    #[allow(unsafe_code)]
    fn simd_block_kernel_is_bit_identical_at_the_extremes() {
        #[cfg(target_arch = "x86_64")]
        if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") {
            let mut cases: Vec<([i8; QK], [i8; QK])> = vec![
                ([-128; QK], [127; QK]),
                ([-128; QK], [-127; QK]),
                ([127; QK], [127; QK]),
                ([15; QK], [-127; QK]),
                ([-16; QK], [-127; QK]),
                ([0; QK], [-128; QK]),
            ];
            let mut x = 0x2545_f491_4f6c_dd1du64;
            let mut next = || {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x
            };
            for _ in 0..2000 {
                let mut w = [0i8; QK];
                let mut a = [0i8; QK];
                for j in 0..QK {
                    let r = next();
                    w[j] = r as i8;
                    a[j] = ((r >> 8) as i8).max(-127);
                }
                cases.push((w, a));
            }
            for (i, (w, a)) in cases.iter().enumerate() {
                // Scales and running sums of varied magnitudes, so the FMA's single rounding
                // matters (a separate multiply and add would differ in the last bit).
                let r = next();
                let d = f32::from(f16::from_bits((r as u16 & 0x3fff) | 0x0400)) * 1.1e-3;
                let start: Lanes =
                    std::array::from_fn(|j| ((r >> (8 * j)) as u8 as f32 - 128.0) * 3.7e-2);
                for lanes in [true, false] {
                    let (mut generic, mut simd) = (start, start);
                    fma_block_generic(&mut generic, d, w, a, lanes);
                    // SAFETY: AVX2 and FMA were detected just above.
                    unsafe { fma_block_avx2(&mut simd, d, w, a, lanes) };
                    assert_eq!(
                        simd.map(f32::to_bits),
                        generic.map(f32::to_bits),
                        "case {i}, lanes {lanes}: {w:?} · {a:?}"
                    );
                }
                let mut generic = start;
                fma_block_generic(&mut generic, d, w, a, true);
                if i < 6 {
                    // The extremes: every lane is exactly 4·w·a (no i16 saturation).
                    let lane = 4.0 * f32::from(w[0]) * f32::from(a[0]);
                    let want = start.map(|s| d.mul_add(lane, s));
                    assert_eq!(generic, want, "case {i}");
                }
            }
        }
    }

    #[test]
    #[allow(unsafe_code)]
    fn simd_q5_0_unpack_matches_the_portable_one() {
        #[cfg(target_arch = "x86_64")]
        if is_x86_feature_detected!("avx2") {
            let mut x = 0x9e37_79b9_7f4a_7c15u64;
            // Every byte value in every position of qh, and random nibbles.
            for i in 0..4 * 256 + 500 {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                let qh = if i < 4 * 256 {
                    ((i % 256) as u32) << (8 * (i / 256))
                } else {
                    x as u32
                };
                let qs: [u8; 16] = std::array::from_fn(|j| (x >> (j * 4 % 64)) as u8 ^ j as u8);
                let (mut generic, mut simd) = ([0i8; QK], [0i8; QK]);
                unpack_q5_0_generic(&qs, qh, &mut generic);
                // SAFETY: AVX2 was detected just above.
                unsafe { unpack_q5_0_avx2(&qs, qh, &mut simd) };
                assert_eq!(simd, generic, "qh {qh:#x} qs {qs:?}");
            }
        }
    }

    #[test]
    #[allow(unsafe_code)]
    fn simd_q4_1_unpack_matches_the_portable_one() {
        #[cfg(target_arch = "x86_64")]
        if is_x86_feature_detected!("avx2") {
            for i in 0..256usize {
                let qs: [u8; 16] =
                    std::array::from_fn(|j| (i as u8).wrapping_mul(j as u8 + 1) ^ (j as u8 * 17));
                let (mut generic, mut simd) = ([0i8; QK], [0i8; QK]);
                unpack_q4_1_generic(&qs, &mut generic);
                // SAFETY: AVX2 was detected just above.
                unsafe { unpack_q4_1_avx2(&qs, &mut simd) };
                assert_eq!(simd, generic, "{qs:?}");
            }
        }
    }

    #[test]
    fn q5_0_rows_unpack_to_candles_dequantized_values() {
        // Each block has a large positive value (quantized to −16: Q5_0's scale is max/−16) and
        // a slightly smaller negative one (quantized to 16, clamped to 15): both ends of the range.
        let (n, k) = (12, 896);
        let w: Vec<f32> = (0..n * k)
            .map(|i| match i % QK {
                3 => 9.0,
                17 => -8.9,
                _ => ((i * 7919 % 263) as f32 - 131.0) / 37.0,
            })
            .collect();
        let wt = Tensor::from_vec(w, (n, k), &Device::Cpu).unwrap();
        let q = QTensor::quantize(&wt, GgmlDType::Q5_0).unwrap();
        let deq = q
            .dequantize(&Device::Cpu)
            .unwrap()
            .to_vec2::<f32>()
            .unwrap();
        let Weight::Own(own) = Weight::new(q).unwrap() else {
            panic!("Q5_0 must use the own kernel")
        };
        let Kind::Q5_0 { d, .. } = &own.kind else {
            panic!("Q5_0 kind expected")
        };
        let mut row = vec![0i8; k];
        let (mut lowest, mut highest) = (0i8, 0i8);
        for (c, want) in deq.iter().enumerate() {
            own.unpack_row(c, &mut row);
            for (j, (&q, &v)) in row.iter().zip(want).enumerate() {
                assert!((-16..=15).contains(&q), "{c},{j}: {q}");
                // candle dequantizes as `value as f32 * d`: exactly our unpacked value times d.
                assert_eq!(f32::from(q) * d[c * k / QK + j / QK], v, "{c},{j}");
                lowest = lowest.min(q);
                highest = highest.max(q);
            }
        }
        assert_eq!((lowest, highest), (-16, 15));
    }

    #[test]
    fn own_kernels_follow_ggmls_float_order_bit_for_bit() {
        // An independent restatement of each kernel's float operations, straight from ggml:
        // lanes order (AVX2 `vec_dot_q5_0_q8_0` / `_q8_0_q8_0`): acc_j = fma(d_w·d_a, lane_j, acc_j)
        // over the blocks, then hsum_float_8; per-block order (Q4_1): acc += (d_w·d_a)·sumi, then
        // + Σ m_w·s_a.
        // 19 rows: two groups of eight and three left over; 9 blocks: one of eight and one more.
        let (n, k, rows) = (9, 288, 19);
        let w: Vec<f32> = (0..n * k)
            .map(|i| ((i * 6007 % 251) as f32 - 125.0) / 61.0)
            .collect();
        let x: Vec<f32> = (0..rows * k)
            .map(|i| ((i * 7919 % 233) as f32 - 116.0) / 13.0)
            .collect();
        let wt = Tensor::from_vec(w, (n, k), &Device::Cpu).unwrap();
        for dtype in [GgmlDType::Q4_1, GgmlDType::Q5_0, GgmlDType::Q8_0] {
            let Weight::Own(own) = Weight::new(QTensor::quantize(&wt, dtype).unwrap()).unwrap()
            else {
                panic!("own kernel expected")
            };
            let got = own.matmul(&x, rows);
            let a = quantize_q8(&x);
            let kb = k / QK;
            let mut wrow = vec![0i8; k];
            for c in 0..n {
                own.unpack_row(c, &mut wrow);
                for r in 0..rows {
                    let want = match &own.kind {
                        Kind::Q4_1 { d, m, .. } => {
                            let (mut acc, mut summs) = (0f32, 0f32);
                            for b in 0..kb {
                                let ab = r * kb + b;
                                let sumi: i32 = (0..QK)
                                    .map(|j| {
                                        i32::from(wrow[b * QK + j]) * i32::from(a.q[ab * QK + j])
                                    })
                                    .sum();
                                acc += (d[c * kb + b] * a.d[ab]) * sumi as f32;
                                summs += m[c * kb + b] * a.s[ab];
                            }
                            acc + summs
                        }
                        Kind::Q5_0 { d, .. } | Kind::Q8_0 { d, .. } => {
                            let mut l = [0f32; LANES];
                            for b in 0..kb {
                                let ab = r * kb + b;
                                let scale = d[c * kb + b] * a.d[ab];
                                for (j, l) in l.iter_mut().enumerate() {
                                    let lane: i32 = (4 * j..4 * j + 4)
                                        .map(|t| {
                                            i32::from(wrow[b * QK + t])
                                                * i32::from(a.q[ab * QK + t])
                                        })
                                        .sum();
                                    *l = scale.mul_add(lane as f32, *l);
                                }
                            }
                            ((l[0] + l[4]) + (l[2] + l[6])) + ((l[1] + l[5]) + (l[3] + l[7]))
                        }
                        Kind::Q4K { .. } | Kind::Q6K { .. } => unreachable!("block types only"),
                    };
                    assert_eq!(
                        got[r * n + c].to_bits(),
                        want.to_bits(),
                        "{dtype:?} row {r} col {c}"
                    );
                }
            }
        }
    }

    #[test]
    fn k_quant_kernels_match_candles_matmul() {
        // Ours against candle's own QMatMul (repacked kernels, Q8_K activations as ggml) on the
        // same quantized matrix: they differ by float rounding only (and by a last-bit
        // activation step where a value falls exactly half-way: candle rounds away from zero,
        // ggml and we to even; the data here has no such ties).
        let (n, k) = (40, 512);
        let w: Vec<f32> = (0..n * k)
            .map(|i| ((i * 7919 % 509) as f32 - 254.0) / 97.0)
            .collect();
        let wt = Tensor::from_vec(w, (n, k), &Device::Cpu).unwrap();
        for dtype in [GgmlDType::Q4K, GgmlDType::Q6K] {
            let reference = QMatMul::from_qtensor(QTensor::quantize(&wt, dtype).unwrap()).unwrap();
            let weight = Weight::new(QTensor::quantize(&wt, dtype).unwrap()).unwrap();
            assert!(matches!(weight, Weight::Own(_)));
            for rows in [1, 3, 8, 21] {
                let x: Vec<f32> = (0..rows * k)
                    .map(|i| ((i * 104_729 % 211) as f32 - 105.0) / 31.0)
                    .collect();
                let got = weight.matmul(&x, rows).unwrap();
                let want = Weight::candle_matmul(&reference, &x, rows).unwrap();
                assert_eq!(got.len(), want.len());
                for (i, (g, r)) in got.iter().zip(&want).enumerate() {
                    assert!(
                        (g - r).abs() <= 2e-6 * (1.0 + r.abs()),
                        "{dtype:?} rows {rows} [{i}]: {g} vs {r}"
                    );
                }
            }
        }
    }

    #[test]
    fn q8_k_activations_match_candles_quantizer() {
        use candle_core::quantized::k_quants::{BlockQ8K, GgmlType};
        let x: Vec<f32> = (0..3 * QK_K)
            .map(|i| ((i * 7919 % 1013) as f32 - 500.0) / 37.0 + if i == 300 { -40.0 } else { 0.0 })
            .collect();
        let ours = quantize_q8k_generic(&x, 1);
        let mut theirs = vec![BlockQ8K::zeros(); 3];
        BlockQ8K::from_float(&x, &mut theirs);
        let mut deq = vec![0f32; x.len()];
        BlockQ8K::to_float(&theirs, &mut deq);
        for (i, &v) in deq.iter().enumerate() {
            assert_eq!(ours.d[i / QK_K] * f32::from(ours.q[i]), v, "{i}");
        }
        for (j, s) in ours.sums.iter().enumerate() {
            let want: i32 = ours.q[j * QK..(j + 1) * QK]
                .iter()
                .map(|&v| i32::from(v))
                .sum();
            assert_eq!(i32::from(*s), want);
        }
        // The value of largest magnitude maps to −127 whatever its sign (iscale = −127/max).
        assert_eq!(ours.q[300], -127);
        assert!(ours.d[1] > 0.0 && ours.q[QK_K..2 * QK_K].iter().all(|&v| v >= -127));
    }

    /// ggml's AVX2 `ggml_vec_dot_q4_K_q8_K` / `_q6_K_q8_K` restated lane by lane straight from
    /// the GGUF block bytes (its `utmp` scale unpacking, its chunk order), for one weight row
    /// and one Q8_K activation row.
    fn ggml_k_dot(q4k: bool, blocks: &[u8], a: &[i8], ad: &[f32]) -> f32 {
        let half = |b: &[u8], i: usize| f16::from_le_bytes([b[i], b[i + 1]]).to_f32();
        let bytes = if q4k { Q4_K_BYTES } else { Q6_K_BYTES };
        let (mut acc, mut acc_m) = ([0f32; LANES], [0f32; 4]);
        for (i, x) in blocks.chunks_exact(bytes).enumerate() {
            let q8 = &a[i * QK_K..(i + 1) * QK_K];
            let mut sumi = [0i32; LANES];
            // `chunk(c, scale_of_lane_half, value)`: one 32-value chunk into the lanes.
            let mut chunk = |c: usize, sc: [i32; 2], v: &dyn Fn(usize) -> i32| {
                for u in 0..QK {
                    sumi[u / 4] += sc[u / 16] * v(u) * i32::from(q8[c * QK + u]);
                }
            };
            if q4k {
                let mut utmp = [0u32; 4];
                for (j, u) in utmp.iter_mut().take(3).enumerate() {
                    *u = u32::from_le_bytes(x[4 + 4 * j..8 + 4 * j].try_into().unwrap());
                }
                let (k1, k2, k3) = (0x3f3f_3f3fu32, 0x0f0f_0f0fu32, 0x0303_0303u32);
                utmp[3] = ((utmp[2] >> 4) & k2) | (((utmp[1] >> 6) & k3) << 4);
                let uaux = utmp[1] & k1;
                utmp[1] = (utmp[2] & k2) | (((utmp[0] >> 6) & k3) << 4);
                utmp[2] = uaux;
                utmp[0] &= k1;
                let sm: Vec<i32> = utmp
                    .iter()
                    .flat_map(|u| u.to_le_bytes())
                    .map(i32::from)
                    .collect();
                let qs = &x[16..144];
                for j in 0..4 {
                    let lo = |u: usize| i32::from(qs[32 * j + u] & 0xF);
                    let hi = |u: usize| i32::from(qs[32 * j + u] >> 4);
                    chunk(2 * j, [sm[2 * j]; 2], &lo);
                    chunk(2 * j + 1, [sm[2 * j + 1]; 2], &hi);
                }
                let bsums: Vec<i32> = q8
                    .chunks_exact(16)
                    .map(|c| c.iter().map(|&v| i32::from(v)).sum())
                    .collect();
                let q8s: Vec<i32> = bsums.chunks_exact(2).map(|p| p[0] + p[1]).collect();
                let d = ad[i] * half(x, 0);
                let dmin = -ad[i] * half(x, 2);
                for (l, s) in acc.iter_mut().zip(sumi) {
                    *l = d.mul_add(s as f32, *l);
                }
                for (t, m) in acc_m.iter_mut().enumerate() {
                    let prod = sm[8 + 2 * t] * q8s[2 * t] + sm[9 + 2 * t] * q8s[2 * t + 1];
                    *m = dmin.mul_add(prod as f32, *m);
                }
            } else {
                let sc: Vec<i32> = x[192..208].iter().map(|&v| i32::from(v as i8)).collect();
                for j in 0..2 {
                    let (ql, qh) = (&x[64 * j..64 * j + 64], &x[128 + 32 * j..160 + 32 * j]);
                    let q = |m: usize, u: usize| {
                        let low = if m.is_multiple_of(2) {
                            ql[u]
                        } else {
                            ql[32 + u]
                        };
                        let low = if m < 2 { low & 0xF } else { low >> 4 };
                        let high = (qh[u] >> (2 * m)) & 3;
                        i32::from(low | (high << 4)) - 32
                    };
                    for m in 0..4 {
                        let s = [sc[8 * j + 2 * m], sc[8 * j + 2 * m + 1]];
                        chunk(4 * j + m, s, &|u| q(m, u));
                    }
                }
                let d = ad[i] * half(x, 208);
                for (l, s) in acc.iter_mut().zip(sumi) {
                    *l = d.mul_add(s as f32, *l);
                }
            }
        }
        let mut v = hsum_lanes(&acc);
        if q4k {
            v += (acc_m[0] + acc_m[2]) + (acc_m[1] + acc_m[3]);
        }
        v
    }

    #[test]
    fn k_quant_kernels_follow_ggmls_float_order_bit_for_bit() {
        let (n, k, rows) = (11, 768, 6);
        let w: Vec<f32> = (0..n * k)
            .map(|i| ((i * 6007 % 251) as f32 - 125.0) / 61.0 * if i % 97 == 0 { 9.0 } else { 1.0 })
            .collect();
        let x: Vec<f32> = (0..rows * k)
            .map(|i| ((i * 7919 % 233) as f32 - 116.0) / 13.0)
            .collect();
        let wt = Tensor::from_vec(w, (n, k), &Device::Cpu).unwrap();
        for dtype in [GgmlDType::Q4K, GgmlDType::Q6K] {
            let q = QTensor::quantize(&wt, dtype).unwrap();
            let data = q.data().unwrap().to_vec();
            let Weight::Own(own) = Weight::new(q).unwrap() else {
                panic!("own kernel expected")
            };
            let a = quantize_q8k_generic(&x, rows);
            let nsb = k / QK_K;
            let row_bytes = data.len() / n;
            for tier in Tier::supported() {
                let got = own.matmul_with(tier, &x, rows);
                for r in 0..rows {
                    for c in 0..n {
                        let want = ggml_k_dot(
                            dtype == GgmlDType::Q4K,
                            &data[c * row_bytes..(c + 1) * row_bytes],
                            &a.q[r * k..(r + 1) * k],
                            &a.d[r * nsb..(r + 1) * nsb],
                        );
                        assert_eq!(
                            got[r * n + c].to_bits(),
                            want.to_bits(),
                            "{dtype:?} {tier:?} row {r} col {c}: {} vs {want}",
                            got[r * n + c]
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn lanes_are_summed_in_ggml_order() {
        // Values whose sum depends on the order: 1e8 cancels only when paired as hsum_float_8
        // pairs lanes (0,4), (1,5), (2,6), (3,7).
        let l: Lanes = [1e8, 1.0, 3.0, 5.0, -1e8, 2.0, 4.0, 6.0];
        assert_eq!(hsum_lanes(&l), 21.0);
        let sequential: f32 = l.iter().sum();
        assert_ne!(sequential, 21.0);
    }

    #[test]
    fn magic_rounding_is_round_half_to_even() {
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let mut values: Vec<f32> = (-600..=600).map(|i| i as f32 * 0.25).collect();
        values.extend([127.5, -127.5, 126.5, -0.5, 0.5, 1.5, -2.5, 0.49999997, -0.0]);
        for _ in 0..100_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            values.push(((x >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 300.0);
        }
        for v in values {
            assert_eq!(round_half_even(v), v.round_ties_even() as i32, "{v}");
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

#[cfg(test)]
mod timing {
    use super::*;

    /// User + system CPU seconds of this process (`/proc/self/stat`, 100 Hz ticks).
    fn cpu_secs() -> f64 {
        let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
        let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
        let f: Vec<f64> = rest
            .split_whitespace()
            .filter_map(|v| v.parse().ok())
            .collect();
        (f.get(10).copied().unwrap_or(0.0) + f.get(11).copied().unwrap_or(0.0)) / 100.0
    }

    /// Kernel timings on Qwen2.5-0.5B's shapes (not a correctness test):
    /// `cargo test --release -p airlock-inference --lib kernel_timings -- --ignored --nocapture`.
    #[test]
    #[ignore]
    fn kernel_timings() {
        let only = std::env::var("AIRLOCK_KERNEL").unwrap_or_default();
        println!(
            "tier {} ({KERNEL_TIER_ENV}={:?})",
            Tier::detect().name(),
            std::env::var(KERNEL_TIER_ENV).ok()
        );
        for (dtype, n, k) in [
            (GgmlDType::Q4_1, 1536, 576),
            (GgmlDType::Q5_0, 4864, 896),
            (GgmlDType::Q8_0, 8192, 896),
            (GgmlDType::Q4K, 896, 4864),
            (GgmlDType::Q6K, 896, 4864),
        ] {
            if !only.is_empty() && format!("{dtype:?}") != only {
                continue;
            }
            let w: Vec<f32> = (0..n * k)
                .map(|i| ((i * 7919 % 509) as f32 - 254.0) / 97.0)
                .collect();
            let wt = Tensor::from_vec(w, (n, k), &Device::Cpu).unwrap();
            let Weight::Own(own) = Weight::new(QTensor::quantize(&wt, dtype).unwrap()).unwrap()
            else {
                panic!()
            };
            // AIRLOCK_KERNEL_ROWS=1,64,450 picks the row counts (450: a RAG prompt's prefill).
            let row_counts: Vec<usize> = std::env::var("AIRLOCK_KERNEL_ROWS")
                .ok()
                .map(|v| v.split(',').filter_map(|r| r.trim().parse().ok()).collect())
                .unwrap_or_else(|| vec![1, 4, 8, 64]);
            for rows in row_counts {
                if rows > 1
                    && !only.is_empty()
                    && std::env::var_os("AIRLOCK_KERNEL_ROWS1").is_some()
                {
                    continue;
                }
                let x: Vec<f32> = (0..rows * k)
                    .map(|i| ((i * 104_729 % 211) as f32 - 105.0) / 31.0)
                    .collect();
                let _ = own.matmul(&x, rows);
                let reps = (if only.is_empty() { 60 } else { 600 } / rows.div_ceil(64)).max(3);
                let (t, c) = (std::time::Instant::now(), cpu_secs());
                for _ in 0..reps {
                    std::hint::black_box(own.matmul(&x, rows));
                }
                let s = t.elapsed().as_secs_f64() / reps as f64;
                let cpu = (cpu_secs() - c) / reps as f64 / 2.0;
                println!(
                    "{dtype:?} {n}x{k} rows {rows:3}: {:8.3} ms, {:6.1} GMAC/s wall, {:6.1} per CPU-s/2",
                    s * 1e3,
                    (n * k * rows) as f64 / s / 1e9,
                    (n * k * rows) as f64 / cpu / 1e9
                );
            }
        }
    }
}
