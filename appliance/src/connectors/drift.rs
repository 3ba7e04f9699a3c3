//! The drift check of a source (`POST /v1/connectors/{alias}/verify`): a fresh crawl (the
//! directory and the share's ACLs, nothing written) compared with the grants Airlock holds for
//! the source's documents, user by user. A `leak` is a user Airlock lets read a document the
//! source no longer lets them read; `missing` the reverse (a file new or changed since the last
//! sync, or one whose upsert failed). After a successful sync with no change on the source
//! since, both are empty.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use airlock_connectors::source::{SmbSource, Source};
use serde::Serialize;

use super::config::ConnectorConfig;
use super::store::Store;
use super::sync::doc_id;
use airlock_serving::services::Services;

/// Most mismatches a report lists (the counts are complete).
pub const LISTED: usize = 1000;

/// One document on which Airlock and the source disagree.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct Drift {
    /// The document.
    pub doc_id: String,
    /// Its path on the share now (or at the last sync, for a file gone since).
    pub path: String,
    /// Users Airlock lets read it and the source does not.
    pub leaks: Vec<String>,
    /// Users the source lets read it and Airlock does not.
    pub missing: Vec<String>,
}

/// What a drift check found.
#[derive(Debug, Clone, Default, Serialize, PartialEq, Eq)]
pub struct DriftReport {
    /// Documents compared (the source's items now and at the last sync).
    pub documents_checked: usize,
    /// (user, document) pairs where Airlock grants what the source refuses.
    pub leaks: usize,
    /// (user, document) pairs where the source grants what Airlock refuses.
    pub missing: usize,
    /// The first [`LISTED`] documents with a mismatch.
    pub mismatches: Vec<Drift>,
    /// Files the crawl could not decide (given to nobody): (path, reason).
    pub unreadable: Vec<(String, String)>,
}

/// Runs the check. `Err`: the crawl or a read of the grants failed (nothing is concluded).
pub(super) async fn check(
    cfg: &ConnectorConfig,
    services: Arc<Services>,
    store: Arc<Store>,
) -> Result<DriftReport, String> {
    let (smb, ad) = cfg.library_configs()?;
    let mut source = SmbSource::connect(smb, ad)
        .await
        .map_err(|e| format!("connecting to the share: {e}"))?;
    let directory = source
        .principals()
        .await
        .map_err(|e| format!("reading the directory: {e}"))?;
    let alias = cfg.alias.clone();
    let state = {
        let (store, alias) = (store.clone(), alias.clone());
        tokio::task::spawn_blocking(move || store.state(&alias).map_err(|e| e.to_string()))
            .await
            .map_err(|e| e.to_string())??
    };
    let fresh = source
        .changes(&state, &directory)
        .await
        .map_err(|e| format!("listing the share: {e}"))?
        .next;
    // Per item: its path and who the source lets read it now (nobody for a file gone).
    let mut items: BTreeMap<String, (String, BTreeSet<String>)> = BTreeMap::new();
    for (id, item) in &state.items {
        items.insert(id.clone(), (item.path.clone(), BTreeSet::new()));
    }
    for (id, item) in &fresh.items {
        let users = item.readers.user_names(&directory).into_iter().collect();
        items.insert(id.clone(), (item.path.clone(), users));
    }
    let unreadable = fresh.errors.clone();
    tokio::task::spawn_blocking(move || {
        let mut report = DriftReport {
            documents_checked: items.len(),
            unreadable,
            ..DriftReport::default()
        };
        for (id, (path, source_users)) in items {
            let doc = doc_id(&alias, &id);
            let live = services
                .retrieval
                .document(&doc)
                .map_err(|e| format!("{doc}: {e}"))?
                .is_some_and(|d| d.deleted_at_ms.is_none());
            let held: BTreeSet<String> = if live {
                services
                    .acl
                    .document_grants(&doc)
                    .map_err(|e| format!("{doc}: {e}"))?
                    .map(|g| g.users.into_iter().collect())
                    .unwrap_or_default()
            } else {
                BTreeSet::new()
            };
            let leaks: Vec<String> = held.difference(&source_users).cloned().collect();
            let missing: Vec<String> = source_users.difference(&held).cloned().collect();
            report.leaks += leaks.len();
            report.missing += missing.len();
            if (!leaks.is_empty() || !missing.is_empty()) && report.mismatches.len() < LISTED {
                report.mismatches.push(Drift {
                    doc_id: doc,
                    path,
                    leaks,
                    missing,
                });
            }
        }
        Ok(report)
    })
    .await
    .map_err(|e| e.to_string())?
}
