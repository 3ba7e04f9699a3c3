//! Verify throughput of a ~1 GiB bundle of incompressible payload, side by side in one run with
//! `zstd -dc FILE | sha256sum` on the same file.
//!
//! `cargo bench -p airlock-bundle --bench verify` (size: `AIRLOCK_BENCH_MIB`, default 1024;
//! temp dir: `AIRLOCK_BENCH_DIR`, default the system temp dir). Prints a Markdown table.

use std::fs::{self, File};
use std::io::{BufWriter, Write};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use airlock_bundle::{BuildOptions, InstallOptions, Limits, NoProgress, Store, build, verify_file};
use airlock_signing::{KeyPair, Keyring};

/// xorshift64*: fast, and its output is incompressible for zstd.
fn write_random(path: &Path, bytes: u64, mut seed: u64) {
    let mut out = BufWriter::with_capacity(1 << 20, File::create(path).unwrap());
    let mut buf = vec![0u8; 1 << 20];
    let mut left = bytes;
    while left > 0 {
        for chunk in buf.chunks_exact_mut(8) {
            seed ^= seed >> 12;
            seed ^= seed << 25;
            seed ^= seed >> 27;
            chunk.copy_from_slice(&seed.wrapping_mul(0x2545_F491_4F6C_DD1D).to_le_bytes());
        }
        let n = left.min(buf.len() as u64) as usize;
        out.write_all(&buf[..n]).unwrap();
        left -= n as u64;
    }
    out.flush().unwrap();
}

fn mbps(bytes: u64, d: Duration) -> f64 {
    bytes as f64 / 1e6 / d.as_secs_f64()
}

fn main() {
    let mib: u64 = std::env::var("AIRLOCK_BENCH_MIB")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1024);
    let base = std::env::var_os("AIRLOCK_BENCH_DIR")
        .map(Into::into)
        .unwrap_or_else(std::env::temp_dir);
    let dir = tempfile::tempdir_in(base).unwrap();
    let src = dir.path().join("src");
    fs::create_dir_all(src.join("models")).unwrap();
    // Four files, like a model bundle: one large, a few smaller.
    let total = mib << 20;
    let sizes = [
        total / 2,
        total / 4,
        total / 8,
        total - total / 2 - total / 4 - total / 8,
    ];
    for (i, size) in sizes.iter().enumerate() {
        write_random(
            &src.join(format!("models/part-{i}.bin")),
            *size,
            0x9E37_79B9_7F4A_7C15 + i as u64,
        );
    }

    let key = KeyPair::from_seed([1; 32]);
    let ring = Keyring::new(1, &[key.public()]).unwrap();
    let bundle = dir.path().join("bench.tar.zst");
    let options = BuildOptions::new("bench", "1.0.0".parse().unwrap());
    let t = Instant::now();
    build(&src, &options, &[&key], &bundle, &NoProgress).unwrap();
    let build_time = t.elapsed();
    let file_bytes = fs::metadata(&bundle).unwrap().len();

    let limits = Limits::default();
    // Warm the page cache so every contender reads from memory.
    verify_file(&bundle, &ring, &limits, &NoProgress).unwrap();
    let pipeline = |hasher: &str| {
        let t = Instant::now();
        let out = Command::new("sh")
            .arg("-c")
            .arg(format!(
                "zstd -dc '{}' | {hasher} >/dev/null",
                bundle.display()
            ))
            .output()
            .expect("sh, zstd and the hasher on PATH");
        assert!(out.status.success(), "zstd -dc | {hasher} failed");
        t.elapsed()
    };
    let has_openssl = Command::new("openssl")
        .arg("version")
        .output()
        .is_ok_and(|o| o.status.success());
    let runs = 5;
    let (mut ours, mut coreutils, mut openssl) = (Vec::new(), Vec::new(), Vec::new());
    // Interleaved, so that load from other processes hits every contender alike.
    for _ in 0..runs {
        let t = Instant::now();
        verify_file(&bundle, &ring, &limits, &NoProgress).unwrap();
        ours.push(t.elapsed());
        coreutils.push(pipeline("sha256sum"));
        if has_openssl {
            openssl.push(pipeline("openssl dgst -sha256"));
        }
    }
    let stats = |v: &mut Vec<Duration>| {
        v.sort();
        (v[0], v[v.len() / 2])
    };
    let (ours_best, ours_med) = stats(&mut ours);

    // Install = verify + extract + fsync + rename (disk bound; informational).
    let store = Store::open(&dir.path().join("data")).unwrap();
    let t = Instant::now();
    store
        .install(&bundle, &ring, &InstallOptions::default())
        .unwrap();
    let install_time = t.elapsed();

    let uptime = fs::read_to_string("/proc/loadavg").unwrap_or_default();
    println!(
        "payload {mib} MiB incompressible, bundle file {:.1} MB, zstd level {}",
        file_bytes as f64 / 1e6,
        options.zstd_level
    );
    println!("load average at end: {}", uptime.trim());
    println!();
    println!("| measure (file MB/s, {runs} interleaved runs) | best | median |");
    println!("|---|---|---|");
    println!(
        "| `airlock bundle verify` (verify_file) | {:.0} | {:.0} |",
        mbps(file_bytes, ours_best),
        mbps(file_bytes, ours_med)
    );
    let contender = |name: &str, times: &mut Vec<Duration>| {
        if times.is_empty() {
            return;
        }
        let (best, med) = stats(times);
        println!(
            "| `zstd -dc FILE \\| {name}` | {:.0} | {:.0} |",
            mbps(file_bytes, best),
            mbps(file_bytes, med)
        );
        println!(
            "| ratio verify / ({name} pipeline) | {:.2} | {:.2} |",
            best.as_secs_f64() / ours_best.as_secs_f64(),
            med.as_secs_f64() / ours_med.as_secs_f64()
        );
    };
    contender("sha256sum", &mut coreutils);
    contender("openssl dgst -sha256", &mut openssl);
    println!();
    println!(
        "build: {:.0} MB/s ({:.1} s); install (verify + extract + fsync): {:.0} MB/s ({:.1} s)",
        mbps(total, build_time),
        build_time.as_secs_f64(),
        mbps(total, install_time),
        install_time.as_secs_f64()
    );
}
