//! Shared set-up of the daemon benches (`daemon`, `load`): the real models (MiniLM embedder,
//! SmolLM2 from the staged bundle) and a bank-dev subset ingested with `iam_v1` applied, plus the
//! golden `v1` queries whose relevant documents are in the subset, each with its user's token.
//!
//! Included by each bench with `#[path = "support/bank.rs"] mod bank;`.

use std::collections::{BTreeMap, HashSet};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use airlock::Services;
use airlock_acl::{Acl, NewUser, Role};
use airlock_inference::generate::EngineConfig;
use airlock_inference::{Catalogue, Embedder, EmbedderConfig, EmbedderFiles};
use airlock_retrieval::{DocumentInput, Retrieval, RetrievalConfig};
use airlock_serving::generator::Generator;
use airlock_serving::services::ModelCard;
use serde_json::Value;

/// An integer from the environment, or `default`.
pub fn env_usize(key: &str, default: usize) -> usize {
    std::env::var(key)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// `var` from the environment, or `rel` under the crate directory.
pub fn dir(var: &str, rel: &str) -> PathBuf {
    std::env::var_os(var)
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(rel))
}

/// The `p` quantile (0..=1, nearest rank) of `v` (sorted in place); 0 when empty.
pub fn pct(v: &mut [f64], p: f64) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    let i = ((v.len() as f64 - 1.0) * p).round() as usize;
    v[i]
}

/// The CPU model and its SIMD flags (`/proc/cpuinfo`), as every bench prints them.
pub fn cpu_line() -> String {
    airlock_inference::cpu_line()
}

/// The loaded models and stores of one bench run.
pub struct Bank {
    /// Access control (users from `iam_v1`, one local admin).
    pub acl: Arc<Acl>,
    /// Documents, chunks and indexes of the subset.
    pub retrieval: Arc<Retrieval>,
    /// MiniLM.
    pub embedder: Arc<Embedder>,
    /// SmolLM2 served as `airlock-small`, with the daemon's default engine settings.
    pub generator: Arc<Generator>,
    /// `(user, query)` of the usable golden cases.
    pub cases: Vec<(String, String)>,
    /// Bearer token per case user.
    pub tokens: BTreeMap<String, String>,
    /// Keeps the data directory alive.
    _tmp: tempfile::TempDir,
}

impl Bank {
    /// Loads the models and ingests the first `n_docs` bank-dev documents (env:
    /// `AIRLOCK_MODELS_DIR`, `AIRLOCK_SHARED_DIR` as in the tests).
    pub fn load(n_docs: usize) -> Bank {
        let models = dir("AIRLOCK_MODELS_DIR", "../models-cache/models");
        let staging = models.join("../staging");
        let data = dir("AIRLOCK_SHARED_DIR", "../../shared").join("datasets/bank-dev");

        let tmp = tempfile::tempdir().unwrap();
        let db = tmp.path().join("airlock.db");
        let embedder = Arc::new(
            Embedder::load(
                &EmbedderFiles::in_dir(&models.join("minilm")),
                EmbedderConfig::default(),
            )
            .unwrap(),
        );
        let acl = Arc::new(Acl::open(&db).unwrap());
        let retrieval = Arc::new(
            Retrieval::open(
                &db,
                &tmp.path().join("index"),
                RetrievalConfig::default(),
                Arc::new(airlock_serving::models::EmbedAdapter(embedder.clone())),
                None,
            )
            .unwrap(),
        );
        let cat = Catalogue::from_bundle_dir(&staging).unwrap();
        let entry = cat.by_id("smollm2").unwrap();
        let generator = Arc::new(
            Generator::load(
                "airlock-small",
                "smollm2",
                &cat.generator_files(entry).unwrap(),
                EngineConfig::default(),
            )
            .unwrap(),
        );

        // Corpus subset (in file order) and the IAM snapshot.
        let t = Instant::now();
        let docs: Vec<DocumentInput> = std::fs::read_to_string(data.join("corpus.jsonl"))
            .unwrap()
            .lines()
            .take(n_docs)
            .map(|l| {
                let v: Value = serde_json::from_str(l).unwrap();
                DocumentInput::new(
                    v["doc_id"].as_str().unwrap(),
                    v["title"].as_str().unwrap(),
                    v["text"].as_str().unwrap(),
                )
            })
            .collect();
        let ids: HashSet<String> = docs.iter().map(|d| d.doc_id.clone()).collect();
        let ingest = retrieval.upsert(docs, &mut |_| {}).unwrap();
        let chunks = retrieval.stats().live_chunks;
        println!(
            "ingested {} docs ({chunks} chunks) in {:.1} s",
            ingest.outcomes.len(),
            t.elapsed().as_secs_f64()
        );
        let iam = std::fs::File::open(data.join("iam_v1.jsonl")).unwrap();
        acl.sync_snapshot("bench", std::io::BufReader::new(iam))
            .unwrap();

        // Queries whose relevant documents are in the subset, each asked by the case's user.
        let cases: Vec<(String, String)> = std::fs::read_to_string(data.join("golden.jsonl"))
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str::<Value>(l).unwrap())
            .filter(|c| c["phase"] == "v1")
            .filter(|c| {
                c["relevant_doc_ids"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .all(|d| ids.contains(d.as_str().unwrap()))
            })
            .map(|c| {
                (
                    c["user"].as_str().unwrap().to_string(),
                    c["query"].as_str().unwrap().to_string(),
                )
            })
            .collect();
        let mut tokens = BTreeMap::new();
        for (u, _) in &cases {
            if !tokens.contains_key(u) {
                tokens.insert(u.clone(), acl.issue_token("bench", u).unwrap());
            }
        }
        acl.add_user(
            "bench",
            "admin",
            &NewUser {
                groups: vec![],
                roles: vec![Role::Admin, Role::Operator],
                local: true,
            },
        )
        .unwrap();
        Bank {
            acl,
            retrieval,
            embedder,
            generator,
            cases,
            tokens,
            _tmp: tmp,
        }
    }

    /// Fresh services over the same models and stores (one per daemon instance).
    pub fn services(&self) -> Services {
        let cards = vec![ModelCard {
            id: "airlock-small".into(),
            object: "model",
            created: 0,
            owned_by: "airlock",
            role: "generator".into(),
            model: "smollm2".into(),
        }];
        Services::new(
            self.acl.clone(),
            self.retrieval.clone(),
            self.embedder.clone(),
            cards,
            vec![self.generator.clone()],
            "bench".into(),
        )
    }
}
