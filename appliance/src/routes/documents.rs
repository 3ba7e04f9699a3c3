//! Document administration: `PUT/GET/DELETE /v1/documents/{doc_id}` and `POST /v1/reconcile`.

use airlock_acl::{Acl, Actor, DocGrants};
use airlock_retrieval::{
    DeleteOutcome, DocumentInput, ReconcileReport, Retrieval, Staged, UpsertOutcome, UpsertStatus,
};
use axum::Json;
use axum::extract::{Path, RawQuery, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::{Map, Value, json};

use crate::auth::Admin;
use crate::error::ApiError;
use crate::extract::{ApiJson, RequestId, UploadJson};
use crate::routes::acl::{actor_of, allow_empty, blocking};
use crate::services::Services;
use crate::state::AppState;

/// Body of `PUT /v1/documents/{doc_id}`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PutDocument {
    /// Title.
    #[serde(default)]
    pub title: String,
    /// Plain text.
    pub text: String,
    /// Free-form metadata object.
    #[serde(default)]
    pub metadata: Map<String, Value>,
    /// Who may read it; absent keeps the current grant (nobody for a new document).
    #[serde(default)]
    pub acl: Option<DocGrants>,
}

/// `PUT /v1/documents/{doc_id}` → 201 created / 200 replaced `{"doc_id","version","chunks"}`,
/// durable when sent.
///
/// Everything is validated first (id, grant, size, text, chunking, embedding); a refused
/// request changes nothing. With an `acl`, content and grant are written in one SQLite
/// transaction, and the old version's chunks are hidden before the new grant applies, so no
/// reader ever sees the old content under the new grant or the new content under the old one.
pub async fn put(
    State(state): State<AppState>,
    Admin(actor): Admin,
    RequestId(request_id): RequestId,
    Path(doc_id): Path<String>,
    UploadJson(body): UploadJson<PutDocument>,
) -> Result<Response, ApiError> {
    let services = state.services()?;
    let outcome = blocking(move || {
        let actor = actor_of(&actor, &request_id);
        airlock_retrieval::ingest::validate_doc_id(&doc_id)?;
        if let Some(grants) = &body.acl {
            grants.validate(&doc_id)?;
        }
        let mut doc = DocumentInput::new(doc_id.clone(), body.title, body.text);
        doc.metadata = body.metadata;
        let staged = services.retrieval.stage(doc)?;
        let outcome = match &body.acl {
            None => services.retrieval.upsert_staged(staged)?,
            Some(grants) => put_with_grant(&services, actor, &doc_id, grants, staged)?,
        };
        services.acl.audit_admin(
            actor,
            json!({"action": "document_put", "doc_id": outcome.doc_id,
                   "version": outcome.version, "chunks": outcome.chunks,
                   "status": outcome.status}),
        )?;
        Ok(outcome)
    })
    .await?;
    let status = match outcome.status {
        UpsertStatus::Created => StatusCode::CREATED,
        UpsertStatus::Replaced | UpsertStatus::Unchanged => StatusCode::OK,
    };
    Ok((
        status,
        Json(json!({
            "doc_id": outcome.doc_id,
            "version": outcome.version,
            "chunks": outcome.chunks,
            "status": outcome.status,
        })),
    )
        .into_response())
}

/// Stores a staged document and its grant in one transaction (see [`put`]).
fn put_with_grant(
    services: &Services,
    actor: Actor<'_>,
    doc_id: &str,
    grants: &DocGrants,
    staged: Staged,
) -> Result<UpsertOutcome, ApiError> {
    services.retrieval.upsert_joined(staged, |joint| {
        let joint = std::cell::RefCell::new(joint);
        services.acl.set_document_grants_with(
            actor,
            doc_id,
            grants,
            |tx| {
                joint
                    .borrow_mut()
                    .write(tx)
                    .map_err(|e| airlock_acl::Error::Joined {
                        source: Box::new(e),
                    })
            },
            || joint.borrow_mut().hide_replaced(),
        )?;
        Ok::<_, ApiError>(())
    })
}

fn rfc3339_ms(ms: i64) -> Option<String> {
    let t = time::OffsetDateTime::from_unix_timestamp_nanos(i128::from(ms) * 1_000_000).ok()?;
    t.format(&time::format_description::well_known::Rfc3339)
        .ok()
}

/// `GET /v1/documents/{doc_id}` → the admin view: metadata, version, chunk count, grant and
/// `deleted_at` (no content).
pub async fn get(
    State(state): State<AppState>,
    Admin(_): Admin,
    Path(doc_id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let services = state.services()?;
    let id = doc_id.clone();
    let (info, grants) = blocking(move || {
        let info = services.retrieval.document(&id)?;
        let grants = services.acl.document_grants(&id)?;
        Ok((info, grants))
    })
    .await?;
    let info = info.ok_or_else(|| ApiError::NotFound(format!("no document `{doc_id}`")))?;
    Ok(Json(json!({
        "doc_id": info.doc_id,
        "title": info.title,
        "metadata": info.metadata,
        "version": info.version,
        "chunks": info.chunks,
        "acl": grants.unwrap_or_default(),
        "created_at": rfc3339_ms(info.created_at_ms),
        "updated_at": rfc3339_ms(info.updated_at_ms),
        "deleted_at": info.deleted_at_ms.and_then(rfc3339_ms),
    })))
}

/// `DELETE /v1/documents/{doc_id}` → 200 (also when already deleted); 404 for an id never seen.
/// The document is tombstoned at once and never returned again.
pub async fn delete(
    State(state): State<AppState>,
    Admin(actor): Admin,
    RequestId(request_id): RequestId,
    Path(doc_id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let services = state.services()?;
    let id = doc_id.clone();
    let outcome = blocking(move || {
        let outcome = services.retrieval.delete(&id)?;
        if outcome != DeleteOutcome::NotFound {
            services.acl.audit_admin(
                actor_of(&actor, &request_id),
                json!({"action": "document_delete", "doc_id": id, "status": outcome}),
            )?;
        }
        Ok(outcome)
    })
    .await?;
    match outcome {
        DeleteOutcome::Deleted | DeleteOutcome::AlreadyDeleted => Ok(Json(json!({
            "doc_id": doc_id,
            "deleted": true,
            "status": outcome,
        }))),
        DeleteOutcome::NotFound => Err(ApiError::NotFound(format!("no document `{doc_id}`"))),
    }
}

/// Body of `POST /v1/reconcile`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Reconcile {
    /// Every document id the source currently has.
    pub source_ids: Vec<String>,
}

/// `POST /v1/reconcile[?allow_empty=true]` → `{"orphans_tombstoned": [...], "missing": [...]}`.
/// An empty `source_ids` (which would tombstone everything) is refused without
/// `allow_empty=true`.
pub async fn reconcile(
    State(state): State<AppState>,
    Admin(actor): Admin,
    RequestId(request_id): RequestId,
    RawQuery(query): RawQuery,
    ApiJson(body): ApiJson<Reconcile>,
) -> Result<Json<ReconcileReport>, ApiError> {
    let allow_empty = allow_empty(query.as_deref())?;
    let services = state.services()?;
    let report = blocking(move || {
        let report = services
            .retrieval
            .reconcile(&body.source_ids, allow_empty)?;
        services.acl.audit_admin(
            actor_of(&actor, &request_id),
            json!({"action": "reconcile", "source_ids": body.source_ids.len(),
                   "orphans_tombstoned": report.orphans_tombstoned,
                   "missing": report.missing.len()}),
        )?;
        Ok(report)
    })
    .await?;
    Ok(Json(report))
}

/// Body of `POST /v1/purge` (all optional).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Purge {
    /// Only documents tombstoned at least this many seconds ago (default 0: every one).
    #[serde(default)]
    pub retention_secs: u64,
}

/// `POST /v1/purge` → the purge record: tombstoned documents older than the retention are
/// removed for good (rows, chunks, vectors, index entries, grants; see [`purge_documents`]).
pub async fn purge(
    State(state): State<AppState>,
    Admin(actor): Admin,
    RequestId(request_id): RequestId,
    ApiJson(body): ApiJson<Purge>,
) -> Result<Json<Value>, ApiError> {
    let services = state.services()?;
    let report = blocking(move || {
        purge_documents(
            &services.acl,
            &services.retrieval,
            services.feedback.as_deref(),
            actor_of(&actor, &request_id),
            std::time::Duration::from_secs(body.retention_secs),
        )
    })
    .await?;
    Ok(Json(report))
}

/// Purges tombstoned documents older than `retention` (`POST /v1/purge`, `airlock purge`):
/// the store removes their rows and rebuilds the indexes without them, their grants go, and
/// one audit row records ids, versions and times (never content). Returns that record.
pub fn purge_documents(
    acl: &Acl,
    retrieval: &Retrieval,
    conversations: Option<&crate::feedback::FeedbackStore>,
    actor: Actor<'_>,
    retention: std::time::Duration,
) -> Result<Value, ApiError> {
    let now_ms = time::OffsetDateTime::now_utc().unix_timestamp_nanos() / 1_000_000;
    let cutoff = i64::try_from(now_ms - retention.as_millis() as i128).unwrap_or(i64::MIN);
    let report = retrieval.purge(cutoff)?;
    // Conversation turns that showed a purged document go with it.
    let turns_removed = match conversations {
        Some(store) => {
            let ids: Vec<String> = report.purged.iter().map(|d| d.doc_id.clone()).collect();
            store.remove_turns_showing(&ids)?
        }
        None => 0,
    };
    for d in &report.purged {
        if acl
            .document_grants(&d.doc_id)?
            .is_some_and(|g| g != DocGrants::default())
        {
            acl.set_document_grants(actor, &d.doc_id, &DocGrants::default())?;
        }
    }
    let documents: Vec<Value> = report
        .purged
        .iter()
        .map(|d| {
            json!({"doc_id": d.doc_id, "version": d.version,
                   "deleted_at": rfc3339_ms(d.deleted_at_ms)})
        })
        .collect();
    let record = json!({
        "action": "purge",
        "retention_secs": retention.as_secs(),
        "purged_at": rfc3339_ms(i64::try_from(now_ms).unwrap_or(i64::MAX)),
        "documents": documents,
        "index_generation": report.reindex.as_ref().map(|r| r.generation),
        "conversation_turns_removed": turns_removed,
    });
    acl.audit_admin(actor, record.clone())?;
    Ok(record)
}
