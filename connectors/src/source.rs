//! The connector framework: a [`Source`] lists what changed since its last sync, fetches a
//! document's bytes, and resolves principals; [`SourceState`] is what a source remembers
//! between syncs (per item: path, content version, readers; last success; per-item errors).
//!
//! A sync is all-or-nothing: a failed listing or directory read returns an error and the state
//! is not advanced, so an unreachable source never reads as "everything was deleted".
//! Changes are typed so the daemon can apply a permission-only change as an ACL update
//! without re-extracting or re-embedding.

use std::collections::BTreeMap;

use crate::access::Readers;
use crate::directory::Directory;
use crate::smb::{FileAccess, Listing, SmbConfig, SmbError, SmbShare};

/// A document's identity in its source (for SMB: the server's file id, stable across renames
/// and moves within the share).
pub type ItemId = String;

/// What the daemon must do for one item.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Change {
    /// New or changed content: fetch, extract, embed, store with these readers.
    Upsert {
        /// The item.
        id: ItemId,
        /// Its current path.
        path: String,
        /// Its content version (changes when the bytes may have).
        version: String,
        /// Who may read it.
        readers: Readers,
    },
    /// Same content, new path (renamed or moved): update the metadata only.
    Moved {
        /// The item.
        id: ItemId,
        /// Its new path.
        path: String,
    },
    /// Same content, different readers: an ACL update, no re-extraction, no re-embedding.
    Permissions {
        /// The item.
        id: ItemId,
        /// Who may read it now (possibly nobody).
        readers: Readers,
    },
    /// Gone from the source: a tombstone.
    Delete {
        /// The item.
        id: ItemId,
    },
}

/// What a source remembers of one item.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ItemState {
    /// Its path.
    pub path: String,
    /// Its content version.
    pub version: String,
    /// Its readers at the last sync.
    pub readers: Readers,
}

/// A source's state between syncs. Every field has a default, so `{}` (a source whose first
/// sync failed: no state yet) reads as the empty state.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct SourceState {
    /// Items by id.
    pub items: BTreeMap<ItemId, ItemState>,
    /// Unix seconds of the last successful sync.
    pub last_success: Option<u64>,
    /// Items the last sync could not handle (path, reason): reported, given to nobody.
    pub errors: Vec<(String, String)>,
    /// Principals the source's permissions name that the directory does not know (they grant
    /// nobody anything): reported.
    #[serde(default)]
    pub unknown_principals: Vec<String>,
}

impl SourceState {
    /// What Airlock holds once this state is applied, by path: each item's readers, and the
    /// items that could not be read as unreadable (given to nobody) — the input of
    /// [`crate::verify::verify`].
    pub fn decisions(&self) -> BTreeMap<String, FileAccess> {
        let mut out: BTreeMap<String, FileAccess> = self
            .items
            .values()
            .map(|i| (i.path.clone(), FileAccess::Readers(i.readers.clone())))
            .collect();
        for (path, why) in &self.errors {
            out.insert(path.clone(), FileAccess::Unreadable(why.clone()));
        }
        out
    }
}

/// The result of listing a source: the changes and the state to keep once they are applied.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Changes {
    /// What to do, deletions last.
    pub changes: Vec<Change>,
    /// The state after applying them (store it only once every change is written).
    pub next: SourceState,
}

/// A source of documents that keeps its permissions.
#[allow(async_fn_in_trait)]
pub trait Source {
    /// Why a sync failed (as a whole).
    type Error: std::error::Error;
    /// The identities the source's permissions name, with their tokens.
    async fn principals(&mut self) -> Result<Directory, Self::Error>;
    /// What changed since `state`, with readers computed against `directory`.
    async fn changes(
        &mut self,
        state: &SourceState,
        directory: &Directory,
    ) -> Result<Changes, Self::Error>;
    /// The bytes of an item at `path`.
    async fn fetch(&mut self, path: &str) -> Result<Vec<u8>, Self::Error>;
}

/// The changes that take `state` to what `listing` and `decisions` say now. Items whose
/// permissions could not be read are errors and get no readers (an item known before loses
/// its readers).
pub fn diff(
    state: &SourceState,
    listing: &Listing,
    decisions: &BTreeMap<String, FileAccess>,
    now_secs: u64,
) -> Changes {
    let mut next = SourceState {
        last_success: Some(now_secs),
        ..SourceState::default()
    };
    let mut changes = Vec::new();
    for file in listing.files() {
        let Some(file_id) = file.file_id else {
            // No handle could be opened: no id, no readers.
            if let Some(FileAccess::Unreadable(why)) = decisions.get(&file.path) {
                next.errors.push((file.path.clone(), why.clone()));
            }
            continue;
        };
        let id = file_id.to_string();
        let version = format!("{}:{}", file.size, file.mtime);
        let readers = match decisions.get(&file.path) {
            Some(FileAccess::Readers(r)) => r.clone(),
            Some(FileAccess::Unreadable(why)) => {
                next.errors.push((file.path.clone(), why.clone()));
                Readers::default()
            }
            None => Readers::default(),
        };
        match state.items.get(&id) {
            None => changes.push(Change::Upsert {
                id: id.clone(),
                path: file.path.clone(),
                version: version.clone(),
                readers: readers.clone(),
            }),
            Some(old) if old.version != version => changes.push(Change::Upsert {
                id: id.clone(),
                path: file.path.clone(),
                version: version.clone(),
                readers: readers.clone(),
            }),
            Some(old) => {
                if old.path != file.path {
                    changes.push(Change::Moved {
                        id: id.clone(),
                        path: file.path.clone(),
                    });
                }
                if old.readers != readers {
                    changes.push(Change::Permissions {
                        id: id.clone(),
                        readers: readers.clone(),
                    });
                }
            }
        }
        next.items.insert(
            id,
            ItemState {
                path: file.path.clone(),
                version,
                readers,
            },
        );
    }
    for id in state.items.keys() {
        if !next.items.contains_key(id) {
            changes.push(Change::Delete { id: id.clone() });
        }
    }
    Changes { changes, next }
}

/// An SMB share with its Active Directory, as a [`Source`].
pub struct SmbSource {
    /// The share.
    pub share: SmbShare,
    /// The directory.
    pub ad: crate::ad::AdConfig,
    /// The largest file fetched (the daemon's `[extract]` limit); larger ones are refused.
    pub max_bytes: u64,
}

/// Why an SMB sync failed.
#[derive(Debug, thiserror::Error)]
pub enum SmbSourceError {
    /// The share.
    #[error(transparent)]
    Smb(#[from] SmbError),
    /// The directory.
    #[error(transparent)]
    Ad(#[from] crate::ad::AdError),
}

impl SmbSource {
    /// Connects to the share.
    pub async fn connect(
        smb: SmbConfig,
        ad: crate::ad::AdConfig,
    ) -> Result<SmbSource, SmbSourceError> {
        Ok(SmbSource {
            share: SmbShare::connect(smb).await?,
            ad,
            max_bytes: 64 * 1024 * 1024,
        })
    }
}

impl Source for SmbSource {
    type Error = SmbSourceError;

    async fn principals(&mut self) -> Result<Directory, SmbSourceError> {
        let mut ad = crate::ad::Ad::connect(self.ad.clone()).await?;
        let d = ad.directory().await;
        ad.close().await;
        Ok(d?)
    }

    async fn changes(
        &mut self,
        state: &SourceState,
        directory: &Directory,
    ) -> Result<Changes, SmbSourceError> {
        let share_sd = if self.share.config().read_share_acl {
            self.share
                .share_security()
                .await
                .map_err(SmbError::ShareAcl)?
        } else {
            self.share.config().share_sd.clone()
        };
        let listing = self.share.list().await?;
        let decisions = listing.readers(
            directory,
            share_sd.as_ref(),
            self.share.config().check_traverse,
        );
        let unknown = listing.unknown_sids(directory);
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0);
        let mut changes = diff(state, &listing, &decisions, now);
        changes.next.unknown_principals = unknown.iter().map(ToString::to_string).collect();
        Ok(changes)
    }

    async fn fetch(&mut self, path: &str) -> Result<Vec<u8>, SmbSourceError> {
        let max = self.max_bytes;
        Ok(self.share.read(path, max).await?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sd::SecurityDescriptor;
    use crate::smb::{Access, Entry};

    fn entry(path: &str, id: u64, mtime: u64) -> Entry {
        Entry {
            path: path.into(),
            is_dir: false,
            size: 10,
            mtime,
            ctime: mtime,
            file_id: Some(id),
            access: Access::Sd(SecurityDescriptor::with_dacl(None)),
            is_link: false,
        }
    }

    fn readers(sids: &[&str]) -> FileAccess {
        FileAccess::Readers(Readers {
            users: sids.iter().map(|s| s.parse().unwrap()).collect(),
        })
    }

    #[test]
    fn renames_permission_changes_and_deletions_are_told_apart() {
        let mut listing = Listing::default();
        for e in [
            entry("a.txt", 1, 100),
            entry("b.txt", 2, 100),
            entry("c.txt", 3, 100),
        ] {
            listing.entries.insert(e.path.clone(), e);
        }
        let mut decisions = BTreeMap::new();
        for p in ["a.txt", "b.txt", "c.txt"] {
            decisions.insert(p.to_owned(), readers(&["S-1-5-21-1-2-3-1101"]));
        }
        let first = diff(&SourceState::default(), &listing, &decisions, 1);
        assert_eq!(first.changes.len(), 3);
        assert!(
            first
                .changes
                .iter()
                .all(|c| matches!(c, Change::Upsert { .. }))
        );

        // a renamed, b's readers changed, c deleted, d new, e unreadable.
        let mut listing = Listing::default();
        for e in [
            entry("z.txt", 1, 100),
            entry("b.txt", 2, 100),
            entry("d.txt", 4, 100),
        ] {
            listing.entries.insert(e.path.clone(), e);
        }
        let mut unreadable = entry("e.txt", 5, 100);
        unreadable.file_id = None;
        unreadable.access = Access::Unreadable("ACCESS_DENIED".into());
        listing.entries.insert("e.txt".into(), unreadable);
        let mut decisions = BTreeMap::new();
        decisions.insert("z.txt".to_owned(), readers(&["S-1-5-21-1-2-3-1101"]));
        decisions.insert("b.txt".to_owned(), readers(&[]));
        decisions.insert("d.txt".to_owned(), readers(&["S-1-5-21-1-2-3-1102"]));
        decisions.insert(
            "e.txt".to_owned(),
            FileAccess::Unreadable("ACCESS_DENIED".into()),
        );
        let second = diff(&first.next, &listing, &decisions, 2);
        assert_eq!(
            second.changes,
            vec![
                Change::Permissions {
                    id: "2".into(),
                    readers: Readers::default()
                },
                Change::Upsert {
                    id: "4".into(),
                    path: "d.txt".into(),
                    version: "10:100".into(),
                    readers: Readers {
                        users: ["S-1-5-21-1-2-3-1102".parse().unwrap()].into()
                    }
                },
                Change::Moved {
                    id: "1".into(),
                    path: "z.txt".into()
                },
                Change::Delete { id: "3".into() },
            ]
        );
        assert_eq!(
            second.next.errors,
            [("e.txt".to_owned(), "ACCESS_DENIED".to_owned())]
        );
        // Nothing changed: nothing to do.
        let third = diff(&second.next, &listing, &decisions, 3);
        assert!(third.changes.is_empty());
    }
}
