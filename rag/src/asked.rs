//! What kind of value a question asks for, and whether an answer holds one.
//!
//! "By what time must JPY payments be released?" asks for a time of day; "By 6 May 2026." is
//! not one, however well a source supports the date. A small model that cannot find the asked
//! value often answers with another value of the right subject (an outage date for "when do full
//! backups start each night", a version number for "which incident number"); attribution then
//! finds a source holding it, and the answer looks supported. [`answers_another_kind`] catches
//! that: the question asks for a kind of value ([`asked`]) and the answer holds none of that
//! kind of its own ([`holds`]), so the answer is treated as unsupported (`cite::cited`).
//!
//! The kinds are deliberately few and their detectors lenient: a rule that withholds a right
//! answer costs a user more than one that lets a wrong one through to the other checks.
//! A question asking for two things ("how much …, and since when …") is not judged.

use std::collections::HashSet;

/// A kind of value a question asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Asked {
    /// A time of day: "what time", "by what time", "what hour", "cut-off time", "when … each
    /// night".
    Time,
    /// A date or day: "what date", "which day", "on what day", "from when", "since when".
    Date,
    /// An identifier: "which reference", "what incident number", "what ticket".
    Reference,
    /// A figure: "how much", "how many", "what amount/figure/limit/rate/…".
    Figure,
}

/// Question words that start a second question after "and" ("…, and since when …").
const SECOND_QUESTION: &[&str] = &[
    "when", "what", "which", "how", "who", "where", "since", "from", "why", "whom", "whose",
];

/// Nouns naming a figure after "what"/"which" (within [`FIGURE_NOUN_WINDOW`] words): "what
/// maximum net debt", "which amount", "what recovery point target".
const FIGURE_NOUNS: &[&str] = &[
    "amount",
    "figure",
    "sum",
    "percentage",
    "percent",
    "number",
    "target",
    "limit",
    "threshold",
    "ratio",
    "rate",
    "cap",
    "ceiling",
    "floor",
    "fee",
    "allowance",
    "tenor",
    "spread",
    "maximum",
    "minimum",
    "budget",
    "price",
    "cost",
    "value",
    "margin",
    "premium",
    "multiple",
    "count",
];

/// How many words after "what"/"which" a figure noun may stand.
const FIGURE_NOUN_WINDOW: usize = 4;

/// Words after "what"/"which" that make it a question for an identifier.
const REFERENCE_NOUNS: &[&str] = &["reference", "ref", "incident", "ticket", "identifier", "id"];

/// Parts of the day after "each"/"every" that make a "when" question one about a time of day.
const DAY_PARTS: &[&str] = &[
    "night",
    "day",
    "morning",
    "evening",
    "afternoon",
    "weekday",
    "business",
];

/// The kind of value `question` asks for, if it asks for one kind only.
pub fn asked(question: &str) -> Option<Asked> {
    let w = airlock_text::words(question);
    let at = |i: usize| w.get(i).map(String::as_str).unwrap_or("");
    if (0..w.len()).any(|i| at(i) == "and" && SECOND_QUESTION.contains(&at(i + 1))) {
        return None;
    }
    let wh = |i: usize| matches!(at(i), "what" | "which");
    let mut found = None;
    for i in 0..w.len() {
        let kind = if (wh(i) && matches!(at(i + 1), "time" | "hour"))
            || (matches!(at(i), "cut-off" | "cutoff") && at(i + 1) == "time")
            || (at(i) == "when"
                && (i + 1..w.len())
                    .any(|j| matches!(at(j), "each" | "every") && DAY_PARTS.contains(&at(j + 1))))
        {
            Some(Asked::Time)
        } else if (wh(i) && matches!(at(i + 1), "date" | "day"))
            || (matches!(at(i), "since" | "from") && at(i + 1) == "when")
        {
            Some(Asked::Date)
        } else if wh(i)
            && (REFERENCE_NOUNS.contains(&at(i + 1))
                || (matches!(at(i + 1), "case" | "control" | "tracking")
                    && matches!(at(i + 2), "number" | "no" | "reference")))
        {
            Some(Asked::Reference)
        } else if (at(i) == "how" && matches!(at(i + 1), "much" | "many"))
            || (wh(i) && (i + 1..=i + FIGURE_NOUN_WINDOW).any(|j| FIGURE_NOUNS.contains(&at(j))))
        {
            Some(Asked::Figure)
        } else {
            None
        };
        if let Some(kind) = kind {
            match found {
                None => found = Some(kind),
                Some(k) if k == kind => {}
                // Two kinds asked: not judged.
                Some(_) => return None,
            }
        }
    }
    found
}

/// Whether `answer` holds a value of `kind` of its own (for [`Asked::Reference`] and
/// [`Asked::Figure`], one that `question` does not already contain).
pub fn holds(answer: &str, question: &str, kind: Asked) -> bool {
    let norm = airlock_text::normalize(answer);
    let question_words: HashSet<String> = airlock_text::words(&airlock_text::normalize(question))
        .into_iter()
        .collect();
    let words = airlock_text::words(&norm);
    let own = || words.iter().filter(|w| !question_words.contains(*w));
    match kind {
        Asked::Time => has_time(&norm),
        Asked::Date => words.iter().any(|w| {
            is_iso_date(w)
                || airlock_text::MONTHS.contains(&w.as_str())
                || DATE_WORDS.contains(&w.as_str())
        }),
        Asked::Reference => own().any(|w| w.bytes().any(|b| b.is_ascii_digit()) && !is_iso_date(w)),
        Asked::Figure => {
            own().any(|w| w.bytes().any(|b| b.is_ascii_digit()) && !is_iso_date(w))
                || words.iter().any(|w| NUMBER_WORDS.contains(&w.as_str()))
        }
    }
}

/// Whether `answer` fails to hold the kind of value `question` asks for (see the module doc).
pub fn answers_another_kind(answer: &str, question: &str) -> bool {
    asked(question).is_some_and(|kind| !holds(answer, question, kind))
}

/// Words that answer "what day" without a calendar date.
const DATE_WORDS: &[&str] = &[
    "monday",
    "tuesday",
    "wednesday",
    "thursday",
    "friday",
    "saturday",
    "sunday",
    "day",
    "days",
    "weekday",
    "weekdays",
    "weekend",
    "today",
    "tomorrow",
    "yesterday",
    "quarter",
    "month",
    "year",
];

/// Figures written as words.
const NUMBER_WORDS: &[&str] = &[
    "one",
    "two",
    "three",
    "four",
    "five",
    "six",
    "seven",
    "eight",
    "nine",
    "ten",
    "eleven",
    "twelve",
    "fifteen",
    "twenty",
    "thirty",
    "forty",
    "fifty",
    "sixty",
    "ninety",
    "hundred",
    "thousand",
    "million",
    "billion",
    "half",
    "twice",
    "double",
    "zero",
    "none",
    "unlimited",
];

/// `2026-05-06`.
fn is_iso_date(w: &str) -> bool {
    let b = w.as_bytes();
    b.len() == 10
        && b[4] == b'-'
        && b[7] == b'-'
        && b.iter()
            .enumerate()
            .all(|(i, c)| i == 4 || i == 7 || c.is_ascii_digit())
}

/// A time of day in lower-case `text`: `14:30`, `9am`, `9 p.m.`, `noon`, `midday`, `midnight`,
/// `o'clock`, `close of business`, `end of day`.
fn has_time(text: &str) -> bool {
    let b = text.as_bytes();
    let clock = (0..b.len()).any(|i| {
        b[i] == b':'
            && i > 0
            && b[i - 1].is_ascii_digit()
            && b.get(i + 1).is_some_and(u8::is_ascii_digit)
            && b.get(i + 2).is_some_and(u8::is_ascii_digit)
    });
    let meridiem = (0..b.len()).any(|i| {
        b[i].is_ascii_digit() && {
            let rest = text[i + 1..].trim_start_matches(' ');
            ["am", "pm", "a.m", "p.m"].iter().any(|m| {
                rest.strip_prefix(m)
                    .is_some_and(|after| after.chars().next().is_none_or(|c| !c.is_alphanumeric()))
            })
        }
    });
    clock
        || meridiem
        || [
            "noon",
            "midday",
            "midnight",
            "o'clock",
            "close of business",
            "end of day",
        ]
        .iter()
        .any(|p| text.contains(p))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_kind_asked_for() {
        let cases = [
            (
                "By what time do JPY payments from Singapore have to be released?",
                Some(Asked::Time),
            ),
            (
                "When do full backups of QuillPoint start each night?",
                Some(Asked::Time),
            ),
            ("What is the cut-off time for CHF wires?", Some(Asked::Time)),
            (
                "On what day will the planned HarborGate outage take place?",
                Some(Asked::Date),
            ),
            (
                "From when does the new pay structure apply?",
                Some(Asked::Date),
            ),
            (
                "What incident number was assigned to the phishing compromise?",
                Some(Asked::Reference),
            ),
            (
                "Which reference does the security team use for it?",
                Some(Asked::Reference),
            ),
            (
                "How much can Tier 4 clients send by wire in a day?",
                Some(Asked::Figure),
            ),
            (
                "What recovery point target applies to CrestVault?",
                Some(Asked::Figure),
            ),
            (
                "What maximum net debt to EBITDA did the committee set?",
                Some(Asked::Figure),
            ),
            // The reference rate is not a question for a reference.
            (
                "At what spread over the reference rate is the facility priced?",
                Some(Asked::Figure),
            ),
            // Two questions in one, and questions for no kind: not judged.
            (
                "How much has to move before TM-B95 fires, and since when do the settings apply?",
                None,
            ),
            (
                "When is the Trade Finance Operations team's move happening?",
                None,
            ),
            ("Who approves exceptions to the travel policy?", None),
            ("Does the policy allow business class?", None),
        ];
        for (q, kind) in cases {
            assert_eq!(asked(q), kind, "{q}");
        }
    }

    #[test]
    fn an_answer_of_another_kind_is_caught() {
        let caught = [
            (
                "By what time do JPY payments have to be released?",
                "By 6 May 2026.",
            ),
            (
                "When do full backups of DeltaStream start each night?",
                "The full backups of DeltaStream start each night on 2024-02-14.",
            ),
            (
                "On what day will the planned HarborGate outage take place?",
                "The planned HarborGate outage will take place on 00:13 UTC each night.",
            ),
            (
                "What incident number was assigned to the phishing compromise affecting BoltSync in January 2026?",
                "The incident number assigned is 2026-01-10.",
            ),
            (
                "Which reference does the security team use for the compromise affecting EmberDesk in August 2024?",
                "The reference for the compromise affecting EmberDesk in August 2024 is the Colleague Update.",
            ),
            (
                "What figure was proposed in the draft proposal?",
                "It was proposed on 9 June 2025.",
            ),
            (
                "What figure was proposed in the draft strategy?",
                "Credit Risk",
            ),
            (
                "What recovery point target applies to CrestVault?",
                "CrestVault will be unavailable on 2026-05-06 while the platform is upgraded.",
            ),
        ];
        for (q, a) in caught {
            assert!(answers_another_kind(a, q), "{q} / {a}");
        }
    }

    #[test]
    fn an_answer_of_the_asked_kind_passes() {
        let passes = [
            (
                "By what time must JPY payments be released?",
                "By 14:30 Singapore time [1].",
            ),
            (
                "By what time must EUR payments be released?",
                "They must be released by 3 pm.",
            ),
            (
                "What is the cut-off time for CHF wires?",
                "Noon, Zurich time.",
            ),
            ("When do full backups start each night?", "At 01:15 UTC."),
            (
                "On what day will the outage take place?",
                "On 14 July 2026.",
            ),
            (
                "On what day is the report due?",
                "On the last business day of each month.",
            ),
            (
                "From when does the new pay structure apply?",
                "From Monday.",
            ),
            (
                "What incident number was assigned to it?",
                "It was logged as GUILLEMOT-6118.",
            ),
            (
                "Which reference does the team use?",
                "They use reference 48213.",
            ),
            (
                "How much can Tier 4 clients send per day?",
                "Up to 7,250,000 EUR per business day.",
            ),
            (
                "What recovery point target applies to CrestVault?",
                "15 minutes.",
            ),
            ("What tenor does the facility have?", "Five years."),
            (
                "At what spread over the reference rate is it priced?",
                "At 440 bps.",
            ),
            // Not judged: two questions, or none of the kinds.
            (
                "How much has to move before TM-B95 fires, and since when do the settings apply?",
                "Since 2023-03-30.",
            ),
            ("Who approves exceptions?", "The Head of Treasury."),
        ];
        for (q, a) in passes {
            assert!(!answers_another_kind(a, q), "{q} / {a}");
        }
    }

    #[test]
    fn a_figure_the_question_already_holds_is_not_the_answers_own() {
        // "2024" is the question's; the answer adds no identifier of its own.
        assert!(answers_another_kind(
            "The reference for the incident in 2024 is the colleague update.",
            "Which reference was used for the incident in 2024?",
        ));
        assert!(!answers_another_kind(
            "The reference for the incident in 2024 is SEC-2024-117.",
            "Which reference was used for the incident in 2024?",
        ));
    }
}
