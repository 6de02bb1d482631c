//! systemd readiness and watchdog notifications (`sd_notify(3)`).
//!
//! The protocol is one datagram per notification, `KEY=VALUE` lines, sent to the unix socket
//! named by `NOTIFY_SOCKET` (a path, or `@name` for the abstract namespace). It is small
//! enough to speak directly, which keeps the socket and the environment read once, at start,
//! and lets tests point a [`Notifier`] at a socket of their own. Without `NOTIFY_SOCKET` every
//! call is a no-op.
//!
//! What the agent sends: `READY=1` after the first successful apply, `WATCHDOG=1` at half of
//! `WATCHDOG_USEC` while the dataplane loop is live ([`run_watchdog`]), `STOPPING=1` on
//! shutdown.

use std::ffi::{OsStr, OsString};
use std::future::Future;
use std::os::linux::net::SocketAddrExt as _;
use std::os::unix::ffi::OsStrExt as _;
use std::os::unix::net::{SocketAddr, UnixDatagram};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use super::health::HealthAggregator;

/// What can go wrong talking to systemd.
#[derive(Debug, thiserror::Error)]
pub enum NotifyError {
    #[error("NOTIFY_SOCKET={value:?} is not a usable socket address")]
    BadSocket {
        value: OsString,
        #[source]
        source: std::io::Error,
    },
    #[error("creating the notify socket")]
    Socket(#[source] std::io::Error),
    #[error("sending {state:?} to systemd at {socket}")]
    Send {
        state: String,
        socket: String,
        #[source]
        source: std::io::Error,
    },
}

#[derive(Debug)]
struct Inner {
    sock: UnixDatagram,
    addr: SocketAddr,
    /// For messages: the socket as given.
    name: String,
    ready_sent: AtomicBool,
}

/// A handle for systemd notifications; cheap to clone. Disabled (every call a no-op) when the
/// service manager did not ask for notifications.
#[derive(Debug, Clone, Default)]
pub struct Notifier {
    inner: Option<Arc<Inner>>,
    watchdog: Option<Duration>,
}

impl Notifier {
    /// A notifier that sends nothing.
    pub fn disabled() -> Self {
        Self::default()
    }

    /// From this process's `NOTIFY_SOCKET`, `WATCHDOG_USEC` and `WATCHDOG_PID`.
    pub fn from_env() -> Result<Self, NotifyError> {
        Self::from_vars(
            std::env::var_os("NOTIFY_SOCKET").as_deref(),
            std::env::var("WATCHDOG_USEC").ok().as_deref(),
            std::env::var("WATCHDOG_PID").ok().as_deref(),
        )
    }

    /// From the given variables (the hermetic core of [`Notifier::from_env`]). The watchdog is
    /// on when `watchdog_usec` is a positive number and `watchdog_pid`, if set, is this
    /// process (sd_watchdog_enabled(3)).
    pub fn from_vars(
        notify_socket: Option<&OsStr>,
        watchdog_usec: Option<&str>,
        watchdog_pid: Option<&str>,
    ) -> Result<Self, NotifyError> {
        let Some(value) = notify_socket.filter(|v| !v.is_empty()) else {
            return Ok(Self::disabled());
        };
        let bytes = value.as_bytes();
        let addr = match bytes.strip_prefix(b"@") {
            Some(name) => SocketAddr::from_abstract_name(name),
            None => SocketAddr::from_pathname(PathBuf::from(value)),
        }
        .map_err(|source| NotifyError::BadSocket {
            value: value.to_owned(),
            source,
        })?;
        let sock = UnixDatagram::unbound().map_err(NotifyError::Socket)?;
        let for_us = watchdog_pid
            .map(|p| p.trim().parse::<u32>().ok() == Some(std::process::id()))
            .unwrap_or(true);
        let watchdog = watchdog_usec
            .and_then(|u| u.trim().parse::<u64>().ok())
            .filter(|&u| u > 0 && for_us)
            .map(Duration::from_micros);
        Ok(Notifier {
            inner: Some(Arc::new(Inner {
                sock,
                addr,
                name: value.to_string_lossy().into_owned(),
                ready_sent: AtomicBool::new(false),
            })),
            watchdog,
        })
    }

    /// Whether notifications go anywhere.
    pub fn is_enabled(&self) -> bool {
        self.inner.is_some()
    }

    /// How often to send `WATCHDOG=1`: half of `WATCHDOG_USEC`, as sd_watchdog_enabled(3)
    /// advises; `None` when systemd runs no watchdog for us.
    pub fn watchdog_interval(&self) -> Option<Duration> {
        self.inner.as_ref()?;
        self.watchdog.map(|w| w / 2)
    }

    /// Sends `state` (newline-separated `KEY=VALUE` lines) as one datagram.
    pub fn notify(&self, state: &str) -> Result<(), NotifyError> {
        let Some(inner) = &self.inner else {
            return Ok(());
        };
        inner
            .sock
            .send_to_addr(state.as_bytes(), &inner.addr)
            .map(drop)
            .map_err(|source| NotifyError::Send {
                state: state.to_string(),
                socket: inner.name.clone(),
                source,
            })
    }

    /// `READY=1`, once: later calls send nothing.
    pub fn ready(&self) -> Result<(), NotifyError> {
        let Some(inner) = &self.inner else {
            return Ok(());
        };
        if inner.ready_sent.swap(true, Ordering::SeqCst) {
            return Ok(());
        }
        self.notify("READY=1\nSTATUS=dataplane in sync")
    }

    /// `WATCHDOG=1`: the agent is healthy.
    pub fn watchdog(&self) -> Result<(), NotifyError> {
        self.notify("WATCHDOG=1")
    }

    /// `STOPPING=1`: shutdown has begun.
    pub fn stopping(&self) -> Result<(), NotifyError> {
        self.notify("STOPPING=1\nSTATUS=stopping; rules stay in place")
    }
}

/// Pings the systemd watchdog at [`Notifier::watchdog_interval`] for as long as `health` says
/// the agent is live, until `shutdown` completes. If the dataplane loop hangs, its reporter
/// times out, the pings stop, and systemd restarts us. Returns at once when there is no
/// watchdog.
pub async fn run_watchdog(
    notifier: Notifier,
    health: HealthAggregator,
    shutdown: impl Future<Output = ()>,
) {
    let Some(every) = notifier.watchdog_interval() else {
        return;
    };
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            _ = &mut shutdown => return,
            _ = tick.tick() => {}
        }
        if health.summary().live {
            if let Err(e) = notifier.watchdog() {
                tracing::warn!(error = %e, "systemd watchdog notification failed");
            }
        } else {
            tracing::warn!("not live: withholding the systemd watchdog ping");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_socket_everything_is_a_no_op() {
        let n = Notifier::from_vars(None, Some("1000000"), None).unwrap();
        assert!(!n.is_enabled());
        assert_eq!(n.watchdog_interval(), None);
        n.ready().unwrap();
        n.watchdog().unwrap();
        n.stopping().unwrap();
    }

    #[test]
    fn watchdog_is_half_the_interval_and_only_for_us() {
        let s = OsStr::new("@felix-nft-test-unused");
        let n = Notifier::from_vars(Some(s), Some("10000000"), None).unwrap();
        assert_eq!(n.watchdog_interval(), Some(Duration::from_secs(5)));
        let me = std::process::id().to_string();
        let n = Notifier::from_vars(Some(s), Some("10000000"), Some(&me)).unwrap();
        assert_eq!(n.watchdog_interval(), Some(Duration::from_secs(5)));
        let n = Notifier::from_vars(Some(s), Some("10000000"), Some("1")).unwrap();
        assert_eq!(
            n.watchdog_interval(),
            None,
            "WATCHDOG_PID names another process"
        );
        let n = Notifier::from_vars(Some(s), None, None).unwrap();
        assert_eq!(n.watchdog_interval(), None);
    }

    #[test]
    fn abstract_socket_receives_ready_once() {
        let name = format!("felix-nft-test-{}", std::process::id());
        let rx = UnixDatagram::bind_addr(&SocketAddr::from_abstract_name(&name).unwrap()).unwrap();
        rx.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
        let n = Notifier::from_vars(Some(OsStr::new(&format!("@{name}"))), None, None).unwrap();
        n.ready().unwrap();
        n.ready().unwrap();
        n.stopping().unwrap();
        let mut buf = [0u8; 256];
        let k = rx.recv(&mut buf).unwrap();
        assert!(buf[..k].starts_with(b"READY=1\n"));
        let k = rx.recv(&mut buf).unwrap();
        assert!(
            buf[..k].starts_with(b"STOPPING=1\n"),
            "READY=1 went only once"
        );
    }
}
