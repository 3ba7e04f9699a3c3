//! SQLite persistence: versioned migrations, the start-up load, and the row writers used inside
//! the transactions of [`crate::Acl`].
//!
//! Tables (all prefixed `acl_` except the shared `doc_ordinals`): `acl_schema_migrations`,
//! `acl_users`, `acl_user_roles`, `acl_memberships`, `acl_tokens`, `acl_grant_users`,
//! `acl_grant_groups`, `acl_audit`, `acl_sessions`.

use std::collections::HashMap;
use std::path::Path;
use std::time::Duration;

use rusqlite::{Connection, params};

use crate::error::Error;
use crate::model::{Grant, Model, Name, Role, sorted_diff};
use crate::ordinals;

/// One schema step. Versions are applied in order, each in its own transaction, and recorded in
/// `acl_schema_migrations`; a database with a higher version than [`SCHEMA_VERSION`] is refused.
struct Migration {
    version: i64,
    name: &'static str,
    apply: fn(&Connection) -> rusqlite::Result<()>,
}

const MIGRATIONS: &[Migration] = &[
    Migration {
        version: 1,
        name: "doc_ordinals",
        apply: ordinals::migrate,
    },
    Migration {
        version: 2,
        name: "principals, grants, tokens",
        apply: |c| c.execute_batch(V2_PRINCIPALS),
    },
    Migration {
        version: 3,
        name: "append-only audit log",
        apply: |c| c.execute_batch(V3_AUDIT),
    },
    Migration {
        version: 4,
        name: "separate roles: admins keep the operator duties they had",
        apply: |c| c.execute_batch(V4_ROLES),
    },
    Migration {
        version: 5,
        name: "sign-in sessions, token expiry and last use",
        apply: |c| c.execute_batch(V5_SESSIONS),
    },
];

/// The schema version this build writes.
pub const SCHEMA_VERSION: i64 = 5;

const V2_PRINCIPALS: &str = "
CREATE TABLE acl_users (
    user_id    TEXT PRIMARY KEY,
    local      INTEGER NOT NULL CHECK (local IN (0, 1)),
    created_us INTEGER NOT NULL
) STRICT;
CREATE TABLE acl_user_roles (
    user_id TEXT NOT NULL REFERENCES acl_users(user_id),
    role    TEXT NOT NULL,
    PRIMARY KEY (user_id, role)
) STRICT, WITHOUT ROWID;
CREATE TABLE acl_memberships (
    user_id  TEXT NOT NULL REFERENCES acl_users(user_id),
    group_id TEXT NOT NULL,
    PRIMARY KEY (user_id, group_id)
) STRICT, WITHOUT ROWID;
CREATE INDEX acl_memberships_group ON acl_memberships(group_id);
CREATE TABLE acl_tokens (
    user_id      TEXT PRIMARY KEY REFERENCES acl_users(user_id),
    token_sha256 TEXT NOT NULL UNIQUE,
    issued_us    INTEGER NOT NULL
) STRICT;
CREATE TABLE acl_grant_users (
    ordinal INTEGER NOT NULL REFERENCES doc_ordinals(ordinal),
    user_id TEXT NOT NULL,
    PRIMARY KEY (ordinal, user_id)
) STRICT, WITHOUT ROWID;
CREATE TABLE acl_grant_groups (
    ordinal  INTEGER NOT NULL REFERENCES doc_ordinals(ordinal),
    group_id TEXT NOT NULL,
    PRIMARY KEY (ordinal, group_id)
) STRICT, WITHOUT ROWID;
";

const V3_AUDIT: &str = "
CREATE TABLE acl_audit (
    seq        INTEGER PRIMARY KEY AUTOINCREMENT,
    at_us      INTEGER NOT NULL,
    kind       TEXT NOT NULL,
    actor      TEXT,
    user_id    TEXT,
    request_id TEXT,
    detail     TEXT NOT NULL
) STRICT;
CREATE INDEX acl_audit_user_at ON acl_audit(user_id, at_us);
CREATE INDEX acl_audit_actor_at ON acl_audit(actor, at_us);
CREATE INDEX acl_audit_at ON acl_audit(at_us);
CREATE TRIGGER acl_audit_no_update BEFORE UPDATE ON acl_audit
BEGIN SELECT RAISE(ABORT, 'acl_audit is append-only'); END;
CREATE TRIGGER acl_audit_no_delete BEFORE DELETE ON acl_audit
BEGIN SELECT RAISE(ABORT, 'acl_audit is append-only'); END;
";

const V5_SESSIONS: &str = "
ALTER TABLE acl_tokens ADD COLUMN expires_us INTEGER;
ALTER TABLE acl_tokens ADD COLUMN last_used_us INTEGER;
CREATE TABLE acl_sessions (
    session_sha256 TEXT PRIMARY KEY,
    user_id        TEXT NOT NULL REFERENCES acl_users(user_id),
    csrf_sha256    TEXT NOT NULL,
    created_us     INTEGER NOT NULL,
    last_seen_us   INTEGER NOT NULL,
    expires_us     INTEGER NOT NULL
) STRICT;
CREATE INDEX acl_sessions_user ON acl_sessions(user_id);
";

/// Before version 4 `admin` was the only role and opened every privileged endpoint; it now means
/// configuration and users only, and content operations are `operator`'s. Existing admins get
/// `operator` too, so an upgrade changes no one's access; new users get exactly the roles
/// named.
const V4_ROLES: &str = "
INSERT OR IGNORE INTO acl_user_roles (user_id, role)
    SELECT user_id, 'operator' FROM acl_user_roles WHERE role = 'admin';
";

/// Opens a connection with the crate's settings (WAL, foreign keys, busy timeout).
pub(crate) fn connect(path: &Path) -> Result<Connection, Error> {
    let open = |source| Error::Open {
        path: path.to_owned(),
        source,
    };
    let conn = Connection::open(path).map_err(open)?;
    conn.busy_timeout(Duration::from_secs(10)).map_err(open)?;
    conn.pragma_update(None, "journal_mode", "WAL")
        .map_err(open)?;
    conn.pragma_update(None, "foreign_keys", true)
        .map_err(open)?;
    Ok(conn)
}

/// Applies every migration newer than the database's version.
pub(crate) fn migrate(conn: &mut Connection) -> Result<(), Error> {
    conn.execute_batch(
        "CREATE TABLE IF NOT EXISTS acl_schema_migrations (
             version    INTEGER PRIMARY KEY,
             name       TEXT NOT NULL,
             applied_us INTEGER NOT NULL
         ) STRICT;",
    )
    .map_err(Error::db("creating the migration table"))?;
    for m in MIGRATIONS {
        let tx = conn
            .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)
            .map_err(Error::db("starting a migration"))?;
        let current: i64 = tx
            .query_row(
                "SELECT COALESCE(MAX(version), 0) FROM acl_schema_migrations",
                [],
                |r| r.get(0),
            )
            .map_err(Error::db("reading the schema version"))?;
        if current > SCHEMA_VERSION {
            return Err(Error::SchemaTooNew {
                found: current,
                supported: SCHEMA_VERSION,
            });
        }
        if current >= m.version {
            continue;
        }
        (m.apply)(&tx).map_err(Error::db("applying a migration"))?;
        tx.execute(
            "INSERT INTO acl_schema_migrations (version, name, applied_us) VALUES (?1, ?2, ?3)",
            params![m.version, m.name, now_us()],
        )
        .map_err(Error::db("recording a migration"))?;
        tx.commit().map_err(Error::db("committing a migration"))?;
        tracing::info!(version = m.version, name = m.name, "acl schema migrated");
    }
    Ok(())
}

/// Microseconds since the Unix epoch (the audit and row timestamps).
pub(crate) fn now_us() -> i64 {
    let ns = time::OffsetDateTime::now_utc().unix_timestamp_nanos();
    i64::try_from(ns / 1000).unwrap_or(i64::MAX)
}

fn ordinal_of(v: i64) -> Result<u32, Error> {
    u32::try_from(v).map_err(|_| Error::Corrupt {
        detail: format!("document ordinal {v} out of range"),
    })
}

/// Reads every row into a fresh model.
pub(crate) fn load(conn: &Connection) -> Result<Model, Error> {
    let mut m = Model::default();
    let e = Error::db;

    let mut st = conn
        .prepare("SELECT doc_id, ordinal FROM doc_ordinals")
        .map_err(e("loading ordinals"))?;
    let mut rows = st.query([]).map_err(e("loading ordinals"))?;
    while let Some(r) = rows.next().map_err(e("loading ordinals"))? {
        let id: String = r.get(0).map_err(e("loading ordinals"))?;
        let o = ordinal_of(r.get(1).map_err(e("loading ordinals"))?)?;
        let id = m.intern(&id);
        m.ordinals.insert(id, o);
    }

    let mut st = conn
        .prepare("SELECT user_id, local FROM acl_users")
        .map_err(e("loading users"))?;
    let mut rows = st.query([]).map_err(e("loading users"))?;
    while let Some(r) = rows.next().map_err(e("loading users"))? {
        let id: String = r.get(0).map_err(e("loading users"))?;
        let local: bool = r.get(1).map_err(e("loading users"))?;
        let id = m.intern(&id);
        m.insert_user(id, local);
    }

    let mut st = conn
        .prepare("SELECT user_id, role FROM acl_user_roles")
        .map_err(e("loading roles"))?;
    let mut rows = st.query([]).map_err(e("loading roles"))?;
    while let Some(r) = rows.next().map_err(e("loading roles"))? {
        let id: String = r.get(0).map_err(e("loading roles"))?;
        let role: String = r.get(1).map_err(e("loading roles"))?;
        let role: Role = role.parse().map_err(|_| Error::Corrupt {
            detail: format!("unknown role {role:?} stored for user {id:?}"),
        })?;
        user_mut(&mut m, &id)?.roles.insert(role);
    }

    let mut groups: HashMap<Name, std::collections::BTreeSet<Name>> = HashMap::new();
    let mut st = conn
        .prepare("SELECT user_id, group_id FROM acl_memberships")
        .map_err(e("loading memberships"))?;
    let mut rows = st.query([]).map_err(e("loading memberships"))?;
    while let Some(r) = rows.next().map_err(e("loading memberships"))? {
        let id: String = r.get(0).map_err(e("loading memberships"))?;
        let g: String = r.get(1).map_err(e("loading memberships"))?;
        let (id, g) = (m.intern(&id), m.intern(&g));
        groups.entry(id).or_default().insert(g);
    }
    for (id, gs) in groups {
        if !m.users.contains_key(&id) {
            return Err(Error::Corrupt {
                detail: format!("membership rows for missing user {id:?}"),
            });
        }
        m.set_user_groups(&id, gs);
    }

    let mut st = conn
        .prepare("SELECT user_id, token_sha256, expires_us FROM acl_tokens")
        .map_err(e("loading tokens"))?;
    let mut rows = st.query([]).map_err(e("loading tokens"))?;
    while let Some(r) = rows.next().map_err(e("loading tokens"))? {
        let id: String = r.get(0).map_err(e("loading tokens"))?;
        let h: String = r.get(1).map_err(e("loading tokens"))?;
        let expires: Option<i64> = r.get(2).map_err(e("loading tokens"))?;
        let mut digest = [0u8; 32];
        hex::decode_to_slice(&h, &mut digest).map_err(|_| Error::Corrupt {
            detail: format!("malformed token digest for user {id:?}"),
        })?;
        let rec = user_mut(&mut m, &id)?;
        rec.token = Some(digest);
        rec.token_expires_us = expires;
    }

    let mut raw: HashMap<u32, (Vec<String>, Vec<String>)> = HashMap::new();
    for (sql, is_user) in [
        ("SELECT ordinal, user_id FROM acl_grant_users", true),
        ("SELECT ordinal, group_id FROM acl_grant_groups", false),
    ] {
        let mut st = conn.prepare(sql).map_err(e("loading grants"))?;
        let mut rows = st.query([]).map_err(e("loading grants"))?;
        while let Some(r) = rows.next().map_err(e("loading grants"))? {
            let o = ordinal_of(r.get(0).map_err(e("loading grants"))?)?;
            let name: String = r.get(1).map_err(e("loading grants"))?;
            let entry = raw.entry(o).or_default();
            if is_user {
                entry.0.push(name);
            } else {
                entry.1.push(name);
            }
        }
    }
    let mut affected = crate::model::Touched::default();
    for (o, (users, groups)) in raw {
        let g = m.grant_from(&users, &groups);
        m.set_grant(o, g, &mut affected);
    }
    Ok(m)
}

fn user_mut<'m>(m: &'m mut Model, id: &str) -> Result<&'m mut crate::model::UserRecord, Error> {
    m.users.get_mut(id).ok_or_else(|| Error::Corrupt {
        detail: format!("rows for missing user {id:?}"),
    })
}

/// Inserts a new user row.
pub(crate) fn insert_user(c: &Connection, id: &str, local: bool) -> rusqlite::Result<()> {
    c.prepare_cached("INSERT INTO acl_users (user_id, local, created_us) VALUES (?1, ?2, ?3)")?
        .execute(params![id, local, now_us()])?;
    Ok(())
}

/// Deletes a user with memberships, roles, token and sessions.
pub(crate) fn delete_user(c: &Connection, id: &str) -> rusqlite::Result<()> {
    for sql in [
        "DELETE FROM acl_sessions WHERE user_id = ?1",
        "DELETE FROM acl_memberships WHERE user_id = ?1",
        "DELETE FROM acl_user_roles WHERE user_id = ?1",
        "DELETE FROM acl_tokens WHERE user_id = ?1",
        "DELETE FROM acl_users WHERE user_id = ?1",
    ] {
        c.prepare_cached(sql)?.execute(params![id])?;
    }
    Ok(())
}

/// Replaces a user's memberships.
pub(crate) fn write_memberships<'a>(
    c: &Connection,
    id: &str,
    groups: impl IntoIterator<Item = &'a Name>,
) -> rusqlite::Result<()> {
    c.prepare_cached("DELETE FROM acl_memberships WHERE user_id = ?1")?
        .execute(params![id])?;
    let mut ins =
        c.prepare_cached("INSERT INTO acl_memberships (user_id, group_id) VALUES (?1, ?2)")?;
    for g in groups {
        ins.execute(params![id, &**g])?;
    }
    Ok(())
}

/// Replaces a user's roles.
pub(crate) fn write_roles<'a>(
    c: &Connection,
    id: &str,
    roles: impl IntoIterator<Item = &'a Role>,
) -> rusqlite::Result<()> {
    c.prepare_cached("DELETE FROM acl_user_roles WHERE user_id = ?1")?
        .execute(params![id])?;
    let mut ins = c.prepare_cached("INSERT INTO acl_user_roles (user_id, role) VALUES (?1, ?2)")?;
    for r in roles {
        ins.execute(params![id, r.as_str()])?;
    }
    Ok(())
}

/// Stores (replaces) a user's token digest, with its expiry (`None`: never); a new token has
/// not been used yet.
pub(crate) fn write_token(
    c: &Connection,
    id: &str,
    digest: &[u8; 32],
    expires_us: Option<i64>,
) -> rusqlite::Result<()> {
    c.prepare_cached(
        "INSERT INTO acl_tokens (user_id, token_sha256, issued_us, expires_us, last_used_us)
         VALUES (?1, ?2, ?3, ?4, NULL)
         ON CONFLICT (user_id) DO UPDATE SET token_sha256 = excluded.token_sha256,
                                             issued_us = excluded.issued_us,
                                             expires_us = excluded.expires_us,
                                             last_used_us = NULL",
    )?
    .execute(params![id, hex::encode(digest), now_us(), expires_us])?;
    Ok(())
}

/// Changes the grant rows of one document from `old` (what is stored) to `new`, touching only
/// the rows that differ.
pub(crate) fn write_grant(
    c: &Connection,
    ordinal: u32,
    old: &Grant,
    new: &Grant,
) -> rusqlite::Result<()> {
    for (table, col, old, new) in [
        ("acl_grant_users", "user_id", &old.users, &new.users),
        ("acl_grant_groups", "group_id", &old.groups, &new.groups),
    ] {
        let mut del = c.prepare_cached(&format!(
            "DELETE FROM {table} WHERE ordinal = ?1 AND {col} = ?2"
        ))?;
        let mut ins = c.prepare_cached(&format!(
            "INSERT INTO {table} (ordinal, {col}) VALUES (?1, ?2)"
        ))?;
        let mut res = Ok(());
        sorted_diff(old, new, |name, added| {
            if res.is_ok() {
                let st = if added { &mut ins } else { &mut del };
                res = st.execute(params![ordinal, &**name]).map(drop);
            }
        });
        res?;
    }
    Ok(())
}

/// The stored grant of one document, read from the rows (for the admin view).
pub(crate) fn read_grant(
    c: &Connection,
    ordinal: u32,
) -> rusqlite::Result<(Vec<String>, Vec<String>)> {
    let mut users = Vec::new();
    let mut st = c.prepare_cached(
        "SELECT user_id FROM acl_grant_users WHERE ordinal = ?1 ORDER BY user_id",
    )?;
    for r in st.query_map(params![ordinal], |r| r.get(0))? {
        users.push(r?);
    }
    let mut groups = Vec::new();
    let mut st = c.prepare_cached(
        "SELECT group_id FROM acl_grant_groups WHERE ordinal = ?1 ORDER BY group_id",
    )?;
    for r in st.query_map(params![ordinal], |r| r.get(0))? {
        groups.push(r?);
    }
    Ok((users, groups))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn migration_4_gives_existing_admins_the_operator_role() {
        let dir = tempfile::tempdir().unwrap();
        let mut c = connect(&dir.path().join("a.db")).unwrap();
        migrate(&mut c).unwrap();
        // A database as version 3 left it: `admin` was the only role (and no sessions yet).
        c.execute_batch(
            "DELETE FROM acl_schema_migrations WHERE version >= 4;
             DROP TABLE acl_sessions;
             ALTER TABLE acl_tokens DROP COLUMN expires_us;
             ALTER TABLE acl_tokens DROP COLUMN last_used_us;
             INSERT INTO acl_users VALUES ('root', 1, 0), ('u1', 0, 0);
             INSERT INTO acl_user_roles VALUES ('root', 'admin');",
        )
        .unwrap();
        migrate(&mut c).unwrap();
        let model = load(&c).unwrap();
        let roles = |u: &str| model.users[u].roles.iter().copied().collect::<Vec<_>>();
        assert_eq!(roles("root"), [Role::Admin, Role::Operator]);
        assert!(roles("u1").is_empty());
    }

    #[test]
    fn migrations_are_versioned_and_idempotent() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.db");
        let mut c = connect(&path).unwrap();
        migrate(&mut c).unwrap();
        migrate(&mut c).unwrap();
        let versions: Vec<i64> = c
            .prepare("SELECT version FROM acl_schema_migrations ORDER BY version")
            .unwrap()
            .query_map([], |r| r.get(0))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        assert_eq!(versions, [1, 2, 3, 4, 5]);
        let mode: String = c
            .query_row("PRAGMA journal_mode", [], |r| r.get(0))
            .unwrap();
        assert_eq!(mode, "wal");

        c.execute(
            "INSERT INTO acl_schema_migrations VALUES (99, 'future', 0)",
            [],
        )
        .unwrap();
        assert!(matches!(
            migrate(&mut c),
            Err(Error::SchemaTooNew { found: 99, .. })
        ));
    }
}
