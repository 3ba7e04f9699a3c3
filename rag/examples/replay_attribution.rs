//! Replays recorded answers through citation attribution ([`airlock_rag::cite::cited`]), to see
//! what a change to the support rules does to answers a model already gave, without running
//! the model again. Input: JSON lines `{"id", "question", "answer", "sources": ["…", …]}` (the
//! prompt's source texts, or the listed documents' texts as an approximation); output: one line
//! per case, `id<TAB>how<TAB>cited source numbers`.
//!
//! ```sh
//! cargo run -p airlock-rag --example replay_attribution -- answers.jsonl
//! ```

use std::io::BufRead;

fn main() {
    let path = std::env::args()
        .nth(1)
        .expect("usage: replay_attribution ANSWERS.jsonl");
    let file = std::fs::File::open(&path).expect("open the answers file");
    for line in std::io::BufReader::new(file).lines() {
        let line = line.expect("read a line");
        if line.trim().is_empty() {
            continue;
        }
        let case: serde_json::Value = serde_json::from_str(&line).expect("a JSON object per line");
        let text = |k: &str| case[k].as_str().unwrap_or_default().to_string();
        let sources: Vec<String> = case["sources"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|s| s.as_str().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default();
        let refs: Vec<&str> = sources.iter().map(String::as_str).collect();
        let c = airlock_rag::cite::cited(&text("answer"), &text("question"), &refs);
        println!("{}\t{:?}\t{:?}", text("id"), c.by, c.sources);
    }
}
