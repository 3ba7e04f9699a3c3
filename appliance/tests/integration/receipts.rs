//! Per-answer receipts (issue 26 point 3) with the real SmolLM2 engine, and the SIEM export and
//! sink (point 5) through the real `airlock` binary and real SQLite.

use std::path::Path;
use std::process::{Command, Output};

use airlock_acl::{AuditQuery, Role};
use axum::http::{Method, StatusCode};
use serde_json::{Value, json};

use crate::support::TestApp;

const BIN: &str = env!("CARGO_BIN_EXE_airlock");

fn run<S: AsRef<std::ffi::OsStr> + std::fmt::Debug>(dir: &Path, args: &[S]) -> Output {
    Command::new(BIN)
        .args(args)
        .env_remove("AIRLOCK_DATA")
        .env_remove("AIRLOCK_CONFIG")
        .current_dir(dir)
        .output()
        .unwrap()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

const SECRET_TEXT: &str = "OSPREY-4411";

async fn seed(t: &TestApp) {
    for (id, title, text, group) in [
        (
            "doc-risk",
            "Liquidity buffer policy",
            "The liquidity buffer must stay above 15 percent of deposits at all times. \
             Codename OSPREY-4411.",
            "risk",
        ),
        (
            "doc-hr",
            "Parental leave",
            "Parental leave lasts twenty weeks at full pay for all staff.",
            "hr",
        ),
    ] {
        let r = t
            .call(
                Method::PUT,
                &format!("/v1/documents/{id}"),
                Some(&t.admin),
                Some(
                    json!({"title": title, "text": text, "acl": {"users": [], "groups": [group]}}),
                ),
            )
            .await;
        assert_eq!(r.status, StatusCode::CREATED, "{}", r.text);
    }
}

fn ask(question: &str, stream: bool) -> Value {
    json!({
        "messages": [{"role": "user", "content": question}],
        "max_tokens": 8,
        "stream": stream,
    })
}

/// The SSE events' JSON (comments and `[DONE]` left out).
fn events(raw: &str) -> Vec<Value> {
    raw.split("\n\n")
        .filter_map(|e| e.trim().strip_prefix("data: "))
        .filter(|d| *d != "[DONE]")
        .map(|d| serde_json::from_str(d).unwrap())
        .collect()
}

async fn receipt(t: &TestApp, token: &str, id: &str) -> (Value, String) {
    let r = t
        .call(
            Method::GET,
            &format!("/v1/receipts/{id}"),
            Some(token),
            None,
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert_eq!(r.headers.get("content-type").unwrap(), "application/json");
    (r.json["receipt"].clone(), r.text)
}

fn ids(v: &Value, field: &str) -> Vec<(u64, String)> {
    v[field]
        .as_array()
        .unwrap_or_else(|| panic!("no {field} in {v}"))
        .iter()
        .map(|d| {
            (
                d["n"].as_u64().unwrap(),
                d["doc_id"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_answer_has_a_signed_receipt_of_what_it_showed_and_cited() {
    let t = TestApp::new();
    seed(&t).await;
    let rita = t.user("rita", &["risk"]);
    let aud = t.add_user("aud", &[], vec![Role::Auditor]);
    let services = t.state.services().unwrap();
    let question = "What is the minimum liquidity buffer?";

    // 1. A non-streaming answer: its receipt names exactly what it showed and cited.
    let r = t
        .call(
            Method::POST,
            "/v1/chat/completions",
            Some(&rita),
            Some(ask(question, false)),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    let a = &r.json["airlock"];
    let id1 = a["receipt_id"].as_str().expect("a receipt id").to_string();
    assert!(airlock_evidence::receipts::valid_id(&id1), "{id1}");
    let (r1, body1) = receipt(&t, &aud, &id1).await;
    assert_eq!(r1["receipt_id"], id1);
    assert_eq!(r1["user_id"], "rita");
    assert_eq!(r1["request_id"], r.json["id"]);
    assert_eq!(r1["outcome"], "answered");
    assert_eq!(r1["model"]["alias"], "airlock-small");
    assert_eq!(r1["model"]["model_id"], "smollm2");
    assert_eq!(r1["model"]["served_by"], "local");
    assert_eq!(r1["bundle"]["version"], "1.0.0-test");
    assert_eq!(
        r1["index_generation"],
        services.retrieval.stats().index_generation
    );
    assert_eq!(r1["acl_state_seq"], services.acl.state_seq());
    let shown: Vec<(u64, String)> = a["citations"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            (
                c["n"].as_u64().unwrap(),
                c["doc_id"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    assert!(!shown.is_empty());
    assert_eq!(ids(&r1, "shown"), shown, "{r1}");
    for d in r1["shown"].as_array().unwrap() {
        let now = services
            .retrieval
            .document(d["doc_id"].as_str().unwrap())
            .unwrap()
            .unwrap();
        assert_eq!(d["version"], now.version, "{d}");
    }
    let cited: Vec<u64> = a["cited"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n.as_u64().unwrap())
        .collect();
    let want: Vec<(u64, String)> = shown
        .iter()
        .filter(|(n, _)| cited.contains(n))
        .cloned()
        .collect();
    assert_eq!(ids(&r1, "cited"), want, "{r1}");
    assert_eq!(r1["cited_by"], a["cited_by"]);
    let digest1 = r1["prompt_sha256"].as_str().unwrap().to_string();
    assert!(
        digest1.starts_with("sha256:") && digest1.len() == 71,
        "{digest1}"
    );
    // Ids, versions and digests only: no question, title or document text.
    for text in [question, "liquidity", "Liquidity", SECRET_TEXT, "deposits"] {
        assert!(!body1.contains(text), "{text:?} in {body1}");
    }

    // 2. The same question streamed: the same prompt (the same digest); the receipt id comes on
    // the first event and the cited sources equal the last event's.
    let s = t
        .call(
            Method::POST,
            "/v1/chat/completions",
            Some(&rita),
            Some(ask(question, true)),
        )
        .await;
    assert_eq!(s.status, StatusCode::OK, "{}", s.text);
    let ev = events(&s.text);
    let id2 = ev[0]["airlock"]["receipt_id"].as_str().unwrap().to_string();
    assert_ne!(id2, id1);
    let end = &ev.last().unwrap()["airlock"];
    let (r2, _) = receipt(&t, &aud, &id2).await;
    assert_eq!(
        r2["prompt_sha256"],
        digest1.as_str(),
        "same prompt, same digest"
    );
    assert_eq!(r2["request_id"], ev[0]["id"]);
    let end_cited: Vec<u64> = end["cited"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n.as_u64().unwrap())
        .collect();
    let got: Vec<u64> = ids(&r2, "cited").iter().map(|(n, _)| *n).collect();
    assert_eq!(got, end_cited, "{r2}");
    assert_eq!(
        r2["finish"],
        ev.last().unwrap()["choices"][0]["finish_reason"]
    );

    // 3. Another prompt (a system message added): another digest.
    let mut other = ask(question, false);
    other["messages"] = json!([
        {"role": "system", "content": "Answer in one short sentence."},
        {"role": "user", "content": question},
    ]);
    let o = t
        .call(
            Method::POST,
            "/v1/chat/completions",
            Some(&rita),
            Some(other),
        )
        .await;
    assert_eq!(o.status, StatusCode::OK, "{}", o.text);
    let (r3, _) = receipt(&t, &aud, o.json["airlock"]["receipt_id"].as_str().unwrap()).await;
    assert_ne!(r3["prompt_sha256"], digest1.as_str(), "the prompt changed");

    // 4. Rita loses the document: her next answer is an abstention with a receipt (zero
    // documents), under a newer ACL state; her old receipts still carry no text, and she may
    // not fetch receipts at all.
    let seq_before = services.acl.state_seq();
    let g = t
        .call(
            Method::PUT,
            "/v1/acl/documents/doc-risk",
            Some(&t.admin),
            Some(json!({"users": [], "groups": ["nobody"]})),
        )
        .await;
    assert!(g.status.is_success(), "{}", g.text);
    let n = t
        .call(
            Method::POST,
            "/v1/chat/completions",
            Some(&rita),
            Some(ask(question, false)),
        )
        .await;
    assert_eq!(n.status, StatusCode::OK, "{}", n.text);
    let id4 = n.json["airlock"]["receipt_id"]
        .as_str()
        .unwrap()
        .to_string();
    let (r4, _) = receipt(&t, &aud, &id4).await;
    assert_eq!(r4["outcome"], "abstained", "{r4}");
    assert_eq!(r4["shown"], json!([]));
    assert_eq!(r4["cited"], json!([]));
    assert_eq!(r4["cited_by"], "no_source");
    assert_eq!(r4["prompt_sha256"], Value::Null, "nothing was generated");
    assert!(r4["acl_state_seq"].as_i64().unwrap() > seq_before, "{r4}");
    let refused = t
        .call(
            Method::GET,
            &format!("/v1/receipts/{id1}"),
            Some(&rita),
            None,
        )
        .await;
    assert_eq!(refused.status, StatusCode::FORBIDDEN, "{}", refused.text);
    assert!(!refused.text.contains("doc-risk"));
    let (again, body_again) = receipt(&t, &t.admin, &id1).await;
    assert_eq!(
        again["shown"], r1["shown"],
        "a receipt is history: it does not change"
    );
    assert!(!body_again.contains(SECRET_TEXT));

    // 5. Unknown and malformed ids: problems.
    t.call(
        Method::GET,
        "/v1/receipts/rcpt-00000000000000000000000000000000",
        Some(&aud),
        None,
    )
    .await
    .assert_problem(404, "not-found", "no receipt has this id");
    t.call(Method::GET, "/v1/receipts/rcpt-XYZ", Some(&aud), None)
        .await
        .assert_problem(
            400,
            "invalid-request",
            "`rcpt-XYZ` is not a receipt id (`rcpt-` and 32 lowercase hex digits)",
        );

    // 6. The receipts are audit entries (kind `receipt`), without text.
    let audit = t
        .call(Method::GET, "/v1/audit?kind=receipt", Some(&aud), None)
        .await;
    assert_eq!(audit.status, StatusCode::OK, "{}", audit.text);
    // Four served entries (one an abstention) and three completed ones.
    assert_eq!(
        audit.json["entries"].as_array().unwrap().len(),
        7,
        "{}",
        audit.text
    );
    assert!(!audit.text.contains(SECRET_TEXT) && !audit.text.contains(question));

    // 7. Off-box: the saved body verifies with the appliance's public key; one changed byte or
    // one changed field does not.
    let dir = tempfile::tempdir().unwrap();
    let public = t._dir.path().join("keys/appliance.pub");
    let file = dir.path().join("receipt.json");
    std::fs::write(&file, &body1).unwrap();
    let verify = |f: &Path| {
        run(
            dir.path(),
            &[
                "receipt",
                "verify",
                f.to_str().unwrap(),
                "--appliance-key",
                public.to_str().unwrap(),
            ],
        )
    };
    let out = verify(&file);
    assert!(out.status.success(), "{}", stderr(&out));
    let printed: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(printed, r1);
    // One byte: the user id's first letter.
    let tampered = dir.path().join("byte.json");
    std::fs::write(&tampered, body1.replacen("\"rita\"", "\"sita\"", 1)).unwrap();
    let out = verify(&tampered);
    assert!(!out.status.success());
    assert!(stderr(&out).contains("refused"), "{}", stderr(&out));
    // One field, still in canonical form: a shown document's version.
    let version = r1["shown"][0]["version"].as_str().unwrap();
    let flipped_version = format!(
        "{}{}",
        &version[..version.len() - 1],
        if version.ends_with('0') { '1' } else { '0' }
    );
    let flipped = dir.path().join("field.json");
    std::fs::write(&flipped, body1.replacen(version, &flipped_version, 1)).unwrap();
    let out = verify(&flipped);
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("the signature does not verify"),
        "{}",
        stderr(&out)
    );
    // Another appliance's key.
    let other_key = dir.path().join("other");
    let out = run(
        dir.path(),
        &[
            "keygen",
            "--out",
            other_key.to_str().unwrap(),
            "--name",
            "other",
        ],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let out = run(
        dir.path(),
        &[
            "receipt",
            "verify",
            file.to_str().unwrap(),
            "--appliance-key",
            other_key.join("other.pub").to_str().unwrap(),
        ],
    );
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("not by the given appliance key"),
        "{}",
        stderr(&out)
    );
    let total = services
        .acl
        .audit_query(&AuditQuery {
            kind: Some(airlock_acl::AuditKind::Receipt),
            ..AuditQuery::default()
        })
        .unwrap()
        .len();
    assert_eq!(total, 7);
}

fn lines_of(p: &Path) -> Vec<String> {
    match std::fs::read_to_string(p) {
        Ok(s) => s.lines().map(str::to_owned).collect(),
        Err(_) => Vec::new(),
    }
}

#[test]
fn the_siem_export_and_the_sink_write_the_same_lines_and_the_sink_rotates() {
    use airlock_evidence::audit_sink::{AuditSinkConfig, attach};
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    std::fs::create_dir_all(&data).unwrap();
    let siem = dir.path().join("siem");
    std::fs::create_dir_all(&siem).unwrap();
    let path = siem.join("audit.jsonl");
    let cfg = AuditSinkConfig {
        path: path.clone(),
        max_bytes: 400,
        keep: 2,
    };
    let since = time::OffsetDateTime::now_utc() - time::Duration::seconds(1);
    let db = data.join("airlock.db");
    let acl = airlock_acl::Acl::open(&db).unwrap();
    attach(&acl, &cfg).unwrap();
    acl.add_user(
        "cli",
        "u017",
        &airlock_acl::NewUser {
            groups: vec!["risk".into()],
            roles: vec![],
            local: true,
        },
    )
    .unwrap();
    // Written as it is committed: the file already ends with the change's entry.
    let newest = acl.audit_query(&AuditQuery::default()).unwrap();
    let last: Value = serde_json::from_str(lines_of(&path).last().unwrap()).unwrap();
    assert_eq!(last["seq"], newest.last().unwrap().seq);
    assert_eq!(last["detail"]["action"], "user_add");
    for i in 0..12 {
        acl.audit_shown(&format!("req-{i}"), "u017", &["doc-1", "doc-2"])
            .unwrap();
    }
    acl.audit_receipt(
        "req-r",
        "u017",
        json!({"receipt_id": "rcpt-0123456789abcdef0123456789abcdef", "phase": "served"}),
    )
    .unwrap();
    // Rotated at 400 bytes, keeping path.1 and path.2.
    let rotated = |n: u32| siem.join(format!("audit.jsonl.{n}"));
    assert!(rotated(1).exists() && rotated(2).exists());
    assert!(!rotated(3).exists(), "keep = 2");
    for p in [path.clone(), rotated(1), rotated(2)] {
        let len = std::fs::metadata(&p).unwrap().len();
        assert!(len > 0 && len <= 400, "{}: {len} bytes", p.display());
    }
    let mut sunk: Vec<String> = Vec::new();
    for p in [rotated(2), rotated(1), path.clone()] {
        sunk.extend(lines_of(&p));
    }

    // The export: one line per entry, the sink's lines exactly (the same format).
    let all = acl.audit_query(&AuditQuery::default()).unwrap();
    let since_s = since
        .format(&time::format_description::well_known::Rfc3339)
        .unwrap();
    let out = dir.path().join("export.jsonl");
    let o = run(
        dir.path(),
        &[
            "audit",
            "export",
            "--data",
            data.to_str().unwrap(),
            "--since",
            &since_s,
            "--format",
            "jsonl",
            "--out",
            out.to_str().unwrap(),
        ],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let exported = lines_of(&out);
    assert_eq!(exported.len(), all.len());
    assert!(
        exported.ends_with(&sunk),
        "the sink's lines are the export's"
    );
    for (l, e) in exported.iter().zip(&all) {
        let v: Value = serde_json::from_str(l).unwrap();
        assert_eq!(v["seq"], e.seq);
        let keys: Vec<&str> = v.as_object().unwrap().keys().map(String::as_str).collect();
        let mut want = [
            "seq",
            "at",
            "kind",
            "actor",
            "user_id",
            "request_id",
            "detail",
        ];
        want.sort_unstable();
        let mut keys = keys;
        keys.sort_unstable();
        assert_eq!(keys, want, "{l}");
    }
    assert!(exported.iter().any(|l| l.contains("\"kind\":\"receipt\"")));
    // --until before the first entry: nothing.
    let early = dir.path().join("early.jsonl");
    let o = run(
        dir.path(),
        &[
            "audit",
            "export",
            "--data",
            data.to_str().unwrap(),
            "--since",
            "2000-01-01T00:00:00Z",
            "--until",
            "2000-01-02T00:00:00Z",
            "--out",
            early.to_str().unwrap(),
        ],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(lines_of(&early).is_empty());

    // Bad arguments: a clear error, a non-zero exit, nothing written.
    for (args, says) in [
        (vec!["--since", "yesterday"], "is not an RFC 3339 instant"),
        (vec!["--since", "2026-05-01"], "is not an RFC 3339 instant"),
        (
            vec![
                "--since",
                "2026-05-02T00:00:00Z",
                "--until",
                "2026-05-01T00:00:00Z",
            ],
            "--until must be later than --since",
        ),
        (
            vec!["--since", &since_s, "--format", "csv"],
            "invalid value 'csv'",
        ),
    ] {
        let bad = dir.path().join("bad.jsonl");
        let mut full = vec!["audit", "export", "--data", data.to_str().unwrap()];
        full.extend(args.iter().copied());
        full.extend(["--out", bad.to_str().unwrap()]);
        let o = run(dir.path(), &full);
        assert!(!o.status.success(), "{full:?}");
        assert!(stderr(&o).contains(says), "{full:?}: {}", stderr(&o));
        assert!(!bad.exists() && !dir.path().join("bad.jsonl.partial").exists());
    }
    // An existing --out is never overwritten.
    let o = run(
        dir.path(),
        &[
            "audit",
            "export",
            "--data",
            data.to_str().unwrap(),
            "--since",
            &since_s,
            "--out",
            out.to_str().unwrap(),
        ],
    );
    assert!(!o.status.success());
    assert_eq!(lines_of(&out), exported);

    // Restarted: the sink continues after the last entry its file holds (no line twice, none
    // skipped), including entries another process appended meanwhile.
    drop(acl);
    let other = airlock_acl::Acl::open(&db).unwrap();
    other.audit_shown("req-cli", "u017", &["doc-3"]).unwrap();
    drop(other);
    let acl = airlock_acl::Acl::open(&db).unwrap();
    attach(&acl, &cfg).unwrap();
    acl.audit_shown("req-after", "u017", &["doc-4"]).unwrap();
    let mut seqs: Vec<i64> = Vec::new();
    for p in [rotated(2), rotated(1), path.clone()] {
        for l in lines_of(&p) {
            seqs.push(
                serde_json::from_str::<Value>(&l).unwrap()["seq"]
                    .as_i64()
                    .unwrap(),
            );
        }
    }
    assert!(seqs.windows(2).all(|w| w[1] == w[0] + 1), "{seqs:?}");
    let newest = acl.audit_query(&AuditQuery::default()).unwrap();
    assert_eq!(*seqs.last().unwrap(), newest.last().unwrap().seq);
}

#[test]
fn a_bad_audit_sink_is_refused_at_start() {
    let dir = tempfile::tempdir().unwrap();
    for (section, says) in [
        (
            "[audit_sink]\npath = \"audit.jsonl\"\nmax_bytes = 0\n",
            "audit_sink",
        ),
        (
            "[audit_sink]\npath = \"/nonexistent-airlock-dir/audit.jsonl\"\n",
            "cannot open /nonexistent-airlock-dir/audit.jsonl for appending",
        ),
        (
            "[audit_sink]\npath = \"a.jsonl\"\nkeep = 0\n",
            "`keep` must be between 1 and 1000",
        ),
    ] {
        let cfg = dir.path().join("airlock.toml");
        std::fs::write(&cfg, section).unwrap();
        let o = run(
            dir.path(),
            &[
                "serve",
                "--config",
                cfg.to_str().unwrap(),
                "--data",
                dir.path().join("data").to_str().unwrap(),
                "--port",
                "0",
            ],
        );
        assert!(!o.status.success(), "{section}");
        assert!(stderr(&o).contains(says), "{section}: {}", stderr(&o));
    }
}
