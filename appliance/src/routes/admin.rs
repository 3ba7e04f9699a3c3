//! The operator console's read-only API (`GET /v1/admin/...`, the `/admin` page of the web UI):
//! documents, users and groups with their effective access, IAM sync runs, capacity, answer
//! feedback, eval reports and the audit log. Who may read which page is in the role table
//! ([`crate::roles::ROUTES`]). Ids, titles, counts and times only: never chunk text, prompts or
//! answers. Every list is paged with an explicit `limit` (at most [`MAX_PAGE`]); a bad query
//! parameter is `400 invalid-request` and nothing is read.

use std::collections::BTreeMap;
use std::path::{Path as FsPath, PathBuf};

use airlock_acl::{Actor, AuditKind, AuditSearch};
use airlock_evidence::feedback::{Rating, rfc3339_us};
use airlock_retrieval::{DocumentList, DocumentStatus};
use axum::Json;
use axum::extract::{Path, Query, State};
use roaring::RoaringBitmap;
use serde::Deserialize;
use serde_json::{Value, json};
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

use crate::auth::Admin;
use crate::error::ApiError;
use crate::routes::acl::blocking;
use crate::state::AppState;

/// Entries a page holds when the request names no `limit`.
pub const DEFAULT_PAGE: usize = 50;
/// Most entries one page may hold.
pub const MAX_PAGE: usize = 200;
/// Longest filter value (an id, a prefix, a cursor) in bytes.
pub const MAX_FILTER_BYTES: usize = 256;
/// Largest feedback `offset`.
pub const MAX_OFFSET: usize = 100_000;
/// Largest `report.json` the eval pages read.
pub const MAX_REPORT_BYTES: u64 = 64 << 20;
/// Versions of one document the document page lists (newest first).
pub const MAX_VERSIONS: usize = 50;

fn page_limit(limit: Option<usize>) -> Result<usize, ApiError> {
    match limit {
        None => Ok(DEFAULT_PAGE),
        Some(l) if (1..=MAX_PAGE).contains(&l) => Ok(l),
        Some(_) => Err(ApiError::InvalidRequest(format!(
            "`limit` must be between 1 and {MAX_PAGE}"
        ))),
    }
}

/// A filter value: at most [`MAX_FILTER_BYTES`], no control characters; empty is none.
fn filter(field: &str, v: Option<String>) -> Result<Option<String>, ApiError> {
    match v {
        Some(s) if s.len() > MAX_FILTER_BYTES => Err(ApiError::InvalidRequest(format!(
            "`{field}` is longer than {MAX_FILTER_BYTES} bytes"
        ))),
        Some(s) if s.chars().any(char::is_control) => Err(ApiError::InvalidRequest(format!(
            "`{field}` contains a control character"
        ))),
        Some(s) if s.is_empty() => Ok(None),
        other => Ok(other),
    }
}

/// An RFC 3339 filter; an empty one (a form's blank field) is none.
fn instant(field: &str, v: Option<&str>) -> Result<Option<OffsetDateTime>, ApiError> {
    crate::routes::audit::instant(field, v.filter(|s| !s.is_empty()))
}

fn rfc3339_ms(ms: i64) -> Option<String> {
    OffsetDateTime::from_unix_timestamp_nanos(i128::from(ms) * 1_000_000)
        .ok()?
        .format(&Rfc3339)
        .ok()
}

fn rfc3339_s(s: f64) -> Option<String> {
    (s > 0.0).then(|| rfc3339_ms((s * 1e3) as i64)).flatten()
}

fn now_s() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

/// Takes one more than a page to know whether another follows: `(page, more)`.
fn split_page<T>(mut rows: Vec<T>, limit: usize) -> (Vec<T>, bool) {
    let more = rows.len() > limit;
    rows.truncate(limit);
    (rows, more)
}

/// A query string with no parameters.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NoParams {}

// ------------------------------------------------------------------------------------------
// Documents (operator)

/// The query of `GET /v1/admin/documents`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DocumentsParams {
    /// Id or title prefix (ASCII case-insensitive).
    pub q: Option<String>,
    /// `live`, `deleted` or `all` [default: all].
    pub status: Option<String>,
    /// The `next_after` of the previous page.
    pub after: Option<String>,
    /// Page size [default 50, at most 200].
    pub limit: Option<usize>,
}

fn doc_status(d: &airlock_retrieval::DocumentSummary) -> &'static str {
    if d.deleted_at_ms.is_some() {
        "deleted"
    } else {
        "live"
    }
}

fn summary_json(d: &airlock_retrieval::DocumentSummary) -> Value {
    json!({
        "doc_id": d.doc_id,
        "title": d.title,
        "status": doc_status(d),
        "version": d.version,
        "chunks": d.chunks,
        "anchored_chunks": d.anchored_chunks,
        "created_at": rfc3339_ms(d.created_at_ms),
        "updated_at": rfc3339_ms(d.updated_at_ms),
        "deleted_at": d.deleted_at_ms.and_then(rfc3339_ms),
    })
}

/// `GET /v1/admin/documents?q=&status=&after=&limit=` → `{"documents": [...], "next_after"}`.
pub async fn documents(
    State(state): State<AppState>,
    Admin(_): Admin,
    Query(p): Query<DocumentsParams>,
) -> Result<Json<Value>, ApiError> {
    let limit = page_limit(p.limit)?;
    let status = match p.status.as_deref() {
        None | Some("") | Some("all") => DocumentStatus::All,
        Some("live") => DocumentStatus::Live,
        Some("deleted") => DocumentStatus::Deleted,
        Some(_) => {
            return Err(ApiError::InvalidRequest(
                "`status` must be live, deleted or all".into(),
            ));
        }
    };
    let q = DocumentList {
        doc_id: None,
        prefix: filter("q", p.q)?,
        status,
        after: filter("after", p.after)?,
        limit: limit + 1,
    };
    let services = state.services()?;
    let rows = blocking(move || Ok(services.retrieval.list_documents(&q)?)).await?;
    let (rows, more) = split_page(rows, limit);
    let next = more
        .then(|| rows.last().map(|d| d.doc_id.clone()))
        .flatten();
    Ok(Json(json!({
        "documents": rows.iter().map(summary_json).collect::<Vec<_>>(),
        "next_after": next,
    })))
}

/// `GET /v1/admin/documents/{doc_id}` → the document (live, deleted or purged), its versions
/// from the audit log, its grant and how many users may read it.
pub async fn document(
    State(state): State<AppState>,
    Admin(_): Admin,
    Path(doc_id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let doc_id = filter("doc_id", Some(doc_id))?.unwrap_or_default();
    let services = state.services()?;
    blocking(move || {
        let found = services.retrieval.list_documents(&DocumentList {
            doc_id: Some(doc_id.clone()),
            limit: 1,
            ..DocumentList::default()
        })?;
        let history = |action: &str, limit: usize| {
            services.acl.audit_search(&AuditSearch {
                doc_id: Some(doc_id.clone()),
                action: Some(action.into()),
                limit,
                ..AuditSearch::default()
            })
        };
        let versions: Vec<Value> = history("document_put", MAX_VERSIONS)?
            .into_iter()
            .map(|e| {
                json!({"version": e.detail["version"], "chunks": e.detail["chunks"],
                       "status": e.detail["status"], "at": e.at.format(&Rfc3339).ok(),
                       "actor": e.actor})
            })
            .collect();
        let mut out = match found.first() {
            Some(d) => summary_json(d),
            None => {
                let Some(purge) = history("purge", 1)?.into_iter().next() else {
                    return Err(ApiError::NotFound(format!("no document `{doc_id}`")));
                };
                json!({"doc_id": doc_id, "status": "purged",
                       "purged_at": purge.at.format(&Rfc3339).ok(), "chunks": 0,
                       "anchored_chunks": 0})
            }
        };
        let grants = services.acl.document_grants(&doc_id)?.unwrap_or_default();
        let readers = match services.acl.ordinal(&doc_id)? {
            Some(o) if found.first().is_some_and(|d| d.deleted_at_ms.is_none()) => {
                let snap = services.acl.snapshot();
                snap.user_ids()
                    .iter()
                    .filter(|u| snap.can_read(u, o))
                    .count()
            }
            _ => 0,
        };
        out["versions"] = json!(versions);
        out["acl"] = json!(grants);
        out["readable_by_users"] = json!(readers);
        Ok(Json(out))
    })
    .await
}

// ------------------------------------------------------------------------------------------
// Users and groups (admin, operator, auditor)

/// The query of `GET /v1/admin/users` and `GET /v1/admin/groups`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IdPageParams {
    /// Id prefix (case-sensitive).
    pub q: Option<String>,
    /// The `next_after` of the previous page.
    pub after: Option<String>,
    /// Page size [default 50, at most 200].
    pub limit: Option<usize>,
}

fn live_set(services: &airlock_serving::services::Services) -> Result<RoaringBitmap, ApiError> {
    Ok(services.retrieval.live_ordinals()?.into_iter().collect())
}

/// `GET /v1/admin/users?q=&after=&limit=` → `{"users": [{user_id, groups, roles, local,
/// has_token, readable_documents}], "next_after", "total"}`; `readable_documents` counts the
/// live documents the user's grants open.
pub async fn users(
    State(state): State<AppState>,
    Admin(_): Admin,
    Query(p): Query<IdPageParams>,
) -> Result<Json<Value>, ApiError> {
    let limit = page_limit(p.limit)?;
    let (prefix, after) = (filter("q", p.q)?, filter("after", p.after)?);
    let services = state.services()?;
    blocking(move || {
        let live = live_set(&services)?;
        let snap = services.acl.snapshot();
        let ids = snap.user_ids();
        let total = ids.len();
        let matching = ids
            .into_iter()
            .filter(|u| prefix.as_deref().is_none_or(|p| u.starts_with(p)))
            .filter(|u| after.as_deref().is_none_or(|a| u.as_str() > a));
        let (page, more) = split_page(matching.take(limit + 1).collect(), limit);
        let users: Vec<Value> = page
            .iter()
            .filter_map(|u| snap.user(u))
            .map(|u| {
                let readable = snap.allow_set(&u.user_id).bitmap().intersection_len(&live);
                json!({"user_id": u.user_id, "groups": u.groups, "roles": u.roles,
                       "local": u.local, "has_token": u.has_token,
                       "readable_documents": readable})
            })
            .collect();
        let next = more.then(|| page.last().cloned()).flatten();
        Ok(Json(
            json!({"users": users, "next_after": next, "total": total}),
        ))
    })
    .await
}

/// `GET /v1/admin/groups?q=&after=&limit=` → `{"groups": [{group_id, members,
/// readable_documents}], "next_after", "total"}`: every group a user belongs to or a grant
/// names; `readable_documents` counts the live documents granted to the group.
pub async fn groups(
    State(state): State<AppState>,
    Admin(_): Admin,
    Query(p): Query<IdPageParams>,
) -> Result<Json<Value>, ApiError> {
    let limit = page_limit(p.limit)?;
    let (prefix, after) = (filter("q", p.q)?, filter("after", p.after)?);
    let services = state.services()?;
    blocking(move || {
        let live = live_set(&services)?;
        let grants = services.acl.group_grants()?;
        let snap = services.acl.snapshot();
        let mut members: BTreeMap<String, usize> = grants.keys().map(|g| (g.clone(), 0)).collect();
        for u in snap.user_ids() {
            for g in snap.user_groups(&u).unwrap_or_default() {
                *members.entry(g).or_default() += 1;
            }
        }
        let total = members.len();
        let matching = members
            .iter()
            .filter(|(g, _)| prefix.as_deref().is_none_or(|p| g.starts_with(p)))
            .filter(|(g, _)| after.as_deref().is_none_or(|a| g.as_str() > a));
        let (page, more) = split_page(matching.take(limit + 1).collect::<Vec<_>>(), limit);
        let groups: Vec<Value> = page
            .iter()
            .map(|(g, n)| {
                let readable = grants.get(*g).map_or(0, |b| b.intersection_len(&live));
                json!({"group_id": g, "members": n, "readable_documents": readable})
            })
            .collect();
        let next = more
            .then(|| page.last().map(|(g, _)| (*g).clone()))
            .flatten();
        Ok(Json(
            json!({"groups": groups, "next_after": next, "total": total}),
        ))
    })
    .await
}

// ------------------------------------------------------------------------------------------
// IAM sync runs (admin, operator, auditor)

/// The query of `GET /v1/admin/syncs` and the cursor of the audit pages.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SeqPageParams {
    /// The `next_before` of the previous page (an audit `seq`).
    pub before: Option<i64>,
    /// Page size [default 50, at most 200].
    pub limit: Option<usize>,
}

fn before(v: Option<i64>) -> Result<Option<i64>, ApiError> {
    match v {
        Some(s) if s < 1 => Err(ApiError::InvalidRequest(
            "`before` must be a positive audit seq".into(),
        )),
        other => Ok(other),
    }
}

/// Records a full IAM sync that failed (`admin` audit entry `{"action": "sync_failed",
/// "source", "error"}`), for the console's sync history: a directory sync that failed (over
/// HTTP or on its schedule: the caller sent nothing that could be refused) or a snapshot sync
/// that failed on the server's side (a refused snapshot records nothing). The error names ids
/// and lines at most, never content. A failure to record is logged, not returned.
pub fn record_sync_failure(
    acl: &airlock_acl::Acl,
    actor: Actor<'_>,
    source: &str,
    e: &dyn std::fmt::Display,
) {
    let mut error = e.to_string();
    if error.len() > 500 {
        let mut cut = 500;
        while !error.is_char_boundary(cut) {
            cut -= 1;
        }
        error.truncate(cut);
    }
    let detail = json!({"action": "sync_failed", "source": source, "error": error});
    if let Err(e) = acl.audit_admin(actor, detail) {
        tracing::warn!(error = %e, "recording a failed sync");
    }
}

/// `GET /v1/admin/syncs?before=&limit=` → `{"freshness": {last_success_at, age_seconds},
/// "runs": [{seq, at, actor, source, outcome, counts | error}], "next_before"}`, newest first.
pub async fn syncs(
    State(state): State<AppState>,
    Admin(_): Admin,
    Query(p): Query<SeqPageParams>,
) -> Result<Json<Value>, ApiError> {
    let limit = page_limit(p.limit)?;
    let before_seq = before(p.before)?;
    let services = state.services()?;
    blocking(move || {
        let rows = services.acl.audit_search(&AuditSearch {
            sync_runs: true,
            before_seq,
            limit: limit + 1,
            ..AuditSearch::default()
        })?;
        let (rows, more) = split_page(rows, limit);
        let runs: Vec<Value> = rows
            .iter()
            .map(|e| {
                let at = e.at.format(&Rfc3339).ok();
                if e.kind == AuditKind::Sync {
                    let directory = e.detail["source"] == "directory";
                    let counts = if directory {
                        e.detail["counts"].clone()
                    } else {
                        e.detail.clone()
                    };
                    json!({"seq": e.seq, "at": at, "actor": e.actor,
                           "source": if directory { "directory" } else { "snapshot" },
                           "outcome": "applied", "counts": counts})
                } else {
                    json!({"seq": e.seq, "at": at, "actor": e.actor,
                           "source": e.detail["source"], "outcome": "failed",
                           "error": e.detail["error"]})
                }
            })
            .collect();
        let last = services.acl.last_full_sync_us()?;
        let age = last.map(|us| (now_s() - us as f64 / 1e6).max(0.0).round() as u64);
        let next = more.then(|| rows.last().map(|e| e.seq)).flatten();
        Ok(Json(json!({
            "freshness": {
                "last_success_at": last.and_then(|us| rfc3339_ms(us / 1000)),
                "age_seconds": age,
            },
            "runs": runs,
            "next_before": next,
        })))
    })
    .await
}

// ------------------------------------------------------------------------------------------
// Capacity (admin, operator, auditor)

/// `GET /v1/admin/capacity` → the ladder's rung and signals, the counters the console turns
/// into rates, and the recent sheds (newest first).
pub async fn capacity(
    State(state): State<AppState>,
    Admin(_): Admin,
    Query(_): Query<NoParams>,
) -> Result<Json<Value>, ApiError> {
    use crate::metrics::{PriorityLabel, QuotaKind};
    let a = state.admission();
    let m = state.metrics();
    let s = a.signals();
    let now = now_s();
    let recent: Vec<(f64, &'static str)> = m.recent_sheds.lock().iter().rev().copied().collect();
    let last_minute = recent.iter().filter(|(t, _)| now - t <= 60.0).count();
    let shed = |priority| {
        m.shed_total
            .get_or_create(&PriorityLabel { priority })
            .get()
    };
    let limited = |quota| {
        m.rate_limited_total
            .get_or_create(&QuotaKind { quota })
            .get()
    };
    Ok(Json(json!({
        "at": rfc3339_s(now),
        "at_unix": now,
        "rung": a.current_rung(),
        "ladder_enabled": state.config().admission().ladder_enabled(),
        "pressure": m.ladder_pressure.get(),
        "inflight": s.inflight,
        "queue_depth": s.queued,
        "kv_fraction": s.kv_fraction,
        "queue_wait_ewma_ms": s.wait_ewma.map(|d| d.as_secs_f64() * 1e3),
        "shed_ratio": s.shed_ratio,
        "totals": {
            "shed_interactive": shed("interactive"),
            "shed_batch": shed("batch"),
            "rate_limited_requests": limited("requests"),
            "rate_limited_tokens": limited("tokens"),
            "generated_tokens": m.generated_tokens.get(),
            "prompt_tokens": m.prompt_tokens.get(),
            "rung_transitions": m.rung_transitions.get(),
            "recheck_drops": m.recheck_drops.get(),
        },
        "sheds_last_minute": last_minute,
        "recent_sheds": recent.iter()
            .map(|(t, p)| json!({"at": rfc3339_s(*t), "priority": p}))
            .collect::<Vec<_>>(),
    })))
}

// ------------------------------------------------------------------------------------------
// Feedback (operator)

/// The query of `GET /v1/admin/feedback`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FeedbackParams {
    /// Only `up` or `down`.
    pub rating: Option<String>,
    /// Ratings to skip (newest first) [default 0, at most 100000].
    pub offset: Option<usize>,
    /// Page size [default 50, at most 200].
    pub limit: Option<usize>,
}

/// `GET /v1/admin/feedback?rating=&offset=&limit=` → `{"feedback": [{user_id, request_id,
/// rating, comment, created_at, updated_at, model, rung, bundle_version}], "totals": {up,
/// down}, "next_offset"}`, newest first. Never the question or the answer.
pub async fn feedback(
    State(state): State<AppState>,
    Admin(_): Admin,
    Query(p): Query<FeedbackParams>,
) -> Result<Json<Value>, ApiError> {
    let limit = page_limit(p.limit)?;
    let offset = p.offset.unwrap_or(0);
    if offset > MAX_OFFSET {
        return Err(ApiError::InvalidRequest(format!(
            "`offset` must be at most {MAX_OFFSET}"
        )));
    }
    let rating = match p.rating.as_deref() {
        None | Some("") => None,
        Some("up") => Some(Rating::Up),
        Some("down") => Some(Rating::Down),
        Some(_) => {
            return Err(ApiError::InvalidRequest(
                "`rating` must be up or down".into(),
            ));
        }
    };
    let services = state.services()?;
    let Some(store) = services.feedback.clone() else {
        return Ok(Json(
            json!({"feedback": [], "totals": {"up": 0, "down": 0}, "next_offset": null}),
        ));
    };
    blocking(move || {
        let page = store.list_feedback(rating, limit + 1, offset)?;
        let rows: Vec<Value> = page
            .rows
            .into_iter()
            .map(|f| {
                json!({
                    "user_id": f.user_id,
                    "request_id": f.request_id,
                    "rating": f.rating,
                    "comment": f.comment,
                    "created_at": rfc3339_us(f.created_us),
                    "updated_at": rfc3339_us(f.updated_us),
                    "model": f.model,
                    "rung": f.rung,
                    "bundle_version": f.bundle_version,
                })
            })
            .collect();
        let mut totals = json!({"up": 0, "down": 0});
        for (rating, n) in page.totals {
            totals[rating] = json!(n);
        }
        let (rows, more) = split_page(rows, limit);
        Ok(Json(json!({
            "feedback": rows,
            "totals": totals,
            "next_offset": more.then_some(offset + limit),
        })))
    })
    .await
}

// ------------------------------------------------------------------------------------------
// Eval reports (operator, auditor)

/// The query of `GET /v1/admin/evals`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EvalsParams {
    /// The `next_after` of the previous page (a report name).
    pub after: Option<String>,
    /// Page size [default 50, at most 200].
    pub limit: Option<usize>,
}

/// Whether `name` may name a report directory: `[A-Za-z0-9._-]`, not starting with a dot, at
/// most 128 bytes.
pub fn valid_report_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 128
        && !name.starts_with('.')
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

/// The aggregate parts of a `report.json` (never its `cases`: their queries, answers and ids).
pub const REPORT_KEYS: [&str; 7] = [
    "set",
    "bundle_version",
    "rung",
    "overall",
    "per_kind",
    "per_phase",
    "latency_ms",
];

/// Reads `dir/name/report.json` (at most [`MAX_REPORT_BYTES`]) and keeps [`REPORT_KEYS`].
fn read_report(dir: &FsPath, name: &str) -> Result<Value, ApiError> {
    let path = dir.join(name).join("report.json");
    let meta = std::fs::metadata(&path)
        .map_err(|_| ApiError::NotFound(format!("no eval report `{name}`")))?;
    if meta.len() > MAX_REPORT_BYTES {
        return Err(ApiError::InvalidRequest(format!(
            "eval report `{name}` is larger than {MAX_REPORT_BYTES} bytes"
        )));
    }
    let bytes = std::fs::read(&path)
        .map_err(|e| ApiError::internal(format!("reading eval report {name}: {e}")))?;
    let mut out = report_aggregates(&bytes).ok_or_else(|| {
        ApiError::InvalidRequest(format!("eval report `{name}` is not a report.json"))
    })?;
    out.insert("name".into(), json!(name));
    if let Some(t) = meta.modified().ok().and_then(|t| {
        t.duration_since(std::time::UNIX_EPOCH)
            .ok()
            .and_then(|d| rfc3339_ms(d.as_millis() as i64))
    }) {
        out.insert("modified_at".into(), json!(t));
    }
    Ok(Value::Object(out))
}

/// The [`REPORT_KEYS`] of a `report.json`'s bytes (`None`: not a JSON object). Nothing else of
/// the file is kept (the fuzz target `console_report` checks it).
pub fn report_aggregates(bytes: &[u8]) -> Option<serde_json::Map<String, Value>> {
    let Ok(Value::Object(v)) = serde_json::from_slice::<Value>(bytes) else {
        return None;
    };
    Some(
        REPORT_KEYS
            .iter()
            .filter_map(|k| v.get(*k).map(|x| ((*k).to_owned(), x.clone())))
            .collect(),
    )
}

fn reports_dir(state: &AppState) -> Option<PathBuf> {
    state.config().eval_reports_dir.clone()
}

/// `GET /v1/admin/evals?after=&limit=` → `{"configured", "reports": [{name, modified_at, set,
/// bundle_version, rung, overall}], "next_after"}` from `eval_reports_dir`, by name.
pub async fn evals(
    State(state): State<AppState>,
    Admin(_): Admin,
    Query(p): Query<EvalsParams>,
) -> Result<Json<Value>, ApiError> {
    let limit = page_limit(p.limit)?;
    let after = filter("after", p.after)?;
    let Some(dir) = reports_dir(&state) else {
        return Ok(Json(
            json!({"configured": false, "reports": [], "next_after": null}),
        ));
    };
    blocking(move || {
        let mut names: Vec<String> = match std::fs::read_dir(&dir) {
            Ok(rd) => rd
                .filter_map(Result::ok)
                .filter_map(|e| e.file_name().into_string().ok())
                .filter(|n| valid_report_name(n) && dir.join(n).join("report.json").is_file())
                .collect(),
            Err(e) => {
                return Err(ApiError::internal(format!(
                    "reading eval_reports_dir {}: {e}",
                    dir.display()
                )));
            }
        };
        names.sort();
        names.retain(|n| after.as_deref().is_none_or(|a| n.as_str() > a));
        let (page, more) = split_page(names, limit);
        let reports: Vec<Value> = page
            .iter()
            .map(|n| match read_report(&dir, n) {
                Ok(mut r) => {
                    if let Some(o) = r.as_object_mut() {
                        for k in ["per_kind", "per_phase", "latency_ms"] {
                            o.remove(k);
                        }
                    }
                    r
                }
                Err(e) => json!({"name": n, "error": e.to_string()}),
            })
            .collect();
        let next = more.then(|| page.last().cloned()).flatten();
        Ok(Json(
            json!({"configured": true, "reports": reports, "next_after": next}),
        ))
    })
    .await
}

/// `GET /v1/admin/evals/{name}` → the report's aggregates: `set`, `bundle_version`, `rung`,
/// `overall`, `per_kind`, `per_phase`, `latency_ms` (never its cases).
pub async fn eval(
    State(state): State<AppState>,
    Admin(_): Admin,
    Path(name): Path<String>,
) -> Result<Json<Value>, ApiError> {
    if !valid_report_name(&name) {
        return Err(ApiError::InvalidRequest(
            "a report name is [A-Za-z0-9._-], at most 128 bytes, not starting with a dot".into(),
        ));
    }
    let dir = reports_dir(&state)
        .ok_or_else(|| ApiError::NotFound("no eval_reports_dir is configured".into()))?;
    blocking(move || Ok(Json(read_report(&dir, &name)?))).await
}

// ------------------------------------------------------------------------------------------
// Audit search (admin, auditor)

/// The query of `GET /v1/admin/audit`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AuditParams {
    /// Entries about or by this user.
    pub user: Option<String>,
    /// Entries naming this document id.
    pub doc_id: Option<String>,
    /// At or after this instant (RFC 3339).
    pub since: Option<String>,
    /// Before this instant (RFC 3339).
    pub until: Option<String>,
    /// Only this kind.
    pub kind: Option<String>,
    /// The `next_before` of the previous page.
    pub before: Option<i64>,
    /// Page size [default 50, at most 200].
    pub limit: Option<usize>,
}

/// `GET /v1/admin/audit?user=&doc_id=&since=&until=&kind=&before=&limit=` → `{"entries":
/// [...], "next_before"}`, newest first. Entries hold ids, counts and digests, never content.
pub async fn audit(
    State(state): State<AppState>,
    Admin(_): Admin,
    Query(p): Query<AuditParams>,
) -> Result<Json<Value>, ApiError> {
    let limit = page_limit(p.limit)?;
    let kinds = match p.kind.as_deref() {
        None | Some("") => vec![],
        Some(k) => vec![crate::routes::audit::kind(k)?],
    };
    let q = AuditSearch {
        user: filter("user", p.user)?,
        doc_id: filter("doc_id", p.doc_id)?,
        since: instant("since", p.since.as_deref())?,
        until: instant("until", p.until.as_deref())?,
        kinds,
        before_seq: before(p.before)?,
        limit: limit + 1,
        ..AuditSearch::default()
    };
    let services = state.services()?;
    let rows = blocking(move || Ok(services.acl.audit_search(&q)?)).await?;
    let (rows, more) = split_page(rows, limit);
    let next = more.then(|| rows.last().map(|e| e.seq)).flatten();
    Ok(Json(json!({"entries": rows, "next_before": next})))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_filters_and_report_names_are_checked() {
        assert_eq!(page_limit(None).unwrap(), DEFAULT_PAGE);
        assert_eq!(page_limit(Some(MAX_PAGE)).unwrap(), MAX_PAGE);
        assert!(page_limit(Some(0)).is_err());
        assert!(page_limit(Some(MAX_PAGE + 1)).is_err());
        assert!(filter("q", Some("x".repeat(MAX_FILTER_BYTES + 1))).is_err());
        assert!(filter("q", Some("a\nb".into())).is_err());
        assert_eq!(filter("q", Some(String::new())).unwrap(), None);
        assert!(instant("since", Some("yesterday")).is_err());
        assert!(before(Some(0)).is_err());
        assert!(valid_report_name("bank-dev_2026.12.01"));
        for bad in ["", ".hidden", "../etc", "a/b", "a b", &"x".repeat(129)] {
            assert!(!valid_report_name(bad), "{bad}");
        }
        let (page, more) = split_page(vec![1, 2, 3], 2);
        assert_eq!((page, more), (vec![1, 2], true));
        let (page, more) = split_page(vec![1, 2], 2);
        assert_eq!((page, more), (vec![1, 2], false));
    }
}
