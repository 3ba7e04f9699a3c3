//! The install store: install, floor, no-op reinstall, rollback, verify-installed, cleanup,
//! locking, and interrupted installs (a panic at each stage stands in for a crash here; the
//! CLI tests kill a real process with SIGKILL).

use std::fs;
use std::panic::{AssertUnwindSafe, catch_unwind};

use airlock_bundle::{
    Error, InstallOptions, InstallOutcome, InstallStage, NoProgress, Refusal, Store,
};

use crate::common::*;

#[test]
fn install_extracts_verified_files_and_records_state() {
    let inst = installed_v1();
    let cur = inst.store.current().unwrap().unwrap();
    assert_eq!(cur.version.to_string(), "1.0.0");
    assert_eq!(
        fs::read_to_string(cur.dir.join("README.txt")).unwrap(),
        "bundle 1.0.0\n"
    );
    assert!(cur.dir.join("manifest.json").is_file() && cur.dir.join("manifest.sig.json").is_file());
    assert_eq!(
        cur.manifest
            .model_by_alias("airlock-embed")
            .unwrap()
            .files
            .len(),
        2
    );
    let state = inst.store.state().unwrap();
    assert_eq!(state.current, Some("1.0.0".parse().unwrap()));
    assert_eq!(state.previous, None);
    assert_eq!(state.highest_installed, Some("1.0.0".parse().unwrap()));
    assert_eq!(state.history.len(), 1);
    inst.store
        .verify_installed(&inst.keyring, &NoProgress)
        .unwrap();
}

#[test]
fn upgrade_rollback_and_floor() {
    let inst = installed_v1();
    let k = key(1);
    let v2 = built(inst.dir.path(), "2.0.0", &[&k]);
    let out = inst
        .store
        .install(&v2, &inst.keyring, &InstallOptions::default())
        .unwrap();
    assert!(
        matches!(&out, InstallOutcome::Installed { version, previous: Some(p), .. }
        if version.to_string() == "2.0.0" && p.to_string() == "1.0.0")
    );

    let (from, to) = inst.store.rollback(&inst.keyring).unwrap();
    assert_eq!(
        (from.unwrap().to_string(), to.to_string()),
        ("2.0.0".into(), "1.0.0".into())
    );
    let state = inst.store.state().unwrap();
    assert_eq!(state.current.as_ref().unwrap().to_string(), "1.0.0");
    assert_eq!(state.previous.as_ref().unwrap().to_string(), "2.0.0");
    assert_eq!(
        state.highest_installed.as_ref().unwrap().to_string(),
        "2.0.0",
        "rollback keeps the floor"
    );
    assert_eq!(state.history.last().unwrap().action, "rollback");
    inst.store
        .verify_installed(&inst.keyring, &NoProgress)
        .unwrap();

    // The floor still refuses anything not above 2.0.0, even though 1.0.0 is current.
    let v15 = built(inst.dir.path(), "1.5.0", &[&k]);
    let r = refusal(
        inst.store
            .install(&v15, &inst.keyring, &InstallOptions::default()),
    );
    assert!(matches!(r, Refusal::Downgrade { .. }), "{r}");

    // Rolling back again returns to 2.0.0; then 3.0.0 installs and 1.0.0 is cleaned up.
    inst.store.rollback(&inst.keyring).unwrap();
    let v3 = built(inst.dir.path(), "3.0.0", &[&k]);
    inst.store
        .install(&v3, &inst.keyring, &InstallOptions::default())
        .unwrap();
    let (state, listed) = inst.store.list().unwrap();
    let versions: Vec<String> = listed.iter().map(|b| b.version.to_string()).collect();
    assert_eq!(versions, ["2.0.0", "3.0.0"]);
    assert!(listed[1].is_current && listed[0].is_previous);
    assert_eq!(state.history.len(), 5);
}

#[test]
fn reinstalling_the_current_bundle_is_a_no_op() {
    let inst = installed_v1();
    let before = inst.store.state().unwrap();
    let again = inst.dir.path().join("bundle-1.0.0.tar.zst");
    let out = inst
        .store
        .install(&again, &inst.keyring, &InstallOptions::default())
        .unwrap();
    assert!(matches!(out, InstallOutcome::AlreadyCurrent { .. }));
    assert_eq!(inst.store.state().unwrap(), before);
}

#[test]
fn reinstalling_a_corrupted_copy_of_the_current_bundle_is_refused() {
    // Issue 19 F9: the "nothing to do" answer came after the manifest alone, so a copy with a
    // flipped byte in a model file was accepted as the current bundle.
    let inst = installed_v1();
    let before = fs::read(inst.store.root().join("state.json")).unwrap();
    let original = inst.dir.path().join("bundle-1.0.0.tar.zst");
    let bad = write(
        inst.dir.path(),
        "corrupted-1.0.0.tar.zst",
        &flip_in_payload(&original, b"weights 1.0.0"),
    );
    let err = inst
        .store
        .install(&bad, &inst.keyring, &InstallOptions::default())
        .unwrap_err();
    let line = err.to_string();
    assert!(line.contains("corrupted-1.0.0.tar.zst"), "{line}");
    let r = refusal(Err::<(), _>(err));
    assert!(
        matches!(&r, Refusal::DigestMismatch { path } if path == "models/embed/model.bin"),
        "{r}"
    );
    assert_eq!(
        fs::read(inst.store.root().join("state.json")).unwrap(),
        before
    );
    inst.store
        .verify_installed(&inst.keyring, &NoProgress)
        .unwrap();
    // The intact copy is still a no-op.
    let out = inst
        .store
        .install(&original, &inst.keyring, &InstallOptions::default())
        .unwrap();
    assert!(matches!(out, InstallOutcome::AlreadyCurrent { .. }));
    assert_eq!(
        fs::read(inst.store.root().join("state.json")).unwrap(),
        before
    );
}

#[test]
fn rollback_without_previous_is_an_error() {
    let inst = installed_v1();
    let err = inst.store.rollback(&inst.keyring).unwrap_err();
    assert!(
        matches!(&err, Error::Store { reason, .. } if reason.contains("no previous")),
        "{err}"
    );
}

#[test]
fn rollback_refuses_a_previous_signed_by_a_now_revoked_key() {
    let inst = installed_v1();
    let (a, b) = (key(1), key(2));
    let ring = keyring(1, &[&a, &b]);
    let v2 = built(inst.dir.path(), "2.0.0", &[&b]);
    inst.store
        .install(&v2, &ring, &InstallOptions::default())
        .unwrap();
    let mut rotated = ring.clone();
    rotated.revoke(&a.key_id()).unwrap();
    let r = refusal(inst.store.rollback(&rotated));
    assert!(
        matches!(&r, Refusal::Signature { reason } if reason.contains("revoked")),
        "{r}"
    );
    assert_eq!(
        inst.store.current().unwrap().unwrap().version.to_string(),
        "2.0.0"
    );
}

#[test]
fn verify_installed_detects_tampering() {
    let inst = installed_v1();
    let dir = inst.store.current().unwrap().unwrap().dir;
    let readme = dir.join("README.txt");

    fs::write(&readme, "bundle 1.0.1\n").unwrap();
    let r = refusal(inst.store.verify_installed(&inst.keyring, &NoProgress));
    assert!(
        matches!(&r, Refusal::DigestMismatch { path } if path == "README.txt"),
        "{r}"
    );

    fs::write(&readme, "bundle 1.0.0 and more\n").unwrap();
    let r = refusal(inst.store.verify_installed(&inst.keyring, &NoProgress));
    assert!(matches!(r, Refusal::SizeMismatch { .. }), "{r}");

    fs::write(&readme, "bundle 1.0.0\n").unwrap();
    fs::write(dir.join("planted.so"), "x").unwrap();
    let r = refusal(inst.store.verify_installed(&inst.keyring, &NoProgress));
    assert!(
        matches!(&r, Refusal::Unexpected { path } if path == "planted.so"),
        "{r}"
    );
    fs::remove_file(dir.join("planted.so")).unwrap();

    fs::remove_file(&readme).unwrap();
    std::os::unix::fs::symlink("/etc/hostname", &readme).unwrap();
    let r = refusal(inst.store.verify_installed(&inst.keyring, &NoProgress));
    assert!(matches!(r, Refusal::EntryType { .. }), "{r}");
    fs::remove_file(&readme).unwrap();
    let r = refusal(inst.store.verify_installed(&inst.keyring, &NoProgress));
    assert!(
        matches!(&r, Refusal::Missing { path } if path == "README.txt"),
        "{r}"
    );

    let other = keyring(1, &[&key(7)]);
    fs::write(&readme, "bundle 1.0.0\n").unwrap();
    inst.store
        .verify_installed(&inst.keyring, &NoProgress)
        .unwrap();
    let r = refusal(inst.store.verify_installed(&other, &NoProgress));
    assert!(matches!(r, Refusal::Signature { .. }), "{r}");
}

#[test]
fn a_second_writer_is_locked_out() {
    let inst = installed_v1();
    let lock = fs::OpenOptions::new()
        .write(true)
        .open(inst.store.root().join(".lock"))
        .unwrap();
    lock.lock().unwrap();
    let v2 = built(inst.dir.path(), "2.0.0", &[&key(1)]);
    let err = inst
        .store
        .install(&v2, &inst.keyring, &InstallOptions::default())
        .unwrap_err();
    assert!(matches!(err, Error::Locked { .. }), "{err}");
    drop(lock);
    inst.store
        .install(&v2, &inst.keyring, &InstallOptions::default())
        .unwrap();
}

#[test]
fn an_install_interrupted_at_any_stage_leaves_a_usable_store() {
    for stage in InstallStage::ALL {
        let inst = installed_v1();
        let v2 = built(inst.dir.path(), "2.0.0", &[&key(1)]);
        let stop = move |s: InstallStage| {
            if s == stage {
                panic!("interrupted at {}", s.name());
            }
        };
        let options = InstallOptions {
            progress: &NoProgress,
            on_stage: &stop,
        };
        let crashed = catch_unwind(AssertUnwindSafe(|| {
            inst.store.install(&v2, &inst.keyring, &options)
        }));
        assert!(crashed.is_err(), "{stage:?} was reached");

        // Whatever the stage, the current version verifies and loads.
        let current = inst
            .store
            .verify_installed(&inst.keyring, &NoProgress)
            .unwrap();
        let expect = if stage == InstallStage::Switched {
            "2.0.0"
        } else {
            "1.0.0"
        };
        assert_eq!(current.version.to_string(), expect, "{stage:?}");
        assert!(current.dir.join("README.txt").is_file());

        // The next install cleans up and completes.
        let again = Store::open(&inst.dir.path().join("data")).unwrap();
        let out = again
            .install(&v2, &inst.keyring, &InstallOptions::default())
            .unwrap();
        if stage == InstallStage::Switched {
            assert!(matches!(out, InstallOutcome::AlreadyCurrent { .. }));
        } else {
            assert!(
                matches!(out, InstallOutcome::Installed { .. }),
                "{stage:?}: {out:?}"
            );
        }
        let names: Vec<String> = fs::read_dir(again.root())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert!(
            !names
                .iter()
                .any(|n| n.starts_with(".staging") || n.ends_with(".tmp")),
            "{stage:?}: {names:?}"
        );
        again.verify_installed(&inst.keyring, &NoProgress).unwrap();
    }
}

#[test]
fn a_corrupt_state_file_is_an_error_not_a_reset() {
    let inst = installed_v1();
    fs::write(inst.store.root().join("state.json"), "{not json").unwrap();
    let err = inst.store.state().unwrap_err();
    assert!(matches!(err, Error::Store { .. }), "{err}");
    let v2 = built(inst.dir.path(), "2.0.0", &[&key(1)]);
    assert!(
        inst.store
            .install(&v2, &inst.keyring, &InstallOptions::default())
            .is_err()
    );
}
