//! What this appliance holds of a source, as one digest (issue 43, "two appliances converge"):
//! two daemons that sync the same source to the same point hold the same documents with the same
//! content and the same readers, so their digests are equal; a document missing, an extra one, a
//! different content version or a reader more or less changes it.
//!
//! Read from the stores themselves, not from the connector's state: every live document whose id
//! is the source's (`alias:item`), in id order, with its content version (the store's hash of
//! title, text, metadata, original and anchors) and its grant (users and groups, sorted).

use airlock_acl::Acl;
use airlock_retrieval::Retrieval;
use airlock_retrieval::{DocumentList, DocumentStatus};
use serde::Serialize;
use sha2::{Digest, Sha256};

use super::sync::doc_id;

/// Documents listed per page of the store's listing.
const PAGE: usize = 1000;

/// One source's holdings.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Holdings {
    /// The source's alias.
    pub source: String,
    /// Live documents of the source.
    pub documents: usize,
    /// Documents of the source that no one may read (an empty grant).
    pub unreadable: usize,
    /// Hex SHA-256 over (doc id, content version, users, groups) of each document, in id order.
    pub digest: String,
}

/// A store could not be read.
#[derive(Debug, thiserror::Error)]
#[error("reading the holdings of `{alias}`: {reason}")]
pub struct HoldingsError {
    alias: String,
    reason: String,
}

/// The holdings of `alias` in `retrieval` and `acl`.
pub fn holdings(alias: &str, retrieval: &Retrieval, acl: &Acl) -> Result<Holdings, HoldingsError> {
    let fail = |reason: String| HoldingsError {
        alias: alias.to_owned(),
        reason,
    };
    let prefix = doc_id(alias, "");
    let mut hasher = Sha256::new();
    let (mut documents, mut unreadable) = (0, 0);
    let mut after = None;
    loop {
        let page = retrieval
            .list_documents(&DocumentList {
                prefix: Some(prefix.clone()),
                status: DocumentStatus::Live,
                after: after.clone(),
                limit: PAGE,
                ..DocumentList::default()
            })
            .map_err(|e| fail(e.to_string()))?;
        let Some(last) = page.last() else { break };
        after = Some(last.doc_id.clone());
        // The listing's prefix is case-insensitive and also matches titles.
        for doc in page.iter().filter(|d| d.doc_id.starts_with(&prefix)) {
            let grants = acl
                .document_grants(&doc.doc_id)
                .map_err(|e| fail(e.to_string()))?
                .unwrap_or_default();
            let mut users = grants.users;
            let mut groups = grants.groups;
            users.sort_unstable();
            groups.sort_unstable();
            if users.is_empty() && groups.is_empty() {
                unreadable += 1;
            }
            field(&mut hasher, b"doc", &doc.doc_id);
            field(&mut hasher, b"version", &doc.version);
            for u in &users {
                field(&mut hasher, b"user", u);
            }
            for g in &groups {
                field(&mut hasher, b"group", g);
            }
            documents += 1;
        }
        if page.len() < PAGE {
            break;
        }
    }
    Ok(Holdings {
        source: alias.to_owned(),
        documents,
        unreadable,
        digest: hex::encode(hasher.finalize()),
    })
}

/// One tagged, length-prefixed field, so no two different holdings hash alike.
fn field(h: &mut Sha256, tag: &[u8], value: &str) {
    h.update(tag);
    h.update((value.len() as u64).to_le_bytes());
    h.update(value.as_bytes());
}
