//! Shared helpers of the embedder/reranker bench binaries: paths, datasets, timing.
#![allow(dead_code)]

use std::path::PathBuf;

use airlock_inference::{Embedder, EmbedderConfig, EmbedderFiles};

pub fn models_dir() -> PathBuf {
    std::env::var_os("AIRLOCK_MODELS_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../models-cache/models"))
}

pub fn datasets_dir() -> PathBuf {
    std::env::var_os("AIRLOCK_SHARED_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../shared"))
        .join("datasets")
}

pub fn read_jsonl(rel: &str) -> Vec<serde_json::Value> {
    let path = datasets_dir().join(rel);
    std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).expect("JSON line"))
        .collect()
}

pub fn embedder() -> Embedder {
    // `AIRLOCK_EMBED_BATCH` overrides the texts per forward pass (the padded-token cap follows).
    let mut config = EmbedderConfig::default();
    if let Some(b) = std::env::var("AIRLOCK_EMBED_BATCH")
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
    {
        config.batch_size = b;
        config.max_batch_tokens = b * config.max_tokens;
    }
    Embedder::load(&EmbedderFiles::in_dir(&models_dir().join("minilm")), config)
        .expect("MiniLM loads")
}

pub fn load_avg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

pub fn threads() -> String {
    std::env::var("RAYON_NUM_THREADS").unwrap_or_else(|_| "unset (all cores)".into())
}

pub fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

pub fn percentile(sorted: &[f64], p: f64) -> f64 {
    let idx = ((sorted.len() - 1) as f64 * p).round() as usize;
    sorted[idx]
}

/// Cranfield: doc ids, doc texts (`title + " " + text`), query ids, query texts, binary qrels.
pub struct Cranfield {
    pub doc_ids: Vec<String>,
    pub docs: Vec<String>,
    pub query_ids: Vec<String>,
    pub queries: Vec<String>,
    pub qrels: std::collections::HashMap<String, std::collections::HashSet<String>>,
}

pub fn cranfield() -> Cranfield {
    let corpus = read_jsonl("cranfield/corpus.jsonl");
    let qs = read_jsonl("cranfield/queries.jsonl");
    let mut qrels: std::collections::HashMap<String, std::collections::HashSet<String>> =
        Default::default();
    let tsv = std::fs::read_to_string(datasets_dir().join("cranfield/qrels/dev.tsv")).unwrap();
    for line in tsv.lines().skip(1) {
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.len() == 3 && f[2].parse::<i32>().unwrap_or(0) > 0 {
            qrels
                .entry(f[0].to_string())
                .or_default()
                .insert(f[1].to_string());
        }
    }
    Cranfield {
        doc_ids: corpus
            .iter()
            .map(|d| d["_id"].as_str().unwrap().to_string())
            .collect(),
        docs: corpus
            .iter()
            .map(|d| {
                format!(
                    "{} {}",
                    d["title"].as_str().unwrap(),
                    d["text"].as_str().unwrap()
                )
            })
            .collect(),
        query_ids: qs
            .iter()
            .map(|q| q["_id"].as_str().unwrap().to_string())
            .collect(),
        queries: qs
            .iter()
            .map(|q| q["text"].as_str().unwrap().to_string())
            .collect(),
        qrels,
    }
}

/// CPU seconds (user + system, all threads) this process has used so far, from
/// `/proc/self/stat` (Linux; 0 elsewhere). On a shared machine, wall time measures the
/// neighbours too; CPU time per unit of work does not.
pub fn cpu_seconds() -> f64 {
    let Ok(stat) = std::fs::read_to_string("/proc/self/stat") else {
        return 0.0;
    };
    // Fields after the command name (which is in parentheses and may contain spaces).
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let f: Vec<&str> = rest.split_whitespace().collect();
    // utime and stime are fields 14 and 15 of the full line, i.e. 11 and 12 after ')'.
    let ticks: f64 = f.get(11).and_then(|v| v.parse().ok()).unwrap_or(0.0)
        + f.get(12).and_then(|v| v.parse().ok()).unwrap_or(0.0);
    ticks / 100.0
}
