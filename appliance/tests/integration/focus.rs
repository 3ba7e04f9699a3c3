//! Source focus's semantic judgement on real retrieved chunks with the real embedder.

use airlock_rag::focus::{self, Candidate};
use serde_json::Value;

use crate::support::embedder;

/// bank-dev's hb-0290 ("What's the daily cap on outbound wire payments for Tier 1 SME clients
/// booked in Warsaw?"): the six chunks retrieval returned (fixture). The relevant document
/// words it "outgoing payments sent by wire"; lexically a near-copy about another tier matches
/// the question's words best and focus alone keeps only that one. The sentences' cosines with
/// the question bring the relevant document back.
#[test]
fn the_semantic_judgement_keeps_the_document_that_says_it_in_other_words() {
    let fixture: Value = serde_json::from_str(
        &std::fs::read_to_string(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("tests/fixtures/focus-hb-0290.json"),
        )
        .unwrap(),
    )
    .unwrap();
    let question = fixture["question"].as_str().unwrap();
    let relevant = fixture["relevant_doc_ids"][0].as_str().unwrap();
    let cands: Vec<Candidate<'_>> = fixture["candidates"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| Candidate {
            doc_id: c["doc_id"].as_str().unwrap(),
            title: c["title"].as_str().unwrap(),
            text: c["text"].as_str().unwrap(),
        })
        .collect();
    let kept_docs = |keep: &[bool]| -> Vec<&str> {
        let mut v: Vec<&str> = cands
            .iter()
            .zip(keep)
            .filter(|(_, k)| **k)
            .map(|(c, _)| c.doc_id)
            .collect();
        v.dedup();
        v
    };

    let lexical = focus::keep(question, &cands, 0.9);
    assert!(
        !kept_docs(&lexical).contains(&relevant),
        "{:?}",
        kept_docs(&lexical)
    );

    let e = embedder();
    let (cosines, embedded) = focus::semantic_judgement(question, &cands, |t| e.embed(t))
        .unwrap()
        .expect("a judgement");
    assert_eq!(embedded, focus::sentence_units(&cands).len());
    let semantic = focus::keep_semantic(question, &cands, 0.9, &cosines);
    let kept = kept_docs(&semantic);
    assert!(kept.contains(&relevant), "{kept:?} {cosines:?}");
    // It still sets most near-copies aside.
    assert!(kept.len() <= 3, "{kept:?} {cosines:?}");
}

#[test]
fn too_many_sentences_fall_back_to_lexical_focus() {
    let text = "One sentence here. ".repeat(focus::MAX_SEMANTIC_SENTENCES + 1);
    let cands = [
        Candidate {
            doc_id: "a",
            title: "t",
            text: &text,
        },
        Candidate {
            doc_id: "b",
            title: "t",
            text: "Another one.",
        },
    ];
    let r = focus::semantic_judgement("q", &cands, |_| -> Result<Vec<Vec<f32>>, ()> {
        panic!("must not embed")
    });
    assert_eq!(r, Ok(None));
}
