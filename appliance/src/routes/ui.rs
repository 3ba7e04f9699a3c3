//! The web UI: static files from `appliance/ui/` embedded in the binary and served at `/`.
//! No authentication here: the page signs in with a bearer token and calls the API itself. In
//! trusted-header mode the page carries [`SSO_META`], and the page first asks `GET /v1/info`
//! without a token: behind the SSO proxy that answers 200 and no token prompt is shown.

use axum::Router;
use axum::extract::{Path, State};
use axum::http::{HeaderValue, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use include_dir::{Dir, include_dir};

use crate::error::ApiError;
use crate::state::AppState;

static UI: Dir<'static> = include_dir!("$CARGO_MANIFEST_DIR/ui");

/// The page's Content-Security-Policy (it uses no inline scripts or styles).
pub const CSP: &str = "default-src 'self'; script-src 'self'; style-src 'self'; connect-src 'self'; \
img-src 'self' data:; frame-ancestors 'none'; base-uri 'none'; form-action 'self'; object-src 'none'";

/// Added to the page's head in trusted-header mode (the page then tries the proxy's sign-in).
pub const SSO_META: &str = r#"<meta name="airlock-sign-in" content="proxy">"#;

/// `GET /`, `GET /app.css`, `GET /js/{file}`, and the operator console `GET /admin`,
/// `GET /admin.css`.
pub fn routes() -> Router<AppState> {
    Router::new()
        .route("/", get(index))
        .route("/index.html", get(index))
        .route("/app.css", get(|| async { asset("app.css") }))
        // The operator console (its data comes from `/v1/admin/...`, behind the role table).
        .route("/admin", get(|| async { asset("admin.html") }))
        .route("/admin.css", get(|| async { asset("admin.css") }))
        .route("/js/{file}", get(js))
}

fn mime(path: &str) -> Option<&'static str> {
    match path.rsplit_once('.').map(|(_, e)| e) {
        Some("html") => Some("text/html; charset=utf-8"),
        Some("css") => Some("text/css; charset=utf-8"),
        Some("js") => Some("text/javascript; charset=utf-8"),
        _ => None,
    }
}

fn asset(path: &str) -> Response {
    let (Some(file), Some(ct)) = (UI.get_file(path), mime(path)) else {
        return ApiError::NotFound("no such route".into()).into_response();
    };
    let mut resp = file.contents().into_response();
    let h = resp.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static(ct));
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    if ct.starts_with("text/html") {
        h.insert(
            header::CONTENT_SECURITY_POLICY,
            HeaderValue::from_static(CSP),
        );
        h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
        h.insert(
            header::REFERRER_POLICY,
            HeaderValue::from_static("no-referrer"),
        );
    }
    resp
}

async fn index(State(state): State<AppState>) -> Response {
    let mut resp = asset("index.html");
    if state.config().trusted_header.is_some()
        && let Some(html) = UI.get_file("index.html").and_then(|f| f.contents_utf8())
    {
        let html = html.replacen("</head>", &format!("  {SSO_META}\n</head>"), 1);
        *resp.body_mut() = axum::body::Body::from(html);
    }
    resp
}

async fn js(Path(file): Path<String>) -> Response {
    if file.contains('/') || file.contains("..") {
        return ApiError::NotFound("no such route".into()).into_response();
    }
    asset(&format!("js/{file}"))
}
