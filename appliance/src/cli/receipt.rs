//! `airlock receipt verify`: checks a receipt saved from `GET /v1/receipts/{id}` off-box against
//! the appliance's public key and prints it.

use std::path::PathBuf;

use airlock_evidence::receipts;
use anyhow::Context;

/// `airlock receipt …`.
#[derive(Debug, clap::Subcommand)]
pub enum ReceiptCommand {
    /// Verify a signed answer receipt (the body of `GET /v1/receipts/{id}`) and print it.
    Verify(VerifyArgs),
}

/// `airlock receipt verify`.
#[derive(Debug, clap::Args)]
pub struct VerifyArgs {
    /// The receipt file.
    pub file: PathBuf,
    /// The appliance's public key (`DATA/keys/appliance.pub` of the box that signed it).
    #[arg(long)]
    pub appliance_key: PathBuf,
}

/// Runs `airlock receipt …`.
pub fn run(cmd: ReceiptCommand) -> anyhow::Result<bool> {
    match cmd {
        ReceiptCommand::Verify(a) => verify(a),
    }
}

/// Prints the verified receipt (pretty JSON) on stdout; exit 1 with the reason when the file
/// does not verify.
fn verify(a: VerifyArgs) -> anyhow::Result<bool> {
    let key = airlock_signing::PublicKey::load(&a.appliance_key)?;
    let len = std::fs::metadata(&a.file)
        .with_context(|| format!("reading {}", a.file.display()))?
        .len();
    if len > receipts::MAX_RECEIPT_BYTES as u64 {
        eprintln!(
            "refused: {}",
            receipts::ReceiptError::TooLarge(len as usize)
        );
        return Ok(false);
    }
    let bytes = std::fs::read(&a.file).with_context(|| format!("reading {}", a.file.display()))?;
    match receipts::verify(&bytes, &key) {
        Ok(r) => {
            eprintln!(
                "verified: receipt {} signed by appliance key {}",
                r.receipt_id, r.appliance_id
            );
            println!("{}", serde_json::to_string_pretty(&r)?);
            Ok(true)
        }
        Err(e) => {
            eprintln!("refused: {e}");
            Ok(false)
        }
    }
}
