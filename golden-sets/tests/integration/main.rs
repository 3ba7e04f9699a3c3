//! End-to-end tests of the runner against a deliberately leaking fake daemon: proves the leak
//! detector and the gate fire on what a real daemon would return over HTTP. (The real daemon is
//! exercised by the appliance's eval tests.)

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::path::Path;
use std::time::Duration;

use airlock_eval::client::Client;
use airlock_eval::gate::{Baseline, GateFailure, gate};
use airlock_eval::runner::{GoldenSet, RunOptions, run_golden};
use serde_json::{Value, json};

/// Serves `/v1/retrieve` and `/v1/chat/completions`; when `leak` is set, every answer cites
/// `doc-secret` and quotes `CANARY-1`, as a broken ACL would.
fn fake_daemon(leak: bool) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            let mut reader = BufReader::new(stream.try_clone().unwrap());
            let mut request_line = String::new();
            reader.read_line(&mut request_line).unwrap();
            let mut len = 0usize;
            let mut auth = String::new();
            loop {
                let mut h = String::new();
                reader.read_line(&mut h).unwrap();
                if h == "\r\n" || h.is_empty() {
                    break;
                }
                let lower = h.to_ascii_lowercase();
                if let Some(v) = lower.strip_prefix("content-length:") {
                    len = v.trim().parse().unwrap();
                }
                if lower.starts_with("authorization:") {
                    auth = h.trim().to_owned();
                }
            }
            let mut body = vec![0; len];
            reader.read_exact(&mut body).unwrap();
            let (status, out) = if auth.ends_with("tok-admin")
                && request_line.starts_with("POST /v1/acl/sync")
            {
                // The runner applies the set's phase transitions (here: an empty iam_v2).
                (
                    200,
                    json!({"users_added": 0, "users_removed": 0, "memberships_changed": 0, "grants_changed": 0, "users_access_changed": 0}),
                )
            } else if !auth.ends_with("tok-u1") {
                (
                    401,
                    json!({"type": "https://airlock.local/problems/unauthorized", "title": "Unauthorized", "status": 401, "detail": "unknown token"}),
                )
            } else if request_line.contains("/v1/retrieve") {
                let mut results = vec![
                    json!({"doc_id": "doc-public", "chunk_id": 1, "title": "Public", "snippet": "The limit is 42 minutes.", "score": 0.9}),
                ];
                if leak {
                    results.push(json!({"doc_id": "doc-secret", "chunk_id": 2, "title": "Secret", "snippet": "code CANARY-1", "score": 0.8}));
                }
                (
                    200,
                    json!({"results": results, "rung": 0, "timings_ms": {"bm25": 0.5}}),
                )
            } else {
                let answer = if leak {
                    "It is 42 minutes (see CANARY-1) [1]."
                } else {
                    "It is 42 minutes [1]."
                };
                (
                    200,
                    json!({
                        "choices": [{"index": 0, "message": {"role": "assistant", "content": answer}, "finish_reason": "stop"}],
                        "airlock": {"citations": [{"n": 1, "doc_id": "doc-public", "chunk_id": 1, "title": "Public", "snippet": "The limit is 42 minutes.", "score": 0.9}], "rung": 0, "bundle_version": "1.0.0"}
                    }),
                )
            };
            let text = out.to_string();
            let _ = write!(
                stream,
                "HTTP/1.1 {status} X\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{text}",
                text.len()
            );
        }
    });
    format!("http://{addr}")
}

fn write_set(dir: &Path) {
    let case = |id: &str, relevant: Value, contains: Value| {
        json!({"id": id, "user": "u1", "query": "What is the limit?", "relevant_doc_ids": relevant,
               "answer_contains": contains, "forbidden_doc_ids": ["doc-secret"],
               "forbidden_strings": ["CANARY-1"], "phase": "v1", "kind": "answerable",
               "valid_phases": ["v1", "v2", "after_delete"]})
        .to_string()
    };
    std::fs::write(
        dir.join("golden.jsonl"),
        format!(
            "{}\n{}\n",
            case("c1", json!(["doc-public"]), json!(["42 minutes"])),
            case("c2", json!(["doc-public"]), json!(["42 minutes"]))
        ),
    )
    .unwrap();
    std::fs::write(dir.join("corpus.jsonl"), "").unwrap();
    std::fs::write(dir.join("iam_v1.jsonl"), "").unwrap();
    std::fs::write(dir.join("iam_v2.jsonl"), "").unwrap();
    std::fs::write(dir.join("deletions.json"), "[]").unwrap();
}

fn run(leak: bool) -> airlock_eval::gate::Report {
    run_recording(leak, false)
}

fn run_recording(leak: bool, record_answers: bool) -> airlock_eval::gate::Report {
    let dir = tempfile::tempdir().unwrap();
    write_set(dir.path());
    let set = GoldenSet::read(dir.path()).unwrap();
    let client = Client::new(&fake_daemon(leak), Duration::from_secs(10));
    let mut tokens = BTreeMap::from([
        ("admin".to_owned(), "tok-admin".to_owned()),
        ("u1".to_owned(), "tok-u1".to_owned()),
    ]);
    let opts = RunOptions {
        setup: false,
        record_answers,
        ..RunOptions::default()
    };
    run_golden(&client, &set, &mut tokens, &opts, &|_, _, _| {}).unwrap()
}

#[test]
fn reports_keep_document_ids_always_and_answers_only_when_asked() {
    let plain = run(true);
    let c = &plain.cases[0];
    assert_eq!(c.retrieved, ["doc-public", "doc-secret"]);
    assert_eq!(c.cited, ["doc-public"]);
    assert_eq!(
        c.answer, None,
        "answers quote documents: not kept by default"
    );
    let json = serde_json::to_string(&plain).unwrap();
    assert!(!json.contains("42 minutes"), "no answer text in the report");

    let recorded = run_recording(true, true);
    assert_eq!(
        recorded.cases[0].answer.as_deref(),
        Some("It is 42 minutes (see CANARY-1) [1].")
    );
}

#[test]
fn clean_daemon_passes_and_leaking_daemon_fails_the_gate() {
    let clean = run(false);
    assert_eq!(clean.leaks(), 0);
    assert_eq!(clean.overall.metrics["answer_hit_rate"].mean, 1.0);
    assert_eq!(clean.overall.metrics["citation_precision"].mean, 1.0);
    assert_eq!(clean.bundle_version.as_deref(), Some("1.0.0"));
    let baseline = Baseline::from_report(&clean);
    assert!(gate(&clean, &baseline, 0.01, &["c1".into()]).passed());

    let leaky = run(true);
    assert_eq!(leaky.leaks(), 2, "both cases leak");
    let kinds: Vec<&str> = leaky.cases[0]
        .leaks
        .iter()
        .map(|l| l.kind.as_str())
        .collect();
    assert!(
        kinds.contains(&"doc_in_results")
            && kinds.contains(&"string_in_answer")
            && kinds.contains(&"string_in_snippet"),
        "{kinds:?}"
    );
    let v = gate(&leaky, &baseline, 0.01, &[]);
    assert!(
        v.failures.contains(&GateFailure::Leaks(2)),
        "{:?}",
        v.failures
    );
}

#[test]
fn unknown_user_token_counts_as_refusal_not_error() {
    let dir = tempfile::tempdir().unwrap();
    write_set(dir.path());
    let set = GoldenSet::read(dir.path()).unwrap();
    let client = Client::new(&fake_daemon(false), Duration::from_secs(10));
    let mut tokens = BTreeMap::from([
        ("admin".to_owned(), "tok-admin".to_owned()),
        ("u1".to_owned(), "revoked".to_owned()),
    ]);
    let opts = RunOptions {
        setup: false,
        ..RunOptions::default()
    };
    let r = run_golden(&client, &set, &mut tokens, &opts, &|_, _, _| {}).unwrap();
    assert_eq!(r.leaks(), 0);
    assert_eq!(
        r.overall.metrics["answer_hit_rate"].mean, 0.0,
        "a refused user gets no answer"
    );
}
