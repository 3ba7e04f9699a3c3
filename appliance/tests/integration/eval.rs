//! `airlock eval` end to end: the real CLI owns a real daemon (signed bundle with MiniLM and
//! SmolLM2, real socket) on a scratch data directory, runs the `mini` fixture set through every
//! phase, writes the reports, and the gate passes against a baseline made from that report and
//! refuses a report whose metric fell below it. (The leak detector itself is proven against a
//! deliberately leaking fake daemon in the airlock-eval crate's tests.)

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Instant, SystemTime};

use airlock_eval::gate::{HEADLINE, Report};

use crate::support::airlock_cli as airlock;
use crate::support::small_staging;

const BIN: &str = env!("CARGO_BIN_EXE_airlock");

fn mini_set() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../golden-sets/fixtures/mini")
}

/// Every file under `dir` with its size and modification time.
fn listing(dir: &Path) -> BTreeMap<PathBuf, (u64, SystemTime)> {
    let mut out = BTreeMap::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let e = e.unwrap();
            let m = e.metadata().unwrap();
            if m.is_dir() {
                stack.push(e.path());
            } else {
                out.insert(e.path(), (m.len(), m.modified().unwrap()));
            }
        }
    }
    out
}

/// An installed appliance (demo key, signed bundle of the small models), no documents.
pub(crate) fn installed_appliance(dir: &Path) -> PathBuf {
    let staging = dir.join("staging");
    small_staging(&staging);
    let data = dir.join("data");
    let out = airlock(&[
        "demo",
        "--data",
        data.to_str().unwrap(),
        "--setup-only",
        "--no-sample-data",
        "--staging",
        staging.to_str().unwrap(),
    ]);
    assert!(out.status.success());
    data
}

#[test]
fn owned_daemon_runs_the_mini_set_and_the_gate_decides() {
    let tmp = tempfile::tempdir().unwrap();
    let data = installed_appliance(tmp.path());
    let before = listing(&data);
    let out_dir = tmp.path().join("eval-out");
    let set = mini_set();
    // The operator's settings reach the owned daemon: one chunk per prompt keeps the small
    // model's prefill short in a debug build; a loaded 2-core machine needs a long timeout.
    let config = tmp.path().join("airlock.toml");
    std::fs::write(
        &config,
        format!(
            "data = {:?}\ntop_k = 1\nrequest_timeout_secs = 900\n",
            data.to_str().unwrap()
        ),
    )
    .unwrap();
    let t = Instant::now();
    let out = airlock(&[
        "eval",
        "run",
        "--set",
        set.to_str().unwrap(),
        "--config",
        config.to_str().unwrap(),
        "--out",
        out_dir.to_str().unwrap(),
        "--answer-cases",
        "1",
        "--max-tokens",
        "8",
        "--plain-baseline",
        "--plain-top-k",
        "1",
    ]);
    eprintln!("eval run took {:.1} s", t.elapsed().as_secs_f64());
    assert!(out.status.success());
    assert_eq!(
        listing(&data),
        before,
        "the eval must not write to the appliance's data directory"
    );
    assert!(
        !out_dir.join("scratch-data").exists(),
        "the scratch data directory is removed after the run"
    );

    // The JSON report: every case, every phase and kind, no leak.
    let report_path = out_dir.join("report.json");
    let report: Report = serde_json::from_slice(&std::fs::read(&report_path).unwrap()).unwrap();
    assert_eq!(report.set, "mini");
    assert_eq!(report.bundle_version.as_deref(), Some("0.1.0"));
    assert_eq!(
        report.rung,
        Some(0),
        "the owned daemon's ladder is off: rung 0"
    );
    assert_eq!(report.leaks(), 0, "{:#?}", report.cases);
    assert!(report.cases.iter().all(|c| c.leaks.is_empty()));
    // golden.jsonl's 19 cases and followups.jsonl's 2 (asked after their history).
    assert_eq!(report.overall.cases, 21);
    let phases: Vec<(&str, usize)> = report
        .per_phase
        .iter()
        .map(|(p, s)| (p.as_str(), s.cases))
        .collect();
    assert_eq!(phases, [("after_delete", 2), ("v1", 15), ("v2", 4)]);
    let kinds: Vec<&str> = report.per_kind.keys().map(String::as_str).collect();
    assert_eq!(
        kinds,
        [
            "acl_denied",
            "acl_granted",
            "acl_revoked",
            "answerable",
            "deleted",
            "follow_up",
            "multi_doc",
            "near_duplicate"
        ]
    );
    // The follow-ups: the first retrieves its document from the conversation, the second
    // (about a document the user may not read) leaks nothing.
    let fu: Vec<_> = report
        .cases
        .iter()
        .filter(|c| c.id.starts_with("mini-fu-"))
        .collect();
    assert_eq!(fu.len(), 2);
    assert!(fu.iter().all(|c| c.leaks.is_empty()), "{fu:#?}");

    // Metrics: in [0, 1], intervals bracket the mean, and the overall numbers agree with the
    // per-case scores and with the per-phase summaries.
    let summaries = std::iter::once(&report.overall)
        .chain(report.per_phase.values())
        .chain(report.per_kind.values());
    for s in summaries {
        for (name, e) in &s.metrics {
            assert!(
                (0.0..=1.0).contains(&e.lo) && e.lo <= e.mean && e.mean <= e.hi && e.hi <= 1.0,
                "{name}: {e:?}"
            );
            assert!(e.n > 0 && e.n <= s.cases, "{name}: {e:?}");
        }
    }
    for name in HEADLINE {
        let Some(overall) = report.overall.metrics.get(name) else {
            continue;
        };
        let n: usize = report
            .per_phase
            .values()
            .filter_map(|s| s.metrics.get(name).map(|e| e.n))
            .sum();
        let weighted: f64 = report
            .per_phase
            .values()
            .filter_map(|s| s.metrics.get(name).map(|e| e.mean * e.n as f64))
            .sum();
        assert_eq!(n, overall.n, "{name}");
        assert!((weighted / n as f64 - overall.mean).abs() < 1e-9, "{name}");
    }
    let recalls: Vec<f64> = report.cases.iter().filter_map(|c| c.recall_10).collect();
    assert_eq!(recalls.len(), 12, "cases with relevant documents");
    let mean = recalls.iter().sum::<f64>() / recalls.len() as f64;
    assert!((report.overall.metrics["recall_10"].mean - mean).abs() < 1e-9);
    assert!(
        mean >= 0.8,
        "14 short documents, 10 chunks retrieved: the relevant ones are found ({mean})"
    );
    // Answers were asked for the first case of each phase only.
    let answered: Vec<&str> = report
        .cases
        .iter()
        .filter(|c| c.answer_hit.is_some() || c.abstained.is_some())
        .map(|c| c.id.as_str())
        .collect();
    assert_eq!(
        answered,
        ["mini-01", "mini-14", "mini-16", "mini-18"],
        "one answer per phase, plus the refused removed user (mini-16)"
    );
    // The plain baseline answered the same cases, through the same access control.
    let plain = report.plain_baseline.as_ref().expect("--plain-baseline");
    let plain_ids: Vec<&str> = plain.cases.iter().map(|c| c.id.as_str()).collect();
    assert_eq!(
        plain_ids,
        ["mini-01", "mini-14", "mini-18"],
        "the baseline answers the cases sampled for answers"
    );
    assert_eq!(plain.leaks(), 0, "{:#?}", plain.cases);
    for c in plain.cases.iter().chain(&report.cases) {
        if c.answer_words.is_some() {
            assert!(
                c.invented_values.is_some(),
                "the shown sources' texts are known on both paths: {c:#?}"
            );
        }
    }
    let removed = report.cases.iter().find(|c| c.id == "mini-16").unwrap();
    assert_eq!(
        removed.abstained,
        Some(true),
        "u5 was removed in v2: its token is refused"
    );
    assert!(report.latency_ms.contains_key("chat.total"));
    for stage in ["chat.first_token", "chat.prefill", "chat.decode"] {
        assert!(
            report.latency_ms.contains_key(stage),
            "the owned daemon's stage timings give the generation's {stage}"
        );
    }
    assert!(report.latency_ms.keys().any(|k| k.starts_with("retrieve.")));

    // Markdown and self-contained HTML.
    let md = std::fs::read_to_string(out_dir.join("report.md")).unwrap();
    eprintln!("{md}");
    assert!(md.contains("mini") && md.contains("recall_10"), "{md}");
    assert!(md.contains("Beside the plain baseline"), "{md}");
    let html = std::fs::read_to_string(out_dir.join("report.html")).unwrap();
    assert!(html.contains("<svg"), "plots are inline SVG");
    assert!(!html.contains("src=\"http"), "no external assets");

    // The gate: a baseline from this report passes; a metric forced below it fails (exit 1).
    let baseline = tmp.path().join("baseline.json");
    let b = airlock(&[
        "eval",
        "baseline",
        "--report",
        report_path.to_str().unwrap(),
        "--out",
        baseline.to_str().unwrap(),
    ]);
    assert!(b.status.success());
    let pass = airlock(&[
        "eval",
        "gate",
        "--baseline",
        baseline.to_str().unwrap(),
        "--report",
        report_path.to_str().unwrap(),
    ]);
    assert_eq!(pass.status.code(), Some(0));
    assert!(String::from_utf8_lossy(&pass.stdout).starts_with("PASS"));

    let mut worse: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&report_path).unwrap()).unwrap();
    let m = &mut worse["overall"]["metrics"]["recall_10"]["mean"];
    *m = serde_json::json!(m.as_f64().unwrap() - 0.05);
    let worse_path = tmp.path().join("worse.json");
    std::fs::write(&worse_path, serde_json::to_vec(&worse).unwrap()).unwrap();
    let fail = airlock(&[
        "eval",
        "gate",
        "--baseline",
        baseline.to_str().unwrap(),
        "--report",
        worse_path.to_str().unwrap(),
    ]);
    assert_eq!(fail.status.code(), Some(1));
    let verdict = String::from_utf8_lossy(&fail.stdout);
    assert!(
        verdict.starts_with("FAIL") && verdict.contains("recall_10 fell"),
        "{verdict}"
    );
}

/// `--rung all`: the phased run at rung 0, then every rung 0-3 scored on the same final-state
/// cases, one report per rung and a table whose rows all cover the same cases.
#[test]
fn rung_sweep_scores_every_rung_on_the_same_cases() {
    let tmp = tempfile::tempdir().unwrap();
    let data = installed_appliance(tmp.path());
    let out_dir = tmp.path().join("sweep");
    let config = tmp.path().join("airlock.toml");
    std::fs::write(
        &config,
        format!(
            "data = {:?}\nrequest_timeout_secs = 900\n",
            data.to_str().unwrap()
        ),
    )
    .unwrap();
    let out = airlock(&[
        "eval",
        "run",
        "--set",
        mini_set().to_str().unwrap(),
        "--config",
        config.to_str().unwrap(),
        "--out",
        out_dir.to_str().unwrap(),
        "--rung",
        "all",
        "--no-answers",
    ]);
    assert!(out.status.success());
    let read =
        |p: PathBuf| -> Report { serde_json::from_slice(&std::fs::read(p).unwrap()).unwrap() };
    let phased = read(out_dir.join("rung-0/report.json"));
    assert_eq!(phased.overall.cases, 21, "rung 0 walks every phase");
    let rows: Vec<Report> = std::iter::once(read(out_dir.join("rung-0/final-state/report.json")))
        .chain((1..=3).map(|r| read(out_dir.join(format!("rung-{r}/report.json")))))
        .collect();
    let ids = |r: &Report| -> Vec<String> { r.cases.iter().map(|c| c.id.clone()).collect() };
    for (rung, r) in rows.iter().enumerate() {
        assert_eq!(r.rung, Some(rung as u8));
        assert_eq!(r.leaks(), 0, "rung {rung}");
        assert_eq!(ids(r), ids(&rows[0]), "rung {rung} scored other cases");
        assert!(r.overall.cases > 0 && r.overall.cases < 21);
    }
    let table = std::fs::read_to_string(out_dir.join("rungs.md")).unwrap();
    assert!(
        table.starts_with("Cases valid in the set's final state"),
        "{table}"
    );
    for rung in 0..=3 {
        assert!(
            table.contains(&format!("\n| {rung} | {} | 0 |", rows[0].overall.cases)),
            "{table}"
        );
    }
    assert!(out_dir.join("rungs.html").is_file());
}

#[test]
fn owned_daemon_refuses_a_data_dir_without_a_bundle_and_leaves_it_alone() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("empty");
    std::fs::create_dir_all(&data).unwrap();
    let out = airlock(&[
        "eval",
        "run",
        "--set",
        mini_set().to_str().unwrap(),
        "--data",
        data.to_str().unwrap(),
        "--out",
        tmp.path().join("out").to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("no bundle is installed"), "{err}");
    assert!(listing(&data).is_empty(), "nothing written to the data dir");

    // --against needs --tokens (usage error, exit 2); --tokens needs --against.
    let usage = airlock(&[
        "eval",
        "run",
        "--set",
        "x",
        "--against",
        "http://127.0.0.1:9",
    ]);
    assert_eq!(usage.status.code(), Some(2));
    let usage = airlock(&["eval", "run", "--set", "x", "--tokens", "t.json"]);
    assert_eq!(usage.status.code(), Some(2));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn against_an_operators_daemon_with_given_tokens() {
    // An operator's appliance on a real socket; the runner gets only the admin token and
    // creates the set's users from its IAM snapshots through the admin API.
    let app = crate::support::TestApp::new();
    let served = app.serve().await;
    let tmp = tempfile::tempdir().unwrap();
    let tokens = tmp.path().join("tokens.json");
    std::fs::write(
        &tokens,
        serde_json::to_vec(&serde_json::json!({"admin": app.admin})).unwrap(),
    )
    .unwrap();
    let out_dir = tmp.path().join("out");
    let args: Vec<String> = [
        "eval",
        "run",
        "--set",
        mini_set().to_str().unwrap(),
        "--against",
        &served.base,
        "--tokens",
        tokens.to_str().unwrap(),
        "--out",
        out_dir.to_str().unwrap(),
        "--no-answers",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let out = tokio::task::spawn_blocking(move || {
        airlock(&args.iter().map(String::as_str).collect::<Vec<_>>())
    })
    .await
    .unwrap();
    assert!(out.status.success());
    let report: Report =
        serde_json::from_slice(&std::fs::read(out_dir.join("report.json")).unwrap()).unwrap();
    assert_eq!(report.leaks(), 0);
    assert_eq!(report.overall.cases, 21);
    assert_eq!(report.rung, None, "an operator's daemon chooses its rung");
    assert_eq!(report.bundle_version.as_deref(), Some("1.0.0-test"));
    assert!(
        report.cases.iter().all(|c| c.answer_hit.is_none()),
        "--no-answers measures no answers"
    );
    // The set's users now exist on the operator's daemon, and the removed one is gone.
    let acl = &app.state.services().unwrap().acl;
    assert!(acl.user("u1").is_some() && acl.user("ext1").is_some());
    assert!(acl.user("u5").is_none(), "u5 is not in iam_v2");
    served.shutdown().await;
}

#[test]
fn sigterm_stops_an_owned_run_without_a_report_and_cleans_up() {
    use std::io::{BufRead, BufReader};
    use std::process::Stdio;
    use std::time::Duration;

    let tmp = tempfile::tempdir().unwrap();
    let data = installed_appliance(tmp.path());
    let out_dir = tmp.path().join("eval-out");
    let scratch = tmp.path().join("scratch");
    // Every case answered with long answers: the run would take many minutes.
    let mut child = Command::new(BIN)
        .args(["eval", "run", "--set"])
        .arg(mini_set())
        .arg("--data")
        .arg(&data)
        .arg("--scratch")
        .arg(&scratch)
        .arg("--out")
        .arg(&out_dir)
        .args(["--max-tokens", "256"])
        .env_remove("AIRLOCK_DATA")
        .env_remove("AIRLOCK_CONFIG")
        .env_remove("AIRLOCK_LOG")
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = BufReader::new(child.stderr.take().unwrap());
    let (tx, rx) = std::sync::mpsc::channel();
    let reader = std::thread::spawn(move || {
        let mut all = String::new();
        for line in stderr.lines().map_while(Result::ok) {
            if line.contains("owned daemon ready") {
                let _ = tx.send(());
            }
            all.push_str(&line);
            all.push('\n');
        }
        all
    });
    rx.recv_timeout(Duration::from_secs(600))
        .expect("the owned daemon became ready");
    // Let the runner get into the cases (ingest, first answers), then stop it.
    std::thread::sleep(Duration::from_secs(3));
    let t = Instant::now();
    let kill = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(kill.success());
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        assert!(
            t.elapsed() < Duration::from_secs(120),
            "SIGTERM must stop the run (drain grace 30 s)"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    let stderr = reader.join().unwrap();
    eprintln!("{stderr}");
    assert!(!status.success(), "an interrupted run is not a pass");
    assert!(
        stderr.contains("the run was stopped before every case ran"),
        "the error says the run was interrupted"
    );
    assert!(
        !out_dir.join("report.json").exists(),
        "no report for a run that did not finish"
    );
    assert!(!scratch.exists(), "the scratch data directory is removed");
}

/// A set given as files (`docs/`, as the real-document sets in golden-sets/real are): the runner
/// ingests each file as it is (HTML, and a PDF in a subfolder whose id keeps its `/`), the
/// grants come from `iam_v1.jsonl`, and the daemon's own extractor reads them.
#[test]
fn owned_daemon_ingests_a_set_given_as_files() {
    let tmp = tempfile::tempdir().unwrap();
    let data = installed_appliance(tmp.path());
    let set = tmp.path().join("files-set");
    std::fs::create_dir_all(set.join("docs/reports")).unwrap();
    std::fs::write(
        set.join("docs/ports.html"),
        "<html><head><title>Ports</title></head><body><nav>Prev | Up | Next</nav>\
         <h1>Listening ports</h1><p>The relay daemon listens on port 4711 unless \
         <code>--listen</code> names another.</p></body></html>",
    )
    .unwrap();
    std::fs::copy(
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../extract/tests/fixtures/plain.pdf"),
        set.join("docs/reports/sextant.pdf"),
    )
    .unwrap();
    // A folder ingest's grants file is not a document.
    std::fs::write(
        set.join("docs/.acl.jsonl"),
        "{\"path\": \"*\", \"groups\": [\"ops\"]}\n",
    )
    .unwrap();
    let iam = "{\"user\": \"u1\", \"groups\": [\"ops\"]}\n{\"user\": \"u2\", \"groups\": [\"risk\"]}\n\
               {\"doc\": \"ports.html\", \"users\": [], \"groups\": [\"ops\"]}\n\
               {\"doc\": \"reports/sextant.pdf\", \"users\": [], \"groups\": [\"risk\"]}\n";
    std::fs::write(set.join("iam_v1.jsonl"), iam).unwrap();
    std::fs::write(set.join("iam_v2.jsonl"), iam).unwrap();
    std::fs::write(set.join("corpus.jsonl"), "").unwrap();
    std::fs::write(set.join("deletions.json"), "[]").unwrap();
    let case = |id: &str, user: &str, query: &str, relevant: &str, forbidden: &str| {
        serde_json::json!({"id": id, "user": user, "query": query,
            "relevant_doc_ids": [relevant], "answer_contains": [],
            "forbidden_doc_ids": [forbidden], "forbidden_strings": [],
            "phase": "v1", "kind": "answerable", "valid_phases": ["v1", "v2", "after_delete"]})
        .to_string()
    };
    std::fs::write(
        set.join("golden.jsonl"),
        format!(
            "{}\n{}\n",
            case(
                "f-1",
                "u1",
                "Which port does the relay daemon listen on?",
                "ports.html",
                "reports/sextant.pdf"
            ),
            case(
                "f-2",
                "u2",
                "How often are SextantBridge backups restored in a test environment?",
                "reports/sextant.pdf",
                "ports.html"
            ),
        ),
    )
    .unwrap();
    let out_dir = tmp.path().join("eval-out");
    let out = airlock(&[
        "eval",
        "run",
        "--set",
        set.to_str().unwrap(),
        "--data",
        data.to_str().unwrap(),
        "--out",
        out_dir.to_str().unwrap(),
        "--no-answers",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: Report =
        serde_json::from_slice(&std::fs::read(out_dir.join("report.json")).unwrap()).unwrap();
    assert_eq!(report.leaks(), 0, "{:#?}", report.cases);
    for c in &report.cases {
        assert_eq!(
            c.recall_10,
            Some(1.0),
            "each user finds the file it may read: {c:#?}"
        );
    }
}
