//! The services a ready daemon holds: the ACL authority, the document store and indexes, the
//! models, and the installed bundle's identity. Built once by start-up after the bundle is
//! verified; shared read-only by every request (`Arc<Services>`).
//! The feedback store (served chat completions and answer ratings) is attached with
//! [`Services::with_feedback`]; start-up always attaches it.

use std::sync::Arc;

use airlock_acl::Acl;
use airlock_evidence::feedback::FeedbackStore;
use airlock_inference::Embedder;
use airlock_retrieval::{Retrieval, SearchMode};
use serde::Serialize;

use airlock_identity::caller::Caller;

use crate::generator::Generator;

/// Alias of the full-quality generator.
pub const LARGE: &str = "airlock-large";
/// Alias of the degraded-rung generator.
pub const SMALL: &str = "airlock-small";

/// A model as `GET /v1/models` lists it.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct ModelCard {
    /// The alias clients use (`airlock-large`, `airlock-small`, `airlock-embed`…).
    pub id: String,
    /// Always `model`.
    pub object: &'static str,
    /// Unix seconds (the bundle's creation time).
    pub created: u64,
    /// Always `airlock`.
    pub owned_by: &'static str,
    /// `generator`, `embedder` or `reranker`.
    pub role: String,
    /// The catalogue id of the model behind the alias.
    pub model: String,
}

/// Everything a request may need once the daemon is ready.
pub struct Services {
    /// The access-control authority.
    pub acl: Arc<Acl>,
    /// Documents, chunks and indexes.
    pub retrieval: Arc<Retrieval>,
    /// The sentence embedder (also used by retrieval through its `Embed` seam).
    pub embedder: Arc<Embedder>,
    /// The models clients may name.
    pub catalogue: Vec<ModelCard>,
    /// The loaded generators, by alias (catalogue order).
    pub generators: Vec<Arc<Generator>>,
    /// Served chat completions and answer feedback (`None`: nothing is recorded and every
    /// `POST /v1/feedback` is 404, as for an unknown request id).
    pub feedback: Option<Arc<FeedbackStore>>,
    /// The answer path over the ACL, the documents and the embedder (chat and retrieve).
    pub answer_path: airlock_rag::AnswerPath,
    /// Generators on the bank's inference rack (`[[remote_generators]]`), by alias.
    pub remotes: Vec<Arc<crate::remote::RemoteGenerator>>,
    /// The appliance key, which signs answer receipts (`None`: `GET /v1/receipts/{id}` is
    /// `503 not-ready`).
    pub appliance_key: Option<Arc<airlock_signing::KeyPair>>,
    /// Where uploaded files are extracted (in-process unless [`Services::with_extractor`]
    /// attaches budgeted workers; start-up always does).
    pub extractor: crate::extraction::Extractor,
    bundle_version: String,
    /// `sha256:<hex>` of the installed bundle's signed `manifest.json`.
    bundle_digest: Option<String>,
}

impl Services {
    /// Assembles the services.
    pub fn new(
        acl: Arc<Acl>,
        retrieval: Arc<Retrieval>,
        embedder: Arc<Embedder>,
        catalogue: Vec<ModelCard>,
        generators: Vec<Arc<Generator>>,
        bundle_version: String,
    ) -> Self {
        let answer_path = airlock_rag::AnswerPath::new(
            acl.clone(),
            retrieval.clone(),
            Arc::new(crate::models::EmbedAdapter(embedder.clone())),
        );
        Services {
            acl,
            retrieval,
            embedder,
            answer_path,
            catalogue,
            generators,
            feedback: None,
            remotes: Vec::new(),
            appliance_key: None,
            extractor: crate::extraction::Extractor::InProcess,
            bundle_version,
            bundle_digest: None,
        }
    }

    /// Attaches the extractor of uploaded files (`Config::extractor`: budgeted workers).
    pub fn with_extractor(mut self, extractor: crate::extraction::Extractor) -> Self {
        self.extractor = extractor;
        self
    }

    /// Attaches the appliance key (receipts are signed with it).
    pub fn with_appliance_key(mut self, key: airlock_signing::KeyPair) -> Self {
        self.appliance_key = Some(Arc::new(key));
        self
    }

    /// Records the installed bundle's manifest digest (named in every receipt).
    pub fn with_bundle_digest(mut self, digest: String) -> Self {
        self.bundle_digest = Some(digest);
        self
    }

    /// `sha256:<hex>` of the installed bundle's signed `manifest.json`, when served from one.
    pub fn bundle_digest(&self) -> Option<&str> {
        self.bundle_digest.as_deref()
    }

    /// Attaches remote generators (already checked against their upstreams): each is listed
    /// in `/v1/models` as a generator under its alias.
    pub fn with_remotes(mut self, remotes: Vec<Arc<crate::remote::RemoteGenerator>>) -> Self {
        let created = self.catalogue.first().map_or(0, |c| c.created);
        for r in &remotes {
            self.catalogue.push(ModelCard {
                id: r.alias.clone(),
                object: "model",
                created,
                owned_by: "airlock",
                role: "generator".into(),
                model: r.config.model.clone(),
            });
        }
        self.remotes = remotes;
        self
    }

    /// The remote generator serving `alias`.
    pub fn remote(&self, alias: &str) -> Option<&Arc<crate::remote::RemoteGenerator>> {
        self.remotes.iter().find(|r| r.alias == alias)
    }

    /// Attaches the feedback store: chat completions are recorded and can be rated.
    pub fn with_feedback(mut self, store: Arc<FeedbackStore>) -> Self {
        self.feedback = Some(store);
        self
    }

    /// The generator serving `alias`.
    pub fn generator(&self, alias: &str) -> Option<&Arc<Generator>> {
        self.generators.iter().find(|g| g.alias == alias)
    }

    /// The generator of requests that name no model: `airlock-large`, else the first one.
    pub fn default_generator(&self) -> Option<&Arc<Generator>> {
        self.generator(LARGE).or_else(|| self.generators.first())
    }

    /// The generator of degraded rungs: `airlock-small`, else the default one.
    pub fn small_generator(&self) -> Option<&Arc<Generator>> {
        self.generator(SMALL).or_else(|| self.default_generator())
    }

    /// The installed bundle's version.
    pub fn bundle_version(&self) -> &str {
        &self.bundle_version
    }

    /// The search mode used when a request names none: hybrid when the vector index is
    /// available, BM25 otherwise.
    pub fn default_mode(&self) -> SearchMode {
        if self.retrieval.stats().vector_index {
            SearchMode::Hybrid
        } else {
            SearchMode::Bm25
        }
    }

    /// Resolves a bearer token (no I/O here: its last use is written back at most once a
    /// minute, on the blocking pool).
    pub fn authenticate(&self, token: &str) -> Option<Caller> {
        let p = self.acl.authenticate(token)?;
        if self.acl.note_token_use(&p.user_id)
            && let Ok(rt) = tokio::runtime::Handle::try_current()
        {
            let (acl, user) = (self.acl.clone(), p.user_id.clone());
            rt.spawn_blocking(move || {
                if let Err(e) = acl.persist_token_use(&user) {
                    tracing::warn!(error = %e, "recording a token's use failed");
                }
            });
        }
        Some(Caller::new(p.user_id, p.roles))
    }

    /// Resolves a user id asserted by the trusted SSO proxy; unknown users are refused.
    pub fn principal(&self, user_id: &str) -> Option<Caller> {
        self.acl
            .user(user_id)
            .map(|u| Caller::new(u.user_id, u.roles))
    }

    /// The engines' counters summed over the local generators: (active sequences, KV-cache
    /// bytes, prefix-cache hits, prompt tokens saved by the prefix cache).
    pub fn engine_totals(&self) -> (i64, i64, i64, i64) {
        let (mut active, mut kv, mut hits, mut saved) = (0i64, 0i64, 0i64, 0i64);
        for g in &self.generators {
            let m = g.engine().metrics();
            active += m.active_sequences as i64;
            kv += m.kv_bytes as i64;
            hits += m.prefix_hits as i64;
            saved += m.prefix_tokens_saved as i64;
        }
        (active, kv, hits, saved)
    }
}
