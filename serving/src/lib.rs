//! `airlock-serving`: what serves an answer. It holds the per-user quotas ([`quota`]), the
//! load-driven degradation ladder ([`ladder`]), the models as retrieval's seams ([`models`]),
//! the local generators ([`generator`]) and the metrics of the bank's inference rack
//! ([`rack_metrics`]).
//!
//! It must not know HTTP servers (no axum, no tower: the routes, extractors and the one
//! error → HTTP status map are the binary's), the root `Config` (each section here is its own
//! struct with its own `validate`) or the binary (`airlock`). It returns its own errors; its
//! metrics are handles the binary registers in its Prometheus registry.
#![warn(missing_docs)]

pub mod generator;
pub mod ladder;
pub mod models;
pub mod quota;
pub mod rack_metrics;
pub mod remote;
