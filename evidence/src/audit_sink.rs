//! The audit log as JSON lines for a SIEM: `airlock audit export` writes the log's entries in a
//! time range, and the `[audit_sink]` file receives every entry as it is committed. Both write
//! the same record, one JSON object per line ([`line`]; docs/operations/siem.md "Audit export, field
//! by field"): ids, counts and digests only, never content.
//!
//! The sink file is appended to and rotated at `max_bytes`: `path` → `path.1` → … → `path.keep`
//! (the oldest beyond `keep` is removed). fsync policy: each batch handed over by the ACL (in
//! practice one entry per append) is written and `fdatasync`ed before the append returns; a
//! rotation also syncs the directory. SQLite stays the record: a failed write is logged and the
//! same entries are offered again with the next append, so the file never skips an entry; after
//! a restart the sink continues after the last `seq` its file holds.

use std::fs::{self, File, OpenOptions};
use std::io::{self, BufRead, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use airlock_acl::{AuditEntry, AuditSink};
use serde::{Deserialize, Serialize};

/// `[audit_sink]`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AuditSinkConfig {
    /// The JSON-lines file (its directory must exist and be writable by the daemon).
    pub path: PathBuf,
    /// Rotate before a line would take the file past this many bytes [default: 100 MiB].
    #[serde(default = "default_max_bytes")]
    pub max_bytes: u64,
    /// Rotated files kept (`path.1` … `path.keep`) [default: 10].
    #[serde(default = "default_keep")]
    pub keep: u32,
}

fn default_max_bytes() -> u64 {
    100 << 20
}

fn default_keep() -> u32 {
    10
}

/// Most rotated files.
pub const MAX_KEEP: u32 = 1000;

impl AuditSinkConfig {
    /// Range checks (the writable check is [`FileSink::open`]'s, at start).
    pub fn validate(&self) -> Result<(), String> {
        if self.path.as_os_str().is_empty() {
            return Err("`path` is empty".into());
        }
        if self.max_bytes == 0 {
            return Err("`max_bytes` must be at least 1".into());
        }
        if self.keep == 0 || self.keep > MAX_KEEP {
            return Err(format!("`keep` must be between 1 and {MAX_KEEP}"));
        }
        Ok(())
    }
}

/// One exported record: the entry's compact JSON (`seq`, `at`, `kind`, `actor`, `user_id`,
/// `request_id`, `detail`), without the newline.
pub fn line(e: &AuditEntry) -> String {
    serde_json::to_string(e).expect("an audit entry serializes")
}

/// The `[audit_sink]` file.
#[derive(Debug)]
pub struct FileSink {
    path: PathBuf,
    max_bytes: u64,
    keep: u32,
    file: File,
    size: u64,
}

fn rotated(path: &Path, n: u32) -> PathBuf {
    let mut s = path.as_os_str().to_owned();
    s.push(format!(".{n}"));
    PathBuf::from(s)
}

impl FileSink {
    /// Opens (creating) the file for appending; an unusable path is an error naming it.
    pub fn open(c: &AuditSinkConfig) -> io::Result<Self> {
        c.validate().map_err(io::Error::other)?;
        let file = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&c.path)
            .map_err(|e| {
                io::Error::new(
                    e.kind(),
                    format!("cannot open {} for appending: {e}", c.path.display()),
                )
            })?;
        let size = file.metadata()?.len();
        Ok(FileSink {
            path: c.path.clone(),
            max_bytes: c.max_bytes,
            keep: c.keep,
            file,
            size,
        })
    }

    /// The `seq` of the last record in the file (or, when it is empty, in `path.1`).
    pub fn last_seq(&self) -> io::Result<Option<i64>> {
        for p in [self.path.clone(), rotated(&self.path, 1)] {
            if let Some(seq) = last_seq_of(&p)? {
                return Ok(Some(seq));
            }
        }
        Ok(None)
    }

    fn rotate(&mut self) -> io::Result<()> {
        let _ = fs::remove_file(rotated(&self.path, self.keep));
        for n in (1..self.keep).rev() {
            let from = rotated(&self.path, n);
            if from.exists() {
                fs::rename(&from, rotated(&self.path, n + 1))?;
            }
        }
        fs::rename(&self.path, rotated(&self.path, 1))?;
        self.file = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.path)?;
        self.size = 0;
        if let Some(dir) = self.path.parent().filter(|d| !d.as_os_str().is_empty()) {
            File::open(dir)?.sync_all()?;
        }
        Ok(())
    }
}

impl AuditSink for FileSink {
    fn write(&mut self, entries: &[AuditEntry]) -> io::Result<()> {
        for e in entries {
            let mut l = line(e);
            l.push('\n');
            let len = l.len() as u64;
            if self.size > 0 && self.size + len > self.max_bytes {
                self.file.sync_data()?;
                self.rotate()?;
            }
            self.file.write_all(l.as_bytes())?;
            self.size += len;
        }
        self.file.sync_data()
    }
}

/// The `seq` of the last complete line of `path` (`None`: absent or empty).
fn last_seq_of(path: &Path) -> io::Result<Option<i64>> {
    let mut f = match File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    let len = f.metadata()?.len();
    let start = len.saturating_sub(64 << 10);
    f.seek(SeekFrom::Start(start))?;
    let mut tail = Vec::new();
    f.read_to_end(&mut tail)?;
    let mut last = None;
    for l in tail.lines() {
        let l = l?;
        if let Ok(v) = serde_json::from_str::<serde_json::Value>(&l)
            && let Some(seq) = v.get("seq").and_then(serde_json::Value::as_i64)
        {
            last = Some(seq);
        }
    }
    Ok(last)
}

/// Why the configured sink could not be attached ([`attach`]).
#[derive(Debug, thiserror::Error)]
pub enum AttachError {
    /// The file cannot be opened for appending (or the section is out of range).
    #[error("[audit_sink]")]
    Open(#[source] io::Error),
    /// The file's last record cannot be read.
    #[error("[audit_sink]: reading {}", path.display())]
    Read {
        /// The sink file.
        path: PathBuf,
        /// Cause.
        source: io::Error,
    },
    /// The ACL refused the sink.
    #[error(transparent)]
    Acl(#[from] airlock_acl::Error),
}

/// Opens the configured sink and attaches it to the ACL, continuing after the last record its
/// file holds (a fresh file starts with the entries committed from now on). Called at start;
/// an unusable file refuses the start.
pub fn attach(acl: &airlock_acl::Acl, c: &AuditSinkConfig) -> Result<(), AttachError> {
    let sink = FileSink::open(c).map_err(AttachError::Open)?;
    let after = sink.last_seq().map_err(|source| AttachError::Read {
        path: c.path.clone(),
        source,
    })?;
    acl.attach_audit_sink(Box::new(sink), after)?;
    tracing::info!(path = %c.path.display(), max_bytes = c.max_bytes, keep = c.keep,
        after_seq = after, "audit sink attached");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_settings_are_refused() {
        let ok = AuditSinkConfig {
            path: "/tmp/x.jsonl".into(),
            max_bytes: 1,
            keep: 1,
        };
        assert!(ok.validate().is_ok());
        for bad in [
            AuditSinkConfig {
                max_bytes: 0,
                ..ok.clone()
            },
            AuditSinkConfig {
                keep: 0,
                ..ok.clone()
            },
            AuditSinkConfig {
                keep: MAX_KEEP + 1,
                ..ok.clone()
            },
            AuditSinkConfig {
                path: PathBuf::new(),
                ..ok.clone()
            },
        ] {
            assert!(bad.validate().is_err(), "{bad:?}");
        }
        let unwritable = AuditSinkConfig {
            path: "/nonexistent-dir/audit.jsonl".into(),
            ..ok
        };
        let e = FileSink::open(&unwritable).unwrap_err().to_string();
        assert!(e.contains("/nonexistent-dir/audit.jsonl"), "{e}");
    }
}
