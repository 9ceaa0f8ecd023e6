//! Transport: the jsonrpsee server with the REST layer in front, on one listener (or two, when
//! the facilitator has its own address). Handlers stay thin; the services do the work.

mod auth;
mod idempotency;
mod ops;
mod rest;
mod rpc;
pub mod wire_errors;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;

use jsonrpsee::server::{BatchRequestConfig, Server, ServerConfig, ServerHandle};

use crate::chain::Chain;
use crate::config::ServerSettings;
use crate::facilitator::Facilitator;
use crate::router::Router;
pub use auth::{Keys, KeysError};
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
    /// With `auth.api_keys_file`: who may call (access.md §5).
    pub keys: Option<Arc<Keys>>,
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
        let config = ServerConfig::builder()
            .http_only()
            .max_request_body_size(settings.max_body_bytes)
            .max_connections(settings.max_connections)
            // Each call fans out to every chain: a bounded batch keeps one request from
            // monopolising the upstreams.
            .set_batch_request_config(BatchRequestConfig::Limit(MAX_BATCH_CALLS))
            .build();
        let server = Server::builder()
            .set_config(config)
            .set_http_middleware(
                tower::ServiceBuilder::new().layer(rest::RestLayer::new(app.clone(), surface)),
            )
            .build(address)
            .await?;
        bound.push((server, surface));
    }
    let mut listeners = Vec::new();
    for (server, surface) in bound {
        let address = server.local_addr()?;
        let module = if surface.rpc {
            rpc::module(app.clone())
        } else {
            jsonrpsee::RpcModule::new(app.clone())
        };
        listeners.push(Listener {
            address,
            handle: server.start(module),
        });
    }
    Ok(listeners)
}
