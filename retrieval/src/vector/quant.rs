//! Int8 scalar quantization and the int8 distance given to hnsw_rs.
//!
//! Scheme: **symmetric, one global scale**, calibrated from the data. The clip value `c` is the
//! 99.99th percentile of `|x_i|` over every component of a sample of the first vectors inserted
//! (up to [`CALIBRATION_SAMPLE`] vectors); the scale is `s = 127 / c` and a component quantizes to
//! `round(x · s)` clamped to `[-127, 127]`. One scale for all dimensions keeps the int8 dot product
//! proportional to the f32 one (`x·y ≈ X·Y / s²`), which per-dimension scales would not for
//! vector–vector distances inside the graph. Queries are quantized with the same scale.

use anndists::dist::Distance;

use super::kernels::dot_i8;

/// Maximum number of vectors sampled for calibration.
pub const CALIBRATION_SAMPLE: usize = 20_000;
/// Percentile of `|x_i|` used as the clip value.
pub const CALIBRATION_PERCENTILE: f64 = 0.9999;

/// The int8 quantizer: one global symmetric scale.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Quantizer {
    scale: f32,
}

impl Quantizer {
    /// A quantizer with an explicit scale (`> 0`, finite).
    pub fn with_scale(scale: f32) -> Option<Self> {
        (scale.is_finite() && scale > 0.0).then_some(Self { scale })
    }

    /// Calibrates from sample vectors: clip value = the 99.99th percentile of `|x_i|`.
    /// Returns `None` when the sample has no non-zero finite component.
    pub fn calibrate<'a>(sample: impl IntoIterator<Item = &'a [f32]>) -> Option<Self> {
        let mut mags: Vec<f32> = sample
            .into_iter()
            .take(CALIBRATION_SAMPLE)
            .flat_map(|v| v.iter().map(|x| x.abs()))
            .filter(|x| x.is_finite() && *x > 0.0)
            .collect();
        if mags.is_empty() {
            return None;
        }
        let idx = ((mags.len() - 1) as f64 * CALIBRATION_PERCENTILE).round() as usize;
        let (_, clip, _) = mags.select_nth_unstable_by(idx, f32::total_cmp);
        Self::with_scale(127.0 / *clip)
    }

    /// The scale `s` (int8 value = `round(x · s)`).
    pub fn scale(&self) -> f32 {
        self.scale
    }

    /// Quantizes `v` into `out` (cleared first).
    pub fn quantize_into(&self, v: &[f32], out: &mut Vec<i8>) {
        out.clear();
        out.extend(
            v.iter()
                .map(|&x| (x * self.scale).round().clamp(-127.0, 127.0) as i8),
        );
    }

    /// Quantizes `v`.
    pub fn quantize(&self, v: &[f32]) -> Vec<i8> {
        let mut out = Vec::with_capacity(v.len());
        self.quantize_into(v, &mut out);
        out
    }

    /// Converts an int8 dot product back to the f32 scale (≈ cosine for normalised vectors).
    pub fn dot_to_f32(&self, dot: i32) -> f32 {
        dot as f32 / (self.scale * self.scale)
    }
}

/// Int8 "dot distance" for hnsw_rs: `128² · len − X·Y`.
///
/// hnsw_rs asserts distances are ≥ 0; the offset is the largest possible dot product of two int8
/// vectors, so the distance is ≥ 0 by construction (no clamping that would tie near-duplicates),
/// and it orders exactly like the negated dot product. Values are integers below 2^24 for
/// `len ≤ 1024`, so the f32 result is exact.
#[derive(Debug, Default, Clone, Copy)]
pub struct DistI8Dot;

impl Distance<i8> for DistI8Dot {
    #[inline]
    fn eval(&self, a: &[i8], b: &[i8]) -> f32 {
        let max = 128 * 128 * a.len().min(b.len()) as i64;
        (max - i64::from(dot_i8(a, b))) as f32
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn calibration_uses_a_high_percentile_and_round_trips() {
        let v: Vec<Vec<f32>> = (0..200)
            .map(|i| {
                (0..50)
                    .map(|j| ((i * 50 + j) as f32 / 10_000.0) - 0.5)
                    .collect()
            })
            .collect();
        let q = Quantizer::calibrate(v.iter().map(Vec::as_slice)).unwrap();
        // max |x| is 0.5; the 99.99th percentile is just below it.
        assert!(
            q.scale() >= 127.0 / 0.5 && q.scale() < 127.0 / 0.49,
            "{}",
            q.scale()
        );
        let x = &v[123];
        let back: Vec<f32> = q
            .quantize(x)
            .iter()
            .map(|&c| f32::from(c) / q.scale())
            .collect();
        for (a, b) in x.iter().zip(&back) {
            assert!((a - b).abs() <= 0.5 / q.scale() + 1e-6);
        }
    }

    #[test]
    fn calibration_rejects_empty_or_zero_samples() {
        assert!(Quantizer::calibrate(std::iter::empty()).is_none());
        let z = [0.0f32; 8];
        assert!(Quantizer::calibrate([&z[..]]).is_none());
        assert!(Quantizer::with_scale(f32::NAN).is_none());
    }

    #[test]
    fn outliers_saturate_instead_of_wrapping() {
        let q = Quantizer::with_scale(100.0).unwrap();
        assert_eq!(
            q.quantize(&[10.0, -10.0, 0.004, 0.006]),
            vec![127, -127, 0, 1]
        );
    }

    #[test]
    fn distance_is_non_negative_and_orders_like_negative_dot() {
        let d = DistI8Dot;
        let a = [-128i8; 384];
        assert_eq!(d.eval(&a, &a), 0.0);
        let x = [10i8, 20, 30];
        let near = [11i8, 19, 31];
        let far = [-10i8, 5, -30];
        assert!(d.eval(&x, &near) < d.eval(&x, &far));
        assert!(d.eval(&x, &far) >= 0.0);
    }
}
