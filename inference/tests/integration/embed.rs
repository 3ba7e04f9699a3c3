//! Embedder parity with sentence-transformers (`minilm-reference.jsonl`).

use std::sync::{Arc, OnceLock};

use airlock_inference::{EmbedWorker, Embedder, EmbedderConfig, EmbedderFiles};

use crate::common::{cosine, models_dir, read_jsonl};

fn embedder() -> &'static Arc<Embedder> {
    static E: OnceLock<Arc<Embedder>> = OnceLock::new();
    E.get_or_init(|| {
        let files = EmbedderFiles::in_dir(&models_dir().join("minilm"));
        Arc::new(Embedder::load(&files, EmbedderConfig::default()).expect("MiniLM loads"))
    })
}

struct Line {
    text: String,
    input_ids: Vec<u32>,
    embedding: Vec<f32>,
}

fn reference() -> Vec<Line> {
    read_jsonl("minilm-reference.jsonl")
        .into_iter()
        .map(|v| Line {
            text: v["text"].as_str().unwrap().to_string(),
            input_ids: serde_json::from_value(v["input_ids"].clone()).unwrap(),
            embedding: serde_json::from_value(v["embedding"].clone()).unwrap(),
        })
        .collect()
}

#[test]
fn input_ids_match_sentence_transformers() {
    let e = embedder();
    let lines = reference();
    assert_eq!(lines.len(), 24);
    assert!(
        lines.iter().any(|l| l.input_ids.len() == 256),
        "fixture has a truncated line"
    );
    for l in &lines {
        assert_eq!(
            e.input_ids(&l.text).unwrap(),
            l.input_ids,
            "ids of {:?}",
            l.text
        );
    }
}

#[test]
fn embeddings_match_sentence_transformers_batched_and_single() {
    let e = embedder();
    let lines = reference();
    let texts: Vec<&str> = lines.iter().map(|l| l.text.as_str()).collect();
    let batched = e.embed(&texts).unwrap();
    let mut worst = 1.0f64;
    for (l, v) in lines.iter().zip(&batched) {
        assert_eq!(v.len(), 384);
        let c = cosine(v, &l.embedding);
        worst = worst.min(c);
        assert!(c >= 0.999, "cosine {c} for {:?}", l.text);
        let norm: f32 = v.iter().map(|x| x * x).sum::<f32>().sqrt();
        assert!((norm - 1.0).abs() < 1e-4);
    }
    eprintln!("worst cosine vs reference: {worst:.7}");
    assert!(
        worst >= 0.9999,
        "an f32 implementation should reach 0.9999, got {worst}"
    );
    // batch invariance: one at a time (no padding) gives the same vectors
    for (l, v) in lines.iter().zip(&batched).step_by(5) {
        let single = e.embed(&[l.text.as_str()]).unwrap();
        assert!(cosine(&single[0], v) > 0.99999, "{:?}", l.text);
    }
}

#[test]
fn known_pair_similarity() {
    let v = embedder()
        .embed(&["A man is eating food.", "A man is eating a piece of bread."])
        .unwrap();
    let c = cosine(&v[0], &v[1]);
    assert!((c - 0.7553).abs() < 1e-3, "cosine {c}");
}

#[test]
fn token_spans_are_byte_offsets_without_truncation() {
    let e = embedder();
    let text = "Café naïve Zürich — ".repeat(100);
    let spans = e.token_spans(&text).unwrap();
    assert!(
        spans.len() > 256,
        "spans are not truncated: {}",
        spans.len()
    );
    for &(s, t) in &spans {
        assert!(s < t && t <= text.len());
        assert!(text.is_char_boundary(s) && text.is_char_boundary(t));
    }
    assert_eq!(&text[spans[0].0..spans[0].1], "Café");
    assert!(spans.windows(2).all(|w| w[0].1 <= w[1].0));
}

#[test]
fn worker_answers_off_thread_and_reports_full_queue() {
    let worker = EmbedWorker::spawn(Arc::clone(embedder()), 1).unwrap();
    let t1 = worker
        .submit(vec!["first".into(), "second text".into()])
        .unwrap();
    let direct = embedder().embed(&["first", "second text"]).unwrap();
    let got = t1.wait().unwrap();
    assert_eq!(got.len(), 2);
    assert!(cosine(&got[1], &direct[1]) > 0.99999);
    // Fill the queue faster than one thread can drain it: some submit must be refused.
    let long = "word ".repeat(250);
    let mut refused = 0;
    let mut tickets = Vec::new();
    for _ in 0..8 {
        match worker.submit(vec![long.clone(); 16]) {
            Ok(t) => tickets.push(t),
            Err(airlock_inference::Error::QueueFull(_)) => refused += 1,
            Err(e) => panic!("unexpected {e}"),
        }
    }
    assert!(refused > 0, "a queue of 1 accepted 8 heavy jobs at once");
    for t in tickets {
        assert_eq!(t.wait().unwrap().len(), 16);
    }
}
