//! Bearer tokens: 32 random bytes from the thread-local CSPRNG (ChaCha seeded by the OS), shown
//! once as `alk_` + 64 hex digits, stored only as the SHA-256 of the whole token string.
//!
//! Authentication hashes the presented token and looks the digest up in a map. The lookup
//! compares digests, not tokens: timing can at most reveal how much of a *digest* matched, and
//! because SHA-256 is preimage-resistant that gives an attacker nothing to steer the next guess
//! with (the same argument as GitHub's and Django's hashed-token lookups). The stored side never
//! holds a usable secret, so a leaked database does not leak tokens.

use sha2::{Digest, Sha256};

/// Prefix of every token, so secret scanners and humans recognise one.
pub const TOKEN_PREFIX: &str = "alk_";

/// A fresh token and its digest.
pub(crate) fn generate() -> (String, [u8; 32]) {
    let mut raw = [0u8; 32];
    rand::fill(&mut raw[..]);
    let token = format!("{TOKEN_PREFIX}{}", hex::encode(raw));
    let d = digest(&token);
    (token, d)
}

/// SHA-256 of the token string.
pub(crate) fn digest(token: &str) -> [u8; 32] {
    Sha256::digest(token.as_bytes()).into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_random_and_hashed() {
        let (a, da) = generate();
        let (b, db) = generate();
        assert_ne!(a, b);
        assert_ne!(da, db);
        assert_eq!(a.len(), 4 + 64);
        assert!(a.starts_with(TOKEN_PREFIX));
        assert_eq!(digest(&a), da);
        assert_eq!(
            hex::encode(digest("abc")),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }
}
