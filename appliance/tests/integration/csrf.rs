//! Issue 42 H3 for every credential: a browser's state-changing request from another site is
//! refused before authentication (`403 cross-site`, `Sec-Fetch-Site` or `Origin`), whether it
//! carries a bearer token, a session cookie (directory and OIDC sign-ins share it) or nothing
//! (the public sign-in); a cookie still needs its session's `X-Airlock-CSRF`; JSON routes take
//! JSON bodies only (`415`), so a form's `text/plain` body never reaches a handler. Refusals
//! change nothing. The SSO proxy's case runs through nginx in `sso_proxy.rs`.

use std::time::Duration;

use axum::body::Body;
use axum::http::{Method, Request, header};
use serde_json::json;

use crate::support::TestApp;

fn post(uri: &str, headers: &[(&str, &str)], body: Option<(&str, &str)>) -> Request<Body> {
    let mut b = Request::builder().method(Method::POST).uri(uri);
    for (k, v) in headers {
        b = b.header(*k, *v);
    }
    match body {
        Some((ct, text)) => {
            if !ct.is_empty() {
                b = b.header(header::CONTENT_TYPE, ct);
            }
            b.body(Body::from(text.to_owned())).unwrap()
        }
        None => b.body(Body::empty()).unwrap(),
    }
}

fn slug(r: &crate::support::Resp) -> String {
    r.json["type"]
        .as_str()
        .unwrap_or("")
        .trim_start_matches("https://airlock.local/problems/")
        .to_owned()
}

async fn live_docs(t: &TestApp) -> usize {
    let r = t
        .call(Method::GET, "/v1/admin/documents", Some(&t.admin), None)
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
    r.json["documents"].as_array().map_or(0, |d| {
        d.iter().filter(|d| d["deleted_at"].is_null()).count()
    })
}

#[tokio::test]
async fn cross_site_writes_are_refused_for_tokens_cookies_and_sign_in() {
    let t = TestApp::new();
    let put = t
        .call(
            Method::PUT,
            "/v1/documents/d1",
            Some(&t.admin),
            Some(
                json!({"title": "Cheques", "text": "Cheques clear in two days.",
                        "acl": {"users": [], "groups": ["g"]}}),
            ),
        )
        .await;
    assert!(put.status.is_success(), "{}", put.text);
    let before = live_docs(&t).await;
    assert_eq!(before, 1);
    let acl = t.state.services().unwrap().acl.clone();
    let session = acl
        .create_session("admin", Duration::from_secs(600))
        .unwrap();
    let cookie = format!("airlock_session={}", session.token);
    let bearer = format!("Bearer {}", t.admin);
    let host = ("host", "airlock.bank.internal");
    let cross: [&[(&str, &str)]; 3] = [
        &[
            host,
            ("sec-fetch-site", "cross-site"),
            ("origin", "https://evil.example"),
        ],
        &[host, ("origin", "https://evil.example")],
        &[host, ("origin", "null")],
    ];
    // No Content-Type (a `fetch` of a typeless Blob), a form's, and JSON.
    let untyped = Some(("", r#"{"source_ids": []}"#));
    let reconcile = Some(("text/plain", r#"{"source_ids": []}"#));
    let json_reconcile = Some(("application/json", r#"{"source_ids": []}"#));
    for site in cross {
        for (cred, extra) in [
            ("bearer", vec![("authorization", bearer.as_str())]),
            (
                "cookie",
                vec![
                    ("cookie", cookie.as_str()),
                    ("x-airlock-csrf", session.csrf.as_str()),
                ],
            ),
        ] {
            let hs: Vec<(&str, &str)> = site.iter().copied().chain(extra).collect();
            for body in [untyped, reconcile, json_reconcile] {
                let r = t
                    .send(post("/v1/reconcile?allow_empty=true", &hs, body))
                    .await;
                assert_eq!(
                    (r.status.as_u16(), slug(&r)),
                    (403, "cross-site".into()),
                    "{cred} {site:?}"
                );
            }
            let r = t
                .send(post("/v1/purge", &hs, Some(("text/plain", "{}"))))
                .await;
            assert_eq!(
                (r.status.as_u16(), slug(&r)),
                (403, "cross-site".into()),
                "{cred}"
            );
        }
        // The public sign-in too (login CSRF), before anything else is looked at.
        let r = t
            .send(post(
                "/v1/auth/login",
                site,
                Some(("text/plain", r#"{"username": "a", "password": "b"}"#)),
            ))
            .await;
        assert_eq!((r.status.as_u16(), slug(&r)), (403, "cross-site".into()));
    }
    assert_eq!(live_docs(&t).await, before, "nothing was tombstoned");

    // Reading across sites is not refused (a page on another site cannot read the answer).
    let r = t
        .send(
            Request::get("/v1/info")
                .header("sec-fetch-site", "cross-site")
                .header(header::AUTHORIZATION, &bearer)
                .body(Body::empty())
                .unwrap(),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text);

    // The page's own origin: a cookie without its CSRF header is still refused; with it, a
    // form's body is 415; JSON with the header is served.
    let same = [
        host,
        ("origin", "https://airlock.bank.internal"),
        ("cookie", cookie.as_str()),
    ];
    let r = t
        .send(post(
            "/v1/reconcile",
            &same,
            Some(("application/json", r#"{"source_ids": ["d1"]}"#)),
        ))
        .await;
    assert_eq!(
        (r.status.as_u16(), slug(&r)),
        (403, "csrf-failed".into()),
        "{}",
        r.text
    );
    let with_csrf: Vec<(&str, &str)> = same
        .iter()
        .copied()
        .chain([("x-airlock-csrf", session.csrf.as_str())])
        .collect();
    let r = t
        .send(post(
            "/v1/reconcile",
            &with_csrf,
            Some(("text/plain", r#"{"source_ids": ["d1"]}"#)),
        ))
        .await;
    assert_eq!(
        (r.status.as_u16(), slug(&r)),
        (415, "unsupported-media-type".into()),
        "{}",
        r.text
    );
    let r = t
        .send(post(
            "/v1/reconcile",
            &with_csrf,
            Some(("application/json", r#"{"source_ids": ["d1"]}"#)),
        ))
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
    // Sec-Fetch-Site: same-origin is the browser's word for it, whatever Host a proxy sent.
    let r = t
        .send(post(
            "/v1/reconcile",
            &[
                ("host", "127.0.0.1:8080"),
                ("origin", "https://airlock.bank.internal"),
                ("sec-fetch-site", "same-origin"),
                ("authorization", bearer.as_str()),
            ],
            Some(("application/json", r#"{"source_ids": ["d1"]}"#)),
        ))
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(live_docs(&t).await, before);
}

#[tokio::test]
async fn json_routes_refuse_bodies_without_a_json_media_type() {
    let t = TestApp::new();
    let bearer = format!("Bearer {}", t.admin);
    let auth = [("authorization", bearer.as_str())];
    for (uri, body) in [
        ("/v1/retrieve", r#"{"query": "x"}"#),
        ("/v1/conversations", "{}"),
        ("/v1/reconcile?allow_empty=true", r#"{"source_ids": []}"#),
        ("/v1/purge", "{}"),
        (
            "/v1/acl/sync",
            "{\"user\": \"mallory\", \"groups\": [\"hr\"]}\n",
        ),
        (
            "/v1/chat/completions",
            r#"{"messages": [{"role": "user", "content": "hi"}]}"#,
        ),
    ] {
        for ct in [
            "",
            "text/plain",
            "application/x-www-form-urlencoded",
            "multipart/form-data",
        ] {
            let r = t.send(post(uri, &auth, Some((ct, body)))).await;
            assert_eq!(r.status, 415, "{uri} {ct:?}: {}", r.text);
            assert_eq!(slug(&r), "unsupported-media-type", "{uri}");
        }
    }
    let r = t
        .send(post("/v1/retrieve", &auth, Some(("", r#"{"query": "x"}"#))))
        .await;
    r.assert_problem(
        415,
        "unsupported-media-type",
        "the request has no Content-Type; this route takes application/json (Content-Type)",
    );
    // A document upload without a media type is refused too (JSON or a typed file only).
    let r = t
        .send(
            Request::put("/v1/documents/d2")
                .header(header::AUTHORIZATION, &bearer)
                .body(Body::from(r#"{"title": "t", "text": "x"}"#))
                .unwrap(),
        )
        .await;
    assert_eq!(
        (r.status.as_u16(), slug(&r)),
        (415, "unsupported-media-type".into()),
        "{}",
        r.text
    );
    // Nothing was applied: no user, no document, no conversation.
    let services = t.state.services().unwrap();
    assert!(services.acl.user("mallory").is_none());
    let r = t
        .call(Method::GET, "/v1/documents/d2", Some(&t.admin), None)
        .await;
    assert_eq!(r.status, 404, "{}", r.text);
    let r = t
        .call(Method::GET, "/v1/conversations", Some(&t.admin), None)
        .await;
    assert_eq!(r.json["data"], json!([]), "{}", r.text);
}
