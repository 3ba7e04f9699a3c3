//! TLS to https upstreams: rustls with the ring provider (as the server side, [`crate::tls`]),
//! trusting only the certificates of the entry's `ca_file` (no system roots, no way to turn
//! verification off). The server's certificate must chain to one of them and name the base
//! URL's host (a DNS name, sent as SNI, or an IP address in its subjectAltName).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::ClientConfig;
use rustls_pki_types::ServerName;
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;

/// A TLS client configuration trusting one CA file.
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
        let roots = crate::tls::read_roots("ca_file", ca).map_err(|e| match e {
            crate::tls::TlsError::File { path, message, .. } => {
                format!("ca_file {}: {message}", path.display())
            }
            other => other.to_string(),
        })?;
        let mut config = ClientConfig::builder_with_provider(crate::tls::provider())
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
