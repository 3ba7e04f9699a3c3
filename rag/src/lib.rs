//! `airlock-rag`: the answer path (DESIGN.md §4), one entry point for `/v1/chat/completions` and
//! `/v1/retrieve`. From a conversation and a caller it builds the retrieval query, retrieves
//! through `airlock-retrieval` with the caller's allow set, re-checks every chunk against the
//! current ACL just before it is shown, audits what is shown, chooses a chat's prompt sources
//! (similarity floor, names, focus, facets), builds the prompt and, once the answer exists,
//! finds the sources it used.
//!
//! It depends on `airlock-acl` and `airlock-retrieval` only: models come in through
//! retrieval's [`Embed`] seam, metrics through [`Meter`], and HTTP stays in the appliance.
//! Every function here is blocking: run it on a blocking pool.
#![warn(missing_docs)]

pub mod asked;
pub mod cite;
pub mod facets;
pub mod focus;
pub mod passage;
pub mod prompt;
pub mod query;
pub mod retrieve;
mod select;
pub mod terms;

use std::sync::Arc;
use std::time::{Duration, Instant};

use airlock_acl::Acl;
use airlock_retrieval::{Embed, Retrieval, SearchMode, SearchResult};

pub use cite::{Cited, CitedBy};
pub use prompt::{Role, Source};
pub use query::FollowUps;
pub use retrieve::{RetrieveParams, Retrieved, StageTimings};

/// What can go wrong on the answer path.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Retrieval failed.
    #[error(transparent)]
    Retrieval(#[from] airlock_retrieval::Error),
    /// The ACL (or its audit log) failed.
    #[error(transparent)]
    Acl(#[from] airlock_acl::Error),
}

/// The answer path's counters (the appliance maps them onto its Prometheus metrics).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Count {
    /// Chunks dropped by the pre-prompt re-check.
    RecheckDrops,
    /// Chunks under the similarity floor.
    BelowFloor,
    /// Questions whose names no retrieved source holds.
    UnmatchedNames,
    /// Questions (or facets) naming a term of art the caller's readable documents never
    /// mention ([`terms`]).
    UnknownTerms,
    /// Chunks set aside by source focus.
    OutOfFocus,
    /// Sentences embedded for semantic focus.
    FocusSentences,
    /// Questions retrieved once per facet.
    FacetQuestions,
}

/// Where the answer path reports what it did.
pub trait Meter {
    /// Adds `n` to a counter.
    fn count(&self, what: Count, n: u64);
    /// Records one retrieval stage's duration.
    fn stage(&self, stage: &'static str, seconds: f64);
}

/// A [`Meter`] that records nothing.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoMeter;

impl Meter for NoMeter {
    fn count(&self, _: Count, _: u64) {}
    fn stage(&self, _: &'static str, _: f64) {}
}

/// How a chat chooses its prompt sources (docs/operations/answer-sources.md).
#[derive(Debug, Clone, Copy)]
pub struct Selection {
    /// `min_source_similarity`: chunks whose rescored similarity is below it go.
    pub floor: f32,
    /// `abstain_on_unmatched_names`.
    pub check_names: bool,
    /// `abstain_on_unknown_terms`: no prompt source when the question names a term of art
    /// ([`terms`]) that no document the caller may read mentions.
    pub check_terms: bool,
    /// `source_focus` (0: off).
    pub focus: f32,
    /// `source_focus_near_copy`: focus sets a document aside only when its retrieved chunks
    /// share at least this share of content words with a document it keeps (0: any).
    pub near_copy: f32,
    /// `semantic_focus` (with the embedder; full pipeline only).
    pub semantic: bool,
    /// `facet_retrieval`: a two-subject question is retrieved once per subject.
    pub facets: bool,
}

/// Why the answer path runs.
#[derive(Debug, Clone, Copy)]
pub enum Purpose {
    /// `/v1/retrieve`: the re-checked results, best first.
    Retrieve,
    /// A chat answer: the prompt sources chosen by the selection.
    Chat(Selection),
}

/// One run of the answer path.
#[derive(Debug, Clone)]
pub struct Ask<'a> {
    /// The caller.
    pub user_id: &'a str,
    /// The request id (audit key).
    pub request_id: &'a str,
    /// The conversation so far, the question last (`/v1/retrieve`: one user message).
    pub conversation: &'a [(Role, String)],
    /// Chunks wanted.
    pub k: usize,
    /// Retrievers.
    pub mode: SearchMode,
    /// Cross-encoder rerank (the rung allows it and one is installed).
    pub rerank: bool,
    /// Each retrieval ends on a multiple of this (zero: at once).
    pub time_quantum: Duration,
    /// How the conversation becomes the retrieval query.
    pub follow_ups: FollowUps,
    /// Chat or retrieve.
    pub purpose: Purpose,
}

/// What the answer path chose to show.
#[derive(Debug)]
pub struct Shown {
    /// The retrieval query built from the conversation.
    pub query: String,
    /// A follow-up resolved into a stand-alone question by [`FollowUps::Carry`]: the prompt
    /// asks it instead of the elliptical last message, without the earlier turns (the
    /// "condensed question" design: the small generator otherwise answers the previous turn's
    /// question again, or copies its figure from the earlier answer). `None` when the last
    /// message stood alone.
    pub stand_alone: Option<String>,
    /// The chunks shown (retrieve: best first; chat: the prompt sources in prompt order,
    /// source `n` is `chunks[n - 1]`). Each passed the re-check and is audited as shown.
    pub chunks: Vec<SearchResult>,
    /// Chunks the re-check dropped.
    pub dropped: usize,
    /// Retrieval stage timings (summed over facets).
    pub timings: StageTimings,
    /// Milliseconds spent choosing prompt sources.
    pub selection_ms: f64,
    /// Where each shown chunk of an extracted file comes from (page, sheet + rows, slide,
    /// heading path), by chunk id; read for the caller's documents only.
    pub anchors: std::collections::HashMap<u32, airlock_retrieval::ingest::Anchor>,
}

impl Shown {
    /// The prompt for `conversation` with these chunks as its sources.
    pub fn prompt(&self, conversation: &[(Role, String)]) -> Vec<(Role, String)> {
        let condensed: Vec<(Role, String)>;
        let conversation = match &self.stand_alone {
            Some(q) => {
                condensed = conversation
                    .iter()
                    .filter(|(r, _)| *r == Role::System)
                    .cloned()
                    .chain(std::iter::once((Role::User, q.clone())))
                    .collect();
                &condensed[..]
            }
            None => conversation,
        };
        let sources: Vec<Source<'_>> = self
            .chunks
            .iter()
            .map(|c| Source {
                title: &c.title,
                text: &c.text,
            })
            .collect();
        prompt::build(conversation, Some(&sources))
    }

    /// What attribution needs once the answer is complete.
    pub fn attribution(&self) -> Attribution {
        Attribution {
            question: self.query.clone(),
            sources: self.chunks.iter().map(|c| c.text.clone()).collect(),
        }
    }
}

/// The longest quote [`Attribution::quote`] gives (bytes; a sentence or a table row).
pub const QUOTE_BYTES: usize = 320;

/// The question and the sources' texts, kept until the answer is complete to find which
/// sources it used ([`cite::cited`]).
#[derive(Debug, Clone)]
pub struct Attribution {
    question: String,
    sources: Vec<String>,
}

impl Attribution {
    /// The sources' texts, in prompt order (source `[n]` is element `n - 1`).
    pub fn sources(&self) -> &[String] {
        &self.sources
    }

    /// The sources `answer` used.
    pub fn cited(&self, answer: &str) -> Cited {
        let sources: Vec<&str> = self.sources.iter().map(String::as_str).collect();
        cite::cited(answer, &self.question, &sources)
    }

    /// The excerpts of the `cited` sources (1-based numbers) around the sentences that
    /// support `answer`, in at most `max` bytes each: `(n, excerpt)` for each cited source
    /// with a passage ([`passage::excerpt`]).
    pub fn passages(
        &self,
        answer: &str,
        cited: &[usize],
        max: usize,
    ) -> Vec<(usize, passage::Excerpt)> {
        cited
            .iter()
            .filter_map(|&n| {
                let text = self.sources.get(n.checked_sub(1)?)?;
                let e = passage::excerpt(text, answer, max);
                e.passage.is_some().then_some((n, e))
            })
            .collect()
    }

    /// The sentence (or table row) of the first cited source that best matches the question
    /// and the answer together ([`passage::excerpt`]), for the answer to quote after itself:
    /// `(n, quote)`. `None` when no cited source has such a passage, when the passage is a
    /// heading, or when the answer already holds every content word of it.
    ///
    /// A small model often names the right page but states the value loosely or not at all;
    /// the quote puts the source's own words (the option, the default, the path) beside the
    /// answer. It reads only the cited source's text, the question and the answer.
    pub fn quote(&self, answer: &str, cited: &[usize]) -> Option<(usize, String)> {
        let &n = cited.first()?;
        let text = self.sources.get(n.checked_sub(1)?)?;
        let target = format!("{} {answer}", self.question);
        let passage = passage::excerpt(text, &target, QUOTE_BYTES).passage?;
        let quote = passage.split_whitespace().collect::<Vec<_>>().join(" ");
        if quote.starts_with('#') || quote.is_empty() {
            return None;
        }
        let said: std::collections::HashSet<String> = cite::content_words(answer).collect();
        if cite::content_words(&quote).all(|w| said.contains(&w)) {
            return None;
        }
        Some((n, quote))
    }
}

/// A document as it stands now for one user ([`AnswerPath::documents_now`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DocNow {
    /// The user may read it now (live and granted).
    pub readable: bool,
    /// Its current version (content hash); `None` when it is not stored.
    pub version: Option<String>,
}

/// The answer path over one appliance's ACL, documents and embedder.
#[derive(Clone)]
pub struct AnswerPath {
    acl: Arc<Acl>,
    retrieval: Arc<Retrieval>,
    embedder: Arc<dyn Embed>,
}

impl std::fmt::Debug for AnswerPath {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AnswerPath").finish_non_exhaustive()
    }
}

impl AnswerPath {
    /// The answer path over these services.
    pub fn new(acl: Arc<Acl>, retrieval: Arc<Retrieval>, embedder: Arc<dyn Embed>) -> Self {
        AnswerPath {
            acl,
            retrieval,
            embedder,
        }
    }

    /// Each of `doc_ids` as it stands now for `user_id` (one store lookup per document):
    /// readable when it is live (not deleted or purged) and the current ACL grants it, and its
    /// current version. What history may show is decided here, like what a new answer may
    /// show. Blocking.
    pub fn documents_now(&self, user_id: &str, doc_ids: &[&str]) -> Result<Vec<DocNow>, Error> {
        let allow = self.acl.allow_set(user_id);
        doc_ids
            .iter()
            .map(|d| {
                Ok(match self.retrieval.document(d)? {
                    Some(info) => DocNow {
                        readable: info.deleted_at_ms.is_none() && allow.contains(info.ordinal),
                        version: Some(info.version),
                    },
                    None => DocNow::default(),
                })
            })
            .collect()
    }

    /// Retrieves for the conversation's question as the caller, re-checks, chooses what to
    /// show and audits it. Blocking.
    pub fn run(&self, ask: &Ask<'_>, meter: &dyn Meter) -> Result<Shown, Error> {
        let query = query::retrieval_query(ask.conversation, ask.follow_ups);
        let stand_alone = (ask.follow_ups == FollowUps::Carry
            && prompt::last_user_text(ask.conversation).is_some_and(|last| last != query))
        .then(|| query.clone());
        let mut shown = match ask.purpose {
            Purpose::Retrieve => {
                let r = self.retrieve(ask, &query, meter)?;
                Shown {
                    query,
                    stand_alone: None,
                    chunks: r.chunks,
                    dropped: r.dropped,
                    timings: r.timings,
                    selection_ms: 0.0,
                    anchors: Default::default(),
                }
            }
            Purpose::Chat(sel) => self.chat_sources(ask, query, sel, meter)?,
        };
        shown.stand_alone = stand_alone;
        if !shown.chunks.is_empty() {
            let mut ids: Vec<&str> = shown.chunks.iter().map(|c| c.doc_id.as_str()).collect();
            ids.sort_unstable();
            ids.dedup();
            self.acl.audit_shown(ask.request_id, ask.user_id, &ids)?;
            let chunk_ids: Vec<u32> = shown.chunks.iter().map(|c| c.chunk_id).collect();
            let allow = self.acl.allow_set(ask.user_id);
            shown.anchors = self.retrieval.chunk_anchors(&chunk_ids, &allow)?;
        }
        Ok(shown)
    }

    fn retrieve(&self, ask: &Ask<'_>, query: &str, meter: &dyn Meter) -> Result<Retrieved, Error> {
        retrieve::retrieve(
            &self.acl,
            &self.retrieval,
            meter,
            &RetrieveParams {
                user_id: ask.user_id,
                request_id: ask.request_id,
                query,
                k: ask.k,
                mode: ask.mode,
                rerank: ask.rerank,
                time_quantum: ask.time_quantum,
            },
        )
    }

    /// Whether `question` names a term of art ([`terms`]) that no document the caller may read
    /// mentions. The embedder's tokenizer tells rare words; the BM25 index, over the caller's
    /// readable chunks only, whether the corpus holds them.
    fn names_unknown_term(&self, ask: &Ask<'_>, question: &str) -> Result<bool, Error> {
        let found = terms::terms_of_art(question, |w| {
            self.embedder.token_spans(w).ok().map(|s| s.len())
        });
        if found.is_empty() {
            return Ok(false);
        }
        let mut spellings: Vec<String> = found
            .iter()
            .flat_map(|t| terms::pieces_of(t))
            .flat_map(|p| terms::spellings(&p))
            .collect();
        spellings.sort_unstable();
        spellings.dedup();
        let words: Vec<&str> = spellings.iter().map(String::as_str).collect();
        let allow = self.acl.allow_set(ask.user_id);
        let mentioned = self.retrieval.mentions(&words, &allow)?;
        let known: std::collections::HashMap<&str, Option<bool>> =
            words.iter().copied().zip(mentioned).collect();
        let unknown = terms::unknown(&found, |w| known.get(w).copied().flatten());
        Ok(!unknown.is_empty())
    }

    /// A chat's prompt sources: a question about two subjects is retrieved and focused once
    /// per subject, the lists then taken in turn.
    fn chat_sources(
        &self,
        ask: &Ask<'_>,
        query: String,
        sel: Selection,
        meter: &dyn Meter,
    ) -> Result<Shown, Error> {
        let facets = sel.facets.then(|| facets::facets(&query)).flatten();
        if facets.is_some() {
            meter.count(Count::FacetQuestions, 1);
        }
        let questions: Vec<&str> = match &facets {
            Some(f) => f.iter().map(String::as_str).collect(),
            None => vec![query.as_str()],
        };
        let mut per_question = Vec::with_capacity(questions.len());
        let mut timings: Option<StageTimings> = None;
        let mut dropped = 0;
        let mut selection_ms = 0.0;
        for q in questions {
            let mut retrieved = self.retrieve(ask, q, meter)?;
            let ts = Instant::now();
            select::keep_prompt_sources(
                &mut retrieved.chunks,
                q,
                select::SourceSelection {
                    floor: sel.floor,
                    check_names: sel.check_names,
                    focus: sel.focus,
                    near_copy: sel.near_copy,
                    embedder: (sel.semantic && ask.rerank).then_some(self.embedder.as_ref()),
                },
                meter,
            );
            if sel.check_terms && !retrieved.chunks.is_empty() && self.names_unknown_term(ask, q)? {
                meter.count(Count::UnknownTerms, 1);
                retrieved.chunks.clear();
            }
            selection_ms += ts.elapsed().as_secs_f64() * 1e3;
            dropped += retrieved.dropped;
            match &mut timings {
                Some(t) => t.add(&retrieved.timings),
                None => timings = Some(retrieved.timings),
            }
            per_question.push(retrieved.chunks);
        }
        let chunks = select::interleave(per_question, ask.k);
        Ok(Shown {
            query,
            stand_alone: None,
            chunks,
            dropped,
            timings: timings.unwrap_or_default(),
            selection_ms,
            anchors: Default::default(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shown(query: &str, stand_alone: Option<&str>) -> Shown {
        Shown {
            query: query.to_string(),
            stand_alone: stand_alone.map(str::to_string),
            chunks: Vec::new(),
            dropped: 0,
            timings: StageTimings::default(),
            selection_ms: 0.0,
            anchors: Default::default(),
        }
    }

    fn conversation() -> Vec<(Role, String)> {
        vec![
            (Role::System, "Answer in English.".to_string()),
            (
                Role::User,
                "What is the break fee in Project Fomalhaut?".to_string(),
            ),
            (
                Role::Assistant,
                "The break fee is USD 2,350,000 [1].".to_string(),
            ),
            (Role::User, "And the exclusivity period?".to_string()),
        ]
    }

    #[test]
    fn a_resolved_follow_up_is_asked_stand_alone_without_the_earlier_turns() {
        let q = "And the exclusivity period? Project Fomalhaut";
        let p = shown(q, Some(q)).prompt(&conversation());
        assert_eq!(p.len(), 2, "system and one user turn: {p:?}");
        assert_eq!(p[0].0, Role::System);
        assert!(p[0].1.ends_with("Answer in English."), "client system kept");
        assert_eq!(p[1].0, Role::User);
        assert!(p[1].1.ends_with(&format!("Question: {q}")), "{}", p[1].1);
        assert!(!p.iter().any(|(_, t)| t.contains("2,350,000")));
    }

    #[test]
    fn the_quote_is_the_cited_sentence_that_holds_what_was_asked() {
        let a = Attribution {
            question: "Which apt option reinstalls a damaged package?".into(),
            sources: vec![
                "## 6.2. apt-get\nThe other sentence.".into(),
                "APT is a vast project. To put back a damaged package, run apt install \
                 --reinstall package. Other tools exist."
                    .into(),
            ],
        };
        let (n, q) = a.quote("Use apt with an option [2].", &[2]).unwrap();
        assert_eq!(n, 2);
        assert_eq!(
            q,
            "To put back a damaged package, run apt install --reinstall package."
        );
        // Nothing to add when the answer says it all; no cited source, no quote.
        let said = "To put back a damaged package, run apt install --reinstall package [2].";
        assert_eq!(a.quote(said, &[2]), None);
        assert_eq!(a.quote("Use apt.", &[]), None);
    }

    #[test]
    fn a_question_that_stood_alone_keeps_the_conversation() {
        let p = shown("And the exclusivity period?", None).prompt(&conversation());
        assert_eq!(p.len(), 4, "{p:?}");
        assert!(p[3].1.ends_with("Question: And the exclusivity period?"));
    }
}
