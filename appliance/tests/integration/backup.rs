//! `airlock backup` / `airlock restore` end to end (issue 26, point 8): a real `airlock serve`
//! over a real data directory (signed bundle of MiniLM and SmolLM2), documents ingested over
//! HTTP, a backup taken while the daemon serves and while another client keeps writing, a
//! restore onto a fresh directory and a second daemon there that retrieves exactly the same
//! documents with the same scores for the same user (token included: the ACL state is in the
//! backup). And a damaged archive is refused, naming what is damaged, with the target unchanged.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::oidc::free_port;
use crate::sandbox::http;
use crate::support::airlock_cli as airlock;

const BIN: &str = env!("CARGO_BIN_EXE_airlock");

/// An installed appliance (demo key, signed bundle of the small models), no documents; returns
/// the data directory and the admin token.
pub(crate) fn installed(dir: &Path) -> (PathBuf, String) {
    let data = crate::eval::installed_appliance(dir);
    let tokens: BTreeMap<String, String> =
        serde_json::from_slice(&std::fs::read(data.join("demo/tokens.json")).unwrap()).unwrap();
    let admin = tokens.values().next().unwrap().clone();
    (data, admin)
}

/// A running `airlock serve`; killed when dropped. Its stderr is collected.
pub(crate) struct Daemon {
    child: Child,
    pub(crate) base: String,
    logs: Option<std::thread::JoinHandle<String>>,
}

impl Daemon {
    pub(crate) fn start(data: &Path, envs: &[(&str, &str)]) -> Self {
        let port = free_port();
        let mut cmd = Command::new(BIN);
        cmd.args(["serve", "--data", data.to_str().unwrap(), "--port"])
            .arg(port.to_string())
            .env_remove("AIRLOCK_DATA")
            .env_remove("AIRLOCK_CONFIG")
            .env("AIRLOCK_LOG", "info")
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        for (k, v) in envs {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().unwrap();
        let stderr = child.stderr.take().unwrap();
        let logs = std::thread::spawn(move || {
            let mut all = String::new();
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                all.push_str(&line);
                all.push('\n');
            }
            all
        });
        Daemon {
            child,
            base: format!("http://127.0.0.1:{port}"),
            logs: Some(logs),
        }
    }

    pub(crate) fn wait_ready(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(600);
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                panic!("airlock serve exited early ({status}):\n{}", self.stop());
            }
            if ureq::get(&format!("{}/readyz", self.base))
                .call()
                .is_ok_and(|r| r.status() == 200)
            {
                return;
            }
            assert!(Instant::now() < deadline, "never ready");
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    pub(crate) fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Stops the daemon (SIGTERM, then SIGKILL after 60 s) and returns its log.
    pub(crate) fn stop(&mut self) -> String {
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let deadline = Instant::now() + Duration::from_secs(60);
        while self.child.try_wait().unwrap().is_none() {
            if Instant::now() > deadline {
                let _ = self.child.kill();
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        self.logs
            .take()
            .map(|h| h.join().unwrap())
            .unwrap_or_default()
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if self.logs.is_some() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

const TOPICS: [&str; 6] = [
    "The overdraft limit for retail customers is five thousand euros per account.",
    "Mortgage applications need two payslips and a signed valuation report.",
    "The branch in Rotterdam opens at nine and closes at five on weekdays.",
    "Wire transfers above fifty thousand euros require a second approver.",
    "Lost debit cards are blocked through the hotline within ten minutes.",
    "The savings account pays an interest rate of two percent per year.",
];

/// The demo's second operator's token (`approver` in `demo/tokens.json`): its approvals let the
/// admin issue tokens to users with access (four eyes).
pub(crate) fn approver_of(data: &Path) -> String {
    let tokens: BTreeMap<String, String> =
        serde_json::from_slice(&std::fs::read(data.join("demo/tokens.json")).unwrap()).unwrap();
    tokens["approver"].clone()
}

/// Creates (or updates) `user` in `group` and issues a token for them, approved by `approver`.
fn user_token(base: &str, admin: &str, approver: &str, user: &str, group: &str) -> String {
    let (status, body) = http(
        "PUT",
        &format!("{base}/v1/acl/users/{user}"),
        admin,
        Some(json!({"groups": [group]})),
    );
    assert!(status == 201 || status == 200, "{body}");
    let (status, body) = http(
        "POST",
        &format!("{base}/v1/acl/approvals"),
        approver,
        Some(json!({"action": "token_issue", "user_id": user})),
    );
    assert_eq!(status, 201, "{body}");
    let approval = body["approval"].as_str().unwrap().to_owned();
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .build()
        .into();
    let mut resp = agent
        .post(&format!("{base}/v1/acl/users/{user}/token"))
        .header("Authorization", &format!("Bearer {admin}"))
        .header("X-Airlock-Approval", &approval)
        .send_empty()
        .unwrap();
    let status = resp.status().as_u16();
    let body: Value = resp.body_mut().read_json().unwrap_or(Value::Null);
    assert_eq!(status, 201, "{body}");
    body["token"].as_str().unwrap().to_owned()
}

fn put_doc(base: &str, admin: &str, id: &str, text: &str, group: &str) {
    let (status, body) = http(
        "PUT",
        &format!("{base}/v1/documents/{id}"),
        admin,
        Some(json!({"title": format!("Policy {id}"), "text": text,
                    "acl": {"users": [], "groups": [group]}})),
    );
    assert!(status == 201 || status == 200, "{status} {body}");
}

/// `PUT` of a raw file (`content_type`) or `GET` of one; (status, body bytes).
fn raw(method: &str, url: &str, token: &str, file: Option<(&str, &[u8])>) -> (u16, Vec<u8>) {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(600)))
        .build()
        .into();
    let auth = format!("Bearer {token}");
    let resp = match (method, file) {
        ("PUT", Some((ct, bytes))) => agent
            .put(url)
            .header("Authorization", &auth)
            .header("Content-Type", ct)
            .send(bytes),
        _ => agent.get(url).header("Authorization", &auth).call(),
    };
    let mut resp = resp.unwrap();
    let status = resp.status().as_u16();
    (status, resp.body_mut().read_to_vec().unwrap_or_default())
}

/// The answer text and the cited documents of a short greedy chat.
fn chat(base: &str, token: &str, question: &str) -> (String, Value) {
    let (status, body) = http(
        "POST",
        &format!("{base}/v1/chat/completions"),
        token,
        Some(json!({
            "model": "airlock-small",
            "messages": [{"role": "user", "content": question}],
            "max_tokens": 16,
            "temperature": 0,
        })),
    );
    assert_eq!(status, 200, "{body}");
    let cited: Vec<&Value> = body["airlock"]["citations"]
        .as_array()
        .map(|c| c.iter().map(|c| &c["doc_id"]).collect())
        .unwrap_or_default();
    (
        body["choices"][0]["message"]["content"]
            .as_str()
            .unwrap()
            .to_owned(),
        json!(cited),
    )
}

/// (doc id, chunk id, score) of a retrieve, in order.
fn retrieve(base: &str, token: &str, query: &str) -> Vec<(String, u64, f64)> {
    let (status, body) = http(
        "POST",
        &format!("{base}/v1/retrieve"),
        token,
        Some(json!({"query": query, "top_k": 5})),
    );
    assert_eq!(status, 200, "{body}");
    body["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["doc_id"].as_str().unwrap().to_owned(),
                r["chunk_id"].as_u64().unwrap_or(0),
                r["score"].as_f64().unwrap(),
            )
        })
        .collect()
}

#[test]
fn a_backup_taken_while_serving_and_writing_restores_to_a_daemon_that_answers_the_same() {
    let tmp = tempfile::tempdir().unwrap();
    let (data, admin) = installed(tmp.path());
    let mut daemon = Daemon::start(&data, &[]);
    daemon.wait_ready();
    let base = daemon.base.clone();
    for (i, text) in TOPICS.iter().enumerate() {
        put_doc(&base, &admin, &format!("policy-{i}"), text, "staff");
    }
    let approver = approver_of(&data);
    let ann = user_token(&base, &admin, &approver, "ann", "staff");
    // A document uploaded as a file: its original is in the backup too.
    let csv = std::fs::read(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../extract/tests/fixtures/branches.csv"),
    )
    .unwrap();
    let (status, body) = raw(
        "PUT",
        &format!("{base}/v1/documents/branches.csv"),
        &admin,
        Some(("text/csv", &csv)),
    );
    assert_eq!(status, 201, "{}", String::from_utf8_lossy(&body));
    let (status, body) = http(
        "PUT",
        &format!("{base}/v1/acl/documents/branches.csv"),
        &admin,
        Some(json!({"users": [], "groups": ["staff"]})),
    );
    assert_eq!(status, 200, "{body}");
    let queries = [
        "what is the overdraft limit",
        "when does the Rotterdam branch open",
        "second approver for transfers",
    ];
    let before: Vec<_> = queries.iter().map(|q| retrieve(&base, &ann, q)).collect();
    assert!(before.iter().all(|r| !r.is_empty()), "{before:?}");
    let question = "What is the overdraft limit for retail customers?";
    let answer = chat(&base, &ann, question);
    assert!(!answer.0.trim().is_empty(), "{answer:?}");

    // Another client keeps writing documents ann cannot read while the backup runs: the
    // backup waits for each write's lock, and the copy is at one point of that stream.
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let (stop, base, admin) = (stop.clone(), base.clone(), admin.clone());
        std::thread::spawn(move || {
            let mut n = 0;
            while !stop.load(Ordering::Relaxed) {
                put_doc(
                    &base,
                    &admin,
                    &format!("late-{n}"),
                    &format!("Late note {n}: {}", TOPICS[n % TOPICS.len()]),
                    "board",
                );
                n += 1;
            }
            n
        })
    };
    std::thread::sleep(Duration::from_millis(500));
    let archive = tmp.path().join("backup.tar.zst");
    let out = airlock(&[
        "backup",
        "--data",
        data.to_str().unwrap(),
        "--out",
        archive.to_str().unwrap(),
    ]);
    stop.store(true, Ordering::Relaxed);
    let written = writer.join().unwrap();
    assert!(out.status.success());
    assert!(written > 0, "the concurrent writer wrote nothing");
    let report = String::from_utf8_lossy(&out.stderr);
    assert!(
        report.contains("left out the private key keys/appliance.key"),
        "{report}"
    );
    // The source keeps serving the same answers.
    for (q, want) in queries.iter().zip(&before) {
        assert_eq!(&retrieve(&base, &ann, q), want);
    }
    daemon.stop();

    // Restore onto a fresh data directory and serve it.
    let fresh = tmp.path().join("restored");
    let out = airlock(&[
        "restore",
        "--from",
        archive.to_str().unwrap(),
        "--data",
        fresh.to_str().unwrap(),
    ]);
    assert!(out.status.success());
    assert!(!fresh.join("keys/appliance.key").exists());
    assert!(fresh.join("keys/trusted.json").is_file());
    let mut restored = Daemon::start(&fresh, &[]);
    restored.wait_ready();
    let rbase = restored.base.clone();
    for (q, want) in queries.iter().zip(&before) {
        assert_eq!(&retrieve(&rbase, &ann, q), want, "{q}");
    }
    // The original file came back with its document.
    let (status, body) = raw(
        "GET",
        &format!("{rbase}/v1/documents/branches.csv/file"),
        &ann,
        None,
    );
    assert_eq!((status, body), (200, csv));
    // And chat answers the same (greedy decoding, same sources).
    assert_eq!(chat(&rbase, &ann, question), answer);
    // Every late document the restored store has is found by its index: the database and the
    // indexes were copied at the same point, so start-up repaired nothing.
    let bo = user_token(&rbase, &admin, &approver, "bo", "board");
    let mut restored_late = 0;
    for n in 0..written {
        let (status, _) = http(
            "GET",
            &format!("{rbase}/v1/documents/late-{n}"),
            &admin,
            None,
        );
        if status != 200 {
            continue;
        }
        restored_late += 1;
        let hits = retrieve(&rbase, &bo, &format!("Late note {n}"));
        assert!(
            hits.iter().any(|(d, _, _)| *d == format!("late-{n}")),
            "late-{n} is in the restored store but not found: {hits:?}"
        );
    }
    let logs = restored.stop();
    assert!(
        !logs.contains("repaired indexes"),
        "the restored indexes missed committed chunks:\n{logs}"
    );
    eprintln!("{restored_late} of {written} concurrent writes were in the backup");
}

/// Every file below `dir` with its content.
fn contents(dir: &Path) -> BTreeMap<PathBuf, Vec<u8>> {
    let mut out = BTreeMap::new();
    if !dir.exists() {
        return out;
    }
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                stack.push(p);
            } else {
                out.insert(p.clone(), std::fs::read(&p).unwrap());
            }
        }
    }
    out
}

#[test]
fn a_damaged_backup_is_refused_by_name_and_the_target_is_unchanged() {
    let tmp = tempfile::tempdir().unwrap();
    let (data, _admin) = installed(tmp.path());
    let archive = tmp.path().join("b.tar.zst");
    let out = airlock(&[
        "backup",
        "--data",
        data.to_str().unwrap(),
        "--out",
        archive.to_str().unwrap(),
        "--no-bundles",
    ]);
    assert!(out.status.success());
    // A backup file is never overwritten.
    let again = airlock(&[
        "backup",
        "--data",
        data.to_str().unwrap(),
        "--out",
        archive.to_str().unwrap(),
    ]);
    assert!(!again.status.success());
    let good = std::fs::read(&archive).unwrap();

    // A non-empty target is refused without --force, and left alone.
    let target = tmp.path().join("target");
    std::fs::create_dir_all(target.join("keep")).unwrap();
    std::fs::write(target.join("keep/file"), b"operator's file").unwrap();
    let before = contents(&target);
    let out = airlock(&[
        "restore",
        "--from",
        archive.to_str().unwrap(),
        "--data",
        target.to_str().unwrap(),
    ]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("not empty"));
    assert_eq!(contents(&target), before);

    // One byte flipped, at several places: refused with --force too, the target unchanged, no
    // staging directory left behind.
    for at in [good.len() / 3, good.len() / 2, good.len() - 20] {
        let mut bad = good.clone();
        bad[at] ^= 0x40;
        let bad_path = tmp.path().join(format!("bad-{at}.tar.zst"));
        std::fs::write(&bad_path, &bad).unwrap();
        let out = airlock(&[
            "restore",
            "--from",
            bad_path.to_str().unwrap(),
            "--data",
            target.to_str().unwrap(),
            "--force",
        ]);
        assert!(!out.status.success(), "flip at {at} accepted");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains(&format!("refusing to restore {}", bad_path.display()))
                && err.contains("damaged"),
            "{err}"
        );
        assert_eq!(contents(&target), before, "flip at {at} changed the target");
        let fresh = tmp.path().join(format!("fresh-{at}"));
        let out = airlock(&[
            "restore",
            "--from",
            bad_path.to_str().unwrap(),
            "--data",
            fresh.to_str().unwrap(),
        ]);
        assert!(!out.status.success());
        assert!(
            !fresh.exists(),
            "a refused restore created {}",
            fresh.display()
        );
        let leftovers: Vec<_> = std::fs::read_dir(tmp.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.contains(".restore-"))
            .collect();
        assert_eq!(leftovers, Vec::<String>::new());
    }

    // The good archive restores with --force; the old contents are moved aside, not deleted.
    let out = airlock(&[
        "restore",
        "--from",
        archive.to_str().unwrap(),
        "--data",
        target.to_str().unwrap(),
        "--force",
    ]);
    assert!(out.status.success());
    assert!(target.join("airlock.db").is_file());
    assert!(!target.join("bundles").exists(), "--no-bundles");
    let aside: Vec<_> = std::fs::read_dir(tmp.path())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.to_string_lossy().contains("target.pre-restore-"))
        .collect();
    assert_eq!(aside.len(), 1);
    assert_eq!(
        std::fs::read(aside[0].join("keep/file")).unwrap(),
        b"operator's file"
    );

    // --include-keys: the appliance key travels, owner-only.
    let with_keys = tmp.path().join("k.tar.zst");
    let out = airlock(&[
        "backup",
        "--data",
        data.to_str().unwrap(),
        "--out",
        with_keys.to_str().unwrap(),
        "--no-bundles",
        "--include-keys",
    ]);
    assert!(out.status.success());
    let k = tmp.path().join("with-keys");
    assert!(
        airlock(&[
            "restore",
            "--from",
            with_keys.to_str().unwrap(),
            "--data",
            k.to_str().unwrap()
        ])
        .status
        .success()
    );
    assert_eq!(
        std::fs::read(k.join("keys/appliance.key")).unwrap(),
        std::fs::read(data.join("keys/appliance.key")).unwrap()
    );
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(k.join("keys/appliance.key"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600);
}
