//! The least a request can cost on routerd's transport, for the benchmark to set routerd beside.
//!
//!   transport-floor UPSTREAM_URL [HOLD_MS]
//!
//! It serves HTTP as routerd does (jsonrpsee's server with an HTTP middleware, as many runtime
//! threads as routerd's default, at most 1,024 connections, the body read whole) and answers every request after one
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
use jsonrpsee::server::{HttpBody, HttpRequest, HttpResponse, Server, ServerConfig};

fn main() {
    let mut args = std::env::args().skip(1);
    let Some(upstream) = args.next() else {
        eprintln!("usage: transport-floor UPSTREAM_URL [HOLD_MS]");
        std::process::exit(2);
    };
    let hold = Duration::from_millis(args.next().and_then(|a| a.parse().ok()).unwrap_or(0));
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(routerd::config::ServerSettings::default_worker_threads())
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
    let server = Server::builder()
        .set_config(
            ServerConfig::builder()
                .http_only()
                .max_connections(1024)
                .build(),
        )
        .set_http_middleware(tower::ServiceBuilder::new().layer_fn(move |_| floor.clone()))
        .build("127.0.0.1:0")
        .await
        .expect("bind");
    println!("{}", server.local_addr().expect("bound").port());
    let handle = server.start(jsonrpsee::RpcModule::new(()));
    handle.stopped().await;
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
