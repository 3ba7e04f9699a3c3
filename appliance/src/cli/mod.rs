//! The `airlock` command line. Each command group lives in its own module; this file only
//! declares the tree and maps results to exit codes (0 ok, 1 failure, 2 usage).

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

pub mod audit;
pub mod backup;
pub mod bundle;
pub mod connectors;
pub mod demo;
pub mod eval;
pub mod export;
pub mod ingest;
mod ingest_dir;
pub mod keys;
pub mod receipt;
pub mod serve;
pub mod users;

/// Airlock: an air-gapped RAG appliance.
#[derive(Debug, Parser)]
#[command(name = "airlock", version, about, propagate_version = true)]
pub struct Cli {
    /// The command to run.
    #[command(subcommand)]
    pub command: Command,
}

/// Options shared by every command that touches the appliance's state.
#[derive(Debug, Clone, clap::Args)]
pub struct DataArgs {
    /// The appliance's data directory.
    #[arg(long = "data", env = "AIRLOCK_DATA", default_value = "./airlock-data")]
    pub data: PathBuf,
}

/// Top-level commands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Generate an Ed25519 signing key pair.
    Keygen(keys::KeygenArgs),
    /// Manage keyrings: the trusted keys, threshold and revocations.
    #[command(subcommand)]
    Keyring(keys::KeyringCommand),
    /// Build, verify, inspect and list signed bundles.
    #[command(subcommand)]
    Bundle(bundle::BundleCommand),
    /// Verify a bundle and make it the current one.
    Install(bundle::InstallArgs),
    /// Switch back to the previous installed bundle.
    Rollback(bundle::RollbackArgs),
    /// Golden-set evaluation and the release gate.
    #[command(subcommand)]
    Eval(eval::EvalCommand),
    /// Set up a working demo appliance (key, signed bundle, sample data, users) and serve it.
    Demo(demo::DemoArgs),
    /// Serve an installed appliance (HTTP API, web UI).
    Serve(Box<serve::ServeArgs>),
    /// Ingest documents from files or directories (offline; the daemon must be stopped).
    Ingest(ingest::IngestArgs),
    /// Tombstone documents (offline).
    Delete(ingest::DeleteArgs),
    /// Tombstone documents the source no longer has (offline).
    Reconcile(ingest::ReconcileArgs),
    /// Remake the indexes without dead chunks: BM25 rebuilt from the document store, the vector
    /// index compacted (rebuilt when more than 20% of it is dead) (offline).
    Reindex(ingest::ReindexArgs),
    /// Remove tombstoned documents for good: rows, chunks, vectors, index entries (offline).
    Purge(ingest::PurgeArgs),
    /// Access control: apply an IAM snapshot.
    #[command(subcommand)]
    Acl(users::AclCommand),
    /// Users and their bearer tokens.
    #[command(subcommand)]
    User(users::UserCommand),
    /// Print audit log entries as JSON Lines; `audit export`: the SIEM export.
    Audit(audit::AuditCli),
    /// Answer receipts: verify a signed receipt off-box.
    #[command(subcommand)]
    Receipt(receipt::ReceiptCommand),
    /// Connectors of a running daemon (`[[connectors]]`): status, sync now (through its API).
    #[command(subcommand)]
    Connectors(connectors::ConnectorsCommand),
    /// Back up the data directory into one checksummed archive (online: the daemon may serve).
    Backup(backup::BackupArgs),
    /// Restore a data directory from a backup archive (every checksum verified first).
    Restore(backup::RestoreArgs),
    /// Internal: an extraction worker, started by the daemon and `airlock ingest`.
    #[command(hide = true)]
    Extract(crate::extraction_child::ChildArgs),
}

/// Parses the command line, runs it and maps the outcome to an exit code.
pub fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(c) => c,
        Err(e) => {
            let code = if e.use_stderr() { 2 } else { 0 };
            let _ = e.print();
            return ExitCode::from(code);
        }
    };
    match run(cli) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(1)
        }
    }
}

/// A command that writes what a serving daemon holds (users, tokens, sessions, grants,
/// documents, indexes, conversations): its data directory, what to use instead while the
/// daemon serves it, and whether it may create the lock file (`airlock_platform::data_lock`).
///
/// Every other command only reads the data directory (`user tokens list`, `audit`, `backup`,
/// `receipt`), writes what the daemon reads only at start (`install`, `rollback`, `keyring`:
/// restart it afterwards), appends one audit entry (`eval export`: the log is append-only and
/// the daemon keeps none of it in memory), works elsewhere (`keygen`, `bundle`, `eval run`'s
/// scratch directory), or asks the running daemon over its API (`connectors`).
pub fn writer(cmd: &Command) -> Option<(&std::path::Path, &'static str, bool)> {
    use users::{AclCommand, TokensCommand, UserCommand};
    const STOP: &str = "stop the daemon first (there is no HTTP route for this)";
    Some(match cmd {
        Command::Ingest(a) => (
            a.store.data.as_path(),
            "send the documents to `PUT /v1/documents/{doc_id}` (JSON or the raw file), or queue \
             a JSON Lines corpus in DATA/ingest-queue/ (docs/operations/ingest.md)",
            true,
        ),
        Command::Delete(a) => (
            a.store.data.as_path(),
            "use `DELETE /v1/documents/{doc_id}`",
            true,
        ),
        Command::Reconcile(a) => (a.store.data.as_path(), "use `POST /v1/reconcile`", true),
        Command::Purge(a) => (a.store.data.as_path(), "use `POST /v1/purge`", true),
        Command::Reindex(a) => (a.store.data.as_path(), STOP, true),
        Command::Acl(AclCommand::Sync(a)) if a.ldap => {
            (a.data.as_path(), "use `POST /v1/acl/sync/ldap`", true)
        }
        Command::Acl(AclCommand::Sync(a)) => (a.data.as_path(), "use `POST /v1/acl/sync`", true),
        Command::User(UserCommand::Add(a)) => (
            a.data.as_path(),
            "use `PUT /v1/acl/users/{user_id}`, then `POST /v1/acl/users/{user_id}/token`",
            true,
        ),
        Command::User(UserCommand::Token(a)) => (
            a.data.as_path(),
            "use `POST /v1/acl/users/{user_id}/token`",
            true,
        ),
        Command::User(UserCommand::Tokens(TokensCommand::Revoke(a))) => (
            a.data.as_path(),
            "use `DELETE /v1/acl/users/{user_id}/token` (and `DELETE \
             /v1/acl/users/{user_id}/sessions` to end sign-in sessions only)",
            true,
        ),
        Command::User(UserCommand::Remove(a)) => (
            a.data.as_path(),
            "use `DELETE /v1/acl/users/{user_id}`",
            true,
        ),
        Command::Restore(a) => (a.data.data.as_path(), STOP, false),
        Command::Demo(a) => (
            a.data.data.as_path(),
            "stop the daemon first, or set up the demo in another --data directory",
            true,
        ),
        _ => return None,
    })
}

/// Runs a parsed command. `Ok(false)` is a clean refusal (e.g. the eval gate): exit code 1.
pub fn run(cli: Cli) -> anyhow::Result<bool> {
    // One writer per data directory: refused at once while a daemon serves it.
    let _lock = match writer(&cli.command) {
        Some((data, instead, create)) => Some(airlock_platform::data_lock::DataLock::write(
            data, instead, create,
        )?),
        None => None,
    };
    match cli.command {
        Command::Keygen(args) => keys::keygen(args),
        Command::Keyring(cmd) => keys::keyring(cmd),
        Command::Bundle(cmd) => bundle::bundle(cmd),
        Command::Install(args) => bundle::install(args),
        Command::Rollback(args) => bundle::rollback(args),
        Command::Eval(cmd) => eval::run(cmd),
        Command::Demo(args) => demo::run(args),
        Command::Serve(args) => serve::run(*args).map(|()| true),
        Command::Ingest(args) => ingest::ingest(args),
        Command::Delete(args) => ingest::delete(args),
        Command::Reconcile(args) => ingest::reconcile(args),
        Command::Reindex(args) => ingest::reindex(args),
        Command::Purge(args) => ingest::purge(args),
        Command::Acl(cmd) => users::acl(cmd),
        Command::User(cmd) => users::user(cmd),
        Command::Audit(args) => audit::run(args),
        Command::Receipt(cmd) => receipt::run(cmd),
        Command::Connectors(cmd) => connectors::run(cmd),
        Command::Backup(args) => backup::run_backup(args),
        Command::Restore(args) => backup::run_restore(args),
        Command::Extract(args) => crate::extraction_child::run_child(args),
    }
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    #[test]
    fn the_command_tree_is_consistent() {
        super::Cli::command().debug_assert();
    }
}
