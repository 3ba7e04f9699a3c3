//! The bundle manifest (`manifest.json`): format-versioned, signed as stored.

use std::collections::{BTreeMap, BTreeSet};

use semver::Version;
use serde::{Deserialize, Serialize};

use crate::{BINARY_PATH, Limits, MANIFEST_NAME, Refusal, SIGNATURES_NAME, path};

/// The manifest format this crate writes and reads.
pub const MANIFEST_FORMAT: &str = "airlock-bundle/v1";

/// The signed description of a bundle.
///
/// The signature covers the exact bytes of `manifest.json` as stored in the bundle; they are
/// produced once, at build time, by [`Manifest::to_json`] and never re-serialised afterwards.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Manifest {
    /// Always [`MANIFEST_FORMAT`].
    pub format: String,
    /// Product or bundle name (e.g. `airlock-models`).
    pub name: String,
    /// Bundle version; the install store orders bundles by semver precedence.
    pub version: Version,
    /// Creation time, RFC 3339 (UTC).
    pub created: String,
    /// Install only over an installed `current` at least this version (`None`: any).
    pub min_previous_version: Option<Version>,
    /// Every payload file, sorted by path.
    pub files: Vec<FileEntry>,
    /// The model catalogue (from `catalogue.json` in the build directory; may be empty).
    pub models: Vec<ModelEntry>,
    /// The appliance binary, when the bundle carries it.
    pub binary: Option<BinaryEntry>,
    /// Exact size and SHA-256 of the compressed payload frame (see [`crate::format`]).
    pub payload_frame: PayloadFrame,
}

/// Size and digest of the compressed payload frame: pins its exact bytes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PayloadFrame {
    /// Bytes from the end of the metadata frame to the end of the file.
    pub size: u64,
    /// Lowercase hex SHA-256 of those bytes.
    pub sha256: String,
}

/// A payload file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileEntry {
    /// Relative, normalized, `/`-separated path.
    pub path: String,
    /// Size in bytes.
    pub size: u64,
    /// Lowercase hex SHA-256 of the contents.
    pub sha256: String,
}

/// A model in the catalogue. The bundle crate checks only that its files are in the bundle;
/// `params` is opaque to it (the daemon interprets them).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelEntry {
    /// Unique model id within the bundle (e.g. `minilm-l6`).
    pub id: String,
    /// What the model is used for.
    pub role: Role,
    /// The name clients use (e.g. `airlock-large`); unique within the bundle.
    pub alias: String,
    /// Bundle paths of the model's files.
    pub files: Vec<String>,
    /// Model parameters (context length, pooling, chat template, ...), a JSON object.
    #[serde(default)]
    pub params: serde_json::Map<String, serde_json::Value>,
}

/// A model's role in the appliance.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Sentence embedding model.
    Embedder,
    /// Cross-encoder reranker.
    Reranker,
    /// Text generator.
    Generator,
}

/// The appliance binary carried by a bundle.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BinaryEntry {
    /// Its bundle path (always [`BINARY_PATH`]).
    pub path: String,
    /// Lowercase hex SHA-256 (equal to its file entry's).
    pub sha256: String,
}

fn bad(reason: impl Into<String>) -> Refusal {
    Refusal::Manifest {
        reason: reason.into(),
    }
}

fn is_sha256_hex(s: &str) -> bool {
    s.len() == 64
        && s.bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

impl Manifest {
    /// The canonical bytes: pretty JSON in field order, object keys sorted, trailing newline.
    /// Call once at build time; verification always uses the stored bytes.
    pub fn to_json(&self) -> Vec<u8> {
        let mut v = serde_json::to_vec_pretty(self).expect("serialising a manifest");
        v.push(b'\n');
        v
    }

    /// Parses manifest bytes (call only on bytes whose signature has been verified).
    pub fn from_json(bytes: &[u8]) -> Result<Manifest, Refusal> {
        serde_json::from_slice(bytes).map_err(|e| bad(e.to_string()))
    }

    /// The file entry for `path`.
    pub fn file(&self, path: &str) -> Option<&FileEntry> {
        self.files
            .binary_search_by(|f| f.path.as_str().cmp(path))
            .ok()
            .map(|i| &self.files[i])
    }

    /// The catalogue entry with the given alias.
    pub fn model_by_alias(&self, alias: &str) -> Option<&ModelEntry> {
        self.models.iter().find(|m| m.alias == alias)
    }

    /// Sum of declared payload sizes.
    pub fn total_size(&self) -> u64 {
        self.files
            .iter()
            .map(|f| f.size)
            .fold(0u64, u64::saturating_add)
    }

    /// Checks the manifest on its own and against `limits`: format, created time, paths (safe,
    /// sorted, unique, no file that is also a directory), digests, declared sizes, the catalogue
    /// and the binary entry.
    pub fn validate(&self, limits: &Limits) -> Result<(), Refusal> {
        if self.format != MANIFEST_FORMAT {
            return Err(bad(format!(
                "unknown format {:?} (this build reads {MANIFEST_FORMAT})",
                self.format
            )));
        }
        if self.name.is_empty() || self.name.len() > 128 || self.name.chars().any(char::is_control)
        {
            return Err(bad("name must be 1-128 printable characters"));
        }
        time::OffsetDateTime::parse(
            &self.created,
            &time::format_description::well_known::Rfc3339,
        )
        .map_err(|e| bad(format!("created {:?} is not RFC 3339: {e}", self.created)))?;
        if let Some(min) = &self.min_previous_version
            && min >= &self.version
        {
            return Err(bad(format!(
                "min_previous_version {min} must be below version {}",
                self.version
            )));
        }

        if !is_sha256_hex(&self.payload_frame.sha256) {
            return Err(bad("payload_frame.sha256 is not 64 lowercase hex digits"));
        }
        self.validate_files(limits)?;
        self.validate_models()?;
        self.validate_binary()
    }

    /// The file list: within the entry, file and total size limits, safe paths sorted without
    /// repeats, none named like the metadata or also a directory of another, digests well-formed.
    fn validate_files(&self, limits: &Limits) -> Result<(), Refusal> {
        let count = self.files.len() as u64;
        if count > limits.max_entries {
            return Err(Refusal::TooManyEntries {
                count,
                limit: limits.max_entries,
            });
        }
        let mut total: u64 = 0;
        let mut dirs = BTreeSet::new();
        for (i, f) in self.files.iter().enumerate() {
            self.validate_file(i, f, limits)?;
            total = total.saturating_add(f.size);
            let mut prefix = 0;
            while let Some(pos) = f.path[prefix..].find('/') {
                dirs.insert(&f.path[..prefix + pos]);
                prefix += pos + 1;
            }
        }
        if total > limits.max_total_size {
            return Err(Refusal::TotalTooLarge {
                total,
                limit: limits.max_total_size,
            });
        }
        if let Some(f) = self.files.iter().find(|f| dirs.contains(f.path.as_str())) {
            return Err(bad(format!(
                "file {:?} is also a directory of another file",
                f.path
            )));
        }
        Ok(())
    }

    /// File `i` of the list, `f`, on its own and against the one before it.
    fn validate_file(&self, i: usize, f: &FileEntry, limits: &Limits) -> Result<(), Refusal> {
        path::check(&f.path).map_err(|reason| Refusal::UnsafePath {
            path: f.path.clone(),
            reason,
        })?;
        if f.path == MANIFEST_NAME || f.path == SIGNATURES_NAME {
            return Err(bad(format!("payload file may not be named {:?}", f.path)));
        }
        if i > 0 {
            let prev = &self.files[i - 1].path;
            if prev == &f.path {
                return Err(Refusal::DuplicatePath {
                    path: f.path.clone(),
                });
            }
            if prev > &f.path {
                return Err(bad(format!(
                    "files are not sorted by path ({:?} after {prev:?})",
                    f.path
                )));
            }
        }
        if !is_sha256_hex(&f.sha256) {
            return Err(bad(format!(
                "file {:?}: sha256 is not 64 lowercase hex digits",
                f.path
            )));
        }
        if f.size > limits.max_file_size {
            return Err(Refusal::FileTooLarge {
                path: f.path.clone(),
                size: f.size,
                limit: limits.max_file_size,
            });
        }
        Ok(())
    }

    /// The model catalogue: ids and aliases non-empty and unique, every model's files in the
    /// bundle.
    fn validate_models(&self) -> Result<(), Refusal> {
        let mut ids = BTreeSet::new();
        let mut aliases = BTreeMap::new();
        for m in &self.models {
            if m.id.is_empty() || !ids.insert(m.id.as_str()) {
                return Err(bad(format!("model id {:?} is empty or repeated", m.id)));
            }
            if m.alias.is_empty() || aliases.insert(m.alias.as_str(), ()).is_some() {
                return Err(bad(format!(
                    "model alias {:?} is empty or repeated",
                    m.alias
                )));
            }
            if m.files.is_empty() {
                return Err(bad(format!("model {:?} lists no files", m.id)));
            }
            for p in &m.files {
                if self.file(p).is_none() {
                    return Err(bad(format!(
                        "model {:?} lists file {p:?}, which is not in the bundle",
                        m.id
                    )));
                }
            }
        }
        Ok(())
    }

    /// The binary, if any: at [`BINARY_PATH`], a file of the bundle with the same digest.
    fn validate_binary(&self) -> Result<(), Refusal> {
        if let Some(b) = &self.binary {
            if b.path != BINARY_PATH {
                return Err(bad(format!(
                    "binary path must be {BINARY_PATH:?}, not {:?}",
                    b.path
                )));
            }
            match self.file(&b.path) {
                Some(f) if f.sha256 == b.sha256 => {}
                Some(_) => return Err(bad("binary sha256 differs from its file entry")),
                None => return Err(bad(format!("binary {:?} is not in the bundle", b.path))),
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Manifest {
        Manifest {
            format: MANIFEST_FORMAT.into(),
            name: "airlock-models".into(),
            version: Version::new(1, 2, 0),
            created: "2026-11-29T00:00:00Z".into(),
            min_previous_version: None,
            files: vec![
                FileEntry {
                    path: "a/b.bin".into(),
                    size: 3,
                    sha256: "0".repeat(64),
                },
                FileEntry {
                    path: "c.txt".into(),
                    size: 5,
                    sha256: "1".repeat(64),
                },
            ],
            models: vec![ModelEntry {
                id: "m".into(),
                role: Role::Embedder,
                alias: "airlock-embed".into(),
                files: vec!["a/b.bin".into()],
                params: serde_json::Map::new(),
            }],
            binary: None,
            payload_frame: PayloadFrame {
                size: 10,
                sha256: "3".repeat(64),
            },
        }
    }

    #[test]
    fn valid_manifest_round_trips() {
        let m = sample();
        m.validate(&Limits::default()).unwrap();
        assert_eq!(Manifest::from_json(&m.to_json()).unwrap(), m);
        assert_eq!(m.to_json(), m.to_json(), "serialisation is deterministic");
    }

    #[test]
    fn unsorted_files_file_dir_clash_and_bad_catalogue_are_refused() {
        let limits = Limits::default();
        let mut m = sample();
        m.files.swap(0, 1);
        assert!(matches!(m.validate(&limits), Err(Refusal::Manifest { .. })));

        let mut m = sample();
        m.files.insert(
            0,
            FileEntry {
                path: "a".into(),
                size: 1,
                sha256: "2".repeat(64),
            },
        );
        let err = m.validate(&limits).unwrap_err();
        assert!(err.to_string().contains("also a directory"), "{err}");

        let mut m = sample();
        m.models[0].files = vec!["nope.bin".into()];
        let err = m.validate(&limits).unwrap_err();
        assert!(err.to_string().contains("not in the bundle"), "{err}");
    }

    #[test]
    fn declared_sizes_over_limits_are_refused() {
        let m = sample();
        let small = Limits {
            max_file_size: 4,
            ..Limits::default()
        };
        assert!(matches!(
            m.validate(&small),
            Err(Refusal::FileTooLarge {
                size: 5,
                limit: 4,
                ..
            })
        ));
        let small = Limits {
            max_total_size: 7,
            ..Limits::default()
        };
        assert!(matches!(
            m.validate(&small),
            Err(Refusal::TotalTooLarge { total: 8, limit: 7 })
        ));
        let small = Limits {
            max_entries: 1,
            ..Limits::default()
        };
        assert!(matches!(
            m.validate(&small),
            Err(Refusal::TooManyEntries { count: 2, limit: 1 })
        ));
    }

    #[test]
    fn unknown_fields_and_formats_are_refused() {
        let mut v: serde_json::Value = serde_json::from_slice(&sample().to_json()).unwrap();
        v["extra"] = serde_json::json!(1);
        assert!(Manifest::from_json(v.to_string().as_bytes()).is_err());
        let mut m = sample();
        m.format = "airlock-bundle/v2".into();
        assert!(m.validate(&Limits::default()).is_err());
    }
}
