//! `GET /v1/receipts/{id}`: an answer's receipt, signed by the appliance key, for the `auditor`
//! (and `admin`) role. Ids, versions and digests only (see [`airlock_evidence::receipts`]).

use airlock_evidence::receipts;
use axum::extract::{Path, State};
use axum::http::{HeaderValue, header};
use axum::response::{IntoResponse, Response};

use crate::auth::Admin;
use crate::error::ApiError;
use crate::routes::acl::blocking;
use crate::state::AppState;

/// The problem detail of an id that names no receipt.
pub const UNKNOWN_RECEIPT: &str = "no receipt has this id";

/// `GET /v1/receipts/{id}` → the signed receipt file (canonical JSON: save the body as it is
/// and check it with `airlock receipt verify FILE --appliance-key PUB`).
pub async fn get(
    State(state): State<AppState>,
    Admin(_): Admin,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    if !receipts::valid_id(&id) {
        return Err(ApiError::InvalidRequest(format!(
            "`{}` is not a receipt id (`{}` and 32 lowercase hex digits)",
            id.chars().take(64).collect::<String>(),
            receipts::ID_PREFIX
        )));
    }
    let services = state.services()?;
    let Some(key) = services.appliance_key.clone() else {
        tracing::error!("GET /v1/receipts: no appliance key to sign with (run `airlock install`)");
        return Err(ApiError::NotReady);
    };
    let acl = services.acl.clone();
    let entries = blocking(move || Ok(acl.receipt_entries(&id)?)).await?;
    if entries.is_empty() {
        return Err(ApiError::NotFound(UNKNOWN_RECEIPT.into()));
    }
    let receipt = receipts::merge(key.key_id().as_str(), &entries).map_err(ApiError::internal)?;
    let mut resp = receipts::sign(&receipt, &key).into_response();
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    Ok(resp)
}
