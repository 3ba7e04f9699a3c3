//! Every endpoint and every problem type through `app()` + `oneshot`, with exact error bodies.

use airlock::{AppState, Config, app};
use axum::body::Body;
use axum::http::{Method, Request, StatusCode, header};
use serde_json::json;
use tower::ServiceExt;

use crate::support::TestApp;

#[tokio::test]
async fn health_ready_and_not_ready() {
    let t = TestApp::new();
    let r = t.call(Method::GET, "/healthz", None, None).await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.json, json!({"status": "ok"}));
    assert!(r.headers.get("x-request-id").is_some(), "request id echoed");
    let r = t.call(Method::GET, "/readyz", None, None).await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.json["bundle_version"], "1.0.0-test");

    // A daemon still starting: health yes, ready no, API 503 not-ready.
    let starting = AppState::starting(Config::default());
    let send = |uri: &'static str| {
        let router = app(starting.clone());
        async move {
            let resp = router
                .oneshot(Request::get(uri).body(Body::empty()).unwrap())
                .await
                .unwrap();
            let status = resp.status();
            let retry = resp.headers().get(header::RETRY_AFTER).cloned();
            let b = http_body_util::BodyExt::collect(resp.into_body())
                .await
                .unwrap()
                .to_bytes();
            (
                status,
                retry,
                serde_json::from_slice::<serde_json::Value>(&b).unwrap(),
            )
        }
    };
    assert_eq!(send("/healthz").await.0, StatusCode::OK);
    let (s, _, body) = send("/readyz").await;
    assert_eq!(s, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(body, json!({"status": "starting"}));
    let (s, retry, body) = send("/v1/models").await;
    assert_eq!(s, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(retry.unwrap(), "1");
    assert_eq!(
        body,
        crate::support::problem_json(503, "not-ready", "the appliance is not ready")
    );
}

#[tokio::test]
async fn auth_problems() {
    let t = TestApp::new();
    let alice = t.user("alice", &["risk"]);
    for token in [None, Some("not-a-token")] {
        t.call(Method::GET, "/v1/models", token, None)
            .await
            .assert_problem(401, "unauthorized", "a valid bearer token is required");
    }
    // Malformed Authorization header.
    let r = t
        .send(
            Request::get("/v1/models")
                .header(header::AUTHORIZATION, format!("Basic {alice}"))
                .body(Body::empty())
                .unwrap(),
        )
        .await;
    r.assert_problem(401, "unauthorized", "a valid bearer token is required");
    // Authentication is checked before the body is read: garbage body, still 401.
    let r = t
        .send(
            Request::post("/v1/retrieve")
                .header(header::CONTENT_TYPE, "application/json")
                .body(Body::from("{not json"))
                .unwrap(),
        )
        .await;
    r.assert_problem(401, "unauthorized", "a valid bearer token is required");
    // A user holds no role (the full route-by-role matrix is in roles.rs).
    for (m, uri, needs) in [
        (
            Method::GET,
            "/metrics",
            "the admin, auditor or metrics role",
        ),
        (Method::GET, "/v1/documents/doc-1", "the operator role"),
        (Method::DELETE, "/v1/documents/doc-1", "the operator role"),
        (Method::POST, "/v1/acl/users/alice/token", "the admin role"),
    ] {
        t.call(m, uri, Some(&alice), None).await.assert_problem(
            403,
            "forbidden",
            &format!("this endpoint needs {needs}"),
        );
    }
    let r = t.call(Method::GET, "/v1/models", Some(&alice), None).await;
    assert_eq!(r.status, StatusCode::OK);
    let r = t.call(Method::GET, "/v1/info", Some(&alice), None).await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.json["user"], "alice");
    assert_eq!(r.json["admin"], false);
    assert!(r.json["bundle_version"].is_string(), "{}", r.json);
    t.call(Method::GET, "/v1/info", None, None)
        .await
        .assert_problem(401, "unauthorized", "a valid bearer token is required");
}

#[tokio::test]
async fn routing_problems() {
    let t = TestApp::new();
    t.call(Method::GET, "/v1/nope", Some(&t.admin), None)
        .await
        .assert_problem(404, "not-found", "no such route");
    t.call(Method::GET, "/nope", None, None)
        .await
        .assert_problem(404, "not-found", "no such route");
    t.call(Method::GET, "/v1/retrieve", Some(&t.admin), None)
        .await
        .assert_problem(
            405,
            "method-not-allowed",
            "method GET is not allowed on this route",
        );
    t.call(Method::POST, "/v1/models", Some(&t.admin), None)
        .await
        .assert_problem(
            405,
            "method-not-allowed",
            "method POST is not allowed on this route",
        );
}

#[tokio::test]
async fn invalid_request_problems() {
    let t = TestApp::new();
    let r = t
        .send(
            Request::post("/v1/retrieve")
                .header(header::AUTHORIZATION, format!("Bearer {}", t.admin))
                .header(header::CONTENT_TYPE, "application/json")
                .body(Body::from("{\"query\": "))
                .unwrap(),
        )
        .await;
    r.assert_problem(
        400,
        "invalid-request",
        "invalid JSON body: EOF while parsing a value at line 1 column 10",
    );
    let r = t
        .call(
            Method::POST,
            "/v1/retrieve",
            Some(&t.admin),
            Some(json!({"query": "x", "top_k": "ten"})),
        )
        .await;
    r.assert_problem(
        400,
        "invalid-request",
        "invalid JSON body: invalid type: string \"ten\", expected usize at line 1 column 26",
    );
    // Non-OpenAI endpoints reject unknown fields.
    let r = t
        .call(
            Method::PUT,
            "/v1/acl/users/bob",
            Some(&t.admin),
            Some(json!({"groups": [], "group": "x"})),
        )
        .await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST, "{}", r.text);
    assert_eq!(
        r.json["type"],
        "https://airlock.local/problems/invalid-request"
    );
    assert!(
        r.json["detail"]
            .as_str()
            .unwrap()
            .contains("unknown field `group`")
    );
    // Wrong content type.
    let r = t
        .send(
            Request::post("/v1/retrieve")
                .header(header::AUTHORIZATION, format!("Bearer {}", t.admin))
                .header(header::CONTENT_TYPE, "text/plain")
                .body(Body::from("{\"query\":\"x\"}"))
                .unwrap(),
        )
        .await;
    r.assert_problem(
        415,
        "unsupported-media-type",
        "unsupported content type `text/plain`; this route takes application/json (Content-Type)",
    );
    // Bad UTF-8.
    let r = t
        .send(
            Request::post("/v1/retrieve")
                .header(header::AUTHORIZATION, format!("Bearer {}", t.admin))
                .header(header::CONTENT_TYPE, "application/json")
                .body(Body::from(b"{\"query\":\"\xff\"}".to_vec()))
                .unwrap(),
        )
        .await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    assert_eq!(
        r.json["type"],
        "https://airlock.local/problems/invalid-request"
    );
}

#[tokio::test]
async fn payload_too_large_uses_the_route_limit() {
    let t = TestApp::with_config(Config {
        body_limit: Some(4096),
        upload_limit: Some(64 * 1024),
        ..Config::default()
    });
    let big = "x".repeat(8 * 1024);
    let r = t
        .call(
            Method::POST,
            "/v1/retrieve",
            Some(&t.admin),
            Some(json!({ "query": big })),
        )
        .await;
    r.assert_problem(
        413,
        "payload-too-large",
        "the request body exceeds the limit of 4096 bytes",
    );
    // Documents take the upload limit: the same body is accepted there...
    let r = t
        .call(
            Method::PUT,
            "/v1/documents/doc-big",
            Some(&t.admin),
            Some(json!({"title": "Big", "text": big})),
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.text);
    // ...up to its own limit (also without a Content-Length: a streamed body).
    let huge = "y".repeat(80 * 1024);
    let body = serde_json::to_vec(&json!({"title": "Huge", "text": huge})).unwrap();
    let stream = futures::stream::iter(
        body.chunks(8192)
            .map(|c| Ok::<_, std::io::Error>(axum::body::Bytes::copy_from_slice(c)))
            .collect::<Vec<_>>(),
    );
    let r = t
        .send(
            Request::put("/v1/documents/doc-huge")
                .header(header::AUTHORIZATION, format!("Bearer {}", t.admin))
                .header(header::CONTENT_TYPE, "application/json")
                .body(Body::from_stream(stream))
                .unwrap(),
        )
        .await;
    r.assert_problem(
        413,
        "payload-too-large",
        "the request body exceeds the limit of 65536 bytes",
    );
}

#[tokio::test]
async fn acl_endpoints_users_tokens_grants_sync() {
    let t = TestApp::new();
    // Create a user, then issue a token; the user can call the API with it.
    let r = t
        .call(
            Method::PUT,
            "/v1/acl/users/carol",
            Some(&t.admin),
            Some(json!({"groups": ["risk"]})),
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.text);
    assert_eq!(r.json["user"]["groups"], json!(["risk"]));
    let r = t
        .call(
            Method::PUT,
            "/v1/acl/users/carol",
            Some(&t.admin),
            Some(json!({"groups": ["risk", "hr"]})),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    // A token for a user with groups needs a second admin's approval (four eyes).
    let approved_token = || async {
        let approval = t
            .approval(json!({"action": "token_issue", "user_id": "carol"}))
            .await;
        t.call_with(
            Method::POST,
            "/v1/acl/users/carol/token",
            Some(&t.admin),
            &[("x-airlock-approval", &approval)],
            None,
        )
        .await
    };
    let r = approved_token().await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.text);
    let carol = r.json["token"].as_str().unwrap().to_string();
    assert_eq!(
        t.call(Method::GET, "/v1/models", Some(&carol), None)
            .await
            .status,
        StatusCode::OK
    );
    // Rotation invalidates the old token at once.
    let r = approved_token().await;
    let carol2 = r.json["token"].as_str().unwrap().to_string();
    t.call(Method::GET, "/v1/models", Some(&carol), None)
        .await
        .assert_problem(401, "unauthorized", "a valid bearer token is required");
    assert_eq!(
        t.call(Method::GET, "/v1/models", Some(&carol2), None)
            .await
            .status,
        StatusCode::OK
    );
    // A token for a user that does not exist: 404.
    t.call(
        Method::POST,
        "/v1/acl/users/nobody/token",
        Some(&t.admin),
        None,
    )
    .await
    .assert_problem(404, "not-found", "unknown user \"nobody\"");
    // Document grants.
    let r = t
        .call(
            Method::PUT,
            "/v1/acl/documents/doc-7",
            Some(&t.admin),
            Some(json!({"users": ["carol"], "groups": []})),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert_eq!(
        r.json,
        json!({"doc_id": "doc-7", "changed": true, "users_access_changed": 1})
    );
    // A sync that does not name carol keeps her: users created through the API are local.
    let snapshot = "{\"user\": \"dave\", \"groups\": [\"risk\"]}\n{\"doc\": \"doc-7\", \"users\": [], \"groups\": [\"risk\"]}\n";
    let r = t
        .send(
            Request::post("/v1/acl/sync")
                .header(header::AUTHORIZATION, format!("Bearer {}", t.admin))
                .header(header::CONTENT_TYPE, "application/x-ndjson")
                .body(Body::from(snapshot))
                .unwrap(),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert_eq!(r.json["users_added"], 1);
    assert_eq!(r.json["grants_changed"], 1);
    assert_eq!(
        t.call(Method::GET, "/v1/models", Some(&carol2), None)
            .await
            .status,
        StatusCode::OK
    );
    // A malformed snapshot: 400 and nothing applied.
    let r = t
        .send(
            Request::post("/v1/acl/sync")
                .header(header::AUTHORIZATION, format!("Bearer {}", t.admin))
                .header(header::CONTENT_TYPE, "application/x-ndjson")
                .body(Body::from("{\"user\": 5}\n"))
                .unwrap(),
        )
        .await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST, "{}", r.text);
    assert_eq!(
        r.json["type"],
        "https://airlock.local/problems/invalid-request"
    );
}

#[tokio::test]
async fn sync_removes_users_and_their_tokens() {
    let t = TestApp::new();
    let erin = t.user("erin", &["risk"]);
    assert_eq!(
        t.call(Method::GET, "/v1/models", Some(&erin), None)
            .await
            .status,
        StatusCode::OK
    );
    let r = t
        .send(
            Request::post("/v1/acl/sync")
                .header(header::AUTHORIZATION, format!("Bearer {}", t.admin))
                .header(header::CONTENT_TYPE, "application/x-ndjson")
                .body(Body::from("{\"user\": \"frank\", \"groups\": []}\n"))
                .unwrap(),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert_eq!(r.json["users_removed"], 1);
    t.call(Method::GET, "/v1/models", Some(&erin), None)
        .await
        .assert_problem(401, "unauthorized", "a valid bearer token is required");
    // The local admin survives every sync.
    assert_eq!(
        t.call(Method::GET, "/v1/models", Some(&t.admin), None)
            .await
            .status,
        StatusCode::OK
    );
}

#[tokio::test]
async fn models_and_embeddings() {
    let t = TestApp::new();
    let r = t
        .call(Method::GET, "/v1/models", Some(&t.admin), None)
        .await;
    assert_eq!(r.json["object"], "list");
    let ids: Vec<&str> = r.json["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["airlock-small", "airlock-embed"]);

    let r = t
        .call(
            Method::POST,
            "/v1/embeddings",
            Some(&t.admin),
            Some(
                json!({"input": ["A man is eating food.", "A man is eating a piece of bread."],
                        "model": "airlock-embed", "user": "extra fields are ignored"}),
            ),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    let a: Vec<f32> = serde_json::from_value(r.json["data"][0]["embedding"].clone()).unwrap();
    let b: Vec<f32> = serde_json::from_value(r.json["data"][1]["embedding"].clone()).unwrap();
    assert_eq!(a.len(), 384);
    let cos: f32 = a.iter().zip(&b).map(|(x, y)| x * y).sum();
    assert!((cos - 0.7553).abs() < 0.01, "cosine {cos}");
    assert!(r.json["usage"]["prompt_tokens"].as_u64().unwrap() > 10);

    // base64: little-endian f32, identical values.
    let r = t
        .call(
            Method::POST,
            "/v1/embeddings",
            Some(&t.admin),
            Some(json!({"input": "A man is eating food.", "encoding_format": "base64"})),
        )
        .await;
    use base64::Engine as _;
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(r.json["data"][0]["embedding"].as_str().unwrap())
        .unwrap();
    let decoded: Vec<f32> = bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect();
    assert_eq!(decoded, a);

    t.call(
        Method::POST,
        "/v1/embeddings",
        Some(&t.admin),
        Some(json!({"input": "x", "model": "no-such-model"})),
    )
    .await
    .assert_problem(404, "not-found", "no model `no-such-model`");
    t.call(
        Method::POST,
        "/v1/embeddings",
        Some(&t.admin),
        Some(json!({"input": "x", "encoding_format": "int8"})),
    )
    .await
    .assert_problem(
        400,
        "invalid-request",
        "encoding_format `int8` is not `float` or `base64`",
    );
}

#[tokio::test]
async fn documents_lifecycle_and_retrieve_respects_acl() {
    let t = TestApp::new();
    let risk = t.user("rita", &["risk"]);
    let hr = t.user("hank", &["hr"]);
    let r = put(
        &t,
        "doc-risk",
        "Liquidity buffer policy",
        "The liquidity buffer must stay above 14 percent of deposits. Codename OSPREY-4411.",
        "risk",
    )
    .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.text);
    assert_eq!(r.json["doc_id"], "doc-risk");
    assert!(r.json["chunks"].as_u64().unwrap() >= 1);
    let v1 = r.json["version"].as_str().unwrap().to_string();
    let r = put(
        &t,
        "doc-hr",
        "Parental leave",
        "Parental leave lasts twenty weeks at full pay for all staff.",
        "hr",
    )
    .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.text);

    // Replace: 200 and a new version.
    let r = put(
        &t,
        "doc-risk",
        "Liquidity buffer policy",
        "The liquidity buffer must stay above 15 percent of deposits. Codename OSPREY-4411.",
        "risk",
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert_ne!(r.json["version"].as_str().unwrap(), v1);

    // Admin view.
    let r = t
        .call(Method::GET, "/v1/documents/doc-risk", Some(&t.admin), None)
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert_eq!(r.json["acl"], json!({"users": [], "groups": ["risk"]}));
    assert_eq!(r.json["metadata"], json!({"kind": "policy"}));
    assert_eq!(r.json["deleted_at"], json!(null));
    assert!(
        r.json.get("text").is_none(),
        "admin view carries no content"
    );

    // Retrieve: each user sees only their documents.
    let r = ask(&t, &risk).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert_eq!(r.headers.get("x-airlock-rung").unwrap(), "0");
    let docs: Vec<&str> = r.json["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| h["doc_id"].as_str().unwrap())
        .collect();
    assert_eq!(docs[0], "doc-risk", "{}", r.text);
    assert!(!docs.contains(&"doc-hr") || docs.len() > 1);
    assert!(
        r.json["results"][0]["snippet"]
            .as_str()
            .unwrap()
            .contains("15 percent")
    );
    // Per-stage timings go to admins only: for anyone else they would tell a word that occurs
    // only in documents they cannot read from an absent word (issue 19, F2).
    assert!(r.json.get("timings_ms").is_none(), "{}", r.text);
    let boss = t.admin_user("boss", &["risk"]);
    let b = ask(&t, &boss).await;
    assert_eq!(b.status, StatusCode::OK, "{}", b.text);
    assert!(
        b.json["timings_ms"]["bm25"].as_f64().is_some(),
        "{}",
        b.text
    );
    assert!(
        b.json["timings_ms"]["handler"].as_f64().is_some(),
        "{}",
        b.text
    );
    let r = ask(&t, &hr).await;
    let docs: Vec<&str> = r.json["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| h["doc_id"].as_str().unwrap())
        .collect();
    assert!(
        docs.iter().all(|d| *d == "doc-hr"),
        "hr sees only the hr document: {}",
        r.text
    );
    assert!(!r.text.contains("OSPREY"));
    let r = t
        .call(
            Method::POST,
            "/v1/retrieve",
            Some(&hr),
            Some(json!({"query": "how long is parental leave", "top_k": 5})),
        )
        .await;
    assert_eq!(r.json["results"][0]["doc_id"], "doc-hr", "{}", r.text);
    assert!(
        r.json["results"][0].get("text").is_none(),
        "no full text unless asked: {}",
        r.text
    );
    // `include_text`: each chunk's full text, still only what the caller may read.
    let r = t
        .call(
            Method::POST,
            "/v1/retrieve",
            Some(&hr),
            Some(json!({"query": "how long is parental leave", "top_k": 5, "include_text": true})),
        )
        .await;
    let results = r.json["results"].as_array().unwrap();
    assert!(!results.is_empty(), "{}", r.text);
    for hit in results {
        assert_eq!(hit["doc_id"], "doc-hr", "{}", r.text);
        let text = hit["text"].as_str().expect("text asked for");
        let snippet = hit["snippet"].as_str().unwrap().trim_end_matches('…');
        assert!(
            text.len() >= snippet.len() && text.contains(snippet.trim_start_matches('…')),
            "the snippet is cut from the full text: {text:?} / {snippet:?}"
        );
    }
    assert!(!r.text.contains("OSPREY"));
    // `prompt_sources`: what a chat would place in its prompt, by the chat's selection.
    let sources = |q: &'static str| {
        t.call(
            Method::POST,
            "/v1/retrieve",
            Some(&hr),
            Some(json!({"query": q, "prompt_sources": true})),
        )
    };
    let r = sources("how long is parental leave").await;
    let results = r.json["results"].as_array().unwrap();
    assert!(!results.is_empty(), "{}", r.text);
    assert!(results.len() <= 6, "the chat's top_k: {}", r.text);
    assert!(
        results.iter().all(|h| h["doc_id"] == "doc-hr"),
        "{}",
        r.text
    );
    assert!(!r.text.contains("OSPREY"));
    // A name no retrieved source holds: the chat would answer "cannot find" without
    // generating, so it has no prompt source (the plain retrieval still ranks chunks).
    let q = "how long is parental leave at Quillfeather Logistics";
    assert_eq!(
        sources(q).await.json["results"],
        json!([]),
        "name check applied"
    );
    let r = t
        .call(
            Method::POST,
            "/v1/retrieve",
            Some(&hr),
            Some(json!({"query": q, "top_k": 5})),
        )
        .await;
    assert!(
        !r.json["results"].as_array().unwrap().is_empty(),
        "{}",
        r.text
    );

    // Delete: tombstoned at once, idempotent, never returned again.
    let r = t
        .call(
            Method::DELETE,
            "/v1/documents/doc-risk",
            Some(&t.admin),
            None,
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert_eq!(r.json["status"], "deleted");
    let r = t
        .call(
            Method::DELETE,
            "/v1/documents/doc-risk",
            Some(&t.admin),
            None,
        )
        .await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.json["status"], "already_deleted");
    let r = ask(&t, &risk).await;
    assert!(!r.text.contains("doc-risk"), "{}", r.text);
    let r = t
        .call(Method::GET, "/v1/documents/doc-risk", Some(&t.admin), None)
        .await;
    assert!(r.json["deleted_at"].is_string(), "{}", r.text);
    t.call(
        Method::DELETE,
        "/v1/documents/doc-never",
        Some(&t.admin),
        None,
    )
    .await
    .assert_problem(404, "not-found", "no document `doc-never`");
    t.call(Method::GET, "/v1/documents/doc-never", Some(&t.admin), None)
        .await
        .assert_problem(404, "not-found", "no document `doc-never`");

    // Reconcile: the source has only doc-hr and doc-new.
    let r = t
        .call(
            Method::POST,
            "/v1/reconcile",
            Some(&t.admin),
            Some(json!({"source_ids": ["doc-hr", "doc-new"]})),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert_eq!(
        r.json,
        json!({"orphans_tombstoned": Vec::<String>::new(), "missing": ["doc-new"]})
    );
    // Retrieve input validation.
    t.call(
        Method::POST,
        "/v1/retrieve",
        Some(&risk),
        Some(json!({"query": "  "})),
    )
    .await
    .assert_problem(400, "invalid-request", "`query` must not be empty");
    t.call(
        Method::POST,
        "/v1/retrieve",
        Some(&risk),
        Some(json!({"query": "x", "top_k": 0})),
    )
    .await
    .assert_problem(400, "invalid-request", "`top_k` must be between 1 and 100");
}

#[tokio::test]
async fn metrics_exposition_for_admins() {
    let t = TestApp::new();
    t.call(Method::GET, "/healthz", None, None).await;
    let r = t.call(Method::GET, "/metrics", Some(&t.admin), None).await;
    assert_eq!(r.status, StatusCode::OK);
    assert!(
        r.headers
            .get(header::CONTENT_TYPE)
            .unwrap()
            .to_str()
            .unwrap()
            .starts_with("text/plain; version=0.0.4")
    );
    assert!(
        r.text
            .contains("airlock_requests_total{route=\"/healthz\",status=\"200\"} 1"),
        "{}",
        r.text
    );
    assert!(
        r.text
            .contains("airlock_bundle_info{version=\"1.0.0-test\"} 1")
    );
}

#[tokio::test]
async fn ui_is_served_with_csp() {
    let t = TestApp::new();
    let r = t.call(Method::GET, "/", None, None).await;
    assert_eq!(r.status, StatusCode::OK);
    assert!(r.text.contains("<html"));
    assert!(
        r.headers
            .get(header::CONTENT_SECURITY_POLICY)
            .unwrap()
            .to_str()
            .unwrap()
            .contains("default-src 'self'")
    );
    let r = t.call(Method::GET, "/js/app.js", None, None).await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(
        r.headers.get(header::CONTENT_TYPE).unwrap(),
        "text/javascript; charset=utf-8"
    );
    t.call(Method::GET, "/js/missing.js", None, None)
        .await
        .assert_problem(404, "not-found", "no such route");
}

async fn put(t: &TestApp, id: &str, title: &str, text: &str, group: &str) -> crate::support::Resp {
    t.call(
        Method::PUT,
        &format!("/v1/documents/{id}"),
        Some(&t.admin),
        Some(
            json!({"title": title, "text": text, "metadata": {"kind": "policy"},
                    "acl": {"users": [], "groups": [group]}}),
        ),
    )
    .await
}

async fn ask(t: &TestApp, token: &str) -> crate::support::Resp {
    t.call(
        Method::POST,
        "/v1/retrieve",
        Some(token),
        Some(json!({"query": "liquidity buffer percent of deposits", "top_k": 5})),
    )
    .await
}

#[tokio::test]
async fn per_user_budget_is_rate_limited() {
    let t = TestApp::with_config(Config {
        user_requests_per_minute: Some(2),
        ..crate::support::test_config()
    });
    let alice = t.user("alice", &["risk"]);
    let bob = t.user("bob", &["risk"]);
    let ask = |token: String| {
        let t = &t;
        async move {
            t.call(
                Method::POST,
                "/v1/retrieve",
                Some(&token),
                Some(json!({"query": "liquidity"})),
            )
            .await
        }
    };
    assert_eq!(ask(alice.clone()).await.status, StatusCode::OK);
    assert_eq!(ask(alice.clone()).await.status, StatusCode::OK);
    let r = ask(alice.clone()).await;
    r.assert_problem(429, "rate-limited", "request budget exhausted; retry later");
    let retry: u64 = r.headers[header::RETRY_AFTER]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!((29..=30).contains(&retry), "{retry}");
    // Budgets are per user.
    assert_eq!(ask(bob).await.status, StatusCode::OK);
}

/// A PDF ingested as a file (as `airlock ingest DIR` does) is retrieved with its page anchor
/// and heading path, only by a reader of the document.
#[tokio::test]
async fn ingested_pdf_is_retrieved_with_its_page_anchor() {
    let t = TestApp::new();
    let carol = t.user("carol", &[]);
    let dave = t.user("dave", &[]);
    let pdf = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../extract/tests/fixtures/table-two-pages.pdf");
    let services = t.state.services().unwrap();
    let rep = services
        .retrieval
        .ingest_path(&pdf, 8, &mut |_| {})
        .unwrap();
    assert!(rep.errors.is_empty(), "{:?}", rep.errors);
    assert_eq!(rep.outcomes[0].doc_id, "table-two-pages.pdf");
    let r = t
        .call(
            Method::PUT,
            "/v1/acl/documents/table-two-pages.pdf",
            Some(&t.admin),
            Some(json!({"users": ["carol"], "groups": []})),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    let body = json!({"query": "Premier Bond 68 rate", "top_k": 3, "mode": "bm25"});
    let r = t
        .call(
            Method::POST,
            "/v1/retrieve",
            Some(&carol),
            Some(body.clone()),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    let hit = &r.json["results"][0];
    assert_eq!(hit["doc_id"], "table-two-pages.pdf", "{}", r.json);
    assert!(
        hit["snippet"]
            .as_str()
            .unwrap()
            .starts_with("Product | Term (months)"),
        "{hit}"
    );
    let pages: Vec<i64> = r.json["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| h["page"].as_i64().expect("every hit of the PDF has a page"))
        .collect();
    assert!(pages.contains(&2), "row 68 is on page 2: {}", r.json);
    // The supporting passage is the row the question names, inside its snippet.
    let passage = hit["passage"].as_str().expect("a passage");
    assert!(passage.contains("Premier Bond 68"), "{hit}");
    assert!(hit["snippet"].as_str().unwrap().contains(passage), "{hit}");
    assert_eq!(hit["section"], json!(["Deposit rate sheet"]));
    // Someone without a grant gets nothing, anchors included.
    let r = t
        .call(Method::POST, "/v1/retrieve", Some(&dave), Some(body))
        .await;
    assert_eq!(r.json["results"], json!([]), "{}", r.json);
}
