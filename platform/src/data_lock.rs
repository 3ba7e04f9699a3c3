//! One writer per data directory: `DATA/airlock.lock`, an advisory `flock`.
//!
//! `airlock serve` holds it exclusively for its whole life and writes its process id into it.
//! Every CLI command that writes what the daemon holds in memory or on its index (users,
//! tokens, sessions, grants, documents, indexes, conversations) holds it shared while it runs
//! (the appliance's `cli::writer` lists them). So while a daemon serves the directory, such a command is
//! refused at once, before it opens anything, and told which HTTP route does the same through
//! the daemon; a daemon does not start while such a command runs or another daemon serves; and
//! CLI writers may still run side by side with each other, as before.
//!
//! The lock goes with the open file: a holder that dies releases it, and `exec` (the demo's
//! hand-over to `airlock serve`) closes it.

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

pub use crate::paths::LOCK_FILE;

/// Why the lock was not taken.
#[derive(Debug, thiserror::Error)]
pub enum DataLockError {
    /// A daemon's lock refused: another daemon serves the directory or a CLI writer holds it.
    #[error(
        "refusing to start: {} a command that writes {} holds {} (one writer per data directory)",
        holder(.pid),
        .data.display(),
        .lock.display()
    )]
    Held {
        /// The data directory.
        data: PathBuf,
        /// Its lock file.
        lock: PathBuf,
        /// The process id in the lock file (a serving daemon's), if readable.
        pid: Option<u32>,
    },
    /// A CLI writer's lock refused: a daemon serves the directory.
    #[error(
        "refused: the daemon{} is serving {}, and only it writes there while it runs; {instead}",
        pid_note(.pid),
        .data.display()
    )]
    Serving {
        /// The data directory.
        data: PathBuf,
        /// The daemon's process id, if readable.
        pid: Option<u32>,
        /// What to do while it serves (the HTTP route).
        instead: String,
    },
    /// The file system refused: `doing` (`creating the data directory`, `opening`, `locking`,
    /// ...) `path`.
    #[error("{doing} {}", .path.display())]
    Io {
        /// What was being done.
        doing: &'static str,
        /// To which path.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
}

/// Who holds the lock against a daemon.
fn holder(pid: &Option<u32>) -> String {
    match pid {
        Some(pid) => format!("another `airlock serve` (pid {pid}) or"),
        None => "another `airlock serve` or".to_owned(),
    }
}

/// ` (pid N)` when the daemon's process id is known.
fn pid_note(pid: &Option<u32>) -> String {
    pid.map(|p| format!(" (pid {p})")).unwrap_or_default()
}

fn io<'a>(
    doing: &'static str,
    path: &'a Path,
) -> impl FnOnce(std::io::Error) -> DataLockError + 'a {
    move |source| DataLockError::Io {
        doing,
        path: path.to_path_buf(),
        source,
    }
}

/// A held data-directory lock; dropping it releases the lock.
#[derive(Debug)]
pub struct DataLock {
    _file: Option<File>,
}

/// The lock file of `data`.
pub fn path(data: &Path) -> PathBuf {
    crate::paths::DataDir::new(data).lock()
}

/// The process id a serving daemon wrote into the lock file, if readable.
fn daemon_pid(file: &mut File) -> Option<u32> {
    let mut s = String::new();
    file.seek(SeekFrom::Start(0)).ok()?;
    file.read_to_string(&mut s).ok()?;
    s.trim().parse().ok()
}

impl DataLock {
    /// The daemon's lock (`airlock serve`): exclusive, taken before anything is opened; its
    /// process id is written into the file. Refused while another daemon serves `data` or a CLI
    /// command writes to it.
    pub fn serve(data: &Path) -> Result<DataLock, DataLockError> {
        std::fs::create_dir_all(data).map_err(io("creating the data directory", data))?;
        let p = path(data);
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&p)
            .map_err(io("opening", &p))?;
        match file.try_lock() {
            Ok(()) => {}
            Err(std::fs::TryLockError::WouldBlock) => {
                return Err(DataLockError::Held {
                    data: data.to_path_buf(),
                    pid: daemon_pid(&mut file),
                    lock: p,
                });
            }
            Err(std::fs::TryLockError::Error(e)) => {
                return Err(io("locking", &p)(e));
            }
        }
        file.set_len(0)
            .and_then(|()| file.seek(SeekFrom::Start(0)).map(|_| ()))
            .and_then(|()| writeln!(file, "{}", std::process::id()))
            .and_then(|()| file.sync_data())
            .map_err(io("writing", &p))?;
        Ok(DataLock { _file: Some(file) })
    }

    /// A CLI writer's lock: shared with other CLI writers, refused while a daemon serves `data`
    /// with `instead` (what to do while it serves: the HTTP route) in the message. A directory
    /// that does not exist yet needs no lock (no daemon serves it); `create` makes the lock file
    /// in an existing directory that has none (every writer but `restore`, which must not put
    /// a file into the directory it is about to fill).
    pub fn write(data: &Path, instead: &str, create: bool) -> Result<DataLock, DataLockError> {
        if !data.is_dir() {
            return Ok(DataLock { _file: None });
        }
        let p = path(data);
        let file = match File::open(&p) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && !create => {
                return Ok(DataLock { _file: None });
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false)
                .open(&p)
                .map_err(io("creating", &p))?,
            Err(e) => return Err(io("opening", &p)(e)),
        };
        let mut file = file;
        match file.try_lock_shared() {
            Ok(()) => Ok(DataLock { _file: Some(file) }),
            Err(std::fs::TryLockError::WouldBlock) => Err(DataLockError::Serving {
                data: data.to_path_buf(),
                pid: daemon_pid(&mut file),
                instead: instead.to_owned(),
            }),
            Err(std::fs::TryLockError::Error(e)) => Err(io("locking", &p)(e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_daemon_excludes_writers_and_writers_exclude_the_daemon() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let w1 = DataLock::write(d, "use X", true).unwrap();
        let w2 = DataLock::write(d, "use X", true).unwrap();
        let e = DataLock::serve(d).unwrap_err().to_string();
        assert!(e.contains("refusing to start"), "{e}");
        drop((w1, w2));
        let daemon = DataLock::serve(d).unwrap();
        let e = DataLock::write(d, "use `POST /v1/x`", true)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains(&format!("(pid {})", std::process::id())) && e.ends_with("use `POST /v1/x`"),
            "{e}"
        );
        assert!(DataLock::serve(d).is_err(), "a second daemon");
        drop(daemon);
        assert!(DataLock::write(d, "", true).is_ok());
        // A directory that does not exist is not created, nor is a lock file without `create`.
        let missing = d.join("missing");
        assert!(DataLock::write(&missing, "", true).is_ok());
        assert!(!missing.exists());
        let empty = d.join("empty");
        std::fs::create_dir(&empty).unwrap();
        assert!(DataLock::write(&empty, "", false).is_ok());
        assert_eq!(std::fs::read_dir(&empty).unwrap().count(), 0);
    }
}
