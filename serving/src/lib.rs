//! `airlock-serving`: what serves an answer. It holds the services a ready daemon answers from
//! ([`services`]: the ACL, retrieval, the models and generators, the rack, the extractor, the
//! bundle's identity), admission ([`admission`]: the one gate every model-bound request
//! passes, with its `AdmissionSettings` section and its own `AdmissionError`), the per-user
//! quotas ([`quota`]), the load-driven degradation ladder ([`ladder`]), the models as
//! retrieval's seams ([`models`]), the local generators ([`generator`]), the generators on the
//! bank's inference rack ([`remote`]: OpenAI-compatible upstreams through
//! `airlock_platform::egress`, replicas, circuit breaker, the engines' own metrics, the
//! `[[remote_generators]]` section and its checks), the queue of corpora a daemon thread
//! ingests while it serves ([`ingest_queue`]), the budgeted extraction of uploaded files in
//! worker processes ([`extraction`]: the parent's pool, its `[extract]` budget and the frames;
//! the worker's own side, `airlock extract --child`, is the binary's) and the metric handles it
//! counts with ([`metrics`], [`rack_metrics`]).
//!
//! It must not know the HTTP server (no axum, no tower, no hyper: the routes, extractors and
//! the one error → HTTP status map are the binary's; the rack is reached through the
//! platform's egress client), the root `Config` (each section here is its own struct with its
//! own checks) or the binary (`airlock`). It returns its own errors; its metrics are handles
//! the binary registers in its Prometheus registry.
#![warn(missing_docs)]

pub mod admission;
pub mod answer;
pub mod extraction;
pub mod generator;
pub mod ingest_queue;
pub mod ladder;
pub mod metrics;
pub mod models;
pub mod quota;
pub mod rack_metrics;
pub mod remote;
pub mod services;
