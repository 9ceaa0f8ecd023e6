//! The typed settings: every key of the TOML files, with its serde attributes and its default.
//! What a value may be is checked in `validate`; where a value may come from, in `env`.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;

use ethers_core::types::U256;
use serde::{Deserialize, Serialize};

use super::batch::BatchContracts;
use super::redacted::{Endpoint, Secret};
use super::resolve::Provenance;
use super::solana::SolanaChainSettings;
use super::telemetry::TelemetrySettings;

/// The deepest `finality_depth`: the head watcher keeps this many canonical block hashes.
pub const KEPT_BLOCKS: u64 = 256;

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Settings {
    #[serde(default)]
    pub server: ServerSettings,
    #[serde(default)]
    pub storage: StorageSettings,
    #[serde(default)]
    pub chains: BTreeMap<String, ChainSettings>,
    /// The Solana clusters among `[chains.*]`, taken out by `resolve` (their keys are not an
    /// EVM chain's) and shown under `chains` by `render`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub solana_chains: BTreeMap<String, SolanaChainSettings>,
    pub router: Option<RouterSettings>,
    pub facilitator: Option<FacilitatorSettings>,
    #[serde(default)]
    pub auth: AuthSettings,
    /// OpenTelemetry traces: off unless an endpoint is configured.
    #[serde(default)]
    pub telemetry: TelemetrySettings,
    /// Which chains are known networks, and where their preset values came from.
    #[serde(skip)]
    pub(super) provenance: Provenance,
}

/// Who may call routerd (access.md §5): without a keys file, anyone who reaches it.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct AuthSettings {
    /// The API keys file; also `$CREDENTIALS_DIRECTORY/api-keys` under systemd.
    pub api_keys_file: Option<PathBuf>,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct ServerSettings {
    pub listen: SocketAddr,
    pub facilitator_listen: Option<SocketAddr>,
    /// When set, `/metrics` and `/ready` are served here only (access.md §4).
    pub ops_listen: Option<SocketAddr>,
    pub max_body_bytes: u32,
    pub shutdown_grace_secs: u64,
    pub max_connections: u32,
    /// Bound on receiving a request's headers (also while a keep-alive connection waits for
    /// its next request) and, separately, its body (access.md §7).
    pub request_read_timeout_ms: u64,
    /// A keep-alive connection with no request in flight is closed after this (access.md §7).
    pub idle_timeout_secs: u64,
    /// Without API keys: a token bucket per client address (unset: no limit).
    pub client_rate_per_sec: Option<u32>,
    pub client_burst: Option<u32>,
    /// Reverse proxies (CIDRs) whose `X-Forwarded-For` / `Forwarded` name the client; none by
    /// default, and no other peer's forwarding headers are believed (access.md §3b).
    pub trusted_proxies: Vec<ipnet::IpNet>,
    /// Connections the public listeners hold together; unset: the open-file limit (raised to
    /// its hard limit at start) less a reserve for the store, upstreams and the ops listener.
    pub max_open_connections: Option<usize>,
    /// Connections one client address holds (a trusted proxy's are bounded by the total only);
    /// unset: 4,096 (a busy resource server behind one address opens more sockets than its
    /// requests in flight), or the total when smaller.
    pub max_connections_per_client: Option<usize>,
    /// Threads of the async runtime; unset: [`ServerSettings::default_worker_threads`].
    pub worker_threads: Option<usize>,
    /// Bytes one relayed answer (every entry of a batch together) may take from the nodes;
    /// beyond it the relay answers a JSON-RPC error and reads no further (access.md §3c).
    pub max_relay_answer_bytes: u32,
}

impl ServerSettings {
    /// Half the host's cores (a node usually runs on the same host), but two where it has two:
    /// one thread leaves a core idle whenever the node answers faster than routerd works.
    pub fn default_worker_threads() -> usize {
        let cores = std::thread::available_parallelism().unwrap_or(std::num::NonZeroUsize::MIN);
        Self::worker_threads_for(cores)
    }

    /// The default for a host of `cores`. Measured on 2 cores beside anvil, under wrk at
    /// concurrency 64: with one thread the host was 23 to 24 % idle and verify answered 3,760
    /// to 4,200 a second; with two, 7 % idle and 4,850 to 4,970, with settlements per block and
    /// block-to-answer unchanged.
    pub(super) fn worker_threads_for(cores: std::num::NonZeroUsize) -> usize {
        (cores.get() / 2).max(2).min(cores.get())
    }

    pub fn worker_threads(&self) -> usize {
        self.worker_threads
            .unwrap_or_else(Self::default_worker_threads)
    }
}

impl Default for ServerSettings {
    fn default() -> Self {
        Self {
            listen: "127.0.0.1:8080".parse().expect("static address"),
            facilitator_listen: None,
            ops_listen: None,
            max_body_bytes: 65536,
            shutdown_grace_secs: 30,
            max_connections: 1024,
            request_read_timeout_ms: 10_000,
            idle_timeout_secs: 60,
            client_rate_per_sec: None,
            client_burst: None,
            trusted_proxies: Vec::new(),
            max_open_connections: None,
            max_connections_per_client: None,
            worker_threads: None,
            max_relay_answer_bytes: 4 * 1024 * 1024,
        }
    }
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct StorageSettings {
    pub backend: StorageBackend,
    /// The sled directory (backend "sled").
    pub path: PathBuf,
    /// The database (backend "postgres"); also `$CREDENTIALS_DIRECTORY/postgres-url`.
    pub postgres_url: Option<Secret>,
    /// How long a signer lane stays with an instance that stopped renewing its lease.
    pub lease_ttl_secs: u64,
    /// This instance's name in lane leases.
    pub instance_id: String,
}

impl Default for StorageSettings {
    fn default() -> Self {
        let path = match std::env::var_os("STATE_DIRECTORY") {
            Some(dir) => PathBuf::from(dir).join("routerd.db"),
            None => PathBuf::from("data/routerd.db"),
        };
        Self {
            backend: StorageBackend::Sled,
            path,
            postgres_url: None,
            lease_ttl_secs: 10,
            instance_id: default_instance_id(),
        }
    }
}

/// Host name plus process id: unique among the instances of one deployment.
fn default_instance_id() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_else(|_| "routerd".to_string());
    format!("{host}-{}", std::process::id())
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum StorageBackend {
    /// Embedded, one instance.
    #[default]
    Sled,
    /// Shared by several instances.
    Postgres,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ChainKind {
    L1,
    L2,
    L3,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum FeeModel {
    /// EIP-1559 when the latest block carries `baseFeePerGas`, legacy otherwise.
    #[default]
    Auto,
    Eip1559,
    Legacy,
    /// EIP-1559 execution fees plus the L1 data fee of the `GasPriceOracle` predeploy.
    OpStack,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ChainSettings {
    pub chain_id: u64,
    pub kind: ChainKind,
    pub rpc_urls: Vec<Endpoint>,
    #[serde(default = "default_native_price")]
    pub native_price: f64,
    #[serde(default)]
    pub fee_model: FeeModel,
    #[serde(default = "default_valid_before_margin")]
    pub valid_before_margin_secs: u64,
    /// Cap on what the facilitator pays per gas on this network, in wei (decimal string). A
    /// known network has a preset one; without either, one is derived at start from the chain's
    /// recent blocks (access.md §2).
    pub max_fee_per_gas: Option<String>,
    /// Whether `max_fee_per_gas` is the preset's (no file or environment set it): set from the
    /// provenance after loading, never read from a file.
    #[serde(skip)]
    pub max_fee_per_gas_is_preset: bool,
    /// Cap on what one settlement transaction may cost (gas limit x price), in wei.
    pub max_settlement_cost_wei: Option<String>,
    /// Blocks deep a settlement must be before settle answers success (1 = the including block).
    #[serde(default = "default_confirmations")]
    pub confirmations: u64,
    /// Blocks past inclusion a settlement is followed for reorganisations.
    #[serde(default = "default_finality_depth")]
    pub finality_depth: u64,
    /// WebSocket URLs for an `eth_subscribe("newHeads")` subscription: a new block is known the
    /// moment the node announces it (polling goes on as a fallback).
    #[serde(default)]
    pub ws_urls: Vec<Endpoint>,
    /// How often the head block is polled; receipts and fee data follow this cadence.
    #[serde(default = "default_poll_interval")]
    pub poll_interval_ms: u64,
    /// Bound on one upstream request to this chain.
    #[serde(default = "default_request_timeout")]
    pub request_timeout_ms: u64,
    /// Upstream requests in flight at once per RPC URL; more wait their turn instead of piling
    /// onto a saturated node (the wait does not count against `request_timeout_ms`).
    #[serde(default = "default_max_concurrent_requests")]
    pub max_concurrent_requests: usize,
    /// Callers' reads in flight on this chain, per kind (verify, settle, router): over it a
    /// caller is answered 503 at once (access.md §3b).
    #[serde(default = "default_max_caller_reads")]
    pub max_caller_reads: usize,
    /// Most calls routerd puts in one HTTP request when it sends small batches together (a
    /// provider that refuses larger batches needs its limit here; 1 sends each on its own).
    #[serde(default = "default_max_batch_calls")]
    pub max_batch_calls: usize,
    /// The most gas one settlement may take (calldata floor included); a payment that needs
    /// more is refused before anything is sent (access.md §2).
    #[serde(default = "default_max_settlement_gas")]
    pub max_settlement_gas: u64,
    /// The most gas a caller's `eth_call` or `eth_estimateGas` may ask at this chain's relay
    /// endpoint (access.md §3c).
    #[serde(default = "default_max_call_gas")]
    pub max_call_gas: u64,
    #[serde(default)]
    pub tokens: BTreeMap<String, TokenSettings>,
    /// The `batch-settlement` scheme's contracts on this chain (presets: their CREATE2
    /// addresses, the same on every chain).
    #[serde(default)]
    pub contracts: BatchContracts,
}

impl ChainSettings {
    pub fn max_fee_cap(&self) -> Option<U256> {
        self.max_fee_per_gas
            .as_deref()
            .and_then(|s| U256::from_dec_str(s).ok())
    }

    /// Whether the operator set a fee cap (a preset's `max_fee_per_gas` is not one).
    pub fn operator_fee_caps(&self) -> bool {
        let fee = self.max_fee_per_gas.is_some() && !self.max_fee_per_gas_is_preset;
        fee || self.max_settlement_cost_wei.is_some()
    }

    pub fn max_settlement_cost(&self) -> Option<U256> {
        self.max_settlement_cost_wei
            .as_deref()
            .and_then(|s| U256::from_dec_str(s).ok())
    }
}

fn default_max_settlement_gas() -> u64 {
    300_000
}
fn default_max_call_gas() -> u64 {
    30_000_000
}

fn default_max_concurrent_requests() -> usize {
    64
}
/// Room for a burst of a thousand honest settles arriving at once (each holds its place only
/// while its checks read the chain), while a flood still meets a bound.
pub(super) fn default_max_caller_reads() -> usize {
    1024
}
fn default_max_batch_calls() -> usize {
    64
}
fn default_confirmations() -> u64 {
    1
}
fn default_finality_depth() -> u64 {
    64
}
fn default_native_price() -> f64 {
    1.0
}
fn default_valid_before_margin() -> u64 {
    6
}
fn default_poll_interval() -> u64 {
    100
}
fn default_request_timeout() -> u64 {
    5000
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct TokenSettings {
    pub address: String,
    pub eip712_name: String,
    pub eip712_version: String,
    /// How payers may pay with it: ERC-3009 (`transferWithAuthorization`, the token's own) and
    /// Permit2 (any ERC-20, through x402's proxy). Default: ERC-3009 only.
    #[serde(default = "default_transfer_methods")]
    pub transfer_methods: Vec<TransferMethod>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum TransferMethod {
    Eip3009,
    Permit2,
}

fn default_transfer_methods() -> Vec<TransferMethod> {
    vec![TransferMethod::Eip3009]
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RouterSettings {
    pub chains: Vec<String>,
    #[serde(default = "default_prefer")]
    pub prefer: Vec<ChainKind>,
    #[serde(default = "default_chain_timeout")]
    pub chain_timeout_ms: u64,
    #[serde(default = "default_nonce_ttl")]
    pub nonce_reservation_ttl_secs: u64,
    /// How far one caller's reservations may run ahead of a sender's pending nonce.
    #[serde(default = "default_max_reservations_ahead")]
    pub max_reservations_ahead: u64,
    /// Fraction added on top of `eth_estimateGas` (0.2 = +20%).
    #[serde(default = "default_gas_headroom")]
    pub gas_headroom: f64,
    /// How long the chain of a transaction sent through routerd is remembered, so that its
    /// receipt is asked there.
    #[serde(default = "default_sent_retention")]
    pub sent_retention_secs: u64,
    /// Most transactions remembered as sent through routerd; beyond it the oldest are forgotten
    /// first (access.md §3c).
    #[serde(default = "default_max_sent_remembered")]
    pub max_sent_remembered: usize,
}

fn default_prefer() -> Vec<ChainKind> {
    vec![ChainKind::L2, ChainKind::L1, ChainKind::L3]
}
fn default_chain_timeout() -> u64 {
    1500
}
fn default_max_reservations_ahead() -> u64 {
    16
}
fn default_nonce_ttl() -> u64 {
    120
}
fn default_gas_headroom() -> f64 {
    0.2
}
fn default_sent_retention() -> u64 {
    7 * 24 * 3600
}
fn default_max_sent_remembered() -> usize {
    100_000
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct FacilitatorSettings {
    pub networks: Vec<String>,
    #[serde(default)]
    pub signer_key_file: String,
    /// Solana fee payer keys (solana-keygen's JSON): one file or a list, one key each; empty,
    /// `$CREDENTIALS_DIRECTORY/svm-fee-payer` under systemd. Needed only with a Solana network.
    #[serde(default, deserialize_with = "one_or_many")]
    pub svm_fee_payer_key_file: Vec<String>,
    #[serde(default)]
    pub deny_list_file: String,
    #[serde(default = "default_settle_timeout")]
    pub settle_timeout_secs: u64,
    #[serde(default = "default_max_batch")]
    pub max_batch: usize,
    /// Finished settlement records are pruned after this many days.
    #[serde(default = "default_retention_days")]
    pub retention_days: u64,
    /// Blocks a settlement may stay unmined before it is re-sent with bumped fees.
    #[serde(default = "default_bump_after_blocks")]
    pub bump_after_blocks: u64,
    /// The x402 protocol versions served on the facilitator routes; a body's `x402Version`
    /// picks its wire format.
    #[serde(default = "default_x402_versions")]
    pub x402_versions: Vec<u32>,
    /// Accept `http://` resources (the spec asks for `https://`): for local development and
    /// resource servers behind a TLS-terminating proxy, whose middleware states its own URL.
    #[serde(default)]
    pub allow_http_resource: bool,
    /// Longer payment signatures answer `invalid_payload` (access.md §2).
    #[serde(default = "default_max_signature_bytes")]
    pub max_signature_bytes: usize,
    /// How long a payer whose settlement reverted on chain is refused (access.md §2).
    #[serde(default = "default_revert_cooldown")]
    pub revert_cooldown_secs: u64,
    /// The factories a settlement may call to deploy a payer's smart wallet (ERC-6492). Empty,
    /// as in the official packages: a wallet not yet deployed is refused.
    #[serde(default)]
    pub erc6492_factories: Vec<String>,
    /// The discovery catalogue (x402 v2 `bazaar`): resources whose settled payments declared
    /// themselves, served at `/discovery/resources` and `/discovery/search`. Only with v2 served.
    #[serde(default = "default_discovery")]
    pub discovery: bool,
    /// A listing not settled again for this long is no longer listed.
    #[serde(default = "default_discovery_ttl")]
    pub discovery_ttl_secs: u64,
    /// Most listings kept; beyond it the least recently settled is evicted.
    #[serde(default = "default_discovery_max_entries")]
    pub discovery_max_entries: usize,
    /// Most bytes of one listing as stored (its JSON: requirements, metadata, the extension's
    /// info and schema); a larger declaration is not catalogued.
    #[serde(default = "default_discovery_max_entry_bytes")]
    pub discovery_max_entry_bytes: usize,
    /// Serve x402 v2's `batch-settlement` scheme on the served EVM networks (spec:
    /// batch-settlement.md); its contracts must have code on each at start.
    #[serde(default)]
    pub batch_settlement: bool,
    /// The file of the key that signs `batch-settlement` claim and refund authorizations (one
    /// 0x-hex private key); empty: none. It never signs a transaction and is no signer.
    #[serde(default)]
    pub receiver_authorizer_key_file: String,
    /// Most calls one `batch-settlement` transaction packs into the contract's `multicall`.
    #[serde(default = "default_batch_max_calls_per_tx")]
    pub batch_max_calls_per_tx: usize,
}

fn default_batch_max_calls_per_tx() -> usize {
    100
}

fn default_discovery() -> bool {
    true
}
fn default_discovery_ttl() -> u64 {
    7 * 24 * 3600
}
fn default_discovery_max_entries() -> usize {
    1000
}
fn default_discovery_max_entry_bytes() -> usize {
    16 * 1024
}

fn default_max_signature_bytes() -> usize {
    2048
}
fn default_revert_cooldown() -> u64 {
    3600
}

impl FacilitatorSettings {
    pub fn serves_version(&self, version: u32) -> bool {
        self.x402_versions.contains(&version)
    }

    /// The served Solana networks, by their v1 names (the keys of `Settings::solana_chains`),
    /// however `networks` spells them.
    pub fn solana_networks(&self) -> Vec<&'static str> {
        self.networks
            .iter()
            .filter_map(|name| super::solana::find(name))
            .map(|preset| preset.name)
            .collect()
    }

    /// The served EVM networks: every network that is not a Solana one.
    pub fn evm_networks(&self) -> impl Iterator<Item = &String> {
        self.networks
            .iter()
            .filter(|name| super::solana::find(name).is_none())
    }
}

/// A key that takes one string or a list of them.
fn one_or_many<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<String>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum OneOrMany {
        One(String),
        Many(Vec<String>),
    }
    Ok(match OneOrMany::deserialize(d)? {
        OneOrMany::One(one) if one.is_empty() => Vec::new(),
        OneOrMany::One(one) => vec![one],
        OneOrMany::Many(many) => many,
    })
}

fn default_x402_versions() -> Vec<u32> {
    vec![1]
}

fn default_retention_days() -> u64 {
    30
}
fn default_settle_timeout() -> u64 {
    60
}
fn default_max_batch() -> usize {
    100
}
fn default_bump_after_blocks() -> u64 {
    3
}
