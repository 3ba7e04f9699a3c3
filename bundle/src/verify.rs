//! Streaming verification: signature first, then every entry hashed while it is read.
//!
//! Two threads, like `zstd -dc FILE | sha256sum`: one reads the file and decompresses it into
//! 1 MiB buffers, the other parses tar and hashes entries. Everything the tar parser reads goes
//! through a byte budget (derived from the limits before the manifest is known, from the
//! manifest afterwards), so a decompression bomb is stopped after at most the budget.

use std::cell::Cell;
use std::fs::File;
use std::io::{self, Read};
use std::path::Path;
use std::sync::Mutex;
use std::sync::mpsc::{Receiver, SyncSender, sync_channel};

use airlock_signing::{KeyId, Keyring, Purpose, SignatureEnvelope};
use sha2::{Digest, Sha256};

use crate::format::{self, FRAME_DESCRIPTOR, RAW_BLOCK, WINDOW_DESCRIPTOR, ZSTD_MAGIC};
use crate::manifest::{FileEntry, PayloadFrame};
use crate::{
    Error, Limits, MANIFEST_NAME, Manifest, Progress, Refusal, Result, SIGNATURES_NAME, path,
};

const CHUNK: usize = 1 << 20;
/// Zero bytes allowed after the tar end-of-archive block (a full 10 KiB tar record).
const MAX_TAR_PADDING: u64 = 10240;

/// A bundle whose signature and contents checked out.
#[derive(Debug, Clone)]
pub struct Verified {
    /// The parsed, validated manifest.
    pub manifest: Manifest,
    /// The exact signed bytes of `manifest.json`.
    pub manifest_bytes: Vec<u8>,
    /// The exact bytes of `manifest.sig.json`.
    pub signatures_bytes: Vec<u8>,
    /// Keys whose signatures verified (at least the keyring's threshold), sorted.
    pub signers: Vec<KeyId>,
}

/// Receives what verification accepts; the whole file is always read and checked (a sink
/// cannot cut verification short). `file` gets a reader of exactly the entry's bytes; the
/// verifier checks size and digest after it returns, so a sink must treat data as untrusted
/// until the whole verification succeeds.
pub(crate) trait Sink {
    fn metadata(&mut self, verified: &Verified) -> Result<()>;
    fn file(&mut self, entry: &FileEntry, content: &mut dyn Read) -> Result<()>;
}

struct Discard(Vec<u8>);

impl Sink for Discard {
    fn metadata(&mut self, _: &Verified) -> Result<()> {
        Ok(())
    }
    fn file(&mut self, entry: &FileEntry, content: &mut dyn Read) -> Result<()> {
        loop {
            match content.read(&mut self.0) {
                Ok(0) => return Ok(()),
                Ok(_) => {}
                Err(e) => return Err(Error::io(&entry.path, e)),
            }
        }
    }
}

/// Verifies the bundle at `path` against `keyring` and `limits` without extracting anything.
pub fn verify_file(
    path: &Path,
    keyring: &Keyring,
    limits: &Limits,
    progress: &dyn Progress,
) -> Result<Verified> {
    let verified = verify_with(
        path,
        keyring,
        limits,
        progress,
        &mut Discard(vec![0; CHUNK]),
    )?;
    Ok(verified)
}

/// A bundle's metadata, read **without** checking signatures or payload (for display only).
#[derive(Debug, Clone)]
pub struct Unverified {
    /// The manifest as parsed (not validated, not trusted).
    pub manifest: Manifest,
    /// The signature envelope as parsed (not checked).
    pub signatures: SignatureEnvelope,
}

/// Reads the metadata frame of the bundle at `path` for display. Nothing it returns is
/// trusted; use [`verify_file`] for a verdict.
pub fn inspect_file(path: &Path, limits: &Limits) -> Result<Unverified> {
    let refused = |r: Refusal| Error::refused(path, r);
    let mut file = File::open(path).map_err(|e| Error::io(path, e))?;
    let content = read_metadata_frame(&mut file, metadata_budget(limits)).map_err(refused)?;
    let mut archive = tar::Archive::new(&content[..]);
    let mut entries = archive.entries().map_err(|e| {
        refused(Refusal::Corrupt {
            reason: e.to_string(),
        })
    })?;
    let mut read = |expected: &'static str| -> Result<Vec<u8>> {
        let mut entry = match entries.next() {
            Some(Ok(e)) => e,
            Some(Err(e)) => {
                return Err(refused(Refusal::Corrupt {
                    reason: e.to_string(),
                }));
            }
            None => {
                return Err(refused(Refusal::UnexpectedEntry {
                    expected,
                    found: "end of archive".into(),
                }));
            }
        };
        let found = String::from_utf8_lossy(&entry.path_bytes()).into_owned();
        if found != expected {
            return Err(refused(Refusal::UnexpectedEntry { expected, found }));
        }
        let mut bytes = Vec::new();
        entry.read_to_end(&mut bytes).map_err(|e| {
            refused(Refusal::Corrupt {
                reason: e.to_string(),
            })
        })?;
        Ok(bytes)
    };
    let manifest_bytes = read(MANIFEST_NAME)?;
    let signature_bytes = read(SIGNATURES_NAME)?;
    let manifest = Manifest::from_json(&manifest_bytes).map_err(refused)?;
    let signatures = SignatureEnvelope::from_json(&signature_bytes).map_err(|e| {
        refused(Refusal::Signature {
            reason: e.to_string(),
        })
    })?;
    Ok(Unverified {
        manifest,
        signatures,
    })
}

/// Verifies `path`, handing accepted data to `sink`.
pub(crate) fn verify_with(
    path: &Path,
    keyring: &Keyring,
    limits: &Limits,
    progress: &dyn Progress,
    sink: &mut dyn Sink,
) -> Result<Verified> {
    let file = File::open(path).map_err(|e| Error::io(path, e))?;
    let len = file.metadata().map_err(|e| Error::io(path, e))?.len();
    progress.begin("verifying", len);
    let report = Mutex::new(DecodeReport::default());
    let (tx, rx) = sync_channel::<Option<Vec<u8>>>(4);
    let (pool_tx, pool_rx) = sync_channel::<Vec<u8>>(8);
    let result = std::thread::scope(|scope| {
        let decoder = scope.spawn(|| {
            decode(
                file,
                metadata_budget(limits),
                tx,
                pool_rx,
                progress,
                &report,
            )
        });
        let reader = ChannelReader {
            rx,
            pool: pool_tx,
            current: Vec::new(),
            pos: 0,
            done: false,
        };
        let budget = Budget {
            limit: Cell::new(metadata_budget(limits)),
            used: Cell::new(0),
            tripped: Cell::new(false),
        };
        let ctx = Ctx {
            report: &report,
            budget: &budget,
        };
        let result = ctx.run(
            BudgetReader {
                inner: reader,
                budget: &budget,
            },
            keyring,
            limits,
            sink,
        );
        // Dropping the tar reader (inside `run`) closed the channel, so the decoder stops.
        let _ = decoder.join();
        result
    });
    progress.finish();
    result.map_err(|e| match e {
        Failure::Refused(refusal) => Error::refused(path, refusal),
        Failure::Other(e) => e,
    })
}

enum Failure {
    Refused(Refusal),
    Other(Error),
}

impl From<Refusal> for Failure {
    fn from(r: Refusal) -> Self {
        Failure::Refused(r)
    }
}

impl From<Error> for Failure {
    fn from(e: Error) -> Self {
        match e {
            Error::Refused { refusal, .. } => Failure::Refused(refusal),
            other => Failure::Other(other),
        }
    }
}

/// The byte budget before the manifest is known: two metadata files plus headers.
fn metadata_budget(limits: &Limits) -> u64 {
    2 * limits.max_manifest_size + 64 * 1024
}

/// The byte budget for the payload the manifest declares: data rounded up to 512-byte blocks,
/// a header (plus a GNU long-name header and its data) per file, and the end-of-archive record.
fn payload_budget(manifest: &Manifest) -> u64 {
    manifest
        .files
        .iter()
        .map(|f| f.size.div_ceil(512) * 512 + 3 * 512 + (f.path.len() as u64).div_ceil(512) * 512)
        .fold(MAX_TAR_PADDING + 1024, u64::saturating_add)
}

// ---- decoder thread -------------------------------------------------------------------------

fn check_frame_header(h: &[u8]) -> std::result::Result<(), Refusal> {
    let bad = |reason: &str| Refusal::FrameHeader {
        reason: reason.into(),
    };
    if h.len() < 4 || h[..4] != ZSTD_MAGIC {
        return Err(Refusal::Corrupt {
            reason: "not a zstd file (bad magic number)".into(),
        });
    }
    let Some(&fhd) = h.get(4) else {
        return Err(Refusal::Truncated);
    };
    if fhd & 0b0001_0000 != 0 {
        return Err(bad("unused bit set"));
    }
    if fhd & 0b0000_1000 != 0 {
        return Err(bad("reserved bit set"));
    }
    if fhd & 0b0000_0011 != 0 {
        return Err(bad("dictionary id present"));
    }
    if fhd & 0b0000_0100 == 0 {
        return Err(bad("content checksum missing"));
    }
    let single_segment = fhd & 0b0010_0000 != 0;
    if !single_segment {
        let Some(&wd) = h.get(5) else {
            return Err(Refusal::Truncated);
        };
        if wd != WINDOW_DESCRIPTOR {
            return Err(bad("window size is not the builder's"));
        }
    }
    Ok(())
}

struct CountingReader<'a, R> {
    inner: R,
    progress: &'a dyn Progress,
}

impl<R: Read> Read for CountingReader<'_, R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.progress.advance(n as u64);
        Ok(n)
    }
}

/// What the decoder thread learned, for checks on the tar side.
#[derive(Default)]
struct DecodeReport {
    failure: Option<Refusal>,
    metadata_len: u64,
    payload: Option<(u64, String)>,
}

/// Reads the raw-block metadata frame; returns its content (checksum verified).
fn read_metadata_frame(file: &mut impl Read, limit: u64) -> std::result::Result<Vec<u8>, Refusal> {
    let eof = |e: io::Error| {
        if e.kind() == io::ErrorKind::UnexpectedEof {
            Refusal::Truncated
        } else {
            Refusal::Corrupt {
                reason: e.to_string(),
            }
        }
    };
    let bad = |reason: &str| Refusal::MetadataFrame {
        reason: reason.into(),
    };
    let mut header = [0u8; 6];
    let mut got = 0;
    while got < 6 {
        match file.read(&mut header[got..]) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(eof(e)),
        }
    }
    check_frame_header(&header[..got])?;
    if got < 6 || header[4] != FRAME_DESCRIPTOR {
        return Err(bad("frame header is not the builder's"));
    }
    let mut content = Vec::new();
    loop {
        let mut bh = [0u8; 3];
        file.read_exact(&mut bh).map_err(eof)?;
        let (last, kind, size) = format::parse_block_header(bh);
        if kind != 0 {
            return Err(bad("blocks must be stored raw"));
        }
        if size > RAW_BLOCK || (!last && size != RAW_BLOCK) {
            return Err(bad("block sizes are not the builder's"));
        }
        if content.len() as u64 + size as u64 > limit {
            return Err(Refusal::DecompressedTooLarge { limit });
        }
        let start = content.len();
        content.resize(start + size, 0);
        file.read_exact(&mut content[start..]).map_err(eof)?;
        if last {
            break;
        }
    }
    let mut sum = [0u8; 4];
    file.read_exact(&mut sum).map_err(eof)?;
    if u32::from_le_bytes(sum) != format::xxh64(&content, 0) as u32 {
        return Err(bad("content checksum mismatch"));
    }
    Ok(content)
}

/// Hashes and counts the compressed payload frame as the decoder reads it.
struct PayloadHasher<R> {
    inner: R,
    hasher: Sha256,
    size: u64,
}

impl<R: Read> Read for PayloadHasher<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.hasher.update(&buf[..n]);
        self.size += n as u64;
        Ok(n)
    }
}

fn decode(
    file: File,
    metadata_limit: u64,
    tx: SyncSender<Option<Vec<u8>>>,
    pool: Receiver<Vec<u8>>,
    progress: &dyn Progress,
    report: &Mutex<DecodeReport>,
) {
    let fail = |refusal: Refusal| {
        report.lock().expect("decode report").failure = Some(refusal);
        let _ = tx.send(None);
    };
    let io_refusal = |e: io::Error| {
        if e.kind() == io::ErrorKind::UnexpectedEof {
            Refusal::Truncated
        } else {
            Refusal::Corrupt {
                reason: format!("zstd: {e}"),
            }
        }
    };
    let mut file = CountingReader {
        inner: file,
        progress,
    };
    let metadata = match read_metadata_frame(&mut file, metadata_limit) {
        Ok(m) => m,
        Err(r) => return fail(r),
    };
    report.lock().expect("decode report").metadata_len = metadata.len() as u64;
    if tx.send(Some(metadata)).is_err() {
        return;
    }

    let mut header = Vec::with_capacity(6);
    if let Err(e) = (&mut file).take(6).read_to_end(&mut header) {
        return fail(io_refusal(e));
    }
    if header.is_empty() {
        return fail(Refusal::Truncated);
    }
    if let Err(r) = check_frame_header(&header) {
        return fail(r);
    }
    let source = PayloadHasher {
        inner: io::Cursor::new(header).chain(file),
        hasher: Sha256::new(),
        size: 0,
    };
    let mut decoder = match zstd::stream::read::Decoder::new(source) {
        Ok(d) => d.single_frame(),
        Err(e) => return fail(io_refusal(e)),
    };
    loop {
        let mut buf = pool.try_recv().unwrap_or_else(|_| vec![0; CHUNK]);
        buf.resize(CHUNK, 0);
        let mut filled = 0;
        while filled < CHUNK {
            match decoder.read(&mut buf[filled..]) {
                Ok(0) => break,
                Ok(n) => filled += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return fail(io_refusal(e)),
            }
        }
        buf.truncate(filled);
        if filled == 0 {
            break;
        }
        if tx.send(Some(buf)).is_err() {
            return; // The tar side stopped (refusal or Stop); nothing more to do.
        }
    }
    // The frame (and its content checksum) is complete; nothing may follow it.
    let mut rest = decoder.into_inner();
    let mut one = [0u8; 1];
    match rest.read(&mut one) {
        Ok(0) => {}
        Ok(_) => {
            return fail(Refusal::TrailingData {
                reason: "bytes after the zstd frame".into(),
            });
        }
        Err(e) => return fail(io_refusal(e)),
    }
    let hashed = rest.into_inner();
    report.lock().expect("decode report").payload =
        Some((hashed.size, hex::encode(hashed.hasher.finalize())));
}

// ---- tar side -------------------------------------------------------------------------------

struct ChannelReader {
    rx: Receiver<Option<Vec<u8>>>,
    pool: SyncSender<Vec<u8>>,
    current: Vec<u8>,
    pos: usize,
    done: bool,
}

impl Read for ChannelReader {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        while self.pos == self.current.len() {
            if self.done {
                return Ok(0);
            }
            match self.rx.recv() {
                Ok(Some(next)) => {
                    let old = std::mem::replace(&mut self.current, next);
                    let _ = self.pool.try_send(old);
                    self.pos = 0;
                }
                Ok(None) => return Err(io::Error::other("bundle decoder failed")),
                Err(_) => {
                    self.done = true;
                    return Ok(0);
                }
            }
        }
        let n = buf.len().min(self.current.len() - self.pos);
        buf[..n].copy_from_slice(&self.current[self.pos..self.pos + n]);
        self.pos += n;
        Ok(n)
    }
}

struct Budget {
    limit: Cell<u64>,
    used: Cell<u64>,
    tripped: Cell<bool>,
}

struct BudgetReader<'a> {
    inner: ChannelReader,
    budget: &'a Budget,
}

impl Read for BudgetReader<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let left = self
            .budget
            .limit
            .get()
            .saturating_sub(self.budget.used.get());
        if left == 0 && !buf.is_empty() {
            // Only an error if there is actually more data.
            let mut probe = [0u8; 1];
            if self.inner.read(&mut probe)? == 0 {
                return Ok(0);
            }
            self.budget.tripped.set(true);
            return Err(io::Error::other("decompressed byte budget exceeded"));
        }
        let cap = buf.len().min(usize::try_from(left).unwrap_or(usize::MAX));
        let n = self.inner.read(&mut buf[..cap])?;
        self.budget.used.set(self.budget.used.get() + n as u64);
        Ok(n)
    }
}

struct HashingReader<'a, R> {
    inner: R,
    hasher: Sha256,
    count: u64,
    failed: &'a Cell<bool>,
}

impl<R: Read> Read for HashingReader<'_, R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self.inner.read(buf) {
            Ok(n) => {
                self.hasher.update(&buf[..n]);
                self.count += n as u64;
                Ok(n)
            }
            Err(e) => {
                self.failed.set(true);
                Err(e)
            }
        }
    }
}

struct Ctx<'a> {
    report: &'a Mutex<DecodeReport>,
    budget: &'a Budget,
}

fn entry_kind(t: tar::EntryType) -> Option<&'static str> {
    use tar::EntryType::*;
    Some(match t {
        Regular => return None,
        Symlink => "symlink",
        Link => "hardlink",
        Char => "character device",
        Block => "block device",
        Fifo => "FIFO",
        Directory => "directory",
        Continuous => "contiguous file",
        GNUSparse => "sparse file",
        XGlobalHeader => "PAX global header",
        _ => "unknown-type",
    })
}

impl Ctx<'_> {
    /// Turns a read failure into the refusal that explains it.
    fn classify(&self, e: &io::Error) -> Refusal {
        if let Some(r) = self.report.lock().expect("decode report").failure.take() {
            return r;
        }
        if self.budget.tripped.get() {
            return Refusal::DecompressedTooLarge {
                limit: self.budget.limit.get(),
            };
        }
        if e.kind() == io::ErrorKind::UnexpectedEof {
            return Refusal::Truncated;
        }
        Refusal::Corrupt {
            reason: format!("tar: {e}"),
        }
    }

    fn check_entry<R: Read>(
        &self,
        entry: &mut tar::Entry<'_, R>,
    ) -> std::result::Result<String, Refusal> {
        let raw = entry.path_bytes().into_owned();
        let path = String::from_utf8(raw).map_err(|e| Refusal::UnsafePath {
            path: String::from_utf8_lossy(e.as_bytes()).into_owned(),
            reason: "not UTF-8",
        })?;
        path::check(&path).map_err(|reason| Refusal::UnsafePath {
            path: path.clone(),
            reason,
        })?;
        if let Some(kind) = entry_kind(entry.header().entry_type()) {
            return Err(Refusal::EntryType {
                path,
                kind: kind.into(),
            });
        }
        if entry
            .pax_extensions()
            .map_err(|e| self.classify(&e))?
            .is_some()
        {
            return Err(Refusal::EntryType {
                path,
                kind: "PAX-extended".into(),
            });
        }
        Ok(path)
    }

    fn read_metadata<R: Read>(
        &self,
        next: Option<io::Result<tar::Entry<'_, R>>>,
        expected: &'static str,
        limit: u64,
    ) -> std::result::Result<Vec<u8>, Refusal> {
        let mut entry = match next {
            None => {
                return Err(Refusal::UnexpectedEntry {
                    expected,
                    found: "end of archive".into(),
                });
            }
            Some(Err(e)) => return Err(self.classify(&e)),
            Some(Ok(entry)) => entry,
        };
        let found = String::from_utf8_lossy(&entry.path_bytes()).into_owned();
        if found != expected {
            return Err(Refusal::UnexpectedEntry { expected, found });
        }
        self.check_entry(&mut entry)?;
        let size = entry.size();
        if size > limit {
            return Err(Refusal::MetadataTooLarge {
                name: expected,
                size,
                limit,
            });
        }
        let mut bytes = Vec::with_capacity(size as usize);
        entry
            .read_to_end(&mut bytes)
            .map_err(|e| self.classify(&e))?;
        if bytes.len() as u64 != size {
            return Err(Refusal::Truncated);
        }
        Ok(bytes)
    }

    fn run(
        &self,
        reader: BudgetReader<'_>,
        keyring: &Keyring,
        limits: &Limits,
        sink: &mut dyn Sink,
    ) -> std::result::Result<Verified, Failure> {
        let mut archive = tar::Archive::new(reader);
        let mut entries = archive.entries().map_err(|e| self.classify(&e))?;

        let manifest_bytes =
            self.read_metadata(entries.next(), MANIFEST_NAME, limits.max_manifest_size)?;
        let signatures_bytes =
            self.read_metadata(entries.next(), SIGNATURES_NAME, limits.max_manifest_size)?;
        let metadata_len = self.report.lock().expect("decode report").metadata_len;
        if self.budget.used.get().div_ceil(512) * 512 != metadata_len {
            return Err(Refusal::MetadataFrame {
                reason: "holds more than manifest.json and manifest.sig.json".into(),
            }
            .into());
        }
        let signature = |e: airlock_signing::Error| Refusal::Signature {
            reason: e.to_string(),
        };
        let envelope = SignatureEnvelope::from_json(&signatures_bytes).map_err(signature)?;
        let signers = keyring
            .verify(Purpose::Manifest, &manifest_bytes, &envelope)
            .map_err(signature)?;
        // Only signed bytes are parsed.
        let manifest = Manifest::from_json(&manifest_bytes)?;
        manifest.validate(limits)?;
        self.budget.limit.set(
            self.budget
                .used
                .get()
                .saturating_add(payload_budget(&manifest)),
        );

        let verified = Verified {
            manifest,
            manifest_bytes,
            signatures_bytes,
            signers,
        };
        sink.metadata(&verified)?;

        let files = &verified.manifest.files;
        let mut seen = vec![false; files.len()];
        for entry in entries.by_ref() {
            let mut entry = entry.map_err(|e| self.classify(&e))?;
            self.payload_entry(&mut entry, files, &mut seen, sink)?;
        }
        if let Some(i) = seen.iter().position(|s| !s) {
            return Err(Refusal::Missing {
                path: files[i].path.clone(),
            }
            .into());
        }
        self.check_padding(archive.into_inner())?;
        self.check_payload_frame(&verified.manifest.payload_frame)?;
        Ok(verified)
    }

    /// One payload entry: listed in the manifest once, of its declared size, streamed to the
    /// sink (and drained after it) with its digest checked.
    fn payload_entry<R: Read>(
        &self,
        entry: &mut tar::Entry<'_, R>,
        files: &[FileEntry],
        seen: &mut [bool],
        sink: &mut dyn Sink,
    ) -> std::result::Result<(), Failure> {
        let path = self.check_entry(entry)?;
        let Ok(index) = files.binary_search_by(|f| f.path.as_str().cmp(&path)) else {
            return Err(if path == MANIFEST_NAME || path == SIGNATURES_NAME {
                Refusal::DuplicatePath { path }
            } else {
                Refusal::NotInManifest { path }
            }
            .into());
        };
        if std::mem::replace(&mut seen[index], true) {
            return Err(Refusal::DuplicatePath { path }.into());
        }
        let declared = &files[index];
        if entry.size() != declared.size {
            return Err(Refusal::SizeMismatch {
                path,
                declared: declared.size,
                actual: entry.size(),
            }
            .into());
        }
        let failed = Cell::new(false);
        let mut hashing = HashingReader {
            inner: entry,
            hasher: Sha256::new(),
            count: 0,
            failed: &failed,
        };
        let stored = sink.file(declared, &mut hashing);
        // Drain whatever the sink left, so size and digest cover the whole entry.
        let drained = io::copy(&mut hashing, &mut io::sink());
        if failed.get() {
            let e = drained
                .err()
                .unwrap_or_else(|| io::Error::other("entry read failed"));
            return Err(self.classify(&e).into());
        }
        stored?;
        if hashing.count != declared.size {
            return Err(Refusal::Truncated.into());
        }
        if hex::encode(hashing.hasher.finalize()) != declared.sha256 {
            return Err(Refusal::DigestMismatch { path }.into());
        }
        Ok(())
    }

    /// After the end-of-archive block only zero padding may follow, then the stream ends
    /// (reading to the end also makes the decoder check the frame's content checksum).
    fn check_padding(&self, mut rest: impl Read) -> std::result::Result<(), Failure> {
        let mut buf = vec![0u8; 64 * 1024];
        let mut padding = 0u64;
        loop {
            let n = rest.read(&mut buf).map_err(|e| self.classify(&e))?;
            if n == 0 {
                break;
            }
            padding += n as u64;
            if buf[..n].iter().any(|&b| b != 0) {
                return Err(Refusal::TrailingData {
                    reason: "data after the end of the tar archive".into(),
                }
                .into());
            }
            if padding > MAX_TAR_PADDING {
                return Err(Refusal::TrailingData {
                    reason: "padding after the tar archive is too long".into(),
                }
                .into());
            }
        }
        Ok(())
    }

    /// The decoder's report: no failure, and the payload frame read whole with the size and
    /// digest the manifest pins.
    fn check_payload_frame(&self, expected: &PayloadFrame) -> std::result::Result<(), Failure> {
        let mut report = self.report.lock().expect("decode report");
        if let Some(r) = report.failure.take() {
            return Err(r.into());
        }
        match report.payload.take() {
            Some((size, _)) if size != expected.size => Err(Refusal::PayloadFrame {
                reason: format!("size {size} differs from the manifest's {}", expected.size),
            }
            .into()),
            Some((_, sha256)) if sha256 != expected.sha256 => Err(Refusal::PayloadFrame {
                reason: "SHA-256 differs from the manifest".into(),
            }
            .into()),
            Some(_) => Ok(()),
            None => Err(Refusal::Truncated.into()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frame_header_rules() {
        let ok = [0x28, 0xB5, 0x2F, 0xFD, 0x04, 0x68];
        assert_eq!(check_frame_header(&ok), Ok(()));
        let mut h = ok;
        h[4] |= 0x10;
        assert!(matches!(
            check_frame_header(&h),
            Err(Refusal::FrameHeader { .. })
        ));
        let mut h = ok;
        h[5] = 0x69;
        assert!(matches!(
            check_frame_header(&h),
            Err(Refusal::FrameHeader { .. })
        ));
        let mut h = ok;
        h[4] = 0x00;
        assert!(matches!(
            check_frame_header(&h),
            Err(Refusal::FrameHeader { .. })
        ));
        assert!(matches!(
            check_frame_header(&ok[..3]),
            Err(Refusal::Corrupt { .. })
        ));
        assert!(matches!(
            check_frame_header(&ok[..5]),
            Err(Refusal::Truncated)
        ));
    }
}
