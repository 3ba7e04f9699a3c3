//! Metric functions. Retrieval metrics follow trec_eval's definitions (`ndcg_cut`, `recall`,
//! `recip_rank` cut at k): gain = the judged grade (binary sets: 1), discount `log2(rank + 1)`,
//! ideal DCG from the judgments, recall over all judged-relevant documents. A ranking is of
//! document ids; chunk-level results are collapsed to their first occurrence per document first
//! ([`dedup_docs`]), as trec_eval would count a document once.

use std::collections::{BTreeMap, HashSet};

use rand::{RngExt, SeedableRng};
use serde::{Deserialize, Serialize};

use crate::formats::GoldenCase;

/// Keeps the first occurrence of each document id, preserving rank order.
pub fn dedup_docs<S: AsRef<str>>(ranked: &[S]) -> Vec<&str> {
    let mut seen = HashSet::new();
    ranked
        .iter()
        .map(AsRef::as_ref)
        .filter(|d| seen.insert(*d))
        .collect()
}

/// nDCG@k of a ranking against graded judgments (grades ≤ 0 count as not relevant).
/// Returns 0 when nothing is relevant (trec_eval convention).
pub fn ndcg_at_k(ranked: &[&str], judged: &BTreeMap<String, i32>, k: usize) -> f64 {
    let gain = |d: &str| judged.get(d).copied().unwrap_or(0).max(0) as f64;
    let dcg: f64 = ranked
        .iter()
        .take(k)
        .enumerate()
        .map(|(i, d)| gain(d) / ((i + 2) as f64).log2())
        .sum();
    let mut ideal: Vec<f64> = judged.values().map(|&g| g.max(0) as f64).collect();
    ideal.sort_by(|a, b| b.total_cmp(a));
    let idcg: f64 = ideal
        .iter()
        .take(k)
        .enumerate()
        .map(|(i, g)| g / ((i + 2) as f64).log2())
        .sum();
    if idcg == 0.0 { 0.0 } else { dcg / idcg }
}

/// Recall@k: relevant documents in the top k over all relevant documents (0 when none are).
pub fn recall_at_k(ranked: &[&str], judged: &BTreeMap<String, i32>, k: usize) -> f64 {
    let relevant = judged.values().filter(|&&g| g > 0).count();
    if relevant == 0 {
        return 0.0;
    }
    let hits = ranked
        .iter()
        .take(k)
        .filter(|d| judged.get(**d).is_some_and(|&g| g > 0))
        .count();
    hits as f64 / relevant as f64
}

/// Reciprocal rank of the first relevant document within the top k, else 0.
pub fn mrr_at_k(ranked: &[&str], judged: &BTreeMap<String, i32>, k: usize) -> f64 {
    ranked
        .iter()
        .take(k)
        .position(|d| judged.get(*d).is_some_and(|&g| g > 0))
        .map_or(0.0, |i| 1.0 / (i + 1) as f64)
}

pub use airlock_text::{contains_normalized, normalize};

/// Phrases by which an answer says the sources do not hold the answer ("don't know" is what a
/// plain stuff-documents prompt asks the model to say).
const ABSTENTION_MARKERS: [&str; 14] = [
    "cannot find",
    "can't find",
    "could not find",
    "couldn't find",
    "do not contain",
    "does not contain",
    "don't contain",
    "doesn't contain",
    "no information",
    "not able to find",
    "unable to find",
    "do not have",
    "don't know",
    "do not know",
];

/// Whether an answer abstains: empty, or it says the sources do not contain the answer.
pub fn is_abstention(answer: &str) -> bool {
    let a = normalize(answer);
    a.trim().is_empty() || ABSTENTION_MARKERS.iter().any(|m| a.contains(m))
}

/// What the system returned for one case.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Observation {
    /// Retrieved document ids in rank order (chunk-level; duplicates allowed).
    pub retrieved_doc_ids: Vec<String>,
    /// Every snippet returned to the user (retrieval results and citations).
    pub snippets: Vec<String>,
    /// Cited document ids, in citation order: every source listed with the answer (the chunks
    /// placed in the prompt). Leaks are checked over all of them.
    pub cited_doc_ids: Vec<String>,
    /// The documents the answer used (the daemon's `airlock.cited`), when it reported them;
    /// citation precision and recall score these, else every listed citation.
    #[serde(default)]
    pub used_doc_ids: Option<Vec<String>>,
    /// Titles shown with the citations and results.
    pub titles: Vec<String>,
    /// The generated answer (empty when none was asked for or the request was refused).
    pub answer: String,
    /// The request was refused with 401 (the user no longer exists): counts as "no access".
    pub refused: bool,
    /// No answer was asked for (retrieval-only scoring): the answer, citation and abstention
    /// metrics do not apply to this case (`None`), leaks are still checked in what was returned.
    #[serde(default)]
    pub retrieval_only: bool,
    /// The full text of every source shown with the answer (the chunks in its prompt), when
    /// known: the invented-value check reads them.
    #[serde(default)]
    pub source_texts: Option<Vec<String>>,
    /// Only the prompt sources were asked for (no answer): answer metrics do not apply,
    /// abstention is "no prompt source", citations are the prompt sources.
    #[serde(default)]
    pub sources_only: bool,
}

/// One leak of forbidden material.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Leak {
    /// `doc_in_results`, `doc_in_citations`, `string_in_answer`, `string_in_snippet`, `string_in_title`.
    pub kind: String,
    /// The forbidden doc id or string.
    pub what: String,
}

/// Every leak of forbidden documents or strings in one observation.
pub fn leaks(case: &GoldenCase, obs: &Observation) -> Vec<Leak> {
    let mut out = Vec::new();
    let mut push = |kind: &str, what: &str| {
        let l = Leak {
            kind: kind.into(),
            what: what.into(),
        };
        if !out.contains(&l) {
            out.push(l);
        }
    };
    for d in &case.forbidden_doc_ids {
        if obs.retrieved_doc_ids.contains(d) {
            push("doc_in_results", d);
        }
        if obs.cited_doc_ids.contains(d) {
            push("doc_in_citations", d);
        }
    }
    for s in &case.forbidden_strings {
        if contains_normalized(&obs.answer, s) {
            push("string_in_answer", s);
        }
        if obs.snippets.iter().any(|t| contains_normalized(t, s)) {
            push("string_in_snippet", s);
        }
        if obs.titles.iter().any(|t| contains_normalized(t, s)) {
            push("string_in_title", s);
        }
    }
    out
}

/// The scores of one case. `None` where a metric does not apply to the case.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CaseScore {
    /// Case id.
    pub id: String,
    /// Case kind name.
    pub kind: String,
    /// Phase name.
    pub phase: String,
    /// nDCG@10 over document ids (cases with relevant documents).
    pub ndcg_10: Option<f64>,
    /// Recall@10 over document ids.
    pub recall_10: Option<f64>,
    /// Recall@100 over document ids (retrieval sets; `None` for end-to-end cases).
    #[serde(default)]
    pub recall_100: Option<f64>,
    /// MRR@10 over document ids.
    pub mrr_10: Option<f64>,
    /// Every `answer_contains` string found in the answer (cases that expect an answer).
    pub answer_hit: Option<bool>,
    /// Cited documents that are relevant / cited documents (cases with relevant docs and citations).
    pub citation_precision: Option<f64>,
    /// Relevant documents cited / relevant documents.
    pub citation_recall: Option<f64>,
    /// The answer abstained (cases with nothing readable to answer from).
    pub abstained: Option<bool>,
    /// Leaks found (any fails the run).
    pub leaks: Vec<Leak>,
    /// Why the case could not be observed (a failed request): it has no metrics and fails
    /// the gate.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// The first ten distinct documents retrieved, in rank order (ids only: a failed case can
    /// be looked at without re-running it).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub retrieved: Vec<String>,
    /// The documents the answer cited (`airlock.cited`, else every citation), in order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub cited: Vec<String>,
    /// The answer's text: recorded only when the operator asks for it (`--record-answers`),
    /// since an answer quotes documents.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub answer: Option<String>,
    /// How many values ([`answer_values`]) the answer states that neither a shown source nor
    /// the question holds (answers that do not abstain, when the sources' texts are known).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub invented_values: Option<usize>,
    /// The answer's length in words (answers that do not abstain).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub answer_words: Option<usize>,
}

impl CaseScore {
    /// A case whose requests failed: no metric applies, the error is recorded.
    pub fn failed(case: &GoldenCase, error: String) -> Self {
        CaseScore {
            id: case.id.clone(),
            kind: case.kind.as_str().into(),
            phase: case.phase.as_str().into(),
            ndcg_10: None,
            recall_10: None,
            recall_100: None,
            mrr_10: None,
            answer_hit: None,
            citation_precision: None,
            citation_recall: None,
            abstained: None,
            leaks: Vec::new(),
            error: Some(error),
            retrieved: Vec::new(),
            cited: Vec::new(),
            answer: None,
            invented_values: None,
            answer_words: None,
        }
    }
}

/// Scores one case from what the system returned.
pub fn score_case(case: &GoldenCase, obs: &Observation) -> CaseScore {
    let judged: BTreeMap<String, i32> = case
        .relevant_doc_ids
        .iter()
        .map(|d| (d.clone(), 1))
        .collect();
    let ranked = dedup_docs(&obs.retrieved_doc_ids);
    let has_relevant = !judged.is_empty();
    let cited = dedup_docs(obs.used_doc_ids.as_deref().unwrap_or(&obs.cited_doc_ids));
    let relevant_cited = cited.iter().filter(|d| judged.contains_key(**d)).count();
    // A refused request answers nothing, so its abstention counts even in retrieval-only runs.
    let answered = !obs.retrieval_only || obs.refused;
    let gave_answer = !obs.retrieval_only && !obs.refused && !is_abstention(&obs.answer);
    CaseScore {
        id: case.id.clone(),
        kind: case.kind.as_str().into(),
        phase: case.phase.as_str().into(),
        ndcg_10: has_relevant.then(|| ndcg_at_k(&ranked, &judged, 10)),
        recall_10: has_relevant.then(|| recall_at_k(&ranked, &judged, 10)),
        recall_100: None,
        mrr_10: has_relevant.then(|| mrr_at_k(&ranked, &judged, 10)),
        answer_hit: (answered && !obs.sources_only && !case.answer_contains.is_empty()).then(
            || {
                case.answer_contains
                    .iter()
                    .all(|s| contains_normalized(&obs.answer, s))
            },
        ),
        citation_precision: (answered && has_relevant && !cited.is_empty())
            .then(|| relevant_cited as f64 / cited.len() as f64),
        citation_recall: (answered && has_relevant)
            .then(|| relevant_cited as f64 / judged.len() as f64),
        abstained: (answered && !has_relevant).then(|| {
            obs.refused
                || if obs.sources_only {
                    cited.is_empty()
                } else {
                    is_abstention(&obs.answer)
                }
        }),
        leaks: leaks(case, obs),
        error: None,
        retrieved: ranked.iter().take(10).map(|d| (*d).to_owned()).collect(),
        cited: cited.iter().map(|d| (*d).to_owned()).collect(),
        answer: None,
        invented_values: gave_answer
            .then(|| {
                obs.source_texts
                    .as_ref()
                    .map(|t| invented_values(&obs.answer, &case.query, t).len())
            })
            .flatten(),
        answer_words: gave_answer.then(|| obs.answer.split_whitespace().count()),
    }
}

/// The values an answer states: tokens with a digit (numbers, dates, ports, versions, sizes),
/// command-line options (`-x`, `--name`), paths and dotted or underscored identifiers
/// (`/etc/ssh`, `sshd_config`, `os.path.join`), and spans in backticks. Source markers (`[1]`)
/// and surrounding punctuation are dropped. Lower-cased, in order, without repeats.
pub fn answer_values(answer: &str) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    let mut push = |v: &str| {
        let v = v.to_lowercase();
        if !v.is_empty() && !out.contains(&v) {
            out.push(v);
        }
    };
    let mut rest = answer;
    while let Some(a) = rest.find('`') {
        let Some(b) = rest[a + 1..].find('`') else {
            break;
        };
        push(rest[a + 1..a + 1 + b].trim());
        rest = &rest[a + 2 + b..];
    }
    for raw in answer.split(|c: char| c.is_whitespace() || c == '`') {
        let t = raw.trim_matches(|c: char| {
            matches!(
                c,
                '.' | ','
                    | ';'
                    | ':'
                    | '!'
                    | '?'
                    | '('
                    | ')'
                    | '"'
                    | '\''
                    | '['
                    | ']'
                    | '*'
                    | '“'
                    | '”'
                    | '‘'
                    | '’'
            )
        });
        // `[1]`, `[2,3]`: source markers, not values.
        if raw.starts_with('[') && t.chars().all(|c| c.is_ascii_digit() || c == ',') {
            continue;
        }
        let word = |c: char| c.is_alphanumeric();
        let has_digit = t.chars().any(|c| c.is_ascii_digit());
        let option = t.len() > 1
            && t.starts_with('-')
            && t.trim_start_matches('-').chars().next().is_some_and(word);
        let inner = |sep: char| {
            t.char_indices().any(|(i, c)| {
                c == sep
                    && t[..i].chars().next_back().is_some_and(word)
                    && t[i + c.len_utf8()..].chars().next().is_some_and(word)
            })
        };
        let path = t.len() > 1 && t.starts_with('/') && t[1..].chars().next().is_some_and(word);
        if has_digit || option || path || inner('_') || inner('.') || inner('/') {
            push(t);
        }
    }
    out
}

/// The values of `answer` ([`answer_values`]) that neither a source nor the question holds
/// (compared after [`normalize`], so case and spacing do not matter).
pub fn invented_values(answer: &str, question: &str, sources: &[String]) -> Vec<String> {
    let held: Vec<String> = sources
        .iter()
        .map(|s| normalize(s))
        .chain(std::iter::once(normalize(question)))
        .collect();
    answer_values(answer)
        .into_iter()
        .filter(|v| {
            let v = normalize(v);
            !v.trim().is_empty() && !held.iter().any(|h| h.contains(v.trim()))
        })
        .collect()
}

/// A mean with a bootstrap 95% confidence interval.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Estimate {
    /// Sample mean.
    pub mean: f64,
    /// 2.5th percentile of the bootstrap means.
    pub lo: f64,
    /// 97.5th percentile of the bootstrap means.
    pub hi: f64,
    /// Number of samples.
    pub n: usize,
}

/// Mean and percentile-bootstrap 95% interval (`resamples` draws, fixed `seed` for repeatability).
/// Returns `None` for an empty sample.
pub fn bootstrap(values: &[f64], resamples: usize, seed: u64) -> Option<Estimate> {
    if values.is_empty() {
        return None;
    }
    let n = values.len();
    let mean = values.iter().sum::<f64>() / n as f64;
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut means: Vec<f64> = (0..resamples.max(1))
        .map(|_| (0..n).map(|_| values[rng.random_range(0..n)]).sum::<f64>() / n as f64)
        .collect();
    means.sort_by(f64::total_cmp);
    let pick = |q: f64| means[((means.len() - 1) as f64 * q).round() as usize];
    Some(Estimate {
        mean,
        lo: pick(0.025),
        hi: pick(0.975),
        n,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::formats::{CaseKind, Phase};

    fn judged(pairs: &[(&str, i32)]) -> BTreeMap<String, i32> {
        pairs.iter().map(|(d, g)| (d.to_string(), *g)).collect()
    }

    #[test]
    fn ndcg_matches_hand_computed_example() {
        // Relevant: a, c, e (binary). Ranking: a b c d.
        // DCG = 1/log2(2) + 1/log2(4) = 1 + 0.5 = 1.5
        // IDCG@10 (3 relevant) = 1 + 1/log2(3) + 1/log2(4) = 1 + 0.63093 + 0.5 = 2.13093
        let j = judged(&[("a", 1), ("c", 1), ("e", 1), ("z", 0)]);
        let r = ["a", "b", "c", "d"];
        let got = ndcg_at_k(&r, &j, 10);
        assert!((got - 1.5 / 2.130_929_753_571_457).abs() < 1e-9, "{got}");
        assert!((recall_at_k(&r, &j, 10) - 2.0 / 3.0).abs() < 1e-12);
        assert!((recall_at_k(&r, &j, 1) - 1.0 / 3.0).abs() < 1e-12);
        assert_eq!(mrr_at_k(&["b", "c"], &j, 10), 0.5);
        assert_eq!(mrr_at_k(&["b", "c"], &j, 1), 0.0);
        // Graded: gain = grade (trec_eval), ideal order 2 then 1.
        let g = judged(&[("a", 1), ("b", 2)]);
        let got = ndcg_at_k(&["a", "b"], &g, 10);
        let want = (1.0 + 2.0 / 3f64.log2()) / (2.0 + 1.0 / 3f64.log2());
        assert!((got - want).abs() < 1e-12);
        assert_eq!(ndcg_at_k(&["a"], &judged(&[]), 10), 0.0);
    }

    #[test]
    fn dedup_keeps_first_rank() {
        assert_eq!(dedup_docs(&["a", "b", "a", "c", "b"]), vec!["a", "b", "c"]);
    }

    fn case(
        relevant: &[&str],
        contains: &[&str],
        forbidden: &[&str],
        strings: &[&str],
    ) -> GoldenCase {
        let v = |x: &[&str]| x.iter().map(|s| s.to_string()).collect();
        GoldenCase {
            history: Vec::new(),
            id: "c".into(),
            user: "u".into(),
            query: "q".into(),
            relevant_doc_ids: v(relevant),
            answer_contains: v(contains),
            forbidden_doc_ids: v(forbidden),
            forbidden_strings: v(strings),
            phase: Phase::V1,
            kind: CaseKind::Answerable,
            valid_phases: vec![Phase::V1],
            note: None,
        }
    }

    #[test]
    fn case_scoring_and_leaks() {
        let c = case(&["d1", "d2"], &["42 minutes"], &["d9"], &["SECRET-1"]);
        let obs = Observation {
            retrieved_doc_ids: vec!["d1".into(), "d1".into(), "d3".into()],
            cited_doc_ids: vec!["d1".into(), "d3".into()],
            answer: "It is 42 minutes [1].".into(),
            ..Default::default()
        };
        let s = score_case(&c, &obs);
        assert_eq!(s.answer_hit, Some(true));
        assert_eq!(s.citation_precision, Some(0.5));
        assert_eq!(s.citation_recall, Some(0.5));
        assert_eq!(s.recall_10, Some(0.5));
        assert!(s.leaks.is_empty());
        assert_eq!(s.abstained, None);

        let leaky = Observation {
            retrieved_doc_ids: vec!["d9".into()],
            snippets: vec!["... secret-1 ...".into()],
            answer: "I cannot find this in the sources.".into(),
            ..Default::default()
        };
        let denied = case(&[], &[], &["d9"], &["SECRET-1"]);
        let s = score_case(&denied, &leaky);
        assert_eq!(s.abstained, Some(true));
        let kinds: Vec<&str> = s.leaks.iter().map(|l| l.kind.as_str()).collect();
        assert_eq!(kinds, ["doc_in_results", "string_in_snippet"]);
    }

    #[test]
    fn citation_metrics_score_the_used_sources_and_leaks_every_listed_one() {
        let c = case(&["d1", "d2"], &[], &["d9"], &[]);
        let obs = Observation {
            cited_doc_ids: vec!["d1".into(), "d3".into(), "d9".into(), "d1".into()],
            used_doc_ids: Some(vec!["d1".into()]),
            answer: "Forty-two.".into(),
            ..Default::default()
        };
        let s = score_case(&c, &obs);
        assert_eq!(s.citation_precision, Some(1.0));
        assert_eq!(s.citation_recall, Some(0.5));
        let kinds: Vec<&str> = s.leaks.iter().map(|l| l.kind.as_str()).collect();
        assert_eq!(
            kinds,
            ["doc_in_citations"],
            "a listed source leaks even if unused"
        );
        // An answer that used no source: precision does not apply, recall is 0.
        let none = Observation {
            used_doc_ids: Some(Vec::new()),
            ..obs
        };
        let s = score_case(&c, &none);
        assert_eq!((s.citation_precision, s.citation_recall), (None, Some(0.0)));
    }

    #[test]
    fn retrieval_only_scoring_skips_answer_metrics_but_not_leaks() {
        let c = case(&["d1"], &["42 minutes"], &["d9"], &["SECRET-1"]);
        let obs = Observation {
            retrieved_doc_ids: vec!["d1".into(), "d9".into()],
            retrieval_only: true,
            ..Default::default()
        };
        let s = score_case(&c, &obs);
        assert_eq!(s.recall_10, Some(1.0));
        assert_eq!(s.mrr_10, Some(1.0));
        assert_eq!(
            (s.answer_hit, s.citation_precision, s.citation_recall),
            (None, None, None),
            "no answer was asked for: no answer metrics"
        );
        assert_eq!(s.leaks.len(), 1, "a forbidden result still leaks");

        let denied = case(&[], &[], &["d9"], &["SECRET-1"]);
        let quiet = Observation {
            retrieval_only: true,
            ..Default::default()
        };
        assert_eq!(score_case(&denied, &quiet).abstained, None);
        let refused = Observation {
            retrieval_only: true,
            refused: true,
            ..Default::default()
        };
        assert_eq!(
            score_case(&denied, &refused).abstained,
            Some(true),
            "a 401 is an abstention whether or not an answer was asked for"
        );
    }

    #[test]
    fn answer_values_are_numbers_options_paths_and_identifiers() {
        assert_eq!(
            answer_values("Use `ssh -p 2222` or --port; see /etc/ssh/sshd_config [1]. It was 3.5."),
            [
                "ssh -p 2222",
                "-p",
                "2222",
                "--port",
                "/etc/ssh/sshd_config",
                "3.5"
            ]
        );
        assert_eq!(
            answer_values("Set os.path.join and max_size [2,3]."),
            ["os.path.join", "max_size"]
        );
        assert!(answer_values("The answer is yes, it is enabled by default.").is_empty());
    }

    #[test]
    fn invented_values_are_the_ones_no_source_or_question_holds() {
        let sources = vec!["The default port is 22.\nUse -p to change it.".to_owned()];
        let q = "Which port does sshd use on 2026-01-01?";
        assert!(invented_values("It listens on 22; use -p [1].", q, &sources).is_empty());
        assert!(invented_values("Since 2026-01-01 it is 22.", q, &sources).is_empty());
        assert_eq!(
            invented_values("It listens on 2222 with --port.", q, &sources),
            ["2222", "--port"]
        );
        let c = case(&["d1"], &["22"], &[], &[]);
        let obs = Observation {
            answer: "Port 2222 [1].".into(),
            source_texts: Some(sources.clone()),
            ..Default::default()
        };
        let s = score_case(&c, &obs);
        assert_eq!((s.invented_values, s.answer_words), (Some(1), Some(3)));
        let abstains = Observation {
            answer: "I don't know.".into(),
            source_texts: Some(sources),
            ..Default::default()
        };
        let s = score_case(&c, &abstains);
        assert_eq!((s.invented_values, s.answer_words), (None, None));
        let unknown = Observation {
            answer: "Port 2222.".into(),
            ..Default::default()
        };
        assert_eq!(
            score_case(&c, &unknown).invented_values,
            None,
            "sources unknown"
        );
    }

    #[test]
    fn bootstrap_interval_brackets_mean_and_is_repeatable() {
        let v: Vec<f64> = (0..100).map(|i| (i % 2) as f64).collect();
        let e = bootstrap(&v, 1000, 7).unwrap();
        assert_eq!(e.mean, 0.5);
        assert!(
            e.lo < 0.5 && e.hi > 0.5 && e.lo > 0.35 && e.hi < 0.65,
            "{e:?}"
        );
        assert_eq!(bootstrap(&v, 1000, 7), Some(e));
        assert!(bootstrap(&[], 10, 1).is_none());
        let c = bootstrap(&[1.0; 5], 100, 1).unwrap();
        assert_eq!((c.lo, c.hi), (1.0, 1.0));
    }
}
