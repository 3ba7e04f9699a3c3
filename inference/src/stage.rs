//! Staging a bundle's models (`airlock bundle stage`): from a directory holding each model's
//! files in a subdirectory named by its id, compile each generator's `tokenizer.json` and
//! `chat_template.jinja` from its GGUF metadata and write the model catalogue
//! (`catalogue.json`, [`CATALOGUE_FILE`]). `airlock bundle build` then packs and signs the
//! directory. The demo's models are one such set ([`demo_models`]); a bank's own model is
//! another.
//!
//! Layout under the staging directory, per model id:
//! - an embedder (BERT, safetensors): `ID/model.safetensors`, `ID/config.json`,
//!   `ID/tokenizer.json`, and `ID/modules.json` when present;
//! - a generator (GGUF): `ID/model.gguf`; the compiled `ID/tokenizer.json` and
//!   `ID/chat_template.jinja` are written beside it.
//!
//! A reranker entry is written for the first embedder: no cross-encoder is packaged, and the
//! catalogue names the measured fallback scorer (the embedder's f32 cosine over the candidates,
//! docs/benchmarks/inference-embed.md).

use std::path::{Path, PathBuf};

use serde_json::{Map, Value, json};

use crate::catalogue::{CATALOGUE_FILE, Catalogue, ModelEntry, Role};
use crate::error::{Error, Result};
use crate::tokenizer::gguf;

/// One model to stage.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StageModel {
    /// The model id: its subdirectory of the staging directory.
    pub id: String,
    /// Embedder or generator.
    pub role: Role,
    /// The name clients use (`airlock-small`, …).
    pub alias: String,
    /// Where the weights come from (a free text kept in the catalogue), if known.
    pub upstream: Option<String>,
}

/// The demo bundle's models (`scripts/fetch-models.sh` lays their files out).
pub fn demo_models() -> Vec<StageModel> {
    let m = |id: &str, role, alias: &str, upstream: &str| StageModel {
        id: id.into(),
        role,
        alias: alias.into(),
        upstream: Some(upstream.into()),
    };
    vec![
        m(
            "minilm",
            Role::Embedder,
            "airlock-embed",
            "sentence-transformers/all-MiniLM-L6-v2",
        ),
        m(
            "smollm2",
            Role::Generator,
            "airlock-small",
            "HuggingFaceTB/SmolLM2-135M-Instruct (Q4_1 GGUF)",
        ),
        m(
            "qwen",
            Role::Generator,
            "airlock-large",
            "Qwen/Qwen2.5-Coder-0.5B-Instruct (Q4_K_M GGUF)",
        ),
    ]
}

/// Stages `models` under `staging` and writes the catalogue; returns its path and one line
/// per model saying what was done. `provenance` maps a model id to an object (package,
/// version, digests, licence) kept as the entry's `params.provenance`; without it, a model's
/// provenance says it was supplied by the operator. Refuses (and writes no catalogue) on a
/// missing file, a malformed model, an unknown role, or a duplicate id or alias.
pub fn stage(
    staging: &Path,
    models: &[StageModel],
    provenance: Option<&Map<String, Value>>,
) -> Result<(PathBuf, Vec<String>)> {
    if models.is_empty() {
        return Err(Error::Catalogue("no model to stage".into()));
    }
    let prov = |id: &str| -> Result<Value> {
        match provenance {
            None => Ok(json!({ "source": "operator-supplied" })),
            Some(p) => p.get(id).cloned().ok_or_else(|| {
                Error::Catalogue(format!("the provenance file has no entry for {id:?}"))
            }),
        }
    };
    let mut entries = Vec::new();
    let mut lines = Vec::new();
    let mut first_embedder: Option<&StageModel> = None;
    for m in models {
        let dir = staging.join(&m.id);
        let need = |name: &str| -> Result<()> {
            let p = dir.join(name);
            if p.is_file() {
                Ok(())
            } else {
                Err(Error::Catalogue(format!(
                    "model {:?}: {} is missing",
                    m.id,
                    p.display()
                )))
            }
        };
        let mut params = Map::new();
        match m.role {
            Role::Embedder => {
                let mut names = vec!["model.safetensors", "config.json", "tokenizer.json"];
                for n in &names {
                    need(n)?;
                }
                if dir.join("modules.json").is_file() {
                    names.push("modules.json");
                }
                let config_path = dir.join("config.json");
                let config: Value = serde_json::from_slice(
                    &std::fs::read(&config_path).map_err(|e| Error::io(&config_path, e))?,
                )
                .map_err(|e| Error::invalid(&config_path, e.to_string()))?;
                let dim = config
                    .get("hidden_size")
                    .and_then(Value::as_u64)
                    .ok_or_else(|| Error::invalid(&config_path, "no hidden_size"))?;
                params.extend(obj(json!({
                    "architecture": "bert",
                    "dim": dim,
                    "max_tokens": 256,
                    "batch_size": 32,
                    "pooling": "mean",
                    "normalize": true,
                })));
                entries.push(entry(m, &names, params, prov(&m.id)?));
                lines.push(format!("{}: embedder {} (dim {dim})", m.id, m.alias));
                first_embedder.get_or_insert(m);
            }
            Role::Generator => {
                need("model.gguf")?;
                let gguf_path = dir.join("model.gguf");
                let info = gguf::write_artifacts(&gguf_path, &dir)?;
                let (arch, ctx) = arch_and_context(&gguf_path)?;
                params.extend(obj(json!({
                    "architecture": arch,
                    "context_length": ctx,
                    "vocab_size": info.vocab_size,
                    "tokenizer_pre": info.pre,
                    "bos_token_id": info.bos_token_id,
                    "eos_token_id": info.eos_token_id,
                    "add_bos_token": info.add_bos_token,
                    "end_of_generation_ids": info.end_of_generation_ids,
                })));
                let names = ["model.gguf", gguf::TOKENIZER_FILE, gguf::CHAT_TEMPLATE_FILE];
                entries.push(entry(m, &names, params, prov(&m.id)?));
                lines.push(format!(
                    "{}: generator {} ({arch}, context {ctx}): compiled tokenizer.json ({} tokens, \
                     pre {}) and chat_template.jinja",
                    m.id, m.alias, info.vocab_size, info.pre
                ));
            }
            Role::Reranker => {
                return Err(Error::Catalogue(format!(
                    "model {:?}: a reranker is not staged from files (the catalogue names the \
                     embedder's fallback scorer)",
                    m.id
                )));
            }
        }
    }
    if let Some(e) = first_embedder {
        // It scores with the embedder's weights: list them so the bundle verifies what it uses.
        entries.push(ModelEntry {
            id: format!("{}-cosine-rescore", e.id),
            role: Role::Reranker,
            alias: "airlock-rerank".into(),
            files: ["model.safetensors", "config.json", "tokenizer.json"]
                .iter()
                .map(|n| format!("{}/{n}", e.id))
                .collect(),
            params: obj(json!({
                "kind": "bi-encoder-rescore",
                "embedder": e.id,
                "note": "no cross-encoder is available as a package; fallback scorer",
            })),
        });
    }
    let catalogue = Catalogue::new(staging, entries)?;
    let path = staging.join(CATALOGUE_FILE);
    std::fs::write(&path, catalogue.to_json()).map_err(|e| Error::io(&path, e))?;
    Ok((path, lines))
}

fn entry(
    m: &StageModel,
    names: &[&str],
    mut params: Map<String, Value>,
    prov: Value,
) -> ModelEntry {
    if let Some(u) = &m.upstream {
        params.insert("upstream".into(), Value::String(u.clone()));
    }
    params.insert("provenance".into(), prov);
    ModelEntry {
        id: m.id.clone(),
        role: m.role,
        alias: m.alias.clone(),
        files: names.iter().map(|n| format!("{}/{n}", m.id)).collect(),
        params,
    }
}

fn obj(v: Value) -> Map<String, Value> {
    match v {
        Value::Object(m) => m,
        _ => Map::new(),
    }
}

fn arch_and_context(path: &Path) -> Result<(String, u64)> {
    let md = gguf::read_metadata(path)?;
    let arch = md
        .get("general.architecture")
        .ok_or_else(|| Error::invalid(path, "general.architecture missing"))?
        .to_string()
        .map_err(|e| Error::invalid(path, format!("general.architecture: {e}")))?
        .clone();
    let ctx = md
        .get(&format!("{arch}.context_length"))
        .ok_or_else(|| Error::invalid(path, format!("{arch}.context_length missing")))?
        .to_u64()
        .map_err(|e| Error::invalid(path, format!("{arch}.context_length: {e}")))?;
    Ok((arch, ctx))
}
