//! `airlock ingest` killed with SIGKILL (issue 19). The real binary ingests 60 short documents
//! in batches of 8 with `--ack-file` and is killed at each ingest failpoint: embedded but not
//! committed, committed and acknowledged but not indexed, in BM25 but not in the vector index,
//! in the middle of a later batch; and once at an unannounced moment right after its third
//! acknowledgement. After restart (the stores opened as the daemon opens them, which repairs
//! the indexes) every acknowledged document is live with the acknowledged version, chunk count
//! and ordinal, its ACL ordinal is the document row's, BM25 finds exactly its chunks by its
//! canary word, the vector index holds each chunk once and a vector search finds it; every
//! other document is wholly present or wholly absent. Running the same ingest again completes
//! and leaves each document stored exactly once, acknowledged ones untouched.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use airlock::startup;
use airlock_acl::AllowSet;
use airlock_bundle::{BuildOptions, InstallOptions, NoProgress, Store};
use airlock_retrieval::vector::VectorIndex;
use airlock_retrieval::{RepairReport, SearchMode, SearchRequest};
use airlock_signing::{KeyPair, Keyring};
use roaring::RoaringBitmap;

use crate::support::{embedder, staging_of};

const BIN: &str = env!("CARGO_BIN_EXE_airlock");
const DOCS: usize = 60;
const BATCH: usize = 8;

/// A signed bundle with MiniLM only (all `airlock ingest` loads) and the keyring trusting it.
pub(crate) fn embedder_bundle(dir: &Path) -> (PathBuf, Keyring) {
    let staging = dir.join("staging");
    staging_of(&staging, &["minilm"]);
    let key = KeyPair::generate();
    let bundle = dir.join("embedder.tar.zst");
    airlock_bundle::build(
        &staging,
        &BuildOptions::new("airlock-test", "1.0.0".parse().unwrap()),
        &[&key],
        &bundle,
        &NoProgress,
    )
    .unwrap();
    (bundle, Keyring::new(1, &[key.public()]).unwrap())
}

/// A fresh data directory in `dir` with the keyring pinned and the bundle installed.
pub(crate) fn appliance(dir: &Path, bundle: &Path, keyring: &Keyring) -> PathBuf {
    let data = dir.join("data");
    std::fs::create_dir_all(data.join("keys")).unwrap();
    keyring.save(&data.join("keys/trusted.json")).unwrap();
    Store::open(&data)
        .unwrap()
        .install(bundle, keyring, &InstallOptions::default())
        .unwrap();
    data
}

fn doc_id(i: usize) -> String {
    format!("doc-{i:02}.txt")
}

/// A word that occurs in document `i` only (one BM25 term, which the stemmer leaves alone:
/// no suffix it strips ends in `x`).
fn canary(i: usize) -> String {
    format!(
        "zq{}{}x",
        (b'a' + (i / 26) as u8) as char,
        (b'a' + (i % 26) as u8) as char
    )
}

fn text(i: usize) -> String {
    format!("Crash report {i}: the {} ledger was reconciled.", canary(i))
}

/// The folder of `DOCS` text files; returns it.
fn corpus(dir: &Path) -> PathBuf {
    let folder = dir.join("corpus");
    std::fs::create_dir_all(&folder).unwrap();
    for i in 0..DOCS {
        std::fs::write(folder.join(doc_id(i)), text(i)).unwrap();
    }
    folder
}

fn ingest_cmd(data: &Path, folder: &Path, ack: &Path) -> Command {
    let mut c = Command::new(BIN);
    c.arg("ingest")
        .arg(folder)
        .args(["--batch", &BATCH.to_string(), "--data"])
        .arg(data)
        .arg("--ack-file")
        .arg(ack)
        .env_remove("AIRLOCK_DATA")
        .env_remove("AIRLOCK_KEYRING")
        .env_remove("AIRLOCK_FAILPOINT")
        .env_remove("AIRLOCK_LOG")
        .stdout(Stdio::null());
    c
}

/// One document of an acknowledgement line.
#[derive(Debug, Clone, serde::Deserialize)]
struct Acked {
    doc_id: String,
    ordinal: u32,
    version: String,
    chunks: usize,
    status: String,
}

/// One line of the acknowledgement file.
#[derive(Debug, serde::Deserialize)]
struct AckLine {
    path: PathBuf,
    batch: usize,
    documents: Vec<Acked>,
}

/// The complete lines of the acknowledgement file (a line cut short by the kill has no
/// newline and acknowledges nothing).
fn ack_lines(path: &Path) -> Vec<AckLine> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    text.split_inclusive('\n')
        .filter(|l| l.ends_with('\n'))
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("ack line {l:?}: {e}")))
        .collect()
}

/// How the ingest is stopped.
#[derive(Debug, Clone, Copy)]
enum Kill {
    /// At the failpoint (`AIRLOCK_FAILPOINT`), once the process reports it.
    At(&'static str),
    /// As soon as the acknowledgement file has this many complete lines.
    AfterAcks(usize),
}

/// Runs the ingest and SIGKILLs it as `how` says.
fn run_and_kill(mut cmd: Command, ack: &Path, how: Kill) {
    let mut child = match how {
        Kill::At(fp) => {
            let mut child = cmd
                .env("AIRLOCK_FAILPOINT", fp)
                .stderr(Stdio::piped())
                .spawn()
                .unwrap();
            let want = format!("failpoint {fp} reached");
            let mut seen = Vec::new();
            let reached = BufReader::new(child.stderr.take().unwrap())
                .lines()
                .map(Result::unwrap)
                .any(|line| {
                    seen.push(line);
                    seen.last().unwrap() == &want
                });
            assert!(
                reached,
                "{fp}: the ingest ended before its failpoint: {seen:?}"
            );
            child
        }
        Kill::AfterAcks(n) => {
            let mut child = cmd.stderr(Stdio::null()).spawn().unwrap();
            let t = Instant::now();
            while ack_lines(ack).len() < n {
                assert!(
                    child.try_wait().unwrap().is_none(),
                    "the ingest ended before {n} acknowledgements"
                );
                assert!(t.elapsed() < Duration::from_secs(600), "no progress");
                std::thread::sleep(Duration::from_millis(2));
            }
            child
        }
    };
    child.kill().unwrap(); // SIGKILL
    assert!(!child.wait().unwrap().success());
}

/// A live document as the stores hold it.
#[derive(Debug, Clone, PartialEq)]
struct Doc {
    ordinal: u32,
    version: String,
    chunk_count: usize,
    updated_at: i64,
    chunks: Vec<u32>,
}

/// Opens the stores as the daemon does (which repairs the indexes), checks that SQLite, the ACL
/// ordinals, BM25 and the vector index agree on every document, and returns the live documents
/// with what the open repaired.
fn open_and_check(data: &Path, label: &str) -> (BTreeMap<String, Doc>, RepairReport) {
    let retrieval = startup::open_retrieval(data, embedder()).unwrap();
    let repair = retrieval.last_repair().clone();
    let generation = retrieval.stats().index_generation;
    let acl = startup::open_acl(data).unwrap();

    // SQLite: every document row is live and has its chunk rows; every chunk row belongs to a
    // document; the shared ordinal table names exactly the stored documents, with their
    // ordinals (a document and its ordinal are written in one transaction).
    let conn = rusqlite::Connection::open(startup::db_path(data)).unwrap();
    let mut docs = BTreeMap::new();
    let mut by_ordinal = BTreeMap::new();
    let mut st = conn
        .prepare(
            "SELECT doc_id, ordinal, version, chunk_count, updated_at, deleted_at FROM documents",
        )
        .unwrap();
    let rows = st
        .query_map([], |r| {
            Ok((
                r.get::<_, String>(0)?,
                r.get::<_, u32>(1)?,
                r.get::<_, String>(2)?,
                r.get::<_, i64>(3)?,
                r.get::<_, i64>(4)?,
                r.get::<_, Option<i64>>(5)?,
            ))
        })
        .unwrap();
    for row in rows {
        let (id, ordinal, version, chunk_count, updated_at, deleted_at) = row.unwrap();
        assert_eq!(deleted_at, None, "{label}: {id} tombstoned");
        by_ordinal.insert(ordinal, id.clone());
        docs.insert(
            id,
            Doc {
                ordinal,
                version,
                chunk_count: chunk_count as usize,
                updated_at,
                chunks: Vec::new(),
            },
        );
    }
    let mut all_chunks = Vec::new();
    let mut st = conn
        .prepare("SELECT id, doc_ordinal FROM chunks ORDER BY id")
        .unwrap();
    for row in st
        .query_map([], |r| Ok((r.get::<_, u32>(0)?, r.get::<_, u32>(1)?)))
        .unwrap()
    {
        let (chunk, ordinal) = row.unwrap();
        let id = by_ordinal.get(&ordinal).unwrap_or_else(|| {
            panic!("{label}: chunk {chunk} of ordinal {ordinal} has no document")
        });
        docs.get_mut(id).unwrap().chunks.push(chunk);
        all_chunks.push(chunk);
    }
    let ordinals: BTreeMap<String, u32> = conn
        .prepare("SELECT doc_id, ordinal FROM doc_ordinals")
        .unwrap()
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
        .unwrap()
        .map(Result::unwrap)
        .collect();
    let doc_ordinals: BTreeMap<String, u32> =
        docs.iter().map(|(id, d)| (id.clone(), d.ordinal)).collect();
    assert_eq!(ordinals, doc_ordinals, "{label}: doc_ordinals vs documents");
    let mut allow = RoaringBitmap::new();
    for (id, d) in &docs {
        assert!(
            d.chunk_count > 0 && d.chunks.len() == d.chunk_count,
            "{label}: {id} has {} chunk rows, chunk_count {}",
            d.chunks.len(),
            d.chunk_count
        );
        assert_eq!(acl.ordinal(id).unwrap(), Some(d.ordinal), "{label}: {id}");
        allow.insert(d.ordinal);
    }
    let allow = AllowSet::from_bitmap_for_tests(allow);

    // BM25: each document's canary finds exactly its chunks (an entry indexed twice would be
    // returned twice); a word of every document finds every chunk exactly once.
    let search = |query: &str, k: usize, mode: SearchMode| {
        let req = SearchRequest {
            query,
            k,
            mode,
            rescore: mode != SearchMode::Bm25,
            rerank: false,
        };
        retrieval.search(&req, &allow).unwrap().results
    };
    for (id, d) in &docs {
        let i: usize = id[4..6].parse().unwrap();
        let hits = search(&canary(i), 10, SearchMode::Bm25);
        let mut found: Vec<u32> = hits.iter().map(|h| h.chunk_id).collect();
        found.sort_unstable();
        assert_eq!(found, d.chunks, "{label}: BM25 for {id}: {hits:?}");
        assert!(
            hits.iter()
                .all(|h| h.doc_id == *id && h.doc_ordinal == d.ordinal)
        );
        // Vector: the document's own text finds it first.
        let hits = search(&text(i), 3, SearchMode::Vector);
        assert_eq!(
            hits.first().map(|h| h.doc_id.as_str()),
            Some(id.as_str()),
            "{label}: vector search for {id}: {hits:?}"
        );
    }
    if !docs.is_empty() {
        let mut found: Vec<u32> = search("ledger reconciled", 1000, SearchMode::Bm25)
            .iter()
            .map(|h| h.chunk_id)
            .collect();
        found.sort_unstable();
        assert_eq!(found, all_chunks, "{label}: BM25 holds every chunk once");
    }
    drop(acl);
    assert_eq!(std::sync::Arc::strong_count(&retrieval), 1);
    drop(retrieval); // closes the vector index (checkpoint)

    // The vector index holds every chunk exactly once, and nothing else.
    let vectors = VectorIndex::open(
        &startup::index_root(data)
            .join(generation.to_string())
            .join("vector"),
    )
    .unwrap();
    let want: RoaringBitmap = all_chunks.iter().copied().collect();
    assert_eq!(vectors.ids(), want, "{label}: vector ids");
    assert_eq!(
        vectors.len(),
        all_chunks.len(),
        "{label}: a vector held twice"
    );
    (docs, repair)
}

/// The documents of the acknowledgement lines, checking that none is named twice.
fn acked_docs(lines: &[AckLine], folder: &Path) -> BTreeMap<String, Acked> {
    let mut out = BTreeMap::new();
    for (n, line) in lines.iter().enumerate() {
        assert_eq!(line.path, folder);
        assert!(
            n == 0 || line.batch > lines[n - 1].batch,
            "batch numbers rise"
        );
        for d in &line.documents {
            assert!(
                out.insert(d.doc_id.clone(), d.clone()).is_none(),
                "{} acknowledged twice",
                d.doc_id
            );
        }
    }
    out
}

/// One kill point: its name, how the ingest is stopped, how many documents are acknowledged
/// (at least) and, when exact, how many are stored after the kill; what the reopen must repair
/// (`None`: not predictable).
struct Point {
    name: &'static str,
    kill: Kill,
    acked: usize,
    exact: bool,
    repair: Option<fn(&[Acked]) -> RepairReport>,
}

fn no_repair(_: &[Acked]) -> RepairReport {
    RepairReport::default()
}

/// The last batch's chunks are in neither index.
fn both_missing(acked: &[Acked]) -> RepairReport {
    let n: usize = acked[acked.len() - BATCH..].iter().map(|a| a.chunks).sum();
    RepairReport {
        bm25_added: n as u64,
        bm25_removed: 0,
        vector_added: n as u64,
    }
}

/// The last batch's chunks are in BM25, not in the vector index.
fn vectors_missing(acked: &[Acked]) -> RepairReport {
    let n: usize = acked[acked.len() - BATCH..].iter().map(|a| a.chunks).sum();
    RepairReport {
        vector_added: n as u64,
        ..RepairReport::default()
    }
}

#[test]
fn ingest_killed_anywhere_keeps_every_acknowledged_document() {
    let started = Instant::now();
    let tmp = tempfile::tempdir().unwrap();
    let (bundle, keyring) = embedder_bundle(tmp.path());
    let folder = corpus(tmp.path());
    let points = [
        Point {
            name: "(a) during embedding, before any commit",
            kill: Kill::At("ingest-after-embed"),
            acked: 0,
            exact: true,
            repair: Some(no_repair),
        },
        Point {
            name: "(b) right after the first commit, before the index writes",
            kill: Kill::At("ingest-after-commit"),
            acked: BATCH,
            exact: true,
            repair: Some(both_missing),
        },
        Point {
            name: "(c) second batch between the BM25 and the vector writes",
            kill: Kill::At("ingest-after-bm25@2"),
            acked: 2 * BATCH,
            exact: true,
            repair: Some(vectors_missing),
        },
        Point {
            name: "(d) during the embedding of the fourth batch",
            kill: Kill::At("ingest-after-embed@4"),
            acked: 3 * BATCH,
            exact: true,
            repair: Some(no_repair),
        },
        Point {
            name: "(e) unannounced, right after the third acknowledgement",
            kill: Kill::AfterAcks(3),
            acked: 3 * BATCH,
            exact: false,
            repair: None,
        },
    ];
    for p in &points {
        let t = Instant::now();
        let dir = tmp
            .path()
            .join(p.name.split(' ').next().unwrap().trim_matches(['(', ')']));
        let data = appliance(&dir, &bundle, &keyring);
        let ack = dir.join("ingest.ack");
        run_and_kill(ingest_cmd(&data, &folder, &ack), &ack, p.kill);

        let lines = ack_lines(&ack);
        let acked = acked_docs(&lines, &folder);
        let acked_list: Vec<Acked> = lines.iter().flat_map(|l| l.documents.clone()).collect();
        if p.exact {
            assert_eq!(acked.len(), p.acked, "{}: acknowledged", p.name);
        } else {
            assert!(acked.len() >= p.acked, "{}: acknowledged", p.name);
        }
        let (after_kill, repair) = open_and_check(&data, p.name);
        if let Some(expect) = p.repair {
            assert_eq!(repair, expect(&acked_list), "{}: repair", p.name);
        }
        if p.exact {
            assert_eq!(after_kill.len(), p.acked, "{}: stored", p.name);
        }
        for (id, a) in &acked {
            let d = after_kill
                .get(id)
                .unwrap_or_else(|| panic!("{}: acknowledged {id} lost", p.name));
            assert_eq!(
                (d.ordinal, &d.version, d.chunk_count, a.status.as_str()),
                (a.ordinal, &a.version, a.chunks, "created"),
                "{}: {id}",
                p.name
            );
        }
        // The reopen left nothing to repair for the next one.
        let (again, repair) = open_and_check(&data, p.name);
        assert_eq!(
            repair,
            RepairReport::default(),
            "{}: repair is idempotent",
            p.name
        );
        assert_eq!(again, after_kill, "{}", p.name);

        // The same ingest again completes; what was stored is untouched, the rest is stored
        // (and acknowledged) once.
        let out = ingest_cmd(&data, &folder, &ack)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{}: re-run: {stdout}{}",
            p.name,
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(stdout.trim(), format!("{DOCS} documents stored, 0 refused"));
        let all_lines = ack_lines(&ack);
        let resumed = acked_docs(&all_lines[lines.len()..], &folder);
        let expect: BTreeSet<String> = (0..DOCS)
            .map(doc_id)
            .filter(|id| !after_kill.contains_key(id))
            .collect();
        assert_eq!(
            resumed.keys().cloned().collect::<BTreeSet<_>>(),
            expect,
            "{}: the re-run acknowledges exactly what was missing",
            p.name
        );
        let (done, repair) = open_and_check(&data, p.name);
        assert_eq!(repair, RepairReport::default(), "{}", p.name);
        assert_eq!(done.len(), DOCS, "{}", p.name);
        for (id, d) in &after_kill {
            assert_eq!(&done[id], d, "{}: {id} changed by the re-run", p.name);
        }
        for (id, a) in &resumed {
            let d = &done[id];
            assert_eq!(
                (d.ordinal, &d.version, d.chunk_count),
                (a.ordinal, &a.version, a.chunks),
                "{}: {id}",
                p.name
            );
        }
        eprintln!(
            "{}: {} acknowledged, {} stored after the kill, {:.1} s",
            p.name,
            acked.len(),
            after_kill.len(),
            t.elapsed().as_secs_f64()
        );
    }
    eprintln!(
        "ingest crash test: {:.1} s",
        started.elapsed().as_secs_f64()
    );
}
