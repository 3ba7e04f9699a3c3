//! Safe upgrades (issue 26 point 7): upgrade → rollback → upgrade with real signed bundles, a
//! rollback refused by a migration its target cannot read (naming it, changing nothing), and an
//! index refused by another embedder.

use std::path::Path;

use crate::eval::installed_appliance;
use crate::support::airlock_cli as airlock;

fn ok(args: &[&str]) -> String {
    let out = airlock(args);
    assert!(
        out.status.success(),
        "airlock {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn fails(args: &[&str]) -> String {
    let out = airlock(args);
    assert!(!out.status.success(), "airlock {args:?} succeeded");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Builds the staged models into a bundle `version`, signed with the demo key.
fn bundle(dir: &Path, data: &Path, version: &str) -> String {
    let out = dir.join(format!("airlock-{version}.tar.zst"));
    ok(&[
        "bundle",
        "build",
        "--from",
        dir.join("staging").to_str().unwrap(),
        "--version",
        version,
        "--sign",
        data.join("demo/keys/demo.key").to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
    ]);
    out.to_str().unwrap().to_string()
}

fn current(data: &Path) -> String {
    let state: serde_json::Value =
        serde_json::from_slice(&std::fs::read(data.join("bundles/state.json")).unwrap()).unwrap();
    state["current"].as_str().unwrap().to_string()
}

/// Ingests one text document through the release now current (which verifies the bundle,
/// checks the index's embedder and marks the release).
fn ingest(dir: &Path, data: &Path, name: &str) {
    let file = dir.join(format!("{name}.txt"));
    std::fs::write(&file, format!("The {name} limit is 42 units.")).unwrap();
    ok(&[
        "ingest",
        "--data",
        data.to_str().unwrap(),
        file.to_str().unwrap(),
    ]);
}

#[test]
fn upgrade_rollback_upgrade_with_real_bundles_and_refusals_that_name_the_reason() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let data = installed_appliance(dir);
    let d = data.to_str().unwrap();
    let first = current(&data);
    ingest(dir, &data, "first");
    let marks = data.join("releases/schema-marks.json");
    assert!(marks.exists(), "the first release is marked");

    // Upgrade.
    let b = bundle(dir, &data, "0.2.0");
    ok(&["install", &b, "--data", d]);
    assert_eq!(current(&data), "0.2.0");
    ingest(dir, &data, "second");
    let m: serde_json::Value = serde_json::from_slice(&std::fs::read(&marks).unwrap()).unwrap();
    assert!(m["releases"][&first].is_object() && m["releases"]["0.2.0"].is_object());

    // Roll back: the first release reads this schema (same binary).
    let said = ok(&["rollback", "--data", d]);
    assert!(said.contains(&format!("to {first}")), "{said}");
    ingest(dir, &data, "third");

    // A target whose binary reads an older acl schema: refused, naming the migration, and the
    // install state is untouched.
    let original = std::fs::read(&marks).unwrap();
    let mut older = m.clone();
    let acl = older["releases"]["0.2.0"]["acl"].as_i64().unwrap();
    older["releases"]["0.2.0"]["acl"] = (acl - 1).into();
    std::fs::write(&marks, serde_json::to_vec(&older).unwrap()).unwrap();
    let state = std::fs::read(data.join("bundles/state.json")).unwrap();
    let err = fails(&["rollback", "--data", d]);
    assert!(err.contains(&format!("acl migration {acl}")), "{err}");
    assert!(err.contains("airlock restore"), "{err}");
    assert_eq!(
        std::fs::read(data.join("bundles/state.json")).unwrap(),
        state
    );
    // --force does not override a schema the target cannot read.
    fails(&["rollback", "--data", d, "--force"]);
    // A target that never ran here: refused unless forced.
    let mut unknown = m.clone();
    unknown["releases"].as_object_mut().unwrap().remove("0.2.0");
    std::fs::write(&marks, serde_json::to_vec(&unknown).unwrap()).unwrap();
    let err = fails(&["rollback", "--data", d]);
    assert!(
        err.contains("never started on this data directory"),
        "{err}"
    );
    std::fs::write(&marks, &original).unwrap();

    // Upgrade again: back to 0.2.0, then a newer release.
    ok(&["rollback", "--data", d]);
    assert_eq!(current(&data), "0.2.0");
    let c = bundle(dir, &data, "0.3.0");
    ok(&["install", &c, "--data", d]);
    assert_eq!(current(&data), "0.3.0");
    ingest(dir, &data, "fourth");
    let list = ok(&["bundle", "list", "--data", d]);
    assert!(list.contains("0.3.0"), "{list}");

    // The index's vectors came from the staged MiniLM: an embedder with other files is refused
    // (simulated by the record, which is what start-up compares) and nothing is ingested.
    let rec = data.join("releases/embedder.json");
    let mut e: serde_json::Value = serde_json::from_slice(&std::fs::read(&rec).unwrap()).unwrap();
    assert_eq!(e["model"], "minilm");
    e["digest"] = "sha256:0000".into();
    std::fs::write(&rec, serde_json::to_vec(&e).unwrap()).unwrap();
    let file = dir.join("fifth.txt");
    std::fs::write(&file, "The fifth limit is 7 units.").unwrap();
    let err = fails(&["ingest", "--data", d, file.to_str().unwrap()]);
    assert!(
        err.contains("vectors of two models cannot be searched together"),
        "{err}"
    );
}
