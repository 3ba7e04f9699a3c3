//! The one write of a document with its grant: content and grant in one SQLite transaction
//! (`PUT /v1/documents` with an `acl`, `airlock ingest DIR` with a sidecar rule, the
//! connectors' upserts). A leaf of the appliance's modules so that the HTTP routes and the
//! daemon's connectors both use it without importing each other.

use airlock_acl::{Acl, Actor, DocGrants};
use airlock_retrieval::{Retrieval, Staged, UpsertOutcome};

use crate::error::ApiError;

/// Stores a staged document and its grant in one SQLite transaction (`PUT /v1/documents` with
/// an `acl`, `airlock ingest DIR` with a sidecar rule): the old version's chunks are hidden
/// before the new grant applies, the new chunks appear after it.
pub fn store_with_grant(
    acl: &Acl,
    retrieval: &Retrieval,
    actor: Actor<'_>,
    doc_id: &str,
    grants: &DocGrants,
    staged: Staged,
) -> Result<UpsertOutcome, ApiError> {
    retrieval.upsert_joined(staged, |joint| {
        let joint = std::cell::RefCell::new(joint);
        acl.set_document_grants_with(
            actor,
            doc_id,
            grants,
            |tx| {
                joint
                    .borrow_mut()
                    .write(tx)
                    .map_err(|e| airlock_acl::Error::Joined {
                        source: Box::new(e),
                    })
            },
            || joint.borrow_mut().hide_replaced(),
        )?;
        Ok::<_, ApiError>(())
    })
}
