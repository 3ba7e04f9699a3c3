//! `airlock acl sync|user add|user token|user remove|audit`: access-control administration on
//! the data directory's SQLite file. No bundle is needed (operators can be created before an
//! install). Tokens are printed once and stored only as SHA-256.

use std::io::BufReader;
use std::path::PathBuf;

use airlock_acl::{AuditQuery, NewUser, Role};
use anyhow::Context;

use crate::startup;

/// The actor recorded in the audit log for CLI changes.
pub(crate) const ACTOR: &str = "cli";

/// `airlock acl ...`.
#[derive(Debug, clap::Subcommand)]
pub enum AclCommand {
    /// Apply a JSON Lines IAM snapshot (replaces the previous one; operators are kept), or
    /// with `--ldap` the memberships of every enabled directory user.
    Sync(SyncArgs),
}

/// `airlock acl sync FILE`.
#[derive(Debug, clap::Args)]
pub struct SyncArgs {
    /// The appliance's data directory.
    #[arg(long = "data", env = "AIRLOCK_DATA", default_value = "./airlock-data")]
    pub data: PathBuf,
    /// The snapshot (`{"user",...}` and `{"doc",...}` lines).
    #[arg(required_unless_present = "ldap", conflicts_with = "ldap")]
    pub file: Option<PathBuf>,
    /// Import users and their group memberships from the `[ldap]` directory of `--config`
    /// (the membership half of the IAM state; document grants are not touched). Users that are
    /// disabled or gone in the directory are removed with their tokens and sessions.
    #[arg(long, requires = "config")]
    pub ldap: bool,
    /// The daemon's TOML configuration (its `[ldap]` table), for `--ldap`.
    #[arg(long = "config", env = "AIRLOCK_CONFIG")]
    pub config: Option<PathBuf>,
    /// Apply an empty snapshot (removes every user but the local operators, and every grant).
    #[arg(long)]
    pub allow_empty: bool,
}

/// `airlock user ...`.
#[derive(Debug, clap::Subcommand)]
pub enum UserCommand {
    /// Create a user and print their first bearer token.
    Add(UserAddArgs),
    /// Issue (rotate) a user's bearer token and print it.
    Token(UserTokenArgs),
    /// List issued tokens (JSON Lines: user, issued, expiry, last use; never the secret) or
    /// revoke one.
    #[command(subcommand)]
    Tokens(TokensCommand),
    /// Remove a user and their token.
    Remove(UserIdArgs),
}

/// `airlock user add ID`.
#[derive(Debug, clap::Args)]
pub struct UserAddArgs {
    /// The appliance's data directory.
    #[arg(long = "data", env = "AIRLOCK_DATA", default_value = "./airlock-data")]
    pub data: PathBuf,
    /// The user id.
    pub user_id: String,
    /// Groups (comma-separated or repeated).
    #[arg(long, value_delimiter = ',')]
    pub groups: Vec<String>,
    /// Make the user an appliance operator with every duty (the admin and operator roles, as
    /// `admin` meant before roles were separated); a local user, outside the IAM snapshot.
    #[arg(long)]
    pub admin: bool,
    /// Roles (comma-separated or repeated): admin (users, tokens), operator (ingest, sync,
    /// purge, evals), auditor (audit log, metrics; no document content), metrics (scrapes
    /// /metrics only). A user with a role is local (kept by IAM syncs).
    #[arg(long = "role", value_delimiter = ',', value_parser = parse_role)]
    pub roles: Vec<Role>,
}

fn parse_role(s: &str) -> Result<Role, String> {
    s.parse().map_err(|e: airlock_acl::Error| e.to_string())
}

/// `airlock user token ID [--ttl 30d]`.
#[derive(Debug, clap::Args)]
pub struct UserTokenArgs {
    /// The appliance's data directory.
    #[arg(long = "data", env = "AIRLOCK_DATA", default_value = "./airlock-data")]
    pub data: PathBuf,
    /// The user id.
    pub user_id: String,
    /// Lifetime of the token: seconds, or a number with `s`, `m`, `h` or `d` [default: none].
    #[arg(long, value_parser = parse_ttl)]
    pub ttl: Option<std::time::Duration>,
}

/// `airlock user tokens ...`.
#[derive(Debug, clap::Subcommand)]
pub enum TokensCommand {
    /// Print every issued token's user, issue time, expiry and last use.
    List(DataOnly),
    /// Revoke a user's token and end their sign-in sessions.
    Revoke(UserIdArgs),
}

/// Only the data directory.
#[derive(Debug, clap::Args)]
pub struct DataOnly {
    /// The appliance's data directory.
    #[arg(long = "data", env = "AIRLOCK_DATA", default_value = "./airlock-data")]
    pub data: PathBuf,
}

/// `30d`, `12h`, `90m`, `3600s` or `3600`.
fn parse_ttl(s: &str) -> Result<std::time::Duration, String> {
    let (num, unit) = match s.char_indices().last() {
        Some((i, c)) if c.is_ascii_alphabetic() => (&s[..i], c),
        _ => (s, 's'),
    };
    let n: u64 = num
        .parse()
        .map_err(|_| format!("{s:?}: a number with s, m, h or d"))?;
    let mult = match unit {
        's' => 1,
        'm' => 60,
        'h' => 3600,
        'd' => 86_400,
        _ => return Err(format!("{s:?}: the unit is s, m, h or d")),
    };
    if n == 0 {
        return Err("must be more than 0".into());
    }
    Ok(std::time::Duration::from_secs(n.saturating_mul(mult)))
}

/// `airlock user remove ID`, `airlock user tokens revoke ID`.
#[derive(Debug, clap::Args)]
pub struct UserIdArgs {
    /// The appliance's data directory.
    #[arg(long = "data", env = "AIRLOCK_DATA", default_value = "./airlock-data")]
    pub data: PathBuf,
    /// The user id.
    pub user_id: String,
}

/// `airlock audit`.
#[derive(Debug, clap::Args)]
pub struct AuditArgs {
    /// The appliance's data directory.
    #[arg(long = "data", env = "AIRLOCK_DATA", default_value = "./airlock-data")]
    pub data: PathBuf,
    /// Entries about or by this user.
    #[arg(long)]
    pub user: Option<String>,
    /// Entries at or after this instant (RFC 3339).
    #[arg(long)]
    pub since: Option<String>,
    /// At most this many entries.
    #[arg(long, default_value_t = 1000)]
    pub limit: usize,
}

/// Runs `airlock acl ...`.
pub fn acl(cmd: AclCommand) -> anyhow::Result<bool> {
    match cmd {
        AclCommand::Sync(a) if a.ldap => {
            let config = crate::config::Config {
                config_file: a.config.clone(),
                ..crate::config::Config::default()
            }
            .load()?;
            let Some(ldap) = config.ldap else {
                anyhow::bail!("--ldap: the configuration has no [ldap] table");
            };
            let acl = startup::open_acl(&a.data)?;
            let counts = airlock_identity::ldap::sync_blocking(&acl, &ldap, ACTOR)
                .map_err(|e| anyhow::anyhow!("directory sync: {e}"))?;
            println!("{}", serde_json::to_string_pretty(&counts)?);
            Ok(true)
        }
        AclCommand::Sync(a) => {
            let acl = startup::open_acl(&a.data)?;
            let path = a.file.context("a snapshot file or --ldap")?;
            let file = std::fs::File::open(&path)
                .with_context(|| format!("opening {}", path.display()))?;
            let options = airlock_acl::SyncOptions {
                allow_empty: a.allow_empty,
            };
            let counts = acl.sync_snapshot_with(ACTOR, BufReader::new(file), options)?;
            println!("{}", serde_json::to_string_pretty(&counts)?);
            Ok(true)
        }
    }
}

/// Runs `airlock user ...`.
pub fn user(cmd: UserCommand) -> anyhow::Result<bool> {
    match cmd {
        UserCommand::Add(a) => {
            let acl = startup::open_acl(&a.data)?;
            let mut roles = a.roles;
            if a.admin {
                roles.extend([Role::Admin, Role::Operator]);
            }
            roles.sort();
            roles.dedup();
            let token = acl.add_user(
                ACTOR,
                &a.user_id,
                &NewUser {
                    groups: a.groups,
                    local: !roles.is_empty(),
                    roles,
                },
            )?;
            println!("{token}");
            Ok(true)
        }
        UserCommand::Token(a) => {
            let acl = startup::open_acl(&a.data)?;
            println!("{}", acl.issue_token_expiring(ACTOR, &a.user_id, a.ttl)?);
            Ok(true)
        }
        UserCommand::Tokens(TokensCommand::List(a)) => {
            let acl = startup::open_acl(&a.data)?;
            for t in acl.tokens()? {
                println!("{}", serde_json::to_string(&t)?);
            }
            Ok(true)
        }
        UserCommand::Tokens(TokensCommand::Revoke(a)) => {
            let acl = startup::open_acl(&a.data)?;
            let had = acl.revoke_token(ACTOR, &a.user_id)?;
            eprintln!(
                "{}: {}",
                a.user_id,
                if had {
                    "token revoked, sessions ended"
                } else {
                    "had no token; sessions ended"
                }
            );
            Ok(true)
        }
        UserCommand::Remove(a) => {
            let acl = startup::open_acl(&a.data)?;
            acl.remove_user(ACTOR, &a.user_id)?;
            eprintln!("removed {}", a.user_id);
            Ok(true)
        }
    }
}

/// Prints matching audit entries as JSON Lines, oldest first.
pub fn audit(a: AuditArgs) -> anyhow::Result<bool> {
    let since = a
        .since
        .as_deref()
        .map(|s| {
            time::OffsetDateTime::parse(s, &time::format_description::well_known::Rfc3339)
                .with_context(|| format!("--since {s}: not RFC 3339"))
        })
        .transpose()?;
    let acl = startup::open_acl(&a.data)?;
    let entries = acl.audit_query(&AuditQuery {
        user: a.user,
        since,
        until: None,
        kind: None,
        limit: Some(a.limit),
    })?;
    for e in entries {
        println!("{}", serde_json::to_string(&e)?);
    }
    Ok(true)
}
