//! The answer core: what a chat answer is, apart from how it travels. Given the caller, its
//! admission ticket and the conversation, [`answer`] runs the answer path of DESIGN.md §4: the
//! history of a server-kept thread (`history`), the generator (`target`), the follow-up
//! rewrite (`rewrite`), retrieval with the caller's `AllowSet`, the pre-prompt re-check and the
//! prompt (`prepare`), the abstention when no readable source is relevant, the receipt
//! (`receipt`: no receipt, no answer), the completion record, and the start of the generation
//! on the rack or the local engine (`start`); the [`Generation`] it hands back yields the
//! engine's events, keeps the ticket, the quota and the metrics, and completes the receipt and
//! the thread's turn.
//!
//! It must not know HTTP: no axum or hyper type, no status or problem type (failures are
//! [`AnswerError`], mapped to the error table by the route in one place), no wire framing
//! (the route turns a [`Generation`] into a `chat.completion` or an SSE stream), and not the
//! root `Config` (the route passes [`Settings`]).

use std::sync::Arc;
use std::time::{Duration, Instant};

use airlock_identity::caller::Caller;
use airlock_inference::generate::SamplingParams;
use airlock_rag::{Attribution, FollowUps, Role, Selection, prompt};

use crate::admission::{Admission, Priority, Ticket};
use crate::services::Services;

mod error;
mod generation;
mod history;
mod meters;
mod prepare;
mod receipt;
pub mod rewrite;
mod shown;
mod start;
mod target;

pub use error::AnswerError;
use error::blocking;
pub use generation::{Generation, finish_reason};
pub use history::{History, history, withheld_now};
pub use meters::AnswerMetrics;
pub use prepare::CITATION_SNIPPET_BYTES;
pub use receipt::Closer;
pub use shown::{Citation, Timings};

use history::TurnRecorder;
use prepare::Prepared;

/// Log targets of the events the answer core took over from the chat route: the lines and an
/// operator's `AIRLOCK_LOG` filters stay as they were.
pub mod log_target {
    /// The chat handler's events.
    pub const CHAT: &str = "airlock::routes::chat";
    /// A generation's events.
    pub const STREAM: &str = "airlock::routes::chat::stream";
    /// Receipt failures.
    pub const RECEIPT: &str = "airlock::routes::chat::receipt";
    /// Thread turns not kept.
    pub const THREAD: &str = "airlock::routes::chat::thread";
}

/// What the answer core takes from the configuration, for this caller.
#[derive(Clone, Copy)]
pub struct Settings {
    /// How prompt sources are chosen (docs/operations/answer-sources.md).
    pub selection: Selection,
    /// How a follow-up becomes the retrieval query.
    pub follow_ups: FollowUps,
    /// The retrieval time quantum for this caller.
    pub time_quantum: Duration,
    /// Whether this caller is shown stage timings.
    pub stage_timings: bool,
    /// How long a generation may make no progress before it is ended.
    pub idle_timeout: Duration,
}

/// The appliance's parts an answer runs on, and who asks.
pub struct Core<'a> {
    /// The services answered from.
    pub services: &'a Arc<Services>,
    /// What the answer counts.
    pub metrics: &'a AnswerMetrics,
    /// The gate the request passed (its queue and the ladder).
    pub admission: &'a Admission,
    /// Who asks.
    pub caller: &'a Caller,
    /// What the configuration says for this caller.
    pub settings: Settings,
}

/// A chat request, validated.
pub struct Chat {
    /// The request's id (logs, the audit, the completion record).
    pub request_id: String,
    /// The client's messages (the thread's history goes before them).
    pub messages: Vec<(Role, String)>,
    /// The model named, if any.
    pub model: Option<String>,
    /// How to sample.
    pub params: SamplingParams,
    /// Whether the answer is grounded in retrieved sources.
    pub retrieval: bool,
    /// How many chunks retrieval returns.
    pub top_k: usize,
    /// The server-kept thread, also the rack's session affinity.
    pub conversation_id: Option<String>,
    /// The answer is wanted whole (not streamed): the rack is asked for one response.
    pub whole: bool,
    /// Interactive or batch.
    pub priority: Priority,
    /// When the request arrived (after authentication).
    pub t0: Instant,
}

/// An answer: its model, rung, receipt and stage timings so far, and how it is given.
pub struct Answer {
    /// The alias of the model answering (the response's `model`).
    pub model: String,
    /// The rung the request was admitted at.
    pub rung: u8,
    /// The answer's receipt.
    pub receipt_id: String,
    /// Stage timings so far (admins, or every caller where configured); a generation's are
    /// filled in when it ends.
    pub timings: Option<Timings>,
    /// How it is given.
    pub given: Given,
}

/// How an answer is given.
pub enum Given {
    /// No chunk the caller may read passed the similarity floor: the system prompt's own
    /// abstention ([`prompt::NO_SOURCE_ANSWER`]), without generation, already recorded with
    /// its receipt. The ticket is held until the response is built.
    NoSource {
        /// The admission ticket.
        ticket: Ticket,
    },
    /// A generation in flight.
    Generated(Box<Generated>),
}

/// A generation in flight, with what the response says about it.
pub struct Generated {
    /// The generation's events.
    pub generation: Generation,
    /// The sources in the prompt.
    pub citations: Vec<Citation>,
    /// The question and the sources' texts, to find which sources the answer used.
    pub cite: Option<Attribution>,
    /// Why the rack handed the request to the local model, if it did.
    pub fallback: Option<&'static str>,
}

/// Answers `chat` for the caller admitted with `ticket`, from `history` (see [`history`]).
pub async fn answer(
    cx: &Core<'_>,
    ticket: Ticket,
    history: History,
    mut chat: Chat,
) -> Result<Answer, AnswerError> {
    let plan = ticket.plan;
    let target = target::pick_generator(cx.services, chat.model.as_deref(), plan.small_model)?;
    let mut model = target.alias().to_string();
    let mut conversation: Vec<(Role, String)> = history.turns;
    conversation.append(&mut chat.messages);
    let question = prompt::last_user_text(&conversation)
        .unwrap_or_default()
        .to_string();
    let (mut prepared, rewrite_ms) =
        prepare::prepare(cx, plan, target, conversation, &chat).await?;
    let receipt_id = airlock_evidence::receipts::new_id();
    let recorder = history.thread.map(|(store, thread)| TurnRecorder {
        store,
        thread,
        user: cx.caller.user_id.clone(),
        question,
        request_id: chat.request_id.clone(),
        parents: history.parents,
        sources: prepared
            .citations
            .iter()
            .zip(&prepared.versions)
            .map(|(c, v)| (c.doc_id.clone(), v.clone()))
            .collect(),
    });
    let timings = cx.settings.stage_timings.then(|| Timings {
        retrieval: prepared.retrieval.take(),
        query_rewrite: rewrite_ms,
        sources: prepared.sources_ms,
        prompt: prepared.prompt_ms,
        ..Timings::default()
    });
    if chat.retrieval && prepared.citations.is_empty() {
        abstain(
            cx,
            &chat,
            &receipt_id,
            &prepared,
            &model,
            plan.rung,
            recorder,
        )
        .await?;
        let given = Given::NoSource { ticket };
        return Ok(Answer {
            model,
            rung: plan.rung,
            receipt_id,
            timings,
            given,
        });
    }
    let started = start::start(cx, &chat, &plan, &mut prepared, &mut model).await?;
    // The completion is served from here on: record it (id, user, model, rung, bundle; never
    // text) before its id reaches the client, so the user can rate it, even if stopped early;
    // then its receipt, before the answer's first byte: no receipt, no answer.
    let served = receipt::served(cx.services, &receipt_id, &prepared, false);
    let closer = match open_records(cx, &chat, &served, &model, plan.rung).await {
        Ok(closer) => closer,
        Err(e) => {
            started.reservation.settle(0);
            return Err(e);
        }
    };
    let fallback = started.fallback;
    let generation = generation(cx, &chat, ticket, started, &model, recorder, closer);
    let given = Given::Generated(Box::new(Generated {
        generation,
        citations: prepared.citations,
        cite: prepared.cite,
        fallback,
    }));
    Ok(Answer {
        model,
        rung: plan.rung,
        receipt_id,
        timings,
        given,
    })
}

/// The abstention: its receipt (complete in one entry) before anything is answered, the
/// thread's turn, and the completion record. Given no source, a small model invents an answer
/// or loops on "[1] [2] …", so the model is not run.
async fn abstain(
    cx: &Core<'_>,
    chat: &Chat,
    receipt_id: &str,
    prepared: &Prepared,
    model: &str,
    rung: u8,
    recorder: Option<TurnRecorder>,
) -> Result<(), AnswerError> {
    let served = receipt::served(cx.services, receipt_id, prepared, true);
    receipt::open(
        &cx.services.acl,
        &chat.request_id,
        &cx.caller.user_id,
        &served,
    )
    .await?;
    if let Some(r) = recorder {
        r.save(prompt::NO_SOURCE_ANSWER.to_string(), &[]);
    }
    cx.metrics.no_source_answers.inc();
    tracing::event!(
        target: log_target::CHAT,
        tracing::Level::INFO,
        airlock.rung = rung,
        "no readable source: answered without generation"
    );
    record(
        cx.services,
        &chat.request_id,
        &cx.caller.user_id,
        model,
        rung,
    )
    .await
}

/// The completion record, then the receipt's `served` entry; the closer of the receipt.
async fn open_records(
    cx: &Core<'_>,
    chat: &Chat,
    served: &airlock_evidence::receipts::Served,
    model: &str,
    rung: u8,
) -> Result<Closer, AnswerError> {
    let user = &cx.caller.user_id;
    record(cx.services, &chat.request_id, user, model, rung).await?;
    receipt::open(&cx.services.acl, &chat.request_id, user, served).await?;
    Ok(Closer {
        acl: cx.services.acl.clone(),
        receipt_id: served.receipt_id.clone(),
        request_id: chat.request_id.clone(),
        user_id: user.clone(),
    })
}

/// The generation in flight: the started sequence with its ticket, the metrics and what
/// completes the answer (the receipt's closer, the thread's turn).
fn generation(
    cx: &Core<'_>,
    chat: &Chat,
    ticket: Ticket,
    started: start::Started,
    model: &str,
    recorder: Option<TurnRecorder>,
    closer: Closer,
) -> Generation {
    Generation {
        source: started.source,
        backend: model.to_string(),
        idle_timeout: cx.settings.idle_timeout,
        first: started.first,
        ticket,
        queue: started.queue,
        admitted_at: started.admitted_at,
        reservation: Some(started.reservation),
        prompt_tokens: started.prompt_tokens,
        used: None,
        metrics: cx.metrics.clone(),
        t0: chat.t0,
        submitted: started.submitted,
        first_token_at: None,
        tokens: 0,
        finished: false,
        recorder,
        receipt: Some(closer),
    }
}

/// Records a served completion for feedback (id, user, model, rung, bundle; never text).
pub(crate) async fn record(
    services: &Arc<Services>,
    request_id: &str,
    user_id: &str,
    model: &str,
    rung: u8,
) -> Result<(), AnswerError> {
    let Some(store) = services.feedback.clone() else {
        return Ok(());
    };
    let (rid, user, model) = (
        request_id.to_string(),
        user_id.to_string(),
        model.to_string(),
    );
    let bundle_version = services.bundle_version().to_string();
    blocking(move || {
        Ok(
            store.record_completion(&airlock_evidence::feedback::CompletionRecord {
                request_id: &rid,
                user_id: &user,
                model: &model,
                rung,
                bundle_version: &bundle_version,
            })?,
        )
    })
    .await
}
