//! The retrieval query of a conversation. Retrieval with the last user message alone fails on
//! follow-ups ("And what was the tenor of that facility?", "And for Aurora Freight?"): the
//! subject or the thing asked is in an earlier turn. [`FollowUps::Carry`] rewrites a follow-up
//! into a stand-alone question from the previous question's *keys* (proper names, years and
//! codes), deterministically and without a model:
//!
//! - a question that names its own subject and asks its own thing stands alone: unchanged (a
//!   first turn is always unchanged);
//! - a follow-up that asks something new about the same subject ("How about the break fee on
//!   that deal?", "… a Credit Officer there?") gets the previous question's names (and its
//!   years when it has none of its own) appended;
//! - an elliptical follow-up that names a new subject for the same question ("And for Aurora
//!   Freight?", "What about the 2026 review?", "And USD payments?", "Same question for
//!   Canada.") is the previous question with its key of the same kind (name, year, code)
//!   replaced by the new one, plus the follow-up's own words.
//!
//! A follow-up is recognised by its opening ("and …", "what about", "how about", "same …",
//! "could you also …", "what's it for") or a pronoun that points back ("there", "it", "their",
//! "that deal"). The rules were chosen by reading the bank-dev follow-up dev set (40 cases);
//! no name, id or word of that set is in the code. Earlier turns are resolved in order, so a
//! third turn builds on the resolved second. Only user turns are read: an assistant's answer
//! never enters retrieval.

use std::collections::HashSet;

use crate::prompt::Role;

/// How a conversation becomes a retrieval query (`follow_up_query` in the config).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FollowUps {
    /// The last user message alone (before follow-ups were handled).
    Last,
    /// The previous user message and the last one, concatenated.
    Concat,
    /// A follow-up rewritten from the previous question's keys (the module doc).
    #[default]
    Carry,
    /// A follow-up rewritten into a stand-alone question by the generator (the appliance asks
    /// it before the answer path runs and passes the rewrite as a one-message conversation).
    /// Without a model (here) it is [`FollowUps::Carry`].
    Rewrite,
}

/// The retrieval query for `conversation` (its user turns; the question is the last one).
pub fn retrieval_query(conversation: &[(Role, String)], how: FollowUps) -> String {
    let users: Vec<&str> = conversation
        .iter()
        .filter(|(r, t)| *r == Role::User && !t.trim().is_empty())
        .map(|(_, t)| t.trim())
        .collect();
    let Some((&last, earlier)) = users.split_last() else {
        return String::new();
    };
    let Some(&previous) = earlier.last() else {
        return last.to_string();
    };
    match how {
        FollowUps::Last => last.to_string(),
        FollowUps::Concat => format!("{previous} {last}"),
        FollowUps::Carry | FollowUps::Rewrite => {
            let mut resolved = users[0].to_string();
            for q in &users[1..] {
                resolved = carry(&resolved, q);
            }
            resolved
        }
    }
}

/// Openings of a follow-up (lower case, at the start of the question).
const OPENERS: &[&str] = &[
    "and ",
    "and?",
    "what about ",
    "how about ",
    "same ",
    "also ",
    "could you also ",
    "can you also ",
    "what's it for ",
    "what is it for ",
    "what's that for ",
    "while we're on ",
    "while we are on ",
];

/// Pronouns that point back to the previous question's subject.
const BACK_POINTERS: &[&str] = &[
    "there", "it", "its", "their", "they", "them", "those", "these", "he", "she", "his", "her",
];

/// Words a follow-up uses about itself ("same question", "the figure"): not a thing asked.
const FOLLOW_UP_WORDS: &[&str] = &[
    "about", "actually", "also", "case", "check", "figure", "one", "ones", "please", "question",
    "same", "thanks", "while", "we're",
];

/// A key of a question: what names its subject.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Key {
    /// A run of proper-name words ("Aurora Freight").
    Name(Vec<String>),
    /// A year ("2024").
    Year(String),
    /// A code in capitals or with digits ("USD", "G4").
    Code(String),
}

impl Key {
    fn text(&self) -> String {
        match self {
            Key::Name(words) => words.join(" "),
            Key::Year(s) | Key::Code(s) => s.clone(),
        }
    }

    fn same_kind(&self, other: &Key) -> bool {
        std::mem::discriminant(self) == std::mem::discriminant(other)
    }

    /// Its words in lower case.
    fn words(&self) -> Vec<String> {
        airlock_text::alnum_words(&self.text()).collect()
    }
}

fn keys(question: &str) -> Vec<Key> {
    let mut out: Vec<Key> = crate::cite::name_runs(question)
        .into_iter()
        .map(Key::Name)
        .collect();
    out.extend(crate::focus::years(question).into_iter().map(Key::Year));
    let mut seen = HashSet::new();
    for (i, w) in question
        .split(|c: char| !(c.is_alphanumeric() || c == '-'))
        .filter(|w| !w.is_empty())
        .enumerate()
    {
        let letters = w.chars().filter(|c| c.is_alphabetic()).count();
        let upper = w.chars().filter(|c| c.is_uppercase()).count();
        let digits = w.chars().filter(char::is_ascii_digit).count();
        // "USD", "SME", "G4", "TM-B75"; not "I", not a lone number, not a year.
        let code = (letters >= 2 && upper == letters && w.len() <= 8)
            || (letters >= 1 && digits >= 1 && upper == letters && w.len() <= 8);
        if code && (i > 0 || letters >= 2) && seen.insert(w.to_string()) {
            out.push(Key::Code(w.to_string()));
        }
    }
    out
}

/// The question's own content words: function words, its keys and follow-up words removed.
fn own_words(question: &str, keys: &[Key]) -> Vec<String> {
    let key_words: HashSet<String> = keys.iter().flat_map(Key::words).collect();
    crate::focus::question_terms(question)
        .into_iter()
        .filter(|w| !key_words.contains(w))
        .filter(|w| !FOLLOW_UP_WORDS.contains(&w.as_str()))
        .filter(|w| w.chars().any(char::is_alphabetic))
        .collect()
}

/// The question's opener, if it opens as a follow-up, and whether what follows the opener is
/// a question of its own ("And how large is …?") rather than a bare subject ("And the X?",
/// "How about the Y?").
fn opener(question: &str) -> Option<bool> {
    let q = question.trim_start().to_lowercase().replace('’', "'");
    if q == "and" {
        return Some(false);
    }
    let o = OPENERS.iter().find(|o| q.starts_with(**o))?;
    let rest = airlock_text::words(&q[o.len()..]);
    Some(rest.first().is_some_and(|w| ASKING.contains(&w.as_str())))
}

/// Words that open a question of its own.
const ASKING: &[&str] = &[
    "what", "which", "who", "whom", "whose", "when", "where", "why", "how", "is", "are", "was",
    "were", "does", "do", "did", "can", "could", "will", "would", "has", "have", "should",
];

/// A pronoun pointing back; `that`/`this` count as determiners ("that deal") only, and only
/// when the question names nothing of its own (else "the limit that applies to X").
fn points_back(question: &str, names_own: bool) -> bool {
    let words = airlock_text::words(question);
    words.iter().enumerate().any(|(i, w)| {
        BACK_POINTERS.contains(&w.as_str())
            || (!names_own
                && (w == "that" || w == "this")
                && words.get(i + 1).is_some_and(|n| !airlock_text::is_stop(n)))
    })
}

/// One follow-up step: `question` after `previous` (already stand-alone).
fn carry(previous: &str, question: &str) -> String {
    let q_keys = keys(question);
    let names_own = q_keys.iter().any(|k| matches!(k, Key::Name(_)));
    let own = own_words(question, &q_keys);
    let opened = opener(question);
    let back = points_back(question, names_own);
    if opened.is_none() && !back {
        return question.to_string();
    }
    let p_keys = keys(previous);
    // Elliptical: asks nothing of its own ("And for X?", "How about the Y book?").
    let elliptical = (!q_keys.is_empty() && own.len() < 2) || (opened == Some(false) && !back);
    if !elliptical {
        // Something new about the same subject: carry the subject over.
        let has_year = q_keys.iter().any(|k| matches!(k, Key::Year(_)));
        let q_text = question.to_lowercase();
        // "there" points at a place, named last in a question ("… booked in Warsaw"); other
        // pointers ("that deal", "their pay") at any of its names.
        let only_last = airlock_text::words(question).iter().any(|w| w == "there");
        let last_name = p_keys.iter().rposition(|k| matches!(k, Key::Name(_)));
        let carried: Vec<String> = p_keys
            .iter()
            .enumerate()
            .filter(|(i, k)| match k {
                Key::Name(_) => !only_last || Some(*i) == last_name,
                Key::Year(_) => !has_year,
                Key::Code(_) => false,
            })
            .map(|(_, k)| k)
            .map(Key::text)
            .filter(|t| !q_text.contains(&t.to_lowercase()))
            .collect();
        if carried.is_empty() {
            return question.to_string();
        }
        return format!("{question} {}", carried.join(" "));
    }
    // The same question about a new subject: swap the previous question's keys.
    let mut text = previous.to_string();
    let mut used: Vec<usize> = Vec::new();
    let mut appended: Vec<String> = Vec::new();
    let prev_lower = previous.to_lowercase();
    for k in &q_keys {
        if prev_lower.contains(&k.text().to_lowercase()) {
            continue;
        }
        let candidates: Vec<usize> = p_keys
            .iter()
            .enumerate()
            .filter(|(i, p)| !used.contains(i) && p.same_kind(k))
            .filter(|(_, p)| !question.to_lowercase().contains(&p.text().to_lowercase()))
            .map(|(i, _)| i)
            .collect();
        // A name replaces a name of as many words if there is one, else the last name (a
        // question's subject usually ends it: "… set for Fairhaven Shipping?").
        let pick = match k {
            Key::Name(w) => candidates
                .iter()
                .rev()
                .find(|&&i| matches!(&p_keys[i], Key::Name(p) if p.len() == w.len()))
                .or(candidates.last())
                .copied(),
            _ => candidates.first().copied(),
        };
        match pick.and_then(|i| replace_phrase(&text, &p_keys[i].text(), &k.text()).map(|t| (i, t)))
        {
            Some((i, t)) => {
                used.push(i);
                text = t;
            }
            None => appended.push(k.text()),
        }
    }
    let text_words: HashSet<String> = airlock_text::words(&text).into_iter().collect();
    appended.extend(own.into_iter().filter(|w| !text_words.contains(w)));
    if appended.is_empty() {
        text
    } else {
        format!("{text} {}", appended.join(" "))
    }
}

/// `text` with the first whole-word occurrence of `phrase` replaced by `with`.
fn replace_phrase(text: &str, phrase: &str, with: &str) -> Option<String> {
    let mut from = 0;
    while let Some(pos) = text[from..].find(phrase) {
        let start = from + pos;
        let end = start + phrase.len();
        let before = text[..start].chars().next_back();
        let after = text[end..].chars().next();
        let boundary = |c: Option<char>| c.is_none_or(|c| !c.is_alphanumeric());
        if boundary(before) && boundary(after) {
            return Some(format!("{}{with}{}", &text[..start], &text[end..]));
        }
        from = end;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn conv(turns: &[&str]) -> Vec<(Role, String)> {
        turns
            .iter()
            .enumerate()
            .map(|(i, t)| {
                let role = if i % 2 == 0 {
                    Role::User
                } else {
                    Role::Assistant
                };
                (role, t.to_string())
            })
            .collect()
    }

    fn carried(previous: &str, question: &str) -> String {
        retrieval_query(
            &conv(&[previous, "An answer [1].", question]),
            FollowUps::Carry,
        )
    }

    #[test]
    fn a_first_turn_and_a_stand_alone_question_are_unchanged() {
        let q = "What is the daily wire limit for Tier 1 clients in Oslo?";
        assert_eq!(retrieval_query(&conv(&[q]), FollowUps::Carry), q);
        let next = "When do full backups of LatticeNode start each night?";
        assert_eq!(carried(q, next), next);
        // "that" as a relative pronoun in a question naming its own subject.
        let rel = "What is the limit that applies to Quarry Holdings loans?";
        assert_eq!(carried(q, rel), rel);
        assert_eq!(retrieval_query(&[], FollowUps::Carry), "");
    }

    #[test]
    fn a_new_question_about_the_same_subject_carries_the_names() {
        assert_eq!(
            carried(
                "Who is the target in Project Vireo? Thanks!",
                "How about the break fee on that deal?"
            ),
            "How about the break fee on that deal? Project Vireo"
        );
        assert_eq!(
            carried(
                "When did the pay change take effect for Ana Lind in the 2023 review?",
                "And by what percentage did their pay rise in the 2024 review?"
            ),
            "And by what percentage did their pay rise in the 2024 review? Ana Lind"
        );
        assert_eq!(
            carried(
                "What is the cut-off for SEK payments from Tallinn?",
                "How much can a Deputy Credit Officer there approve alone?"
            ),
            "How much can a Deputy Credit Officer there approve alone? Tallinn"
        );
        // "there" is the place named last, not the role named before it.
        assert_eq!(
            carried(
                "How much can a Credit Officer in the Tallinn region approve?",
                "And the wire cap for Tier 2 clients booked there?"
            ),
            "And the wire cap for Tier 2 clients booked there? Tallinn"
        );
    }

    #[test]
    fn the_same_question_about_a_new_subject_swaps_the_key() {
        let p = "Quick question: What maximum leverage did the committee set for Orrin Marine?";
        assert_eq!(
            carried(p, "And for Teal Freight?"),
            "Quick question: What maximum leverage did the committee set for Teal Freight?"
        );
        assert_eq!(
            carried(p, "What's it for Teal Freight?"),
            "Quick question: What maximum leverage did the committee set for Teal Freight?"
        );
        assert_eq!(
            carried(
                "How big an increase was awarded to Ana Lind in the 2024 pay review?",
                "What about the 2026 review?"
            ),
            "How big an increase was awarded to Ana Lind in the 2026 pay review?"
        );
        assert_eq!(
            carried(
                "What is the latest time to submit SEK payments from Tallinn?",
                "And USD payments?"
            ),
            "What is the latest time to submit USD payments from Tallinn?"
        );
        assert_eq!(
            carried(
                "What's the top salary for grade G4 Risk and Compliance roles in Norway?",
                "Same question for Canada."
            ),
            "What's the top salary for grade G4 Risk and Compliance roles in Canada?"
        );
        // No key to swap: the new words are added.
        assert_eq!(
            carried(
                "What's the provisioning coverage for Stage 2 exposures in the Oslo SME book?",
                "How about the corporate revolving credit book?"
            ),
            "What's the provisioning coverage for Stage 2 exposures in the Oslo SME book? corporate revolving credit"
        );
    }

    #[test]
    fn an_opener_followed_by_a_question_of_its_own_is_not_elliptical() {
        // A new question after "And": the previous subject's names are carried (none here),
        // the previous question's words are not.
        assert_eq!(
            carried(
                "When does the annual pay review take effect?",
                "And how large is the minimum liquidity buffer?"
            ),
            "And how large is the minimum liquidity buffer?"
        );
        assert_eq!(
            carried(
                "What margin was agreed on the loan to Brill Optics?",
                "And what was the tenor?"
            ),
            "And what was the tenor? Brill Optics"
        );
    }

    #[test]
    fn turns_resolve_in_order_and_answers_are_never_read() {
        let c = conv(&[
            "What margin was agreed on the loan to Brill Optics?",
            "The margin for Quasar Mining is 2% [1].",
            "And for Castle Tools?",
            "…",
            "What about Nettle Foods?",
        ]);
        assert_eq!(
            retrieval_query(&c, FollowUps::Carry),
            "What margin was agreed on the loan to Nettle Foods?"
        );
        assert_eq!(
            retrieval_query(&c, FollowUps::Concat),
            "And for Castle Tools? What about Nettle Foods?"
        );
        assert_eq!(
            retrieval_query(&c, FollowUps::Last),
            "What about Nettle Foods?"
        );
    }
}
