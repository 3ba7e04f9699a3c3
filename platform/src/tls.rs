//! TLS material: the `[tls]` section ([`TlsSettings`], owned and checked here), certificates,
//! keys and CA bundles read with rustls (ring provider, no OpenSSL), and the reloadable server
//! acceptor ([`TlsServer`]) that `airlock serve` terminates HTTPS with when `[tls] cert` and
//! `key` are set.
//!
//! - TLS 1.2 and 1.3 only (rustls has nothing older), HTTP/1.1 (ALPN `http/1.1`).
//! - `cert`: the certificate chain, leaf first (PEM); `key`: its private key (PEM: PKCS#8,
//!   PKCS#1 RSA or SEC1 EC).
//! - `client_ca` (optional, PEM bundle): clients may present a certificate chaining to one of
//!   these CAs; one that presents a bad certificate fails the handshake, one that presents none
//!   is served, and the appliance's role-gated routes then answer `403` without a verified
//!   client certificate (mTLS on the privileged routes only; employees' browsers need none).
//! - Reload: [`TlsServer::reload`] re-reads the three files and swaps the acceptor; new
//!   connections use the new certificate, open ones keep theirs. `airlock serve` calls it on
//!   SIGHUP ([`reload_on_hangup`]). A reload that fails keeps the previous certificate and logs
//!   why.
//!
//! What HTTP makes of a connection (the HSTS header, the request's transport, the refusal
//! without a client certificate) is the server's: the appliance's `tls` module.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use arc_swap::ArcSwap;
use rustls::RootCertStore;
use rustls::crypto::CryptoProvider;
use rustls::server::{ServerConfig, WebPkiClientVerifier};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use serde::Deserialize;
use tokio::net::TcpStream;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::client::TlsStream;

/// The `[tls]` section of the configuration.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize, clap::Args)]
#[serde(deny_unknown_fields, default)]
pub struct TlsSettings {
    /// HTTPS: the server's certificate chain, leaf first (PEM). Requires `key`.
    #[arg(id = "tls_cert", long = "tls-cert", env = "AIRLOCK_TLS_CERT")]
    pub cert: Option<PathBuf>,
    /// HTTPS: the certificate's private key (PEM: PKCS#8, PKCS#1 RSA or SEC1 EC).
    #[arg(id = "tls_key", long = "tls-key", env = "AIRLOCK_TLS_KEY")]
    pub key: Option<PathBuf>,
    /// HTTPS: CA certificates (PEM) that client certificates must chain to; when set, the
    /// role-gated routes (admin, operator, auditor, metrics) need a verified client
    /// certificate (mTLS).
    #[arg(
        id = "tls_client_ca",
        long = "tls-client-ca",
        env = "AIRLOCK_TLS_CLIENT_CA"
    )]
    pub client_ca: Option<PathBuf>,
}

impl TlsSettings {
    /// `self` with every unset field taken from `lower`.
    pub fn over(self, lower: TlsSettings) -> TlsSettings {
        TlsSettings {
            cert: self.cert.or(lower.cert),
            key: self.key.or(lower.key),
            client_ca: self.client_ca.or(lower.client_ca),
        }
    }

    /// Whether HTTPS is configured.
    pub fn enabled(&self) -> bool {
        self.cert.is_some()
    }

    /// The section's combination check (the root configuration's validation calls it):
    /// `(field, reason)`.
    pub fn check(&self) -> Result<(), (&'static str, &'static str)> {
        match (&self.cert, &self.key) {
            (Some(_), None) => Err(("tls.key", "required when tls.cert is set")),
            (None, Some(_)) => Err(("tls.cert", "required when tls.key is set")),
            (None, None) if self.client_ca.is_some() => Err((
                "tls.client_ca",
                "client certificates need HTTPS: set tls.cert and tls.key",
            )),
            _ => Ok(()),
        }
    }
}

/// A certificate, key or CA file that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// The file is missing, unreadable or not the PEM expected.
    #[error("tls.{field} {path}: {message}")]
    File {
        /// `cert`, `key` or `client_ca`.
        field: &'static str,
        /// The file.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
    /// rustls refused the combination (e.g. the key does not match the certificate).
    #[error("tls: {0}")]
    Config(String),
}

/// The reloadable TLS acceptor of a serving daemon.
pub struct TlsServer {
    settings: TlsSettings,
    acceptor: ArcSwap<TlsAcceptor>,
}

impl std::fmt::Debug for TlsServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsServer")
            .field("settings", &self.settings)
            .finish_non_exhaustive()
    }
}

impl TlsServer {
    /// Reads the configured files and builds the acceptor. `settings` must have `cert` and `key`.
    pub fn load(settings: &TlsSettings) -> Result<Self, TlsError> {
        let acceptor = acceptor(settings)?;
        Ok(TlsServer {
            settings: settings.clone(),
            acceptor: ArcSwap::from_pointee(acceptor),
        })
    }

    /// Re-reads the files; on success new connections use them, on failure nothing changes.
    pub fn reload(&self) -> Result<(), TlsError> {
        let acceptor = acceptor(&self.settings)?;
        self.acceptor.store(Arc::new(acceptor));
        Ok(())
    }

    /// The current acceptor.
    pub fn acceptor(&self) -> Arc<TlsAcceptor> {
        self.acceptor.load_full()
    }

    /// Whether client certificates are checked (`client_ca` set).
    pub fn mtls(&self) -> bool {
        self.settings.client_ca.is_some()
    }
}

/// Listens for SIGHUP now (so a SIGHUP right after this call no longer ends the process) and
/// returns the task that reloads `tls` on each one, for as long as the runtime runs. Unix only;
/// must be called inside a tokio runtime.
#[cfg(unix)]
pub fn reload_on_hangup(
    tls: Arc<TlsServer>,
) -> std::io::Result<impl std::future::Future<Output = ()> + Send + 'static> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut hup = signal(SignalKind::hangup())?;
    Ok(async move {
        while hup.recv().await.is_some() {
            let t = tls.clone();
            match tokio::task::spawn_blocking(move || t.reload()).await {
                Ok(Ok(())) => tracing::info!("SIGHUP: TLS certificate reloaded"),
                Ok(Err(e)) => {
                    tracing::error!(error = %e, "SIGHUP: TLS reload failed; keeping the old certificate");
                }
                Err(e) => tracing::error!(error = %e, "SIGHUP: TLS reload task failed"),
            }
        }
    })
}

/// The crypto provider of every TLS config of the appliance (ring).
pub fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn file_err<'a>(field: &'static str, path: &'a Path) -> impl Fn(String) -> TlsError + 'a {
    move |message| TlsError::File {
        field,
        path: path.to_owned(),
        message,
    }
}

/// Every certificate of a PEM file (at least one).
pub fn read_certs(
    field: &'static str,
    path: &Path,
) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let err = file_err(field, path);
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(|e| err(e.to_string()))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| err(e.to_string()))?;
    if certs.is_empty() {
        return Err(err("no CERTIFICATE block in the PEM file".into()));
    }
    Ok(certs)
}

/// The private key of a PEM file (PKCS#8, PKCS#1 RSA or SEC1 EC).
pub fn read_key(field: &'static str, path: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    PrivateKeyDer::from_pem_file(path).map_err(|e| file_err(field, path)(e.to_string()))
}

/// A root store of every certificate in a PEM file.
pub fn read_roots(field: &'static str, path: &Path) -> Result<RootCertStore, TlsError> {
    let mut roots = RootCertStore::empty();
    for c in read_certs(field, path)? {
        roots
            .add(c)
            .map_err(|e| file_err(field, path)(format!("not a usable CA certificate: {e}")))?;
    }
    Ok(roots)
}

fn acceptor(s: &TlsSettings) -> Result<TlsAcceptor, TlsError> {
    let (Some(cert), Some(key)) = (&s.cert, &s.key) else {
        return Err(TlsError::Config("tls.cert and tls.key are required".into()));
    };
    let certs = read_certs("cert", cert)?;
    let key = read_key("key", key)?;
    let provider = provider();
    let builder = ServerConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
        .map_err(|e| TlsError::Config(e.to_string()))?;
    let builder = match &s.client_ca {
        Some(ca) => {
            let roots = read_roots("client_ca", ca)?;
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                .allow_unauthenticated()
                .build()
                .map_err(|e| TlsError::Config(format!("client_ca: {e}")))?;
            builder.with_client_cert_verifier(verifier)
        }
        None => builder.with_no_client_auth(),
    };
    let mut config = builder
        .with_single_cert(certs, key)
        .map_err(|e| TlsError::Config(format!("certificate and key: {e}")))?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(TlsAcceptor::from(Arc::new(config)))
}

/// A rustls client configuration trusting only the certificates in `ca_file` (no system roots;
/// TLS 1.2 and 1.3, no client certificate): the directory's and the identity provider's.
pub fn client_config(ca_file: &Path) -> Result<Arc<rustls::ClientConfig>, String> {
    use rustls::pki_types::CertificateDer;
    use rustls::pki_types::pem::PemObject;
    let mut roots = rustls::RootCertStore::empty();
    let certs = CertificateDer::pem_file_iter(ca_file)
        .map_err(|e| format!("{}: {e}", ca_file.display()))?;
    for c in certs {
        let c = c.map_err(|e| format!("{}: {e}", ca_file.display()))?;
        roots
            .add(c)
            .map_err(|e| format!("{}: {e}", ca_file.display()))?;
    }
    if roots.is_empty() {
        return Err(format!("{}: no PEM certificate", ca_file.display()));
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
        .map_err(|e| e.to_string())?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(Arc::new(config))
}

/// A TLS client trusting one CA file: the inference rack's https upstreams (the server's
/// certificate must chain to one of its certificates and name the host dialled).
pub struct TlsConnector {
    connector: tokio_rustls::TlsConnector,
    ca_file: PathBuf,
}

impl std::fmt::Debug for TlsConnector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsConnector")
            .field("ca_file", &self.ca_file)
            .finish_non_exhaustive()
    }
}

impl TlsConnector {
    /// Reads the CA file (PEM, one or more certificates); TLS 1.2 and 1.3, HTTP/1.1.
    pub fn from_ca_file(ca: &Path) -> Result<Self, String> {
        let roots = read_roots("ca_file", ca).map_err(|e| match e {
            TlsError::File { path, message, .. } => {
                format!("ca_file {}: {message}", path.display())
            }
            other => other.to_string(),
        })?;
        let mut config = rustls::ClientConfig::builder_with_provider(provider())
            .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
            .map_err(|e| format!("ca_file {}: {e}", ca.display()))?
            .with_root_certificates(roots)
            .with_no_client_auth();
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(TlsConnector {
            connector: tokio_rustls::TlsConnector::from(Arc::new(config)),
            ca_file: ca.to_path_buf(),
        })
    }

    /// The handshake over a connected socket, verifying the certificate for `host`.
    pub async fn connect(
        &self,
        host: &str,
        tcp: TcpStream,
    ) -> Result<TlsStream<TcpStream>, String> {
        let name = ServerName::try_from(host.to_string())
            .map_err(|e| format!("`{host}` is not a TLS server name: {e}"))?;
        self.connector.connect(name, tcp).await.map_err(|e| {
            format!(
                "{e} (the upstream's certificate must chain to ca_file {} and name `{host}`)",
                self.ca_file.display()
            )
        })
    }
}
