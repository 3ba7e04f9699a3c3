//! Random sequences of upsert / delete / search / reopen / reindex against a brute-force model:
//! no dead or disallowed chunk is ever returned, and BM25 results are exactly the model's visible
//! matches (all of them when k is large, a consistent prefix when k is small); vector and hybrid
//! searches return exactly min(k, visible) current chunks.

use std::collections::{BTreeMap, BTreeSet};

use airlock_retrieval::{DocumentInput, SearchMode, SearchRequest};
use proptest::prelude::*;

use crate::common::{Env, allow, test_config};

/// Words that neither stem into each other nor are stop words.
const VOCAB: [&str; 8] = [
    "apple", "banana", "cherry", "delta", "falcon", "guitar", "harbor", "jungle",
];
const DOCS: usize = 10;

#[derive(Debug, Clone)]
enum Op {
    Upsert {
        doc: usize,
        words: Vec<usize>,
    },
    Delete {
        doc: usize,
    },
    Search {
        words: Vec<usize>,
        allowed: u16,
        k: usize,
    },
    Reopen,
    Reindex,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        5 => (0..DOCS, prop::collection::vec(0..VOCAB.len(), 1..6)).prop_map(|(doc, words)| Op::Upsert { doc, words }),
        2 => (0..DOCS).prop_map(|doc| Op::Delete { doc }),
        5 => (prop::collection::vec(0..VOCAB.len(), 1..3), any::<u16>(), 1..6usize)
            .prop_map(|(words, allowed, k)| Op::Search { words, allowed, k }),
        1 => Just(Op::Reopen),
        1 => Just(Op::Reindex),
    ]
}

fn text(words: &[usize]) -> String {
    words
        .iter()
        .map(|&w| VOCAB[w])
        .collect::<Vec<_>>()
        .join(" ")
}

fn req(q: &str, k: usize) -> SearchRequest<'_> {
    SearchRequest {
        query: q,
        k,
        mode: SearchMode::Bm25,
        rescore: false,
        rerank: false,
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    #[test]
    fn search_never_returns_dead_or_disallowed_chunks(ops in prop::collection::vec(op(), 1..40)) {
        let env = Env::new();
        let mut eng = env.open(test_config());
        // Model: live doc → its words; doc → ordinal (stable once assigned).
        let mut live: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
        let mut ordinal: BTreeMap<usize, u32> = BTreeMap::new();
        for op in ops {
            match op {
                Op::Upsert { doc, words } => {
                    let o = eng.upsert_one(DocumentInput::new(format!("doc{doc}"), "", text(&words))).unwrap();
                    if let Some(&prev) = ordinal.get(&doc) {
                        prop_assert_eq!(prev, o.ordinal);
                    }
                    ordinal.insert(doc, o.ordinal);
                    live.insert(doc, words);
                }
                Op::Delete { doc } => {
                    eng.delete(&format!("doc{doc}")).unwrap();
                    live.remove(&doc);
                }
                Op::Reopen => {
                    drop(eng);
                    eng = env.open(test_config());
                    prop_assert_eq!(eng.last_repair(), &Default::default());
                }
                Op::Reindex => {
                    eng.reindex().unwrap();
                }
                Op::Search { words, allowed, k } => {
                    let allowed_docs: BTreeSet<usize> = (0..DOCS).filter(|d| allowed & (1 << d) != 0).collect();
                    let set = allow(allowed_docs.iter().filter_map(|d| ordinal.get(d).copied()));
                    let q = text(&words);
                    let expected: BTreeSet<String> = live
                        .iter()
                        .filter(|(d, ws)| allowed_docs.contains(d) && ws.iter().any(|w| words.contains(w)))
                        .map(|(d, _)| format!("doc{d}"))
                        .collect();
                    let all = eng.search(&req(&q, 100), &set).unwrap();
                    let got: BTreeSet<String> = all.results.iter().map(|r| r.doc_id.clone()).collect();
                    prop_assert_eq!(&got, &expected);
                    prop_assert_eq!(all.results.len(), expected.len(), "one live chunk per document");
                    for r in &all.results {
                        let d: usize = r.doc_id[3..].parse().unwrap();
                        prop_assert_eq!(&r.text, &text(&live[&d]), "current version only");
                        prop_assert!(eng.is_visible(r.chunk_id, &set));
                    }
                    let top = eng.search(&req(&q, k), &set).unwrap();
                    prop_assert_eq!(top.results.len(), k.min(expected.len()));
                    let prefix: Vec<u32> = all.results.iter().take(k).map(|r| r.chunk_id).collect();
                    let top_ids: Vec<u32> = top.results.iter().map(|r| r.chunk_id).collect();
                    prop_assert_eq!(top_ids, prefix);
                    for w in all.results.windows(2) {
                        prop_assert!(w[0].score >= w[1].score);
                    }
                    // Hybrid (vector side returns k whenever k visible chunks exist): exactly
                    // min(k, visible live documents) results, all visible and current.
                    let visible = live.keys().filter(|d| allowed_docs.contains(d)).count();
                    let mut h = SearchRequest::new(&q, k);
                    for (mode, rescore) in [(SearchMode::Hybrid, true), (SearchMode::Vector, false)] {
                        h.mode = mode;
                        h.rescore = rescore;
                        let hr = eng.search(&h, &set).unwrap();
                        prop_assert_eq!(hr.results.len(), k.min(visible), "{:?}", mode);
                        for r in &hr.results {
                            let d: usize = r.doc_id[3..].parse().unwrap();
                            prop_assert!(allowed_docs.contains(&d) && live.contains_key(&d));
                            prop_assert_eq!(&r.text, &text(&live[&d]));
                        }
                    }
                }
            }
        }
    }
}
