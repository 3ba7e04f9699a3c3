//! Format compatibility: the frozen v1 bundle made by this builder still verifies and installs.
//!
//! The fixture was made by `regenerate_v1_fixture` (ignored; run it only when adding a new
//! format version, never to "fix" this test): keys from seeds 1 and 2, threshold 2.

use std::path::PathBuf;

use airlock_bundle::{InstallOptions, Limits, NoProgress, Role, Store, build, verify_file};
use airlock_signing::Keyring;

use crate::common::*;

fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/v1")
}

#[test]
fn frozen_v1_bundle_still_verifies_and_installs() {
    let ring = Keyring::load(&fixtures().join("keyring.json")).unwrap();
    let bundle = fixtures().join("bundle.tar.zst");
    let v = verify_file(&bundle, &ring, &Limits::default(), &NoProgress).unwrap();
    assert_eq!(v.manifest.format, "airlock-bundle/v1");
    assert_eq!(v.manifest.name, "test-bundle");
    assert_eq!(v.manifest.version.to_string(), "1.0.0");
    assert_eq!(v.manifest.created, "2026-11-29T00:00:00Z");
    assert_eq!(v.signers, vec![key(1).key_id(), key(2).key_id()]);
    assert_eq!(v.manifest.files.len(), 4);
    let model = v.manifest.model_by_alias("airlock-embed").unwrap();
    assert_eq!((model.id.as_str(), model.role), ("embed", Role::Embedder));

    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    store
        .install(&bundle, &ring, &InstallOptions::default())
        .unwrap();
    let installed = store.verify_installed(&ring, &NoProgress).unwrap();
    assert_eq!(
        std::fs::read_to_string(installed.dir.join("README.txt")).unwrap(),
        "bundle fixture\n"
    );
}

#[test]
#[ignore = "writes the frozen fixture; run only when introducing a new format version"]
fn regenerate_v1_fixture() {
    let dir = tempfile::tempdir().unwrap();
    let src = source_tree(dir.path(), "fixture");
    std::fs::create_dir_all(fixtures()).unwrap();
    let (a, b) = (key(1), key(2));
    build(
        &src,
        &options("1.0.0"),
        &[&a, &b],
        &fixtures().join("bundle.tar.zst"),
        &NoProgress,
    )
    .unwrap();
    keyring(2, &[&a, &b])
        .save(&fixtures().join("keyring.json"))
        .unwrap();
}
