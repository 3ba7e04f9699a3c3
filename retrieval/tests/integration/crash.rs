//! Crash repair with a real process killed by SIGKILL between the SQLite commit and the index
//! write. The test binary re-executes itself to run `crash_child`, which commits a batch and then
//! waits inside the progress callback (after `Committed`, before indexing) until it is killed.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

use airlock_retrieval::{DocumentInput, Progress, SearchMode, SearchRequest};

use crate::common::{allow_all, open_at, test_config};

const DIR_ENV: &str = "AIRLOCK_TEST_CRASH_DIR";
const MARK: &str = "AIRLOCK-CRASH-CHILD-COMMITTED";

fn docs(prefix: &str, n: usize) -> Vec<DocumentInput> {
    (0..n)
        .map(|i| {
            DocumentInput::new(
                format!("{prefix}{i}"),
                "",
                format!("{prefix} ledger entry {i} reconciled"),
            )
        })
        .collect()
}

/// Child side; does nothing unless started by `kill_between_commit_and_index_is_repaired`.
#[test]
#[ignore = "helper process of kill_between_commit_and_index_is_repaired"]
fn crash_child() {
    let Some(dir) = std::env::var_os(DIR_ENV) else {
        return;
    };
    let eng = open_at(std::path::Path::new(&dir), test_config());
    eng.upsert(docs("first", 5), &mut |_| {}).unwrap();
    eng.upsert(docs("second", 7), &mut |p| {
        if let Progress::Committed { .. } = p {
            println!("{MARK}");
            std::thread::sleep(std::time::Duration::from_secs(120));
        }
    })
    .unwrap();
}

#[test]
fn kill_between_commit_and_index_is_repaired() {
    let dir = tempfile::tempdir().unwrap();
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "crash::crash_child",
            "--exact",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(DIR_ENV, dir.path())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let mut seen = false;
    for line in BufReader::new(stdout).lines() {
        if line.unwrap().contains(MARK) {
            seen = true;
            break;
        }
    }
    assert!(seen, "child never reached the commit point");
    child.kill().unwrap(); // SIGKILL
    let status = child.wait().unwrap();
    assert!(!status.success());

    let eng = open_at(dir.path(), test_config());
    let rep = eng.last_repair();
    assert_eq!(rep.bm25_added, 7, "{rep:?}");
    assert_eq!(rep.vector_added, 7, "{rep:?}");
    let req = SearchRequest {
        query: "ledger reconciled",
        k: 50,
        mode: SearchMode::Bm25,
        rescore: false,
        rerank: false,
    };
    let r = eng.search(&req, &allow_all()).unwrap();
    assert_eq!(
        r.results.len(),
        12,
        "acknowledged = committed: both batches are searchable"
    );
    drop(eng);
    // Repair is idempotent: nothing left to do on the next open.
    let eng = open_at(dir.path(), test_config());
    assert_eq!(eng.last_repair(), &Default::default());
}
