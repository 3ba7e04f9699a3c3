//! Any single-byte change anywhere in a valid bundle is refused.

use airlock_bundle::{Limits, NoProgress, verify_file};
use proptest::prelude::*;

use crate::common::*;

fn small_bundle() -> (tempfile::TempDir, Vec<u8>) {
    let dir = tempfile::tempdir().unwrap();
    let path = built(dir.path(), "1.0.0", &[&key(1)]);
    let bytes = std::fs::read(path).unwrap();
    (dir, bytes)
}

fn refused(dir: &std::path::Path, bytes: &[u8]) -> bool {
    let p = write(dir, "flipped.tar.zst", bytes);
    verify_file(&p, &keyring(1, &[&key(1)]), &Limits::default(), &NoProgress).is_err()
}

#[test]
fn every_position_with_every_single_bit_flip_is_refused() {
    let (dir, bytes) = small_bundle();
    assert!(
        !refused(dir.path(), &bytes),
        "the unmodified bundle verifies"
    );
    let mut accepted = Vec::new();
    for i in 0..bytes.len() {
        for bit in 0..8 {
            let mut b = bytes.clone();
            b[i] ^= 1 << bit;
            if !refused(dir.path(), &b) {
                accepted.push((i, bit));
            }
        }
    }
    assert!(
        accepted.is_empty(),
        "{} of {} flips accepted: {:?}",
        accepted.len(),
        bytes.len() * 8,
        &accepted[..accepted.len().min(20)]
    );
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]
    #[test]
    fn any_single_byte_change_is_refused(pos in any::<prop::sample::Index>(), xor in 1u8..=255) {
        let (dir, mut bytes) = small_bundle();
        let i = pos.index(bytes.len());
        bytes[i] ^= xor;
        prop_assert!(refused(dir.path(), &bytes), "byte {} ^ {:#04x} accepted", i, xor);
    }
}
