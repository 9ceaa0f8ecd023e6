//! The accept loop of one listener. routerd accepts its own connections (rather than letting
//! jsonrpsee do it) for two things: each request carries the client's address (the caller of
//! a router reservation when no API keys are set, access.md §6), and each connection runs on a
//! [`silence::Clock`] that closes it when a client is too slow to send a request, or idle too
//! long between two (access.md §7).
//!
//! A connection whose first bytes are not HTTP/2's preface is served as HTTP/1 from the start:
//! hyper-util's version check otherwise reads those bytes apart and hands hyper's parser the
//! first 24 on their own, and the parser's next read then finds its 8 KiB buffer short of room
//! and doubles it, for as long as the connection lives (8 KiB more for each of a settle burst's
//! thousand waiting connections). Peeking decides the same way without taking the bytes.

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto::Builder;
use hyper_util::service::TowerToHyperService;
use jsonrpsee::server::{HttpBody, HttpRequest, HttpResponse, StopHandle};
use tokio::net::{TcpListener, TcpStream};
use tower::Service;

use super::client::{ClientId, TrustedProxies};
use super::gate::{Gate, Permit};
use super::silence::{Clock, Expired, Timeouts, Watched};

/// The peer address a request came from, in its extensions (behind a trusted proxy the client
/// is another: `client::TrustedProxies::resolve`).
#[derive(Debug, Clone, Copy)]
pub struct ClientAddr(pub SocketAddr);

/// Who makes a request, for what belongs to a caller (router reservations, `Idempotency-Key`
/// scopes, the pending rule's pass): its API key's name, or without keys its client.
#[derive(Debug, Clone)]
pub struct Caller(pub String);

impl Caller {
    pub fn of(key: Option<&str>, client: Option<&ClientId>) -> Self {
        Caller(match (key, client) {
            (Some(name), _) => format!("key:{name}"),
            (None, Some(client)) => format!("ip:{client}"),
            (None, None) => "unknown".to_string(),
        })
    }
}

/// What bounds a listener's connections: its gate, and the proxies whose connections carry
/// many clients (bounded by the total only).
#[derive(Clone)]
pub struct Bounds {
    pub gate: Arc<Gate>,
    pub proxies: TrustedProxies,
}

/// How long the accept loop rests after a failed accept (out of descriptors, say), rather than
/// spinning on it.
const ACCEPT_BACKOFF: std::time::Duration = std::time::Duration::from_millis(20);

/// Accepts until `stop`, serving each connection the gate admits with a fresh service from
/// `make`.
pub async fn accept<M, S>(
    listener: TcpListener,
    mut make: M,
    stop: StopHandle,
    timeouts: Timeouts,
    bounds: Bounds,
) where
    M: FnMut() -> S,
    S: Service<HttpRequest, Response = HttpResponse> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let stopped = stop.clone().shutdown();
    tokio::pin!(stopped);
    loop {
        let (socket, remote) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(e) => {
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(ACCEPT_BACKOFF).await;
                    continue;
                }
            },
            _ = &mut stopped => return,
        };
        let clock = Clock::new(timeouts, tokio::time::Instant::now());
        let client = (!bounds.proxies.trusts(remote.ip())).then(|| ClientId::of(remote.ip()));
        let Some(permit) = bounds.gate.admit(client, clock.clone()) else {
            tracing::debug!(client = %remote, "connection refused: every connection held is busy");
            continue;
        };
        let service = make();
        tokio::spawn(serve(
            socket,
            remote,
            service,
            stop.clone(),
            (clock, permit),
        ));
    }
}

/// One connection: every request gets [`ClientAddr`] and counts on the connection's clock; on
/// `stop` the requests in flight finish.
async fn serve<S>(
    socket: TcpStream,
    remote: SocketAddr,
    service: S,
    stop: StopHandle,
    (clock, permit): (Arc<Clock>, Permit),
) where
    S: Service<HttpRequest, Response = HttpResponse> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let tagged = tower::util::MapRequestLayer::new(move |request: http::Request<Incoming>| {
        let mut request = request.map(HttpBody::new);
        request.extensions_mut().insert(ClientAddr(remote));
        request
    });
    let counted = Counted {
        inner: tower::Layer::layer(&tagged, service),
        clock: clock.clone(),
    };
    let service = TowerToHyperService::new(counted);
    let stopped = stop.shutdown();
    tokio::pin!(stopped);
    let Some(version) = first_bytes(&socket, remote, &clock, &permit, stopped.as_mut()).await
    else {
        return;
    };
    let builder = Builder::new(TokioExecutor::new());
    let builder = match version {
        Version::Http1 => builder.http1_only(),
        Version::Undecided => builder,
    };
    let io = TokioIo::new(Watched::new(socket, clock.clone()));
    let connection = builder.serve_connection(io, service);
    tokio::pin!(connection);
    loop {
        let deadline = match clock.check(tokio::time::Instant::now()) {
            Ok(deadline) => deadline,
            Err(expired) => {
                tracing::debug!(client = %remote, ?expired, "connection closed: silent too long");
                return;
            }
        };
        tokio::select! {
            _ = &mut connection => return,
            // The gate needs the place for another connection: this one was idle.
            _ = permit.close.notified() => {
                tracing::debug!(client = %remote, "connection closed to make room");
                return;
            }
            _ = &mut stopped => {
                connection.as_mut().graceful_shutdown();
                let _ = connection.await;
                return;
            }
            _ = tokio::time::sleep_until(deadline) => {}
        }
    }
}

/// Waits for a connection's first bytes under the same bounds as its requests: `None` when it is
/// closed first. Until then it has nothing in flight to finish or answer.
async fn first_bytes(
    socket: &TcpStream,
    remote: SocketAddr,
    clock: &Clock,
    permit: &Permit,
    stopped: Pin<&mut impl Future<Output = ()>>,
) -> Option<Version> {
    // A fresh connection's deadline does not move until it sends a byte.
    let deadline = clock.check(tokio::time::Instant::now()).ok()?;
    tokio::select! {
        version = Version::of(socket) => Some(version),
        _ = permit.close.notified() => {
            tracing::debug!(client = %remote, "connection closed to make room");
            None
        }
        _ = stopped => None,
        _ = tokio::time::sleep_until(deadline) => {
            tracing::debug!(client = %remote, expired = ?Expired::Request, "connection closed: silent too long");
            None
        }
    }
}

/// What a connection's first bytes say of its protocol.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Version {
    /// They differ from HTTP/2's preface: HTTP/1, or bytes HTTP/1's parser refuses.
    Http1,
    /// HTTP/2's preface so far, or nothing yet (closed, or a failed read): hyper-util's own
    /// check reads on.
    Undecided,
}

/// What every HTTP/2 connection without TLS begins with (RFC 9113 §3.4).
const HTTP2_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

impl Version {
    /// Waits for the connection's first bytes and looks at them without taking them.
    async fn of(socket: &TcpStream) -> Self {
        let mut first = [0u8; HTTP2_PREFACE.len()];
        match socket.peek(&mut first).await {
            Ok(read) => Self::of_bytes(&first[..read]),
            Err(_) => Version::Undecided,
        }
    }

    fn of_bytes(first: &[u8]) -> Self {
        if first.is_empty() || HTTP2_PREFACE.starts_with(first) {
            Version::Undecided
        } else {
            Version::Http1
        }
    }
}

/// A service that marks each request on the connection's clock until its answer is ready.
#[derive(Clone)]
struct Counted<S> {
    inner: S,
    clock: Arc<Clock>,
}

impl<S, R> Service<R> for Counted<S>
where
    S: Service<R>,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<S::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: R) -> Self::Future {
        let in_flight = self.clock.request_started();
        let answer = self.inner.call(request);
        Box::pin(async move {
            let answer = answer.await;
            drop(in_flight);
            answer
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_bytes_off_the_http2_preface_decide_http1() {
        assert_eq!(
            Version::of_bytes(b"POST /verify HTTP/1.1\r\n"),
            Version::Http1
        );
        assert_eq!(Version::of_bytes(b"GET /"), Version::Http1);
        assert_eq!(Version::of_bytes(b"\x16\x03\x01"), Version::Http1);
        assert_eq!(Version::of_bytes(HTTP2_PREFACE), Version::Undecided);
        assert_eq!(Version::of_bytes(b"PRI * HTTP/2"), Version::Undecided);
        assert_eq!(Version::of_bytes(b"P"), Version::Undecided);
        assert_eq!(Version::of_bytes(b""), Version::Undecided);
    }
}
