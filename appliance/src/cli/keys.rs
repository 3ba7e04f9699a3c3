//! `airlock keygen` and `airlock keyring init|add|revoke|sign|rotate|show`: signing keys and the
//! appliance's root of trust (`<data>/keys/trusted.json`).
//!
//! Edits (`add`, `revoke`) work on a keyring *file* (a draft, usually on the offline signing
//! machine). The pinned keyring of an installed appliance changes only through `rotate`, which
//! accepts a new keyring signed by a threshold of the pinned one (`sign` makes that file).

use std::path::{Path, PathBuf};

use airlock_signing::{KeyId, KeyPair, Keyring, PublicKey, SignedKeyring};
use anyhow::{Context, bail};
use clap::{Args, Subcommand};

use super::DataArgs;

/// The pinned keyring of a data directory.
pub fn pinned_keyring(data: &Path) -> PathBuf {
    airlock_platform::paths::DataDir::new(data).pinned_keyring()
}

/// `--keyring FILE`, defaulting to the data directory's pinned keyring.
#[derive(Debug, Clone, Args)]
pub struct KeyringArgs {
    /// Keyring to check signatures against (default: DATA/keys/trusted.json). Once DATA has a
    /// pinned keyring, install, rollback, verify-installed and rotate use it only and refuse
    /// another FILE.
    #[arg(long, value_name = "FILE")]
    pub keyring: Option<PathBuf>,
}

impl KeyringArgs {
    /// The keyring path to use.
    pub fn path(&self, data: &DataArgs) -> PathBuf {
        self.keyring
            .clone()
            .unwrap_or_else(|| pinned_keyring(&data.data))
    }

    /// The data directory's root of trust, for commands that change or vouch for what it runs
    /// (`install`, `rollback`, `bundle verify-installed`, `keyring rotate`). Once the data
    /// directory has a pinned keyring, that keyring is the only one: `--keyring FILE` is
    /// refused unless FILE is the pinned keyring itself (trust changes only through `airlock
    /// keyring rotate`). Without a pinned keyring, `--keyring FILE` is used as given.
    pub fn trusted(&self, data: &DataArgs) -> anyhow::Result<Keyring> {
        let pinned = pinned_keyring(&data.data);
        if let Some(given) = &self.keyring
            && pinned.exists()
            && !same_file(given, &pinned)
        {
            bail!(
                "--keyring {} refused: {} has a pinned keyring ({}), the only one its bundles are                  checked against; drop --keyring (trust changes only through `airlock keyring                  rotate`)",
                given.display(),
                data.data.display(),
                pinned.display()
            );
        }
        self.load(data)
    }

    /// Loads the keyring (with a hint when the pinned one is missing). Any `--keyring FILE` is
    /// accepted: use this only for checks that change nothing and vouch for nothing installed
    /// (`bundle verify`, `keyring show`); see [`KeyringArgs::trusted`].
    pub fn load(&self, data: &DataArgs) -> anyhow::Result<Keyring> {
        let path = self.path(data);
        if self.keyring.is_none() && !path.exists() {
            bail!(
                "no pinned keyring at {} (run `airlock keyring init` or pass --keyring FILE)",
                path.display()
            );
        }
        Ok(Keyring::load(&path)?)
    }
}

/// Whether `a` and `b` name the same existing file (after resolving links and `..`).
pub fn same_file(a: &Path, b: &Path) -> bool {
    match (a.canonicalize(), b.canonicalize()) {
        (Ok(a), Ok(b)) => a == b,
        _ => false,
    }
}

/// `airlock keygen`.
#[derive(Debug, Args)]
pub struct KeygenArgs {
    /// Directory for NAME.key (private, mode 0600) and NAME.pub.
    #[arg(long, value_name = "DIR")]
    pub out: PathBuf,
    /// Base name of the key files.
    #[arg(long, default_value = "signing")]
    pub name: String,
}

/// `airlock keyring ...`.
#[derive(Debug, Subcommand)]
pub enum KeyringCommand {
    /// Create a keyring (version 1). Without --out, pins it as DATA/keys/trusted.json.
    Init {
        /// Public key files (NAME.pub) to trust.
        #[arg(long = "key", value_name = "PUB", required = true)]
        keys: Vec<PathBuf>,
        /// Signatures required (k of the trusted keys).
        #[arg(long, default_value_t = 1)]
        threshold: u32,
        /// Write here instead of pinning in the data directory.
        #[arg(long, value_name = "FILE")]
        out: Option<PathBuf>,
        /// The data directory.
        #[command(flatten)]
        data: DataArgs,
    },
    /// Trust another public key in a keyring file (bumps its version).
    Add {
        /// The keyring file to edit.
        file: PathBuf,
        /// Public key file (NAME.pub).
        #[arg(long = "key", value_name = "PUB")]
        key: PathBuf,
        /// Also set the threshold.
        #[arg(long)]
        threshold: Option<u32>,
    },
    /// Revoke a key in a keyring file (bumps its version); its signatures stop counting.
    Revoke {
        /// The keyring file to edit.
        file: PathBuf,
        /// Key id to revoke (32 hex digits, as printed by keygen).
        #[arg(long = "key-id", value_name = "ID")]
        key_id: String,
        /// Also set the threshold.
        #[arg(long)]
        threshold: Option<u32>,
    },
    /// Sign a new keyring with keys of the current one, for `rotate`.
    Sign {
        /// The new keyring file.
        file: PathBuf,
        /// Private key files of the CURRENT keyring (a threshold of them).
        #[arg(long = "sign", value_name = "KEY", required = true)]
        sign: Vec<PathBuf>,
        /// Where to write the signed keyring.
        #[arg(long, value_name = "FILE")]
        out: PathBuf,
    },
    /// Replace the pinned keyring with a signed new one (threshold of the pinned keys, higher
    /// version).
    Rotate {
        /// The signed keyring made by `airlock keyring sign`.
        signed: PathBuf,
        /// The data directory.
        #[command(flatten)]
        data: DataArgs,
        /// Keyring to check signatures against.
        #[command(flatten)]
        keyring: KeyringArgs,
    },
    /// Print a keyring.
    Show {
        /// The data directory.
        #[command(flatten)]
        data: DataArgs,
        /// Keyring to check signatures against.
        #[command(flatten)]
        keyring: KeyringArgs,
    },
}

/// Runs `airlock keygen`.
pub fn keygen(args: KeygenArgs) -> anyhow::Result<bool> {
    let pair = KeyPair::generate();
    let (private, public) = pair.write_files(&args.out, &args.name)?;
    println!("key id  {}", pair.key_id());
    println!("private {} (mode 0600; keep it offline)", private.display());
    println!("public  {}", public.display());
    Ok(true)
}

fn load_publics(paths: &[PathBuf]) -> anyhow::Result<Vec<PublicKey>> {
    paths.iter().map(|p| Ok(PublicKey::load(p)?)).collect()
}

fn print_keyring(ring: &Keyring, path: &Path) {
    println!(
        "keyring {} (version {}, threshold {})",
        path.display(),
        ring.version(),
        ring.threshold()
    );
    for k in ring.keys() {
        println!("  trusted {}", k.key_id);
    }
    for id in ring.revoked() {
        println!("  revoked {id}");
    }
}

/// Runs `airlock keyring ...`.
pub fn keyring(cmd: KeyringCommand) -> anyhow::Result<bool> {
    match cmd {
        KeyringCommand::Init {
            keys,
            threshold,
            out,
            data,
        } => {
            let ring = Keyring::new(threshold, &load_publics(&keys)?)?;
            let path = out.unwrap_or_else(|| pinned_keyring(&data.data));
            if path.exists() {
                bail!(
                    "{} already exists; change a pinned keyring with `airlock keyring rotate`",
                    path.display()
                );
            }
            ring.save(&path)?;
            print_keyring(&ring, &path);
        }
        KeyringCommand::Add {
            file,
            key,
            threshold,
        } => {
            let mut ring = Keyring::load(&file)?;
            ring.add_key(PublicKey::load(&key)?)?;
            if let Some(k) = threshold {
                ring.set_threshold(k)?;
            }
            ring.save(&file)?;
            print_keyring(&ring, &file);
        }
        KeyringCommand::Revoke {
            file,
            key_id,
            threshold,
        } => {
            let mut ring = Keyring::load(&file)?;
            let id = KeyId::parse(&key_id)?;
            if let Some(k) = threshold {
                ring.set_threshold(k)?;
            }
            ring.revoke(&id)?;
            ring.save(&file)?;
            print_keyring(&ring, &file);
        }
        KeyringCommand::Sign { file, sign, out } => {
            let next = Keyring::load(&file)?;
            let keys = sign
                .iter()
                .map(|p| Ok(KeyPair::load(p)?))
                .collect::<anyhow::Result<Vec<_>>>()?;
            let refs: Vec<&KeyPair> = keys.iter().collect();
            SignedKeyring::sign(&next, &refs).save(&out)?;
            println!(
                "signed keyring version {} with {} key(s): {}",
                next.version(),
                refs.len(),
                out.display()
            );
        }
        KeyringCommand::Rotate {
            signed,
            data,
            keyring,
        } => {
            let path = keyring.path(&data);
            let current = keyring.trusted(&data)?;
            let next = SignedKeyring::load(&signed)?
                .accept(&current)
                .with_context(|| format!("refused rotation {}", signed.display()))?;
            next.save(&path)?;
            println!(
                "keyring rotated: version {} -> {}",
                current.version(),
                next.version()
            );
            print_keyring(&next, &path);
        }
        KeyringCommand::Show { data, keyring } => {
            let ring = keyring.load(&data)?;
            print_keyring(&ring, &keyring.path(&data));
        }
    }
    Ok(true)
}
