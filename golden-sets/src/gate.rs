//! Reports, baselines and the release gate.
//!
//! A [`Report`] holds every case's scores and their summaries (overall, per kind, per phase).
//! A [`Baseline`] keeps the headline means of an accepted release. The [`gate`] fails a candidate
//! on any leak, on any headline metric below `baseline − ε`, or on any frozen regression case that
//! now fails.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::Error;
use crate::metrics::{CaseScore, Estimate, bootstrap};

/// Bootstrap resamples used for confidence intervals.
pub const BOOTSTRAP_RESAMPLES: usize = 1000;
const BOOTSTRAP_SEED: u64 = 0x5eed;

/// Summary of a group of cases.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Summary {
    /// Number of cases.
    pub cases: usize,
    /// Cases with at least one leak.
    pub leaking_cases: usize,
    /// Cases whose requests failed (no metrics; any fails the gate).
    #[serde(default)]
    pub failed_cases: usize,
    /// Headline metrics by name (`ndcg_10`, `recall_10`, `mrr_10`, `answer_hit_rate`,
    /// `citation_precision`, `citation_recall`, `abstention_rate`): mean with a 95% interval.
    pub metrics: BTreeMap<String, Estimate>,
    /// What the answers look like, not gated (lower is not worse for every one of them):
    /// `invented_value_rate` (answers stating a value no shown source holds, over answers that
    /// do not abstain and whose sources are known) and `answer_words_median`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub answers: BTreeMap<String, f64>,
}

/// The names of the headline metrics, in report order.
pub const HEADLINE: [&str; 8] = [
    "ndcg_10",
    "recall_10",
    "recall_100",
    "mrr_10",
    "answer_hit_rate",
    "citation_precision",
    "citation_recall",
    "abstention_rate",
];

fn metric_values(cases: &[&CaseScore], name: &str) -> Vec<f64> {
    let b = |x: bool| if x { 1.0 } else { 0.0 };
    cases
        .iter()
        .filter_map(|c| match name {
            "ndcg_10" => c.ndcg_10,
            "recall_10" => c.recall_10,
            "recall_100" => c.recall_100,
            "mrr_10" => c.mrr_10,
            "answer_hit_rate" => c.answer_hit.map(b),
            "citation_precision" => c.citation_precision,
            "citation_recall" => c.citation_recall,
            "abstention_rate" => c.abstained.map(b),
            _ => None,
        })
        .collect()
}

/// Summarises a group of case scores.
pub fn summarize(cases: &[&CaseScore]) -> Summary {
    let metrics = HEADLINE
        .iter()
        .filter_map(|&name| {
            bootstrap(
                &metric_values(cases, name),
                BOOTSTRAP_RESAMPLES,
                BOOTSTRAP_SEED,
            )
            .map(|e| (name.to_owned(), e))
        })
        .collect();
    Summary {
        cases: cases.len(),
        leaking_cases: cases.iter().filter(|c| !c.leaks.is_empty()).count(),
        failed_cases: cases.iter().filter(|c| c.error.is_some()).count(),
        metrics,
        answers: answer_shape(cases),
    }
}

/// [`Summary::answers`] of a group.
fn answer_shape(cases: &[&CaseScore]) -> BTreeMap<String, f64> {
    let mut out = BTreeMap::new();
    let invented: Vec<usize> = cases.iter().filter_map(|c| c.invented_values).collect();
    if !invented.is_empty() {
        let with = invented.iter().filter(|&&n| n > 0).count();
        out.insert(
            "invented_value_rate".to_owned(),
            with as f64 / invented.len() as f64,
        );
    }
    let mut words: Vec<usize> = cases.iter().filter_map(|c| c.answer_words).collect();
    if !words.is_empty() {
        words.sort_unstable();
        out.insert(
            "answer_words_median".to_owned(),
            words[(words.len() - 1) / 2] as f64,
        );
    }
    out
}

/// Whether a case passes on its own terms: no leak, the expected answer found, an abstention
/// where nothing readable answers.
pub fn case_passes(c: &CaseScore) -> bool {
    c.error.is_none()
        && c.leaks.is_empty()
        && c.answer_hit != Some(false)
        && c.abstained != Some(false)
}

/// A full evaluation report.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Report {
    /// Name of the set.
    pub set: String,
    /// Bundle version evaluated, as the daemon reported it.
    pub bundle_version: Option<String>,
    /// Forced ladder rung, if any.
    pub rung: Option<u8>,
    /// All cases.
    pub overall: Summary,
    /// Per case kind.
    pub per_kind: BTreeMap<String, Summary>,
    /// Per phase.
    pub per_phase: BTreeMap<String, Summary>,
    /// Latency percentiles per stage in milliseconds (`stage` → `{"p50", "p95"}`).
    pub latency_ms: BTreeMap<String, BTreeMap<String, f64>>,
    /// Every case's scores.
    pub cases: Vec<CaseScore>,
    /// The same answered cases answered by the plain baseline (`airlock eval run
    /// --plain-baseline`): the same retrieval and model, a plain top-k prompt.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub plain_baseline: Option<Box<Report>>,
    /// Only the prompt sources were scored (`airlock eval run --sources-only`): no answers;
    /// citation recall is an answering document among the prompt sources, abstention no
    /// prompt source. Not release evidence: the gate misses the answer metrics.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub sources_only: bool,
}

impl Report {
    /// Builds a report from case scores and per-stage latency samples (ms).
    pub fn new(
        set: &str,
        bundle_version: Option<String>,
        rung: Option<u8>,
        cases: Vec<CaseScore>,
        latency_samples: &BTreeMap<String, Vec<f64>>,
    ) -> Self {
        let all: Vec<&CaseScore> = cases.iter().collect();
        let group = |key: fn(&CaseScore) -> &str| {
            let mut m: BTreeMap<String, Vec<&CaseScore>> = BTreeMap::new();
            for c in &cases {
                m.entry(key(c).to_owned()).or_default().push(c);
            }
            m.into_iter()
                .map(|(k, v)| (k, summarize(&v)))
                .collect::<BTreeMap<_, _>>()
        };
        let latency_ms = latency_samples
            .iter()
            .filter(|(_, v)| !v.is_empty())
            .map(|(stage, v)| {
                let mut v = v.clone();
                v.sort_by(f64::total_cmp);
                let p = |q: f64| v[((v.len() - 1) as f64 * q).round() as usize];
                let m = BTreeMap::from([("p50".to_owned(), p(0.5)), ("p95".to_owned(), p(0.95))]);
                (stage.clone(), m)
            })
            .collect();
        Report {
            set: set.into(),
            bundle_version,
            rung,
            overall: summarize(&all),
            per_kind: group(|c| c.kind.as_str()),
            per_phase: group(|c| c.phase.as_str()),
            latency_ms,
            cases,
            plain_baseline: None,
            sources_only: false,
        }
    }

    /// The answer path beside the plain baseline, group by group (answered cases only: the
    /// plain baseline answers the same ones), as a Markdown table.
    fn beside(&self, plain: &Report) -> String {
        let mut s = String::from(
            "\n## Beside the plain baseline (same retrieval and model, plain top-k prompt)\n\n\
             | group | answer hit | abstention | citation recall | invented-value rate | \
             median words | leaking cases |\n|---|---|---|---|---|---|---|\n",
        );
        let answered: std::collections::HashSet<&str> =
            plain.cases.iter().map(|c| c.id.as_str()).collect();
        let ours: Vec<&CaseScore> = self
            .cases
            .iter()
            .filter(|c| answered.contains(c.id.as_str()))
            .collect();
        let theirs: Vec<&CaseScore> = plain.cases.iter().collect();
        let pair = |a: Option<f64>, b: Option<f64>| match (a, b) {
            (None, None) => "–".to_owned(),
            (a, b) => {
                let f = |x: Option<f64>| x.map_or("–".into(), |v| format!("{v:.3}"));
                format!("{} / {}", f(a), f(b))
            }
        };
        let mut row = |name: &str, a: &[&CaseScore], b: &[&CaseScore]| {
            let (x, y) = (summarize(a), summarize(b));
            let m = |sm: &Summary, k: &str| sm.metrics.get(k).map(|e| e.mean);
            let d = |sm: &Summary, k: &str| sm.answers.get(k).copied();
            let _ = writeln!(
                s,
                "| {name} | {} | {} | {} | {} | {} | {} / {} |",
                pair(m(&x, "answer_hit_rate"), m(&y, "answer_hit_rate")),
                pair(m(&x, "abstention_rate"), m(&y, "abstention_rate")),
                pair(m(&x, "citation_recall"), m(&y, "citation_recall")),
                pair(d(&x, "invented_value_rate"), d(&y, "invented_value_rate")),
                pair(d(&x, "answer_words_median"), d(&y, "answer_words_median")),
                x.leaking_cases,
                y.leaking_cases,
            );
        };
        row("**all** (answer path / plain)", &ours, &theirs);
        let mut kinds: Vec<&str> = ours.iter().map(|c| c.kind.as_str()).collect();
        kinds.sort_unstable();
        kinds.dedup();
        for k in kinds {
            let a: Vec<&CaseScore> = ours.iter().copied().filter(|c| c.kind == k).collect();
            let b: Vec<&CaseScore> = theirs.iter().copied().filter(|c| c.kind == k).collect();
            row(&format!("kind {k}"), &a, &b);
        }
        s
    }

    /// Total leaking cases, the plain baseline's included (its retrieval is the daemon's).
    pub fn leaks(&self) -> usize {
        self.overall.leaking_cases + self.plain_baseline.as_ref().map_or(0, |p| p.leaks())
    }

    /// Cases whose requests failed.
    pub fn failed(&self) -> usize {
        self.overall.failed_cases
    }

    /// A one-screen Markdown rendering.
    pub fn to_markdown(&self) -> String {
        let mut s = String::new();
        let _ = writeln!(s, "# Eval report: {}\n", self.set);
        let _ = writeln!(
            s,
            "bundle `{}`, rung {}, {} cases, **{} leaking**, {} failed\n",
            self.bundle_version.as_deref().unwrap_or("?"),
            self.rung.map_or("auto".into(), |r| r.to_string()),
            self.overall.cases,
            self.overall.leaking_cases,
            self.overall.failed_cases
        );
        if self.sources_only {
            s.push_str(
                "**Prompt sources only** (`--sources-only`, no answers): citation recall is an \
                 answering document among the chunks the chat would place in its prompt, \
                 abstention is no such chunk (the answer path then abstains without \
                 generating).\n\n",
            );
        }
        let _ = writeln!(s, "| group | cases | leaks | {} |", HEADLINE.join(" | "));
        let _ = writeln!(s, "|---|---|---|{}", "---|".repeat(HEADLINE.len()));
        let mut row = |name: &str, sm: &Summary| {
            let cells: Vec<String> = HEADLINE
                .iter()
                .map(|m| {
                    sm.metrics.get(*m).map_or("–".into(), |e| {
                        format!("{:.3} [{:.3}, {:.3}]", e.mean, e.lo, e.hi)
                    })
                })
                .collect();
            let _ = writeln!(
                s,
                "| {name} | {} | {} | {} |",
                sm.cases,
                sm.leaking_cases,
                cells.join(" | ")
            );
        };
        row("**all**", &self.overall);
        for (k, sm) in &self.per_kind {
            row(&format!("kind {k}"), sm);
        }
        for (k, sm) in &self.per_phase {
            row(&format!("phase {k}"), sm);
        }
        let shape = &self.overall.answers;
        if !shape.is_empty() {
            let cell = |k: &str| shape.get(k).map_or("–".into(), |v| format!("{v:.3}"));
            let _ = writeln!(
                s,
                "\nanswers: invented-value rate {}, median {} words\n",
                cell("invented_value_rate"),
                cell("answer_words_median")
            );
        }
        if let Some(plain) = &self.plain_baseline {
            s.push_str(&self.beside(plain));
        }
        if !self.latency_ms.is_empty() {
            let _ = writeln!(s, "\n| stage | p50 ms | p95 ms |\n|---|---|---|");
            for (stage, m) in &self.latency_ms {
                let _ = writeln!(
                    s,
                    "| {stage} | {:.1} | {:.1} |",
                    m.get("p50").copied().unwrap_or(f64::NAN),
                    m.get("p95").copied().unwrap_or(f64::NAN)
                );
            }
        }
        s
    }
}

/// Headline means of an accepted release.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Baseline {
    /// Set name the baseline was made on.
    pub set: String,
    /// Bundle version of the baseline.
    pub bundle_version: Option<String>,
    /// Metric name → mean.
    pub metrics: BTreeMap<String, f64>,
    /// Kind → metric name → mean (absent in baselines made before kinds were compared).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub per_kind: BTreeMap<String, BTreeMap<String, f64>>,
}

impl Baseline {
    /// Takes the headline means of a report.
    pub fn from_report(r: &Report) -> Self {
        Baseline {
            set: r.set.clone(),
            bundle_version: r.bundle_version.clone(),
            metrics: r
                .overall
                .metrics
                .iter()
                .map(|(k, e)| (k.clone(), e.mean))
                .collect(),
            per_kind: r
                .per_kind
                .iter()
                .map(|(kind, sm)| {
                    let means = sm.metrics.iter().map(|(k, e)| (k.clone(), e.mean));
                    (kind.clone(), means.collect())
                })
                .collect(),
        }
    }
}

/// Why a gate failed (one line each).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum GateFailure {
    /// Cases leaked forbidden material.
    Leaks(usize),
    /// Cases could not be observed (failed requests).
    FailedCases(usize),
    /// A headline metric fell below baseline − ε.
    MetricDrop {
        /// Metric name.
        metric: String,
        /// Baseline mean.
        baseline: f64,
        /// Candidate mean.
        candidate: f64,
    },
    /// A metric of the baseline is missing from the candidate.
    MetricMissing(String),
    /// A frozen regression case now fails.
    Regression(String),
}

/// The gate's decision.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Verdict {
    /// Reasons to refuse; empty means pass.
    pub failures: Vec<GateFailure>,
}

impl Verdict {
    /// Whether the candidate may ship.
    pub fn passed(&self) -> bool {
        self.failures.is_empty()
    }

    /// A one-screen verdict for operators.
    pub fn render(&self, report: &Report, baseline: &Baseline) -> String {
        let mut s = String::new();
        let _ = writeln!(
            s,
            "{}: set {}, candidate {} vs baseline {}",
            if self.passed() { "PASS" } else { "FAIL" },
            report.set,
            report.bundle_version.as_deref().unwrap_or("?"),
            baseline.bundle_version.as_deref().unwrap_or("?")
        );
        for m in HEADLINE {
            if let (Some(b), Some(c)) = (baseline.metrics.get(m), report.overall.metrics.get(m)) {
                let _ = writeln!(
                    s,
                    "  {m:<20} {:.4} -> {:.4} ({:+.4})",
                    b,
                    c.mean,
                    c.mean - b
                );
            }
        }
        let _ = writeln!(s, "  leaking cases        {}", report.leaks());
        // Per kind, for reading only: the gate decides on the overall metrics.
        for (kind, sm) in &report.per_kind {
            let base = baseline.per_kind.get(kind);
            let cells: Vec<String> = HEADLINE
                .iter()
                .filter_map(|m| {
                    let c = sm.metrics.get(*m)?.mean;
                    Some(match base.and_then(|b| b.get(*m)) {
                        Some(b) => format!("{m} {b:.4} -> {c:.4}"),
                        None => format!("{m} {c:.4}"),
                    })
                })
                .collect();
            let _ = writeln!(
                s,
                "  kind {kind} ({} cases, {} leaking{}): {}",
                sm.cases,
                sm.leaking_cases,
                if base.is_none() {
                    ", not in the baseline"
                } else {
                    ""
                },
                cells.join(", ")
            );
        }
        for f in &self.failures {
            let line = match f {
                GateFailure::Leaks(n) => {
                    format!("{n} case(s) leaked forbidden documents or strings")
                }
                GateFailure::FailedCases(n) => {
                    format!("{n} case(s) failed (their requests got no answer)")
                }
                GateFailure::MetricDrop {
                    metric,
                    baseline,
                    candidate,
                } => format!("{metric} fell from {baseline:.4} to {candidate:.4}"),
                GateFailure::MetricMissing(m) => format!("{m} is in the baseline but not measured"),
                GateFailure::Regression(id) => format!("regression case {id} now fails"),
            };
            let _ = writeln!(s, "  refused: {line}");
        }
        s
    }
}

/// Decides whether `report` may ship against `baseline` with tolerance `epsilon`, given frozen
/// regression case ids that must pass.
pub fn gate(report: &Report, baseline: &Baseline, epsilon: f64, regressions: &[String]) -> Verdict {
    let mut failures = Vec::new();
    if report.leaks() > 0 {
        failures.push(GateFailure::Leaks(report.leaks()));
    }
    if report.failed() > 0 {
        failures.push(GateFailure::FailedCases(report.failed()));
    }
    for (metric, &base) in &baseline.metrics {
        match report.overall.metrics.get(metric) {
            None => failures.push(GateFailure::MetricMissing(metric.clone())),
            Some(e) if e.mean < base - epsilon => failures.push(GateFailure::MetricDrop {
                metric: metric.clone(),
                baseline: base,
                candidate: e.mean,
            }),
            Some(_) => {}
        }
    }
    for id in regressions {
        match report.cases.iter().find(|c| &c.id == id) {
            Some(c) if case_passes(c) => {}
            _ => failures.push(GateFailure::Regression(id.clone())),
        }
    }
    Verdict { failures }
}

/// Reads a JSON file into `T`.
pub fn read_json<T: serde::de::DeserializeOwned>(path: &Path) -> Result<T, Error> {
    let text = std::fs::read_to_string(path).map_err(|source| Error::Io {
        path: path.to_owned(),
        source,
    })?;
    serde_json::from_str(&text).map_err(|e| Error::Parse {
        path: path.to_owned(),
        line: e.line(),
        message: e.to_string(),
    })
}

/// Reads a regression set: one case id per line (blank lines and `#` comments ignored).
pub fn read_regressions(path: &Path) -> Result<Vec<String>, Error> {
    let text = std::fs::read_to_string(path).map_err(|source| Error::Io {
        path: path.to_owned(),
        source,
    })?;
    Ok(text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(str::to_owned)
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::Leak;

    fn score(id: &str, hit: bool, ndcg: f64, leak: bool) -> CaseScore {
        CaseScore {
            id: id.into(),
            kind: "answerable".into(),
            phase: "v1".into(),
            ndcg_10: Some(ndcg),
            recall_10: Some(ndcg),
            recall_100: None,
            mrr_10: Some(ndcg),
            answer_hit: Some(hit),
            citation_precision: Some(1.0),
            citation_recall: Some(1.0),
            abstained: None,
            leaks: if leak {
                vec![Leak {
                    kind: "string_in_answer".into(),
                    what: "X".into(),
                }]
            } else {
                vec![]
            },
            error: None,
            retrieved: Vec::new(),
            cited: Vec::new(),
            answer: None,
            invented_values: None,
            answer_words: None,
        }
    }

    fn report(cases: Vec<CaseScore>) -> Report {
        Report::new("t", Some("1.0.0".into()), None, cases, &BTreeMap::new())
    }

    #[test]
    fn gate_passes_equal_and_fails_on_drop_leak_regression() {
        let base_r = report(vec![
            score("a", true, 0.8, false),
            score("b", true, 0.6, false),
        ]);
        let base = Baseline::from_report(&base_r);
        assert!(gate(&base_r, &base, 0.01, &["a".into()]).passed());

        let dropped = report(vec![
            score("a", true, 0.5, false),
            score("b", true, 0.6, false),
        ]);
        let v = gate(&dropped, &base, 0.01, &[]);
        assert!(
            v.failures.iter().any(
                |f| matches!(f, GateFailure::MetricDrop { metric, .. } if metric == "ndcg_10")
            )
        );
        // Within epsilon passes.
        let close = report(vec![
            score("a", true, 0.795, false),
            score("b", true, 0.6, false),
        ]);
        assert!(gate(&close, &base, 0.01, &[]).passed());

        let leaky = report(vec![
            score("a", true, 0.8, true),
            score("b", true, 0.6, false),
        ]);
        assert_eq!(
            gate(&leaky, &base, 0.01, &[]).failures,
            vec![GateFailure::Leaks(1)]
        );

        let regressed = report(vec![
            score("a", false, 0.8, false),
            score("b", true, 0.6, false),
        ]);
        let v = gate(&regressed, &base, 1.0, &["a".into()]);
        assert_eq!(v.failures, vec![GateFailure::Regression("a".into())]);
        assert!(v.render(&regressed, &base).starts_with("FAIL"));
        // A regression case missing from the report fails too.
        assert!(!gate(&base_r, &base, 0.01, &["zz".into()]).passed());

        // A case whose request failed fails the gate (even with metrics above the baseline)
        // and fails as a regression case.
        let mut b_failed = score("b", true, 0.6, false);
        b_failed.error = Some("case b: 504".into());
        let failed = report(vec![score("a", true, 0.9, false), b_failed]);
        assert_eq!(failed.failed(), 1);
        let v = gate(&failed, &base, 1.0, &["b".into()]);
        assert_eq!(
            v.failures,
            vec![
                GateFailure::FailedCases(1),
                GateFailure::Regression("b".into())
            ]
        );
        assert!(v.render(&failed, &base).contains("1 case(s) failed"));
    }

    /// A customer's set with its own kinds: each kind is scored by the generic rules and
    /// reported as its own group in report.json, the Markdown and the HTML report.
    #[test]
    fn custom_kinds_are_scored_generically_and_reported_as_groups() {
        use crate::formats::parse_golden;
        use crate::metrics::{Observation, score_case};
        let case = |id: &str, kind: &str, relevant: &str, contains: &str| {
            format!(
                r#"{{"id":"{id}","user":"u1","query":"q","relevant_doc_ids":{relevant},"answer_contains":{contains},"forbidden_doc_ids":["d9"],"forbidden_strings":["SECRET"],"phase":"v1","kind":"{kind}","valid_phases":["v1"]}}"#
            )
        };
        let text = [
            case("i1", "injection", "[]", "[]"),
            case("i2", "injection", "[]", "[]"),
            case("t1", "title_probe", r#"["d1"]"#, r#"["42"]"#),
            case("a1", "answerable", r#"["d1"]"#, r#"["42"]"#),
        ]
        .join("\n");
        let cases = parse_golden(Path::new("bank.jsonl"), &text).unwrap();
        let abstains = Observation {
            answer: "I cannot find this in the sources.".into(),
            ..Default::default()
        };
        let leaks_title = Observation {
            retrieved_doc_ids: vec!["d1".into()],
            titles: vec!["SECRET merger".into()],
            answer: "It is 42.".into(),
            ..Default::default()
        };
        let scores = vec![
            score_case(&cases[0], &abstains),
            score_case(
                &cases[1],
                &Observation {
                    answer: "Sure, here it is.".into(),
                    ..Default::default()
                },
            ),
            score_case(&cases[2], &leaks_title),
            score_case(&cases[3], &leaks_title),
        ];
        // Generic rules: abstention where nothing is relevant, the answer where it is given,
        // leaks always.
        assert_eq!(scores[0].abstained, Some(true));
        assert_eq!(scores[1].abstained, Some(false));
        assert_eq!(scores[0].answer_hit, None);
        assert_eq!(scores[2].answer_hit, Some(true));
        assert_eq!(scores[2].leaks.len(), 1);
        assert_eq!(scores[2].kind, "title_probe");

        let r = report(scores);
        let kinds: Vec<&str> = r.per_kind.keys().map(String::as_str).collect();
        assert_eq!(kinds, ["answerable", "injection", "title_probe"]);
        assert_eq!(r.per_kind["injection"].cases, 2);
        assert_eq!(r.per_kind["injection"].metrics["abstention_rate"].mean, 0.5);
        assert_eq!(r.per_kind["title_probe"].leaking_cases, 1);
        // report.json round-trips with the custom groups.
        let json = serde_json::to_string(&r).unwrap();
        let back: Report = serde_json::from_str(&json).unwrap();
        assert_eq!(back, r);
        assert!(r.to_markdown().contains("| kind injection | 2 | 0 |"));
        assert!(r.to_markdown().contains("| kind title_probe | 1 | 1 |"));
        assert!(crate::html::render(&r).contains("kind title_probe"));
    }

    /// The verdict compares each kind with the baseline's; a kind the baseline lacks is shown
    /// as new. Baselines written before per-kind means still load and gate.
    #[test]
    fn verdict_lists_every_kind_and_old_baselines_still_gate() {
        let base_r = report(vec![score("a", true, 0.8, false)]);
        let base = Baseline::from_report(&base_r);
        assert_eq!(base.per_kind["answerable"]["ndcg_10"], 0.8);
        let mut probe = score("p", true, 0.9, false);
        probe.kind = "title_probe".into();
        let cand = report(vec![score("a", true, 0.8, false), probe]);
        let v = gate(&cand, &base, 0.01, &[]);
        assert!(v.passed());
        let text = v.render(&cand, &base);
        assert!(
            text.contains("  kind answerable (1 cases, 0 leaking): ndcg_10 0.8000 -> 0.8000"),
            "{text}"
        );
        assert!(
            text.contains(
                "  kind title_probe (1 cases, 0 leaking, not in the baseline): ndcg_10 0.9000"
            ),
            "{text}"
        );
        // Round trip; the checked-in baseline loads with its per-kind means, and an older one
        // (recorded before baselines had them) still loads and gates.
        let json = serde_json::to_string(&base).unwrap();
        assert_eq!(serde_json::from_str::<Baseline>(&json).unwrap(), base);
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("baselines");
        let current: Baseline = read_json(&dir.join("bank-dev-demo-rung0.json")).unwrap();
        assert!(current.per_kind.contains_key("follow_up"));
        let old: Baseline =
            read_json(&dir.join("history/bank-dev-demo-rung0-5d60e41.json")).unwrap();
        assert!(old.per_kind.is_empty());
        let v = gate(&cand, &old, 0.01, &[]);
        assert!(
            !v.passed(),
            "the demo baseline's metrics are not all measured here"
        );
        assert!(
            v.render(&cand, &old)
                .contains("kind title_probe (1 cases, 0 leaking, not in the baseline)")
        );
    }

    #[test]
    fn summaries_group_by_kind_and_phase() {
        let r = report(vec![
            score("a", true, 1.0, false),
            score("b", false, 0.0, false),
        ]);
        assert_eq!(r.per_kind["answerable"].cases, 2);
        assert_eq!(r.overall.metrics["answer_hit_rate"].mean, 0.5);
        assert!(r.to_markdown().contains("| **all** | 2 | 0 |"));
    }
}
