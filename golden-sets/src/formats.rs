//! Set formats, parsed strictly with line-numbered errors.
//!
//! - BEIR layout (retrieval sets): `corpus.jsonl` (`_id`, `title`, `text`, `metadata`),
//!   `queries.jsonl` (`_id`, `text`), `qrels/<split>.tsv` (header `query-id corpus-id score`).
//! - Airlock golden JSONL (end-to-end sets): one [`GoldenCase`] per line.

use std::collections::{BTreeMap, HashSet};
use std::fs;
use std::path::{Path, PathBuf};

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::Error;

/// The phase of an end-to-end run in which a case is asked.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    /// After ingest and the first IAM snapshot.
    V1,
    /// After the second IAM snapshot.
    V2,
    /// After the source deletions were tombstoned.
    AfterDelete,
}

impl Phase {
    /// All phases in run order.
    pub const ALL: [Phase; 3] = [Phase::V1, Phase::V2, Phase::AfterDelete];

    /// The name used in files and reports.
    pub fn as_str(self) -> &'static str {
        match self {
            Phase::V1 => "v1",
            Phase::V2 => "v2",
            Phase::AfterDelete => "after_delete",
        }
    }
}

/// What a case tests (reported per kind): one of the known kinds of Airlock's own sets, or any
/// other label a customer's set uses (e.g. `injection`, `title_probe`). Every kind is scored by
/// the same rules ([`crate::metrics::score_case`]: leaks always, the answer when
/// `answer_contains` is given, abstention when `relevant_doc_ids` is empty) and reported as its
/// own group. In files a kind is its label, a string of 1 to [`CaseKind::MAX_LEN`] characters
/// from `a-z`, `0-9`, `_` and `-`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum CaseKind {
    /// The user may read a document that answers.
    Answerable,
    /// The answer exists only in documents the user may not read.
    AclDenied,
    /// Readable before the second snapshot, not after.
    AclRevoked,
    /// Not readable before the second snapshot, readable after.
    AclGranted,
    /// The only source was deleted.
    Deleted,
    /// A public summary and a restricted full version.
    NearDuplicate,
    /// The answer needs two readable documents.
    MultiDoc,
    /// A follow-up question: asked after the case's `history` of earlier turns.
    FollowUp,
    /// Any other label (a customer's own kind), already validated.
    Custom(String),
}

impl CaseKind {
    /// The longest kind label accepted.
    pub const MAX_LEN: usize = 64;

    /// The known kinds.
    pub const KNOWN: [CaseKind; 8] = [
        CaseKind::Answerable,
        CaseKind::AclDenied,
        CaseKind::AclRevoked,
        CaseKind::AclGranted,
        CaseKind::Deleted,
        CaseKind::NearDuplicate,
        CaseKind::MultiDoc,
        CaseKind::FollowUp,
    ];

    /// The name used in files and reports.
    pub fn as_str(&self) -> &str {
        match self {
            CaseKind::Answerable => "answerable",
            CaseKind::AclDenied => "acl_denied",
            CaseKind::AclRevoked => "acl_revoked",
            CaseKind::AclGranted => "acl_granted",
            CaseKind::Deleted => "deleted",
            CaseKind::NearDuplicate => "near_duplicate",
            CaseKind::MultiDoc => "multi_doc",
            CaseKind::FollowUp => "follow_up",
            CaseKind::Custom(label) => label,
        }
    }

    /// Whether this is one of [`CaseKind::KNOWN`].
    pub fn is_known(&self) -> bool {
        !matches!(self, CaseKind::Custom(_))
    }

    /// The kind named `label`: a known kind, else a custom one if the label is well-formed.
    pub fn parse(label: &str) -> Result<CaseKind, String> {
        if let Some(k) = CaseKind::KNOWN.iter().find(|k| k.as_str() == label) {
            return Ok(k.clone());
        }
        let well_formed = !label.is_empty()
            && label.len() <= CaseKind::MAX_LEN
            && label
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-');
        if well_formed {
            Ok(CaseKind::Custom(label.to_owned()))
        } else {
            Err(format!(
                "invalid kind {label:?}: a kind is 1 to {} characters from a-z, 0-9, `_` and `-`",
                CaseKind::MAX_LEN
            ))
        }
    }
}

impl Serialize for CaseKind {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for CaseKind {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Label;
        impl serde::de::Visitor<'_> for Label {
            type Value = CaseKind;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                write!(
                    f,
                    "a kind label of 1 to {} characters from a-z, 0-9, `_` and `-`",
                    CaseKind::MAX_LEN
                )
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<CaseKind, E> {
                CaseKind::parse(v).map_err(E::custom)
            }
        }
        d.deserialize_str(Label)
    }
}

/// One end-to-end case of an Airlock golden set.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GoldenCase {
    /// Unique case id.
    pub id: String,
    /// Who asks.
    pub user: String,
    /// Earlier turns of the conversation, oldest first (sent before `query`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub history: Vec<Turn>,
    /// The question.
    pub query: String,
    /// Documents the user may read that answer the question (empty: nothing readable does).
    pub relevant_doc_ids: Vec<String>,
    /// Strings a correct answer contains.
    pub answer_contains: Vec<String>,
    /// Documents that must never be retrieved, cited or quoted for this user in this phase.
    pub forbidden_doc_ids: Vec<String>,
    /// Strings that must never appear in the answer, citations or snippets.
    pub forbidden_strings: Vec<String>,
    /// The phase the case is asked in.
    pub phase: Phase,
    /// What the case tests.
    pub kind: CaseKind,
    /// Phases in which the case holds.
    pub valid_phases: Vec<Phase>,
    /// Free-text explanation of the access situation.
    #[serde(default)]
    pub note: Option<String>,
}

/// One earlier turn of a case's conversation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Turn {
    /// `user` or `assistant`.
    pub role: TurnRole,
    /// The text.
    pub content: String,
}

/// Who spoke a [`Turn`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TurnRole {
    /// The person.
    User,
    /// An earlier answer.
    Assistant,
}

/// A BEIR corpus document.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BeirDoc {
    /// Document id (`_id` in BEIR, `doc_id` in the bank layout).
    #[serde(alias = "_id", alias = "doc_id")]
    pub id: String,
    /// Title (may be empty).
    #[serde(default)]
    pub title: String,
    /// Body text.
    pub text: String,
    /// Free metadata.
    #[serde(default)]
    pub metadata: serde_json::Value,
}

/// A BEIR query.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BeirQuery {
    /// Query id.
    #[serde(rename = "_id")]
    pub id: String,
    /// Query text.
    pub text: String,
    /// Free metadata.
    #[serde(default)]
    pub metadata: serde_json::Value,
}

/// Relevance judgments: query id → (doc id → grade). Grades ≤ 0 are stored but not relevant.
pub type Qrels = BTreeMap<String, BTreeMap<String, i32>>;

/// A retrieval set in BEIR layout with one qrels split.
#[derive(Debug, Clone)]
pub struct BeirSet {
    /// Corpus documents in file order.
    pub corpus: Vec<BeirDoc>,
    /// Queries that have judgments in the split, in file order.
    pub queries: Vec<BeirQuery>,
    /// Judgments of the split.
    pub qrels: Qrels,
}

fn read(path: &Path) -> Result<String, Error> {
    fs::read_to_string(path).map_err(|source| Error::Io {
        path: path.to_owned(),
        source,
    })
}

/// Parses a JSON Lines file strictly: every non-blank line must be one `T`.
pub fn parse_jsonl<T: DeserializeOwned>(path: &Path, text: &str) -> Result<Vec<T>, Error> {
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let v = serde_json::from_str(line).map_err(|e| Error::Parse {
            path: path.to_owned(),
            line: i + 1,
            message: e.to_string(),
        })?;
        out.push(v);
    }
    Ok(out)
}

/// Reads an Airlock golden JSONL file; rejects unknown fields and duplicate case ids.
pub fn read_golden(path: &Path) -> Result<Vec<GoldenCase>, Error> {
    parse_golden(path, &read(path)?)
}

/// Parses the text of an Airlock golden JSONL file named `path` (for errors), with the checks
/// of [`read_golden`].
pub fn parse_golden(path: &Path, text: &str) -> Result<Vec<GoldenCase>, Error> {
    let cases: Vec<GoldenCase> = parse_jsonl(path, text)?;
    let mut seen = HashSet::new();
    for (i, c) in cases.iter().enumerate() {
        if !seen.insert(c.id.as_str()) {
            return Err(Error::Invalid {
                path: path.to_owned(),
                message: format!("duplicate case id {:?} (case #{})", c.id, i + 1),
            });
        }
        if !c.valid_phases.contains(&c.phase) {
            return Err(Error::Invalid {
                path: path.to_owned(),
                message: format!("case {:?}: phase is not among valid_phases", c.id),
            });
        }
    }
    Ok(cases)
}

/// Parses a BEIR qrels TSV (header line, then `query-id<TAB>corpus-id<TAB>score`).
pub fn parse_qrels(path: &Path, text: &str) -> Result<Qrels, Error> {
    let mut qrels = Qrels::new();
    let mut lines = text.lines().enumerate();
    match lines.next() {
        Some((_, h))
            if h.split('\t')
                .map(str::trim)
                .eq(["query-id", "corpus-id", "score"]) => {}
        _ => {
            return Err(Error::Parse {
                path: path.to_owned(),
                line: 1,
                message: "expected header `query-id<TAB>corpus-id<TAB>score`".into(),
            });
        }
    }
    for (i, line) in lines {
        if line.trim().is_empty() {
            continue;
        }
        let parse_err = |message: String| Error::Parse {
            path: path.to_owned(),
            line: i + 1,
            message,
        };
        let fields: Vec<&str> = line.split('\t').collect();
        let [q, d, s] = fields[..] else {
            return Err(parse_err(format!(
                "expected 3 tab-separated fields, found {}",
                fields.len()
            )));
        };
        let score: i32 = s
            .trim()
            .parse()
            .map_err(|_| parse_err(format!("score {s:?} is not an integer")))?;
        if qrels
            .entry(q.trim().to_owned())
            .or_default()
            .insert(d.trim().to_owned(), score)
            .is_some()
        {
            return Err(parse_err(format!("duplicate judgment for ({q}, {d})")));
        }
    }
    Ok(qrels)
}

/// Reads a BEIR set directory with the given qrels split (e.g. `dev`).
pub fn read_beir(dir: &Path, split: &str) -> Result<BeirSet, Error> {
    let p = |f: &str| -> PathBuf { dir.join(f) };
    let corpus_path = p("corpus.jsonl");
    let corpus: Vec<BeirDoc> = parse_jsonl(&corpus_path, &read(&corpus_path)?)?;
    let queries_path = p("queries.jsonl");
    let all_queries: Vec<BeirQuery> = parse_jsonl(&queries_path, &read(&queries_path)?)?;
    let qrels_path = dir.join("qrels").join(format!("{split}.tsv"));
    let qrels = parse_qrels(&qrels_path, &read(&qrels_path)?)?;
    let ids: HashSet<&str> = all_queries.iter().map(|q| q.id.as_str()).collect();
    if let Some(q) = qrels.keys().find(|q| !ids.contains(q.as_str())) {
        return Err(Error::Invalid {
            path: qrels_path,
            message: format!("judgments for query {q:?} which is not in queries.jsonl"),
        });
    }
    let queries = all_queries
        .into_iter()
        .filter(|q| qrels.contains_key(&q.id))
        .collect();
    Ok(BeirSet {
        corpus,
        queries,
        qrels,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn golden_rejects_unknown_fields_with_line_number() {
        let p = Path::new("g.jsonl");
        let good = r#"{"id":"a","user":"u1","query":"q","relevant_doc_ids":[],"answer_contains":[],"forbidden_doc_ids":[],"forbidden_strings":[],"phase":"v1","kind":"answerable","valid_phases":["v1"]}"#;
        let bad = good.replace("\"kind\"", "\"extra\":1,\"kind\"");
        let ok: Vec<GoldenCase> = parse_jsonl(p, good).unwrap();
        assert_eq!(ok[0].kind, CaseKind::Answerable);
        let err = parse_jsonl::<GoldenCase>(p, &format!("{good}\n\n{bad}")).unwrap_err();
        let msg = err.to_string();
        assert!(msg.starts_with("g.jsonl:3:"), "{msg}");
        assert!(msg.contains("unknown field `extra`"), "{msg}");
    }

    #[test]
    fn golden_accepts_custom_kinds_and_rejects_malformed_ones_with_line_number() {
        let p = Path::new("bank.jsonl");
        let line = |id: &str, kind: &str| {
            format!(
                r#"{{"id":"{id}","user":"u1","query":"q","relevant_doc_ids":[],"answer_contains":[],"forbidden_doc_ids":[],"forbidden_strings":[],"phase":"v1","kind":{kind},"valid_phases":["v1"]}}"#
            )
        };
        let text = [
            line("a", r#""injection""#),
            line("b", r#""title_probe""#),
            line("c", r#""enumeration-2""#),
            line("d", r#""follow_up""#),
        ]
        .join("\n");
        let cases = parse_golden(p, &text).unwrap();
        let kinds: Vec<&str> = cases.iter().map(|c| c.kind.as_str()).collect();
        assert_eq!(
            kinds,
            ["injection", "title_probe", "enumeration-2", "follow_up"]
        );
        assert_eq!(cases[0].kind, CaseKind::Custom("injection".into()));
        assert_eq!(
            cases[3].kind,
            CaseKind::FollowUp,
            "a known label stays known"
        );
        // The label is written back as it was read.
        let json = serde_json::to_value(&cases[1]).unwrap();
        assert_eq!(json["kind"], "title_probe");

        let long = format!("\"{}\"", "k".repeat(CaseKind::MAX_LEN + 1));
        let max = format!("\"{}\"", "k".repeat(CaseKind::MAX_LEN));
        assert!(parse_golden(p, &line("m", &max)).is_ok());
        for bad in [
            r#""""#,
            r#""Title Probe""#,
            r#""injéction""#,
            r#""a.b""#,
            long.as_str(),
            "7",
        ] {
            let text = format!("{}\n{}", line("ok", r#""answerable""#), line("x", bad));
            let msg = parse_golden(p, &text).unwrap_err().to_string();
            assert!(msg.starts_with("bank.jsonl:2:"), "{bad}: {msg}");
            assert!(msg.contains("kind"), "{bad}: {msg}");
        }
    }

    #[test]
    fn qrels_need_header_and_integer_scores() {
        let p = Path::new("q.tsv");
        let q = parse_qrels(p, "query-id\tcorpus-id\tscore\n1\t184\t1\n1\t29\t0\n").unwrap();
        assert_eq!(q["1"]["184"], 1);
        assert!(parse_qrels(p, "1\t184\t1\n").is_err());
        let e = parse_qrels(p, "query-id\tcorpus-id\tscore\n1\t2\tx\n").unwrap_err();
        assert!(e.to_string().starts_with("q.tsv:2:"), "{e}");
        assert!(parse_qrels(p, "query-id\tcorpus-id\tscore\n1\t2\t1\n1\t2\t1\n").is_err());
    }
}
