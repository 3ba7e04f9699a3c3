//! Everything decided before generation starts: the follow-up rewrite, retrieval with the
//! caller's `AllowSet` and the pre-prompt re-check (`AnswerPath::run`), the citations and the
//! versions they were read at, and the prompt with its digest. Blocking work runs on the
//! blocking pool.

use std::sync::Arc;
use std::time::Instant;

use airlock_evidence::receipts::DocRef;
use airlock_rag::{Ask, Attribution, FollowUps, Purpose, Role, StageTimings, prompt};

use super::{AnswerMetrics, Citation};
use crate::admission::RungPlan;
use crate::services::Services;

use super::target::Target;
use super::{AnswerError, Chat, Core, Settings, blocking, receipt};

/// Longest citation snippet, in bytes.
pub const CITATION_SNIPPET_BYTES: usize = 300;

/// Everything decided before generation starts.
pub(crate) struct Prepared {
    pub(crate) target: Target,
    /// The local generator's prompt token ids (empty for a remote generator).
    pub(crate) prompt: Vec<u32>,
    /// The final prompt as messages (system prompt, re-checked sources, question): what a
    /// remote generator is sent.
    pub(crate) messages: Vec<(Role, String)>,
    /// The version of each citation's document (only when the turn is kept in a thread).
    pub(crate) versions: Vec<String>,
    pub(crate) citations: Vec<Citation>,
    /// The question and the sources' texts, to find which sources the answer used.
    pub(crate) cite: Option<Attribution>,
    pub(crate) retrieval: Option<StageTimings>,
    pub(crate) sources_ms: f64,
    pub(crate) prompt_ms: f64,
    /// `sha256:<hex>` of the exact prompt the generator is given (the receipt's).
    pub(crate) prompt_sha256: String,
    /// The sources shown, with their versions (the receipt's `shown`).
    pub(crate) shown: Vec<DocRef>,
    /// The index generation searched and the ACL state, when the sources were chosen.
    pub(crate) index_generation: u64,
    pub(crate) acl_state_seq: i64,
}

/// The citations of the prompt sources, numbered in prompt order, with their anchors.
/// Each excerpt is cut around the passage that best matches the question (the answer does not
/// exist yet; a finished answer's passages replace them).
fn citations_of(shown: &airlock_rag::Shown) -> Vec<Citation> {
    let question = shown.stand_alone.as_deref().unwrap_or(&shown.query);
    shown
        .chunks
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let excerpt = airlock_rag::passage::excerpt(&c.text, question, CITATION_SNIPPET_BYTES);
            Citation {
                n: i + 1,
                doc_id: c.doc_id.clone(),
                chunk_id: c.chunk_id,
                title: c.title.clone(),
                snippet: excerpt.snippet,
                passage: excerpt.passage,
                score: c.score,
                anchor: shown.anchors.get(&c.chunk_id).cloned(),
            }
        })
        .collect()
}

/// What the retrieval brings to the prompt.
struct Sources {
    built: Vec<(Role, String)>,
    citations: Vec<Citation>,
    versions: Vec<String>,
    retrieval: Option<StageTimings>,
    attribution: Option<Attribution>,
    sources_ms: f64,
}

/// What [`retrieve`] searches for whom.
struct Search {
    services: Arc<Services>,
    metrics: AnswerMetrics,
    user: String,
    request_id: String,
    k: usize,
    plan: RungPlan,
    settings: Settings,
}

/// The follow-up rewrite (on the request's model when it is local, else on the default local
/// one: a rack alias's retrieval query is still made on the appliance), then the prompt.
/// Also the milliseconds the rewrite took.
pub(crate) async fn prepare(
    cx: &Core<'_>,
    plan: RungPlan,
    target: Target,
    conversation: Vec<(Role, String)>,
    chat: &Chat,
) -> Result<(Prepared, Option<f64>), AnswerError> {
    let services = cx.services;
    let k = plan
        .max_prompt_chunks
        .map_or(chat.top_k, |cap| chat.top_k.min(cap));
    let rewriter = match &target {
        Target::Local(g) => Some(g.clone()),
        Target::Remote(_) => services.default_generator().cloned(),
    };
    let rewrite = match (&rewriter, chat.retrieval) {
        (Some(g), true) => {
            super::rewrite::rewritten(cx.settings.follow_ups, g, &conversation, chat.priority)
                .await?
        }
        _ => None,
    };
    let rewrite_ms = rewrite.as_ref().map(|(_, ms)| *ms);
    let search = Search {
        services: services.clone(),
        metrics: cx.metrics.clone(),
        user: cx.caller.user_id.clone(),
        request_id: chat.request_id.clone(),
        k,
        plan,
        settings: cx.settings,
    };
    let retrieval = chat.retrieval;
    let prepared = blocking(move || {
        let sources = if retrieval {
            retrieve(&search, &conversation, rewrite.map(|(one, _)| one))?
        } else {
            Sources {
                built: prompt::build(&conversation, None),
                citations: Vec::new(),
                versions: Vec::new(),
                retrieval: None,
                attribution: None,
                sources_ms: 0.0,
            }
        };
        build(&search.services, target, sources)
    })
    .await?;
    Ok((prepared, rewrite_ms))
}

/// Retrieval, re-check and source selection (`AnswerPath::run`, which audits what is shown),
/// and the versions of the chunks shown. A generator's rewrite is searched as it stands
/// (`Last`); the prompt keeps the conversation as the user wrote it.
fn retrieve(
    s: &Search,
    conversation: &[(Role, String)],
    rewrite: Option<Vec<(Role, String)>>,
) -> Result<Sources, AnswerError> {
    let (searched, follow_ups) = match &rewrite {
        Some(one) => (one.as_slice(), FollowUps::Last),
        None => (conversation, s.settings.follow_ups),
    };
    let shown = s.services.answer_path.run(
        &Ask {
            user_id: &s.user,
            request_id: &s.request_id,
            conversation: searched,
            k: s.k,
            mode: s.services.default_mode(),
            rerank: s.plan.rerank,
            time_quantum: s.settings.time_quantum,
            follow_ups,
            purpose: Purpose::Chat(s.settings.selection),
        },
        s.metrics.meter.as_ref(),
    )?;
    let citations = citations_of(&shown);
    // The versions shown, those of the chunks themselves (a document replaced since the
    // search has another): kept with a thread's turn and named in the receipt. A chunk gone
    // meanwhile has none ("": no document version matches).
    let chunk_ids: Vec<u32> = citations.iter().map(|c| c.chunk_id).collect();
    let mut of_chunk = s.services.retrieval.chunk_versions(&chunk_ids)?;
    let versions = citations
        .iter()
        .map(|c| of_chunk.remove(&c.chunk_id).unwrap_or_default())
        .collect();
    Ok(Sources {
        built: shown.prompt(conversation),
        citations,
        versions,
        retrieval: Some(shown.timings.clone()),
        attribution: Some(shown.attribution()),
        sources_ms: shown.selection_ms,
    })
}

/// The prompt for `target` with its digest, and what the receipt names: the sources shown
/// with their versions, the index generation and the ACL state.
fn build(services: &Services, target: Target, s: Sources) -> Result<Prepared, AnswerError> {
    let index_generation = services.retrieval.stats().index_generation;
    let acl_state_seq = services.acl.state_seq();
    let shown: Vec<DocRef> = s
        .citations
        .iter()
        .zip(&s.versions)
        .map(|(c, v)| DocRef {
            n: c.n,
            doc_id: c.doc_id.clone(),
            version: (!v.is_empty()).then(|| v.clone()),
            chunk_id: c.chunk_id,
        })
        .collect();
    let tp = Instant::now();
    let (prompt, prompt_sha256) = match &target {
        Target::Local(g) => g.prompt_with_digest(&s.built)?,
        Target::Remote(_) => (Vec::new(), receipt::messages_digest(&s.built)),
    };
    Ok(Prepared {
        target,
        prompt,
        messages: s.built,
        versions: s.versions,
        citations: s.citations,
        cite: s.attribution,
        retrieval: s.retrieval,
        sources_ms: s.sources_ms,
        prompt_ms: tp.elapsed().as_secs_f64() * 1e3,
        prompt_sha256,
        shown,
        index_generation,
        acl_state_seq,
    })
}
