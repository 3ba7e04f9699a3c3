//! Fuzz harnesses (not API). Each `pub fn` takes arbitrary bytes and must never panic: a panic
//! is a finding. The same bodies run under `cargo fuzz` (`fuzz/fuzz_targets/bundle_*.rs`) and as
//! plain tests over the checked-in corpus and regressions (`fuzz/corpus/<target>/`,
//! `fuzz/regressions/<target>/`) plus proptest mutations of them (the tests below).
//!
//! The harnesses check invariants, not only "no panic": an accepted bundle's signers reach the
//! threshold, its manifest re-parses equal and validates, an independent decode of the file
//! (plain `zstd -dc | tar t` semantics) finds exactly the manifest's files with matching sizes
//! and digests and the payload frame the manifest pins; a refused bundle is always a
//! [`crate::Error::Refused`] (a verdict on the input), never an I/O or internal error.

use std::io::{Read, Write};
use std::path::PathBuf;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};

use airlock_signing::{KeyPair, Keyring, Purpose, SignatureEnvelope};
use semver::Version;
use sha2::{Digest, Sha256};

use crate::manifest::{FileEntry, MANIFEST_FORMAT, PayloadFrame};
use crate::{
    Limits, MANIFEST_NAME, Manifest, NoProgress, SIGNATURES_NAME, Verified, format, inspect_file,
    verify_file,
};

/// The seed of the key that signs the fuzz corpus bundles (32 bytes of `0xF2`).
pub const FUZZ_KEY_SEED: [u8; 32] = [0xF2; 32];

/// The key that signs the corpus bundles (and the bundles [`bundle_payload`] assembles).
pub fn fuzz_key() -> &'static KeyPair {
    static KEY: OnceLock<KeyPair> = OnceLock::new();
    KEY.get_or_init(|| KeyPair::from_seed(FUZZ_KEY_SEED))
}

/// A threshold-1 keyring trusting [`fuzz_key`].
pub fn fuzz_keyring() -> &'static Keyring {
    static RING: OnceLock<Keyring> = OnceLock::new();
    RING.get_or_init(|| Keyring::new(1, &[fuzz_key().public()]).expect("fuzz keyring"))
}

/// Small limits keep each execution fast and its memory bounded; the checks are the same ones.
pub fn fuzz_limits() -> Limits {
    Limits {
        max_file_size: 1 << 20,
        max_total_size: 4 << 20,
        max_entries: 64,
        max_manifest_size: 64 << 10,
    }
}

/// A file in the temp directory, removed on drop (verify reads bundles from paths).
struct TempFile(PathBuf);

impl TempFile {
    fn write(data: &[u8]) -> TempFile {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let path = std::env::temp_dir().join(format!(
            "airlock-fuzz-{}-{}.tar.zst",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        let mut f = std::fs::File::create(&path).expect("creating a fuzz temp file");
        f.write_all(data).expect("writing a fuzz temp file");
        TempFile(path)
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// Target `bundle_verify`: `data` is a whole bundle file, verified against [`fuzz_keyring`].
pub fn bundle_verify(data: &[u8]) {
    check_bundle(data, None);
}

/// Target `bundle_payload`: `data` is the *uncompressed payload tar stream* (entries and end
/// blocks) of a bundle. The harness lists the regular entries a lenient tar reader finds in a
/// manifest, compresses `data` as the payload frame, signs with [`fuzz_key`] and verifies, so
/// the fuzzer reaches the tar-entry checks behind the signature. When `data` is exactly the
/// builder's canonical tar of those entries, the bundle must be accepted.
pub fn bundle_payload(data: &[u8]) {
    let entries = lenient_entries(data);
    let mut files: Vec<FileEntry> = Vec::new();
    for (path, content) in &entries {
        if files.iter().any(|f| &f.path == path) {
            continue;
        }
        files.push(FileEntry {
            path: path.clone(),
            size: content.len() as u64,
            sha256: hex::encode(Sha256::digest(content)),
        });
    }
    files.sort_by(|a, b| a.path.cmp(&b.path));
    let (bundle, manifest) = assemble(files, data);
    let canonical = canonical_payload(&entries) == data
        && manifest.validate(&fuzz_limits()).is_ok()
        && manifest.to_json().len() as u64 <= fuzz_limits().max_manifest_size;
    check_bundle(&bundle, Some(canonical));
}

/// Target `bundle_manifest`: `data` is `manifest.json`. A parsed manifest re-serialises to
/// bytes that parse equal, and validation is a pure function of the manifest.
pub fn bundle_manifest(data: &[u8]) {
    let Ok(m) = Manifest::from_json(data) else {
        return;
    };
    let again = Manifest::from_json(&m.to_json()).expect("a manifest's own JSON parses");
    assert_eq!(again, m, "manifest JSON round trip");
    let limits = Limits::default();
    let verdict = m.validate(&limits);
    assert_eq!(
        verdict,
        again.validate(&limits),
        "validation is deterministic"
    );
    if verdict.is_ok() {
        for w in m.files.windows(2) {
            assert!(
                w[0].path < w[1].path,
                "accepted files are sorted and unique"
            );
        }
        for f in &m.files {
            assert!(
                m.file(&f.path).is_some(),
                "every listed file is found by path"
            );
        }
        assert!(m.total_size() <= limits.max_total_size);
    }
}

/// The builder's payload tar of `entries` (sorted by path, first of each path), end blocks
/// included.
fn canonical_payload(entries: &[(String, Vec<u8>)]) -> Vec<u8> {
    let mut sorted: Vec<&(String, Vec<u8>)> = Vec::new();
    for e in entries {
        if !sorted.iter().any(|s| s.0 == e.0) {
            sorted.push(e);
        }
    }
    sorted.sort_by(|a, b| a.0.cmp(&b.0));
    let mut tar = tar::Builder::new(Vec::new());
    for (path, content) in sorted {
        let mut h = entry_header(content.len() as u64);
        if tar.append_data(&mut h, path, &content[..]).is_err() {
            return Vec::new(); // Not a path the builder could write: never canonical.
        }
    }
    tar.into_inner().unwrap_or_default()
}

fn entry_header(size: u64) -> tar::Header {
    let mut h = tar::Header::new_gnu();
    h.set_entry_type(tar::EntryType::Regular);
    h.set_size(size);
    h.set_mode(0o644);
    h.set_uid(0);
    h.set_gid(0);
    h.set_mtime(CREATED_UNIX);
    h
}

const CREATED: &str = "2026-11-29T00:00:00Z";
const CREATED_UNIX: u64 = 1_795_910_400;

/// The regular entries a lenient tar reader finds (stopping at the first error), as
/// `(lossy path, content)`.
fn lenient_entries(data: &[u8]) -> Vec<(String, Vec<u8>)> {
    let mut out = Vec::new();
    let mut archive = tar::Archive::new(data);
    let Ok(entries) = archive.entries() else {
        return out;
    };
    for entry in entries {
        let Ok(mut entry) = entry else { break };
        if entry.header().entry_type() != tar::EntryType::Regular || entry.size() > 1 << 20 {
            continue;
        }
        let path = String::from_utf8_lossy(&entry.path_bytes()).into_owned();
        let mut content = Vec::new();
        if entry.read_to_end(&mut content).is_err() {
            break;
        }
        out.push((path, content));
    }
    out
}

/// A bundle file whose manifest lists `files` and whose payload frame is `payload` compressed
/// as the builder does; signed by [`fuzz_key`].
fn assemble(files: Vec<FileEntry>, payload: &[u8]) -> (Vec<u8>, Manifest) {
    let mut encoder = zstd::stream::write::Encoder::new(Vec::new(), 1).expect("zstd encoder");
    encoder.include_checksum(true).expect("zstd checksum");
    encoder
        .window_log(format::WINDOW_LOG)
        .expect("zstd window log");
    encoder.write_all(payload).expect("compressing to memory");
    let frame = encoder.finish().expect("compressing to memory");
    let manifest = Manifest {
        format: MANIFEST_FORMAT.into(),
        name: "fuzz".into(),
        version: Version::new(1, 0, 0),
        created: CREATED.into(),
        min_previous_version: None,
        files,
        models: Vec::new(),
        binary: None,
        payload_frame: PayloadFrame {
            size: frame.len() as u64,
            sha256: hex::encode(Sha256::digest(&frame)),
        },
    };
    let manifest_bytes = manifest.to_json();
    let envelope =
        SignatureEnvelope::new(vec![fuzz_key().sign(Purpose::Manifest, &manifest_bytes)]);
    let mut meta = Vec::new();
    for (name, bytes) in [
        (MANIFEST_NAME, manifest_bytes),
        (SIGNATURES_NAME, envelope.to_json()),
    ] {
        let mut h = entry_header(bytes.len() as u64);
        h.set_path(name).expect("metadata entry name");
        h.set_cksum();
        meta.extend_from_slice(h.as_bytes());
        meta.extend_from_slice(&bytes);
        meta.resize(meta.len().div_ceil(512) * 512, 0);
    }
    let mut bundle = format::metadata_frame(&meta);
    bundle.extend_from_slice(&frame);
    (bundle, manifest)
}

/// Verifies `data`; checks the invariants of an acceptance or a refusal. `must_accept`: the
/// input is known good.
fn check_bundle(data: &[u8], must_accept: Option<bool>) {
    let file = TempFile::write(data);
    let keyring = fuzz_keyring();
    let limits = fuzz_limits();
    let verdict = verify_file(&file.0, keyring, &limits, &NoProgress);
    let inspected = inspect_file(&file.0, &limits);
    if let Err(e) = &inspected {
        assert!(e.refusal().is_some(), "inspect must refuse, not fail: {e}");
    }
    match verdict {
        Ok(v) => {
            let inspected = inspected.expect("a verified bundle's metadata can be inspected");
            assert_eq!(
                inspected.manifest, v.manifest,
                "inspect reads what verify read"
            );
            check_accepted(data, &v, keyring, &limits);
        }
        Err(e) => {
            assert!(
                e.refusal().is_some(),
                "a bad bundle must be refused, not fail with {e}"
            );
            assert!(
                must_accept != Some(true),
                "the canonical bundle was refused: {e}"
            );
        }
    }
}

fn check_accepted(data: &[u8], v: &Verified, keyring: &Keyring, limits: &Limits) {
    assert!(v.signers.len() >= keyring.threshold() as usize);
    assert!(v.signers.iter().all(|s| keyring.is_trusted(s)));
    let envelope = SignatureEnvelope::from_json(&v.signatures_bytes).expect("accepted envelope");
    keyring
        .verify(Purpose::Manifest, &v.manifest_bytes, &envelope)
        .expect("accepted signatures verify again");
    assert_eq!(
        Manifest::from_json(&v.manifest_bytes).expect("accepted manifest parses"),
        v.manifest
    );
    v.manifest
        .validate(limits)
        .expect("accepted manifest validates");

    // The payload frame the manifest pins is the file's tail.
    let frame = &v.manifest.payload_frame;
    let tail = data
        .len()
        .checked_sub(usize::try_from(frame.size).expect("frame size"))
        .expect("payload frame inside the file");
    assert_eq!(hex::encode(Sha256::digest(&data[tail..])), frame.sha256);

    // An independent decode (all frames, as `zstd -dc`) holds exactly the manifest's files.
    let plain = zstd::stream::decode_all(data).expect("an accepted bundle decodes");
    let mut archive = tar::Archive::new(&plain[..]);
    let mut seen = vec![false; v.manifest.files.len()];
    for (i, entry) in archive.entries().expect("tar").enumerate() {
        let mut entry = entry.expect("an accepted bundle's tar entries parse");
        let path = String::from_utf8(entry.path_bytes().into_owned()).expect("UTF-8 path");
        let mut content = Vec::new();
        entry.read_to_end(&mut content).expect("entry content");
        match i {
            0 => assert_eq!(
                (path.as_str(), &content),
                (MANIFEST_NAME, &v.manifest_bytes)
            ),
            1 => assert_eq!(
                (path.as_str(), &content),
                (SIGNATURES_NAME, &v.signatures_bytes)
            ),
            _ => {
                let index = v
                    .manifest
                    .files
                    .iter()
                    .position(|f| f.path == path)
                    .unwrap_or_else(|| panic!("accepted entry {path:?} is not in the manifest"));
                assert!(!std::mem::replace(&mut seen[index], true), "{path:?} twice");
                let f = &v.manifest.files[index];
                assert_eq!(content.len() as u64, f.size, "{path:?} size");
                assert_eq!(hex::encode(Sha256::digest(&content)), f.sha256, "{path:?}");
            }
        }
    }
    assert!(
        seen.iter().all(|s| *s),
        "every manifest file is in the accepted bundle"
    );
}

#[cfg(test)]
#[path = "../../fuzz/replay.rs"]
mod replay;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{BuildOptions, build};

    /// A small real bundle made by the builder, signed by the fuzz key.
    fn built_bundle() -> Vec<u8> {
        let dir = tempfile::tempdir().unwrap();
        let src = dir.path().join("src");
        std::fs::create_dir_all(src.join("models/embed")).unwrap();
        std::fs::write(src.join("models/embed/model.bin"), b"weights ".repeat(64)).unwrap();
        std::fs::write(src.join("models/embed/config.json"), b"{\"dim\": 384}").unwrap();
        std::fs::write(src.join("README.txt"), b"fuzz seed bundle\n").unwrap();
        std::fs::write(
            src.join("catalogue.json"),
            br#"[{"id":"embed","role":"embedder","alias":"airlock-embed","files":["models/embed/model.bin","models/embed/config.json"],"params":{"dim":384}}]"#,
        )
        .unwrap();
        let mut o = BuildOptions::new("fuzz-seed", Version::new(1, 0, 0));
        o.created = time::OffsetDateTime::from_unix_timestamp(CREATED_UNIX as i64).unwrap();
        o.limits = fuzz_limits();
        let out = dir.path().join("seed.tar.zst");
        build(&src, &o, &[fuzz_key()], &out, &NoProgress).unwrap();
        std::fs::read(out).unwrap()
    }

    /// The payload tar of [`built_bundle`] (decompressed payload frame).
    fn built_payload(bundle: &[u8]) -> Vec<u8> {
        let plain = zstd::stream::decode_all(bundle).unwrap();
        let mut archive = tar::Archive::new(&plain[..]);
        let mut entries = archive.entries().unwrap();
        entries.next().unwrap().unwrap();
        let sig = entries.next().unwrap().unwrap();
        let start = (sig.raw_file_position() + sig.size()).div_ceil(512) * 512;
        plain[start as usize..].to_vec()
    }

    #[test]
    fn the_builders_bundle_is_accepted_and_a_flipped_byte_refused() {
        let bundle = built_bundle();
        let file = TempFile::write(&bundle);
        let v = verify_file(&file.0, fuzz_keyring(), &fuzz_limits(), &NoProgress).unwrap();
        check_accepted(&bundle, &v, fuzz_keyring(), &fuzz_limits());
        let payload = built_payload(&bundle);
        let entries = lenient_entries(&payload);
        assert_eq!(entries.len(), 4);
        assert_eq!(
            canonical_payload(&entries),
            payload,
            "canonical = builder's tar"
        );
        bundle_payload(&payload); // asserts acceptance
        let mut bad = bundle.clone();
        let last = bad.len() - 1;
        bad[last] ^= 1;
        let file = TempFile::write(&bad);
        let e = verify_file(&file.0, fuzz_keyring(), &fuzz_limits(), &NoProgress).unwrap_err();
        assert!(e.refusal().is_some(), "{e}");
    }

    #[test]
    fn bundle_verify_corpus_and_mutations() {
        let bundle = built_bundle();
        // ~1 ms a case in the unoptimised test build (the verifier zeroes a 1 MiB buffer).
        replay::run("bundle_verify", &[bundle], 1000, bundle_verify);
    }

    #[test]
    fn bundle_payload_corpus_and_mutations() {
        let payload = built_payload(&built_bundle());
        // ~7 ms a case unoptimised (every case is signed and reaches the payload).
        replay::run("bundle_payload", &[payload], 250, bundle_payload);
    }

    #[test]
    fn bundle_manifest_corpus_and_mutations() {
        let bundle = built_bundle();
        let file = TempFile::write(&bundle);
        let v = verify_file(&file.0, fuzz_keyring(), &fuzz_limits(), &NoProgress).unwrap();
        replay::run(
            "bundle_manifest",
            &[v.manifest_bytes],
            3000,
            bundle_manifest,
        );
    }

    /// Writes the seed corpus files (`cargo test -p airlock-bundle -- --ignored write_seeds`).
    #[test]
    #[ignore = "regenerates fuzz/corpus seeds"]
    fn write_seeds() {
        let bundle = built_bundle();
        let file = TempFile::write(&bundle);
        let v = verify_file(&file.0, fuzz_keyring(), &fuzz_limits(), &NoProgress).unwrap();
        replay::write_seed("bundle_verify", "built.tar.zst", &bundle);
        replay::write_seed("bundle_payload", "built.tar", &built_payload(&bundle));
        replay::write_seed("bundle_manifest", "built.json", &v.manifest_bytes);
    }
}
