//! `GET /v1/models` and `POST /v1/embeddings` (OpenAI shapes).

use axum::Json;
use axum::extract::State;
use base64::Engine as _;
use serde_json::{Value, json};

use crate::auth::Caller;
use crate::error::ApiError;
use crate::extract::ApiJson;
use crate::openai::{EmbeddingInput, EmbeddingsRequest};
use crate::routes::acl::blocking;
use crate::state::AppState;

/// Most inputs per embeddings request.
pub const MAX_EMBED_INPUTS: usize = 256;

/// `GET /v1/models` → `{"object":"list","data":[...]}`.
pub async fn list(State(state): State<AppState>, _caller: Caller) -> Result<Json<Value>, ApiError> {
    let services = state.services()?;
    Ok(Json(json!({"object": "list", "data": services.catalogue})))
}

/// `GET /v1/info` → `{"bundle_version", "daemon_version", "user", "admin"}`: what the web UI shows
/// in its footer and keys saved conversations by. Needs a token like every API route. A caller
/// signed in by the SSO proxy also gets its `csrf_token` (for `X-Airlock-CSRF`, crate::csrf).
pub async fn info(
    State(state): State<AppState>,
    caller: Caller,
    proxy_csrf: Option<axum::Extension<crate::csrf::ProxyCsrf>>,
) -> Result<axum::response::Response, ApiError> {
    use axum::response::IntoResponse;
    let services = state.services()?;
    let mut info = json!({
        "bundle_version": services.bundle_version(),
        "daemon_version": env!("CARGO_PKG_VERSION"),
        "user": caller.user_id,
        "admin": caller.has(airlock_acl::Role::Admin),
        "roles": caller.roles,
        // The server keeps conversations (`/v1/conversations`): the web UI offers them.
        "conversations": services.feedback.is_some(),
        "indexing": indexing(&state, &caller),
    });
    let Some(axum::Extension(crate::csrf::ProxyCsrf(token))) = proxy_csrf else {
        return Ok(Json(info).into_response());
    };
    info["csrf_token"] = Value::String(token);
    let mut resp = Json(info).into_response();
    resp.headers_mut().insert(
        axum::http::header::CACHE_CONTROL,
        axum::http::HeaderValue::from_static("no-store"),
    );
    Ok(resp)
}

/// The background ingest (airlock_serving::ingest_queue) as `GET /v1/info` shows it: `null` when idle;
/// to an operator or admin the job, its counts, rate and estimate, the jobs queued behind it and
/// the finished ones; to anyone else only `{"active": true}` — corpus sizes and names are not
/// theirs to see.
fn indexing(state: &AppState, caller: &Caller) -> Value {
    let status = state.indexing().snapshot();
    let operator = caller.has(airlock_acl::Role::Admin) || caller.has(airlock_acl::Role::Operator);
    if operator {
        if !status.active() && status.finished.is_empty() {
            return Value::Null;
        }
        let mut v = serde_json::to_value(&status).unwrap_or(Value::Null);
        if let Value::Object(m) = &mut v {
            m.insert("active".into(), Value::Bool(status.active()));
        }
        v
    } else if status.active() {
        json!({"active": true})
    } else {
        Value::Null
    }
}

/// `POST /v1/embeddings`: `input` string or array; floats, or base64 of little-endian f32
/// when `encoding_format` is `base64` (the official client's default).
pub async fn embeddings(
    State(state): State<AppState>,
    caller: Caller,
    crate::routes::priority::PriorityHeader(priority): crate::routes::priority::PriorityHeader,
    ApiJson(req): ApiJson<EmbeddingsRequest>,
) -> Result<Json<Value>, ApiError> {
    let services = state.services()?;
    let _ticket = state.admission().admit(&caller, None, priority)?;
    let base64 = match req.encoding_format.as_deref() {
        None | Some("float") => false,
        Some("base64") => true,
        Some(other) => {
            return Err(ApiError::InvalidRequest(format!(
                "encoding_format `{other}` is not `float` or `base64`"
            )));
        }
    };
    let model = match req.model.as_deref() {
        None => embedder_alias(&services.catalogue),
        Some(m) => {
            let card = services
                .catalogue
                .iter()
                .find(|c| c.id == m || c.model == m)
                .ok_or_else(|| ApiError::NotFound(format!("no model `{m}`")))?;
            if card.role != "embedder" {
                return Err(ApiError::InvalidRequest(format!(
                    "model `{m}` is not an embedding model"
                )));
            }
            card.id.clone()
        }
    };
    let texts = match req.input {
        EmbeddingInput::One(s) => vec![s],
        EmbeddingInput::Many(v) => v,
    };
    if texts.is_empty() || texts.len() > MAX_EMBED_INPUTS {
        return Err(ApiError::InvalidRequest(format!(
            "`input` must hold 1 to {MAX_EMBED_INPUTS} texts"
        )));
    }
    if texts.iter().any(|t| t.is_empty()) {
        return Err(ApiError::InvalidRequest(
            "`input` texts must not be empty".into(),
        ));
    }
    let embedder = services.embedder.clone();
    let (vectors, tokens) = blocking(move || {
        let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
        let mut tokens = 0usize;
        for t in &refs {
            tokens += embedder
                .input_ids(t)
                .map_err(|e| ApiError::internal(format!("embedder tokenize: {e}")))?
                .len();
        }
        let v = embedder
            .embed(&refs)
            .map_err(|e| ApiError::internal(format!("embedder: {e}")))?;
        Ok((v, tokens))
    })
    .await?;
    let data: Vec<Value> = vectors
        .into_iter()
        .enumerate()
        .map(|(i, v)| {
            let embedding = if base64 {
                let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
                json!(base64::engine::general_purpose::STANDARD.encode(bytes))
            } else {
                json!(v)
            };
            json!({"object": "embedding", "index": i, "embedding": embedding})
        })
        .collect();
    Ok(Json(json!({
        "object": "list",
        "data": data,
        "model": model,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    })))
}

fn embedder_alias(cards: &[airlock_serving::services::ModelCard]) -> String {
    cards
        .iter()
        .find(|c| c.role == "embedder")
        .map(|c| c.id.clone())
        .unwrap_or_else(|| "airlock-embed".into())
}
