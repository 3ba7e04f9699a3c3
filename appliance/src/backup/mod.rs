//! `airlock backup` and `airlock restore`: a consistent online copy of a data directory in one
//! checksummed archive ([`archive`]), and its verified restore.
//!
//! Consistency (docs/operations/backup-restore.md): the document store's indexes are
//! derived from SQLite and written by the engine after each commit, all under the index root's
//! cross-process write lock ([`airlock_retrieval::IndexWriteLock`]). The backup takes that lock,
//! copies every SQLite database with SQLite's online backup API (a page-exact snapshot, whatever
//! other connections do), reads the index generation the copied database names, copies that
//! generation's directory and the original files (`originals/`), and only then releases the
//! lock: the database, the indexes and the originals in the archive are at the same point. Engine writes wait meanwhile; searches and chat go on. Files
//! tantivy may still rewrite in the background (segment merges) are copied until two listings
//! of the generation, before and after the copy, agree.
//!
//! Private keys (`*.key`: the appliance key, a demo signing key) stay out of the archive unless
//! asked for: a backup travels to other media and machines, and the appliance key is the box's
//! identity for signed exports and receipts, whose private half never leaves the data directory.

pub mod archive;

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, bail};

use airlock_retrieval::IndexWriteLock;
use archive::{FileEntry, Manifest, Source};

/// What to put in a backup beyond the database, the indexes and the keyring.
#[derive(Clone, Copy, Debug, Default)]
pub struct BackupOptions {
    /// Include private keys (`*.key`, the appliance key among them).
    pub include_keys: bool,
    /// Leave out the installed bundles (`bundles/`): a restore then needs `airlock install` of
    /// the same bundle file before it serves.
    pub no_bundles: bool,
}

/// What a backup wrote.
#[derive(Debug)]
pub struct BackupReport {
    /// The manifest written.
    pub manifest: Manifest,
    /// Archive size in bytes.
    pub archive_bytes: u64,
    /// Private keys left out (paths relative to the data directory).
    pub keys_left_out: Vec<String>,
    /// How long the write lock was held.
    pub locked: Duration,
}

/// Files never copied: SQLite's side files (the online backup is complete without them), lock
/// files, and the service's scratch directory.
fn skipped(rel: &str) -> bool {
    let name = rel.rsplit('/').next().unwrap_or(rel);
    rel == "tmp"
        || rel.starts_with("tmp/")
        || name.ends_with("-wal")
        || name.ends_with("-shm")
        || name.ends_with("-journal")
        || name.ends_with(".lock")
        || name.ends_with(".tmp")
}

fn is_private_key(rel: &str) -> bool {
    rel.ends_with(".key")
}

fn is_sqlite(path: &Path) -> bool {
    use std::io::Read;
    let mut magic = [0u8; 16];
    fs::File::open(path)
        .and_then(|mut f| f.read_exact(&mut magic))
        .is_ok_and(|()| &magic == b"SQLite format 3\0")
}

fn rel_of(root: &Path, p: &Path) -> anyhow::Result<String> {
    let rel = p.strip_prefix(root)?;
    let parts: Vec<&str> = rel
        .components()
        .map(|c| {
            c.as_os_str()
                .to_str()
                .with_context(|| format!("{}: the path is not UTF-8", p.display()))
        })
        .collect::<anyhow::Result<_>>()?;
    Ok(parts.join("/"))
}

/// Every regular file beneath `dir` (relative to `root`), sorted; symbolic links and special
/// files are refused (a data directory holds none).
fn walk(root: &Path, dir: &Path, out: &mut Vec<(String, PathBuf)>) -> anyhow::Result<()> {
    let mut items: Vec<_> = fs::read_dir(dir)
        .with_context(|| format!("listing {}", dir.display()))?
        .collect::<Result<_, _>>()
        .with_context(|| format!("listing {}", dir.display()))?;
    items.sort_by_key(fs::DirEntry::file_name);
    for item in items {
        let p = item.path();
        let rel = rel_of(root, &p)?;
        if skipped(&rel) {
            continue;
        }
        let t = item.file_type()?;
        if t.is_dir() {
            walk(root, &p, out)?;
        } else if t.is_file() {
            out.push((rel, p));
        } else {
            bail!(
                "{} is neither a regular file nor a directory: a data directory holds none; \
                 move it away before the backup",
                p.display()
            );
        }
    }
    Ok(())
}

fn mode_of(path: &Path, rel: &str) -> u32 {
    if is_private_key(rel) {
        return 0o600;
    }
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        if let Ok(m) = fs::metadata(path)
            && m.permissions().mode() & 0o111 != 0
        {
            return 0o755;
        }
    }
    #[cfg(not(unix))]
    let _ = path;
    0o644
}

fn source(rel: String, from: PathBuf) -> anyhow::Result<Source> {
    let (sha256, size) = archive::hash_file(&from)?;
    Ok(Source {
        entry: FileEntry {
            mode: mode_of(&from, &rel),
            path: rel,
            size,
            sha256,
        },
        from,
    })
}

/// Copies the database `src` to `dst` with SQLite's online backup API (one step: a consistent
/// snapshot even while the daemon writes).
fn sqlite_backup(src: &Path, dst: &Path) -> anyhow::Result<()> {
    let from = rusqlite::Connection::open_with_flags(
        src,
        rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY | rusqlite::OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )
    .with_context(|| format!("opening {}", src.display()))?;
    from.busy_timeout(Duration::from_secs(60))?;
    let mut to = rusqlite::Connection::open(dst)?;
    {
        use rusqlite::backup::StepResult;
        let b = rusqlite::backup::Backup::new(&from, &mut to)?;
        // -1: every page in one step, under one read transaction of the source.
        let deadline = std::time::Instant::now() + Duration::from_secs(300);
        loop {
            match b
                .step(-1)
                .with_context(|| format!("backing up {}", src.display()))?
            {
                StepResult::Done => break,
                StepResult::More | StepResult::Busy | StepResult::Locked
                    if std::time::Instant::now() < deadline =>
                {
                    std::thread::sleep(Duration::from_millis(50));
                }
                other => bail!("backing up {}: {other:?} for 300 s", src.display()),
            }
        }
    }
    // A self-contained file: no WAL beside it.
    to.pragma_update(None, "journal_mode", "DELETE")?;
    to.close().map_err(|(_, e)| e)?;
    Ok(())
}

type Listing = BTreeMap<String, (u64, Option<std::time::SystemTime>, u64)>;

fn listing(root: &Path, dir: &Path) -> anyhow::Result<Listing> {
    let mut files = Vec::new();
    walk(root, dir, &mut files)?;
    let mut out = BTreeMap::new();
    for (rel, p) in files {
        let m = fs::metadata(&p)?;
        #[cfg(unix)]
        let ino = std::os::unix::fs::MetadataExt::ino(&m);
        #[cfg(not(unix))]
        let ino = 0;
        out.insert(rel, (m.len(), m.modified().ok(), ino));
    }
    Ok(out)
}

/// Copies `dir` (beneath `root`) into `staging` at the same relative paths until a listing
/// before and after the copy agree (tantivy may merge segments in the background).
fn copy_stable(root: &Path, dir: &Path, staging: &Path) -> anyhow::Result<()> {
    for _attempt in 0..50 {
        let before = listing(root, dir)?;
        let mut vanished = false;
        for rel in before.keys() {
            let dst = staging.join(rel);
            fs::create_dir_all(dst.parent().expect("a file path has a parent"))?;
            match fs::copy(root.join(rel), &dst) {
                Ok(_) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => vanished = true,
                Err(e) => return Err(e).with_context(|| format!("copying {rel}")),
            }
        }
        if !vanished && listing(root, dir)? == before {
            return Ok(());
        }
        let rel = rel_of(root, dir)?;
        let _ = fs::remove_dir_all(staging.join(rel));
        std::thread::sleep(Duration::from_millis(100));
    }
    bail!(
        "{} kept changing during 50 copies; try again",
        dir.display()
    )
}

/// Removes a directory when dropped (staging of a backup or restore that did not finish).
struct RemoveOnDrop(Option<PathBuf>);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        if let Some(p) = self.0.take() {
            let _ = fs::remove_dir_all(p);
        }
    }
}

/// A sibling path of `p` with `suffix` appended to its file name.
fn sibling(p: &Path, suffix: &str) -> anyhow::Result<PathBuf> {
    let name = p
        .file_name()
        .with_context(|| format!("{} has no file name", p.display()))?;
    let mut n = std::ffi::OsString::from(".");
    n.push(name);
    n.push(suffix);
    Ok(p.with_file_name(n))
}

/// Takes a backup of the data directory `data` into the new file `out`.
pub fn backup(data: &Path, out: &Path, opts: BackupOptions) -> anyhow::Result<BackupReport> {
    let data = check_backup_paths(data, out)?;
    let partial = sibling(out, &format!(".partial-{}", std::process::id()))?;
    let staging = sibling(out, &format!(".staging-{}", std::process::id()))?;
    fs::create_dir(&staging)
        .with_context(|| format!("creating the staging directory {}", staging.display()))?;
    let _clean = RemoveOnDrop(Some(staging.clone()));
    let remove_partial = RemoveFileOnDrop(partial.clone());

    let mut files = Vec::new();
    walk(&data, &data, &mut files)?;
    let Consistent {
        staged,
        generation,
        locked,
    } = copy_consistent(&data, &files, &staging)?;

    let (sources, keys_left_out) = backup_sources(files, staged, &opts)?;
    let bundle = airlock_bundle::Store::open(&data)
        .ok()
        .and_then(|s| s.state().ok())
        .and_then(|s| s.current)
        .map(|v| v.to_string());
    let manifest = Manifest {
        format_version: archive::FORMAT_VERSION,
        created: time::OffsetDateTime::now_utc()
            .format(&time::format_description::well_known::Rfc3339)
            .unwrap_or_default(),
        airlock_version: env!("CARGO_PKG_VERSION").to_string(),
        index_generation: generation,
        bundle,
        includes_keys: opts.include_keys,
        includes_bundles: !opts.no_bundles,
        files: sources.iter().map(|s| s.entry.clone()).collect(),
    };
    let archive_bytes = archive::write(&partial, &manifest, &sources)?;
    fs::rename(&partial, out)
        .with_context(|| format!("renaming {} to {}", partial.display(), out.display()))?;
    drop(remove_partial);
    Ok(BackupReport {
        manifest,
        archive_bytes,
        keys_left_out,
        locked,
    })
}

/// `data` is a data directory and `out` a new file outside it; `data` resolved.
fn check_backup_paths(data: &Path, out: &Path) -> anyhow::Result<PathBuf> {
    let db = crate::startup::db_path(data);
    if !db.is_file() {
        bail!(
            "{} is not an Airlock data directory (no {})",
            data.display(),
            db.display()
        );
    }
    if out.exists() {
        bail!("{} exists: refusing to overwrite a backup", out.display());
    }
    let data = data
        .canonicalize()
        .with_context(|| format!("resolving {}", data.display()))?;
    let out_dir = match out.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    if out_dir.canonicalize().is_ok_and(|d| d.starts_with(&data)) {
        bail!(
            "{} is inside the data directory {}: write the backup elsewhere",
            out.display(),
            data.display()
        );
    }
    Ok(data)
}

/// What [`copy_consistent`] copied under the engine's write lock.
struct Consistent {
    /// (path in the data directory, copy in the staging directory).
    staged: Vec<(String, PathBuf)>,
    /// The index generation the copied database names.
    generation: u64,
    /// How long the lock was held.
    locked: Duration,
}

/// The consistent part, under the engine's write lock: the SQLite databases outside the index
/// (online backups), the index generation the copied database names, and the original files.
fn copy_consistent(
    data: &Path,
    files: &[(String, PathBuf)],
    staging: &Path,
) -> anyhow::Result<Consistent> {
    let index_root = crate::startup::index_root(data);
    fs::create_dir_all(&index_root)?;
    let lock = match IndexWriteLock::try_acquire(&index_root)? {
        Some(l) => l,
        None => {
            eprintln!("==> waiting for the running write (ingest, delete, reindex) to finish");
            IndexWriteLock::acquire(&index_root)?
        }
    };
    let locked_at = std::time::Instant::now();
    let mut staged: Vec<(String, PathBuf)> = Vec::new();
    for (rel, p) in files {
        if !rel.starts_with("index/") && is_sqlite(p) {
            let dst = staging.join(rel);
            fs::create_dir_all(dst.parent().expect("a file path has a parent"))?;
            sqlite_backup(p, &dst)?;
            staged.push((rel.clone(), dst));
        }
    }
    let generation = airlock_retrieval::stored_index_generation(&staging.join("airlock.db"))
        .context("reading the index generation of the copied database")?;
    let gen_dir = index_root.join(generation.to_string());
    if gen_dir.is_dir() {
        copy_stable(data, &gen_dir, staging)?;
        let mut copied = Vec::new();
        walk(staging, &staging.join(rel_of(data, &gen_dir)?), &mut copied)?;
        staged.extend(copied);
    }
    // The original files the copied database names (content-addressed, written before and
    // removed after the rows that name them, under the same lock).
    let originals = airlock_retrieval::originals_dir(&index_root);
    if originals.is_dir() {
        copy_stable(data, &originals, staging)?;
        let copied_dir = staging.join(rel_of(data, &originals)?);
        if copied_dir.is_dir() {
            // (absent when there is no original yet)
            let mut copied = Vec::new();
            walk(staging, &copied_dir, &mut copied)?;
            staged.extend(copied);
        }
    }
    drop(lock);
    Ok(Consistent {
        staged,
        generation,
        locked: locked_at.elapsed(),
    })
}

/// The archive's sources, sorted: the data directory's other files (the index and originals
/// only as staged; bundles and private keys as `opts` says), then the staged copies; with the
/// private keys left out.
fn backup_sources(
    files: Vec<(String, PathBuf)>,
    staged: Vec<(String, PathBuf)>,
    opts: &BackupOptions,
) -> anyhow::Result<(Vec<Source>, Vec<String>)> {
    let mut sources = Vec::new();
    let mut keys_left_out = Vec::new();
    let staged_paths: std::collections::BTreeSet<&str> =
        staged.iter().map(|(r, _)| r.as_str()).collect();
    for (rel, p) in files {
        if staged_paths.contains(rel.as_str())
            || rel.starts_with("index/")
            || rel.starts_with("originals/")
        {
            continue;
        }
        if opts.no_bundles && rel.starts_with("bundles/") {
            continue;
        }
        if is_private_key(&rel) && !opts.include_keys {
            keys_left_out.push(rel);
            continue;
        }
        sources.push(source(rel, p)?);
    }
    for (rel, p) in staged {
        sources.push(source(rel, p)?);
    }
    sources.sort_by(|a, b| a.entry.path.cmp(&b.entry.path));
    Ok((sources, keys_left_out))
}

/// Removes a file when dropped (an archive being written; gone after its rename).
struct RemoveFileOnDrop(PathBuf);

impl Drop for RemoveFileOnDrop {
    fn drop(&mut self) {
        let _ = fs::remove_file(&self.0);
    }
}

/// What a restore wrote.
#[derive(Debug)]
pub struct RestoreReport {
    /// The manifest restored.
    pub manifest: Manifest,
    /// Where the previous contents of the target went (`--force` over a non-empty directory).
    pub moved_aside: Option<PathBuf>,
}

fn is_empty_dir(p: &Path) -> anyhow::Result<bool> {
    Ok(fs::read_dir(p)
        .with_context(|| format!("listing {}", p.display()))?
        .next()
        .is_none())
}

/// Restores the archive `from` as the data directory `data`: every file is verified into a
/// staging directory beside `data` first; only when all of them are does the staging directory
/// become `data` (a rename). A non-empty `data` is refused unless `force`, which moves its
/// contents aside to `<data>.pre-restore-<unix time>` (never deleted). On any refusal `data` is
/// left as it was.
pub fn restore(from: &Path, data: &Path, force: bool) -> anyhow::Result<RestoreReport> {
    let target_exists = data.exists();
    if target_exists {
        if !data.is_dir() {
            bail!("{} exists and is not a directory", data.display());
        }
        if !is_empty_dir(data)? && !force {
            bail!(
                "refusing to restore into {}: it is not empty (stop the daemon, then use \
                 --force to move its contents aside to {}.pre-restore-<time>)",
                data.display(),
                data.display()
            );
        }
    }
    let parent = match data.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    fs::create_dir_all(&parent)?;
    let staging = sibling(data, &format!(".restore-{}", std::process::id()))?;
    if staging.exists() {
        fs::remove_dir_all(&staging)?;
    }
    fs::create_dir(&staging)
        .with_context(|| format!("creating the staging directory {}", staging.display()))?;
    let mut clean = RemoveOnDrop(Some(staging.clone()));
    let file = fs::File::open(from).with_context(|| format!("opening {}", from.display()))?;
    let manifest = archive::read(std::io::BufReader::with_capacity(1 << 20, file), &staging)
        .map_err(|e| match e {
            archive::ArchiveError::Corrupt { entry, reason } => anyhow::anyhow!(
                "refusing to restore {}: {entry}: {reason} (the archive is damaged; nothing \
                 was written to {})",
                from.display(),
                data.display()
            ),
            other => anyhow::Error::new(other).context(format!(
                "restoring {} (nothing was written to {})",
                from.display(),
                data.display()
            )),
        })?;
    restrict_keys_dir(&staging);
    let mut moved_aside = None;
    if target_exists {
        if is_empty_dir(data)? {
            fs::remove_dir(data)?;
        } else {
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_secs())
                .unwrap_or(0);
            let aside = PathBuf::from(format!("{}.pre-restore-{now}", data.display()));
            fs::rename(data, &aside).with_context(|| format!("moving {} aside", data.display()))?;
            moved_aside = Some(aside);
        }
    }
    fs::rename(&staging, data)
        .with_context(|| format!("renaming {} to {}", staging.display(), data.display()))?;
    clean.0 = None;
    if let Ok(d) = fs::File::open(&parent) {
        let _ = d.sync_all();
    }
    Ok(RestoreReport {
        manifest,
        moved_aside,
    })
}

/// `keys/` holds the appliance key when it was backed up: owner-only, as `airlock install`
/// leaves it.
fn restrict_keys_dir(root: &Path) {
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let keys = root.join("keys");
        if keys.is_dir() {
            let _ = fs::set_permissions(&keys, fs::Permissions::from_mode(0o700));
        }
    }
    #[cfg(not(unix))]
    let _ = root;
}
