//! `airlock-eval`: golden-set formats, retrieval and answer metrics, the ACL-leak probe, reports
//! and the release gate against a baseline.
#![warn(missing_docs)]
