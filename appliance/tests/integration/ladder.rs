//! The degradation ladder and quotas: a harness replays synthetic load through the controller
//! with a fake clock (descends under load, recovers after, no flapping at a threshold), real
//! concurrent holders drive admission's own bookkeeping, and requests through `app()` check the
//! wire behaviour: shed = 503 problem with `Retry-After` that never reaches the engine, batch shed
//! first, the load-driven rung 5 sheds only the excess (below its in-flight limit a chat is
//! served, reporting rung 5), rung-4 deadline = 504, RPM and TPM quotas = 429 with reservation
//! and refund.

use std::time::{Duration, Instant};

use airlock::auth::Caller;
use airlock::config::Config;
use airlock::metrics::Metrics;
use airlock_serving::admission::{Admission, AdmissionConfig, Priority};
use airlock_serving::ladder::{Ladder, LadderConfig, Signals};
use axum::body::Body;
use axum::http::{Method, Request, StatusCode, header};
use serde_json::{Value, json};

use crate::support::{Resp, TestApp, load_smollm2, test_config};

/// One tick of a synthetic load: queue depth and in-flight count.
fn load(queued: usize, inflight: usize) -> Signals {
    Signals {
        queued,
        inflight,
        ..Signals::default()
    }
}

/// Replays `pattern` (one entry per 250 ms tick) and returns the rung after each tick.
fn replay(ladder: &mut Ladder, t0: Instant, pattern: &[Signals]) -> Vec<u8> {
    pattern
        .iter()
        .enumerate()
        .map(|(i, s)| {
            ladder.observe(s, t0 + Duration::from_millis(250 * i as u64));
            ladder.rung()
        })
        .collect()
}

/// The thresholds these tests were written against (an engine that serves 16 requests at once
/// within the objective), independent of the shipped defaults, which are sized for the 2-core
/// reference box.
fn wide() -> LadderConfig {
    LadderConfig {
        inflight_full: 16,
        shed_admit_inflight: 16,
        recover_hold: Duration::from_secs(10),
        ..LadderConfig::default()
    }
}

fn transitions(rungs: &[u8]) -> usize {
    rungs.windows(2).filter(|w| w[0] != w[1]).count()
}

#[test]
fn harness_descends_under_load_and_recovers_after() {
    let cfg = wide();
    let mut ladder = Ladder::new(cfg.clone());
    let t0 = Instant::now();
    // 20 s idle, a 60 s ramp to 5x the queue's full level, 60 s at it, then 120 s idle.
    let mut pattern = vec![load(0, 2); 80];
    for i in 0..240 {
        let q = (i * cfg.queue_full * 5) / 240;
        pattern.push(load(q, 16.min(q + 2)));
    }
    pattern.extend(vec![load(cfg.queue_full * 5, 16); 240]);
    pattern.extend(vec![load(0, 0); 480]);
    let rungs = replay(&mut ladder, t0, &pattern);

    assert!(rungs[..80].iter().all(|r| *r == 0), "idle stays at rung 0");
    let ramp = &rungs[80..320];
    assert!(
        ramp.windows(2).all(|w| w[1] >= w[0]),
        "never climbs while load rises"
    );
    assert_eq!(rungs[560 - 1], 5, "5x full load sheds");
    // Down fast: the first tick at or over a threshold enters its rung.
    let first_at = |r: u8| rungs.iter().position(|x| *x >= r).unwrap();
    let q_at = |i: usize| pattern[i].queued as f64 / cfg.queue_full as f64;
    for r in 1..=5u8 {
        let i = first_at(r);
        assert!(q_at(i) >= cfg.step_down[usize::from(r) - 1]);
        assert!(q_at(i - 1) < cfg.step_down[usize::from(r) - 1] || rungs[i - 1] >= r);
    }
    // Up slowly: one rung per calm hold (10 s = 40 ticks), so rung 0 after ~50 s, not before.
    let idle = &rungs[560..];
    let back = idle
        .iter()
        .position(|r| *r == 0)
        .expect("recovers to rung 0");
    let hold_ticks = (cfg.recover_hold.as_millis() / 250) as usize;
    assert!(back >= 5 * hold_ticks, "climbed too fast: {back} ticks");
    assert!(
        back <= 5 * hold_ticks + 5,
        "climbed too slowly: {back} ticks"
    );
    assert_eq!(transitions(idle), 5, "one rung at a time: {idle:?}");
}

#[test]
fn harness_does_not_flap_on_a_steady_load_at_a_threshold() {
    let cfg = wide();
    let mut ladder = Ladder::new(cfg.clone());
    let t0 = Instant::now();
    // A load that hovers around rung 2's threshold (1.5 x full: 12 of 8) with ±1 noise for
    // 10 minutes, never dropping to the recovery threshold.
    let pattern: Vec<Signals> = (0..2400)
        .map(|i| load([11, 12, 13, 12, 11, 13][i % 6], 10))
        .collect();
    let rungs = replay(&mut ladder, t0, &pattern);
    assert_eq!(rungs[0], 1, "11/8 = 1.375: rung 1 at once");
    assert_eq!(*rungs.last().unwrap(), 2);
    assert_eq!(
        transitions(&rungs),
        1,
        "one step down to rung 2, then steady: {:?}",
        &rungs[..20]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_holders_drive_admission_down_and_back() {
    let cfg = AdmissionConfig {
        ladder: Some(wide()),
        tick: None,
        ..AdmissionConfig::default()
    };
    let admission = Admission::new(Metrics::new().admission(), cfg);
    let t0 = Instant::now();
    // 30 concurrent requests, each admitted and waiting for the engine until released.
    let (release_tx, release_rx) = tokio::sync::watch::channel(false);
    let mut tasks = Vec::new();
    for i in 0..30 {
        let a = admission.clone();
        let mut rx = release_rx.clone();
        tasks.push(tokio::spawn(async move {
            let caller = Caller {
                user_id: format!("u{i}"),
                admin: false,
                roles: vec![],
            };
            let ticket = a.admit(&caller, None, Priority::Interactive).unwrap();
            let _slot = a.enqueue();
            let _ = rx.wait_for(|r| *r).await;
            drop(ticket);
        }));
    }
    while admission.queued() < 30 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let step = admission
        .tick(t0)
        .expect("30 queued / 8 full = 3.75: rung 4");
    assert_eq!((step.from, step.to), (0, 4));
    let u = Caller {
        user_id: "late".into(),
        admin: false,
        roles: vec![],
    };
    let plan = admission
        .admit(&u, None, Priority::Interactive)
        .unwrap()
        .plan;
    assert_eq!(plan.rung, 4);
    assert_eq!(
        plan.queue_deadline,
        Some(airlock_serving::admission::DEFAULT_QUEUE_DEADLINE)
    );
    assert!(matches!(
        admission.admit(&u, None, Priority::Batch),
        Err(airlock_serving::admission::AdmissionError::Shed { .. })
    ));
    release_tx.send(true).unwrap();
    for t in tasks {
        t.await.unwrap();
    }
    assert_eq!((admission.inflight(), admission.queued()), (0, 0));
    let mut rung = 4;
    for s in 1..=60u64 {
        if let Some(t) = admission.tick(t0 + Duration::from_secs(s)) {
            assert_eq!(t.to + 1, rung, "one rung at a time");
            rung = t.to;
        }
    }
    assert_eq!(admission.current_rung(), 0, "recovered after the load");
}

fn ladder_off() -> Config {
    Config {
        ladder: Some(false),
        ..test_config()
    }
}

fn chat_req(token: &str, body: Value, batch: bool) -> Request<Body> {
    let mut b = Request::builder()
        .method(Method::POST)
        .uri("/v1/chat/completions")
        .header(header::AUTHORIZATION, format!("Bearer {token}"))
        .header(header::CONTENT_TYPE, "application/json");
    if batch {
        b = b.header("x-airlock-priority", "batch");
    }
    b.body(Body::from(serde_json::to_vec(&body).unwrap()))
        .unwrap()
}

fn plain_question(max_tokens: u32) -> Value {
    json!({
        "messages": [{"role": "user", "content": "Name one colour. Answer in one word."}],
        "max_tokens": max_tokens,
        "stop": ["."],
        "airlock": {"retrieval": false},
    })
}

fn assert_shed(r: &Resp, rung: &str) {
    r.assert_problem(
        503,
        "capacity-unavailable",
        "the appliance is at capacity; retry later",
    );
    assert_eq!(r.headers.get(header::RETRY_AFTER).unwrap(), "5");
    assert_eq!(r.headers.get("x-airlock-rung").unwrap(), rung);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shed_requests_are_503_problems_that_never_reach_the_engine() {
    let t = TestApp::with_generator(ladder_off(), load_smollm2());
    let user = t.user("ursula", &[]);
    let engine_before = {
        let s = t.state.services().unwrap();
        s.generators[0].engine().metrics()
    };
    // An operator's pin at rung 5 sheds everything, nothing in flight or not.
    t.state.admission().set_rung(5);
    for _ in 0..5 {
        let r = t.send(chat_req(&user, plain_question(8), false)).await;
        assert_shed(&r, "5");
    }
    // Batch traffic is shed from rung 3 while interactive traffic is still served.
    t.state.admission().set_rung(3);
    let r = t.send(chat_req(&user, plain_question(8), true)).await;
    assert_shed(&r, "3");
    let after_shed = t.state.services().unwrap().generators[0].engine().metrics();
    assert_eq!(
        (
            after_shed.prompt_tokens_processed,
            after_shed.steps,
            after_shed.tokens_generated
        ),
        (
            engine_before.prompt_tokens_processed,
            engine_before.steps,
            engine_before.tokens_generated
        ),
        "shed requests must not touch the engine"
    );
    let r = t.send(chat_req(&user, plain_question(8), false)).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert_eq!(r.headers.get("x-airlock-rung").unwrap(), "3");
    assert!(
        t.state.services().unwrap().generators[0]
            .engine()
            .metrics()
            .steps
            > after_shed.steps
    );
    let metrics = t.state.metrics().encode();
    assert!(
        metrics.contains("airlock_shed_total{priority=\"interactive\"} 5"),
        "{metrics}"
    );
    assert!(metrics.contains("airlock_shed_total{priority=\"batch\"} 1"));
    assert!(metrics.contains("airlock_ladder_rung 3"));
    assert!(metrics.contains("airlock_rung_transitions_total 2"));
    // A bad priority header is a 400, not a silent default.
    let mut req = chat_req(&user, plain_question(8), false);
    req.headers_mut()
        .insert("x-airlock-priority", "urgent".parse().unwrap());
    assert_eq!(t.send(req).await.status, StatusCode::BAD_REQUEST);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_running_ladder_sheds_the_excess_under_load_and_recovers() {
    let config = Config {
        ladder: Some(true),
        ladder_tick_ms: Some(20),
        ladder_recover_hold_secs: Some(1),
        // Full at 2 in flight, and rung 5 admits up to 2.
        ladder_inflight_full: Some(2),
        ladder_shed_admit_inflight: Some(2),
        ..test_config()
    };
    assert_eq!(config.admission().ladder_config().shed_admit_inflight, 2);
    // Its own engine: the controller reads the engine's queue, which other tests must not fill.
    let t = TestApp::with_generator(config, load_smollm2());
    let user = t.user("ursula", &[]);
    let admission = t.state.admission().clone();
    let engine = t.state.services().unwrap().generators[0].clone();
    // Two admitted requests hold the rung-5 limit; 40 requests waiting for the engine (5 x the
    // queue's full level) put the thread at rung 5.
    let holder = Caller {
        user_id: "holder".into(),
        admin: false,
        roles: vec![],
    };
    let mut held: Vec<_> = (0..2)
        .map(|_| {
            admission
                .admit(&holder, None, Priority::Interactive)
                .unwrap()
        })
        .collect();
    let slots: Vec<_> = (0..40).map(|_| admission.enqueue()).collect();
    let deadline = Instant::now() + Duration::from_secs(10);
    while admission.current_rung() < 5 {
        assert!(
            Instant::now() < deadline,
            "the ladder thread never descended"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // At the limit: the excess is a 503 answered before retrieval or the engine.
    let before = engine.engine().metrics();
    let r = t.send(chat_req(&user, plain_question(8), false)).await;
    assert_shed(&r, "5");
    let r = t.send(chat_req(&user, plain_question(8), true)).await;
    assert_shed(&r, "5");
    let after = engine.engine().metrics();
    assert_eq!(
        (after.steps, after.prompt_tokens_processed),
        (before.steps, before.prompt_tokens_processed),
        "shed requests must not touch the engine"
    );
    // Below the limit, rung 5 still serves an interactive chat (rung 4's plan), and says rung 5.
    held.pop();
    let r = t.send(chat_req(&user, plain_question(8), false)).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert_eq!(r.headers.get("x-airlock-rung").unwrap(), "5");
    assert_eq!(r.json["airlock"]["rung"], 5);
    assert!(engine.engine().metrics().steps > after.steps);
    assert_eq!(admission.current_rung(), 5, "the queue still holds rung 5");
    let metrics = t.state.metrics().encode();
    assert!(
        metrics.contains("airlock_shed_total{priority=\"interactive\"} 1"),
        "{metrics}"
    );
    assert!(metrics.contains("airlock_shed_total{priority=\"batch\"} 1"));
    drop(held);
    drop(slots);
    let t_release = Instant::now();
    let deadline = Instant::now() + Duration::from_secs(30);
    while admission.current_rung() > 0 {
        assert!(Instant::now() < deadline, "the ladder never recovered");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        t_release.elapsed() >= Duration::from_secs(5),
        "five rungs with a 1 s hold each cannot recover in {:?}",
        t_release.elapsed()
    );
    let metrics = t.state.metrics().encode();
    assert!(metrics.contains("airlock_ladder_rung 0"), "{metrics}");
    assert!(metrics.contains("airlock_ladder_rung_seconds_total{rung=\"5\"}"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rung_four_answers_504_when_the_deadline_passes_before_the_first_token() {
    let config = Config {
        queue_deadline_ms: Some(1),
        ..ladder_off()
    };
    let t = TestApp::with_generator(config, load_smollm2());
    let admin = t.admin.clone();
    let mut body = plain_question(8);
    body["airlock"]["rung"] = json!(4);
    let r = t.send(chat_req(&admin, body, false)).await;
    r.assert_problem(
        504,
        "deadline-exceeded",
        "the request waited past its deadline before generation started",
    );
    assert_eq!(r.headers.get("x-airlock-rung").unwrap(), "4");
    // The abandoned sequence is cancelled in the engine, not left running.
    let engine = t.state.services().unwrap().generators[0].clone();
    let deadline = Instant::now() + Duration::from_secs(60);
    while engine.engine().metrics().cancellations < 1 {
        assert!(Instant::now() < deadline, "sequence never cancelled");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(t.state.admission().queued(), 0);
    assert_eq!(t.state.admission().inflight(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_per_minute_quota_is_429_with_retry_after() {
    let config = Config {
        user_requests_per_minute: Some(2),
        ..ladder_off()
    };
    let t = TestApp::with_config(config);
    let user = t.user("quinn", &[]);
    let retrieve = || async {
        t.call(
            Method::POST,
            "/v1/retrieve",
            Some(&user),
            Some(json!({"query": "liquidity", "top_k": 3})),
        )
        .await
    };
    assert_eq!(retrieve().await.status, StatusCode::OK);
    assert_eq!(retrieve().await.status, StatusCode::OK);
    let r = retrieve().await;
    r.assert_problem(429, "rate-limited", "request budget exhausted; retry later");
    let secs: u64 = r.headers[header::RETRY_AFTER]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!(
        (25..=30).contains(&secs),
        "2/min: one more in ~30 s, got {secs}"
    );
    // Admins have their own limits (unlimited by default).
    let r = t
        .call(
            Method::POST,
            "/v1/retrieve",
            Some(&t.admin),
            Some(json!({"query": "liquidity", "top_k": 3})),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK);
    assert!(
        t.state
            .metrics()
            .encode()
            .contains("airlock_rate_limited_total{quota=\"requests\"} 1")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_per_minute_reserve_prompt_plus_max_tokens_and_refund_the_rest() {
    const TPM: u32 = 600;
    let config = Config {
        user_tokens_per_minute: Some(TPM),
        ..ladder_off()
    };
    let t = TestApp::with_config(config);
    let user = t.user("tess", &[]);
    let quotas = t.state.admission().quotas().clone();
    let max_tokens = 64;
    let t_start = Instant::now();
    let r = t
        .send(chat_req(&user, plain_question(max_tokens), false))
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    let prompt = r.json["usage"]["prompt_tokens"].as_u64().unwrap() as f64;
    let completion = r.json["usage"]["completion_tokens"].as_u64().unwrap() as f64;
    assert!(
        completion < f64::from(max_tokens),
        "the stop string must end the answer early for the refund to show ({completion})"
    );
    let refill = t_start.elapsed().as_secs_f64() * f64::from(TPM) / 60.0;
    let available = quotas
        .tokens_available("tess", false, Instant::now())
        .unwrap();
    // Charged exactly what was used (prompt + completion), not the reservation.
    let used = f64::from(TPM) - available;
    assert!(
        used <= prompt + completion + 0.5 && used >= prompt + completion - refill - 1.0,
        "used {used}, prompt {prompt}, completion {completion}, refill ≤ {refill}"
    );
    // A request whose reservation does not fit is refused before generation, with Retry-After.
    // Other requests of the same user hold most of the bucket: a request whose reservation
    // (prompt + max_tokens) does not fit is refused before generation, with Retry-After.
    let now = Instant::now();
    let left = quotas.tokens_available("tess", false, now).unwrap();
    let held = quotas
        .reserve_tokens("tess", false, (left - 20.0) as usize, now)
        .unwrap();
    let r = t
        .send(chat_req(&user, plain_question(max_tokens), false))
        .await;
    drop(held);
    r.assert_problem(429, "rate-limited", "request budget exhausted; retry later");
    assert!(r.headers.contains_key(header::RETRY_AFTER));
    assert!(
        t.state
            .metrics()
            .encode()
            .contains("airlock_rate_limited_total{quota=\"tokens\"} 1")
    );
}
