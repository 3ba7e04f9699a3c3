//! Sign-in sessions (directory or IdP logins) and the lifetimes of bearer tokens.
//!
//! A session is a random secret like a token (`als_` + 64 hex digits, in the `airlock_session`
//! cookie) with a second one, its CSRF token, that the web UI sends in a header on every
//! state-changing request. Both are stored only as SHA-256 (`acl_sessions`), like tokens; a
//! leaked database holds no usable secret. Sessions belong to an existing user: removing the
//! user (a sync that no longer lists them, `user remove`) deletes their sessions in the same
//! transaction, and a session whose user is gone authenticates nobody.
//!
//! Sessions are kept in memory as well (loaded at open), so resolving a cookie is a hash lookup
//! under a short lock and no I/O. The last-seen time (the idle lifetime) and a token's last use
//! are written back at most once a minute per session or token ([`PERSIST_EVERY_US`]): after a
//! restart an idle session is therefore at most that much *older*, never younger.

use std::collections::{BTreeSet, HashMap};
use std::time::Duration;

use rusqlite::{Connection, params};
use serde::Serialize;
use serde_json::json;

use crate::acl::{Acl, Actor, Memberships};
use crate::audit::{AuditKind, Record};
use crate::error::{Error, IdKind, check_id};
use crate::model::{Model, Name};
use crate::store::now_us;
use crate::view::Principal;
use crate::{SyncCounts, token};

/// Prefix of a session secret.
pub const SESSION_PREFIX: &str = "als_";
/// Last-seen and last-used times are written back at most this often (µs).
pub const PERSIST_EVERY_US: i64 = 60_000_000;

#[derive(Clone, Debug)]
struct SessionRec {
    user: Name,
    csrf: [u8; 32],
    last_seen_us: i64,
    persisted_seen_us: i64,
    expires_us: i64,
}

/// The in-memory side of `acl_sessions` and of the tokens' last use.
#[derive(Debug, Default)]
pub(crate) struct Sessions {
    by_digest: HashMap<[u8; 32], SessionRec>,
    /// user → (last use, last use written back).
    token_use: HashMap<String, (i64, i64)>,
}

impl Sessions {
    /// Loads the sessions that have not expired (expired rows are deleted).
    pub(crate) fn load(conn: &Connection) -> Result<Self, Error> {
        let e = Error::db("loading sessions");
        let now = now_us();
        conn.execute(
            "DELETE FROM acl_sessions WHERE expires_us <= ?1",
            params![now],
        )
        .map_err(e)?;
        let mut st = conn
            .prepare(
                "SELECT session_sha256, user_id, csrf_sha256, last_seen_us, expires_us
                 FROM acl_sessions",
            )
            .map_err(Error::db("loading sessions"))?;
        let rows = st
            .query_map([], |r| {
                Ok((
                    r.get::<_, String>(0)?,
                    r.get::<_, String>(1)?,
                    r.get::<_, String>(2)?,
                    r.get::<_, i64>(3)?,
                    r.get::<_, i64>(4)?,
                ))
            })
            .map_err(Error::db("loading sessions"))?;
        let mut out = Sessions::default();
        for r in rows {
            let (d, user, c, seen, expires) = r.map_err(Error::db("loading sessions"))?;
            let digest = unhex(&d)?;
            out.by_digest.insert(
                digest,
                SessionRec {
                    user: Name::from(user.as_str()),
                    csrf: unhex(&c)?,
                    last_seen_us: seen,
                    persisted_seen_us: seen,
                    expires_us: expires,
                },
            );
        }
        Ok(out)
    }

    /// Open sessions (not past their absolute end) per user that no longer exists in `model`:
    /// the sessions a change is about to end ([`Sessions::retain_users`]).
    pub(crate) fn ending(&self, model: &Model) -> Vec<(Name, usize)> {
        let now = now_us();
        let mut n: HashMap<&Name, usize> = HashMap::new();
        for s in self.by_digest.values() {
            if s.expires_us > now && !model.users.contains_key(&s.user) {
                *n.entry(&s.user).or_default() += 1;
            }
        }
        let mut out: Vec<(Name, usize)> = n.into_iter().map(|(u, c)| (u.clone(), c)).collect();
        out.sort();
        out
    }

    /// Drops the sessions of users that no longer exist.
    pub(crate) fn retain_users(&mut self, model: &Model) {
        self.by_digest
            .retain(|_, s| model.users.contains_key(&s.user));
    }
}

fn unhex(h: &str) -> Result<[u8; 32], Error> {
    let mut d = [0u8; 32];
    hex::decode_to_slice(h, &mut d).map_err(|_| Error::Corrupt {
        detail: "malformed session digest".into(),
    })?;
    Ok(d)
}

fn micros(d: Duration) -> i64 {
    i64::try_from(d.as_micros()).unwrap_or(i64::MAX)
}

fn fmt_us(us: i64) -> String {
    time::OffsetDateTime::from_unix_timestamp_nanos(i128::from(us) * 1000)
        .ok()
        .and_then(|t| {
            t.format(&time::format_description::well_known::Rfc3339)
                .ok()
        })
        .unwrap_or_default()
}

/// A new session: the secrets are returned once.
#[derive(Clone, Debug)]
pub struct NewSession {
    /// The session secret (the cookie's value).
    pub token: String,
    /// The CSRF token (the `X-Airlock-CSRF` header's value).
    pub csrf: String,
    /// When the session ends at the latest (RFC 3339).
    pub expires_at: String,
}

/// A resolved session.
#[derive(Clone, Debug)]
pub struct SessionCaller {
    /// The user and their current roles.
    pub principal: Principal,
    /// SHA-256 of the session's CSRF token.
    pub csrf_sha256: [u8; 32],
    /// Whether the last-seen time should be written back now ([`Acl::persist_session_seen`]).
    pub persist_due: bool,
}

impl SessionCaller {
    /// Whether `presented` is this session's CSRF token (compares digests).
    pub fn csrf_matches(&self, presented: &str) -> bool {
        token::digest(presented) == self.csrf_sha256
    }
}

/// One issued bearer token, for `airlock user tokens list` (never the secret).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct TokenInfo {
    /// The user the token authenticates.
    pub user_id: String,
    /// When it was issued (RFC 3339).
    pub issued_at: String,
    /// When it expires (RFC 3339), if it does.
    pub expires_at: Option<String>,
    /// Whether it has expired.
    pub expired: bool,
    /// When it last authenticated a request (RFC 3339; at most a minute old), if ever.
    pub last_used_at: Option<String>,
    /// Sign-in sessions the user has open.
    pub sessions: usize,
}

/// One sign-in event for the audit log ([`Acl::audit_sign_in`]): which method, what came of it,
/// who (when known) and from where. Never a password, a cookie or a token.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SignIn<'a> {
    /// `ldap`, `session` (logout), `oidc`, ...
    pub method: &'a str,
    /// `success`, `logout`, or the refusal (`wrong_password`, `unknown_user`, ...).
    pub outcome: &'a str,
    /// The Airlock user id, when known (never for an unknown user).
    pub user_id: Option<&'a str>,
    /// The username as typed, when it did not resolve to a user id.
    pub username: Option<&'a str>,
    /// The client address.
    pub client: Option<&'a str>,
}

impl Acl {
    /// Appends a [`SignIn`] entry (kind `sign_in`) to the audit log (blocking I/O). Nothing else
    /// is written: a refused sign-in audited here changes no other row.
    pub fn audit_sign_in<'a>(
        &self,
        actor: impl Into<Actor<'a>>,
        event: &SignIn<'_>,
    ) -> Result<(), Error> {
        let actor = actor.into();
        let mut detail = json!({"method": event.method, "outcome": event.outcome});
        if let Some(u) = event.username {
            detail["username"] = json!(u);
        }
        if let Some(c) = event.client {
            detail["client"] = json!(c);
        }
        crate::audit::append(
            &self.side.lock(),
            &Record {
                kind: AuditKind::SignIn,
                actor: Some(actor.user_id),
                user_id: event.user_id,
                request_id: actor.request_id,
                detail,
            },
        )?;
        self.flush_sink();
        Ok(())
    }

    /// Opens a session for an existing user, ending at the latest after `absolute`. The user's
    /// sessions are not limited in number; each login makes a new one.
    /// Errors: [`Error::UnknownUser`].
    pub fn create_session(&self, user_id: &str, absolute: Duration) -> Result<NewSession, Error> {
        let mut raw = [0u8; 32];
        rand::fill(&mut raw[..]);
        let secret = format!("{SESSION_PREFIX}{}", hex::encode(raw));
        let (csrf, csrf_digest) = token::generate();
        let digest = token::digest(&secret);
        let now = now_us();
        let expires = now.saturating_add(micros(absolute));
        // Under the writer lock: a concurrent removal of the user cannot interleave between the
        // row and the in-memory entry (the row's foreign key refuses a removed user).
        let w = self.writer.lock();
        let Some(user) = w.model.users.get_key_value(user_id).map(|(k, _)| k.clone()) else {
            return Err(Error::UnknownUser {
                user_id: user_id.to_owned(),
            });
        };
        w.conn
            .prepare_cached(
                "INSERT INTO acl_sessions (session_sha256, user_id, csrf_sha256, created_us,
                                           last_seen_us, expires_us)
                 VALUES (?1, ?2, ?3, ?4, ?4, ?5)",
            )
            .and_then(|mut st| {
                st.execute(params![
                    hex::encode(digest),
                    user_id,
                    hex::encode(csrf_digest),
                    now,
                    expires
                ])
            })
            .map_err(Error::db("storing a session"))?;
        self.sessions.lock().by_digest.insert(
            digest,
            SessionRec {
                user,
                csrf: csrf_digest,
                last_seen_us: now,
                persisted_seen_us: now,
                expires_us: expires,
            },
        );
        drop(w);
        Ok(NewSession {
            token: secret,
            csrf,
            expires_at: fmt_us(expires),
        })
    }

    /// Resolves a session secret: `None` for an unknown or ended session, one past its absolute
    /// end or unused for longer than `idle`, or one whose user no longer exists. Marks the
    /// session as seen now. No I/O.
    pub fn session(&self, secret: &str, idle: Duration) -> Option<SessionCaller> {
        let digest = token::digest(secret);
        let now = now_us();
        let mut s = self.sessions.lock();
        let rec = s.by_digest.get_mut(&digest)?;
        if now >= rec.expires_us || now.saturating_sub(rec.last_seen_us) > micros(idle) {
            return None;
        }
        let user = rec.user.clone();
        let snap = self.snapshot();
        let info = snap.user(&user)?;
        rec.last_seen_us = now;
        let persist_due = now - rec.persisted_seen_us >= PERSIST_EVERY_US;
        if persist_due {
            rec.persisted_seen_us = now;
        }
        Some(SessionCaller {
            principal: Principal {
                user_id: info.user_id,
                roles: info.roles,
            },
            csrf_sha256: rec.csrf,
            persist_due,
        })
    }

    /// Writes a session's last-seen time back (blocking I/O; when
    /// [`SessionCaller::persist_due`]).
    pub fn persist_session_seen(&self, secret: &str) -> Result<(), Error> {
        let digest = token::digest(secret);
        let Some(seen) = self
            .sessions
            .lock()
            .by_digest
            .get(&digest)
            .map(|r| r.last_seen_us)
        else {
            return Ok(());
        };
        self.side
            .lock()
            .prepare_cached("UPDATE acl_sessions SET last_seen_us = ?2 WHERE session_sha256 = ?1")
            .and_then(|mut st| st.execute(params![hex::encode(digest), seen]))
            .map_err(Error::db("recording a session's use"))?;
        Ok(())
    }

    /// Ends a session (logout). Returns whether it existed.
    pub fn end_session(&self, secret: &str) -> Result<bool, Error> {
        let digest = token::digest(secret);
        let _w = self.writer.lock();
        let n = self
            .side
            .lock()
            .execute(
                "DELETE FROM acl_sessions WHERE session_sha256 = ?1",
                params![hex::encode(digest)],
            )
            .map_err(Error::db("ending a session"))?;
        let had = self.sessions.lock().by_digest.remove(&digest).is_some();
        Ok(n > 0 || had)
    }

    /// Ends every sign-in session of `user_id` (`DELETE /v1/acl/users/{id}/sessions`): none of
    /// them authenticates from now on; the user's bearer token is not touched. The deletion and
    /// one `sign_in` audit entry (`outcome: sessions_ended`, `ended_by: sessions_end`, the
    /// number) are one transaction, written also when the user had none. Returns that number.
    /// Errors: [`Error::UnknownUser`].
    pub fn end_user_sessions<'a>(
        &self,
        actor: impl Into<Actor<'a>>,
        user_id: &str,
    ) -> Result<usize, Error> {
        let actor = actor.into();
        // Under the writer lock, as create_session: no session of the user appears meanwhile.
        let w = self.writer.lock();
        if !w.model.users.contains_key(user_id) {
            return Err(Error::UnknownUser {
                user_id: user_id.to_owned(),
            });
        }
        let now = now_us();
        let live = self
            .sessions
            .lock()
            .by_digest
            .values()
            .filter(|s| &*s.user == user_id && s.expires_us > now)
            .count();
        let mut side = self.side.lock();
        let e = Error::db("ending a user's sessions");
        let tx = side.transaction().map_err(e)?;
        tx.execute(
            "DELETE FROM acl_sessions WHERE user_id = ?1",
            params![user_id],
        )
        .map_err(Error::db("ending a user's sessions"))?;
        crate::audit::append(
            &tx,
            &Record {
                kind: AuditKind::SignIn,
                actor: Some(actor.user_id),
                user_id: Some(user_id),
                request_id: actor.request_id,
                detail: json!({"method": "session", "outcome": "sessions_ended",
                               "ended_by": "sessions_end", "sessions": live}),
            },
        )?;
        tx.commit().map_err(Error::db("ending a user's sessions"))?;
        drop(side);
        self.sessions
            .lock()
            .by_digest
            .retain(|_, s| &*s.user != user_id);
        drop(w);
        self.flush_sink();
        Ok(live)
    }

    /// Records that `user_id`'s bearer token authenticated a request now; returns whether the
    /// time should be written back ([`Acl::persist_token_use`]). No I/O.
    pub fn note_token_use(&self, user_id: &str) -> bool {
        let now = now_us();
        let mut s = self.sessions.lock();
        let e = s
            .token_use
            .entry(user_id.to_owned())
            .or_insert((now, i64::MIN));
        e.0 = now;
        if now.saturating_sub(e.1) >= PERSIST_EVERY_US {
            e.1 = now;
            true
        } else {
            false
        }
    }

    /// Writes a token's last use back (blocking I/O).
    pub fn persist_token_use(&self, user_id: &str) -> Result<(), Error> {
        let Some((used, _)) = self.sessions.lock().token_use.get(user_id).copied() else {
            return Ok(());
        };
        self.side
            .lock()
            .prepare_cached("UPDATE acl_tokens SET last_used_us = ?2 WHERE user_id = ?1")
            .and_then(|mut st| st.execute(params![user_id, used]))
            .map_err(Error::db("recording a token's use"))?;
        Ok(())
    }

    /// Every issued token (user, issue, expiry, last use), by user id.
    pub fn tokens(&self) -> Result<Vec<TokenInfo>, Error> {
        let now = now_us();
        let s = self.sessions.lock();
        let mut sessions: HashMap<&str, usize> = HashMap::new();
        for r in s.by_digest.values() {
            if r.expires_us > now {
                *sessions.entry(&r.user).or_default() += 1;
            }
        }
        let side = self.side.lock();
        let mut st = side
            .prepare(
                "SELECT user_id, issued_us, expires_us, last_used_us FROM acl_tokens
                 ORDER BY user_id",
            )
            .map_err(Error::db("listing tokens"))?;
        let rows = st
            .query_map([], |r| {
                Ok((
                    r.get::<_, String>(0)?,
                    r.get::<_, i64>(1)?,
                    r.get::<_, Option<i64>>(2)?,
                    r.get::<_, Option<i64>>(3)?,
                ))
            })
            .map_err(Error::db("listing tokens"))?;
        let mut out = Vec::new();
        for r in rows {
            let (user_id, issued, expires, used) = r.map_err(Error::db("listing tokens"))?;
            let used = used.max(s.token_use.get(&user_id).map(|u| u.0));
            out.push(TokenInfo {
                issued_at: fmt_us(issued),
                expires_at: expires.map(fmt_us),
                expired: expires.is_some_and(|e| now >= e),
                last_used_at: used.map(fmt_us),
                sessions: sessions.get(user_id.as_str()).copied().unwrap_or(0),
                user_id,
            });
        }
        Ok(out)
    }

    /// Revokes a user's bearer token and ends their sessions (`airlock user tokens revoke`).
    /// Returns whether the user had a token. Errors: [`Error::UnknownUser`].
    pub fn revoke_token<'a>(
        &self,
        actor: impl Into<Actor<'a>>,
        user_id: &str,
    ) -> Result<bool, Error> {
        let actor = actor.into();
        let (had, _) = self.mutate(
            |tx, m, p| {
                let Some(u) = m.users.get_key_value(user_id).map(|(k, _)| k.clone()) else {
                    return Err(Error::UnknownUser {
                        user_id: user_id.to_owned(),
                    });
                };
                let e = Error::db("revoking a token");
                tx.execute(
                    "DELETE FROM acl_tokens WHERE user_id = ?1",
                    params![user_id],
                )
                .map_err(e)?;
                tx.execute(
                    "DELETE FROM acl_sessions WHERE user_id = ?1",
                    params![user_id],
                )
                .map_err(Error::db("revoking a token"))?;
                let rec = m.users.get_mut(&u).expect("checked above");
                let had = rec.token.take().is_some();
                rec.token_expires_us = None;
                p.touched.users.insert(u);
                p.tokens_changed = true;
                Ok(had)
            },
            |_, _| Record {
                kind: AuditKind::Admin,
                actor: Some(actor.user_id),
                user_id: Some(user_id),
                request_id: actor.request_id,
                detail: json!({"action": "token_revoke"}),
            },
        )?;
        self.sessions
            .lock()
            .by_digest
            .retain(|_, s| &*s.user != user_id);
        Ok(had)
    }

    /// The membership half of the IAM state from a directory (`airlock acl sync --ldap`):
    /// every listed user exists afterwards with exactly the listed groups (new ones are created
    /// as directory users, not local); users that are not local and not listed (removed or
    /// disabled in the directory) are removed with their token and sessions. Local users that
    /// are not listed keep their groups. Document grants are not touched. Only users whose
    /// groups changed are recomputed. An empty list is refused ([`Error::EmptySnapshot`]): a
    /// directory that returns nobody is a misconfiguration more often than an empty bank.
    /// A listed user whose id is a local account's is left out: the directory never changes a
    /// local account's groups.
    pub fn sync_directory<'a>(
        &self,
        actor: impl Into<Actor<'a>>,
        users: &[(String, Vec<String>)],
    ) -> Result<SyncCounts, Error> {
        let actor = actor.into();
        if users.is_empty() {
            return Err(Error::EmptySnapshot);
        }
        let mut seen = BTreeSet::new();
        for (u, gs) in users {
            check_id(IdKind::User, u)?;
            gs.iter().try_for_each(|g| check_id(IdKind::Group, g))?;
            if !seen.insert(u.as_str()) {
                return Err(Error::InvalidId {
                    kind: IdKind::User,
                    id: u.chars().take(80).collect(),
                    reason: "listed twice by the directory",
                });
            }
        }
        let (counts, changed) = self.mutate(
            |tx, m, p| apply_directory(tx, m, p, users, true),
            |counts, _| Record {
                kind: AuditKind::Sync,
                actor: Some(actor.user_id),
                user_id: None,
                request_id: actor.request_id,
                detail: json!({"source": "directory", "counts": counts}),
            },
        )?;
        Ok(SyncCounts {
            users_access_changed: changed,
            ..counts
        })
    }

    /// One user's directory membership, at sign-in: creates the user (not local) or replaces
    /// their groups when they differ. Nothing is written when nothing changed. Returns whether
    /// anything changed. A local account's id is refused ([`Error::LocalAccount`]): an external
    /// identity never takes a local operator's roles or groups.
    pub fn sync_directory_user<'a>(
        &self,
        actor: impl Into<Actor<'a>>,
        user_id: &str,
        groups: &[String],
    ) -> Result<bool, Error> {
        let actor = actor.into();
        check_id(IdKind::User, user_id)?;
        groups.iter().try_for_each(|g| check_id(IdKind::Group, g))?;
        let want: BTreeSet<&str> = groups.iter().map(String::as_str).collect();
        if let Some(u) = self.user(user_id) {
            if u.local {
                return Err(Error::LocalAccount {
                    user_id: user_id.to_owned(),
                });
            }
            let have: BTreeSet<&str> = u.groups.iter().map(String::as_str).collect();
            if have == want {
                return Ok(false);
            }
        }
        let list = [(user_id.to_owned(), groups.to_vec())];
        self.mutate(
            |tx, m, p| apply_directory(tx, m, p, &list, false),
            |_, _| Record {
                kind: AuditKind::Sync,
                actor: Some(actor.user_id),
                user_id: Some(user_id),
                request_id: actor.request_id,
                detail: json!({"source": "directory-login", "groups": groups}),
            },
        )?;
        Ok(true)
    }
}

/// Rows first, then the model (see [`Acl::sync_directory`]); `full`: remove unlisted users.
fn apply_directory(
    tx: &rusqlite::Transaction<'_>,
    m: &mut Model,
    p: &mut crate::acl::Pending,
    users: &[(String, Vec<String>)],
    full: bool,
) -> Result<SyncCounts, Error> {
    let mut counts = SyncCounts::default();
    // A local account is never an external identity: one sign-in is refused, a full sync leaves
    // local accounts as they are (checked under the writer lock, in the model being changed).
    let is_local = |u: &str| m.users.get(u).is_some_and(|r| r.local);
    if !full && let Some((u, _)) = users.iter().find(|(u, _)| is_local(u)) {
        return Err(Error::LocalAccount { user_id: u.clone() });
    }
    let users: Vec<&(String, Vec<String>)> = users.iter().filter(|(u, _)| !is_local(u)).collect();
    let listed = users
        .iter()
        .map(|(u, gs)| (u.as_str(), gs.iter().map(String::as_str)));
    let changes = Memberships::diff(m, listed, full, &mut counts)?;
    changes.write(tx, "applying directory memberships")?;
    changes.apply(m, p);
    Ok(counts)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{DocGrants, NewUser};

    fn acl() -> (tempfile::TempDir, Acl) {
        let dir = tempfile::tempdir().unwrap();
        let acl = Acl::open(dir.path().join("a.db")).unwrap();
        (dir, acl)
    }

    #[test]
    fn sessions_are_hashed_expire_and_survive_a_reopen() {
        let (dir, acl) = acl();
        acl.add_user("t", "u1", &NewUser::default()).unwrap();
        let s = acl.create_session("u1", Duration::from_secs(3600)).unwrap();
        assert!(s.token.starts_with(SESSION_PREFIX));
        let c = acl.session(&s.token, Duration::from_secs(60)).unwrap();
        assert_eq!(c.principal.user_id, "u1");
        assert!(c.csrf_matches(&s.csrf));
        assert!(!c.csrf_matches(&s.token));
        // Only digests are stored.
        let conn = crate::store::connect(&dir.path().join("a.db")).unwrap();
        let stored: String = conn
            .query_row(
                "SELECT session_sha256 || csrf_sha256 FROM acl_sessions",
                [],
                |r| r.get(0),
            )
            .unwrap();
        assert!(!stored.contains(&s.token[4..]) && !stored.contains(&s.csrf[4..]));
        drop(acl);
        let acl = Acl::open(dir.path().join("a.db")).unwrap();
        assert!(acl.session(&s.token, Duration::from_secs(60)).is_some());
        // Idle: not seen for longer than the idle lifetime.
        std::thread::sleep(Duration::from_millis(30));
        assert!(acl.session(&s.token, Duration::from_millis(10)).is_none());
        // Absolute.
        let short = acl.create_session("u1", Duration::from_millis(20)).unwrap();
        std::thread::sleep(Duration::from_millis(30));
        assert!(acl.session(&short.token, Duration::from_secs(60)).is_none());
        assert!(acl.end_session(&s.token).unwrap());
        assert!(acl.session(&s.token, Duration::from_secs(60)).is_none());
        assert!(
            acl.create_session("nobody", Duration::from_secs(1))
                .is_err()
        );
    }

    #[test]
    fn directory_sync_sets_memberships_only_and_removes_unlisted_users_with_sessions() {
        let (_dir, acl) = acl();
        acl.add_user(
            "t",
            "op",
            &NewUser {
                local: true,
                ..NewUser::default()
            },
        )
        .unwrap();
        acl.set_document_grants(
            "t",
            "d1",
            &DocGrants {
                users: vec![],
                groups: vec!["g".into()],
            },
        )
        .unwrap();
        let list = |v: &[(&str, &[&str])]| -> Vec<(String, Vec<String>)> {
            v.iter()
                .map(|(u, g)| (u.to_string(), g.iter().map(|x| x.to_string()).collect()))
                .collect()
        };
        let c = acl
            .sync_directory("t", &list(&[("a", &["g"]), ("b", &[])]))
            .unwrap();
        assert_eq!(
            (c.users_added, c.users_removed, c.users_access_changed),
            (2, 0, 1)
        );
        assert_eq!(acl.allow_set("a").len(), 1);
        let s = acl.create_session("a", Duration::from_secs(60)).unwrap();
        let t = acl.issue_token("t", "a").unwrap();
        // Unchanged: nothing recomputed.
        let c = acl
            .sync_directory("t", &list(&[("a", &["g"]), ("b", &[])]))
            .unwrap();
        assert_eq!(c, SyncCounts::default());
        // `a` leaves the directory: token and session die, the local operator stays, the grant
        // stays.
        let c = acl.sync_directory("t", &list(&[("b", &["g"])])).unwrap();
        assert_eq!((c.users_removed, c.users_access_changed), (1, 2));
        assert!(acl.session(&s.token, Duration::from_secs(60)).is_none());
        assert!(acl.authenticate(&t).is_none());
        assert!(acl.user("op").is_some());
        assert_eq!(acl.allow_set("b").len(), 1);
        // Back in the directory: the old session does not come back.
        acl.sync_directory("t", &list(&[("a", &["g"]), ("b", &["g"])]))
            .unwrap();
        assert!(acl.session(&s.token, Duration::from_secs(60)).is_none());
        assert!(matches!(
            acl.sync_directory("t", &[]),
            Err(Error::EmptySnapshot)
        ));
    }

    #[test]
    fn an_external_identity_never_takes_a_local_account() {
        let (_dir, acl) = acl();
        acl.add_user(
            "t",
            "op",
            &NewUser {
                local: true,
                roles: vec![crate::Role::Admin],
                ..NewUser::default()
            },
        )
        .unwrap();
        let before = acl.user("op").unwrap();
        assert!(matches!(
            acl.sync_directory_user("t", "op", &["g".into()]),
            Err(Error::LocalAccount { user_id }) if user_id == "op"
        ));
        assert!(matches!(
            acl.sync_directory_user("t", "op", &[]),
            Err(Error::LocalAccount { .. })
        ));
        let list = [
            ("op".to_string(), vec!["g".to_string()]),
            ("a".to_string(), vec!["g".to_string()]),
        ];
        let c = acl.sync_directory("t", &list).unwrap();
        assert_eq!((c.users_added, c.memberships_changed), (1, 1));
        assert_eq!(acl.user("op").unwrap(), before);
        assert_eq!(acl.user("a").unwrap().groups, ["g"]);
    }

    #[test]
    fn sessions_a_change_ends_are_audited_with_it() {
        use crate::{AuditKind, AuditQuery};
        let (_dir, acl) = acl();
        for u in ["u1", "u2"] {
            acl.add_user("t", u, &NewUser::default()).unwrap();
        }
        for u in ["u1", "u1", "u2"] {
            acl.create_session(u, Duration::from_secs(60)).unwrap();
        }
        let sign_ins = || {
            acl.audit_query(&AuditQuery {
                kind: Some(AuditKind::SignIn),
                ..AuditQuery::default()
            })
            .unwrap()
        };
        acl.remove_user("t", "u2").unwrap();
        let e = sign_ins();
        assert_eq!(e.len(), 1);
        assert_eq!(e[0].user_id.as_deref(), Some("u2"));
        assert_eq!(
            e[0].detail,
            json!({"method": "session", "outcome": "sessions_ended", "ended_by": "user_remove",
                   "sessions": 1})
        );
        // An IAM snapshot that no longer lists u1 ends both of u1's sessions.
        acl.sync_snapshot("t", &b"{\"user\": \"u3\", \"groups\": []}\n"[..])
            .unwrap();
        let e = sign_ins();
        assert_eq!(e.len(), 2);
        assert_eq!(e[1].user_id.as_deref(), Some("u1"));
        assert_eq!(e[1].detail["ended_by"], "iam_sync");
        assert_eq!(e[1].detail["sessions"], 2);
        // A change that removes nobody with a session writes no sign-in entry.
        acl.remove_user("t", "u3").unwrap();
        assert_eq!(sign_ins().len(), 2);
    }

    #[test]
    fn a_users_sessions_end_on_request_and_are_audited() {
        use crate::{AuditKind, AuditQuery};
        let (_dir, acl) = acl();
        for u in ["u1", "u2"] {
            acl.add_user("t", u, &NewUser::default()).unwrap();
        }
        let a = acl.create_session("u1", Duration::from_secs(60)).unwrap();
        let b = acl.create_session("u1", Duration::from_secs(60)).unwrap();
        let c = acl.create_session("u2", Duration::from_secs(60)).unwrap();
        let idle = Duration::from_secs(60);
        assert_eq!(
            acl.end_user_sessions(
                Actor {
                    user_id: "adm",
                    request_id: Some("req-1"),
                },
                "u1"
            )
            .unwrap(),
            2
        );
        assert!(acl.session(&a.token, idle).is_none());
        assert!(acl.session(&b.token, idle).is_none());
        assert!(
            acl.session(&c.token, idle).is_some(),
            "another user's session stays"
        );
        let e = acl
            .audit_query(&AuditQuery {
                kind: Some(AuditKind::SignIn),
                ..AuditQuery::default()
            })
            .unwrap();
        assert_eq!(e.len(), 1);
        assert_eq!(e[0].actor.as_deref(), Some("adm"));
        assert_eq!(e[0].user_id.as_deref(), Some("u1"));
        assert_eq!(
            e[0].detail,
            json!({"method": "session", "outcome": "sessions_ended", "ended_by": "sessions_end",
                   "sessions": 2})
        );
        // Gone from the database too: a reopened ACL does not resurrect them.
        let reopened = Acl::open(acl.path()).unwrap();
        assert!(reopened.session(&a.token, idle).is_none());
        assert!(reopened.session(&c.token, idle).is_some());
        assert!(matches!(
            acl.end_user_sessions("adm", "nobody"),
            Err(Error::UnknownUser { .. })
        ));
    }

    #[test]
    fn tokens_expire_are_listed_and_revoked() {
        let (_dir, acl) = acl();
        acl.add_user("t", "u1", &NewUser::default()).unwrap();
        let t = acl
            .issue_token_expiring("t", "u1", Some(Duration::from_millis(30)))
            .unwrap();
        assert!(acl.authenticate(&t).is_some());
        assert!(acl.note_token_use("u1"));
        assert!(
            !acl.note_token_use("u1"),
            "written back at most once a minute"
        );
        acl.persist_token_use("u1").unwrap();
        let l = acl.tokens().unwrap();
        assert_eq!(l.len(), 1);
        assert!(l[0].expires_at.is_some() && l[0].last_used_at.is_some() && !l[0].expired);
        std::thread::sleep(Duration::from_millis(40));
        assert!(acl.authenticate(&t).is_none(), "expired");
        assert!(acl.tokens().unwrap()[0].expired);
        let t = acl.issue_token("t", "u1").unwrap();
        let s = acl.create_session("u1", Duration::from_secs(60)).unwrap();
        assert!(acl.authenticate(&t).is_some());
        assert!(acl.revoke_token("t", "u1").unwrap());
        assert!(acl.authenticate(&t).is_none());
        assert!(acl.session(&s.token, Duration::from_secs(60)).is_none());
        assert!(acl.tokens().unwrap().is_empty());
    }
}
