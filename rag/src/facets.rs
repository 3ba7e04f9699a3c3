//! Facets: a question that asks the same thing about two subjects ("What is the interest rate
//! for the Family ISA, and what is it for the Student Mortgage?", "Compare the deadline of
//! module A with that of module B", "the threshold for both X and Y", "the date for X and also
//! for Y") needs two documents, one per subject. One retrieval for the whole question ranks the
//! documents about either subject against both at once, and source focus then keeps the one
//! that matches the question's words best: the prompt holds one subject and the answer misses
//! the other. [`facets`] splits such a question into one question per subject, each asking the
//! shared part ("What is the interest rate") about its own subject; the chat retrieves and
//! focuses each on its own and gives the model the union.
//!
//! Only these explicit forms are split (a question is never split on a bare "and", which joins
//! the words of one subject as often as two subjects: "Health and Safety", "terms and
//! conditions"). Every facet's sources pass the same access checks as any retrieval's.

/// Split points that introduce the second subject with a preposition of its own
/// (`", and what is it for Y"`); the second subject reuses the first facet's text up to the
/// same preposition.
const SECOND_SUBJECT: &[&str] = &[
    ", and what is it ",
    " and what is it ",
    ", and what is that ",
    " and also ",
    " with that of ",
    " with that for ",
    " with the one for ",
];

/// Prepositions that introduce a subject.
const PREPOSITIONS: &[&str] = &["for", "of", "at", "in", "on"];

/// The two one-subject questions of a question that asks the same thing about two subjects, or
/// `None` (see the module doc).
pub fn facets(question: &str) -> Option<[String; 2]> {
    sentences(question).find_map(|s| second_subject(s).or_else(|| both(s)))
}

/// The question's sentences: ends at `?`, `!` or a `.` followed by a space (not "1.14%").
fn sentences(text: &str) -> impl Iterator<Item = &str> {
    let bytes = text.as_bytes();
    let mut start = 0;
    let mut out = Vec::new();
    for (i, &b) in bytes.iter().enumerate() {
        let end = match b {
            b'?' | b'!' => true,
            b'.' => bytes.get(i + 1).is_none_or(u8::is_ascii_whitespace),
            _ => false,
        };
        if end {
            out.push(&text[start..i]);
            start = i + 1;
        }
    }
    out.push(&text[start..]);
    out.into_iter().map(str::trim).filter(|s| !s.is_empty())
}

/// `"A, and what is it for B"`: `[A, A's text before its last " for " + " for B"]`.
fn second_subject(sentence: &str) -> Option<[String; 2]> {
    let lower = sentence.to_ascii_lowercase();
    let (at, split) = SECOND_SUBJECT
        .iter()
        .filter_map(|p| lower.find(p).map(|at| (at, *p)))
        .min()?;
    let first = sentence[..at].trim_end_matches(',').trim();
    let mut rest = sentence[at + split.len()..].trim();
    // "with that of B": the split point itself holds the preposition.
    let preposition = match split.trim().rsplit(' ').next() {
        Some(p @ ("of" | "for")) => p,
        _ => {
            let (p, tail) = rest.split_once(' ')?;
            rest = tail;
            PREPOSITIONS
                .iter()
                .find(|q| q.eq_ignore_ascii_case(p))
                .copied()?
        }
    };
    let frame = first
        .to_ascii_lowercase()
        .rfind(&format!(" {preposition} "))
        .map(|i| &first[..i])?;
    two(first.to_string(), format!("{frame} {preposition} {rest}"))
}

/// `"the threshold for both X and Y"`: `["the threshold for X", "the threshold for Y"]`,
/// split at the last " and ".
fn both(sentence: &str) -> Option<[String; 2]> {
    let lower = sentence.to_ascii_lowercase();
    let at = PREPOSITIONS
        .iter()
        .filter_map(|p| lower.find(&format!(" {p} both ")).map(|i| i + p.len() + 2))
        .min()?;
    let head = &sentence[..at];
    let pair = &sentence[at + "both ".len()..];
    let and = pair.to_ascii_lowercase().rfind(" and ")?;
    let (x, y) = (pair[..and].trim(), pair[and + " and ".len()..].trim());
    two(format!("{head}{x}"), format!("{head}{y}"))
}

/// Both facets, when each has a subject of its own.
fn two(a: String, b: String) -> Option<[String; 2]> {
    let words = |s: &str| s.split_whitespace().count();
    (words(&a) >= 3 && words(&b) >= 3 && a != b).then_some([a, b])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f(q: &str) -> Option<[String; 2]> {
        facets(q)
    }

    #[test]
    fn and_what_is_it_for_reuses_the_shared_part() {
        assert_eq!(
            f(
                "Please help. What is the interest rate for the Halcyon Family ISA, and what is it \
               for the Halcyon Student Mortgage? Thanks."
            ),
            Some([
                "What is the interest rate for the Halcyon Family ISA".into(),
                "What is the interest rate for the Halcyon Student Mortgage".into(),
            ])
        );
        // The subject's own words differ, not only its names.
        assert_eq!(
            f(
                "What is the EDD trigger for institutional customers onboarded in Spain, and what \
               is it for private banking customers onboarded in Spain?"
            ),
            Some([
                "What is the EDD trigger for institutional customers onboarded in Spain".into(),
                "What is the EDD trigger for private banking customers onboarded in Spain".into(),
            ])
        );
    }

    #[test]
    fn compare_with_that_of_and_also_for() {
        assert_eq!(
            f(
                "Need this: Compare the deadline of the Health and Safety module for 2024 with \
               that of the Fraud Prevention module for 2026. Thanks!"
            ),
            Some([
                "Need this: Compare the deadline of the Health and Safety module for 2024".into(),
                "Need this: Compare the deadline of the Fraud Prevention module for 2026".into(),
            ])
        );
        assert_eq!(
            f(
                "Can you give me the outage date for the SummitStream outage and also for the \
               NimbusDesk outage?"
            ),
            Some([
                "Can you give me the outage date for the SummitStream outage".into(),
                "Can you give me the outage date for the NimbusDesk outage".into(),
            ])
        );
    }

    #[test]
    fn both_x_and_y_splits_at_the_last_and() {
        assert_eq!(
            f(
                "I need the deadline for both the Health and Safety module for 2026 and the Model \
               Risk module for 2024."
            ),
            Some([
                "I need the deadline for the Health and Safety module for 2026".into(),
                "I need the deadline for the Model Risk module for 2024".into(),
            ])
        );
    }

    #[test]
    fn one_subject_questions_are_not_split() {
        for q in [
            "What is the Health and Safety deadline for 2026?",
            "What are the terms and conditions of the Halcyon ISA?",
            "Both parties sign the form and the manager approves it: who keeps it?",
            "What is the rate of 1.14% for, and who set it?",
            "Which vault cash limit applies at the branch now managed by Karim Quintero?",
            "",
            "and also",
            "What is it for?",
        ] {
            assert_eq!(f(q), None, "{q}");
        }
    }
}
