//! `airlock audit` (print entries) and `airlock audit export` (the SIEM export: JSON lines,
//! one record per audit entry, the `[audit_sink]` file's format).

use std::io::Write;
use std::path::{Path, PathBuf};

use airlock_acl::AuditQuery;
use anyhow::{Context, bail};
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

use crate::startup;

/// `airlock audit [--data D --user U --since T --limit N]` or `airlock audit export …`.
#[derive(Debug, clap::Args)]
#[command(args_conflicts_with_subcommands = true)]
pub struct AuditCli {
    /// `export`: the SIEM export.
    #[command(subcommand)]
    pub command: Option<AuditCommand>,
    /// Without a subcommand: print entries.
    #[command(flatten)]
    pub list: super::users::AuditArgs,
}

/// `airlock audit …`.
#[derive(Debug, clap::Subcommand)]
pub enum AuditCommand {
    /// Write the audit log's entries in a time range as JSON lines (ids only, never content).
    Export(ExportArgs),
}

/// The export format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// One JSON object per line.
    Jsonl,
}

/// `airlock audit export`.
#[derive(Debug, clap::Args)]
pub struct ExportArgs {
    /// The appliance's data directory.
    #[arg(long = "data", env = "AIRLOCK_DATA", default_value = "./airlock-data")]
    pub data: PathBuf,
    /// Entries at or after this instant (RFC 3339 with an offset, e.g. 2026-05-01T00:00:00Z).
    #[arg(long)]
    pub since: String,
    /// Entries before this instant (RFC 3339) [default: now and later: no bound].
    #[arg(long)]
    pub until: Option<String>,
    /// The output format.
    #[arg(long, value_enum, default_value = "jsonl")]
    pub format: Format,
    /// Write here (refused if it exists; written whole or not at all) instead of stdout.
    #[arg(long)]
    pub out: Option<PathBuf>,
}

/// An RFC 3339 instant with its offset (`--since`, `--until`).
pub fn parse_instant(flag: &str, s: &str) -> anyhow::Result<OffsetDateTime> {
    OffsetDateTime::parse(s.trim(), &Rfc3339).map_err(|_| {
        anyhow::anyhow!(
            "{flag} {s:?} is not an RFC 3339 instant (write e.g. 2026-05-01T00:00:00Z or \
             2026-05-01T02:00:00+02:00)"
        )
    })
}

/// Runs `airlock audit …`.
pub fn run(a: AuditCli) -> anyhow::Result<bool> {
    match a.command {
        None => super::users::audit(a.list),
        Some(AuditCommand::Export(e)) => export(e),
    }
}

/// Entries read per page.
const PAGE: usize = 10_000;

fn export(a: ExportArgs) -> anyhow::Result<bool> {
    // Every argument is checked before anything is opened or written.
    let since = parse_instant("--since", &a.since)?;
    let until = a
        .until
        .as_deref()
        .map(|u| parse_instant("--until", u))
        .transpose()?;
    if until.is_some_and(|u| u <= since) {
        bail!("--until must be later than --since");
    }
    let Format::Jsonl = a.format;
    if let Some(out) = &a.out
        && out.exists()
    {
        bail!("{} exists; an export is never overwritten", out.display());
    }
    if !startup::db_path(&a.data).exists() {
        bail!(
            "{} holds no appliance database (airlock.db)",
            a.data.display()
        );
    }
    let acl = startup::open_acl(&a.data)?;
    let q = AuditQuery {
        user: None,
        since: Some(since),
        until,
        kind: None,
        limit: Some(PAGE),
    };
    let mut out: Box<dyn Write> = match &a.out {
        Some(path) => Box::new(std::io::BufWriter::new(
            std::fs::File::create_new(partial(path))
                .with_context(|| format!("creating {}", partial(path).display()))?,
        )),
        None => Box::new(std::io::BufWriter::new(std::io::stdout().lock())),
    };
    let (mut after, mut n) = (0i64, 0usize);
    let written = (|| -> anyhow::Result<()> {
        loop {
            let page = acl.audit_query_after(&q, after)?;
            for e in &page {
                writeln!(out, "{}", airlock_evidence::audit_sink::line(e))?;
            }
            n += page.len();
            match page.last() {
                Some(last) if page.len() == PAGE => after = last.seq,
                _ => break,
            }
        }
        out.flush()?;
        Ok(())
    })();
    drop(out);
    if let Some(path) = &a.out {
        let tmp = partial(path);
        if let Err(e) = written {
            let _ = std::fs::remove_file(&tmp);
            return Err(e);
        }
        std::fs::File::open(&tmp)?.sync_all()?;
        std::fs::rename(&tmp, path)
            .with_context(|| format!("renaming {} to {}", tmp.display(), path.display()))?;
        eprintln!("{n} audit entries written to {}", path.display());
    } else {
        written?;
    }
    Ok(true)
}

/// Where an export is written before it is renamed into place.
fn partial(path: &Path) -> PathBuf {
    let mut s = path.as_os_str().to_owned();
    s.push(".partial");
    PathBuf::from(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn instants_need_rfc3339_with_an_offset() {
        for ok in [
            "2026-05-01T00:00:00Z",
            "2026-05-01T02:00:00+02:00",
            "2026-05-01T00:00:00.123456Z",
            // RFC 3339 §5.6 allows a space for the `T`.
            "2026-05-01 00:00:00Z",
        ] {
            assert!(parse_instant("--since", ok).is_ok(), "{ok}");
        }
        for bad in [
            "",
            "yesterday",
            "2026-05-01",
            "2026-05-01T00:00:00",
            "2026-13-01T00:00:00Z",
            "2026-02-30T00:00:00Z",
            "1714521600",
            "2026-05-01T25:00:00Z",
        ] {
            let e = parse_instant("--since", bad).unwrap_err().to_string();
            assert!(
                e.contains("--since") && e.contains("RFC 3339"),
                "{bad}: {e}"
            );
        }
    }
}
