//! Starting the generation of a prepared answer: the rack first (its admission may hand the
//! request to the local small model), else the in-process engine with the token quota, the
//! queue slot and rung 4's bounded wait for the first output.

use std::sync::Arc;
use std::time::Instant;

use airlock_inference::generate::{Event as GenEvent, GenerateRequest, Stream};

use crate::admission::{QueueSlot, RungPlan};
use crate::generator::Generator;
use crate::quota::TokenReservation;
use crate::remote::{BackendLabel, FallbackLabel, Refusal, RemoteGenerator, RemoteStream};

use super::generation::Source;
use super::prepare::Prepared;
use super::target::Target;
use super::{AnswerError, Chat, Core, blocking, log_target};

/// A generation submitted, not yet served.
pub(crate) struct Started {
    pub(crate) source: Source,
    pub(crate) reservation: TokenReservation,
    pub(crate) prompt_tokens: usize,
    /// The first output, when rung 4 waited for it.
    pub(crate) first: Option<GenEvent>,
    pub(crate) queue: Option<QueueSlot>,
    pub(crate) admitted_at: Option<Instant>,
    pub(crate) submitted: Instant,
    /// Why the rack handed the request to the local model, if it did.
    pub(crate) fallback: Option<&'static str>,
}

/// What the rack said.
enum Rack {
    /// Its stream, the token reservation and the estimated prompt tokens.
    Opened(Box<RemoteStream>, TokenReservation, usize),
    /// Unavailable: the local small model answers instead, for this reason.
    Fallback(Arc<Generator>, &'static str),
}

/// Submits the prepared answer to its generator. `model` becomes the local model's alias when
/// the rack hands the request over.
pub(crate) async fn start(
    cx: &Core<'_>,
    chat: &Chat,
    plan: &RungPlan,
    prepared: &mut Prepared,
    model: &mut String,
) -> Result<Started, AnswerError> {
    let submitted = Instant::now();
    let mut fallback: Option<&'static str> = None;
    let mut remote = None;
    if let Target::Remote(r) = &prepared.target {
        match open_rack(cx, chat, plan, &r.clone(), prepared).await? {
            Rack::Opened(stream, reservation, estimate) => {
                remote = Some((stream, reservation, estimate))
            }
            Rack::Fallback(g, reason) => {
                fallback = Some(reason);
                model.clone_from(&g.alias);
                let messages = prepared.messages.clone();
                let local = g.clone();
                (prepared.prompt, prepared.prompt_sha256) =
                    blocking(move || Ok(local.prompt_with_digest(&messages)?)).await?;
                prepared.target = Target::Local(g);
            }
        }
    }
    match (remote, &prepared.target) {
        (Some((stream, reservation, estimate)), _) => {
            tracing::event!(
                target: log_target::CHAT,
                tracing::Level::INFO,
                gen_ai.request.model = %model,
                airlock.replica = %stream.replica().upstream.authority(),
                airlock.rung = plan.rung,
                airlock.citations = prepared.citations.len(),
                "generation sent to the rack"
            );
            let admitted = stream.sent_at();
            Ok(Started {
                source: Source::Remote(stream),
                reservation,
                prompt_tokens: estimate,
                first: None,
                queue: None,
                admitted_at: Some(admitted),
                submitted,
                fallback,
            })
        }
        (None, Target::Remote(_)) => Err(AnswerError::internal("remote target without a stream")),
        (None, Target::Local(generator)) => {
            let generator = generator.clone();
            let mut started = submit_local(cx, chat, plan, prepared, model, &generator).await?;
            started.fallback = fallback;
            Ok(started)
        }
    }
}

/// Opens the rack's stream, with the token quota reserved before anything goes upstream: the
/// estimated prompt plus the most the completion can cost; the upstream's usage settles it.
async fn open_rack(
    cx: &Core<'_>,
    chat: &Chat,
    plan: &RungPlan,
    r: &Arc<RemoteGenerator>,
    prepared: &Prepared,
) -> Result<Rack, AnswerError> {
    let estimate = crate::remote::estimate_tokens(&prepared.messages);
    let reservation = cx
        .admission
        .reserve(cx.caller, estimate + chat.params.max_tokens)
        .map_err(|retry_after| AnswerError::OverQuota { retry_after })?;
    let opened = r
        .open(
            chat.conversation_id.as_deref(),
            &prepared.messages,
            &chat.params,
            chat.whole,
            &cx.metrics.rack,
        )
        .await;
    let refusal = match opened {
        Ok(s) => return Ok(Rack::Opened(Box::new(s), reservation, estimate)),
        Err(refusal) => refusal,
    };
    reservation.settle(0);
    let local = cx
        .services
        .small_generator()
        .filter(|_| r.config.fallback_to_local())
        .cloned();
    let reason = refusal.reason();
    let label = BackendLabel {
        backend: r.alias.clone(),
    };
    match (local, refusal) {
        (_, Refusal::Refused(m)) => Err(AnswerError::Upstream(m)),
        (Some(g), _) => {
            tracing::warn!(target: log_target::CHAT, backend = %r.alias, fallback = %g.alias, reason,
                "remote generator unavailable: answering with the local model");
            cx.metrics
                .rack
                .fallbacks
                .get_or_create(&FallbackLabel {
                    from: r.alias.clone(),
                    reason,
                })
                .inc();
            Ok(Rack::Fallback(g, reason))
        }
        (None, Refusal::Saturated { retry_after } | Refusal::Unhealthy { retry_after }) => {
            cx.metrics.rack.shed.get_or_create(&label).inc();
            Err(AnswerError::RackShed {
                retry_after,
                rung: plan.rung,
            })
        }
        (None, Refusal::Failed(m)) => Err(AnswerError::Upstream(m)),
    }
}

/// Queues the prompt on the local engine, which admits interactive requests before queued
/// batch/eval ones. Token quota: the most this request can cost is reserved; the unused part
/// is refunded when the generation ends (`Generation`'s drop).
async fn submit_local(
    cx: &Core<'_>,
    chat: &Chat,
    plan: &RungPlan,
    prepared: &mut Prepared,
    model: &str,
    generator: &Arc<Generator>,
) -> Result<Started, AnswerError> {
    let prompt_tokens = prepared.prompt.len();
    let reservation = cx
        .admission
        .reserve(cx.caller, prompt_tokens + chat.params.max_tokens)
        .map_err(|retry_after| AnswerError::OverQuota { retry_after })?;
    let queue = cx.admission.enqueue();
    let submitted = Instant::now();
    let mut stream = generator
        .engine()
        .submit_with_priority(
            GenerateRequest {
                prompt: std::mem::take(&mut prepared.prompt),
                params: chat.params.clone(),
            },
            chat.priority.engine(),
        )
        .map_err(AnswerError::Submit)?;
    tracing::event!(
        target: log_target::CHAT,
        tracing::Level::INFO,
        gen_ai.request.model = %model,
        gen_ai.usage.input_tokens = prompt_tokens,
        airlock.rung = plan.rung,
        airlock.priority = chat.priority.as_str(),
        airlock.citations = prepared.citations.len(),
        "generation queued"
    );
    let mut queue = Some(queue);
    let mut admitted_at = None;
    let first = match plan.queue_deadline {
        Some(deadline) => {
            let until = tokio::time::Instant::from_std(submitted + deadline);
            match first_output(&mut stream, until, &mut queue, &mut admitted_at).await {
                Some(first) => first,
                None => {
                    // Nothing was generated: the reservation goes back in full.
                    reservation.settle(0);
                    return Err(AnswerError::QueueDeadline { rung: plan.rung });
                }
            }
        }
        None => None,
    };
    Ok(Started {
        source: Source::Local {
            stream,
            engine: generator.engine().counters(),
        },
        reservation,
        prompt_tokens,
        first,
        queue,
        admitted_at,
        submitted,
        fallback: None,
    })
}

/// Rung 4: a bounded wait for the first output (token or end); `None` past `until`. The
/// engine's admission event on the way ends the queue wait but not the deadline.
async fn first_output(
    stream: &mut Stream,
    until: tokio::time::Instant,
    queue: &mut Option<QueueSlot>,
    admitted_at: &mut Option<Instant>,
) -> Option<Option<GenEvent>> {
    loop {
        match tokio::time::timeout_at(until, stream.recv()).await {
            Ok(Some(GenEvent::Admitted { .. })) => {
                *admitted_at = Some(Instant::now());
                *queue = None;
            }
            Ok(ev) => return Some(ev),
            Err(_) => return None,
        }
    }
}
