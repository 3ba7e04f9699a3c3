//! End to end on a real socket with the real embedder and real stores: ingest a bank-dev subset
//! through the API, sync `iam_v1`, check that every result respects the ACL (computed here,
//! independently, from the snapshot), delete a document and check it never comes back, sync
//! `iam_v2` and check revoked access is gone on the next request.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::path::Path;

use serde_json::{Value, json};

use crate::support::{TestApp, shared_dir};

/// An IAM snapshot as plain sets: who is in which group, who may read which document.
struct Iam {
    groups: HashMap<String, HashSet<String>>,
    grants: HashMap<String, (HashSet<String>, HashSet<String>)>,
    text: String,
}

impl Iam {
    fn load(path: &Path) -> Self {
        let text = std::fs::read_to_string(path).unwrap();
        let mut groups = HashMap::new();
        let mut grants = HashMap::new();
        for line in text.lines().filter(|l| !l.trim().is_empty()) {
            let v: Value = serde_json::from_str(line).unwrap();
            let set = |k: &str| -> HashSet<String> {
                v[k].as_array()
                    .unwrap()
                    .iter()
                    .map(|x| x.as_str().unwrap().to_string())
                    .collect()
            };
            if let Some(u) = v["user"].as_str() {
                groups.insert(u.to_string(), set("groups"));
            } else {
                grants.insert(
                    v["doc"].as_str().unwrap().to_string(),
                    (set("users"), set("groups")),
                );
            }
        }
        Iam {
            groups,
            grants,
            text,
        }
    }

    fn can_read(&self, user: &str, doc: &str) -> bool {
        let Some(user_groups) = self.groups.get(user) else {
            return false;
        };
        self.grants
            .get(doc)
            .is_some_and(|(users, groups)| users.contains(user) || !groups.is_disjoint(user_groups))
    }
}

/// A minimal blocking HTTP client over the real socket.
struct Http {
    base: String,
    agent: ureq::Agent,
}

impl Http {
    fn new(base: &str) -> Self {
        let agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .build()
            .new_agent();
        Http {
            base: base.to_string(),
            agent,
        }
    }

    fn send(
        &self,
        method: &str,
        path: &str,
        token: &str,
        body: Option<(&str, String)>,
    ) -> (u16, Value) {
        let url = format!("{}{path}", self.base);
        let auth = format!("Bearer {token}");
        let resp = match (method, body) {
            ("GET", _) => self.agent.get(&url).header("Authorization", &auth).call(),
            ("DELETE", _) => self
                .agent
                .delete(&url)
                .header("Authorization", &auth)
                .call(),
            ("POST", None) => self
                .agent
                .post(&url)
                .header("Authorization", &auth)
                .send_empty(),
            ("POST", Some((ct, b))) => self
                .agent
                .post(&url)
                .header("Authorization", &auth)
                .header("Content-Type", ct)
                .send(b),
            ("PUT", Some((ct, b))) => self
                .agent
                .put(&url)
                .header("Authorization", &auth)
                .header("Content-Type", ct)
                .send(b),
            other => panic!("unsupported {other:?}"),
        }
        .unwrap();
        let status = resp.status().as_u16();
        let text = resp.into_body().read_to_string().unwrap();
        (status, serde_json::from_str(&text).unwrap_or(Value::Null))
    }

    /// `POST path` without a body, with `X-Airlock-Approval: approval`.
    fn post_approved(&self, path: &str, token: &str, approval: &str) -> (u16, Value) {
        let resp = self
            .agent
            .post(&format!("{}{path}", self.base))
            .header("Authorization", &format!("Bearer {token}"))
            .header("X-Airlock-Approval", approval)
            .send_empty()
            .unwrap();
        let status = resp.status().as_u16();
        let text = resp.into_body().read_to_string().unwrap();
        (status, serde_json::from_str(&text).unwrap_or(Value::Null))
    }

    fn json(&self, method: &str, path: &str, token: &str, body: Value) -> (u16, Value) {
        self.send(
            method,
            path,
            token,
            Some(("application/json", body.to_string())),
        )
    }
}

struct Case {
    user: String,
    query: String,
    relevant: Vec<String>,
    forbidden_docs: Vec<String>,
    forbidden_strings: Vec<String>,
}

fn cases(dir: &Path, kind: &str, n: usize) -> Vec<Case> {
    std::fs::read_to_string(dir.join("golden.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .filter(|c| c["kind"] == kind)
        .take(n)
        .map(|c| {
            let list = |k: &str| -> Vec<String> {
                c[k].as_array()
                    .unwrap()
                    .iter()
                    .map(|x| x.as_str().unwrap().to_string())
                    .collect()
            };
            Case {
                user: c["user"].as_str().unwrap().to_string(),
                query: c["query"].as_str().unwrap().to_string(),
                relevant: list("relevant_doc_ids"),
                forbidden_docs: list("forbidden_doc_ids"),
                forbidden_strings: list("forbidden_strings"),
            }
        })
        .collect()
}

/// Retrieves for `user` and checks every result against the independent ACL oracle and the
/// deleted set; returns the result doc ids and the raw text.
fn retrieve_checked(
    http: &Http,
    tokens: &HashMap<String, String>,
    iam: &Iam,
    deleted: &HashSet<String>,
    user: &str,
    query: &str,
) -> (Vec<String>, String) {
    let (status, body) = http.json(
        "POST",
        "/v1/retrieve",
        &tokens[user],
        json!({"query": query, "top_k": 10}),
    );
    assert_eq!(status, 200, "{body}");
    let docs: Vec<String> = body["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["doc_id"].as_str().unwrap().to_string())
        .collect();
    for d in &docs {
        assert!(iam.can_read(user, d), "ACL leak: {user} got {d}");
        assert!(
            !deleted.contains(d),
            "deleted document {d} returned to {user}"
        );
    }
    (docs, body.to_string())
}

/// Asks the generator as `user` and checks citations and answer against the oracle and the
/// case's forbidden material.
fn chat_checked(
    http: &Http,
    tokens: &HashMap<String, String>,
    iam: &Iam,
    deleted: &HashSet<String>,
    c: &Case,
) {
    let (status, body) = http.json(
        "POST",
        "/v1/chat/completions",
        &tokens[&c.user],
        json!({"messages": [{"role": "user", "content": c.query}], "max_tokens": 24}),
    );
    assert_eq!(status, 200, "{body}");
    for cite in body["airlock"]["citations"].as_array().unwrap() {
        let d = cite["doc_id"].as_str().unwrap();
        assert!(
            iam.can_read(&c.user, d),
            "ACL leak in citations: {} got {d}",
            c.user
        );
        assert!(!deleted.contains(d), "deleted {d} cited");
        assert!(
            !c.forbidden_docs.iter().any(|f| f == d),
            "forbidden {d} cited"
        );
    }
    let text = body.to_string();
    for s in &c.forbidden_strings {
        assert!(
            !text.contains(s.as_str()),
            "{} saw forbidden {s} in the answer",
            c.user
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bank_dev_acl_delete_and_resync_over_a_real_socket() {
    let data = shared_dir().join("datasets/bank-dev");
    let v1 = Iam::load(&data.join("iam_v1.jsonl"));
    let v2 = Iam::load(&data.join("iam_v2.jsonl"));
    let answerable = cases(&data, "answerable", 12);
    let denied = cases(&data, "acl_denied", 12);
    let revoked = cases(&data, "acl_revoked", 6);
    let deleted_cases = cases(&data, "deleted", 4);

    // The subset: every document the chosen cases name, plus the first 40 of the corpus.
    let mut wanted: BTreeSet<String> = BTreeSet::new();
    for c in answerable
        .iter()
        .chain(&denied)
        .chain(&revoked)
        .chain(&deleted_cases)
    {
        wanted.extend(c.relevant.iter().cloned());
        wanted.extend(c.forbidden_docs.iter().cloned());
    }
    let corpus: Vec<Value> = std::fs::read_to_string(data.join("corpus.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    wanted.extend(
        corpus
            .iter()
            .take(40)
            .map(|d| d["doc_id"].as_str().unwrap().to_string()),
    );
    let docs: Vec<Value> = corpus
        .into_iter()
        .filter(|d| wanted.contains(d["doc_id"].as_str().unwrap()))
        .collect();

    let t = TestApp::new();
    let served = t.serve().await;
    let admin = t.admin.clone();
    // A second admin approves the tokens of users with groups (four eyes).
    let approver = t
        .state
        .services()
        .unwrap()
        .acl
        .add_user(
            "test",
            "approver",
            &airlock_acl::NewUser {
                groups: vec![],
                roles: vec![airlock_acl::Role::Admin],
                local: true,
            },
        )
        .unwrap();
    let base = served.base.clone();
    let users: BTreeSet<String> = answerable
        .iter()
        .chain(&denied)
        .chain(&revoked)
        .chain(&deleted_cases)
        .map(|c| c.user.clone())
        .collect();

    tokio::task::spawn_blocking(move || {
        let http = Http::new(&base);
        let no_deletes = HashSet::new();
        // Ingest through the API (admin), then the IAM snapshot.
        for d in &docs {
            let id = d["doc_id"].as_str().unwrap();
            let (s, b) = http.json(
                "PUT",
                &format!("/v1/documents/{id}"),
                &admin,
                json!({"title": d["title"], "text": d["text"], "metadata": d["metadata"]}),
            );
            assert_eq!(s, 201, "{id}: {b}");
        }
        let (s, b) = http.send(
            "POST",
            "/v1/acl/sync",
            &admin,
            Some(("application/x-ndjson", v1.text.clone())),
        );
        assert_eq!(s, 200, "{b}");
        assert_eq!(b["users_added"], 60);
        let mut tokens = HashMap::new();
        for u in &users {
            let (s, b) = http.json(
                "POST",
                "/v1/acl/approvals",
                &approver,
                json!({"action": "token_issue", "user_id": u}),
            );
            assert_eq!(s, 201, "{b}");
            let approval = b["approval"].as_str().unwrap();
            let (s, b) = http.post_approved(&format!("/v1/acl/users/{u}/token"), &admin, approval);
            assert_eq!(s, 201, "{b}");
            tokens.insert(u.clone(), b["token"].as_str().unwrap().to_string());
        }

        // v1: answerable cases find their document; denied cases leak nothing.
        let mut found = 0;
        for c in &answerable {
            let (got, _) = retrieve_checked(&http, &tokens, &v1, &no_deletes, &c.user, &c.query);
            if c.relevant.iter().any(|r| got.contains(r)) {
                found += 1;
            }
        }
        assert!(
            found * 4 >= answerable.len() * 3,
            "recall: {found}/{}",
            answerable.len()
        );
        for c in &denied {
            let (got, text) = retrieve_checked(&http, &tokens, &v1, &no_deletes, &c.user, &c.query);
            for f in &c.forbidden_docs {
                assert!(!got.contains(f), "{} got forbidden {f}", c.user);
            }
            for s in &c.forbidden_strings {
                assert!(
                    !text.contains(s.as_str()),
                    "{} saw forbidden string {s}",
                    c.user
                );
            }
        }
        // Answers and citations respect the ACL too (a few: generation is slow in debug builds).
        for c in denied.iter().take(3) {
            chat_checked(&http, &tokens, &v1, &no_deletes, c);
        }

        // Under v1 the revoked cases' documents are still readable and found for at least one.
        let mut revoked_seen_in_v1 = 0;
        for c in &revoked {
            let (got, _) = retrieve_checked(&http, &tokens, &v1, &no_deletes, &c.user, &c.query);
            if c.forbidden_docs.iter().any(|f| got.contains(f)) {
                revoked_seen_in_v1 += 1;
            }
        }
        assert!(
            revoked_seen_in_v1 > 0,
            "no revoked document was visible under v1"
        );

        // Delete: the document is gone for everybody at once, and a second DELETE is 200.
        let mut deleted = HashSet::new();
        for c in &deleted_cases {
            let (before, _) = retrieve_checked(&http, &tokens, &v1, &deleted, &c.user, &c.query);
            let target = c
                .forbidden_docs
                .iter()
                .find(|f| before.contains(f))
                .or(c.forbidden_docs.first())
                .unwrap()
                .clone();
            let (s, b) = http.send("DELETE", &format!("/v1/documents/{target}"), &admin, None);
            assert_eq!(s, 200, "{b}");
            deleted.insert(target);
        }
        for c in deleted_cases.iter().chain(&answerable) {
            let (_, text) = retrieve_checked(&http, &tokens, &v1, &deleted, &c.user, &c.query);
            for d in &deleted {
                assert!(!text.contains(&format!("\"{d}\"")), "deleted {d} came back");
            }
        }

        // v2: revoked access is gone on the next request; a removed user's token fails.
        let (s, b) = http.send(
            "POST",
            "/v1/acl/sync",
            &admin,
            Some(("application/x-ndjson", v2.text.clone())),
        );
        assert_eq!(s, 200, "{b}");
        assert_eq!(b["users_removed"], 1);
        for c in &revoked {
            if !v2.groups.contains_key(&c.user) {
                let (s, b) = http.json(
                    "POST",
                    "/v1/retrieve",
                    &tokens[&c.user],
                    json!({"query": c.query}),
                );
                assert_eq!(s, 401, "removed user still authenticated: {b}");
                continue;
            }
            let (got, text) = retrieve_checked(&http, &tokens, &v2, &deleted, &c.user, &c.query);
            for f in &c.forbidden_docs {
                assert!(!got.contains(f), "{} still gets revoked {f}", c.user);
            }
            for s in &c.forbidden_strings {
                assert!(!text.contains(s.as_str()), "{} still sees {s}", c.user);
            }
        }
        if let Some(c) = revoked.iter().find(|c| v2.groups.contains_key(&c.user)) {
            chat_checked(&http, &tokens, &v2, &deleted, c);
        }
        for c in answerable.iter().chain(&denied) {
            if v2.groups.contains_key(&c.user) {
                retrieve_checked(&http, &tokens, &v2, &deleted, &c.user, &c.query);
            }
        }
    })
    .await
    .unwrap();
    assert_eq!(served.shutdown().await, airlock::server::Drained::Clean);
}
