//! `airlock`: the appliance. CLI, config, daemon wiring, HTTP API, auth, admission and the
//! degradation ladder, metrics, web UI assets and egress lockdown. The only crate that wires the
//! other crates together.
//!
//! The daemon is [`app`]: one `axum::Router` built from an [`AppState`], used unchanged by
//! `airlock serve`, the integration tests and the evals.
#![warn(missing_docs)]

pub mod approvals;
pub mod auth;
pub mod backup;
pub mod cli;
pub mod config;
pub mod connector_metrics;
pub mod connectors;
pub mod csrf;
pub mod document_write;
pub mod error;
pub mod extract;
pub mod extraction_child;
#[doc(hidden)]
pub mod fuzzing;
pub mod metrics;
pub mod openai;
pub mod roles;
pub mod routes;
pub mod sbom;
pub mod server;
mod serving_metrics;
pub mod session;
pub mod startup;
pub mod state;
pub mod tls;

pub use airlock_serving::services::Services;
pub use config::Config;
pub use error::ApiError;
pub use routes::app;
pub use state::AppState;
