//! `airlock-eval`: golden-set formats, retrieval and answer metrics, the ACL-leak probe, reports
//! and the release gate against a baseline.
//!
//! It owns no retrieval or generation of its own: it reads sets (BEIR layout for retrieval, the
//! Airlock golden JSONL for end-to-end cases), scores what a daemon returned, and decides whether a
//! release may ship. It talks to a daemon over the public HTTP API (the `airlock` crate drives it),
//! so evals measure exactly what users get.
#![warn(missing_docs)]

pub mod client;
mod error;
pub mod export;
pub mod formats;
#[doc(hidden)]
pub mod fuzzing;
pub mod gate;
pub mod html;
pub mod metrics;
pub mod runner;

pub use error::Error;
