//! `airlock-platform`: what the appliance needs from the machine it runs on, and nothing of the
//! appliance itself. It holds the data directory's layout ([`paths`]: where `airlock.db`,
//! `airlock.lock`, `index/`, `originals/`, `releases/`, `ingest-queue/`, `connectors/`, `keys/` and `bundles/`
//! are), the one-writer lock on it ([`data_lock`]), the egress lockdown ([`sandbox`]: Landlock),
//! systemd's service notifications ([`notify`]), secrets kept in files ([`secrets`]), the TLS
//! material ([`tls`]: the `[tls]` section, certificates and keys read with rustls, the
//! reloadable server acceptor, the clients trusting one CA file) and the egress HTTP client
//! ([`egress`]: HTTP/1.1 to the bank's servers over hyper's client, one connection per request,
//! https trusting only a configured CA).
//!
//! A leaf: it must not know any other Airlock crate, the root `Config` (callers pass the values
//! it needs: a data directory, ports, the `[tls]` section it owns), an HTTP server or its
//! layers (no axum, no tower: hyper's client only, behind [`egress`]'s own types), users,
//! documents or models. It returns its own errors.
#![warn(missing_docs)]

pub mod data_lock;
pub mod egress;
pub mod notify;
pub mod paths;
pub mod sandbox;
pub mod secrets;
pub mod tls;
