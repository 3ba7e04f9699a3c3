//! The appliance key: this box's own Ed25519 identity, created at install
//! (`airlock install`), kept as `DATA/keys/appliance.key` (mode 0600; the private half never
//! leaves the data directory) and `DATA/keys/appliance.pub` (what an auditor is given). It signs
//! what leaves the box: eval exports (`airlock eval export`) and answer receipts. It is not a
//! bundle-signing key and is never put in a keyring: a bundle signed with it is refused like any
//! other untrusted one.

use std::fs;
use std::path::{Path, PathBuf};

use airlock_platform::paths::DataDir;
use airlock_signing::KeyPair;

/// Why the appliance key could not be created or read.
#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    /// The data directory has no appliance key.
    #[error("{} does not exist: the appliance key is created by `airlock install`", .0.display())]
    Missing(PathBuf),
    /// Writing the key in place failed.
    #[error(transparent)]
    Io(#[from] std::io::Error),
    /// The key files could not be written or read.
    #[error(transparent)]
    Key(#[from] airlock_signing::Error),
}

/// File name stem in `DATA/keys/`.
pub const NAME: &str = "appliance";

/// `DATA/keys/appliance.key`.
pub fn private_path(data: &Path) -> PathBuf {
    DataDir::new(data).keys().join(format!("{NAME}.key"))
}

/// `DATA/keys/appliance.pub`.
pub fn public_path(data: &Path) -> PathBuf {
    DataDir::new(data).keys().join(format!("{NAME}.pub"))
}

/// The appliance key, created when the data directory has none. A crash while it is created
/// leaves either no key (a stray public half is replaced) or the whole pair: the pair is
/// written to a staging directory and renamed into place, the public half first.
pub fn ensure(data: &Path) -> Result<KeyPair, KeyError> {
    let private = private_path(data);
    if private.exists() {
        return load(data);
    }
    let keys = DataDir::new(data).keys();
    let staging = keys.join(".appliance-key.new");
    if staging.exists() {
        fs::remove_dir_all(&staging)?;
    }
    let public = public_path(data);
    if public.exists() {
        fs::remove_file(&public)?;
    }
    let pair = KeyPair::generate();
    let (new_private, new_public) = pair.write_files(&staging, NAME)?;
    fs::rename(&new_public, &public)?;
    fs::rename(&new_private, &private)?;
    fs::remove_dir(&staging)?;
    fs::File::open(&keys)?.sync_all()?;
    Ok(pair)
}

/// The existing appliance key (an error naming `airlock install` when there is none).
pub fn load(data: &Path) -> Result<KeyPair, KeyError> {
    let private = private_path(data);
    if !private.exists() {
        return Err(KeyError::Missing(private));
    }
    Ok(KeyPair::load(&private)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ensure_creates_once_and_then_loads_the_same_key() {
        let dir = tempfile::tempdir().unwrap();
        assert!(load(dir.path()).is_err());
        let a = ensure(dir.path()).unwrap();
        let b = ensure(dir.path()).unwrap();
        assert_eq!(a.key_id(), b.key_id());
        let public = airlock_signing::PublicKey::load(&public_path(dir.path())).unwrap();
        assert_eq!(public.key_id(), a.key_id());
        // A stray public half without its private key (a crash mid-creation) is replaced.
        let other = tempfile::tempdir().unwrap();
        fs::create_dir_all(other.path().join("keys")).unwrap();
        fs::write(public_path(other.path()), "stale").unwrap();
        let c = ensure(other.path()).unwrap();
        let public = airlock_signing::PublicKey::load(&public_path(other.path())).unwrap();
        assert_eq!(public.key_id(), c.key_id());
    }
}
