//! `POST /v1/feedback` through `app()` + `oneshot` with the real SmolLM2 engine: every status of
//! the contract with exact problem bodies, the replace semantics, the same 404 for another
//! user's request id as for an unknown one, rating a stopped stream, the completion id equal to
//! `X-Request-Id`, no question text on disk, and persistence across a restart.

use airlock::{Config, app};
use axum::body::Body;
use axum::http::{Method, Request, StatusCode, header};
use http_body_util::BodyExt;
use serde_json::{Value, json};
use tower::ServiceExt;

use crate::support::{Resp, TestApp, test_config};

const NOT_SERVED: &str = "no chat completion with this request_id was served to you";

fn question(text: &str, stream: bool) -> Value {
    json!({
        "messages": [{"role": "user", "content": text}],
        "max_tokens": 4,
        "stream": stream,
        "airlock": {"retrieval": false},
    })
}

/// A non-streaming answer to `token`; returns the response (id checked against the header).
async fn answer(t: &TestApp, token: &str, text: &str) -> Resp {
    let r = t
        .call(
            Method::POST,
            "/v1/chat/completions",
            Some(token),
            Some(question(text, false)),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    let id = r.json["id"].as_str().unwrap();
    assert_eq!(
        r.headers["x-request-id"], id,
        "completion id = X-Request-Id"
    );
    r
}

async fn feedback(t: &TestApp, token: Option<&str>, body: Value) -> Resp {
    t.call(Method::POST, "/v1/feedback", token, Some(body))
        .await
}

/// Sends a raw body to `/v1/feedback` as `token`.
async fn feedback_raw(t: &TestApp, token: &str, body: &'static str) -> Resp {
    t.send(
        Request::post("/v1/feedback")
            .header(header::AUTHORIZATION, format!("Bearer {token}"))
            .header(header::CONTENT_TYPE, "application/json")
            .body(Body::from(body))
            .unwrap(),
    )
    .await
}

fn created_at(r: &Resp) -> time::OffsetDateTime {
    time::OffsetDateTime::parse(
        r.json["created_at"].as_str().unwrap(),
        &time::format_description::well_known::Rfc3339,
    )
    .unwrap()
}

async fn metrics(t: &TestApp) -> String {
    t.call(Method::GET, "/metrics", Some(&t.admin), None)
        .await
        .text
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rating_is_stored_then_replaced() {
    let t = TestApp::new();
    let alice = t.user("alice", &["risk"]);
    let r = answer(&t, &alice, "Say hello.").await;
    let id = r.json["id"].as_str().unwrap().to_string();

    let r = feedback(&t, Some(&alice), json!({"request_id": id, "rating": "up"})).await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.text);
    let first_at = created_at(&r);
    assert_eq!(
        r.json,
        json!({"request_id": id, "rating": "up", "comment": null,
               "created_at": r.json["created_at"]})
    );

    // The UI sends the rating at once, then again with the comment: 200, replaced.
    let r = feedback(
        &t,
        Some(&alice),
        json!({"request_id": id, "rating": "down", "comment": "Missed the 15 % figure"}),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert_eq!(r.json["rating"], "down");
    assert_eq!(r.json["comment"], "Missed the 15 % figure");
    assert_eq!(created_at(&r), first_at, "created_at is the first rating's");
    let store = t.state.services().unwrap().feedback.clone().unwrap();
    let stored = store.feedback("alice", &id).unwrap().unwrap();
    assert_eq!(stored.rating, airlock_evidence::feedback::Rating::Down);
    assert_eq!(stored.comment.as_deref(), Some("Missed the 15 % figure"));
    assert!(stored.updated_us >= stored.created_us);

    // A blank comment is no comment: replacing with it clears the stored one.
    let r = feedback(
        &t,
        Some(&alice),
        json!({"request_id": id, "rating": "up", "comment": "  "}),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert_eq!(r.json["comment"], Value::Null);
    assert_eq!(store.feedback("alice", &id).unwrap().unwrap().comment, None);

    // Counted by rating only: no comment text, user or request id in the exposition.
    let m = metrics(&t).await;
    assert!(m.contains("airlock_feedback_total{rating=\"up\"} 2"), "{m}");
    assert!(
        m.contains("airlock_feedback_total{rating=\"down\"} 1"),
        "{m}"
    );
    assert!(!m.contains("Missed the") && !m.contains(&id), "{m}");
    assert!(
        m.contains("route=\"/v1/feedback\",status=\"201\"} 1"),
        "{m}"
    );
    assert!(
        m.contains("route=\"/v1/feedback\",status=\"200\"} 2"),
        "{m}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_users_request_id_is_the_same_404_as_an_unknown_one() {
    let t = TestApp::new();
    let alice = t.user("alice", &["risk"]);
    let bob = t.user("bob", &["risk"]);
    let r = answer(&t, &alice, "Say hello.").await;
    let id = r.json["id"].as_str().unwrap().to_string();

    let foreign = feedback(&t, Some(&bob), json!({"request_id": id, "rating": "down"})).await;
    foreign.assert_problem(404, "not-found", NOT_SERVED);
    let unknown = feedback(
        &t,
        Some(&bob),
        json!({"request_id": "chatcmpl-never-served", "rating": "down"}),
    )
    .await;
    unknown.assert_problem(404, "not-found", NOT_SERVED);
    assert_eq!(foreign.text, unknown.text, "byte-identical bodies");
    assert_eq!(
        foreign.headers[header::CONTENT_TYPE],
        unknown.headers[header::CONTENT_TYPE]
    );
    // Bob's attempt left nothing behind; Alice can still rate her answer.
    let store = t.state.services().unwrap().feedback.clone().unwrap();
    assert_eq!(store.feedback("bob", &id).unwrap(), None);
    let r = feedback(&t, Some(&alice), json!({"request_id": id, "rating": "up"})).await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.text);
    // Even the admin cannot rate someone else's answer.
    feedback(
        &t,
        Some(&t.admin),
        json!({"request_id": id, "rating": "up"}),
    )
    .await
    .assert_problem(404, "not-found", NOT_SERVED);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_bodies_and_auth_problems() {
    let t = TestApp::new();
    let alice = t.user("alice", &["risk"]);
    let r = answer(&t, &alice, "Say hello.").await;
    let id = r.json["id"].as_str().unwrap().to_string();

    // 401 before the body is read: a garbage body is not a 400.
    for token in [None, Some("not-a-token")] {
        let mut b = Request::post("/v1/feedback").header(header::CONTENT_TYPE, "application/json");
        if let Some(tok) = token {
            b = b.header(header::AUTHORIZATION, format!("Bearer {tok}"));
        }
        t.send(b.body(Body::from("{not json")).unwrap())
            .await
            .assert_problem(401, "unauthorized", "a valid bearer token is required");
    }
    t.call(Method::GET, "/v1/feedback", Some(&alice), None)
        .await
        .assert_problem(
            405,
            "method-not-allowed",
            "method GET is not allowed on this route",
        );

    feedback_raw(&t, &alice, "{\"request_id\": ")
        .await
        .assert_problem(
            400,
            "invalid-request",
            "invalid JSON body: EOF while parsing a value at line 1 column 15",
        );
    feedback_raw(&t, &alice, "{\"request_id\": \"x\"}")
        .await
        .assert_problem(
            400,
            "invalid-request",
            "invalid JSON body: missing field `rating` at line 1 column 19",
        );
    feedback_raw(&t, &alice, "{\"request_id\": \"x\", \"rating\": \"meh\"}")
        .await
        .assert_problem(
            400,
            "invalid-request",
            "invalid JSON body: unknown variant `meh`, expected `up` or `down` at line 1 column 35",
        );
    feedback_raw(&t, &alice, "{\"request_id\": 7, \"rating\": \"up\"}")
        .await
        .assert_problem(
            400,
            "invalid-request",
            "invalid JSON body: invalid type: integer `7`, expected a string at line 1 column 16",
        );
    feedback_raw(
        &t,
        &alice,
        "{\"request_id\": \"x\", \"rating\": \"up\", \"answer\": \"the answer text\"}",
    )
    .await
    .assert_problem(
        400,
        "invalid-request",
        "invalid JSON body: unknown field `answer`, expected one of `request_id`, `rating`, \
         `comment` at line 1 column 44",
    );

    // request_id: 1..=200 characters. 200 passes validation (and is unknown: 404).
    let id_problem = "`request_id` must be 1 to 200 characters";
    feedback(&t, Some(&alice), json!({"request_id": "", "rating": "up"}))
        .await
        .assert_problem(400, "invalid-request", id_problem);
    feedback(
        &t,
        Some(&alice),
        json!({"request_id": "r".repeat(201), "rating": "up"}),
    )
    .await
    .assert_problem(400, "invalid-request", id_problem);
    feedback(
        &t,
        Some(&alice),
        json!({"request_id": "é".repeat(200), "rating": "up"}),
    )
    .await
    .assert_problem(404, "not-found", NOT_SERVED);

    // comment: at most 2000 characters (Unicode scalar values, not bytes).
    let r = feedback(
        &t,
        Some(&alice),
        json!({"request_id": id, "rating": "up", "comment": "é".repeat(2000)}),
    )
    .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.text);
    assert_eq!(r.json["comment"].as_str().unwrap().chars().count(), 2000);
    feedback(
        &t,
        Some(&alice),
        json!({"request_id": id, "rating": "down", "comment": "é".repeat(2001)}),
    )
    .await
    .assert_problem(
        400,
        "invalid-request",
        "`comment` must be at most 2000 characters",
    );
    // The refused request changed nothing.
    let store = t.state.services().unwrap().feedback.clone().unwrap();
    assert_eq!(
        store.feedback("alice", &id).unwrap().unwrap().rating,
        airlock_evidence::feedback::Rating::Up
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn body_over_the_limit_is_413() {
    let t = TestApp::with_config(Config {
        body_limit: Some(4096),
        ..test_config()
    });
    let alice = t.user("alice", &["risk"]);
    let r = feedback(
        &t,
        Some(&alice),
        json!({"request_id": "x", "rating": "up", "comment": "c".repeat(5000)}),
    )
    .await;
    r.assert_problem(
        413,
        "payload-too-large",
        "the request body exceeds the limit of 4096 bytes",
    );
    // Also without a Content-Length (a streamed body).
    let body = serde_json::to_vec(&json!({"request_id": "x", "rating": "up",
                                           "comment": "c".repeat(5000)}))
    .unwrap();
    let stream = futures::stream::iter(
        body.chunks(1024)
            .map(|c| Ok::<_, std::io::Error>(axum::body::Bytes::copy_from_slice(c)))
            .collect::<Vec<_>>(),
    );
    t.send(
        Request::post("/v1/feedback")
            .header(header::AUTHORIZATION, format!("Bearer {alice}"))
            .header(header::CONTENT_TYPE, "application/json")
            .body(Body::from_stream(stream))
            .unwrap(),
    )
    .await
    .assert_problem(
        413,
        "payload-too-large",
        "the request body exceeds the limit of 4096 bytes",
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn per_user_budget_is_rate_limited() {
    let t = TestApp::with_config(Config {
        user_requests_per_minute: Some(2),
        ..test_config()
    });
    let alice = t.user("alice", &["risk"]);
    let bob = t.user("bob", &["risk"]);
    let body = json!({"request_id": "chatcmpl-unknown", "rating": "up"});
    for _ in 0..2 {
        assert_eq!(
            feedback(&t, Some(&alice), body.clone()).await.status,
            StatusCode::NOT_FOUND
        );
    }
    let r = feedback(&t, Some(&alice), body.clone()).await;
    r.assert_problem(429, "rate-limited", "request budget exhausted; retry later");
    let retry: u64 = r.headers[header::RETRY_AFTER]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!((29..=30).contains(&retry), "{retry}");
    // Per user.
    assert_eq!(
        feedback(&t, Some(&bob), body).await.status,
        StatusCode::NOT_FOUND
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_stream_can_be_rated() {
    let t = TestApp::new();
    let alice = t.user("alice", &["risk"]);
    let mut q = question("Write a long story about a lighthouse keeper.", true);
    q["max_tokens"] = json!(300);
    let req = Request::post("/v1/chat/completions")
        .header(header::AUTHORIZATION, format!("Bearer {alice}"))
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from(serde_json::to_vec(&q).unwrap()))
        .unwrap();
    let resp = app(t.state.clone()).oneshot(req).await.unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    let header_id = resp.headers()["x-request-id"].to_str().unwrap().to_string();
    let mut body = resp.into_body();
    // The first event carries the completion id; then the client stops.
    let first = body.frame().await.unwrap().unwrap().into_data().unwrap();
    let first = String::from_utf8(first.to_vec()).unwrap();
    let json: Value = serde_json::from_str(first.trim().strip_prefix("data: ").unwrap()).unwrap();
    assert_eq!(json["object"], "chat.completion.chunk");
    assert_eq!(json["id"], header_id.as_str(), "chunk id = X-Request-Id");
    drop(body);
    assert_eq!(
        t.state.metrics().cancelled.get(),
        1,
        "the generation was cancelled, not finished"
    );

    let r = feedback(
        &t,
        Some(&alice),
        json!({"request_id": header_id, "rating": "down", "comment": "stopped: too long"}),
    )
    .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.text);
    assert_eq!(r.json["request_id"], header_id.as_str());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn completion_id_follows_the_request_id_header() {
    let t = TestApp::new();
    let alice = t.user("alice", &["risk"]);
    let send = |rid: String| {
        let t = &t;
        let alice = alice.clone();
        async move {
            t.send(
                Request::post("/v1/chat/completions")
                    .header(header::AUTHORIZATION, format!("Bearer {alice}"))
                    .header(header::CONTENT_TYPE, "application/json")
                    .header("x-request-id", rid)
                    .body(Body::from(
                        serde_json::to_vec(&question("Say hello.", false)).unwrap(),
                    ))
                    .unwrap(),
            )
            .await
        }
    };
    // A usable client id becomes the completion id.
    let r = send("client-chosen-42".into()).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert_eq!(r.json["id"], "client-chosen-42");
    assert_eq!(r.headers["x-request-id"], "client-chosen-42");
    let r = feedback(
        &t,
        Some(&alice),
        json!({"request_id": "client-chosen-42", "rating": "up"}),
    )
    .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.text);
    // An unusable one (over 64 characters) is replaced, and the header follows the completion id.
    let r = send("z".repeat(65)).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    let id = r.json["id"].as_str().unwrap();
    assert_ne!(id, "z".repeat(65));
    assert_eq!(r.headers["x-request-id"], id);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn feedback_survives_a_restart_and_no_question_text_is_stored() {
    let mut t = TestApp::new();
    let alice = t.user("alice", &["risk"]);
    let marker = "Quartermaster ZEBRA-7731 asks: say hello.";
    let r = answer(&t, &alice, marker).await;
    let id = r.json["id"].as_str().unwrap().to_string();
    let answer_text = r.json["choices"][0]["message"]["content"]
        .as_str()
        .unwrap()
        .to_string();
    let r = feedback(
        &t,
        Some(&alice),
        json!({"request_id": id, "rating": "up", "comment": "kept across restarts"}),
    )
    .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.text);
    let first_at = created_at(&r);

    t.restart();
    let store = t.state.services().unwrap().feedback.clone().unwrap();
    let stored = store.feedback("alice", &id).unwrap().unwrap();
    assert_eq!(stored.comment.as_deref(), Some("kept across restarts"));
    assert!(store.completion_recorded("alice", &id).unwrap());
    // The served completion is still resolvable: a second rating replaces the first.
    let r = feedback(
        &t,
        Some(&alice),
        json!({"request_id": id, "rating": "down"}),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert_eq!(created_at(&r), first_at);

    // What is recorded for the completion: ids, user, time, model, rung, bundle; no text.
    let db = rusqlite::Connection::open(store.path()).unwrap();
    let row: (String, String, String, i64, String) = db
        .query_row(
            "SELECT user_id, request_id, model, rung, bundle_version FROM chat_completions",
            [],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?)),
        )
        .unwrap();
    assert_eq!(
        row,
        (
            "alice".into(),
            id.clone(),
            "airlock-small".into(),
            0,
            "1.0.0-test".into()
        )
    );
    // Neither the question nor the answer is anywhere in the database files.
    drop(db);
    for name in ["airlock.db", "airlock.db-wal"] {
        let path = store.path().with_file_name(name);
        let Ok(bytes) = std::fs::read(&path) else {
            continue;
        };
        let text = String::from_utf8_lossy(&bytes);
        assert!(!text.contains("ZEBRA-7731"), "question text in {name}");
        if answer_text.trim().len() >= 8 {
            assert!(!text.contains(answer_text.trim()), "answer text in {name}");
        }
    }
}
