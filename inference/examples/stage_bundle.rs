//! Bundle staging step run by `scripts/fetch-models.sh`: compiles each generator's
//! `tokenizer.json` and `chat_template.jinja` from its GGUF metadata and writes the model
//! `catalogue.json` (with provenance) into the staging directory.
//!
//! Usage: `stage_bundle STAGING_DIR PROVENANCE_JSON`. The staging directory must already hold
//! `minilm/{model.safetensors,config.json,tokenizer.json,modules.json}`, `smollm2/model.gguf`
//! and `qwen/model.gguf`; the provenance file maps each model id to an object (package, version,
//! sha256 of each file, licence) that is copied into the entry's `params.provenance`.

use std::path::{Path, PathBuf};

use airlock_inference::catalogue::{CATALOGUE_FILE, Catalogue, ModelEntry, Role};
use airlock_inference::tokenizer::gguf;
use serde_json::{Map, Value, json};

type Res<T> = Result<T, Box<dyn std::error::Error>>;

fn main() {
    if let Err(e) = run() {
        eprintln!("stage_bundle: {e}");
        std::process::exit(1);
    }
}

fn run() -> Res<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [staging, provenance] = args.as_slice() else {
        return Err("usage: stage_bundle STAGING_DIR PROVENANCE_JSON".into());
    };
    let staging = PathBuf::from(staging);
    let provenance: Map<String, Value> = serde_json::from_slice(&std::fs::read(provenance)?)?;
    let prov = |id: &str| -> Res<Value> {
        provenance
            .get(id)
            .cloned()
            .ok_or_else(|| format!("no provenance for {id}").into())
    };

    let mut entries = Vec::new();

    let bert: Value = serde_json::from_slice(&std::fs::read(staging.join("minilm/config.json"))?)?;
    entries.push(ModelEntry {
        id: "minilm".into(),
        role: Role::Embedder,
        alias: "airlock-embed".into(),
        files: files(
            "minilm",
            &[
                "model.safetensors",
                "config.json",
                "tokenizer.json",
                "modules.json",
            ],
        ),
        params: obj(json!({
            "architecture": "bert",
            "dim": bert["hidden_size"],
            "max_tokens": 256,
            "batch_size": 32,
            "pooling": "mean",
            "normalize": true,
            "upstream": "sentence-transformers/all-MiniLM-L6-v2",
            "provenance": prov("minilm")?,
        })),
    });

    for (id, alias, upstream) in [
        (
            "smollm2",
            "airlock-small",
            "HuggingFaceTB/SmolLM2-135M-Instruct (Q4_1 GGUF)",
        ),
        (
            "qwen",
            "airlock-large",
            "Qwen/Qwen2.5-Coder-0.5B-Instruct (Q4_K_M GGUF)",
        ),
    ] {
        let dir = staging.join(id);
        let gguf_path = dir.join("model.gguf");
        let info = gguf::write_artifacts(&gguf_path, &dir)?;
        let (arch, ctx) = arch_and_context(&gguf_path)?;
        entries.push(ModelEntry {
            id: id.into(),
            role: Role::Generator,
            alias: alias.into(),
            files: files(
                id,
                &["model.gguf", gguf::TOKENIZER_FILE, gguf::CHAT_TEMPLATE_FILE],
            ),
            params: obj(json!({
                "architecture": arch,
                "context_length": ctx,
                "vocab_size": info.vocab_size,
                "tokenizer_pre": info.pre,
                "bos_token_id": info.bos_token_id,
                "eos_token_id": info.eos_token_id,
                "add_bos_token": info.add_bos_token,
                "end_of_generation_ids": info.end_of_generation_ids,
                "upstream": upstream,
                "provenance": prov(id)?,
            })),
        });
        println!(
            "{id}: compiled tokenizer.json ({} tokens, pre {}) and chat_template.jinja",
            info.vocab_size, info.pre
        );
    }

    // No packaged cross-encoder exists; the catalogue names the measured fallback scorer (see
    // docs/benchmarks/inference-embed.md): the embedder's f32 cosine over the candidates.
    entries.push(ModelEntry {
        id: "minilm-cosine-rescore".into(),
        role: Role::Reranker,
        alias: "airlock-rerank".into(),
        // It scores with the embedder's weights: list them so the bundle verifies what it uses.
        files: files(
            "minilm",
            &["model.safetensors", "config.json", "tokenizer.json"],
        ),
        params: obj(json!({
            "kind": "bi-encoder-rescore",
            "embedder": "minilm",
            "note": "no cross-encoder is available as a package; fallback scorer",
        })),
    });

    let catalogue = Catalogue::new(&staging, entries)?;
    let path = staging.join(CATALOGUE_FILE);
    std::fs::write(&path, catalogue.to_json())?;
    println!("wrote {}", path.display());
    Ok(())
}

fn files(dir: &str, names: &[&str]) -> Vec<String> {
    names.iter().map(|n| format!("{dir}/{n}")).collect()
}

fn obj(v: Value) -> Map<String, Value> {
    match v {
        Value::Object(m) => m,
        _ => unreachable!("json! object literal"),
    }
}

fn arch_and_context(path: &Path) -> Res<(String, u64)> {
    let md = gguf::read_metadata(path)?;
    let arch = md
        .get("general.architecture")
        .ok_or("general.architecture missing")?
        .to_string()?
        .clone();
    let ctx = md
        .get(&format!("{arch}.context_length"))
        .ok_or("context_length missing")?
        .to_u64()?;
    Ok((arch, ctx))
}
