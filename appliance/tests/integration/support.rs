//! Shared fixtures for the daemon tests: a ready `AppState` over real stores (SQLite, tantivy,
//! the int8 vector index) and the real MiniLM embedder, plus a request helper for `oneshot`.

use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use airlock::{AppState, Config, Services, app};
use airlock_acl::{Acl, NewUser, Role};
use airlock_evidence::feedback::FeedbackStore;
use airlock_inference::generate::EngineConfig;
use airlock_inference::{Catalogue, Embedder, EmbedderConfig, EmbedderFiles};
use airlock_retrieval::{Retrieval, RetrievalConfig};
use airlock_serving::generator::Generator;
use airlock_serving::services::ModelCard;
use axum::body::Body;
use axum::http::{HeaderMap, Method, Request, StatusCode, header};
use http_body_util::BodyExt;
use serde_json::Value;
use tower::ServiceExt;

/// The model directory (`AIRLOCK_MODELS_DIR` or the repo's `models-cache/models`).
pub fn models_dir() -> PathBuf {
    std::env::var_os("AIRLOCK_MODELS_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../models-cache/models"))
}

/// The shared datasets directory (`AIRLOCK_SHARED_DIR` or the repo's sibling `shared/`).
pub fn shared_dir() -> PathBuf {
    std::env::var_os("AIRLOCK_SHARED_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../shared"))
}

/// The MiniLM embedder, loaded once per test binary.
pub fn embedder() -> Arc<Embedder> {
    static E: OnceLock<Arc<Embedder>> = OnceLock::new();
    E.get_or_init(|| {
        let files = EmbedderFiles::in_dir(&models_dir().join("minilm"));
        Arc::new(
            Embedder::load(
                &files,
                EmbedderConfig {
                    name: "minilm-l6".into(),
                    ..EmbedderConfig::default()
                },
            )
            .expect("load MiniLM from models-cache"),
        )
    })
    .clone()
}

/// The staged demo bundle directory (`models-cache/staging`, made by scripts/fetch-models.sh).
pub fn staging_dir() -> PathBuf {
    std::env::var_os("AIRLOCK_STAGING_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| models_dir().join("../staging"))
}

/// Loads SmolLM2 (served as `airlock-small`) from the staged bundle with its own engine.
pub fn load_smollm2() -> Arc<Generator> {
    let cat = Catalogue::from_bundle_dir(&staging_dir()).expect("staged catalogue");
    let entry = cat.by_id("smollm2").expect("smollm2 in the catalogue");
    let files = cat.generator_files(entry).unwrap();
    Arc::new(
        Generator::load(
            "airlock-small",
            "smollm2",
            &files,
            EngineConfig {
                n_ctx: 2048,
                ..EngineConfig::default()
            },
        )
        .expect("load SmolLM2"),
    )
}

/// SmolLM2, loaded once per test binary (tests that count engine steps load their own).
pub fn smollm2() -> Arc<Generator> {
    static G: OnceLock<Arc<Generator>> = OnceLock::new();
    G.get_or_init(load_smollm2).clone()
}

/// A catalogue for the test daemon: the small generator and the embedder.
pub fn catalogue() -> Vec<ModelCard> {
    [
        ("airlock-small", "generator", "smollm2"),
        ("airlock-embed", "embedder", "minilm-l6"),
    ]
    .into_iter()
    .map(|(id, role, model)| ModelCard {
        id: id.into(),
        object: "model",
        created: 0,
        owned_by: "airlock",
        role: role.into(),
        model: model.into(),
    })
    .collect()
}

/// The default config with timeouts long enough for debug builds on a loaded machine, and the
/// load-driven ladder off (a debug build's multi-second waits would rightly degrade or shed;
/// tests of the ladder turn it on).
pub fn test_config() -> Config {
    Config {
        request_timeout_secs: Some(900),
        stream_idle_timeout_secs: Some(900),
        ladder: Some(false),
        ..Config::default()
    }
}

/// A ready daemon over fresh stores in a temporary directory, with one local admin.
pub struct TestApp {
    /// The state (also usable to build more routers).
    pub state: AppState,
    /// The admin's bearer token.
    pub admin: String,
    /// Keeps the data directory alive.
    pub _dir: tempfile::TempDir,
}

impl TestApp {
    /// Builds the app with the default config, except for generous timeouts: a shared 2-core
    /// machine under load can take minutes per generation in a debug build.
    pub fn new() -> Self {
        Self::with_config(test_config())
    }

    /// Builds the app with `config` (validated).
    pub fn with_config(config: Config) -> Self {
        Self::with_generator(config, smollm2())
    }

    /// Builds the app with `config` and a given generator.
    pub fn with_generator(config: Config, generator: Arc<Generator>) -> Self {
        let _ = tracing_subscriber::fmt()
            .with_test_writer()
            .with_env_filter("warn")
            .try_init();
        let dir = tempfile::tempdir().unwrap();
        let services = open_services(dir.path(), generator);
        Self::from_services(config, services, dir)
    }

    /// Builds the app with `config`, SmolLM2 as the local generator and the remote
    /// generators `remotes` (already connected).
    pub fn with_remotes(
        config: Config,
        remotes: Vec<Arc<airlock_serving::remote::RemoteGenerator>>,
    ) -> Self {
        let _ = tracing_subscriber::fmt()
            .with_test_writer()
            .with_env_filter("warn")
            .try_init();
        let dir = tempfile::tempdir().unwrap();
        let services = open_services(dir.path(), smollm2()).with_remotes(remotes);
        Self::from_services(config, services, dir)
    }

    /// Builds the app over `services` opened elsewhere (e.g. by `startup::open` from an
    /// installed bundle) in `dir`, with one local admin.
    pub fn from_services(config: Config, services: Services, dir: tempfile::TempDir) -> Self {
        config.validate().expect("valid test config");
        let services = services.with_extractor(test_extractor(&config));
        let admin = services
            .acl
            .add_user(
                "test",
                "admin",
                &NewUser {
                    groups: vec![],
                    roles: vec![Role::Admin, Role::Operator],
                    local: true,
                },
            )
            .unwrap();
        let state = AppState::ready(config, services);
        TestApp {
            state,
            admin,
            _dir: dir,
        }
    }

    /// Restarts the daemon over the same data directory: the services are withdrawn and
    /// dropped (closing the stores), then everything is reopened from disk into a new state
    /// with the same config. Tokens, documents and feedback survive; in-memory quotas do not.
    pub fn restart(&mut self) {
        let old = self.state.clear_services().expect("the app was ready");
        let generator = old.generators[0].clone();
        let config = self.state.config().clone();
        drop(old);
        let services =
            open_services(self._dir.path(), generator).with_extractor(test_extractor(&config));
        self.state = AppState::ready(config, services);
    }

    /// Adds a (non-local) user with groups and returns their token.
    pub fn user(&self, id: &str, groups: &[&str]) -> String {
        self.add_user(id, groups, vec![])
    }

    /// Adds a (non-local) admin and operator with groups and returns their token.
    pub fn admin_user(&self, id: &str, groups: &[&str]) -> String {
        self.add_user(id, groups, vec![Role::Admin, Role::Operator])
    }

    /// Adds a local user (an IAM sync keeps it: an operator account) with `roles` and returns
    /// their token.
    pub fn local_user(&self, id: &str, roles: Vec<Role>) -> String {
        self.state
            .services()
            .unwrap()
            .acl
            .add_user(
                "test",
                id,
                &NewUser {
                    groups: vec![],
                    roles,
                    local: true,
                },
            )
            .unwrap()
    }

    /// Adds a (non-local) user with groups and roles and returns their token.
    pub fn add_user(&self, id: &str, groups: &[&str], roles: Vec<Role>) -> String {
        self.state
            .services()
            .unwrap()
            .acl
            .add_user(
                "test",
                id,
                &NewUser {
                    groups: groups.iter().map(|g| g.to_string()).collect(),
                    roles,
                    local: false,
                },
            )
            .unwrap()
    }

    /// A one-time approval of `change` (`POST /v1/acl/approvals`' body) by a second operator,
    /// `approver` (admin and operator, local; created on first use), for a request's
    /// `X-Airlock-Approval` header (four eyes, crate::approvals).
    pub async fn approval(&self, change: Value) -> String {
        let acl = self.state.services().unwrap().acl.clone();
        let token = match acl.user("approver") {
            Some(_) => acl.issue_token("test", "approver").unwrap(),
            None => acl
                .add_user(
                    "test",
                    "approver",
                    &NewUser {
                        groups: vec![],
                        roles: vec![Role::Admin, Role::Operator],
                        local: true,
                    },
                )
                .unwrap(),
        };
        let r = self
            .call(
                Method::POST,
                "/v1/acl/approvals",
                Some(&token),
                Some(change),
            )
            .await;
        assert_eq!(r.status, StatusCode::CREATED, "{}", r.text);
        r.json["approval"].as_str().unwrap().to_owned()
    }

    /// Sends one request through `app()` with `oneshot`.
    pub async fn call(
        &self,
        method: Method,
        uri: &str,
        token: Option<&str>,
        body: Option<Value>,
    ) -> Resp {
        self.call_with(method, uri, token, &[], body).await
    }

    /// [`TestApp::call`] with extra request headers.
    pub async fn call_with(
        &self,
        method: Method,
        uri: &str,
        token: Option<&str>,
        headers: &[(&str, &str)],
        body: Option<Value>,
    ) -> Resp {
        let mut b = Request::builder().method(method).uri(uri);
        if let Some(t) = token {
            b = b.header(header::AUTHORIZATION, format!("Bearer {t}"));
        }
        for (k, v) in headers {
            b = b.header(*k, *v);
        }
        let req = match body {
            Some(v) => b
                .header(header::CONTENT_TYPE, "application/json")
                .body(Body::from(serde_json::to_vec(&v).unwrap()))
                .unwrap(),
            None => b.body(Body::empty()).unwrap(),
        };
        self.send(req).await
    }

    /// Sends a prepared request.
    pub async fn send(&self, req: Request<Body>) -> Resp {
        let resp = app(self.state.clone()).oneshot(req).await.unwrap();
        let status = resp.status();
        let headers = resp.headers().clone();
        let bytes = resp.into_body().collect().await.unwrap().to_bytes();
        let text = String::from_utf8_lossy(&bytes).into_owned();
        let json = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
        Resp {
            status,
            headers,
            text,
            json,
        }
    }
}

/// The daemon's extractor for `config` (budgeted workers), running the `airlock` binary: in a
/// test process `/proc/self/exe` is the test harness, not `airlock`.
pub fn test_extractor(config: &Config) -> airlock_serving::extraction::Extractor {
    airlock_serving::extraction::Extractor::Child(airlock_serving::extraction::ChildExtractor::new(
        airlock_serving::extraction::ChildProgram {
            path: env!("CARGO_BIN_EXE_airlock").into(),
            require_sandbox: false,
        },
        config.extract_budget(),
    ))
}

/// Opens the stores (ACL, documents and indexes, feedback) in `dir` as the daemon does and
/// assembles the services with the test catalogue and `generator`.
fn open_services(dir: &Path, generator: Arc<Generator>) -> Services {
    let db = dir.join("airlock.db");
    let acl = Arc::new(Acl::open(&db).unwrap());
    let embedder = embedder();
    let retrieval = Arc::new(
        Retrieval::open(
            &db,
            &dir.join("index"),
            RetrievalConfig::default(),
            Arc::new(airlock_serving::models::EmbedAdapter(embedder.clone())),
            None,
        )
        .unwrap(),
    );
    let feedback = Arc::new(FeedbackStore::open(&db).unwrap());
    Services::new(
        acl,
        retrieval,
        embedder,
        catalogue(),
        vec![generator],
        "1.0.0-test".into(),
    )
    .with_feedback(feedback)
    .with_appliance_key(airlock_evidence::appliance_key::ensure(dir).unwrap())
}

/// A daemon served on a real loopback socket until dropped.
pub struct Served {
    /// `http://127.0.0.1:PORT`.
    pub base: String,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    handle: Option<tokio::task::JoinHandle<std::io::Result<airlock::server::Drained>>>,
}

impl Served {
    /// Stops accepting, drains, and reports how the drain ended.
    pub async fn shutdown(mut self) -> airlock::server::Drained {
        let _ = self.stop.take().unwrap().send(());
        self.handle.take().unwrap().await.unwrap().unwrap()
    }
}

impl TestApp {
    /// Serves the app on `127.0.0.1:0` with graceful shutdown (grace from the config).
    pub async fn serve(&self) -> Served {
        self.serve_with(None).await
    }

    /// [`TestApp::serve`], over HTTPS when `tls` is given (`base` is then `https://…`).
    pub async fn serve_with(&self, tls: Option<Arc<airlock::tls::TlsServer>>) -> Served {
        let scheme = if tls.is_some() { "https" } else { "http" };
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let grace = self.state.config().shutdown_grace();
        let state = self.state.clone();
        let handle = tokio::spawn(async move {
            airlock::server::serve_with(
                listener,
                state,
                tls,
                async move {
                    let _ = rx.await;
                },
                grace,
            )
            .await
        });
        Served {
            base: format!("{scheme}://{addr}"),
            stop: Some(tx),
            handle: Some(handle),
        }
    }
}

/// A collected response.
#[derive(Debug)]
pub struct Resp {
    /// Status.
    pub status: StatusCode,
    /// Headers.
    pub headers: HeaderMap,
    /// Body as text.
    pub text: String,
    /// Body as JSON (`Null` if not JSON).
    pub json: Value,
}

impl Resp {
    /// Asserts a problem body exactly (type, title, status, detail) and its content type.
    pub fn assert_problem(&self, status: u16, slug: &str, detail: &str) {
        assert_eq!(self.status.as_u16(), status, "{}", self.text);
        assert_eq!(
            self.headers.get(header::CONTENT_TYPE).unwrap(),
            "application/problem+json",
            "{}",
            self.text
        );
        assert_eq!(self.json, problem_json(status, slug, detail));
    }
}

/// A problem body exactly as the daemon writes it (RFC 9457 members and the OpenAI-style
/// `error` member).
pub fn problem_json(status: u16, slug: &str, detail: &str) -> serde_json::Value {
    let title = axum::http::StatusCode::from_u16(status)
        .unwrap()
        .canonical_reason()
        .unwrap();
    let class = match status {
        401 => "authentication_error",
        403 => "permission_error",
        404 => "not_found_error",
        429 => "rate_limit_error",
        503 => "overloaded_error",
        s if s >= 500 => "server_error",
        _ => "invalid_request_error",
    };
    serde_json::json!({
        "type": format!("https://airlock.local/problems/{slug}"),
        "title": title,
        "status": status,
        "detail": detail,
        "error": {
            "message": detail,
            "type": class,
            "code": slug.replace('-', "_"),
            "param": null,
        },
    })
}

/// A staging directory with only the embedder and the small generator (hard links).
pub fn small_staging(dst: &Path) {
    staging_of(dst, &["minilm", "smollm2"]);
}

/// A staging directory with only the staged models `ids` (hard links).
pub fn staging_of(dst: &Path, ids: &[&str]) {
    let src = staging_dir();
    let cat: Vec<Value> =
        serde_json::from_slice(&std::fs::read(src.join("catalogue.json")).unwrap()).unwrap();
    let keep: Vec<Value> = cat
        .into_iter()
        .filter(|e| ids.iter().any(|id| e["id"] == *id))
        .collect();
    assert_eq!(
        keep.len(),
        ids.len(),
        "staged catalogue lacks one of {ids:?}"
    );
    for e in &keep {
        for f in e["files"].as_array().unwrap() {
            let rel = f.as_str().unwrap();
            let to = dst.join(rel);
            std::fs::create_dir_all(to.parent().unwrap()).unwrap();
            std::fs::hard_link(src.join(rel), &to)
                .or_else(|_| std::fs::copy(src.join(rel), &to).map(|_| ()))
                .unwrap();
        }
    }
    std::fs::write(
        dst.join("catalogue.json"),
        serde_json::to_vec_pretty(&keep).unwrap(),
    )
    .unwrap();
}

/// Runs the real `airlock` binary with `args`, without the environment variables a developer's
/// shell may set for it (data dir, config, CA file, log filter); its stderr is echoed for the
/// test log.
pub fn airlock_cli(args: &[&str]) -> std::process::Output {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_airlock"))
        .args(args)
        .env_remove("AIRLOCK_DATA")
        .env_remove("AIRLOCK_CONFIG")
        .env_remove("AIRLOCK_CA_FILE")
        .env_remove("AIRLOCK_LOG")
        .output()
        .unwrap();
    eprintln!(
        "airlock {}: {}\n{}",
        args.join(" "),
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    out
}
