//! The crate's error type and the refusal reasons for hostile or broken bundles.

use std::fmt;
use std::path::PathBuf;

use semver::Version;

/// Everything that can go wrong in this crate.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The bundle (or an installed bundle directory) failed a check: it is not trusted.
    #[error("refused {}: {refusal}", file.display())]
    Refused {
        /// The bundle file or installed directory.
        file: PathBuf,
        /// Which check failed.
        refusal: Refusal,
    },
    /// The build input is not acceptable (symlink in the source directory, bad catalogue, ...).
    #[error("cannot build from {}: {reason}", path.display())]
    BuildInput {
        /// The offending input path.
        path: PathBuf,
        /// Why.
        reason: String,
    },
    /// The install store cannot do what was asked (no previous version, corrupt state file, ...).
    #[error("bundle store {}: {reason}", path.display())]
    Store {
        /// The store directory or state file.
        path: PathBuf,
        /// Why.
        reason: String,
    },
    /// Another process holds the store's lock.
    #[error("bundle store {} is locked by another airlock process", path.display())]
    Locked {
        /// The lock file.
        path: PathBuf,
    },
    /// Loading keys or signing failed.
    #[error(transparent)]
    Signing(#[from] airlock_signing::Error),
    /// Reading or writing a file failed (an environment fault, not a verdict on the bundle).
    #[error("{}: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
}

impl Error {
    pub(crate) fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Error::Io {
            path: path.into(),
            source,
        }
    }

    pub(crate) fn refused(file: impl Into<PathBuf>, refusal: Refusal) -> Self {
        Error::Refused {
            file: file.into(),
            refusal,
        }
    }

    /// The refusal, when this error is one.
    pub fn refusal(&self) -> Option<&Refusal> {
        match self {
            Error::Refused { refusal, .. } => Some(refusal),
            _ => None,
        }
    }
}

/// Why a bundle was refused. Each variant names the check and, where there is one, the entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// The zstd or tar stream cannot be decoded.
    Corrupt {
        /// Decoder message.
        reason: String,
    },
    /// The file ends before the archive does.
    Truncated,
    /// The zstd frame header is not the canonical one the builder writes.
    FrameHeader {
        /// What differs.
        reason: String,
    },
    /// The metadata frame breaks the format's rules (see [`crate::format`]).
    MetadataFrame {
        /// Which rule.
        reason: String,
    },
    /// The payload frame's size or SHA-256 differs from the manifest.
    PayloadFrame {
        /// What differs.
        reason: String,
    },
    /// Bytes after the end of the tar archive or after the zstd frame.
    TrailingData {
        /// Where.
        reason: String,
    },
    /// The first two entries are not `manifest.json` then `manifest.sig.json`.
    UnexpectedEntry {
        /// Entry expected at this position.
        expected: &'static str,
        /// Entry found (or `end of archive`).
        found: String,
    },
    /// `manifest.json` or `manifest.sig.json` is larger than the manifest limit.
    MetadataTooLarge {
        /// Which file.
        name: &'static str,
        /// Its size.
        size: u64,
        /// The limit.
        limit: u64,
    },
    /// The signature envelope is unreadable or the signatures do not meet the keyring.
    Signature {
        /// The signing crate's verdict.
        reason: String,
    },
    /// The (signed) manifest is malformed or inconsistent.
    Manifest {
        /// What is wrong.
        reason: String,
    },
    /// An entry path is absolute, contains `..`, or is not normalized.
    UnsafePath {
        /// The path as found.
        path: String,
        /// Which rule it breaks.
        reason: &'static str,
    },
    /// An entry is not a regular file (symlink, hardlink, device, FIFO, directory, ...).
    EntryType {
        /// The entry's path.
        path: String,
        /// Its tar type.
        kind: String,
    },
    /// The same path appears twice.
    DuplicatePath {
        /// The path.
        path: String,
    },
    /// An archive entry the manifest does not list.
    NotInManifest {
        /// The path.
        path: String,
    },
    /// A manifest file missing from the archive (or from the installed directory).
    Missing {
        /// The path.
        path: String,
    },
    /// A file in an installed directory that the manifest does not list.
    Unexpected {
        /// The path.
        path: String,
    },
    /// An entry's size differs from the manifest.
    SizeMismatch {
        /// The path.
        path: String,
        /// Size in the manifest.
        declared: u64,
        /// Size found.
        actual: u64,
    },
    /// An entry's SHA-256 differs from the manifest.
    DigestMismatch {
        /// The path.
        path: String,
    },
    /// A declared file size is over the per-file limit.
    FileTooLarge {
        /// The path.
        path: String,
        /// Declared size.
        size: u64,
        /// The limit.
        limit: u64,
    },
    /// The declared total is over the limit.
    TotalTooLarge {
        /// Declared total.
        total: u64,
        /// The limit.
        limit: u64,
    },
    /// More files than the entry limit.
    TooManyEntries {
        /// Declared count.
        count: u64,
        /// The limit.
        limit: u64,
    },
    /// The decompressed stream grew past what the manifest and limits allow.
    DecompressedTooLarge {
        /// The byte budget that was exceeded.
        limit: u64,
    },
    /// The version is not above the highest ever installed (rollback floor).
    Downgrade {
        /// Offered version.
        version: Version,
        /// Highest installed version.
        highest: Version,
    },
    /// The bundle requires a newer installed version to upgrade from.
    PreviousTooOld {
        /// The bundle's minimum previous version.
        required: Version,
        /// The installed current version.
        current: Version,
    },
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        use Refusal::*;
        match self {
            Corrupt { reason } => write!(f, "archive is corrupt: {reason}"),
            Truncated => write!(f, "archive is truncated"),
            FrameHeader { reason } => write!(f, "zstd frame header is not canonical: {reason}"),
            MetadataFrame { reason } => write!(f, "metadata frame: {reason}"),
            PayloadFrame { reason } => write!(f, "payload frame: {reason}"),
            TrailingData { reason } => write!(f, "trailing data: {reason}"),
            UnexpectedEntry { expected, found } => {
                write!(f, "expected entry {expected}, found {found:?}")
            }
            MetadataTooLarge { name, size, limit } => {
                write!(f, "{name}: size {size} is over the limit of {limit} bytes")
            }
            Signature { reason } => write!(f, "manifest signature check failed: {reason}"),
            Manifest { reason } => write!(f, "manifest.json: {reason}"),
            UnsafePath { path, reason } => write!(f, "entry {path:?}: unsafe path ({reason})"),
            EntryType { path, kind } => write!(f, "entry {path:?}: {kind} entries are not allowed"),
            DuplicatePath { path } => write!(f, "entry {path:?}: duplicate path"),
            NotInManifest { path } => write!(f, "entry {path:?}: not listed in the manifest"),
            Missing { path } => write!(f, "file {path:?}: listed in the manifest but missing"),
            Unexpected { path } => {
                write!(f, "file {path:?}: present but not listed in the manifest")
            }
            SizeMismatch {
                path,
                declared,
                actual,
            } => {
                write!(
                    f,
                    "file {path:?}: size {actual} differs from the manifest's {declared}"
                )
            }
            DigestMismatch { path } => {
                write!(f, "file {path:?}: SHA-256 differs from the manifest")
            }
            FileTooLarge { path, size, limit } => {
                write!(
                    f,
                    "file {path:?}: declared size {size} is over the per-file limit of {limit} bytes"
                )
            }
            TotalTooLarge { total, limit } => {
                write!(
                    f,
                    "declared total size {total} is over the limit of {limit} bytes"
                )
            }
            TooManyEntries { count, limit } => {
                write!(f, "{count} files is over the limit of {limit}")
            }
            DecompressedTooLarge { limit } => {
                write!(
                    f,
                    "decompressed data exceeds {limit} bytes (decompression bomb)"
                )
            }
            Downgrade { version, highest } => write!(
                f,
                "version {version} is not above the highest installed version {highest} (rollback floor; use `airlock rollback`)"
            ),
            PreviousTooOld { required, current } => {
                write!(
                    f,
                    "requires version {required} or later to be installed first, current is {current}"
                )
            }
        }
    }
}
