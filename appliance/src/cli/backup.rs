//! `airlock backup` and `airlock restore` (docs/operations/backup-restore.md).

use std::path::PathBuf;

use clap::Args;

use super::DataArgs;
use crate::backup::{self, BackupOptions};

/// `airlock backup`.
#[derive(Debug, Args)]
pub struct BackupArgs {
    /// The data directory (the daemon may be serving it).
    #[command(flatten)]
    pub data: DataArgs,
    /// The archive to write (`.tar.zst`; must not exist).
    #[arg(long)]
    pub out: PathBuf,
    /// Also back up private keys (the appliance key `keys/appliance.key`): the archive then
    /// carries the box's signing identity and must be kept like the key itself.
    #[arg(long)]
    pub include_keys: bool,
    /// Leave out the installed bundles (`bundles/`); a restore then needs `airlock install` of
    /// the same bundle file.
    #[arg(long)]
    pub no_bundles: bool,
}

/// `airlock restore`.
#[derive(Debug, Args)]
pub struct RestoreArgs {
    /// The archive written by `airlock backup`.
    #[arg(long)]
    pub from: PathBuf,
    /// The data directory to create (stop any daemon on it first).
    #[command(flatten)]
    pub data: DataArgs,
    /// Restore into a non-empty directory: its contents are moved aside to
    /// `<data>.pre-restore-<unix time>` (never deleted).
    #[arg(long)]
    pub force: bool,
}

/// Runs `airlock backup`.
pub fn run_backup(a: BackupArgs) -> anyhow::Result<bool> {
    let r = backup::backup(
        &a.data.data,
        &a.out,
        BackupOptions {
            include_keys: a.include_keys,
            no_bundles: a.no_bundles,
        },
    )?;
    let bytes: u64 = r.manifest.files.iter().map(|f| f.size).sum();
    eprintln!(
        "backup {}: {} files, {bytes} bytes ({} compressed), index generation {}, bundle {}, \
         write lock held {} ms",
        a.out.display(),
        r.manifest.files.len(),
        r.archive_bytes,
        r.manifest.index_generation,
        r.manifest.bundle.as_deref().unwrap_or("none"),
        r.locked.as_millis()
    );
    for k in &r.keys_left_out {
        eprintln!("  left out the private key {k} (use --include-keys to back it up)");
    }
    Ok(true)
}

/// Runs `airlock restore`.
pub fn run_restore(a: RestoreArgs) -> anyhow::Result<bool> {
    let r = backup::restore(&a.from, &a.data.data, a.force)?;
    eprintln!(
        "restored {} files into {} (every SHA-256 verified; taken {}, index generation {}, \
         bundle {})",
        r.manifest.files.len(),
        a.data.data.display(),
        r.manifest.created,
        r.manifest.index_generation,
        r.manifest.bundle.as_deref().unwrap_or("none")
    );
    if let Some(p) = &r.moved_aside {
        eprintln!("  the previous contents are in {}", p.display());
    }
    if !r.manifest.includes_bundles {
        eprintln!("  the archive has no bundles: `airlock install` the same bundle before serving");
    }
    if !r.manifest.includes_keys {
        eprintln!(
            "  the archive has no private keys: `airlock install` creates a new appliance key \
             (give auditors its keys/appliance.pub)"
        );
    }
    Ok(true)
}
