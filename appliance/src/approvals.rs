//! Separation of duties for access (issue 42 M3, docs/operations/roles.md): the principal that
//! changes who may read cannot read through its own change without a second person.
//!
//! A change **needs approval** when the caller could read more through it:
//! - `PUT /v1/acl/users/{id}` that changes the caller's own groups or roles, or adds a group or
//!   a role to a user who holds a bearer token (whoever minted that token may hold it);
//! - `POST /v1/acl/users/{id}/token` for another user who has groups, roles or direct grants
//!   (the token's holder reads what that user reads);
//! - `PUT /v1/acl/documents/{id}` and `PUT /v1/documents/{id}` with an `acl` that let the caller
//!   read a document it cannot read now (named in `users`, or through one of its groups);
//! - `POST /v1/acl/sync` whose snapshot does that for any document, or lists the caller.
//!
//! Such a change is applied only with one of:
//! - `X-Airlock-Approval: apv_…`: a one-time approval of exactly this change that a second
//!   person issued with `POST /v1/acl/approvals` ([`Change`]): another principal than the
//!   caller and than the user it is about, holding the change's role (`admin` for users and
//!   tokens, `operator` for grants and syncs) when it is issued and when it is used; valid
//!   [`APPROVAL_TTL`]. The eval export's four eyes (two principals, neither approving itself),
//!   over HTTP, without either handing the other a token;
//! - `X-Airlock-Break-Glass: <reason>`: applied by the caller alone, recorded in the audit log
//!   first (`break_glass`, with the reason and the change), counted in
//!   `airlock_break_glass_total` (the `AirlockBreakGlass` alert) and logged at WARN.
//!
//! Otherwise it is refused, `403 approval-required`, and nothing changes. Approvals live in the
//! daemon's memory (a restart forgets the unused ones), at most [`MAX_OUTSTANDING`] at a time.
//! Whoever holds the data directory offline (the CLI with the daemon stopped) is outside these
//! duties: that is the appliance's root, and its changes are audited as `cli`.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use airlock_acl::{Acl, Role};
use axum::http::{HeaderMap, HeaderName};
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use serde_json::json;
use sha2::{Digest, Sha256};

use crate::error::ApiError;
use airlock_identity::caller::Caller;

/// The header that presents an approval.
pub const APPROVAL_HEADER: HeaderName = HeaderName::from_static("x-airlock-approval");
/// The header of a break-glass change: its reason.
pub const BREAK_GLASS_HEADER: HeaderName = HeaderName::from_static("x-airlock-break-glass");
/// How long an issued approval may be used.
pub const APPROVAL_TTL: Duration = Duration::from_secs(15 * 60);
/// Most approvals issued and not yet used or expired.
pub const MAX_OUTSTANDING: usize = 1000;
/// Longest break-glass reason, in bytes.
pub const MAX_REASON_BYTES: usize = 500;
const PREFIX: &str = "apv_";

/// What one approval is for: one change, exactly (`POST /v1/acl/approvals`' body). Lists are
/// compared as sets.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "action", rename_all = "snake_case", deny_unknown_fields)]
pub enum Change {
    /// `PUT /v1/acl/users/{user_id}` with this body.
    UserPut {
        /// The user.
        user_id: String,
        /// Their groups.
        groups: Vec<String>,
        /// Their roles (absent: unchanged).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        roles: Option<Vec<Role>>,
    },
    /// `POST /v1/acl/users/{user_id}/token`.
    TokenIssue {
        /// The user.
        user_id: String,
    },
    /// `PUT /v1/acl/documents/{doc_id}` (or a document's `acl`) with this grant.
    DocumentGrants {
        /// The document.
        doc_id: String,
        /// Users granted.
        users: Vec<String>,
        /// Groups granted.
        groups: Vec<String>,
    },
    /// `POST /v1/acl/sync` with the snapshot of this SHA-256 (lower-case hex of the body).
    AclSync {
        /// The snapshot body's digest.
        sha256: String,
    },
}

impl Change {
    /// The same change with its lists sorted and deduplicated (the form compared and audited).
    pub fn normalized(mut self) -> Self {
        fn norm<T: Ord>(v: &mut Vec<T>) {
            v.sort();
            v.dedup();
        }
        match &mut self {
            Change::UserPut { groups, roles, .. } => {
                norm(groups);
                if let Some(r) = roles {
                    norm(r);
                }
            }
            Change::DocumentGrants { users, groups, .. } => {
                norm(users);
                norm(groups);
            }
            Change::AclSync { sha256 } => *sha256 = sha256.to_ascii_lowercase(),
            Change::TokenIssue { .. } => {}
        }
        self
    }

    /// The role an approver of this change must hold.
    pub fn role(&self) -> Role {
        match self {
            Change::UserPut { .. } | Change::TokenIssue { .. } => Role::Admin,
            Change::DocumentGrants { .. } | Change::AclSync { .. } => Role::Operator,
        }
    }

    /// The user the change is about, who may not approve it.
    fn subject(&self) -> Option<&str> {
        match self {
            Change::UserPut { user_id, .. } | Change::TokenIssue { user_id } => Some(user_id),
            _ => None,
        }
    }

    /// Users the change names as readers, who may not approve it.
    fn named(&self) -> &[String] {
        match self {
            Change::DocumentGrants { users, .. } => users,
            _ => &[],
        }
    }
}

/// One issued approval.
#[derive(Debug, Clone)]
struct Grant {
    id: String,
    change: Change,
    approver: String,
    expires: Instant,
}

/// The approvals issued and not yet used (in memory).
#[derive(Debug, Default)]
pub struct Approvals {
    pending: Mutex<HashMap<[u8; 32], Grant>>,
    serial: tokio::sync::Mutex<()>,
}

/// An issued approval, as `POST /v1/acl/approvals` answers it.
#[derive(Debug, Clone, Serialize)]
pub struct Issued {
    /// The one-time secret (`X-Airlock-Approval`).
    pub approval: String,
    /// Its public id (in the audit log, never the secret).
    pub id: String,
    /// Seconds it stays valid.
    pub expires_in_secs: u64,
    /// The change it approves.
    pub change: Change,
}

/// How a change that needed approval was let through.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Authorised {
    /// It did not need one.
    NotNeeded,
    /// A second person approved it.
    Approved {
        /// The approver.
        approver: String,
        /// The approval's public id.
        id: String,
    },
    /// Break-glass, with its reason.
    BreakGlass(String),
}

fn digest(secret: &str) -> [u8; 32] {
    Sha256::digest(secret.as_bytes()).into()
}

impl Approvals {
    /// Held by every handler that decides whether a change needs approval from the ACL's
    /// current state and then applies it, so that two such changes cannot interleave between
    /// check and apply (a token minted while a group is added to its user).
    pub fn serial(&self) -> &tokio::sync::Mutex<()> {
        &self.serial
    }

    /// Issues an approval of `change` by `approver` (its role already checked), valid from
    /// `now` for [`APPROVAL_TTL`].
    pub fn issue(
        &self,
        approver: &Caller,
        change: Change,
        now: Instant,
    ) -> Result<Issued, ApiError> {
        let change = change.normalized();
        if !approver.has(change.role()) {
            return Err(ApiError::Forbidden(match change.role() {
                Role::Admin => "approving a change of users or tokens needs the admin role",
                _ => "approving a change of grants or an IAM sync needs the operator role",
            }));
        }
        if change.subject() == Some(approver.user_id.as_str())
            || change.named().contains(&approver.user_id)
        {
            return Err(ApiError::Forbidden(
                "four eyes: a change that gives the approver access must be approved by someone else",
            ));
        }
        let mut raw = [0u8; 24];
        ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut raw)
            .map_err(|_| ApiError::internal("no randomness for an approval"))?;
        let secret = format!("{PREFIX}{}", hex::encode(raw));
        let d = digest(&secret);
        let id = hex::encode(&d[..8]);
        let mut pending = self.pending.lock();
        pending.retain(|_, g| g.expires > now);
        if pending.len() >= MAX_OUTSTANDING {
            return Err(ApiError::Conflict(format!(
                "{MAX_OUTSTANDING} approvals are outstanding, the most kept; use or let some \
                 expire first"
            )));
        }
        pending.insert(
            d,
            Grant {
                id: id.clone(),
                change: change.clone(),
                approver: approver.user_id.clone(),
                expires: now + APPROVAL_TTL,
            },
        );
        Ok(Issued {
            approval: secret,
            id,
            expires_in_secs: APPROVAL_TTL.as_secs(),
            change,
        })
    }

    /// Uses the approval `secret` for `change` by `requester`: the approver and the public id.
    /// It is consumed only when it fits (a mistyped change does not burn it).
    fn take(
        &self,
        secret: &str,
        change: &Change,
        requester: &str,
        now: Instant,
    ) -> Result<(String, String), ApiError> {
        let mut pending = self.pending.lock();
        pending.retain(|_, g| g.expires > now);
        let d = digest(secret.trim());
        let Some(g) = pending.get(&d) else {
            return Err(ApiError::ApprovalRequired(
                "the approval is unknown, used or expired; ask for a new one".into(),
            ));
        };
        if g.change != *change {
            return Err(ApiError::ApprovalRequired(format!(
                "the approval is for another change: {}",
                serde_json::to_string(&g.change).unwrap_or_default()
            )));
        }
        if g.approver == requester {
            return Err(ApiError::ApprovalRequired(
                "four eyes: the approval was issued by the caller itself; a second person must \
                 approve"
                    .into(),
            ));
        }
        let g = pending.remove(&d).expect("looked up above");
        Ok((g.approver, g.id))
    }
}

/// Whether `change` may go ahead for the user `caller` (`needed`: it gives the caller access,
/// see the module docs), from the request's approval or break-glass header.
pub fn authorise(
    approvals: &Approvals,
    acl: &Acl,
    headers: &HeaderMap,
    caller: &str,
    change: Change,
    needed: bool,
) -> Result<(Change, Authorised), ApiError> {
    let change = change.normalized();
    if !needed {
        return Ok((change, Authorised::NotNeeded));
    }
    if let Some(v) = headers.get(APPROVAL_HEADER) {
        let secret = v.to_str().unwrap_or("");
        let (approver, id) = approvals.take(secret, &change, caller, Instant::now())?;
        // The approver must still hold the role (and exist) now.
        if !acl
            .user(&approver)
            .is_some_and(|u| u.roles.contains(&change.role()))
        {
            return Err(ApiError::ApprovalRequired(format!(
                "the approver {approver} no longer holds the {} role",
                change.role()
            )));
        }
        return Ok((change, Authorised::Approved { approver, id }));
    }
    if let Some(v) = headers.get(BREAK_GLASS_HEADER) {
        let reason = v.to_str().unwrap_or("").trim();
        if reason.is_empty() || reason.len() > MAX_REASON_BYTES {
            return Err(ApiError::InvalidRequest(format!(
                "X-Airlock-Break-Glass must give a reason of 1 to {MAX_REASON_BYTES} bytes \
                 (visible ASCII)"
            )));
        }
        return Ok((change, Authorised::BreakGlass(reason.to_owned())));
    }
    Err(ApiError::ApprovalRequired(format!(
        "{}: a second person holding the {} role approves it with POST /v1/acl/approvals \
         {}, and the request then carries X-Airlock-Approval; or X-Airlock-Break-Glass: <reason> \
         applies it alone (audited, alerted)",
        match &change {
            Change::UserPut { .. } =>
                "this change of a user lets a credential you may hold read more",
            Change::TokenIssue { .. } =>
                "a token for a user with access reads what that user reads",
            Change::DocumentGrants { .. } => "this grant lets you read the document",
            Change::AclSync { .. } => "this snapshot lets you read more",
        },
        change.role(),
        serde_json::to_string(&change).unwrap_or_default()
    )))
}

/// Whether a grant of `doc_id` to `users` and `groups` lets `caller` read it while it cannot
/// now (named directly, or through one of its groups).
pub fn grant_gives(
    acl: &Acl,
    caller: &str,
    doc_id: &str,
    users: &[String],
    groups: &[String],
) -> bool {
    let mine = acl.user(caller).map(|u| u.groups).unwrap_or_default();
    let named = users.iter().any(|u| u == caller) || groups.iter().any(|g| mine.contains(g));
    named
        && !acl
            .ordinal(doc_id)
            .ok()
            .flatten()
            .is_some_and(|o| acl.can_read(caller, o))
}

/// Whether an IAM snapshot (JSON Lines) lists `caller` as a user or lets it read a document it
/// cannot read now. Lines that do not parse are left to the sync, which refuses them.
pub fn snapshot_gives(acl: &Acl, caller: &str, body: &str) -> bool {
    let strings = |v: &serde_json::Value| -> Vec<String> {
        v.as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|s| s.as_str().map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default()
    };
    body.lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .any(|v| {
            if v["user"].as_str() == Some(caller) {
                return true;
            }
            v["doc"].as_str().is_some_and(|doc| {
                grant_gives(
                    acl,
                    caller,
                    doc,
                    &strings(&v["users"]),
                    &strings(&v["groups"]),
                )
            })
        })
}

/// The SHA-256 of a snapshot body (lower-case hex), as [`Change::AclSync`] names it.
pub fn body_sha256(body: &str) -> String {
    hex::encode(Sha256::digest(body.as_bytes()))
}

/// Records how a change that needed approval goes ahead, before it is applied (a change that is
/// then refused leaves this entry, which says what was attempted). A break-glass change is also
/// counted and logged at WARN.
pub fn record(
    acl: &Acl,
    metrics: &crate::metrics::Metrics,
    actor: airlock_acl::Actor<'_>,
    change: &Change,
    how: &Authorised,
) -> Result<(), ApiError> {
    match how {
        Authorised::NotNeeded => Ok(()),
        Authorised::Approved { approver, id } => Ok(acl.audit_admin(
            actor,
            json!({"action": "approved_change", "approval": id, "approved_by": approver,
                   "change": change}),
        )?),
        Authorised::BreakGlass(reason) => {
            acl.audit_admin(
                actor,
                json!({"action": "break_glass", "reason": reason, "change": change}),
            )?;
            metrics.break_glass.inc();
            tracing::warn!(actor = actor.user_id, change = ?change, "break-glass access change");
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn who(id: &str, roles: &[Role]) -> Caller {
        Caller::new(id.into(), roles.to_vec())
    }

    fn token(u: &str) -> Change {
        Change::TokenIssue { user_id: u.into() }
    }

    #[test]
    fn approvals_are_one_time_exact_expiring_and_never_the_callers_own() {
        let a = Approvals::default();
        let t0 = Instant::now();
        let ann = who("ann", &[Role::Admin]);
        let issued = a.issue(&ann, token("z"), t0).unwrap();
        assert!(issued.approval.starts_with("apv_"));
        // Another change, or the approver itself: refused, and the approval is not burnt.
        assert!(a.take(&issued.approval, &token("y"), "bob", t0).is_err());
        assert!(a.take(&issued.approval, &token("z"), "ann", t0).is_err());
        let (approver, id) = a.take(&issued.approval, &token("z"), "bob", t0).unwrap();
        assert_eq!(
            (approver.as_str(), id.as_str()),
            ("ann", issued.id.as_str())
        );
        assert!(
            a.take(&issued.approval, &token("z"), "bob", t0).is_err(),
            "one use"
        );
        // Expiry.
        let late = a.issue(&ann, token("z"), t0).unwrap();
        assert!(
            a.take(&late.approval, &token("z"), "bob", t0 + APPROVAL_TTL)
                .is_err()
        );
        // Sets, not lists.
        let put = |g: &[&str]| Change::UserPut {
            user_id: "z".into(),
            groups: g.iter().map(|s| s.to_string()).collect(),
            roles: None,
        };
        let p = a.issue(&ann, put(&["b", "a", "a"]), t0).unwrap();
        assert!(
            a.take(&p.approval, &put(&["a", "b"]).normalized(), "bob", t0)
                .is_ok()
        );
        // The approver's role and subject.
        assert!(
            a.issue(&who("op", &[Role::Operator]), token("z"), t0)
                .is_err()
        );
        assert!(a.issue(&ann, token("ann"), t0).is_err());
        let grant = Change::DocumentGrants {
            doc_id: "d".into(),
            users: vec!["op".into()],
            groups: vec![],
        };
        assert!(
            a.issue(&ann, grant.clone(), t0).is_err(),
            "grants need operator"
        );
        assert!(
            a.issue(&who("op", &[Role::Operator]), grant, t0).is_err(),
            "names op"
        );
    }

    #[test]
    fn outstanding_approvals_are_bounded() {
        let a = Approvals::default();
        let t0 = Instant::now();
        let ann = who("ann", &[Role::Admin]);
        for i in 0..MAX_OUTSTANDING {
            a.issue(&ann, token(&format!("u{i}")), t0).unwrap();
        }
        let e = a.issue(&ann, token("one-more"), t0).unwrap_err();
        assert!(matches!(e, ApiError::Conflict(_)), "{e:?}");
        // Expired ones make room.
        assert!(a.issue(&ann, token("later"), t0 + APPROVAL_TTL).is_ok());
    }
}
