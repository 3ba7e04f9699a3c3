//! The cross-process write lock of an index root, `<index root>/write.lock`: an exclusive
//! `flock` held by every engine write from its SQLite commit to its last index write (and by
//! [`crate::Retrieval::open`] while it repairs), and by `airlock backup` while it copies the
//! database and the current index generation. A holder therefore sees the document store and
//! the index files at the same point: no committed chunk the indexes lack, no index file
//! half-written by the engine.
//!
//! Each acquisition opens the file anew (its own open file description), so two holders in one
//! process exclude each other as two processes do. The lock goes with the file handle: a holder
//! that dies releases it.

use std::fs::{File, OpenOptions};
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};

/// File name of the lock in the index root.
pub const WRITE_LOCK_FILE: &str = "write.lock";

/// A held write lock; dropping it releases the lock.
#[derive(Debug)]
pub struct IndexWriteLock {
    _file: File,
}

impl IndexWriteLock {
    /// The lock file of `index_root`.
    pub fn path(index_root: &Path) -> PathBuf {
        index_root.join(WRITE_LOCK_FILE)
    }

    /// Waits for and takes the write lock of `index_root` (creating the lock file, mode 0644
    /// under the umask, when it does not exist; it is opened read-only otherwise, so a holder
    /// running as another user than the file's owner can take it too).
    pub fn acquire(index_root: &Path) -> Result<Self> {
        let path = Self::path(index_root);
        let file = match File::open(&path) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false)
                .open(&path)
                .map_err(|e| Error::io(&path, e))?,
            Err(e) => return Err(Error::io(&path, e)),
        };
        file.lock().map_err(|e| Error::io(&path, e))?;
        Ok(Self { _file: file })
    }

    /// Takes the lock if nobody holds it (`None` when it is held elsewhere).
    pub fn try_acquire(index_root: &Path) -> Result<Option<Self>> {
        let path = Self::path(index_root);
        let file = match File::open(&path) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Self::acquire(index_root).map(Some);
            }
            Err(e) => return Err(Error::io(&path, e)),
        };
        match file.try_lock() {
            Ok(()) => Ok(Some(Self { _file: file })),
            Err(std::fs::TryLockError::WouldBlock) => Ok(None),
            Err(std::fs::TryLockError::Error(e)) => Err(Error::io(&path, e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn holders_exclude_each_other_in_one_process() {
        let dir = tempfile::tempdir().unwrap();
        let held = IndexWriteLock::acquire(dir.path()).unwrap();
        assert!(IndexWriteLock::try_acquire(dir.path()).unwrap().is_none());
        drop(held);
        let again = IndexWriteLock::try_acquire(dir.path()).unwrap();
        assert!(again.is_some());
    }
}
