//! The model catalogue of an installed bundle (`catalogue.json`: a JSON array of
//! `{"id", "role", "alias", "files", "params"}`), and loading models from the paths it lists
//! only. Paths are relative to the bundle root; absolute paths and `..` are refused, and a model
//! can only open files its own entry lists.
//!
//! The same types write the catalogue when a bundle is staged ([`Catalogue::to_json`]), so the
//! writer and the loader cannot drift apart.

use std::collections::HashSet;
use std::path::{Component, Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::embed::{Embedder, EmbedderConfig, EmbedderFiles};
use crate::error::{Error, Result};
use crate::rerank::{CrossEncoder, CrossEncoderConfig, CrossEncoderFiles};

/// The catalogue file name at the bundle root.
pub const CATALOGUE_FILE: &str = "catalogue.json";

/// What a model is used for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Sentence embedder.
    Embedder,
    /// Relevance scorer for (query, passage) pairs.
    Reranker,
    /// Text generator.
    Generator,
}

/// One model of the catalogue.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelEntry {
    /// Unique id within the bundle (e.g. `minilm`).
    pub id: String,
    /// Role.
    pub role: Role,
    /// Client-facing name (`airlock-embed`, `airlock-small`, `airlock-large`), unique.
    pub alias: String,
    /// Bundle-relative paths of the model's files.
    pub files: Vec<String>,
    /// Role-specific parameters and provenance (a JSON object).
    #[serde(default)]
    pub params: serde_json::Map<String, serde_json::Value>,
}

impl ModelEntry {
    /// The listed file whose last path component is `name`.
    pub fn file_named(&self, name: &str) -> Option<&str> {
        self.files
            .iter()
            .map(String::as_str)
            .find(|f| f.rsplit('/').next() == Some(name))
    }

    /// The numeric param `key`, else `default`.
    fn param_usize(&self, key: &str, default: usize) -> usize {
        self.params
            .get(key)
            .and_then(serde_json::Value::as_u64)
            .map_or(default, |v| v as usize)
    }
}

/// The files a GGUF generator needs, resolved inside the bundle.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GeneratorFiles {
    /// The quantized weights (`model.gguf`).
    pub gguf: PathBuf,
    /// The compiled `tokenizer.json` built from the GGUF metadata at bundle-build time.
    pub tokenizer: PathBuf,
    /// The chat template (`chat_template.jinja`) extracted at bundle-build time.
    pub chat_template: PathBuf,
}

/// A validated catalogue rooted at an installed bundle directory.
#[derive(Debug, Clone, PartialEq)]
pub struct Catalogue {
    root: PathBuf,
    entries: Vec<ModelEntry>,
}

impl Catalogue {
    /// Validates `entries` (unique ids and aliases, safe relative paths) under `root`.
    pub fn new(root: impl Into<PathBuf>, entries: Vec<ModelEntry>) -> Result<Self> {
        let mut ids = HashSet::new();
        let mut aliases = HashSet::new();
        for e in &entries {
            if !ids.insert(e.id.as_str()) {
                return Err(Error::Catalogue(format!("duplicate model id {:?}", e.id)));
            }
            if !aliases.insert(e.alias.as_str()) {
                return Err(Error::Catalogue(format!("duplicate alias {:?}", e.alias)));
            }
            for f in &e.files {
                check_relative(f).map_err(|why| {
                    Error::Catalogue(format!("model {:?}: file {f:?} {why}", e.id))
                })?;
            }
        }
        Ok(Self {
            root: root.into(),
            entries,
        })
    }

    /// Parses a catalogue JSON value (e.g. from the bundle manifest) rooted at `root`.
    pub fn from_json(root: impl Into<PathBuf>, value: serde_json::Value) -> Result<Self> {
        let entries: Vec<ModelEntry> = serde_json::from_value(value)
            .map_err(|e| Error::Catalogue(format!("not a model catalogue: {e}")))?;
        Self::new(root, entries)
    }

    /// Reads `catalogue.json` at the root of an installed bundle.
    pub fn from_bundle_dir(root: &Path) -> Result<Self> {
        let path = root.join(CATALOGUE_FILE);
        let bytes = std::fs::read(&path).map_err(|e| Error::io(&path, e))?;
        let value = serde_json::from_slice(&bytes)
            .map_err(|e| Error::Catalogue(format!("{}: {e}", path.display())))?;
        Self::from_json(root, value)
    }

    /// The catalogue as JSON text (what bundle staging writes).
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(&self.entries).expect("catalogue entries serialise")
    }

    /// The bundle root.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// All entries in order.
    pub fn entries(&self) -> &[ModelEntry] {
        &self.entries
    }

    /// The entry with this alias.
    pub fn by_alias(&self, alias: &str) -> Option<&ModelEntry> {
        self.entries.iter().find(|e| e.alias == alias)
    }

    /// The entry with this id.
    pub fn by_id(&self, id: &str) -> Option<&ModelEntry> {
        self.entries.iter().find(|e| e.id == id)
    }

    /// The first entry with this role.
    pub fn first_with_role(&self, role: Role) -> Option<&ModelEntry> {
        self.entries.iter().find(|e| e.role == role)
    }

    /// The on-disk path of the file `name` listed by `entry`; a file the entry does not list
    /// cannot be opened through the catalogue.
    pub fn path_of(&self, entry: &ModelEntry, name: &str) -> Result<PathBuf> {
        let rel = entry.file_named(name).ok_or_else(|| {
            Error::Catalogue(format!("model {:?} lists no file {name:?}", entry.id))
        })?;
        Ok(self.root.join(rel))
    }

    /// The files of a BERT-layout entry with `role`: weights, config and tokenizer.
    fn bert_files(&self, entry: &ModelEntry, role: Role) -> Result<[PathBuf; 3]> {
        self.expect_role(entry, role)?;
        Ok([
            self.path_of(entry, "model.safetensors")?,
            self.path_of(entry, "config.json")?,
            self.path_of(entry, "tokenizer.json")?,
        ])
    }

    /// Resolves an embedder entry's files.
    pub fn embedder_files(&self, entry: &ModelEntry) -> Result<EmbedderFiles> {
        let [weights, config, tokenizer] = self.bert_files(entry, Role::Embedder)?;
        Ok(EmbedderFiles {
            weights,
            config,
            tokenizer,
        })
    }

    /// Loads the embedder `entry` with the limits in its params (`max_tokens`, default 256;
    /// `batch_size`, default 32).
    pub fn load_embedder(&self, entry: &ModelEntry) -> Result<Embedder> {
        let files = self.embedder_files(entry)?;
        let defaults = EmbedderConfig::default();
        let max_tokens = entry.param_usize("max_tokens", defaults.max_tokens);
        let batch_size = entry.param_usize("batch_size", defaults.batch_size);
        Embedder::load(
            &files,
            EmbedderConfig {
                name: entry.id.clone(),
                max_tokens,
                batch_size,
                max_batch_tokens: batch_size * max_tokens,
            },
        )
    }

    /// Resolves a reranker entry's files (a BERT cross-encoder: `model.safetensors`,
    /// `config.json`, `tokenizer.json`).
    pub fn cross_encoder_files(&self, entry: &ModelEntry) -> Result<CrossEncoderFiles> {
        let [weights, config, tokenizer] = self.bert_files(entry, Role::Reranker)?;
        Ok(CrossEncoderFiles {
            weights,
            config,
            tokenizer,
        })
    }

    /// Loads the reranker `entry` as a cross-encoder with the limits in its params
    /// (`max_tokens` per pair, default 512; `batch_size` pairs per forward pass, default 16).
    pub fn load_cross_encoder(&self, entry: &ModelEntry) -> Result<CrossEncoder> {
        let files = self.cross_encoder_files(entry)?;
        let defaults = CrossEncoderConfig::default();
        CrossEncoder::load(
            &files,
            CrossEncoderConfig {
                name: entry.id.clone(),
                max_tokens: entry.param_usize("max_tokens", defaults.max_tokens),
                batch_size: entry.param_usize("batch_size", defaults.batch_size),
            },
        )
    }

    /// Resolves a generator entry's files.
    pub fn generator_files(&self, entry: &ModelEntry) -> Result<GeneratorFiles> {
        self.expect_role(entry, Role::Generator)?;
        Ok(GeneratorFiles {
            gguf: self.path_of(entry, "model.gguf")?,
            tokenizer: self.path_of(entry, "tokenizer.json")?,
            chat_template: self.path_of(entry, "chat_template.jinja")?,
        })
    }

    fn expect_role(&self, entry: &ModelEntry, role: Role) -> Result<()> {
        if entry.role == role {
            Ok(())
        } else {
            Err(Error::Catalogue(format!(
                "model {:?} is a {:?}, not a {role:?}",
                entry.id, entry.role
            )))
        }
    }
}

fn check_relative(p: &str) -> std::result::Result<(), &'static str> {
    if p.is_empty() || p.contains('\\') {
        return Err("is empty or uses backslashes");
    }
    for c in Path::new(p).components() {
        match c {
            Component::Normal(_) => {}
            Component::CurDir | Component::ParentDir => return Err("has . or .. components"),
            Component::RootDir | Component::Prefix(_) => return Err("is absolute"),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn sample() -> serde_json::Value {
        json!([
            {"id": "minilm", "role": "embedder", "alias": "airlock-embed",
             "files": ["minilm/model.safetensors", "minilm/config.json", "minilm/tokenizer.json"],
             "params": {"max_tokens": 256}},
            {"id": "smollm2", "role": "generator", "alias": "airlock-small",
             "files": ["smollm2/model.gguf", "smollm2/tokenizer.json", "smollm2/chat_template.jinja"]},
            {"id": "ce", "role": "reranker", "alias": "airlock-rerank",
             "files": ["ce/model.safetensors", "ce/config.json", "ce/tokenizer.json"]}
        ])
    }

    #[test]
    fn resolves_listed_files_only() {
        let c = Catalogue::from_json("/b", sample()).unwrap();
        let e = c.by_alias("airlock-embed").unwrap();
        let f = c.embedder_files(e).unwrap();
        assert_eq!(f.weights, PathBuf::from("/b/minilm/model.safetensors"));
        let g = c.by_id("smollm2").unwrap();
        assert_eq!(
            c.generator_files(g).unwrap().tokenizer,
            PathBuf::from("/b/smollm2/tokenizer.json")
        );
        assert!(c.path_of(g, "config.json").is_err());
        assert!(c.generator_files(e).is_err(), "role is checked");
        let r = c.first_with_role(Role::Reranker).unwrap();
        assert_eq!(
            c.cross_encoder_files(r).unwrap().config,
            PathBuf::from("/b/ce/config.json")
        );
        assert!(c.cross_encoder_files(e).is_err(), "role is checked");
        assert_eq!(c.first_with_role(Role::Generator).unwrap().id, "smollm2");
        let again = Catalogue::from_json("/b", serde_json::from_str(&c.to_json()).unwrap());
        assert_eq!(again.unwrap(), c);
    }

    #[test]
    fn refuses_unsafe_paths_duplicates_and_unknown_fields() {
        for bad in ["../x", "/etc/passwd", "a/../../b", "./a", "a\\b", ""] {
            let mut v = sample();
            v[0]["files"][0] = json!(bad);
            assert!(Catalogue::from_json("/b", v).is_err(), "{bad}");
        }
        let mut v = sample();
        v[1]["alias"] = json!("airlock-embed");
        assert!(Catalogue::from_json("/b", v).is_err());
        let mut v = sample();
        v[1]["id"] = json!("minilm");
        assert!(Catalogue::from_json("/b", v).is_err());
        let mut v = sample();
        v[0]["url"] = json!("https://example.com");
        assert!(Catalogue::from_json("/b", v).is_err());
    }
}
