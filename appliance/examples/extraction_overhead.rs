//! What extracting in a budgeted worker costs against extracting in-process, on ordinary files:
//!
//! ```sh
//! cargo build -p airlock --bin airlock
//! cargo run -p airlock --example extraction_overhead -- [--rounds 5] [--airlock PATH] FILE_OR_DIR...
//! ```
//!
//! Each file is extracted `--rounds` times both ways, alternating (in-process with
//! `airlock_retrieval::ingest::parse_document_with`, then through `Extractor::Child` with one
//! warm worker running `PATH`, default the `airlock` binary next to this example's directory),
//! keeping each file's best time per way; it prints the totals per format and overall and the
//! worker's cost in percent. The worker's process start is paid once (the first round) and not
//! counted: a worker serves file after file.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Instant;

use airlock_retrieval::ingest::{ExtractLimits, SourceFormat, parse_document_with};
use airlock_serving::extraction::{ChildExtractor, ChildProgram, ExtractBudget, Extractor};

const MAX_BYTES: usize = 8 << 20;

fn main() {
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    let mut rounds = 5;
    let mut airlock = std::env::current_exe()
        .ok()
        .and_then(|e| e.parent()?.parent().map(|d| d.join("airlock")))
        .unwrap_or_else(|| PathBuf::from("airlock"));
    while let Some(flag) = args.first().filter(|a| a.starts_with("--")).cloned() {
        let value = args.get(1).cloned().expect("a value after the flag");
        match flag.as_str() {
            "--rounds" => rounds = value.parse().expect("--rounds N"),
            "--airlock" => airlock = PathBuf::from(value),
            other => panic!("unknown flag {other}"),
        }
        args.drain(..2);
    }
    let mut files = Vec::new();
    for a in &args {
        walk(Path::new(a), &mut files);
    }
    files.sort();
    let worker = Extractor::Child(ChildExtractor::new(
        ChildProgram {
            path: airlock,
            require_sandbox: false,
        },
        ExtractBudget {
            max_concurrent: 1,
            ..ExtractBudget::default()
        },
    ));
    let limits = ExtractLimits::default();
    // format -> (files, bytes, in-process seconds, worker seconds)
    let mut totals: BTreeMap<String, (usize, usize, f64, f64)> = BTreeMap::new();
    for path in &files {
        let ext = path.extension().and_then(|e| e.to_str()).unwrap_or("");
        let Some(format) = SourceFormat::from_extension(ext) else {
            continue;
        };
        let bytes = std::fs::read(path).expect("readable");
        let id = path.file_name().unwrap().to_string_lossy().into_owned();
        let (mut inproc, mut child) = (f64::MAX, f64::MAX);
        for round in 0..=rounds {
            let t = Instant::now();
            let a = parse_document_with(&id, None, &bytes, format, MAX_BYTES, &limits);
            let ta = t.elapsed().as_secs_f64();
            let t = Instant::now();
            let b = worker.document(&id, None, &bytes, format, MAX_BYTES, &limits);
            let tb = t.elapsed().as_secs_f64();
            if round == 0 {
                // The same document both ways (the worker's first start is not timed).
                match (&a, &b) {
                    (Ok(a), Ok(b)) => assert!(a.text == b.text && a.regions == b.regions, "{id}"),
                    (Err(_), Err(_)) => {}
                    _ => panic!("{id}: in-process {:?}, worker {:?}", a.is_ok(), b.is_ok()),
                }
                continue;
            }
            inproc = inproc.min(ta);
            child = child.min(tb);
        }
        let key = ext.to_ascii_lowercase();
        let t = totals.entry(key).or_default();
        t.0 += 1;
        t.1 += bytes.len();
        t.2 += inproc;
        t.3 += child;
    }
    println!("format | files | MB | in-process s | worker s | worker cost");
    let mut all = (0, 0, 0.0, 0.0);
    for (f, t) in &totals {
        row(f, *t);
        all = (all.0 + t.0, all.1 + t.1, all.2 + t.2, all.3 + t.3);
    }
    row("all", all);
}

fn row(name: &str, (files, bytes, a, b): (usize, usize, f64, f64)) {
    println!(
        "{name} | {files} | {:.2} | {a:.4} | {b:.4} | {:+.1}%",
        bytes as f64 / 1e6,
        (b / a - 1.0) * 100.0
    );
}

fn walk(p: &Path, out: &mut Vec<PathBuf>) {
    if p.is_dir() {
        for e in std::fs::read_dir(p).expect("listable").flatten() {
            if !e.file_name().to_string_lossy().starts_with('.') {
                walk(&e.path(), out);
            }
        }
    } else {
        out.push(p.to_path_buf());
    }
}
