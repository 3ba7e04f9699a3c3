//! One generation in flight: where its events come from (the in-process engine or the rack),
//! its admission ticket, queue slot and token reservation, the idle watchdog, its metrics, and
//! the receipt and thread turn completed when it ends. Dropping it cancels the sequence.

use std::time::{Duration, Instant};

use airlock_inference::generate::{
    EngineCounters, Event as GenEvent, FinishReason, Stream, Usage as GenUsage,
};

use super::AnswerMetrics;
use crate::admission::{QueueSlot, Ticket};
use crate::quota::TokenReservation;

use super::history::TurnRecorder;
use super::receipt::Closer;
use super::{AnswerError, log_target};

/// Where a generation's events come from.
pub(crate) enum Source {
    /// The in-process engine.
    Local {
        /// The sequence's events (dropping it cancels the sequence).
        stream: Stream,
        /// The engine's counters: its step count tells a slow prefill or a queue (steps
        /// advance) from a stuck engine (they do not).
        engine: std::sync::Arc<EngineCounters>,
    },
    /// A remote generator's upstream stream (dropping it closes the upstream connection); it
    /// enforces its own first-token and between-token timeouts.
    Remote(Box<crate::remote::RemoteStream>),
}

/// One generation in flight: owns the engine stream (dropping it cancels the sequence), the
/// admission ticket and the timing.
pub struct Generation {
    pub(crate) source: Source,
    /// The alias of the generator producing it (the `backend` label of token metrics).
    pub(crate) backend: String,
    /// How long the generation may make no progress before it is ended.
    pub(crate) idle_timeout: Duration,
    pub(crate) first: Option<GenEvent>,
    pub(crate) ticket: Ticket,
    /// Held from submission until the engine admits the sequence (the ladder's queue-wait
    /// signal and queue depth).
    pub(crate) queue: Option<QueueSlot>,
    /// When the engine admitted the sequence (its prefill started).
    pub(crate) admitted_at: Option<Instant>,
    pub(crate) reservation: Option<TokenReservation>,
    pub(crate) prompt_tokens: usize,
    /// Prompt + completion tokens as the engine reported them at the end.
    pub(crate) used: Option<usize>,
    /// What it counts (the route also counts an unsupported answer here).
    pub metrics: AnswerMetrics,
    /// When the request arrived.
    pub t0: Instant,
    /// When the sequence was submitted to the engine or the rack.
    pub submitted: Instant,
    /// When the first token came.
    pub first_token_at: Option<Instant>,
    pub(crate) tokens: usize,
    pub(crate) finished: bool,
    /// Adds the answer to the thread it was asked in, when it completes.
    pub recorder: Option<TurnRecorder>,
    /// Completes the answer's receipt before the answer is acknowledged as complete.
    pub receipt: Option<Closer>,
}

impl Generation {
    /// The next event for the client: tokens, preemptions and the end. The engine's admission
    /// event is consumed here (it ends the queue wait).
    pub async fn next(&mut self) -> Option<GenEvent> {
        loop {
            let ev = match self.first.take() {
                Some(ev) => Some(ev),
                None => self.recv_watched().await,
            };
            if let Some(GenEvent::Admitted { .. }) = ev {
                self.admitted(Instant::now());
                continue;
            }
            self.account(&ev);
            return ev;
        }
    }

    /// The engine admitted the sequence at `at`: the queue wait ends.
    fn admitted(&mut self, at: Instant) {
        if self.admitted_at.is_none() {
            self.admitted_at = Some(at);
        }
        self.queue = None;
    }

    /// When the engine admitted the sequence; the first token's time when the engine's event
    /// was not seen.
    pub fn admission_time(&self, first_token: Instant) -> Instant {
        self.admitted_at.unwrap_or(first_token)
    }

    fn account(&mut self, ev: &Option<GenEvent>) {
        match ev {
            Some(GenEvent::Token { .. }) => {
                self.tokens += 1;
                if self.first_token_at.is_none() {
                    let now = Instant::now();
                    self.first_token_at = Some(now);
                    self.queue = None;
                    let admitted = self.admission_time(now);
                    self.metrics.ttft.observe((now - self.t0).as_secs_f64());
                    self.metrics
                        .meter
                        .stage("first_token", (now - self.submitted).as_secs_f64());
                    self.metrics
                        .meter
                        .stage("queue_wait", (admitted - self.submitted).as_secs_f64());
                    self.metrics
                        .meter
                        .stage("prefill", (now - admitted).as_secs_f64());
                }
            }
            Some(GenEvent::Done { usage, .. }) => {
                self.finished = true;
                self.queue = None;
                self.used = Some(usage.prompt_tokens + usage.completion_tokens);
                if let Some(first) = self.first_token_at
                    && self.tokens > 1
                {
                    let per = first.elapsed().as_secs_f64() / (self.tokens - 1) as f64;
                    self.metrics.tpot.observe(per);
                }
                self.metrics.rack.count_tokens(
                    &self.backend,
                    usage.prompt_tokens,
                    usage.completion_tokens,
                );
                self.metrics
                    .generated_tokens
                    .inc_by(usage.completion_tokens as u64);
                self.metrics
                    .prompt_tokens
                    .inc_by(usage.prompt_tokens as u64);
            }
            Some(GenEvent::Preempted { .. } | GenEvent::Admitted { .. }) => {}
            None => self.finished = true,
        }
    }
}

impl Generation {
    /// The next engine event. The idle timeout measures the generation's progress, not bytes
    /// on the wire (keep-alive comments flow while a request queues or prefills): the wait
    /// only fails when neither this stream got an event nor the engine completed any step for
    /// `idle_timeout` (a stuck engine), and then ends the generation with an error.
    async fn recv_watched(&mut self) -> Option<GenEvent> {
        let (stream, engine) = match &mut self.source {
            Source::Local { stream, engine } => (stream, engine.clone()),
            Source::Remote(remote) => return remote.recv().await,
        };
        let waited =
            until_stalled(stream.recv(), || engine.snapshot().steps, self.idle_timeout).await;
        match waited {
            Ok(ev) => ev,
            Err(Stalled) => {
                tracing::error!(
                    target: log_target::STREAM,
                    idle_secs = self.idle_timeout.as_secs(),
                    tokens = self.tokens,
                    "the engine made no progress; ending the generation"
                );
                Some(GenEvent::Done {
                    reason: FinishReason::Error(format!(
                        "no engine progress for {} s",
                        self.idle_timeout.as_secs()
                    )),
                    usage: GenUsage {
                        prompt_tokens: self.prompt_tokens,
                        completion_tokens: self.tokens,
                    },
                    text: None,
                })
            }
        }
    }
}

/// [`until_stalled`] gave up: no progress for the whole idle timeout.
#[derive(Debug, PartialEq, Eq)]
struct Stalled;

/// Awaits `wait` while watching a progress counter (`steps`, sampled a few times per `idle`):
/// `Err(Stalled)` once `wait` has not finished and the counter has not moved for `idle`.
async fn until_stalled<F: std::future::Future>(
    wait: F,
    steps: impl Fn() -> u64,
    idle: Duration,
) -> Result<F::Output, Stalled> {
    let check = (idle / 4).clamp(Duration::from_millis(10), Duration::from_secs(1));
    let mut wait = std::pin::pin!(wait);
    let mut seen = steps();
    let mut progress_at = Instant::now();
    loop {
        if let Ok(out) = tokio::time::timeout(check, &mut wait).await {
            return Ok(out);
        }
        let now = steps();
        if now != seen {
            seen = now;
            progress_at = Instant::now();
        } else if progress_at.elapsed() >= idle {
            return Err(Stalled);
        }
    }
}

impl Drop for Generation {
    fn drop(&mut self) {
        if let Some(r) = self.reservation.take() {
            r.settle(self.used.unwrap_or(self.prompt_tokens + self.tokens));
        }
        if !self.finished {
            self.metrics.cancelled.inc();
            tracing::info!(
                target: log_target::STREAM,
                rung = self.ticket.plan.rung,
                tokens = self.tokens,
                "client went away: generation cancelled"
            );
        }
    }
}

/// The OpenAI `finish_reason` of how a generation ended, or why it failed.
pub fn finish_reason(r: &FinishReason, remote: bool) -> Result<&'static str, AnswerError> {
    match r {
        FinishReason::Stop => Ok("stop"),
        FinishReason::Length => Ok("length"),
        FinishReason::Cancelled => Err(AnswerError::Cancelled),
        FinishReason::Error(e) if remote => Err(AnswerError::Upstream(e.clone())),
        FinishReason::Error(e) => Err(AnswerError::internal(format!("generation failed: {e}"))),
    }
}

impl Generation {
    /// Whether the rack generates it.
    pub fn is_remote(&self) -> bool {
        matches!(self.source, Source::Remote(_))
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::time::{Duration, Instant};

    use super::{Stalled, until_stalled};

    #[tokio::test]
    async fn a_stuck_engine_ends_the_wait_after_the_idle_timeout() {
        let idle = Duration::from_millis(200);
        let t0 = Instant::now();
        let r = until_stalled(std::future::pending::<()>(), || 7, idle).await;
        assert_eq!(r, Err(Stalled));
        let took = t0.elapsed();
        assert!(took >= idle && took < idle * 4, "{took:?}");
    }

    #[tokio::test]
    async fn engine_steps_keep_a_long_wait_alive() {
        // The awaited event takes 5 idle periods, but the engine steps meanwhile (a queue or a
        // long prefill ahead of it): the wait is not cut.
        let idle = Duration::from_millis(100);
        let steps = AtomicU64::new(0);
        let event = async {
            tokio::time::sleep(idle * 5).await;
            "token"
        };
        let r = until_stalled(event, || steps.fetch_add(1, Ordering::Relaxed), idle).await;
        assert_eq!(r, Ok("token"));
        assert!(steps.load(Ordering::Relaxed) > 5);
        // An event that arrives in time needs no steps.
        let r = until_stalled(async { 1 }, || 0, idle).await;
        assert_eq!(r, Ok(1));
    }
}
