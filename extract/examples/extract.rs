//! Prints what airlock-extract reads from files, or times it:
//!
//! ```sh
//! cargo run -p airlock-extract --example extract -- FILE...           # blocks with anchors
//! cargo run --release -p airlock-extract --example extract -- --bench 5 FILE.pdf
//! ```
use std::time::Instant;

use airlock_extract::{Format, Limits, extract};

fn main() {
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    let mut bench = 0usize;
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
