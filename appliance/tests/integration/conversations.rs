//! The answer path's conversation features through `app()` with the real models: follow-up
//! questions retrieve from the conversation, server-kept threads (`/v1/conversations`) with
//! redaction when access changes, and OpenAI fidelity (unsupported fields refused by name, the
//! `error` member of problems, `stream_options.include_usage`).

use axum::http::{Method, StatusCode};
use serde_json::{Value, json};

use crate::support::TestApp;

/// Two near-identical rate documents for two products, readable by `risk`.
async fn seed(t: &TestApp) -> String {
    for (id, title, text) in [
        (
            "doc-aurora",
            "Aurora Freight facility",
            "The committee set a maximum net debt to EBITDA of 3.25x for Aurora Freight. \
             The facility tenor is five years.",
        ),
        (
            "doc-fairhaven",
            "Fairhaven Shipping facility",
            "The committee set a maximum net debt to EBITDA of 4.10x for Fairhaven Shipping. \
             The facility tenor is seven years.",
        ),
    ] {
        let r = t
            .call(
                Method::PUT,
                &format!("/v1/documents/{id}"),
                Some(&t.admin),
                Some(json!({"title": title, "text": text,
                            "acl": {"users": [], "groups": ["risk"]}})),
            )
            .await;
        assert_eq!(r.status, StatusCode::CREATED, "{}", r.text);
    }
    t.user("rita", &["risk"])
}

fn first_turn() -> Vec<Value> {
    vec![
        json!({"role": "user", "content": "What maximum net debt to EBITDA did the committee set for Fairhaven Shipping?"}),
        json!({"role": "assistant", "content": "The committee set 4.10x for Fairhaven Shipping [1]."}),
    ]
}

async fn retrieve_ids(t: &TestApp, token: &str, body: Value) -> Vec<String> {
    let r = t
        .call(Method::POST, "/v1/retrieve", Some(token), Some(body))
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    r.json["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| h["doc_id"].as_str().unwrap().to_string())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follow_up_retrieves_from_the_conversation() {
    let t = TestApp::new();
    let rita = seed(&t).await;
    // "And for Aurora Freight?" alone names the company but not what is asked; with the
    // conversation it is the leverage question about Aurora Freight.
    let mut messages = first_turn();
    messages.push(json!({"role": "user", "content": "And for Aurora Freight?"}));
    let ids = retrieve_ids(&t, &rita, json!({"messages": messages, "top_k": 2})).await;
    assert_eq!(ids[0], "doc-aurora", "{ids:?}");
    // A new question about the same subject carries the subject over.
    let mut messages = first_turn();
    messages.push(json!({"role": "user", "content": "And what is the tenor of that facility?"}));
    let ids = retrieve_ids(&t, &rita, json!({"messages": messages, "top_k": 1})).await;
    assert_eq!(ids, ["doc-fairhaven"]);
    // The chat retrieves the same way: its first citation is the Aurora document.
    let mut messages = first_turn();
    messages.push(json!({"role": "user", "content": "And for Aurora Freight?"}));
    let r = t
        .call(
            Method::POST,
            "/v1/chat/completions",
            Some(&rita),
            Some(json!({"messages": messages, "max_tokens": 24})),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert_eq!(
        r.json["airlock"]["citations"][0]["doc_id"], "doc-aurora",
        "{}",
        r.text
    );
    // Both `query` and `messages` at once is refused.
    let r = t
        .call(
            Method::POST,
            "/v1/retrieve",
            Some(&rita),
            Some(json!({"query": "x", "messages": first_turn()})),
        )
        .await;
    r.assert_problem(
        400,
        "invalid-request",
        "give either `query` or `messages`, not both",
    );
}

/// `follow_up_query = "rewrite"`: the generator rewrites a follow-up before retrieval (its cost
/// in `timings_ms.query_rewrite`, admins only); a first turn is never rewritten; whatever the
/// rewrite says, nothing the caller may not read is retrieved.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rewrite_mode_rewrites_follow_ups_only_and_keeps_the_acl() {
    let mut config = crate::support::test_config();
    config.follow_up_query = Some(airlock_rag::FollowUps::Rewrite);
    let t = TestApp::with_config(config);
    let rita = seed(&t).await;
    // A document about Aurora Freight that rita may not read.
    let r = t
        .call(
            Method::PUT,
            "/v1/documents/doc-aurora-secret",
            Some(&t.admin),
            Some(json!({"title": "Aurora Freight watch list",
                        "text": "Aurora Freight is on the watch list; net debt to EBITDA 5.9x.",
                        "acl": {"users": [], "groups": ["board"]}})),
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.text);
    let boss = t.admin_user("boss", &["risk"]);
    let mut messages = first_turn();
    messages.push(json!({"role": "user", "content": "And for Aurora Freight?"}));
    let r = t
        .call(
            Method::POST,
            "/v1/retrieve",
            Some(&boss),
            Some(json!({"messages": messages, "top_k": 5})),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    let ms = r.json["timings_ms"]["query_rewrite"].as_f64();
    assert!(ms.is_some_and(|m| m > 0.0), "{}", r.text);
    let ids: Vec<&str> = r.json["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| h["doc_id"].as_str().unwrap())
        .collect();
    assert!(ids.contains(&"doc-aurora"), "{ids:?}");
    assert!(!ids.contains(&"doc-aurora-secret"), "{ids:?}");
    // A first turn is searched as written: no rewrite.
    let r = t
        .call(
            Method::POST,
            "/v1/retrieve",
            Some(&boss),
            Some(json!({"messages": [first_turn()[0].clone()], "top_k": 2})),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert!(
        r.json["timings_ms"].get("query_rewrite").is_none(),
        "{}",
        r.text
    );
    // The ordinary user's follow-up never sees the unreadable document, in retrieval or chat.
    let ids = retrieve_ids(&t, &rita, json!({"messages": messages, "top_k": 5})).await;
    assert!(!ids.iter().any(|d| d == "doc-aurora-secret"), "{ids:?}");
    let r = t
        .call(
            Method::POST,
            "/v1/chat/completions",
            Some(&rita),
            Some(json!({"messages": messages, "max_tokens": 16})),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert!(!r.text.contains("doc-aurora-secret"), "{}", r.text);
    assert!(!r.text.contains("5.9x"), "{}", r.text);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn threads_keep_turns_and_redact_them_when_a_source_is_revoked() {
    let t = TestApp::new();
    let rita = seed(&t).await;
    let other = t.user("otto", &["risk"]);
    let r = t
        .call(
            Method::POST,
            "/v1/conversations",
            Some(&rita),
            Some(json!({})),
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.text);
    let id = r.json["id"].as_str().unwrap().to_string();
    // First turn, then a follow-up that sends only the new question: the thread is the history.
    for q in [
        "What maximum net debt to EBITDA did the committee set for Fairhaven Shipping?",
        "And for Aurora Freight?",
    ] {
        let r = t
            .call(
                Method::POST,
                "/v1/chat/completions",
                Some(&rita),
                Some(
                    json!({"messages": [{"role": "user", "content": q}], "max_tokens": 24,
                            "airlock": {"conversation_id": id}}),
                ),
            )
            .await;
        assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    }
    // The turns are stored after the answer (on the blocking pool): wait for both.
    let mut thread = Value::Null;
    for _ in 0..100 {
        thread = t
            .call(
                Method::GET,
                &format!("/v1/conversations/{id}"),
                Some(&rita),
                None,
            )
            .await
            .json;
        if thread["messages"].as_array().is_some_and(|m| m.len() == 2) {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    let turns = thread["messages"].as_array().unwrap();
    assert_eq!(turns.len(), 2, "{thread}");
    assert_eq!(turns[1]["question"], "And for Aurora Freight?");
    assert_eq!(turns[1]["sources"][0]["doc_id"], "doc-aurora", "{thread}");
    assert_eq!(turns[0]["redacted"], false);
    // Listed for its owner only; another user gets the same 404 as for a missing thread.
    let r = t
        .call(Method::GET, "/v1/conversations", Some(&rita), None)
        .await;
    assert_eq!(r.json["data"][0]["id"], id.as_str());
    assert_eq!(r.json["data"][0]["turns"], 2);
    let theirs = t
        .call(
            Method::GET,
            &format!("/v1/conversations/{id}"),
            Some(&other),
            None,
        )
        .await;
    let missing = t
        .call(
            Method::GET,
            "/v1/conversations/conv-nope",
            Some(&other),
            None,
        )
        .await;
    assert_eq!(theirs.status, StatusCode::NOT_FOUND);
    assert_eq!(theirs.text, missing.text);
    let r = t
        .call(
            Method::POST,
            "/v1/chat/completions",
            Some(&other),
            Some(json!({"messages": [{"role": "user", "content": "hi"}],
                        "airlock": {"conversation_id": id}})),
        )
        .await;
    assert_eq!(r.status, StatusCode::NOT_FOUND, "{}", r.text);

    // The Aurora document is re-permissioned away from rita: the turn that showed it is
    // redacted (no text of it at all), the other stays.
    let r = t
        .call(
            Method::PUT,
            "/v1/acl/documents/doc-aurora",
            Some(&t.admin),
            Some(json!({"users": [], "groups": ["credit-committee"]})),
        )
        .await;
    assert!(r.status.is_success(), "{}", r.text);
    let r = t
        .call(
            Method::GET,
            &format!("/v1/conversations/{id}"),
            Some(&rita),
            None,
        )
        .await;
    let turns = r.json["messages"].as_array().unwrap();
    assert_eq!(turns[0]["redacted"], false, "{}", r.text);
    assert_eq!(turns[1]["redacted"], true, "{}", r.text);
    assert!(turns[1].get("answer").is_none() && turns[1].get("question").is_none());
    assert_eq!(turns[1]["sources"], json!([]));
    assert!(!r.text.contains("Aurora"), "{}", r.text);
    assert!(!r.text.contains("3.25"), "{}", r.text);

    // Deleting the thread: 204, then 404.
    let r = t
        .call(
            Method::DELETE,
            &format!("/v1/conversations/{id}"),
            Some(&rita),
            None,
        )
        .await;
    assert_eq!(r.status, StatusCode::NO_CONTENT);
    let r = t
        .call(
            Method::GET,
            &format!("/v1/conversations/{id}"),
            Some(&rita),
            None,
        )
        .await;
    assert_eq!(r.status, StatusCode::NOT_FOUND);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unsupported_openai_fields_are_refused_by_name() {
    let t = TestApp::new();
    let rita = seed(&t).await;
    for (field, value) in [
        (
            "tools",
            json!([{"type": "function", "function": {"name": "f"}}]),
        ),
        ("tool_choice", json!("auto")),
        ("functions", json!([{"name": "f"}])),
        ("response_format", json!({"type": "json_object"})),
        ("n", json!(2)),
        ("logprobs", json!(true)),
        ("top_logprobs", json!(3)),
        ("logit_bias", json!({"50256": -100})),
    ] {
        let mut body = json!({"messages": [{"role": "user", "content": "hi"}],
                              "airlock": {"retrieval": false}, "max_tokens": 2});
        body[field] = value;
        let r = t
            .call(
                Method::POST,
                "/v1/chat/completions",
                Some(&rita),
                Some(body),
            )
            .await;
        assert_eq!(r.status, StatusCode::BAD_REQUEST, "{field}: {}", r.text);
        assert_eq!(
            r.json["type"], "https://airlock.local/problems/unsupported-parameter",
            "{field}"
        );
        assert_eq!(r.json["error"]["code"], "unsupported_parameter");
        assert_eq!(r.json["error"]["param"], field);
        assert_eq!(r.json["error"]["type"], "invalid_request_error");
        assert!(r.json["detail"].as_str().unwrap().contains(field));
    }
    // What the daemon does anyway is accepted: one choice, text, no logprobs.
    let r = t
        .call(
            Method::POST,
            "/v1/chat/completions",
            Some(&rita),
            Some(
                json!({"messages": [{"role": "user", "content": "hi"}], "n": 1,
                        "response_format": {"type": "text"}, "logprobs": false,
                        "tool_choice": "none", "airlock": {"retrieval": false},
                        "max_tokens": 2}),
            ),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    // Every problem carries the OpenAI-style member.
    let r = t
        .call(Method::GET, "/v1/conversations", Some("bogus"), None)
        .await;
    assert_eq!(r.status, StatusCode::UNAUTHORIZED);
    assert_eq!(r.json["error"]["type"], "authentication_error");
    assert_eq!(r.json["error"]["message"], r.json["detail"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn include_usage_adds_a_usage_chunk_without_choices() {
    let t = TestApp::new();
    let rita = seed(&t).await;
    let r = t
        .call(
            Method::POST,
            "/v1/chat/completions",
            Some(&rita),
            Some(
                json!({"messages": [{"role": "user", "content": "hi"}], "stream": true,
                        "stream_options": {"include_usage": true},
                        "airlock": {"retrieval": false}, "max_tokens": 3}),
            ),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    let events: Vec<Value> = r
        .text
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter(|d| *d != "[DONE]")
        .map(|d| serde_json::from_str(d).unwrap())
        .collect();
    let last = events.last().unwrap();
    assert_eq!(last["choices"], json!([]), "{}", r.text);
    assert!(last["usage"]["total_tokens"].as_u64().unwrap() > 0);
    assert!(r.text.trim_end().ends_with("data: [DONE]"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fixed_system_prompt_prefix_is_prefilled_once_and_answers_are_unchanged() {
    // Its own engine: the prefix is registered as start-up does for every generator.
    let g = crate::support::load_smollm2();
    let prefix = g.shared_prefix_ids().unwrap();
    assert!(
        prefix.len() > 50,
        "the system prompt is most of it: {}",
        prefix.len()
    );
    g.engine().set_shared_prefix(prefix.clone());
    let t = TestApp::with_generator(crate::support::test_config(), g.clone());
    let rita = seed(&t).await;
    let ask =
        |q: &'static str| json!({"messages": [{"role": "user", "content": q}], "max_tokens": 12});
    let mut answers = Vec::new();
    for q in [
        "What maximum net debt to EBITDA was set for Aurora Freight?",
        "What maximum net debt to EBITDA was set for Aurora Freight?",
        "What is the tenor of the Fairhaven Shipping facility?",
    ] {
        let r = t
            .call(
                Method::POST,
                "/v1/chat/completions",
                Some(&rita),
                Some(ask(q)),
            )
            .await;
        assert_eq!(r.status, StatusCode::OK, "{}", r.text);
        answers.push(r.json["choices"][0]["message"]["content"].clone());
    }
    let m = g.engine().metrics();
    // The first request fills the prefix; the next two (another question too) reuse it.
    assert_eq!(m.prefix_hits, 2, "{m:?}");
    assert_eq!(m.prefix_tokens_saved, 2 * prefix.len() as u64, "{m:?}");
    // Greedy: the same question gets the same answer cold and from the cached prefix.
    assert_eq!(answers[0], answers[1]);
}

/// Asks `q` in the thread `id` as `token` (`retrieval`: whether sources are retrieved); returns
/// the response.
async fn ask_in(t: &TestApp, token: &str, id: Option<&str>, q: &str, retrieval: bool) -> Value {
    let mut airlock = json!({"retrieval": retrieval});
    if let Some(id) = id {
        airlock["conversation_id"] = json!(id);
    }
    let r = t
        .call(
            Method::POST,
            "/v1/chat/completions",
            Some(token),
            Some(
                json!({"messages": [{"role": "user", "content": q}], "max_tokens": 24,
                        "airlock": airlock}),
            ),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    r.json
}

/// The thread once it holds `n` turns (they are stored after the answer, on the blocking pool).
async fn thread_with(t: &TestApp, token: &str, id: &str, n: usize) -> Value {
    let mut thread = Value::Null;
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

/// Issue 42 H5 and L1: a turn without sources that repeats an earlier answer carries that
/// answer's provenance, so it is redacted with it (shown and fed to the model alike) and comes
/// back with it; a document deleted and re-created under the same id does not bring a turn
/// back, since what a turn saw is keyed on the document's version.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_turn_repeating_an_answer_is_redacted_with_it_and_keyed_on_the_version() {
    let t = TestApp::new();
    let rita = seed(&t).await;
    let r = t
        .call(
            Method::POST,
            "/v1/conversations",
            Some(&rita),
            Some(json!({})),
        )
        .await;
    let id = r.json["id"].as_str().unwrap().to_string();
    let first = ask_in(
        &t,
        &rita,
        Some(&id),
        "What maximum net debt to EBITDA did the committee set for Fairhaven Shipping?",
        true,
    )
    .await;
    assert_eq!(
        first["airlock"]["citations"][0]["doc_id"], "doc-fairhaven",
        "{first}"
    );
    thread_with(&t, &rita, &id, 1).await;
    ask_in(&t, &rita, Some(&id), "Repeat your previous answer.", false).await;
    let thread = thread_with(&t, &rita, &id, 2).await;
    assert_eq!(thread["messages"][1]["sources"], json!([]), "{thread}");
    assert_eq!(thread["messages"][1]["redacted"], false, "{thread}");

    // Fairhaven is re-permissioned away from rita: the repeat goes with the answer it repeats.
    let grant = |groups: Value| {
        t.call(
            Method::PUT,
            "/v1/acl/documents/doc-fairhaven",
            Some(&t.admin),
            Some(json!({"users": [], "groups": groups})),
        )
    };
    let r = grant(json!(["credit-committee"])).await;
    assert!(r.status.is_success(), "{}", r.text);
    let thread = thread_with(&t, &rita, &id, 2).await;
    for turn in thread["messages"].as_array().unwrap() {
        assert_eq!(turn["redacted"], true, "{thread}");
        assert!(turn.get("answer").is_none(), "{thread}");
    }
    // Nor is it fed to the model: a question in the thread is prompted exactly as one asked
    // outside any thread.
    let q = "Say hello.";
    let alone = ask_in(&t, &rita, None, q, false).await;
    let within = ask_in(&t, &rita, Some(&id), q, false).await;
    assert_eq!(
        within["usage"]["prompt_tokens"], alone["usage"]["prompt_tokens"],
        "no redacted turn in the prompt: {within} vs {alone}"
    );
    thread_with(&t, &rita, &id, 3).await;
    // The grant back: both turns come back.
    let r = grant(json!(["risk"])).await;
    assert!(r.status.is_success(), "{}", r.text);
    let thread = thread_with(&t, &rita, &id, 3).await;
    let redacted: Vec<&Value> = thread["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| &m["redacted"])
        .collect();
    assert_eq!(redacted, [false, false, false], "{thread}");

    // The document is deleted and its id re-created with another text that rita may read:
    // the turns that saw the old text stay redacted ("changed"), the repeat with them.
    let r = t
        .call(
            Method::DELETE,
            "/v1/documents/doc-fairhaven",
            Some(&t.admin),
            None,
        )
        .await;
    assert!(r.status.is_success(), "{}", r.text);
    let thread = thread_with(&t, &rita, &id, 3).await;
    assert_eq!(
        thread["messages"][0]["notice"],
        "a source of this answer is no longer available to you"
    );
    let r = t
        .call(
            Method::PUT,
            "/v1/documents/doc-fairhaven",
            Some(&t.admin),
            Some(json!({"title": "Fairhaven Shipping facility",
                        "text": "The Fairhaven Shipping facility was cancelled.",
                        "acl": {"users": [], "groups": ["risk"]}})),
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.text);
    let thread = thread_with(&t, &rita, &id, 3).await;
    let turns = thread["messages"].as_array().unwrap();
    for turn in &turns[..2] {
        assert_eq!(turn["redacted"], true, "{thread}");
        assert_eq!(
            turn["notice"],
            "a source of this answer has changed since; ask again for an answer from its current text"
        );
    }
    // The third turn was answered without them (they were redacted then): it stands.
    assert_eq!(turns[2]["redacted"], false, "{thread}");
    assert!(!thread.to_string().contains("4.10"), "{thread}");
}
