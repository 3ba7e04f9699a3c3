//! Noticing a client that went away while its request is still being served.
//!
//! hyper reads an HTTP/1 connection only between requests, so while a handler computes or a
//! stream waits for the engine, a client that closes its socket is noticed only when a write
//! to it fails — a step or more later, and never while a request merely queues. Each accepted
//! connection therefore keeps a second descriptor of its socket (`dup`: no unsafe code, and
//! hyper's own descriptor is untouched), registered with the runtime and only ever peeked at:
//! when the peer's FIN or RST arrives, [`Peer::closed`] resolves at once and the request drops
//! its engine stream, which the engine reclaims at its next step.
//!
//! Limits, by design: a client that half-closes its sending side while waiting for the answer
//! counts as gone (hyper closes such connections too, its `half_close` being off); a client
//! that pipelines a further request before closing is noticed only by the failing write, as
//! before (the peeked bytes hide the end of the stream). Each connection costs one more file
//! descriptor while it is open.

use std::net::SocketAddr;
use std::os::fd::AsFd;
use std::sync::Arc;

use axum::serve::IncomingStream;
use tokio::net::{TcpListener, TcpStream};

/// The connection a request arrived on (axum connect info: one per connection, cloned into
/// every request's extensions).
#[derive(Clone, Debug)]
pub struct Peer {
    addr: SocketAddr,
    watch: Option<Arc<TcpStream>>,
}

impl axum::extract::connect_info::Connected<IncomingStream<'_, TcpListener>> for Peer {
    fn connect_info(stream: IncomingStream<'_, TcpListener>) -> Self {
        let addr = *stream.remote_addr();
        Peer {
            addr,
            watch: watch(stream.io()),
        }
    }
}

/// A duplicate of `socket`'s descriptor registered with the runtime, or `None` (logged) when
/// the process cannot spare a descriptor: the connection then works as before, its close
/// noticed by a failing write. The duplicate is only ever peeked at, never read or written.
fn watch(socket: &TcpStream) -> Option<Arc<TcpStream>> {
    let dup = socket
        .as_fd()
        .try_clone_to_owned()
        .map(std::net::TcpStream::from)
        .and_then(|s| {
            // Shared with the original (one file description): non-blocking already.
            s.set_nonblocking(true)?;
            TcpStream::from_std(s)
        });
    match dup {
        Ok(s) => Some(Arc::new(s)),
        Err(e) => {
            tracing::warn!(error = %e, "cannot watch a connection for client disconnects");
            None
        }
    }
}

impl Peer {
    /// The client's address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Resolves when the client has closed or reset the connection; never resolves while it is
    /// open, or when the connection is not watched.
    pub async fn closed(&self) {
        let Some(socket) = &self.watch else {
            return std::future::pending().await;
        };
        let mut byte = [0u8; 1];
        loop {
            // Waits until the socket is readable, then looks without consuming anything.
            match socket.peek(&mut byte).await {
                // End of stream: the client sent its FIN.
                Ok(0) => return,
                // Bytes of a further request wait unread: the socket stays readable, so there
                // is nothing more to learn here (any end of stream hides behind them, see the
                // module docs); a failing write will tell.
                Ok(_) => return std::future::pending().await,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                // Reset, or any other socket error: nobody is listening any more.
                Err(_) => return,
            }
        }
    }
}

/// How `fut` ended: its output, or `None` when the client closed the connection first (then
/// `fut` is dropped, which cancels whatever it owned). Output that is ready wins.
pub async fn unless_closed<F: std::future::Future>(
    peer: Option<&Peer>,
    fut: F,
) -> Option<F::Output> {
    match peer {
        None => Some(fut.await),
        Some(p) => tokio::select! {
            biased;
            out = fut => Some(out),
            () = p.closed() => None,
        },
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use tokio::io::AsyncWriteExt;

    use super::*;

    async fn pair() -> (TcpStream, TcpStream) {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let (client, accepted) = tokio::join!(TcpStream::connect(addr), l.accept());
        (client.unwrap(), accepted.unwrap().0)
    }

    fn peer_of(s: &TcpStream) -> Peer {
        Peer {
            addr: s.peer_addr().unwrap(),
            watch: watch(s),
        }
    }

    #[tokio::test]
    async fn an_open_connection_is_not_closed_and_a_closed_one_is() {
        let (client, server) = pair().await;
        let peer = peer_of(&server);
        assert!(
            tokio::time::timeout(Duration::from_millis(100), peer.closed())
                .await
                .is_err(),
            "an open connection read as closed"
        );
        drop(client);
        tokio::time::timeout(Duration::from_secs(5), peer.closed())
            .await
            .expect("the close was not noticed");
        // The server side still owns its socket: the watch did not take it over.
        drop(server);
    }

    #[tokio::test]
    async fn a_reset_is_a_close() {
        let (client, mut server) = pair().await;
        let peer = peer_of(&server);
        // Closing a socket with unread received bytes sends a reset (RST), not a FIN.
        server.write_all(b"HTTP/1.1 200 OK\r\n").await.unwrap();
        tokio::time::sleep(Duration::from_millis(20)).await;
        drop(client);
        tokio::time::timeout(Duration::from_secs(5), peer.closed())
            .await
            .expect("the reset was not noticed");
    }

    #[tokio::test]
    async fn unread_request_bytes_are_not_a_close() {
        let (mut client, server) = pair().await;
        let peer = peer_of(&server);
        client.write_all(b"GET / HTTP/1.1\r\n").await.unwrap();
        assert!(
            tokio::time::timeout(Duration::from_millis(150), peer.closed())
                .await
                .is_err(),
            "pending request bytes read as a close"
        );
        drop(server);
    }

    #[tokio::test]
    async fn unless_closed_drops_the_work_when_the_client_leaves() {
        let (client, server) = pair().await;
        let peer = peer_of(&server);
        let work = async {
            tokio::time::sleep(Duration::from_secs(30)).await;
            7
        };
        let left = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(50)).await;
            drop(client);
        });
        let out = tokio::time::timeout(Duration::from_secs(5), unless_closed(Some(&peer), work))
            .await
            .expect("not cut short");
        assert_eq!(out, None);
        left.await.unwrap();
        assert_eq!(unless_closed(Some(&peer), async { 1 }).await, Some(1));
        assert_eq!(unless_closed(None, async { 2 }).await, Some(2));
    }
}
