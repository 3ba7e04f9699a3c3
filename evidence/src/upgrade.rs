//! Safe upgrades and rollbacks of the data directory (issue 26 point 7).
//!
//! - **Schema marks** (`DATA/releases/schema-marks.json`): each release that starts on a data directory
//!   records the schema versions its binary reads and writes (acl, retrieval, appliance
//!   tables of `airlock.db`), by bundle version. `airlock rollback` compares the previous
//!   release's mark with what the database holds now: a migration applied after that release
//!   last ran has no way back (none of ours drops or rewrites data in a way an older binary
//!   could undo safely), so the rollback is **refused, naming each such migration**, and the
//!   operator restores the backup taken before the upgrade instead. A previous release with
//!   no mark (it never started on this data directory) is refused too unless `--force`.
//! - **Embedder identity** (`DATA/releases/embedder.json`): the model id and a digest of the files of
//!   the embedder whose vectors the index holds. A bundle whose embedder differs is refused at
//!   start (vectors of two models are not comparable: search would silently return noise).
//!
//! Both files are written atomically (temporary file, fsync, rename, fsync of the directory) in
//! `DATA/releases/`, a directory the daemon may write under its lockdown, and travel with
//! `airlock backup`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use airlock_platform::paths::DataDir;
use serde::{Deserialize, Serialize};

/// Why a release record could not be read or written, or the index's embedder is not the
/// installed bundle's.
#[derive(Debug, thiserror::Error)]
pub enum UpgradeError {
    /// A release record could not be read.
    #[error("reading {}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// Cause.
        source: std::io::Error,
    },
    /// A release record is not what this build writes.
    #[error("reading {}{what}", path.display())]
    Malformed {
        /// The file.
        path: PathBuf,
        /// What it is, for the message (` (the schema marks)` or empty).
        what: &'static str,
        /// Cause.
        source: serde_json::Error,
    },
    /// A release record could not be written.
    #[error("writing {}", path.display())]
    Write {
        /// The file.
        path: PathBuf,
        /// Cause.
        source: airlock_signing::Error,
    },
    /// `airlock.db` could not be opened read-only.
    #[error("opening {} read-only", path.display())]
    Open {
        /// The database file.
        path: PathBuf,
        /// Cause.
        source: rusqlite::Error,
    },
    /// Reading the migrations `airlock.db` holds failed.
    #[error(transparent)]
    Database(#[from] rusqlite::Error),
    /// The index holds another embedder's vectors.
    #[error(
        "the index holds vectors of embedder {} ({}), but the installed bundle's embedder is {} \
         ({}); vectors of two models cannot be searched together. Roll back to a bundle with \
         the index's embedder (`airlock rollback`), or ingest the corpus again into a new data \
         directory with this bundle",
        indexed.model,
        indexed.digest,
        installed.model,
        installed.digest
    )]
    EmbedderChanged {
        /// The embedder whose vectors the index holds.
        indexed: EmbedderIdentity,
        /// The installed bundle's.
        installed: EmbedderIdentity,
    },
}

/// The schema versions a binary reads and writes, per table family of `airlock.db`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SchemaVersions {
    /// `acl_schema_migrations` (principals, grants, tokens, audit, roles, sessions).
    pub acl: i64,
    /// `retrieval_schema` (documents, chunks, anchors).
    pub retrieval: i64,
    /// `appliance_schema_migrations` (served completions, feedback, conversations, receipts).
    pub appliance: i64,
}

/// The marks file: bundle version → the schema versions its binary supports.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SchemaMarks {
    /// By bundle version.
    pub releases: BTreeMap<String, SchemaVersions>,
}

/// Where the release records live: a directory, because the daemon's lockdown lets nothing be
/// created directly in the data directory (`sandbox::daemon_writable` creates it).
pub use airlock_platform::paths::RELEASES_DIR;

/// `DATA/releases/schema-marks.json`.
pub fn marks_path(data: &Path) -> PathBuf {
    DataDir::new(data).releases().join("schema-marks.json")
}

/// `DATA/airlock.db`.
fn db_path(data: &Path) -> PathBuf {
    DataDir::new(data).db()
}

/// `DATA/releases/embedder.json`.
pub fn embedder_path(data: &Path) -> PathBuf {
    DataDir::new(data).releases().join("embedder.json")
}

/// Reads the marks (none yet: empty).
pub fn read_marks(data: &Path) -> Result<SchemaMarks, UpgradeError> {
    let path = marks_path(data);
    match std::fs::read(&path) {
        Ok(bytes) => serde_json::from_slice(&bytes).map_err(|source| UpgradeError::Malformed {
            path,
            what: " (the schema marks)",
            source,
        }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(SchemaMarks::default()),
        Err(source) => Err(UpgradeError::Read { path, source }),
    }
}

/// Records that the release `bundle_version` (this binary, which supports `mine`) runs on
/// `data`. Idempotent.
pub fn record_mark(
    data: &Path,
    bundle_version: &str,
    mine: SchemaVersions,
) -> Result<(), UpgradeError> {
    let mut marks = read_marks(data)?;
    if marks.releases.get(bundle_version) == Some(&mine) {
        return Ok(());
    }
    marks.releases.insert(bundle_version.to_string(), mine);
    write_atomic(&marks_path(data), &pretty(&marks))
}

/// The records' JSON (a map of plain fields: it always serialises).
fn pretty(v: &impl Serialize) -> Vec<u8> {
    serde_json::to_vec_pretty(v).expect("a release record serialises")
}

/// One migration the database holds beyond what a release supports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Blocking {
    /// `acl`, `retrieval` or `appliance`.
    pub family: &'static str,
    /// Its version.
    pub version: i64,
    /// Its recorded name (retrieval migrations record none).
    pub name: Option<String>,
}

impl std::fmt::Display for Blocking {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} migration {}", self.family, self.version)?;
        if let Some(n) = &self.name {
            write!(f, " \"{n}\"")?;
        }
        Ok(())
    }
}

/// The migrations `airlock.db` holds that a release supporting `target` cannot read (none when
/// there is no database). Opens the database read-only and changes nothing.
pub fn migrations_beyond(
    data: &Path,
    target: &SchemaVersions,
) -> Result<Vec<Blocking>, UpgradeError> {
    let db = db_path(data);
    if !db.exists() {
        return Ok(Vec::new());
    }
    let conn = rusqlite::Connection::open_with_flags(
        &db,
        rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY | rusqlite::OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )
    .map_err(|source| UpgradeError::Open {
        path: db.clone(),
        source,
    })?;
    let table_exists = |name: &str| -> Result<bool, UpgradeError> {
        Ok(conn.query_row(
            "SELECT EXISTS (SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?1)",
            [name],
            |r| r.get::<_, bool>(0),
        )?)
    };
    let mut out = Vec::new();
    for (family, table, above, named) in [
        ("acl", "acl_schema_migrations", target.acl, true),
        ("retrieval", "retrieval_schema", target.retrieval, false),
        (
            "appliance",
            "appliance_schema_migrations",
            target.appliance,
            true,
        ),
    ] {
        if !table_exists(table)? {
            continue;
        }
        let sql = if named {
            format!("SELECT version, name FROM {table} WHERE version > ?1 ORDER BY version")
        } else {
            format!("SELECT version, NULL FROM {table} WHERE version > ?1 ORDER BY version")
        };
        let mut stmt = conn.prepare(&sql)?;
        let rows = stmt.query_map([above], |r| {
            Ok(Blocking {
                family,
                version: r.get(0)?,
                name: r.get(1)?,
            })
        })?;
        for row in rows {
            out.push(row?);
        }
    }
    Ok(out)
}

/// Why `airlock rollback` to `target_version` must not run, or `None` when it may.
/// `force` allows a target without a mark (never started here); nothing allows a target whose
/// binary cannot read the database.
pub fn rollback_refusal(
    data: &Path,
    target_version: &str,
    force: bool,
) -> Result<Option<String>, UpgradeError> {
    let marks = read_marks(data)?;
    let Some(target) = marks.releases.get(target_version) else {
        if force || !db_path(data).exists() {
            return Ok(None);
        }
        return Ok(Some(format!(
            "{target_version} never started on this data directory (no entry in {}), so the \
             schema its binary reads is unknown; restore the backup taken before the upgrade \
             (`airlock restore`), or pass --force if you know {target_version} reads this \
             database",
            marks_path(data).display()
        )));
    };
    let beyond = migrations_beyond(data, target)?;
    if beyond.is_empty() {
        return Ok(None);
    }
    let list = beyond
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(", ");
    Ok(Some(format!(
        "{target_version}'s binary reads acl schema {}, retrieval schema {} and appliance schema \
         {}, but this data directory has since been migrated by: {list}. These migrations have \
         no way back; restore the backup taken before the upgrade (`airlock restore`), which \
         also rolls the bundle back",
        target.acl, target.retrieval, target.appliance
    )))
}

/// The identity of the embedder whose vectors an index holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EmbedderIdentity {
    /// The catalogue's model id.
    pub model: String,
    /// `sha256:<hex>` over its files' paths (relative to the bundle) and digests.
    pub digest: String,
}

impl EmbedderIdentity {
    /// The identity of model `id` made of `files` (bundle paths, each with its
    /// `sha256:<hex>`): the digest is over the sorted `path digest` lines.
    pub fn new<'a>(id: &str, files: impl IntoIterator<Item = (&'a str, &'a str)>) -> Self {
        use sha2::Digest;
        let mut lines: Vec<String> = files
            .into_iter()
            .map(|(path, digest)| format!("{path} {digest}\n"))
            .collect();
        lines.sort();
        let mut h = sha2::Sha256::new();
        for l in &lines {
            h.update(l.as_bytes());
        }
        EmbedderIdentity {
            model: id.to_string(),
            digest: format!("sha256:{}", hex::encode(h.finalize())),
        }
    }
}

/// Checks that the index in `data` was built by `embedder`; records it when no embedder is
/// recorded yet (a new data directory, or one from before this check: its vectors are taken to
/// be this embedder's). Errors name both embedders.
pub fn check_embedder(data: &Path, embedder: &EmbedderIdentity) -> Result<(), UpgradeError> {
    let path = embedder_path(data);
    match std::fs::read(&path) {
        Ok(bytes) => {
            let indexed: EmbedderIdentity =
                serde_json::from_slice(&bytes).map_err(|source| UpgradeError::Malformed {
                    path,
                    what: "",
                    source,
                })?;
            if &indexed != embedder {
                return Err(UpgradeError::EmbedderChanged {
                    indexed,
                    installed: embedder.clone(),
                });
            }
            Ok(())
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            write_atomic(&path, &pretty(embedder))
        }
        Err(source) => Err(UpgradeError::Read { path, source }),
    }
}

/// Writes `bytes` to `path` atomically and durably.
fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), UpgradeError> {
    airlock_signing::write_atomic(path, bytes).map_err(|source| UpgradeError::Write {
        path: path.to_owned(),
        source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The versions of a binary that knows the ACL's and the appliance's current migrations.
    fn supported() -> SchemaVersions {
        SchemaVersions {
            acl: airlock_acl::SCHEMA_VERSION,
            retrieval: 1,
            appliance: crate::feedback::SCHEMA_VERSION,
        }
    }

    #[test]
    fn a_release_is_marked_once_and_an_unmarked_target_is_refused_unless_forced() {
        let dir = tempfile::tempdir().unwrap();
        record_mark(dir.path(), "1.0.0", supported()).unwrap();
        record_mark(dir.path(), "1.0.0", supported()).unwrap();
        let marks = read_marks(dir.path()).unwrap();
        assert_eq!(marks.releases["1.0.0"], supported());
        // No database: nothing to protect.
        assert_eq!(rollback_refusal(dir.path(), "0.9.0", false).unwrap(), None);
        // A database, and a target that never ran here.
        let db = db_path(dir.path());
        airlock_acl::Acl::open(&db).unwrap();
        let why = rollback_refusal(dir.path(), "0.9.0", false)
            .unwrap()
            .unwrap();
        assert!(why.contains("0.9.0 never started"), "{why}");
        assert_eq!(rollback_refusal(dir.path(), "0.9.0", true).unwrap(), None);
        assert_eq!(rollback_refusal(dir.path(), "1.0.0", false).unwrap(), None);
    }

    #[test]
    fn a_target_older_than_a_migration_is_refused_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let db = db_path(dir.path());
        airlock_acl::Acl::open(&db).unwrap();
        let mut older = supported();
        older.acl -= 1;
        let marks = SchemaMarks {
            releases: [("1.0.0".to_string(), older)].into(),
        };
        write_atomic(
            &marks_path(dir.path()),
            &serde_json::to_vec(&marks).unwrap(),
        )
        .unwrap();
        let why = rollback_refusal(dir.path(), "1.0.0", true)
            .unwrap()
            .unwrap();
        assert!(
            why.contains(&format!("acl migration {}", airlock_acl::SCHEMA_VERSION)),
            "{why}"
        );
        assert!(why.contains("restore"), "{why}");
    }

    #[test]
    fn another_embedder_is_refused_naming_both() {
        let dir = tempfile::tempdir().unwrap();
        let a = EmbedderIdentity {
            model: "minilm".into(),
            digest: "sha256:aa".into(),
        };
        let b = EmbedderIdentity {
            model: "minilm".into(),
            digest: "sha256:bb".into(),
        };
        check_embedder(dir.path(), &a).unwrap();
        check_embedder(dir.path(), &a).unwrap();
        let e = check_embedder(dir.path(), &b).unwrap_err().to_string();
        assert!(e.contains("sha256:aa") && e.contains("sha256:bb"), "{e}");
        // The record is unchanged by the refusal.
        let kept: EmbedderIdentity =
            serde_json::from_slice(&std::fs::read(embedder_path(dir.path())).unwrap()).unwrap();
        assert_eq!(kept, a);
    }
}
