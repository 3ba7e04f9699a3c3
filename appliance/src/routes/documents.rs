//! Document administration: `PUT/GET/DELETE /v1/documents/{doc_id}` and `POST /v1/reconcile`.

use airlock_acl::DocGrants;
use airlock_retrieval::{DeleteOutcome, DocumentInput, ReconcileReport, UpsertStatus};
use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::{Map, Value, json};

use crate::auth::Admin;
use crate::error::ApiError;
use crate::extract::{ApiJson, UploadJson};
use crate::routes::acl::blocking;
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
    Path(doc_id): Path<String>,
    UploadJson(body): UploadJson<PutDocument>,
) -> Result<Response, ApiError> {
    let services = state.services()?;
    let outcome = blocking(move || {
        airlock_retrieval::ingest::validate_doc_id(&doc_id)?;
        if let Some(grants) = &body.acl {
            grants.validate(&doc_id)?;
        }
        let mut doc = DocumentInput::new(doc_id.clone(), body.title, body.text);
        doc.metadata = body.metadata;
        let staged = services.retrieval.stage(doc)?;
        let Some(grants) = &body.acl else {
            return Ok(services.retrieval.upsert_staged(staged)?);
        };
        services.retrieval.upsert_joined(staged, |joint| {
            let joint = std::cell::RefCell::new(joint);
            services.acl.set_document_grants_with(
                &actor.user_id,
                &doc_id,
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
    Admin(_): Admin,
    Path(doc_id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let services = state.services()?;
    let id = doc_id.clone();
    let outcome = blocking(move || Ok(services.retrieval.delete(&id)?)).await?;
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

/// `POST /v1/reconcile` → `{"orphans_tombstoned": [...], "missing": [...]}`.
pub async fn reconcile(
    State(state): State<AppState>,
    Admin(_): Admin,
    ApiJson(body): ApiJson<Reconcile>,
) -> Result<Json<ReconcileReport>, ApiError> {
    let services = state.services()?;
    let report = blocking(move || Ok(services.retrieval.reconcile(&body.source_ids)?)).await?;
    Ok(Json(report))
}
