//! The continuous-batching engine on the real SmolLM2 model: batching does not change greedy
//! output, cancellation frees work, typed refusals, chunked prefill keeps streams flowing,
//! preemption takes the newest sequence, interactive requests are admitted before batch ones
//! (with promotion of long-waiting batch requests and per-class queue limits).

use std::time::{Duration, Instant};

use airlock_inference::generate::{
    Engine, EngineConfig, Event, FinishReason, GenerateRequest, MIN_PREFILL_ROWS, Priority,
    SamplingParams, Stream, SubmitError, Usage,
};
use serde_json::Value;

use super::common::read_jsonl;
use super::generate::{compare, load};

/// Everything one stream received.
#[derive(Debug, Default)]
struct Collected {
    tokens: Vec<u32>,
    steps: Vec<u64>,
    preempted: bool,
    /// The step of the `Admitted` event.
    admitted: Option<u64>,
    reason: Option<FinishReason>,
    usage: Usage,
}

fn collect(mut s: Stream) -> Collected {
    let mut c = Collected::default();
    while let Some(ev) = s.blocking_recv() {
        match ev {
            Event::Token { id, step, .. } => {
                c.tokens.push(id);
                c.steps.push(step);
            }
            Event::Admitted { step } => {
                assert!(c.admitted.is_none(), "admitted twice");
                assert!(c.tokens.is_empty(), "admitted after a token");
                c.admitted = Some(step);
            }
            Event::Preempted { .. } => c.preempted = true,
            Event::Done { reason, usage, .. } => {
                c.reason = Some(reason);
                c.usage = usage;
            }
        }
    }
    c
}

fn prompts() -> Vec<(Vec<u32>, Vec<u32>)> {
    read_jsonl("smollm2-greedy.jsonl")
        .iter()
        .map(|l| {
            let ids = |v: &Value| -> Vec<u32> {
                v.as_array()
                    .unwrap()
                    .iter()
                    .map(|x| x.as_u64().unwrap() as u32)
                    .collect()
            };
            (ids(&l["prompt_token_ids"]), ids(&l["generated_token_ids"]))
        })
        .collect()
}

fn engine(config: EngineConfig) -> Engine {
    Engine::start(load("smollm2"), None, config).expect("engine starts")
}

fn req(prompt: &[u32], max_tokens: usize) -> GenerateRequest {
    GenerateRequest {
        prompt: prompt.to_vec(),
        params: SamplingParams::greedy(max_tokens),
    }
}

fn wait_until(what: &str, mut cond: impl FnMut() -> bool) {
    let t0 = Instant::now();
    while !cond() {
        assert!(
            t0.elapsed() < Duration::from_secs(120),
            "timed out waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// SmolLM2's `<|im_end|>`, which ends the chat fixtures.
const IM_END: u32 = 2;

#[test]
fn concurrent_streams_equal_solo_runs_and_llama_cpp() {
    let e = engine(EngineConfig::default());
    let cases = prompts();
    let mut solo = Vec::new();
    let lines = read_jsonl("smollm2-greedy.jsonl");
    for (n, (prompt, want)) in cases.iter().take(4).enumerate() {
        let c = collect(e.submit(req(prompt, 32)).unwrap());
        // The engine reproduces llama.cpp's greedy ids under the fixture rules (the stop token
        // is not emitted as a token but ends the stream).
        let mut ids = c.tokens.clone();
        if c.reason == Some(FinishReason::Stop) {
            ids.push(IM_END);
        }
        let matched = compare(&format!("engine, line {}", n + 1), &lines[n], &ids);
        if matched == want.len() && want.last() == Some(&IM_END) {
            assert_eq!(c.reason, Some(FinishReason::Stop));
        }
        assert_eq!(c.usage.prompt_tokens, prompt.len());
        assert_eq!(c.usage.completion_tokens, c.tokens.len());
        solo.push(c.tokens);
    }
    let before = e.metrics();
    let streams: Vec<Stream> = cases
        .iter()
        .take(4)
        .map(|(p, _)| e.submit(req(p, 32)).unwrap())
        .collect();
    let together: Vec<Collected> = streams.into_iter().map(collect).collect();
    for (i, (c, s)) in together.iter().zip(&solo).enumerate() {
        assert_eq!(&c.tokens, s, "stream {i} differs when batched");
        // Each stream learnt when the engine admitted it, at or before its first token's step.
        assert!(
            c.admitted.is_some_and(|a| a <= c.steps[0]),
            "stream {i}: admitted {:?}, first token at step {}",
            c.admitted,
            c.steps[0]
        );
    }
    let after = e.metrics();
    let tokens: usize = solo.iter().map(Vec::len).sum();
    let steps = after.steps - before.steps;
    // Batched: far fewer steps than tokens (one step serves all four streams).
    assert!(
        steps as usize <= solo.iter().map(Vec::len).max().unwrap() + 4,
        "{steps} steps for {tokens} tokens"
    );
    assert_eq!(
        after.tokens_generated - before.tokens_generated,
        tokens as u64
    );
    assert_eq!(after.active_sequences, 0);
    assert_eq!(after.kv_bytes, 0);
}

#[test]
fn cancelled_stream_stops_consuming_steps() {
    let e = engine(EngineConfig::default());
    let cases = prompts();
    let a = e.submit(req(&cases[2].0, 48)).unwrap();
    let mut b = e.submit(req(&cases[0].0, 48)).unwrap();
    // Take three tokens from B, then hang up (counting whatever else was already sent).
    let mut got_b = 0u64;
    while got_b < 3 {
        if let Some(Event::Token { .. }) = b.blocking_recv() {
            got_b += 1;
        }
    }
    while let Some(ev) = b.try_recv() {
        assert!(matches!(ev, Event::Token { .. }));
        got_b += 1;
    }
    drop(b);
    let a = collect(a);
    assert_eq!(a.reason, Some(FinishReason::Length));
    let m = e.metrics();
    assert_eq!(m.cancellations, 1);
    // B consumed what it received plus at most the one step in flight when it was dropped (it
    // is noticed at the next step), not its 48.
    let b_consumed = m.tokens_generated - a.tokens.len() as u64;
    assert!(
        b_consumed >= got_b && b_consumed <= got_b + 1,
        "cancelled stream generated {b_consumed} tokens, {got_b} received"
    );
    assert!(
        got_b < 40,
        "the test must cancel B early ({got_b} tokens received)"
    );
    // Every step after the cancellation served A alone: steps == A's tokens.
    assert_eq!(m.steps, a.tokens.len() as u64);
    assert_eq!(m.active_sequences, 0);
    assert_eq!(m.kv_bytes, 0);
}

#[test]
fn queue_full_context_and_budget_refusals_are_typed() {
    let bpt = load("smollm2").config().kv_bytes_per_token();
    let cfg = EngineConfig {
        queue_capacity: 1,
        max_batch: 1,
        step_token_budget: 8,
        prefill_chunk: 8,
        kv_budget_bytes: 128 * bpt,
        n_ctx: 256,
        ..EngineConfig::default()
    };
    let e = engine(cfg);
    let p = prompts()[2].0.clone();
    assert!(matches!(
        e.submit(req(&p, 300)),
        Err(SubmitError::ContextTooLong { n_ctx: 256, .. })
    ));
    assert!(matches!(
        e.submit(req(&p, 200)),
        Err(SubmitError::OverBudget { budget_bytes, .. }) if budget_bytes == 128 * bpt
    ));
    assert!(matches!(
        e.submit(req(&[], 5)),
        Err(SubmitError::Invalid(_))
    ));
    let bad_stop = GenerateRequest {
        prompt: p.clone(),
        params: SamplingParams {
            stop_strings: vec!["\n".into()],
            ..SamplingParams::greedy(4)
        },
    };
    assert!(matches!(e.submit(bad_stop), Err(SubmitError::Invalid(_))));
    // One running (batch of 1), one queued, the next is refused.
    let running = e.submit(req(&p, 100)).unwrap();
    wait_until("admission", || e.metrics().active_sequences == 1);
    let queued = e.submit(req(&p, 4)).unwrap();
    assert_eq!(e.metrics().queue_depth, 1);
    assert!(matches!(
        e.submit(req(&p, 4)),
        Err(SubmitError::QueueFull { capacity: 1 })
    ));
    drop(running);
    let q = collect(queued);
    assert_eq!(q.tokens.len(), 4);
}

#[test]
fn chunked_prefill_keeps_running_stream_fed_every_step() {
    let cfg = EngineConfig {
        max_batch: 4,
        step_token_budget: 24,
        prefill_chunk: 16,
        ..EngineConfig::default()
    };
    let e = engine(cfg);
    let cases = prompts();
    let mut a = e.submit(req(&cases[1].0, 40)).unwrap();
    // Let A reach decode.
    let mut a_steps = Vec::new();
    while a_steps.len() < 2 {
        if let Some(Event::Token { step, .. }) = a.blocking_recv() {
            a_steps.push(step);
        }
    }
    // A long prompt (~300 tokens) arrives while A decodes.
    let long: Vec<u32> = cases
        .iter()
        .flat_map(|(p, _)| p.clone())
        .cycle()
        .take(300)
        .collect();
    let submitted_after = e.metrics().steps;
    let b = e.submit(req(&long, 2)).unwrap();
    let a = {
        let mut rest = collect(a);
        a_steps.append(&mut rest.steps);
        rest.steps = a_steps;
        rest
    };
    let b = collect(b);
    let b_first = b.steps[0];
    // B's prompt needed many steps (16-token chunks, 24-row budget minus A's decode row)...
    assert!(
        b_first - submitted_after >= 300 / 23,
        "long prompt prefilled in {} steps",
        b_first - submitted_after
    );
    // ...and A got a token on every one of them: its steps are consecutive and span B's prefill.
    assert!(
        a.steps.windows(2).all(|w| w[1] == w[0] + 1),
        "A skipped steps: {:?}",
        a.steps
    );
    assert!(
        *a.steps.last().unwrap() > b_first,
        "A must still be running after B's prefill"
    );
    assert!(e.metrics().prompt_tokens_processed >= 300);
}

/// Decode protection: with `decode_stall_factor` 1 (no step may be slower than a decode-only
/// one, so every step with a decoding stream gets the floor of `MIN_PREFILL_ROWS` prefill rows
/// once both step times are known), a long prompt arriving while a stream decodes is spread
/// over many more steps than `prefill_chunk` alone would give, the running stream gets a token
/// every step, and both outputs equal their solo runs.
#[test]
fn decode_protection_spreads_a_long_prefill_and_keeps_outputs() {
    let cases = prompts();
    let long: Vec<u32> = cases
        .iter()
        .flat_map(|(p, _)| p.clone())
        .cycle()
        .take(120)
        .collect();
    let solo = |prompt: &[u32], n: usize| {
        collect(
            engine(EngineConfig::default())
                .submit(req(prompt, n))
                .unwrap(),
        )
    };
    let (solo_a, solo_b) = (solo(&cases[1].0, 30), solo(&long, 2));
    let e = engine(EngineConfig {
        decode_stall_factor: Some(1.0),
        ..EngineConfig::default()
    });
    let mut a = e.submit(req(&cases[1].0, 30)).unwrap();
    let mut a_first = Vec::new();
    let mut a_steps = Vec::new();
    // A's prefill (a prefill-only step) and two decode-only steps: both step times are known.
    while a_steps.len() < 3 {
        if let Some(Event::Token { id, step, .. }) = a.blocking_recv() {
            a_first.push(id);
            a_steps.push(step);
        }
    }
    let submitted_after = e.metrics().steps;
    let b = collect(e.submit(req(&long, 2)).unwrap());
    let mut rest = collect(a);
    a_first.append(&mut rest.tokens);
    a_steps.append(&mut rest.steps);
    let prefill_steps = b.steps[0] - submitted_after;
    assert!(
        prefill_steps as usize >= long.len() / MIN_PREFILL_ROWS,
        "120 prompt tokens in {prefill_steps} steps: the floor is {MIN_PREFILL_ROWS} rows a step"
    );
    if *a_steps.last().unwrap() > b.steps[0] {
        assert!(
            a_steps.windows(2).all(|w| w[1] == w[0] + 1),
            "A skipped steps: {a_steps:?}"
        );
    }
    assert_eq!(
        a_first, solo_a.tokens,
        "decode protection changed A's output"
    );
    assert_eq!(
        b.tokens, solo_b.tokens,
        "decode protection changed B's output"
    );
    // A factor below 1 or not finite is refused at start.
    for f in [0.5, f64::NAN] {
        let refused = Engine::start(
            load("smollm2"),
            None,
            EngineConfig {
                decode_stall_factor: Some(f),
                ..EngineConfig::default()
            },
        );
        assert!(refused.is_err(), "factor {f} was accepted");
    }
}

#[test]
fn preemption_takes_the_newest_and_keeps_outputs() {
    let bpt = load("smollm2").config().kv_bytes_per_token();
    // Room for three 32-token blocks: two short prompts fit, but both cannot grow past 32.
    let cfg = EngineConfig {
        kv_budget_bytes: 3 * 32 * bpt,
        ..EngineConfig::default()
    };
    let e = engine(cfg);
    let cases = prompts();
    let (pa, pb) = (&cases[1].0, &cases[2].0);
    let solo_a = collect(e.submit(req(pa, 60)).unwrap());
    let solo_b = collect(e.submit(req(pb, 60)).unwrap());
    assert!(!solo_a.preempted && !solo_b.preempted);
    assert_eq!(e.metrics().preemptions, 0);

    let a = e.submit(req(pa, 60)).unwrap();
    wait_until("A admitted", || e.metrics().active_sequences == 1);
    let b = e.submit(req(pb, 60)).unwrap();
    let (a, b) = (collect(a), collect(b));
    assert!(!a.preempted, "the oldest sequence must never be preempted");
    assert!(b.preempted, "the newest sequence is the one to preempt");
    assert!(e.metrics().preemptions >= 1);
    // Re-prefill of prompt + generated tokens continues exactly where it stopped.
    assert_eq!(a.tokens, solo_a.tokens);
    assert_eq!(b.tokens, solo_b.tokens);
}

/// The engine step of a stream's first token (prompt `cases[2]` generates well past its
/// `max_tokens` without a stop token, so every stream here gets tokens).
fn first_step(s: Stream) -> u64 {
    let c = collect(s);
    assert_eq!(c.reason, Some(FinishReason::Length));
    c.steps[0]
}

/// With one sequence running (batch of 1), queues `order` behind it and returns the step at
/// which each queued request got its first token.
fn admission_steps(cfg: EngineConfig, order: &[Priority]) -> Vec<u64> {
    let e = engine(EngineConfig {
        max_batch: 1,
        ..cfg
    });
    let p = prompts()[2].0.clone();
    let running = e.submit(req(&p, 12)).unwrap();
    wait_until("admission", || e.metrics().active_sequences == 1);
    let queued: Vec<Stream> = order
        .iter()
        .map(|&prio| e.submit_with_priority(req(&p, 2), prio).unwrap())
        .collect();
    // Everything was queued while the first request still ran.
    assert_eq!(e.metrics().queue_depth, order.len());
    assert_eq!(collect(running).reason, Some(FinishReason::Length));
    queued.into_iter().map(first_step).collect()
}

#[test]
fn interactive_requests_are_admitted_before_queued_batch_ones() {
    use Priority::{Batch, Interactive};
    // Batch A, B then interactive C, while the engine is busy: C starts first, then A, then B.
    let s = admission_steps(EngineConfig::default(), &[Batch, Batch, Interactive]);
    let (a, b, c) = (s[0], s[1], s[2]);
    assert!(c < a && a < b, "first-token steps A {a}, B {b}, C {c}");
    // FIFO within a class.
    let s = admission_steps(
        EngineConfig::default(),
        &[Interactive, Batch, Interactive, Batch],
    );
    assert!(
        s[0] < s[2] && s[2] < s[1] && s[1] < s[3],
        "first-token steps {s:?}"
    );
}

#[test]
fn batch_request_waiting_too_long_is_promoted() {
    use Priority::{Batch, Interactive};
    // Batch A waits the 12 steps of the running request, more than the 4 allowed: promoted, it
    // goes before the interactive requests that arrived after it.
    let promoted = EngineConfig {
        batch_max_wait_steps: 4,
        ..EngineConfig::default()
    };
    let s = admission_steps(promoted, &[Batch, Interactive, Interactive]);
    assert!(s[0] < s[1] && s[1] < s[2], "first-token steps {s:?}");
    // The same arrivals with the default promotion delay (128 steps): A goes last.
    let s = admission_steps(EngineConfig::default(), &[Batch, Interactive, Interactive]);
    assert!(s[1] < s[2] && s[2] < s[0], "first-token steps {s:?}");
}

#[test]
fn batch_has_its_own_queue_limit() {
    let e = engine(EngineConfig {
        queue_capacity: 2,
        batch_queue_capacity: 1,
        max_batch: 1,
        ..EngineConfig::default()
    });
    let p = prompts()[2].0.clone();
    let running = e.submit(req(&p, 200)).unwrap();
    wait_until("admission", || e.metrics().active_sequences == 1);
    let batch = e.submit_with_priority(req(&p, 2), Priority::Batch).unwrap();
    assert!(matches!(
        e.submit_with_priority(req(&p, 2), Priority::Batch),
        Err(SubmitError::QueueFull { capacity: 1 })
    ));
    // The queued batch request does not take an interactive slot.
    let i1 = e.submit(req(&p, 2)).unwrap();
    let i2 = e
        .submit_with_priority(req(&p, 2), Priority::Interactive)
        .unwrap();
    assert_eq!(e.metrics().queue_depth, 3);
    assert!(matches!(
        e.submit(req(&p, 2)),
        Err(SubmitError::QueueFull { capacity: 2 })
    ));
    // The batch limit is capped by the queue capacity.
    let capped = engine(EngineConfig {
        queue_capacity: 2,
        ..EngineConfig::default()
    });
    assert_eq!(capped.config().batch_queue_capacity, 2);
    assert!(
        Engine::start(
            load("smollm2"),
            None,
            EngineConfig {
                batch_queue_capacity: 0,
                ..EngineConfig::default()
            }
        )
        .is_err()
    );
    drop(running);
    for s in [batch, i1, i2] {
        assert_eq!(collect(s).tokens.len(), 2);
    }
}

/// A "system prompt" prefix (the first 37 ids of a 57-id fixture prompt, not a multiple of the
/// prefill chunk) and two prompts that start with it and go on with different "user" tails
/// (two other fixture prompts): `(prefix, a, b)`.
fn prefixed_prompts() -> (Vec<u32>, Vec<u32>, Vec<u32>) {
    let cases = prompts();
    let prefix: Vec<u32> = cases[4].0[..37].to_vec();
    let with_tail = |i: usize| -> Vec<u32> {
        let mut p = prefix.clone();
        p.extend_from_slice(&cases[i].0);
        p
    };
    let (a, b) = (with_tail(1), with_tail(2));
    (prefix, a, b)
}

/// The prefix cache is no timing side channel: what one user asked never changes how much of
/// another user's prompt is prefilled (the work that sets time to first token). User B's
/// request prefills the same number of tokens whether user A asked B's very question just
/// before, or another one: only the platform's fixed prefix is ever reused.
#[test]
fn another_users_question_never_shortens_a_prefill() {
    let (prefix, a, b) = prefixed_prompts();
    // B's prefilled tokens after A asked `first`.
    let prefilled_for_b = |first: &[u32]| -> (u64, Vec<u32>) {
        let e = engine(EngineConfig {
            prefill_chunk: 16,
            ..EngineConfig::default()
        });
        e.set_shared_prefix(prefix.clone());
        let _ = collect(e.submit(req(first, 4)).unwrap());
        let before = e.metrics().prompt_tokens_processed;
        let answer = collect(e.submit(req(&b, 8)).unwrap());
        (e.metrics().prompt_tokens_processed - before, answer.tokens)
    };
    let (after_same, same_answer) = prefilled_for_b(&b);
    let (after_other, other_answer) = prefilled_for_b(&a);
    assert_eq!(
        after_same, after_other,
        "B's prefill depends on what A asked"
    );
    assert_eq!(after_same, (b.len() - prefix.len()) as u64);
    assert_eq!(same_answer, other_answer);
}

#[test]
fn shared_prefix_is_computed_once_and_reused_bit_identically() {
    // A "system prompt" prefix (the first 37 ids of a 57-id fixture prompt, not a multiple of
    // the prefill chunk) followed by different "user" tails: two other fixture prompts.
    let (prefix, a, b) = prefixed_prompts();
    let cold_cfg = EngineConfig {
        prefill_chunk: 16,
        ..EngineConfig::default()
    };
    // Cold reference: no shared prefix.
    let cold = engine(cold_cfg.clone());
    let cold_b = collect(cold.submit(req(&b, 24)).unwrap());
    assert_eq!(cold.metrics().prefix_hits, 0);

    let e = engine(cold_cfg);
    e.set_shared_prefix(prefix.clone());
    // The first request fills the prefix's KV (a miss)...
    let first = collect(e.submit(req(&a, 8)).unwrap());
    assert!(!first.tokens.is_empty());
    let m1 = e.metrics();
    assert_eq!((m1.prefix_hits, m1.prefix_tokens_saved), (0, 0));
    assert_eq!(m1.prompt_tokens_processed, a.len() as u64);
    // ... which stays counted in the KV bytes while cached.
    assert!(
        m1.kv_bytes > 0,
        "the cached prefix is counted in the KV budget"
    );
    // The second one starts from it: only its own tail is prefilled, and its output is the
    // cold run's.
    let warm_b = collect(e.submit(req(&b, 24)).unwrap());
    let m2 = e.metrics();
    assert_eq!(m2.prefix_hits, 1);
    assert_eq!(m2.prefix_tokens_saved, prefix.len() as u64);
    assert_eq!(
        m2.prompt_tokens_processed - m1.prompt_tokens_processed,
        (b.len() - prefix.len()) as u64
    );
    assert_eq!(
        warm_b.tokens, cold_b.tokens,
        "prefix reuse changed the output"
    );
    assert_eq!(warm_b.usage.prompt_tokens, b.len());

    // A prompt that only shares part of the prefix is not a hit (nothing partial is reused).
    let partial: Vec<u32> = prefix[..30].iter().chain(&b[37..]).copied().collect();
    let _ = collect(e.submit(req(&partial, 2)).unwrap());
    assert_eq!(e.metrics().prefix_hits, 1);
    // A new prefix replaces the old one and its KV.
    e.set_shared_prefix(Vec::new());
    let _ = collect(e.submit(req(&b, 2)).unwrap());
    assert_eq!(e.metrics().prefix_hits, 1);
    assert_eq!(e.metrics().kv_bytes, 0);
}
