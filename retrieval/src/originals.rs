//! The original files of ingested documents, content-addressed: `<data>/originals/<sha256>`.
//!
//! A file is written before the row that names it is committed (temporary file, fsync, rename,
//! fsync of the directory), so a committed document never names a missing file; identical files
//! share one copy. After every write the engine removes the files no live document names any
//! more ([`crate::Retrieval`]: replace, delete, purge, a failed joint write), and on open it
//! sweeps files a crash left unnamed. Every change happens under the engine's writer lock and
//! the cross-process write lock, which `airlock backup` also takes.

use std::io::Write;
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use crate::error::{Error, Result};

/// An ingested document's original file, stored with it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Original {
    /// SHA-256 of `bytes`, lowercase hex.
    pub sha256: String,
    /// Its media type (`application/pdf`, ...).
    pub media_type: String,
    /// The file's bytes.
    pub bytes: Vec<u8>,
}

impl Original {
    /// The original `bytes` of media type `media_type`.
    pub fn new(media_type: impl Into<String>, bytes: Vec<u8>) -> Self {
        Self {
            sha256: sha256_hex(&bytes),
            media_type: media_type.into(),
            bytes,
        }
    }
}

/// SHA-256 of `bytes`, lowercase hex.
pub fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// Whether `s` is a SHA-256 digest in lowercase hex (the only names in the directory).
pub(crate) fn is_digest(s: &str) -> bool {
    s.len() == 64
        && s.bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// The originals directory.
#[derive(Debug)]
pub(crate) struct Originals {
    dir: PathBuf,
}

impl Originals {
    /// Opens (creating if needed) the directory.
    pub(crate) fn open(dir: &Path) -> Result<Self> {
        std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
        Ok(Self {
            dir: dir.to_path_buf(),
        })
    }

    /// The path of the file with this digest (`None` for anything but a digest).
    pub(crate) fn path(&self, sha256: &str) -> Option<PathBuf> {
        is_digest(sha256).then(|| self.dir.join(sha256))
    }

    /// Stores `original` durably; a file already there with this digest is kept.
    pub(crate) fn put(&self, original: &Original) -> Result<()> {
        let path = self.path(&original.sha256).ok_or_else(|| {
            Error::Corrupt(format!("not a SHA-256 digest: {:.80}", original.sha256))
        })?;
        if path.is_file() {
            return Ok(());
        }
        let tmp = self
            .dir
            .join(format!("{}.{}.tmp", original.sha256, std::process::id()));
        let written = (|| {
            let mut f = std::fs::File::create(&tmp)?;
            f.write_all(&original.bytes)?;
            f.sync_all()?;
            drop(f);
            std::fs::rename(&tmp, &path)?;
            self.sync_dir()
        })();
        if let Err(e) = written {
            let _ = std::fs::remove_file(&tmp);
            return Err(Error::io(&path, e));
        }
        Ok(())
    }

    /// Removes the file with this digest (absent is fine).
    pub(crate) fn remove(&self, sha256: &str) -> Result<()> {
        let Some(path) = self.path(sha256) else {
            return Ok(());
        };
        match std::fs::remove_file(&path) {
            Ok(()) => self.sync_dir().map_err(|e| Error::io(&self.dir, e)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(Error::io(&path, e)),
        }
    }

    /// Digests of the files present, and the leftover temporary files of interrupted writes.
    pub(crate) fn list(&self) -> Result<(Vec<String>, Vec<PathBuf>)> {
        let mut digests = Vec::new();
        let mut leftovers = Vec::new();
        for entry in std::fs::read_dir(&self.dir).map_err(|e| Error::io(&self.dir, e))? {
            let entry = entry.map_err(|e| Error::io(&self.dir, e))?;
            let name = entry.file_name();
            let name = name.to_string_lossy();
            if is_digest(&name) {
                digests.push(name.into_owned());
            } else if name.ends_with(".tmp") {
                leftovers.push(entry.path());
            }
        }
        Ok((digests, leftovers))
    }

    fn sync_dir(&self) -> std::io::Result<()> {
        std::fs::File::open(&self.dir)?.sync_all()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn put_is_durable_idempotent_and_content_addressed() {
        let dir = tempfile::tempdir().unwrap();
        let o = Originals::open(&dir.path().join("originals")).unwrap();
        let a = Original::new("text/plain", b"hello".to_vec());
        assert_eq!(
            a.sha256,
            "2cf24dba5fb0a30e26e83b2ac5b9e29e1b161e5c1fa7425e73043362938b9824"
        );
        o.put(&a).unwrap();
        o.put(&a).unwrap();
        let p = o.path(&a.sha256).unwrap();
        assert_eq!(std::fs::read(&p).unwrap(), b"hello");
        let (digests, leftovers) = o.list().unwrap();
        assert_eq!(digests, vec![a.sha256.clone()]);
        assert!(leftovers.is_empty());
        o.remove(&a.sha256).unwrap();
        o.remove(&a.sha256).unwrap();
        assert!(!p.exists());
        assert!(o.path("../etc/passwd").is_none());
        assert!(o.path(&"A".repeat(64)).is_none());
    }
}
