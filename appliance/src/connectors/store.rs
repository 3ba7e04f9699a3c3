//! The connectors' own SQLite file (`DATA/connectors/connectors.db`, not `airlock.db`): per
//! source, the state of its last successful sync (items with their paths, versions and
//! readers; per-item errors; unknown principals; last success) and what its last run did.
//!
//! A source's state is written only after every change of a sync has been applied to the
//! document store and the ACL, so a sync that fails half-way is redone from the old state (every
//! write it repeats is idempotent). Losing this file costs a full re-crawl: every file is then
//! new to the connector, and re-stored unchanged when its bytes are (same SHA-256).

use std::path::{Path, PathBuf};

use airlock_connectors::source::SourceState;
use parking_lot::Mutex;
use rusqlite::{Connection, OptionalExtension, params};
use serde::{Deserialize, Serialize};

/// Why the connectors' file could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// SQLite.
    #[error("connectors state {path}: {source}")]
    Sqlite {
        /// The file.
        path: PathBuf,
        /// The cause.
        source: rusqlite::Error,
    },
    /// A stored state that does not parse (written by another version?).
    #[error("connectors state {path}: source `{alias}`: {message}")]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// The source.
        alias: String,
        /// What failed.
        message: String,
    },
}

/// What one run of a source did (counts only; never content).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunCounts {
    /// Files listed with readers (the source's items after the run).
    pub items: usize,
    /// New or changed files extracted and stored.
    pub upserted: usize,
    /// Files whose bytes changed on the server but not their content (same SHA-256): grant
    /// update only.
    pub unchanged_content: usize,
    /// Permission-only changes (ACL update, no extraction, no embedding).
    pub permissions: usize,
    /// Renames and moves: the stored document keeps its id and is stored again under its new
    /// name and path (a rename that fails to store is counted in `failed`).
    pub moved: usize,
    /// Files gone from the source (tombstoned).
    pub deleted: usize,
    /// Files that could not be fetched, extracted or stored this run (listed in the state's
    /// errors; retried at the next run).
    pub failed: usize,
}

/// The last run of a source as stored.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct LastRun {
    /// Unix seconds it started.
    pub started_at: u64,
    /// Unix seconds it ended.
    pub finished_at: u64,
    /// Why it failed as a whole (`None`: it succeeded).
    pub error: Option<String>,
    /// What it did (a failed run may have applied some changes before failing).
    pub counts: RunCounts,
}

/// The connectors' file.
pub struct Store {
    path: PathBuf,
    conn: Mutex<Connection>,
}

impl Store {
    /// Opens (creating) the file.
    pub fn open(path: &Path) -> Result<Store, StoreError> {
        let err = |source| StoreError::Sqlite {
            path: path.to_path_buf(),
            source,
        };
        if let Some(dir) = path.parent() {
            // Made before the lockdown by `sandbox::daemon_writable`; here for tests and the
            // first start.
            let _ = std::fs::create_dir_all(dir);
        }
        let conn = Connection::open(path).map_err(err)?;
        conn.execute_batch(
            "PRAGMA journal_mode = WAL;
             PRAGMA synchronous = FULL;
             CREATE TABLE IF NOT EXISTS sources (
                 alias TEXT PRIMARY KEY,
                 state TEXT NOT NULL DEFAULT '{}',
                 last_run TEXT
             );",
        )
        .map_err(err)?;
        Ok(Store {
            path: path.to_path_buf(),
            conn: Mutex::new(conn),
        })
    }

    fn err(&self, source: rusqlite::Error) -> StoreError {
        StoreError::Sqlite {
            path: self.path.clone(),
            source,
        }
    }

    fn corrupt(&self, alias: &str, e: serde_json::Error) -> StoreError {
        StoreError::Corrupt {
            path: self.path.clone(),
            alias: alias.to_owned(),
            message: e.to_string(),
        }
    }

    /// The state of `alias`'s last successful sync (empty before the first).
    pub fn state(&self, alias: &str) -> Result<SourceState, StoreError> {
        let text: Option<String> = self
            .conn
            .lock()
            .query_row(
                "SELECT state FROM sources WHERE alias = ?1",
                params![alias],
                |r| r.get(0),
            )
            .optional()
            .map_err(|e| self.err(e))?;
        match text {
            None => Ok(SourceState::default()),
            Some(t) => serde_json::from_str(&t).map_err(|e| self.corrupt(alias, e)),
        }
    }

    /// The last run of `alias`, if any.
    pub fn last_run(&self, alias: &str) -> Result<Option<LastRun>, StoreError> {
        let text: Option<Option<String>> = self
            .conn
            .lock()
            .query_row(
                "SELECT last_run FROM sources WHERE alias = ?1",
                params![alias],
                |r| r.get(0),
            )
            .optional()
            .map_err(|e| self.err(e))?;
        match text.flatten() {
            None => Ok(None),
            Some(t) => serde_json::from_str(&t)
                .map(Some)
                .map_err(|e| self.corrupt(alias, e)),
        }
    }

    /// Records a successful run: the new state and the run, in one transaction.
    pub fn succeeded(
        &self,
        alias: &str,
        state: &SourceState,
        run: &LastRun,
    ) -> Result<(), StoreError> {
        let state = serde_json::to_string(state).map_err(|e| self.corrupt(alias, e))?;
        let run = serde_json::to_string(run).map_err(|e| self.corrupt(alias, e))?;
        self.conn
            .lock()
            .execute(
                "INSERT INTO sources (alias, state, last_run) VALUES (?1, ?2, ?3)
                 ON CONFLICT(alias) DO UPDATE SET state = ?2, last_run = ?3",
                params![alias, state, run],
            )
            .map_err(|e| self.err(e))?;
        Ok(())
    }

    /// Records a failed run; the state stays that of the last success.
    pub fn failed(&self, alias: &str, run: &LastRun) -> Result<(), StoreError> {
        let run = serde_json::to_string(run).map_err(|e| self.corrupt(alias, e))?;
        self.conn
            .lock()
            .execute(
                "INSERT INTO sources (alias, last_run) VALUES (?1, ?2)
                 ON CONFLICT(alias) DO UPDATE SET last_run = ?2",
                params![alias, run],
            )
            .map_err(|e| self.err(e))?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_run_keeps_the_last_successful_state() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("connectors").join("connectors.db");
        let store = Store::open(&path).unwrap();
        assert_eq!(store.state("a").unwrap(), SourceState::default());
        assert_eq!(store.last_run("a").unwrap(), None);
        let state = SourceState {
            last_success: Some(7),
            errors: vec![("x.bin".into(), "unsupported".into())],
            ..SourceState::default()
        };
        let ok = LastRun {
            started_at: 5,
            finished_at: 7,
            error: None,
            counts: RunCounts {
                items: 1,
                ..RunCounts::default()
            },
        };
        store.succeeded("a", &state, &ok).unwrap();
        let bad = LastRun {
            error: Some("unreachable".into()),
            ..ok.clone()
        };
        store.failed("a", &bad).unwrap();
        drop(store);
        let store = Store::open(&path).unwrap();
        assert_eq!(store.state("a").unwrap(), state);
        assert_eq!(store.last_run("a").unwrap(), Some(bad));
        store.failed("b", &ok).unwrap();
        assert_eq!(store.state("b").unwrap(), SourceState::default());
    }
}
