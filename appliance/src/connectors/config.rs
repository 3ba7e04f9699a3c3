//! `[[connectors]]`: one entry per source (docs/operations/connectors.md). Checked at start-up
//! ([`ConnectorConfig::check`]); the password is read from its file at every sync, so rotating
//! it needs no restart.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::scope::{MAX_GLOBS, PathScope};

/// Longest alias, bytes.
pub const MAX_ALIAS: usize = 32;
/// Shortest and longest sync interval, minutes (one week).
pub const INTERVAL_MINUTES: std::ops::RangeInclusive<u64> = 1..=10_080;
/// Largest `max_file_bytes` (1 GiB).
pub const MAX_FILE_BYTES: u64 = 1 << 30;
/// Largest `max_entries`.
pub const MAX_ENTRIES: usize = 1_000_000;

/// Where the share's own permissions (the share ACL) come from.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ShareAcl {
    /// Read from the server at every sync (srvsvc level 502); a refusal fails the sync.
    #[default]
    Server,
    /// The operator states that the share has no ACL of its own (it allows everyone; only the
    /// files' ACLs count). Samba 4.17 answers level 502 without a descriptor for such a share.
    None,
}

/// One `[[connectors]]` entry.
#[derive(Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ConnectorConfig {
    /// The source's name in the API, the CLI, metrics and audit rows (`[a-z0-9-]`, ≤ 32).
    pub alias: String,
    /// `smb`: a Windows (or Samba) file share with Active Directory.
    pub kind: String,
    /// The file server's host name or IP address (no scheme, no port).
    pub host: String,
    /// The file server's TCP port [default: 445].
    #[serde(default)]
    pub port: Option<u16>,
    /// The share's name.
    pub share: String,
    /// A folder inside the share to crawl, `/`-separated [default: the whole share].
    #[serde(default)]
    pub path: Option<String>,
    /// The service account's domain (NetBIOS name, e.g. `BANK`).
    pub domain: String,
    /// The service account (sAMAccountName).
    pub username: String,
    /// File holding its password (mode 600; never inline).
    pub password_file: PathBuf,
    /// The domain controller: `ldaps://host[:636]`, or `ldap://host[:389]` with `ldap_start_tls`.
    pub ldap_url: String,
    /// Upgrade an `ldap://` connection with StartTLS [default: false].
    #[serde(default)]
    pub ldap_start_tls: bool,
    /// The CA certificates (PEM) the domain controller's certificate must chain to.
    pub ldap_ca_file: PathBuf,
    /// The service account's LDAP bind name (`svc-airlock@bank.example` or a DN).
    pub ldap_bind: String,
    /// Minutes between syncs [default: 60].
    #[serde(default)]
    pub interval_minutes: Option<u64>,
    /// Largest file fetched, bytes [default: 64 MiB]; larger files are reported, not stored.
    #[serde(default)]
    pub max_file_bytes: Option<u64>,
    /// Most files and folders one crawl may list [default: 100,000]; more fails the sync.
    #[serde(default)]
    pub max_entries: Option<usize>,
    /// Deadline of one request to the file server or the directory, seconds [default: 30].
    #[serde(default)]
    pub timeout_secs: Option<u64>,
    /// Where the share ACL comes from [default: server].
    #[serde(default)]
    pub share_acl: ShareAcl,
    /// Reading a file also needs traverse on every folder above it [default: true; Samba
    /// checks it, Windows by default does not; checking can only hide a file].
    #[serde(default)]
    pub check_traverse: Option<bool>,
    /// Globs of the files that are documents, relative to the crawl root, case-insensitive
    /// [default: every file] (`scope.rs`).
    #[serde(default)]
    pub include: Vec<String>,
    /// Globs of files left out, relative to the crawl root, case-insensitive; they win over
    /// `include` [default: none].
    #[serde(default)]
    pub exclude: Vec<String>,
}

impl std::fmt::Debug for ConnectorConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Everything is safe to log: the password is only a file name here.
        f.debug_struct("ConnectorConfig")
            .field("alias", &self.alias)
            .field("kind", &self.kind)
            .field("host", &self.host)
            .field("port", &self.port())
            .field("share", &self.share)
            .field("path", &self.path)
            .field("domain", &self.domain)
            .field("username", &self.username)
            .field("password_file", &self.password_file)
            .field("ldap_url", &self.ldap_url)
            .field("ldap_start_tls", &self.ldap_start_tls)
            .field("ldap_ca_file", &self.ldap_ca_file)
            .field("ldap_bind", &self.ldap_bind)
            .field("interval_minutes", &self.interval_minutes())
            .field("max_file_bytes", &self.max_file_bytes())
            .field("share_acl", &self.share_acl)
            .field("include", &self.include)
            .field("exclude", &self.exclude)
            .finish_non_exhaustive()
    }
}

impl ConnectorConfig {
    /// The file server's port.
    pub fn port(&self) -> u16 {
        self.port.unwrap_or(445)
    }

    /// Time between syncs.
    pub fn interval(&self) -> Duration {
        Duration::from_secs(self.interval_minutes() * 60)
    }

    fn interval_minutes(&self) -> u64 {
        self.interval_minutes.unwrap_or(60)
    }

    /// The largest file fetched, bytes.
    pub fn max_file_bytes(&self) -> u64 {
        self.max_file_bytes.unwrap_or(64 << 20)
    }

    /// The most entries a crawl may list.
    pub fn max_entries(&self) -> usize {
        self.max_entries.unwrap_or(100_000)
    }

    /// Deadline of one request.
    pub fn timeout(&self) -> Duration {
        Duration::from_secs(self.timeout_secs.unwrap_or(30))
    }

    /// The crawl root inside the share, `/`-separated, without leading or trailing `/`.
    pub fn root(&self) -> String {
        self.path
            .as_deref()
            .unwrap_or("")
            .trim_matches('/')
            .to_owned()
    }

    /// The crawl's scope from `include` and `exclude` (`None`: every file).
    pub fn scope(&self) -> Option<Arc<dyn airlock_connectors::smb::Scope>> {
        let scope = PathScope::new(&self.include, &self.exclude);
        (!scope.is_everything()).then(|| Arc::new(scope) as Arc<dyn airlock_connectors::smb::Scope>)
    }

    /// The domain controller's host and port from `ldap_url` (the egress allowlist).
    pub fn ldap_endpoint(&self) -> Option<(String, u16)> {
        let (rest, default) = if let Some(r) = self.ldap_url.strip_prefix("ldaps://") {
            (r, 636)
        } else if let Some(r) = self.ldap_url.strip_prefix("ldap://") {
            (r, 389)
        } else {
            return None;
        };
        let authority = rest.split('/').next().unwrap_or("");
        let (host, port) = match authority.strip_prefix('[') {
            Some(v6) => {
                let (h, after) = v6.split_once(']')?;
                match after.strip_prefix(':') {
                    Some(p) => (h, p.parse::<u16>().ok().filter(|p| *p != 0)?),
                    None if after.is_empty() => (h, default),
                    None => return None,
                }
            }
            None => match authority.rsplit_once(':') {
                Some((h, p)) => (h, p.parse::<u16>().ok().filter(|p| *p != 0)?),
                None => (authority, default),
            },
        };
        (!host.is_empty()).then(|| (host.to_owned(), port))
    }

    /// Every `(host, port)` this source dials: the file server and the domain controller.
    pub fn endpoints(&self) -> Vec<(String, u16)> {
        let mut out = vec![(self.host.clone(), self.port())];
        out.extend(self.ldap_endpoint());
        out
    }

    /// Checks every field: `Err((field, reason))` names the setting at fault.
    pub fn check(&self) -> Result<(), (&'static str, String)> {
        let alias_ok = !self.alias.is_empty()
            && self.alias.len() <= MAX_ALIAS
            && self
                .alias
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
        if !alias_ok {
            return Err((
                "connectors.alias",
                format!(
                    "`{}` must be 1 to {MAX_ALIAS} characters of a-z, 0-9 and -",
                    self.alias
                ),
            ));
        }
        self.check_share()?;
        self.check_credentials()?;
        self.check_limits()
    }

    /// `what` about this connector, for an error.
    fn at(&self, what: &str) -> String {
        format!("connector `{}`: {what}", self.alias)
    }

    /// The kind, host, port, share and folder.
    fn check_share(&self) -> Result<(), (&'static str, String)> {
        if self.kind != "smb" {
            return Err((
                "connectors.kind",
                self.at(&format!("`{}` is not a known kind (only `smb`)", self.kind)),
            ));
        }
        if self.host.is_empty()
            || self
                .host
                .chars()
                .any(|c| c.is_whitespace() || c.is_control() || "/\\:@".contains(c))
        {
            return Err((
                "connectors.host",
                self.at(
                    "must be a host name or IPv4 address (no scheme, port or path; the port is \
                    `port`)",
                ),
            ));
        }
        if self.port == Some(0) {
            return Err(("connectors.port", self.at("must be between 1 and 65535")));
        }
        if self.share.is_empty()
            || self
                .share
                .chars()
                .any(|c| c.is_control() || "/\\".contains(c))
        {
            return Err((
                "connectors.share",
                self.at("must be a share name (no slashes)"),
            ));
        }
        let root = self.root();
        if root.contains('\\')
            || root.chars().any(char::is_control)
            || root.split('/').any(|p| p == ".." || p == ".")
            || root.contains("//")
        {
            return Err((
                "connectors.path",
                self.at("must be a folder inside the share, `/`-separated, without `.` or `..`"),
            ));
        }
        Ok(())
    }

    /// The service account, its password file and the directory's LDAP endpoint and CA.
    fn check_credentials(&self) -> Result<(), (&'static str, String)> {
        for (field, v) in [
            ("connectors.domain", &self.domain),
            ("connectors.username", &self.username),
            ("connectors.ldap_bind", &self.ldap_bind),
        ] {
            if v.trim().is_empty() || v.chars().any(char::is_control) {
                return Err((field, self.at("must not be empty")));
            }
        }
        if self.password_file.as_os_str().is_empty() {
            return Err((
                "connectors.password_file",
                self.at("must name the file holding the service account's password"),
            ));
        }
        match self.ldap_endpoint() {
            None => {
                return Err((
                    "connectors.ldap_url",
                    self.at("must be `ldaps://host[:port]` or `ldap://host[:port]`"),
                ));
            }
            Some(_) if self.ldap_url.starts_with("ldap://") && !self.ldap_start_tls => {
                return Err((
                    "connectors.ldap_url",
                    self.at(
                        "plain `ldap://` would send the service account's password in clear: \
                        use `ldaps://` or set `ldap_start_tls = true`",
                    ),
                ));
            }
            Some(_) if self.ldap_url.starts_with("ldaps://") && self.ldap_start_tls => {
                return Err((
                    "connectors.ldap_start_tls",
                    self.at("is for `ldap://` URLs; `ldaps://` is TLS already"),
                ));
            }
            Some(_) => {}
        }
        if self.ldap_ca_file.as_os_str().is_empty() {
            return Err((
                "connectors.ldap_ca_file",
                self.at("must name the CA file the domain controller's certificate chains to"),
            ));
        }
        Ok(())
    }

    /// The interval, size, entry and time limits and the include and exclude globs.
    fn check_limits(&self) -> Result<(), (&'static str, String)> {
        if !INTERVAL_MINUTES.contains(&self.interval_minutes()) {
            return Err((
                "connectors.interval_minutes",
                self.at("must be between 1 and 10080 (one week)"),
            ));
        }
        if !(1..=MAX_FILE_BYTES).contains(&self.max_file_bytes()) {
            return Err((
                "connectors.max_file_bytes",
                self.at("must be between 1 byte and 1 GiB"),
            ));
        }
        if !(1..=MAX_ENTRIES).contains(&self.max_entries()) {
            return Err((
                "connectors.max_entries",
                self.at("must be between 1 and 1000000"),
            ));
        }
        if !(1..=600).contains(&self.timeout_secs.unwrap_or(30)) {
            return Err((
                "connectors.timeout_secs",
                self.at("must be between 1 and 600"),
            ));
        }
        for (field, globs) in [
            ("connectors.include", &self.include),
            ("connectors.exclude", &self.exclude),
        ] {
            if globs.len() > MAX_GLOBS {
                return Err((field, self.at(&format!("has more than {MAX_GLOBS} globs"))));
            }
            for g in globs {
                if let Some(why) = airlock_retrieval::sidecar::glob_problem(g) {
                    return Err((field, self.at(&format!("glob `{g}` {why}"))));
                }
            }
        }
        Ok(())
    }

    /// The crawl's and the directory's settings, with the password read from its file now.
    pub fn library_configs(
        &self,
    ) -> Result<
        (
            airlock_connectors::smb::SmbConfig,
            airlock_connectors::ad::AdConfig,
        ),
        String,
    > {
        let password = airlock_platform::secrets::read_secret(&self.password_file)
            .map_err(|e| format!("password_file: {e}"))?;
        let smb = airlock_connectors::smb::SmbConfig {
            addr: format!("{}:{}", self.host, self.port()),
            share: self.share.clone(),
            root: self.root(),
            domain: self.domain.clone(),
            username: self.username.clone(),
            password: password.clone(),
            share_sd: None,
            read_share_acl: self.share_acl == ShareAcl::Server,
            check_traverse: self.check_traverse.unwrap_or(true),
            timeout: self.timeout(),
            max_entries: self.max_entries(),
            scope: self.scope(),
        };
        let ad = airlock_connectors::ad::AdConfig {
            url: self.ldap_url.clone(),
            start_tls: self.ldap_start_tls,
            ca_file: Some(self.ldap_ca_file.clone()),
            bind_dn: self.ldap_bind.clone(),
            bind_password: password,
            timeout: self.timeout(),
            page_size: 500,
        };
        Ok((smb, ad))
    }
}

/// Checks every entry and that no alias is configured twice.
pub fn check_all(entries: &[ConnectorConfig]) -> Result<(), (&'static str, String)> {
    for (i, c) in entries.iter().enumerate() {
        c.check()?;
        if entries[..i].iter().any(|o| o.alias == c.alias) {
            return Err((
                "connectors.alias",
                format!("`{}` is configured twice", c.alias),
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(extra: &str) -> Result<ConnectorConfig, String> {
        #[derive(Deserialize)]
        struct T {
            connectors: Vec<ConnectorConfig>,
        }
        let text = format!(
            "[[connectors]]\nalias = \"finance\"\nkind = \"smb\"\nhost = \"fs1.bank.example\"\n\
             share = \"docs\"\ndomain = \"BANK\"\nusername = \"svc-airlock\"\n\
             password_file = \"/etc/airlock/svc.pw\"\nldap_url = \"ldaps://dc1.bank.example\"\n\
             ldap_ca_file = \"/etc/airlock/ca.pem\"\nldap_bind = \"svc-airlock@bank.example\"\n\
             {extra}"
        );
        let mut t: T = toml::from_str(&text).map_err(|e| e.to_string())?;
        let c = t.connectors.remove(0);
        c.check().map_err(|(f, r)| format!("{f}: {r}"))?;
        Ok(c)
    }

    #[test]
    fn entries_are_checked_with_the_setting_named() {
        let c = entry("").unwrap();
        assert_eq!(
            c.endpoints(),
            [
                ("fs1.bank.example".to_owned(), 445),
                ("dc1.bank.example".to_owned(), 636)
            ]
        );
        assert_eq!(c.interval(), Duration::from_secs(3600));
        assert_eq!(
            entry("path = \"/reports/2026/\"").unwrap().root(),
            "reports/2026"
        );
        for (extra, want) in [
            ("password = \"x\"", "unknown field"),
            ("path = \"a/../b\"", "connectors.path"),
            ("interval_minutes = 0", "connectors.interval_minutes"),
            ("max_file_bytes = 0", "connectors.max_file_bytes"),
            ("port = 0", "connectors.port"),
            ("share_acl = \"guess\"", "unknown variant"),
            (
                "exclude = [\"/etc/**\"]",
                "connectors.exclude: connector `finance`: glob `/etc/**` must be relative",
            ),
            ("include = [\"a/../b\"]", "connectors.include"),
            ("include = [\"\"]", "glob `` is empty"),
        ] {
            let e = match entry(extra) {
                Ok(_) => String::new(),
                Err(e) => e,
            };
            assert!(e.contains(want), "{extra}: {e}");
        }
        let mut c = entry("").unwrap();
        c.ldap_url = "ldap://dc1".into();
        assert!(c.check().unwrap_err().1.contains("in clear"));
        c.ldap_start_tls = true;
        assert_eq!(c.ldap_endpoint(), Some(("dc1".to_owned(), 389)));
        c.check().unwrap();
        c.kind = "imap".into();
        assert_eq!(c.check().unwrap_err().0, "connectors.kind");
        c.kind = "smb".into();
        c.alias = "Finance".into();
        assert_eq!(c.check().unwrap_err().0, "connectors.alias");
        c.alias = "finance".into();
        c.host = "smb://fs1".into();
        assert_eq!(c.check().unwrap_err().0, "connectors.host");
        let twice = [entry("").unwrap(), entry("").unwrap()];
        assert!(check_all(&twice).unwrap_err().1.contains("twice"));
    }
}
