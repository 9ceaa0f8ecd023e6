//! Transport: the jsonrpsee server with the REST layer in front, on one listener (or two, when
//! the facilitator has its own address). Handlers stay thin; the services do the work.

mod auth;
mod idempotency;
mod listen;
mod ops;
pub(crate) mod rest;
pub(crate) mod rpc;
mod silence;
pub mod wire_errors;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;

use std::time::Duration;

use jsonrpsee::server::{stop_channel, BatchRequestConfig, Server, ServerConfig, ServerHandle};
use jsonrpsee::Methods;
use tokio::net::TcpListener;

use crate::chain::Chain;
use crate::config::ServerSettings;
use crate::facilitator::Facilitator;
use crate::router::Router;
pub use auth::{ClientLimit, Keys, KeysError};
pub use ops::{guards_down, Metrics};

/// Most calls in one JSON-RPC batch.
const MAX_BATCH_CALLS: u32 = 100;

/// What the transport serves from.
pub struct App {
    pub facilitator: Option<Arc<Facilitator>>,
    pub router: Option<Arc<Router>>,
    pub chains: BTreeMap<String, Arc<Chain>>,
    pub metrics: Metrics,
    pub max_body_bytes: u32,
    /// `server.request_read_timeout_ms`: bound on receiving a request body.
    pub read_timeout: Duration,
    /// With `auth.api_keys_file`: who may call (access.md §5).
    pub keys: Option<Arc<Keys>>,
    /// Without keys, with `server.client_rate_per_sec`: each client address's rate.
    pub client_limit: Option<ClientLimit>,
}

/// Which routes a listener serves; operator routes are on every listener.
#[derive(Debug, Clone, Copy)]
pub struct Surface {
    pub rpc: bool,
    pub facilitator: bool,
    /// `/metrics` and `/ready` (`/health` is on every listener).
    pub ops: bool,
}

pub struct Listener {
    pub address: SocketAddr,
    pub handle: ServerHandle,
}

/// Binds every configured address, then starts serving. A bind failure is returned before
/// anything serves, so a half-started daemon never answers.
pub async fn start(settings: &ServerSettings, app: Arc<App>) -> std::io::Result<Vec<Listener>> {
    let split = settings.facilitator_listen.is_some();
    let ops = settings.ops_listen.is_none();
    let mut plan = vec![(
        settings.listen,
        Surface {
            rpc: true,
            facilitator: !split,
            ops,
        },
    )];
    if let Some(address) = settings.facilitator_listen {
        plan.push((
            address,
            Surface {
                rpc: false,
                facilitator: true,
                ops,
            },
        ));
    }
    if let Some(address) = settings.ops_listen {
        plan.push((
            address,
            Surface {
                rpc: false,
                facilitator: false,
                ops: true,
            },
        ));
    }
    let mut bound = Vec::new();
    for (address, surface) in plan {
        bound.push((TcpListener::bind(address).await?, surface));
    }
    let timeouts = silence::Timeouts {
        read: Duration::from_millis(settings.request_read_timeout_ms),
        idle: Duration::from_secs(settings.idle_timeout_secs),
    };
    let mut listeners = Vec::new();
    for (listener, surface) in bound {
        let address = listener.local_addr()?;
        let config = ServerConfig::builder()
            .http_only()
            .max_request_body_size(settings.max_body_bytes)
            .max_connections(settings.max_connections)
            // Each call fans out to every chain: a bounded batch keeps one request from
            // monopolising the upstreams.
            .set_batch_request_config(BatchRequestConfig::Limit(MAX_BATCH_CALLS))
            .build();
        let builder = Server::builder()
            .set_config(config)
            .set_http_middleware(
                tower::ServiceBuilder::new().layer(rest::RestLayer::new(app.clone(), surface)),
            )
            .to_service_builder();
        let methods: Methods = match surface.rpc {
            true => rpc::module(app.clone()).into(),
            false => jsonrpsee::RpcModule::new(app.clone()).into(),
        };
        let (stop, handle) = stop_channel();
        let make = {
            let stop = stop.clone();
            move || builder.clone().build(methods.clone(), stop.clone())
        };
        tokio::spawn(listen::accept(listener, make, stop, timeouts));
        listeners.push(Listener { address, handle });
    }
    Ok(listeners)
}

/// An app of the given router, no facilitator, no chains and no keys.
#[cfg(test)]
fn test_app(
    router: Option<Arc<Router>>,
    facilitator: Option<Arc<Facilitator>>,
    chains: BTreeMap<String, Arc<Chain>>,
) -> App {
    App {
        facilitator,
        router,
        chains,
        metrics: Metrics::new(),
        max_body_bytes: 1 << 20,
        read_timeout: Duration::from_secs(5),
        keys: None,
        client_limit: None,
    }
}

#[cfg(test)]
mod wire_tests;
