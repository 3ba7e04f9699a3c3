//! `[[connectors]]` end to end against a real Samba AD domain controller (`samba.rs`): the
//! daemon's scheduler syncs a share with its NTFS ACLs, users signed in over `[ldap]` against the
//! same DC retrieve exactly the files the share lets them read (a deny ACE included), an ACE
//! change is an ACL update without re-extraction, the drift check finds the change before the
//! re-sync and nothing after it, and a sync against a stopped DC changes nothing; a second
//! appliance syncing the same source holds the same documents and readers (the holdings digest)
//! once it has synced the same changes. Also: the API's refusals, audit rows and metrics.

use std::time::{Duration, Instant};

use airlock::Config;
use axum::http::{Method, StatusCode};
use serde_json::{Value, json};

use crate::ldap::{cookie_of, login, with_cookie};
use crate::samba::Dc;
use crate::support::{TestApp, test_config};

const PW: &str = "Test-Pass-1!";
const ALIAS: &str = "docs";
const QUERY: &str = "quarterly liquidity report";

/// The operator's `[ldap]` and `[[connectors]]` for the DC (sign-in ids are sAMAccountNames,
/// the names the connector grants to).
fn config(dc: &Dc, pw_file: &std::path::Path) -> Config {
    let parsed =
        Config::from_toml(&toml(dc, pw_file), std::path::Path::new("airlock.toml")).unwrap();
    Config {
        ldap: parsed.ldap,
        connectors: parsed.connectors,
        ..test_config()
    }
}

/// [`config`]'s sections as the operator's TOML.
fn toml(dc: &Dc, pw_file: &std::path::Path) -> String {
    let realm = dc.get("REALM").to_lowercase();
    let base = realm
        .split('.')
        .map(|p| format!("DC={p}"))
        .collect::<Vec<_>>()
        .join(",");
    let ca = dc.get("CA_FILE");
    format!(
        "[ldap]\nurl = \"ldaps://127.0.0.1:636\"\nca_file = \"{ca}\"\n\
         bind_dn = \"svc-airlock@{realm}\"\nbind_password_file = \"{pw}\"\n\
         user_base = \"CN=Users,{base}\"\nuser_filter = \"(sAMAccountName={{username}})\"\n\
         user_id_attr = \"sAMAccountName\"\ngroup_base = \"CN=Users,{base}\"\n\
         group_filter = \"(member={{user_dn}})\"\ngroup_name_attr = \"cn\"\n\
         disabled_filter = \"(userAccountControl:1.2.840.113556.1.4.803:=2)\"\n\n\
         [[connectors]]\nalias = \"{ALIAS}\"\nkind = \"smb\"\nhost = \"127.0.0.1\"\n\
         share = \"docs\"\ndomain = \"{domain}\"\nusername = \"svc-airlock\"\n\
         password_file = \"{pw}\"\nldap_url = \"ldaps://127.0.0.1:636\"\n\
         ldap_ca_file = \"{ca}\"\nldap_bind = \"svc-airlock@{realm}\"\n\
         interval_minutes = 60\nshare_acl = \"none\"\ncheck_traverse = true\n\
         exclude = [\"**/*.tmp\", \"scratch/**\"]\n",
        pw = pw_file.display(),
        domain = dc.get("DOMAIN"),
    )
}

/// The real binary (`airlock demo`, which execs `airlock serve`) under strace with the lockdown
/// required and `toml`'s `[[connectors]]`: its first sync of the share succeeds through the
/// lockdown, and every IPv4/IPv6 connect goes to 127.0.0.1 on the file server's port (445) or
/// the directory's (636), the two the configuration names.
fn traced_sync_connects_only_to_the_source(toml: &str, items: u64) {
    use crate::sandbox::{STRACE, http, inet_connects, stop_traced, traced_demo_ready};
    assert!(
        std::path::Path::new(STRACE).exists(),
        "{STRACE} is not installed (.ci/run installs it)"
    );
    let dir = tempfile::tempdir().unwrap();
    let staging = dir.path().join("staging");
    crate::support::small_staging(&staging);
    let data = dir.path().join("data");
    let toml_path = dir.path().join("connectors.toml");
    std::fs::write(&toml_path, toml).unwrap();
    let log = dir.path().join("strace.txt");
    let port = crate::sandbox::free_port();
    let (mut strace, logs) = traced_demo_ready(&log, &data, &staging, &toml_path, port);
    let tokens: Value =
        serde_json::from_slice(&std::fs::read(data.join("demo/tokens.json")).unwrap()).unwrap();
    let operator = tokens["admin"].as_str().unwrap();
    let deadline = Instant::now() + Duration::from_secs(600);
    let status = loop {
        let (code, body) = http(
            "GET",
            &format!("http://127.0.0.1:{port}/v1/connectors"),
            operator,
            None,
        );
        assert_eq!(code, 200, "{body}");
        let s = body["data"][0].clone();
        if s["runs"].as_u64().unwrap_or(0) >= 1 && s["running"] == false {
            break s;
        }
        assert!(Instant::now() < deadline, "no sync ended: {body}");
        std::thread::sleep(Duration::from_millis(250));
    };
    stop_traced(&mut strace);
    let logs = logs.join().unwrap();
    assert!(status["last_run"]["error"].is_null(), "{status}\n{logs}");
    assert_eq!(status["items"], items, "{status}");
    assert!(
        logs.lines().any(|l| l.contains("egress lockdown active")
            && l.contains("tcp_connect_allowed_ports")
            && l.contains("445")
            && l.contains("636")),
        "the daemon must log its lockdown with the share's and the directory's ports:\n{logs}"
    );
    let trace = std::fs::read_to_string(&log).unwrap();
    let inet = inet_connects(&trace);
    for port in [445, 636] {
        let to = format!("sin_port=htons({port})");
        assert!(
            inet.iter().any(|l| l.contains(&to)),
            "no connect to port {port}:\n{trace}"
        );
    }
    for l in &inet {
        assert!(
            l.contains("127.0.0.1")
                && (l.contains("sin_port=htons(445)") || l.contains("sin_port=htons(636)")),
            "a connect outside the configured source:\n{l}"
        );
    }
    eprintln!(
        "{} connects, all to 127.0.0.1:445 or :636 (the share and its directory)",
        inet.len()
    );
}

/// The source's status once a sync after the `runs`-th has ended.
async fn wait_for_run(t: &TestApp, runs: u64) -> Value {
    let deadline = Instant::now() + Duration::from_secs(900);
    loop {
        let r = t
            .call(Method::GET, "/v1/connectors", Some(&t.admin), None)
            .await;
        assert_eq!(r.status, StatusCode::OK, "{}", r.text);
        let s = &r.json["data"][0];
        if s["runs"].as_u64().unwrap_or(0) > runs && s["running"] == false {
            return s.clone();
        }
        assert!(Instant::now() < deadline, "no sync ended: {}", r.text);
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// Asks for a sync through the API and waits for it.
async fn sync(t: &TestApp, runs: u64) -> Value {
    let r = t
        .call(
            Method::POST,
            &format!("/v1/connectors/{ALIAS}/sync"),
            Some(&t.admin),
            None,
        )
        .await;
    assert_eq!(r.status, StatusCode::ACCEPTED, "{}", r.text);
    wait_for_run(t, runs).await
}

/// The drift check through the API: (leaks, missing, the report).
async fn verify(t: &TestApp) -> (u64, u64, Value) {
    let r = t
        .call(
            Method::POST,
            &format!("/v1/connectors/{ALIAS}/verify"),
            Some(&t.admin),
            None,
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    (
        r.json["leaks"].as_u64().unwrap(),
        r.json["missing"].as_u64().unwrap(),
        r.json,
    )
}

/// What the appliance holds of the source: (documents, digest).
async fn holdings(t: &TestApp) -> (u64, String) {
    let r = t
        .call(
            Method::GET,
            &format!("/v1/connectors/{ALIAS}/holdings"),
            Some(&t.admin),
            None,
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert_eq!(r.json["source"], ALIAS, "{}", r.text);
    assert_eq!(r.json["unreadable"], 0, "{}", r.text);
    (
        r.json["documents"].as_u64().unwrap(),
        r.json["digest"].as_str().unwrap().to_owned(),
    )
}

/// The share paths a signed-in user retrieves.
async fn visible(t: &TestApp, session: &(String, String)) -> Vec<String> {
    let r = with_cookie(
        t,
        Method::POST,
        "/v1/retrieve",
        &session.0,
        Some(&session.1),
        Some(json!({"query": QUERY, "top_k": 20})),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    let mut paths: Vec<String> = r.json["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| path_of(t, h["doc_id"].as_str().unwrap()))
        .collect();
    paths.sort();
    paths.dedup();
    paths
}

fn path_of(t: &TestApp, doc_id: &str) -> String {
    let info = t
        .state
        .services()
        .unwrap()
        .retrieval
        .document(doc_id)
        .unwrap()
        .unwrap();
    info.metadata["path"].as_str().unwrap().to_owned()
}

/// The stored document of a share path: its id and `[version, chunks, updated_at]`.
fn document_of(t: &TestApp, path: &str) -> (String, Value) {
    let docs = t
        .state
        .services()
        .unwrap()
        .retrieval
        .list_documents(&airlock_retrieval::DocumentList {
            limit: 100,
            ..Default::default()
        })
        .unwrap();
    let d = docs
        .iter()
        .find(|d| path_of(t, &d.doc_id) == path)
        .unwrap_or_else(|| panic!("no document for {path}"));
    let info = t
        .state
        .services()
        .unwrap()
        .retrieval
        .document(&d.doc_id)
        .unwrap()
        .unwrap();
    (
        d.doc_id.clone(),
        json!([info.version, info.chunks, info.updated_at_ms]),
    )
}

async fn sign_in(t: &TestApp, user: &str) -> (String, String) {
    let r = login(t, user, PW).await;
    assert_eq!(r.status, StatusCode::OK, "{user}: {}", r.text);
    // The sign-in id is the sAMAccountName: the name the connector's grants use.
    assert_eq!(r.json["user"], user, "{}", r.text);
    (
        cookie_of(&r),
        r.json["csrf_token"].as_str().unwrap().to_owned(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn smb_share_acls_decide_who_retrieves_what_and_a_failed_sync_changes_nothing() {
    let Some(mut dc) = tokio::task::spawn_blocking(Dc::start).await.unwrap() else {
        return;
    };
    let dom = dc.get("DOMAIN_SID").to_owned();
    for u in ["svc-airlock", "alice", "bob"] {
        dc.add_user(u, PW);
    }
    dc.add_group("finance");
    dc.add_group("crawlers");
    dc.add_members("finance", &["alice", "bob"]);
    dc.add_members("crawlers", &["svc-airlock"]);
    let (svc, finance, alice, bob) = (
        dc.sid("crawlers"),
        dc.sid("finance"),
        dc.sid("alice"),
        dc.sid("bob"),
    );
    let ba = "S-1-5-32-544";
    let du = format!("{dom}-513");
    let read = "0x001200a9";
    let own =
        |extra: &str| format!("O:{ba}G:{du}D:P{extra}(A;;0x001f01ff;;;{ba})(A;;{read};;;{svc})");
    // The root: Administrators full, the crawler and Domain Users read, inherited.
    dc.set_sddl(
        "",
        &format!(
            "O:{ba}G:{du}D:PAI(A;OICI;0x001f01ff;;;{ba})(A;OICI;{read};;;{svc})(A;OICI;{read};;;{du})"
        ),
    );
    let text = |who: &str| format!("The {QUERY} for {who}: liquidity coverage stays above 130%.");
    dc.put("shared.txt", text("every domain user").as_bytes());
    dc.put("alice.txt", text("alice").as_bytes());
    dc.set_sddl("alice.txt", &own(&format!("(A;;{read};;;{alice})")));
    dc.put("bob.txt", text("bob").as_bytes());
    dc.set_sddl("bob.txt", &own(&format!("(A;;{read};;;{bob})")));
    // finance may read it, but a deny ACE for bob comes first: alice only.
    dc.put("team.txt", text("finance but not bob").as_bytes());
    dc.set_sddl(
        "team.txt",
        &own(&format!("(D;;0x00000001;;;{bob})(A;;{read};;;{finance})")),
    );
    // Outside the source's scope (`exclude`), readable by every domain user: never listed,
    // never stored, whatever the case of its name.
    dc.put("notes.TMP", text("a scratch file").as_bytes());
    dc.smb("mkdir scratch");
    dc.put("scratch/draft.txt", text("a draft").as_bytes());

    let secrets = tempfile::tempdir().unwrap();
    let pw_file = secrets.path().join("svc.pw");
    std::fs::write(&pw_file, PW).unwrap();
    std::fs::set_permissions(
        &pw_file,
        <std::fs::Permissions as std::os::unix::fs::PermissionsExt>::from_mode(0o600),
    )
    .unwrap();
    let t = TestApp::with_config(config(&dc, &pw_file));
    airlock::cli::serve::start_connectors(&t.state, t._dir.path()).unwrap();

    // The first sync runs at start: four files, each extracted and stored with its grant.
    let s = wait_for_run(&t, 0).await;
    assert!(s["last_run"]["error"].is_null(), "{s}");
    assert_eq!(s["last_run"]["counts"]["upserted"], 4, "{s}");
    assert_eq!(s["items"], 4, "{s}");
    assert!(s["last_success"].as_u64().is_some(), "{s}");

    // A second appliance syncing the same source (the HA story) holds the same documents with
    // the same content versions and readers: the same digest.
    let t2 = TestApp::with_config(config(&dc, &pw_file));
    airlock::cli::serve::start_connectors(&t2.state, t2._dir.path()).unwrap();
    let s2 = wait_for_run(&t2, 0).await;
    assert!(s2["last_run"]["error"].is_null(), "{s2}");
    let first = holdings(&t).await;
    assert_eq!(first.0, 4);
    assert_eq!(holdings(&t2).await, first);
    let r = t
        .call(
            Method::GET,
            "/v1/connectors/nope/holdings",
            Some(&t.admin),
            None,
        )
        .await;
    r.assert_problem(404, "not-found", "no connector `nope`");

    // The API: an unknown alias is 404, a second request while one is pending or running 409.
    let r = t
        .call(
            Method::POST,
            "/v1/connectors/nope/sync",
            Some(&t.admin),
            None,
        )
        .await;
    r.assert_problem(404, "not-found", "no connector `nope`");
    let path = format!("/v1/connectors/{ALIAS}/sync");
    let r = t.call(Method::POST, &path, Some(&t.admin), None).await;
    assert_eq!(r.status, StatusCode::ACCEPTED, "{}", r.text);
    let r = t.call(Method::POST, &path, Some(&t.admin), None).await;
    r.assert_problem(
        409,
        "conflict",
        "connector `docs` is already syncing (or a sync is requested); try again when it ends",
    );
    // Nothing changed on the share: nothing to do.
    let s = wait_for_run(&t, 1).await;
    assert!(s["last_run"]["error"].is_null(), "{s}");
    for kind in ["upserted", "permissions", "deleted", "failed"] {
        assert_eq!(s["last_run"]["counts"][kind], 0, "{kind}: {s}");
    }

    // Signed in over LDAP against the same DC, each user retrieves exactly what the share
    // lets them read.
    let alice_s = sign_in(&t, "alice").await;
    let bob_s = sign_in(&t, "bob").await;
    assert_eq!(
        visible(&t, &alice_s).await,
        ["alice.txt", "shared.txt", "team.txt"]
    );
    assert_eq!(visible(&t, &bob_s).await, ["bob.txt", "shared.txt"]);
    for (user, path) in [("alice", "alice.txt"), ("bob", "team.txt")] {
        let can = dc.can_read(user, path);
        let sees = visible(&t, if user == "alice" { &alice_s } else { &bob_s })
            .await
            .contains(&path.to_owned());
        assert_eq!(
            can,
            Some(sees),
            "{user} {path}: server and Airlock disagree"
        );
    }

    // An ACE change only: bob may now read alice.txt. The re-sync is an ACL update: the stored
    // document (version, chunks, last update) is untouched.
    let (alice_doc, before) = document_of(&t, "alice.txt");
    let (leaks, missing, report) = verify(&t).await;
    assert_eq!((leaks, missing), (0, 0), "{report}");
    assert_eq!(report["documents_checked"], 4, "{report}");
    dc.set_sddl(
        "alice.txt",
        &own(&format!("(A;;{read};;;{alice})(A;;{read};;;{bob})")),
    );
    // Before the re-sync the drift check sees it: bob is missing on alice.txt.
    let (leaks, missing, report) = verify(&t).await;
    assert_eq!((leaks, missing), (0, 1), "{report}");
    assert_eq!(report["mismatches"][0]["path"], "alice.txt", "{report}");
    assert_eq!(
        report["mismatches"][0]["missing"],
        json!(["bob"]),
        "{report}"
    );
    let s = sync(&t, 2).await;
    assert!(s["last_run"]["error"].is_null(), "{s}");
    assert_eq!(s["last_run"]["counts"]["permissions"], 1, "{s}");
    assert_eq!(s["last_run"]["counts"]["upserted"], 0, "{s}");
    assert_eq!(document_of(&t, "alice.txt"), (alice_doc, before));
    assert_eq!(
        visible(&t, &bob_s).await,
        ["alice.txt", "bob.txt", "shared.txt"]
    );
    assert_eq!(dc.can_read("bob", "alice.txt"), Some(true));
    let (leaks, missing, report) = verify(&t).await;
    assert_eq!((leaks, missing), (0, 0), "{report}");
    // The second appliance has not synced since: its holdings differ by bob's grant, until it
    // syncs too.
    let changed = holdings(&t).await;
    assert_ne!(changed, first);
    assert_eq!(holdings(&t2).await, first);
    let s2 = sync(&t2, 1).await;
    assert_eq!(s2["last_run"]["counts"]["permissions"], 1, "{s2}");
    assert_eq!(holdings(&t2).await, changed);

    // A rename: the document keeps its id; its path (what citations show) and title follow the
    // file, and its readers stay those of the file.
    let (shared_doc, _) = document_of(&t, "shared.txt");
    dc.smb("rename shared.txt renamed.txt");
    let s = sync(&t, 3).await;
    assert!(s["last_run"]["error"].is_null(), "{s}");
    assert_eq!(s["last_run"]["counts"]["moved"], 1, "{s}");
    assert_eq!(s["last_run"]["counts"]["upserted"], 0, "{s}");
    assert_eq!(document_of(&t, "renamed.txt").0, shared_doc);
    let info = t
        .state
        .services()
        .unwrap()
        .retrieval
        .document(&shared_doc)
        .unwrap()
        .unwrap();
    assert_eq!(info.title, "renamed.txt");
    assert_eq!(
        visible(&t, &bob_s).await,
        ["alice.txt", "bob.txt", "renamed.txt"]
    );
    let (leaks, missing, report) = verify(&t).await;
    assert_eq!((leaks, missing), (0, 0), "{report}");
    // The second appliance converges on the rename too (title, path and content version).
    assert_ne!(holdings(&t).await, changed);
    sync(&t2, 2).await;
    assert_eq!(holdings(&t2).await, holdings(&t).await);
    drop(t2);

    // The real binary under the egress lockdown syncs the same share and dials nothing else.
    let text = toml(&dc, &pw_file);
    tokio::task::spawn_blocking(move || traced_sync_connects_only_to_the_source(&text, 4))
        .await
        .unwrap();

    // The DC stops: the sync fails loudly and changes nothing (no deletion, no grant change).
    let last_success = s["last_success"].clone();
    drop(dc);
    let s = sync(&t, 4).await;
    let error = s["last_run"]["error"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    assert!(!error.is_empty(), "{s}");
    assert_eq!(s["last_success"], last_success, "{s}");
    assert_eq!(s["items"], 4, "{s}");
    assert_eq!(
        visible(&t, &alice_s).await,
        ["alice.txt", "renamed.txt", "team.txt"]
    );
    assert_eq!(
        visible(&t, &bob_s).await,
        ["alice.txt", "bob.txt", "renamed.txt"]
    );
    let r = t
        .call(
            Method::POST,
            &format!("/v1/connectors/{ALIAS}/verify"),
            Some(&t.admin),
            None,
        )
        .await;
    assert_eq!(r.status, StatusCode::BAD_GATEWAY, "{}", r.text);

    // Audit rows per sync and the metrics.
    let r = t
        .call(Method::GET, "/v1/audit?limit=1000", Some(&t.admin), None)
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    for action in [
        "connector_sync_started",
        "connector_sync_finished",
        "connector_sync_requested",
        "connector_verify",
    ] {
        assert!(r.text.contains(action), "no {action} row: {}", r.text);
    }
    let r = t.call(Method::GET, "/metrics", Some(&t.admin), None).await;
    for line in [
        "airlock_connector_syncs_total{source=\"docs\"} 5",
        "airlock_connector_sync_failures_total{source=\"docs\"} 1",
        "airlock_connector_items_total{source=\"docs\",kind=\"upsert\"} 4",
        "airlock_connector_items_total{source=\"docs\",kind=\"permissions\"} 1",
    ] {
        assert!(
            r.text.contains(line),
            "no `{line}` in /metrics:\n{}",
            r.text
        );
    }
}
