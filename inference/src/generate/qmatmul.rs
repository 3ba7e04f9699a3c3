//! Quantized weight matrices: `y = x · Wᵀ` for a stack of activation rows.
//!
//! K-quants (Q4_K, Q6_K) go through candle: its `QMatMul` (repacked kernels, activations in
//! Q8_K as in ggml) for prefill chunks, and for decode-sized calls its block dot products run
//! over column tiles on rayon ([`KQuantWeight`]), so that one thread pool serves every matmul of
//! a decode step. `Q4_1`, `Q5_0` and `Q8_0` get their own kernels here because candle's differ
//! from ggml in ways that change greedy tokens, or are slow:
//! - its Q8_1 activation blocks store the block sum as `f16(sum) * f16(d)` (two roundings, in
//!   half precision) where ggml stores `f16(d * sum)`, and every Q4_1 block's min term is
//!   multiplied by that sum: on SmolLM2 (all Q4_1) this flipped a token with a 0.33 margin;
//! - its repacked Q8_0 kernel quantizes activations in 256-wide Q8_K blocks where ggml uses
//!   32-wide Q8_0 blocks (SmolLM2's tied lm_head is Q8_0);
//! - its `Q5_0` dot product has no SIMD path at all (scalar), and Q5_0 is what llama.cpp's
//!   Q4_K_M falls back to for every tensor whose rows are not a multiple of 256 wide (all of
//!   Qwen2.5-0.5B's 896-wide Q/K/V/O/gate/up matrices and its token embedding).
//!
//! These kernels quantize activations exactly as ggml's x86 `quantize_row_q8_1`/`_q8_0`
//! (d = max/127, scale 127/max, round half to even, s = f16(d·Σq)). Each 32-value block's
//! integer products are summed exactly (`vpmaddubsw` + `vpmaddwd`: eight i32 lanes of four
//! products each), then accumulated in one of two float orders:
//! - **lanes** (Q5_0, Q8_0): ggml's AVX2 `ggml_vec_dot_q5_0_q8_0` / `_q8_0_q8_0` and llamafile's
//!   tinyBLAS (llama.cpp's prefill path for these types): the lanes are converted to f32 and
//!   accumulated with one fused multiply-add each, `acc = fma(d_w·d_a, lane, acc)`, and summed at
//!   the end of the row in `hsum_float_8`'s order;
//! - **per block** (Q4_1): the block's eight lanes are summed as integers and accumulated as
//!   `acc += (d_w·d_a)·Σq_w·q_a` (ggml's scalar reference order), plus `Σ m_w·s_a` at the end.
//!   ggml's AVX2 Q4_1 kernel uses the lanes order too, but with it SmolLM2's greedy output leaves
//!   llama.cpp's fixture at a 0.19-margin step, while the per-block order matches it (the
//!   remaining difference from llama.cpp's logits, ~0.07 on average per step, is the same in
//!   both orders and comes from elsewhere; see `docs/benchmarks/inference-generate.md`).
//!
//! The portable tier does the same operations lane by lane (`f32::mul_add` is a correctly
//! rounded FMA everywhere), so every tier gives bit-identical results.

use candle_core::quantized::k_quants::{BlockQ4K, BlockQ6K, BlockQ8K, GgmlType, QK_K};
use candle_core::quantized::{GgmlDType, QMatMul, QTensor};
use candle_core::{Device, Module, Tensor};
use half::f16;
use rayon::prelude::*;

/// Values per Q4_1 / Q8_1 block.
const QK: usize = 32;
/// Bytes of one Q4_1 block in GGUF: f16 d, f16 m, 16 bytes of nibbles.
const Q4_1_BYTES: usize = 20;
/// Bytes of one Q5_0 block in GGUF: f16 d, 4 bytes of fifth bits, 16 bytes of nibbles.
const Q5_0_BYTES: usize = 22;
/// Bytes of one Q8_0 block: f16 d, 32 signed bytes.
const Q8_0_BYTES: usize = 34;
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
/// Output columns per parallel work item.
const COL_TILE: usize = 16;
/// Activation rows accumulated together in one pass over a weight row.
const ROW_GROUP: usize = 4;

/// Activation rows up to which K-quant matrices use [`KQuantWeight`]'s rayon path (decode and
/// small decode batches); bigger calls (prefill chunks) use candle's repacked kernels.
const KQUANT_ROWS: usize = 8;

/// A weight matrix `[n, k]` (`n` outputs) in whichever form runs it fastest and faithfully.
pub(crate) enum Weight {
    Candle(QMatMul),
    Own(OwnWeight),
    KQuant(KQuantWeight),
}

impl Weight {
    pub(crate) fn new(t: QTensor) -> candle_core::Result<Self> {
        match t.dtype() {
            GgmlDType::Q4_1 | GgmlDType::Q5_0 | GgmlDType::Q8_0 => {
                Ok(Self::Own(OwnWeight::from_qtensor(&t)?))
            }
            GgmlDType::Q4K | GgmlDType::Q6K => Ok(Self::KQuant(KQuantWeight::from_qtensor(t)?)),
            _ => Ok(Self::Candle(QMatMul::from_qtensor(t)?)),
        }
    }

    /// A weight shared with the token embedding (tied lm_head).
    pub(crate) fn shared(t: &std::sync::Arc<QTensor>) -> candle_core::Result<Self> {
        match t.dtype() {
            GgmlDType::Q4_1 | GgmlDType::Q5_0 | GgmlDType::Q8_0 => {
                Ok(Self::Own(OwnWeight::from_qtensor(t)?))
            }
            _ => Ok(Self::Candle(QMatMul::from_arc(t.clone())?)),
        }
    }

    /// `x` is `[rows, k]` row-major; returns `[rows, n]`.
    pub(crate) fn matmul(&self, x: &[f32], rows: usize) -> candle_core::Result<Vec<f32>> {
        match self {
            Self::Candle(m) => Self::candle_matmul(m, x, rows),
            Self::Own(w) => Ok(w.matmul(x, rows)),
            Self::KQuant(w) if rows <= KQUANT_ROWS => Ok(w.matmul(x, rows)),
            Self::KQuant(w) => Self::candle_matmul(&w.mm, x, rows),
        }
    }

    fn candle_matmul(m: &QMatMul, x: &[f32], rows: usize) -> candle_core::Result<Vec<f32>> {
        let k = x.len() / rows;
        let t = Tensor::from_slice(x, (rows, k), &Device::Cpu)?;
        m.forward(&t)?.flatten_all()?.to_vec1::<f32>()
    }
}

/// A Q4_K or Q6_K matrix: candle's `QMatMul` (repacked kernels, on candle's barrier pool) for
/// prefill chunks, and for decode-sized calls candle's own AVX2 block dot products
/// (`GgmlType::vec_dot`, ggml's `vec_dot_q4_K_q8_K` / `_q6_K_q8_K` with Q8_K activations) run
/// over column tiles on rayon — the pool our other kernels use. With both pools in play on every
/// decode step, each one's idle threads spin while the other works; on two cores that halved the
/// decode speed. Costs a second copy of these weights (Qwen2.5-0.5B's ffn_down: ~72 MB).
pub(crate) struct KQuantWeight {
    mm: QMatMul,
    n: usize,
    k: usize,
    blocks: KBlocks,
}

enum KBlocks {
    Q4K(Vec<BlockQ4K>),
    Q6K(Vec<BlockQ6K>),
}

/// Copies GGUF block bytes into typed candle blocks.
#[allow(unsafe_code)]
fn blocks_from_bytes<T: GgmlType>(data: &[u8], block_bytes: usize) -> candle_core::Result<Vec<T>> {
    let size = std::mem::size_of::<T>();
    if size != block_bytes || !data.len().is_multiple_of(size) {
        candle_core::bail!(
            "{:?}: {} bytes do not split into {block_bytes}-byte blocks of {size}",
            T::DTYPE,
            data.len()
        );
    }
    let mut v = vec![T::zeros(); data.len() / size];
    // SAFETY: `T` is one of candle's `#[repr(C)]` ggml block structs (BlockQ4K, BlockQ6K), made
    // only of integers, byte arrays and f16, without padding (their size equals the GGUF block
    // size, checked above), so every byte pattern is a valid value; `v` holds exactly
    // `data.len()` bytes and does not overlap `data`.
    unsafe {
        std::ptr::copy_nonoverlapping(data.as_ptr(), v.as_mut_ptr().cast::<u8>(), data.len());
    }
    Ok(v)
}

impl KQuantWeight {
    fn from_qtensor(t: QTensor) -> candle_core::Result<Self> {
        let (n, k) = t.shape().dims2()?;
        if !k.is_multiple_of(QK_K) {
            candle_core::bail!("row width {k} is not a multiple of {QK_K}");
        }
        let data = t.data()?;
        let blocks = match t.dtype() {
            GgmlDType::Q4K => KBlocks::Q4K(blocks_from_bytes(&data, 144)?),
            GgmlDType::Q6K => KBlocks::Q6K(blocks_from_bytes(&data, 210)?),
            other => candle_core::bail!("not a K-quant handled here: {other:?}"),
        };
        let nb = match &blocks {
            KBlocks::Q4K(b) => b.len(),
            KBlocks::Q6K(b) => b.len(),
        };
        if nb != n * k / QK_K {
            candle_core::bail!("{nb} blocks for a {n}x{k} matrix");
        }
        drop(data);
        Ok(Self {
            mm: QMatMul::from_qtensor(t)?,
            n,
            k,
            blocks,
        })
    }

    /// `[rows, k] · Wᵀ` with candle's block dot products over rayon column tiles.
    fn matmul(&self, x: &[f32], rows: usize) -> Vec<f32> {
        let kb = self.k / QK_K;
        let mut a = vec![BlockQ8K::zeros(); rows * kb];
        for (xr, ar) in x.chunks_exact(self.k).zip(a.chunks_exact_mut(kb)) {
            BlockQ8K::from_float(xr, ar);
        }
        let mut by_col = vec![0f32; self.n * rows];
        by_col
            .par_chunks_mut(COL_TILE * rows)
            .enumerate()
            .for_each(|(t, out)| {
                for (c, col_out) in out.chunks_exact_mut(rows).enumerate() {
                    let col = t * COL_TILE + c;
                    for (o, ar) in col_out.iter_mut().zip(a.chunks_exact(kb)) {
                        *o = match &self.blocks {
                            KBlocks::Q4K(w) => {
                                BlockQ4K::vec_dot(self.k, &w[col * kb..(col + 1) * kb], ar)
                            }
                            KBlocks::Q6K(w) => {
                                BlockQ6K::vec_dot(self.k, &w[col * kb..(col + 1) * kb], ar)
                            }
                        };
                    }
                }
            });
        let mut y = vec![0f32; rows * self.n];
        for (col, vals) in by_col.chunks_exact(rows).enumerate() {
            for (r, &v) in vals.iter().enumerate() {
                y[r * self.n + col] = v;
            }
        }
        y
    }
}

/// A Q4_1, Q5_0 or Q8_0 matrix in struct-of-arrays form (still packed: Q4_1/Q5_0 keep their
/// nibbles and fifth bits), multiplied by our own kernels.
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
            GgmlDType::Q5_0 => Q5_0_BYTES,
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
        let kind = if block_bytes == Q5_0_BYTES {
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
        } else if block_bytes == Q4_1_BYTES {
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

    /// Weight row `col` as 8-bit values (Q4_1 nibbles widened, Q5_0 nibbles with their fifth
    /// bits minus 16, Q8_0 copied) into `out`, with the portable Q5_0 block unpacker.
    #[cfg(test)]
    fn unpack_row(&self, col: usize, out: &mut [i8]) {
        self.unpack_row_with(col, out, unpack_q5_0_generic);
    }

    /// [`Self::unpack_row`] with a given Q5_0 block unpacker (portable or SIMD; they give the
    /// same bytes).
    #[inline(always)]
    fn unpack_row_with(
        &self,
        col: usize,
        out: &mut [i8],
        q5_block: impl Fn(&[u8], u32, &mut [i8]),
    ) {
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
            Kind::Q5_0 { qh, qs, .. } => {
                let src = &qs[col * kb * 16..(col + 1) * kb * 16];
                let hs = &qh[col * kb..(col + 1) * kb];
                for ((blk, &h), dst) in src.chunks_exact(16).zip(hs).zip(out.chunks_exact_mut(QK)) {
                    q5_block(blk, h, dst);
                }
            }
            Kind::Q8_0 { qs, .. } => out.copy_from_slice(&qs[col * self.k..(col + 1) * self.k]),
        }
    }

    /// Dot products of one unpacked weight row with every activation row: per block,
    /// `fma_block` adds `(d_w·d_a)·lane` to eight lane accumulators (lane `j` = the exact
    /// integer sum of the block's products `4j..4j+4`) with one FMA each, or, in the per-block
    /// order, `(d_w·d_a)·Σq_w·q_a` to lane 0 (the other lanes stay 0); the lanes are then summed
    /// in `hsum_float_8`'s order, plus `Σ m_w·s_a` for Q4_1. `fma_block` is the portable or a
    /// SIMD version of the same exact operations, so every tier gives the same bits.
    #[inline(always)]
    fn dot_rows(
        &self,
        col: usize,
        w: &[i8],
        a: &Q8Rows,
        out: &mut [f32],
        fma_block: impl Fn(&mut Lanes, f32, &[i8], &[i8], bool) + Copy,
    ) {
        let kb = self.k / QK;
        let wb = col * kb;
        let dw = match &self.kind {
            Kind::Q4_1 { d, .. } | Kind::Q5_0 { d, .. } | Kind::Q8_0 { d, .. } => &d[wb..wb + kb],
        };
        let lanes = self.lanes_order();
        // Four activation rows at a time: four independent accumulators hide the FMA latency
        // and share each weight block load; each row's own operations and their order are
        // unchanged. Leftover rows go one at a time.
        let full = out.len() / ROW_GROUP * ROW_GROUP;
        let (grouped, rest) = out.split_at_mut(full);
        for (g, group) in grouped.chunks_exact_mut(ROW_GROUP).enumerate() {
            let acc = group_lanes::<ROW_GROUP>(g * ROW_GROUP, kb, w, dw, a, fma_block, lanes);
            for (o, l) in group.iter_mut().zip(&acc) {
                *o = hsum_lanes(l);
            }
        }
        for (i, o) in rest.iter_mut().enumerate() {
            let [acc] = group_lanes::<1>(full + i, kb, w, dw, a, fma_block, lanes);
            *o = hsum_lanes(&acc);
        }
        if let Kind::Q4_1 { m, .. } = &self.kind {
            let mw = &m[wb..wb + kb];
            for (r, o) in out.iter_mut().enumerate() {
                let mut summs = 0f32;
                for (m, s) in mw.iter().zip(&a.s[r * kb..(r + 1) * kb]) {
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

    /// One tile of output columns (`out` is `[cols][rows]`) with a given block kernel and
    /// Q5_0 block unpacker. Q8_0 rows are used in place; the others are unpacked once per
    /// column and then meet every activation row.
    #[inline(always)]
    fn tile_with(
        &self,
        first_col: usize,
        a: &Q8Rows,
        rows: usize,
        out: &mut [f32],
        fma_block: impl Fn(&mut Lanes, f32, &[i8], &[i8], bool) + Copy,
        q5_block: impl Fn(&[u8], u32, &mut [i8]) + Copy,
    ) {
        let mut buf = vec![0i8; self.k];
        for (c, col_out) in out.chunks_exact_mut(rows).enumerate() {
            let col = first_col + c;
            let w: &[i8] = match &self.kind {
                Kind::Q8_0 { qs, .. } => &qs[col * self.k..(col + 1) * self.k],
                _ => {
                    self.unpack_row_with(col, &mut buf, q5_block);
                    &buf
                }
            };
            self.dot_rows(col, w, a, col_out, fma_block);
        }
    }

    /// The portable tile (the reference every SIMD tier must match bit for bit).
    #[inline(always)]
    fn tile_generic(&self, first_col: usize, a: &Q8Rows, rows: usize, out: &mut [f32]) {
        self.tile_with(
            first_col,
            a,
            rows,
            out,
            fma_block_generic,
            unpack_q5_0_generic,
        )
    }

    /// The tile with AVX2 block kernels (`vpmaddubsw` + `vpmaddwd` + `vfmadd`, as ggml's x86
    /// code).
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma")]
    fn tile_avx2(&self, first_col: usize, a: &Q8Rows, rows: usize, out: &mut [f32]) {
        self.tile_with(
            first_col,
            a,
            rows,
            out,
            |acc, d, w, x, f| fma_block_avx2(acc, d, w, x, f),
            |qs, qh, dst| unpack_q5_0_avx2(qs, qh, dst),
        )
    }

    /// The same for CPUs with AVX-512 (the AVX2 block kernel, compiled with the wider ISA
    /// enabled).
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma")]
    fn tile_avx512(&self, first_col: usize, a: &Q8Rows, rows: usize, out: &mut [f32]) {
        self.tile_with(
            first_col,
            a,
            rows,
            out,
            |acc, d, w, x, f| fma_block_avx2(acc, d, w, x, f),
            |qs, qh, dst| unpack_q5_0_avx2(qs, qh, dst),
        )
    }

    /// Runs one tile with the widest instruction set the CPU has. Integer sums are exact, each
    /// lane's FMA is one correctly rounded operation in every tier and the float operations
    /// happen in the same order, so all tiers give bit-identical results (tested).
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
/// — or, in the per-block order, summed as integers first (`hsum_i32_8`).
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
        for dtype in [GgmlDType::Q4_1, GgmlDType::Q5_0, GgmlDType::Q8_0] {
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
        for dtype in [GgmlDType::Q4_1, GgmlDType::Q5_0, GgmlDType::Q8_0] {
            for (n, k, rows) in [(48, 64, 1), (40, 96, 5), (16, 32, 17), (24, 896, 6)] {
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
        let (n, k, rows) = (9, 128, 6);
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
    fn k_quant_decode_path_matches_candles_matmul() {
        // The rayon path (candle's block dot products per column) against candle's own QMatMul
        // (repacked kernels) on the same quantized matrix: both quantize activations to Q8_K the
        // same way, so they differ by float rounding only.
        let (n, k) = (40, 512);
        let w: Vec<f32> = (0..n * k)
            .map(|i| ((i * 7919 % 509) as f32 - 254.0) / 97.0)
            .collect();
        let wt = Tensor::from_vec(w, (n, k), &Device::Cpu).unwrap();
        for dtype in [GgmlDType::Q4K, GgmlDType::Q6K] {
            let reference = QMatMul::from_qtensor(QTensor::quantize(&wt, dtype).unwrap()).unwrap();
            let Weight::KQuant(kq) = Weight::new(QTensor::quantize(&wt, dtype).unwrap()).unwrap()
            else {
                panic!("{dtype:?} must use the K-quant weight")
            };
            for rows in [1, 3, KQUANT_ROWS] {
                let x: Vec<f32> = (0..rows * k)
                    .map(|i| ((i * 104_729 % 211) as f32 - 105.0) / 31.0)
                    .collect();
                let got = kq.matmul(&x, rows);
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
    fn lanes_are_summed_in_ggml_order() {
        // Values whose sum depends on the order: 1e8 cancels only when paired as hsum_float_8
        // pairs lanes (0,4), (1,5), (2,6), (3,7).
        let l: Lanes = [1e8, 1.0, 3.0, 5.0, -1e8, 2.0, 4.0, 6.0];
        assert_eq!(hsum_lanes(&l), 21.0);
        let sequential: f32 = l.iter().sum();
        assert_ne!(sequential, 21.0);
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
