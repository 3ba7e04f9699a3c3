//! Append-only row files (`vectors.f32`, `vectors.i8`, `chunks.u32`): a 64-byte versioned header,
//! then fixed-size rows indexed by slot, with a SHA-256 per block of [`BLOCK_ROWS`] rows kept in
//! the index's meta file.
//!
//! Block checksums make [`RowFile::sync`] cost O(new rows) (only the last, partial block is
//! re-hashed) while [`RowFile::open`] still verifies every byte. Rows past the persisted count
//! (written after the last meta commit) are truncated on open: they were never acknowledged.

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::VectorError;

/// Rows per checksummed block.
pub(crate) const BLOCK_ROWS: u64 = 4096;
/// Header length in bytes.
pub(crate) const HEADER_LEN: u64 = 64;
const MAGIC: &[u8; 8] = b"ALVROWS\0";
/// Format version of the row files.
pub(crate) const ROWS_VERSION: u32 = 1;

/// What a row file holds (stored in its header).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RowKind {
    /// Little-endian f32 components, `dim` per row.
    F32 = 1,
    /// int8 components, `dim` per row.
    I8 = 2,
    /// One little-endian u32 chunk id per row.
    ChunkId = 3,
}

/// Persisted state of one row file (part of the meta file).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub(crate) struct RowFileState {
    /// Rows covered by `blocks`.
    pub rows: u64,
    /// Hex SHA-256 of each block of [`BLOCK_ROWS`] rows (the last may be partial).
    pub blocks: Vec<String>,
}

/// One append-only row file.
#[derive(Debug)]
pub(crate) struct RowFile {
    path: PathBuf,
    file: File,
    row_bytes: u64,
    /// Rows written (persisted or not).
    rows: u64,
    /// Checksums as of the last `sync`.
    state: RowFileState,
}

fn io_err(path: &Path, what: &str) -> impl FnOnce(std::io::Error) -> VectorError {
    let path = path.to_path_buf();
    let what = what.to_string();
    move |source| VectorError::Io { path, what, source }
}

fn header(kind: RowKind, dim: u32, row_bytes: u64) -> [u8; HEADER_LEN as usize] {
    let mut h = [0u8; HEADER_LEN as usize];
    h[..8].copy_from_slice(MAGIC);
    h[8..12].copy_from_slice(&ROWS_VERSION.to_le_bytes());
    h[12..16].copy_from_slice(&(kind as u32).to_le_bytes());
    h[16..20].copy_from_slice(&dim.to_le_bytes());
    h[20..28].copy_from_slice(&row_bytes.to_le_bytes());
    h
}

impl RowFile {
    /// Creates (truncating) a row file with its header.
    pub fn create(
        path: &Path,
        kind: RowKind,
        dim: u32,
        row_bytes: u64,
    ) -> Result<Self, VectorError> {
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(path)
            .map_err(io_err(path, "create row file"))?;
        file.write_all(&header(kind, dim, row_bytes))
            .and_then(|()| file.sync_all())
            .map_err(io_err(path, "write row file header"))?;
        Ok(Self {
            path: path.to_path_buf(),
            file,
            row_bytes,
            rows: 0,
            state: RowFileState::default(),
        })
    }

    /// Opens a row file persisted with `state`: checks the header, truncates rows past
    /// `state.rows`, and verifies every block checksum.
    pub fn open(
        path: &Path,
        kind: RowKind,
        dim: u32,
        row_bytes: u64,
        state: &RowFileState,
    ) -> Result<Self, VectorError> {
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)
            .map_err(io_err(path, "open row file"))?;
        let mut h = [0u8; HEADER_LEN as usize];
        file.read_exact(&mut h)
            .map_err(io_err(path, "read row file header"))?;
        if h != header(kind, dim, row_bytes) {
            return Err(VectorError::Corrupt {
                path: path.to_path_buf(),
                detail: format!(
                    "header does not match ({kind:?}, dim {dim}, format version {ROWS_VERSION})"
                ),
            });
        }
        let want_len = HEADER_LEN + state.rows * row_bytes;
        let len = file
            .metadata()
            .map_err(io_err(path, "stat row file"))?
            .len();
        if len < want_len {
            return Err(VectorError::Corrupt {
                path: path.to_path_buf(),
                detail: format!("{len} bytes, {want_len} expected for {} rows", state.rows),
            });
        }
        if len > want_len {
            file.set_len(want_len)
                .map_err(io_err(path, "truncate unpersisted rows"))?;
        }
        let expected_blocks = state.rows.div_ceil(BLOCK_ROWS) as usize;
        if state.blocks.len() != expected_blocks {
            return Err(VectorError::Corrupt {
                path: path.to_path_buf(),
                detail: format!(
                    "{} block checksums for {} rows",
                    state.blocks.len(),
                    state.rows
                ),
            });
        }
        let mut rf = Self {
            path: path.to_path_buf(),
            file,
            row_bytes,
            rows: state.rows,
            state: state.clone(),
        };
        for (i, want) in state.blocks.iter().enumerate() {
            let got = rf.hash_block(i as u64)?;
            if &got != want {
                return Err(VectorError::Corrupt {
                    path: path.to_path_buf(),
                    detail: format!(
                        "checksum mismatch in block {i} (rows {}..)",
                        i as u64 * BLOCK_ROWS
                    ),
                });
            }
        }
        rf.file
            .seek(SeekFrom::End(0))
            .map_err(io_err(path, "seek row file"))?;
        Ok(rf)
    }

    fn hash_block(&mut self, block: u64) -> Result<String, VectorError> {
        let first = block * BLOCK_ROWS;
        let last = (first + BLOCK_ROWS).min(self.rows);
        let mut buf = vec![0u8; ((last - first) * self.row_bytes) as usize];
        self.file
            .seek(SeekFrom::Start(HEADER_LEN + first * self.row_bytes))
            .and_then(|_| self.file.read_exact(&mut buf))
            .map_err(io_err(&self.path, "read rows for checksum"))?;
        self.file
            .seek(SeekFrom::End(0))
            .map_err(io_err(&self.path, "seek row file"))?;
        Ok(hex::encode(Sha256::digest(&buf)))
    }

    /// Appends whole rows (`bytes.len()` must be a multiple of the row size).
    pub fn append(&mut self, bytes: &[u8]) -> Result<(), VectorError> {
        debug_assert_eq!(bytes.len() as u64 % self.row_bytes, 0);
        self.file
            .write_all(bytes)
            .map_err(io_err(&self.path, "append rows"))?;
        self.rows += bytes.len() as u64 / self.row_bytes;
        Ok(())
    }

    /// Makes the appended rows durable and updates the block checksums (re-hashing only blocks
    /// that changed since the last sync). Returns the state to store in the meta file.
    pub fn sync(&mut self) -> Result<RowFileState, VectorError> {
        if self.rows == self.state.rows {
            return Ok(self.state.clone());
        }
        self.file
            .sync_data()
            .map_err(io_err(&self.path, "fsync rows"))?;
        let first_dirty = self.state.rows / BLOCK_ROWS;
        let total_blocks = self.rows.div_ceil(BLOCK_ROWS);
        self.state.blocks.truncate(first_dirty as usize);
        for b in first_dirty..total_blocks {
            let h = self.hash_block(b)?;
            self.state.blocks.push(h);
        }
        self.state.rows = self.rows;
        Ok(self.state.clone())
    }

    /// Reads all persisted rows' bytes.
    pub fn read_all(&mut self) -> Result<Vec<u8>, VectorError> {
        let mut buf = vec![0u8; (self.rows * self.row_bytes) as usize];
        self.file
            .seek(SeekFrom::Start(HEADER_LEN))
            .and_then(|_| self.file.read_exact(&mut buf))
            .and_then(|()| self.file.seek(SeekFrom::End(0)).map(|_| ()))
            .map_err(io_err(&self.path, "read rows"))?;
        Ok(buf)
    }

    /// The open file (for memory-mapping).
    pub fn file(&self) -> &File {
        &self.file
    }

    /// Rows written so far.
    #[cfg(test)]
    pub fn rows(&self) -> u64 {
        self.rows
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sync_reopen_verify_and_truncate_unpersisted_tail() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("r.bin");
        let mut rf = RowFile::create(&p, RowKind::I8, 4, 4).unwrap();
        let rows: Vec<u8> = (0..(BLOCK_ROWS as usize + 10) * 4)
            .map(|i| i as u8)
            .collect();
        rf.append(&rows).unwrap();
        let st = rf.sync().unwrap();
        assert_eq!(st.rows, BLOCK_ROWS + 10);
        assert_eq!(st.blocks.len(), 2);
        rf.append(&[1, 2, 3, 4]).unwrap(); // never synced
        drop(rf);
        let mut rf = RowFile::open(&p, RowKind::I8, 4, 4, &st).unwrap();
        assert_eq!(rf.rows(), BLOCK_ROWS + 10);
        assert_eq!(rf.read_all().unwrap(), rows);
        // Appending after reopen re-hashes only the last block.
        rf.append(&[9, 9, 9, 9]).unwrap();
        let st2 = rf.sync().unwrap();
        assert_eq!(st2.blocks[0], st.blocks[0]);
        assert_ne!(st2.blocks[1], st.blocks[1]);
    }

    #[test]
    fn corruption_and_wrong_header_are_detected() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("r.bin");
        let mut rf = RowFile::create(&p, RowKind::F32, 2, 8).unwrap();
        rf.append(&[0u8; 80]).unwrap();
        let st = rf.sync().unwrap();
        drop(rf);
        assert!(matches!(
            RowFile::open(&p, RowKind::F32, 3, 12, &st),
            Err(VectorError::Corrupt { .. })
        ));
        let mut bytes = std::fs::read(&p).unwrap();
        bytes[HEADER_LEN as usize + 5] ^= 1;
        std::fs::write(&p, &bytes).unwrap();
        let err = RowFile::open(&p, RowKind::F32, 2, 8, &st).unwrap_err();
        assert!(err.to_string().contains("checksum"), "{err}");
    }
}
