//! Document administration: `PUT/GET/DELETE /v1/documents/{doc_id}` and `POST /v1/reconcile`.

use airlock_acl::{Acl, Actor, DocGrants};
use airlock_retrieval::{
    DeleteOutcome, DocumentInput, ReconcileReport, Retrieval, Staged, UpsertOutcome, UpsertStatus,
};
use axum::Json;
use axum::extract::{Path, Query, RawQuery, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::{Map, Value, json};

pub(crate) use crate::document_write::store_with_grant;

use crate::auth::{Admin, Caller};
use crate::error::ApiError;
use crate::extract::{ApiJson, JsonOrFile, RequestId};
use crate::routes::acl::{actor_of, allow_empty, blocking};
use crate::state::AppState;
use airlock_serving::services::Services;

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

/// Query of `PUT /v1/documents/{doc_id}` (raw file uploads only).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PutQuery {
    /// The title (default: the file's own title, e.g. its first heading or properties).
    #[serde(default)]
    pub title: Option<String>,
}

/// `PUT /v1/documents/{doc_id}` → 201 created / 200 replaced `{"doc_id","version","chunks"}`,
/// durable when sent.
///
/// The body is JSON ([`PutDocument`]) or the raw file with its media type as `Content-Type`
/// (`?title=` optional), which is extracted and kept as the document's original
/// (`GET /v1/documents/{doc_id}/file`); another type is 415, a file the extractor refuses 422.
///
/// Everything is validated first (id, grant, size, extraction, chunking, embedding); a refused
/// request changes nothing (no row, no original file). With an `acl`, content and grant are
/// written in one SQLite transaction, and the old version's chunks are hidden before the new
/// grant applies, so no reader ever sees the old content under the new grant or the new
/// content under the old one.
pub async fn put(
    State(state): State<AppState>,
    Admin(actor): Admin,
    RequestId(request_id): RequestId,
    Path(doc_id): Path<String>,
    Query(query): Query<PutQuery>,
    headers: axum::http::HeaderMap,
    body: JsonOrFile<PutDocument>,
) -> Result<Response, ApiError> {
    let services = state.services()?;
    let limits = state.config().extract_limits();
    let metrics = state.metrics().clone();
    let approvals_state = state.clone();
    let outcome = blocking(move || {
        let actor = actor_of(&actor, &request_id);
        airlock_retrieval::ingest::validate_doc_id(&doc_id)?;
        let (doc, acl) = match body {
            JsonOrFile::Json(body) => {
                if query.title.is_some() {
                    return Err(ApiError::InvalidRequest(
                        "`?title=` is for raw file uploads; a JSON body carries `title`".into(),
                    ));
                }
                let mut doc = DocumentInput::new(doc_id.clone(), body.title, body.text);
                doc.metadata = body.metadata;
                (doc, body.acl)
            }
            JsonOrFile::File {
                media_type,
                format,
                bytes,
            } => (
                file_document(
                    &services,
                    &doc_id,
                    query.title.as_deref(),
                    media_type,
                    format,
                    bytes.to_vec(),
                    &limits,
                )?,
                None,
            ),
        };
        if let Some(grants) = &acl {
            grants.validate(&doc_id)?;
        }
        // Staged (extracted, chunked, embedded) before the access check: the embedding does not
        // hold the lock that keeps access checks and changes in order.
        let staged = services.retrieval.stage(doc)?;
        // A grant that lets the caller read the document needs approval (crate::approvals).
        let _serial = acl
            .as_ref()
            .map(|_| approvals_state.approvals().serial().blocking_lock());
        if let Some(g) = &acl {
            use crate::approvals::{self, Change};
            let needed =
                approvals::grant_gives(&services.acl, actor.user_id, &doc_id, &g.users, &g.groups);
            let change = Change::DocumentGrants {
                doc_id: doc_id.clone(),
                users: g.users.clone(),
                groups: g.groups.clone(),
            };
            let (change, how) = approvals::authorise(
                approvals_state.approvals(),
                &services.acl,
                &headers,
                actor.user_id,
                change,
                needed,
            )?;
            approvals::record(&services.acl, &metrics, actor, &change, &how)?;
        }
        let outcome = match &acl {
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

/// A raw upload as a document with its original: extracted under `limits` by the services'
/// extractor (in a budgeted worker: an overrun is the file's `limit_exceeded` refusal), within
/// the store's `max_document_bytes`. A refusal is 422 with the extractor's reason; too large is
/// 413; no worker is 500 (cannot start) or 503 (the daemon is stopping).
fn file_document(
    services: &Services,
    doc_id: &str,
    title: Option<&str>,
    media_type: String,
    format: airlock_retrieval::SourceFormat,
    bytes: Vec<u8>,
    limits: &airlock_retrieval::ingest::ExtractLimits,
) -> Result<DocumentInput, ApiError> {
    use airlock_serving::extraction::ExtractFailure as F;
    let max_bytes = services.retrieval.config().max_document_bytes;
    let mut doc = services
        .extractor
        .document(doc_id, title, &bytes, format, max_bytes, limits)
        .map_err(|e| match e {
            F::Document(
                e @ (airlock_retrieval::Error::Extraction { .. }
                | airlock_retrieval::Error::InvalidUtf8 { .. }
                | airlock_retrieval::Error::EmptyDocument { .. }),
            ) => ApiError::Unprocessable(e.to_string()),
            F::Document(e) => e.into(),
            F::Unavailable(why) => ApiError::internal(why),
            F::Stopping => ApiError::NotReady,
        })?;
    doc.original = Some(airlock_retrieval::Original::new(media_type, bytes));
    Ok(doc)
}

/// Stores a staged document and its grant in one transaction (see [`put`]).
fn put_with_grant(
    services: &Services,
    actor: Actor<'_>,
    doc_id: &str,
    grants: &DocGrants,
    staged: Staged,
) -> Result<UpsertOutcome, ApiError> {
    store_with_grant(
        &services.acl,
        &services.retrieval,
        actor,
        doc_id,
        grants,
        staged,
    )
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
    conversations: Option<&airlock_evidence::feedback::FeedbackStore>,
    actor: Actor<'_>,
    retention: std::time::Duration,
) -> Result<Value, ApiError> {
    let now_ms = time::OffsetDateTime::now_utc().unix_timestamp_nanos() / 1_000_000;
    let cutoff = i64::try_from(now_ms - retention.as_millis() as i128).unwrap_or(i64::MIN);
    let report = retrieval.purge(cutoff)?;
    // Conversation turns whose provenance names a purged document go with it: those that
    // showed it and every later turn answered from one of them.
    let turns_removed = match conversations {
        Some(store) => {
            let ids: Vec<String> = report.purged.iter().map(|d| d.doc_id.clone()).collect();
            store.remove_turns_from(&ids)?
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

/// The one answer for a file the caller may not have: unknown id, tombstoned, given as text
/// (no original), or not readable by the caller. The same bytes in every case, so the answer
/// says nothing about documents the caller cannot read.
fn no_file() -> ApiError {
    ApiError::NotFound("no such document file".into())
}

/// `GET /v1/documents/{doc_id}/file` → the document's original file, with its media type and a
/// `Content-Disposition` (inline for PDF, so a viewer can open `#page=N`; attachment for every
/// other type), only if the caller's `AllowSet`, taken now, contains the document; audited as
/// `shown`. Otherwise 404 with the body of an unknown id ([`no_file`]).
pub async fn file(
    State(state): State<AppState>,
    caller: Caller,
    RequestId(request_id): RequestId,
    Path(doc_id): Path<String>,
) -> Result<Response, ApiError> {
    let services = state.services()?;
    let id = doc_id.clone();
    let user = caller.user_id.clone();
    let original = blocking(move || {
        let allow = services.acl.allow_set(&user);
        let Some(original) = services.retrieval.original(&id, &allow)? else {
            return Ok(None);
        };
        services
            .acl
            .audit_shown(&request_id, &user, std::slice::from_ref(&id))?;
        Ok(Some(original))
    })
    .await?;
    let Some(original) = original else {
        return Err(no_file());
    };
    let inline = original.media_type == "application/pdf";
    let content_type = match original.media_type.as_str() {
        t @ ("text/plain" | "text/markdown" | "text/csv" | "text/html") => {
            format!("{t}; charset=utf-8")
        }
        t => t.to_owned(),
    };
    let disposition = content_disposition(&doc_id, &original.media_type, inline);
    let len = original.len;
    let file = tokio::fs::File::from_std(original.file);
    let stream = futures::stream::try_unfold(file, |mut f| async move {
        use tokio::io::AsyncReadExt;
        let mut buf = vec![0u8; 64 << 10];
        let n = f.read(&mut buf).await?;
        if n == 0 {
            return Ok(None);
        }
        buf.truncate(n);
        Ok::<_, std::io::Error>(Some((axum::body::Bytes::from(buf), f)))
    });
    let mut resp = Response::new(axum::body::Body::from_stream(stream));
    let h = resp.headers_mut();
    let value = |s: &str| HeaderValue::from_str(s).map_err(ApiError::internal);
    h.insert(header::CONTENT_TYPE, value(&content_type)?);
    h.insert(header::CONTENT_LENGTH, HeaderValue::from(len));
    h.insert(header::CONTENT_DISPOSITION, value(&disposition)?);
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(
        header::CACHE_CONTROL,
        HeaderValue::from_static("private, no-store"),
    );
    if !inline {
        // An HTML or other active file never runs in the appliance's origin.
        h.insert(
            header::CONTENT_SECURITY_POLICY,
            HeaderValue::from_static("sandbox; default-src 'none'"),
        );
    }
    Ok(resp)
}

/// The file name extension of a media type, for names that lack one.
fn extension_of(media_type: &str) -> Option<&'static str> {
    Some(
        match airlock_retrieval::SourceFormat::from_media_type(media_type)? {
            airlock_retrieval::SourceFormat::Text => "txt",
            airlock_retrieval::SourceFormat::Markdown => "md",
            airlock_retrieval::SourceFormat::Html => "html",
            airlock_retrieval::SourceFormat::Extracted(f) => match f.name() {
                "markdown" => "md",
                "text" => "txt",
                n => n,
            },
        },
    )
}

/// A `Content-Disposition` value that cannot break the header or name a path: the last `/`
/// segment of the id, as a plain ASCII `filename` (other characters `_`) and, exactly, as an
/// RFC 8187 `filename*`; the format's extension is added when the name has none.
pub(crate) fn content_disposition(doc_id: &str, media_type: &str, inline: bool) -> String {
    let last = doc_id.rsplit(['/', '\\']).next().unwrap_or("");
    let last = last.trim_matches(|c: char| c == '.' || c.is_whitespace() || c.is_control());
    let mut name = if last.is_empty() { "document" } else { last }.to_owned();
    if !name.contains('.')
        && let Some(ext) = extension_of(media_type)
    {
        name = format!("{name}.{ext}");
    }
    let ascii: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_' | ' ' | '(' | ')' | ',') {
                c
            } else {
                '_'
            }
        })
        .collect();
    let ascii = ascii.trim_matches(|c| c == '.' || c == ' ' || c == '_');
    let ascii = if ascii.is_empty() { "document" } else { ascii };
    let mut encoded = String::with_capacity(name.len() * 3);
    for b in name.bytes() {
        if b.is_ascii_alphanumeric() || b"!#$&+-.^_`|~".contains(&b) {
            encoded.push(b as char);
        } else {
            encoded.push_str(&format!("%{b:02X}"));
        }
    }
    let kind = if inline { "inline" } else { "attachment" };
    format!("{kind}; filename=\"{ascii}\"; filename*=UTF-8''{encoded}")
}

#[cfg(test)]
mod tests {
    use super::content_disposition;

    #[test]
    fn content_disposition_is_safe_and_exact() {
        assert_eq!(
            content_disposition("policies/credit limits.pdf", "application/pdf", true),
            "inline; filename=\"credit limits.pdf\"; filename*=UTF-8''credit%20limits.pdf"
        );
        // Quotes, CR/LF, backslashes and non-ASCII never reach the plain name.
        let d = content_disposition("x/a\"b\r\nSet-Cookie: c=d;\\é.html", "text/html", false);
        assert!(d.starts_with("attachment; filename=\""), "{d}");
        assert!(
            !d.contains('\r') && !d.contains('\n') && !d.contains('é'),
            "{d}"
        );
        assert_eq!(d.matches('"').count(), 2, "{d}");
        // The last path segment only; the extension of the type when the id has none.
        assert_eq!(
            content_disposition(
                "rate-sheet",
                "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet",
                false
            ),
            "attachment; filename=\"rate-sheet.xlsx\"; filename*=UTF-8''rate-sheet.xlsx"
        );
        assert_eq!(
            content_disposition("../..", "application/pdf", true),
            "inline; filename=\"document.pdf\"; filename*=UTF-8''document.pdf"
        );
    }
}
