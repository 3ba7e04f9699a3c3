//! Fuzz harnesses (not API). Each `pub fn` takes arbitrary bytes and must never panic: a panic
//! is a finding. The same bodies run under `cargo fuzz` (`fuzz/fuzz_targets/golden_jsonl.rs`)
//! and as plain tests over `fuzz/corpus/golden_jsonl/`, `fuzz/regressions/golden_jsonl/` and
//! proptest mutations of them (the tests below).

use std::path::Path;

use crate::Error;
use crate::formats::{BeirDoc, BeirQuery, parse_golden, parse_jsonl, parse_qrels};

/// Target `golden_jsonl`: `data` is read as each set file format: an Airlock golden JSONL
/// file, a BEIR corpus and queries file, and a BEIR qrels TSV (non-UTF-8 input is refused
/// before parsing, as `read_to_string` does).
///
/// Invariants: accepted golden cases have unique ids and a phase among their valid phases, and
/// their re-serialisation parses to equal cases; accepted qrels re-serialise to a TSV that parses
/// equal; accepted BEIR lines keep their ids and texts through a round trip; every refusal is
/// [`Error::Parse`] naming a line of the input, or [`Error::Invalid`].
pub fn golden_jsonl(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let p = Path::new("fuzz.jsonl");
    let lines = text.lines().count().max(1);
    let refused = |e: Error| match e {
        Error::Parse { line, .. } => assert!(line >= 1 && line <= lines, "line {line}"),
        Error::Invalid { .. } => {}
        Error::Io { .. } => panic!("parsing text is not I/O: {e}"),
    };

    match parse_golden(p, text) {
        Ok(cases) => {
            let mut ids: Vec<&str> = cases.iter().map(|c| c.id.as_str()).collect();
            ids.sort_unstable();
            assert!(ids.windows(2).all(|w| w[0] != w[1]), "duplicate case id");
            assert!(cases.iter().all(|c| c.valid_phases.contains(&c.phase)));
            let again = parse_golden(p, &jsonl(&cases)).expect("own JSONL parses");
            assert_eq!(again, cases, "golden round trip");
        }
        Err(e) => refused(e),
    }

    match parse_jsonl::<BeirDoc>(p, text) {
        Ok(docs) => {
            let again: Vec<BeirDoc> = parse_jsonl(p, &jsonl(&docs)).expect("own JSONL parses");
            let key = |d: &BeirDoc| (d.id.clone(), d.title.clone(), d.text.clone());
            assert_eq!(
                again.iter().map(key).collect::<Vec<_>>(),
                docs.iter().map(key).collect::<Vec<_>>()
            );
        }
        Err(e) => refused(e),
    }

    match parse_jsonl::<BeirQuery>(p, text) {
        Ok(queries) => {
            let again: Vec<BeirQuery> = parse_jsonl(p, &jsonl(&queries)).expect("own JSONL");
            let key = |q: &BeirQuery| (q.id.clone(), q.text.clone());
            assert_eq!(
                again.iter().map(key).collect::<Vec<_>>(),
                queries.iter().map(key).collect::<Vec<_>>()
            );
        }
        Err(e) => refused(e),
    }

    match parse_qrels(Path::new("fuzz.tsv"), text) {
        Ok(qrels) => {
            let mut tsv = String::from("query-id\tcorpus-id\tscore\n");
            for (q, docs) in &qrels {
                for (d, s) in docs {
                    tsv += &format!("{q}\t{d}\t{s}\n");
                }
            }
            let again = parse_qrels(Path::new("fuzz.tsv"), &tsv).expect("own TSV parses");
            assert_eq!(again, qrels, "qrels round trip");
        }
        Err(e) => refused(e),
    }
}

fn jsonl<T: serde::Serialize>(items: &[T]) -> String {
    items
        .iter()
        .map(|i| serde_json::to_string(i).expect("serialising") + "\n")
        .collect()
}

#[cfg(test)]
#[path = "../../fuzz/replay.rs"]
mod replay;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn golden_jsonl_corpus_and_mutations() {
        replay::run("golden_jsonl", &[], 3000, golden_jsonl);
    }
}
