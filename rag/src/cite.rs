//! Which sources an answer actually used.
//!
//! Every chunk placed in the prompt is listed in `airlock.citations` (the user was shown it, and
//! the stream must send it before the answer exists). Once the answer is complete, `cited`
//! names the sources it rests on:
//!
//! 1. **Markers**: the source numbers the answer writes as `[n]`, `[n][m]` or `[n, m]` (the
//!    system prompt asks for them), when at least one is a valid source number.
//! 2. **Support**, when the answer carries no valid marker (small models often omit them): the
//!    smallest set of sources that covers the answer's own content words. Content words are
//!    the answer's words minus stop words, minus generic answer vocabulary ("document",
//!    "information", …) and minus the question's words (every retrieved source shares those,
//!    so they say nothing about which one was used); each is weighted by how rare it is among
//!    the sources (`ln(1 + S/df)`). Sources are picked greedily by the weight they cover that
//!    no earlier pick covered; a source is cited only while it adds at least
//!    [`MIN_NEW_SHARE`] of the supported weight and [`MIN_TERMS`] new words. A near-duplicate
//!    of a cited source adds nothing new and is not cited; an answer that abstains shares no
//!    content with the sources and cites nothing.
//! 3. **The kind asked for** ([`crate::asked`]): an answer with content of its own that holds
//!    no value of the kind the question asks for (a date for "by what time", a version number
//!    for "which incident number", a phrase for "what figure") is unsupported and cites
//!    nothing, whatever its markers or its support say: a source holding it does not answer.
//!
//! The text is compared as lower-case alphanumeric words with a plural `s` removed, figures and
//! dates written one way (`49,600` is one word; `14 July 2026` and `2026-07-14` are the same
//! word, and a bare `14` is not part of it); nothing is logged.

use std::collections::{BTreeSet, HashMap, HashSet};

use crate::asked;

/// A cited source must add this share of the answer's supported weight that earlier picks did
/// not cover.
pub const MIN_NEW_SHARE: f64 = 0.2;
/// A cited source must add at least this many content words (a number counts double: figures
/// are what answers are made of).
pub const MIN_TERMS: f64 = 2.0;

/// How the cited sources were found.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum CitedBy {
    /// The answer's own `[n]` markers.
    Markers,
    /// Word support (the answer had no valid marker).
    Support,
    /// No source was relevant enough: the answer says so and was not generated.
    NoSource,
    /// The answer has content words of its own (beyond the question's and generic answer
    /// vocabulary) and no valid marker, and no source supports them: a figure or name the model
    /// made up. A non-streaming answer is withheld (`withhold_unsupported_answers`).
    Unsupported,
}

/// The sources an answer used: 1-based source numbers, ascending.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cited {
    /// Source numbers (`n` of the citations).
    pub sources: Vec<usize>,
    /// How they were found.
    pub by: CitedBy,
}

/// The sources `answer` used among `sources` (chunk texts in prompt order, source `n` is
/// `sources[n - 1]`), for a `question`.
pub fn cited(answer: &str, question: &str, sources: &[&str]) -> Cited {
    let markers = markers(answer, sources.len());
    if !markers.is_empty() {
        let marked: Vec<&str> = markers.iter().map(|&n| sources[n - 1]).collect();
        if asked::answers_another_kind(&strip_markers(answer), question)
            && quoting(answer, question, &marked).is_none()
        {
            return Cited {
                sources: Vec::new(),
                by: CitedBy::Unsupported,
            };
        }
        return Cited {
            sources: markers,
            by: CitedBy::Markers,
        };
    }
    let (mut picked, has_content) = support(answer, question, sources);
    let quoted = quoting(answer, question, sources);
    if has_content && asked::answers_another_kind(answer, question) && quoted.is_none() {
        // Not the kind of value asked for: whatever source holds it, it does not answer.
        return Cited {
            sources: Vec::new(),
            by: CitedBy::Unsupported,
        };
    }
    if picked.is_empty() {
        // Too few words for the cover's thresholds ("unlimited."), but a source holds them all.
        picked.extend(quoted);
    }
    let by = if picked.is_empty() && (has_content || restates(answer, question)) {
        CitedBy::Unsupported
    } else {
        CitedBy::Support
    };
    Cited {
        sources: picked,
        by,
    }
}

/// The first of `sources` (1-based) that holds every content word of `answer` (its words beyond
/// the question's and generic answer vocabulary, figures and dates written one way): the answer
/// quotes that source, and a quote is never withheld, whatever kind of value the question seems
/// to ask for (an option, a command, a keyword default are kinds [`asked`] does not know).
/// `None` when the answer has no content words of its own.
fn quoting(answer: &str, question: &str, sources: &[&str]) -> Option<usize> {
    let content = own_content(answer, question);
    if content.is_empty() {
        return None;
    }
    sources
        .iter()
        .position(|s| {
            let held: HashSet<String> = words(&comparable(s)).collect();
            content.iter().all(|w| held.contains(w))
        })
        .map(|i| i + 1)
}

/// Question words an answer must repeat, with nothing of its own, to be a restatement.
const RESTATED_WORDS: usize = 3;

/// Whether `answer` only restates `question` ("The relocation allowance is paid to colleagues
/// relocating to Singapore."): no content word of its own, at least [`RESTATED_WORDS`] of the
/// question's, and no yes, no or negation (which is what a yes/no answer adds). It tells the
/// user nothing, and a small model writes it when no source answers.
fn restates(answer: &str, question: &str) -> bool {
    let answer_words: HashSet<String> = words(&comparable(&strip_markers(answer))).collect();
    if ["yes", "no", "not", "never", "none", "nor"]
        .iter()
        .any(|w| answer_words.contains(*w))
    {
        return false;
    }
    let question: HashSet<String> = words(&comparable(question))
        .filter(|w| !is_noise(w))
        .collect();
    answer_words
        .iter()
        .filter(|w| question.contains(*w))
        .count()
        >= RESTATED_WORDS
}

/// Valid `[n]` / `[n, m]` markers in `answer`, ascending and unique.
fn markers(answer: &str, n_sources: usize) -> Vec<usize> {
    let mut out = BTreeSet::new();
    let mut rest = answer;
    while let Some(open) = rest.find('[') {
        let after = &rest[open + 1..];
        let Some(close) = after.find(']') else { break };
        let inner = &after[..close];
        let nums: Option<Vec<usize>> = inner
            .split([',', ';'])
            .map(|p| {
                let p = p.trim().to_ascii_lowercase();
                p.trim_start_matches("source").trim().parse().ok()
            })
            .collect();
        if let Some(nums) = nums {
            out.extend(nums.into_iter().filter(|&n| (1..=n_sources).contains(&n)));
        }
        rest = &after[close..];
    }
    out.into_iter().collect()
}

/// The greedy cover of the answer's content words (see the module doc), and whether the answer
/// has content words at all.
fn support(answer: &str, question: &str, sources: &[&str]) -> (Vec<usize>, bool) {
    let content = own_content(answer, question);
    if content.is_empty() || sources.is_empty() {
        return (Vec::new(), !content.is_empty());
    }
    let per_source: Vec<HashSet<String>> = sources
        .iter()
        .map(|s| {
            words(&comparable(s))
                .filter(|w| content.contains(w))
                .collect()
        })
        .collect();
    let mut df: HashMap<&str, usize> = HashMap::new();
    for set in &per_source {
        for w in set {
            *df.entry(w.as_str()).or_default() += 1;
        }
    }
    let n = sources.len() as f64;
    let weight = |w: &str| -> f64 {
        let idf = (1.0 + n / df[w] as f64).ln();
        if is_figure(w) { 2.0 * idf } else { idf }
    };
    let count = |w: &str| -> f64 { if is_figure(w) { 2.0 } else { 1.0 } };
    let supported: f64 = df.keys().map(|w| weight(w)).sum();
    let mut covered: HashSet<&str> = HashSet::new();
    let mut picked = Vec::new();
    loop {
        // The source adding the most uncovered weight; ties go to the better-ranked source.
        let best = per_source
            .iter()
            .enumerate()
            .filter(|(i, _)| !picked.contains(&(i + 1)))
            .map(|(i, set)| {
                let new: Vec<&str> = set
                    .iter()
                    .map(String::as_str)
                    .filter(|w| !covered.contains(w))
                    .collect();
                let gain: f64 = new.iter().map(|w| weight(w)).sum();
                let terms: f64 = new.iter().map(|w| count(w)).sum();
                (i, gain, terms, new)
            })
            .fold(None::<(usize, f64, f64, Vec<&str>)>, |acc, c| match acc {
                Some(a) if a.1 >= c.1 => Some(a),
                _ => Some(c),
            });
        let Some((i, gain, terms, new)) = best else {
            break;
        };
        if gain < MIN_NEW_SHARE * supported || terms < MIN_TERMS {
            break;
        }
        picked.push(i + 1);
        covered.extend(new);
    }
    picked.sort_unstable();
    (picked, true)
}

/// The answer's own content words: its words (markers left out, figures written one way) that
/// are neither the question's nor stop words or generic answer vocabulary.
fn own_content(answer: &str, question: &str) -> HashSet<String> {
    let question: HashSet<String> = words(&comparable(question)).collect();
    words(&comparable(&strip_markers(answer)))
        .filter(|w| !question.contains(w) && !is_noise(w))
        .collect()
}

/// `answer` without its bracketed source numbers (so "[2]" is not read as the number 2).
fn strip_markers(answer: &str) -> String {
    let mut out = String::with_capacity(answer.len());
    let mut rest = answer;
    while let Some(open) = rest.find('[') {
        out.push_str(&rest[..open]);
        let after = &rest[open + 1..];
        match after.find(']') {
            Some(close)
                if after[..close]
                    .chars()
                    .all(|c| c.is_ascii_digit() || matches!(c, ',' | ';' | ' ')) =>
            {
                rest = &after[close + 1..];
            }
            _ => {
                out.push('[');
                rest = after;
            }
        }
    }
    out.push_str(rest);
    out
}

/// `text` with figures and dates written one way, as the evals match answers
/// ([`airlock_text::normalize`]: `49,600` → `49600`, `14 July 2026` → `2026-07-14`),
/// and each ISO date joined into one word (`20260714`): a bare "14" is not supported by a
/// source dated 14 July, and "2025-11-24" is not supported by a source that has 2025 and 24 in
/// other places.
fn comparable(text: &str) -> String {
    let text = airlock_text::normalize(&without_version_numbers(&without_list_numbers(text)));
    let b = text.as_bytes();
    let digits =
        |r: std::ops::Range<usize>| b.get(r).is_some_and(|s| s.iter().all(u8::is_ascii_digit));
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    while i < b.len() {
        let starts_word = i == 0 || !b[i - 1].is_ascii_alphanumeric();
        let ends_word = b.get(i + 10).is_none_or(|c| !c.is_ascii_alphanumeric());
        if starts_word
            && ends_word
            && digits(i..i + 4)
            && b.get(i + 4) == Some(&b'-')
            && digits(i + 5..i + 7)
            && b.get(i + 7) == Some(&b'-')
            && digits(i + 8..i + 10)
        {
            out.push_str(&text[i..i + 4]);
            out.push_str(&text[i + 5..i + 7]);
            out.push_str(&text[i + 8..i + 10]);
            i += 10;
            continue;
        }
        // A decimal is one figure ("3.8" is not "3" and "8"): its point becomes a letter.
        if b[i] == b'.'
            && i > 0
            && b[i - 1].is_ascii_digit()
            && b.get(i + 1).is_some_and(u8::is_ascii_digit)
        {
            out.push('p');
            i += 1;
            continue;
        }
        let c = text[i..].chars().next().unwrap_or(' ');
        out.push(c);
        i += c.len_utf8();
    }
    out
}

/// The content words of `text` as attribution compares them: its `[n]` markers left out,
/// figures and dates written one way ([`comparable`]), plurals folded, stop words and answer
/// vocabulary dropped ([`crate::passage`] uses them too).
pub(crate) fn content_words(text: &str) -> impl Iterator<Item = String> {
    let text = comparable(&strip_markers(text));
    words(&text)
        .filter(|w| !is_noise(w))
        .collect::<Vec<_>>()
        .into_iter()
}

/// A figure: a word that starts with a digit (`49600`, `20260714`, `3p8` for 3.8).
pub(crate) fn is_figure(w: &str) -> bool {
    w.as_bytes().first().is_some_and(u8::is_ascii_digit)
}

/// `text` without its documents' version numbers: the value after "Version" ("**Version:**
/// 3.8", "Version 2.7") and the version column of a revision-history table (a table whose
/// header has a "Version" cell). They are document control, not figures an answer could take
/// from the source, and a small model asked for a number it cannot find copies them.
fn without_version_numbers(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut version_column: Option<usize> = None;
    for line in text.split_inclusive('\n') {
        let row = line.trim();
        if !row.starts_with('|') {
            version_column = None;
        } else {
            let cells: Vec<&str> = row.trim_matches('|').split('|').collect();
            let is_version = |c: &str| {
                c.trim()
                    .trim_matches('*')
                    .trim()
                    .eq_ignore_ascii_case("version")
            };
            if let Some(col) = cells.iter().position(|c| is_version(c)) {
                version_column = Some(col);
            } else if let Some(col) = version_column {
                let kept: Vec<&str> = cells
                    .iter()
                    .enumerate()
                    .map(|(i, c)| if i == col { "" } else { *c })
                    .collect();
                out.push_str(&format!("|{}|\n", kept.join("|")));
                continue;
            }
        }
        out.push_str(&without_version_values(line));
    }
    out
}

/// `line` without the version number that follows a "version" word (with only `*`, `:` and
/// spaces between).
fn without_version_values(line: &str) -> String {
    let lower = line.to_ascii_lowercase();
    let mut out = String::with_capacity(line.len());
    let mut from = 0;
    while let Some(pos) = lower[from..].find("version") {
        let start = from + pos;
        let end = start + "version".len();
        let word_start = start == 0 || !lower.as_bytes()[start - 1].is_ascii_alphanumeric();
        let rest = &line[end..];
        let gap = rest
            .bytes()
            .take_while(|b| matches!(b, b'*' | b':' | b' ' | b'\t'))
            .count();
        let value = rest[gap..]
            .bytes()
            .take_while(|b| b.is_ascii_digit() || *b == b'.')
            .count();
        let value_ends = rest[gap + value..]
            .chars()
            .next()
            .is_none_or(|c| !c.is_alphanumeric());
        out.push_str(&line[from..end]);
        if word_start && value > 0 && value_ends && rest.as_bytes()[gap].is_ascii_digit() {
            out.push_str(&rest[..gap]);
            from = end + gap + value;
        } else {
            from = end;
        }
    }
    out.push_str(&line[from..]);
    out
}

/// `text` without the numbers of numbered list items ("2. Escalate …" at the start of a line):
/// they order steps and are not figures an answer could take from the source.
fn without_list_numbers(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for line in text.split_inclusive('\n') {
        let body = line.trim_start();
        let digits = body.bytes().take_while(u8::is_ascii_digit).count();
        let numbered = (1..=3).contains(&digits)
            && matches!(body.as_bytes().get(digits), Some(b'.' | b')'))
            && body
                .as_bytes()
                .get(digits + 1)
                .is_some_and(u8::is_ascii_whitespace);
        out.push_str(if numbered { &body[digits + 1..] } else { line });
    }
    out
}

/// Lower-case alphanumeric words, a plural `s` removed from words longer than three letters.
fn words(text: &str) -> impl Iterator<Item = String> + '_ {
    airlock_text::alnum_words(text).map(airlock_text::singular)
}

/// Stop words, single letters and the vocabulary every answer uses about itself.
fn is_noise(w: &str) -> bool {
    (w.chars().count() == 1 && !w.chars().all(|c| c.is_ascii_digit()))
        || (airlock_text::is_stop(w) && !CONTENT_IN_ANSWERS.contains(&w))
        || ANSWER_VOCABULARY.contains(&w)
}

/// Words an answer uses about itself and its sources ("according to the document …"): never
/// evidence of which source it used.
const ANSWER_VOCABULARY: &[&str] = &[
    "according",
    "again",
    "also",
    "am",
    "available",
    "based",
    "between",
    "cannot",
    "context",
    "doe",
    "document",
    "during",
    "find",
    "found",
    "further",
    "given",
    "information",
    "itself",
    "mention",
    "mentioned",
    "once",
    "out",
    "provide",
    "provided",
    "question",
    "sorry",
    "source",
    "through",
    "up",
];

/// Function words that still count as an answer's content words here ("may" is a month in a
/// date; the others were never treated as noise by attribution and are kept so).
const CONTENT_IN_ANSWERS: &[&str] = &["doing", "few", "just", "may", "might", "shall", "whose"];

#[cfg(test)]
mod tests {
    use super::*;

    const S1: &str = "Wire transfers above 10,000 EUR need a second approver from Treasury \
                      operations before release.";
    const S2: &str = "The travel policy reimburses economy class flights booked through the \
                      corporate portal.";
    const S3: &str = "Card disputes must be filed within 60 days of the statement date through \
                      the disputes desk.";

    #[test]
    fn markers_win_and_are_validated() {
        let c = cited(
            "Use the portal [2]; disputes within 60 days [3][9] [1, 3].",
            "q",
            &[S1, S2, S3],
        );
        assert_eq!(c.by, CitedBy::Markers);
        assert_eq!(c.sources, vec![1, 2, 3]);
        // Only out-of-range markers: none valid, so support decides.
        let c = cited(
            "A second approver from Treasury operations is needed [7].",
            "q",
            &[S1, S2],
        );
        assert_eq!(c.by, CitedBy::Support);
        assert_eq!(c.sources, vec![1]);
    }

    #[test]
    fn support_cites_the_source_the_answer_rests_on() {
        let c = cited(
            "Disputes must be filed within 60 days of the statement date.",
            "How long do I have to dispute a card payment?",
            &[S1, S2, S3],
        );
        assert_eq!(c.sources, vec![3]);
    }

    #[test]
    fn an_answer_drawing_on_two_sources_cites_both() {
        let c = cited(
            "Transfers above 10,000 EUR need a second approver from Treasury; flights are \
             reimbursed in economy class when booked through the corporate portal.",
            "what are the rules",
            &[S1, S2, S3],
        );
        assert_eq!(c.sources, vec![1, 2]);
    }

    #[test]
    fn a_near_duplicate_adds_nothing_and_is_not_cited() {
        let dup = format!("{S3} (archived copy)");
        let c = cited(
            "File disputes within 60 days of the statement date via the disputes desk.",
            "card disputes",
            &[S1, &dup, S3],
        );
        assert_eq!(c.sources, vec![2]);
    }

    #[test]
    fn abstentions_and_question_echoes_cite_nothing() {
        let sources = [S1, S2, S3];
        let c = cited(
            "I cannot find this information in the documents available to you.",
            "What is the travel policy for flights?",
            &sources,
        );
        assert!(c.sources.is_empty(), "{c:?}");
        // Repeating the question's words is not support.
        let c = cited(
            "The travel policy for flights.",
            "What is the travel policy for flights?",
            &sources,
        );
        assert!(c.sources.is_empty(), "{c:?}");
        assert!(cited("", "q", &sources).sources.is_empty());
        assert!(cited("Anything at all.", "q", &[]).sources.is_empty());
    }

    #[test]
    fn a_figure_no_source_holds_is_unsupported() {
        let sources = [S1, S2, S3];
        let c = cited(
            "The per-share price proposed in Project Zinnia is 1.00 dollars.",
            "What per-share price is being proposed in Project Zinnia?",
            &sources,
        );
        assert_eq!(
            c,
            Cited {
                sources: vec![],
                by: CitedBy::Unsupported
            }
        );
        // An answer that only repeats the question tells nothing: unsupported too (before
        // 2026-12-01 it was shown; a small model writes it when no source answers).
        let c = cited(
            "The travel policy for flights.",
            "What is the travel policy for flights?",
            &sources,
        );
        assert_eq!(c.by, CitedBy::Unsupported, "{c:?}");
        // A supported figure is cited, a valid marker counts as the model's own citation.
        let c = cited(
            "Within 60 days of the statement date.",
            "How long?",
            &sources,
        );
        assert_eq!((c.sources, c.by), (vec![3], CitedBy::Support));
        assert_eq!(
            cited("It is 99 days [2].", "q", &sources).by,
            CitedBy::Markers
        );
    }

    #[test]
    fn marker_digits_are_not_read_as_figures() {
        assert_eq!(strip_markers("see [2] and [1, 3]. [x]"), "see  and . [x]");
        let c = cited("Yes [60].", "q", &[S3]);
        assert!(c.sources.is_empty(), "{c:?}");
    }
}

/// Proper names in a question: capitalised words that do not open a sentence or clause
/// (vendors, people, projects, places), a possessive `'s` removed. All-capital tokens
/// (acronyms, codes such as "UK" or "TM-B75") and labels followed by a number ("Tier 1") are
/// left out.
pub fn names(question: &str) -> Vec<String> {
    name_runs(question).into_iter().flatten().collect()
}

/// The question's [`names`] grouped into runs of consecutive words ("Thornbury Agritech",
/// "Bradwell Station Road"; a lone name is a run of one).
pub fn name_runs(question: &str) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    for clause in question.split(['.', '?', '!', ':', ';', '\n']) {
        let clause = clause.replace(" - ", " . ");
        for part in clause.split(" . ") {
            let words: Vec<&str> = part
                .split(|c: char| !(c.is_alphanumeric() || c == '\'' || c == '’' || c == '-'))
                .filter(|w| !w.is_empty())
                .collect();
            let mut run: Vec<String> = Vec::new();
            for (i, word) in words.iter().enumerate() {
                match name_at(&words, i, word) {
                    Some(w) => run.push(w.to_string()),
                    None => {
                        if !run.is_empty() {
                            out.push(std::mem::take(&mut run));
                        }
                    }
                }
            }
            if !run.is_empty() {
                out.push(run);
            }
        }
    }
    out
}

/// `word` (the `i`-th of its clause) as a name, if it is one.
fn name_at<'a>(words: &[&str], i: usize, word: &'a str) -> Option<&'a str> {
    // "Tier 1", "Stage 2": a label with a small number, not a name (a year after a name,
    // "Sheridan's 2024 bonus", does not count).
    if words
        .get(i + 1)
        .is_some_and(|n| n.len() <= 3 && n.chars().all(|c| c.is_ascii_digit()))
    {
        return None;
    }
    let w = word.trim_matches(|c| c == '\'' || c == '’' || c == '-');
    let w = w
        .strip_suffix("'s")
        .or_else(|| w.strip_suffix("’s"))
        .unwrap_or(w);
    let upper = w.chars().filter(|c| c.is_uppercase()).count();
    let letters = w.chars().filter(|c| c.is_alphabetic()).count();
    let capitalised = w.chars().next().is_some_and(char::is_uppercase);
    (i > 0 && capitalised && upper < letters && letters > 1).then_some(w)
}

/// Lower-case alphanumeric pieces of `text` (any other character separates).
pub(crate) fn pieces(text: &str) -> Vec<String> {
    text.split(|c: char| !c.is_alphanumeric())
        .filter(|w| !w.is_empty())
        .map(str::to_lowercase)
        .collect()
}

/// The question's names that occur in none of the sources (whole words, any case), and its
/// names of several words ("Haverhill Central") that no source writes as one phrase, joined
/// by spaces: the sources are about something else, however similar their topic (the
/// "Haverhill North" and "Radley Central" branches are not the Haverhill Central branch).
pub fn unmatched_names(question: &str, sources: &[&str]) -> Vec<String> {
    let runs = name_runs(question);
    if runs.is_empty() {
        return Vec::new();
    }
    let present: HashSet<String> = sources
        .iter()
        .flat_map(|s| {
            s.split(|c: char| !(c.is_alphanumeric() || c == '-'))
                .filter(|w| !w.is_empty())
                .flat_map(|w| {
                    // "LatticeWorks-hosted" also names LatticeWorks.
                    let lower = w.to_lowercase();
                    let parts: Vec<String> = lower.split('-').map(str::to_string).collect();
                    std::iter::once(lower).chain(parts)
                })
        })
        .collect();
    let mut out: Vec<String> = runs
        .iter()
        .flatten()
        .filter(|n| !present.contains(&n.to_lowercase()))
        .cloned()
        .collect();
    let source_pieces: Vec<Vec<String>> = sources.iter().map(|s| pieces(s)).collect();
    for run in runs.iter().filter(|r| r.len() > 1) {
        let phrase: Vec<String> = run.iter().flat_map(|w| pieces(w)).collect();
        let found = source_pieces
            .iter()
            .any(|p| p.windows(phrase.len()).any(|w| w == phrase.as_slice()));
        if !found {
            out.push(run.join(" "));
        }
    }
    out
}

/// Whether `text` names each of the question's name runs on its own at least once: an
/// occurrence followed (across spaces on the same line) by a further capitalised word that the
/// question does not use is a longer, different name ("Beverley Market Square" is not the
/// "Beverley branch"; "Beverley Branch" is, the question saying "branch"). `true` when the
/// question names nothing.
pub fn names_stand_alone(question: &str, text: &str) -> bool {
    let runs = name_runs(question);
    if runs.is_empty() {
        return true;
    }
    let asked: HashSet<String> = pieces(question).into_iter().collect();
    // Alphanumeric pieces of the text with their original case, and whether only spaces or
    // tabs separate each from the one before.
    let mut tokens: Vec<(&str, bool)> = Vec::new();
    let mut gap_is_space = false;
    let mut start = None;
    for (i, c) in text.char_indices() {
        if c.is_alphanumeric() {
            start.get_or_insert(i);
            continue;
        }
        if let Some(s) = start.take() {
            tokens.push((&text[s..i], gap_is_space));
            gap_is_space = true;
        }
        if !matches!(c, ' ' | '\t') {
            gap_is_space = false;
        }
    }
    if let Some(s) = start {
        tokens.push((&text[s..], gap_is_space));
    }
    let lower: Vec<String> = tokens.iter().map(|(t, _)| t.to_lowercase()).collect();
    runs.iter().all(|run| {
        let phrase: Vec<String> = run.iter().flat_map(|w| pieces(w)).collect();
        if phrase.is_empty() {
            return true;
        }
        lower
            .windows(phrase.len())
            .enumerate()
            .filter(|(_, w)| *w == phrase.as_slice())
            .any(|(at, _)| {
                let capitals = |t: &str| t.chars().all(char::is_uppercase);
                let shouted = tokens[at..at + phrase.len()]
                    .iter()
                    .all(|(t, _)| capitals(t));
                let extended = tokens.get(at + phrase.len()).is_some_and(|(next, spaced)| {
                    *spaced
                        && next.chars().next().is_some_and(char::is_uppercase)
                        && next.chars().all(char::is_alphabetic)
                        // An acronym after a name qualifies it ("London SME lending"), unless
                        // the whole line is in capitals ("NAILSEA RETAIL PARK").
                        && (shouted || !capitals(next))
                        && !asked.contains(&next.to_lowercase())
                });
                !extended
            })
    })
}

#[cfg(test)]
mod name_tests {
    use super::*;

    #[test]
    fn names_skip_sentence_openers_acronyms_and_possessives() {
        assert_eq!(
            names("What's the maximum tolerable downtime target for LatticeWorks?"),
            ["LatticeWorks"]
        );
        assert_eq!(
            names(
                "Need this for a meeting: What amount was awarded as Carlos Sheridan's 2024 \
                 bonus? Thanks in advance!"
            ),
            ["Carlos", "Sheridan"]
        );
        assert_eq!(
            // A clause's first word is skipped even when it is a name: the rest still names it.
            names("Hi - Esther Pereira took over. Which UK limit applies to TM-B75?"),
            ["Pereira"]
        );
        assert!(names("how long do disputes take? Please cite the source.").is_empty());
        assert!(names("What is the cap as a share of Tier 1 capital?").is_empty());
    }

    #[test]
    fn unmatched_names_are_the_ones_no_source_mentions() {
        let sources = [
            "CormorantSync recovery point objective: 15 minutes.",
            "Vendor tiering for Halcyon-hosted systems.",
        ];
        assert_eq!(
            unmatched_names(
                "Quick question: what RPO applies to LatticeWorks?",
                &sources
            ),
            ["LatticeWorks"]
        );
        assert!(unmatched_names("What RPO applies to cormorantsync?", &sources).is_empty());
        assert!(unmatched_names("What RPO applies to CormorantSync?", &sources).is_empty());
        assert!(unmatched_names("Which systems are Halcyon hosted?", &sources).is_empty());
        assert!(unmatched_names("what is the rpo?", &sources).is_empty());
    }

    #[test]
    fn a_name_stands_alone_unless_a_further_capitalised_word_extends_it() {
        let q = "What is the vault limit at the Beverley branch?";
        assert!(names_stand_alone(
            q,
            "For the Beverley branch, the limit is USD 1."
        ));
        // The question says "branch": "Beverley Branch" is the same thing.
        assert!(names_stand_alone(
            q,
            "Cash Procedure - Beverley Branch\nLimits"
        ));
        assert!(!names_stand_alone(
            q,
            "Limits: Beverley Market Square Branch"
        ));
        assert!(!names_stand_alone(q, "LIMITS: BEVERLEY MARKET SQUARE"));
        // A line break, punctuation or a lower-case word ends the name; an acronym qualifies it.
        assert!(names_stand_alone(q, "Limits for Beverley\nMarket rules"));
        assert!(names_stand_alone(q, "Branches: Beverley, Nailsea Central"));
        assert!(names_stand_alone(q, "Beverley SME lending"));
        assert!(names_stand_alone(
            "what is the vault limit?",
            "Beverley Market Square"
        ));
        // Several names: each must stand alone somewhere.
        let q = "Who owns TallyVault at the Leyburn branch?";
        assert!(!names_stand_alone(
            q,
            "TallyVault is run from Leyburn Retail Park."
        ));
        assert!(names_stand_alone(
            q,
            "TallyVault Ops, Leyburn. TallyVault is ours."
        ));
    }

    #[test]
    fn figures_and_dates_compare_as_written_once() {
        // A bare day of the month is not a figure a dated source supports.
        let dated = "Issued: 14 July 2026. Details are restricted.";
        let report = "A total of 387,099 records were exposed on 2026-06-27.";
        assert_eq!(
            cited("14", "How many records?", &[dated]).by,
            CitedBy::Unsupported
        );
        let c = cited("387099 records.", "How many?", &[dated, report]);
        assert_eq!((c.sources, c.by), (vec![2], CitedBy::Support));
        // The same date written two ways is the same word.
        let c = cited("It was 27 June 2026.", "When?", &[dated, report]);
        assert_eq!((c.sources, c.by), (vec![2], CitedBy::Support));
        assert_eq!(
            comparable("on 2026-06-27, ref 2026-06-271"),
            "on 20260627, ref 2026-06-271"
        );
        // The number of a list item is not a figure; a figure at the start of a line is.
        let steps = "Actions:\n1. Review the logs.\n 2) Escalate.\n12 accounts were closed.";
        assert_eq!(
            cited("2", "Which incident number?", &[steps]).by,
            CitedBy::Unsupported
        );
        assert_eq!(cited("12", "How many accounts?", &[steps]).sources, [1]);
        assert_eq!(without_list_numbers("1. a\n2.5 b\n3.\tc"), " a\n2.5 b\n\tc");
    }

    #[test]
    fn a_decimal_is_one_figure_and_version_numbers_support_nothing() {
        // A decimal is not its two halves.
        let split = "Tier 3 clients: 8 approvers.";
        assert_eq!(
            cited("The ratio is 3.8.", "What ratio?", &[split]).by,
            CitedBy::Unsupported
        );
        let c = cited(
            "The ratio is 3.8.",
            "What ratio?",
            &[split, "Ratio held: 3.8 on average."],
        );
        assert_eq!((c.sources, c.by), (vec![2], CitedBy::Support));
        assert_eq!(comparable("7.02% and 3.8. Then"), "7p02% and 3p8. then");
        // A document's version is document control, in a field or a revision table.
        let bulletin = "**Issued:** 17 February 2025\n**Version:** 3.8\n**Classification:** Staff";
        assert_eq!(
            cited(
                "The incident number is 3.8.",
                "What incident number?",
                &[bulletin]
            )
            .by,
            CitedBy::Unsupported
        );
        let history = "| Version | Date | Author |\n|---|---|---|\n| 1.3 | 6 November 2020 | R. Joshi |\n\
                       Rates after the table: 1.3% for staff.";
        assert!(
            !comparable(history).contains("1p3 |"),
            "{}",
            comparable(history)
        );
        assert_eq!(
            cited(
                "An increase of 1.3%.",
                "What increase?",
                &[&history[..history.find("Rates").unwrap()]]
            )
            .by,
            CitedBy::Unsupported
        );
        assert_eq!(
            cited("An increase of 1.3%.", "What increase?", &[history]).sources,
            [1]
        );
        // Only the value right after the word goes: other figures on the line stay.
        assert_eq!(
            without_version_values("Version: 2.7 | limit 2.7 | versions 4 | Version 5a"),
            "Version:  | limit 2.7 | versions 4 | Version 5a"
        );
    }

    #[test]
    fn an_answer_that_only_restates_the_question_is_unsupported() {
        let q = "What relocation allowance is paid to colleagues relocating to Singapore?";
        let src =
            "Relocation to Singapore: colleagues are paid an allowance; amounts are restricted.";
        assert_eq!(
            cited(
                "The relocation allowance is paid to colleagues relocating to Singapore.",
                q,
                &[src]
            )
            .by,
            CitedBy::Unsupported
        );
        // A yes/no answer adds its yes or no; an abstention repeats nothing.
        let yn = "Is a second approver required for wire transfers?";
        assert!(!restates(
            "Yes, a second approver is required for wire transfers.",
            yn
        ));
        assert!(!restates(
            "No, a second approver is not required for wire transfers.",
            yn
        ));
        assert!(restates(
            "A second approver is required for wire transfers.",
            yn
        ));
        assert_eq!(
            cited(
                "I cannot find this information in the documents available to you.",
                q,
                &[src]
            )
            .by,
            CitedBy::Support
        );
    }

    #[test]
    fn a_keyword_default_quoted_from_its_source_is_supported() {
        // Real-manual questions ask for kinds of value the asked-kind rule does not know: a
        // keyword default, an option, a command. "value" reads as a figure question.
        let q = "What value does sshd use for PermitRootLogin when the config does not set it?";
        let src = "PermitRootLogin: Specifies whether root can log in using ssh(1). The argument \
                   must be yes, prohibit-password, forced-commands-only, or no. The default is \
                   prohibit-password.";
        for answer in ["prohibit-password [1]", "prohibit-password", "Unlimited."] {
            let c = cited(answer, q, &[src, "Unlimited sessions are allowed."]);
            assert_ne!(c.by, CitedBy::Unsupported, "{answer}: {c:?}");
            assert!(!c.sources.is_empty(), "{answer}: {c:?}");
        }
        // A value no source holds stays unsupported.
        assert_eq!(cited("permit-always", q, &[src]).by, CitedBy::Unsupported);
    }

    #[test]
    fn a_name_of_several_words_must_be_written_as_one_phrase() {
        let q = "Quick question: How much cash can a till hold at the Bradwell Station Road \
                 branch during opening hours?";
        assert_eq!(name_runs(q), [["Bradwell", "Station", "Road"]]);
        // Every word is in some source, the phrase in none: another branch.
        let others = [
            "Cash Holding Limits for the Elmhurst Station Road Branch",
            "Bradwell Central branch: till limit GBP 20,000.",
        ];
        assert_eq!(unmatched_names(q, &others), ["Bradwell Station Road"]);
        let with_it = [others[0], "Limits for the Bradwell Station Road Branch"];
        assert!(unmatched_names(q, &with_it).is_empty());
        // Possessives, "&" and case do not break a phrase.
        assert_eq!(
            name_runs("What is Thornbury Agritech's covenant with Sorensen & Sandoval LLP?"),
            [vec!["Thornbury", "Agritech"], vec!["Sorensen", "Sandoval"]]
        );
        assert!(
            unmatched_names(
                "What is Thornbury Agritech's covenant with Sorensen & Sandoval LLP?",
                &["THORNBURY AGRITECH'S counsel: Sorensen & Sandoval LLP."]
            )
            .is_empty()
        );
    }

    #[test]
    fn a_value_of_another_kind_than_asked_is_unsupported_unless_a_source_holds_it() {
        let q = "By what time do JPY payments from Singapore have to be released?";
        let src = "JPY payments from Singapore: the payments calendar was updated on 6 May 2026. \
                   The Singapore desk reviews JPY limits quarterly.";
        // A date no source holds, for a question asking for a time of day, with or without a
        // marker: it does not answer, and cites nothing.
        for answer in ["By 7 May 2026.", "By 7 May 2026 [1]."] {
            let c = cited(answer, q, &[src]);
            assert_eq!(c.by, CitedBy::Unsupported, "{answer}");
            assert!(c.sources.is_empty(), "{answer}");
        }
        // The same kind of answer quoting a source is never withheld (issue 46: withholding
        // never fires when a cited source holds the answer's span): the user can check it
        // against the source, and the kind detector does not know every kind of value.
        assert_eq!(
            cited("By 6 May 2026 [1].", q, &[src]),
            Cited {
                sources: vec![1],
                by: CitedBy::Markers
            }
        );
        assert_eq!(
            cited("By 6 May 2026.", q, &["Other text about limits.", src]),
            Cited {
                sources: vec![2],
                by: CitedBy::Support
            }
        );
        // A marker naming a source that does not hold it: the quote is not from the cited
        // source, and the asked-kind rule stands.
        let other = "JPY limits are reviewed quarterly by the Singapore desk.";
        assert_eq!(
            cited("By 6 May 2026 [1].", q, &[other, src]).by,
            CitedBy::Unsupported
        );
        // The asked kind, supported: cited as before.
        let with_time = "JPY payments from Singapore must be released by 14:30 SGT.";
        assert_eq!(
            cited("They must be released by 14:30 SGT.", q, &[src, with_time]),
            Cited {
                sources: vec![2],
                by: CitedBy::Support
            }
        );
        // The fixed abstention is not judged for its kind.
        assert_eq!(
            cited(
                "I cannot find this information in the documents available to you.",
                q,
                &[src]
            )
            .by,
            CitedBy::Support
        );
    }
}
