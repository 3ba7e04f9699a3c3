//! The backup archive format: one zstd frame (with its content checksum) holding a tar stream:
//! `MANIFEST` first, then `data/<path>` for every file the manifest lists, in its order, and
//! nothing else.
//!
//! `MANIFEST` is a line `AIRLOCK-BACKUP <format version> <SHA-256 of the JSON body>` and the
//! JSON body ([`Manifest`]: what was backed up, and every file's path, size, mode and SHA-256).
//! The checksums detect corruption, not a forger (the archive is not signed: keep backups where
//! only operators can write). The reader treats the archive as hostile input all the same:
//! every path is checked, only regular files are accepted, every size must be the manifest's,
//! and files are written only beneath the caller's staging directory.

use std::fs::{self, File, OpenOptions};
use std::io::{self, BufWriter, Read, Write};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// The manifest line's magic word.
pub const MAGIC: &str = "AIRLOCK-BACKUP";
/// Format version of the archive and its manifest.
pub const FORMAT_VERSION: u32 = 1;
/// Name of the first entry.
pub const MANIFEST_ENTRY: &str = "MANIFEST";
/// Prefix of every file entry.
pub const DATA_PREFIX: &str = "data/";
/// Largest manifest accepted (bytes).
pub const MAX_MANIFEST_BYTES: u64 = 64 << 20;
/// Most files accepted in one manifest.
pub const MAX_FILES: usize = 1_000_000;

/// What an archive holds.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Manifest {
    /// [`FORMAT_VERSION`].
    pub format_version: u32,
    /// When the backup was taken (RFC 3339, UTC).
    pub created: String,
    /// The `airlock` version that took it.
    pub airlock_version: String,
    /// The index generation copied (`index/<generation>/`), the one the database names.
    pub index_generation: u64,
    /// The installed bundle's version at the time, if any.
    pub bundle: Option<String>,
    /// Whether private keys (`*.key`, the appliance key among them) are in the archive.
    pub includes_keys: bool,
    /// Whether the installed bundles (`bundles/`) are in the archive.
    pub includes_bundles: bool,
    /// Every file, in archive order.
    pub files: Vec<FileEntry>,
}

/// One file of the data directory.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileEntry {
    /// Path relative to the data directory (`/`-separated).
    pub path: String,
    /// Size in bytes.
    pub size: u64,
    /// Permission bits (at most 0o755; private keys 0o600).
    pub mode: u32,
    /// SHA-256 of the content, lowercase hex.
    pub sha256: String,
}

/// Why an archive cannot be written or read.
#[derive(Debug, thiserror::Error)]
pub enum ArchiveError {
    /// A local file operation failed.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// Cause.
        source: io::Error,
    },
    /// The archive is damaged or not a backup: `entry` names where (the manifest, a file's
    /// path, or `archive` for the container itself).
    #[error("corrupt backup: {entry}: {reason}")]
    Corrupt {
        /// The entry (a data-directory path, `MANIFEST`, or `archive`).
        entry: String,
        /// What is wrong.
        reason: String,
    },
}

fn corrupt(entry: impl Into<String>, reason: impl Into<String>) -> ArchiveError {
    ArchiveError::Corrupt {
        entry: entry.into(),
        reason: reason.into(),
    }
}

fn io_err(path: &Path) -> impl Fn(io::Error) -> ArchiveError + '_ {
    move |source| ArchiveError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// The bytes of `MANIFEST` for `m`.
pub fn manifest_bytes(m: &Manifest) -> Vec<u8> {
    let body = serde_json::to_vec_pretty(m).expect("a manifest serialises");
    let mut out = format!(
        "{MAGIC} {FORMAT_VERSION} {}\n",
        hex::encode(Sha256::digest(&body))
    )
    .into_bytes();
    out.extend_from_slice(&body);
    out
}

/// Parses and validates `MANIFEST` bytes.
pub fn parse_manifest(bytes: &[u8]) -> Result<Manifest, ArchiveError> {
    let bad = |r: String| corrupt(MANIFEST_ENTRY, r);
    let nl = bytes
        .iter()
        .position(|&b| b == b'\n')
        .ok_or_else(|| bad("no header line".into()))?;
    let header =
        std::str::from_utf8(&bytes[..nl]).map_err(|_| bad("header is not UTF-8".into()))?;
    let body = &bytes[nl + 1..];
    let mut parts = header.split(' ');
    let (magic, version, digest) = (parts.next(), parts.next(), parts.next());
    if magic != Some(MAGIC) || parts.next().is_some() {
        return Err(bad(format!("not an Airlock backup (header {header:?})")));
    }
    if version != Some(&FORMAT_VERSION.to_string()) {
        return Err(bad(format!(
            "format version {} (this airlock reads {FORMAT_VERSION})",
            version.unwrap_or("?")
        )));
    }
    if digest != Some(hex::encode(Sha256::digest(body)).as_str()) {
        return Err(bad("SHA-256 mismatch".into()));
    }
    let m: Manifest =
        serde_json::from_slice(body).map_err(|e| bad(format!("invalid JSON: {e}")))?;
    validate(&m)?;
    Ok(m)
}

/// The manifest's own rules: version, file count, safe unique paths (none a directory of
/// another), hex digests, modes.
fn validate(m: &Manifest) -> Result<(), ArchiveError> {
    if m.format_version != FORMAT_VERSION {
        return Err(corrupt(
            MANIFEST_ENTRY,
            format!("format_version {}", m.format_version),
        ));
    }
    if m.files.len() > MAX_FILES {
        return Err(corrupt(
            MANIFEST_ENTRY,
            format!("{} files (at most {MAX_FILES})", m.files.len()),
        ));
    }
    let mut paths: Vec<&str> = Vec::with_capacity(m.files.len());
    for f in &m.files {
        airlock_bundle::check_path(&f.path)
            .map_err(|why| corrupt(MANIFEST_ENTRY, format!("path {:?}: {why}", f.path)))?;
        if f.sha256.len() != 64
            || !f
                .sha256
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        {
            return Err(corrupt(
                MANIFEST_ENTRY,
                format!("{}: sha256 is not 64 lowercase hex digits", f.path),
            ));
        }
        if f.mode & !0o755 != 0 {
            return Err(corrupt(
                MANIFEST_ENTRY,
                format!("{}: mode {:o} (at most 0755)", f.path, f.mode),
            ));
        }
        paths.push(&f.path);
    }
    paths.sort_unstable();
    for w in paths.windows(2) {
        if w[0] == w[1] {
            return Err(corrupt(MANIFEST_ENTRY, format!("{} listed twice", w[0])));
        }
        if w[1].starts_with(w[0]) && w[1].as_bytes()[w[0].len()] == b'/' {
            return Err(corrupt(
                MANIFEST_ENTRY,
                format!("{} is a file and a directory", w[0]),
            ));
        }
    }
    Ok(())
}

/// SHA-256 and size of a file.
pub fn hash_file(path: &Path) -> Result<(String, u64), ArchiveError> {
    let f = File::open(path).map_err(io_err(path))?;
    let mut reader = Hashing {
        inner: f,
        hasher: Sha256::new(),
        n: 0,
    };
    io::copy(&mut reader, &mut io::sink()).map_err(io_err(path))?;
    Ok((hex::encode(reader.hasher.finalize()), reader.n))
}

/// A file to put in an archive: its entry and where its bytes are now.
pub struct Source {
    /// The manifest entry (path, size, mode, digest as hashed).
    pub entry: FileEntry,
    /// The file to read.
    pub from: PathBuf,
}

/// Writes the archive to `out` (created; an existing file is refused): `manifest` (whose files
/// are the entries of `sources`, in order), then each file, read again and checked against its
/// entry (a file that changed since it was hashed fails the write).
pub fn write(out: &Path, manifest: &Manifest, sources: &[Source]) -> Result<u64, ArchiveError> {
    validate(manifest)?;
    if manifest.files.len() != sources.len()
        || manifest
            .files
            .iter()
            .zip(sources)
            .any(|(f, s)| *f != s.entry)
    {
        return Err(corrupt(
            MANIFEST_ENTRY,
            "the manifest does not list the sources in order",
        ));
    }
    let file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(out)
        .map_err(io_err(out))?;
    let mut enc = zstd::stream::write::Encoder::new(BufWriter::with_capacity(1 << 20, file), 3)
        .map_err(io_err(out))?;
    enc.include_checksum(true).map_err(io_err(out))?;
    let mut tar = tar::Builder::new(enc);
    let m = manifest_bytes(manifest);
    tar.append_data(&mut header(m.len() as u64, 0o644), MANIFEST_ENTRY, &m[..])
        .map_err(io_err(out))?;
    for s in sources {
        let f = File::open(&s.from).map_err(io_err(&s.from))?;
        let mut reader = Hashing {
            inner: f.take(s.entry.size),
            hasher: Sha256::new(),
            n: 0,
        };
        tar.append_data(
            &mut header(s.entry.size, s.entry.mode),
            format!("{DATA_PREFIX}{}", s.entry.path),
            &mut reader,
        )
        .map_err(io_err(&s.from))?;
        if reader.n != s.entry.size || hex::encode(reader.hasher.finalize()) != s.entry.sha256 {
            return Err(ArchiveError::Io {
                path: s.from.clone(),
                source: io::Error::other("the file changed while the backup was written"),
            });
        }
    }
    let enc = tar.into_inner().map_err(io_err(out))?;
    let buf = enc.finish().map_err(io_err(out))?;
    let file = buf.into_inner().map_err(|e| ArchiveError::Io {
        path: out.to_path_buf(),
        source: e.into_error(),
    })?;
    file.sync_all().map_err(io_err(out))?;
    Ok(file.metadata().map_err(io_err(out))?.len())
}

fn header(size: u64, mode: u32) -> tar::Header {
    let mut h = tar::Header::new_gnu();
    h.set_entry_type(tar::EntryType::Regular);
    h.set_size(size);
    h.set_mode(mode);
    h.set_mtime(0);
    h.set_uid(0);
    h.set_gid(0);
    h
}

struct Hashing<R> {
    inner: R,
    hasher: Sha256,
    n: u64,
}

impl<R: Read> Read for Hashing<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.hasher.update(&buf[..n]);
        self.n += n as u64;
        Ok(n)
    }
}

/// Reads an archive from `input`, writing each file beneath `into` (an existing, empty
/// directory) only after its path and size were checked, and checking its SHA-256 as it is
/// written. Returns the manifest once every file is written and verified and the archive ended
/// where the manifest says. On an error, `into` may hold a part of the files: the caller
/// removes it.
pub fn read(input: impl Read, into: &Path) -> Result<Manifest, ArchiveError> {
    let archive_err = |e: io::Error| corrupt("archive", e.to_string());
    let decoder = zstd::stream::read::Decoder::new(input)
        .map_err(archive_err)?
        .single_frame();
    let mut tar = tar::Archive::new(decoder);
    let mut entries = tar.entries().map_err(archive_err)?;
    let mut first = next_entry(&mut entries, MANIFEST_ENTRY)?;
    check_entry(&first, MANIFEST_ENTRY, MANIFEST_ENTRY)?;
    if first.size() > MAX_MANIFEST_BYTES {
        return Err(corrupt(MANIFEST_ENTRY, format!("{} bytes", first.size())));
    }
    let mut bytes = Vec::with_capacity(first.size() as usize);
    first
        .read_to_end(&mut bytes)
        .map_err(|e| corrupt(MANIFEST_ENTRY, e.to_string()))?;
    drop(first);
    let manifest = parse_manifest(&bytes)?;
    for f in &manifest.files {
        let mut entry = next_entry(&mut entries, &f.path)?;
        check_entry(&entry, &format!("{DATA_PREFIX}{}", f.path), &f.path)?;
        if entry.size() != f.size {
            return Err(corrupt(
                &f.path,
                format!(
                    "{} bytes in the archive, {} in the manifest",
                    entry.size(),
                    f.size
                ),
            ));
        }
        let dst = into.join(&f.path);
        if let Some(parent) = dst.parent() {
            fs::create_dir_all(parent).map_err(io_err(parent))?;
        }
        let mut out = OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&dst)
            .map_err(io_err(&dst))?;
        // Reading is the archive's fault, writing the disk's.
        let mut hasher = Sha256::new();
        let mut n = 0u64;
        let mut buf = vec![0u8; 1 << 16];
        loop {
            let got = match entry.read(&mut buf) {
                Ok(0) => break,
                Ok(got) => got,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(corrupt(&f.path, e.to_string())),
            };
            hasher.update(&buf[..got]);
            n += got as u64;
            out.write_all(&buf[..got]).map_err(io_err(&dst))?;
        }
        if n != f.size {
            return Err(corrupt(&f.path, "truncated"));
        }
        if hex::encode(hasher.finalize()) != f.sha256 {
            return Err(corrupt(&f.path, "SHA-256 mismatch"));
        }
        out.sync_all().map_err(io_err(&dst))?;
        set_mode(&dst, f.mode)?;
    }
    if let Some(extra) = entries.next() {
        let name = extra
            .ok()
            .and_then(|e| e.path().ok().map(|p| p.display().to_string()))
            .unwrap_or_else(|| "?".into());
        return Err(corrupt(
            "archive",
            format!("entry {name:?} after the last file"),
        ));
    }
    // Read the frame to its end: its content checksum is checked there, and nothing may follow.
    let mut decoder = tar.into_inner();
    let mut rest = [0u8; 8192];
    loop {
        let n = decoder.read(&mut rest).map_err(archive_err)?;
        if n == 0 {
            break;
        }
        if rest[..n].iter().any(|&b| b != 0) {
            return Err(corrupt("archive", "data after the end of the tar stream"));
        }
    }
    let mut tail = decoder.finish();
    let mut one = [0u8; 1];
    if tail.read(&mut one).map_err(archive_err)? != 0 {
        return Err(corrupt("archive", "bytes after the zstd frame"));
    }
    Ok(manifest)
}

fn next_entry<'a, R: Read>(
    entries: &mut tar::Entries<'a, R>,
    expect: &str,
) -> Result<tar::Entry<'a, R>, ArchiveError> {
    entries
        .next()
        .ok_or_else(|| corrupt(expect, "missing (the archive ends early)"))?
        .map_err(|e| corrupt(expect, e.to_string()))
}

fn check_entry<R: Read>(e: &tar::Entry<'_, R>, want: &str, name: &str) -> Result<(), ArchiveError> {
    if e.header().entry_type() != tar::EntryType::Regular {
        return Err(corrupt(
            name,
            format!(
                "entry type {:?} (only regular files)",
                e.header().entry_type()
            ),
        ));
    }
    if e.path_bytes().as_ref() != want.as_bytes() {
        return Err(corrupt(
            name,
            format!(
                "the archive has {:?} where the manifest expects {want:?}",
                String::from_utf8_lossy(&e.path_bytes())
            ),
        ));
    }
    Ok(())
}

#[cfg(unix)]
fn set_mode(path: &Path, mode: u32) -> Result<(), ArchiveError> {
    use std::os::unix::fs::PermissionsExt;
    fs::set_permissions(path, fs::Permissions::from_mode(mode)).map_err(io_err(path))
}

#[cfg(not(unix))]
fn set_mode(_: &Path, _: u32) -> Result<(), ArchiveError> {
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn manifest() -> Manifest {
        Manifest {
            format_version: FORMAT_VERSION,
            created: "2026-12-02T00:00:00Z".into(),
            airlock_version: "0.1.0".into(),
            index_generation: 0,
            bundle: None,
            includes_keys: false,
            includes_bundles: false,
            files: Vec::new(),
        }
    }

    fn source(dir: &Path, path: &str, text: &[u8]) -> Source {
        let from = dir.join(path.replace('/', "_"));
        fs::write(&from, text).unwrap();
        let (sha256, size) = hash_file(&from).unwrap();
        Source {
            entry: FileEntry {
                path: path.into(),
                size,
                mode: 0o644,
                sha256,
            },
            from,
        }
    }

    #[test]
    fn round_trip_and_no_flipped_byte_restores_other_content() {
        let dir = tempfile::tempdir().unwrap();
        let sources = vec![
            source(dir.path(), "airlock.db", b"database bytes"),
            source(dir.path(), "index/0/bm25/meta.json", &[7u8; 3000]),
        ];
        let out = dir.path().join("b.tar.zst");
        let mut m = manifest();
        m.files = sources.iter().map(|s| s.entry.clone()).collect();
        write(&out, &m, &sources).unwrap();
        let bytes = fs::read(&out).unwrap();
        let into = dir.path().join("r");
        fs::create_dir(&into).unwrap();
        let m = read(&bytes[..], &into).unwrap();
        assert_eq!(m.files.len(), 2);
        assert_eq!(
            fs::read(into.join("index/0/bm25/meta.json")).unwrap(),
            vec![7u8; 3000]
        );
        let mut accepted = 0;
        for i in 0..bytes.len() {
            let mut bad = bytes.clone();
            bad[i] ^= 0x01;
            let into = dir.path().join(format!("bad{i}"));
            fs::create_dir(&into).unwrap();
            match read(&bad[..], &into) {
                Err(err) => assert!(
                    matches!(err, ArchiveError::Corrupt { .. }),
                    "flip at {i}: {err}"
                ),
                // A flip the decoder does not see in the output (the frame header's window size,
                // an unused bit of an entropy table) restores the very same files.
                Ok(got) => {
                    assert_eq!(got, m, "flip at {i}");
                    assert_eq!(
                        fs::read(into.join("airlock.db")).unwrap(),
                        b"database bytes",
                        "flip at {i}"
                    );
                    assert_eq!(
                        fs::read(into.join("index/0/bm25/meta.json")).unwrap(),
                        vec![7u8; 3000],
                        "flip at {i}"
                    );
                    accepted += 1;
                }
            }
        }
        assert!(
            accepted * 20 < bytes.len(),
            "{accepted} of {} flips accepted",
            bytes.len()
        );
    }

    #[test]
    fn a_manifest_must_be_safe_and_sound() {
        let entry = |p: &str| FileEntry {
            path: p.into(),
            size: 0,
            mode: 0o644,
            sha256: "0".repeat(64),
        };
        for (files, why) in [
            (vec![entry("../x")], "'..'"),
            (vec![entry("/etc/passwd")], "absolute"),
            (vec![entry("a"), entry("a")], "twice"),
            (vec![entry("a"), entry("a/b")], "a file and a directory"),
        ] {
            let mut m = manifest();
            m.files = files;
            let err = parse_manifest(&manifest_bytes(&m)).unwrap_err().to_string();
            assert!(err.contains(why), "{err}");
        }
        let mut m = manifest();
        m.files = vec![FileEntry {
            mode: 0o4755,
            ..entry("a")
        }];
        assert!(parse_manifest(&manifest_bytes(&m)).is_err());
        let mut bytes = manifest_bytes(&manifest());
        let last = bytes.len() - 2;
        bytes[last] ^= 1;
        assert!(
            parse_manifest(&bytes)
                .unwrap_err()
                .to_string()
                .contains("SHA-256 mismatch")
        );
    }
}
