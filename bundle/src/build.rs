//! Deterministic bundle build.

use std::fs::{self, File};
use std::io::{self, BufWriter, Read, Write};
use std::path::{Path, PathBuf};

use airlock_signing::{KeyPair, SignatureEnvelope};
use semver::Version;
use sha2::{Digest, Sha256};
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

use crate::manifest::{BinaryEntry, FileEntry, MANIFEST_FORMAT, ModelEntry, PayloadFrame};
use crate::{
    BINARY_PATH, CATALOGUE_NAME, Error, Limits, MANIFEST_NAME, Manifest, Progress, Refusal, Result,
    SIGNATURES_NAME, format, path,
};

/// What to build. Every field is an input of the output bytes: the same options, signing keys
/// and source files give a byte-identical bundle.
#[derive(Debug, Clone)]
pub struct BuildOptions {
    /// Bundle name.
    pub name: String,
    /// Bundle version.
    pub version: Version,
    /// Creation time written to the manifest and used as every entry's mtime.
    pub created: OffsetDateTime,
    /// Minimum installed version this bundle may upgrade from.
    pub min_previous_version: Option<Version>,
    /// The appliance binary to carry as [`BINARY_PATH`] (mode 0755).
    pub binary: Option<PathBuf>,
    /// Generated files to carry beside the source directory's, as (bundle path, file on disk)
    /// (e.g. the binary's SBOM). Listed, digested and signed like every other file; a path
    /// that the source directory also has is refused.
    pub extra_files: Vec<(String, PathBuf)>,
    /// zstd level, 1..=19.
    pub zstd_level: i32,
    /// Limits the result must satisfy (the builder refuses to make what verify would refuse).
    pub limits: Limits,
}

impl BuildOptions {
    /// Options with defaults: created now (UTC, whole seconds), no minimum previous version,
    /// no binary, zstd level 3, default limits.
    pub fn new(name: impl Into<String>, version: Version) -> Self {
        let now = OffsetDateTime::now_utc();
        BuildOptions {
            name: name.into(),
            version,
            created: now.replace_nanosecond(0).unwrap_or(now),
            min_previous_version: None,
            binary: None,
            extra_files: Vec::new(),
            zstd_level: 3,
            limits: Limits::default(),
        }
    }
}

struct Source {
    entry: FileEntry,
    disk: PathBuf,
    mode: u32,
}

fn input(path: &Path, reason: impl Into<String>) -> Error {
    Error::BuildInput {
        path: path.to_owned(),
        reason: reason.into(),
    }
}

/// Collects every regular file under `root` (relative `/` paths); refuses symlinks and
/// anything that is not a regular file or directory.
fn walk(root: &Path, dir: &Path, out: &mut Vec<(String, PathBuf)>) -> Result<()> {
    for item in fs::read_dir(dir).map_err(|e| Error::io(dir, e))? {
        let item = item.map_err(|e| Error::io(dir, e))?;
        let disk = item.path();
        let kind = item.file_type().map_err(|e| Error::io(&disk, e))?;
        if kind.is_symlink() {
            return Err(input(
                &disk,
                "symlinks are not allowed in a bundle source directory",
            ));
        } else if kind.is_dir() {
            walk(root, &disk, out)?;
        } else if kind.is_file() {
            let rel = disk.strip_prefix(root).expect("walk stays under root");
            let rel = rel
                .to_str()
                .ok_or_else(|| input(&disk, "file name is not UTF-8"))?
                .to_owned();
            out.push((rel, disk));
        } else {
            return Err(input(
                &disk,
                "only regular files and directories are allowed",
            ));
        }
    }
    Ok(())
}

fn hash_file(disk: &Path, progress: &dyn Progress) -> Result<(u64, String)> {
    let mut file = File::open(disk).map_err(|e| Error::io(disk, e))?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    let mut size = 0u64;
    loop {
        let n = file.read(&mut buf).map_err(|e| Error::io(disk, e))?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
        size += n as u64;
        progress.advance(n as u64);
    }
    Ok((size, hex::encode(hasher.finalize())))
}

/// Reads a file's bytes for the tar writer, re-hashing them, so a file that changes between
/// the hashing pass and the writing pass is detected.
struct Rehash<'a> {
    file: File,
    hasher: Sha256,
    progress: &'a dyn Progress,
}

impl Read for Rehash<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.file.read(buf)?;
        self.hasher.update(&buf[..n]);
        self.progress.advance(n as u64);
        Ok(n)
    }
}

fn header(size: u64, mode: u32, mtime: u64) -> tar::Header {
    let mut h = tar::Header::new_gnu();
    h.set_entry_type(tar::EntryType::Regular);
    h.set_size(size);
    h.set_mode(mode);
    h.set_uid(0);
    h.set_gid(0);
    h.set_mtime(mtime);
    h
}

/// Builds a signed bundle at `out` from every regular file under `from`.
///
/// Files are packed in sorted path order; `catalogue.json` (if present) is parsed into the
/// manifest's model catalogue and stays in the bundle as a file. `signers` sign the exact
/// manifest bytes. The output is written to a temporary file next to `out` and renamed into
/// place when complete. Returns the manifest.
pub fn build(
    from: &Path,
    options: &BuildOptions,
    signers: &[&KeyPair],
    out: &Path,
    progress: &dyn Progress,
) -> Result<Manifest> {
    if signers.is_empty() {
        return Err(input(from, "at least one signing key is required"));
    }
    if !(1..=19).contains(&options.zstd_level) {
        return Err(input(
            from,
            format!("zstd level {} is not in 1..=19", options.zstd_level),
        ));
    }
    let (sources, binary) = hash_sources(from, options, progress)?;
    let models = read_catalogue(&sources)?;

    // Fail fast (before compressing gigabytes) on what the manifest check would refuse.
    let provisional = Manifest {
        format: MANIFEST_FORMAT.into(),
        name: options.name.clone(),
        version: options.version.clone(),
        created: options
            .created
            .to_offset(time::UtcOffset::UTC)
            .format(&Rfc3339)
            .expect("RFC 3339 formatting"),
        min_previous_version: options.min_previous_version.clone(),
        files: sources.iter().map(|s| s.entry.clone()).collect(),
        models,
        binary,
        payload_frame: PayloadFrame {
            size: 0,
            sha256: "0".repeat(64),
        },
    };
    provisional.validate(&options.limits).map_err(|r| match r {
        Refusal::Manifest { reason } => input(from, reason),
        other => input(from, other.to_string()),
    })?;

    let mtime = u64::try_from(options.created.unix_timestamp()).unwrap_or(0);
    let dir = match out.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_owned(),
        _ => PathBuf::from("."),
    };
    let name = out
        .file_name()
        .ok_or_else(|| input(out, "output path has no file name"))?
        .to_string_lossy()
        .into_owned();
    let target = Target {
        payload_tmp: dir.join(format!(".{name}.payload-{}", std::process::id())),
        tmp: dir.join(format!(".{name}.tmp-{}", std::process::id())),
        out,
        dir,
    };
    let written = (|| -> Result<Manifest> {
        // 1. The payload frame, hashed as it is written.
        let payload_frame = write_payload(
            &target.payload_tmp,
            &sources,
            options.zstd_level,
            mtime,
            progress,
        )?;

        // 2. The manifest pins the payload frame, then is signed as stored.
        let manifest = Manifest {
            payload_frame,
            ..provisional
        };
        let manifest_bytes = manifest.to_json();
        if manifest_bytes.len() as u64 > options.limits.max_manifest_size {
            return Err(input(
                from,
                "manifest is over the manifest size limit (too many files?)",
            ));
        }
        let envelope = SignatureEnvelope::new(
            signers
                .iter()
                .map(|k| k.sign(airlock_signing::Purpose::Manifest, &manifest_bytes))
                .collect(),
        );
        let signature_bytes = envelope.to_json();

        // 3. The metadata frame, then the payload frame, into a temp file renamed into place.
        write_bundle(&target, &manifest_bytes, &signature_bytes, mtime)?;
        Ok(manifest)
    })();
    let _ = fs::remove_file(&target.payload_tmp);
    if written.is_err() {
        let _ = fs::remove_file(&target.tmp);
    }
    written
}

/// Where a bundle is written: the payload frame's temp file, the bundle's temp file, the
/// bundle and its directory (synced after the rename).
struct Target<'a> {
    payload_tmp: PathBuf,
    tmp: PathBuf,
    out: &'a Path,
    dir: PathBuf,
}

/// The source directory's files, the binary and the extra files, checked and hashed (progress
/// reported over their total size), sorted by bundle path; with the binary's manifest entry.
fn hash_sources(
    from: &Path,
    options: &BuildOptions,
    progress: &dyn Progress,
) -> Result<(Vec<Source>, Option<BinaryEntry>)> {
    let mut found = Vec::new();
    walk(from, from, &mut found)?;
    found.sort();

    let total: u64 = found
        .iter()
        .map(|(_, disk)| fs::metadata(disk).map(|m| m.len()).unwrap_or(0))
        .chain(
            options
                .binary
                .iter()
                .chain(options.extra_files.iter().map(|(_, d)| d))
                .map(|b| fs::metadata(b).map(|m| m.len()).unwrap_or(0)),
        )
        .sum();
    progress.begin("hashing", total);
    let mut sources = Vec::with_capacity(found.len() + 1);
    for (rel, disk) in found {
        path::check(&rel).map_err(|r| input(&disk, format!("path {rel:?} is not allowed: {r}")))?;
        if rel == MANIFEST_NAME || rel == SIGNATURES_NAME {
            return Err(input(
                &disk,
                format!("{rel} is reserved for the bundle's own metadata"),
            ));
        }
        if options.binary.is_some() && rel == BINARY_PATH {
            return Err(input(
                &disk,
                format!("{BINARY_PATH} would clash with --binary"),
            ));
        }
        let (size, sha256) = hash_file(&disk, progress)?;
        sources.push(Source {
            entry: FileEntry {
                path: rel,
                size,
                sha256,
            },
            disk,
            mode: 0o644,
        });
    }
    let binary = hash_binary(options, progress, &mut sources)?;
    hash_extra_files(options, progress, &mut sources)?;
    sources.sort_by(|a, b| a.entry.path.cmp(&b.entry.path));
    progress.finish();
    Ok((sources, binary))
}

/// The binary, if any, hashed into `sources` (mode 0755); its manifest entry.
fn hash_binary(
    options: &BuildOptions,
    progress: &dyn Progress,
    sources: &mut Vec<Source>,
) -> Result<Option<BinaryEntry>> {
    let Some(bin) = &options.binary else {
        return Ok(None);
    };
    let (size, sha256) = hash_file(bin, progress)?;
    let binary = BinaryEntry {
        path: BINARY_PATH.into(),
        sha256: sha256.clone(),
    };
    sources.push(Source {
        entry: FileEntry {
            path: BINARY_PATH.into(),
            size,
            sha256,
        },
        disk: bin.clone(),
        mode: 0o755,
    });
    Ok(Some(binary))
}

/// The extra files hashed into `sources`; a path the bundle already has is refused.
fn hash_extra_files(
    options: &BuildOptions,
    progress: &dyn Progress,
    sources: &mut Vec<Source>,
) -> Result<()> {
    for (rel, disk) in &options.extra_files {
        path::check(rel).map_err(|r| input(disk, format!("path {rel:?} is not allowed: {r}")))?;
        if rel == MANIFEST_NAME
            || rel == SIGNATURES_NAME
            || sources.iter().any(|s| &s.entry.path == rel)
        {
            return Err(input(
                disk,
                format!("{rel} is generated by the build and must not be in the source directory"),
            ));
        }
        let (size, sha256) = hash_file(disk, progress)?;
        sources.push(Source {
            entry: FileEntry {
                path: rel.clone(),
                size,
                sha256,
            },
            disk: disk.clone(),
            mode: 0o644,
        });
    }
    Ok(())
}

/// The model catalogue the sources carry, if any.
fn read_catalogue(sources: &[Source]) -> Result<Vec<ModelEntry>> {
    Ok(
        match sources.iter().find(|s| s.entry.path == CATALOGUE_NAME) {
            Some(s) => {
                let bytes = fs::read(&s.disk).map_err(|e| Error::io(&s.disk, e))?;
                serde_json::from_slice::<Vec<ModelEntry>>(&bytes)
                    .map_err(|e| input(&s.disk, format!("not a model catalogue: {e}")))?
            }
            None => Vec::new(),
        },
    )
}

/// The metadata frame (manifest and signatures) then the payload frame, written to the temp
/// file, synced and renamed into place.
fn write_bundle(
    target: &Target<'_>,
    manifest_bytes: &[u8],
    signature_bytes: &[u8],
    mtime: u64,
) -> Result<()> {
    let Target {
        payload_tmp,
        tmp,
        out,
        dir,
    } = target;
    let mut meta = Vec::with_capacity(manifest_bytes.len() + signature_bytes.len() + 2048);
    for (name, bytes) in [
        (MANIFEST_NAME, manifest_bytes),
        (SIGNATURES_NAME, signature_bytes),
    ] {
        let mut h = header(bytes.len() as u64, 0o644, mtime);
        h.set_path(name).map_err(|e| Error::io(name, e))?;
        h.set_cksum();
        meta.extend_from_slice(h.as_bytes());
        meta.extend_from_slice(bytes);
        meta.resize(meta.len().div_ceil(512) * 512, 0);
    }
    let mut file = File::create(tmp).map_err(|e| Error::io(tmp, e))?;
    file.write_all(&format::metadata_frame(&meta))
        .map_err(|e| Error::io(tmp, e))?;
    let mut payload = File::open(payload_tmp).map_err(|e| Error::io(payload_tmp, e))?;
    io::copy(&mut payload, &mut file).map_err(|e| Error::io(tmp, e))?;
    file.sync_all().map_err(|e| Error::io(tmp, e))?;
    fs::rename(tmp, out).map_err(|e| Error::io(out, e))?;
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| Error::io(dir, e))?;
    Ok(())
}

/// Counts and hashes what is written through it.
struct HashingWriter {
    file: File,
    hasher: Sha256,
    size: u64,
}

impl Write for HashingWriter {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.file.write(buf)?;
        self.hasher.update(&buf[..n]);
        self.size += n as u64;
        Ok(n)
    }
    fn flush(&mut self) -> io::Result<()> {
        self.file.flush()
    }
}

/// Writes the payload entries and the end-of-archive blocks as one zstd frame to `path`.
fn write_payload(
    path: &Path,
    sources: &[Source],
    level: i32,
    mtime: u64,
    progress: &dyn Progress,
) -> Result<PayloadFrame> {
    let io_err = |e| Error::io(path, e);
    let file = File::create(path).map_err(io_err)?;
    let sink = HashingWriter {
        file,
        hasher: Sha256::new(),
        size: 0,
    };
    let mut encoder =
        zstd::stream::write::Encoder::new(BufWriter::with_capacity(1 << 20, sink), level)
            .map_err(io_err)?;
    encoder.include_checksum(true).map_err(io_err)?;
    encoder.window_log(format::WINDOW_LOG).map_err(io_err)?;
    let mut tar = tar::Builder::new(encoder);
    progress.begin("compressing", sources.iter().map(|s| s.entry.size).sum());
    for s in sources {
        let file = File::open(&s.disk).map_err(|e| Error::io(&s.disk, e))?;
        let mut reader = Rehash {
            file,
            hasher: Sha256::new(),
            progress,
        };
        let mut h = header(s.entry.size, s.mode, mtime);
        tar.append_data(&mut h, &s.entry.path, (&mut reader).take(s.entry.size))
            .map_err(|e| Error::io(&s.disk, e))?;
        let mut extra = [0u8; 1];
        let grew = reader
            .file
            .read(&mut extra)
            .map_err(|e| Error::io(&s.disk, e))?
            != 0;
        if grew || hex::encode(reader.hasher.finalize()) != s.entry.sha256 {
            return Err(input(
                &s.disk,
                "file changed while the bundle was being built",
            ));
        }
    }
    progress.finish();
    let encoder = tar.into_inner().map_err(io_err)?;
    let writer = encoder.finish().map_err(io_err)?;
    let sink = writer
        .into_inner()
        .map_err(|e| Error::io(path, e.into_error()))?;
    Ok(PayloadFrame {
        size: sink.size,
        sha256: hex::encode(sink.hasher.finalize()),
    })
}
