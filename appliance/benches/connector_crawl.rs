//! The SMB connector against `airlock ingest DIR` on the same files, same box, same run (issue 43
//! targets): a real Samba AD DC on loopback serves N text files (default 10,000, in folders of
//! 100) readable by Domain Users; the real binary
//!
//! 1. ingests the local copy with `airlock ingest --data D DIR` (the peer: files per second),
//!    twice: with a permissions sidecar granting every file to a group (each document stored with
//!    its grant in its own transaction, as the connector stores them) and without one (ungranted
//!    documents written in batches, the fastest path);
//! 2. serves `D2` with the share as a `[[connectors]]` source: the first sync (a crawl of the
//!    whole share: listing, security descriptors, reads, extraction, embedding, storing);
//! 3. after 1% of the files change on the share, a sync (the incremental one);
//! 4. after a deny ACE for one user is added to 1% of the files, a sync: permission-only changes,
//!    shown to store nothing again (the documents' versions and update times unchanged).
//!
//! Prints the CPU model and flags, a table and, last, one JSON line. Needs root, Samba
//! (`samba smbclient winbind krb5-user`) and the staged models (`models-cache/staging`).
//!
//! `cargo bench -p airlock --bench connector_crawl` (env: `AIRLOCK_BENCH_FILES`, default 10000;
//! `AIRLOCK_BENCH_USERS` directory users besides the service account, default 50).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

#[path = "../../connectors/tests/support/mod.rs"]
mod dc;

const PW: &str = "Bench-Pass-1!";
const ALIAS: &str = "bench";
const READ: &str = "0x001200a9";

fn env_usize(key: &str, default: usize) -> usize {
    std::env::var(key)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Words of real prose: the Debian Administrator's Handbook pages of the real-document set,
/// tags stripped.
fn words() -> Vec<String> {
    let docs =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../golden-sets/real/debian-handbook/docs");
    let mut names: Vec<PathBuf> = std::fs::read_dir(&docs)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "html"))
        .collect();
    names.sort();
    let mut out = Vec::new();
    for p in names {
        let html = std::fs::read_to_string(&p).unwrap();
        let mut text = String::with_capacity(html.len());
        let mut in_tag = false;
        for c in html.chars() {
            match c {
                '<' => in_tag = true,
                '>' => {
                    in_tag = false;
                    text.push(' ');
                }
                _ if !in_tag => text.push(c),
                _ => {}
            }
        }
        out.extend(
            text.split_whitespace()
                .filter(|w| {
                    w.chars()
                        .all(|c| c.is_alphanumeric() || ".,;:()-'".contains(c))
                })
                .map(str::to_owned),
        );
    }
    assert!(out.len() > 10_000, "too few words in {}", docs.display());
    out
}

/// The text of file `i` (version `v`): ~200 words of the handbook from a place of its own.
fn text(words: &[String], i: usize, v: usize) -> String {
    let start = (i * 7919 + v * 104_729) % (words.len() - 250);
    let len = 150 + (i * 31) % 100;
    format!(
        "Note {i} (revision {v}). {}\n",
        words[start..start + len].join(" ")
    )
}

fn rel(i: usize) -> String {
    format!("d{:03}/f{i:05}.txt", i / 100)
}

/// Writes the corpus under `root`; returns its bytes.
fn write_corpus(root: &Path, words: &[String], n: usize) -> u64 {
    let mut bytes = 0;
    for i in 0..n {
        let p = root.join(rel(i));
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        let t = text(words, i, 0);
        bytes += t.len() as u64;
        std::fs::write(p, t).unwrap();
    }
    bytes
}

fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_airlock")
}

fn check(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A data directory with the demo keyring pinned and the demo bundle (MiniLM) installed.
fn prepared(data: &Path) {
    let staging = Path::new(env!("CARGO_MANIFEST_DIR")).join("../models-cache/staging");
    assert!(
        staging.join("catalogue.json").exists(),
        "no staged models at {} (scripts/fetch-models.sh)",
        staging.display()
    );
    check(
        Command::new(bin())
            .args(["demo", "--data"])
            .arg(data)
            .args(["--setup-only", "--no-sample-data", "--staging"])
            .arg(&staging),
    );
}

fn http(agent: &ureq::Agent, method: &str, url: &str, token: &str) -> (u16, Value) {
    let auth = format!("Bearer {token}");
    let resp = match method {
        "GET" => agent.get(url).header("Authorization", &auth).call(),
        _ => agent
            .post(url)
            .header("Authorization", &auth)
            .send_json(json!({})),
    };
    let mut resp = resp.unwrap();
    let status = resp.status().as_u16();
    (status, resp.body_mut().read_json().unwrap_or(Value::Null))
}

struct Daemon {
    child: Child,
    base: String,
    token: String,
    agent: ureq::Agent,
}

impl Daemon {
    fn start(data: &Path, config: &Path) -> Daemon {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let child = Command::new(bin())
            .args(["serve", "--data"])
            .arg(data)
            .args(["--port", &port.to_string(), "--config"])
            .arg(config)
            .env("AIRLOCK_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let ready = format!("http://127.0.0.1:{port}/readyz");
        let deadline = Instant::now() + Duration::from_secs(600);
        while !ureq::get(&ready).call().is_ok_and(|r| r.status() == 200) {
            assert!(Instant::now() < deadline, "the daemon never got ready");
            std::thread::sleep(Duration::from_millis(200));
        }
        let tokens: Value =
            serde_json::from_slice(&std::fs::read(data.join("demo/tokens.json")).unwrap()).unwrap();
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_global(Some(Duration::from_secs(600)))
            .build()
            .into();
        Daemon {
            child,
            base: format!("http://127.0.0.1:{port}"),
            token: tokens["admin"].as_str().unwrap().to_owned(),
            agent,
        }
    }

    fn status(&self) -> Option<Value> {
        let url = format!("{}/v1/connectors", self.base);
        let resp = self
            .agent
            .get(&url)
            .header("Authorization", &format!("Bearer {}", self.token))
            .call()
            .ok()?;
        let mut resp = resp;
        (resp.status().as_u16() == 200)
            .then(|| resp.body_mut().read_json::<Value>().ok())
            .flatten()
            .map(|v| v["data"][0].clone())
    }

    /// Waits until more than `runs` syncs have ended; the source's status then.
    fn wait_for_run(&self, runs: u64) -> Value {
        let deadline = Instant::now() + Duration::from_secs(6 * 3600);
        loop {
            if let Some(s) = self.status()
                && s["runs"].as_u64().unwrap_or(0) > runs
                && s["running"] == false
            {
                assert!(s["last_run"]["error"].is_null(), "the sync failed: {s}");
                return s;
            }
            assert!(Instant::now() < deadline, "no sync ended");
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    fn sync(&self, runs: u64) -> Value {
        let (code, body) = http(
            &self.agent,
            "POST",
            &format!("{}/v1/connectors/{ALIAS}/sync", self.base),
            &self.token,
        );
        assert_eq!(code, 202, "{body}");
        self.wait_for_run(runs)
    }

    /// doc id → (version, updated_at) of every live document (the console's listing).
    fn documents(&self) -> BTreeMap<String, (String, String)> {
        let mut out = BTreeMap::new();
        let mut after: Option<String> = None;
        loop {
            let url = format!(
                "{}/v1/admin/documents?status=live&limit=200{}",
                self.base,
                after.map(|a| format!("&after={a}")).unwrap_or_default()
            );
            let (code, body) = http(&self.agent, "GET", &url, &self.token);
            assert_eq!(code, 200, "{body}");
            for d in body["documents"].as_array().unwrap() {
                out.insert(
                    d["doc_id"].as_str().unwrap().to_owned(),
                    (d["version"].to_string(), d["updated_at"].to_string()),
                );
            }
            match body["next_after"].as_str() {
                Some(next) => after = Some(next.to_owned()),
                None => return out,
            }
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let _ = self.child.wait();
    }
}

/// Seconds a run took, from its own start and end (Unix seconds).
fn run_secs(s: &Value) -> f64 {
    let r = &s["last_run"];
    (r["finished_at"].as_u64().unwrap() - r["started_at"].as_u64().unwrap()) as f64
}

fn main() {
    let files = env_usize("AIRLOCK_BENCH_FILES", 10_000);
    let users = env_usize("AIRLOCK_BENCH_USERS", 50);
    println!("{}", airlock_inference::cpu_line());
    let work = tempfile::Builder::new()
        .prefix("airlock-connector-bench-")
        .tempdir()
        .unwrap();
    let corpus = work.path().join("corpus");
    let words = words();
    let bytes = write_corpus(&corpus, &words, files);
    eprintln!("corpus: {files} files, {bytes} bytes");

    // 1. The peer: `airlock ingest DIR` on the local copy, with and without a sidecar.
    let ingest = |name: &str| {
        let data = work.path().join(name);
        prepared(&data);
        let t = Instant::now();
        check(
            Command::new(bin())
                .args(["ingest", "--data"])
                .arg(&data)
                .arg(&corpus)
                .env("AIRLOCK_LOG", "warn"),
        );
        let secs = t.elapsed().as_secs_f64();
        eprintln!("airlock ingest DIR ({name}): {secs:.1} s");
        secs
    };
    let batched_secs = ingest("ingest-ungranted");
    let sidecar = corpus.join(".acl.jsonl");
    std::fs::write(&sidecar, "{\"path\": \"**\", \"groups\": [\"staff\"]}\n").unwrap();
    let ingest_secs = ingest("ingest-granted");
    std::fs::remove_file(&sidecar).unwrap();

    // 2. The share: Domain Users may read everything (inherited from the root).
    let Some(mut dc) = dc::Dc::start() else {
        eprintln!("no Samba DC on this machine: the connector half was not measured");
        std::process::exit(2);
    };
    dc.add_user("svc-airlock", PW);
    dc.add_group("crawlers");
    dc.add_members("crawlers", &["svc-airlock"]);
    let names: Vec<String> = (0..users).map(|i| format!("user{i:03}")).collect();
    for n in &names {
        dc.add_user(n, PW);
    }
    let (ba, du) = ("S-1-5-32-544", format!("{}-513", dc.get("DOMAIN_SID")));
    let svc = dc.sid("crawlers");
    dc.set_sddl(
        "",
        &format!(
            "O:{ba}G:{du}D:PAI(A;OICI;0x001f01ff;;;{ba})(A;OICI;{READ};;;{svc})(A;OICI;{READ};;;{du})"
        ),
    );
    let t = Instant::now();
    dc.smb(&format!(
        "prompt OFF; recurse ON; lcd \"{}\"; mput *",
        corpus.display()
    ));
    eprintln!(
        "uploaded to the share in {:.1} s",
        t.elapsed().as_secs_f64()
    );

    let secrets = work.path().join("svc.pw");
    std::fs::write(&secrets, PW).unwrap();
    std::fs::set_permissions(
        &secrets,
        <std::fs::Permissions as std::os::unix::fs::PermissionsExt>::from_mode(0o600),
    )
    .unwrap();
    let realm = dc.get("REALM").to_lowercase();
    let config = work.path().join("airlock.toml");
    std::fs::write(
        &config,
        format!(
            "[[connectors]]\nalias = \"{ALIAS}\"\nkind = \"smb\"\nhost = \"127.0.0.1\"\n\
             share = \"docs\"\ndomain = \"{domain}\"\nusername = \"svc-airlock\"\n\
             password_file = \"{pw}\"\nldap_url = \"ldaps://127.0.0.1:636\"\n\
             ldap_ca_file = \"{ca}\"\nldap_bind = \"svc-airlock@{realm}\"\n\
             interval_minutes = 600\nshare_acl = \"none\"\ncheck_traverse = true\n",
            domain = dc.get("DOMAIN"),
            pw = secrets.display(),
            ca = dc.get("CA_FILE"),
        ),
    )
    .unwrap();
    let d2 = work.path().join("connector");
    prepared(&d2);
    let daemon = Daemon::start(&d2, &config);
    let first = daemon.wait_for_run(0);
    assert_eq!(first["last_run"]["counts"]["upserted"], files, "{first}");
    let first_secs = run_secs(&first);

    // 3. 1% of the files change on the share.
    let changed = (files / 100).max(1);
    let step = files / changed;
    let changes = work.path().join("changes");
    for k in 0..changed {
        let i = k * step;
        let p = changes.join(rel(i));
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, text(&words, i, 1)).unwrap();
    }
    dc.smb(&format!(
        "prompt OFF; recurse ON; lcd \"{}\"; mput *",
        changes.display()
    ));
    let incremental = daemon.sync(1);
    assert_eq!(
        incremental["last_run"]["counts"]["upserted"], changed,
        "{incremental}"
    );
    let incremental_secs = run_secs(&incremental);

    // 4. An ACE added to 1% of the files (others than step 3's): permission-only changes.
    let before = daemon.documents();
    let denied = dc.sid(&names[0]);
    let mut touched = Vec::new();
    for k in 0..changed {
        let path = rel(k * step + step / 2);
        dc.add_ace(&path, &format!("ACL:{denied}:DENIED/0x0/0x00000001"));
        touched.push(path);
    }
    let acl = daemon.sync(2);
    assert_eq!(acl["last_run"]["counts"]["upserted"], 0, "{acl}");
    assert_eq!(acl["last_run"]["counts"]["permissions"], changed, "{acl}");
    let after = daemon.documents();
    assert_eq!(
        before, after,
        "a permission-only sync re-stored documents (version or update time changed)"
    );
    let acl_secs = run_secs(&acl);
    let permissions = acl["last_run"]["counts"]["permissions"].as_u64().unwrap();
    drop(daemon);

    let ingest_rate = files as f64 / ingest_secs;
    let batched_rate = files as f64 / batched_secs;
    let crawl_rate = files as f64 / first_secs.max(1.0);
    println!("\n| run | files | seconds | files/s |");
    println!("|---|---:|---:|---:|");
    println!(
        "| `airlock ingest DIR`, sidecar grant (peer) | {files} | {ingest_secs:.1} | {ingest_rate:.1} |"
    );
    println!(
        "| `airlock ingest DIR`, no grant (batched) | {files} | {batched_secs:.1} | {batched_rate:.1} |"
    );
    println!("| connector first sync | {files} | {first_secs:.0} | {crawl_rate:.1} |");
    println!("| connector sync, {changed} files changed | {changed} | {incremental_secs:.0} | |");
    println!("| connector sync, {permissions} ACEs changed | {permissions} | {acl_secs:.0} | |");
    println!(
        "\nfirst crawl / ingest rate: {:.2} (target >= 0.80; {:.2} of the batched ungranted ingest); \
         incremental / first: {:.3} (target <= 0.10); permission-only sync re-stored 0 documents",
        crawl_rate / ingest_rate,
        crawl_rate / batched_rate,
        incremental_secs / first_secs.max(1.0)
    );
    println!(
        "{}",
        json!({
            "bench": "connector_crawl", "files": files, "bytes": bytes, "users": users,
            "ingest_secs": ingest_secs, "ingest_ungranted_secs": batched_secs,
            "first_sync_secs": first_secs,
            "incremental_changed": changed, "incremental_secs": incremental_secs,
            "permission_changes": permissions, "permission_sync_secs": acl_secs,
            "crawl_over_ingest_rate": crawl_rate / ingest_rate,
            "crawl_over_ungranted_ingest_rate": crawl_rate / batched_rate,
            "incremental_over_first": incremental_secs / first_secs.max(1.0),
            "cpu": airlock_inference::cpu_line(),
        })
    );
}
