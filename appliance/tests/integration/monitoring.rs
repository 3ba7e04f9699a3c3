//! The monitoring kit (issue 26, point 6): what the shipped dashboard and alert rules query is
//! what the daemon exports; the latency histograms reach the real waits (up to 600 s and
//! beyond); request durations are labelled by route template, never by raw path; the IAM-sync
//! freshness gauge follows syncs and survives a restart; and `airlock serve` under systemd's
//! `Type=notify` protocol sends READY=1 once `/readyz` answers 200, then WATCHDOG=1.

use std::collections::BTreeSet;
use std::os::unix::net::UnixDatagram;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use airlock_acl::{NewUser, Role};
use axum::body::Body;
use axum::http::{Method, Request, header};

use crate::backup::{Daemon, installed};
use crate::support::TestApp;

fn packaging(rel: &str) -> String {
    std::fs::read_to_string(format!("{}/../packaging/{rel}", env!("CARGO_MANIFEST_DIR"))).unwrap()
}

/// Every `airlock_…` metric name in `text` (recording rules are `airlock:…`, not matched).
fn metric_names(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let b = text.as_bytes();
    let mut i = 0;
    while let Some(at) = text[i..].find("airlock_") {
        let start = i + at;
        let boundary =
            start == 0 || !(b[start - 1].is_ascii_alphanumeric() || b[start - 1] == b'_');
        let mut end = start;
        while end < b.len()
            && (b[end].is_ascii_lowercase() || b[end].is_ascii_digit() || b[end] == b'_')
        {
            end += 1;
        }
        // `airlock_*` in prose is no name.
        if boundary && end > start + "airlock_".len() {
            out.insert(text[start..end].to_owned());
        }
        i = end;
    }
    out
}

/// Whether the exposition `expo` has the series `name` (a sample, or a declared family whose
/// samples are `name` with a Prometheus suffix: `_total`, `_bucket`, `_count`, `_sum`).
fn exported(expo: &str, name: &str) -> bool {
    let has_sample = expo
        .lines()
        .filter(|l| !l.starts_with('#'))
        .any(|l| l.starts_with(name) && l[name.len()..].starts_with(['{', ' ']));
    let family = ["_total", "_bucket", "_count", "_sum"]
        .iter()
        .find_map(|s| name.strip_suffix(s))
        .unwrap_or(name);
    has_sample
        || expo
            .lines()
            .any(|l| l.starts_with(&format!("# TYPE {family} ")))
}

async fn scrape(app: &TestApp, token: &str) -> String {
    let r = app.call(Method::GET, "/metrics", Some(token), None).await;
    assert_eq!(r.status, 200, "{}", r.text);
    r.text
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dashboard_and_the_alert_rules_use_only_exported_metrics() {
    let app = TestApp::new();
    let prom = app.add_user("prometheus", &[], vec![Role::Metrics]);
    // Families without a sample are not in the exposition: give each labelled one a sample.
    let m = app.state.metrics();
    m.shed("interactive");
    m.rate_limited("requests");
    scrape(&app, &prom).await;
    let expo = scrape(&app, &prom).await;
    for file in [
        "grafana/airlock.json",
        "prometheus/airlock-rules.yml",
        "prometheus/airlock-rules.test.yml",
    ] {
        let names = metric_names(&packaging(file));
        assert!(names.len() >= 5, "{file}: {names:?}");
        let missing: Vec<_> = names.iter().filter(|n| !exported(&expo, n)).collect();
        assert!(
            missing.is_empty(),
            "{file} uses metrics the daemon does not export: {missing:?}"
        );
    }
    // The checker itself catches a name the daemon does not have.
    assert!(!exported(&expo, "airlock_ttft_secs_bucket"));
    assert!(exported(&expo, "airlock_shed_total"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn latency_histograms_reach_the_real_waits_and_durations_are_per_route_template() {
    let app = TestApp::new();
    let prom = app.add_user("prometheus", &[], vec![Role::Metrics]);
    let r = app
        .call(
            Method::GET,
            "/v1/documents/secret-merger-memo",
            Some(&app.admin),
            None,
        )
        .await;
    assert_eq!(r.status, 404, "{}", r.text);
    app.state.metrics().ttft.observe(590.0);
    app.state.metrics().observe_stage("queue_wait", 590.0);
    let expo = scrape(&app, &prom).await;
    // A 590 s wait lands in a finite bucket (524.288 < 590 <= 1048.576), not only in +Inf.
    for series in [
        "airlock_ttft_seconds_bucket{le=\"524.288\"} 0",
        "airlock_ttft_seconds_bucket{le=\"1048.576\"} 1",
        "airlock_retrieval_stage_seconds_bucket{stage=\"queue_wait\",le=\"524.288\"} 0",
        "airlock_retrieval_stage_seconds_bucket{stage=\"queue_wait\",le=\"1048.576\"} 1",
        "airlock_request_duration_seconds_bucket{route=\"/v1/documents/{doc_id}\",le=\"1048.576\"} 1",
        "airlock_request_duration_seconds_count{route=\"/v1/documents/{doc_id}\"} 1",
    ] {
        assert!(
            expo.lines().any(|l| l == series),
            "missing {series:?} in\n{}",
            expo.lines()
                .filter(|l| l.contains("1048") || l.contains("duration"))
                .collect::<Vec<_>>()
                .join("\n")
        );
    }
    assert!(
        !expo.contains("secret-merger-memo"),
        "a raw path leaked into a label"
    );
}

async fn sync_snapshot(app: &TestApp) {
    let r = app
        .send(
            Request::post("/v1/acl/sync")
                .header(header::AUTHORIZATION, format!("Bearer {}", app.admin))
                .header(header::CONTENT_TYPE, "application/x-ndjson")
                .body(Body::from("{\"user\": \"dave\", \"groups\": [\"risk\"]}\n"))
                .unwrap(),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
}

fn freshness(expo: &str) -> f64 {
    expo.lines()
        .find_map(|l| l.strip_prefix("airlock_iam_sync_last_success_timestamp_seconds "))
        .unwrap_or_else(|| panic!("no freshness gauge in\n{expo}"))
        .trim()
        .parse()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_iam_sync_freshness_gauge_follows_syncs_and_survives_a_restart() {
    let mut app = TestApp::new();
    // A local user: the IAM snapshot below removes every other user it does not name.
    let prom = app
        .state
        .services()
        .unwrap()
        .acl
        .add_user(
            "test",
            "prometheus",
            &NewUser {
                groups: vec![],
                roles: vec![Role::Metrics],
                local: true,
            },
        )
        .unwrap();
    assert_eq!(freshness(&scrape(&app, &prom).await), 0.0, "never synced");
    // One user's sign-in sync is not an IAM sync.
    app.state
        .services()
        .unwrap()
        .acl
        .sync_directory_user("test", "erin", &["risk".to_owned()])
        .unwrap();
    app.restart();
    assert_eq!(freshness(&scrape(&app, &prom).await), 0.0);
    let before = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    sync_snapshot(&app).await;
    let after = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    let at = freshness(&scrape(&app, &prom).await);
    assert!(
        at >= before - 1.0 && at <= after + 1.0,
        "{before} <= {at} <= {after}"
    );
    // A restarted daemon reads the last sync from the audit log.
    app.restart();
    let again = freshness(&scrape(&app, &prom).await);
    assert!((again - at).abs() < 1.0, "{again} vs {at}");
}

#[test]
fn the_shipped_unit_is_type_notify_with_a_watchdog() {
    let unit = packaging("airlock.service");
    let value = |key: &str| {
        unit.lines()
            .find_map(|l| l.strip_prefix(&format!("{key}=")))
            .unwrap_or_else(|| panic!("{key}= missing"))
            .trim()
            .to_owned()
    };
    assert_eq!(value("Type"), "notify");
    assert_eq!(value("NotifyAccess"), "main");
    let watchdog: u64 = value("WatchdogSec").trim_end_matches('s').parse().unwrap();
    assert!((10..=120).contains(&watchdog), "{watchdog}");
    // The notification datagrams are AF_UNIX: the address families must allow it.
    assert!(
        value("RestrictAddressFamilies")
            .split_whitespace()
            .any(|f| f == "AF_UNIX")
    );
}

fn recv(sock: &UnixDatagram, deadline: Instant) -> Option<String> {
    let mut buf = [0u8; 4096];
    while Instant::now() < deadline {
        match sock.recv(&mut buf) {
            Ok(n) => return Some(String::from_utf8_lossy(&buf[..n]).into_owned()),
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) => {}
            Err(e) => panic!("{e}"),
        }
    }
    None
}

#[test]
fn serve_notifies_systemd_ready_after_readyz_then_pings_the_watchdog() {
    let tmp = tempfile::tempdir().unwrap();
    let (data, _admin) = installed(tmp.path());
    let path = tmp.path().join("notify.sock");
    let sock = UnixDatagram::bind(&path).unwrap();
    sock.set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    let mut daemon = Daemon::start(
        &data,
        &[
            ("NOTIFY_SOCKET", path.to_str().unwrap()),
            ("WATCHDOG_USEC", "2000000"),
        ],
    );
    let deadline = Instant::now() + Duration::from_secs(600);
    let mut before_ready = Vec::new();
    let ready_at = loop {
        let msg = recv(&sock, deadline)
            .unwrap_or_else(|| panic!("no READY=1: {before_ready:?}\n{}", daemon.stop()));
        if msg.lines().any(|l| l == "READY=1") {
            break Instant::now();
        }
        before_ready.push(msg);
    };
    // READY=1 means ready: /readyz answers 200 at once.
    let r = ureq::get(&format!("{}/readyz", daemon.base))
        .call()
        .unwrap();
    assert_eq!(r.status(), 200);
    // The watchdog keeps pinging (every WATCHDOG_USEC / 2 = 1 s).
    let mut pings = 0;
    while pings < 2 {
        let msg =
            recv(&sock, ready_at + Duration::from_secs(10)).expect("no WATCHDOG=1 after READY=1");
        if msg == "WATCHDOG=1" {
            pings += 1;
        }
    }
    // On SIGTERM it says it is stopping.
    let _ = std::process::Command::new("kill")
        .args(["-TERM", &daemon.pid().to_string()])
        .status();
    let stop_deadline = Instant::now() + Duration::from_secs(60);
    let mut stopping = false;
    while let Some(msg) = recv(&sock, stop_deadline) {
        if msg.lines().any(|l| l == "STOPPING=1") {
            stopping = true;
            break;
        }
    }
    daemon.stop();
    assert!(stopping, "no STOPPING=1 on SIGTERM");
    assert!(
        before_ready.iter().all(|m| !m.contains("READY=1")),
        "{before_ready:?}"
    );
}
