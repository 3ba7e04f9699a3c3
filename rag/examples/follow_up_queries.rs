//! Prints the retrieval query each follow-up strategy builds for the cases of a golden JSONL
//! file with `history` (e.g. bank-dev's `followups.jsonl`), to read them against the cases'
//! stand-alone wording:
//!
//! ```sh
//! cargo run -p airlock-rag --example follow_up_queries -- ../shared/datasets/bank-dev/followups.jsonl
//! ```

use airlock_rag::{FollowUps, Role, query::retrieval_query};

fn main() -> Result<(), Box<dyn std::error::Error>> {
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
        }
    }
    Ok(())
}
