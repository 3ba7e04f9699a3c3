//! Derives the software bill of materials of the `airlock` binary while it is built (issue 19,
//! supply chain): every crate linked into it, with its version, licence and Cargo.lock checksum.
//!
//! The crate set is what `cargo tree -p airlock -e normal,no-proc-macro --target $TARGET` prints
//! for this very build (the resolver's own answer: this target's platform dependencies, the
//! features unified for this build), so dev-dependencies, build-dependencies (the build scripts'
//! tools) and procedural macros (compiler plug-ins that run at build time) are not listed: none
//! of them is linked. Checksums come from Cargo.lock (registry crates only; workspace crates have
//! none). The result is written to `$OUT_DIR/sbom-components.tsv` and embedded by `src/sbom.rs`.
//! No dependency of its own: the two formats it reads are parsed by hand.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

fn main() {
    let manifest_dir = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets it"));
    let root = manifest_dir
        .parent()
        .expect("the appliance crate sits in the workspace root")
        .to_path_buf();
    let lock = root.join("Cargo.lock");
    // Dependencies change only through Cargo.lock or a manifest.
    println!("cargo:rerun-if-changed={}", lock.display());
    println!(
        "cargo:rerun-if-changed={}",
        root.join("Cargo.toml").display()
    );
    for member in std::fs::read_dir(&root).expect("reading the workspace root") {
        let manifest = member.expect("workspace entry").path().join("Cargo.toml");
        if manifest.is_file() {
            println!("cargo:rerun-if-changed={}", manifest.display());
        }
    }
    println!("cargo:rerun-if-changed=build.rs");

    let target = std::env::var("TARGET").expect("cargo sets TARGET");
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(&cargo)
        .current_dir(&root)
        .args([
            "tree",
            "--frozen",
            "-p",
            "airlock",
            "-e",
            "normal,no-proc-macro",
            "--prefix",
            "none",
            "--target",
            &target,
            "--format",
            "{p}\t{l}",
        ])
        .output()
        .unwrap_or_else(|e| panic!("sbom: running {cargo} tree: {e}"));
    assert!(
        out.status.success(),
        "sbom: `cargo tree` failed (the SBOM of the binary cannot be derived): {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let tree = String::from_utf8(out.stdout).expect("cargo tree prints UTF-8");
    let checksums = lock_checksums(&std::fs::read_to_string(&lock).expect("reading Cargo.lock"));

    // name -> (version, kind, licence, checksum); a crate linked in two versions is two rows.
    let mut rows: BTreeMap<(String, String), String> = BTreeMap::new();
    for line in tree.lines().filter(|l| !l.trim().is_empty()) {
        // A crate printed again is marked " (*)" at the end of the line.
        let line = line.trim_end().trim_end_matches(" (*)");
        let (package, licence) = line.split_once('\t').unwrap_or((line, ""));
        let package = package.trim();
        let mut parts = package.splitn(3, ' ');
        let (Some(name), Some(version)) = (parts.next(), parts.next()) else {
            panic!("sbom: unexpected cargo tree line {line:?}");
        };
        let version = version.trim_start_matches('v');
        let source = parts.next().unwrap_or("");
        let kind = if source.is_empty() {
            "registry"
        } else if source.starts_with("(proc-macro)") {
            continue;
        } else if Path::new(source.trim_matches(|c| c == '(' || c == ')')).is_absolute() {
            "workspace"
        } else {
            "other"
        };
        let checksum = checksums
            .get(&(name.to_owned(), version.to_owned()))
            .cloned()
            .unwrap_or_default();
        if kind == "registry" && checksum.is_empty() {
            panic!("sbom: no Cargo.lock checksum for registry crate {name} {version}");
        }
        let licence = licence.trim().replace('/', " OR ");
        rows.insert(
            (name.to_owned(), version.to_owned()),
            format!("{kind}\t{licence}\t{checksum}"),
        );
    }
    assert!(
        rows.len() > 10,
        "sbom: cargo tree listed {} crates",
        rows.len()
    );
    let mut tsv = String::new();
    for ((name, version), rest) in &rows {
        tsv.push_str(&format!("{name}\t{version}\t{rest}\n"));
    }
    let dest = PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets OUT_DIR"))
        .join("sbom-components.tsv");
    std::fs::write(&dest, tsv).expect("writing the SBOM component list");
}

/// (name, version) -> checksum of every `[[package]]` of a Cargo.lock that has one.
fn lock_checksums(text: &str) -> BTreeMap<(String, String), String> {
    let mut out = BTreeMap::new();
    let (mut name, mut version, mut checksum) = (None, None, None);
    let mut flush =
        |name: &mut Option<String>, version: &mut Option<String>, sum: &mut Option<String>| {
            if let (Some(n), Some(v), Some(c)) = (name.take(), version.take(), sum.take()) {
                out.insert((n, v), c);
            }
        };
    for line in text.lines() {
        let line = line.trim();
        if line == "[[package]]" {
            flush(&mut name, &mut version, &mut checksum);
            continue;
        }
        let Some((key, value)) = line.split_once(" = ") else {
            continue;
        };
        let value = value.trim_matches('"').to_owned();
        match key {
            "name" => name = Some(value),
            "version" => version = Some(value),
            "checksum" => checksum = Some(value),
            _ => {}
        }
    }
    flush(&mut name, &mut version, &mut checksum);
    out
}
