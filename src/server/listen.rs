//! The accept loop of one listener. routerd accepts its own connections (rather than letting
//! jsonrpsee do it) for two things: each request carries the client's address (the caller of
//! a router reservation when no API keys are set, access.md §6), and hyper bounds how long a
//! client may take to send its request headers, also between the requests of a keep-alive
//! connection (access.md §7; the body's bound is `rest::read_body`'s).

use std::net::SocketAddr;
use std::time::Duration;

use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto::Builder;
use hyper_util::service::TowerToHyperService;
use jsonrpsee::server::{HttpBody, HttpRequest, HttpResponse, StopHandle};
use tokio::net::{TcpListener, TcpStream};
use tower::Service;

/// The address a request came from, in its extensions.
#[derive(Debug, Clone, Copy)]
pub struct ClientAddr(pub SocketAddr);

/// Who makes a request, for what belongs to a caller (router reservations): its API key's name,
/// or without keys its client's IP address.
#[derive(Debug, Clone)]
pub struct Caller(pub String);

impl Caller {
    pub fn of(key: Option<&str>, client: Option<&ClientAddr>) -> Self {
        Caller(match (key, client) {
            (Some(name), _) => format!("key:{name}"),
            (None, Some(ClientAddr(addr))) => format!("ip:{}", addr.ip()),
            (None, None) => "unknown".to_string(),
        })
    }
}

/// Accepts until `stop`, serving each connection with a fresh service from `make`.
pub async fn accept<M, S>(
    listener: TcpListener,
    mut make: M,
    stop: StopHandle,
    read_timeout: Duration,
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
                    tracing::debug!(error = %e, "accept failed");
                    continue;
                }
            },
            _ = &mut stopped => return,
        };
        let service = make();
        tokio::spawn(serve(socket, remote, service, stop.clone(), read_timeout));
    }
}

/// One connection: every request gets [`ClientAddr`]; on `stop` the requests in flight finish.
async fn serve<S>(
    socket: TcpStream,
    remote: SocketAddr,
    service: S,
    stop: StopHandle,
    read_timeout: Duration,
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
    let service = TowerToHyperService::new(tower::Layer::layer(&tagged, service));
    let mut builder = Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(read_timeout);
    let connection = builder.serve_connection(TokioIo::new(socket), service);
    tokio::pin!(connection);
    tokio::select! {
        _ = &mut connection => {}
        _ = stop.shutdown() => {
            connection.as_mut().graceful_shutdown();
            let _ = connection.await;
        }
    }
}
