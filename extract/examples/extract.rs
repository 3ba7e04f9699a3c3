//! Prints what airlock-extract reads from files, or times it:
//!
//! ```sh
//! cargo run -p airlock-extract --example extract -- FILE...           # blocks with anchors
//! cargo run --release -p airlock-extract --example extract -- --bench 5 FILE.pdf
//! cargo run --release -p airlock-extract --example extract -- --bench-total 3 DIR_OR_FILE...
//! cargo run --release -p airlock-extract --example extract -- --jsonl [--tables-as-text] DIR...
//! ```
//!
//! `--jsonl` prints one `{"doc_id", "title", "text"}` line per file (id = file name, text =
//! `Extracted::to_text`), the form `airlock ingest FILE.jsonl` reads; with `--tables-as-text`
//! the measurement switch `Limits::tables_as_text` is on (docs/benchmarks/extraction.md).
//!
//! `--bench-total N` walks the given files and folders (hidden names skipped, as `airlock
//! ingest DIR` does), extracts every file N times, keeps each file's best time and prints the
//! totals per format and overall (files, MB, units = pages/sheets/slides, seconds, units/s,
//! MB/s): extraction alone, no chunking or embedding, on the calling thread (run it under
//! `taskset -c 0` for a per-core rate).
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Instant;

use airlock_extract::{Format, Limits, extract};

fn main() {
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    let mut bench = 0usize;
    if args.first().map(String::as_str) == Some("--jsonl") {
        let flat = args.get(1).map(String::as_str) == Some("--tables-as-text");
        jsonl(flat, &args[if flat { 2 } else { 1 }..]);
        return;
    }
    if args.first().map(String::as_str) == Some("--bench-total") {
        let n = args.get(1).and_then(|n| n.parse().ok()).unwrap_or(3);
        bench_total(n, &args[2..]);
        return;
    }
    if args.first().map(String::as_str) == Some("--bench") {
        bench = args.get(1).and_then(|n| n.parse().ok()).unwrap_or(5);
        args.drain(..2);
    }
    let limits = Limits::default();
    for path in args {
        let bytes = std::fs::read(&path).expect("read");
        let ext = path.rsplit_once('.').map(|(_, e)| e).unwrap_or("");
        let Some(format) = Format::from_extension(ext) else {
            println!("== {path}: unknown extension");
            continue;
        };
        if bench > 0 {
            let mut best = f64::MAX;
            let mut units = 0;
            for _ in 0..bench {
                let t = Instant::now();
                let x = extract(&bytes, format, &limits);
                best = best.min(t.elapsed().as_secs_f64());
                units = x.map(|x| x.units).unwrap_or(0);
            }
            let mb = bytes.len() as f64 / 1e6;
            println!(
                "{path}: {units} units, {:.1} KB, best of {bench}: {:.1} ms = {:.0} units/s, {:.2} MB/s",
                bytes.len() as f64 / 1e3,
                best * 1e3,
                f64::from(units) / best,
                mb / best
            );
            continue;
        }
        match extract(&bytes, format, &limits) {
            Ok(x) => {
                println!(
                    "== {path}: title {:?}, {} units, {} blocks",
                    x.title,
                    x.units,
                    x.blocks.len()
                );
                for b in &x.blocks {
                    let a = &b.anchor;
                    let mut loc = Vec::new();
                    if let Some(p) = a.page {
                        loc.push(format!("p{p}"));
                    }
                    if let Some(s) = &a.sheet {
                        loc.push(format!("sheet {s}"));
                    }
                    if let Some((r0, r1)) = a.rows {
                        loc.push(format!("rows {r0}-{r1}"));
                    }
                    if let Some(s) = a.slide {
                        loc.push(format!("slide {s}"));
                    }
                    if !a.section.is_empty() {
                        loc.push(a.section.join(" > "));
                    }
                    println!("[{:?} | {}]\n{}", b.kind, loc.join(", "), b.text);
                }
            }
            Err(e) => println!("== {path}: refused ({}): {e}", e.code()),
        }
    }
}

/// The files under `path` (itself if it is a file), in name order, hidden names skipped.
fn files_under(path: &Path, out: &mut Vec<PathBuf>) {
    if path.is_file() {
        out.push(path.to_path_buf());
        return;
    }
    let mut entries: Vec<PathBuf> = std::fs::read_dir(path)
        .expect("read_dir")
        .filter_map(Result::ok)
        .filter(|e| !e.file_name().to_string_lossy().starts_with('.'))
        .map(|e| e.path())
        .collect();
    entries.sort();
    for e in entries {
        files_under(&e, out);
    }
}

#[derive(Default)]
struct Total {
    files: u64,
    refused: u64,
    bytes: u64,
    units: u64,
    secs: f64,
}

fn bench_total(runs: usize, paths: &[String]) {
    let limits = Limits::default();
    let mut files = Vec::new();
    for p in paths {
        files_under(Path::new(p), &mut files);
    }
    let mut totals: BTreeMap<&'static str, Total> = BTreeMap::new();
    let wall = Instant::now();
    for path in &files {
        let ext = path.extension().and_then(|e| e.to_str()).unwrap_or("");
        let Some(format) = Format::from_extension(ext) else {
            continue;
        };
        let bytes = std::fs::read(path).expect("read");
        let mut best = f64::MAX;
        let mut outcome = None;
        for _ in 0..runs.max(1) {
            let t = Instant::now();
            let x = extract(&bytes, format, &limits);
            best = best.min(t.elapsed().as_secs_f64());
            outcome = Some(x.map(|x| x.units));
        }
        let t = totals.entry(format.name()).or_default();
        t.files += 1;
        t.bytes += bytes.len() as u64;
        t.secs += best;
        match outcome {
            Some(Ok(units)) => t.units += u64::from(units),
            _ => t.refused += 1,
        }
    }
    println!("format | files | refused | MB | units | s (sum of best of {runs}) | units/s | MB/s");
    let mut all = Total::default();
    for (name, t) in &totals {
        print_total(name, t);
        all.files += t.files;
        all.refused += t.refused;
        all.bytes += t.bytes;
        all.units += t.units;
        all.secs += t.secs;
    }
    print_total("all", &all);
    eprintln!(
        "wall {:.1} s for {runs} passes",
        wall.elapsed().as_secs_f64()
    );
}

fn print_total(name: &str, t: &Total) {
    let mb = t.bytes as f64 / 1e6;
    println!(
        "{name} | {} | {} | {mb:.2} | {} | {:.3} | {:.0} | {:.2}",
        t.files,
        t.refused,
        t.units,
        t.secs,
        t.units as f64 / t.secs.max(1e-9),
        mb / t.secs.max(1e-9)
    );
}

fn jsonl(tables_as_text: bool, paths: &[String]) {
    let limits = Limits {
        tables_as_text,
        ..Limits::default()
    };
    let mut files = Vec::new();
    for p in paths {
        files_under(Path::new(p), &mut files);
    }
    for path in files {
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let ext = path.extension().and_then(|e| e.to_str()).unwrap_or("");
        let Some(format) = Format::from_extension(ext) else {
            continue;
        };
        let bytes = std::fs::read(&path).expect("read");
        match extract(&bytes, format, &limits) {
            Ok(x) => println!(
                "{}",
                serde_json::json!({
                    "doc_id": name,
                    "title": x.title.clone().unwrap_or_else(|| name.clone()),
                    "text": x.to_text(),
                })
            ),
            Err(e) => eprintln!("{name}: refused: {e}"),
        }
    }
}
