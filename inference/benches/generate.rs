//! Generation throughput on the real GGUF models (a small bench binary, not criterion: each
//! number is a few seconds of work, repeated).
//!
//! ```text
//! RAYON_NUM_THREADS=2 cargo bench -p airlock-inference --bench generate
//! ```
//!
//! - prompt processing (pp): a 512-token prompt prefilled as one chunk, tokens/s;
//! - single-stream decode (tg): 128 greedy tokens after that prompt, tokens/s;
//! - aggregate decode through the [`Engine`]: N concurrent streams (N = 1, 2, 4, 8, 16), each a
//!   16-token prompt and up to 32 generated tokens; generated tokens/s over the whole run.
//!
//! Every rate is printed twice: per wall-clock second, and per "CPU-second / threads" (the
//! process's user+system time from `/proc/self/stat` divided by `RAYON_NUM_THREADS`), which is
//! what the rate would be on otherwise idle cores when the machine is shared with other work.
//!
//! `AIRLOCK_BENCH_MODELS` (default `smollm2,qwen`) picks the models under `AIRLOCK_MODELS_DIR`
//! (default `../models-cache/models`). Shorter runs (e.g. the large model on a busy machine):
//! `AIRLOCK_BENCH_PP` (prompt tokens, default 512), `AIRLOCK_BENCH_TG` (decode steps, default
//! 128), `AIRLOCK_BENCH_REPS` (timed runs after the warm-up, default 2) and
//! `AIRLOCK_BENCH_STREAMS` (comma-separated stream counts, default `1,2,4,8,16`; empty skips the
//! engine part).
//! - `AIRLOCK_BENCH_PREFIX=N` (0 < N < pp) also times the first token with the KV of the prompt's
//!   first N tokens cached, as the engine's shared system-prompt prefix does: the cached prefix
//!   is prefilled once, untimed; each timed run copies its KV cache and prefills the other
//!   pp − N tokens in one chunk (the copy is timed too).
//! - `AIRLOCK_BENCH_BATCHED=1,4,8` also times batched decode on the model directly, like the
//!   peer's `bench_llm_batched.py`: S sequences, each with its own 128-token prompt prefilled
//!   (untimed), then 128 greedy steps, each one forward of S tokens (one per sequence);
//!   aggregate decode tok/s = S × 128 / decode time, median of `AIRLOCK_BENCH_REPS` after a
//!   warm-up.
//! - chunked prefill that does not starve decoders: 4 streams decode 64 tokens each,
//!   undisturbed and then with a long prompt (`AIRLOCK_BENCH_INTRUDER`, default 450 tokens, the
//!   size of a RAG prompt) submitted once all four are decoding; the time per output token of
//!   the four streams, p50 and p99 over every gap between two of their tokens, and the p99
//!   ratio disturbed / undisturbed (goal ≤ 2×), without decode protection and with the daemon's
//!   `decode_stall_factor` 2.

use std::path::PathBuf;
use std::time::Instant;

use airlock_inference::generate::{
    DecoderModel, Engine, EngineConfig, Event, GenerateRequest, KERNEL_TIER_ENV, SamplingParams,
    SeqChunk, argmax, kernel_tier,
};

const STREAM_PROMPT: usize = 16;
const STREAM_TOKENS: usize = 32;
/// Decoding streams and their tokens in the chunked-prefill measurement.
const TPOT_STREAMS: usize = 4;
const TPOT_TOKENS: usize = 64;

fn models_dir() -> PathBuf {
    std::env::var_os("AIRLOCK_MODELS_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../models-cache/models"))
}

/// A `usize` knob from the environment, or its default.
fn knob(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Sizes of one bench run.
#[derive(Clone, Copy)]
struct Sizes {
    pp: usize,
    tg: usize,
    reps: usize,
}

/// Deterministic ordinary-text-like ids: a fixed pseudo-random walk over the first 20k ids.
fn prompt(len: usize, salt: u64) -> Vec<u32> {
    let mut x = 0x2545_F491_4F6C_DD1D_u64 ^ salt;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (100 + x % 20_000) as u32
        })
        .collect()
}

/// User + system CPU seconds of this process so far (Linux `/proc/self/stat`, 100 Hz ticks).
fn cpu_secs() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // Fields after the parenthesised command name; utime and stime are fields 14 and 15.
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    (ticks(11) + ticks(12)) / 100.0
}

fn threads() -> f64 {
    std::env::var("RAYON_NUM_THREADS")
        .ok()
        .and_then(|v| v.parse::<f64>().ok())
        .unwrap_or(2.0)
}

/// A wall-clock and a CPU-normalised rate for `n` items.
#[derive(Clone, Copy)]
struct Rate {
    wall: f64,
    cpu: f64,
}

impl Rate {
    fn measure(n: usize, f: impl FnOnce()) -> Self {
        let (t, c) = (Instant::now(), cpu_secs());
        f();
        let wall = t.elapsed().as_secs_f64();
        let cpu = (cpu_secs() - c).max(0.01) / threads();
        Self {
            wall: n as f64 / wall,
            cpu: n as f64 / cpu,
        }
    }
}

impl std::fmt::Display for Rate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{:7.1} tok/s wall, {:7.1} tok/s per CPU-time",
            self.wall, self.cpu
        )
    }
}

fn median_rate(v: Vec<Rate>) -> Rate {
    Rate {
        wall: median(v.iter().map(|r| r.wall).collect()),
        cpu: median(v.iter().map(|r| r.cpu).collect()),
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// (pp, tg) rates, medians of `reps` runs after one warm-up.
fn single_stream(model: &DecoderModel, sz: Sizes) -> (Rate, Rate) {
    let p = prompt(sz.pp, 1);
    let mut pp = Vec::new();
    let mut tg = Vec::new();
    for rep in 0..=sz.reps {
        let mut cache = model.new_cache();
        let mut logits = Vec::new();
        let pp_rate = Rate::measure(sz.pp, || {
            let mut c = [SeqChunk {
                tokens: &p,
                cache: &mut cache,
                want_logits: true,
            }];
            logits = model
                .forward(&mut c)
                .expect("prefill")
                .remove(0)
                .expect("logits");
        });
        let mut next = argmax(&logits);
        let tg_rate = Rate::measure(sz.tg, || {
            for _ in 0..sz.tg {
                let mut c = [SeqChunk {
                    tokens: &[next],
                    cache: &mut cache,
                    want_logits: true,
                }];
                let l = model
                    .forward(&mut c)
                    .expect("decode")
                    .remove(0)
                    .expect("logits");
                next = argmax(&l);
            }
        });
        if rep > 0 {
            pp.push(pp_rate);
            tg.push(tg_rate);
        }
    }
    (median_rate(pp), median_rate(tg))
}

/// Time to first token (ms, wall and per CPU-time; medians of `reps` after one warm-up) of a
/// `pp`-token prompt whose first `prefix` tokens' KV is cached: copy that cache, prefill the rest.
fn ttft_with_prefix(model: &DecoderModel, pp: usize, prefix: usize, reps: usize) -> (f64, f64) {
    let p = prompt(pp, 1);
    let mut cached = model.new_cache();
    let mut c = [SeqChunk {
        tokens: &p[..prefix],
        cache: &mut cached,
        want_logits: false,
    }];
    model.forward(&mut c).expect("prefix prefill");
    let (mut wall, mut cpu) = (Vec::new(), Vec::new());
    for rep in 0..=reps {
        let (t, c0) = (Instant::now(), cpu_secs());
        let mut cache = cached.clone();
        let mut c = [SeqChunk {
            tokens: &p[prefix..],
            cache: &mut cache,
            want_logits: true,
        }];
        let logits = model
            .forward(&mut c)
            .expect("prefill")
            .remove(0)
            .expect("logits");
        std::hint::black_box(argmax(&logits));
        if rep > 0 {
            wall.push(t.elapsed().as_secs_f64() * 1e3);
            cpu.push((cpu_secs() - c0) / threads() * 1e3);
        }
    }
    (median(wall), median(cpu))
}

/// Aggregate decode rate of `s` sequences stepped together (see the module docs).
fn batched_decode(model: &DecoderModel, s: usize, reps: usize) -> Rate {
    const PL: usize = 128;
    const TG: usize = 128;
    let prompts: Vec<Vec<u32>> = (0..s).map(|i| prompt(PL, 500 + i as u64)).collect();
    let mut rates = Vec::new();
    for rep in 0..=reps {
        let mut caches: Vec<_> = (0..s).map(|_| model.new_cache()).collect();
        let mut chunks: Vec<SeqChunk> = caches
            .iter_mut()
            .zip(&prompts)
            .map(|(cache, p)| SeqChunk {
                tokens: p,
                cache,
                want_logits: true,
            })
            .collect();
        let mut next: Vec<u32> = model
            .forward(&mut chunks)
            .expect("prefill")
            .into_iter()
            .map(|l| argmax(&l.expect("logits")))
            .collect();
        drop(chunks);
        let rate = Rate::measure(s * TG, || {
            for _ in 0..TG {
                let toks: Vec<[u32; 1]> = next.iter().map(|&t| [t]).collect();
                let mut chunks: Vec<SeqChunk> = caches
                    .iter_mut()
                    .zip(&toks)
                    .map(|(cache, t)| SeqChunk {
                        tokens: t,
                        cache,
                        want_logits: true,
                    })
                    .collect();
                next = model
                    .forward(&mut chunks)
                    .expect("decode")
                    .into_iter()
                    .map(|l| argmax(&l.expect("logits")))
                    .collect();
            }
        });
        if rep > 0 {
            rates.push(rate);
        }
    }
    median_rate(rates)
}

/// Aggregate generated tokens/s with `n` concurrent streams through the engine.
fn aggregate(engine: &Engine, n: usize) -> Rate {
    let (t0, c0) = (Instant::now(), cpu_secs());
    let streams: Vec<_> = (0..n)
        .map(|i| {
            engine
                .submit(GenerateRequest {
                    prompt: prompt(STREAM_PROMPT, 100 + i as u64),
                    // Sampling with a seed so streams do not end early on a stop token too often;
                    // each stream still stops at max_tokens at the latest.
                    params: SamplingParams {
                        temperature: 0.8,
                        top_p: 0.95,
                        seed: Some(i as u64),
                        ..SamplingParams::greedy(STREAM_TOKENS)
                    },
                })
                .expect("submit")
        })
        .collect();
    let mut tokens = 0usize;
    for mut s in streams {
        while let Some(ev) = s.blocking_recv() {
            if let Event::Token { .. } = ev {
                tokens += 1;
            }
        }
    }
    Rate {
        wall: tokens as f64 / t0.elapsed().as_secs_f64(),
        cpu: tokens as f64 / ((cpu_secs() - c0).max(0.01) / threads()),
    }
}

/// Time per output token (ms) of [`TPOT_STREAMS`] decoding streams, p50 and p99 over every gap
/// between two consecutive tokens of a stream, while a prompt of `intruder` tokens (if any) is
/// submitted once every stream has its first token.
fn tpot(engine: &Engine, intruder: Option<usize>, salt: u64) -> (f64, f64) {
    let started = std::sync::Arc::new(std::sync::Barrier::new(TPOT_STREAMS + 1));
    let readers: Vec<_> = (0..TPOT_STREAMS)
        .map(|i| {
            let mut s = engine
                .submit(GenerateRequest {
                    prompt: prompt(STREAM_PROMPT, salt + i as u64),
                    params: SamplingParams {
                        temperature: 0.8,
                        top_p: 0.95,
                        seed: Some(salt + i as u64),
                        ..SamplingParams::greedy(TPOT_TOKENS)
                    },
                })
                .expect("submit");
            let started = started.clone();
            std::thread::spawn(move || {
                let mut at = Vec::new();
                while let Some(ev) = s.blocking_recv() {
                    if let Event::Token { .. } = ev {
                        at.push(Instant::now());
                        if at.len() == 1 {
                            started.wait();
                        }
                    }
                }
                if at.is_empty() {
                    started.wait();
                }
                at
            })
        })
        .collect();
    started.wait();
    let long = intruder.map(|n| {
        engine
            .submit(GenerateRequest {
                prompt: prompt(n, salt + 999),
                params: SamplingParams::greedy(1),
            })
            .expect("submit the long prompt")
    });
    let mut gaps: Vec<f64> = Vec::new();
    for r in readers {
        let at = r.join().expect("reader");
        gaps.extend(at.windows(2).map(|w| (w[1] - w[0]).as_secs_f64() * 1e3));
    }
    if let Some(mut s) = long {
        while s.blocking_recv().is_some() {}
    }
    gaps.sort_by(f64::total_cmp);
    let q = |p: f64| gaps[((gaps.len() as f64 * p) as usize).min(gaps.len() - 1)];
    (q(0.5), q(0.99))
}

fn main() {
    // `cargo bench` passes `--bench`; nothing to parse.
    let which = std::env::var("AIRLOCK_BENCH_MODELS").unwrap_or_else(|_| "smollm2,qwen".into());
    let threads = std::env::var("RAYON_NUM_THREADS").unwrap_or_else(|_| "(unset)".into());
    let sz = Sizes {
        pp: knob("AIRLOCK_BENCH_PP", 512).max(1),
        tg: knob("AIRLOCK_BENCH_TG", 128),
        reps: knob("AIRLOCK_BENCH_REPS", 2).max(1),
    };
    let streams: Vec<usize> = std::env::var("AIRLOCK_BENCH_STREAMS")
        .unwrap_or_else(|_| "1,2,4,8,16".into())
        .split(',')
        .filter_map(|v| v.trim().parse().ok())
        .filter(|&n| n > 0)
        .collect();
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    println!("{}", airlock_inference::cpu_line());
    println!(
        "quantized kernel tier: {} ({KERNEL_TIER_ENV}={})",
        kernel_tier().unwrap_or_else(|e| panic!("{e}")),
        std::env::var(KERNEL_TIER_ENV).unwrap_or_else(|_| "(unset)".into())
    );
    println!(
        "RAYON_NUM_THREADS={threads}; pp {} tokens, tg {} steps, {} timed runs; load average \
         before: {}",
        sz.pp,
        sz.tg,
        sz.reps,
        load.trim()
    );
    for name in which.split(',').filter(|s| !s.is_empty()) {
        let path = models_dir().join(name).join("model.gguf");
        let t = Instant::now();
        let model = DecoderModel::load(&path).expect("model loads");
        println!(
            "\n## {name} ({}), loaded in {:.2}s",
            path.display(),
            t.elapsed().as_secs_f64()
        );
        let (pp, tg) = single_stream(&model, sz);
        println!("pp{}:                 {pp}", sz.pp);
        println!(
            "time to first token ({} prompt tokens, one prefill chunk): {:.0} ms wall, {:.0} ms \
             per CPU-time",
            sz.pp,
            sz.pp as f64 / pp.wall * 1e3,
            sz.pp as f64 / pp.cpu * 1e3
        );
        let prefix = knob("AIRLOCK_BENCH_PREFIX", 0);
        if prefix > 0 && prefix < sz.pp {
            let (wall, cpu) = ttft_with_prefix(&model, sz.pp, prefix, sz.reps);
            println!(
                "time to first token ({} prompt tokens, the first {prefix} cached): {wall:.0} ms \
                 wall, {cpu:.0} ms per CPU-time",
                sz.pp
            );
        }
        println!("tg{} (after {}):     {tg}", sz.tg, sz.pp);
        let batched: Vec<usize> = std::env::var("AIRLOCK_BENCH_BATCHED")
            .unwrap_or_default()
            .split(',')
            .filter_map(|v| v.trim().parse().ok())
            .filter(|&n| n > 0)
            .collect();
        let mut base = None;
        for &n in &batched {
            let rate = batched_decode(&model, n, sz.reps);
            let b = *base.get_or_insert(rate);
            println!(
                "batched decode, {n} sequences x 128 steps after 128-token prompts: {rate}  \
                 ({:.2}x / {:.2}x the first)",
                rate.wall / b.wall,
                rate.cpu / b.cpu
            );
        }
        if streams.is_empty() {
            continue;
        }
        let engine = Engine::start(
            model,
            None,
            EngineConfig {
                max_batch: 16,
                ..EngineConfig::default()
            },
        )
        .expect("engine");
        aggregate(&engine, 2); // warm-up
        let mut base = None;
        for &n in &streams {
            let rate = aggregate(&engine, n);
            let b = *base.get_or_insert(rate);
            println!(
                "streams {n:2}: {rate}  ({:.2}x / {:.2}x single)",
                rate.wall / b.wall,
                rate.cpu / b.cpu
            );
        }
        let intruder = knob("AIRLOCK_BENCH_INTRUDER", 450);
        let report = |engine: &Engine, label: &str| {
            let (mut calm, mut hit) = (Vec::new(), Vec::new());
            for rep in 0..sz.reps as u64 {
                calm.push(tpot(engine, None, 1000 + rep * 10));
                hit.push(tpot(engine, Some(intruder), 2000 + rep * 10));
            }
            let (c50, c99) = (
                median(calm.iter().map(|t| t.0).collect()),
                median(calm.iter().map(|t| t.1).collect()),
            );
            let (h50, h99) = (
                median(hit.iter().map(|t| t.0).collect()),
                median(hit.iter().map(|t| t.1).collect()),
            );
            println!(
                "decode TPOT, {TPOT_STREAMS} streams, {label}: undisturbed p50 {c50:.1} ms p99 \
                 {c99:.1} ms; with a {intruder}-token prompt arriving: p50 {h50:.1} ms p99 \
                 {h99:.1} ms; p99 ratio {:.2}x (goal <= 2x)",
                h99 / c99
            );
        };
        report(
            &engine,
            &format!(
                "prefill chunk {} (no decode protection)",
                EngineConfig::default().prefill_chunk
            ),
        );
        let guarded = Engine::start(
            DecoderModel::load(&path).expect("model loads"),
            None,
            EngineConfig {
                max_batch: 16,
                decode_stall_factor: Some(2.0),
                ..EngineConfig::default()
            },
        )
        .expect("engine");
        aggregate(&guarded, 2); // warm-up: the step-time model learns
        report(&guarded, "decode_stall_factor 2 (the daemon's default)");
        drop(guarded);
        let m = engine.metrics();
        println!(
            "engine: {} steps, {} tokens, {} preemptions",
            m.steps, m.tokens_generated, m.preemptions
        );
        let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
        println!("load average after: {}", load.trim());
    }
}
