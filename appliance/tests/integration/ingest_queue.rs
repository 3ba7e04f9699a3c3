//! The ingest queue (issue 26 point 9, `airlock_serving::ingest_queue`): a corpus queued in
//! `DATA/ingest-queue/` is ingested while the daemon serves. In process: the progress seen by
//! an operator and by an ordinary user halfway through a job, the documents readable by their
//! grantees once stored (grants given before the documents existed), a refused line counted
//! and named only to the operator, the job file removed, a re-queued job skipped by content
//! hash, and a bad job name refused with nothing written. With the real binary: `airlock serve`
//! takes up a job queued before it started.

use std::path::Path;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use airlock_serving::ingest_queue::{self, Status};
use axum::http::Method;
use serde_json::{Value, json};

use crate::backup::{Daemon, installed};
use crate::sandbox::http;
use crate::support::TestApp;

const TOPICS: [&str; 5] = [
    "The overdraft limit for retail customers is five thousand euros per account.",
    "Mortgage applications need two payslips and a signed valuation report.",
    "Wire transfers above fifty thousand euros require a second approver.",
    "Lost debit cards are blocked through the hotline within ten minutes.",
    "The savings account pays an interest rate of two percent per year.",
];

/// A JSON-lines corpus of `n` documents `q000`… plus one line that is not JSON.
fn corpus(path: &Path, n: usize) {
    let mut s = String::new();
    for i in 0..n {
        let text = format!("Note {i}. {}", TOPICS[i % TOPICS.len()]);
        s.push_str(
            &json!({"_id": format!("q{i:03}"), "title": format!("Note {i}"), "text": text})
                .to_string(),
        );
        s.push('\n');
        if i == n / 2 {
            s.push_str("{not json\n");
        }
    }
    std::fs::write(path, s).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queued_corpus_ingests_beside_serving_with_progress_by_role() {
    let app = std::sync::Arc::new(TestApp::new());
    let data = app._dir.path().to_path_buf();
    let services = app.state.services().unwrap();
    let reader = app.user("reader", &["tellers"]);
    let other = app.user("other", &["auditors"]);
    // Grants before the documents exist (as the demo applies its IAM snapshot first).
    const N: usize = 24;
    for i in 0..N {
        let grants = airlock_acl::DocGrants {
            users: vec![],
            groups: vec!["tellers".into()],
        };
        services
            .acl
            .set_document_grants("test", &format!("q{i:03}"), &grants)
            .unwrap();
    }
    let src = data.join("src.jsonl");
    corpus(&src, N);

    // A bad job name is refused and writes nothing.
    let err = ingest_queue::enqueue(&data, "../escape", &src).unwrap_err();
    assert!(err.to_string().contains("job name"), "{err:#}");
    assert!(ingest_queue::pending(&data).unwrap().is_empty());
    // A half-written file (the temporary name) is not a job.
    std::fs::create_dir_all(ingest_queue::queue_dir(&data)).unwrap();
    std::fs::write(
        ingest_queue::queue_dir(&data).join(".009-x.jsonl.part"),
        b"{}",
    )
    .unwrap();
    let job = ingest_queue::enqueue(&data, "notes", &src).unwrap();
    assert_eq!(ingest_queue::pending(&data).unwrap(), vec![job.clone()]);
    assert!(
        job.path.ends_with("001-notes.jsonl"),
        "{}",
        job.path.display()
    );

    // The worker pauses at its first progress report until the test has looked.
    let (at_progress, paused) = mpsc::channel::<()>();
    let (go, resume) = mpsc::channel::<()>();
    let status: std::sync::Arc<Status> = app.state.indexing().clone();
    let worker = {
        let (services, job, status) = (services.clone(), job.clone(), status.clone());
        std::thread::spawn(move || {
            let mut first = true;
            ingest_queue::run_job(&services, &job, &status, None, &mut |_| {
                if std::mem::take(&mut first) {
                    at_progress.send(()).unwrap();
                    resume.recv().unwrap();
                }
            })
            .unwrap()
        })
    };
    tokio::task::spawn_blocking(move || paused.recv().unwrap())
        .await
        .unwrap();
    let info = app
        .call(Method::GET, "/v1/info", Some(&app.admin), None)
        .await;
    assert_eq!(info.status, 200, "{}", info.text);
    let ix = &info.json["indexing"];
    assert_eq!(ix["active"], true, "{ix}");
    assert_eq!(ix["job"]["name"], "notes", "{ix}");
    assert_eq!(ix["job"]["docs_total"], N + 1, "{ix}");
    assert_eq!(ix["job"]["refused"], 1, "{ix}");
    assert_eq!(ix["job"]["docs_done"], 1, "{ix}");
    assert_eq!(ix["queued"], 0, "{ix}");
    // An ordinary user learns only that indexing goes on: no name, no counts.
    let info = app.call(Method::GET, "/v1/info", Some(&other), None).await;
    assert_eq!(
        info.json["indexing"],
        json!({"active": true}),
        "{}",
        info.text
    );
    go.send(()).unwrap();
    let outcome = tokio::task::spawn_blocking(move || worker.join().unwrap())
        .await
        .unwrap();
    assert_eq!((outcome.stored, outcome.refused), (N, 1));
    assert!(outcome.chunks >= N, "{outcome:?}");
    assert!(!job.path.exists(), "the finished job's file is removed");

    // Done: the operator sees the finished job, the refusal named by its line; others nothing.
    let info = app
        .call(Method::GET, "/v1/info", Some(&app.admin), None)
        .await;
    let ix = &info.json["indexing"];
    assert_eq!(ix["active"], false, "{ix}");
    assert_eq!(ix["job"], Value::Null, "{ix}");
    assert_eq!(ix["finished"][0]["name"], "notes", "{ix}");
    assert_eq!(ix["finished"][0]["stored"], N, "{ix}");
    assert_eq!(ix["finished"][0]["refused"], 1, "{ix}");
    let refusal = ix["finished"][0]["refusals"][0].as_str().unwrap();
    assert!(refusal.contains("line 14"), "{refusal}");
    let info = app.call(Method::GET, "/v1/info", Some(&reader), None).await;
    assert_eq!(info.json["indexing"], Value::Null, "{}", info.text);

    // The grantees read the documents; nobody else does.
    let q = json!({"query": "overdraft limit for retail customers", "top_k": 5});
    let r = app
        .call(Method::POST, "/v1/retrieve", Some(&reader), Some(q.clone()))
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
    let hits = r.json["results"].as_array().unwrap();
    assert!(!hits.is_empty(), "{}", r.text);
    assert!(
        hits.iter()
            .all(|h| h["doc_id"].as_str().unwrap().starts_with('q')),
        "{}",
        r.text
    );
    let r = app
        .call(Method::POST, "/v1/retrieve", Some(&other), Some(q))
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(r.json["results"], json!([]), "{}", r.text);

    // Queued again (a restart mid-job takes the job up the same way): nothing is re-embedded.
    let again = ingest_queue::enqueue(&data, "notes", &src).unwrap();
    assert!(
        again.path.ends_with("001-notes.jsonl"),
        "{}",
        again.path.display()
    );
    let fresh = Status::default();
    let (services2, again2) = (services.clone(), again.clone());
    let o = tokio::task::spawn_blocking(move || {
        ingest_queue::run_job(&services2, &again2, &fresh, None, &mut |_| {}).unwrap()
    })
    .await
    .unwrap();
    assert_eq!((o.stored, o.refused, o.chunks), (N, 1, 0));
    assert!(!again.path.exists());
}

/// `airlock serve` ingests a corpus queued before it started, beside serving, and removes it.
#[test]
fn the_daemon_takes_up_a_queued_corpus() {
    let tmp = tempfile::tempdir().unwrap();
    let (data, admin) = installed(tmp.path());
    let src = tmp.path().join("src.jsonl");
    corpus(&src, 8);
    let job = ingest_queue::enqueue(&data, "notes", &src).unwrap();
    let mut daemon = Daemon::start(&data, &[]);
    daemon.wait_ready();
    let deadline = Instant::now() + Duration::from_secs(300);
    let finished = loop {
        let (status, body) = http("GET", &format!("{}/v1/info", daemon.base), &admin, None);
        assert_eq!(status, 200, "{body}");
        let finished = body["indexing"]["finished"].clone();
        if finished.as_array().is_some_and(|f| !f.is_empty()) {
            break finished;
        }
        assert!(Instant::now() < deadline, "the job never finished: {body}");
        std::thread::sleep(Duration::from_millis(300));
    };
    assert_eq!(finished[0]["name"], "notes", "{finished}");
    assert_eq!(finished[0]["stored"], 8, "{finished}");
    assert_eq!(finished[0]["refused"], 1, "{finished}");
    assert!(!job.path.exists());
    let log = daemon.stop();
    assert!(log.contains("ingest job finished"), "{log}");
    // Names and counts only: no document text in the log.
    assert!(!log.contains("overdraft"), "{log}");
}

/// `airlock demo` (not `--setup-only`) on a fresh data directory, with small sample corpora:
/// it serves at once, its two corpora are queued and ingested by the daemon, and each user then
/// reads exactly what the IAM snapshot (applied before the documents existed) grants.
#[test]
fn the_demo_serves_at_once_and_ingests_its_corpora_in_the_background() {
    use std::process::{Command, Stdio};
    let tmp = tempfile::tempdir().unwrap();
    let staging = tmp.path().join("staging");
    crate::support::small_staging(&staging);
    let sample = tmp.path().join("sample");
    let (bank, cran) = (sample.join("bank-dev"), sample.join("cranfield"));
    std::fs::create_dir_all(&bank).unwrap();
    std::fs::create_dir_all(&cran).unwrap();
    let line = |id: &str, text: &str| json!({"doc_id": id, "title": id, "text": text}).to_string();
    let mut docs = Vec::new();
    for (i, t) in TOPICS.iter().enumerate() {
        docs.push(line(&format!("doc-{i}"), t));
    }
    std::fs::write(bank.join("corpus.jsonl"), docs.join("\n") + "\n").unwrap();
    let mut iam = vec![
        json!({"user": "u1", "groups": ["g1"]}).to_string(),
        json!({"user": "u2", "groups": ["g2"]}).to_string(),
    ];
    for i in 0..TOPICS.len() {
        let g = if i % 2 == 0 { "g1" } else { "g2" };
        iam.push(json!({"doc": format!("doc-{i}"), "users": [], "groups": [g]}).to_string());
    }
    std::fs::write(bank.join("iam_v1.jsonl"), iam.join("\n") + "\n").unwrap();
    let cran_docs = [
        line(
            "c1",
            "Boundary layer transition on a flat plate at high speed.",
        ),
        line("c2", "Heat transfer in hypersonic flow over a blunt body."),
    ];
    std::fs::write(cran.join("corpus.jsonl"), cran_docs.join("\n") + "\n").unwrap();

    let data = tmp.path().join("data");
    let port = crate::oidc::free_port();
    let mut child = Command::new(env!("CARGO_BIN_EXE_airlock"))
        .args(["demo", "--data", data.to_str().unwrap(), "--port"])
        .arg(port.to_string())
        .arg("--staging")
        .arg(&staging)
        .arg("--sample-data")
        .arg(&sample)
        .arg("--sample-files")
        .arg(tmp.path().join("no-files"))
        .env_remove("AIRLOCK_DATA")
        .env_remove("AIRLOCK_CONFIG")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    struct Kill<'a>(&'a mut std::process::Child);
    impl Drop for Kill<'_> {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let guard = Kill(&mut child);
    let base = format!("http://127.0.0.1:{port}");
    let deadline = Instant::now() + Duration::from_secs(600);
    while !ureq::get(&format!("{base}/readyz"))
        .call()
        .is_ok_and(|r| r.status() == 200)
    {
        assert!(guard.0.try_wait().unwrap().is_none(), "airlock demo exited");
        assert!(Instant::now() < deadline, "never ready");
        std::thread::sleep(Duration::from_millis(200));
    }
    let tokens: std::collections::BTreeMap<String, String> =
        serde_json::from_slice(&std::fs::read(data.join("demo/tokens.json")).unwrap()).unwrap();
    let finished = loop {
        let (status, body) = http("GET", &format!("{base}/v1/info"), &tokens["admin"], None);
        assert_eq!(status, 200, "{body}");
        let f = body["indexing"]["finished"].clone();
        if f.as_array().is_some_and(|f| f.len() == 2) {
            break f;
        }
        assert!(
            Instant::now() < deadline,
            "the corpora never finished: {body}"
        );
        std::thread::sleep(Duration::from_millis(300));
    };
    assert_eq!(finished[0]["name"], "bank-dev", "{finished}");
    assert_eq!(finished[0]["stored"], TOPICS.len(), "{finished}");
    assert_eq!(finished[1]["name"], "cranfield", "{finished}");
    assert_eq!(finished[1]["stored"], 2, "{finished}");
    assert!(ingest_queue::pending(&data).unwrap().is_empty());
    // u1 reads the even bank-dev documents and Cranfield, nothing else.
    let (status, body) = http(
        "POST",
        &format!("{base}/v1/retrieve"),
        &tokens["u1"],
        Some(json!({"query": "limit approver hotline interest flow", "top_k": 20})),
    );
    assert_eq!(status, 200, "{body}");
    let mut seen: Vec<String> = body["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| h["doc_id"].as_str().unwrap().to_owned())
        .collect();
    seen.sort();
    seen.dedup();
    for id in &seen {
        let allowed = id.starts_with('c')
            || id
                .strip_prefix("doc-")
                .is_some_and(|n| n.parse::<usize>().unwrap() % 2 == 0);
        assert!(allowed, "u1 sees {id}: {body}");
    }
    assert!(seen.iter().any(|id| id.starts_with("doc-")), "{body}");
    drop(guard);
}

/// `airlock demo --setup-only` on a fresh clone (issue 44): no sample datasets at
/// `--sample-data`, so the repository's real documents (`--repo-corpus`, golden-sets/real/) are
/// queued as folders and ingested as `airlock ingest DIR` does, each page with its grant from
/// the set's `docs/.acl.jsonl`, and the set's IAM users are the demo users: u04 (in `openssh`)
/// retrieves ssh-keygen's man page, u02 (not in it) does not, but reads the systemd pages.
/// A few pages of systemd-openssh (HTML and a PDF) with the set's own grants and IAM: the whole
/// set takes minutes in a debug build.
#[test]
fn without_sample_datasets_the_demo_ingests_the_repositorys_documents_with_their_grants() {
    const PAGES: [&str; 5] = [
        "ssh-keygen.1.html",
        "moduli.5.html",
        "ssh-keysign.8.pdf",
        "systemctl.1.html",
        "systemd.kill.5.html",
    ];
    let tmp = tempfile::tempdir().unwrap();
    let staging = tmp.path().join("staging");
    crate::support::small_staging(&staging);
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("../golden-sets/real/systemd-openssh");
    let set = tmp.path().join("systemd-openssh");
    std::fs::create_dir_all(set.join("docs")).unwrap();
    for page in PAGES {
        std::fs::copy(repo.join("docs").join(page), set.join("docs").join(page)).unwrap();
    }
    for f in ["docs/.acl.jsonl", "iam_v1.jsonl"] {
        std::fs::copy(repo.join(f), set.join(f)).unwrap();
    }
    let data = tmp.path().join("data");
    let out = crate::support::airlock_cli(&[
        "demo",
        "--data",
        data.to_str().unwrap(),
        "--setup-only",
        "--staging",
        staging.to_str().unwrap(),
        "--sample-data",
        tmp.path().join("no-datasets").to_str().unwrap(),
        "--repo-corpus",
        set.to_str().unwrap(),
        "--sample-files",
        tmp.path().join("no-files").to_str().unwrap(),
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(
        err.contains("using the repository's real documents"),
        "{err}"
    );
    assert!(
        err.contains("systemd-openssh: 5 stored, 0 refused"),
        "{err}"
    );
    assert!(ingest_queue::pending(&data).unwrap().is_empty());
    let tokens: std::collections::BTreeMap<String, String> =
        serde_json::from_slice(&std::fs::read(data.join("demo/tokens.json")).unwrap()).unwrap();
    let names: Vec<&str> = tokens.keys().map(String::as_str).collect();
    assert_eq!(
        names,
        [
            "admin", "approver", "u01", "u02", "u03", "u04", "u05", "u06", "u07"
        ]
    );

    let mut daemon = Daemon::start(&data, &[]);
    daemon.wait_ready();
    let seen = |user: &str, query: &str| -> Vec<String> {
        let (status, body) = http(
            "POST",
            &format!("{}/v1/retrieve", daemon.base),
            &tokens[user],
            Some(json!({"query": query, "top_k": 10})),
        );
        assert_eq!(status, 200, "{body}");
        let mut ids: Vec<String> = body["results"]
            .as_array()
            .unwrap()
            .iter()
            .map(|h| h["doc_id"].as_str().unwrap().to_owned())
            .collect();
        ids.sort();
        ids.dedup();
        ids
    };
    let q = "What is the default RSA key size of ssh-keygen?";
    assert!(
        seen("u04", q).contains(&"ssh-keygen.1.html".to_owned()),
        "{:?}",
        seen("u04", q)
    );
    let u02 = seen("u02", q);
    for openssh in ["ssh-keygen.1.html", "moduli.5.html", "ssh-keysign.8.pdf"] {
        assert!(
            !u02.iter().any(|id| id == openssh),
            "u02 sees {openssh}: {u02:?}"
        );
    }
    let q = "Which KillMode applies to a service if I don't set one?";
    assert!(
        seen("u02", q).contains(&"systemd.kill.5.html".to_owned()),
        "{:?}",
        seen("u02", q)
    );
    // The PDF page is stored with its grant: u06 (openssh) retrieves it.
    let q = "ssh-keysign helper for host-based authentication";
    assert!(
        seen("u06", q).contains(&"ssh-keysign.8.pdf".to_owned()),
        "{:?}",
        seen("u06", q)
    );
    daemon.stop();
}
