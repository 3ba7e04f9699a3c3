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

/// The fixed key the `eval_export` target verifies against.
pub fn export_key() -> airlock_signing::KeyPair {
    airlock_signing::KeyPair::from_seed([0x42; 32])
}

/// Target `eval_export`: `data` is read as an export file (`airlock eval verify-export`, the
/// file an auditor receives). Invariant: a file that verifies is exactly what signing its
/// summary again writes (canonical form, deterministic Ed25519), so no other byte string can
/// pass for it; anything else is refused with an error, never a panic.
pub fn eval_export(data: &[u8]) {
    let key = export_key();
    if let Ok(summary) = crate::export::verify(data, &key.public()) {
        assert_eq!(
            crate::export::sign(&summary, &key),
            data,
            "a verified export is canonical"
        );
    }
}

/// A valid export signed by [`export_key`] (the generated seed of `eval_export`).
pub fn export_seed() -> Vec<u8> {
    use crate::export::{Approval, ExportContext, ExportSummary};
    let key = export_key();
    let case = |id: &str, kind: &str, hit: Option<bool>| crate::metrics::CaseScore {
        id: id.into(),
        kind: kind.into(),
        phase: "v1".into(),
        ndcg_10: Some(0.5),
        recall_10: Some(1.0),
        recall_100: None,
        mrr_10: Some(0.5),
        answer_hit: hit,
        citation_precision: Some(1.0),
        citation_recall: Some(0.5),
        abstained: hit.is_none().then_some(true),
        leaks: Vec::new(),
        error: None,
        retrieved: Vec::new(),
        cited: Vec::new(),
        answer: None,
        invented_values: None,
        answer_words: None,
    };
    let mut lat = std::collections::BTreeMap::new();
    lat.insert("chat".to_string(), vec![120.0, 340.0]);
    let report = crate::gate::Report::new(
        "seed",
        Some("0.1.0".into()),
        Some(0),
        vec![
            case("a", "answerable", Some(true)),
            case("b", "acl_denied", None),
        ],
        &lat,
    );
    let summary = ExportSummary::of(
        &report,
        ExportContext {
            appliance_id: key.key_id().as_str().to_string(),
            created_at: "2026-12-01T00:00:00Z".into(),
            set_digest: "sha256:00".into(),
            manifest_digest: None,
            gate: None,
            approval: Approval {
                requested_by: "olga".into(),
                approved_by: "adam".into(),
            },
        },
    );
    crate::export::sign(&summary, &key)
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

    #[test]
    fn eval_export_seed_and_mutations() {
        let seed = export_seed();
        eval_export(&seed);
        assert!(crate::export::verify(&seed, &export_key().public()).is_ok());
        replay::run("eval_export", &[seed], 1000, eval_export);
    }
}
