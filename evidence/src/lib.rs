//! `airlock-evidence`: what the appliance keeps as the record of what it did. It holds the
//! appliance's own tables in `airlock.db` and their migrations ([`feedback`]: the chat
//! completions served and the users' ratings of them; [`conversations`]: the server-kept
//! threads, their turns' sources and parents, and which turns are withheld from their owner),
//! the per-answer receipts built from audit entries and signed ([`receipts`]), the audit log's
//! JSON-lines record and the `[audit_sink]` file ([`audit_sink`]) and the appliance key that
//! signs what leaves the box ([`appliance_key`]), and the data directory's release records
//! ([`upgrade`]: the schema marks `airlock rollback` checks, the index's embedder identity).
//!
//! It must not know HTTP (no axum, no hyper: the routes over these stores and the mapping of
//! their errors to problem details are the server's), the root `Config` (`[audit_sink]` is its
//! own struct with its own `validate`; the data directory and database path are passed in),
//! the answer path, retrieval or models: a turn's sources as they stand now are given to
//! [`conversations::withheld`], and the schema versions a binary supports to
//! [`upgrade::record_mark`], by the caller. It returns its own errors.
#![warn(missing_docs)]

pub mod appliance_key;
pub mod audit_sink;
pub mod conversations;
pub mod feedback;
pub mod receipts;
pub mod upgrade;
