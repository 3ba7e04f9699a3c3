//! Embedding throughput, query latency and reranker latency (bench binary).
//!
//! `RAYON_NUM_THREADS=2 cargo bench -p airlock-inference --bench embed_throughput`
//!
//! Throughput input is built like `../shared/peers/bench_embed_throughput.py`: bank-dev documents
//! (`title + "\n\n" + text`) cut with the model's own tokenizer into pieces of 254 word-pieces
//! (+[CLS]/[SEP] = 256), the first 2,000 pieces in corpus order; one warm-up batch, then 3 timed
//! passes over all 2,000 with batch 32; the median is reported, in wall time and in tokens per
//! process CPU-second (less sensitive to other load on a shared box). `AIRLOCK_EMBED_N` embeds
//! fewer pieces, `AIRLOCK_EMBED_BATCH` changes the texts per forward pass. Query latency: 150 Cranfield +
//! 150 bank golden queries, one call each, 3 passes, the median pass. Reranker latency: one
//! query with 50 Cranfield documents, per scorer (`AIRLOCK_RERANK_LLM=0` skips the LLM judge).

#[path = "util/mod.rs"]
mod util;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use airlock_inference::catalogue::GeneratorFiles;
use airlock_inference::rerank::{LlmRelevanceScorer, LlmScorerConfig};
use airlock_inference::{CrossEncoder, CrossEncoderConfig, CrossEncoderFiles, EmbeddingRescorer};
use candle_core::{Device, Tensor};

fn main() {
    let what = std::env::args().nth(1).filter(|a| !a.starts_with('-'));
    let run = |name: &str| what.as_deref().is_none_or(|w| w == name);
    println!("{}", airlock_inference::cpu_line());
    println!(
        "RAYON_NUM_THREADS={} load={} gemm f32 kernels: {}",
        util::threads(),
        util::load_avg(),
        airlock_inference::gemm_kernels()
    );
    let emb = Arc::new(util::embedder());
    if run("throughput") {
        throughput(&emb);
    }
    if run("query") {
        query_latency(&emb);
    }
    if run("rerank") {
        rerank_latency(&emb);
    }
}

fn throughput(emb: &airlock_inference::Embedder) {
    // `AIRLOCK_EMBED_N`: how many pieces to embed (default 2,000, the peer's count).
    let n: usize = std::env::var("AIRLOCK_EMBED_N")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2000);
    const PIECE: usize = 254;
    let mut chunks: Vec<String> = Vec::new();
    'docs: for d in util::read_jsonl("bank-dev/corpus.jsonl") {
        let text = format!(
            "{}\n\n{}",
            d["title"].as_str().unwrap(),
            d["text"].as_str().unwrap()
        );
        let spans = emb.token_spans(&text).unwrap();
        for seg in spans.chunks(PIECE) {
            chunks.push(text[seg[0].0..seg[seg.len() - 1].1].to_string());
            if chunks.len() >= n {
                break 'docs;
            }
        }
    }
    let refs: Vec<&str> = chunks.iter().map(String::as_str).collect();
    let ntok: usize = refs.iter().map(|c| emb.input_ids(c).unwrap().len()).sum();
    println!(
        "chunks={} tokens(incl. CLS/SEP, after 256 truncation)={ntok} mean={:.1}",
        refs.len(),
        ntok as f64 / refs.len() as f64
    );
    emb.embed(&refs[..32]).unwrap();
    let mut secs = Vec::new();
    let mut cpus = Vec::new();
    for r in 0..3 {
        let la = util::load_avg();
        let cpu0 = util::cpu_seconds();
        let t0 = Instant::now();
        let v = emb.embed(&refs).unwrap();
        let dt = t0.elapsed().as_secs_f64();
        let cpu = util::cpu_seconds() - cpu0;
        assert_eq!(v.len(), refs.len());
        println!(
            "{{\"run\": {r}, \"secs\": {dt:.2}, \"texts_per_s\": {:.1}, \"tokens_per_s\": {:.0}, \"cpu_secs\": {cpu:.1}, \"tokens_per_cpu_s\": {:.0}, \"loadavg_before\": \"{la}\"}}",
            refs.len() as f64 / dt,
            ntok as f64 / dt,
            ntok as f64 / cpu
        );
        secs.push(dt);
        cpus.push(cpu);
    }
    let med = util::median(secs);
    let med_cpu = util::median(cpus);
    println!(
        "THROUGHPUT median {med:.2} s: {:.1} texts/s, {:.0} tokens/s (peer sentence-transformers: 36.8 texts/s, 8,020 tokens/s) -> ratio {:.2}x",
        refs.len() as f64 / med,
        ntok as f64 / med,
        (refs.len() as f64 / med) / 36.8
    );
    // The peer's 54.28 s wall on 2 threads is at most 108.6 CPU-seconds: >= 4,010 tokens/CPU-s.
    println!(
        "THROUGHPUT per CPU-second: median {med_cpu:.1} CPU-s per pass, {:.0} tokens per CPU-s (peer >= 4,010) -> ratio <= {:.2}x",
        ntok as f64 / med_cpu,
        ntok as f64 / med_cpu / 4010.0
    );
}

fn query_latency(emb: &airlock_inference::Embedder) {
    let cran = util::cranfield();
    let mut qs: Vec<String> = cran.queries.clone();
    qs.extend(
        util::read_jsonl("bank-dev/golden.jsonl")
            .iter()
            .take(150)
            .map(|g| g["query"].as_str().unwrap().to_string()),
    );
    let ntok: usize = qs.iter().map(|q| emb.input_ids(q).unwrap().len()).sum();
    println!(
        "queries={} mean tokens={:.1}",
        qs.len(),
        ntok as f64 / qs.len() as f64
    );
    for q in qs.iter().take(10) {
        emb.embed(&[q.as_str()]).unwrap();
    }
    // Each pass: the per-query wall latencies and the process CPU-seconds of the whole pass.
    let mut passes: Vec<(Vec<f64>, f64)> = (0..3)
        .map(|_| {
            let cpu0 = util::cpu_seconds();
            let lat = qs
                .iter()
                .map(|q| {
                    let t0 = Instant::now();
                    emb.embed(&[q.as_str()]).unwrap();
                    t0.elapsed().as_secs_f64() * 1e3
                })
                .collect();
            (lat, util::cpu_seconds() - cpu0)
        })
        .collect();
    passes.sort_by(|a, b| mean(&a.0).partial_cmp(&mean(&b.0)).unwrap());
    let (mut lat, cpu) = passes[1].clone();
    lat.sort_by(|a, b| a.partial_cmp(b).unwrap());
    println!(
        "QUERY latency (batch 1): mean {:.2} ms, p50 {:.2}, p95 {:.2}, {:.2} CPU-ms per query (peer sentence-transformers 2 threads: mean 8.07, p50 7.91, p95 10.3) load={}",
        mean(&lat),
        util::percentile(&lat, 0.5),
        util::percentile(&lat, 0.95),
        cpu * 1e3 / qs.len() as f64,
        util::load_avg()
    );
}

fn mean(v: &[f64]) -> f64 {
    v.iter().sum::<f64>() / v.len() as f64
}

fn rerank_latency(emb: &Arc<airlock_inference::Embedder>) {
    let cran = util::cranfield();
    let query = cran.queries[0].as_str();
    let passages: Vec<&str> = cran.docs.iter().take(50).map(String::as_str).collect();
    let time = |name: &str, reps: usize, f: &mut dyn FnMut() -> Vec<f32>| {
        if reps > 1 {
            f();
        }
        let mut ts = Vec::new();
        let mut cpus = Vec::new();
        for _ in 0..reps {
            let cpu0 = util::cpu_seconds();
            let t0 = Instant::now();
            let s = f();
            ts.push(t0.elapsed().as_secs_f64() * 1e3);
            cpus.push((util::cpu_seconds() - cpu0) * 1e3);
            assert_eq!(s.len(), 50);
        }
        println!(
            "RERANK {name}: 50 pairs in {:.0} ms wall, {:.0} CPU-ms (medians of {reps}) load={}",
            util::median(ts),
            util::median(cpus),
            util::load_avg()
        );
    };

    // A MiniLM-L6-shaped cross-encoder (the shape of ms-marco-MiniLM-L-6-v2): the bundled
    // encoder weights plus a generated pooler/classifier head. Latency only; the scores mean
    // nothing.
    let dir = tempfile::tempdir().unwrap();
    let minilm = util::models_dir().join("minilm");
    let mut tensors: HashMap<String, Tensor> =
        candle_core::safetensors::load(minilm.join("model.safetensors"), &Device::Cpu).unwrap();
    tensors.insert(
        "pooler.dense.weight".into(),
        Tensor::randn(0f32, 0.05, (384, 384), &Device::Cpu).unwrap(),
    );
    tensors.insert(
        "pooler.dense.bias".into(),
        Tensor::zeros(384, candle_core::DType::F32, &Device::Cpu).unwrap(),
    );
    tensors.insert(
        "classifier.weight".into(),
        Tensor::randn(0f32, 0.05, (1, 384), &Device::Cpu).unwrap(),
    );
    tensors.insert(
        "classifier.bias".into(),
        Tensor::zeros(1, candle_core::DType::F32, &Device::Cpu).unwrap(),
    );
    candle_core::safetensors::save(&tensors, dir.path().join("model.safetensors")).unwrap();
    std::fs::copy(minilm.join("config.json"), dir.path().join("config.json")).unwrap();
    std::fs::copy(
        minilm.join("tokenizer.json"),
        dir.path().join("tokenizer.json"),
    )
    .unwrap();
    let ce = CrossEncoder::load(
        &CrossEncoderFiles::in_dir(dir.path()),
        CrossEncoderConfig {
            name: "minilm-l6-ce".into(),
            max_tokens: 512,
            batch_size: 16,
        },
    )
    .unwrap();
    let lens: Vec<usize> = passages
        .iter()
        .map(|p| emb.input_ids(p).unwrap().len())
        .collect();
    println!(
        "passage tokens (embedder, 256 cap): mean {:.0}, query tokens {}",
        lens.iter().sum::<usize>() as f64 / 50.0,
        emb.input_ids(query).unwrap().len()
    );
    time(
        "cross-encoder MiniLM-L6 shape, max 512 tokens/pair",
        3,
        &mut || ce.score(query, &passages).unwrap(),
    );

    let rescorer = EmbeddingRescorer::new(Arc::clone(emb));
    time("embedding rescorer (re-embeds 50 passages)", 3, &mut || {
        rescorer.score(query, &passages).unwrap()
    });

    // `AIRLOCK_RERANK_LLM=0` skips the LLM judge (minutes per call on a loaded box).
    if std::env::var("AIRLOCK_RERANK_LLM").is_ok_and(|v| v == "0") {
        return;
    }
    let smol = util::models_dir().join("smollm2");
    let staged = tempfile::tempdir().unwrap();
    airlock_inference::tokenizer::gguf::write_artifacts(&smol.join("model.gguf"), staged.path())
        .unwrap();
    let llm = LlmRelevanceScorer::load(
        &GeneratorFiles {
            gguf: smol.join("model.gguf"),
            tokenizer: staged.path().join("tokenizer.json"),
            chat_template: staged.path().join("chat_template.jinja"),
        },
        LlmScorerConfig::default(),
    )
    .unwrap();
    time(
        "LLM yes/no SmolLM2-135M, passages cut to 192 tokens",
        1,
        &mut || llm.score(query, &passages).unwrap(),
    );
}
