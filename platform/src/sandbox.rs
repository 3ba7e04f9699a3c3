//! Egress lockdown (DESIGN.md §9): on Linux the daemon restricts itself with Landlock so that it
//! cannot open outbound TCP connections or write outside its data directory.
//!
//! - Network (Landlock ABI ≥ 4): `connect(2)` on TCP sockets is handled with no allowed port, so
//!   every outbound TCP connection fails with `EACCES`. Binding and accepting stay allowed (the
//!   daemon serves its own listener). UDP and Unix sockets are not covered by Landlock's
//!   network rules. With `[[remote_generators]]` configured, `connect` stays allowed to their
//!   ports only ([`lock_down_allowing`]; Landlock rules name ports, not hosts).
//! - File system (ABI ≥ 1, the write rights of ABI 4: write, truncate, create, remove, link,
//!   rename): allowed only where the daemon writes — the data directory's entries other than
//!   `keys/` and `bundles/` (the SQLite files, `index/`, ...) — and on `/dev/null`. Reading
//!   stays allowed everywhere, so the daemon reads the pinned keyring and the installed bundles
//!   but can never change them (issue 19 F7): trust changes only through the offline
//!   `airlock install` / `airlock keyring rotate`.
//!
//! Landlock applies to the calling thread and the threads it creates afterwards (kernels before
//! ABI 8 cannot restrict sibling threads), so a lockdown meant for the process must run while
//! it is still single-threaded: `airlock serve` (and the daemon `airlock demo` execs) calls
//! [`lock_down_daemon`] before it starts the async runtime, the engine threads and the ladder
//! thread, which all inherit the restriction. Called on the main thread with other threads
//! alive, [`lock_down_daemon`] refuses ([`SandboxError::NotSingleThreaded`]) instead of
//! leaving them unrestricted.

use std::path::{Path, PathBuf};

/// What could not be enforced or set up.
#[derive(Debug, thiserror::Error)]
pub enum SandboxError {
    /// A path to allow could not be opened.
    #[error("sandbox: cannot open {path}: {message}")]
    Path {
        /// The path.
        path: PathBuf,
        /// The cause.
        message: String,
    },
    /// A process-wide lockdown was attempted with other threads alive (they would stay
    /// unrestricted).
    #[error(
        "sandbox: the lockdown must be applied while the process is single-threaded, but \
         {threads} threads exist"
    )]
    NotSingleThreaded {
        /// Threads of the process at the time (from `/proc/self/task`).
        threads: usize,
    },
    /// The kernel refused or lacks a restriction that was required.
    #[error("sandbox: {0}")]
    Landlock(String),
    /// `require_sandbox = true` and the kernel cannot enforce every restriction.
    #[error(
        "sandbox required but not fully enforced (outbound TCP denied: {tcp_connect_denied}, \
         writes confined: {writes_confined}; {detail})"
    )]
    NotEnforced {
        /// Whether outbound TCP connect is denied.
        tcp_connect_denied: bool,
        /// Whether writes are confined to the allowed paths.
        writes_confined: bool,
        /// The kernel's Landlock status.
        detail: String,
    },
}

/// Which restrictions are in force after [`lock_down`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SandboxReport {
    /// Outbound TCP `connect` is denied.
    pub tcp_connect_denied: bool,
    /// File-system writes are confined to the allowed paths.
    pub writes_confined: bool,
    /// The paths where writes stay allowed.
    pub writable: Vec<PathBuf>,
    /// The kernel's Landlock status, for the log.
    pub detail: String,
}

impl SandboxReport {
    /// Whether every restriction is enforced.
    pub fn fully_enforced(&self) -> bool {
        self.tcp_connect_denied && self.writes_confined
    }
}

/// Restricts the calling thread and every thread it creates later: no outbound TCP connect,
/// writes only beneath `writable` (each must exist). With `require`, anything less than full
/// enforcement is an error and nothing is applied partially on purpose: the caller must refuse
/// to start.
pub fn lock_down(writable: &[&Path], require: bool) -> Result<SandboxReport, SandboxError> {
    imp::lock_down(writable, &[], require)
}

/// [`lock_down`], except that TCP `connect` stays allowed to `connect_ports` (the configured
/// remote generators' ports; Landlock rules name ports, not hosts: the daemon's rack client
/// dials only the configured `host:port` pairs).
pub fn lock_down_allowing(
    writable: &[&Path],
    connect_ports: &[u16],
    require: bool,
) -> Result<SandboxReport, SandboxError> {
    imp::lock_down(writable, connect_ports, require)
}

/// The extraction worker's lockdown (`airlock extract --child`, the appliance's `extraction`): no
/// file system access at all (read, write, execute), no TCP connect or bind. It has its file on
/// stdin and answers on stdout, so it needs nothing else. Applied by the worker itself, while it
/// is single-threaded, before it reads a byte; it also inherits the daemon's own lockdown.
/// With `require`, anything less than full enforcement is an error (the worker exits).
pub fn lock_down_worker(require: bool) -> Result<SandboxReport, SandboxError> {
    imp::lock_down_worker(require)
}

pub use crate::paths::READ_ONLY;

// SQLite files the daemon writes in the data directory itself (`airlock.db` in WAL mode).
use crate::paths::SQLITE_FILES;

fn path_err(path: &Path) -> impl Fn(std::io::Error) -> SandboxError + '_ {
    move |e| SandboxError::Path {
        path: path.to_path_buf(),
        message: e.to_string(),
    }
}

/// Prepares `data_dir` for the daemon's lockdown and returns where the daemon may write: every
/// directory and regular file directly in `data_dir` except [`READ_ONLY`] ones (symlinks are
/// skipped: they could point anywhere), `index/`, `originals/`, `releases/`, `ingest-queue/` and `connectors/` (created), the SQLite database and its WAL
/// files, and `/dev/null`.
///
/// Landlock rules only grant, and a grant on a directory covers everything beneath it, so the
/// data directory itself gets no rule: nothing may be created or removed directly in it after
/// the lockdown. So the database is brought into WAL mode here (a fresh database needs a
/// rollback journal for that once) and its `-wal` and `-shm` files are created empty (an empty
/// WAL is a valid one), leaving SQLite nothing to create later.
pub fn daemon_writable(data_dir: &Path) -> Result<Vec<PathBuf>, SandboxError> {
    let layout = crate::paths::DataDir::new(data_dir);
    for dir in [
        layout.index(),
        layout.originals(),
        layout.releases(),
        layout.ingest_queue(),
        layout.connectors(),
    ] {
        std::fs::create_dir_all(dir).map_err(path_err(data_dir))?;
    }
    let db = data_dir.join(SQLITE_FILES[0]);
    rusqlite::Connection::open(&db)
        .and_then(|c| {
            c.pragma_update(None, "journal_mode", "WAL")?;
            c.close().map_err(|(_, e)| e)
        })
        .map_err(|e| SandboxError::Path {
            path: db.clone(),
            message: e.to_string(),
        })?;
    for name in &SQLITE_FILES[1..] {
        let path = data_dir.join(name);
        std::fs::OpenOptions::new()
            .append(true)
            .create(true)
            .open(&path)
            .map_err(path_err(&path))?;
    }
    let mut writable = Vec::new();
    for item in std::fs::read_dir(data_dir).map_err(path_err(data_dir))? {
        let item = item.map_err(path_err(data_dir))?;
        let name = item.file_name();
        if READ_ONLY.iter().any(|r| name == *r) {
            continue;
        }
        let kind = item.file_type().map_err(path_err(&item.path()))?;
        if kind.is_dir() || kind.is_file() {
            writable.push(item.path());
        }
    }
    writable.sort();
    let dev_null = Path::new("/dev/null");
    if dev_null.exists() {
        writable.push(dev_null.to_path_buf());
    }
    Ok(writable)
}

/// The number of threads of this process, from `/proc/self/task` (`None` where unreadable).
pub fn process_threads() -> Option<usize> {
    std::fs::read_dir("/proc/self/task")
        .ok()
        .map(|d| d.filter_map(Result::ok).count())
}

/// Whether the calling thread is the process's main thread (`/proc/thread-self` names
/// `<pid>/task/<tid>` with tid = pid).
fn on_main_thread() -> bool {
    std::fs::read_link("/proc/thread-self")
        .ok()
        .and_then(|p| p.file_name().map(|t| t.to_string_lossy().into_owned()))
        .is_some_and(|tid| tid == std::process::id().to_string())
}

/// Applies [`lock_down`] for the daemon: the writable set of [`daemon_writable`] (never
/// `keys/` or `bundles/`), no outbound TCP; logs what is active.
///
/// On the main thread this is the process's lockdown and must come before any other thread
/// exists: with more threads alive it refuses ([`SandboxError::NotSingleThreaded`]) without
/// applying anything. On another thread (the eval runner's owned daemon) it restricts that
/// thread and the threads it starts, as [`lock_down`] does.
pub fn lock_down_daemon(data_dir: &Path, require: bool) -> Result<SandboxReport, SandboxError> {
    lock_down_daemon_allowing(data_dir, &[], require)
}

/// [`lock_down_daemon`] with outbound TCP allowed to `connect_ports` only (see
/// [`lock_down_allowing`]).
pub fn lock_down_daemon_allowing(
    data_dir: &Path,
    connect_ports: &[u16],
    require: bool,
) -> Result<SandboxReport, SandboxError> {
    lock_down_daemon_writing(data_dir, &[], connect_ports, require)
}

/// [`lock_down_daemon_allowing`] with writes also allowed beneath `also_writable` (each must
/// exist: the `[audit_sink]` file's directory).
pub fn lock_down_daemon_writing(
    data_dir: &Path,
    also_writable: &[&Path],
    connect_ports: &[u16],
    require: bool,
) -> Result<SandboxReport, SandboxError> {
    if on_main_thread()
        && let Some(threads) = process_threads()
        && threads > 1
    {
        return Err(SandboxError::NotSingleThreaded { threads });
    }
    let writable = daemon_writable(data_dir)?;
    let mut writable: Vec<&Path> = writable.iter().map(PathBuf::as_path).collect();
    writable.extend_from_slice(also_writable);
    match lock_down_allowing(&writable, connect_ports, require) {
        Ok(report) => {
            if report.fully_enforced() {
                tracing::info!(
                    tcp_connect_denied = true,
                    tcp_connect_allowed_ports = ?connect_ports,
                    writes_confined_to = %data_dir.display(),
                    read_only = ?READ_ONLY,
                    landlock = %report.detail,
                    "egress lockdown active"
                );
            } else {
                tracing::warn!(
                    tcp_connect_denied = report.tcp_connect_denied,
                    writes_confined = report.writes_confined,
                    landlock = %report.detail,
                    "egress lockdown incomplete: the kernel cannot enforce every restriction \
                     (set require_sandbox = true to refuse to start)"
                );
            }
            Ok(report)
        }
        Err(e) => Err(e),
    }
}

#[cfg(target_os = "linux")]
mod imp {
    use std::path::Path;

    use landlock::{
        ABI, Access, AccessFs, AccessNet, CompatLevel, Compatible, LandlockStatus, NetPort,
        PathBeneath, PathFd, Ruleset, RulesetAttr, RulesetCreatedAttr, RulesetStatus,
    };

    use super::{SandboxError, SandboxReport};

    fn ll(e: impl std::fmt::Display) -> SandboxError {
        SandboxError::Landlock(e.to_string())
    }

    pub(super) fn lock_down_worker(require: bool) -> Result<SandboxReport, SandboxError> {
        let abi = ABI::V4;
        let level = if require {
            CompatLevel::HardRequirement
        } else {
            CompatLevel::BestEffort
        };
        let status = Ruleset::default()
            .set_compatibility(level)
            .handle_access(AccessFs::from_all(abi))
            .map_err(ll)?
            .handle_access(AccessNet::ConnectTcp | AccessNet::BindTcp)
            .map_err(ll)?
            .create()
            .map_err(ll)?
            .restrict_self()
            .map_err(ll)?;
        finish(status, Vec::new(), require)
    }

    /// The report of an applied ruleset; with `require`, an error unless fully enforced.
    fn finish(
        status: landlock::RestrictionStatus,
        writable: Vec<std::path::PathBuf>,
        require: bool,
    ) -> Result<SandboxReport, SandboxError> {
        let (fs, net, detail) = match status.landlock {
            LandlockStatus::Available { effective_abi, .. } => {
                let net = !matches!(effective_abi, ABI::V1 | ABI::V2 | ABI::V3);
                let enforced = status.ruleset != RulesetStatus::NotEnforced;
                (
                    enforced,
                    enforced && net,
                    format!("available, ABI {effective_abi:?}, {:?}", status.ruleset),
                )
            }
            LandlockStatus::NotEnabled => (false, false, "not enabled in this kernel".into()),
            LandlockStatus::NotImplemented => (false, false, "not built into this kernel".into()),
        };
        let report = SandboxReport {
            tcp_connect_denied: net,
            writes_confined: fs,
            writable,
            detail,
        };
        if require && !report.fully_enforced() {
            return Err(SandboxError::NotEnforced {
                tcp_connect_denied: report.tcp_connect_denied,
                writes_confined: report.writes_confined,
                detail: report.detail,
            });
        }
        Ok(report)
    }

    pub(super) fn lock_down(
        writable: &[&Path],
        connect_ports: &[u16],
        require: bool,
    ) -> Result<SandboxReport, SandboxError> {
        // ABI 4 is the first with network rules; its write rights exclude device ioctls, which
        // the daemon has no reason to lose on its terminal.
        let abi = ABI::V4;
        let write = AccessFs::from_write(abi);
        let level = if require {
            CompatLevel::HardRequirement
        } else {
            CompatLevel::BestEffort
        };
        let mut created = Ruleset::default()
            .set_compatibility(level)
            .handle_access(write)
            .map_err(ll)?
            .handle_access(AccessNet::ConnectTcp)
            .map_err(ll)?
            .create()
            .map_err(ll)?;
        for path in writable {
            let fd = PathFd::new(path).map_err(|e| SandboxError::Path {
                path: path.to_path_buf(),
                message: e.to_string(),
            })?;
            let access = if path.is_dir() {
                write
            } else {
                write & AccessFs::from_file(abi)
            };
            created = created.add_rule(PathBeneath::new(fd, access)).map_err(ll)?;
        }
        for port in connect_ports {
            created = created
                .add_rule(NetPort::new(*port, AccessNet::ConnectTcp))
                .map_err(ll)?;
        }
        let status = created.restrict_self().map_err(ll)?;
        finish(
            status,
            writable.iter().map(|p| p.to_path_buf()).collect(),
            require,
        )
    }
}

#[cfg(not(target_os = "linux"))]
mod imp {
    use std::path::Path;

    use super::{SandboxError, SandboxReport};

    pub(super) fn lock_down_worker(require: bool) -> Result<SandboxReport, SandboxError> {
        lock_down(&[], &[], require)
    }

    pub(super) fn lock_down(
        writable: &[&Path],
        _connect_ports: &[u16],
        require: bool,
    ) -> Result<SandboxReport, SandboxError> {
        let report = SandboxReport {
            tcp_connect_denied: false,
            writes_confined: false,
            writable: writable.iter().map(|p| p.to_path_buf()).collect(),
            detail: "Landlock exists only on Linux".into(),
        };
        if require {
            return Err(SandboxError::NotEnforced {
                tcp_connect_denied: false,
                writes_confined: false,
                detail: report.detail,
            });
        }
        Ok(report)
    }
}
