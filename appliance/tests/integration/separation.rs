//! Issue 42 M3: separation of duties for access. An admin-only principal could read any
//! document by giving itself a group, or by minting a user with the group and a token; an
//! operator by granting itself a document. Now a change that lets the caller read more needs a
//! second person's one-time approval (`POST /v1/acl/approvals`, `X-Airlock-Approval`) or
//! break-glass (`X-Airlock-Break-Glass`: audited first, counted, alerted); without either it is
//! `403 approval-required` and changes nothing.

use airlock_acl::{AuditQuery, Role};
use axum::body::Body;
use axum::http::{Method, Request, header};
use serde_json::{Value, json};

use crate::support::{Resp, TestApp};

async fn with_headers(
    t: &TestApp,
    method: Method,
    uri: &str,
    token: &str,
    headers: &[(&str, &str)],
    body: Option<Value>,
) -> Resp {
    let mut b = Request::builder()
        .method(method)
        .uri(uri)
        .header(header::AUTHORIZATION, format!("Bearer {token}"));
    for (k, v) in headers {
        b = b.header(*k, *v);
    }
    let req = match body {
        Some(v) => b
            .header(header::CONTENT_TYPE, "application/json")
            .body(Body::from(v.to_string()))
            .unwrap(),
        None => b.body(Body::empty()).unwrap(),
    };
    t.send(req).await
}

fn slug(r: &Resp) -> &str {
    r.json["type"]
        .as_str()
        .unwrap_or("")
        .trim_start_matches("https://airlock.local/problems/")
}

/// Whether `token` retrieves `doc`.
async fn reads(t: &TestApp, token: &str, doc: &str) -> bool {
    let r = t
        .call(
            Method::POST,
            "/v1/retrieve",
            Some(token),
            Some(json!({"query": "salaries of the payroll", "top_k": 5})),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
    r.text.contains(doc)
}

fn audit(t: &TestApp) -> Vec<airlock_acl::AuditEntry> {
    t.state
        .services()
        .unwrap()
        .acl
        .audit_query(&AuditQuery {
            limit: Some(100_000),
            ..AuditQuery::default()
        })
        .unwrap()
}

async fn put_salary(t: &TestApp) {
    let r = t
        .call(
            Method::PUT,
            "/v1/documents/salary",
            Some(&t.admin),
            Some(json!({"title": "Payroll", "text": "The salaries of the payroll are paid on the 25th.",
                        "acl": {"users": [], "groups": ["hr"]}})),
        )
        .await;
    assert!(r.status.is_success(), "{}", r.text);
}

#[tokio::test]
async fn an_admin_only_principal_cannot_read_through_its_own_grants_or_minted_tokens() {
    let t = TestApp::new();
    put_salary(&t).await;
    let ann = t.add_user("ann", &[], vec![Role::Admin]);
    assert!(!reads(&t, &ann, "salary").await);
    let entries_before = audit(&t).len();

    // Giving itself the group, or the operator role (which sets grants): refused.
    for body in [
        json!({"groups": ["hr"]}),
        json!({"groups": [], "roles": ["admin", "operator"]}),
    ] {
        let r = t
            .call(Method::PUT, "/v1/acl/users/ann", Some(&ann), Some(body))
            .await;
        assert_eq!(
            (r.status.as_u16(), slug(&r)),
            (403, "approval-required"),
            "{}",
            r.text
        );
    }
    // A user of its own making with the group, then a token for it: the token is refused.
    let r = t
        .call(
            Method::PUT,
            "/v1/acl/users/mole",
            Some(&ann),
            Some(json!({"groups": ["hr"]})),
        )
        .await;
    assert_eq!(
        r.status, 201,
        "a user without a token reads nothing yet: {}",
        r.text
    );
    let r = t
        .call(Method::POST, "/v1/acl/users/mole/token", Some(&ann), None)
        .await;
    assert_eq!(
        (r.status.as_u16(), slug(&r)),
        (403, "approval-required"),
        "{}",
        r.text
    );
    // The other order: token first (no access yet), then the group: the group is refused.
    let r = t
        .call(
            Method::PUT,
            "/v1/acl/users/mole2",
            Some(&ann),
            Some(json!({"groups": []})),
        )
        .await;
    assert_eq!(r.status, 201, "{}", r.text);
    let r = t
        .call(Method::POST, "/v1/acl/users/mole2/token", Some(&ann), None)
        .await;
    assert_eq!(r.status, 201, "{}", r.text);
    let mole2 = r.json["token"].as_str().unwrap().to_owned();
    let r = t
        .call(
            Method::PUT,
            "/v1/acl/users/mole2",
            Some(&ann),
            Some(json!({"groups": ["hr"]})),
        )
        .await;
    assert_eq!(
        (r.status.as_u16(), slug(&r)),
        (403, "approval-required"),
        "{}",
        r.text
    );
    // Nothing let anyone ann controls read the salaries.
    assert!(!reads(&t, &ann, "salary").await);
    assert!(!reads(&t, &mole2, "salary").await);
    let acl = t.state.services().unwrap().acl.clone();
    assert_eq!(acl.user("ann").unwrap().groups, Vec::<String>::new());
    assert_eq!(acl.user("ann").unwrap().roles, [Role::Admin]);
    assert!(!acl.user("mole").unwrap().has_token);
    assert_eq!(acl.user("mole2").unwrap().groups, Vec::<String>::new());
    // Only the three allowed changes were recorded.
    assert_eq!(audit(&t).len(), entries_before + 3);

    // Ann cannot approve her own change.
    let r = t
        .call(
            Method::POST,
            "/v1/acl/approvals",
            Some(&ann),
            Some(json!({"action": "token_issue", "user_id": "mole"})),
        )
        .await;
    assert_eq!(r.status, 201, "{}", r.text);
    let own = r.json["approval"].as_str().unwrap().to_owned();
    let r = with_headers(
        &t,
        Method::POST,
        "/v1/acl/users/mole/token",
        &ann,
        &[("x-airlock-approval", &own)],
        None,
    )
    .await;
    assert_eq!(
        (r.status.as_u16(), slug(&r)),
        (403, "approval-required"),
        "{}",
        r.text
    );
    assert!(r.text.contains("issued by the caller itself"), "{}", r.text);

    // A second person's approval of exactly this change: applied once.
    let approval = t
        .approval(json!({"action": "token_issue", "user_id": "mole"}))
        .await;
    let wrong = with_headers(
        &t,
        Method::POST,
        "/v1/acl/users/mole2/token",
        &ann,
        &[("x-airlock-approval", &approval)],
        None,
    )
    .await;
    assert_eq!(wrong.status, 201, "mole2 has no access: no approval needed");
    let mole2 = wrong.json["token"].as_str().unwrap().to_owned();
    let r = with_headers(
        &t,
        Method::POST,
        "/v1/acl/users/mole/token",
        &ann,
        &[("x-airlock-approval", &approval)],
        None,
    )
    .await;
    assert_eq!(r.status, 201, "{}", r.text);
    let mole = r.json["token"].as_str().unwrap().to_owned();
    assert!(reads(&t, &mole, "salary").await);
    let again = with_headers(
        &t,
        Method::POST,
        "/v1/acl/users/mole/token",
        &ann,
        &[("x-airlock-approval", &approval)],
        None,
    )
    .await;
    assert_eq!(
        (again.status.as_u16(), slug(&again)),
        (403, "approval-required")
    );
    // An approval of another change does not fit.
    let approval = t
        .approval(json!({"action": "user_put", "user_id": "mole2", "groups": ["hr"]}))
        .await;
    let r = with_headers(
        &t,
        Method::PUT,
        "/v1/acl/users/mole2",
        &ann,
        &[("x-airlock-approval", &approval)],
        Some(json!({"groups": ["hr", "finance"]})),
    )
    .await;
    assert_eq!(
        (r.status.as_u16(), slug(&r)),
        (403, "approval-required"),
        "{}",
        r.text
    );
    let e = audit(&t);
    let used = e
        .iter()
        .find(|e| e.detail["action"] == "approved_change")
        .expect("the approved change is audited");
    assert_eq!(used.actor.as_deref(), Some("ann"));
    assert_eq!(used.detail["approved_by"], "approver");
    assert_eq!(
        used.detail["change"],
        json!({"action": "token_issue", "user_id": "mole"})
    );
    assert!(
        e.iter()
            .any(|e| e.detail["action"] == "approval_issue"
                && e.actor.as_deref() == Some("approver")),
    );
    assert!(
        !e.iter()
            .any(|e| serde_json::to_string(e).unwrap().contains("apv_")),
        "no approval secret in the audit log"
    );

    // Break-glass: alone, with a reason, audited first, counted for the alert.
    let r = with_headers(
        &t,
        Method::PUT,
        "/v1/acl/users/mole2",
        &ann,
        &[("x-airlock-break-glass", " ")],
        Some(json!({"groups": ["hr"]})),
    )
    .await;
    assert_eq!(r.status, 400, "a reason is required: {}", r.text);
    let r = with_headers(
        &t,
        Method::PUT,
        "/v1/acl/users/mole2",
        &ann,
        &[("x-airlock-break-glass", "INC-4711 payroll run blocked")],
        Some(json!({"groups": ["hr"]})),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert!(reads(&t, &mole2, "salary").await);
    let glass = audit(&t)
        .into_iter()
        .find(|e| e.detail["action"] == "break_glass")
        .expect("break-glass is audited");
    assert_eq!(glass.actor.as_deref(), Some("ann"));
    assert_eq!(glass.detail["reason"], "INC-4711 payroll run blocked");
    let m = t.call(Method::GET, "/metrics", Some(&t.admin), None).await;
    assert!(m.text.contains("airlock_break_glass_total 1"), "{}", m.text);
}

#[tokio::test]
async fn an_operator_cannot_grant_itself_a_document_without_a_second_operator() {
    let t = TestApp::new();
    put_salary(&t).await;
    let op = t.add_user("op", &["ops-team"], vec![Role::Operator]);
    let acl = t.state.services().unwrap().acl.clone();
    let self_grants: Vec<(Method, &str, Value)> = vec![
        (
            Method::PUT,
            "/v1/acl/documents/salary",
            json!({"users": ["op"], "groups": ["hr"]}),
        ),
        (
            Method::PUT,
            "/v1/acl/documents/salary",
            json!({"users": [], "groups": ["hr", "ops-team"]}),
        ),
        (
            Method::PUT,
            "/v1/documents/salary",
            json!({"title": "Payroll", "text": "The salaries of the payroll are paid on the 25th.",
                   "acl": {"users": ["op"], "groups": ["hr"]}}),
        ),
    ];
    for (m, uri, body) in &self_grants {
        let r = t.call(m.clone(), uri, Some(&op), Some(body.clone())).await;
        assert_eq!(
            (r.status.as_u16(), slug(&r)),
            (403, "approval-required"),
            "{uri}: {}",
            r.text
        );
    }
    let r = t
        .send(
            Request::post("/v1/acl/sync")
                .header(header::AUTHORIZATION, format!("Bearer {op}"))
                .header(header::CONTENT_TYPE, "application/x-ndjson")
                .body(Body::from(
                    "{\"user\": \"eve\", \"groups\": [\"hr\"]}\n\
                     {\"doc\": \"salary\", \"users\": [\"op\"], \"groups\": [\"hr\"]}\n",
                ))
                .unwrap(),
        )
        .await;
    assert_eq!(
        (r.status.as_u16(), slug(&r)),
        (403, "approval-required"),
        "{}",
        r.text
    );
    assert!(!reads(&t, &op, "salary").await);
    assert_eq!(
        acl.document_grants("salary").unwrap().unwrap().users,
        Vec::<String>::new()
    );
    assert!(acl.user("eve").is_none());
    // Grants to others are an operator's daily work: no approval.
    let r = t
        .call(
            Method::PUT,
            "/v1/acl/documents/salary",
            Some(&op),
            Some(json!({"users": ["carol"], "groups": ["hr"]})),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
    // An admin may not approve a grant (the operator's duty), a second operator may.
    let change = json!({"action": "document_grants", "doc_id": "salary",
                        "users": ["op", "carol"], "groups": ["hr"]});
    let adm = t.add_user("adm", &[], vec![Role::Admin]);
    let r = t
        .call(
            Method::POST,
            "/v1/acl/approvals",
            Some(&adm),
            Some(change.clone()),
        )
        .await;
    assert_eq!(r.status, 403, "{}", r.text);
    let approval = t.approval(change).await;
    let r = with_headers(
        &t,
        Method::PUT,
        "/v1/acl/documents/salary",
        &op,
        &[("x-airlock-approval", &approval)],
        Some(json!({"users": ["carol", "op"], "groups": ["hr"]})),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert!(reads(&t, &op, "salary").await);
}
