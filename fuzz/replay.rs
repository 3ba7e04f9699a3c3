//! The plain-test runner of the fuzz harnesses, shared by every crate's `fuzzing` tests
//! (`#[path = "../../fuzz/replay.rs"] mod replay;`), so `cargo test` exercises the same harness
//! bodies as `cargo fuzz` without a nightly toolchain:
//!
//! 1. every file in `fuzz/corpus/<target>/` and `fuzz/regressions/<target>/` (crash inputs kept
//!    as regression tests) plus the caller's freshly generated seeds, then
//! 2. `cases` proptest cases (`AIRLOCK_FUZZ_CASES` overrides), each a seed with up to 8 mutations
//!    (bit flips, byte and token insertions, deletions, truncation, splices from other seeds).
//!
//! The proptest RNG is deterministic (a CI failure reproduces locally); proptest shrinks a
//! failing input and the panic message prints it for `fuzz/regressions/<target>/`.
#![allow(dead_code)]

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::{Path, PathBuf};

use proptest::prelude::*;
use proptest::sample::Index;
use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};

fn fuzz_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz")
}

/// The checked-in inputs of `target`: corpus first, then regressions, each in name order.
pub fn checked_in(target: &str) -> Vec<(PathBuf, Vec<u8>)> {
    let mut out = Vec::new();
    for kind in ["corpus", "regressions"] {
        let dir = fuzz_dir().join(kind).join(target);
        let Ok(list) = std::fs::read_dir(&dir) else {
            continue;
        };
        let mut paths: Vec<PathBuf> = list
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.is_file())
            .collect();
        paths.sort();
        for p in paths {
            let bytes = std::fs::read(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
            out.push((p, bytes));
        }
    }
    out
}

/// Writes a seed file into `fuzz/corpus/<target>/` (for the ignored `write_seeds` tests).
pub fn write_seed(target: &str, name: &str, bytes: &[u8]) {
    let dir = fuzz_dir().join("corpus").join(target);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join(name), bytes).unwrap();
}

#[derive(Debug, Clone)]
enum Mutation {
    Flip(Index, u8),
    Set(Index, u8),
    Insert(Index, u8),
    Token(Index, Index),
    Remove(Index, u8),
    Truncate(Index),
    Splice(Index, Index, Index, u8),
}

/// Fragments that move structured parsers (JSON, JSONL, TSV, HTML, tar) into other states.
const TOKENS: &[&[u8]] = &[
    b"\"",
    b"{",
    b"}",
    b"[",
    b"]",
    b",",
    b":",
    b"\n",
    b"\r\n",
    b"\t",
    b"null",
    b"true",
    b"-1",
    b"1e999",
    b"18446744073709551616",
    b"\\u0000",
    b"\\ud800",
    b"\xff",
    b"\xc3\x28",
    b"\0",
    b"<",
    b">",
    b"</",
    b"<![CDATA[",
    b"&amp;",
    b"&#x0;",
    b"<table><tr><td>",
    b"<script>",
    b"<h1>",
    b"../",
    b"/",
    b"#",
    b"\"user\":",
    b"\"doc\":",
    b"\"groups\":[]",
    b"\"users\":[]",
    b"ustar\0",
    b"00000000000",
];

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        (any::<Index>(), any::<u8>()).prop_map(|(i, b)| Mutation::Flip(i, b)),
        (any::<Index>(), any::<u8>()).prop_map(|(i, b)| Mutation::Set(i, b)),
        (any::<Index>(), any::<u8>()).prop_map(|(i, b)| Mutation::Insert(i, b)),
        (any::<Index>(), any::<Index>()).prop_map(|(i, t)| Mutation::Token(i, t)),
        (any::<Index>(), 1u8..16).prop_map(|(i, n)| Mutation::Remove(i, n)),
        any::<Index>().prop_map(Mutation::Truncate),
        (any::<Index>(), any::<Index>(), any::<Index>(), any::<u8>())
            .prop_map(|(s, f, a, n)| Mutation::Splice(s, f, a, n)),
    ]
}

fn apply(mut data: Vec<u8>, muts: &[Mutation], seeds: &[Vec<u8>]) -> Vec<u8> {
    let at = |i: &Index, len: usize| if len == 0 { 0 } else { i.index(len + 1) };
    for m in muts {
        match m {
            Mutation::Flip(i, b) if !data.is_empty() => {
                let k = i.index(data.len());
                data[k] ^= 1 << (b % 8);
            }
            Mutation::Set(i, b) if !data.is_empty() => {
                let k = i.index(data.len());
                data[k] = *b;
            }
            Mutation::Insert(i, b) => {
                let k = at(i, data.len());
                data.insert(k, *b);
            }
            Mutation::Token(i, t) => {
                let k = at(i, data.len());
                let tok = TOKENS[t.index(TOKENS.len())];
                data.splice(k..k, tok.iter().copied());
            }
            Mutation::Remove(i, n) if !data.is_empty() => {
                let k = i.index(data.len());
                let end = (k + *n as usize).min(data.len());
                data.drain(k..end);
            }
            Mutation::Truncate(i) => {
                let k = at(i, data.len());
                data.truncate(k);
            }
            Mutation::Splice(s, f, a, n) => {
                let other = &seeds[s.index(seeds.len())];
                if other.is_empty() {
                    continue;
                }
                let from = f.index(other.len());
                let end = (from + 1 + *n as usize * 4).min(other.len());
                let k = at(a, data.len());
                data.splice(k..k, other[from..end].iter().copied());
            }
            _ => {}
        }
    }
    data
}

fn escaped(data: &[u8]) -> String {
    data.iter()
        .flat_map(|b| std::ascii::escape_default(*b))
        .map(char::from)
        .collect()
}

/// Runs `harness` over the checked-in inputs of `target`, the `fresh` seeds, then `cases`
/// mutated seeds.
pub fn run(target: &str, fresh: &[Vec<u8>], cases: u32, harness: fn(&[u8])) {
    let files = checked_in(target);
    assert!(
        !files.is_empty() || !fresh.is_empty(),
        "no corpus for fuzz target {target}"
    );
    for (path, bytes) in &files {
        if catch_unwind(AssertUnwindSafe(|| harness(bytes))).is_err() {
            panic!("fuzz target {target}: {} fails", path.display());
        }
    }
    let mut seeds: Vec<Vec<u8>> = files.into_iter().map(|(_, b)| b).collect();
    seeds.extend(fresh.iter().cloned());
    for (i, s) in fresh.iter().enumerate() {
        if catch_unwind(AssertUnwindSafe(|| harness(s))).is_err() {
            panic!("fuzz target {target}: generated seed #{i} fails");
        }
    }
    let cases = std::env::var("AIRLOCK_FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(cases);
    let config = Config {
        cases,
        failure_persistence: None,
        max_shrink_iters: 2000,
        ..Config::default()
    };
    let rng = TestRng::deterministic_rng(RngAlgorithm::ChaCha);
    let mut runner = TestRunner::new_with_rng(config, rng);
    let strategy = (any::<Index>(), proptest::collection::vec(mutation(), 0..8));
    let result = runner.run(&strategy, |(seed, muts)| {
        let input = apply(seeds[seed.index(seeds.len())].clone(), &muts, &seeds);
        let outcome = catch_unwind(AssertUnwindSafe(|| harness(&input)));
        prop_assert!(
            outcome.is_ok(),
            "fuzz target {target} fails on {} bytes: b\"{}\" (save them under fuzz/regressions/{target}/)",
            input.len(),
            escaped(&input)
        );
        Ok(())
    });
    if let Err(e) = result {
        panic!("{e}");
    }
}
