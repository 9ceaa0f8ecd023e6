//! Operator endpoints: /health, /ready, /metrics, and the metrics the transport records.
//!
//! Invariants: the services say how they are (`Chain::readiness`, `Facilitator::readiness`,
//! `Facilitator::signer_funds`); this module asks no chain anything itself and only words their
//! reports for the wire. Metrics are registered in one fixed order, which `/metrics` keeps.

mod health;

use std::sync::atomic::Ordering;
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
use super::{App, Services};
use crate::chain::{self, Answering, Chain, ChainClient};
use crate::facilitator::readiness::{Funds, Role};
use crate::facilitator::Facilitator;
use crate::guard::Guard;
use crate::router::served::served;

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
struct SettlementLabels {
    /// The family of the payment's network, as its mechanism names it.
    family: &'static str,
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
struct WalletCallLabels {
    /// A served method's name, or `other`: a fixed set.
    method: String,
    chain: String,
    outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ChainLabel {
    chain: String,
}

pub struct Metrics {
    registry: Registry,
    requests: Family<RequestLabels, Counter>,
    latency: Family<RouteLabel, Histogram>,
    settlements: Family<SettlementLabels, Counter>,
    decisions: Family<ChainLabel, Counter>,
    wallet_calls: Family<WalletCallLabels, Counter>,
    upstream_requests: Family<UpstreamLabels, Counter>,
    upstream_errors: Family<UpstreamLabels, Counter>,
    pending_settlements: Gauge,
    lost_settlements: Counter,
    revert_cooldowns: Counter,
    signer_balance: Family<SignerLabels, Gauge<f64, std::sync::atomic::AtomicU64>>,
    signer_nonce: Family<SignerLabels, Gauge>,
    fee_payer_balance: Family<SignerLabels, Gauge>,
    chain_head: Family<ChainLabel, Gauge>,
    health: health::Health,
}

impl Metrics {
    pub fn new() -> Self {
        let mut metrics = Self {
            registry: Registry::with_prefix("routerd"),
            requests: Family::default(),
            latency: Family::new_with_constructor(|| {
                Histogram::new(exponential_buckets(0.0005, 2.0, 16))
            }),
            settlements: Family::default(),
            decisions: Family::default(),
            wallet_calls: Family::default(),
            upstream_requests: Family::default(),
            upstream_errors: Family::default(),
            pending_settlements: Gauge::default(),
            lost_settlements: Counter::default(),
            revert_cooldowns: Counter::default(),
            signer_balance: Family::default(),
            signer_nonce: Family::default(),
            fee_payer_balance: Family::default(),
            chain_head: Family::default(),
            health: health::Health::default(),
        };
        metrics.register_answers();
        metrics.register_upstreams();
        metrics.register_settlements();
        metrics.register_signers_and_heads();
        metrics.register_health();
        metrics
    }

    fn register_answers(&mut self) {
        let r = &mut self.registry;
        r.register(
            "http_requests",
            "HTTP requests by route, status and API key name",
            self.requests.clone(),
        );
        r.register(
            "http_request_duration_seconds",
            "Request latency by route",
            self.latency.clone(),
        );
        r.register(
            "settlements",
            "Settle answers by network family (evm, svm) and outcome",
            self.settlements.clone(),
        );
        r.register(
            "router_decisions",
            "Routed transactions by chosen chain",
            self.decisions.clone(),
        );
        r.register(
            "wallet_calls",
            "Calls a wallet made through the router (eth_sendRawTransaction, the lookups, /chains/<name>) by method, chain and outcome",
            self.wallet_calls.clone(),
        );
    }

    fn register_upstreams(&mut self) {
        let r = &mut self.registry;
        r.register(
            "upstream_requests",
            "Upstream HTTP requests (each one JSON-RPC batch, which may carry the calls of several callers) by chain and upstream (<chain>#<index> in rpc_urls)",
            self.upstream_requests.clone(),
        );
        r.register(
            "upstream_errors",
            "Failed upstream requests by chain and upstream (<chain>#<index> in rpc_urls)",
            self.upstream_errors.clone(),
        );
    }

    fn register_settlements(&mut self) {
        let r = &mut self.registry;
        r.register(
            "pending_settlements",
            "Settlements under way and not yet answered",
            self.pending_settlements.clone(),
        );
        r.register(
            "settlements_lost",
            "Settlements answered as successful whose transaction can no longer land",
            self.lost_settlements.clone(),
        );
        r.register(
            "payer_revert_cooldowns",
            "Payers refused for facilitator.revert_cooldown_secs because a settlement of theirs reverted on chain",
            self.revert_cooldowns.clone(),
        );
    }

    fn register_signers_and_heads(&mut self) {
        let r = &mut self.registry;
        r.register(
            "signer_balance_wei",
            "Native balance of each signer",
            self.signer_balance.clone(),
        );
        r.register(
            "signer_nonce",
            "Pending nonce of each signer",
            self.signer_nonce.clone(),
        );
        r.register(
            "fee_payer_balance_lamports",
            "Lamports of each Solana fee payer",
            self.fee_payer_balance.clone(),
        );
        r.register(
            "chain_head_block",
            "Latest block seen per chain",
            self.chain_head.clone(),
        );
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

    pub fn observe_settlement(&self, family: &'static str, outcome: &'static str) {
        self.settlements
            .get_or_create(&SettlementLabels { family, outcome })
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

impl Metrics {
    /// One wallet call: `method` is labelled only when served (a fixed set), `chain` is a
    /// configured chain's name or `any` (a lookup over every chain).
    pub fn observe_wallet_call(&self, method: &str, chain: &str, ok: bool) {
        // Every wallet method at the router address is one a chain's endpoint serves too.
        let method = match served(method) {
            Some(_) => method.to_string(),
            None => "other".to_string(),
        };
        self.wallet_calls
            .get_or_create(&WalletCallLabels {
                method,
                chain: chain.to_string(),
                outcome: if ok { "ok" } else { "error" },
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
        p if p.starts_with("/chains/") => "/chains",
        _ => "other",
    }
}

pub fn health() -> HttpResponse {
    json_response(StatusCode::OK, &json!({"status": "ok"}))
}

/// 200 when every chain answered recently and every signer can pay for a settlement; otherwise
/// 503 naming each problem.
pub async fn ready(services: &Services) -> HttpResponse {
    let chains: Vec<(&Chain, chain::Readiness)> = services
        .chains
        .values()
        .map(|c| (&**c, c.readiness()))
        .collect();
    let facilitator = match &services.facilitator {
        Some(f) => Some(f.readiness().await),
        None => None,
    };
    let mut problems: Vec<Value> = chains
        .iter()
        .filter_map(|(chain, r)| silence_problem(chain, r.answering))
        .collect();
    let watchers = chains.iter().filter_map(|(_, r)| r.watcher_down);
    let down = facilitator.iter().flat_map(|f| f.down.iter().copied());
    problems.extend(watchers.chain(down).map(guard_problem));
    let funds = facilitator.iter().flat_map(|f| &f.funds);
    problems.extend(funds.filter_map(funding_problem));
    // Not a readiness condition: batch mode is slower, not wrong. Shown so operators see it.
    let read_modes: serde_json::Map<String, Value> = chains
        .iter()
        .map(|(c, r)| (c.name.clone(), json!(r.read_mode.as_str())))
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

fn silence_problem(chain: &Chain, answering: Answering) -> Option<Value> {
    match answering {
        Answering::Recently(_) => None,
        Answering::Silent(age) => Some(
            json!({"chain": chain.name, "problem": format!("no answer for {}s", age.as_secs())}),
        ),
        Answering::Never => Some(json!({"chain": chain.name, "problem": "never answered"})),
    }
}

fn guard_problem(guard: &Guard) -> Value {
    json!({"task": guard.what(), "problem": format!("its last step panicked ({} so far); it runs again at the next", guard.panics())})
}

/// A key that cannot pay for a settlement, named as its family spells it.
fn funding_problem(funds: &Funds) -> Option<Value> {
    let problem = funds.problem.as_ref()?;
    Some(json!({"signer": funds.key, "network": funds.network, "problem": problem}))
}

/// The background loops whose last step panicked (see `guard`): head watchers, then the
/// facilitator's (its signer lanes).
pub fn guards_down(services: &Services) -> Vec<&Guard> {
    let watchers = services.chains.values().map(|c| &*c.head.guard);
    let watchers = watchers.filter(|g| g.is_down());
    let down = services.facilitator.iter().flat_map(|f| f.down());
    watchers.chain(down).collect()
}

pub async fn metrics(app: &App) -> HttpResponse {
    let m = &app.metrics;
    for chain in app.services.chains.values() {
        m.record_chain(chain);
    }
    if let Some(facilitator) = &app.services.facilitator {
        m.record_facilitator(facilitator).await;
    }
    m.record_health(app).await;
    let mut body = String::new();
    prometheus_client::encoding::text::encode(&mut body, &m.registry).expect("writing to a String");
    text_response(
        StatusCode::OK,
        "application/openmetrics-text; version=1.0.0; charset=utf-8",
        body,
    )
}

impl Metrics {
    /// A chain's upstream counts and head, as the chain saw them.
    fn record_chain(&self, chain: &Chain) {
        self.record_upstreams(&chain.name, &chain.client);
        if let Some(head) = chain.head.current() {
            self.chain_head
                .get_or_create(&ChainLabel {
                    chain: chain.name.clone(),
                })
                .set(head.number as i64);
        }
    }

    /// The requests and errors of a chain's upstreams (an EVM chain's or a Solana cluster's).
    fn record_upstreams(&self, chain: &str, client: &ChainClient) {
        for stats in client.stats() {
            let labels = UpstreamLabels {
                chain: chain.to_string(),
                upstream: stats.upstream,
            };
            self.upstream_requests
                .get_or_create(&labels)
                .inner()
                .store(stats.requests, Ordering::Relaxed);
            self.upstream_errors
                .get_or_create(&labels)
                .inner()
                .store(stats.errors, Ordering::Relaxed);
        }
    }

    /// The facilitator's counts, its Solana clusters' upstreams, and its signers' and fee
    /// payers' funds as last read (at the head, or within a Solana slot time): a scrape asks
    /// no chain anything of its own.
    async fn record_facilitator(&self, facilitator: &Facilitator) {
        for (name, client) in facilitator.own_upstreams() {
            self.record_upstreams(name, client);
        }
        self.pending_settlements
            .set(facilitator.pending_settlements() as i64);
        self.lost_settlements
            .inner()
            .store(facilitator.lost_settlements(), Ordering::Relaxed);
        self.revert_cooldowns
            .inner()
            .store(facilitator.revert_cooldowns(), Ordering::Relaxed);
        for funds in facilitator.funds().await {
            self.record_funds(funds);
        }
    }

    /// A key's balance and nonce, under its role's metrics.
    fn record_funds(&self, funds: Funds) {
        let labels = SignerLabels {
            network: funds.network,
            signer: funds.key,
        };
        match funds.role {
            Role::Signer => {
                if let Some(balance) = funds.balance {
                    let gauge = self.signer_balance.get_or_create(&labels);
                    gauge.set(u256_to_f64(balance));
                }
                if let Some(nonce) = funds.nonce {
                    self.signer_nonce.get_or_create(&labels).set(nonce as i64);
                }
            }
            Role::FeePayer => {
                if let Some(balance) = funds.balance {
                    let balance = i64::try_from(balance).unwrap_or(i64::MAX);
                    self.fee_payer_balance.get_or_create(&labels).set(balance);
                }
            }
        }
    }
}

fn u256_to_f64(v: U256) -> f64 {
    v.to_string().parse().unwrap_or(f64::MAX)
}
