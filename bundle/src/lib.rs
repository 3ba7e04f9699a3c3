//! `airlock-bundle`: the signed bundle format and the install store.
//!
//! A bundle is one `tar.zst` file: `manifest.json` (format-versioned: name, version, created,
//! minimum previous version, every file's size and SHA-256, the model catalogue, the binary's
//! digest), then `manifest.sig.json` (an `airlock-signing` envelope over the exact manifest
//! bytes), then the payload files in sorted order.
//!
//! This crate owns:
//! - [`build`]: deterministic bundle creation (sorted entries, fixed owners/modes/mtimes,
//!   configurable zstd level; the same inputs give the same bytes);
//! - [`verify_file`]: streaming verification (signature first, then each entry hashed while it is
//!   read) with hard [`Limits`], so hostile archives are refused early with a [`Refusal`] that
//!   names the entry and the check;
//! - [`Store`]: the install store under `<data>/bundles/` (staging, fsync, rename, atomic
//!   `state.json` with `current`, `previous`, `highest_installed`), rollback and
//!   re-verification of what is installed.
//!
//! It knows nothing of models: the catalogue is data the daemon reads from [`Manifest::models`].
//! It never reads environment variables or chooses files on its own; the binary passes paths,
//! limits, progress reporting and (for crash tests) an install stage hook.
#![warn(missing_docs)]

mod build;
mod error;
pub mod format;
#[doc(hidden)]
pub mod fuzzing;
mod limits;
mod manifest;
mod path;
mod progress;
mod state;
mod store;
mod verify;

pub use build::{BuildOptions, build};
pub use error::{Error, Refusal};
pub use limits::Limits;
pub use manifest::{
    BinaryEntry, FileEntry, MANIFEST_FORMAT, Manifest, ModelEntry, PayloadFrame, Role,
};
/// The entry path rules of bundles (also those of `airlock backup` archives).
pub use path::check as check_path;
pub use progress::{NoProgress, Progress};
pub use state::{HistoryEntry, State};
pub use store::{InstallOptions, InstallOutcome, InstallStage, Installed, ListedBundle, Store};
pub use verify::{Unverified, Verified, inspect_file, verify_file};

/// Bundle versions are semantic versions (re-exported so callers need no `semver` dependency).
pub use semver::Version;

/// Name of the first entry of every bundle.
pub const MANIFEST_NAME: &str = "manifest.json";
/// Name of the second entry of every bundle.
pub const SIGNATURES_NAME: &str = "manifest.sig.json";
/// Where `--binary` is stored inside a bundle.
pub const BINARY_PATH: &str = "bin/airlock";
/// The optional model catalogue file in a build directory.
pub const CATALOGUE_NAME: &str = "catalogue.json";

/// Result type of this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;
