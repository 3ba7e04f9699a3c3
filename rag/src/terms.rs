//! Terms of art: the words of a question that name one particular thing (a tool, a setting, a
//! product, a file), and whether the documents the caller may read know them at all.
//!
//! A question about `autossh`, `run0`, `DefaultMemoryPressureThresholdSec` or Tailscale that no
//! readable document mentions cannot be answered from them, however close the retrieved pages'
//! topic (an SSH tunnel, a sudo replacement, a memory setting, an exit node): a small model
//! then answers from the nearby page, or from what it knows, and a wrong answer reads as fact.
//! The check is over the caller's whole readable corpus (the BM25 index's terms in chunks the
//! caller may read), not over the few retrieved chunks, so a term retrieval merely ranked low
//! does not silence an answerable question; and a term only unreadable documents hold counts
//! as unknown, exactly as if those documents did not exist.
//!
//! Which words count, decided by their form alone (no list of products or tools):
//! - a capitalised word inside a clause ([`crate::cite::names`]: vendors, products, people);
//! - an identifier: letters with digits (`run0`, `TPM2`), an inner capital after a lower-case
//!   letter (`OnCalendar`, `PageUp`), an underscore, or a dot or slash inside (`modprobe.d`,
//!   `node_exporter`, `/etc/fstab`);
//! - a lower-case word the embedder's own vocabulary cuts into [`RARE_PIECES`] or more pieces
//!   (`autossh`, `portablectl`, `flatpak`): far from general English, a name of something.
//!
//! A token starting with a digit is a value (`500M`, `3.11`), not a name, and is not checked. A
//! word is known when the readable corpus holds every alphanumeric piece of it, each as the
//! index analyses it (lower case, English stemming), or its plural `s` dropped (`RPMs`), or its
//! British spelling written the American way (`optimisation`, `colour`).

use std::collections::HashSet;

/// A lower-case word the embedder cuts into this many pieces or more is a term of art.
pub const RARE_PIECES: usize = 3;

/// The shortest piece of a rare word (shorter pieces are abbreviations too common to judge).
const MIN_RARE_LETTERS: usize = 4;

/// The question's terms of art (module docs), each once, in question order. `pieces(word)` is
/// the number of tokens the embedder makes of `word` (`None` when it cannot tell: the word is
/// then judged by its form only).
pub fn terms_of_art(question: &str, pieces: impl Fn(&str) -> Option<usize>) -> Vec<String> {
    let names: HashSet<String> = crate::cite::names(question).into_iter().collect();
    let mut seen = HashSet::new();
    let mut out = Vec::new();
    for raw in question.split_whitespace() {
        let token = trim(raw);
        if token.is_empty() || token.starts_with(|c: char| c.is_ascii_digit()) {
            continue;
        }
        let term = names.contains(token) || identifier(token) || rare(token, &pieces);
        if term && seen.insert(token.to_string()) {
            out.push(token.to_string());
        }
    }
    out
}

/// `raw` without surrounding punctuation and a possessive `'s`.
fn trim(raw: &str) -> &str {
    let t = raw.trim_matches(|c: char| !(c.is_alphanumeric() || c == '/' || c == '_'));
    let t = t
        .strip_suffix("'s")
        .or_else(|| t.strip_suffix("’s"))
        .unwrap_or(t);
    t.trim_end_matches(['.', '/'])
}

/// Letters with digits, an inner capital after a lower-case letter, an underscore, or a dot or
/// slash between characters.
fn identifier(token: &str) -> bool {
    let letters = token.chars().any(char::is_alphabetic);
    let digits = token.chars().any(|c| c.is_ascii_digit());
    let chars: Vec<char> = token.chars().collect();
    let inner_capital = chars
        .windows(2)
        .any(|w| w[0].is_lowercase() && w[1].is_uppercase());
    let inner = token.trim_matches(['.', '/']);
    (letters && digits) || inner_capital || token.contains('_') || inner.contains(['.', '/'])
}

/// A lower-case word (hyphens allowed) whose every piece has at least [`MIN_RARE_LETTERS`]
/// letters and is cut by the embedder into [`RARE_PIECES`] or more tokens.
fn rare(token: &str, pieces: &impl Fn(&str) -> Option<usize>) -> bool {
    if !token.chars().all(|c| c.is_lowercase() || c == '-') {
        return false;
    }
    let mut parts = token.split('-').filter(|p| !p.is_empty()).peekable();
    parts.peek().is_some()
        && parts.all(|p| {
            p.chars().count() >= MIN_RARE_LETTERS && pieces(p).is_some_and(|n| n >= RARE_PIECES)
        })
}

/// The alphanumeric pieces of `term` the corpus must hold (at least two characters each).
pub fn pieces_of(term: &str) -> Vec<String> {
    crate::cite::pieces(term)
        .into_iter()
        .filter(|p| p.chars().count() >= 2)
        .collect()
}

/// The ways a corpus may write `piece`: itself, without a plural `s`, and in American
/// spelling (`-ise`/`-isation`/`-yse` → `-ize`/`-ization`/`-yze`, `-our` → `-or`, `-tre` →
/// `-ter`).
pub fn spellings(piece: &str) -> Vec<String> {
    let mut out = vec![piece.to_string()];
    if piece.len() > 3
        && let Some(s) = piece.strip_suffix('s')
    {
        out.push(s.to_string());
    }
    let mut american = Vec::new();
    for w in &out {
        for (gb, us) in [
            ("isation", "ization"),
            ("ise", "ize"),
            ("ising", "izing"),
            ("ised", "ized"),
            ("iser", "izer"),
            ("yse", "yze"),
            ("our", "or"),
            ("tre", "ter"),
        ] {
            if let Some(stem) = w.strip_suffix(gb) {
                american.push(format!("{stem}{us}"));
            }
        }
    }
    out.extend(american);
    out.dedup();
    out
}

/// The terms of `terms` that are unknown: some piece of the term has no spelling `known`
/// accepts. `known(spelling)` is `None` for a word the corpus's analysis drops (a stop word,
/// counted as known).
pub fn unknown(terms: &[String], known: impl Fn(&str) -> Option<bool>) -> Vec<String> {
    terms
        .iter()
        .filter(|t| {
            pieces_of(t)
                .iter()
                .any(|p| !spellings(p).iter().any(|s| known(s) != Some(false)))
        })
        .cloned()
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A stand-in for the embedder's vocabulary: these words are cut into three pieces.
    fn pieces(w: &str) -> Option<usize> {
        Some(
            if ["autossh", "portablectl", "flatpak", "tolerable"].contains(&w) {
                3
            } else {
                1
            },
        )
    }

    #[test]
    fn terms_of_art_are_names_identifiers_and_rare_words() {
        let t = |q| terms_of_art(q, pieces);
        assert_eq!(t("How do I add a Tailscale exit node?"), ["Tailscale"]);
        assert_eq!(t("How do I use run0 instead of sudo?"), ["run0"]);
        assert_eq!(
            t("What is the default of DefaultMemoryPressureThresholdSec?"),
            ["DefaultMemoryPressureThresholdSec"]
        );
        assert_eq!(
            t("How do I set up an SSH tunnel with autossh?"),
            ["autossh"]
        );
        assert_eq!(
            t("How do I stop a kernel module loading via modprobe.d?"),
            ["modprobe.d"]
        );
        assert_eq!(t("Where does sshd_config live?"), ["sshd_config"]);
        assert_eq!(t("Is /etc/fstab read at boot?"), ["/etc/fstab"]);
        // Sentence openers, acronyms, ordinary words and values are not terms.
        assert!(t("Which signal is sent first when a unit is stopped?").is_empty());
        assert!(t("What port does NFS use?").is_empty());
        assert!(t("How do I shrink journal files below 500M?").is_empty());
        assert!(t("Which 3.11 API supervises a group of tasks?").is_empty());
        // Once each, possessive and punctuation removed.
        assert_eq!(t("Is Vault's key Vault, or (Vault)?"), ["Vault"]);
    }

    #[test]
    fn a_term_is_known_by_any_spelling_of_every_piece() {
        let corpus = ["rpm", "optimization", "color", "modprobe", "sshd", "config"];
        let known = |w: &str| {
            if w == "the" {
                None
            } else {
                Some(corpus.contains(&w))
            }
        };
        let terms: Vec<String> = [
            "RPMs",
            "optimisation",
            "colour",
            "modprobe.d",
            "sshd_config",
        ]
        .map(String::from)
        .to_vec();
        assert!(
            unknown(&terms, known).is_empty(),
            "{:?}",
            unknown(&terms, known)
        );
        let terms: Vec<String> = ["autossh", "sshd_keys", "the"].map(String::from).to_vec();
        assert_eq!(unknown(&terms, known), ["autossh", "sshd_keys"]);
    }
}
