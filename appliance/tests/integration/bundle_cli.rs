//! The bundle supply chain through the real `airlock` binary: keygen, keyring, build, verify,
//! inspect, install, list, rollback, verify-installed, key rotation, exit codes, one-line
//! refusals, and installs killed with SIGKILL at every stage.

use std::fs;
use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};

const BIN: &str = env!("CARGO_BIN_EXE_airlock");

struct Appliance {
    dir: tempfile::TempDir,
}

impl Appliance {
    fn new() -> Appliance {
        Appliance {
            dir: tempfile::tempdir().unwrap(),
        }
    }

    fn path(&self, rel: &str) -> PathBuf {
        self.dir.path().join(rel)
    }

    fn data(&self) -> String {
        self.path("data").to_string_lossy().into_owned()
    }

    /// Runs `airlock ARGS` with a clean environment for the variables it reads.
    fn run(&self, args: &[&str]) -> Output {
        Command::new(BIN)
            .args(args)
            .env_remove("AIRLOCK_DATA")
            .env_remove("AIRLOCK_FAILPOINT")
            .env_remove("SOURCE_DATE_EPOCH")
            .current_dir(self.dir.path())
            .output()
            .unwrap()
    }

    fn ok(&self, args: &[&str]) -> String {
        let out = self.run(args);
        assert!(
            out.status.success(),
            "airlock {args:?} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    }

    /// Runs a command that must fail with exit code 1; returns its stderr.
    fn fails(&self, args: &[&str]) -> String {
        let out = self.run(args);
        assert_eq!(
            out.status.code(),
            Some(1),
            "airlock {args:?}: {}",
            String::from_utf8_lossy(&out.stdout)
        );
        String::from_utf8(out.stderr).unwrap()
    }

    fn source(&self, version: &str) -> String {
        let src = self.path(&format!("src-{version}"));
        fs::create_dir_all(src.join("models/embed")).unwrap();
        fs::write(
            src.join("models/embed/model.bin"),
            format!("weights {version}").repeat(1000),
        )
        .unwrap();
        fs::write(
            src.join("catalogue.json"),
            r#"[{"id":"embed","role":"embedder","alias":"airlock-embed","files":["models/embed/model.bin"],"params":{}}]"#,
        )
        .unwrap();
        src.to_string_lossy().into_owned()
    }

    /// keygen + pinned keyring (threshold 1) + a v1 bundle; returns (key, bundle).
    fn setup(&self) -> (String, String) {
        self.ok(&["keygen", "--out", "keys", "--name", "ops"]);
        self.ok(&[
            "keyring",
            "init",
            "--key",
            "keys/ops.pub",
            "--data",
            &self.data(),
        ]);
        let b1 = self.build("1.0.0", "keys/ops.key");
        (self.path("keys/ops.key").to_string_lossy().into_owned(), b1)
    }

    fn build(&self, version: &str, key: &str) -> String {
        let src = self.source(version);
        let out = self
            .path(&format!("airlock-{version}.tar.zst"))
            .to_string_lossy()
            .into_owned();
        self.ok(&[
            "bundle",
            "build",
            "--from",
            &src,
            "--version",
            version,
            "--sign",
            key,
            "--out",
            &out,
        ]);
        out
    }
}

fn one_line(stderr: &str) -> &str {
    let trimmed = stderr.trim_end();
    assert!(
        !trimmed.contains('\n'),
        "refusal must be one line: {stderr:?}"
    );
    trimmed
}

#[test]
fn build_verify_install_rollback_by_hand() {
    let b = Appliance::new();
    let (key, b1) = b.setup();
    let mode = {
        use std::os::unix::fs::PermissionsExt;
        fs::metadata(&key).unwrap().permissions().mode() & 0o777
    };
    assert_eq!(mode, 0o600);

    let out = b.ok(&["bundle", "verify", &b1, "--data", &b.data()]);
    assert!(
        out.starts_with("ok ") && out.contains("airlock 1.0.0"),
        "{out}"
    );
    let out = b.ok(&["bundle", "inspect", &b1]);
    assert!(
        out.contains("NOT verified") && out.contains("airlock-embed"),
        "{out}"
    );
    let json: serde_json::Value =
        serde_json::from_str(&b.ok(&["bundle", "inspect", &b1, "--json"])).unwrap();
    assert_eq!(json["version"], "1.0.0");

    let out = b.ok(&["install", &b1, "--data", &b.data()]);
    assert!(out.contains("installed 1.0.0 (previous: none)"), "{out}");
    let out = b.ok(&["install", &b1, "--data", &b.data()]);
    assert!(out.contains("already current"), "{out}");

    let b2 = b.build("2.0.0", &key);
    b.ok(&["install", &b2, "--data", &b.data()]);
    let list = b.ok(&["bundle", "list", "--data", &b.data()]);
    assert!(
        list.contains("1.0.0")
            && list.contains("previous")
            && list.contains("2.0.0")
            && list.contains("current"),
        "{list}"
    );

    let out = b.ok(&["rollback", "--data", &b.data()]);
    assert!(out.contains("rolled back from 2.0.0 to 1.0.0"), "{out}");
    let out = b.ok(&["bundle", "verify-installed", "--data", &b.data()]);
    assert!(out.contains("1.0.0"), "{out}");

    // The floor: a 1.5.0 is below the highest installed (2.0.0).
    let b15 = b.build("1.5.0", &key);
    let err = b.fails(&["install", &b15, "--data", &b.data()]);
    let line = one_line(&err);
    assert!(
        line.contains("airlock-1.5.0.tar.zst") && line.contains("rollback floor"),
        "{line}"
    );
}

#[test]
fn refusals_exit_1_with_one_line_naming_file_and_check() {
    let b = Appliance::new();
    let (_, b1) = b.setup();
    b.ok(&["install", &b1, "--data", &b.data()]);

    // A bundle signed by a key the appliance does not trust.
    b.ok(&["keygen", "--out", "rogue", "--name", "rogue"]);
    let rogue = b.build("2.0.0", "rogue/rogue.key");
    let line = b.fails(&["install", &rogue, "--data", &b.data()]);
    let line = one_line(&line);
    assert!(
        line.contains("airlock-2.0.0.tar.zst")
            && line.contains("manifest signature")
            && line.contains("unknown key"),
        "{line}"
    );

    // One flipped byte in the payload frame.
    let mut bytes = fs::read(&b1).unwrap();
    let last = bytes.len() - 10;
    bytes[last] ^= 0x40;
    let tampered = b.path("tampered.tar.zst");
    fs::write(&tampered, bytes).unwrap();
    let line = b.fails(&[
        "bundle",
        "verify",
        tampered.to_str().unwrap(),
        "--data",
        &b.data(),
    ]);
    assert!(one_line(&line).contains("tampered.tar.zst"), "{line}");

    // The installed bundle is untouched, and tampering with it is found.
    b.ok(&["bundle", "verify-installed", "--data", &b.data()]);
    let installed = b.path("data/bundles/1.0.0/models/embed/model.bin");
    let mut content = fs::read(&installed).unwrap();
    content[0] ^= 1;
    fs::write(&installed, content).unwrap();
    let line = b.fails(&["bundle", "verify-installed", "--data", &b.data()]);
    let line = one_line(&line);
    assert!(
        line.contains("models/embed/model.bin") && line.contains("SHA-256"),
        "{line}"
    );

    // Rollback with nothing to roll back to.
    let line = b.fails(&["rollback", "--data", &b.data()]);
    assert!(one_line(&line).contains("no previous version"), "{line}");
}

#[test]
fn a_pinned_keyring_cannot_be_bypassed_with_keyring_file() {
    // Issue 19 F5: `install --keyring FILE` verified against FILE only, so a bundle signed by a
    // key the appliance never trusted became current at 999.0.0 and raised the rollback floor.
    let b = Appliance::new();
    let (key, b1) = b.setup();
    b.ok(&["install", &b1, "--data", &b.data()]);
    let b2 = b.build("2.0.0", &key);
    b.ok(&["install", &b2, "--data", &b.data()]);
    let state_path = b.path("data/bundles/state.json");
    let before = fs::read(&state_path).unwrap();

    b.ok(&["keygen", "--out", "rogue", "--name", "rogue"]);
    b.ok(&[
        "keyring",
        "init",
        "--key",
        "rogue/rogue.pub",
        "--out",
        "rogue/ring.json",
    ]);
    let rogue = b.build("999.0.0", "rogue/rogue.key");
    let ring = b.path("rogue/ring.json").to_string_lossy().into_owned();
    // The rogue bundle is genuinely signed for the rogue keyring.
    b.ok(&["bundle", "verify", &rogue, "--keyring", &ring]);

    let line = b.fails(&["install", &rogue, "--keyring", &ring, "--data", &b.data()]);
    let line = one_line(&line);
    assert!(
        line.contains("--keyring") && line.contains("pinned keyring"),
        "{line}"
    );
    assert_eq!(
        fs::read(&state_path).unwrap(),
        before,
        "state.json unchanged"
    );
    let state: serde_json::Value = serde_json::from_slice(&before).unwrap();
    assert_eq!(
        (
            &state["current"],
            &state["previous"],
            &state["highest_installed"]
        ),
        (&"2.0.0".into(), &"1.0.0".into(), &"2.0.0".into())
    );
    assert!(!b.path("data/bundles/999.0.0").exists());

    // Every command that vouches for or changes what the appliance runs refuses it likewise.
    let data = b.data();
    for args in [
        vec!["rollback", "--keyring", &ring],
        vec!["bundle", "verify-installed", "--keyring", &ring],
        vec!["keyring", "rotate", "rogue/ring.json", "--keyring", &ring],
    ] {
        let mut args = args.clone();
        args.extend(["--data", &data]);
        let line = b.fails(&args);
        assert!(
            one_line(&line).contains("pinned keyring"),
            "{args:?}: {line}"
        );
    }
    assert_eq!(
        fs::read(&state_path).unwrap(),
        before,
        "state.json unchanged"
    );
    // Without --keyring, the pinned keyring refuses the rogue bundle on its merits.
    let line = b.fails(&["install", &rogue, "--data", &b.data()]);
    assert!(one_line(&line).contains("unknown key"), "{line}");
    assert_eq!(
        fs::read(&state_path).unwrap(),
        before,
        "state.json unchanged"
    );
    // Naming the pinned keyring itself is fine (another spelling of the same file).
    let pinned = b.path("data/keys/../keys/trusted.json");
    b.ok(&[
        "bundle",
        "verify-installed",
        "--keyring",
        pinned.to_str().unwrap(),
        "--data",
        &b.data(),
    ]);
}

#[test]
fn reinstalling_a_corrupted_copy_of_the_current_version_fails() {
    // Issue 19 F9: "already current; nothing to do" was said after the manifest alone.
    let b = Appliance::new();
    let (_, b1) = b.setup();
    b.ok(&["install", &b1, "--data", &b.data()]);
    let state_path = b.path("data/bundles/state.json");
    let before = fs::read(&state_path).unwrap();

    // One flipped byte in the model file inside the tar; metadata frame and signature intact.
    let bytes = fs::read(&b1).unwrap();
    let manifest: serde_json::Value =
        serde_json::from_str(&b.ok(&["bundle", "inspect", &b1, "--json"])).unwrap();
    let split = bytes.len() - manifest["payload_frame"]["size"].as_u64().unwrap() as usize;
    let mut tar = zstd::decode_all(&bytes[split..]).unwrap();
    let at = tar.windows(13).position(|w| w == b"weights 1.0.0").unwrap();
    tar[at + 3] ^= 0x01;
    let mut enc = zstd::stream::write::Encoder::new(Vec::new(), 3).unwrap();
    enc.include_checksum(true).unwrap();
    enc.window_log(airlock_bundle::format::WINDOW_LOG).unwrap();
    std::io::Write::write_all(&mut enc, &tar).unwrap();
    let mut corrupted = bytes[..split].to_vec();
    corrupted.extend_from_slice(&enc.finish().unwrap());
    let copy = b.path("copy-1.0.0.tar.zst");
    fs::write(&copy, corrupted).unwrap();

    let line = b.fails(&["install", copy.to_str().unwrap(), "--data", &b.data()]);
    let line = one_line(&line);
    assert!(
        line.contains("copy-1.0.0.tar.zst")
            && line.contains("models/embed/model.bin")
            && line.contains("SHA-256"),
        "{line}"
    );
    assert_eq!(
        fs::read(&state_path).unwrap(),
        before,
        "state.json unchanged"
    );
    let out = b.ok(&["install", &b1, "--data", &b.data()]);
    assert!(out.contains("already current"), "{out}");
}

/// (name, version) of every `[[package]]` in the workspace's Cargo.lock.
fn lock_versions() -> Vec<(String, String)> {
    let lock =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../Cargo.lock")).unwrap();
    let mut out = Vec::new();
    let mut name = None;
    for line in lock.lines() {
        if let Some(n) = line.strip_prefix("name = ") {
            name = Some(n.trim_matches('"').to_owned());
        } else if let Some(v) = line.strip_prefix("version = ")
            && let Some(n) = name.take()
        {
            out.push((n, v.trim_matches('"').to_owned()));
        }
    }
    out
}

#[test]
fn every_built_bundle_carries_the_binarys_sbom_in_its_manifest() {
    // Issue 19, supply chain: a CycloneDX SBOM of the airlock binary in every bundle.
    let b = Appliance::new();
    let (_, b1) = b.setup();
    let manifest: serde_json::Value =
        serde_json::from_str(&b.ok(&["bundle", "inspect", &b1, "--json"])).unwrap();
    let entry = manifest["files"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["path"] == "sbom.cdx.json")
        .unwrap_or_else(|| panic!("sbom.cdx.json not in the manifest: {manifest}"))
        .clone();
    b.ok(&["install", &b1, "--data", &b.data()]);
    let installed = fs::read(b.path("data/bundles/1.0.0/sbom.cdx.json")).unwrap();
    let digest = {
        use sha2::Digest;
        hex::encode(sha2::Sha256::digest(&installed))
    };
    assert_eq!(entry["sha256"], digest.as_str());
    assert_eq!(entry["size"], installed.len() as u64);
    // The same document as `airlock bundle sbom` prints.
    assert_eq!(b.ok(&["bundle", "sbom"]).as_bytes(), installed.as_slice());

    let sbom: serde_json::Value = serde_json::from_slice(&installed).unwrap();
    assert_eq!(sbom["bomFormat"], "CycloneDX");
    assert_eq!(sbom["specVersion"], "1.5");
    assert_eq!(sbom["metadata"]["component"]["name"], "airlock");
    let components = sbom["components"].as_array().unwrap();
    let lock = lock_versions();
    for name in ["tantivy", "axum", "rusqlite"] {
        let c = components
            .iter()
            .find(|c| c["name"] == name)
            .unwrap_or_else(|| panic!("{name} not in the SBOM"));
        let version = c["version"].as_str().unwrap();
        assert!(
            lock.iter().any(|(n, v)| n == name && v == version),
            "{name} {version} is not the Cargo.lock version"
        );
        assert_eq!(c["purl"], format!("pkg:cargo/{name}@{version}"));
        assert_eq!(c["hashes"][0]["alg"], "SHA-256");
        assert_eq!(c["hashes"][0]["content"].as_str().unwrap().len(), 64);
        assert!(c["licenses"][0]["expression"].is_string(), "{c}");
    }
    // Dev-dependencies are not linked into the binary, so not listed.
    assert!(!components.iter().any(|c| c["name"] == "proptest"));
    // A source directory may not smuggle its own SBOM in.
    let src = b.source("2.0.0");
    fs::write(PathBuf::from(&src).join("sbom.cdx.json"), "{}").unwrap();
    let err = b.fails(&[
        "bundle",
        "build",
        "--from",
        &src,
        "--version",
        "2.0.0",
        "--sign",
        "keys/ops.key",
        "--out",
        "x.tar.zst",
    ]);
    assert!(one_line(&err).contains("sbom.cdx.json"), "{err}");
}

#[test]
fn usage_errors_exit_2_and_help_exits_0() {
    let b = Appliance::new();
    assert_eq!(
        b.run(&["bundle", "build", "--from", "x"]).status.code(),
        Some(2)
    );
    assert_eq!(b.run(&["install"]).status.code(), Some(2));
    assert_eq!(b.run(&["bundle", "frobnicate"]).status.code(), Some(2));
    let help = b.run(&["bundle", "--help"]);
    assert_eq!(help.status.code(), Some(0));
    let text = String::from_utf8(help.stdout).unwrap();
    for cmd in ["build", "verify", "inspect", "list", "verify-installed"] {
        assert!(text.contains(cmd), "{cmd} missing from help: {text}");
    }
    // No pinned keyring: a clear failure, not a usage error.
    let err = b.fails(&["install", "nothing.tar.zst", "--data", &b.data()]);
    assert!(err.contains("no pinned keyring"), "{err}");
}

#[test]
fn key_rotation_replaces_the_pinned_keyring() {
    let b = Appliance::new();
    let (old_key, b1) = b.setup();
    b.ok(&["install", &b1, "--data", &b.data()]);
    let ring = b.path("data/keys/trusted.json");
    let old_id = serde_json::from_str::<serde_json::Value>(&fs::read_to_string(&ring).unwrap())
        .unwrap()["keys"][0]["key_id"]
        .as_str()
        .unwrap()
        .to_owned();

    // New key; draft keyring: add it, revoke the old one; sign with the OLD key; rotate.
    b.ok(&["keygen", "--out", "keys2", "--name", "new"]);
    fs::copy(&ring, b.path("draft.json")).unwrap();
    b.ok(&["keyring", "add", "draft.json", "--key", "keys2/new.pub"]);
    b.ok(&["keyring", "revoke", "draft.json", "--key-id", &old_id]);
    // Signed by the new key only: refused (not in the pinned keyring).
    b.ok(&[
        "keyring",
        "sign",
        "draft.json",
        "--sign",
        "keys2/new.key",
        "--out",
        "bad-rotation.json",
    ]);
    let line = b.fails(&[
        "keyring",
        "rotate",
        "bad-rotation.json",
        "--data",
        &b.data(),
    ]);
    assert!(one_line(&line).contains("threshold"), "{line}");
    b.ok(&[
        "keyring",
        "sign",
        "draft.json",
        "--sign",
        &old_key,
        "--out",
        "rotation.json",
    ]);
    let out = b.ok(&["keyring", "rotate", "rotation.json", "--data", &b.data()]);
    assert!(out.contains("version 1 -> 3"), "{out}");
    // Replaying the same rotation is refused (version not higher).
    b.fails(&["keyring", "rotate", "rotation.json", "--data", &b.data()]);

    // Bundles signed by the new key install; the old key no longer counts.
    let b2 = b.build("2.0.0", "keys2/new.key");
    b.ok(&["install", &b2, "--data", &b.data()]);
    let b3 = b.build("3.0.0", &old_key);
    let line = b.fails(&["install", &b3, "--data", &b.data()]);
    assert!(one_line(&line).contains("revoked"), "{line}");
}

/// Starts `airlock install` with a failpoint, waits until it reports the stage, SIGKILLs it.
fn kill_at(b: &Appliance, bundle: &str, stage: &str) {
    let mut child = Command::new(BIN)
        .args(["install", bundle, "--data", &b.data()])
        .env("AIRLOCK_FAILPOINT", stage)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let line = lines
        .next()
        .expect("the child reports the failpoint")
        .unwrap();
    assert_eq!(line, format!("failpoint {stage} reached"));
    child.kill().unwrap(); // SIGKILL
    let status = child.wait().unwrap();
    assert!(!status.success());
}

#[test]
fn install_killed_at_every_stage_leaves_the_old_version_usable() {
    for stage in [
        "after-first-file",
        "after-extract",
        "after-rename",
        "after-state-temp",
        "after-switch",
    ] {
        let b = Appliance::new();
        let (key, b1) = b.setup();
        b.ok(&["install", &b1, "--data", &b.data()]);
        let b2 = b.build("2.0.0", &key);

        kill_at(&b, &b2, stage);

        // The current version still verifies and loads (its catalogue file is readable).
        let expect = if stage == "after-switch" {
            "2.0.0"
        } else {
            "1.0.0"
        };
        let out = b.ok(&["bundle", "verify-installed", "--data", &b.data()]);
        assert!(out.contains(&format!("airlock {expect}")), "{stage}: {out}");
        let model = b.path(&format!("data/bundles/{expect}/models/embed/model.bin"));
        assert!(
            fs::read_to_string(model)
                .unwrap()
                .starts_with(&format!("weights {expect}")),
            "{stage}"
        );

        // Installing again completes (or is a no-op when the switch had happened).
        let out = b.ok(&["install", &b2, "--data", &b.data()]);
        assert!(out.contains("2.0.0"), "{stage}: {out}");
        b.ok(&["bundle", "verify-installed", "--data", &b.data()]);
        let leftovers: Vec<String> = fs::read_dir(b.path("data/bundles"))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with(".staging") || n.ends_with(".tmp"))
            .collect();
        assert!(leftovers.is_empty(), "{stage}: {leftovers:?}");
    }
}

#[test]
fn builds_are_reproducible_from_the_command_line() {
    let b = Appliance::new();
    b.ok(&["keygen", "--out", "keys", "--name", "ops"]);
    let src = b.source("1.0.0");
    for out in ["a.tar.zst", "b.tar.zst"] {
        b.ok(&[
            "bundle",
            "build",
            "--from",
            &src,
            "--version",
            "1.0.0",
            "--sign",
            "keys/ops.key",
            "--out",
            out,
            "--created",
            "2026-11-29T00:00:00Z",
            "--zstd-level",
            "9",
        ]);
    }
    assert_eq!(
        fs::read(b.path("a.tar.zst")).unwrap(),
        fs::read(b.path("b.tar.zst")).unwrap()
    );
}

/// Hard-links (or copies) `names` from `from` into `to`.
fn link_files(from: &std::path::Path, to: &std::path::Path, names: &[&str]) {
    fs::create_dir_all(to).unwrap();
    for n in names {
        if fs::hard_link(from.join(n), to.join(n)).is_err() {
            fs::copy(from.join(n), to.join(n)).unwrap();
        }
    }
}

#[test]
fn a_banks_own_model_is_staged_with_bundle_stage_built_and_verified() {
    let b = Appliance::new();
    let demo = crate::support::staging_dir();
    let staging = b.path("bank-staging");
    link_files(
        &demo.join("smollm2"),
        &staging.join("bank-gen"),
        &["model.gguf"],
    );
    let embed_files = ["model.safetensors", "config.json", "tokenizer.json"];
    link_files(
        &demo.join("minilm"),
        &staging.join("bank-embed"),
        &embed_files,
    );
    let s = staging.to_string_lossy().into_owned();

    // Refusals write no catalogue: a spec without an alias, a model id that is a path, a
    // generator directory without its GGUF, a provenance file missing a staged id.
    let catalogue = staging.join("catalogue.json");
    for (args, says) in [
        (vec!["--generator", "bank-gen"], "expected ID=ALIAS"),
        (vec!["--generator", "../x=bank-small"], "subdirectory name"),
        (
            vec!["--generator", "missing=bank-small"],
            "missing/model.gguf is missing",
        ),
        (vec![], "name the models to stage"),
    ] {
        let mut cmd = vec!["bundle", "stage", "--staging", &s];
        cmd.extend(args);
        let err = b.fails(&cmd);
        assert!(one_line(&err).contains(says), "{cmd:?}: {err}");
        assert!(!catalogue.exists(), "{cmd:?} wrote a catalogue");
    }
    fs::write(b.path("prov.json"), r#"{"bank-gen": {"package": "bank"}}"#).unwrap();
    let prov = b.path("prov.json").to_string_lossy().into_owned();
    let err = b.fails(&[
        "bundle",
        "stage",
        "--staging",
        &s,
        "--generator",
        "bank-gen=bank-small",
        "--embedder",
        "bank-embed=bank-embed",
        "--provenance",
        &prov,
    ]);
    assert!(
        one_line(&err).contains("no entry for \"bank-embed\""),
        "{err}"
    );
    assert!(!catalogue.exists());

    let out = b.ok(&[
        "bundle",
        "stage",
        "--staging",
        &s,
        "--generator",
        "bank-gen=bank-small",
        "--embedder",
        "bank-embed=bank-embed",
    ]);
    assert!(
        out.contains("bank-gen: generator bank-small") && out.contains("wrote "),
        "{out}"
    );
    assert!(staging.join("bank-gen/tokenizer.json").is_file());
    assert!(staging.join("bank-gen/chat_template.jinja").is_file());
    let cat: serde_json::Value = serde_json::from_slice(&fs::read(&catalogue).unwrap()).unwrap();
    let entries = cat
        .as_array()
        .or_else(|| cat["models"].as_array())
        .expect("entries");
    let by_alias = |a: &str| entries.iter().find(|e| e["alias"] == a).cloned();
    let generator = by_alias("bank-small").expect("the generator");
    assert_eq!(generator["role"], "generator");
    assert_eq!(generator["params"]["architecture"], "llama");
    assert_eq!(
        generator["params"]["provenance"]["source"],
        "operator-supplied"
    );
    assert_eq!(
        by_alias("bank-embed").expect("the embedder")["params"]["dim"],
        384
    );
    assert_eq!(
        by_alias("airlock-rerank").expect("the fallback reranker")["params"]["embedder"],
        "bank-embed"
    );

    // The staged directory is a bundle source: built, signed and verified.
    b.ok(&["keygen", "--out", "keys", "--name", "ops"]);
    b.ok(&[
        "keyring",
        "init",
        "--key",
        "keys/ops.pub",
        "--data",
        &b.data(),
    ]);
    let bundle = b.path("bank-1.0.0.tar.zst").to_string_lossy().into_owned();
    b.ok(&[
        "bundle",
        "build",
        "--from",
        &s,
        "--version",
        "1.0.0",
        "--sign",
        "keys/ops.key",
        "--out",
        &bundle,
        "--zstd-level",
        "1",
    ]);
    let out = b.ok(&["bundle", "verify", &bundle, "--data", &b.data()]);
    assert!(out.starts_with("ok "), "{out}");
    let out = b.ok(&["bundle", "inspect", &bundle]);
    assert!(
        out.contains("bank-small") && out.contains("bank-embed"),
        "{out}"
    );
}
