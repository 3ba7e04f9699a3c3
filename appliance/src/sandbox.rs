//! Egress lockdown (DESIGN.md §9): on Linux the daemon restricts itself with Landlock so that it
//! cannot open outbound TCP connections or write outside its data directory.
//!
//! - Network (Landlock ABI ≥ 4): `connect(2)` on TCP sockets is handled with no allowed port, so
//!   every outbound TCP connection fails with `EACCES`. Binding and accepting stay allowed (the
//!   daemon serves its own listener). UDP and Unix sockets are not covered by Landlock's
//!   network rules.
//! - File system (ABI ≥ 1, the write rights of ABI 4: write, truncate, create, remove, link,
//!   rename): allowed only beneath the data directory (and on `/dev/null`). Reading stays
//!   allowed everywhere (bundles, keyrings, models).
//!
//! Landlock applies to the calling thread and the threads it creates afterwards (kernels before
//! ABI 8 cannot restrict sibling threads), so [`lock_down`] must run while the process is still
//! single-threaded: `airlock serve` calls it before it starts the async runtime, the engine
//! threads and the ladder thread, which all inherit the restriction.

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
    imp::lock_down(writable, require)
}

/// Applies [`lock_down`] for the daemon: writes beneath `data_dir` only; logs what is active.
pub fn lock_down_daemon(data_dir: &Path, require: bool) -> Result<SandboxReport, SandboxError> {
    let dev_null = Path::new("/dev/null");
    let mut writable = vec![data_dir];
    if dev_null.exists() {
        writable.push(dev_null);
    }
    match lock_down(&writable, require) {
        Ok(report) => {
            if report.fully_enforced() {
                tracing::info!(
                    tcp_connect_denied = true,
                    writes_confined_to = %data_dir.display(),
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
        ABI, AccessFs, AccessNet, CompatLevel, Compatible, LandlockStatus, PathBeneath, PathFd,
        Ruleset, RulesetAttr, RulesetCreatedAttr, RulesetStatus,
    };

    use super::{SandboxError, SandboxReport};

    fn ll(e: impl std::fmt::Display) -> SandboxError {
        SandboxError::Landlock(e.to_string())
    }

    pub(super) fn lock_down(
        writable: &[&Path],
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
        let status = created.restrict_self().map_err(ll)?;
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
            writable: writable.iter().map(|p| p.to_path_buf()).collect(),
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
}

#[cfg(not(target_os = "linux"))]
mod imp {
    use std::path::Path;

    use super::{SandboxError, SandboxReport};

    pub(super) fn lock_down(
        writable: &[&Path],
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
