//! The drift check: for every (user, file) pair, Airlock's decision against the source's own
//! verdict, computed independently of this crate (for an SMB share: the server opening the file
//! as that user, e.g. `smbclient -U user -c 'get file /dev/null'`).

use std::collections::{BTreeMap, BTreeSet};

use crate::directory::{Directory, DirectoryUser};
use crate::smb::FileAccess;

/// The source's own answers.
pub trait Oracle {
    /// Every file the source holds now (paths as the listing names them).
    fn files(&mut self) -> Result<BTreeSet<String>, String>;
    /// Whether `user` can read `path` on the source; `None` when this user cannot be checked
    /// (no credentials for them).
    fn can_read(&mut self, user: &DirectoryUser, path: &str) -> Option<bool>;
}

/// How Airlock and the source disagree.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MismatchKind {
    /// Airlock lets the user read a file the source refuses them: a leak.
    Leak,
    /// The source lets the user read a file Airlock refuses them.
    Missing,
    /// Airlock holds a file the source no longer has (moved, renamed, deleted).
    Stale,
    /// The source has a file Airlock does not hold.
    Unlisted,
}

/// One disagreement.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mismatch {
    /// The file.
    pub path: String,
    /// The user (`None` for Stale/Unlisted).
    pub user: Option<String>,
    /// How.
    pub kind: MismatchKind,
}

/// What a check found.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Report {
    /// The disagreements (the goal: none).
    pub mismatches: Vec<Mismatch>,
    /// Files Airlock gives nobody because the service account could not read their
    /// permissions, with the reason (reported by the crawl, not drift).
    pub unreadable: Vec<(String, String)>,
    /// (user, file) pairs compared.
    pub pairs_checked: usize,
    /// Users the oracle could not check.
    pub users_unchecked: Vec<String>,
}

/// Compares `decisions` (path → readers, what Airlock holds) with the source, for every
/// directory user and every file either side knows.
pub fn verify(
    decisions: &BTreeMap<String, FileAccess>,
    directory: &Directory,
    oracle: &mut dyn Oracle,
) -> Result<Report, String> {
    let on_source = oracle.files()?;
    let mut report = Report::default();
    for path in on_source.difference(&decisions.keys().cloned().collect()) {
        report.mismatches.push(Mismatch {
            path: path.clone(),
            user: None,
            kind: MismatchKind::Unlisted,
        });
    }
    let mut unchecked = BTreeSet::new();
    for (path, access) in decisions {
        if !on_source.contains(path) {
            report.mismatches.push(Mismatch {
                path: path.clone(),
                user: None,
                kind: MismatchKind::Stale,
            });
            continue;
        }
        let readers = match access {
            FileAccess::Readers(r) => r,
            FileAccess::Unreadable(why) => {
                report.unreadable.push((path.clone(), why.clone()));
                continue;
            }
        };
        for user in directory.users() {
            let Some(server) = oracle.can_read(user, path) else {
                unchecked.insert(user.name.clone());
                continue;
            };
            report.pairs_checked += 1;
            let airlock = readers.contains(&user.sid);
            if airlock != server {
                report.mismatches.push(Mismatch {
                    path: path.clone(),
                    user: Some(user.name.clone()),
                    kind: if airlock {
                        MismatchKind::Leak
                    } else {
                        MismatchKind::Missing
                    },
                });
            }
        }
    }
    report.users_unchecked = unchecked.into_iter().collect();
    Ok(report)
}
