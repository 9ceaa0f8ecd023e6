//! Operator endpoints: /health, /ready, /metrics, and the metrics the transport records.

use std::sync::Arc;
use std::time::Duration;

use ethers_core::types::U256;
use http::StatusCode;
use jsonrpsee::server::HttpResponse;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;
use serde_json::{json, Value};

use super::wire_errors::{json_response, text_response};
use super::App;
use crate::chain::{self, Call, Chain};
use crate::evm;
use crate::facilitator::settlement::lane::SETTLEMENT_GAS;
use crate::guard::Guard;

/// How long a reachability probe of /ready or /metrics may take per chain.
const PROBE_TIMEOUT: Duration = Duration::from_secs(2);

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RequestLabels {
    route: &'static str,
    status: u16,
    /// The API key's name; empty without keys.
    key: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RouteLabel {
    route: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabel {
    outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct UpstreamLabels {
    chain: String,
    /// `<chain>#<index>`: a provider's URL carries its API key.
    upstream: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct SignerLabels {
    network: String,
    signer: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ChainLabel {
    chain: String,
}

pub struct Metrics {
    registry: Registry,
    requests: Family<RequestLabels, Counter>,
    latency: Family<RouteLabel, Histogram>,
    settlements: Family<OutcomeLabel, Counter>,
    decisions: Family<ChainLabel, Counter>,
    upstream_requests: Family<UpstreamLabels, Counter>,
    upstream_errors: Family<UpstreamLabels, Counter>,
    pending_settlements: Gauge,
    lost_settlements: Counter,
    revert_cooldowns: Counter,
    signer_balance: Family<SignerLabels, Gauge<f64, std::sync::atomic::AtomicU64>>,
    signer_nonce: Family<SignerLabels, Gauge>,
    chain_head: Family<ChainLabel, Gauge>,
}

impl Metrics {
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("routerd");
        let requests = Family::<RequestLabels, Counter>::default();
        let latency = Family::<RouteLabel, Histogram>::new_with_constructor(|| {
            Histogram::new(exponential_buckets(0.0005, 2.0, 16))
        });
        let settlements = Family::<OutcomeLabel, Counter>::default();
        let decisions = Family::<ChainLabel, Counter>::default();
        let upstream_requests = Family::<UpstreamLabels, Counter>::default();
        let upstream_errors = Family::<UpstreamLabels, Counter>::default();
        let pending_settlements = Gauge::default();
        let lost_settlements = Counter::default();
        let revert_cooldowns = Counter::default();
        let signer_balance = Family::default();
        let signer_nonce = Family::default();
        let chain_head = Family::default();
        registry.register(
            "http_requests",
            "HTTP requests by route, status and API key name",
            requests.clone(),
        );
        registry.register(
            "http_request_duration_seconds",
            "Request latency by route",
            latency.clone(),
        );
        registry.register(
            "settlements",
            "Settle answers by outcome",
            settlements.clone(),
        );
        registry.register(
            "router_decisions",
            "Routed transactions by chosen chain",
            decisions.clone(),
        );
        registry.register(
            "upstream_requests",
            "Upstream HTTP requests (each one JSON-RPC batch, which may carry the calls of several callers) by chain and upstream (<chain>#<index> in rpc_urls)",
            upstream_requests.clone(),
        );
        registry.register(
            "upstream_errors",
            "Failed upstream requests by chain and upstream (<chain>#<index> in rpc_urls)",
            upstream_errors.clone(),
        );
        registry.register(
            "pending_settlements",
            "Settlements under way and not yet answered",
            pending_settlements.clone(),
        );
        registry.register(
            "settlements_lost",
            "Settlements answered as successful whose transaction can no longer land",
            lost_settlements.clone(),
        );
        registry.register(
            "payer_revert_cooldowns",
            "Payers refused for facilitator.revert_cooldown_secs because a settlement of theirs reverted on chain",
            revert_cooldowns.clone(),
        );
        registry.register(
            "signer_balance_wei",
            "Native balance of each signer",
            signer_balance.clone(),
        );
        registry.register(
            "signer_nonce",
            "Pending nonce of each signer",
            signer_nonce.clone(),
        );
        registry.register(
            "chain_head_block",
            "Latest block seen per chain",
            chain_head.clone(),
        );
        Self {
            registry,
            requests,
            latency,
            settlements,
            decisions,
            upstream_requests,
            upstream_errors,
            pending_settlements,
            lost_settlements,
            revert_cooldowns,
            signer_balance,
            signer_nonce,
            chain_head,
        }
    }

    pub fn observe_request(&self, route: &'static str, status: u16, key: &str, elapsed: Duration) {
        let key = key.to_string();
        self.requests
            .get_or_create(&RequestLabels { route, status, key })
            .inc();
        self.latency
            .get_or_create(&RouteLabel { route })
            .observe(elapsed.as_secs_f64());
    }

    pub fn observe_settlement(&self, outcome: &'static str) {
        self.settlements
            .get_or_create(&OutcomeLabel { outcome })
            .inc();
    }

    pub fn observe_decision(&self, chain: &str) {
        self.decisions
            .get_or_create(&ChainLabel {
                chain: chain.to_string(),
            })
            .inc();
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

/// Routes as metric labels: a fixed set, so a scan of random paths cannot grow the registry.
pub fn route_label(path: &str) -> &'static str {
    match path {
        "/" => "/",
        "/quote" => "/quote",
        "/supported" => "/supported",
        "/verify" => "/verify",
        "/settle" => "/settle",
        "/health" => "/health",
        "/ready" => "/ready",
        "/metrics" => "/metrics",
        p if p.starts_with("/settlements/") => "/settlements",
        _ => "other",
    }
}

pub fn health() -> HttpResponse {
    json_response(StatusCode::OK, &json!({"status": "ok"}))
}

/// 200 when every chain answered recently and every signer can pay for a settlement; otherwise
/// 503 naming each problem.
pub async fn ready(app: &App) -> HttpResponse {
    let mut problems = Vec::new();
    for chain in app.chains.values() {
        let fresh = Duration::from_millis(
            chain.settings.poll_interval_ms * 5 + chain.settings.request_timeout_ms,
        );
        match chain.client.since_last_success() {
            Some(age) if age <= fresh => {}
            Some(age) => problems.push(json!({"chain": chain.name, "problem": format!("no answer for {}s", age.as_secs())})),
            None => problems.push(json!({"chain": chain.name, "problem": "never answered"})),
        }
    }
    for guard in guards_down(app) {
        problems.push(json!({"task": guard.what(), "problem": format!("its last step panicked ({} so far); it runs again at the next", guard.panics())}));
    }
    for signer in signer_states(app).await {
        match signer.balance {
            Some(balance) if balance >= signer.needed => {}
            Some(balance) => problems.push(json!({
                "signer": signer.address, "network": signer.network,
                "problem": format!("balance {balance} wei is below {} wei needed for one settlement", signer.needed),
            })),
            None => problems.push(json!({"signer": signer.address, "network": signer.network, "problem": "balance unknown: chain unreachable"})),
        }
    }
    // Not a readiness condition: batch mode is slower, not wrong. Shown so operators see it.
    let read_modes: serde_json::Map<String, Value> = app
        .chains
        .values()
        .map(|c| (c.name.clone(), json!(c.read_mode().as_str())))
        .collect();
    if problems.is_empty() {
        json_response(
            StatusCode::OK,
            &json!({"ready": true, "readModes": read_modes}),
        )
    } else {
        json_response(
            StatusCode::SERVICE_UNAVAILABLE,
            &json!({"ready": false, "problems": problems, "readModes": read_modes}),
        )
    }
}

/// The background loops whose last step panicked (see `guard`).
pub fn guards_down(app: &App) -> Vec<&Guard> {
    let watchers = app.chains.values().map(|c| &*c.head.guard);
    let lanes = app
        .facilitator
        .iter()
        .flat_map(|f| f.lanes().map(|l| &l.guard));
    watchers.chain(lanes).filter(|g| g.is_down()).collect()
}

pub async fn metrics(app: &App) -> HttpResponse {
    let m = &app.metrics;
    for chain in app.chains.values() {
        for stats in chain.client.stats() {
            let labels = UpstreamLabels {
                chain: chain.name.clone(),
                upstream: stats.upstream,
            };
            m.upstream_requests
                .get_or_create(&labels)
                .inner()
                .store(stats.requests, std::sync::atomic::Ordering::Relaxed);
            m.upstream_errors
                .get_or_create(&labels)
                .inner()
                .store(stats.errors, std::sync::atomic::Ordering::Relaxed);
        }
        if let Some(head) = chain.head.current() {
            m.chain_head
                .get_or_create(&ChainLabel {
                    chain: chain.name.clone(),
                })
                .set(head.number as i64);
        }
    }
    if let Some(facilitator) = &app.facilitator {
        m.pending_settlements
            .set(facilitator.pending_settlements() as i64);
        m.lost_settlements.inner().store(
            facilitator.lost_settlements(),
            std::sync::atomic::Ordering::Relaxed,
        );
        m.revert_cooldowns.inner().store(
            facilitator.revert_cooldowns(),
            std::sync::atomic::Ordering::Relaxed,
        );
    }
    for signer in signer_states(app).await {
        let labels = SignerLabels {
            network: signer.network,
            signer: signer.address,
        };
        if let Some(balance) = signer.balance {
            m.signer_balance
                .get_or_create(&labels)
                .set(u256_to_f64(balance));
        }
        if let Some(nonce) = signer.nonce {
            m.signer_nonce.get_or_create(&labels).set(nonce as i64);
        }
    }
    let mut body = String::new();
    prometheus_client::encoding::text::encode(&mut body, &m.registry).expect("writing to a String");
    text_response(
        StatusCode::OK,
        "application/openmetrics-text; version=1.0.0; charset=utf-8",
        body,
    )
}

#[derive(Debug, Clone)]
pub struct SignerState {
    pub network: String,
    pub address: String,
    pub balance: Option<U256>,
    pub nonce: Option<u64>,
    pub needed: U256,
}

/// Balance and pending nonce of every signer, one batch per network.
pub async fn signer_states(app: &App) -> Vec<SignerState> {
    let Some(facilitator) = &app.facilitator else {
        return Vec::new();
    };
    let mut states = Vec::new();
    for chain in app.chains.values() {
        let lanes: Vec<_> = facilitator
            .lanes()
            .filter(|l| l.network() == chain.name)
            .collect();
        if lanes.is_empty() {
            continue;
        }
        let answers = probe_signers(chain, lanes.iter().map(|l| l.signer_address())).await;
        let price = chain
            .head
            .current()
            .map(|h| h.fees.max_fee_per_gas())
            .unwrap_or_default();
        for (i, lane) in lanes.iter().enumerate() {
            let pick = |j: usize| {
                answers
                    .as_ref()
                    .and_then(|a| a.get(2 * i + j))
                    .and_then(|r| r.as_ref().ok())
                    .cloned()
            };
            states.push(SignerState {
                network: chain.name.clone(),
                address: crate::evm::hex_bytes(lane.signer_address()),
                balance: pick(0).as_ref().and_then(evm::parse_quantity),
                nonce: pick(1).as_ref().and_then(evm::parse_u64),
                needed: price.saturating_mul(SETTLEMENT_GAS.into()),
            });
        }
    }
    states
}

async fn probe_signers(
    chain: &Arc<Chain>,
    signers: impl Iterator<Item = ethers_core::types::Address>,
) -> Option<Vec<chain::CallResult>> {
    let calls: Vec<Call> = signers
        .flat_map(|a| {
            let address = json!(crate::evm::hex_bytes(a));
            [
                Call::new("eth_getBalance", vec![address.clone(), json!("latest")]),
                Call::new("eth_getTransactionCount", vec![address, json!("pending")]),
            ]
        })
        .collect();
    tokio::time::timeout(PROBE_TIMEOUT, chain.client.batch(&calls))
        .await
        .ok()?
        .ok()
}

fn u256_to_f64(v: U256) -> f64 {
    v.to_string().parse().unwrap_or(f64::MAX)
}
