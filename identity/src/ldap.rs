//! LDAP / Active Directory: the `[ldap]` configuration and the directory client behind
//! `POST /v1/auth/login` and `airlock acl sync --ldap`.
//!
//! Sign-in: bind as the service account, search the user with `user_filter` (the username
//! escaped per RFC 4515, so `*)(uid=*` is a literal), bind as the found DN with the password, bind
//! back as the service account and read the user's groups with `group_filter` (nested groups
//! resolved by following `group_filter` for each group's DN when `nested_groups` is on; with AD use
//! `LDAP_MATCHING_RULE_IN_CHAIN` in the filter instead). An unknown user costs the same work: the
//! password is bound against a DN that does not exist, and the directory refuses it like a wrong
//! password. A disabled user (`disabled_filter`) is only reported as such (403) after the
//! directory accepted the password, so the answer tells nothing to someone without it.
//!
//! TLS is mandatory (`ldaps://`, or `ldap://` with `start_tls = true`) and verified against the
//! configured CA file only (rustls; no system store). The bind password and the CA are read
//! when a connection is made, so rotating the secret file needs no restart.

use std::collections::{BTreeSet, HashSet};
use std::path::PathBuf;
use std::time::Duration;

use ldap3::{Ldap, LdapConnAsync, LdapConnSettings, LdapError, Scope, SearchEntry, ldap_escape};
use serde::Deserialize;

fn d_uid() -> String {
    "uid".into()
}
fn d_cn() -> String {
    "cn".into()
}
fn d_depth() -> u32 {
    8
}
fn d_connect() -> u64 {
    5
}
fn d_timeout() -> u64 {
    10
}
fn d_user_failures() -> u32 {
    5
}
fn d_address_failures() -> u32 {
    20
}
fn d_window() -> u64 {
    300
}
fn d_page() -> u32 {
    500
}

/// `[ldap]`: the directory users sign in against (docs/operations/directory-sign-in.md).
#[derive(Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LdapConfig {
    /// `ldaps://host:636`, or `ldap://host:389` with `start_tls = true`.
    pub url: String,
    /// Upgrade an `ldap://` connection with StartTLS (required for `ldap://`).
    #[serde(default)]
    pub start_tls: bool,
    /// PEM file of the CA(s) that issued the directory's certificate (the only trusted roots).
    pub ca_file: PathBuf,
    /// The service account that searches users and groups.
    pub bind_dn: String,
    /// File holding the service account's password (one line; mode 0600 or stricter).
    pub bind_password_file: PathBuf,
    /// Where users are searched (subtree).
    pub user_base: String,
    /// Filter finding one user; `{username}` is replaced by the escaped username.
    pub user_filter: String,
    /// The attribute whose value is the Airlock user id [default: uid].
    #[serde(default = "d_uid")]
    pub user_id_attr: String,
    /// Where groups are searched (subtree).
    pub group_base: String,
    /// Filter finding a user's groups; `{user_dn}` is replaced by the escaped DN.
    pub group_filter: String,
    /// The attribute whose value is the Airlock group id [default: cn].
    #[serde(default = "d_cn")]
    pub group_name_attr: String,
    /// Resolve nested groups by following `group_filter` with each group's DN [default: false;
    /// AD: use `member:1.2.840.113556.1.4.1941:=` in `group_filter` instead].
    #[serde(default)]
    pub nested_groups: bool,
    /// How many levels of nesting are followed [default: 8].
    #[serde(default = "d_depth")]
    pub max_nesting_depth: u32,
    /// Users matching this filter are disabled: sign-in answers 403 and a sync removes them
    /// (OpenLDAP ppolicy: `(pwdAccountLockedTime=*)`; AD:
    /// `(userAccountControl:1.2.840.113556.1.4.803:=2)`).
    #[serde(default)]
    pub disabled_filter: Option<String>,
    /// Filter listing every user for a sync [default: `user_filter` with `{username}` = `*`].
    #[serde(default)]
    pub sync_filter: Option<String>,
    /// Seconds to connect (TCP and TLS) [default: 5].
    #[serde(default = "d_connect")]
    pub connect_timeout_secs: u64,
    /// Seconds per directory operation [default: 10].
    #[serde(default = "d_timeout")]
    pub timeout_secs: u64,
    /// `airlock serve` syncs the memberships from the directory this often [default: never].
    #[serde(default)]
    pub sync_interval_secs: Option<u64>,
    /// Entries per page of a sync's searches (paged results control, RFC 2696) [default: 500;
    /// at most the directory's own page limit, 1,000 for AD's `MaxPageSize`].
    #[serde(default = "d_page")]
    pub sync_page_size: u32,
    /// Failed sign-ins per username within the window before further attempts are refused
    /// (429) [default: 5].
    #[serde(default = "d_user_failures")]
    pub max_failures_per_user: u32,
    /// Failed sign-ins per client address within the window [default: 20].
    #[serde(default = "d_address_failures")]
    pub max_failures_per_address: u32,
    /// The window of the failure limits, in seconds [default: 300].
    #[serde(default = "d_window")]
    pub failure_window_secs: u64,
}

impl std::fmt::Debug for LdapConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The secret is in a file and never read into the config; the path is not secret.
        f.debug_struct("LdapConfig")
            .field("url", &self.url)
            .field("start_tls", &self.start_tls)
            .field("bind_dn", &self.bind_dn)
            .field("user_base", &self.user_base)
            .field("user_filter", &self.user_filter)
            .field("group_base", &self.group_base)
            .field("group_filter", &self.group_filter)
            .finish_non_exhaustive()
    }
}

/// A refused setting: its name as written in the TOML file and why (config.rs turns it into a
/// `ConfigError::Invalid`).
pub type Invalid = (&'static str, String);

fn invalid(field: &'static str, reason: impl Into<String>) -> Invalid {
    (field, reason.into())
}

/// A filter is one parenthesised expression with balanced parentheses.
fn check_filter(field: &'static str, f: &str, placeholder: Option<&str>) -> Result<(), Invalid> {
    if let Some(p) = placeholder
        && !f.contains(p)
    {
        return Err(invalid(field, format!("must contain {p}")));
    }
    let mut depth = 0i32;
    for c in f.chars() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            _ => {}
        }
        if depth < 0 {
            break;
        }
    }
    if !f.starts_with('(') || !f.ends_with(')') || depth != 0 {
        return Err(invalid(
            field,
            "must be one parenthesised LDAP filter, e.g. (uid={username})",
        ));
    }
    Ok(())
}

impl LdapConfig {
    /// Checks the settings and that the CA and bind password files are usable.
    pub fn validate(&self) -> Result<(), Invalid> {
        let tls_ok = match self.url.split_once("://").map(|(s, _)| s) {
            Some("ldaps") if self.start_tls => {
                return Err(invalid(
                    "ldap.start_tls",
                    "is for ldap:// URLs; ldaps:// is TLS already",
                ));
            }
            Some("ldaps") => true,
            Some("ldap") => self.start_tls,
            _ => return Err(invalid("ldap.url", "must start with ldaps:// or ldap://")),
        };
        if !tls_ok {
            return Err(invalid(
                "ldap.url",
                "ldap:// sends passwords in clear text: use ldaps:// or set start_tls = true",
            ));
        }
        url_host(&self.url).ok_or_else(|| invalid("ldap.url", "has no host"))?;
        self.endpoint()
            .ok_or_else(|| invalid("ldap.url", "has no valid host[:port]"))?;
        tls_config(&self.ca_file).map_err(|e| invalid("ldap.ca_file", e))?;
        read_secret(&self.bind_password_file).map_err(|e| invalid("ldap.bind_password_file", e))?;
        for (field, v) in [
            ("ldap.bind_dn", &self.bind_dn),
            ("ldap.user_base", &self.user_base),
            ("ldap.group_base", &self.group_base),
            ("ldap.user_id_attr", &self.user_id_attr),
            ("ldap.group_name_attr", &self.group_name_attr),
        ] {
            if v.trim().is_empty() {
                return Err(invalid(field, "must not be empty"));
            }
        }
        check_filter("ldap.user_filter", &self.user_filter, Some("{username}"))?;
        check_filter("ldap.group_filter", &self.group_filter, Some("{user_dn}"))?;
        if let Some(f) = &self.disabled_filter {
            check_filter("ldap.disabled_filter", f, None)?;
        }
        if let Some(f) = &self.sync_filter {
            check_filter("ldap.sync_filter", f, None)?;
        }
        for (field, v) in [
            ("ldap.connect_timeout_secs", self.connect_timeout_secs),
            ("ldap.timeout_secs", self.timeout_secs),
            ("ldap.failure_window_secs", self.failure_window_secs),
            (
                "ldap.max_failures_per_user",
                u64::from(self.max_failures_per_user),
            ),
            (
                "ldap.max_failures_per_address",
                u64::from(self.max_failures_per_address),
            ),
            ("ldap.max_nesting_depth", u64::from(self.max_nesting_depth)),
            ("ldap.sync_page_size", u64::from(self.sync_page_size)),
        ] {
            if v == 0 {
                return Err(invalid(field, "must be at least 1"));
            }
        }
        if self.sync_page_size > 10_000 {
            return Err(invalid("ldap.sync_page_size", "must be at most 10000"));
        }
        if self.sync_interval_secs.is_some_and(|s| s < 60) {
            return Err(invalid("ldap.sync_interval_secs", "must be at least 60"));
        }
        Ok(())
    }
}

impl LdapConfig {
    /// The directory's host and TCP port from `url` (default 636 for `ldaps://`, 389 for
    /// `ldap://`): the one address the daemon dials for sign-ins and syncs, so the egress
    /// lockdown allows connects to this port (the appliance's `cli::serve::egress_ports`).
    pub fn endpoint(&self) -> Option<(String, u16)> {
        let authority = url_host(&self.url)?;
        let default = if self.url.starts_with("ldaps://") {
            636
        } else {
            389
        };
        let (host, port) = match authority.strip_prefix('[') {
            // [v6]:port or [v6]
            Some(v6) => {
                let (h, rest) = v6.split_once(']')?;
                match rest.strip_prefix(':') {
                    Some(p) => (h, Some(p)),
                    None if rest.is_empty() => (h, None),
                    None => return None,
                }
            }
            None => match authority.rsplit_once(':') {
                Some((h, p)) => (h, Some(p)),
                None => (authority, None),
            },
        };
        let port = match port {
            Some(p) => p.parse::<u16>().ok().filter(|p| *p != 0)?,
            None => default,
        };
        (!host.is_empty()).then(|| (host.to_owned(), port))
    }
}

/// The one form of a typed username the limits count and the directory is asked for:
/// surrounding whitespace trimmed, NFKC (full-width `ｂｏｂ` is `bob`), case-folded, and runs of
/// inner whitespace as one space. Directories match usernames this loosely (LDAP's caseIgnore
/// matching prepares strings the same way), so every variant that would reach one account is
/// one name here.
pub fn canonical_username(typed: &str) -> String {
    use unicode_normalization::UnicodeNormalization;
    let nfkc: String = typed.nfkc().collect();
    nfkc.to_lowercase()
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
}

/// Whether `c` is invisible to a directory's matching: RFC 4518 §2.2 maps soft hyphens,
/// joiners, variation selectors, format characters and the like to nothing, so `b\u{200B}ob`
/// would reach bob's entry under another name. Usernames holding one are refused.
pub fn is_ignorable_in_usernames(c: char) -> bool {
    matches!(
        c,
        '\u{00AD}'
            | '\u{034F}'
            | '\u{061C}'
            | '\u{115F}'..='\u{1160}'
            | '\u{17B4}'..='\u{17B5}'
            | '\u{1806}'
            | '\u{180B}'..='\u{180F}'
            | '\u{200B}'..='\u{200F}'
            | '\u{202A}'..='\u{202E}'
            | '\u{2060}'..='\u{206F}'
            | '\u{3164}'
            | '\u{FE00}'..='\u{FE0F}'
            | '\u{FEFF}'
            | '\u{FFA0}'
            | '\u{FFF0}'..='\u{FFFC}'
            | '\u{1BCA0}'..='\u{1BCA3}'
            | '\u{1D173}'..='\u{1D17A}'
            | '\u{E0000}'..='\u{E0FFF}'
    )
}

fn url_host(url: &str) -> Option<&str> {
    let rest = url.split_once("://")?.1;
    let host = rest.split(['/', '?']).next()?;
    (!host.is_empty()).then_some(host)
}

/// Reads the bind password: the file must be readable by its owner only.
pub use airlock_platform::secrets::read_secret;

/// A rustls client configuration trusting only the certificates in `ca_file`.
pub use airlock_platform::tls::client_config as tls_config;

/// An error and its sources, `: `-joined.
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
}

/// Why a directory operation failed.
#[derive(Debug, thiserror::Error)]
pub enum DirectoryError {
    /// Unknown user or wrong password (the same answer for both; which one is for the audit
    /// log only).
    #[error("the username or password is wrong")]
    InvalidCredentials(Credentials),
    /// The password is right but the account is disabled or locked (the user id when the entry
    /// had one, for the audit log).
    #[error("the account is disabled")]
    Disabled(Option<String>),
    /// The directory cannot be reached, refused the service account, or failed.
    #[error("the directory is unavailable: {0}")]
    Unavailable(String),
    /// A user or group id from the directory is not usable.
    #[error("the directory returned an unusable entry: {0}")]
    BadEntry(String),
}

/// Why the directory refused a user's credentials: told to the audit log, never to the client.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Credentials {
    /// No entry matched `user_filter`.
    UnknownUser,
    /// Several entries matched `user_filter` (none is picked).
    AmbiguousUser,
    /// The user exists and the password is wrong (their user id when the entry had one).
    WrongPassword(Option<String>),
}

impl Credentials {
    /// The audit outcome name.
    pub fn outcome(&self) -> &'static str {
        match self {
            Credentials::UnknownUser => "unknown_user",
            Credentials::AmbiguousUser => "ambiguous_user",
            Credentials::WrongPassword(_) => "wrong_password",
        }
    }
}

fn unavailable(what: &str, e: impl std::fmt::Display) -> DirectoryError {
    DirectoryError::Unavailable(format!("{what}: {e}"))
}

/// A user as the directory describes them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DirectoryUser {
    /// The Airlock user id (`user_id_attr`).
    pub user_id: String,
    /// The entry's DN.
    pub dn: String,
    /// Group ids (`group_name_attr`), nested ones included, sorted.
    pub groups: Vec<String>,
}

/// A connection-making client over one `[ldap]` configuration.
pub struct Directory {
    cfg: LdapConfig,
}

/// LDAP result codes a user bind may fail with that mean "not this password".
fn is_credentials_refusal(rc: u32) -> bool {
    // 49 invalidCredentials, 48 inappropriateAuthentication, 53 unwillingToPerform (some
    // servers for locked accounts), 50 insufficientAccessRights.
    matches!(rc, 48..=50 | 53)
}

impl Directory {
    /// A client for `cfg` (validated at start-up).
    pub fn new(cfg: LdapConfig) -> Self {
        Directory { cfg }
    }

    fn op_timeout(&self) -> Duration {
        Duration::from_secs(self.cfg.timeout_secs)
    }

    /// Connects and binds as the service account.
    async fn connect(&self) -> Result<Ldap, DirectoryError> {
        let tls = tls_config(&self.cfg.ca_file).map_err(|e| unavailable("CA file", e))?;
        let secret = read_secret(&self.cfg.bind_password_file)
            .map_err(|e| unavailable("bind password file", e))?;
        let settings = LdapConnSettings::new()
            .set_conn_timeout(Duration::from_secs(self.cfg.connect_timeout_secs))
            .set_starttls(self.cfg.start_tls)
            .set_config(tls);
        let (conn, mut ldap) = tokio::time::timeout(
            Duration::from_secs(self.cfg.connect_timeout_secs),
            LdapConnAsync::with_settings(settings, &self.cfg.url),
        )
        .await
        .map_err(|_| unavailable("connecting", "timed out"))?
        .map_err(|e| unavailable("connecting", e))?;
        ldap3::drive!(conn);
        self.service_bind(&mut ldap, &secret).await?;
        Ok(ldap)
    }

    async fn service_bind(&self, ldap: &mut Ldap, secret: &str) -> Result<(), DirectoryError> {
        ldap.with_timeout(self.op_timeout())
            .simple_bind(&self.cfg.bind_dn, secret)
            .await
            .and_then(|r| r.success())
            .map_err(|e| unavailable("service account bind", e))?;
        Ok(())
    }

    async fn search(
        &self,
        ldap: &mut Ldap,
        base: &str,
        filter: &str,
        attrs: Vec<&str>,
    ) -> Result<Vec<SearchEntry>, DirectoryError> {
        let (entries, _) = ldap
            .with_timeout(self.op_timeout())
            .search(base, Scope::Subtree, filter, attrs)
            .await
            .and_then(|r| r.success())
            .map_err(|e| unavailable("search", e))?;
        Ok(entries.into_iter().map(SearchEntry::construct).collect())
    }

    fn attr<'e>(entry: &'e SearchEntry, name: &str) -> Option<&'e str> {
        entry
            .attrs
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .and_then(|(_, v)| v.first())
            .map(String::as_str)
    }

    /// The entry's user id: exactly one value of `user_id_attr` (none, or several, is refused:
    /// an entry with two ids would sign in as whichever comes first).
    fn user_id_of(&self, entry: &SearchEntry) -> Result<String, DirectoryError> {
        let values: Vec<&String> = entry
            .attrs
            .iter()
            .filter(|(k, _)| k.eq_ignore_ascii_case(&self.cfg.user_id_attr))
            .flat_map(|(_, v)| v)
            .collect();
        match values.as_slice() {
            [one] => Ok((*one).clone()),
            [] => Err(DirectoryError::BadEntry(format!(
                "{} has no {}",
                entry.dn, self.cfg.user_id_attr
            ))),
            many => Err(DirectoryError::BadEntry(format!(
                "{} has {} values of {} (one user id is required)",
                entry.dn,
                many.len(),
                self.cfg.user_id_attr
            ))),
        }
    }

    /// A subtree search in pages of `sync_page_size` (RFC 2696), so a directory's size limit
    /// (AD: 1,000 entries per search) does not cut a sync short.
    async fn search_paged(
        &self,
        ldap: &mut Ldap,
        filter: &str,
        attrs: Vec<&str>,
    ) -> Result<Vec<SearchEntry>, DirectoryError> {
        use ldap3::adapters::{Adapter, EntriesOnly, PagedResults};
        let page = i32::try_from(self.cfg.sync_page_size).unwrap_or(i32::MAX);
        let adapters: Vec<Box<dyn Adapter<_, _>>> = vec![
            Box::new(EntriesOnly::new()),
            Box::new(PagedResults::new(page)),
        ];
        let mut stream = ldap
            .with_timeout(self.op_timeout())
            .streaming_search_with(adapters, &self.cfg.user_base, Scope::Subtree, filter, attrs)
            .await
            .map_err(|e| unavailable("paged search", e))?;
        let mut out = Vec::new();
        while let Some(e) = stream
            .next()
            .await
            .map_err(|e| unavailable("paged search", e))?
        {
            out.push(SearchEntry::construct(e));
        }
        stream
            .finish()
            .await
            .success()
            .map_err(|e| unavailable("paged search", e))?;
        Ok(out)
    }

    /// The groups of the entry `dn` (nested ones followed when configured), sorted.
    async fn groups_of(&self, ldap: &mut Ldap, dn: &str) -> Result<Vec<String>, DirectoryError> {
        let mut names = BTreeSet::new();
        let mut seen: HashSet<String> = HashSet::new();
        let mut frontier = vec![dn.to_owned()];
        let depth = if self.cfg.nested_groups {
            self.cfg.max_nesting_depth
        } else {
            1
        };
        for _ in 0..depth {
            let mut next = Vec::new();
            for member in &frontier {
                let filter = self
                    .cfg
                    .group_filter
                    .replace("{user_dn}", &ldap_escape(member));
                let attrs = vec![self.cfg.group_name_attr.as_str()];
                for g in self
                    .search(ldap, &self.cfg.group_base, &filter, attrs)
                    .await?
                {
                    if !seen.insert(g.dn.to_ascii_lowercase()) {
                        continue;
                    }
                    let name = Self::attr(&g, &self.cfg.group_name_attr).ok_or_else(|| {
                        DirectoryError::BadEntry(format!(
                            "group {} has no {}",
                            g.dn, self.cfg.group_name_attr
                        ))
                    })?;
                    names.insert(name.to_owned());
                    next.push(g.dn);
                }
            }
            if next.is_empty() {
                break;
            }
            frontier = next;
        }
        Ok(names.into_iter().collect())
    }

    /// Whether the entry `dn` matches `disabled_filter`.
    async fn is_disabled(&self, ldap: &mut Ldap, dn: &str) -> Result<bool, DirectoryError> {
        let Some(f) = &self.cfg.disabled_filter else {
            return Ok(false);
        };
        let (entries, _) = ldap
            .with_timeout(self.op_timeout())
            .search(dn, Scope::Base, f, vec!["1.1"])
            .await
            .and_then(|r| r.success())
            .map_err(|e| unavailable("disabled check", e))?;
        Ok(!entries.is_empty())
    }

    /// Signs a user in: the directory user with their groups, or why not.
    pub async fn login(
        &self,
        username: &str,
        password: &str,
    ) -> Result<DirectoryUser, DirectoryError> {
        let mut ldap = self.connect().await?;
        let filter = self
            .cfg
            .user_filter
            .replace("{username}", &ldap_escape(username));
        let attrs = vec![self.cfg.user_id_attr.as_str()];
        let found = self
            .search(&mut ldap, &self.cfg.user_base, &filter, attrs)
            .await?;
        // Exactly one entry, or nobody (an ambiguous filter must not pick one).
        let (entry, nobody) = match found.as_slice() {
            [e] => (Some(e.clone()), Credentials::UnknownUser),
            [] => (None, Credentials::UnknownUser),
            many => {
                tracing::warn!(
                    entries = many.len(),
                    "ldap.user_filter matched several entries; sign-in refused"
                );
                (None, Credentials::AmbiguousUser)
            }
        };
        // The same work for an unknown user: a bind the directory refuses like a wrong password.
        let bind_dn = match &entry {
            Some(e) => e.dn.clone(),
            None => format!(
                "{}=airlock-no-such-user-{},{}",
                self.cfg.user_id_attr,
                uuid::Uuid::new_v4().simple(),
                self.cfg.user_base
            ),
        };
        let bound = ldap
            .with_timeout(self.op_timeout())
            .simple_bind(&bind_dn, password)
            .await
            .and_then(|r| r.success());
        match bound {
            Ok(_) => {}
            Err(LdapError::LdapResult { result }) if is_credentials_refusal(result.rc) => {
                let _ = ldap.unbind().await;
                return Err(DirectoryError::InvalidCredentials(match &entry {
                    Some(e) => Credentials::WrongPassword(
                        Self::attr(e, &self.cfg.user_id_attr).map(str::to_owned),
                    ),
                    None => nobody,
                }));
            }
            Err(e) => return Err(unavailable("user bind", e)),
        }
        let Some(entry) = entry else {
            // The directory accepted a bind to a DN we made up: refuse, never sign in.
            tracing::error!("the directory accepted a bind to a non-existent DN");
            return Err(DirectoryError::InvalidCredentials(nobody));
        };
        let secret = read_secret(&self.cfg.bind_password_file)
            .map_err(|e| unavailable("bind password file", e))?;
        self.service_bind(&mut ldap, &secret).await?;
        if self.is_disabled(&mut ldap, &entry.dn).await? {
            let _ = ldap.unbind().await;
            return Err(DirectoryError::Disabled(
                Self::attr(&entry, &self.cfg.user_id_attr).map(str::to_owned),
            ));
        }
        let user = self.describe(&mut ldap, &entry).await?;
        let _ = ldap.unbind().await;
        Ok(user)
    }

    async fn describe(
        &self,
        ldap: &mut Ldap,
        entry: &SearchEntry,
    ) -> Result<DirectoryUser, DirectoryError> {
        let user_id = self.user_id_of(entry)?;
        let groups = self.groups_of(ldap, &entry.dn).await?;
        Ok(DirectoryUser {
            user_id,
            dn: entry.dn.clone(),
            groups,
        })
    }

    /// Every enabled user with their groups, for a membership sync (searched in pages). An
    /// entry without exactly one user id is left out (logged): it cannot sign in either.
    pub async fn all_users(&self) -> Result<Vec<DirectoryUser>, DirectoryError> {
        let mut ldap = self.connect().await?;
        let filter = self
            .cfg
            .sync_filter
            .clone()
            .unwrap_or_else(|| self.cfg.user_filter.replace("{username}", "*"));
        let attrs = vec![self.cfg.user_id_attr.as_str()];
        let entries = self.search_paged(&mut ldap, &filter, attrs).await?;
        let disabled: HashSet<String> = match &self.cfg.disabled_filter {
            Some(d) => self
                .search_paged(&mut ldap, &format!("(&{filter}{d})"), vec!["1.1"])
                .await?
                .into_iter()
                .map(|e| e.dn.to_ascii_lowercase())
                .collect(),
            None => HashSet::new(),
        };
        let mut out = Vec::with_capacity(entries.len());
        for e in entries {
            if disabled.contains(&e.dn.to_ascii_lowercase()) {
                continue;
            }
            if let Err(DirectoryError::BadEntry(why)) = self.user_id_of(&e) {
                tracing::warn!(entry = %e.dn, "directory sync leaves out an entry: {why}");
                continue;
            }
            out.push(self.describe(&mut ldap, &e).await?);
        }
        let _ = ldap.unbind().await;
        Ok(out)
    }
}

/// The `(user id, groups)` list [`airlock_acl::Acl::sync_directory`] takes.
pub fn membership_list(users: Vec<DirectoryUser>) -> Vec<(String, Vec<String>)> {
    users.into_iter().map(|u| (u.user_id, u.groups)).collect()
}

/// Reads every enabled user's groups from the directory and applies them as the membership
/// half of the IAM state (blocking: call from a blocking thread or the CLI).
pub fn sync_blocking(
    acl: &airlock_acl::Acl,
    cfg: &LdapConfig,
    actor: &str,
) -> Result<airlock_acl::SyncCounts, String> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    let users = rt
        .block_on(Directory::new(cfg.clone()).all_users())
        .map_err(|e| e.to_string())?;
    acl.sync_directory(actor, &membership_list(users))
        .map_err(|e| error_chain(&e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn filters_are_checked() {
        assert!(check_filter("f", "(uid={username})", Some("{username}")).is_ok());
        assert!(
            check_filter(
                "f",
                "(&(objectClass=user)(sAMAccountName={username}))",
                Some("{username}")
            )
            .is_ok()
        );
        assert!(check_filter("f", "uid={username}", Some("{username}")).is_err());
        assert!(check_filter("f", "(uid=x)", Some("{username}")).is_err());
        assert!(check_filter("f", "(uid={username}))(", Some("{username}")).is_err());
        assert_eq!(url_host("ldaps://dc1.bank:636"), Some("dc1.bank:636"));
        assert_eq!(url_host("ldaps://"), None);
    }

    #[test]
    fn the_endpoint_is_the_urls_host_and_port_with_ldap_defaults() {
        let cfg = |url: &str| LdapConfig {
            url: url.into(),
            ..toml::from_str::<LdapConfig>(
                "url = \"ldaps://x\"\nca_file = \"c\"\nbind_dn = \"b\"\n\
                 bind_password_file = \"p\"\nuser_base = \"u\"\n\
                 user_filter = \"(uid={username})\"\ngroup_base = \"g\"\n\
                 group_filter = \"(member={user_dn})\"\n",
            )
            .unwrap()
        };
        let e = |url: &str| cfg(url).endpoint();
        assert_eq!(e("ldaps://dc1.bank:3269"), Some(("dc1.bank".into(), 3269)));
        assert_eq!(e("ldaps://dc1.bank"), Some(("dc1.bank".into(), 636)));
        assert_eq!(e("ldap://dc1.bank/"), Some(("dc1.bank".into(), 389)));
        assert_eq!(e("ldaps://[::1]:1636"), Some(("::1".into(), 1636)));
        assert_eq!(e("ldaps://[::1]"), Some(("::1".into(), 636)));
        assert_eq!(e("ldaps://dc1.bank:x"), None);
        assert_eq!(e("ldaps://dc1.bank:0"), None);
        assert_eq!(e("ldaps://:636"), None);
    }

    #[test]
    fn usernames_have_one_canonical_form() {
        for v in [
            "bob",
            " bob",
            "bob ",
            "BOB",
            "ｂｏｂ",
            "Ｂｏｂ",
            "\u{3000}bob\t",
        ] {
            assert_eq!(canonical_username(v), "bob", "{v:?}");
        }
        assert_eq!(canonical_username(" Anna  Maria "), "anna maria");
        assert_eq!(canonical_username("\u{3000} "), "");
        assert_ne!(canonical_username("b o b"), "bob");
        for c in ['\u{00AD}', '\u{200B}', '\u{2060}', '\u{FE0F}', '\u{FEFF}'] {
            assert!(is_ignorable_in_usernames(c), "{c:?}");
        }
        assert!(
            "bob ｂｏｂ é"
                .chars()
                .all(|c| !is_ignorable_in_usernames(c))
        );
    }

    #[test]
    fn usernames_are_escaped_per_rfc_4515() {
        assert_eq!(ldap_escape("*)(uid=*"), "\\2a\\29\\28uid=\\2a");
        assert_eq!(ldap_escape("a\\b\0"), "a\\5cb\\00");
    }
}
