//! The `airlock` command line. Each command group lives in its own module; this file only
//! declares the tree and maps results to exit codes (0 ok, 1 failure, 2 usage).

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

pub mod eval;

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
    /// Golden-set evaluation and the release gate.
    #[command(subcommand)]
    Eval(eval::EvalCommand),
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

/// Runs a parsed command. `Ok(false)` is a clean refusal (e.g. the eval gate): exit code 1.
pub fn run(cli: Cli) -> anyhow::Result<bool> {
    match cli.command {
        Command::Eval(cmd) => eval::run(cmd),
    }
}
