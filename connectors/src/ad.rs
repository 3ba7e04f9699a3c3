//! Active Directory as the identity source: every enabled user with their SID (`objectSid`)
//! and every group SID their logon token would hold, nested ones included, read from the
//! user's constructed `tokenGroups` attribute (a base-scope read of each user; AD computes the
//! transitive closure, primary group included). Groups are listed for their names only.
//!
//! LDAPS (or StartTLS) trusts only the configured CA file (rustls with ring, no system store),
//! like the daemon's `[ldap]` sign-in. Searches start at the domain's naming context from the
//! root DSE; search references (Samba answers the domain root with referrals to the
//! configuration partitions) are dropped; results are paged (RFC 2696).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use ldap3::adapters::{Adapter, EntriesOnly, PagedResults};
use ldap3::{Ldap, LdapConnAsync, LdapConnSettings, Scope, SearchEntry};

use crate::directory::{Directory, DirectoryUser};
use crate::sid::Sid;

/// How to reach the domain controller.
#[derive(Clone)]
pub struct AdConfig {
    /// `ldaps://host:636` or `ldap://host:389`.
    pub url: String,
    /// Upgrade an `ldap://` connection with StartTLS.
    pub start_tls: bool,
    /// The CA certificates (PEM) the DC's certificate must chain to; `None` only for plain
    /// `ldap://` (tests on loopback).
    pub ca_file: Option<PathBuf>,
    /// The service account's bind name (a DN or `user@realm`).
    pub bind_dn: String,
    /// Its password.
    pub bind_password: String,
    /// Deadline for each operation.
    pub timeout: Duration,
    /// Entries per page.
    pub page_size: i32,
}

impl std::fmt::Debug for AdConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AdConfig")
            .field("url", &self.url)
            .field("start_tls", &self.start_tls)
            .field("ca_file", &self.ca_file)
            .field("bind_dn", &self.bind_dn)
            .finish_non_exhaustive()
    }
}

/// Why the directory could not be read (the whole read fails: a partial directory would
/// take readers away or, worse, leave stale ones).
#[derive(Debug, thiserror::Error)]
pub enum AdError {
    /// Connecting or binding failed.
    #[error("the directory is unavailable: {0}")]
    Unavailable(String),
    /// An entry lacked what every user or group has.
    #[error("the directory returned an unusable entry: {0}")]
    BadEntry(String),
}

fn unavailable(what: &str, e: impl std::fmt::Display) -> AdError {
    AdError::Unavailable(format!("{what}: {e}"))
}

fn tls_config(ca_file: &std::path::Path) -> Result<Arc<rustls::ClientConfig>, AdError> {
    use rustls::pki_types::CertificateDer;
    use rustls::pki_types::pem::PemObject;
    let mut roots = rustls::RootCertStore::empty();
    let certs = CertificateDer::pem_file_iter(ca_file).map_err(|e| unavailable("CA file", e))?;
    for c in certs {
        roots
            .add(c.map_err(|e| unavailable("CA file", e))?)
            .map_err(|e| unavailable("CA file", e))?;
    }
    if roots.is_empty() {
        return Err(unavailable("CA file", "no PEM certificate"));
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
        .map_err(|e| unavailable("TLS", e))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(Arc::new(config))
}

/// SIDs of an entry's binary attribute. ldap3 files a value under `attrs` when its bytes
/// happen to be valid UTF-8 (a builtin SID such as S-1-5-32-548 is all ASCII), under
/// `bin_attrs` otherwise: both are read.
fn sids(entry: &SearchEntry, attr: &str) -> Result<Vec<Sid>, AdError> {
    let binary = entry
        .bin_attrs
        .iter()
        .filter(|(k, _)| k.eq_ignore_ascii_case(attr))
        .flat_map(|(_, v)| v.iter().map(Vec::as_slice));
    let texts = entry
        .attrs
        .iter()
        .filter(|(k, _)| k.eq_ignore_ascii_case(attr))
        .flat_map(|(_, v)| v.iter().map(String::as_bytes));
    binary
        .chain(texts)
        .map(|v| {
            Sid::from_bytes(v)
                .map(|(s, _)| s)
                .map_err(|e| AdError::BadEntry(format!("{}: {attr}: {e}", entry.dn)))
        })
        .collect()
}

fn text<'e>(entry: &'e SearchEntry, attr: &str) -> Option<&'e str> {
    entry
        .attrs
        .iter()
        .find(|(k, _)| k.eq_ignore_ascii_case(attr))
        .and_then(|(_, v)| v.first())
        .map(String::as_str)
}

/// A bound connection to the domain controller.
pub struct Ad {
    ldap: Ldap,
    cfg: AdConfig,
    base: String,
}

impl Ad {
    /// Connects and binds as the service account.
    pub async fn connect(cfg: AdConfig) -> Result<Ad, AdError> {
        let mut settings = LdapConnSettings::new()
            .set_conn_timeout(cfg.timeout)
            .set_starttls(cfg.start_tls);
        if let Some(ca) = &cfg.ca_file {
            settings = settings.set_config(tls_config(ca)?);
        } else if cfg.url.starts_with("ldaps:") || cfg.start_tls {
            return Err(unavailable(
                "TLS",
                "a CA file is required for ldaps or StartTLS",
            ));
        }
        let (conn, mut ldap) = tokio::time::timeout(
            cfg.timeout,
            LdapConnAsync::with_settings(settings, &cfg.url),
        )
        .await
        .map_err(|_| unavailable("connecting", "timed out"))?
        .map_err(|e| unavailable("connecting", e))?;
        ldap3::drive!(conn);
        ldap.with_timeout(cfg.timeout)
            .simple_bind(&cfg.bind_dn, &cfg.bind_password)
            .await
            .and_then(|r| r.success())
            .map_err(|e| unavailable("service bind", e))?;
        let (rootdse, _) = ldap
            .with_timeout(cfg.timeout)
            .search(
                "",
                Scope::Base,
                "(objectClass=*)",
                vec!["defaultNamingContext"],
            )
            .await
            .and_then(|r| r.success())
            .map_err(|e| unavailable("root DSE", e))?;
        let base = rootdse
            .into_iter()
            .next()
            .map(SearchEntry::construct)
            .and_then(|e| text(&e, "defaultNamingContext").map(str::to_owned))
            .ok_or_else(|| AdError::BadEntry("root DSE has no defaultNamingContext".into()))?;
        Ok(Ad { ldap, cfg, base })
    }

    /// The domain's naming context (`DC=…`).
    pub fn base(&self) -> &str {
        &self.base
    }

    async fn search_paged(
        &mut self,
        filter: &str,
        attrs: Vec<&str>,
    ) -> Result<Vec<SearchEntry>, AdError> {
        let adapters: Vec<Box<dyn Adapter<_, _>>> = vec![
            Box::new(EntriesOnly::new()),
            Box::new(PagedResults::new(self.cfg.page_size)),
        ];
        let mut stream = self
            .ldap
            .with_timeout(self.cfg.timeout)
            .streaming_search_with(adapters, &self.base, Scope::Subtree, filter, attrs)
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

    /// Every enabled user with their token, and every group's name. Disabled accounts
    /// (userAccountControl bit 2) are left out: they cannot sign in anywhere.
    pub async fn directory(&mut self) -> Result<Directory, AdError> {
        let domain_entry = self
            .ldap
            .with_timeout(self.cfg.timeout)
            .search(
                &self.base.clone(),
                Scope::Base,
                "(objectClass=*)",
                vec!["objectSid"],
            )
            .await
            .and_then(|r| r.success())
            .map_err(|e| unavailable("domain SID", e))?
            .0
            .into_iter()
            .next()
            .map(SearchEntry::construct)
            .ok_or_else(|| AdError::BadEntry("no domain object".into()))?;
        let domain = sids(&domain_entry, "objectSid")?
            .into_iter()
            .next()
            .ok_or_else(|| AdError::BadEntry("the domain object has no objectSid".into()))?;
        let mut dir = Directory::new(domain.clone());

        for g in self
            .search_paged("(objectClass=group)", vec!["objectSid", "sAMAccountName"])
            .await?
        {
            let Some(sid) = sids(&g, "objectSid")?.into_iter().next() else {
                return Err(AdError::BadEntry(format!("{}: no objectSid", g.dn)));
            };
            let name = text(&g, "sAMAccountName").unwrap_or(&g.dn).to_owned();
            dir.add_group(sid, &name, &[]);
        }

        let users = self
            .search_paged(
                "(&(objectCategory=person)(objectClass=user)\
                 (!(userAccountControl:1.2.840.113556.1.4.803:=2)))",
                vec!["objectSid", "sAMAccountName", "primaryGroupID"],
            )
            .await?;
        for u in users {
            let sid = sids(&u, "objectSid")?
                .into_iter()
                .next()
                .ok_or_else(|| AdError::BadEntry(format!("{}: no objectSid", u.dn)))?;
            let name = text(&u, "sAMAccountName")
                .ok_or_else(|| AdError::BadEntry(format!("{}: no sAMAccountName", u.dn)))?
                .to_owned();
            let primary = text(&u, "primaryGroupID")
                .and_then(|p| p.parse::<u32>().ok())
                .and_then(|rid| domain.with_rid(rid).ok());
            // tokenGroups is constructed: only a base-scope read returns it.
            let token = self
                .ldap
                .with_timeout(self.cfg.timeout)
                .search(&u.dn, Scope::Base, "(objectClass=*)", vec!["tokenGroups"])
                .await
                .and_then(|r| r.success())
                .map_err(|e| unavailable("tokenGroups", e))?
                .0
                .into_iter()
                .next()
                .map(SearchEntry::construct)
                .ok_or_else(|| AdError::BadEntry(format!("{}: vanished", u.dn)))?;
            let groups = sids(&token, "tokenGroups")?;
            let mut user = DirectoryUser::new(sid, &name, groups);
            user.primary_group = primary;
            dir.add_user(user);
        }
        dir.expand();
        Ok(dir)
    }

    /// Unbinds.
    pub async fn close(mut self) {
        let _ = self.ldap.unbind().await;
    }
}
