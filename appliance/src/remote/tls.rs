//! TLS to https upstreams. This build has no TLS client: an https base URL is refused at
//! start-up with this module's message (use http inside the bank network, or a TLS-terminating
//! sidecar on the appliance's loopback, until the rustls client of issue 22 lands here).

use std::path::Path;

/// A TLS client configuration trusting one CA file.
#[derive(Debug)]
pub struct TlsConnector(());

/// Why https is refused.
pub const UNSUPPORTED: &str = "https upstreams are not supported by this build yet (no TLS \
    client); use an http URL inside the bank network or a TLS-terminating sidecar";

impl TlsConnector {
    /// Reads the CA file.
    pub fn from_ca_file(_ca: &Path) -> Result<Self, String> {
        Err(UNSUPPORTED.to_string())
    }

    /// Wraps a connected socket.
    pub async fn connect(
        &self,
        _host: &str,
        _tcp: tokio::net::TcpStream,
    ) -> Result<tokio::net::TcpStream, String> {
        Err(UNSUPPORTED.to_string())
    }
}
