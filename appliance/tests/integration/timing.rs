//! F2's residual channel over HTTP: the wall-clock time of `POST /v1/retrieve` for a word that
//! occurs only in documents the caller cannot read vs an absent word. The retrieval of a
//! non-admin ends on a multiple of `retrieval_time_quantum_ms`, so the attacker's best
//! threshold on the time (trained on half of 100 queries, tested on the other half) does about
//! as well as a coin. Printed with the same probe with the quantum off, for comparison.

use std::time::Instant;

use airlock::Config;
use airlock_retrieval::DocumentInput;
use axum::http::Method;
use serde_json::json;

use crate::support::{TestApp, test_config};

/// Accuracy of the best threshold on `train` (either direction), applied to `test`.
fn threshold_accuracy(train: &[(f64, bool)], test: &[(f64, bool)]) -> f64 {
    let mut best = (0.0, 0.0, true);
    for &(t, _) in train {
        for above in [true, false] {
            let acc = train
                .iter()
                .filter(|(x, label)| ((*x > t) == above) == *label)
                .count() as f64
                / train.len() as f64;
            if acc > best.0 {
                best = (acc, t, above);
            }
        }
    }
    let (_, t, above) = best;
    test.iter()
        .filter(|(x, label)| ((*x > t) == above) == *label)
        .count() as f64
        / test.len() as f64
}

async fn probe(quantum_ms: u64) -> f64 {
    let t = TestApp::with_config(Config {
        retrieval_time_quantum_ms: Some(quantum_ms),
        ..test_config()
    });
    let eve = t.user("eve", &["staff"]);
    let services = t.state.services().unwrap();
    // Eve's own document, and 300 she cannot read, each with the word `zorblax`.
    let r = t
        .call(
            Method::PUT,
            "/v1/documents/eve-own",
            Some(&t.admin),
            Some(
                json!({"title": "Canteen", "text": "The canteen opens at noon.",
                        "acl": {"users": [], "groups": ["staff"]}}),
            ),
        )
        .await;
    assert_eq!(r.status, 201, "{}", r.text);
    let forbidden: Vec<DocumentInput> = (0..300)
        .map(|i| {
            DocumentInput::new(
                format!("secret-{i}"),
                "Board",
                format!("zorblax zorblax zorblax merger note {i} zorblax"),
            )
        })
        .collect();
    let report = services.retrieval.upsert(forbidden, &mut |_| {}).unwrap();
    assert!(report.errors.is_empty());
    // 100 queries: half the forbidden-only word, half absent words, interleaved.
    let mut samples = Vec::new();
    for i in 0..100 {
        let forbidden_word = i % 2 == 0;
        let query = if forbidden_word {
            "zorblax".to_string()
        } else {
            format!("quintrel{i}")
        };
        let t0 = Instant::now();
        let r = t
            .call(
                Method::POST,
                "/v1/retrieve",
                Some(&eve),
                Some(json!({"query": query, "mode": "bm25", "top_k": 5})),
            )
            .await;
        let ms = t0.elapsed().as_secs_f64() * 1e3;
        assert_eq!(r.status, 200, "{}", r.text);
        assert_eq!(r.json["results"], json!([]), "{}", r.text);
        assert!(r.json.get("timings_ms").is_none(), "{}", r.text);
        samples.push((ms, forbidden_word));
    }
    let (train, test) = samples.split_at(50);
    threshold_accuracy(train, test)
}

#[tokio::test]
async fn retrieval_time_does_not_tell_forbidden_words_from_absent_ones() {
    let off = probe(0).await;
    let on = probe(25).await;
    eprintln!(
        "timing probe, 100 queries, BM25 mode over HTTP: accuracy {off:.2} with the quantum off, \
         {on:.2} with 25 ms"
    );
    // 50 test queries: a coin exceeds 0.70 with probability < 0.3%.
    assert!(
        on <= 0.70,
        "timing probe accuracy {on:.2} with the 25 ms quantum"
    );
}
