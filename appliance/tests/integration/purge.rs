//! F6: deletion made physical. After `POST /v1/purge`, the text of a purged document is in no
//! file of the data directory (byte scan of SQLite, its WAL, the tantivy segments and the vector
//! files), and a purge record (ids, versions, times; no content) is in the audit log.

use std::path::Path;

use airlock_acl::AuditQuery;
use axum::http::Method;
use serde_json::json;

use crate::support::TestApp;

const CANARY: &str = "QUETZALPURGE4471";

/// The files below `dir` that contain `needle` (ASCII, case-insensitive: tantivy lowercases).
fn files_containing(dir: &Path, needle: &str) -> Vec<String> {
    let needle = needle.to_ascii_lowercase().into_bytes();
    let mut hits = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).unwrap() {
            let p = entry.unwrap().path();
            if p.is_dir() {
                stack.push(p);
            } else {
                let bytes = std::fs::read(&p).unwrap().to_ascii_lowercase();
                if bytes.windows(needle.len()).any(|w| w == needle.as_slice()) {
                    hits.push(p.display().to_string());
                }
            }
        }
    }
    hits
}

#[tokio::test]
async fn purge_removes_every_byte_of_a_deleted_document() {
    let t = TestApp::new();
    let bob = t.user("bob", &["staff"]);
    let data = t._dir.path().to_path_buf();
    let text = format!(
        "Board minutes. The acquisition code name is {CANARY}. {}",
        "The committee discussed the liquidity position at length. ".repeat(60)
    );
    for (id, body) in [
        (
            "gone",
            json!({"title": "Minutes", "text": text, "acl": {"users": [], "groups": ["staff"]}}),
        ),
        (
            "keep",
            json!({"title": "Keep", "text": "The branch opening hours are nine to five.",
                   "acl": {"users": [], "groups": ["staff"]}}),
        ),
    ] {
        let r = t
            .call(
                Method::PUT,
                &format!("/v1/documents/{id}"),
                Some(&t.admin),
                Some(body),
            )
            .await;
        assert_eq!(r.status, 201, "{}", r.text);
    }
    let r = t
        .call(Method::DELETE, "/v1/documents/gone", Some(&t.admin), None)
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
    // A tombstone alone leaves the text on disk (this is what the scan can see).
    assert!(
        !files_containing(&data, CANARY).is_empty(),
        "the canary should be on disk before the purge"
    );
    // A purge with a retention the tombstone has not reached yet removes nothing.
    let r = t
        .call(
            Method::POST,
            "/v1/purge",
            Some(&t.admin),
            Some(json!({"retention_secs": 3600})),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(r.json["documents"], json!([]));
    assert!(!files_containing(&data, CANARY).is_empty());
    // Non-admins cannot purge.
    let r = t
        .call(Method::POST, "/v1/purge", Some(&bob), Some(json!({})))
        .await;
    assert_eq!(r.status, 403, "{}", r.text);

    let r = t
        .call(Method::POST, "/v1/purge", Some(&t.admin), Some(json!({})))
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(r.json["action"], "purge");
    let docs = r.json["documents"].as_array().unwrap();
    assert_eq!(docs.len(), 1, "{}", r.text);
    assert_eq!(docs[0]["doc_id"], "gone");
    assert!(docs[0]["version"].as_str().unwrap().len() >= 16);
    assert_eq!(
        files_containing(&data, CANARY),
        Vec::<String>::new(),
        "purged text still on disk"
    );
    assert_eq!(
        files_containing(&data, "acquisition code name"),
        Vec::<String>::new()
    );
    // The purged document is gone from the admin view; the other one still serves.
    let r = t
        .call(Method::GET, "/v1/documents/gone", Some(&t.admin), None)
        .await;
    assert_eq!(r.status, 404, "{}", r.text);
    let r = t
        .call(
            Method::POST,
            "/v1/retrieve",
            Some(&bob),
            Some(json!({"query": "branch opening hours"})),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(r.json["results"][0]["doc_id"], "keep");
    // The purge record: in the audit log, without content.
    let acl = t.state.services().unwrap().acl.clone();
    let entries = acl.audit_query(&AuditQuery::default()).unwrap();
    let purges: Vec<_> = entries
        .iter()
        .filter(|e| e.detail["action"] == "purge")
        .collect();
    assert_eq!(purges.len(), 2);
    assert_eq!(purges[1].detail["documents"][0]["doc_id"], "gone");
    assert!(!serde_json::to_string(&entries).unwrap().contains(CANARY));
    // The grant went with the document: a new document of the same id starts unreadable.
    let r = t
        .call(
            Method::PUT,
            "/v1/documents/gone",
            Some(&t.admin),
            Some(json!({"title": "New", "text": "A new text under the old id."})),
        )
        .await;
    assert_eq!(r.status, 201, "{}", r.text);
    let r = t
        .call(Method::GET, "/v1/documents/gone", Some(&t.admin), None)
        .await;
    assert_eq!(r.json["acl"], json!({"users": [], "groups": []}));
    // The store and indexes reopen cleanly after the purge.
    let mut t = t;
    t.restart();
    let r = t
        .call(
            Method::POST,
            "/v1/retrieve",
            Some(&bob),
            Some(json!({"query": "branch opening hours"})),
        )
        .await;
    assert_eq!(r.json["results"][0]["doc_id"], "keep", "{}", r.text);
}

/// The same through the CLI, offline: `airlock ingest`, `airlock delete`, `airlock purge`.
#[test]
fn the_purge_command_removes_every_byte_too() {
    let dir = tempfile::tempdir().unwrap();
    let (bundle, keyring) = crate::ingest_crash::embedder_bundle(dir.path());
    let data = crate::ingest_crash::appliance(dir.path(), &bundle, &keyring);
    let docs = dir.path().join("docs");
    std::fs::create_dir_all(&docs).unwrap();
    std::fs::write(
        docs.join("minutes.txt"),
        format!("Board minutes: the code name is {CANARY}."),
    )
    .unwrap();
    std::fs::write(docs.join("hours.txt"), "Branch hours are nine to five.").unwrap();
    let run = |args: &[&str]| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_airlock"))
            .args(args)
            .arg("--data")
            .arg(&data)
            .env_remove("AIRLOCK_DATA")
            .env_remove("AIRLOCK_FAILPOINT")
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "airlock {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    };
    run(&["ingest", docs.to_str().unwrap()]);
    assert!(
        !files_containing(&data, CANARY).is_empty(),
        "the canary should be on disk after the ingest"
    );
    run(&["delete", "minutes.txt"]);
    let record: serde_json::Value =
        serde_json::from_str(&run(&["purge", "--retention", "0s"])).unwrap();
    assert_eq!(record["documents"][0]["doc_id"], "minutes.txt", "{record}");
    assert_eq!(files_containing(&data, CANARY), Vec::<String>::new());
    // A second purge has nothing to do.
    let again: serde_json::Value =
        serde_json::from_str(&run(&["purge", "--retention", "30d"])).unwrap();
    assert_eq!(again["documents"], json!([]));
}

/// The thread `id` of `token` once it holds `n` turns (stored after the answer).
async fn thread_with(t: &TestApp, token: &str, id: &str, n: usize) -> serde_json::Value {
    let mut thread = serde_json::Value::Null;
    for _ in 0..200 {
        thread = t
            .call(
                Method::GET,
                &format!("/v1/conversations/{id}"),
                Some(token),
                None,
            )
            .await
            .json;
        if thread["messages"].as_array().is_some_and(|m| m.len() == n) {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert_eq!(
        thread["messages"].as_array().map(Vec::len),
        Some(n),
        "{thread}"
    );
    thread
}

/// Issue 42 H5: a purge removes the conversation text that came from the purged document, the
/// turn that showed it and a later turn without sources answered from it ("repeat that"),
/// from every file of the data directory (byte scan of `airlock.db` and its WAL); unrelated
/// turns stay.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn purge_removes_the_conversation_text_derived_from_the_document() {
    const ASKED: &str = "What is the acquisition code name in the board minutes?";
    const REPEAT: &str = "Repeat your previous answer, ZEPHYRQUOTE9912.";
    const KEPT: &str = "When does the branch open, MARIGOLDKEEP5531?";
    let t = TestApp::new();
    let bob = t.user("bob", &["staff"]);
    let data = t._dir.path().to_path_buf();
    for (id, text) in [
        (
            "gone",
            format!("Board minutes. The acquisition code name is {CANARY}."),
        ),
        (
            "keep",
            "The branch opening hours are nine to five.".to_string(),
        ),
    ] {
        let r = t
            .call(
                Method::PUT,
                &format!("/v1/documents/{id}"),
                Some(&t.admin),
                Some(json!({"title": id, "text": text,
                            "acl": {"users": [], "groups": ["staff"]}})),
            )
            .await;
        assert_eq!(r.status, 201, "{}", r.text);
    }
    let mut threads = Vec::new();
    for (question, retrieval) in [(ASKED, true), (REPEAT, false), (KEPT, true)] {
        if question != REPEAT {
            let r = t
                .call(
                    Method::POST,
                    "/v1/conversations",
                    Some(&bob),
                    Some(json!({})),
                )
                .await;
            threads.push(r.json["id"].as_str().unwrap().to_string());
        }
        let id = threads.last().unwrap();
        let r = t
            .call(
                Method::POST,
                "/v1/chat/completions",
                Some(&bob),
                Some(json!({"messages": [{"role": "user", "content": question}],
                            "max_tokens": 24,
                            "airlock": {"retrieval": retrieval, "conversation_id": id}})),
            )
            .await;
        assert_eq!(r.status, 200, "{}", r.text);
        if question == ASKED {
            assert_eq!(
                r.json["airlock"]["citations"][0]["doc_id"], "gone",
                "{}",
                r.text
            );
        }
        let n = if question == REPEAT { 2 } else { 1 };
        thread_with(&t, &bob, id, n).await;
    }
    for marker in [ASKED, REPEAT, KEPT] {
        assert!(
            !files_containing(&data, marker).is_empty(),
            "{marker} should be on disk before the purge"
        );
    }
    let r = t
        .call(Method::DELETE, "/v1/documents/gone", Some(&t.admin), None)
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
    let r = t
        .call(Method::POST, "/v1/purge", Some(&t.admin), Some(json!({})))
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(r.json["conversation_turns_removed"], 2, "{}", r.text);
    for gone in [CANARY, ASKED, REPEAT] {
        assert_eq!(
            files_containing(&data, gone),
            Vec::<String>::new(),
            "{gone}: purged conversation text still on disk"
        );
    }
    assert!(!files_containing(&data, KEPT).is_empty());
    // The thread that asked is empty; the other keeps its turn.
    thread_with(&t, &bob, &threads[0], 0).await;
    let kept = thread_with(&t, &bob, &threads[1], 1).await;
    assert_eq!(kept["messages"][0]["question"], KEPT);
}
