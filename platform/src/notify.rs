//! systemd's service notification protocol (`sd_notify`), for `Type=notify` with `WatchdogSec=`
//! (packaging/airlock.service): systemd passes a unix datagram socket in `NOTIFY_SOCKET` (a path,
//! or `@name` in the abstract namespace) and the watchdog period in `WATCHDOG_USEC`. The daemon
//! sends `READY=1` once start-up completed (the moment `/readyz` turns 200), `WATCHDOG=1` every
//! half period from its async runtime (a runtime that stops scheduling stops the pings, and
//! systemd restarts the service), and `STOPPING=1` when it starts draining. Without
//! `NOTIFY_SOCKET` (not under systemd) nothing is sent.

use std::io;
use std::os::unix::net::{SocketAddr, UnixDatagram};
use std::time::Duration;

/// A connection to the service manager's notification socket.
#[derive(Debug)]
pub struct Notifier {
    socket: UnixDatagram,
    addr: SocketAddr,
}

impl Notifier {
    /// The notifier of `NOTIFY_SOCKET`, when it is set (an unusable value is logged and ignored:
    /// a missing notification shows up as a start timeout in systemd, with this warning).
    pub fn from_env() -> Option<Self> {
        let value = std::env::var_os("NOTIFY_SOCKET")?;
        match Self::connect(&value) {
            Ok(n) => Some(n),
            Err(e) => {
                tracing::warn!(notify_socket = ?value, error = %e, "cannot use NOTIFY_SOCKET");
                None
            }
        }
    }

    /// A notifier sending to `socket` (a path, or `@name` for the abstract namespace).
    pub fn connect(socket: &std::ffi::OsStr) -> io::Result<Self> {
        let bytes = socket.as_encoded_bytes();
        let addr = match bytes.first() {
            Some(b'/') => SocketAddr::from_pathname(socket)?,
            #[cfg(target_os = "linux")]
            Some(b'@') => {
                use std::os::linux::net::SocketAddrExt;
                SocketAddr::from_abstract_name(&bytes[1..])?
            }
            _ => {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    "NOTIFY_SOCKET is neither an absolute path nor @abstract",
                ));
            }
        };
        Ok(Self {
            socket: UnixDatagram::unbound()?,
            addr,
        })
    }

    /// Sends one notification (`KEY=VALUE` lines).
    pub fn notify(&self, state: &str) -> io::Result<()> {
        self.socket.send_to_addr(state.as_bytes(), &self.addr)?;
        Ok(())
    }

    /// [`Notifier::notify`], a failure logged (the daemon goes on; systemd judges).
    pub fn send(&self, state: &str) {
        if let Err(e) = self.notify(state) {
            tracing::warn!(error = %e, state, "sd_notify failed");
        }
    }
}

/// How often to send `WATCHDOG=1`: half of `WATCHDOG_USEC`, when it is set and meant for this
/// process (`WATCHDOG_PID`, when set, is our pid).
pub fn watchdog_interval() -> Option<Duration> {
    if let Some(pid) = std::env::var_os("WATCHDOG_PID")
        && pid.to_str().and_then(|p| p.parse::<u32>().ok()) != Some(std::process::id())
    {
        return None;
    }
    let usec: u64 = std::env::var("WATCHDOG_USEC").ok()?.parse().ok()?;
    (usec > 0).then(|| Duration::from_micros(usec / 2).max(Duration::from_millis(10)))
}

/// Sends `WATCHDOG=1` every `every` for the life of the runtime.
pub async fn watchdog(notifier: std::sync::Arc<Notifier>, every: Duration) {
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        notifier.send("WATCHDOG=1");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn notifications_reach_a_path_socket() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("notify");
        let server = UnixDatagram::bind(&path).unwrap();
        let n = Notifier::connect(path.as_os_str()).unwrap();
        n.notify("READY=1").unwrap();
        let mut buf = [0u8; 64];
        let len = server.recv(&mut buf).unwrap();
        assert_eq!(&buf[..len], b"READY=1");
        assert!(Notifier::connect(std::ffi::OsStr::new("relative")).is_err());
    }
}
