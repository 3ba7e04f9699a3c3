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

/// Mean-pooled, L2-normalised vectors from candle-transformers' own `BertModel` on a padded
/// batch with an attention mask (the forward the embedder used before the padding-free one).
fn candle_reference(rows: &[Vec<u32>]) -> Vec<Vec<f32>> {
    use candle_core::{DType, Device, Tensor};
    use candle_transformers::models::bert::{BertModel, Config};
    let dir = models_dir().join("minilm");
    let config: Config =
        serde_json::from_str(&std::fs::read_to_string(dir.join("config.json")).unwrap()).unwrap();
    let bytes = std::fs::read(dir.join("model.safetensors")).unwrap();
    let vb =
        candle_nn::VarBuilder::from_buffered_safetensors(bytes, DType::F32, &Device::Cpu).unwrap();
    let model = BertModel::load(vb, &config).unwrap();
    let len = rows.iter().map(Vec::len).max().unwrap();
    let mut ids = Vec::new();
    let mut mask = Vec::new();
    for r in rows {
        ids.extend(
            r.iter()
                .copied()
                .chain(std::iter::repeat_n(0, len - r.len())),
        );
        mask.extend((0..len).map(|j| u32::from(j < r.len())));
    }
    let n = rows.len();
    let ids = Tensor::from_vec(ids, (n, len), &Device::Cpu).unwrap();
    let mask = Tensor::from_vec(mask, (n, len), &Device::Cpu).unwrap();
    let hidden = model
        .forward(&ids, &ids.zeros_like().unwrap(), Some(&mask))
        .unwrap();
    let hidden: Vec<Vec<Vec<f32>>> = hidden.to_vec3().unwrap();
    hidden
        .iter()
        .zip(rows)
        .map(|(h, r)| {
            let mut v = vec![0f32; h[0].len()];
            for tok in &h[..r.len()] {
                for (a, x) in v.iter_mut().zip(tok) {
                    *a += x;
                }
            }
            let norm = v.iter().map(|x| x * x).sum::<f32>().sqrt();
            v.iter().map(|x| x / norm).collect()
        })
        .collect()
}

#[test]
fn padding_free_forward_equals_candle_bert() {
    // Random word-piece ids between [CLS] and [SEP], lengths from 1 ([CLS] alone) to the
    // 256-token limit, in one packed batch and against candle's padded, masked batch.
    let mut seed = 0x5eed_u64;
    let mut next = |m: u64| {
        seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (seed >> 33) % m
    };
    let mut lens = vec![1usize, 2, 3, 256, 255, 17, 128];
    lens.extend((0..5).map(|_| 4 + next(250) as usize));
    let rows: Vec<Vec<u32>> = lens
        .iter()
        .map(|&n| {
            (0..n)
                .map(|j| match j {
                    0 => 101,
                    j if j == n - 1 => 102,
                    _ => 1000 + next(29_000) as u32,
                })
                .collect()
        })
        .collect();
    let e = embedder();
    let got = e.embed_ids(&rows).unwrap();
    let want = candle_reference(&rows);
    let mut worst = 0f32;
    for ((g, w), n) in got.iter().zip(&want).zip(&lens) {
        let d = g
            .iter()
            .zip(w)
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, f32::max);
        assert!(d < 1e-4, "length {n}: max abs difference {d}");
        worst = worst.max(d);
    }
    eprintln!("padding-free vs candle BertModel: max abs difference {worst:e}");
    // the same rows one at a time give the same vectors as the packed batch
    for (r, g) in rows.iter().zip(&got).step_by(3) {
        let single = e.embed_ids(std::slice::from_ref(r)).unwrap();
        let d = single[0]
            .iter()
            .zip(g)
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, f32::max);
        assert!(d < 1e-5, "length {}: batch vs single {d}", r.len());
    }
}
