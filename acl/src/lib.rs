//! `airlock-acl`: the single authority on who may read what.
//!
//! Owns principals (users, groups, roles), bearer tokens, document grants, IAM snapshot sync,
//! the per-user readable sets of document ordinals, the generation-time re-check and the audit
//! log. It does not own documents or their content (that is `airlock-retrieval`);
//! it does own the mapping from external document ids to dense `u32` ordinals ([`ordinals`]),
//! because grants can name a document before it is ingested.
//!
//! The model is deny-by-default: a document is readable by the users its grant names and by the
//! members of the groups it names, and by nobody if it has no grant. Group and user ids are
//! opaque, case-sensitive strings in separate namespaces (`hr-newsletter` grants nothing of
//! `hr`). Roles (`admin`) open admin endpoints and never grant documents.
//!
//! State lives in SQLite (the appliance's database file, `acl_*` tables plus the shared
//! `doc_ordinals`, WAL, versioned migrations). [`Acl::open`] loads it into two levels of shared
//! bitmaps: group → documents and user → documents granted by name. A user's readable set is the
//! union of their groups' bitmaps and their own, so memory grows with the distinct grants, not
//! with users × documents; a request materialises it once ([`AclSnapshot::allow_set`], cached
//! in a bounded LRU) and `can_read` probes the few bitmaps. Each change copies only the bitmaps
//! it edits (copy on write), rebuilds only the affected users' entries and publishes a new
//! immutable state with one atomic swap, so a reader sees the old or the new state, never a
//! mix.
//!
//! The only way to get an [`AllowSet`] is to ask this crate for a user's set at a point in time,
//! so a search without access control cannot be written.
#![warn(missing_docs)]

mod acl;
mod allow;
pub mod audit;
mod console;
mod error;
#[doc(hidden)]
pub mod fuzzing;
mod model;
pub mod ordinals;
pub mod session;
mod sets;
mod snapshot;
mod store;
pub mod token;
mod view;

pub use acl::{
    Acl, Actor, DocGrants, GrantOutcome, NewUser, PutUserOutcome, SyncCounts, SyncOptions, UserSpec,
};
pub use allow::AllowSet;
pub use audit::{AuditEntry, AuditKind, AuditQuery, AuditSink};
pub use console::AuditSearch;
pub use error::{Error, IdKind, LineError, MAX_ID_BYTES};
pub use model::{Role, materialise};
pub use session::{NewSession, SessionCaller, SignIn, TokenInfo};
pub use sets::CacheUse;
pub use snapshot::MAX_REPORTED_LINE_ERRORS;
pub use store::SCHEMA_VERSION;
pub use view::{AclSnapshot, Principal, SetMemory, UserInfo};
