//! The accept loop of one listener. routerd accepts its own connections (rather than letting
//! jsonrpsee do it) for two things: each request carries the client's address (the caller of
//! a router reservation when no API keys are set, access.md §6), and each connection runs on a
//! [`silence::Clock`] that closes it when a client is too slow to send a request, or idle too
//! long between two (access.md §7).

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
use super::silence::{Clock, Timeouts, Watched};

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
    let builder = Builder::new(TokioExecutor::new());
    let io = TokioIo::new(Watched::new(socket, clock.clone()));
    let connection = builder.serve_connection(io, service);
    tokio::pin!(connection);
    let stopped = stop.shutdown();
    tokio::pin!(stopped);
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
