//! Serving: bind, answer `/healthz` at once, turn ready when start-up completes, and on shutdown
//! stop accepting, withdraw readiness and drain in-flight requests and streams up to a deadline.
//!
//! The accept loop is our own (hyper's HTTP/1 connection builder under it) so that slow and
//! numerous clients are bounded: at most `max_connections` open connections, at most
//! `max_connections_per_ip` from one address (more are answered `503 too-many-connections` and
//! closed), `header_read_timeout_secs` for every request head (the first one read and checked
//! by [`head`], later ones on a kept-alive connection by hyper), and `max_header_bytes` for
//! every head. Body reads have their own deadline (`extract.rs`).
//!
//! With [`serve_with`] and a [`TlsServer`] every connection is HTTPS: the TLS handshake (within
//! `header_read_timeout_secs`) comes before the first head, every response carries HSTS, and each
//! request carries a [`Transport`] extension (whether a verified client certificate was shown).
//! A connection over the limits is closed without an answer then (a plain-text 503 would be
//! garbage inside TLS).

use std::collections::HashMap;
use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::pin::pin;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::http::header::STRICT_TRANSPORT_SECURITY;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use parking_lot::Mutex;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, watch};
use tokio::task::JoinSet;
use tower::Layer;
use tower_http::set_header::SetResponseHeader;

use crate::config::Config;
use crate::error::ApiError;
use crate::metrics::{LimitLabel, Metrics};
use crate::routes::app;
use crate::state::AppState;
use crate::tls::{HSTS, TlsServer, Transport};

pub mod head;

use head::{FirstHead, HeadLimits, Prefixed};

/// Refused connections that may linger at once while their 503 is read (more are closed at
/// once after a best-effort write).
const MAX_LINGERING_REFUSALS: usize = 64;

/// How a serve loop ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Drained {
    /// Every in-flight request finished before the deadline.
    Clean,
    /// The deadline passed; the remaining connections were dropped (their streams cancelled).
    DeadlineExceeded,
}

/// Serves `state` on `listener` until `shutdown` resolves, then drains for at most `grace`.
///
/// Readiness is withdrawn as soon as shutdown starts, so a load balancer stops sending new
/// requests while streams in flight finish. At the deadline every connection still open is
/// dropped (its task aborted).
pub async fn serve(
    listener: TcpListener,
    state: AppState,
    shutdown: impl Future<Output = ()> + Send + 'static,
    grace: Duration,
) -> std::io::Result<Drained> {
    serve_with(listener, state, None, shutdown, grace).await
}

/// [`serve`], over HTTPS when `tls` is given.
pub async fn serve_with(
    listener: TcpListener,
    state: AppState,
    tls: Option<Arc<TlsServer>>,
    shutdown: impl Future<Output = ()> + Send + 'static,
    grace: Duration,
) -> std::io::Result<Drained> {
    let (stop_tx, stop_rx) = watch::channel(false);
    let mut conns = Connections::new(state.config(), state.metrics().clone());
    conns.tls = tls;
    let router = app(state.clone());
    let mut handle = tokio::spawn(accept_loop(listener, router, conns, stop_rx));

    tokio::select! {
        res = &mut handle => {
            // The accept loop ended on its own.
            return res.map_err(std::io::Error::other).map(|()| Drained::Clean);
        }
        () = shutdown => {}
    }
    tracing::info!(
        grace_s = grace.as_secs(),
        "shutdown requested: draining in-flight requests"
    );
    state.clear_services();
    let _ = stop_tx.send(true);
    match tokio::time::timeout(grace, &mut handle).await {
        Ok(res) => {
            res.map_err(std::io::Error::other)?;
            tracing::info!("drained cleanly");
            Ok(Drained::Clean)
        }
        Err(_) => {
            // Dropping the loop drops its JoinSet, which aborts every connection task.
            handle.abort();
            tracing::warn!("drain deadline passed: remaining connections dropped");
            Ok(Drained::DeadlineExceeded)
        }
    }
}

/// The connection limits, the HTTP/1 settings and the open-connection counts.
#[derive(Clone)]
struct Connections {
    http: hyper::server::conn::http1::Builder,
    head: HeadLimits,
    global: Arc<Semaphore>,
    per_ip: Arc<Mutex<HashMap<IpAddr, usize>>>,
    max_per_ip: usize,
    lingering: Arc<Semaphore>,
    metrics: Metrics,
    tls: Option<Arc<TlsServer>>,
}

/// One admitted connection's place in the limits, given back on drop.
struct ConnPermit {
    _global: OwnedSemaphorePermit,
    ip: IpAddr,
    per_ip: Arc<Mutex<HashMap<IpAddr, usize>>>,
    metrics: Metrics,
}

impl Drop for ConnPermit {
    fn drop(&mut self) {
        let mut m = self.per_ip.lock();
        if let Some(n) = m.get_mut(&self.ip) {
            *n -= 1;
            if *n == 0 {
                m.remove(&self.ip);
            }
        }
        self.metrics.connections_open.dec();
    }
}

impl Connections {
    fn new(config: &Config, metrics: Metrics) -> Self {
        let mut http = hyper::server::conn::http1::Builder::new();
        http.timer(TokioTimer::new())
            .header_read_timeout(config.header_read_timeout())
            .max_header_size(config.max_header_bytes());
        Connections {
            http,
            head: HeadLimits {
                max_header_bytes: config.max_header_bytes(),
                max_uri_bytes: config.max_uri_bytes(),
                timeout: config.header_read_timeout(),
            },
            global: Arc::new(Semaphore::new(config.max_connections())),
            per_ip: Arc::default(),
            max_per_ip: config.max_connections_per_ip(),
            lingering: Arc::new(Semaphore::new(MAX_LINGERING_REFUSALS)),
            metrics,
            tls: None,
        }
    }

    /// A place for a connection from `ip`, or the name of the limit that refuses it.
    fn admit(&self, ip: IpAddr) -> Result<ConnPermit, &'static str> {
        let ip = ip.to_canonical();
        let mut m = self.per_ip.lock();
        if m.get(&ip).copied().unwrap_or(0) >= self.max_per_ip {
            return Err("per_ip");
        }
        let global = self
            .global
            .clone()
            .try_acquire_owned()
            .map_err(|_| "global")?;
        *m.entry(ip).or_insert(0) += 1;
        self.metrics.connections_open.inc();
        Ok(ConnPermit {
            _global: global,
            ip,
            per_ip: self.per_ip.clone(),
            metrics: self.metrics.clone(),
        })
    }
}

async fn accept_loop(
    listener: TcpListener,
    router: Router,
    conns: Connections,
    mut stop: watch::Receiver<bool>,
) {
    let mut tasks = JoinSet::new();
    loop {
        let (tcp, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) if is_connection_error(&e) => continue,
                Err(e) => {
                    // Out of file descriptors and the like: wait instead of spinning.
                    tracing::warn!(error = %e, "accept failed; retrying in 1 s");
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    continue;
                }
            },
            Some(_) = tasks.join_next(), if !tasks.is_empty() => continue,
            () = stopped(&mut stop) => break,
        };
        match conns.admit(peer.ip()) {
            Ok(permit) => {
                tasks.spawn(serve_connection(
                    tcp,
                    // The peer address for handlers (`ConnectInfo`: sign-in limits).
                    router
                        .clone()
                        .layer(axum::Extension(axum::extract::ConnectInfo(peer))),
                    conns.clone(),
                    permit,
                    stop.clone(),
                ));
            }
            Err(limit) => {
                conns
                    .metrics
                    .connections_refused
                    .get_or_create(&LimitLabel { limit })
                    .inc();
                tracing::debug!(%peer, limit, "connection refused: limit reached");
                refuse(tcp, &conns, &mut tasks);
            }
        }
    }
    drop(listener);
    while tasks.join_next().await.is_some() {}
}

/// Answers `503 too-many-connections` and closes; lingers (≤ 1 s) so the client can read it
/// while few refusals linger, else writes what the socket takes at once and closes.
fn refuse(tcp: TcpStream, conns: &Connections, tasks: &mut JoinSet<()>) {
    if conns.tls.is_some() {
        return;
    }
    let answer = ApiError::TooManyConnections.http1_bytes(&uuid::Uuid::new_v4().to_string());
    match conns.lingering.clone().try_acquire_owned() {
        Ok(permit) => {
            tasks.spawn(async move {
                head::answer_and_close(tcp, &answer).await;
                drop(permit);
            });
        }
        Err(_) => {
            let _ = tcp.try_write(&answer);
        }
    }
}

async fn serve_connection(
    tcp: TcpStream,
    router: Router,
    conns: Connections,
    permit: ConnPermit,
    mut stop: watch::Receiver<bool>,
) {
    let _permit = permit;
    let Some(tls) = conns.tls.clone() else {
        return serve_stream(tcp, Transport::default(), router, conns, stop).await;
    };
    let acceptor = tls.acceptor();
    let handshake = tokio::select! {
        r = tokio::time::timeout(conns.head.timeout, acceptor.accept(tcp)) => r,
        () = stopped(&mut stop) => return,
    };
    match handshake {
        Ok(Ok(stream)) => {
            let transport = Transport {
                tls: true,
                client_cert: stream.get_ref().1.peer_certificates().is_some(),
            };
            serve_stream(stream, transport, router, conns, stop).await;
        }
        Ok(Err(e)) => tracing::debug!(error = %e, "TLS handshake failed"),
        Err(_) => tracing::debug!("TLS handshake timed out"),
    }
}

async fn serve_stream<S: AsyncRead + AsyncWrite + Unpin + Send + 'static>(
    mut tcp: S,
    transport: Transport,
    router: Router,
    conns: Connections,
    mut stop: watch::Receiver<bool>,
) {
    let first = match head::read_first_head(&mut tcp, &conns.head, &mut stop).await {
        FirstHead::Ready(bytes) => bytes,
        FirstHead::Gone => return,
        FirstHead::Refuse(err) => {
            tracing::debug!(error = %err, "request head refused");
            let answer = err.http1_bytes(&uuid::Uuid::new_v4().to_string());
            head::answer_and_close(tcp, &answer).await;
            return;
        }
    };
    let io = TokioIo::new(Prefixed::new(first, tcp));
    let service = SetResponseHeader::overriding(
        axum::Extension(transport).layer(router),
        STRICT_TRANSPORT_SECURITY,
        transport.tls.then_some(HSTS),
    );
    let conn = conns
        .http
        .serve_connection(io, TowerToHyperService::new(service));
    let mut conn = pin!(conn);
    let mut stopping = false;
    loop {
        tokio::select! {
            res = conn.as_mut() => {
                if let Err(e) = res {
                    tracing::debug!(error = %e, "connection ended with an error");
                }
                break;
            }
            () = stopped(&mut stop), if !stopping => {
                conn.as_mut().graceful_shutdown();
                stopping = true;
            }
        }
    }
}

/// Resolves once `stop` turns true (or its sender is gone).
pub(crate) async fn stopped(stop: &mut watch::Receiver<bool>) {
    let _ = stop.wait_for(|s| *s).await;
}

/// Errors of one incoming connection, not of the listener (axum's `serve` skips them too).
fn is_connection_error(e: &std::io::Error) -> bool {
    use std::io::ErrorKind::{ConnectionAborted, ConnectionRefused, ConnectionReset};
    matches!(
        e.kind(),
        ConnectionRefused | ConnectionAborted | ConnectionReset
    )
}

/// Binds the configured address.
pub async fn bind(addr: SocketAddr) -> std::io::Result<TcpListener> {
    TcpListener::bind(addr).await
}

/// Resolves on SIGINT or SIGTERM.
pub async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {}
        () = term => {}
    }
}
