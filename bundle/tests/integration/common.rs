//! Shared helpers: deterministic keys, source trees, and a crafting kit for hostile bundles.

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};

use airlock_bundle::{
    BuildOptions, Error, FileEntry, InstallOptions, Limits, MANIFEST_FORMAT, Manifest, ModelEntry,
    NoProgress, PayloadFrame, Refusal, Role, Store, build, format, verify_file,
};
use airlock_signing::{KeyPair, Keyring, Purpose, SignatureEnvelope};
use semver::Version;
use sha2::{Digest, Sha256};

pub fn key(i: u8) -> KeyPair {
    KeyPair::from_seed([i; 32])
}

pub fn keyring(threshold: u32, keys: &[&KeyPair]) -> Keyring {
    Keyring::new(
        threshold,
        &keys.iter().map(|k| k.public()).collect::<Vec<_>>(),
    )
    .unwrap()
}

pub fn sha(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// A source directory with nested files and a model catalogue.
pub fn source_tree(dir: &Path, salt: &str) -> PathBuf {
    let src = dir.join(format!("src-{salt}"));
    fs::create_dir_all(src.join("models/embed")).unwrap();
    fs::write(
        src.join("models/embed/model.bin"),
        format!("weights {salt}").repeat(100),
    )
    .unwrap();
    fs::write(src.join("models/embed/config.json"), "{\"dim\": 384}").unwrap();
    fs::write(src.join("README.txt"), format!("bundle {salt}\n")).unwrap();
    fs::write(
        src.join("catalogue.json"),
        r#"[{"id":"embed","role":"embedder","alias":"airlock-embed","files":["models/embed/model.bin","models/embed/config.json"],"params":{"dim":384}}]"#,
    )
    .unwrap();
    src
}

/// 2026-11-29T00:00:00Z.
pub const CREATED: i64 = 1_795_910_400;

pub fn options(version: &str) -> BuildOptions {
    let mut o = BuildOptions::new("test-bundle", Version::parse(version).unwrap());
    o.created = time::OffsetDateTime::from_unix_timestamp(CREATED).unwrap();
    o
}

/// Builds a bundle of `source_tree(dir, version)` signed by `signers`.
pub fn built(dir: &Path, version: &str, signers: &[&KeyPair]) -> PathBuf {
    let src = source_tree(dir, version);
    let out = dir.join(format!("bundle-{version}.tar.zst"));
    build(&src, &options(version), signers, &out, &NoProgress).unwrap();
    out
}

/// One raw tar entry for crafted archives.
pub struct Raw {
    pub name: Vec<u8>,
    pub kind: tar::EntryType,
    pub data: Vec<u8>,
    /// Header size field, when it should differ from `data.len()`.
    pub size: Option<u64>,
    pub link: Option<Vec<u8>>,
}

impl Raw {
    pub fn file(name: &str, data: &[u8]) -> Raw {
        Raw {
            name: name.as_bytes().to_vec(),
            kind: tar::EntryType::Regular,
            data: data.to_vec(),
            size: None,
            link: None,
        }
    }
    pub fn kind(name: &str, kind: tar::EntryType, link: Option<&str>) -> Raw {
        Raw {
            name: name.as_bytes().to_vec(),
            kind,
            data: Vec::new(),
            size: None,
            link: link.map(|l| l.as_bytes().to_vec()),
        }
    }
}

/// The tar bytes of `entries` with raw headers (no path sanitising), without end blocks.
pub fn raw_entries(entries: &[Raw]) -> Vec<u8> {
    let mut out = Vec::new();
    for e in entries {
        let mut h = tar::Header::new_gnu();
        {
            let gnu = h.as_gnu_mut().unwrap();
            gnu.name[..e.name.len()].copy_from_slice(&e.name);
            if let Some(link) = &e.link {
                gnu.linkname[..link.len()].copy_from_slice(link);
            }
        }
        h.set_entry_type(e.kind);
        h.set_size(e.size.unwrap_or(e.data.len() as u64));
        h.set_mode(0o644);
        h.set_mtime(0);
        h.set_cksum();
        out.extend_from_slice(h.as_bytes());
        out.extend_from_slice(&e.data);
        out.resize(out.len().div_ceil(512) * 512, 0);
    }
    out
}

/// `raw_entries` plus the end-of-archive blocks.
pub fn raw_tar(entries: &[Raw]) -> Vec<u8> {
    let mut out = raw_entries(entries);
    out.extend_from_slice(&[0u8; 1024]);
    out
}

/// Compresses like the builder (checksum, fixed window), so only the tar content is hostile.
pub fn zstd(tar: &[u8]) -> Vec<u8> {
    let mut enc = zstd::stream::write::Encoder::new(Vec::new(), 3).unwrap();
    enc.include_checksum(true).unwrap();
    enc.window_log(format::WINDOW_LOG).unwrap();
    enc.write_all(tar).unwrap();
    enc.finish().unwrap()
}

/// A payload frame holding `entries` and the end-of-archive blocks.
pub fn payload_frame(entries: &[Raw]) -> Vec<u8> {
    zstd(&raw_tar(entries))
}

pub fn manifest(version: &str, files: &[(&str, &[u8])]) -> Manifest {
    let mut files: Vec<FileEntry> = files
        .iter()
        .map(|(p, d)| FileEntry {
            path: (*p).into(),
            size: d.len() as u64,
            sha256: sha(d),
        })
        .collect();
    files.sort_by(|a, b| a.path.cmp(&b.path));
    Manifest {
        format: MANIFEST_FORMAT.into(),
        name: "crafted".into(),
        version: Version::parse(version).unwrap(),
        created: "2026-11-29T00:00:00Z".into(),
        min_previous_version: None,
        files,
        models: Vec::<ModelEntry>::new(),
        binary: None,
        payload_frame: PayloadFrame {
            size: 0,
            sha256: "0".repeat(64),
        },
    }
}

/// The manifest bytes of `m`, pinned to `payload` (an honest signer's manifest).
pub fn pin(mut m: Manifest, payload: &[u8]) -> Vec<u8> {
    m.payload_frame = PayloadFrame {
        size: payload.len() as u64,
        sha256: sha(payload),
    };
    m.to_json()
}

pub fn sign(manifest_bytes: &[u8], signers: &[&KeyPair]) -> Vec<u8> {
    SignatureEnvelope::new(
        signers
            .iter()
            .map(|k| k.sign(Purpose::Manifest, manifest_bytes))
            .collect(),
    )
    .to_json()
}

/// A bundle file: a metadata frame of `meta` entries, then `payload` as is.
pub fn assemble(meta: &[Raw], payload: &[u8]) -> Vec<u8> {
    let mut out = format::metadata_frame(&raw_entries(meta));
    out.extend_from_slice(payload);
    out
}

/// A bundle of manifest `m` (pinned to the payload, signed by `signers`) and `payload` entries.
pub fn from_manifest(m: Manifest, signers: &[&KeyPair], payload: &[Raw]) -> Vec<u8> {
    let payload = payload_frame(payload);
    let m = pin(m, &payload);
    let s = sign(&m, signers);
    assemble(
        &[
            Raw::file("manifest.json", &m),
            Raw::file("manifest.sig.json", &s),
        ],
        &payload,
    )
}

/// A crafted bundle: signed metadata for `declared` files, then the given payload entries.
pub fn crafted(
    version: &str,
    declared: &[(&str, &[u8])],
    signers: &[&KeyPair],
    payload: Vec<Raw>,
) -> Vec<u8> {
    from_manifest(manifest(version, declared), signers, &payload)
}

pub fn write(dir: &Path, name: &str, bytes: &[u8]) -> PathBuf {
    let p = dir.join(name);
    fs::write(&p, bytes).unwrap();
    p
}

pub fn refusal(result: Result<impl std::fmt::Debug, Error>) -> Refusal {
    match result {
        Err(Error::Refused { refusal, .. }) => refusal,
        other => panic!("expected a refusal, got {other:?}"),
    }
}

/// A data dir with version 1.0.0 installed and current.
pub struct Installed {
    pub dir: tempfile::TempDir,
    pub store: Store,
    pub keyring: Keyring,
}

pub fn installed_v1() -> Installed {
    let dir = tempfile::tempdir().unwrap();
    let k = key(1);
    let keyring = keyring(1, &[&k]);
    let bundle = built(dir.path(), "1.0.0", &[&k]);
    let store = Store::open(&dir.path().join("data")).unwrap();
    store
        .install(&bundle, &keyring, &InstallOptions::default())
        .unwrap();
    Installed {
        dir,
        store,
        keyring,
    }
}

/// Asserts `bytes` are refused by both `verify_file` and `Store::install` (with `limits` and
/// `keyring`), that the refusal satisfies `expect`, and that the installed 1.0.0 is untouched.
pub fn assert_refused(
    bytes: &[u8],
    keyring: Option<&Keyring>,
    limits: Limits,
    expect: impl Fn(&Refusal) -> bool,
) -> Refusal {
    let inst = installed_v1();
    let hostile_store = Store::open(&inst.dir.path().join("data"))
        .unwrap()
        .with_limits(limits);
    let keyring = keyring.unwrap_or(&inst.keyring);
    let path = write(inst.dir.path(), "hostile.tar.zst", bytes);
    let verdict = refusal(verify_file(&path, keyring, &limits, &NoProgress));
    assert!(
        expect(&verdict),
        "unexpected refusal from verify: {verdict}"
    );

    let before = inst.store.state().unwrap();
    let err = hostile_store
        .install(&path, keyring, &InstallOptions::default())
        .unwrap_err();
    let line = err.to_string();
    assert!(
        line.contains("hostile.tar.zst") && !line.contains('\n'),
        "one line naming the file: {line}"
    );
    let r = refusal(Err::<(), _>(err));
    assert!(expect(&r), "unexpected refusal from install: {r}");
    assert_eq!(inst.store.state().unwrap(), before, "state unchanged");
    let current = inst
        .store
        .verify_installed(&inst.keyring, &NoProgress)
        .unwrap();
    assert_eq!(current.version, Version::new(1, 0, 0));
    let leftovers: Vec<_> = fs::read_dir(inst.store.root())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(".staging"))
        .collect();
    assert!(leftovers.is_empty(), "staging removed: {leftovers:?}");
    let _ = Role::Embedder;
    verdict
}

/// The bundle at `path` with one byte flipped inside the first payload entry containing
/// `needle` (the tar is decompressed, changed and recompressed like the builder does, and the
/// signed metadata frame is kept as is): a corrupted copy whose frames all decode cleanly.
pub fn flip_in_payload(path: &Path, needle: &[u8]) -> Vec<u8> {
    let bytes = fs::read(path).unwrap();
    let m = airlock_bundle::inspect_file(path, &Limits::default())
        .unwrap()
        .manifest;
    let split = bytes.len() - m.payload_frame.size as usize;
    let mut tar = zstd::decode_all(&bytes[split..]).unwrap();
    let at = tar
        .windows(needle.len())
        .position(|w| w == needle)
        .expect("needle in the payload");
    tar[at] ^= 0x01;
    let mut out = bytes[..split].to_vec();
    out.extend_from_slice(&zstd(&tar));
    out
}
