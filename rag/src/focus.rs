//! Source focus: which of a chat prompt's candidate sources are about what the question asks.
//!
//! Retrieval finds chunks *similar* to the question; in a bank's document set many documents
//! are near-copies that differ only in the detail asked about (the same procedure for retail and
//! for institutional customers, the same pay letter for two employees, the same limits for two
//! branches). Given all of them, a small model often answers with the figure of the wrong one,
//! and the answer then cites that document. Focus keeps the documents that match the question's
//! *distinguishing* words as well as the best one does, and sets the rest aside.
//!
//! The score is lexical and local to the candidates, so it needs no model and no corpus
//! statistics:
//! - the question's words (lower case, English function words removed) and its pairs of
//!   adjacent content words ("thornbury agritech") are weighted by an inverse document frequency
//!   computed over the candidates themselves: a word every candidate contains ("Ireland" when
//!   all six are about Ireland) weighs almost nothing, a word only one contains
//!   ("institutional") weighs most;
//! - a chunk scores the best *sentence or line* it has (a table row counts as a line), each with
//!   the document's title added: the words must occur together, as a fact is stated, and a
//!   pair must stand side by side;
//! - a document scores its best chunk, and every chunk of a document scoring at least
//!   `ratio × best` is kept, in retrieval order.
//!
//! Measured on bank-dev's v1 questions (docs/operations/answer-sources.md): at ratio 0.9 the prompt keeps
//! 1.9 chunks instead of 5.5, with 0.35 instead of 3.7 documents that are not relevant; the
//! answer-bearing chunk stays in 148 of the 162 answerable prompts that had it. It is not a
//! ranking function for `/v1/retrieve` (on Cranfield, ordering by it lowers nDCG@10 from 0.42
//! to 0.38): it only chooses among sources already retrieved.

use std::collections::{HashMap, HashSet};

use airlock_text::is_stop;
pub use airlock_text::words;

/// One candidate source.
#[derive(Debug, Clone, Copy)]
pub struct Candidate<'a> {
    /// The document it belongs to (chunks of one document are judged together).
    pub doc_id: &'a str,
    /// The document's title (its words count in every line).
    pub title: &'a str,
    /// The chunk's text.
    pub text: &'a str,
}

/// The question's content words (distinct, function words removed).
pub fn question_terms(question: &str) -> Vec<String> {
    let mut seen = HashSet::new();
    words(question)
        .into_iter()
        .filter(|w| !is_stop(w))
        .filter(|w| seen.insert(w.clone()))
        .collect()
}

/// Pairs of content words adjacent in the question ("thornbury agritech", "retail park"):
/// a source must have them side by side, which tells "Thornbury Agritech" from a "Thornbury
/// Robotics" next to a "Ridgeway Agritech".
pub fn question_pairs(question: &str) -> Vec<(String, String)> {
    let w = words(question);
    let mut seen = HashSet::new();
    w.windows(2)
        .filter(|p| !is_stop(&p[0]) && !is_stop(&p[1]))
        .map(|p| (p[0].clone(), p[1].clone()))
        .filter(|p| seen.insert(p.clone()))
        .collect()
}

/// Lines and sentences of a chunk: split at line breaks and after `.`, `?` or `!` followed by
/// white space.
fn sentences(text: &str) -> impl Iterator<Item = &str> {
    text.split('\n').flat_map(|line| {
        let mut parts = Vec::new();
        let mut start = 0;
        let b = line.as_bytes();
        for i in 0..b.len() {
            if matches!(b[i], b'.' | b'?' | b'!')
                && b.get(i + 1).is_some_and(u8::is_ascii_whitespace)
            {
                parts.push(&line[start..=i]);
                start = i + 1;
            }
        }
        parts.push(&line[start..]);
        parts
    })
}

/// One unit a question term can match in: a sentence (or the title), as words and as pairs of
/// adjacent words.
struct Unit {
    words: HashSet<String>,
    pairs: HashSet<(String, String)>,
}

impl Unit {
    fn of(text: &str) -> Unit {
        let w = words(text);
        Unit {
            pairs: w.windows(2).map(|p| (p[0].clone(), p[1].clone())).collect(),
            words: w.into_iter().collect(),
        }
    }
}

/// Each candidate's focus score: the best sentence's summed weight of the question's words and
/// adjacent word pairs found in it or in the title, each weighted `ln((n + 1) / (df + 0.5))`
/// by the number `df` of the `n` candidates containing it.
pub fn scores(question: &str, candidates: &[Candidate<'_>]) -> Vec<f32> {
    let terms = question_terms(question);
    let pairs = question_pairs(question);
    if terms.is_empty() || candidates.is_empty() {
        return vec![0.0; candidates.len()];
    }
    let n = candidates.len() as f32;
    let weight = |df: usize| ((n + 1.0) / (df as f32 + 0.5)).ln();
    // Per candidate: its title and sentences.
    let units: Vec<(Unit, Vec<Unit>)> = candidates
        .iter()
        .map(|c| (Unit::of(c.title), sentences(c.text).map(Unit::of).collect()))
        .collect();
    let has_word = |(title, sents): &(Unit, Vec<Unit>), t: &String| {
        title.words.contains(t) || sents.iter().any(|u| u.words.contains(t))
    };
    let has_pair = |(title, sents): &(Unit, Vec<Unit>), p: &(String, String)| {
        title.pairs.contains(p) || sents.iter().any(|u| u.pairs.contains(p))
    };
    let word_w: Vec<f32> = terms
        .iter()
        .map(|t| weight(units.iter().filter(|u| has_word(u, t)).count()))
        .collect();
    let pair_w: Vec<f32> = pairs
        .iter()
        .map(|p| weight(units.iter().filter(|u| has_pair(u, p)).count()))
        .collect();
    units
        .iter()
        .map(|(title, sents)| {
            sents
                .iter()
                .map(|u| {
                    let w: f32 = terms
                        .iter()
                        .zip(&word_w)
                        .filter(|(t, _)| title.words.contains(*t) || u.words.contains(*t))
                        .map(|(_, w)| w)
                        .sum();
                    let p: f32 = pairs
                        .iter()
                        .zip(&pair_w)
                        .filter(|(p, _)| title.pairs.contains(*p) || u.pairs.contains(*p))
                        .map(|(_, w)| w)
                        .sum();
                    w + p
                })
                .fold(0.0, f32::max)
        })
        .collect()
}

/// Which candidates to keep (`true`) at `ratio` (0 keeps all; 1 keeps only the best-scoring
/// documents): every chunk of each document whose best chunk scores at least `ratio` times the
/// best document's score. All are kept when nothing matches (best score 0).
pub fn keep(question: &str, candidates: &[Candidate<'_>], ratio: f32) -> Vec<bool> {
    if ratio <= 0.0 || candidates.len() < 2 {
        return vec![true; candidates.len()];
    }
    keep_scored(candidates, &scores(question, candidates), ratio)
}

/// Name focus: when the question names something ("Zurich", "Tier 2", "Halcyon Premier Prepaid
/// Card", as [`crate::cite::names`] finds them) and at least one candidate document mentions
/// every such name (its title and candidate chunks together, multi-word names as one phrase),
/// the documents missing one of them are near-copies about another branch, product or person:
/// `Some(keep)` keeps only the complete ones. `None` (keep all) when the question names nothing
/// or no document has every name (names spelled differently in the documents stay harmless).
/// When some complete documents name each name on its own and others only inside a longer
/// name ([`crate::cite::names_stand_alone`]), only the former are kept. The question's
/// [`years`] count as names here ("the 2023 pay review" is not in the 2024 salary review),
/// though not in the name check that abstains (a document may date its facts otherwise).
pub fn naming_all(question: &str, candidates: &[Candidate<'_>]) -> Option<Vec<bool>> {
    let years = years(question);
    if candidates.len() < 2 || (crate::cite::names(question).is_empty() && years.is_empty()) {
        return None;
    }
    let mut docs: HashMap<&str, String> = HashMap::new();
    for c in candidates {
        let text = docs.entry(c.doc_id).or_insert_with(|| c.title.to_string());
        text.push('\n');
        text.push_str(c.text);
    }
    let complete: HashSet<&str> = docs
        .iter()
        .filter(|(_, text)| crate::cite::unmatched_names(question, &[text.as_str()]).is_empty())
        .filter(|(_, text)| {
            let pieces: HashSet<&str> = text
                .split(|c: char| !c.is_alphanumeric())
                .filter(|p| p.len() == 4)
                .collect();
            years.iter().all(|y| pieces.contains(y.as_str()))
        })
        .map(|(id, _)| *id)
        .collect();
    if complete.is_empty() {
        return None;
    }
    // Among those, a document that only ever writes a name as part of a longer one
    // ("Beverley Market Square" for "the Beverley branch") is about something else when
    // another names it on its own.
    let alone: HashSet<&str> = complete
        .iter()
        .copied()
        .filter(|id| crate::cite::names_stand_alone(question, &docs[id]))
        .collect();
    let complete = if alone.is_empty() { complete } else { alone };
    Some(
        candidates
            .iter()
            .map(|c| complete.contains(c.doc_id))
            .collect(),
    )
}

/// The years a question names ("the 2023 pay review", "for 2026"): whole numbers 1900–2099.
pub fn years(question: &str) -> Vec<String> {
    let mut out: Vec<String> = question
        .split(|c: char| !c.is_alphanumeric())
        .filter(|w| {
            w.len() == 4
                && w.bytes().all(|b| b.is_ascii_digit())
                && (w.starts_with("19") || w.starts_with("20"))
        })
        .map(str::to_string)
        .collect();
    out.sort();
    out.dedup();
    out
}

/// The sentences a semantic judgement compares with the question: `(candidate index, text)`,
/// each sentence or line (longer than 3 bytes) prefixed with its document's title
/// (`"Wire Transfer Limits: The daily limit is …"`), candidates in order.
pub fn sentence_units(candidates: &[Candidate<'_>]) -> Vec<(usize, String)> {
    candidates
        .iter()
        .enumerate()
        .flat_map(|(i, c)| {
            sentences(c.text)
                .map(str::trim)
                .filter(|s| s.len() > 3)
                .map(move |s| (i, format!("{}: {s}", c.title)))
        })
        .collect()
}

/// Each candidate's best cosine between the question's vector and its sentences' vectors
/// (`owners[j]` is the candidate of `sentences[j]`, as [`sentence_units`] gives them; vectors
/// L2-normalised); 0 for a candidate without sentences.
pub fn best_cosines(
    question: &[f32],
    sentences: &[Vec<f32>],
    owners: &[usize],
    n: usize,
) -> Vec<f32> {
    let mut best = vec![f32::NEG_INFINITY; n];
    for (v, &i) in sentences.iter().zip(owners) {
        let cos: f32 = question.iter().zip(v).map(|(a, b)| a * b).sum();
        best[i] = best[i].max(cos);
    }
    best.into_iter()
        .map(|b| if b.is_finite() { b } else { 0.0 })
        .collect()
}

/// At most this many candidate sentences are embedded for a semantic judgement; a prompt with
/// more (many long chunks) is judged lexically alone, so the cost stays bounded.
pub const MAX_SEMANTIC_SENTENCES: usize = 256;

/// The semantic judgement of the candidates: embeds the question and every candidate sentence
/// ([`sentence_units`]) with `embed` (one call, question first) and returns each candidate's
/// best cosine ([`best_cosines`]) and the number of sentences embedded; `Ok(None)` when there
/// is no sentence or more than [`MAX_SEMANTIC_SENTENCES`].
pub fn semantic_judgement<E>(
    question: &str,
    candidates: &[Candidate<'_>],
    embed: impl FnOnce(&[&str]) -> Result<Vec<Vec<f32>>, E>,
) -> Result<Option<(Vec<f32>, usize)>, E> {
    let units = sentence_units(candidates);
    if units.is_empty() || units.len() > MAX_SEMANTIC_SENTENCES {
        return Ok(None);
    }
    let mut texts: Vec<&str> = Vec::with_capacity(units.len() + 1);
    texts.push(question);
    texts.extend(units.iter().map(|(_, t)| t.as_str()));
    let vectors = embed(&texts)?;
    if vectors.len() != texts.len() {
        return Ok(None);
    }
    let owners: Vec<usize> = units.iter().map(|(i, _)| *i).collect();
    let best = best_cosines(&vectors[0], &vectors[1..], &owners, candidates.len());
    Ok(Some((best, units.len())))
}

/// [`keep`] with a semantic judgement added: each candidate scores its lexical focus score
/// divided by the best candidate's (0 to 1) plus `semantic[i]`, the best cosine between the
/// question and one of its sentences ([`best_cosines`]). The lexical score tells near-copies
/// apart by the word that distinguishes them; the cosine keeps a document that says the same
/// thing in other words ("send out by wire" for "wire transfer").
pub fn keep_semantic(
    question: &str,
    candidates: &[Candidate<'_>],
    ratio: f32,
    semantic: &[f32],
) -> Vec<bool> {
    if ratio <= 0.0 || candidates.len() < 2 || semantic.len() != candidates.len() {
        return keep(question, candidates, ratio);
    }
    let lexical = scores(question, candidates);
    let top = lexical.iter().copied().fold(0.0, f32::max);
    let blended: Vec<f32> = lexical
        .iter()
        .zip(semantic)
        .map(|(&l, &s)| if top > 0.0 { l / top } else { 0.0 } + s)
        .collect();
    keep_scored(candidates, &blended, ratio)
}

/// Keeps every chunk of the documents whose best chunk scores at least `ratio` × the best
/// document's; all when the best is ≤ 0.
fn keep_scored(candidates: &[Candidate<'_>], s: &[f32], ratio: f32) -> Vec<bool> {
    let mut by_doc: HashMap<&str, f32> = HashMap::new();
    for (c, &v) in candidates.iter().zip(s) {
        let e = by_doc.entry(c.doc_id).or_insert(f32::NEG_INFINITY);
        *e = e.max(v);
    }
    let best = by_doc.values().copied().fold(f32::NEG_INFINITY, f32::max);
    if best <= 0.0 {
        return vec![true; candidates.len()];
    }
    candidates
        .iter()
        .map(|c| by_doc[c.doc_id] >= ratio * best)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c<'a>(doc_id: &'a str, title: &'a str, text: &'a str) -> Candidate<'a> {
        Candidate {
            doc_id,
            title,
            text,
        }
    }

    #[test]
    fn words_keep_inner_joiners_and_drop_punctuation() {
        assert_eq!(
            words("Third-party breach at O’Neill's desk: USD 7,250,000 (TM-R99)."),
            [
                "third-party",
                "breach",
                "at",
                "o'neill",
                "desk",
                "usd",
                "7",
                "250",
                "000",
                "tm-r99"
            ]
        );
        assert_eq!(words("- -- a-"), ["a"]);
        assert!(question_terms("What is the?").is_empty());
        assert_eq!(
            question_terms("What is the EDD threshold for the EDD team?"),
            ["edd", "threshold", "team"]
        );
    }

    #[test]
    fn the_distinguishing_word_decides_between_near_copies() {
        let title = "EDD Thresholds for Customers Onboarded in Ireland";
        let cands = [
            c(
                "retail",
                title,
                "| Customer segment | Turnover |\n| Retail | USD 90,000 |",
            ),
            c(
                "inst",
                title,
                "| Customer segment | Turnover |\n| Institutional | USD 7,250,000 |",
            ),
            c(
                "uk",
                "EDD Thresholds for the United Kingdom",
                "| Retail | GBP 80,000 |",
            ),
        ];
        let q = "Above what turnover do institutional customers onboarded in Ireland need EDD?";
        let s = scores(q, &cands);
        assert!(s[1] > s[0] && s[0] > s[2], "{s:?}");
        assert_eq!(keep(q, &cands, 0.9), [false, true, false]);
        // Ratio 0 keeps everything; so does a question whose words no source has.
        assert_eq!(keep(q, &cands, 0.0), [true, true, true]);
        assert_eq!(
            keep("Quelle est la limite ?", &cands, 0.9),
            [true, true, true]
        );
    }

    #[test]
    fn a_document_is_judged_by_its_best_chunk() {
        // The relevant document's fact chunk matches less than its boilerplate chunk does, and
        // less than the other document: the boilerplate chunk carries the whole document in.
        let cands = [
            c(
                "pay-tech",
                "Pay Structure Update: Technology (Luxembourg)",
                "The new structure applies to all roles from the effective date.",
            ),
            c(
                "grades-nl",
                "New Grade Ranges for Technology in The Netherlands",
                "The pay structure applies to roles in scope.",
            ),
            c(
                "pay-tech",
                "Pay Structure Update: Technology (Luxembourg)",
                "Effective date: 2025-08-08.",
            ),
        ];
        let q = "From when does the new pay structure for Technology roles in Luxembourg apply?";
        assert_eq!(keep(q, &cands, 0.9), [true, false, true]);
    }

    #[test]
    fn words_must_meet_in_one_sentence() {
        // Both chunks contain "Callum" and "bonus"; only one says them together.
        let cands = [
            c(
                "a",
                "Letters",
                "Callum joined in 2020. The bonus pool grew.",
            ),
            c("b", "Letters", "Callum's bonus was approved. Nothing else."),
            c("c", "Other", "Unrelated text."),
        ];
        let q = "What bonus did Callum's manager approve?";
        let s = scores(q, &cands);
        assert!(s[1] > s[0], "{s:?}");
    }

    #[test]
    fn a_name_of_two_words_must_stand_together() {
        // Every chunk has the covenant words; the second names a "Thornbury" and an "Agritech"
        // apart, and matches as many words as the first: only the pair tells them apart.
        let cands = [
            c(
                "cc-75",
                "Credit Committee Minutes",
                "Borrower Thornbury Agritech: leverage covenant 3.62x.",
            ),
            c(
                "cc-23",
                "Credit Committee Minutes",
                "Ridgeway Agritech and Thornbury Robotics: leverage covenant 4.37x.",
            ),
            c(
                "cc-53",
                "Credit Committee Minutes",
                "The leverage covenant for Agritech is 5.10x.",
            ),
        ];
        let q = "What leverage covenant applies to the lending to Thornbury Agritech?";
        assert_eq!(
            question_pairs(q),
            [
                ("leverage".to_string(), "covenant".to_string()),
                ("covenant".to_string(), "applies".to_string()),
                ("thornbury".to_string(), "agritech".to_string()),
            ]
        );
        assert_eq!(keep(q, &cands, 0.9), [true, false, false]);
    }

    #[test]
    fn sentence_units_carry_the_title_and_skip_fragments() {
        let cands = [
            c(
                "a",
                "Limits",
                "Daily limit: USD 5,000. See annex.\n| Tier | Cap |\nok.",
            ),
            c("b", "Empty", ""),
            c("c", "Other", "One more."),
        ];
        assert_eq!(
            sentence_units(&cands),
            [
                (0, "Limits: Daily limit: USD 5,000.".to_string()),
                (0, "Limits: See annex.".to_string()),
                (0, "Limits: | Tier | Cap |".to_string()),
                (2, "Other: One more.".to_string()),
            ]
        );
    }

    #[test]
    fn best_cosines_take_each_candidates_best_sentence() {
        let q = [1.0, 0.0];
        let v = [vec![0.6, 0.8], vec![0.8, 0.6], vec![0.0, 1.0]];
        assert_eq!(best_cosines(&q, &v, &[0, 0, 2], 3), [0.8, 0.0, 0.0]);
        assert_eq!(best_cosines(&q, &[], &[], 2), [0.0, 0.0]);
    }

    #[test]
    fn the_semantic_judgement_keeps_a_paraphrase() {
        // The relevant document says "send out by wire"; its near-copy repeats the question's
        // words about something else. Lexically only the near-copy stays; its best sentence is
        // much further from the question in meaning.
        let cands = [
            c(
                "outbound",
                "Payments Handbook",
                "Customers may send out up to USD 50,000 daily by wire.",
            ),
            c(
                "inbound",
                "Wire Transfer Limits",
                "Incoming wire transfer limits are set by the sending bank.",
            ),
        ];
        let q = "What is the daily outgoing wire transfer limit?";
        assert_eq!(keep(q, &cands, 0.9), [false, true]);
        assert_eq!(keep_semantic(q, &cands, 0.9, &[0.8, 0.45]), [true, true]);
        // With no semantic difference the lexical judgement stands; a wrong-length judgement
        // is ignored rather than misapplied.
        assert_eq!(keep_semantic(q, &cands, 0.9, &[0.5, 0.5]), [false, true]);
        assert_eq!(keep_semantic(q, &cands, 0.9, &[0.9]), [false, true]);
        assert_eq!(keep_semantic(q, &cands, 0.0, &[0.0, 0.9]), [true, true]);
    }

    #[test]
    fn documents_missing_a_name_of_the_question_go_when_another_has_them_all() {
        let cands = [
            c(
                "ldn",
                "Outgoing Wire Limits: SME Clients, London Booking Centre",
                "Tier 2 SME clients may send out USD 400,000 a day.",
            ),
            c(
                "zrh",
                "Treasury Procedure TP-731: Wire Transfer Limits for SME Clients",
                "Scope: clients booked in Zurich.",
            ),
            c(
                "zrh",
                "Treasury Procedure TP-731: Wire Transfer Limits for SME Clients",
                "Tier 2: CHF 250,000 per business day.",
            ),
        ];
        let q = "How much can Tier 2 SME clients booked in Zurich send out by wire in a day?";
        // The Zurich document has "Tier" and "Zurich" in its chunks together; London lacks Zurich.
        assert_eq!(naming_all(q, &cands), Some(vec![false, true, true]));
        // A name no document has (spelled otherwise, or another branch): no judgement here
        // (the name check decides whether to abstain).
        assert_eq!(
            naming_all("What is the Tier 2 limit in Geneva?", &cands),
            None
        );
        // No name, or one candidate: nothing to decide.
        assert_eq!(naming_all("what is the daily wire limit?", &cands), None);
        assert_eq!(naming_all(q, &cands[1..2]), None);
    }

    #[test]
    fn a_year_of_the_question_is_a_name() {
        assert_eq!(
            years("the 2023 pay review, FY2024, 2023-07-31 or 1850?"),
            ["2023"]
        );
        let cands = [
            c(
                "r24",
                "Salary Review 2024 - Tariq Karlsson",
                "Effective 22 June 2024.",
            ),
            c(
                "l23",
                "Compensation Letter for Tariq Karlsson",
                "Effective 2023-07-31.",
            ),
            c(
                "other",
                "Compensation Letter for Rosa Morrow",
                "Effective 2023-05-01.",
            ),
        ];
        let q = "When did the pay change take effect for Tariq Karlsson in the 2023 pay review?";
        assert_eq!(naming_all(q, &cands), Some(vec![false, true, false]));
        // A year alone is enough to decide; no document with it: keep all.
        assert_eq!(
            naming_all("what changed in 2023?", &cands),
            Some(vec![false, true, true])
        );
        assert_eq!(naming_all("what changed in 2019?", &cands), None);
    }

    #[test]
    fn a_name_written_only_inside_a_longer_name_is_another_thing() {
        let cands = [
            c(
                "square",
                "Cash Holding Limits: Beverley Market Square Branch",
                "Teller drawer (trading hours): USD 39,200.",
            ),
            c(
                "beverley",
                "Branch Cash Management Procedure - Beverley Branch",
                "For the Beverley branch, cashiers sell down once a drawer exceeds USD 49,600.",
            ),
            c(
                "shouted",
                "CASH LIMITS: BEVERLEY NORTH BRANCH",
                "Teller drawer: USD 12,000.",
            ),
        ];
        let q = "What may a teller drawer at the Beverley branch contain?";
        assert_eq!(naming_all(q, &cands), Some(vec![false, true, false]));
        // Without the document that names it on its own, all three stay.
        assert_eq!(naming_all(q, &[cands[0], cands[2]]), Some(vec![true, true]));
    }

    #[test]
    fn single_candidates_and_empty_input_are_kept() {
        assert_eq!(keep("q", &[], 0.9), Vec::<bool>::new());
        assert_eq!(keep("bonus", &[c("a", "t", "x")], 0.9), [true]);
        assert_eq!(scores("", &[c("a", "t", "x")]), [0.0]);
    }
}
