//! A refused admin write changes nothing: grants, versions, tombstones, users, tokens and the
//! indexes are compared before and after every refusal path of every admin write endpoint.
//! The first test is the red-team finding F1 (a refused `PUT /v1/documents/{id}` applied its
//! widening `acl` anyway, making the old text readable by the new principals).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use axum::body::Body;
use axum::http::{Method, Request, StatusCode, header};
use serde_json::{Value, json};

use crate::support::TestApp;

/// Every row of every table of `airlock.db` except the append-only audit and served-answer
/// logs, in a stable order, plus the engine's counters: the state a refusal must not change.
pub(crate) fn state_digest(t: &TestApp) -> String {
    let services = t.state.services().unwrap();
    let conn = rusqlite::Connection::open(services.acl.path()).unwrap();
    let mut tables: Vec<String> = conn
        .prepare("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name")
        .unwrap()
        .query_map([], |r| r.get(0))
        .unwrap()
        .map(Result::unwrap)
        .collect();
    tables.retain(|t| !matches!(t.as_str(), "acl_audit" | "chat_completions" | "feedback"));
    let mut out = String::new();
    for table in tables {
        let mut st = conn.prepare(&format!("SELECT * FROM \"{table}\"")).unwrap();
        // When a token or session was last used is access metadata, like the audit log: any
        // authenticated request records it, refused or not.
        let kept: Vec<usize> = st
            .column_names()
            .enumerate()
            .filter(|(_, c)| !matches!(*c, "last_used_us" | "last_seen_us"))
            .map(|(i, _)| i)
            .collect();
        let mut rows: Vec<String> = st
            .query_map([], |r| {
                Ok(kept
                    .iter()
                    .map(|&i| format!("{:?}", r.get_ref(i).unwrap()))
                    .collect::<Vec<_>>()
                    .join("|"))
            })
            .unwrap()
            .map(Result::unwrap)
            .collect();
        rows.sort();
        out.push_str(&format!("## {table}\n{}\n", rows.join("\n")));
    }
    out.push_str(&format!("## stats {:?}\n", services.retrieval.stats()));
    // The documents' original files.
    let mut originals: Vec<String> = std::fs::read_dir(t._dir.path().join("originals"))
        .map(|d| {
            d.map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    originals.sort();
    out.push_str(&format!("## originals {originals:?}\n"));
    out
}

async fn retrieve(t: &TestApp, token: &str, query: &str) -> Vec<String> {
    let r = t
        .call(
            Method::POST,
            "/v1/retrieve",
            Some(token),
            Some(json!({"query": query, "top_k": 10, "mode": "bm25"})),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    r.json["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| {
            format!(
                "{} {}",
                h["doc_id"].as_str().unwrap(),
                h["snippet"].as_str().unwrap()
            )
        })
        .collect()
}

async fn put_doc(t: &TestApp, id: &str, body: Value) -> crate::support::Resp {
    t.call(
        Method::PUT,
        &format!("/v1/documents/{id}"),
        Some(&t.admin),
        Some(body),
    )
    .await
}

#[tokio::test]
async fn refused_document_write_never_changes_access() {
    let t = TestApp::new();
    let alice = t.user("alice", &["treasury"]);
    let bob = t.user("bob", &["all-staff"]);
    let r = put_doc(
        &t,
        "secret-1",
        json!({"title": "Treasury memo", "text": "The hedge code word is KESTREL-7731.",
               "acl": {"users": ["alice"], "groups": []}}),
    )
    .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.text);
    assert_eq!(retrieve(&t, &alice, "KESTREL-7731").await.len(), 1);
    assert!(retrieve(&t, &bob, "KESTREL-7731").await.is_empty());
    let before = state_digest(&t);

    let widen = json!({"users": [], "groups": ["all-staff"]});
    let too_large = "x ".repeat((8 << 20) / 2 + 1);
    let refusals = [
        // The reproduction of the finding: empty text with a widening grant.
        (json!({"title": "t", "text": "", "acl": widen}), 400),
        (json!({"title": "t", "text": "  \n\t ", "acl": widen}), 400),
        // Over the document limit (within the upload limit).
        (json!({"title": "t", "text": too_large, "acl": widen}), 413),
        // Later validation errors: an invalid id in the grant, an unknown field.
        (
            json!({"title": "t", "text": "new text", "acl": {"users": [""], "groups": ["all-staff"]}}),
            400,
        ),
        (
            json!({"title": "t", "text": "new text", "acl": {"users": [], "groups": ["all\u{7}staff"]}}),
            400,
        ),
        (
            json!({"title": "t", "text": "new text", "acl": widen, "colour": "red"}),
            400,
        ),
        (
            json!({"title": "t", "text": "new text", "acl": {"users": [], "groups": ["all-staff"], "roles": []}}),
            400,
        ),
    ];
    for (body, status) in refusals {
        let r = put_doc(&t, "secret-1", body).await;
        assert_eq!(r.status.as_u16(), status, "{}", r.text);
        assert_eq!(
            r.headers.get(header::CONTENT_TYPE).unwrap(),
            "application/problem+json"
        );
        assert!(
            retrieve(&t, &bob, "KESTREL-7731").await.is_empty(),
            "a refused write widened access: {}",
            r.text
        );
        assert_eq!(
            state_digest(&t),
            before,
            "refused write changed state: {}",
            r.text
        );
    }
    // The admin view still shows the old grant.
    let r = t
        .call(Method::GET, "/v1/documents/secret-1", Some(&t.admin), None)
        .await;
    assert_eq!(r.json["acl"], json!({"users": ["alice"], "groups": []}));
    assert_eq!(retrieve(&t, &alice, "KESTREL-7731").await.len(), 1);
}

#[tokio::test]
async fn accepted_document_write_changes_content_and_grant_together() {
    let t = TestApp::new();
    let alice = t.user("alice", &["treasury"]);
    let bob = t.user("bob", &["all-staff"]);
    let r = put_doc(
        &t,
        "memo",
        json!({"title": "Memo", "text": "Secret word PLOVER-1180 for treasury only.",
               "acl": {"users": ["alice"], "groups": []}}),
    )
    .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.text);
    // Widen with new content: bob reads the new text, never the old.
    let r = put_doc(
        &t,
        "memo",
        json!({"title": "Memo", "text": "Public word HERON-2290 for all staff.",
               "acl": {"users": [], "groups": ["all-staff"]}}),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert!(retrieve(&t, &bob, "PLOVER-1180").await.is_empty());
    assert_eq!(retrieve(&t, &bob, "HERON-2290").await.len(), 1);
    assert!(retrieve(&t, &alice, "HERON-2290").await.is_empty());
    // Narrow with new content: bob loses the document.
    let r = put_doc(
        &t,
        "memo",
        json!({"title": "Memo", "text": "Secret word PLOVER-1180 for treasury only.",
               "acl": {"users": ["alice"], "groups": []}}),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert!(retrieve(&t, &bob, "PLOVER-1180").await.is_empty());
    assert!(retrieve(&t, &bob, "HERON-2290").await.is_empty());
    assert_eq!(retrieve(&t, &alice, "PLOVER-1180").await.len(), 1);
    // Unchanged content with a new grant: only the grant changes.
    let r = put_doc(
        &t,
        "memo",
        json!({"title": "Memo", "text": "Secret word PLOVER-1180 for treasury only.",
               "acl": {"users": ["alice", "bob"], "groups": []}}),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert_eq!(r.json["status"], "unchanged");
    assert_eq!(retrieve(&t, &bob, "PLOVER-1180").await.len(), 1);
    // The state survives a restart (one transaction, durable when acknowledged).
    let mut t = t;
    t.restart();
    assert_eq!(retrieve(&t, &bob, "PLOVER-1180").await.len(), 1);
}

/// While the admin flips a document between a secret version (alice only) and a public one
/// (all staff), a staff member searching all the time never sees the secret version: the old
/// chunks are hidden before a new grant applies and the re-check reads one ACL state.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_readers_never_see_old_content_under_a_new_grant() {
    let t = Arc::new(TestApp::new());
    t.user("alice", &["treasury"]);
    let bob = t.user("bob", &["all-staff"]);
    let secret = json!({"title": "Memo", "text": "Rate code GANNET-5120 and the swap book.",
                        "acl": {"users": ["alice"], "groups": []}});
    let public = json!({"title": "Memo", "text": "Rate code PUFFIN-3400 and the swap book.",
                        "acl": {"users": [], "groups": ["all-staff"]}});
    assert_eq!(put_doc(&t, "memo", secret.clone()).await.status, 201);
    let stop = Arc::new(AtomicBool::new(false));
    let reader = {
        let (t, stop, bob) = (t.clone(), stop.clone(), bob.clone());
        tokio::spawn(async move {
            let (mut reads, mut public_seen) = (0, 0);
            while !stop.load(Ordering::Relaxed) {
                for hit in retrieve(&t, &bob, "rate code swap book").await {
                    assert!(!hit.contains("GANNET"), "leak: {hit}");
                    public_seen += usize::from(hit.contains("PUFFIN"));
                }
                reads += 1;
            }
            (reads, public_seen)
        })
    };
    for i in 0..20 {
        let body = if i % 2 == 0 { &public } else { &secret };
        let r = put_doc(&t, "memo", body.clone()).await;
        assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    }
    stop.store(true, Ordering::Relaxed);
    let (reads, public_seen) = reader.await.unwrap();
    assert!(
        reads > 0 && public_seen > 0,
        "reads {reads}, public {public_seen}"
    );
}

/// Every refusal path of every admin write endpoint leaves the state as it was.
#[tokio::test]
async fn every_refused_admin_write_changes_nothing() {
    let t = TestApp::new();
    let bob = t.user("bob", &["all-staff"]);
    assert_eq!(
        put_doc(
            &t,
            "doc-a",
            json!({"title": "A", "text": "Alpha text about the branch.",
                   "acl": {"users": [], "groups": ["all-staff"]}}),
        )
        .await
        .status,
        201
    );
    assert_eq!(
        put_doc(
            &t,
            "doc-gone",
            json!({"title": "G", "text": "Deleted text.", "acl": {"users": ["bob"], "groups": []}}),
        )
        .await
        .status,
        201
    );
    let r = t
        .call(
            Method::DELETE,
            "/v1/documents/doc-gone",
            Some(&t.admin),
            None,
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
    let before = state_digest(&t);
    let long = "x".repeat(300);
    let json_req = |method: Method, uri: String, token: &str, body: Value| {
        Request::builder()
            .method(method)
            .uri(uri)
            .header(header::AUTHORIZATION, format!("Bearer {token}"))
            .header(header::CONTENT_TYPE, "application/json")
            .body(Body::from(serde_json::to_vec(&body).unwrap()))
            .unwrap()
    };
    let raw = |method: Method, uri: &str, token: &str, ct: &str, body: &str| {
        Request::builder()
            .method(method)
            .uri(uri)
            .header(header::AUTHORIZATION, format!("Bearer {token}"))
            .header(header::CONTENT_TYPE, ct)
            .body(Body::from(body.to_owned()))
            .unwrap()
    };
    let admin = t.admin.clone();
    let cases: Vec<(&str, Request<Body>, u16)> = vec![
        // Documents.
        (
            "put: not admin",
            json_req(
                Method::PUT,
                "/v1/documents/doc-a".into(),
                &bob,
                json!({"text": "x"}),
            ),
            403,
        ),
        (
            "put: long id",
            json_req(
                Method::PUT,
                format!("/v1/documents/{long}"),
                &admin,
                json!({"text": "x"}),
            ),
            400,
        ),
        (
            "put: not JSON",
            raw(
                Method::PUT,
                "/v1/documents/doc-a",
                &admin,
                "application/json",
                "{",
            ),
            400,
        ),
        (
            "put: wrong media type",
            raw(
                Method::PUT,
                "/v1/documents/doc-a",
                &admin,
                "application/zip",
                "hello",
            ),
            415,
        ),
        (
            "put: a file the extractor refuses",
            raw(
                Method::PUT,
                "/v1/documents/doc-a",
                &admin,
                "application/pdf",
                "%PDF-1.7 not really",
            ),
            422,
        ),
        (
            "put: no text",
            json_req(
                Method::PUT,
                "/v1/documents/doc-a".into(),
                &admin,
                json!({"title": "A"}),
            ),
            400,
        ),
        (
            "put: empty text, new grant",
            json_req(
                Method::PUT,
                "/v1/documents/doc-a".into(),
                &admin,
                json!({"text": "", "acl": {"users": ["bob"], "groups": []}}),
            ),
            400,
        ),
        (
            "put: empty text on a deleted document",
            json_req(
                Method::PUT,
                "/v1/documents/doc-gone".into(),
                &admin,
                json!({"text": "", "acl": {"users": ["bob"], "groups": []}}),
            ),
            400,
        ),
        (
            "put: empty new document with a grant",
            json_req(
                Method::PUT,
                "/v1/documents/doc-new".into(),
                &admin,
                json!({"text": " ", "acl": {"users": ["bob"], "groups": []}}),
            ),
            400,
        ),
        (
            "put: metadata not an object",
            json_req(
                Method::PUT,
                "/v1/documents/doc-a".into(),
                &admin,
                json!({"text": "Alpha v2", "metadata": [1]}),
            ),
            400,
        ),
        // Delete and reconcile.
        (
            "delete: not admin",
            json_req(
                Method::DELETE,
                "/v1/documents/doc-a".into(),
                &bob,
                json!({}),
            ),
            403,
        ),
        (
            "delete: unknown id",
            json_req(
                Method::DELETE,
                "/v1/documents/doc-never".into(),
                &admin,
                json!({}),
            ),
            404,
        ),
        (
            "reconcile: not admin",
            json_req(
                Method::POST,
                "/v1/reconcile".into(),
                &bob,
                json!({"source_ids": []}),
            ),
            403,
        ),
        (
            "reconcile: bad body",
            json_req(
                Method::POST,
                "/v1/reconcile".into(),
                &admin,
                json!({"ids": ["doc-a"]}),
            ),
            400,
        ),
        // F12: an empty list would tombstone every document.
        (
            "reconcile: empty list",
            json_req(
                Method::POST,
                "/v1/reconcile".into(),
                &admin,
                json!({"source_ids": []}),
            ),
            400,
        ),
        (
            "reconcile: empty list, allow_empty=false",
            json_req(
                Method::POST,
                "/v1/reconcile?allow_empty=false".into(),
                &admin,
                json!({"source_ids": []}),
            ),
            400,
        ),
        (
            "reconcile: unknown query parameter",
            json_req(
                Method::POST,
                "/v1/reconcile?allow_empty=yes".into(),
                &admin,
                json!({"source_ids": []}),
            ),
            400,
        ),
        (
            "reconcile: ids not strings",
            json_req(
                Method::POST,
                "/v1/reconcile".into(),
                &admin,
                json!({"source_ids": [1]}),
            ),
            400,
        ),
        // Users and tokens.
        (
            "user: not admin",
            json_req(
                Method::PUT,
                "/v1/acl/users/carol".into(),
                &bob,
                json!({"groups": []}),
            ),
            403,
        ),
        (
            "user: unknown role",
            json_req(
                Method::PUT,
                "/v1/acl/users/carol".into(),
                &admin,
                json!({"groups": ["risk"], "roles": ["root"]}),
            ),
            400,
        ),
        (
            "user: invalid group id",
            json_req(
                Method::PUT,
                "/v1/acl/users/bob".into(),
                &admin,
                json!({"groups": ["risk", ""]}),
            ),
            400,
        ),
        (
            "user: long id",
            json_req(
                Method::PUT,
                format!("/v1/acl/users/{long}"),
                &admin,
                json!({"groups": []}),
            ),
            400,
        ),
        (
            "user: unknown field",
            json_req(
                Method::PUT,
                "/v1/acl/users/bob".into(),
                &admin,
                json!({"groups": [], "admin": true}),
            ),
            400,
        ),
        (
            "token: unknown user",
            json_req(
                Method::POST,
                "/v1/acl/users/nobody/token".into(),
                &admin,
                json!({}),
            ),
            404,
        ),
        (
            "token: not admin",
            json_req(
                Method::POST,
                "/v1/acl/users/bob/token".into(),
                &bob,
                json!({}),
            ),
            403,
        ),
        // Grants.
        (
            "grant: not admin",
            json_req(
                Method::PUT,
                "/v1/acl/documents/doc-a".into(),
                &bob,
                json!({"users": ["bob"], "groups": []}),
            ),
            403,
        ),
        (
            "grant: invalid user id",
            json_req(
                Method::PUT,
                "/v1/acl/documents/doc-a".into(),
                &admin,
                json!({"users": ["bob", "a\nb"], "groups": []}),
            ),
            400,
        ),
        (
            "grant: missing field",
            json_req(
                Method::PUT,
                "/v1/acl/documents/doc-a".into(),
                &admin,
                json!({"users": ["bob"]}),
            ),
            400,
        ),
        // IAM sync.
        (
            "sync: not admin",
            raw(
                Method::POST,
                "/v1/acl/sync",
                &bob,
                "application/x-ndjson",
                "{\"user\":\"bob\",\"groups\":[]}\n",
            ),
            403,
        ),
        // F12: an empty snapshot would remove every user and every grant.
        (
            "sync: empty body",
            raw(
                Method::POST,
                "/v1/acl/sync",
                &admin,
                "application/x-ndjson",
                "",
            ),
            400,
        ),
        (
            "sync: blank lines only",
            raw(
                Method::POST,
                "/v1/acl/sync",
                &admin,
                "application/x-ndjson",
                "\n  \n\n",
            ),
            400,
        ),
        (
            "sync: unknown query parameter",
            raw(
                Method::POST,
                "/v1/acl/sync?force=1",
                &admin,
                "application/x-ndjson",
                "{\"user\":\"bob\",\"groups\":[]}\n",
            ),
            400,
        ),
        (
            "sync: malformed line after good ones",
            raw(
                Method::POST,
                "/v1/acl/sync",
                &admin,
                "application/x-ndjson",
                "{\"user\":\"bob\",\"groups\":[]}\n{\"user\":\n",
            ),
            400,
        ),
        (
            "sync: user named twice",
            raw(
                Method::POST,
                "/v1/acl/sync",
                &admin,
                "application/x-ndjson",
                "{\"user\":\"bob\",\"groups\":[]}\n{\"user\":\"bob\",\"groups\":[\"x\"]}\n",
            ),
            400,
        ),
    ];
    for (name, req, status) in cases {
        let r = t.send(req).await;
        assert_eq!(r.status.as_u16(), status, "{name}: {}", r.text);
        assert_eq!(
            r.headers.get(header::CONTENT_TYPE).unwrap(),
            "application/problem+json",
            "{name}"
        );
        assert_eq!(state_digest(&t), before, "{name} changed state: {}", r.text);
    }
    // The state still works as before.
    assert_eq!(retrieve(&t, &bob, "alpha branch").await.len(), 1);
    assert!(retrieve(&t, &bob, "deleted").await.is_empty());
}

/// F12: the two writes that can empty everything need the request to say so.
#[tokio::test]
async fn empty_snapshot_and_reconcile_need_allow_empty() {
    let t = TestApp::new();
    let bob = t.user("bob", &["all-staff"]);
    assert_eq!(
        put_doc(
            &t,
            "doc-a",
            json!({"title": "A", "text": "Alpha text.", "acl": {"users": ["bob"], "groups": []}}),
        )
        .await
        .status,
        201
    );
    let sync = |uri: &str, body: &str| {
        Request::builder()
            .method(Method::POST)
            .uri(uri)
            .header(header::AUTHORIZATION, format!("Bearer {}", t.admin))
            .header(header::CONTENT_TYPE, "application/x-ndjson")
            .body(Body::from(body.to_owned()))
            .unwrap()
    };
    let r = t.send(sync("/v1/acl/sync", "")).await;
    assert_eq!(r.status, 400, "{}", r.text);
    assert!(
        r.json["detail"].as_str().unwrap().contains("allow_empty"),
        "{}",
        r.text
    );
    // Still a user with a grant.
    assert_eq!(retrieve(&t, &bob, "alpha").await.len(), 1);
    let r = t.send(sync("/v1/acl/sync?allow_empty=true", "\n")).await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(r.json["users_removed"], 1, "{}", r.text);
    assert_eq!(r.json["grants_changed"], 1, "{}", r.text);
    // The operator is kept; bob is gone.
    let r = t
        .call(
            Method::POST,
            "/v1/retrieve",
            Some(&bob),
            Some(json!({"query": "alpha"})),
        )
        .await;
    assert_eq!(r.status, 401, "{}", r.text);

    let r = t
        .call(
            Method::POST,
            "/v1/reconcile",
            Some(&t.admin),
            Some(json!({"source_ids": []})),
        )
        .await;
    assert_eq!(r.status, 400, "{}", r.text);
    assert!(r.json["detail"].as_str().unwrap().contains("allow_empty"));
    let r = t
        .call(Method::GET, "/v1/documents/doc-a", Some(&t.admin), None)
        .await;
    assert_eq!(r.json["deleted_at"], Value::Null);
    let r = t
        .call(
            Method::POST,
            "/v1/reconcile?allow_empty=true",
            Some(&t.admin),
            Some(json!({"source_ids": []})),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(r.json["orphans_tombstoned"], json!(["doc-a"]));
}
