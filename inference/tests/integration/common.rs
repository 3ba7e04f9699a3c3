//! Paths to the model cache and the shared fixtures, overridable by environment.

use std::path::PathBuf;

/// The extracted model files (`models-cache/models` at the repository root), or
/// `AIRLOCK_MODELS_DIR`.
pub fn models_dir() -> PathBuf {
    std::env::var_os("AIRLOCK_MODELS_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../models-cache/models"))
}

/// The read-only shared project folder (`fixtures/`, `datasets/`), or `AIRLOCK_SHARED_DIR`.
pub fn shared_dir() -> PathBuf {
    std::env::var_os("AIRLOCK_SHARED_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../shared"))
}

/// Reads a JSON-lines fixture.
pub fn read_jsonl(name: &str) -> Vec<serde_json::Value> {
    let path = shared_dir().join("fixtures").join(name);
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("fixture {} missing: {e}", path.display()));
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).expect("fixture line is JSON"))
        .collect()
}

/// Cosine similarity.
pub fn cosine(a: &[f32], b: &[f32]) -> f64 {
    let dot: f64 = a
        .iter()
        .zip(b)
        .map(|(x, y)| f64::from(*x) * f64::from(*y))
        .sum();
    let na: f64 = a.iter().map(|x| f64::from(*x).powi(2)).sum::<f64>().sqrt();
    let nb: f64 = b.iter().map(|x| f64::from(*x).powi(2)).sum::<f64>().sqrt();
    dot / (na * nb)
}
