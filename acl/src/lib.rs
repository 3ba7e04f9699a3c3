//! `airlock-acl`: the single authority on who may read what.
//!
//! Owns principals (users, groups, roles), document grants, IAM snapshot sync, the per-user
//! materialised bitmaps of readable document ordinals, the generation-time re-check and the audit
//! log. It does not own documents or their content (that is `airlock-retrieval`); it does own the
//! mapping from external document ids to dense `u32` ordinals, because grants can name a document
//! before it is ingested.
//!
//! The only way to get an [`AllowSet`] is to ask this crate for a user's set at a point in time, so
//! a search without access control cannot be written.
#![warn(missing_docs)]

mod allow;
pub mod ordinals;

pub use allow::AllowSet;
