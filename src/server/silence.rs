//! How long a connection may stay silent (access.md §7). A client has
//! `server.request_read_timeout_ms` to send a request's headers, counted from its first byte (on a
//! fresh connection, from the accept); a keep-alive connection with no request in flight and no
//! byte received is closed after `server.idle_timeout_secs`. hyper's own header timeout starts as
//! soon as a connection goes idle, so it cannot tell a slow client from a quiet one: this clock
//! replaces it. The body's bound is `rest::read_body`'s.

use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::Instant;

use crate::config::ServerSettings;

/// The two bounds on a silent connection.
#[derive(Debug, Clone, Copy)]
pub struct Timeouts {
    pub read: Duration,
    pub idle: Duration,
}

impl Timeouts {
    /// `server.request_read_timeout_ms` and `server.idle_timeout_secs`.
    pub fn of(settings: &ServerSettings) -> Self {
        Timeouts {
            read: Duration::from_millis(settings.request_read_timeout_ms),
            idle: Duration::from_secs(settings.idle_timeout_secs),
        }
    }
}

/// Where a connection is between requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// No request in flight and no byte since `since`; `fresh` until the first request.
    Waiting { since: Instant, fresh: bool },
    /// A request's first bytes arrived at `since`; its headers are not complete yet.
    Reading { since: Instant },
    /// Requests handed to the service and not answered yet.
    Serving { requests: usize },
}

/// Why a connection's time is up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expired {
    /// A request (or a fresh connection's first one) not received within the read timeout.
    Request,
    /// An idle keep-alive connection.
    Idle,
}

/// One connection's clock, shared by its socket (bytes read) and its service (requests).
#[derive(Debug)]
pub struct Clock {
    timeouts: Timeouts,
    phase: Mutex<Phase>,
}

impl Clock {
    pub fn new(timeouts: Timeouts, now: Instant) -> Arc<Self> {
        Arc::new(Clock {
            timeouts,
            phase: Mutex::new(Phase::Waiting {
                since: now,
                fresh: true,
            }),
        })
    }

    fn phase(&self) -> std::sync::MutexGuard<'_, Phase> {
        // A poisoned lock only means a panic elsewhere held it; the phase is still whole.
        self.phase.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Bytes arrived: between requests, a request has begun.
    pub fn bytes_read(&self, now: Instant) {
        let mut phase = self.phase();
        if let Phase::Waiting { .. } = *phase {
            *phase = Phase::Reading { since: now };
        }
    }

    /// The service received a request; the guard marks its answer.
    pub fn request_started(self: &Arc<Self>) -> InFlight {
        let mut phase = self.phase();
        *phase = match *phase {
            Phase::Serving { requests } => Phase::Serving {
                requests: requests + 1,
            },
            _ => Phase::Serving { requests: 1 },
        };
        InFlight(self.clone())
    }

    fn request_done(&self, now: Instant) {
        let mut phase = self.phase();
        *phase = match *phase {
            Phase::Serving { requests } if requests > 1 => Phase::Serving {
                requests: requests - 1,
            },
            _ => Phase::Waiting {
                since: now,
                fresh: false,
            },
        };
    }

    /// No request in flight and none being received, and not a connection just opened whose
    /// first request is on its way (`grace`): closing it loses nothing.
    pub fn is_idle(&self, now: Instant, grace: Duration) -> bool {
        match *self.phase() {
            Phase::Waiting { fresh: false, .. } => true,
            Phase::Waiting { since, fresh: true } => now.saturating_duration_since(since) >= grace,
            _ => false,
        }
    }

    /// When to look again, or why the connection's time is up.
    pub fn check(&self, now: Instant) -> Result<Instant, Expired> {
        let (deadline, expired) = match *self.phase() {
            Phase::Waiting { since, fresh: true } => (since + self.timeouts.read, Expired::Request),
            Phase::Waiting { since, .. } => (since + self.timeouts.idle, Expired::Idle),
            Phase::Reading { since } => (since + self.timeouts.read, Expired::Request),
            // Handlers are bounded elsewhere; look again later.
            Phase::Serving { .. } => return Ok(now + self.timeouts.read),
        };
        if deadline <= now {
            Err(expired)
        } else {
            Ok(deadline)
        }
    }
}

/// A request in flight; dropped when its answer is ready (or its future is dropped).
pub struct InFlight(Arc<Clock>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.request_done(Instant::now());
    }
}

/// A socket that tells its clock when bytes arrive.
pub struct Watched<T> {
    inner: T,
    clock: Arc<Clock>,
}

impl<T> Watched<T> {
    pub fn new(inner: T, clock: Arc<Clock>) -> Self {
        Watched { inner, clock }
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for Watched<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.inner).poll_read(cx, buf);
        if matches!(polled, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            self.clock.bytes_read(Instant::now());
        }
        polled
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Watched<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const T: Timeouts = Timeouts {
        read: Duration::from_secs(10),
        idle: Duration::from_secs(60),
    };

    fn secs(start: Instant, s: u64) -> Instant {
        start + Duration::from_secs(s)
    }

    #[test]
    fn a_fresh_connection_gets_the_read_timeout_for_its_first_request() {
        let t0 = Instant::now();
        let clock = Clock::new(T, t0);
        assert_eq!(clock.check(secs(t0, 9)), Ok(secs(t0, 10)));
        assert_eq!(clock.check(secs(t0, 10)), Err(Expired::Request));
    }

    #[test]
    fn headers_are_bounded_from_their_first_byte() {
        let t0 = Instant::now();
        let clock = Clock::new(T, t0);
        clock.bytes_read(secs(t0, 5));
        // More bytes of the same headers do not extend the bound.
        clock.bytes_read(secs(t0, 14));
        assert_eq!(clock.check(secs(t0, 15)), Err(Expired::Request));
    }

    #[test]
    fn a_keep_alive_connection_idles_until_the_idle_timeout() {
        let t0 = Instant::now();
        let clock = Clock::new(T, t0);
        clock.bytes_read(t0);
        drop(clock.request_started());
        // The answer went out now (the drop); a quiet client is not a slow one.
        let done = Instant::now();
        assert!(clock.check(done + Duration::from_secs(30)).is_ok());
        assert_eq!(
            clock.check(done + Duration::from_secs(61)),
            Err(Expired::Idle)
        );
        // The next request's first byte starts the read bound again.
        let next = done + Duration::from_secs(40);
        clock.bytes_read(next);
        assert_eq!(
            clock.check(next + Duration::from_secs(10)),
            Err(Expired::Request)
        );
    }

    #[test]
    fn a_request_in_flight_is_never_cut_off_here() {
        let t0 = Instant::now();
        let clock = Clock::new(T, t0);
        let first = clock.request_started();
        let second = clock.request_started();
        clock.bytes_read(secs(t0, 1));
        assert!(clock.check(secs(t0, 600)).is_ok());
        drop(first);
        assert!(clock.check(secs(t0, 600)).is_ok(), "one still in flight");
        drop(second);
        assert!(matches!(
            *clock.phase(),
            Phase::Waiting { fresh: false, .. }
        ));
    }
}
