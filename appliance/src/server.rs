//! Serving: bind, answer `/healthz` at once, turn ready when start-up completes, and on shutdown
//! stop accepting, withdraw readiness and drain in-flight requests and streams up to a deadline.

use std::future::Future;
use std::net::SocketAddr;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::routes::app;
use crate::state::AppState;

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
/// requests while streams in flight finish.
pub async fn serve(
    listener: TcpListener,
    state: AppState,
    shutdown: impl Future<Output = ()> + Send + 'static,
    grace: Duration,
) -> std::io::Result<Drained> {
    let (stop_tx, mut stop_rx) = watch::channel(false);
    let router = app(state.clone());
    let server =
        axum::serve(listener, router.into_make_service()).with_graceful_shutdown(async move {
            let _ = stop_rx.wait_for(|s| *s).await;
        });
    let mut handle = tokio::spawn(async move { server.await });

    tokio::select! {
        res = &mut handle => {
            // The server ended on its own (listener error).
            return res.map_err(std::io::Error::other)?.map(|()| Drained::Clean);
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
            res.map_err(std::io::Error::other)??;
            tracing::info!("drained cleanly");
            Ok(Drained::Clean)
        }
        Err(_) => {
            handle.abort();
            tracing::warn!("drain deadline passed: remaining connections dropped");
            Ok(Drained::DeadlineExceeded)
        }
    }
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
