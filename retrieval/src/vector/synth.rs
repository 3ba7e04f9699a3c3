//! Deterministic synthetic embeddings and an exact-search oracle, for tests and benchmarks of the
//! vector index (real MiniLM vectors are used where a cached file of them exists; see
//! `docs/benchmarks/vector.md`).
//!
//! * [`clustered`]: unit vectors around random cluster centres plus a shared "mean direction",
//!   which mimics the anisotropy of sentence embeddings (random pairs have a positive cosine).
//! * [`noisy_copies`]: the peers' scale proxy (`shared/peers/bench_ann.py`): copies of a base set,
//!   cycled, each plus N(0, σ²) per component, renormalised.
//! * [`exact_top_k`]: brute-force f32 top-k over a subset (the ground truth).

use super::kernels::dot_f32;

/// SplitMix64: small, fast, deterministic.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// A generator from a seed.
    pub fn new(seed: u64) -> Self {
        Self(seed ^ 0x9E37_79B9_7F4A_7C15)
    }

    /// Next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `[0, 1)`.
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Uniform in `0..n` (`n > 0`).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }

    /// Standard normal (Box–Muller).
    pub fn normal(&mut self) -> f64 {
        let u1 = self.unit().max(f64::MIN_POSITIVE);
        let u2 = self.unit();
        (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
    }
}

/// Scales `v` to unit length (left as is when zero).
pub fn normalize(v: &mut [f32]) {
    let n = v.iter().map(|x| x * x).sum::<f32>().sqrt();
    if n > 0.0 {
        v.iter_mut().for_each(|x| *x /= n);
    }
}

/// `n` unit vectors of `dim` in `clusters` clusters: `normalize(0.5·g + c_j + N(0, σ²))` with a
/// shared unit direction `g`, unit centres `c_j`, and per-component σ = `spread / √dim` (so the
/// noise has norm ≈ `spread`).
pub fn clustered(n: usize, dim: usize, clusters: usize, spread: f32, seed: u64) -> Vec<Vec<f32>> {
    let mut rng = Rng::new(seed);
    let unit = |rng: &mut Rng| {
        let mut v: Vec<f32> = (0..dim).map(|_| rng.normal() as f32).collect();
        normalize(&mut v);
        v
    };
    let g = unit(&mut rng);
    let centres: Vec<Vec<f32>> = (0..clusters.max(1)).map(|_| unit(&mut rng)).collect();
    let sigma = spread / (dim as f32).sqrt();
    (0..n)
        .map(|_| {
            let c = &centres[rng.below(centres.len() as u64) as usize];
            let mut v: Vec<f32> = (0..dim)
                .map(|i| 0.5 * g[i] + c[i] + sigma * rng.normal() as f32)
                .collect();
            normalize(&mut v);
            v
        })
        .collect()
}

/// The peers' scale proxy: `n` vectors, vector `i` = `normalize(base[i % len] + N(0, σ²))`.
pub fn noisy_copies(base: &[Vec<f32>], n: usize, sigma: f32, seed: u64) -> Vec<Vec<f32>> {
    let mut rng = Rng::new(seed);
    (0..n)
        .map(|i| {
            let mut v: Vec<f32> = base[i % base.len()]
                .iter()
                .map(|&x| x + sigma * rng.normal() as f32)
                .collect();
            normalize(&mut v);
            v
        })
        .collect()
}

/// Brute-force f32 top `k` of `ids` (indexes into `vectors`) by dot product with `query`, best
/// first; ties prefer the smaller id.
pub fn exact_top_k(
    vectors: &[Vec<f32>],
    ids: impl IntoIterator<Item = u32>,
    query: &[f32],
    k: usize,
) -> Vec<(u32, f32)> {
    let mut all: Vec<(u32, f32)> = ids
        .into_iter()
        .map(|i| (i, dot_f32(query, &vectors[i as usize])))
        .collect();
    let k = k.min(all.len());
    if k == 0 {
        return Vec::new();
    }
    all.select_nth_unstable_by(k - 1, |a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
    all.truncate(k);
    // Give the n-long buffer back: a caller's in-place `collect` would otherwise keep it (550
    // queries × 40 MB at 5M vectors exhausted 24 GiB).
    all.shrink_to_fit();
    all.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
    all
}

/// |approx ∩ exact| / |exact| (1 when `exact` is empty).
pub fn recall(approx: &[u32], exact: &[u32]) -> f64 {
    if exact.is_empty() {
        return 1.0;
    }
    approx.iter().filter(|a| exact.contains(a)).count() as f64 / exact.len() as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generators_are_deterministic_and_normalised() {
        let a = clustered(50, 16, 4, 0.5, 1);
        assert_eq!(a, clustered(50, 16, 4, 0.5, 1));
        assert_ne!(a, clustered(50, 16, 4, 0.5, 2));
        for v in &a {
            let n: f32 = v.iter().map(|x| x * x).sum();
            assert!((n - 1.0).abs() < 1e-4);
        }
        let b = noisy_copies(&a, 120, 0.05, 7);
        assert_eq!(b.len(), 120);
        assert!(
            dot_f32(&b[51], &a[1]) > 0.5,
            "a noisy copy stays near its source"
        );
    }

    #[test]
    fn oracle_orders_by_dot_and_recall_counts_overlap() {
        let v = vec![vec![1.0, 0.0], vec![0.6, 0.8], vec![0.0, 1.0]];
        let top = exact_top_k(&v, 0..3, &[0.0, 1.0], 2);
        assert_eq!(top.iter().map(|t| t.0).collect::<Vec<_>>(), vec![2, 1]);
        assert_eq!(recall(&[2, 0], &[2, 1]), 0.5);
    }
}
