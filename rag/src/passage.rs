//! The supporting passage of a cited chunk: the sentence or sentences that best support the
//! answer (or, before the answer exists, best match the question), and a short excerpt of the
//! chunk around them, instead of the chunk's first bytes.
//!
//! A chunk is cut into units as source focus cuts it ([`crate::focus`]): lines, and sentences
//! within a line (a table row is one line). Each unit scores the summed weight of the target's
//! content words it holds, words compared as attribution compares them ([`crate::cite`]:
//! figures and dates written one way, plurals folded, stop words and answer vocabulary left
//! out); a word's weight is its rarity among the chunk's units (`ln(1 + U/df)`), a figure
//! counts double. The best unit is the passage; the next unit on its line joins it when it holds
//! a target word no other unit holds. A table row keeps its table's header row in the excerpt, so a
//! figure stays next to its column names. A chunk that shares no content word with the target
//! has no passage, and its excerpt is its beginning, as before.
//!
//! Only the chunk's own text and the target are read: what one citation shows does not depend
//! on any other document.

use std::collections::{HashMap, HashSet};

use crate::cite;

/// A citation's excerpt of its chunk.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Excerpt {
    /// At most the byte budget of the chunk's text: the passage with the context that fits
    /// around it (`…` where the chunk goes on), or the chunk's beginning without a passage.
    pub snippet: String,
    /// The supporting sentence(s), a substring of `snippet`; `None` when no unit of the chunk
    /// shares a content word with the target.
    pub passage: Option<String>,
}

/// The excerpt of `text` (a chunk) around the unit(s) that best support `target` (an answer or
/// a question), in at most `max` bytes (plus the `…` marks).
pub fn excerpt(text: &str, target: &str, max: usize) -> Excerpt {
    let text = text.trim();
    let units = units(text);
    let targets: HashSet<String> = cite::content_words(target).collect();
    let best = best_units(text, &units, &targets);
    let Some((first, last)) = best else {
        return Excerpt {
            snippet: crate::prompt::snippet(text, max),
            passage: None,
        };
    };
    let (start, end) = (units[first].0, units[last].1);
    let (start, end) = trimmed(text, start, end);
    if end - start > max {
        // The passage alone is over the budget: `max` bytes of it from a little before its
        // first target word, cut on words.
        let from = window_start(text, start, end, &targets, max);
        let cut = crate::prompt::snippet(&text[from..end], max);
        let passage = cut.trim_end_matches('…').trim().to_string();
        if passage.is_empty() {
            return Excerpt {
                snippet: crate::prompt::snippet(text, max),
                passage: None,
            };
        }
        let snippet = if from > 0 { format!("…{cut}") } else { cut };
        return Excerpt {
            snippet,
            passage: Some(passage),
        };
    }
    let header = table_header(text, start);
    let (mut from, mut to) = (start, end);
    // A table row's header row comes first when it fits (the rows between are skipped).
    let mut head = None;
    if let Some((hs, he)) = header
        && he - hs + 1 + (end - start) <= max
    {
        head = Some(&text[hs..he]);
    }
    let budget = max - head.map_or(0, |h| h.len() + 1);
    // Context: the units before and after, alternating (after first: the sentence that follows
    // a figure usually qualifies it), whole units while they fit.
    let mut before = first;
    let mut after = last + 1;
    loop {
        let mut grew = false;
        if after < units.len() && units[after].1 - from <= budget {
            to = units[after].1;
            after += 1;
            grew = true;
        }
        if before > 0
            && head.is_none_or(|_| units[before - 1].0 > header.map_or(0, |h| h.1))
            && to - units[before - 1].0 <= budget
        {
            before -= 1;
            from = units[before].0;
            grew = true;
        }
        if !grew {
            break;
        }
    }
    let (from, to) = trimmed(text, from, to);
    let mut snippet = String::with_capacity(max + 8);
    if let Some(h) = head {
        snippet.push_str(h.trim());
        snippet.push('\n');
        if from > header.map_or(0, |h| h.1 + 1) {
            snippet.push_str("…\n");
        }
    } else if from > 0 {
        snippet.push('…');
    }
    snippet.push_str(&text[from..to]);
    if to < text.len() {
        snippet.push('…');
    }
    Excerpt {
        snippet,
        passage: Some(text[start..end].to_string()),
    }
}

/// The units of `text`: byte ranges of its lines and of the sentences within a line (split
/// after `.`, `?` or `!` followed by white space), empty ones left out.
fn units(text: &str) -> Vec<(usize, usize)> {
    let b = text.as_bytes();
    let mut out = Vec::new();
    let mut start = 0;
    let mut push = |s: usize, e: usize| {
        let (s, e) = trimmed(text, s, e);
        if e > s {
            out.push((s, e));
        }
    };
    for i in 0..b.len() {
        if b[i] == b'\n' {
            push(start, i);
            start = i + 1;
        } else if matches!(b[i], b'.' | b'?' | b'!')
            && b.get(i + 1).is_some_and(|c| *c == b' ' || *c == b'\t')
        {
            push(start, i + 1);
            start = i + 1;
        }
    }
    push(start, b.len());
    out
}

/// `text[start..end]` without white space at either end, as a byte range.
fn trimmed(text: &str, start: usize, end: usize) -> (usize, usize) {
    let s = &text[start..end];
    let lead = s.len() - s.trim_start().len();
    let trail = s.len() - s.trim_end().len();
    if lead == s.len() {
        return (start, start);
    }
    (start + lead, end - trail)
}

/// Where a window of `max` bytes into the long unit `text[start..end]` starts: a third of the
/// budget before the unit's first word that holds a target word (on a word boundary), or the
/// unit's start.
fn window_start(
    text: &str,
    start: usize,
    end: usize,
    targets: &HashSet<String>,
    max: usize,
) -> usize {
    let unit = &text[start..end];
    let mut first = None;
    let mut at = 0;
    for token in unit.split_inclusive(char::is_whitespace) {
        if cite::content_words(token).any(|w| targets.contains(&w)) {
            first = Some(at);
            break;
        }
        at += token.len();
    }
    let Some(first) = first else {
        return start;
    };
    let mut from = first.saturating_sub(max / 3);
    while !unit.is_char_boundary(from) {
        from -= 1;
    }
    // Back to the start of the word `from` falls in.
    if let Some(space) = unit[..from].rfind(char::is_whitespace)
        && from < first
        && !unit[from..].starts_with(char::is_whitespace)
    {
        from = space + unit[space..].chars().next().map_or(1, char::len_utf8);
    }
    start + from
}

/// The best unit, and the unit after it (on the same line) when it holds a target word no other
/// unit holds: `(first, last)`
/// unit indexes, or `None` when no unit holds a target word.
fn best_units(
    text: &str,
    units: &[(usize, usize)],
    targets: &HashSet<String>,
) -> Option<(usize, usize)> {
    if targets.is_empty() || units.is_empty() {
        return None;
    }
    let held: Vec<HashSet<String>> = units
        .iter()
        .map(|&(s, e)| {
            cite::content_words(&text[s..e])
                .filter(|w| targets.contains(w))
                .collect()
        })
        .collect();
    let mut df: HashMap<&str, usize> = HashMap::new();
    for set in &held {
        for w in set {
            *df.entry(w.as_str()).or_default() += 1;
        }
    }
    let n = units.len() as f64;
    let weight = |w: &str| -> f64 {
        let idf = (1.0 + n / df[w] as f64).ln();
        if cite::is_figure(w) { 2.0 * idf } else { idf }
    };
    let score = |set: &HashSet<String>| -> f64 { set.iter().map(|w| weight(w)).sum() };
    // The best unit; ties go to the earlier one.
    let (best, top) = held
        .iter()
        .enumerate()
        .map(|(i, set)| (i, score(set)))
        .fold((0, 0.0), |acc, c| if c.1 > acc.1 { c } else { acc });
    if top <= 0.0 {
        return None;
    }
    let next = best + 1;
    let joins = next < units.len()
        && !text[units[best].1..units[next].0].contains('\n')
        && held[next]
            .iter()
            .any(|w| !held[best].contains(w) && df[w.as_str()] == 1);
    Some((best, if joins { next } else { best }))
}

/// A table row: a Markdown row (`| a | b |`) or an extracted one (`a | b | c`, cells separated
/// by ` | `, docs/EXTRACTION.md).
fn is_row(line: &str) -> bool {
    line.trim_start().starts_with('|') || line.contains(" | ")
}

/// The header row of the table whose row starts at `at`, as a byte range, when `at` starts a
/// table row that is not itself the table's first row.
fn table_header(text: &str, at: usize) -> Option<(usize, usize)> {
    let line_start = text[..at].rfind('\n').map_or(0, |i| i + 1);
    let line_end = text[at..].find('\n').map_or(text.len(), |i| at + i);
    if line_start != at || !is_row(&text[at..line_end]) {
        return None;
    }
    // Walk back over the table's rows to its first.
    let mut first = at;
    while first > 0 {
        let prev_end = first - 1;
        let prev_start = text[..prev_end].rfind('\n').map_or(0, |i| i + 1);
        if !is_row(&text[prev_start..prev_end]) {
            break;
        }
        first = prev_start;
    }
    if first == at {
        return None;
    }
    let end = text[first..].find('\n').map_or(text.len(), |i| first + i);
    Some((first, end))
}

#[cfg(test)]
mod tests {
    use super::*;

    const POLICY: &str = "Treasury limits are reviewed every quarter by the committee. \
        The overnight placement limit for a single counterparty is EUR 49,600 thousand. \
        Breaches are reported to the CRO within one business day. \
        Other limits are listed in annex B.";

    #[test]
    fn the_passage_is_the_sentence_that_holds_the_answers_figure() {
        let e = excerpt(POLICY, "The limit is EUR 49,600 thousand [1].", 120);
        assert_eq!(
            e.passage.as_deref(),
            Some("The overnight placement limit for a single counterparty is EUR 49,600 thousand.")
        );
        let snippet = &e.snippet;
        assert!(snippet.contains(e.passage.as_deref().unwrap()), "{snippet}");
        assert!(snippet.starts_with('…'), "{snippet}");
        assert!(snippet.len() <= 120 + 2 * '…'.len_utf8(), "{snippet}");
    }

    #[test]
    fn before_the_answer_the_question_picks_the_passage() {
        let e = excerpt(POLICY, "Who receives reports of limit breaches?", 300);
        assert_eq!(
            e.passage.as_deref(),
            Some("Breaches are reported to the CRO within one business day.")
        );
        // The whole chunk fits: no cut marks.
        assert_eq!(e.snippet, POLICY);
    }

    #[test]
    fn a_chunk_sharing_no_word_with_the_target_keeps_its_beginning_and_has_no_passage() {
        let e = excerpt(POLICY, "What is the dress code?", 40);
        assert_eq!(e.passage, None);
        assert_eq!(e.snippet, crate::prompt::snippet(POLICY, 40));
    }

    #[test]
    fn a_table_row_keeps_its_header_row() {
        let text = "Rate sheet, effective 1 March 2026.\n\
            | Product | Term | Rate |\n\
            | --- | --- | --- |\n\
            | Fixed deposit | 12 months | 3.10% |\n\
            | Fixed deposit | 24 months | 3.35% |\n\
            | Savings plus | open | 1.25% |\n\
            Rates are gross and subject to change without notice at any time by the bank.";
        let e = excerpt(text, "What is the rate for a 24 months fixed deposit?", 90);
        assert_eq!(
            e.passage.as_deref(),
            Some("| Fixed deposit | 24 months | 3.35% |")
        );
        assert!(
            e.snippet.starts_with("| Product | Term | Rate |\n"),
            "{}",
            e.snippet
        );
        assert!(e.snippet.contains("| Fixed deposit | 24 months | 3.35% |"));
        // An extracted table's rows (no outer bars) likewise.
        let text = "Product | Term | Rate\nBond 12 | 12 | 2.90%\nBond 68 | 68 | 4.15%\nBond 90 | 90 | 4.40%";
        let e = excerpt(text, "Bond 68 rate", 60);
        assert_eq!(e.passage.as_deref(), Some("Bond 68 | 68 | 4.15%"));
        assert!(
            e.snippet.starts_with("Product | Term | Rate\n"),
            "{}",
            e.snippet
        );
    }

    #[test]
    fn a_passage_longer_than_the_budget_is_cut_on_a_word() {
        let long = format!("Intro. {} limit 77 end.", "word ".repeat(200));
        let e = excerpt(&long, "limit 77", 50);
        let p = e.passage.unwrap();
        assert!(p.len() <= 50, "{p}");
        assert!(p.contains("limit 77"), "{p}");
        assert!(e.snippet.contains(&p));
        assert!(e.snippet.starts_with('…'));
    }

    #[test]
    fn the_next_sentence_joins_when_it_adds_a_target_word() {
        let text = "The cut-off is 17:30 CET. It applies to SEPA payments only. Other text here.";
        let e = excerpt(text, "The cut-off for SEPA payments is 17:30.", 300);
        assert_eq!(
            e.passage.as_deref(),
            Some("The cut-off is 17:30 CET. It applies to SEPA payments only.")
        );
    }

    #[test]
    fn any_input_gives_a_snippet_within_budget_holding_its_passage() {
        let texts = [
            "",
            "\n\n",
            "| a |\n| b |",
            "é. ü! ß? 漢字 limit 5.",
            "x.\ty. z",
            "| only row with limit |",
        ];
        for t in texts {
            for target in ["", "limit", "5", "漢字 b"] {
                for max in [1, 5, 20, 300] {
                    let e = excerpt(t, target, max);
                    if let Some(p) = &e.passage {
                        assert!(!p.is_empty(), "{t:?} {target:?} {max}");
                        assert!(e.snippet.contains(p.as_str()), "{t:?} {target:?} {max}");
                    }
                    // The budget, plus the cut marks (and a header row's "…\n").
                    assert!(e.snippet.len() <= max + 8, "{t:?} {target:?} {max}: {e:?}");
                }
            }
        }
    }
}
