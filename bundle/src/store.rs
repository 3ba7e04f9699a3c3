//! The install store under `<data>/bundles/`: verified extraction, atomic switch, rollback.
//!
//! Layout: `bundles/<version>/` (extracted bundles: payload plus `manifest.json` and
//! `manifest.sig.json`), `bundles/state.json` (current, previous, highest installed, history),
//! `bundles/.lock` (one writer at a time), `bundles/.staging-<version>/` (an install in
//! progress; never referenced by `state.json`, removed by the next install).
//!
//! Crash safety: a bundle directory is complete and fsynced before it is renamed into place,
//! and `state.json` is replaced by rename only after that. Killing the process at any point
//! leaves `state.json` naming the old `current`, whose directory was never touched.

use std::fs::{self, File};
use std::io::{self, Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use airlock_signing::{KeyId, Keyring, Purpose, SignatureEnvelope};
use semver::Version;
use sha2::{Digest, Sha256};

use crate::verify::{Sink, Verified, verify_with};
use crate::{
    BINARY_PATH, Error, Limits, MANIFEST_NAME, Manifest, NoProgress, Progress, Refusal, Result,
    SIGNATURES_NAME, State,
};

const STATE_NAME: &str = "state.json";
const STAGING_PREFIX: &str = ".staging-";

/// The install store of one data directory.
#[derive(Debug, Clone)]
pub struct Store {
    root: PathBuf,
    limits: Limits,
}

/// An installed bundle.
#[derive(Debug, Clone)]
pub struct Installed {
    /// Its version.
    pub version: Version,
    /// Its directory (`<data>/bundles/<version>`); payload paths are relative to it.
    pub dir: PathBuf,
    /// Its manifest (name, version, files, model catalogue, binary).
    pub manifest: Manifest,
}

/// One bundle directory, as listed by [`Store::list`].
#[derive(Debug, Clone)]
pub struct ListedBundle {
    /// Its version.
    pub version: Version,
    /// Its directory.
    pub dir: PathBuf,
    /// Its manifest, if readable.
    pub manifest: Option<Manifest>,
    /// Whether `state.json` names it `current`.
    pub is_current: bool,
    /// Whether `state.json` names it `previous`.
    pub is_previous: bool,
}

/// Points of an install, reported to [`InstallOptions::on_stage`] (used by crash tests).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InstallStage {
    /// The first payload file was written to the staging directory.
    Extracting,
    /// Everything is verified, written and fsynced in staging; not yet renamed.
    Extracted,
    /// Staging was renamed to `bundles/<version>`; `state.json` not yet touched.
    Renamed,
    /// The new `state.json` is written to a temp file; not yet renamed over the old one.
    StateWritten,
    /// `state.json` names the new version; old directories not yet cleaned up.
    Switched,
}

impl InstallStage {
    /// The stage's name as used by failpoints (`after-first-file`, `after-extract`, ...).
    pub fn name(self) -> &'static str {
        match self {
            InstallStage::Extracting => "after-first-file",
            InstallStage::Extracted => "after-extract",
            InstallStage::Renamed => "after-rename",
            InstallStage::StateWritten => "after-state-temp",
            InstallStage::Switched => "after-switch",
        }
    }

    /// Every stage, in order.
    pub const ALL: [InstallStage; 5] = [
        InstallStage::Extracting,
        InstallStage::Extracted,
        InstallStage::Renamed,
        InstallStage::StateWritten,
        InstallStage::Switched,
    ];
}

/// Per-call install options.
pub struct InstallOptions<'a> {
    /// Receives byte counts.
    pub progress: &'a dyn Progress,
    /// Called at each [`InstallStage`].
    pub on_stage: &'a (dyn Fn(InstallStage) + Sync),
}

impl Default for InstallOptions<'static> {
    fn default() -> Self {
        InstallOptions {
            progress: &NoProgress,
            on_stage: &|_| {},
        }
    }
}

/// What an install did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum InstallOutcome {
    /// The bundle was installed and is now current.
    Installed {
        /// The new current version.
        version: Version,
        /// The version that was current before (now `previous`).
        previous: Option<Version>,
        /// Keys whose signatures verified.
        signers: Vec<KeyId>,
    },
    /// The very same bundle is already current; nothing changed.
    AlreadyCurrent {
        /// The current version.
        version: Version,
    },
}

fn io_at(path: &Path) -> impl Fn(io::Error) -> Error + '_ {
    move |e| Error::io(path, e)
}

fn sync_dir(dir: &Path) -> Result<()> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| Error::io(dir, e))
}

/// fsyncs every directory under `dir` (files were synced when written).
fn sync_tree(dir: &Path) -> Result<()> {
    for item in fs::read_dir(dir).map_err(io_at(dir))? {
        let item = item.map_err(io_at(dir))?;
        if item.file_type().map_err(io_at(dir))?.is_dir() {
            sync_tree(&item.path())?;
        }
    }
    sync_dir(dir)
}

struct StagingSink<'a> {
    root: &'a Path,
    state: &'a State,
    on_stage: &'a (dyn Fn(InstallStage) + Sync),
    staging: Option<PathBuf>,
    already_current: bool,
    files_written: usize,
    buf: Vec<u8>,
}

impl Sink for StagingSink<'_> {
    fn metadata(&mut self, verified: &Verified) -> Result<()> {
        let manifest = &verified.manifest;
        let version = &manifest.version;
        if self.state.current.as_ref() == Some(version) {
            let installed = self.root.join(version.to_string()).join(MANIFEST_NAME);
            if fs::read(&installed).ok().as_deref() == Some(verified.manifest_bytes.as_slice()) {
                // The same signed manifest (so the same file digests) is current. Read the rest
                // anyway: "nothing to do" is only said of a file that verifies in full, so a
                // corrupted copy of the current bundle is refused like any other.
                self.already_current = true;
                return Ok(());
            }
        }
        if let Some(highest) = &self.state.highest_installed
            && version.cmp_precedence(highest) != std::cmp::Ordering::Greater
        {
            return Err(Error::refused(
                "",
                Refusal::Downgrade {
                    version: version.clone(),
                    highest: highest.clone(),
                },
            ));
        }
        if let (Some(required), Some(current)) =
            (&manifest.min_previous_version, &self.state.current)
            && current.cmp_precedence(required) == std::cmp::Ordering::Less
        {
            return Err(Error::refused(
                "",
                Refusal::PreviousTooOld {
                    required: required.clone(),
                    current: current.clone(),
                },
            ));
        }
        let staging = self.root.join(format!("{STAGING_PREFIX}{version}"));
        fs::create_dir(&staging).map_err(io_at(&staging))?;
        self.staging = Some(staging.clone());
        write_new(
            &staging.join(MANIFEST_NAME),
            &verified.manifest_bytes,
            0o644,
        )?;
        write_new(
            &staging.join(SIGNATURES_NAME),
            &verified.signatures_bytes,
            0o644,
        )?;
        Ok(())
    }

    fn file(&mut self, entry: &crate::FileEntry, content: &mut dyn Read) -> Result<()> {
        if self.already_current {
            // Nothing is written; the verifier hashes what it drains from `content`.
            return Ok(());
        }
        let staging = self
            .staging
            .as_ref()
            .expect("metadata accepted before files");
        // The path passed `path::check` and the manifest's file/directory clash check, so it
        // stays inside staging and never lands on an existing file.
        let target = staging.join(&entry.path);
        if let Some(parent) = target.parent() {
            fs::create_dir_all(parent).map_err(io_at(parent))?;
        }
        let mode = if entry.path == BINARY_PATH {
            0o755
        } else {
            0o644
        };
        let mut file = fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(mode)
            .open(&target)
            .map_err(io_at(&target))?;
        loop {
            let n = match content.read(&mut self.buf) {
                Ok(0) => break,
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                // A read failure is the archive's; the verifier classifies it.
                Err(e) => return Err(Error::io(&entry.path, e)),
            };
            file.write_all(&self.buf[..n]).map_err(io_at(&target))?;
        }
        file.sync_all().map_err(io_at(&target))?;
        self.files_written += 1;
        if self.files_written == 1 {
            (self.on_stage)(InstallStage::Extracting);
        }
        Ok(())
    }
}

fn write_new(path: &Path, bytes: &[u8], mode: u32) -> Result<()> {
    let mut f = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(path)
        .map_err(io_at(path))?;
    f.write_all(bytes)
        .and_then(|()| f.sync_all())
        .map_err(io_at(path))
}

impl Store {
    /// Opens (creating if needed) the store at `<data_dir>/bundles` with default limits.
    pub fn open(data_dir: &Path) -> Result<Store> {
        let root = data_dir.join("bundles");
        fs::create_dir_all(&root).map_err(io_at(&root))?;
        Ok(Store {
            root,
            limits: Limits::default(),
        })
    }

    /// Uses `limits` for installs and checks.
    pub fn with_limits(mut self, limits: Limits) -> Store {
        self.limits = limits;
        self
    }

    /// The store directory (`<data>/bundles`).
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The current state (empty when nothing was ever installed).
    pub fn state(&self) -> Result<State> {
        let path = self.root.join(STATE_NAME);
        match fs::read(&path) {
            Ok(bytes) => State::from_json(&bytes).map_err(|reason| Error::Store { path, reason }),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(State::default()),
            Err(e) => Err(Error::io(path, e)),
        }
    }

    fn lock(&self) -> Result<File> {
        let path = self.root.join(".lock");
        let file = fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .map_err(io_at(&path))?;
        match file.try_lock() {
            Ok(()) => Ok(file),
            Err(fs::TryLockError::WouldBlock) => Err(Error::Locked { path }),
            Err(fs::TryLockError::Error(e)) => Err(Error::io(path, e)),
        }
    }

    fn write_state(&self, state: &State, on_stage: &(dyn Fn(InstallStage) + Sync)) -> Result<()> {
        let path = self.root.join(STATE_NAME);
        let tmp = self.root.join(format!("{STATE_NAME}.tmp"));
        let _ = fs::remove_file(&tmp);
        write_new(&tmp, &state.to_json(), 0o644)?;
        on_stage(InstallStage::StateWritten);
        fs::rename(&tmp, &path).map_err(io_at(&path))?;
        sync_dir(&self.root)
    }

    /// Removes what no state names: staging dirs, temp state, bundle dirs other than current
    /// and previous. Call with the lock held.
    fn clean(&self, state: &State) -> Result<()> {
        for item in fs::read_dir(&self.root).map_err(io_at(&self.root))? {
            let item = item.map_err(io_at(&self.root))?;
            let name = item.file_name().to_string_lossy().into_owned();
            let path = item.path();
            if name.starts_with(STAGING_PREFIX) {
                fs::remove_dir_all(&path).map_err(io_at(&path))?;
            } else if name == format!("{STATE_NAME}.tmp") {
                fs::remove_file(&path).map_err(io_at(&path))?;
            } else if let Ok(v) = Version::parse(&name)
                && state.current.as_ref() != Some(&v)
                && state.previous.as_ref() != Some(&v)
            {
                fs::remove_dir_all(&path).map_err(io_at(&path))?;
            }
        }
        Ok(())
    }

    /// Verifies `bundle` against `keyring` while extracting it to a staging directory, then
    /// makes it `current` (the old current becomes `previous`).
    ///
    /// Refused (with nothing changed): any verification failure, a version not above
    /// `highest_installed` (unless it is the identical bundle that is already current, which
    /// is a no-op once the whole file verified), or a current version below the bundle's
    /// `min_previous_version`.
    pub fn install(
        &self,
        bundle: &Path,
        keyring: &Keyring,
        options: &InstallOptions<'_>,
    ) -> Result<InstallOutcome> {
        let _lock = self.lock()?;
        let mut state = self.state()?;
        self.clean(&state)?;
        let mut sink = StagingSink {
            root: &self.root,
            state: &state,
            on_stage: options.on_stage,
            staging: None,
            already_current: false,
            files_written: 0,
            buf: vec![0; 1 << 20],
        };
        let verified = match verify_with(bundle, keyring, &self.limits, options.progress, &mut sink)
        {
            Ok(v) => v,
            Err(e) => {
                if let Some(staging) = &sink.staging {
                    let _ = fs::remove_dir_all(staging);
                }
                return Err(e);
            }
        };
        let version = verified.manifest.version.clone();
        if sink.already_current {
            // Every entry, the payload frame and its digest verified, and the signed manifest is
            // byte for byte the installed one.
            return Ok(InstallOutcome::AlreadyCurrent { version });
        }
        let staging = sink
            .staging
            .take()
            .expect("a continued install has a staging directory");
        sync_tree(&staging)?;
        (options.on_stage)(InstallStage::Extracted);

        let target = self.root.join(version.to_string());
        if target.exists() {
            // Above the floor, so neither current nor previous: a leftover of a crashed install.
            fs::remove_dir_all(&target).map_err(io_at(&target))?;
        }
        fs::rename(&staging, &target).map_err(io_at(&target))?;
        sync_dir(&self.root)?;
        (options.on_stage)(InstallStage::Renamed);

        let previous = state.current.take();
        state.previous = previous.clone();
        state.current = Some(version.clone());
        state.highest_installed = Some(version.clone());
        state.record("install", &version, previous.clone());
        self.write_state(&state, options.on_stage)?;
        (options.on_stage)(InstallStage::Switched);
        self.clean(&state)?;
        tracing::info!(version = %version, "bundle installed");
        Ok(InstallOutcome::Installed {
            version,
            previous,
            signers: verified.signers,
        })
    }

    /// Switches `current` to `previous` (and `previous` to the old current), after checking the
    /// previous bundle's manifest signature against `keyring` and that its files are present
    /// with their declared sizes. The rollback floor is unchanged. Returns (from, to).
    pub fn rollback(&self, keyring: &Keyring) -> Result<(Option<Version>, Version)> {
        let _lock = self.lock()?;
        let mut state = self.state()?;
        let Some(target) = state.previous.clone() else {
            return Err(Error::Store {
                path: self.root.clone(),
                reason: "no previous version to roll back to".into(),
            });
        };
        self.check(&target, keyring, false, &NoProgress)?;
        let from = state.current.take();
        state.previous = from.clone();
        state.current = Some(target.clone());
        state.record("rollback", &target, from.clone());
        self.write_state(&state, &|_| {})?;
        tracing::info!(version = %target, "rolled back");
        Ok((from, target))
    }

    /// The current bundle as installed (its manifest was verified at install time; use
    /// [`Store::verify_installed`] to re-check signature and digests), or `None`.
    pub fn current(&self) -> Result<Option<Installed>> {
        let state = self.state()?;
        let Some(version) = state.current else {
            return Ok(None);
        };
        let dir = self.root.join(version.to_string());
        let path = dir.join(MANIFEST_NAME);
        let bytes = fs::read(&path).map_err(io_at(&path))?;
        let manifest = Manifest::from_json(&bytes).map_err(|r| Error::refused(&dir, r))?;
        Ok(Some(Installed {
            version,
            dir,
            manifest,
        }))
    }

    /// Re-checks `current`: manifest signature against `keyring`, manifest validity, and every
    /// file's presence, type, size and SHA-256; no unlisted files. Run at daemon start.
    pub fn verify_installed(
        &self,
        keyring: &Keyring,
        progress: &dyn Progress,
    ) -> Result<Installed> {
        let state = self.state()?;
        let Some(version) = state.current else {
            return Err(Error::Store {
                path: self.root.clone(),
                reason: "no bundle is installed".into(),
            });
        };
        self.check(&version, keyring, true, progress)
    }

    /// Every bundle directory with its role in the state, sorted by version.
    pub fn list(&self) -> Result<(State, Vec<ListedBundle>)> {
        let state = self.state()?;
        let mut out = Vec::new();
        for item in fs::read_dir(&self.root).map_err(io_at(&self.root))? {
            let item = item.map_err(io_at(&self.root))?;
            let Ok(version) = Version::parse(&item.file_name().to_string_lossy()) else {
                continue;
            };
            let dir = item.path();
            let manifest = fs::read(dir.join(MANIFEST_NAME))
                .ok()
                .and_then(|b| Manifest::from_json(&b).ok());
            out.push(ListedBundle {
                is_current: state.current.as_ref() == Some(&version),
                is_previous: state.previous.as_ref() == Some(&version),
                version,
                dir,
                manifest,
            });
        }
        out.sort_by(|a, b| a.version.cmp(&b.version));
        Ok((state, out))
    }

    fn check(
        &self,
        version: &Version,
        keyring: &Keyring,
        deep: bool,
        progress: &dyn Progress,
    ) -> Result<Installed> {
        let dir = self.root.join(version.to_string());
        let refused = |r: Refusal| Error::refused(&dir, r);
        let read_meta = |name: &'static str| -> Result<Vec<u8>> {
            let path = dir.join(name);
            let meta = fs::symlink_metadata(&path).map_err(|e| match e.kind() {
                io::ErrorKind::NotFound => refused(Refusal::Missing { path: name.into() }),
                _ => Error::io(&path, e),
            })?;
            if meta.len() > self.limits.max_manifest_size {
                return Err(refused(Refusal::MetadataTooLarge {
                    name,
                    size: meta.len(),
                    limit: self.limits.max_manifest_size,
                }));
            }
            fs::read(&path).map_err(io_at(&path))
        };
        let manifest_bytes = read_meta(MANIFEST_NAME)?;
        let signatures_bytes = read_meta(SIGNATURES_NAME)?;
        let signature = |e: airlock_signing::Error| {
            refused(Refusal::Signature {
                reason: e.to_string(),
            })
        };
        let envelope = SignatureEnvelope::from_json(&signatures_bytes).map_err(signature)?;
        keyring
            .verify(Purpose::Manifest, &manifest_bytes, &envelope)
            .map_err(signature)?;
        let manifest = Manifest::from_json(&manifest_bytes).map_err(refused)?;
        manifest.validate(&self.limits).map_err(refused)?;
        if &manifest.version != version {
            return Err(refused(Refusal::Manifest {
                reason: format!(
                    "version {} does not match the directory {version}",
                    manifest.version
                ),
            }));
        }

        let mut found = Vec::new();
        list_files(&dir, &dir, &mut found)?;
        found.sort();
        for rel in &found {
            if rel != MANIFEST_NAME && rel != SIGNATURES_NAME && manifest.file(rel).is_none() {
                return Err(refused(Refusal::Unexpected { path: rel.clone() }));
            }
        }
        progress.begin("checking", if deep { manifest.total_size() } else { 0 });
        let mut buf = vec![0u8; 1 << 20];
        for f in &manifest.files {
            let path = dir.join(&f.path);
            let meta = match fs::symlink_metadata(&path) {
                Ok(m) => m,
                Err(e) if e.kind() == io::ErrorKind::NotFound => {
                    return Err(refused(Refusal::Missing {
                        path: f.path.clone(),
                    }));
                }
                Err(e) => return Err(Error::io(&path, e)),
            };
            if !meta.file_type().is_file() {
                return Err(refused(Refusal::EntryType {
                    path: f.path.clone(),
                    kind: "non-regular".into(),
                }));
            }
            if meta.len() != f.size {
                return Err(refused(Refusal::SizeMismatch {
                    path: f.path.clone(),
                    declared: f.size,
                    actual: meta.len(),
                }));
            }
            if deep {
                let mut file = File::open(&path).map_err(io_at(&path))?;
                let mut hasher = Sha256::new();
                loop {
                    let n = file.read(&mut buf).map_err(io_at(&path))?;
                    if n == 0 {
                        break;
                    }
                    hasher.update(&buf[..n]);
                    progress.advance(n as u64);
                }
                if hex::encode(hasher.finalize()) != f.sha256 {
                    return Err(refused(Refusal::DigestMismatch {
                        path: f.path.clone(),
                    }));
                }
            }
        }
        progress.finish();
        Ok(Installed {
            version: version.clone(),
            dir,
            manifest,
        })
    }
}

/// Every non-directory under `dir`, as relative `/` paths; symlinks and special files are
/// reported as found (and then refused as unexpected or non-regular by the caller).
fn list_files(root: &Path, dir: &Path, out: &mut Vec<String>) -> Result<()> {
    for item in fs::read_dir(dir).map_err(io_at(dir))? {
        let item = item.map_err(io_at(dir))?;
        let path = item.path();
        if item.file_type().map_err(io_at(&path))?.is_dir() {
            list_files(root, &path, out)?;
        } else {
            let rel = path
                .strip_prefix(root)
                .expect("under root")
                .to_string_lossy()
                .into_owned();
            out.push(rel);
        }
    }
    Ok(())
}
