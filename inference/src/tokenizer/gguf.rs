//! Rebuilding a Hugging Face `tokenizer.json` from a GGUF file's `tokenizer.ggml.*` metadata.
//!
//! GGUF generators (SmolLM2, Qwen2.5) ship no `tokenizer.json`; their vocabulary, merges, token
//! types and special ids live in the GGUF header. [`tokenizer_json`] turns that metadata into a
//! byte-level BPE `tokenizer.json` equivalent to llama.cpp's tokenizer for the pre-tokenizer the
//! file names (`tokenizer.ggml.pre`). Bundle building runs this once and ships the result as a
//! compiled artifact; the daemon only loads it ([`super::load_plain`]).

use std::collections::{HashMap, HashSet};
use std::path::Path;

use candle_core::quantized::gguf_file::{Content, Value};
use serde_json::json;

use crate::error::{Error, Result};

/// llama.cpp `token_type` values (`llama_token_type`).
const TYPE_NORMAL: i64 = 1;
const TYPE_CONTROL: i64 = 3;
const TYPE_USER_DEFINED: i64 = 4;

/// Qwen2's split regex (upstream `tokenizer.json`; llama.cpp's `qwen2` spells the
/// case-insensitive contractions out as `'[sS]|…`, which matches the same strings).
const QWEN2_REGEX: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// What the GGUF header says about its tokenizer beyond the vocabulary (needed by generators).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct GgufTokenizerInfo {
    /// `tokenizer.ggml.pre`, e.g. `smollm`, `qwen2`.
    pub pre: String,
    /// Vocabulary size.
    pub vocab_size: usize,
    /// `tokenizer.ggml.bos_token_id`.
    pub bos_token_id: Option<u32>,
    /// `tokenizer.ggml.eos_token_id`.
    pub eos_token_id: Option<u32>,
    /// Whether a BOS token is prepended (`tokenizer.ggml.add_bos_token`, default false here).
    pub add_bos_token: bool,
    /// Control tokens that end a generation turn (`<|im_end|>`, `<|endoftext|>`, the EOS id).
    pub end_of_generation_ids: Vec<u32>,
    /// The Jinja chat template (`tokenizer.chat_template`), if any.
    pub chat_template: Option<String>,
}

/// Reads only the metadata of a GGUF file (the tensor data is not touched).
pub fn read_metadata(path: &Path) -> Result<HashMap<String, Value>> {
    let mut file = std::fs::File::open(path).map_err(|e| Error::io(path, e))?;
    let content =
        Content::read(&mut file).map_err(|e| Error::invalid(path, format!("GGUF header: {e}")))?;
    Ok(content.metadata)
}

/// Builds the `tokenizer.json` document and the side information from GGUF metadata. `source`
/// only names the file in errors.
pub fn tokenizer_json(
    md: &HashMap<String, Value>,
    source: &Path,
) -> Result<(serde_json::Value, GgufTokenizerInfo)> {
    let meta = Metadata { md, source };
    let model = meta.string("tokenizer.ggml.model")?;
    if model != "gpt2" {
        return Err(meta.bad(format!(
            "tokenizer.ggml.model {model:?}: only byte-level BPE (\"gpt2\") is supported"
        )));
    }
    let pre = meta
        .string("tokenizer.ggml.pre")
        .unwrap_or_else(|_| "default".to_string());
    let (tokens, types) = meta.tokens()?;
    let merges = meta.merges()?;

    let mut vocab = serde_json::Map::with_capacity(tokens.len());
    for (id, tok) in tokens.iter().enumerate() {
        // First id wins, as in llama.cpp's token_to_id map built in order.
        vocab.entry(tok.clone()).or_insert(json!(id));
    }
    let added = added_tokens(&tokens, &types);
    let (normalizer, pre_tokenizer) = pre_tokenization(&pre).map_err(|e| meta.bad(e))?;

    let doc = json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": added,
        "normalizer": normalizer,
        "pre_tokenizer": pre_tokenizer,
        "post_processor": byte_level(false, false),
        "decoder": byte_level(true, true),
        "model": {
            "type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
            "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false,
            "ignore_merges": false, "vocab": vocab, "merges": merges,
        },
    });

    let bos_token_id = meta.opt_u32("tokenizer.ggml.bos_token_id")?;
    let eos_token_id = meta.opt_u32("tokenizer.ggml.eos_token_id")?;
    let add_bos_token = match md.get("tokenizer.ggml.add_bos_token") {
        Some(v) => v
            .to_bool()
            .map_err(|e| meta.bad(format!("add_bos_token: {e}")))?,
        None => false,
    };
    let eog = end_of_generation(&tokens, &types, eos_token_id);
    let chat_template = md
        .get("tokenizer.chat_template")
        .map(|v| v.to_string().cloned())
        .transpose()
        .map_err(|e| meta.bad(format!("chat_template: {e}")))?;
    let info = GgufTokenizerInfo {
        pre,
        vocab_size: tokens.len(),
        bos_token_id,
        eos_token_id,
        add_bos_token,
        end_of_generation_ids: eog,
        chat_template,
    };
    Ok((doc, info))
}

/// A GGUF file's metadata, read with errors naming the file.
struct Metadata<'a> {
    md: &'a HashMap<String, Value>,
    source: &'a Path,
}

impl Metadata<'_> {
    fn bad(&self, reason: String) -> Error {
        Error::invalid(self.source, reason)
    }

    fn get(&self, key: &str) -> Result<&Value> {
        self.md
            .get(key)
            .ok_or_else(|| self.bad(format!("metadata {key} missing")))
    }

    fn string(&self, key: &str) -> Result<String> {
        self.get(key)?
            .to_string()
            .cloned()
            .map_err(|e| self.bad(format!("{key}: {e}")))
    }

    fn opt_u32(&self, key: &str) -> Result<Option<u32>> {
        self.md
            .get(key)
            .map(|v| v.to_u32().map_err(|e| self.bad(format!("{key}: {e}"))))
            .transpose()
    }

    /// The vocabulary and its token types (all normal when the file has none), as many of each.
    fn tokens(&self) -> Result<(Vec<String>, Vec<i64>)> {
        let tokens: Vec<String> = self
            .get("tokenizer.ggml.tokens")?
            .to_vec()
            .map_err(|e| self.bad(format!("tokens: {e}")))?
            .iter()
            .map(|v| v.to_string().cloned())
            .collect::<std::result::Result<_, _>>()
            .map_err(|e| self.bad(format!("tokens: {e}")))?;
        let types: Vec<i64> = match self.md.get("tokenizer.ggml.token_type") {
            Some(v) => v
                .to_vec()
                .map_err(|e| self.bad(format!("token_type: {e}")))?
                .iter()
                .map(|t| t.to_i32().map(i64::from))
                .collect::<std::result::Result<_, _>>()
                .map_err(|e| self.bad(format!("token_type: {e}")))?,
            None => vec![TYPE_NORMAL; tokens.len()],
        };
        if types.len() != tokens.len() {
            return Err(self.bad(format!(
                "{} tokens but {} token types",
                tokens.len(),
                types.len()
            )));
        }
        Ok((tokens, types))
    }

    /// The BPE merges, each `"left right"`.
    fn merges(&self) -> Result<Vec<(String, String)>> {
        self.get("tokenizer.ggml.merges")?
            .to_vec()
            .map_err(|e| self.bad(format!("merges: {e}")))?
            .iter()
            .map(|m| {
                let m = m
                    .to_string()
                    .map_err(|e| self.bad(format!("merges: {e}")))?;
                m.split_once(' ')
                    .map(|(a, b)| (a.to_string(), b.to_string()))
                    .ok_or_else(|| self.bad(format!("merge {m:?} is not \"left right\"")))
            })
            .collect::<Result<_>>()
    }
}

/// The control (special) and user-defined tokens, as `added_tokens` entries.
fn added_tokens(tokens: &[String], types: &[i64]) -> Vec<serde_json::Value> {
    let mut added = Vec::new();
    for (id, (tok, ty)) in tokens.iter().zip(types).enumerate() {
        let special = match *ty {
            TYPE_CONTROL => true,
            TYPE_USER_DEFINED => false,
            _ => continue,
        };
        added.push(json!({
            "id": id, "content": tok, "single_word": false, "lstrip": false, "rstrip": false,
            "normalized": false, "special": special,
        }));
    }
    added
}

fn byte_level(trim_offsets: bool, use_regex: bool) -> serde_json::Value {
    json!({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": trim_offsets, "use_regex": use_regex})
}

/// The normalizer and pre-tokenizer of the `tokenizer.ggml.pre` named; the reason for one not
/// supported.
fn pre_tokenization(
    pre: &str,
) -> std::result::Result<(serde_json::Value, serde_json::Value), String> {
    Ok(match pre {
        // llama.cpp LLAMA_VOCAB_PRE_TYPE_SMOLLM: "\p{N}" then the GPT-2 regex.
        "smollm" | "starcoder" | "refact" => (
            serde_json::Value::Null,
            json!({"type": "Sequence", "pretokenizers": [
                {"type": "Digits", "individual_digits": true},
                byte_level(true, true),
            ]}),
        ),
        // llama.cpp LLAMA_VOCAB_PRE_TYPE_QWEN2 (upstream Qwen2 also NFC-normalises).
        "qwen2" => (
            json!({"type": "NFC"}),
            json!({"type": "Sequence", "pretokenizers": [
                {"type": "Split", "pattern": {"Regex": QWEN2_REGEX}, "behavior": "Isolated", "invert": false},
                byte_level(false, false),
            ]}),
        ),
        "default" | "gpt2" => (serde_json::Value::Null, byte_level(true, true)),
        other => {
            return Err(format!(
                "tokenizer.ggml.pre {other:?} is not supported (smollm, qwen2, gpt2)"
            ));
        }
    })
}

/// The ids that end a generation turn: the named control tokens, then the EOS id, sorted.
fn end_of_generation(tokens: &[String], types: &[i64], eos_token_id: Option<u32>) -> Vec<u32> {
    let mut eog: Vec<u32> = Vec::new();
    let mut seen = HashSet::new();
    let named = ["<|im_end|>", "<|endoftext|>", "<|eot_id|>", "<end_of_turn>"];
    for (id, (tok, ty)) in tokens.iter().zip(types).enumerate() {
        if *ty == TYPE_CONTROL && named.contains(&tok.as_str()) && seen.insert(id as u32) {
            eog.push(id as u32);
        }
    }
    if let Some(eos) = eos_token_id
        && seen.insert(eos)
    {
        eog.push(eos);
    }
    eog.sort_unstable();
    eog
}

/// Reads a GGUF file and returns its tokenizer as `tokenizer.json` text plus the side
/// information (what the bundle builder writes as the compiled artifact).
pub fn compile_from_file(gguf: &Path) -> Result<(String, GgufTokenizerInfo)> {
    let md = read_metadata(gguf)?;
    let (doc, info) = tokenizer_json(&md, gguf)?;
    let text = serde_json::to_string(&doc)
        .map_err(|e| Error::invalid(gguf, format!("serialise tokenizer.json: {e}")))?;
    // Refuse to emit an artifact the loader would reject.
    tokenizers::Tokenizer::from_bytes(text.as_bytes()).map_err(|e| {
        Error::invalid(gguf, format!("generated tokenizer.json does not load: {e}"))
    })?;
    Ok((text, info))
}

/// The compiled artifact file names written next to a generator's `model.gguf`.
pub const TOKENIZER_FILE: &str = "tokenizer.json";
/// See [`TOKENIZER_FILE`].
pub const CHAT_TEMPLATE_FILE: &str = "chat_template.jinja";

/// Compiles a generator's artifacts into `out_dir`: `tokenizer.json` (from the GGUF metadata)
/// and `chat_template.jinja` (the template text, verbatim). Bundle staging runs this so the
/// daemon never parses tokenizer metadata itself. Returns the side information.
pub fn write_artifacts(gguf: &Path, out_dir: &Path) -> Result<GgufTokenizerInfo> {
    let (json, info) = compile_from_file(gguf)?;
    let template = info
        .chat_template
        .as_deref()
        .ok_or_else(|| Error::invalid(gguf, "no tokenizer.chat_template in the metadata"))?;
    // Refuse a template the renderer cannot compile.
    crate::chat::ChatTemplate::new(&gguf.display().to_string(), template, "", "")?;
    std::fs::create_dir_all(out_dir).map_err(|e| Error::io(out_dir, e))?;
    for (name, text) in [
        (TOKENIZER_FILE, json.as_str()),
        (CHAT_TEMPLATE_FILE, template),
    ] {
        let path = out_dir.join(name);
        let tmp = out_dir.join(format!(".{name}.tmp"));
        std::fs::write(&tmp, text).map_err(|e| Error::io(&tmp, e))?;
        std::fs::rename(&tmp, &path).map_err(|e| Error::io(&path, e))?;
    }
    Ok(info)
}
