//! Build then verify: determinism, catalogue, binary, build-input refusals.

use std::fs;

use airlock_bundle::{Error, Limits, NoProgress, Role, build, verify_file};

use crate::common::*;

#[test]
fn build_then_verify_accepts_and_reports_the_manifest() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (key(1), key(2));
    let bundle = built(dir.path(), "1.2.3", &[&a, &b]);
    let v = verify_file(
        &bundle,
        &keyring(2, &[&a, &b]),
        &Limits::default(),
        &NoProgress,
    )
    .unwrap();
    assert_eq!(v.manifest.version.to_string(), "1.2.3");
    assert_eq!(v.signers.len(), 2);
    let paths: Vec<_> = v.manifest.files.iter().map(|f| f.path.as_str()).collect();
    assert_eq!(
        paths,
        [
            "README.txt",
            "catalogue.json",
            "models/embed/config.json",
            "models/embed/model.bin"
        ]
    );
    let model = v.manifest.model_by_alias("airlock-embed").unwrap();
    assert_eq!(model.role, Role::Embedder);
    assert_eq!(model.params["dim"], 384);
    let readme = v.manifest.file("README.txt").unwrap();
    assert_eq!(readme.sha256, sha(b"bundle 1.2.3\n"));
}

#[test]
fn builds_are_byte_identical_and_frame_header_is_canonical() {
    let dir = tempfile::tempdir().unwrap();
    let src = source_tree(dir.path(), "x");
    let k = key(1);
    let (one, two) = (
        dir.path().join("one.tar.zst"),
        dir.path().join("two.tar.zst"),
    );
    build(&src, &options("1.0.0"), &[&k], &one, &NoProgress).unwrap();
    // Different mtimes on disk must not matter.
    fs::write(src.join("README.txt"), "bundle x\n").unwrap();
    build(&src, &options("1.0.0"), &[&k], &two, &NoProgress).unwrap();
    let (a, b) = (fs::read(&one).unwrap(), fs::read(&two).unwrap());
    assert_eq!(a, b);
    // Magic, frame header descriptor (checksum flag only), window descriptor 2^23.
    assert_eq!(a[..6], [0x28, 0xB5, 0x2F, 0xFD, 0x04, 0x68]);
    // Entry order: manifest, signatures, then sorted payload.
    let mut archive = tar::Archive::new(zstd::stream::read::Decoder::new(&a[..]).unwrap());
    let names: Vec<String> = archive
        .entries()
        .unwrap()
        .map(|e| e.unwrap().path().unwrap().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names[..2], ["manifest.json", "manifest.sig.json"]);
    assert!(names[2..].is_sorted());
}

#[test]
fn binary_is_carried_with_its_digest() {
    let dir = tempfile::tempdir().unwrap();
    let src = source_tree(dir.path(), "b");
    let bin = write(dir.path(), "airlock-bin", b"\x7fELF fake binary");
    let mut o = options("1.0.0");
    o.binary = Some(bin);
    let out = dir.path().join("b.tar.zst");
    let k = key(1);
    let m = build(&src, &o, &[&k], &out, &NoProgress).unwrap();
    assert_eq!(
        m.binary.as_ref().unwrap().sha256,
        sha(b"\x7fELF fake binary")
    );
    verify_file(&out, &keyring(1, &[&k]), &Limits::default(), &NoProgress).unwrap();
}

#[test]
fn long_paths_survive_the_round_trip() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src");
    let deep = format!("{}/{}", "d".repeat(120), "f".repeat(120));
    fs::create_dir_all(src.join("d".repeat(120))).unwrap();
    fs::write(src.join(&deep), b"deep").unwrap();
    let out = dir.path().join("long.tar.zst");
    let k = key(1);
    build(&src, &options("1.0.0"), &[&k], &out, &NoProgress).unwrap();
    let v = verify_file(&out, &keyring(1, &[&k]), &Limits::default(), &NoProgress).unwrap();
    assert_eq!(v.manifest.files[0].path, deep);
}

#[test]
fn symlinks_in_the_source_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let src = source_tree(dir.path(), "s");
    std::os::unix::fs::symlink("/etc/passwd", src.join("models/link")).unwrap();
    let err = build(
        &src,
        &options("1.0.0"),
        &[&key(1)],
        &dir.path().join("o.tar.zst"),
        &NoProgress,
    )
    .unwrap_err();
    assert!(
        matches!(&err, Error::BuildInput { reason, .. } if reason.contains("symlink")),
        "{err}"
    );
    assert!(!dir.path().join("o.tar.zst").exists());
}

#[test]
fn a_catalogue_naming_a_missing_file_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let src = source_tree(dir.path(), "c");
    fs::write(
        src.join("catalogue.json"),
        r#"[{"id":"g","role":"generator","alias":"airlock-large","files":["models/missing.gguf"],"params":{}}]"#,
    )
    .unwrap();
    let err = build(
        &src,
        &options("1.0.0"),
        &[&key(1)],
        &dir.path().join("o.tar.zst"),
        &NoProgress,
    )
    .unwrap_err();
    assert!(err.to_string().contains("models/missing.gguf"), "{err}");
    fs::write(
        src.join("catalogue.json"),
        r#"[{"id":"g","role":"painter","alias":"a","files":[]}]"#,
    )
    .unwrap();
    let err = build(
        &src,
        &options("1.0.0"),
        &[&key(1)],
        &dir.path().join("o.tar.zst"),
        &NoProgress,
    )
    .unwrap_err();
    assert!(err.to_string().contains("not a model catalogue"), "{err}");
}

#[test]
fn the_builder_refuses_what_the_verifier_would_refuse() {
    let dir = tempfile::tempdir().unwrap();
    let src = source_tree(dir.path(), "l");
    let mut o = options("1.0.0");
    o.limits = Limits {
        max_file_size: 100,
        ..Limits::default()
    };
    let err = build(
        &src,
        &o,
        &[&key(1)],
        &dir.path().join("o.tar.zst"),
        &NoProgress,
    )
    .unwrap_err();
    assert!(err.to_string().contains("per-file limit"), "{err}");
}
