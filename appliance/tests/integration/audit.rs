//! F3: every admin change and every document shown by `/v1/retrieve` is an append-only audit
//! row with who, what, when and the request id, and never any content.

use airlock_acl::{AuditKind, AuditQuery};
use axum::body::Body;
use axum::http::{Method, Request, header};
use serde_json::{Value, json};

use crate::support::TestApp;

fn req(t: &TestApp, method: Method, uri: &str, rid: &str, ct: &str, body: String) -> Request<Body> {
    Request::builder()
        .method(method)
        .uri(uri)
        .header(header::AUTHORIZATION, format!("Bearer {}", t.admin))
        .header("x-request-id", rid)
        .header(header::CONTENT_TYPE, ct)
        .body(Body::from(body))
        .unwrap()
}

#[tokio::test]
async fn admin_changes_and_shown_results_are_audited_without_content() {
    let t = TestApp::new();
    let bob = t.user("bob", &["staff"]);
    let json_ct = "application/json";
    let steps: Vec<(Request<Body>, u16)> = vec![
        (
            req(
                &t,
                Method::PUT,
                "/v1/documents/doc-1",
                "rid-put-create",
                json_ct,
                json!({"title": "Osprey", "text": "Canary phrase WAXWING-4417 lives here.",
                       "acl": {"users": [], "groups": ["staff"]}})
                .to_string(),
            ),
            201,
        ),
        (
            req(
                &t,
                Method::PUT,
                "/v1/documents/doc-1",
                "rid-put-replace",
                json_ct,
                json!({"title": "Osprey", "text": "Canary phrase WAXWING-4417 lives here, v2."})
                    .to_string(),
            ),
            200,
        ),
        (
            req(
                &t,
                Method::PUT,
                "/v1/documents/doc-2",
                "rid-put-2",
                json_ct,
                json!({"title": "Other", "text": "Another text."}).to_string(),
            ),
            201,
        ),
        (
            req(
                &t,
                Method::PUT,
                "/v1/acl/documents/doc-2",
                "rid-grant",
                json_ct,
                json!({"users": ["bob"], "groups": []}).to_string(),
            ),
            200,
        ),
        (
            req(
                &t,
                Method::PUT,
                "/v1/acl/users/carol",
                "rid-user",
                json_ct,
                // No groups: a token for a user with access would need a second admin.
                json!({"groups": []}).to_string(),
            ),
            201,
        ),
        (
            req(
                &t,
                Method::POST,
                "/v1/acl/users/carol/token",
                "rid-token",
                json_ct,
                String::new(),
            ),
            201,
        ),
        (
            req(
                &t,
                Method::DELETE,
                "/v1/documents/doc-2",
                "rid-delete",
                json_ct,
                String::new(),
            ),
            200,
        ),
        (
            req(
                &t,
                Method::POST,
                "/v1/reconcile",
                "rid-reconcile",
                json_ct,
                json!({"source_ids": ["doc-1", "doc-9"]}).to_string(),
            ),
            200,
        ),
        (
            req(
                &t,
                Method::POST,
                "/v1/acl/sync",
                "rid-sync",
                "application/x-ndjson",
                "{\"user\": \"bob\", \"groups\": [\"staff\"]}\n{\"doc\": \"doc-1\", \"users\": [], \"groups\": [\"staff\"]}\n".into(),
            ),
            200,
        ),
    ];
    for (r, status) in steps {
        let uri = r.uri().to_string();
        let resp = t.send(r).await;
        assert_eq!(resp.status.as_u16(), status, "{uri}: {}", resp.text);
    }
    // A reader's retrieval: the shown documents are audited under the request id.
    let r = Request::builder()
        .method(Method::POST)
        .uri("/v1/retrieve")
        .header(header::AUTHORIZATION, format!("Bearer {bob}"))
        .header("x-request-id", "rid-retrieve")
        .header(header::CONTENT_TYPE, json_ct)
        .body(Body::from(
            json!({"query": "canary phrase WAXWING-4417", "mode": "bm25"}).to_string(),
        ))
        .unwrap();
    let resp = t.send(r).await;
    assert_eq!(resp.status, 200, "{}", resp.text);
    assert_eq!(resp.json["results"][0]["doc_id"], "doc-1");

    let acl = t.state.services().unwrap().acl.clone();
    let entries = acl.audit_query(&AuditQuery::default()).unwrap();
    let find = |rid: &str| -> Vec<&airlock_acl::AuditEntry> {
        entries
            .iter()
            .filter(|e| e.request_id.as_deref() == Some(rid))
            .collect()
    };
    let action = |rid: &str| -> Vec<String> {
        find(rid)
            .iter()
            .map(|e| e.detail["action"].as_str().unwrap_or("").to_string())
            .collect()
    };
    assert_eq!(
        action("rid-put-create"),
        ["document_grants", "document_put"]
    );
    assert_eq!(action("rid-put-replace"), ["document_put"]);
    assert_eq!(find("rid-put-replace")[0].detail["status"], "replaced");
    assert_eq!(action("rid-grant"), ["document_grants"]);
    assert_eq!(action("rid-user"), ["user_put"]);
    assert_eq!(action("rid-token"), ["token_issue"]);
    assert_eq!(action("rid-delete"), ["document_delete"]);
    assert_eq!(action("rid-reconcile"), ["reconcile"]);
    assert_eq!(find("rid-reconcile")[0].detail["missing"], 1);
    let sync = find("rid-sync");
    assert_eq!(sync.len(), 1);
    assert_eq!(sync[0].kind, AuditKind::Sync);
    for rid in ["rid-put-create", "rid-delete", "rid-user", "rid-sync"] {
        for e in find(rid) {
            assert_eq!(e.actor.as_deref(), Some("admin"), "{rid}");
        }
    }
    let shown = find("rid-retrieve");
    assert_eq!(shown.len(), 1);
    assert_eq!(shown[0].kind, AuditKind::Shown);
    assert_eq!(shown[0].user_id.as_deref(), Some("bob"));
    assert_eq!(shown[0].detail, json!({"doc_ids": ["doc-1"]}));
    // Never content: neither the canary nor the title is in any row.
    let all = serde_json::to_string(&entries).unwrap();
    assert!(!all.contains("WAXWING"), "content in the audit log");
    assert!(!all.contains("Osprey"), "title in the audit log");
    let _: Value = serde_json::from_str(&all).unwrap();
}
