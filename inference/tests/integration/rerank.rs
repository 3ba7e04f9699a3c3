//! The cross-encoder path on a tiny random-weight `BertForSequenceClassification` model written
//! by the test, checked against an independent plain-Rust forward pass.

use std::collections::HashMap;
use std::path::Path;

use airlock_inference::{CrossEncoder, CrossEncoderConfig, CrossEncoderFiles};
use candle_core::{Device, Tensor};

const H: usize = 16;
const HEADS: usize = 2;
const INTER: usize = 32;
const LAYERS: usize = 2;
const MAX_POS: usize = 64;
const WORDS: [&str; 12] = [
    "the", "cat", "sat", "on", "mat", "dog", "ran", "a", "fast", "slow", "##s", "wing",
];
const V: usize = 4 + WORDS.len();

/// Deterministic pseudo-random numbers in [-scale, scale].
struct Lcg(u64);
impl Lcg {
    fn vec(&mut self, n: usize, scale: f32) -> Vec<f32> {
        (0..n)
            .map(|_| {
                self.0 = self
                    .0
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                ((self.0 >> 33) as f32 / (1u64 << 31) as f32 * 2.0 - 1.0) * scale
            })
            .collect()
    }
}

type Weights = HashMap<String, (Vec<f32>, Vec<usize>)>;

fn random_weights(seed: u64) -> Weights {
    let mut r = Lcg(seed);
    let mut w: Weights = HashMap::new();
    let mut put = |name: String, shape: Vec<usize>, scale: f32, offset: f32| {
        let n = shape.iter().product();
        let v = r.vec(n, scale).into_iter().map(|x| x + offset).collect();
        w.insert(name, (v, shape));
    };
    let e = "bert.embeddings";
    put(format!("{e}.word_embeddings.weight"), vec![V, H], 1.0, 0.0);
    put(
        format!("{e}.position_embeddings.weight"),
        vec![MAX_POS, H],
        0.5,
        0.0,
    );
    put(
        format!("{e}.token_type_embeddings.weight"),
        vec![2, H],
        0.5,
        0.0,
    );
    put(format!("{e}.LayerNorm.weight"), vec![H], 0.2, 1.0);
    put(format!("{e}.LayerNorm.bias"), vec![H], 0.1, 0.0);
    for l in 0..LAYERS {
        let p = format!("bert.encoder.layer.{l}");
        for m in ["query", "key", "value"] {
            put(
                format!("{p}.attention.self.{m}.weight"),
                vec![H, H],
                0.5,
                0.0,
            );
            put(format!("{p}.attention.self.{m}.bias"), vec![H], 0.1, 0.0);
        }
        put(
            format!("{p}.attention.output.dense.weight"),
            vec![H, H],
            0.3,
            0.0,
        );
        put(
            format!("{p}.attention.output.dense.bias"),
            vec![H],
            0.1,
            0.0,
        );
        put(
            format!("{p}.attention.output.LayerNorm.weight"),
            vec![H],
            0.2,
            1.0,
        );
        put(
            format!("{p}.attention.output.LayerNorm.bias"),
            vec![H],
            0.1,
            0.0,
        );
        put(
            format!("{p}.intermediate.dense.weight"),
            vec![INTER, H],
            0.3,
            0.0,
        );
        put(
            format!("{p}.intermediate.dense.bias"),
            vec![INTER],
            0.1,
            0.0,
        );
        put(format!("{p}.output.dense.weight"), vec![H, INTER], 0.3, 0.0);
        put(format!("{p}.output.dense.bias"), vec![H], 0.1, 0.0);
        put(format!("{p}.output.LayerNorm.weight"), vec![H], 0.2, 1.0);
        put(format!("{p}.output.LayerNorm.bias"), vec![H], 0.1, 0.0);
    }
    put("bert.pooler.dense.weight".into(), vec![H, H], 0.5, 0.0);
    put("bert.pooler.dense.bias".into(), vec![H], 0.1, 0.0);
    put("classifier.weight".into(), vec![1, H], 1.0, 0.0);
    put("classifier.bias".into(), vec![1], 0.1, 0.0);
    w
}

fn write_model(dir: &Path, w: &Weights) {
    let tensors: HashMap<String, Tensor> = w
        .iter()
        .map(|(k, (v, s))| {
            (
                k.clone(),
                Tensor::from_vec(v.clone(), s.as_slice(), &Device::Cpu).unwrap(),
            )
        })
        .collect();
    candle_core::safetensors::save(&tensors, dir.join("model.safetensors")).unwrap();
    let config = serde_json::json!({
        "architectures": ["BertForSequenceClassification"], "model_type": "bert",
        "vocab_size": V, "hidden_size": H, "num_hidden_layers": LAYERS,
        "num_attention_heads": HEADS, "intermediate_size": INTER, "hidden_act": "gelu",
        "hidden_dropout_prob": 0.1, "attention_probs_dropout_prob": 0.1,
        "max_position_embeddings": MAX_POS, "type_vocab_size": 2, "initializer_range": 0.02,
        "layer_norm_eps": 1e-12, "pad_token_id": 0, "num_labels": 1,
        "id2label": {"0": "LABEL_0"}, "label2id": {"LABEL_0": 0},
    });
    std::fs::write(dir.join("config.json"), config.to_string()).unwrap();
    let mut vocab = serde_json::Map::new();
    for (i, t) in ["[PAD]", "[UNK]", "[CLS]", "[SEP]"]
        .iter()
        .chain(WORDS.iter())
        .enumerate()
    {
        vocab.insert(t.to_string(), serde_json::json!(i));
    }
    let special = |t: &str, id: usize| {
        serde_json::json!({"id": id, "content": t, "single_word": false,
        "lstrip": false, "rstrip": false, "normalized": false, "special": true})
    };
    let tok = serde_json::json!({
        "version": "1.0", "truncation": null, "padding": null,
        "added_tokens": [special("[PAD]", 0), special("[UNK]", 1), special("[CLS]", 2), special("[SEP]", 3)],
        "normalizer": {"type": "BertNormalizer", "clean_text": true, "handle_chinese_chars": true,
                        "strip_accents": null, "lowercase": true},
        "pre_tokenizer": {"type": "BertPreTokenizer"},
        "post_processor": {"type": "TemplateProcessing",
            "single": [{"SpecialToken": {"id": "[CLS]", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                       {"SpecialToken": {"id": "[SEP]", "type_id": 0}}],
            "pair": [{"SpecialToken": {"id": "[CLS]", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                     {"SpecialToken": {"id": "[SEP]", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}},
                     {"SpecialToken": {"id": "[SEP]", "type_id": 1}}],
            "special_tokens": {"[CLS]": {"id": "[CLS]", "ids": [2], "tokens": ["[CLS]"]},
                               "[SEP]": {"id": "[SEP]", "ids": [3], "tokens": ["[SEP]"]}}},
        "decoder": {"type": "WordPiece", "prefix": "##", "cleanup": true},
        "model": {"type": "WordPiece", "unk_token": "[UNK]", "continuing_subword_prefix": "##",
                  "max_input_chars_per_word": 100, "vocab": vocab},
    });
    std::fs::write(dir.join("tokenizer.json"), tok.to_string()).unwrap();
}

// ---- independent reference forward (plain f64 loops, no candle) ----

fn get<'a>(w: &'a Weights, name: &str) -> &'a [f32] {
    &w[name].0
}

/// y = W x + b with W stored [out, in] row-major.
fn linear(w: &Weights, name: &str, x: &[f64]) -> Vec<f64> {
    let (wt, shape) = &w[&format!("{name}.weight")];
    let b = get(w, &format!("{name}.bias"));
    (0..shape[0])
        .map(|o| {
            f64::from(b[o])
                + (0..shape[1])
                    .map(|i| f64::from(wt[o * shape[1] + i]) * x[i])
                    .sum::<f64>()
        })
        .collect()
}

fn layer_norm(w: &Weights, name: &str, x: &[f64]) -> Vec<f64> {
    let g = get(w, &format!("{name}.weight"));
    let b = get(w, &format!("{name}.bias"));
    let n = x.len() as f64;
    let mean = x.iter().sum::<f64>() / n;
    let var = x.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / n;
    x.iter()
        .enumerate()
        .map(|(i, v)| (v - mean) / (var + 1e-12).sqrt() * f64::from(g[i]) + f64::from(b[i]))
        .collect()
}

/// erf by its Maclaurin series (|x| small here) or the continued-fraction-free asymptotic
/// complement; accurate to ~1e-12 over the range the test reaches.
fn erf(x: f64) -> f64 {
    if x.abs() > 6.0 {
        return x.signum();
    }
    // series: erf(x) = 2/sqrt(pi) * sum_n (-1)^n x^(2n+1) / (n! (2n+1))
    let mut term = x;
    let mut sum = x;
    for n in 1..200 {
        term *= -x * x / n as f64;
        let add = term / (2 * n + 1) as f64;
        sum += add;
        if add.abs() < 1e-17 {
            break;
        }
    }
    sum * 2.0 / std::f64::consts::PI.sqrt()
}

fn reference_score(w: &Weights, ids: &[u32], types: &[u32]) -> f64 {
    let n = ids.len();
    let emb = |name: &str, row: usize| -> Vec<f64> {
        get(w, name)[row * H..(row + 1) * H]
            .iter()
            .map(|&v| f64::from(v))
            .collect()
    };
    let mut x: Vec<Vec<f64>> = (0..n)
        .map(|t| {
            let a = emb("bert.embeddings.word_embeddings.weight", ids[t] as usize);
            let b = emb("bert.embeddings.position_embeddings.weight", t);
            let c = emb(
                "bert.embeddings.token_type_embeddings.weight",
                types[t] as usize,
            );
            let s: Vec<f64> = (0..H).map(|i| a[i] + b[i] + c[i]).collect();
            layer_norm(w, "bert.embeddings.LayerNorm", &s)
        })
        .collect();
    let d = H / HEADS;
    for l in 0..LAYERS {
        let p = format!("bert.encoder.layer.{l}");
        let q: Vec<Vec<f64>> = x
            .iter()
            .map(|r| linear(w, &format!("{p}.attention.self.query"), r))
            .collect();
        let k: Vec<Vec<f64>> = x
            .iter()
            .map(|r| linear(w, &format!("{p}.attention.self.key"), r))
            .collect();
        let v: Vec<Vec<f64>> = x
            .iter()
            .map(|r| linear(w, &format!("{p}.attention.self.value"), r))
            .collect();
        let mut ctx = vec![vec![0f64; H]; n];
        for h in 0..HEADS {
            for i in 0..n {
                let scores: Vec<f64> = (0..n)
                    .map(|j| {
                        (0..d)
                            .map(|c| q[i][h * d + c] * k[j][h * d + c])
                            .sum::<f64>()
                            / (d as f64).sqrt()
                    })
                    .collect();
                let m = scores.iter().cloned().fold(f64::MIN, f64::max);
                let e: Vec<f64> = scores.iter().map(|s| (s - m).exp()).collect();
                let z: f64 = e.iter().sum();
                for j in 0..n {
                    for c in 0..d {
                        ctx[i][h * d + c] += e[j] / z * v[j][h * d + c];
                    }
                }
            }
        }
        x = (0..n)
            .map(|i| {
                let a = linear(w, &format!("{p}.attention.output.dense"), &ctx[i]);
                let s: Vec<f64> = (0..H).map(|c| a[c] + x[i][c]).collect();
                let y = layer_norm(w, &format!("{p}.attention.output.LayerNorm"), &s);
                let inter: Vec<f64> = linear(w, &format!("{p}.intermediate.dense"), &y)
                    .into_iter()
                    .map(|u| 0.5 * u * (1.0 + erf(u / std::f64::consts::SQRT_2)))
                    .collect();
                let o = linear(w, &format!("{p}.output.dense"), &inter);
                let s: Vec<f64> = (0..H).map(|c| o[c] + y[c]).collect();
                layer_norm(w, &format!("{p}.output.LayerNorm"), &s)
            })
            .collect();
    }
    let pooled: Vec<f64> = linear(w, "bert.pooler.dense", &x[0])
        .into_iter()
        .map(f64::tanh)
        .collect();
    linear(w, "classifier", &pooled)[0]
}

#[test]
fn erf_reference_is_accurate() {
    // known values
    assert!((erf(0.5) - 0.520_499_877_813_046_5).abs() < 1e-12);
    assert!((erf(-1.5) + 0.966_105_146_475_310_7).abs() < 1e-12);
}

#[test]
fn cross_encoder_matches_independent_forward() {
    let dir = tempfile::tempdir().unwrap();
    let w = random_weights(42);
    write_model(dir.path(), &w);
    let files = CrossEncoderFiles::in_dir(dir.path());
    let ce = CrossEncoder::load(
        &files,
        CrossEncoderConfig {
            name: "tiny".into(),
            max_tokens: 12,
            batch_size: 3,
        },
    )
    .unwrap();

    // tokenization of a pair: [CLS] A [SEP] B [SEP] with segment ids 0/1
    let tok = airlock_inference::tokenizer::load_with_limit(&files.tokenizer, 12).unwrap();
    let enc = tok.encode(("The cat", "a dog ran"), true).unwrap();
    assert_eq!(enc.get_ids(), &[2, 4, 5, 3, 11, 9, 10, 3]);
    assert_eq!(enc.get_type_ids(), &[0, 0, 0, 0, 1, 1, 1, 1]);

    let query = "the cat sat";
    let passages = [
        "on the mat",
        "a dog ran fast on the mat the cat sat on the mat", // truncated to 12 tokens
        "wing",
        "slow dogs",
        "the cat",
        "a fast cat ran on a slow dog",
        "mat",
    ];
    let got = ce.score(query, &passages).unwrap();
    assert_eq!(got.len(), passages.len());
    for (p, g) in passages.iter().zip(&got) {
        let e = tok.encode((query, *p), true).unwrap();
        assert!(e.get_ids().len() <= 12);
        let want = reference_score(&w, e.get_ids(), e.get_type_ids());
        assert!(
            (f64::from(*g) - want).abs() < 1e-4,
            "{p:?}: candle {g} vs reference {want}"
        );
    }
    // the scores really differ between passages (the comparison above is not vacuous)
    let spread =
        got.iter().cloned().fold(f32::MIN, f32::max) - got.iter().cloned().fold(f32::MAX, f32::min);
    assert!(spread > 0.05, "spread {spread}");
    // batch composition and order do not change a pair's score
    let alone = ce.score(query, &[passages[3]]).unwrap()[0];
    assert!((alone - got[3]).abs() < 1e-5);
    let reversed: Vec<&str> = passages.iter().rev().copied().collect();
    let rev = ce.score(query, &reversed).unwrap();
    for (a, b) in got.iter().zip(rev.iter().rev()) {
        assert!((a - b).abs() < 1e-5);
    }
}

#[test]
fn cross_encoder_refuses_wrong_layout() {
    let dir = tempfile::tempdir().unwrap();
    let mut w = random_weights(7);
    w.remove("classifier.weight");
    write_model(dir.path(), &w);
    let cfg = CrossEncoderConfig {
        name: "tiny".into(),
        max_tokens: 12,
        batch_size: 3,
    };
    let err = CrossEncoder::load(&CrossEncoderFiles::in_dir(dir.path()), cfg).unwrap_err();
    assert!(err.to_string().contains("classifier"), "{err}");
}

/// The LLM judge on the real Qwen2.5-0.5B (our decoder, batched passages): a passage that answers
/// the query scores above unrelated ones (SmolLM2-135M does not manage even this: it ranked the
/// Lisbon passage first), the order of the input does not change a passage's score
/// (each continues from its own copy of the query's KV cache), and nothing passed gives nothing.
#[test]
fn llm_judge_prefers_the_relevant_passage() {
    use airlock_inference::catalogue::GeneratorFiles;
    use airlock_inference::rerank::{LlmRelevanceScorer, LlmScorerConfig};

    let gguf = crate::common::models_dir().join("qwen/model.gguf");
    let staged = tempfile::tempdir().unwrap();
    airlock_inference::tokenizer::gguf::write_artifacts(&gguf, staged.path()).unwrap();
    let judge = LlmRelevanceScorer::load(
        &GeneratorFiles {
            gguf,
            tokenizer: staged.path().join("tokenizer.json"),
            chat_template: staged.path().join("chat_template.jinja"),
        },
        LlmScorerConfig::default(),
    )
    .unwrap();
    let query = "What is the boiling point of water at sea level?";
    let relevant = "At sea level, water boils at 100 degrees Celsius (212 degrees Fahrenheit).";
    let others = [
        "The 2019 annual report lists the bank's branches in Lisbon and Porto.",
        "Cats are small carnivorous mammals often kept as pets.",
    ];
    let s = judge
        .score(query, &[others[0], relevant, others[1]])
        .unwrap();
    assert_eq!(s.len(), 3);
    assert!(s[1] > s[0] && s[1] > s[2], "{s:?}");
    // Nine passages span two batched forwards; scores do not depend on the neighbours.
    let mut many = vec![others[0]; 8];
    many.push(relevant);
    let t = judge.score(query, &many).unwrap();
    assert_eq!(t.len(), 9);
    assert!(
        (t[8] - s[1]).abs() < 1e-3 * s[1].abs().max(1.0),
        "{t:?} vs {s:?}"
    );
    assert!(
        (t[0] - s[0]).abs() < 1e-3 * s[0].abs().max(1.0),
        "{t:?} vs {s:?}"
    );
    assert!(judge.score(query, &[]).unwrap().is_empty());
}
