//! One crafted bundle per refusal. Each asserts the exact refusal from `verify_file` and from
//! `Store::install`, and that the installed 1.0.0 stays current and verifies.

use airlock_bundle::{Limits, MANIFEST_FORMAT, Refusal};
use airlock_signing::{Keyring, SignatureEnvelope};
use tar::EntryType;

use crate::common::*;

const DATA: &[u8] = b"payload bytes";

fn ok_payload() -> Vec<Raw> {
    vec![Raw::file("data.bin", DATA)]
}

fn defaults() -> Limits {
    Limits::default()
}

fn signature_reason(r: &Refusal, needle: &str) -> bool {
    matches!(r, Refusal::Signature { reason } if reason.contains(needle))
}

#[test]
fn control_a_well_formed_crafted_bundle_installs() {
    // The crafting kit itself produces acceptable bundles; every test below breaks one rule.
    let inst = installed_v1();
    let p = write(
        inst.dir.path(),
        "ok.tar.zst",
        &crafted("2.0.0", &[("data.bin", DATA)], &[&key(1)], ok_payload()),
    );
    inst.store
        .install(&p, &inst.keyring, &Default::default())
        .unwrap();
    assert_eq!(
        inst.store.current().unwrap().unwrap().version.to_string(),
        "2.0.0"
    );
}

#[test]
fn tampered_payload_byte() {
    let bytes = crafted(
        "2.0.0",
        &[("data.bin", DATA)],
        &[&key(1)],
        vec![Raw::file("data.bin", b"payload bytez")],
    );
    assert_refused(
        &bytes,
        None,
        defaults(),
        |r| matches!(r, Refusal::DigestMismatch { path } if path == "data.bin"),
    );
}

#[test]
fn edited_manifest() {
    let payload = payload_frame(&ok_payload());
    let m = pin(manifest("2.0.0", &[("data.bin", DATA)]), &payload);
    let s = sign(&m, &[&key(1)]);
    let edited = String::from_utf8(m)
        .unwrap()
        .replace("crafted", "crafteD")
        .into_bytes();
    let bytes = assemble(
        &[
            Raw::file("manifest.json", &edited),
            Raw::file("manifest.sig.json", &s),
        ],
        &payload,
    );
    assert_refused(&bytes, None, defaults(), |r| {
        signature_reason(r, "does not verify")
    });
}

fn ok_manifest() -> (Vec<u8>, Vec<u8>) {
    let payload = payload_frame(&ok_payload());
    (
        pin(manifest("2.0.0", &[("data.bin", DATA)]), &payload),
        payload,
    )
}

fn with_envelope(envelope: &[u8]) -> Vec<u8> {
    let (m, payload) = ok_manifest();
    assemble(
        &[
            Raw::file("manifest.json", &m),
            Raw::file("manifest.sig.json", envelope),
        ],
        &payload,
    )
}

fn envelope_of(signers: &[&airlock_signing::KeyPair]) -> SignatureEnvelope {
    let (m, _) = ok_manifest();
    serde_json::from_slice(&sign(&m, signers)).unwrap()
}

#[test]
fn dropped_signature() {
    let bytes = with_envelope(&SignatureEnvelope::new(vec![]).to_json());
    assert_refused(&bytes, None, defaults(), |r| {
        signature_reason(r, "0 valid signature(s) from trusted keys, threshold is 1")
    });
}

#[test]
fn missing_signature_file() {
    let (m, _) = ok_manifest();
    let bytes = assemble(
        &[Raw::file("manifest.json", &m), Raw::file("data.bin", DATA)],
        &payload_frame(&[]),
    );
    assert_refused(
        &bytes,
        None,
        defaults(),
        |r| matches!(r, Refusal::UnexpectedEntry { expected: "manifest.sig.json", found } if found == "data.bin"),
    );
}

#[test]
fn corrupt_signature() {
    let mut env = envelope_of(&[&key(1)]);
    let mut sig = env.signatures[0].signature_bytes().unwrap();
    sig[10] ^= 0x01;
    env.signatures[0].sig = base64_of(&sig);
    assert_refused(&with_envelope(&env.to_json()), None, defaults(), |r| {
        signature_reason(r, "does not verify")
    });
}

fn base64_of(sig: &[u8; 64]) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(sig)
}

#[test]
fn malformed_signature_envelope() {
    assert_refused(&with_envelope(b"{\"format\":\"airlock-signatures/v1\",\"signatures\":[{\"key_id\":\"zz\",\"sig\":\"\"}]}"), None, defaults(), |r| {
        signature_reason(r, "key id")
    });
}

#[test]
fn duplicated_signature() {
    let mut env = envelope_of(&[&key(1)]);
    env.signatures.push(env.signatures[0].clone());
    assert_refused(&with_envelope(&env.to_json()), None, defaults(), |r| {
        signature_reason(r, "more than once")
    });
}

#[test]
fn wrong_key() {
    let bytes = crafted("2.0.0", &[("data.bin", DATA)], &[&key(9)], ok_payload());
    assert_refused(&bytes, None, defaults(), |r| {
        signature_reason(r, &format!("ignored unknown key(s) {}", key(9).key_id()))
    });
}

#[test]
fn revoked_key() {
    let (a, b) = (key(1), key(2));
    let mut ring = keyring(1, &[&a, &b]);
    ring.revoke(&b.key_id()).unwrap();
    let bytes = crafted("2.0.0", &[("data.bin", DATA)], &[&b], ok_payload());
    assert_refused(&bytes, Some(&ring), defaults(), |r| {
        signature_reason(r, &format!("ignored revoked key(s) {}", b.key_id()))
    });
}

#[test]
fn threshold_minus_one_signatures() {
    let (a, b, c) = (key(1), key(2), key(3));
    let ring: Keyring = keyring(3, &[&a, &b, &c]);
    let bytes = crafted("2.0.0", &[("data.bin", DATA)], &[&a, &b], ok_payload());
    assert_refused(&bytes, Some(&ring), defaults(), |r| {
        signature_reason(r, "2 valid signature(s) from trusted keys, threshold is 3")
    });
}

#[test]
fn downgrade_below_the_floor() {
    let bytes = crafted("0.9.0", &[("data.bin", DATA)], &[&key(1)], ok_payload());
    let inst = installed_v1();
    let p = write(inst.dir.path(), "old.tar.zst", &bytes);
    // verify_file alone accepts it (it is validly signed); only the store knows the floor.
    airlock_bundle::verify_file(&p, &inst.keyring, &defaults(), &airlock_bundle::NoProgress)
        .unwrap();
    let r = refusal(inst.store.install(&p, &inst.keyring, &Default::default()));
    assert!(
        matches!(&r, Refusal::Downgrade { version, highest } if version.to_string() == "0.9.0" && highest.to_string() == "1.0.0"),
        "{r}"
    );
    // A different bundle claiming the current version is a downgrade too, not a no-op.
    let same = write(
        inst.dir.path(),
        "same.tar.zst",
        &crafted("1.0.0", &[("data.bin", DATA)], &[&key(1)], ok_payload()),
    );
    assert!(matches!(
        refusal(
            inst.store
                .install(&same, &inst.keyring, &Default::default())
        ),
        Refusal::Downgrade { .. }
    ));
    assert_eq!(
        inst.store.current().unwrap().unwrap().version.to_string(),
        "1.0.0"
    );
}

#[test]
fn requires_a_newer_previous_version() {
    let mut m = manifest("3.0.0", &[("data.bin", DATA)]);
    m.min_previous_version = Some("2.0.0".parse().unwrap());
    let bytes = from_manifest(m, &[&key(1)], &ok_payload());
    let inst = installed_v1();
    let p = write(inst.dir.path(), "needs2.tar.zst", &bytes);
    let r = refusal(inst.store.install(&p, &inst.keyring, &Default::default()));
    assert!(matches!(r, Refusal::PreviousTooOld { .. }), "{r}");
}

#[test]
fn parent_dir_path() {
    let bytes = crafted(
        "2.0.0",
        &[("data.bin", DATA)],
        &[&key(1)],
        vec![Raw::file("../x", DATA)],
    );
    assert_refused(
        &bytes,
        None,
        defaults(),
        |r| matches!(r, Refusal::UnsafePath { path, reason: "contains '..'" } if path == "../x"),
    );
}

#[test]
fn nested_parent_dir_path() {
    let bytes = crafted(
        "2.0.0",
        &[("data.bin", DATA)],
        &[&key(1)],
        vec![Raw::file("a/../../x", DATA)],
    );
    assert_refused(&bytes, None, defaults(), |r| {
        matches!(
            r,
            Refusal::UnsafePath {
                reason: "contains '..'",
                ..
            }
        )
    });
}

#[test]
fn absolute_path() {
    let bytes = crafted(
        "2.0.0",
        &[("data.bin", DATA)],
        &[&key(1)],
        vec![Raw::file("/abs", DATA)],
    );
    assert_refused(
        &bytes,
        None,
        defaults(),
        |r| matches!(r, Refusal::UnsafePath { path, reason: "absolute path" } if path == "/abs"),
    );
}

#[test]
fn unnormalized_path() {
    let bytes = crafted(
        "2.0.0",
        &[("data.bin", DATA)],
        &[&key(1)],
        vec![Raw::file("./data.bin", DATA)],
    );
    assert_refused(&bytes, None, defaults(), |r| {
        matches!(
            r,
            Refusal::UnsafePath {
                reason: "not normalized: '.' component",
                ..
            }
        )
    });
}

#[test]
fn unsafe_path_in_the_signed_manifest() {
    let bytes = crafted("2.0.0", &[("../data.bin", DATA)], &[&key(1)], vec![]);
    assert_refused(
        &bytes,
        None,
        defaults(),
        |r| matches!(r, Refusal::UnsafePath { path, .. } if path == "../data.bin"),
    );
}

#[test]
fn symlink_entry() {
    let bytes = crafted(
        "2.0.0",
        &[("data.bin", DATA)],
        &[&key(1)],
        vec![Raw::kind(
            "data.bin",
            EntryType::Symlink,
            Some("/etc/passwd"),
        )],
    );
    assert_refused(
        &bytes,
        None,
        defaults(),
        |r| matches!(r, Refusal::EntryType { path, kind } if path == "data.bin" && kind == "symlink"),
    );
}

#[test]
fn hardlink_entry() {
    let bytes = crafted(
        "2.0.0",
        &[("data.bin", DATA)],
        &[&key(1)],
        vec![Raw::kind(
            "data.bin",
            EntryType::Link,
            Some("manifest.json"),
        )],
    );
    assert_refused(
        &bytes,
        None,
        defaults(),
        |r| matches!(r, Refusal::EntryType { kind, .. } if kind == "hardlink"),
    );
}

#[test]
fn device_entries() {
    for (kind, name) in [
        (EntryType::Char, "character device"),
        (EntryType::Block, "block device"),
        (EntryType::Fifo, "FIFO"),
    ] {
        let bytes = crafted(
            "2.0.0",
            &[("data.bin", DATA)],
            &[&key(1)],
            vec![Raw::kind("data.bin", kind, None)],
        );
        assert_refused(
            &bytes,
            None,
            defaults(),
            |r| matches!(r, Refusal::EntryType { kind, .. } if kind == name),
        );
    }
}

#[test]
fn directory_entry() {
    let bytes = crafted(
        "2.0.0",
        &[("data.bin", DATA)],
        &[&key(1)],
        vec![Raw::kind("dir", EntryType::Directory, None)],
    );
    assert_refused(
        &bytes,
        None,
        defaults(),
        |r| matches!(r, Refusal::EntryType { kind, .. } if kind == "directory"),
    );
}

#[test]
fn duplicate_path() {
    let bytes = crafted(
        "2.0.0",
        &[("data.bin", DATA)],
        &[&key(1)],
        vec![Raw::file("data.bin", DATA), Raw::file("data.bin", DATA)],
    );
    assert_refused(
        &bytes,
        None,
        defaults(),
        |r| matches!(r, Refusal::DuplicatePath { path } if path == "data.bin"),
    );
}

#[test]
fn second_manifest_entry() {
    let bytes = crafted(
        "2.0.0",
        &[("data.bin", DATA)],
        &[&key(1)],
        vec![
            Raw::file("data.bin", DATA),
            Raw::file("manifest.json", b"{}"),
        ],
    );
    assert_refused(
        &bytes,
        None,
        defaults(),
        |r| matches!(r, Refusal::DuplicatePath { path } if path == "manifest.json"),
    );
}

#[test]
fn extra_file() {
    let bytes = crafted(
        "2.0.0",
        &[("data.bin", DATA)],
        &[&key(1)],
        vec![Raw::file("data.bin", DATA), Raw::file("extra.bin", b"x")],
    );
    assert_refused(
        &bytes,
        None,
        defaults(),
        |r| matches!(r, Refusal::NotInManifest { path } if path == "extra.bin"),
    );
}

#[test]
fn missing_file() {
    let bytes = crafted(
        "2.0.0",
        &[("data.bin", DATA), ("more.bin", b"more")],
        &[&key(1)],
        ok_payload(),
    );
    assert_refused(
        &bytes,
        None,
        defaults(),
        |r| matches!(r, Refusal::Missing { path } if path == "more.bin"),
    );
}

#[test]
fn size_mismatch() {
    let bytes = crafted(
        "2.0.0",
        &[("data.bin", DATA)],
        &[&key(1)],
        vec![Raw::file("data.bin", b"payload bytes!")],
    );
    assert_refused(&bytes, None, defaults(), |r| {
        matches!(
            r,
            Refusal::SizeMismatch {
                declared: 13,
                actual: 14,
                ..
            }
        )
    });
}

#[test]
fn manifest_not_first() {
    let (m, payload) = ok_manifest();
    let s = sign(&m, &[&key(1)]);
    let bytes = assemble(
        &[
            Raw::file("data.bin", DATA),
            Raw::file("manifest.json", &m),
            Raw::file("manifest.sig.json", &s),
        ],
        &payload,
    );
    assert_refused(
        &bytes,
        None,
        defaults(),
        |r| matches!(r, Refusal::UnexpectedEntry { expected: "manifest.json", found } if found == "data.bin"),
    );
}

#[test]
fn truncated_archive() {
    let dir = tempfile::tempdir().unwrap();
    let full = std::fs::read(built(dir.path(), "2.0.0", &[&key(1)])).unwrap();
    for cut in [full.len() - 1, full.len() - 5, full.len() / 2, 100] {
        assert_refused(&full[..cut], None, defaults(), |r| {
            matches!(r, Refusal::Truncated)
        });
    }
}

#[test]
fn trailing_garbage_after_the_zstd_frame() {
    let dir = tempfile::tempdir().unwrap();
    let mut bytes = std::fs::read(built(dir.path(), "2.0.0", &[&key(1)])).unwrap();
    bytes.extend_from_slice(b"garbage");
    assert_refused(
        &bytes,
        None,
        defaults(),
        |r| matches!(r, Refusal::TrailingData { reason } if reason.contains("zstd frame")),
    );
    // A second, valid zstd frame is trailing data too.
    let mut two = std::fs::read(dir.path().join("bundle-2.0.0.tar.zst")).unwrap();
    two.extend_from_slice(&zstd(b"second frame"));
    assert_refused(&two, None, defaults(), |r| {
        matches!(r, Refusal::TrailingData { .. })
    });
}

#[test]
fn trailing_garbage_after_the_tar_end() {
    // Honestly signed: the manifest pins the payload frame including the hidden bytes.
    let mut tar = raw_tar(&ok_payload());
    tar.extend_from_slice(b"hidden payload after the end-of-archive blocks");
    let payload = zstd(&tar);
    let m = pin(manifest("2.0.0", &[("data.bin", DATA)]), &payload);
    let s = sign(&m, &[&key(1)]);
    let bytes = assemble(
        &[
            Raw::file("manifest.json", &m),
            Raw::file("manifest.sig.json", &s),
        ],
        &payload,
    );
    assert_refused(
        &bytes,
        None,
        defaults(),
        |r| matches!(r, Refusal::TrailingData { reason } if reason.contains("tar archive")),
    );
}

#[test]
fn zstd_bomb_of_zeros_after_the_tar_end_stops_early() {
    let mut tar = raw_tar(&ok_payload());
    tar.resize(tar.len() + (256 << 20), 0);
    let payload = zstd(&tar);
    drop(tar);
    let m = pin(manifest("2.0.0", &[("data.bin", DATA)]), &payload);
    let s = sign(&m, &[&key(1)]);
    let bomb = assemble(
        &[
            Raw::file("manifest.json", &m),
            Raw::file("manifest.sig.json", &s),
        ],
        &payload,
    );
    assert!(
        bomb.len() < 100 << 10,
        "256 MiB of zeros compress to {} bytes",
        bomb.len()
    );
    let started = std::time::Instant::now();
    assert_refused(
        &bomb,
        None,
        defaults(),
        |r| matches!(r, Refusal::TrailingData { reason } if reason.contains("padding")),
    );
    assert!(started.elapsed().as_secs() < 20, "stopped early");
}

#[test]
fn zstd_bomb_in_a_long_name_header_hits_the_byte_budget() {
    // A GNU long-name record that decompresses to 64 MiB in the payload: the tar reader would
    // buffer it whole; the byte budget (derived from the manifest's declared sizes) stops it.
    let mut bomb = Raw::kind("././@LongLink", EntryType::GNULongName, None);
    bomb.data = vec![b'a'; 64 << 20];
    let bytes = crafted(
        "2.0.0",
        &[("data.bin", DATA)],
        &[&key(1)],
        vec![bomb, Raw::file("data.bin", DATA)],
    );
    assert!(bytes.len() < 1 << 20);
    assert_refused(&bytes, None, defaults(), |r| {
        matches!(r, Refusal::DecompressedTooLarge { .. })
    });
}

#[test]
fn zstd_bomb_declared_in_the_manifest_is_refused_before_reading() {
    // 256 MiB of zeros compress to ~8 KiB; the manifest declares them honestly, the limit says no.
    let mut m = manifest("2.0.0", &[("data.bin", DATA)]);
    m.files[0].size = 256 << 20;
    let mut entry = Raw::file("data.bin", b"");
    entry.size = Some(256 << 20);
    let mut tar = raw_entries(&[entry]);
    tar.resize(tar.len() + (256 << 20) + 1024, 0);
    let payload = zstd(&tar);
    drop(tar);
    let m = pin(m, &payload);
    let s = sign(&m, &[&key(1)]);
    let bytes = assemble(
        &[
            Raw::file("manifest.json", &m),
            Raw::file("manifest.sig.json", &s),
        ],
        &payload,
    );
    let limits = Limits {
        max_file_size: 1 << 20,
        ..Limits::default()
    };
    assert_refused(
        &bytes,
        None,
        limits,
        |r| matches!(r, Refusal::FileTooLarge { size, limit, .. } if *size == 256 << 20 && *limit == 1 << 20),
    );
}

#[test]
fn declared_total_and_entry_count_limits() {
    let declared: &[(&str, &[u8])] = &[("a.bin", b"aaaa"), ("b.bin", b"bbbb")];
    let bytes = crafted(
        "2.0.0",
        declared,
        &[&key(1)],
        vec![Raw::file("a.bin", b"aaaa"), Raw::file("b.bin", b"bbbb")],
    );
    assert_refused(
        &bytes,
        None,
        Limits {
            max_total_size: 7,
            ..defaults()
        },
        |r| matches!(r, Refusal::TotalTooLarge { total: 8, limit: 7 }),
    );
    assert_refused(
        &bytes,
        None,
        Limits {
            max_entries: 1,
            ..defaults()
        },
        |r| matches!(r, Refusal::TooManyEntries { count: 2, limit: 1 }),
    );
}

#[test]
fn oversized_manifest() {
    let mut m = manifest("2.0.0", &[("data.bin", DATA)]);
    m.name = "n".repeat(100);
    let payload = payload_frame(&ok_payload());
    let m = pin(m, &payload);
    let s = sign(&m, &[&key(1)]);
    let bytes = assemble(
        &[
            Raw::file("manifest.json", &m),
            Raw::file("manifest.sig.json", &s),
        ],
        &payload,
    );
    let limit = (m.len() - 1) as u64;
    assert_refused(
        &bytes,
        None,
        Limits {
            max_manifest_size: limit,
            ..defaults()
        },
        |r| {
            matches!(
                r,
                Refusal::MetadataTooLarge {
                    name: "manifest.json",
                    ..
                }
            )
        },
    );
}

#[test]
fn manifest_of_an_unknown_format() {
    let mut m = manifest("2.0.0", &[("data.bin", DATA)]);
    m.format = "airlock-bundle/v99".into();
    assert_ne!(m.format, MANIFEST_FORMAT);
    let bytes = from_manifest(m, &[&key(1)], &ok_payload());
    assert_refused(
        &bytes,
        None,
        defaults(),
        |r| matches!(r, Refusal::Manifest { reason } if reason.contains("unknown format")),
    );
}

#[test]
fn not_zstd_at_all() {
    let (m, _) = ok_manifest();
    let s = sign(&m, &[&key(1)]);
    let plain_tar = raw_tar(&[
        Raw::file("manifest.json", &m),
        Raw::file("manifest.sig.json", &s),
        Raw::file("data.bin", DATA),
    ]);
    assert_refused(
        &plain_tar,
        None,
        defaults(),
        |r| matches!(r, Refusal::Corrupt { reason } if reason.contains("magic")),
    );
}

#[test]
fn metadata_frame_compressed_instead_of_stored() {
    // A single compressed frame for everything (an older layout, or a hand-made tar.zst).
    let (m, _) = ok_manifest();
    let s = sign(&m, &[&key(1)]);
    let bytes = zstd(&raw_tar(&[
        Raw::file("manifest.json", &m),
        Raw::file("manifest.sig.json", &s),
        Raw::file("data.bin", DATA),
    ]));
    assert_refused(
        &bytes,
        None,
        defaults(),
        |r| matches!(r, Refusal::MetadataFrame { reason } if reason.contains("raw")),
    );
}

#[test]
fn payload_smuggled_into_the_metadata_frame() {
    let payload = payload_frame(&[]);
    let m = pin(manifest("2.0.0", &[("data.bin", DATA)]), &payload);
    let s = sign(&m, &[&key(1)]);
    let bytes = assemble(
        &[
            Raw::file("manifest.json", &m),
            Raw::file("manifest.sig.json", &s),
            Raw::file("data.bin", DATA),
        ],
        &payload,
    );
    assert_refused(
        &bytes,
        None,
        defaults(),
        |r| matches!(r, Refusal::MetadataFrame { reason } if reason.contains("holds more")),
    );
}

#[test]
fn payload_frame_swapped_for_an_equivalent_encoding() {
    // Same decompressed payload, different compressed bytes (another level): the signed
    // manifest pins the exact frame, so it is refused.
    let tar = raw_tar(&ok_payload());
    let (m, _) = ok_manifest();
    let s = sign(&m, &[&key(1)]);
    let mut enc = zstd::stream::write::Encoder::new(Vec::new(), 19).unwrap();
    enc.include_checksum(true).unwrap();
    enc.window_log(23).unwrap();
    std::io::Write::write_all(&mut enc, &tar).unwrap();
    let other = enc.finish().unwrap();
    assert_ne!(other, payload_frame(&ok_payload()));
    let bytes = assemble(
        &[
            Raw::file("manifest.json", &m),
            Raw::file("manifest.sig.json", &s),
        ],
        &other,
    );
    assert_refused(&bytes, None, defaults(), |r| {
        matches!(r, Refusal::PayloadFrame { .. })
    });
}
