//! The connectors' API (operator): `GET /v1/connectors` (each source's state),
//! `POST /v1/connectors/{alias}/sync` (a sync now), `POST /v1/connectors/{alias}/verify` (the
//! drift check) and `GET /v1/connectors/{alias}/holdings` (what this appliance holds of the
//! source, as one digest to compare with another appliance's). The syncs themselves run in the daemon (crate::connectors): the API only asks.

use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use crate::auth::Admin;
use crate::connectors::TriggerError;
use crate::error::ApiError;
use crate::extract::RequestId;
use crate::routes::acl::{actor_of, blocking};
use crate::state::AppState;

/// `GET /v1/connectors` → `{"data": [SourceStatus...]}`: per source, whether a sync runs, the
/// last success, the last run (error and counts), the items held, per-item errors and the
/// principals the directory does not know. No document content.
pub async fn list(State(state): State<AppState>, Admin(_): Admin) -> Result<Json<Value>, ApiError> {
    state.services()?;
    let Some(connectors) = state.connectors().cloned() else {
        return Ok(Json(json!({"data": []})));
    };
    let status = blocking(move || connectors.status().map_err(ApiError::internal)).await?;
    Ok(Json(json!({"data": status})))
}

/// A refused trigger: 404 for an alias not configured, 409 while a sync of it runs.
fn refused(e: TriggerError) -> ApiError {
    match e {
        TriggerError::Unknown(_) => ApiError::NotFound(e.to_string()),
        TriggerError::AlreadyRunning(_) => ApiError::Conflict(e.to_string()),
    }
}

/// The daemon's connectors, or the 404 an alias gets when none is configured.
fn configured(
    state: &AppState,
    alias: &str,
) -> Result<std::sync::Arc<crate::connectors::Connectors>, ApiError> {
    state
        .connectors()
        .cloned()
        .ok_or_else(|| refused(TriggerError::Unknown(alias.to_owned())))
}

/// `POST /v1/connectors/{alias}/sync` → 202 `{"source", "status": "requested"}`: the source's
/// task starts a sync now. 404 for an alias not configured, 409 while one runs or is requested.
pub async fn sync(
    State(state): State<AppState>,
    Admin(actor): Admin,
    RequestId(request_id): RequestId,
    Path(alias): Path<String>,
) -> Result<Response, ApiError> {
    let services = state.services()?;
    let connectors = configured(&state, &alias)?;
    connectors.request_sync(&alias).map_err(refused)?;
    let source = alias.clone();
    blocking(move || {
        services.acl.audit_admin(
            actor_of(&actor, &request_id),
            json!({"action": "connector_sync_requested", "source": source}),
        )?;
        Ok(())
    })
    .await?;
    Ok((
        StatusCode::ACCEPTED,
        Json(json!({"source": alias, "status": "requested"})),
    )
        .into_response())
}

/// `POST /v1/connectors/{alias}/verify` → 200 `DriftReport`: a fresh crawl of the source (the
/// directory and the share's ACLs; nothing written) compared with the grants Airlock holds,
/// user by user (`leaks`: Airlock grants what the source refuses; `missing`: the reverse). 404
/// for an unknown alias, 409 while a sync of it runs, 502 `upstream-failed` when the crawl
/// fails. Audited (`connector_verify`, with the counts).
pub async fn verify(
    State(state): State<AppState>,
    Admin(actor): Admin,
    RequestId(request_id): RequestId,
    Path(alias): Path<String>,
) -> Result<Json<crate::connectors::DriftReport>, ApiError> {
    let services = state.services()?;
    let connectors = configured(&state, &alias)?;
    let report = connectors
        .verify(&alias, services.clone())
        .await
        .map_err(refused)?
        .map_err(|e| ApiError::UpstreamFailed(format!("connector `{alias}`: {e}")))?;
    let detail = json!({"action": "connector_verify", "source": alias,
        "documents_checked": report.documents_checked, "leaks": report.leaks,
        "missing": report.missing});
    blocking(move || {
        services
            .acl
            .audit_admin(actor_of(&actor, &request_id), detail)?;
        Ok(())
    })
    .await?;
    Ok(Json(report))
}

/// `GET /v1/connectors/{alias}/holdings` → 200 `{"source", "documents", "unreadable", "digest"}`:
/// a digest of the source's live documents in this appliance (id, content version, users and
/// groups granted), equal on two appliances that synced the same source to the same point (the
/// HA check, docs/operations/connectors.md). 404 for an alias not configured. Reads only.
pub async fn holdings(
    State(state): State<AppState>,
    Admin(_): Admin,
    Path(alias): Path<String>,
) -> Result<Json<crate::connectors::Holdings>, ApiError> {
    let services = state.services()?;
    let connectors = configured(&state, &alias)?;
    let holdings = blocking(move || match connectors.holdings(&alias, &services) {
        Err(e) => Err(refused(e)),
        Ok(h) => h.map_err(ApiError::internal),
    })
    .await?;
    Ok(Json(holdings))
}
