//! Prints the retrieval query each follow-up strategy builds for the cases of a golden JSONL
//! file with `history` (e.g. bank-dev's `followups.jsonl`), to read them against the cases'
//! stand-alone wording:
//!
//! ```sh
//! cargo run -p airlock-rag --example follow_up_queries -- ../shared/datasets/bank-dev/followups.jsonl
//! ```

use airlock_rag::{FollowUps, Role, query::retrieval_query};

/// Key words of a stand-alone question: words after the first that are capitalised or hold a
/// digit (names, codes, years, grades), lower case.
fn key_words(text: &str) -> Vec<String> {
    let words: Vec<&str> = text
        .split(|c: char| !(c.is_alphanumeric() || c == '-' || c == '\''))
        .filter(|w| !w.is_empty())
        .collect();
    let mut out: Vec<String> = words
        .iter()
        .skip(1)
        .filter(|w| w.starts_with(char::is_uppercase) || w.chars().any(|c| c.is_ascii_digit()))
        .map(|w| w.trim_end_matches("'s").to_lowercase())
        .collect();
    out.sort();
    out.dedup();
    out
}

/// Share of `keys` that occur as words of `query`.
fn coverage(keys: &[String], query: &str) -> f64 {
    let have: Vec<String> = query
        .split(|c: char| !(c.is_alphanumeric() || c == '-' || c == '\''))
        .map(str::to_lowercase)
        .collect();
    if keys.is_empty() {
        return 1.0;
    }
    keys.iter().filter(|k| have.contains(k)).count() as f64 / keys.len() as f64
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let (mut n, mut last_sum, mut carry_sum, mut last_full, mut carry_full) = (0, 0.0, 0.0, 0, 0);
    let path = std::env::args()
        .nth(1)
        .ok_or("usage: follow_up_queries FILE.jsonl")?;
    for line in std::fs::read_to_string(path)?
        .lines()
        .filter(|l| !l.trim().is_empty())
    {
        let case: serde_json::Value = serde_json::from_str(line)?;
        let mut conv: Vec<(Role, String)> = Vec::new();
        for t in case["history"].as_array().into_iter().flatten() {
            let role = match t["role"].as_str() {
                Some("assistant") => Role::Assistant,
                _ => Role::User,
            };
            conv.push((role, t["content"].as_str().unwrap_or("").to_string()));
        }
        conv.push((Role::User, case["query"].as_str().unwrap_or("").to_string()));
        println!("{}", case["id"].as_str().unwrap_or("?"));
        println!("  asked:  {}", case["query"].as_str().unwrap_or(""));
        println!("  carry:  {}", retrieval_query(&conv, FollowUps::Carry));
        if let Some(note) = case["note"].as_str()
            && let Some((_, standalone)) = note.split_once("standalone: ")
        {
            println!("  wanted: {standalone}");
            let keys = key_words(standalone);
            let last = coverage(&keys, case["query"].as_str().unwrap_or(""));
            let carry = coverage(&keys, &retrieval_query(&conv, FollowUps::Carry));
            n += 1;
            last_sum += last;
            carry_sum += carry;
            last_full += usize::from(last == 1.0);
            carry_full += usize::from(carry == 1.0);
        }
    }
    if n > 0 {
        println!(
            "key words of the stand-alone wording found in the query, {n} cases: last message {:.3} \
             (all of them: {last_full}), carry {:.3} (all of them: {carry_full})",
            last_sum / n as f64,
            carry_sum / n as f64
        );
    }
    Ok(())
}
