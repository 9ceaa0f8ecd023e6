//! The least a request can cost on routerd's transport, for the benchmark to set routerd beside.
//!
//!   transport-floor UPSTREAM_URL [HOLD_MS]
//!
//! It serves HTTP as routerd does (routerd's own accept loop with its default connection bounds
//! and timeouts, jsonrpsee's server with an HTTP middleware, as many runtime threads as
//! routerd's default, the body read whole) and answers every request after one
//! JSON-RPC batch to UPSTREAM_URL through jsonrpsee's HTTP client: verify's one upstream read.
//! It parses no payment, recovers no signature, stores and logs nothing. With HOLD_MS it waits
//! that long before answering, as a settlement waits for its block, so that many requests are
//! held at once. It prints the port it listens on.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use http_body_util::{BodyExt, Limited};
use jsonrpsee::core::client::ClientT;
use jsonrpsee::core::params::BatchRequestBuilder;
use jsonrpsee::core::BoxError;
use jsonrpsee::http_client::{HttpClient, HttpClientBuilder};
use jsonrpsee::rpc_params;
use jsonrpsee::server::{stop_channel, HttpBody, HttpRequest, HttpResponse, Server, ServerConfig};
use jsonrpsee::Methods;
use routerd::config::ServerSettings;
use routerd::server::{accept, Bounds, ConnectionLimits, Gate, Timeouts, TrustedProxies};
use tokio::net::TcpListener;

fn main() {
    let mut args = std::env::args().skip(1);
    let Some(upstream) = args.next() else {
        eprintln!("usage: transport-floor UPSTREAM_URL [HOLD_MS]");
        std::process::exit(2);
    };
    let hold = Duration::from_millis(args.next().and_then(|a| a.parse().ok()).unwrap_or(0));
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(ServerSettings::default_worker_threads())
        .enable_all()
        .build()
        .expect("runtime")
        .block_on(serve(upstream, hold));
}

async fn serve(upstream: String, hold: Duration) {
    let client = HttpClientBuilder::default()
        .build(&upstream)
        .expect("upstream URL");
    let floor = Floor { client, hold };
    let settings = ServerSettings::default();
    let service = Server::builder()
        .set_config(ServerConfig::builder().http_only().build())
        .set_http_middleware(tower::ServiceBuilder::new().layer_fn(move |_| floor.clone()))
        .to_service_builder();
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    println!("{}", listener.local_addr().expect("bound").port());
    let (stop, _handle) = stop_channel();
    let make = {
        let stop = stop.clone();
        let methods = Methods::from(jsonrpsee::RpcModule::new(()));
        move || service.clone().build(methods.clone(), stop.clone())
    };
    let timeouts = Timeouts::of(&settings);
    let total = settings.max_connections as usize;
    let bounds = Bounds {
        gate: Gate::new(ConnectionLimits {
            total,
            per_client: total,
        }),
        proxies: TrustedProxies::default(),
    };
    accept(listener, make, stop, timeouts, bounds).await;
}

#[derive(Clone)]
struct Floor {
    client: HttpClient,
    hold: Duration,
}

impl tower::Service<HttpRequest> for Floor {
    type Response = HttpResponse;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<HttpResponse, BoxError>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: HttpRequest) -> Self::Future {
        let floor = self.clone();
        Box::pin(async move {
            let body = Limited::new(request.into_body(), 65536).collect().await?;
            let _read = body.to_bytes().to_vec();
            let mut batch = BatchRequestBuilder::new();
            batch.insert("eth_blockNumber", rpc_params![])?;
            floor
                .client
                .batch_request::<serde_json::Value>(batch)
                .await?;
            if !floor.hold.is_zero() {
                tokio::time::sleep(floor.hold).await;
            }
            Ok(http::Response::builder()
                .status(200)
                .header(http::header::CONTENT_TYPE, "application/json")
                .body(HttpBody::from(r#"{"isValid":true}"#.as_bytes().to_vec()))?)
        })
    }
}
