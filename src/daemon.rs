//! Wiring: open the store, connect the chains, configure the facilitator (its families load
//! their keys, and the receiver authorizer), check it before serving, resume unfinished
//! settlements, serve, tell systemd, and shut down cleanly on SIGTERM/SIGINT.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use crate::chain::Chain;
use crate::config::{ServerSettings, Settings};
use crate::facilitator::deny_list::DenyLists;
use crate::facilitator::{Facilitator, SettleError, SetupError};
use crate::router::nonces::NonceBook;
use crate::router::Router;
use crate::server::{
    self, App, ClientLimit, ConnectionLimits, Gate, Keys, KeysError, Metrics, Services,
    TrustedProxies,
};
use crate::store::{self, StoreError};

#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("{0}")]
    Setup(#[from] SetupError),
    /// A family's check before serving: e.g. a Solana node of another cluster, or none that
    /// answers `getGenesisHash`; or a configured mint that would pay the payee less.
    #[error("{0}")]
    Family(String),
    #[error("chains.{0}.rpc_urls: {1}")]
    Chain(String, String),
    #[error("storage: {0}")]
    Store(#[from] StoreError),
    #[error("resuming settlements: {0}")]
    Recover(#[from] SettleError),
    #[error("server.listen: {0}")]
    Bind(#[from] std::io::Error),
    #[error("{0}")]
    Keys(#[from] KeysError),
}

impl StartError {
    /// Configuration problems exit 2, like a bad config file; the rest exit 1.
    pub fn exit_code(&self) -> u8 {
        match self {
            StartError::Family(_)
            | StartError::Setup(_)
            | StartError::Chain(..)
            | StartError::Keys(_) => 2,
            _ => 1,
        }
    }
}

pub async fn run(settings: Settings) -> Result<(), StartError> {
    let connections = connection_limits(&settings.server);
    let keys = load_keys(&settings)?;
    let store = store::open(&settings.storage).await?;
    let chains = connect_chains(&settings)?;
    learn_read_modes(&chains);
    let facilitator = match &settings.facilitator {
        Some(f) => Some(start_facilitator(&settings, f, &chains, &store).await?),
        None => None,
    };
    let router = start_router(&settings, &chains, &store);
    let services = Services {
        facilitator,
        router,
        chains,
    };
    let app = Arc::new(app(&settings.server, services, connections, keys));
    let deny_list = app
        .services
        .facilitator
        .as_ref()
        .map(|f| f.deny_list().clone());
    tokio::spawn(reload_on_sighup(app.keys.clone(), deny_list));
    let listeners = server::start(&settings.server, app.clone()).await?;
    log_banner(&settings, &app, &listeners, &store.describe());
    notify_systemd_ready(app.clone());

    wait_for_shutdown_signal().await;
    shut_down(&settings.server, &app, listeners, &store).await
}

/// The facilitator with its signers, checked against its clusters, its unfinished settlements
/// resumed.
async fn start_facilitator(
    settings: &Settings,
    f: &crate::config::FacilitatorSettings,
    chains: &BTreeMap<String, Arc<Chain>>,
    store: &store::Storage,
) -> Result<Arc<Facilitator>, StartError> {
    let facilitator = Facilitator::configured(settings, f, chains, store.clone())?;
    facilitator.check().await.map_err(StartError::Family)?;
    let resumed = facilitator.start().await?;
    if resumed > 0 {
        tracing::info!(resumed, "resumed unfinished settlements");
    }
    Ok(Arc::new(facilitator))
}

/// The router, when configured, with its background pruning started.
fn start_router(
    settings: &Settings,
    chains: &BTreeMap<String, Arc<Chain>>,
    store: &store::Storage,
) -> Option<Arc<Router>> {
    let router = settings.router.as_ref().map(|r| {
        let candidates = r.chains.iter().map(|name| chains[name].clone()).collect();
        Arc::new(Router::new(
            r,
            candidates,
            NonceBook::new(
                store.clone(),
                r.nonce_reservation_ttl_secs,
                r.max_reservations_ahead,
            ),
            store.clone(),
        ))
    });
    if let Some(router) = &router {
        tokio::spawn(router.relay().clone().forget_periodically());
        tokio::spawn(router.nonces().clone().prune_periodically());
    }
    router
}

/// The state every request shares: the services and the server's bounds.
fn app(
    server: &ServerSettings,
    services: Services,
    connections: ConnectionLimits,
    keys: Option<Arc<Keys>>,
) -> App {
    let mut metrics = Metrics::new();
    if let Some(facilitator) = &services.facilitator {
        metrics.register_facilitator(facilitator);
    }
    App {
        services,
        metrics,
        max_body_bytes: server.max_body_bytes,
        max_relay_answer_bytes: server.max_relay_answer_bytes as usize,
        read_timeout: Duration::from_millis(server.request_read_timeout_ms),
        client_limit: ClientLimit::new(server.client_rate_per_sec, server.client_burst)
            .filter(|_| keys.is_none()),
        proxies: TrustedProxies::new(server.trusted_proxies.clone()),
        connections: Gate::new(connections),
        keys,
    }
}

/// Stops taking connections, waits the grace period for requests in flight, hands the lanes
/// back and flushes the store.
async fn shut_down(
    server: &ServerSettings,
    app: &App,
    listeners: Vec<server::Listener>,
    store: &store::Storage,
) -> Result<(), StartError> {
    tracing::info!("shutting down: no new connections; waiting for requests in flight");
    let _ = sd_notify::notify(false, &[sd_notify::NotifyState::Stopping]);
    let grace = Duration::from_secs(server.shutdown_grace_secs);
    let drained = tokio::time::timeout(grace, async {
        for listener in listeners {
            let _ = listener.handle.stop();
            listener.handle.stopped().await;
        }
    })
    .await;
    if drained.is_err() {
        tracing::warn!("grace period over with requests in flight; their settlements are stored and resume on start");
    }
    if let Some(facilitator) = &app.services.facilitator {
        facilitator.stop().await;
    }
    store.flush().await?;
    tracing::info!("stopped");
    Ok(())
}

/// The chains the router or the facilitator use; others in the file are ignored.
fn connect_chains(settings: &Settings) -> Result<BTreeMap<String, Arc<Chain>>, StartError> {
    let mut used: Vec<&String> = Vec::new();
    if let Some(r) = &settings.router {
        used.extend(&r.chains);
    }
    if let Some(f) = &settings.facilitator {
        used.extend(f.evm_networks());
    }
    let mut chains = BTreeMap::new();
    for name in used {
        if chains.contains_key(name) {
            continue;
        }
        let chain = Chain::new(name, &settings.chains[name])
            .map_err(|e| StartError::Chain(name.clone(), e))?;
        chains.insert(name.clone(), chain);
    }
    Ok(chains)
}

/// Probes each chain for state overrides in the background, so a slow chain does not hold the
/// start back; a verify that comes first probes for itself. Each probe logs the mode it found.
fn learn_read_modes(chains: &BTreeMap<String, Arc<Chain>>) {
    for chain in chains.values() {
        let chain = chain.clone();
        tokio::spawn(async move {
            if let Err(e) = chain.learn_read_mode().await {
                tracing::warn!(chain = %chain.name, error = %e, "verify read mode not known yet: chain unreachable");
            }
        });
    }
}

fn log_banner(settings: &Settings, app: &App, listeners: &[server::Listener], store: &str) {
    let addresses: Vec<String> = listeners.iter().map(|l| l.address.to_string()).collect();
    let networks: Vec<&str> = settings
        .facilitator
        .iter()
        .flat_map(|f| f.networks.iter().map(String::as_str))
        .collect();
    let router_chains: Vec<&str> = settings
        .router
        .iter()
        .flat_map(|r| r.chains.iter().map(String::as_str))
        .collect();
    let signers: Vec<String> = app
        .services
        .facilitator
        .iter()
        .flat_map(|f| f.senders())
        .collect();
    let authorizer = app
        .services
        .facilitator
        .as_ref()
        .and_then(|f| f.receiver_authorizer())
        .map(|a| format!("{:?}", a.address()))
        .unwrap_or_default();
    tracing::info!(
        version = env!("CARGO_PKG_VERSION"),
        listen = %addresses.join(","),
        networks = %networks.join(","),
        router_chains = %router_chains.join(","),
        signers = %signers.join(","),
        receiver_authorizer = %authorizer,
        store = %store,
        "routerd listening"
    );
}

/// The public listeners' connection bounds (access.md §3b). The soft open-file limit is raised
/// to the hard one first: a shell's soft default of 1,024 is far below what a busy listener
/// needs, and the bounds are derived from what the process really has.
fn connection_limits(settings: &ServerSettings) -> ConnectionLimits {
    let open_files = rlimit::increase_nofile_limit(u64::MAX).unwrap_or_else(|e| {
        tracing::warn!(error = %e, "could not read or raise the open-file limit; assuming 1024");
        1024
    });
    let limits = ConnectionLimits::for_open_files(
        open_files,
        settings.max_open_connections,
        settings.max_connections_per_client,
    );
    tracing::info!(
        open_files,
        max_open_connections = limits.total,
        max_connections_per_client = limits.per_client,
        "connection bounds"
    );
    limits
}

/// READY=1 once listening, and watchdog pings at half the interval systemd asks for, only while
/// no background loop's last step panicked: one that keeps panicking gets routerd restarted,
/// and the restart resumes from the store.
fn notify_systemd_ready(app: Arc<App>) {
    let _ = sd_notify::notify(false, &[sd_notify::NotifyState::Ready]);
    let mut usec = 0;
    if sd_notify::watchdog_enabled(false, &mut usec) && usec > 0 {
        let period = Duration::from_micros(usec / 2);
        tokio::spawn(async move {
            let mut ticker = tokio::time::interval(period);
            loop {
                ticker.tick().await;
                if server::guards_down(&app.services).is_empty() {
                    let _ = sd_notify::notify(false, &[sd_notify::NotifyState::Watchdog]);
                }
            }
        });
    }
}

/// The API keys, when a keys file is configured; a bad file stops the start.
fn load_keys(settings: &Settings) -> Result<Option<Arc<Keys>>, StartError> {
    let Some(path) = &settings.auth.api_keys_file else {
        return Ok(None);
    };
    let keys = Keys::load(path)?;
    tracing::info!(
        keys = keys.count(),
        "API keys loaded: every route but /supported and /health needs one"
    );
    Ok(Some(Arc::new(keys)))
}

/// SIGHUP reads the API keys file and the deny list file again; a bad file keeps what is in
/// use. Without either it is only logged (SIGHUP's default would end the process).
async fn reload_on_sighup(keys: Option<Arc<Keys>>, deny_list: Option<Arc<DenyLists>>) {
    use tokio::signal::unix::{signal, SignalKind};
    let Ok(mut hup) = signal(SignalKind::hangup()) else {
        tracing::error!(
            "cannot install a SIGHUP handler: API keys and the deny list are not reloaded"
        );
        return;
    };
    let deny_list = deny_list.filter(|d| d.configured());
    while hup.recv().await.is_some() {
        if keys.is_none() && deny_list.is_none() {
            tracing::info!(
                "SIGHUP: no auth.api_keys_file nor facilitator.deny_list_file, nothing to reload"
            );
        }
        if let Some(keys) = &keys {
            match keys.reload() {
                Ok(count) => tracing::info!(keys = count, "API keys reloaded"),
                Err(e) => {
                    tracing::error!(error = %e, "API keys not reloaded; the previous keys stay")
                }
            }
        }
        if let Some(deny_list) = &deny_list {
            reload_deny_list(deny_list.clone()).await;
        }
    }
}

/// Off the runtime's threads: the published SDN XML is about 100 MB.
async fn reload_deny_list(deny_list: Arc<DenyLists>) {
    match tokio::task::spawn_blocking(move || deny_list.reload()).await {
        Ok(Ok(summary)) => tracing::info!("facilitator.deny_list_file reloaded: {summary}"),
        Ok(Err(e)) => {
            tracing::error!("facilitator.deny_list_file not reloaded; the previous list stays: {e}")
        }
        Err(e) => {
            tracing::error!(error = %e, "facilitator.deny_list_file reload stopped; the previous list stays")
        }
    }
}

async fn wait_for_shutdown_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate()).expect("installing a SIGTERM handler");
    tokio::select! {
        _ = term.recv() => {}
        _ = tokio::signal::ctrl_c() => {}
    }
}
