//! `airlock-text`: the one place where Airlock splits text into words, knows English function
//! words, writes figures and dates one way and cuts an excerpt on a word ([`snippet`]). Used by
//! the answer path (`airlock-rag`: focus, attribution, facets, follow-ups, citation snippets) and
//! by the evals (`airlock-eval`: answer matching), so the two judge text alike, and by
//! `airlock-evidence` for conversation titles.
#![warn(missing_docs)]

/// English function words and question words: never distinguishing.
pub const STOP_WORDS: &[&str] = &[
    "a", "about", "above", "after", "all", "an", "and", "any", "are", "as", "at", "be", "because",
    "been", "before", "being", "below", "both", "but", "by", "can", "could", "did", "do", "does",
    "doing", "each", "few", "for", "from", "had", "has", "have", "having", "he", "her", "here",
    "him", "his", "how", "i", "if", "in", "into", "is", "it", "its", "just", "may", "me", "might",
    "more", "most", "must", "my", "no", "nor", "not", "of", "on", "only", "or", "other", "our",
    "over", "own", "s", "same", "shall", "she", "should", "so", "some", "such", "t", "than",
    "that", "the", "their", "them", "then", "there", "these", "they", "this", "those", "to", "too",
    "under", "until", "us", "very", "was", "we", "were", "what", "when", "where", "which", "while",
    "who", "whom", "whose", "why", "will", "with", "would", "you", "your",
];

/// Lower-case words: runs of letters and digits, joined by inner `-` or `'` ("third-party",
/// "o'neill"), a possessive `'s` removed; everything else separates.
pub fn words(text: &str) -> Vec<String> {
    fn push(out: &mut Vec<String>, mut w: String) {
        if w.len() > 2 && w.ends_with("'s") {
            w.truncate(w.len() - 2);
        }
        out.push(w);
    }
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut pending: Option<char> = None;
    for ch in text.chars() {
        if ch.is_alphanumeric() {
            if let Some(j) = pending.take() {
                cur.push(j);
            }
            cur.extend(ch.to_lowercase());
        } else if (ch == '-' || ch == '\'' || ch == '’') && !cur.is_empty() && pending.is_none() {
            pending = Some(if ch == '’' { '\'' } else { ch });
        } else {
            pending = None;
            if !cur.is_empty() {
                push(&mut out, std::mem::take(&mut cur));
            }
        }
    }
    if !cur.is_empty() {
        push(&mut out, cur);
    }
    out
}

/// Whether `w` (lower case) is an English function or question word.
pub fn is_stop(w: &str) -> bool {
    STOP_WORDS.contains(&w)
}

/// Lower-case runs of letters and digits; every other character separates ("third-party" is
/// two words here, one in [`words`]).
pub fn alnum_words(text: &str) -> impl Iterator<Item = String> + '_ {
    text.split(|c: char| !c.is_alphanumeric())
        .filter(|w| !w.is_empty())
        .map(str::to_lowercase)
}

/// A lower-case word with a plural `s` removed when more than three letters remain and the
/// stem does not itself end in `s` ("limits" → "limit", "bus" and "class" unchanged).
pub fn singular(w: String) -> String {
    match w.strip_suffix('s') {
        Some(stem) if stem.chars().count() > 3 && !stem.ends_with('s') => stem.to_string(),
        _ => w,
    }
}

/// English month names, lower case, January first.
pub const MONTHS: [&str; 12] = [
    "january",
    "february",
    "march",
    "april",
    "may",
    "june",
    "july",
    "august",
    "september",
    "october",
    "november",
    "december",
];

fn month_number(word: &str) -> Option<u32> {
    let w = word.trim_end_matches('.');
    if w.len() < 3 {
        return None;
    }
    MONTHS
        .iter()
        .position(|m| m.starts_with(w) && (w.len() == m.len() || w.len() == 3))
        .map(|i| i as u32 + 1)
}

/// Normalises text for answer matching: lower case, unified dashes and spaces, digit-group
/// separators removed (`7,250,000` → `7250000`), and dates written `8 August 2025` or
/// `August 8, 2025` rewritten as ISO `2025-08-08`.
pub fn normalize(text: &str) -> String {
    let lower: String = text
        .chars()
        .map(|c| match c {
            '\u{2010}'..='\u{2015}' | '\u{2212}' => '-',
            '\u{00a0}' | '\u{202f}' | '\u{2009}' => ' ',
            c => c,
        })
        .flat_map(char::to_lowercase)
        .collect();
    // Drop separators inside digit groups: a ',' or '\'' between two digits.
    let chars: Vec<char> = lower.chars().collect();
    let mut s = String::with_capacity(lower.len());
    for (i, &c) in chars.iter().enumerate() {
        let between_digits = i > 0
            && i + 1 < chars.len()
            && chars[i - 1].is_ascii_digit()
            && chars[i + 1].is_ascii_digit();
        if (c == ',' || c == '\'') && between_digits {
            continue;
        }
        s.push(c);
    }
    rewrite_dates(&s)
}

fn rewrite_dates(s: &str) -> String {
    let tokens: Vec<&str> = s.split(' ').collect();
    let mut out: Vec<String> = Vec::with_capacity(tokens.len());
    let day = |t: &str| -> Option<u32> {
        let t = t.trim_end_matches(',');
        let t = t
            .trim_end_matches("st")
            .trim_end_matches("nd")
            .trim_end_matches("rd")
            .trim_end_matches("th");
        t.parse().ok().filter(|d| (1..=31).contains(d))
    };
    let year = |t: &str| -> Option<(u32, String)> {
        let digits: String = t.chars().take_while(char::is_ascii_digit).collect();
        if digits.len() != 4 {
            return None;
        }
        Some((digits.parse().ok()?, t[digits.len()..].to_owned()))
    };
    let mut i = 0;
    while i < tokens.len() {
        if i + 2 < tokens.len() {
            // "8 august 2025"
            if let (Some(d), Some(m), Some((y, rest))) = (
                day(tokens[i]),
                month_number(tokens[i + 1]),
                year(tokens[i + 2]),
            ) && !tokens[i].ends_with(',')
            {
                out.push(format!("{y:04}-{m:02}-{d:02}{rest}"));
                i += 3;
                continue;
            }
            // "august 8, 2025"
            if let (Some(m), Some(d), Some((y, rest))) = (
                month_number(tokens[i]),
                day(tokens[i + 1]),
                year(tokens[i + 2]),
            ) {
                out.push(format!("{y:04}-{m:02}-{d:02}{rest}"));
                i += 3;
                continue;
            }
        }
        out.push(tokens[i].to_owned());
        i += 1;
    }
    out.join(" ")
}

/// Whether `haystack` contains `needle` after [`normalize`] of both.
pub fn contains_normalized(haystack: &str, needle: &str) -> bool {
    normalize(haystack).contains(&normalize(needle))
}

/// A short excerpt: `text` trimmed and, when longer than `max` bytes, cut after its last whole
/// word that fits, with `…` appended. Citation snippets and conversation titles.
pub fn snippet(text: &str, max: usize) -> String {
    let t = text.trim();
    if t.len() <= max {
        return t.to_string();
    }
    let mut cut = max;
    while !t.is_char_boundary(cut) {
        cut -= 1;
    }
    let head = &t[..cut];
    let head = head
        .rsplit_once(char::is_whitespace)
        .map_or(head, |(h, _)| h);
    format!("{head}…")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn normalization_handles_numbers_dates_case() {
        assert!(contains_normalized(
            "The threshold is EUR 7250000.",
            "7,250,000"
        ));
        assert!(contains_normalized(
            "It applies from 8 August 2025.",
            "2025-08-08"
        ));
        assert!(contains_normalized("from August 8, 2025 on", "2025-08-08"));
        assert!(contains_normalized("From 2025-08-08", "8 Aug 2025"));
        assert!(contains_normalized("CODE jerboa-7350", "JERBOA-7350"));
        assert!(!contains_normalized("7,250,001", "7,250,000"));
        // A list "1, 2" is not a number.
        assert_eq!(normalize("items 1, 2"), "items 1, 2");
    }

    #[test]
    fn word_splitters_agree_on_plain_words_and_differ_on_joiners() {
        assert_eq!(
            words("The third-party O'Neill's limits"),
            ["the", "third-party", "o'neill", "limits"]
        );
        let plain: Vec<String> = alnum_words("The third-party limits").collect();
        assert_eq!(plain, ["the", "third", "party", "limits"]);
        assert_eq!(singular("limits".into()), "limit");
        assert_eq!(singular("class".into()), "class");
        assert_eq!(singular("bus".into()), "bus");
        assert!(is_stop("the") && !is_stop("limit"));
    }

    #[test]
    fn snippet_cuts_on_words() {
        assert_eq!(snippet("alpha beta gamma", 11), "alpha beta…");
        assert_eq!(snippet("short", 50), "short");
    }
}
