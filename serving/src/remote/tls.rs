//! TLS to https upstreams: rustls with the ring provider (as the server side),
//! trusting only the certificates of the entry's `ca_file` (no system roots, no way to turn
//! verification off). The server's certificate must chain to one of them and name the base
//! URL's host (a DNS name, sent as SNI, or an IP address in its subjectAltName). The connector
//! is `airlock_platform::tls::TlsConnector`, re-exported here.

pub use airlock_platform::tls::TlsConnector;
