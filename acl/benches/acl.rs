//! ACL benchmarks (a small bench binary; criterion's repetition would make the sync part take
//! many minutes). Run all parts, or name some:
//!
//! `cargo bench -p airlock-acl --bench acl -- [recompute] [memory] [sync]`
//!
//! - recompute: materialise the set of a user who reads 10M documents through 15 groups.
//! - memory: serialized size of one user bitmap at 1/10/50% density over 10M documents.
//! - sync: a snapshot with 100k changed document grants over 1M documents and 10k users, end to
//!   end (parse + diff + one transaction + recompute + swap) through the public API; also the
//!   ACL state's memory (RSS of a fresh process opening the database, bytes of the published
//!   per-user bitmaps, bytes of the grant bitmaps), `allow_set` per request and `can_read`.

use std::io::{BufWriter, Write};
use std::time::{Duration, Instant};

use airlock_acl::{Acl, materialise};
use roaring::RoaringBitmap;

/// Deterministic splitmix64.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    fn chance(&mut self, pct: u64) -> bool {
        self.below(100) < pct
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

const TEN_M: u32 = 10_000_000;

fn recompute() {
    println!("## recompute: user reading 10M documents through groups");
    let mut rng = Rng(1);
    // Random layout: every document in exactly one of 10 department groups, 20% also in one of
    // 50 project groups. The user is in all 10 departments and 5 projects.
    let mut depts = vec![RoaringBitmap::new(); 10];
    let mut projects = vec![RoaringBitmap::new(); 50];
    for d in 0..TEN_M {
        depts[rng.below(10) as usize].insert(d);
        if rng.chance(20) {
            projects[rng.below(50) as usize].insert(d);
        }
    }
    let groups: Vec<&RoaringBitmap> = depts.iter().chain(projects.iter().take(5)).collect();
    // Clustered layout: departments ingested in batches (contiguous ordinal ranges).
    let clustered: Vec<RoaringBitmap> = (0..10u32)
        .map(|i| (i * 1_000_000..(i + 1) * 1_000_000).collect())
        .collect();
    for (name, gs) in [
        ("random (15 groups)", groups),
        ("clustered (10 groups)", clustered.iter().collect()),
    ] {
        let mut times = Vec::new();
        let mut len = 0;
        for _ in 0..15 {
            let t = Instant::now();
            let bits = materialise(None, gs.iter().copied());
            times.push(t.elapsed());
            len = bits.len();
        }
        let direct: RoaringBitmap = (0..TEN_M).step_by(997).collect();
        let t = Instant::now();
        let with_direct = materialise(Some(&direct), gs.iter().copied());
        let one = t.elapsed();
        println!(
            "{name}: union of {} documents: median {:.1} ms, min {:.1} ms, max {:.1} ms \
             (15 runs); with a direct-grant bitmap: {:.1} ms ({} docs)",
            len,
            ms(median(times.clone())),
            ms(*times.iter().min().unwrap()),
            ms(*times.iter().max().unwrap()),
            ms(one),
            with_direct.len()
        );
    }
}

fn memory() {
    println!("## memory: one user bitmap over 10M documents");
    let mut rng = Rng(2);
    for pct in [1u64, 10, 50] {
        let random: RoaringBitmap = (0..TEN_M).filter(|_| rng.below(1000) < pct * 10).collect();
        let n = u32::try_from(random.len()).unwrap();
        let contiguous: RoaringBitmap = (0..n).collect();
        let mut runs = contiguous.clone();
        runs.optimize();
        println!(
            "{pct}%: {} docs; random: {:.2} MiB ({:.2} bytes/doc); clustered (array/bitmap \
             containers): {:.2} MiB; clustered with run containers: {:.0} bytes",
            n,
            random.serialized_size() as f64 / 1048576.0,
            random.serialized_size() as f64 / f64::from(n),
            contiguous.serialized_size() as f64 / 1048576.0,
            runs.serialized_size() as f64
        );
    }
}

const DOCS: u32 = 1_000_000;
const USERS: u32 = 10_000;
const DEPTS: u64 = 40;
const PROJECTS: u64 = 200;

#[derive(Clone)]
struct DocGrant {
    dept: u64,
    all_staff: bool,
    project: Option<u64>,
    users: Vec<u32>,
}

fn write_snapshot(path: &std::path::Path, users: &[String], docs: &[DocGrant]) {
    let mut w = BufWriter::new(std::fs::File::create(path).unwrap());
    for u in users {
        writeln!(w, "{u}").unwrap();
    }
    for (i, g) in docs.iter().enumerate() {
        let mut groups = vec![format!("\"dept-{}\"", g.dept)];
        if g.all_staff {
            groups.push("\"all-staff\"".into());
        }
        if let Some(p) = g.project {
            groups.push(format!("\"proj-{p}\""));
        }
        let us: Vec<String> = g.users.iter().map(|u| format!("\"u{u:05}\"")).collect();
        writeln!(
            w,
            "{{\"doc\": \"doc-{i:07}\", \"users\": [{}], \"groups\": [{}]}}",
            us.join(", "),
            groups.join(", ")
        )
        .unwrap();
    }
    w.flush().unwrap();
}

fn peak_rss_mib() -> f64 {
    proc_status_mib("VmHWM:")
}

/// Current resident set size of this process (VmRSS), MiB.
fn rss_mib() -> f64 {
    proc_status_mib("VmRSS:")
}

fn proc_status_mib(field: &str) -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find(|l| l.starts_with(field))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|kb| kb.parse::<f64>().ok())
        .map_or(0.0, |kb| kb / 1024.0)
}

/// Resets the peak RSS (VmHWM) of this process to the current RSS (Linux `clear_refs` 5).
fn reset_peak_rss() {
    let _ = std::fs::write("/proc/self/clear_refs", "5");
}

/// Bytes of the grant bitmaps themselves (one per group, one per user named on a document),
/// built from the generated grants: the "distinct grants" the ACL state should grow with.
fn grant_bitmap_bytes(docs: &[DocGrant]) -> (usize, usize) {
    let mut groups: std::collections::HashMap<String, RoaringBitmap> = Default::default();
    let mut users: std::collections::HashMap<u32, RoaringBitmap> = Default::default();
    for (d, g) in docs.iter().enumerate() {
        let d = u32::try_from(d).unwrap();
        groups
            .entry(format!("dept-{}", g.dept))
            .or_default()
            .insert(d);
        if g.all_staff {
            groups.entry("all-staff".into()).or_default().insert(d);
        }
        if let Some(p) = g.project {
            groups.entry(format!("proj-{p}")).or_default().insert(d);
        }
        for u in &g.users {
            users.entry(*u).or_default().insert(d);
        }
    }
    (
        groups.values().map(RoaringBitmap::serialized_size).sum(),
        users.values().map(RoaringBitmap::serialized_size).sum(),
    )
}

/// Times `allow_set` for every user twice (the first pass cold, the second with whatever the
/// ACL keeps between requests), as a request takes it.
fn allow_set_per_request(acl: &Acl) {
    let ids: Vec<String> = (0..USERS).map(|u| format!("u{u:05}")).collect();
    for pass in ["first", "second"] {
        let mut times: Vec<Duration> = Vec::with_capacity(ids.len());
        let mut readable = 0u64;
        for id in &ids {
            let t = Instant::now();
            let set = acl.allow_set(id);
            times.push(t.elapsed());
            readable += set.len();
        }
        let total: Duration = times.iter().sum();
        times.sort();
        println!(
            "allow_set per request ({pass} pass over {USERS} users): mean {:.1} us, p50 {:.1} us, \
             p99 {:.1} us, max {:.1} us (mean {} readable docs)",
            total.as_secs_f64() * 1e6 / ids.len() as f64,
            times[times.len() / 2].as_secs_f64() * 1e6,
            times[times.len() * 99 / 100].as_secs_f64() * 1e6,
            times[times.len() - 1].as_secs_f64() * 1e6,
            readable / u64::from(USERS)
        );
    }
}

fn sync() {
    println!("## sync: 100k changed grants over 1M documents and 10k users");
    let dir = tempfile::tempdir().unwrap();
    let t = Instant::now();
    let mut rng = Rng(3);
    // Users: 95% in all-staff, one department each, 40% also in 1-2 projects.
    let users: Vec<String> = (0..USERS)
        .map(|u| {
            let mut gs = vec![format!("\"dept-{}\"", rng.below(DEPTS))];
            if rng.chance(95) {
                gs.push("\"all-staff\"".into());
            }
            if rng.chance(40) {
                for _ in 0..=rng.below(2) {
                    gs.push(format!("\"proj-{}\"", rng.below(PROJECTS)));
                }
            }
            gs.sort();
            gs.dedup();
            format!("{{\"user\": \"u{u:05}\", \"groups\": [{}]}}", gs.join(", "))
        })
        .collect();
    // Documents: one department, 30% all staff, 20% a project, 3% 1-3 users by name.
    let mut docs: Vec<DocGrant> = (0..DOCS)
        .map(|_| DocGrant {
            dept: rng.below(DEPTS),
            all_staff: rng.chance(30),
            project: rng.chance(20).then(|| rng.below(PROJECTS)),
            users: if rng.chance(3) {
                (0..=rng.below(3))
                    .map(|_| u32::try_from(rng.below(u64::from(USERS))).unwrap())
                    .collect()
            } else {
                vec![]
            },
        })
        .collect();
    let a = dir.path().join("a.jsonl");
    write_snapshot(&a, &users, &docs);
    let docs_a = docs.clone();
    // B: 100k distinct documents re-permissioned (department moves, all-staff flips).
    let mut changed = RoaringBitmap::new();
    while changed.len() < 100_000 {
        changed.insert(u32::try_from(rng.below(u64::from(DOCS))).unwrap());
    }
    for d in &changed {
        let g = &mut docs[d as usize];
        g.dept = (g.dept + 1 + rng.below(DEPTS - 1)) % DEPTS;
        if rng.chance(50) {
            g.all_staff = !g.all_staff;
        }
    }
    let b = dir.path().join("b.jsonl");
    write_snapshot(&b, &users, &docs);
    println!(
        "generated A and B ({:.0} MiB each) in {:.1} s",
        std::fs::metadata(&b).unwrap().len() as f64 / 1048576.0,
        t.elapsed().as_secs_f64()
    );

    let db = dir.path().join("airlock.db");
    let acl = Acl::open(&db).unwrap();
    let t = Instant::now();
    let c = acl
        .sync_snapshot(
            "bench",
            std::io::BufReader::new(std::fs::File::open(&a).unwrap()),
        )
        .unwrap();
    println!(
        "initial sync of A into an empty database: {:.2} s, {c:?}",
        t.elapsed().as_secs_f64()
    );
    drop(acl);

    let (group_bytes, user_bytes) = grant_bitmap_bytes(&docs_a);
    drop(docs_a);
    println!(
        "grant bitmaps of A (the distinct grants): groups {:.1} MiB, users by name {:.1} MiB",
        group_bytes as f64 / 1048576.0,
        user_bytes as f64 / 1048576.0
    );
    // The state's RSS in a fresh process (this one's heap is full of generated data).
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .arg("state-of")
        .arg(&db)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    print!("{}", String::from_utf8_lossy(&out.stdout));

    let t = Instant::now();
    let acl = Acl::open(&db).unwrap();
    println!(
        "start-up (load rows + materialise 10k users): {:.2} s",
        t.elapsed().as_secs_f64()
    );
    let snap = acl.snapshot();
    println!("  two-level state: {:?}", snap.set_memory());
    // Every set held at once (as that many concurrent requests would), so that distinct
    // pointers are distinct bitmaps.
    let held: Vec<_> = snap.user_ids().iter().map(|u| snap.allow_set(u)).collect();
    let mut distinct: std::collections::HashMap<*const RoaringBitmap, usize> = Default::default();
    for set in &held {
        distinct.insert(set.bitmap() as *const _, set.bitmap().serialized_size());
    }
    drop(held);
    println!(
        "  one allow_set per user: {} distinct bitmaps, {:.1} MiB (serialized size)",
        distinct.len(),
        distinct.values().sum::<usize>() as f64 / 1048576.0
    );
    let total: u64 = snap
        .user_ids()
        .iter()
        .map(|u| snap.allow_set(u).len())
        .sum();
    println!(
        "  {} distinct user bitmaps for {} users, mean {:.0} readable docs per user",
        distinct.len(),
        USERS,
        total as f64 / f64::from(USERS)
    );
    drop(snap);
    allow_set_per_request(&acl);
    println!("  after the passes: {:?}", acl.snapshot().set_memory());

    reset_peak_rss();
    let t = Instant::now();
    let c = acl
        .sync_snapshot(
            "bench",
            std::io::BufReader::new(std::fs::File::open(&b).unwrap()),
        )
        .unwrap();
    let took = t.elapsed();
    println!(
        "sync B (100k changed grants), end to end: {:.2} s (goal <= 5 s), {c:?}",
        took.as_secs_f64()
    );
    println!(
        "  RSS after sync B {:.0} MiB, peak during sync B {:.0} MiB",
        rss_mib(),
        peak_rss_mib()
    );
    let t = Instant::now();
    let c = acl
        .sync_snapshot(
            "bench",
            std::io::BufReader::new(std::fs::File::open(&b).unwrap()),
        )
        .unwrap();
    println!(
        "re-sync B (no change): {:.2} s, {c:?}",
        t.elapsed().as_secs_f64()
    );
    let ids: Vec<String> = (0..USERS).map(|u| format!("u{u:05}")).collect();
    let t = Instant::now();
    let n = 1_000_000u32;
    let mut hits = 0u32;
    for i in 0..n {
        if acl.can_read(&ids[(i % USERS) as usize], i.wrapping_mul(7919) % DOCS) {
            hits += 1;
        }
    }
    println!(
        "can_read: {:.0} ns per call ({} of {} readable)",
        t.elapsed().as_nanos() as f64 / f64::from(n),
        hits,
        n
    );
    println!(
        "peak RSS of the bench process since the start of sync B: {:.0} MiB",
        peak_rss_mib()
    );
}

/// `state-of DB` (run by `sync` as a child process): RSS of a fresh process before and after
/// `Acl::open` of DB, and after one `allow_set` of every user.
fn state_of(db: &str) {
    let before = rss_mib();
    let acl = Acl::open(db).unwrap();
    let opened = rss_mib();
    let users = acl.snapshot().user_ids();
    let sets: Vec<_> = users.iter().map(|u| acl.allow_set(u)).collect();
    let taken = rss_mib();
    println!(
        "ACL state RSS in a fresh process: {before:.0} MiB before open, {opened:.0} MiB after \
         open (+{:.0} MiB), {taken:.0} MiB after one allow_set per user, {} users (+{:.0} MiB)",
        opened - before,
        sets.len(),
        taken - opened
    );
}

fn main() {
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with("--"))
        .collect();
    if args.first().map(String::as_str) == Some("state-of") {
        state_of(&args[1]);
        return;
    }
    let want = |p: &str| args.is_empty() || args.iter().any(|a| a == p);
    if want("recompute") {
        recompute();
    }
    if want("memory") {
        memory();
    }
    if want("sync") {
        // Phase timings (parse, diff, write, recompute, commit) from the crate's tracing events.
        tracing_subscriber::fmt()
            .with_writer(std::io::stderr)
            .with_target(false)
            .init();
        sync();
    }
}
