//! Transport: the jsonrpsee server with the REST layer in front, on one listener (or two, when
//! the facilitator has its own address). Handlers stay thin; the services do the work.
//!
//! Invariants: the services are built once at start ([`Services`]); each listener's `Routes`
//! are built once from them and its [`Surface`], holding a service's handlers only where the
//! listener serves it and it is configured, so no handler checks for a service. Typed errors
//! become wire errors in `wire_errors` only.

mod auth;
mod chains;
mod client;
mod gate;
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

use jsonrpsee::server::middleware::rpc::RpcServiceBuilder;
use jsonrpsee::server::{stop_channel, BatchRequestConfig, Server, ServerConfig, ServerHandle};
use jsonrpsee::Methods;
use tokio::net::TcpListener;

use crate::chain::Chain;
use crate::config::ServerSettings;
use crate::facilitator::Facilitator;
use crate::router::Router;
pub use auth::{ClientLimit, Keys, KeysError};
pub use client::TrustedProxies;
pub use gate::{Gate, Limits as ConnectionLimits};
/// The accept loop, for the transport floor to serve as routerd does (bench/transport_floor.rs).
pub use listen::{accept, Bounds};
pub use ops::{guards_down, Metrics};
pub use silence::Timeouts;

/// Most calls in one JSON-RPC batch.
const MAX_BATCH_CALLS: u32 = 100;

/// What the transport serves from.
pub struct App {
    pub services: Services,
    pub metrics: Metrics,
    pub max_body_bytes: u32,
    /// `server.max_relay_answer_bytes`: what one relayed answer may read from the nodes.
    pub max_relay_answer_bytes: usize,
    /// `server.request_read_timeout_ms`: bound on receiving a request body.
    pub read_timeout: Duration,
    /// With `auth.api_keys_file`: who may call (access.md §5).
    pub keys: Option<Arc<Keys>>,
    /// Without keys, with `server.client_rate_per_sec`: each client address's rate.
    pub client_limit: Option<ClientLimit>,
    /// `server.trusted_proxies`: whose forwarding headers name the client.
    pub proxies: TrustedProxies,
    /// The connections of the public listeners, all of them together (descriptors are the
    /// process's).
    pub connections: Arc<Gate>,
}

/// The services, built once at start: a section left out of the configuration leaves its
/// service out. Handlers do not read this; operator routes ask it for readiness.
pub struct Services {
    /// With `[router]`.
    pub router: Option<Arc<Router>>,
    /// With `[facilitator]`.
    pub facilitator: Option<Arc<Facilitator>>,
    /// The chains the router or the facilitator use.
    pub chains: BTreeMap<String, Arc<Chain>>,
}

/// Which routes a listener serves; operator routes are on every listener.
#[derive(Debug, Clone, Copy)]
pub struct Surface {
    pub rpc: bool,
    pub facilitator: bool,
    /// `/metrics` and `/ready` (`/health` is on every listener).
    pub ops: bool,
}

/// What one listener answers, built once at start.
pub(crate) struct Routes {
    pub app: Arc<App>,
    pub surface: Surface,
    /// With `surface.rpc` and a router: `POST /` in REST form, `POST /quote`, the methods.
    pub router: Option<rpc::RouterApi>,
    /// With `surface.facilitator` and a facilitator: `/supported`, `/verify`, `/settle`,
    /// `/settlements/…`.
    pub facilitator: Option<Arc<Facilitator>>,
}

impl Routes {
    fn new(app: Arc<App>, surface: Surface) -> Self {
        let router = app
            .services
            .router
            .clone()
            .filter(|_| surface.rpc)
            .map(|router| rpc::RouterApi::new(router, app.clone()));
        let facilitator = app
            .services
            .facilitator
            .clone()
            .filter(|_| surface.facilitator);
        Self {
            app,
            surface,
            router,
            facilitator,
        }
    }
}

pub struct Listener {
    pub address: SocketAddr,
    pub handle: ServerHandle,
}

/// Binds every configured address, then starts serving. A bind failure is returned before
/// anything serves, so a half-started daemon never answers.
pub async fn start(settings: &ServerSettings, app: Arc<App>) -> std::io::Result<Vec<Listener>> {
    let mut bound = Vec::new();
    for (address, surface) in plan(settings) {
        bound.push((TcpListener::bind(address).await?, surface));
    }
    let mut listeners = Vec::new();
    for (listener, surface) in bound {
        let address = listener.local_addr()?;
        let routes = Arc::new(Routes::new(app.clone(), surface));
        let gate = match surface.rpc || surface.facilitator {
            true => app.connections.clone(),
            // The ops listener's own few: a full public listener never keeps it out.
            false => Gate::new(gate::Limits {
                total: gate::OPS_CONNECTIONS,
                per_client: gate::OPS_CONNECTIONS,
            }),
        };
        let bounds = listen::Bounds {
            gate,
            proxies: app.proxies.clone(),
        };
        let handle = serve(settings, listener, routes, bounds);
        listeners.push(Listener { address, handle });
    }
    Ok(listeners)
}

/// Each configured address and what it serves.
fn plan(settings: &ServerSettings) -> Vec<(SocketAddr, Surface)> {
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
    plan
}

/// Serves `routes` on `listener` until its handle stops it.
fn serve(
    settings: &ServerSettings,
    listener: TcpListener,
    routes: Arc<Routes>,
    bounds: listen::Bounds,
) -> ServerHandle {
    let timeouts = silence::Timeouts::of(settings);
    let config = ServerConfig::builder()
        .http_only()
        .max_request_body_size(settings.max_body_bytes)
        .max_connections(settings.max_connections)
        // Each call fans out to every chain: a bounded batch keeps one request from
        // monopolising the upstreams.
        .set_batch_request_config(BatchRequestConfig::Limit(MAX_BATCH_CALLS))
        .build();
    let methods: Methods = rpc::module(routes.router.clone()).into();
    let max_answer_bytes = settings.max_relay_answer_bytes as usize;
    let builder = Server::builder()
        .set_config(config)
        .set_rpc_middleware(
            RpcServiceBuilder::new().layer_fn(move |inner| rpc::KeepParams {
                inner,
                max_answer_bytes,
            }),
        )
        .set_http_middleware(tower::ServiceBuilder::new().layer(rest::RestLayer::new(routes)))
        .to_service_builder();
    let (stop, handle) = stop_channel();
    let make = {
        let stop = stop.clone();
        move || builder.clone().build(methods.clone(), stop.clone())
    };
    tokio::spawn(listen::accept(listener, make, stop, timeouts, bounds));
    handle
}

/// An app of the given services, without keys.
#[cfg(test)]
fn test_app(
    router: Option<Arc<Router>>,
    facilitator: Option<Arc<Facilitator>>,
    chains: BTreeMap<String, Arc<Chain>>,
) -> App {
    App {
        services: Services {
            facilitator,
            router,
            chains,
        },
        metrics: Metrics::new(),
        max_body_bytes: 1 << 20,
        max_relay_answer_bytes: 4 << 20,
        read_timeout: Duration::from_secs(5),
        keys: None,
        client_limit: None,
        proxies: TrustedProxies::default(),
        connections: Gate::new(gate::Limits::for_open_files(4096, None, None)),
    }
}

#[cfg(test)]
mod wire_tests;
