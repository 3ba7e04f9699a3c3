//! The operator console's API (`GET /v1/admin/...`, issue 26 point 4): who may read each page,
//! paging limits, bad parameters as problem details, and no content (chunk text, questions,
//! answers, eval cases) in any answer. One app for the whole walk: no generation, no model
//! call beyond the embedder of three small documents.

use airlock::config::Config;
use airlock_acl::Role;
use airlock_evidence::feedback::{CompletionRecord, Rating};
use axum::http::Method;
use serde_json::{Value, json};

use crate::support::{TestApp, test_config};

/// Words of the documents' text: none may appear in a console answer.
const SECRET_WORDS: [&str; 3] = ["Quetzalcoatl", "Marzipan", "Obsidian"];

async fn get(app: &TestApp, path: &str, token: &str) -> crate::support::Resp {
    app.call(Method::GET, path, Some(token), None).await
}

fn put_doc(title: &str, word: &str, groups: &[&str]) -> Value {
    json!({"title": title,
           "text": format!("{word} ledger. The {word} reconciliation runs every Tuesday."),
           "acl": {"users": [], "groups": groups}})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_pages_answer_by_role_page_with_limits_and_never_show_content() {
    let reports = tempfile::tempdir().unwrap();
    let run = reports.path().join("bank-set-2026-12-01");
    std::fs::create_dir_all(&run).unwrap();
    // A report whose cases carry a query, an answer and document ids: only aggregates may
    // leave the file.
    std::fs::write(
        run.join("report.json"),
        json!({"set": "bank-set", "bundle_version": "1.0.0-test", "rung": null,
               "overall": {"cases": 2, "leaking_cases": 0, "failed_cases": 0,
                           "metrics": {"recall_10": {"mean": 0.5, "lo": 0.1, "hi": 0.9}}},
               "per_kind": {"injection": {"cases": 2, "leaking_cases": 0, "metrics": {}}},
               "per_phase": {}, "latency_ms": {},
               "cases": [{"id": "case-SECRET-ID", "query": "What is the Quetzalcoatl ledger?",
                          "answer": "Marzipan answer text"}]})
        .to_string(),
    )
    .unwrap();
    std::fs::create_dir_all(reports.path().join(".hidden")).unwrap();
    // A directory nobody answers for: its sync fails (503) and is a failed run.
    let pki = crate::tls::Pki::new();
    let ca = pki.ca("dir-ca");
    let pw = reports.path().join(".bind-pw");
    std::fs::write(&pw, "pw\n").unwrap();
    std::fs::set_permissions(&pw, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    let closed = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    #[derive(serde::Deserialize)]
    struct T {
        ldap: airlock_identity::ldap::LdapConfig,
    }
    let ldap = toml::from_str::<T>(&format!(
        "[ldap]\nurl = \"ldaps://127.0.0.1:{closed}\"\nca_file = \"{ca}\"\n\
         bind_dn = \"cn=svc\"\nbind_password_file = \"{pw}\"\nuser_base = \"ou=p\"\n\
         user_filter = \"(uid={{username}})\"\nuser_id_attr = \"uid\"\ngroup_base = \"ou=g\"\n\
         group_filter = \"(member={{user_dn}})\"\ngroup_name_attr = \"cn\"\n",
        ca = ca.cert.display(),
        pw = pw.display(),
    ))
    .unwrap()
    .ldap;
    let app = TestApp::with_config(Config {
        eval_reports_dir: Some(reports.path().to_owned()),
        ldap: Some(ldap),
        ..test_config()
    });
    // First (an IAM snapshot replaces every non-local user and grant): one IAM snapshot sync
    // applied, one refused (not a run: a refused request changes nothing), one directory sync
    // failed (a failed run).
    let sync = |body: &'static str| {
        let req = axum::http::Request::builder()
            .method(Method::POST)
            .uri("/v1/acl/sync")
            .header("authorization", format!("Bearer {}", app.admin))
            .header("content-type", "application/x-ndjson")
            .body(axum::body::Body::from(body))
            .unwrap();
        app.send(req)
    };
    let ok = sync("{\"user\": \"u-synced\", \"groups\": [\"g-ops\"]}\n").await;
    assert_eq!(ok.status, 200, "{}", ok.text);
    let bad = sync("{\"user\": 7}\n").await;
    assert_eq!(bad.status, 400, "{}", bad.text);
    let down = app
        .call(Method::POST, "/v1/acl/sync/ldap", Some(&app.admin), None)
        .await;
    assert_eq!(down.status, 503, "{}", down.text);
    let user = app.user("u-plain", &["g-ops"]);
    let ops = app.add_user("u-ops", &["g-ops"], vec![Role::Operator]);
    let adm = app.add_user("u-adm", &[], vec![Role::Admin]);
    let aud = app.add_user("u-aud", &[], vec![Role::Auditor]);
    let prom = app.add_user("u-prom", &[], vec![Role::Metrics]);
    for (id, title, word, groups) in [
        ("doc-a1", "Alpha ledger", SECRET_WORDS[0], &["g-ops"][..]),
        (
            "doc-a2",
            "Alpha policy",
            SECRET_WORDS[1],
            &["g-ops", "g-risk"][..],
        ),
        ("doc-b1", "Beta memo", SECRET_WORDS[2], &["g-risk"][..]),
    ] {
        let r = app
            .call(
                Method::PUT,
                &format!("/v1/documents/{id}"),
                Some(&app.admin),
                Some(put_doc(title, word, groups)),
            )
            .await;
        assert!(r.status.is_success(), "{}", r.text);
    }
    // A second version of doc-a1, then doc-b1 deleted and purged, doc-a2 deleted.
    let r = app
        .call(
            Method::PUT,
            "/v1/documents/doc-a1",
            Some(&app.admin),
            Some(put_doc("Alpha ledger v2", SECRET_WORDS[0], &["g-ops"])),
        )
        .await;
    assert!(r.status.is_success(), "{}", r.text);
    for id in ["doc-b1", "doc-a2"] {
        let r = app
            .call(
                Method::DELETE,
                &format!("/v1/documents/{id}"),
                Some(&app.admin),
                None,
            )
            .await;
        assert_eq!(r.status, 200, "{}", r.text);
        if id == "doc-b1" {
            let r = app
                .call(Method::POST, "/v1/purge", Some(&app.admin), Some(json!({})))
                .await;
            assert_eq!(r.status, 200, "{}", r.text);
        }
    }
    // Feedback on a served completion, with a comment.
    let store = app.state.services().unwrap().feedback.clone().unwrap();
    store
        .record_completion(&CompletionRecord {
            request_id: "chatcmpl-1",
            user_id: "u-plain",
            model: "airlock-small",
            rung: 0,
            bundle_version: "1.0.0-test",
        })
        .unwrap();
    store
        .put_feedback(
            "u-plain",
            "chatcmpl-1",
            Rating::Down,
            Some("missed the cut-off"),
        )
        .unwrap();

    // Who may read which page: o = 200, f = 403 (u = 401 without a token).
    // Columns: user, operator, admin, auditor (a metrics token is refused everywhere).
    let pages: [(&str, &str); 10] = [
        ("/v1/admin/documents", "foff"),
        ("/v1/admin/documents/doc-a1", "foff"),
        ("/v1/admin/users", "fooo"),
        ("/v1/admin/groups", "fooo"),
        ("/v1/admin/syncs", "fooo"),
        ("/v1/admin/capacity", "fooo"),
        ("/v1/admin/feedback", "foff"),
        ("/v1/admin/evals", "fofo"),
        ("/v1/admin/evals/bank-set-2026-12-01", "fofo"),
        ("/v1/admin/audit", "ffoo"),
    ];
    let who = [&user, &ops, &adm, &aud, &prom];
    let mut served = Vec::new();
    for (path, expect) in pages {
        let anon = app.call(Method::GET, path, None, None).await;
        assert_eq!(anon.status, 401, "{path} anonymous: {}", anon.text);
        for (token, want) in who.iter().zip(expect.chars().chain(['f'])) {
            let r = get(&app, path, token).await;
            let code = r.status.as_u16();
            match want {
                'o' => {
                    assert_eq!(code, 200, "{path}: {}", r.text);
                    served.push((path, r.text));
                }
                _ => {
                    assert_eq!(code, 403, "{path}: {}", r.text);
                    assert_eq!(r.json["type"], "https://airlock.local/problems/forbidden");
                }
            }
        }
    }
    // No content anywhere: no document text, no question, answer or case id of the report.
    for (path, text) in &served {
        for w in SECRET_WORDS
            .iter()
            .chain(&["case-SECRET-ID", "Marzipan answer", "reconciliation"])
        {
            assert!(!text.contains(w), "{path} shows {w:?}: {text}");
        }
    }

    // Documents: prefix search, status, counts, versions, purged.
    let r = get(&app, "/v1/admin/documents?q=alpha&status=all", &ops).await;
    let docs = r.json["documents"].as_array().unwrap();
    assert_eq!(docs.len(), 2, "{}", r.text);
    assert_eq!(docs[0]["doc_id"], "doc-a1");
    assert_eq!(docs[0]["status"], "live");
    assert!(docs[0]["chunks"].as_u64().unwrap() >= 1);
    assert_eq!(
        docs[0]["anchored_chunks"], 0,
        "text documents have no anchors"
    );
    assert_eq!(docs[1]["status"], "deleted");
    let r = get(&app, "/v1/admin/documents?status=live", &ops).await;
    assert_eq!(
        r.json["documents"].as_array().unwrap().len(),
        1,
        "{}",
        r.text
    );
    let r = get(&app, "/v1/admin/documents/doc-a1", &ops).await;
    assert_eq!(
        r.json["versions"].as_array().unwrap().len(),
        2,
        "{}",
        r.text
    );
    assert_eq!(
        r.json["readable_by_users"], 3,
        "u-plain, u-ops, u-synced: {}",
        r.text
    );
    let r = get(&app, "/v1/admin/documents/doc-b1", &ops).await;
    assert_eq!(r.json["status"], "purged", "{}", r.text);
    let r = get(&app, "/v1/admin/documents/never-seen", &ops).await;
    assert_eq!(r.status, 404, "{}", r.text);

    // Users and groups with their effective (live) access.
    let r = get(&app, "/v1/admin/users?q=u-plain", &adm).await;
    assert_eq!(r.json["users"][0]["readable_documents"], 1, "{}", r.text);
    let r = get(&app, "/v1/admin/groups", &aud).await;
    let groups: Vec<&Value> = r.json["groups"].as_array().unwrap().iter().collect();
    let g_ops = groups.iter().find(|g| g["group_id"] == "g-ops").unwrap();
    assert_eq!(g_ops["readable_documents"], 1, "{}", r.text);
    assert!(g_ops["members"].as_u64().unwrap() >= 3, "{}", r.text);

    // Sync runs: the applied one with counts, the refused one with its error; freshness.
    let r = get(&app, "/v1/admin/syncs", &aud).await;
    let runs = r.json["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 2, "{}", r.text);
    assert_eq!(runs[0]["outcome"], "failed");
    assert_eq!(runs[0]["source"], "directory");
    assert!(
        runs[0]["error"].as_str().unwrap().contains("unavailable"),
        "{}",
        r.text
    );
    assert_eq!(runs[1]["outcome"], "applied");
    assert_eq!(runs[1]["counts"]["users_added"], 1);
    assert!(r.json["freshness"]["age_seconds"].as_u64().unwrap() < 600);

    // Capacity: rung and counters.
    let r = get(&app, "/v1/admin/capacity", &ops).await;
    assert_eq!(r.json["rung"], 0, "{}", r.text);
    assert!(r.json["recent_sheds"].is_array());

    // Feedback: the rating and comment, never question or answer.
    let r = get(&app, "/v1/admin/feedback?rating=down", &ops).await;
    assert_eq!(
        r.json["feedback"][0]["comment"], "missed the cut-off",
        "{}",
        r.text
    );
    assert_eq!(r.json["totals"]["down"], 1);
    let r = get(&app, "/v1/admin/feedback?rating=up", &ops).await;
    assert_eq!(
        r.json["feedback"].as_array().unwrap().len(),
        0,
        "{}",
        r.text
    );

    // Eval reports: listed (the dot directory is not), opened without cases.
    let r = get(&app, "/v1/admin/evals", &aud).await;
    let list = r.json["reports"].as_array().unwrap();
    assert_eq!(list.len(), 1, "{}", r.text);
    assert_eq!(list[0]["overall"]["cases"], 2);
    let r = get(&app, "/v1/admin/evals/bank-set-2026-12-01", &ops).await;
    assert!(r.json["per_kind"]["injection"].is_object(), "{}", r.text);
    assert!(r.json.get("cases").is_none());
    let r = get(&app, "/v1/admin/evals/nope", &ops).await;
    assert_eq!(r.status, 404, "{}", r.text);

    // Audit search by document and user, newest first, paged with a cursor.
    let r = get(&app, "/v1/admin/audit?doc_id=doc-a1&limit=2", &aud).await;
    let page1 = r.json["entries"].as_array().unwrap().clone();
    assert_eq!(page1.len(), 2, "{}", r.text);
    assert!(page1[0]["seq"].as_i64() > page1[1]["seq"].as_i64());
    let next = r.json["next_before"].as_i64().expect("a second page");
    let r = get(
        &app,
        &format!("/v1/admin/audit?doc_id=doc-a1&limit=2&before={next}"),
        &aud,
    )
    .await;
    let page2 = r.json["entries"].as_array().unwrap();
    assert!(!page2.is_empty(), "{}", r.text);
    assert!(page2.iter().all(|e| e["seq"].as_i64().unwrap() < next));
    let r = get(&app, "/v1/admin/audit?user=u-nobody", &adm).await;
    assert_eq!(r.json["entries"].as_array().unwrap().len(), 0, "{}", r.text);
    let r = get(&app, "/v1/admin/audit?since=2999-01-01T00:00:00Z", &adm).await;
    assert_eq!(r.json["entries"].as_array().unwrap().len(), 0, "{}", r.text);

    // Paging: limit 1 pages through every user exactly once.
    let mut seen = Vec::new();
    let mut after = String::new();
    loop {
        let path = format!("/v1/admin/users?limit=1{after}");
        let r = get(&app, &path, &adm).await;
        let users = r.json["users"].as_array().unwrap();
        assert!(users.len() <= 1, "{}", r.text);
        seen.extend(
            users
                .iter()
                .map(|u| u["user_id"].as_str().unwrap().to_owned()),
        );
        match r.json["next_after"].as_str() {
            Some(n) => after = format!("&after={n}"),
            None => break,
        }
    }
    assert_eq!(seen.len() as u64, r_total(&app, &adm).await);
    let mut sorted = seen.clone();
    sorted.sort();
    sorted.dedup();
    assert_eq!(sorted, seen, "each user once, in order");

    // Bad parameters: problem details, for every page.
    let audit_before = app
        .state
        .services()
        .unwrap()
        .acl
        .audit_query(&airlock_acl::AuditQuery::default())
        .unwrap()
        .len();
    for (path, token) in [
        ("/v1/admin/documents?limit=0", &ops),
        ("/v1/admin/documents?limit=201", &ops),
        ("/v1/admin/documents?status=gone", &ops),
        ("/v1/admin/documents?sort=title", &ops),
        ("/v1/admin/users?limit=many", &adm),
        ("/v1/admin/groups?limit=1000", &adm),
        ("/v1/admin/syncs?before=0", &adm),
        ("/v1/admin/capacity?verbose=1", &adm),
        ("/v1/admin/feedback?rating=meh", &ops),
        ("/v1/admin/feedback?offset=100001", &ops),
        ("/v1/admin/evals?limit=0", &ops),
        ("/v1/admin/evals/..%2Fetc", &ops),
        ("/v1/admin/audit?since=yesterday", &aud),
        ("/v1/admin/audit?kind=everything", &aud),
    ] {
        let r = get(&app, path, token).await;
        assert_eq!(r.status, 400, "{path}: {}", r.text);
        assert_eq!(
            r.json["type"], "https://airlock.local/problems/invalid-request",
            "{path}: {}",
            r.text
        );
        assert!(
            r.headers["content-type"]
                .to_str()
                .unwrap()
                .starts_with("application/problem+json")
        );
    }
    let long = "x".repeat(300);
    let r = get(&app, &format!("/v1/admin/documents?q={long}"), &ops).await;
    assert_eq!(r.status, 400, "{}", r.text);
    let audit_after = app
        .state
        .services()
        .unwrap()
        .acl
        .audit_query(&airlock_acl::AuditQuery::default())
        .unwrap()
        .len();
    assert_eq!(
        audit_before, audit_after,
        "reading the console wrote nothing"
    );
}

async fn r_total(app: &TestApp, token: &str) -> u64 {
    get(app, "/v1/admin/users?limit=200", token).await.json["total"]
        .as_u64()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_page_is_served_with_the_chat_pages_csp() {
    let app = TestApp::new();
    for path in ["/admin", "/admin.css", "/js/admin.js"] {
        let r = app.call(Method::GET, path, None, None).await;
        assert_eq!(r.status, 200, "{path}");
    }
    let r = app.call(Method::GET, "/admin", None, None).await;
    assert_eq!(
        r.headers["content-security-policy"].to_str().unwrap(),
        airlock::routes::ui::CSP
    );
    assert!(r.text.contains("js/admin.js"));
    // No inline script or style, no external URL.
    assert!(!r.text.contains("<script>") && !r.text.contains("style="));
    assert!(!r.text.contains("http://") && !r.text.contains("https://"));
}
