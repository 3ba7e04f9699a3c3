//! The crate's one error type. User mistakes (bad ids, unknown users, malformed snapshots) are
//! separated from internal faults (database, I/O, corrupt state) by [`Error::is_user_error`].

use std::fmt;
use std::path::PathBuf;

/// What kind of identifier was rejected.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IdKind {
    /// A user (principal) id.
    User,
    /// A group id.
    Group,
    /// An external document id.
    Document,
    /// A request id in the audit log.
    Request,
}

impl fmt::Display for IdKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            IdKind::User => "user",
            IdKind::Group => "group",
            IdKind::Document => "document",
            IdKind::Request => "request",
        })
    }
}

/// One rejected line of an IAM snapshot (1-based line number).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LineError {
    /// 1-based line number in the snapshot.
    pub line: usize,
    /// Why the line was rejected (no document content, only ids and field names).
    pub message: String,
}

impl fmt::Display for LineError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "line {}: {}", self.line, self.message)
    }
}

fn list_lines(errors: &[LineError], total: usize) -> String {
    let mut s = errors
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("; ");
    if total > errors.len() {
        s.push_str(&format!(" (and {} more)", total - errors.len()));
    }
    s
}

/// Everything that can go wrong in `airlock-acl`.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A user, group, document or request id is empty, too long or contains control characters.
    #[error("invalid {kind} id {id:?}: {reason}")]
    InvalidId {
        /// Which namespace the id belongs to.
        kind: IdKind,
        /// The rejected id (truncated to 80 characters).
        id: String,
        /// Why it was rejected.
        reason: &'static str,
    },
    /// The operation names a user that does not exist.
    #[error("unknown user {user_id:?}")]
    UnknownUser {
        /// The user id.
        user_id: String,
    },
    /// `add_user` for an id that already exists.
    #[error("user {user_id:?} already exists")]
    UserExists {
        /// The user id.
        user_id: String,
    },
    /// A role name other than the known ones.
    #[error("unknown role {role:?} (known roles: admin, operator, auditor, metrics)")]
    UnknownRole {
        /// The rejected role name.
        role: String,
    },
    /// The change would leave the appliance without any user holding the `admin` role; nothing
    /// was changed.
    #[error(
        "{user_id:?} is the last user with the admin role: give another user the admin role \
         first; nothing was changed"
    )]
    LastAdmin {
        /// The admin the change would remove or demote.
        user_id: String,
    },
    /// A directory or OIDC sign-in resolved to the id of a local account (an operator created
    /// with `airlock user add`): an external identity never takes a local account's roles or
    /// groups. Nothing was changed.
    #[error(
        "{user_id:?} is a local account: a directory or OIDC identity cannot sign in as it; \
         nothing was changed"
    )]
    LocalAccount {
        /// The local account's id.
        user_id: String,
    },
    /// The IAM snapshot has malformed lines; nothing was applied.
    #[error("IAM snapshot rejected, nothing applied: {}", list_lines(.errors, *.total))]
    Snapshot {
        /// The first rejected lines, in order (at most [`crate::MAX_REPORTED_LINE_ERRORS`]).
        errors: Vec<LineError>,
        /// How many lines were rejected in total.
        total: usize,
    },
    /// The IAM snapshot has no user and no document line; applying it would remove every user
    /// but the local operators and every document grant. Nothing was applied.
    #[error(
        "the IAM snapshot is empty (no user or document line): applying it would remove every \
         user except local operators and every document grant; nothing was applied (say \
         allow_empty to apply it on purpose)"
    )]
    EmptySnapshot,
    /// Reading the snapshot stream failed (I/O); nothing was applied.
    #[error("reading the IAM snapshot failed at line {line}")]
    SnapshotRead {
        /// The line being read when the error occurred.
        line: usize,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// Opening or migrating the database file failed.
    #[error("opening the ACL database {}", path.display())]
    Open {
        /// The database file.
        path: PathBuf,
        /// The SQLite error.
        #[source]
        source: rusqlite::Error,
    },
    /// A database statement failed.
    #[error("ACL database error while {context}")]
    Database {
        /// What the crate was doing.
        context: &'static str,
        /// The SQLite error.
        #[source]
        source: rusqlite::Error,
    },
    /// The database was written by a newer build.
    #[error("ACL schema version {found} is newer than this build supports ({supported})")]
    SchemaTooNew {
        /// Highest version recorded in the database.
        found: i64,
        /// Highest version this build knows.
        supported: i64,
    },
    /// A write committed together with an ACL change (see [`crate::Acl::set_document_grants_with`])
    /// failed; the change was rolled back with it.
    #[error("a write joined to the ACL change failed; nothing was applied")]
    Joined {
        /// The joined write's error.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// The stored state violates an invariant (e.g. an unknown role name in a row).
    #[error("ACL database is inconsistent: {detail}")]
    Corrupt {
        /// What is wrong.
        detail: String,
    },
}

impl Error {
    /// `true` for mistakes of the caller (HTTP 4xx: bad id, unknown user, malformed snapshot),
    /// `false` for internal faults (HTTP 5xx: database, I/O, corrupt state).
    pub fn is_user_error(&self) -> bool {
        match self {
            Error::InvalidId { .. }
            | Error::UnknownUser { .. }
            | Error::UserExists { .. }
            | Error::UnknownRole { .. }
            | Error::LastAdmin { .. }
            | Error::LocalAccount { .. }
            | Error::Snapshot { .. }
            | Error::EmptySnapshot => true,
            Error::SnapshotRead { .. }
            | Error::Open { .. }
            | Error::Database { .. }
            | Error::SchemaTooNew { .. }
            | Error::Joined { .. }
            | Error::Corrupt { .. } => false,
        }
    }

    pub(crate) fn db(context: &'static str) -> impl FnOnce(rusqlite::Error) -> Error {
        move |source| Error::Database { context, source }
    }
}

/// Longest accepted id, in bytes.
pub const MAX_ID_BYTES: usize = 256;

/// Checks an id: non-empty, at most [`MAX_ID_BYTES`] bytes, no control characters.
pub(crate) fn check_id(kind: IdKind, id: &str) -> Result<(), Error> {
    let reason = if id.is_empty() {
        "empty"
    } else if id.len() > MAX_ID_BYTES {
        "longer than 256 bytes"
    } else if id.chars().any(char::is_control) {
        "contains control characters"
    } else {
        return Ok(());
    };
    Err(Error::InvalidId {
        kind,
        id: id.chars().take(80).collect(),
        reason,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_checked() {
        assert!(check_id(IdKind::User, "u001").is_ok());
        assert!(check_id(IdKind::Group, "hr-newsletter").is_ok());
        assert!(check_id(IdKind::User, "").is_err());
        assert!(check_id(IdKind::User, "a\nb").is_err());
        assert!(check_id(IdKind::Document, &"x".repeat(257)).is_err());
        let e = check_id(IdKind::Group, "").unwrap_err();
        assert!(e.is_user_error());
        assert_eq!(e.to_string(), "invalid group id \"\": empty");
    }

    #[test]
    fn snapshot_error_names_lines() {
        let e = Error::Snapshot {
            errors: vec![LineError {
                line: 3,
                message: "unknown field `role`".into(),
            }],
            total: 2,
        };
        assert_eq!(
            e.to_string(),
            "IAM snapshot rejected, nothing applied: line 3: unknown field `role` (and 1 more)"
        );
    }
}
