//! Secrets kept in files (the directory's bind password, the OIDC client secret): read when
//! used, so rotating a file needs no restart, and refused when others may read them.

use std::path::Path;

/// Reads a secret file (the bind password, a client secret): the file must be readable by its
/// owner only; trailing line ends are dropped, and an empty secret is refused.
pub fn read_secret(path: &Path) -> Result<String, String> {
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::metadata(path).map_err(|e| format!("{}: {e}", path.display()))?;
    if meta.mode() & 0o077 != 0 {
        return Err(format!(
            "{} is readable by group or others (mode {:o}); chmod 600 it",
            path.display(),
            meta.mode() & 0o777
        ));
    }
    let s = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let s = s.trim_end_matches(['\r', '\n']).to_string();
    if s.is_empty() {
        return Err(format!("{} is empty", path.display()));
    }
    Ok(s)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn a_secret_is_private_and_not_empty() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("secret");
        std::fs::write(&p, "s3cret\n").unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert_eq!(read_secret(&p).unwrap(), "s3cret");
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o640)).unwrap();
        assert!(read_secret(&p).unwrap_err().contains("chmod 600"));
        std::fs::write(&p, "\n").unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert!(read_secret(&p).unwrap_err().ends_with("is empty"));
    }
}
