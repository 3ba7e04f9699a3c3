//! Dot-product kernels for the vector index: int8·int8 → i32 and f32·f32 → f32.
//!
//! The loops are written so LLVM vectorises them (fixed-width lanes of independent accumulators,
//! no early exits). The int8 kernel is the hot path of both HNSW construction and the exact scan,
//! so it is compiled twice: once for the baseline target (SSE2 on x86-64) and once with AVX2
//! enabled, picked at run time. Both versions are the *same source* (`dot_i8_portable`), so the
//! AVX2 build cannot disagree with the scalar twin except through a compiler bug; a property test
//! checks it anyway.
//!
//! This is the only module of the vector index that needs `unsafe` for SIMD: calling a
//! `#[target_feature]` function is unsafe because running it on a CPU without the feature would be
//! undefined behaviour.
#![allow(unsafe_code)]

/// Lanes of independent i32 accumulators in the int8 kernel (one AVX2 register pair of 16-bit
/// products widened to 32 bits).
const LANES_I8: usize = 32;
/// Lanes of independent f32 accumulators in the f32 kernel.
const LANES_F32: usize = 16;

/// Int8 dot product accumulated in i32, portable code (the scalar twin).
///
/// Extra elements of the longer slice are ignored. Cannot overflow for slices shorter than
/// 2^31 / 127² ≈ 133,000 elements.
#[inline(always)]
pub fn dot_i8_portable(a: &[i8], b: &[i8]) -> i32 {
    let n = a.len().min(b.len());
    let (a, b) = (&a[..n], &b[..n]);
    let mut acc = [0i32; LANES_I8];
    let ca = a.chunks_exact(LANES_I8);
    let cb = b.chunks_exact(LANES_I8);
    let (ra, rb) = (ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        for i in 0..LANES_I8 {
            acc[i] += i32::from(x[i]) * i32::from(y[i]);
        }
    }
    let mut sum: i32 = acc.iter().sum();
    for (&x, &y) in ra.iter().zip(rb) {
        sum += i32::from(x) * i32::from(y);
    }
    sum
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn dot_i8_avx2(a: &[i8], b: &[i8]) -> i32 {
    dot_i8_portable(a, b)
}

/// Int8 dot product accumulated in i32, using AVX2 when the CPU has it.
#[inline]
pub fn dot_i8(a: &[i8], b: &[i8]) -> i32 {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx2") {
            // SAFETY: `dot_i8_avx2` only requires AVX2, which was just detected on this CPU; it
            // is otherwise safe code (slice indexing, bounds-checked).
            return unsafe { dot_i8_avx2(a, b) };
        }
    }
    dot_i8_portable(a, b)
}

/// Asks the CPU to start loading `bytes` into cache (one hint per 64-byte line). A hint only:
/// no effect on results, never faults, a no-op off x86-64. The graph search issues it for a
/// batch of neighbours' rows before computing their distances, so the loads overlap.
#[inline(always)]
pub fn prefetch(bytes: &[i8]) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{_MM_HINT_T0, _mm_prefetch};
        for line in bytes.chunks(64) {
            // SAFETY: `_mm_prefetch` (SSE, part of the x86-64 baseline) is a hint that never
            // faults or reads memory architecturally; the pointer is into a live slice.
            unsafe { _mm_prefetch::<_MM_HINT_T0>(line.as_ptr()) };
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = bytes;
}

/// f32 dot product, portable code (the scalar twin).
#[inline(always)]
pub fn dot_f32_portable(a: &[f32], b: &[f32]) -> f32 {
    let n = a.len().min(b.len());
    let (a, b) = (&a[..n], &b[..n]);
    let mut acc = [0f32; LANES_F32];
    let ca = a.chunks_exact(LANES_F32);
    let cb = b.chunks_exact(LANES_F32);
    let (ra, rb) = (ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        for i in 0..LANES_F32 {
            acc[i] += x[i] * y[i];
        }
    }
    let mut sum: f32 = acc.iter().sum();
    for (&x, &y) in ra.iter().zip(rb) {
        sum += x * y;
    }
    sum
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn dot_f32_avx2(a: &[f32], b: &[f32]) -> f32 {
    dot_f32_portable(a, b)
}

/// f32 dot product, using AVX2 when the CPU has it.
#[inline]
pub fn dot_f32(a: &[f32], b: &[f32]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
        {
            // SAFETY: `dot_f32_avx2` requires AVX2 and FMA, both just detected on this CPU; its
            // body is safe code.
            return unsafe { dot_f32_avx2(a, b) };
        }
    }
    dot_f32_portable(a, b)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn naive_i8(a: &[i8], b: &[i8]) -> i32 {
        a.iter()
            .zip(b)
            .map(|(&x, &y)| i32::from(x) * i32::from(y))
            .sum()
    }

    proptest! {
        #[test]
        fn int8_kernels_agree_with_naive(pairs in proptest::collection::vec((any::<i8>(), any::<i8>()), 0..1100)) {
            let a: Vec<i8> = pairs.iter().map(|p| p.0).collect();
            let b: Vec<i8> = pairs.iter().map(|p| p.1).collect();
            let want = naive_i8(&a, &b);
            prop_assert_eq!(dot_i8_portable(&a, &b), want);
            prop_assert_eq!(dot_i8(&a, &b), want);
        }

        #[test]
        fn f32_kernels_agree_with_naive(pairs in proptest::collection::vec((-1.0f32..1.0, -1.0f32..1.0), 0..1100)) {
            let a: Vec<f32> = pairs.iter().map(|p| p.0).collect();
            let b: Vec<f32> = pairs.iter().map(|p| p.1).collect();
            let want: f64 = a.iter().zip(&b).map(|(&x, &y)| f64::from(x) * f64::from(y)).sum();
            let tol = 1e-4 * (a.len() as f64).sqrt().max(1.0);
            prop_assert!((f64::from(dot_f32_portable(&a, &b)) - want).abs() < tol);
            prop_assert!((f64::from(dot_f32(&a, &b)) - want).abs() < tol);
        }
    }

    #[test]
    fn extremes_do_not_overflow_at_embedding_sizes() {
        let a = vec![-128i8; 1024];
        assert_eq!(dot_i8(&a, &a), 128 * 128 * 1024);
        let b = vec![127i8; 1024];
        assert_eq!(dot_i8(&a, &b), -128 * 127 * 1024);
    }

    #[test]
    fn length_mismatch_uses_the_common_prefix() {
        assert_eq!(dot_i8(&[1, 2, 3], &[4, 5]), 14);
        assert_eq!(dot_f32(&[1.0, 2.0], &[3.0, 4.0, 5.0]), 11.0);
    }
}
