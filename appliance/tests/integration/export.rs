//! The signed eval export through the real `airlock` binary: four eyes (two different admins,
//! each proving it with their own token), the audit record, content-freedom, and off-box
//! verification that fails on a tampered byte or a flipped metric.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Command, Output};

use airlock_eval::gate::Report;
use airlock_eval::metrics::CaseScore;

const BIN: &str = env!("CARGO_BIN_EXE_airlock");

fn run<S: AsRef<std::ffi::OsStr> + std::fmt::Debug>(dir: &Path, args: &[S]) -> Output {
    Command::new(BIN)
        .args(args)
        .env_remove("AIRLOCK_DATA")
        .current_dir(dir)
        .output()
        .unwrap()
}

fn ok<S: AsRef<std::ffi::OsStr> + std::fmt::Debug>(dir: &Path, args: &[S]) -> String {
    let out = run(dir, args);
    assert!(
        out.status.success(),
        "airlock {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

fn refused<S: AsRef<std::ffi::OsStr> + std::fmt::Debug>(dir: &Path, args: &[S]) -> String {
    let out = run(dir, args);
    assert!(!out.status.success(), "airlock {args:?} succeeded");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn case(id: &str, kind: &str, hit: Option<bool>, abstained: Option<bool>) -> CaseScore {
    CaseScore {
        id: id.into(),
        kind: kind.into(),
        phase: "v1".into(),
        ndcg_10: Some(1.0),
        recall_10: Some(1.0),
        recall_100: None,
        mrr_10: Some(1.0),
        answer_hit: hit,
        citation_precision: Some(1.0),
        citation_recall: Some(1.0),
        abstained,
        leaks: Vec::new(),
        error: None,
        retrieved: vec!["doc-quarterly-secret".into()],
        cited: vec!["doc-quarterly-secret".into()],
        answer: Some("The covenant is 4.10x for Fairhaven".into()),
        invented_values: None,
        answer_words: None,
    }
}

#[test]
fn an_export_needs_two_admins_is_audited_holds_no_content_and_verifies_off_box() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let data = dir.join("data");
    let data_s = data.to_str().unwrap();
    // The appliance key is made at install; this data dir has users only, so make it here.
    airlock_evidence::appliance_key::ensure(&data).unwrap();
    let token = |user: &str, admin: bool| {
        let mut args = vec!["user", "add", user, "--data", data_s];
        if admin {
            args.push("--admin");
        }
        let t = ok(dir, &args);
        let path = dir.join(format!("{user}.token"));
        std::fs::write(&path, t.trim()).unwrap();
        path.to_str().unwrap().to_string()
    };
    let (olga, adam, eve) = (
        token("olga", true),
        token("adam", true),
        token("eve", false),
    );
    // A report and its set.
    let set = dir.join("set");
    std::fs::create_dir_all(&set).unwrap();
    std::fs::write(set.join("golden.jsonl"), "{\"id\": \"hb-0001\"}\n").unwrap();
    let mut lat = BTreeMap::new();
    lat.insert("chat".to_string(), vec![900.0, 1200.0]);
    let report = Report::new(
        "bank-dev",
        Some("0.1.0".into()),
        Some(0),
        vec![
            case("hb-0001", "answerable", Some(true), None),
            case("hb-0002", "injection", None, Some(true)),
        ],
        &lat,
    );
    let report_path = dir.join("report.json");
    std::fs::write(&report_path, serde_json::to_vec(&report).unwrap()).unwrap();
    let out = dir.join("export.json");
    let args = |tok: &str, approver: &str, approver_tok: &str| -> Vec<String> {
        [
            "eval",
            "export",
            "--data",
            data_s,
            "--report",
            report_path.to_str().unwrap(),
            "--set",
            set.to_str().unwrap(),
            "--token-file",
            tok,
            "--approved-by",
            approver,
            "--approver-token-file",
            approver_tok,
            "--out",
            out.to_str().unwrap(),
        ]
        .map(String::from)
        .to_vec()
    };
    let audit_exports = || {
        ok(dir, &["audit", "--data", data_s])
            .lines()
            .filter(|l| l.contains("eval_export"))
            .count()
    };
    let call = |v: Vec<String>| refused(dir, &v);
    // One person cannot approve their own export.
    let e = call(args(&olga, "olga", &olga));
    assert!(e.contains("four eyes"), "{e}");
    // A claimed approver whose token is someone else's.
    let e = call(args(&olga, "adam", &olga));
    assert!(e.contains("another user"), "{e}");
    // A non-admin approver.
    let e = call(args(&olga, "eve", &eve));
    assert!(e.contains("neither the operator nor the admin role"), "{e}");
    // A forged token.
    std::fs::write(dir.join("forged.token"), "al_forged").unwrap();
    let e = call(args(
        &olga,
        "adam",
        dir.join("forged.token").to_str().unwrap(),
    ));
    assert!(e.contains("not valid"), "{e}");
    // Refusals wrote nothing and recorded nothing.
    assert!(!out.exists());
    assert_eq!(audit_exports(), 0);

    let good = args(&olga, "adam", &adam);
    ok(dir, &good);
    assert_eq!(audit_exports(), 1);
    let bytes = std::fs::read(&out).unwrap();
    let text = String::from_utf8(bytes.clone()).unwrap();
    for secret in ["hb-0001", "doc-quarterly-secret", "Fairhaven", "4.10x"] {
        assert!(!text.contains(secret), "{secret} is in the export");
    }
    assert!(text.contains("\"injection\""), "custom kinds are reported");
    // An existing export is never overwritten.
    let e = refused(dir, &good);
    assert!(e.contains("never overwritten"), "{e}");

    // Off-box: verifies with the appliance's public key only.
    let public = data.join("keys").join("appliance.pub");
    let public_s = public.to_str().unwrap();
    let verify = |file: &Path| {
        run(
            dir,
            &[
                "eval",
                "verify-export",
                file.to_str().unwrap(),
                "--appliance-key",
                public_s,
            ],
        )
    };
    let v = verify(&out);
    assert!(v.status.success(), "{}", String::from_utf8_lossy(&v.stderr));
    let shown = String::from_utf8_lossy(&v.stdout);
    assert!(shown.contains("approved by adam"), "{shown}");
    // One byte changed.
    let mut t = bytes.clone();
    let at = text.find("\"cases\"").unwrap() + 10;
    t[at] ^= 0x01;
    let tampered = dir.join("tampered.json");
    std::fs::write(&tampered, &t).unwrap();
    assert_eq!(verify(&tampered).status.code(), Some(1));
    // One metric flipped in place, the file otherwise as written (still canonical).
    let metric = text.find("\"answer_hit_rate\"").unwrap();
    let value = metric + text[metric..].find("\"mean\": ").unwrap() + "\"mean\": ".len();
    let end = value + text[value..].find(',').unwrap();
    assert_eq!(&text[value..end], "1.0");
    let flipped = format!("{}0.25{}", &text[..value], &text[end..]);
    std::fs::write(&tampered, &flipped).unwrap();
    let v = verify(&tampered);
    assert_eq!(v.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&v.stderr).contains("signature does not verify"),
        "{}",
        String::from_utf8_lossy(&v.stderr)
    );
}
