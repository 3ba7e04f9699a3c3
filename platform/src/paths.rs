//! The data directory's layout, in one place: every file and directory name the appliance keeps
//! beneath `DATA/` ([`DataDir`] joins them onto a data directory). Which crate reads or writes
//! each entry is that crate's business; only the names live here.

use std::path::{Path, PathBuf};

/// The SQLite file shared by the ACL, the document store, feedback and conversations.
pub const DB_FILE: &str = "airlock.db";
/// The database and the files SQLite keeps beside it in WAL mode.
pub const SQLITE_FILES: [&str; 3] = ["airlock.db", "airlock.db-wal", "airlock.db-shm"];
/// The one-writer lock ([`crate::data_lock`]).
pub const LOCK_FILE: &str = "airlock.lock";
/// The index root (vector, BM25).
pub const INDEX_DIR: &str = "index";
/// The documents' original files, content-addressed.
pub const ORIGINALS_DIR: &str = "originals";
/// The release records (schema marks, the index's embedder identity): a directory, because
/// the daemon's lockdown lets nothing be created directly in the data directory
/// ([`crate::sandbox::daemon_writable`] creates it).
pub const RELEASES_DIR: &str = "releases";
/// The ingest queue's corpora.
pub const QUEUE_DIR: &str = "ingest-queue";
/// The connectors' own state (`[[connectors]]`: per-source cursor, last success, per-item
/// errors), a directory for the same reason as [`RELEASES_DIR`].
pub const CONNECTORS_DIR: &str = "connectors";
/// The connectors' SQLite file in [`CONNECTORS_DIR`] (not `airlock.db`: its own file).
pub const CONNECTORS_DB: &str = "connectors.db";
/// The pinned keyring and the appliance key.
pub const KEYS_DIR: &str = "keys";
/// The install store of verified bundles.
pub const BUNDLES_DIR: &str = "bundles";
/// The pinned keyring's file name in [`KEYS_DIR`].
pub const KEYRING_FILE: &str = "trusted.json";
/// Entries of the data directory the daemon reads but never writes: the pinned keyring and the
/// install store.
pub const READ_ONLY: [&str; 2] = [KEYS_DIR, BUNDLES_DIR];

/// A data directory, for naming what is in it (nothing is created or checked).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DataDir<'a>(&'a Path);

impl<'a> DataDir<'a> {
    /// The layout beneath `root`.
    pub fn new(root: &'a Path) -> Self {
        DataDir(root)
    }

    /// The directory itself.
    pub fn root(&self) -> &'a Path {
        self.0
    }

    /// `DATA/airlock.db`.
    pub fn db(&self) -> PathBuf {
        self.0.join(DB_FILE)
    }

    /// `DATA/airlock.lock`.
    pub fn lock(&self) -> PathBuf {
        self.0.join(LOCK_FILE)
    }

    /// `DATA/index`.
    pub fn index(&self) -> PathBuf {
        self.0.join(INDEX_DIR)
    }

    /// `DATA/originals`.
    pub fn originals(&self) -> PathBuf {
        self.0.join(ORIGINALS_DIR)
    }

    /// `DATA/releases`.
    pub fn releases(&self) -> PathBuf {
        self.0.join(RELEASES_DIR)
    }

    /// `DATA/ingest-queue`.
    pub fn ingest_queue(&self) -> PathBuf {
        self.0.join(QUEUE_DIR)
    }

    /// `DATA/connectors`.
    pub fn connectors(&self) -> PathBuf {
        self.0.join(CONNECTORS_DIR)
    }

    /// `DATA/connectors/connectors.db`, the connectors' state.
    pub fn connectors_db(&self) -> PathBuf {
        self.connectors().join(CONNECTORS_DB)
    }

    /// `DATA/keys`.
    pub fn keys(&self) -> PathBuf {
        self.0.join(KEYS_DIR)
    }

    /// `DATA/keys/trusted.json`, the pinned keyring.
    pub fn pinned_keyring(&self) -> PathBuf {
        self.keys().join(KEYRING_FILE)
    }

    /// `DATA/bundles`.
    pub fn bundles(&self) -> PathBuf {
        self.0.join(BUNDLES_DIR)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_the_ones_on_disk() {
        let d = DataDir::new(Path::new("/srv/airlock"));
        assert_eq!(d.db(), Path::new("/srv/airlock/airlock.db"));
        assert_eq!(d.lock(), Path::new("/srv/airlock/airlock.lock"));
        assert_eq!(d.index(), Path::new("/srv/airlock/index"));
        assert_eq!(d.originals(), Path::new("/srv/airlock/originals"));
        assert_eq!(d.releases(), Path::new("/srv/airlock/releases"));
        assert_eq!(d.ingest_queue(), Path::new("/srv/airlock/ingest-queue"));
        assert_eq!(
            d.pinned_keyring(),
            Path::new("/srv/airlock/keys/trusted.json")
        );
        assert_eq!(d.bundles(), Path::new("/srv/airlock/bundles"));
        assert_eq!(
            d.connectors_db(),
            Path::new("/srv/airlock/connectors/connectors.db")
        );
        assert_eq!(SQLITE_FILES[0], DB_FILE);
    }
}
