//! Typed settings: layered TOML files, `ROUTERD__SECTION__KEY` environment overrides, validation
//! that names the bad key, and a redacted rendering for `check-config`.

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use config::{Config, File, FileFormat, Map, Value, ValueKind};
use ethers_core::types::{Address, U256};
use serde::{Deserialize, Serialize};

/// The deepest `finality_depth`: the head watcher keeps this many canonical block hashes.
pub const KEPT_BLOCKS: u64 = 256;

pub const ENV_PREFIX: &str = "ROUTERD";

/// A configuration problem, always naming the key at fault.
#[derive(Debug, thiserror::Error)]
#[error("{key}: {message}")]
pub struct ConfigError {
    pub key: String,
    pub message: String,
}

impl ConfigError {
    fn new(key: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            key: key.into(),
            message: message.into(),
        }
    }
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Settings {
    #[serde(default)]
    pub server: ServerSettings,
    #[serde(default)]
    pub storage: StorageSettings,
    #[serde(default)]
    pub chains: BTreeMap<String, ChainSettings>,
    pub router: Option<RouterSettings>,
    pub facilitator: Option<FacilitatorSettings>,
    #[serde(default)]
    pub auth: AuthSettings,
}

/// Who may call routerd (access.md §5): without a keys file, anyone who reaches it.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct AuthSettings {
    /// The API keys file; also `$CREDENTIALS_DIRECTORY/api-keys` under systemd.
    pub api_keys_file: Option<PathBuf>,
}

impl AuthSettings {
    /// The credential systemd hands over (`LoadCredential=api-keys:...`), when no file is set.
    fn resolve_file(&mut self, env: &HashMap<String, String>) {
        if self.api_keys_file.is_some() {
            return;
        }
        let Some(dir) = env.get("CREDENTIALS_DIRECTORY") else {
            return;
        };
        let file = Path::new(dir).join("api-keys");
        if file.exists() {
            self.api_keys_file = Some(file);
        }
    }
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
    /// Threads of the async runtime; unset: [`ServerSettings::default_worker_threads`].
    pub worker_threads: Option<usize>,
}

impl ServerSettings {
    /// Half the host's cores, at least one. routerd mostly waits on its chains, and a node
    /// usually runs on the same host: measured on 2 cores beside anvil (`scripts/bench`), one
    /// thread answered more verifies and settlements, with less CPU each, than two.
    pub fn default_worker_threads() -> usize {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        (cores / 2).max(1)
    }

    pub fn worker_threads(&self) -> usize {
        self.worker_threads
            .unwrap_or_else(Self::default_worker_threads)
    }

    fn validate(&self) -> Result<(), ConfigError> {
        if self.request_read_timeout_ms == 0 {
            return Err(ConfigError::new(
                "server.request_read_timeout_ms",
                "must be at least 1",
            ));
        }
        if self.idle_timeout_secs == 0 {
            return Err(ConfigError::new(
                "server.idle_timeout_secs",
                "must be at least 1",
            ));
        }
        Ok(())
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
            worker_threads: None,
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

impl StorageSettings {
    /// The credential file systemd hands over (`LoadCredential=postgres-url:...`), when the URL
    /// is not in the files or the environment.
    fn resolve_url(&mut self, env: &HashMap<String, String>) -> Result<(), ConfigError> {
        if self.backend != StorageBackend::Postgres || self.postgres_url.is_some() {
            return Ok(());
        }
        let Some(dir) = env.get("CREDENTIALS_DIRECTORY") else {
            return Ok(());
        };
        let file = Path::new(dir).join("postgres-url");
        match std::fs::read_to_string(&file) {
            Ok(url) => self.postgres_url = Some(Secret(url.trim().to_string())),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => {
                return Err(ConfigError::new(
                    "storage.postgres_url",
                    format!("cannot read {}: {e}", file.display()),
                ))
            }
        }
        Ok(())
    }

    fn validate(&self) -> Result<(), ConfigError> {
        if self.backend == StorageBackend::Postgres {
            match &self.postgres_url {
                None => return Err(ConfigError::new(
                    "storage.postgres_url",
                    "required with storage.backend = \"postgres\" (or ROUTERD__STORAGE__POSTGRES_URL, or $CREDENTIALS_DIRECTORY/postgres-url)",
                )),
                Some(url) if url.0.parse::<tokio_postgres::Config>().is_err() => {
                    // The parser's message may quote the URL: it is not repeated.
                    return Err(ConfigError::new(
                        "storage.postgres_url",
                        "not a PostgreSQL connection URL (postgres://user:password@host:port/database)",
                    ));
                }
                Some(_) => {}
            }
        }
        if self.lease_ttl_secs == 0 {
            return Err(ConfigError::new(
                "storage.lease_ttl_secs",
                "must be at least 1",
            ));
        }
        if self.instance_id.trim().is_empty() {
            return Err(ConfigError::new("storage.instance_id", "must not be empty"));
        }
        Ok(())
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

/// A value never shown: `Debug` and the rendered configuration print `<redacted>`.
#[derive(Clone, Deserialize)]
#[serde(transparent)]
pub struct Secret(String);

impl Secret {
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("<redacted>")
    }
}

impl Serialize for Secret {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str("<redacted>")
    }
}

/// An RPC or WebSocket URL. Providers put API keys in the path or the query (and some in the
/// user part), so `Debug` and the rendered configuration show only the scheme and host.
#[derive(Clone, PartialEq, Eq, Deserialize)]
#[serde(transparent)]
pub struct Endpoint(String);

impl Endpoint {
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// `scheme://host[:port]`, with `/…` when more followed.
    pub fn shown(&self) -> String {
        let (scheme, rest) = self.0.split_once("://").unwrap_or(("", &self.0));
        let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
        let authority = &rest[..end];
        let host = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
        let more = if end < rest.len() { "/…" } else { "" };
        format!("{scheme}://{host}{more}")
    }
}

impl std::fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.shown())
    }
}

impl Serialize for Endpoint {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.shown())
    }
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
    /// Cap on what the facilitator pays per gas on this network, in wei (decimal string).
    pub max_fee_per_gas: Option<String>,
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
    /// Most calls routerd puts in one HTTP request when it sends small batches together (a
    /// provider that refuses larger batches needs its limit here; 1 sends each on its own).
    #[serde(default = "default_max_batch_calls")]
    pub max_batch_calls: usize,
    /// The most gas one settlement may take (calldata floor included); a payment that needs
    /// more is refused before anything is sent (access.md §2).
    #[serde(default = "default_max_settlement_gas")]
    pub max_settlement_gas: u64,
    #[serde(default)]
    pub tokens: BTreeMap<String, TokenSettings>,
}

fn default_max_settlement_gas() -> u64 {
    300_000
}

fn default_max_concurrent_requests() -> usize {
    64
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

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct FacilitatorSettings {
    pub networks: Vec<String>,
    #[serde(default)]
    pub signer_key_file: String,
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

impl Settings {
    /// Loads `paths` in order (later files win), then the environment, then validates.
    pub fn load(paths: &[PathBuf]) -> Result<Self, ConfigError> {
        let env: HashMap<String, String> = std::env::vars().collect();
        Self::load_from(paths, &env)
    }

    pub fn load_from(
        paths: &[PathBuf],
        env: &HashMap<String, String>,
    ) -> Result<Self, ConfigError> {
        let mut builder = Config::builder();
        for path in paths {
            builder = builder
                .add_source(File::new(&path.to_string_lossy(), FileFormat::Toml).required(true));
        }
        let from_files = builder
            .build_cloned()
            .map_err(|e| ConfigError::new(config_error_key(&e), e.to_string()))?;
        let file_tree: Map<String, Value> = from_files.try_deserialize().unwrap_or_default();
        for (key, value) in env_overrides(&file_tree, env)? {
            builder = builder
                .set_override(key.clone(), value)
                .map_err(|e| ConfigError::new(key, e.to_string()))?;
        }
        let mut settings: Settings = builder
            .build()
            .and_then(|c| c.try_deserialize())
            .map_err(|e| ConfigError::new(config_error_key(&e), e.to_string()))?;
        settings.storage.resolve_url(env)?;
        settings.auth.resolve_file(env);
        settings.validate()?;
        Ok(settings)
    }

    fn validate(&self) -> Result<(), ConfigError> {
        if self.router.is_none() && self.facilitator.is_none() {
            return Err(ConfigError::new(
                "router",
                "neither [router] nor [facilitator] is configured: nothing to serve",
            ));
        }
        if self.server.max_body_bytes < 1024 {
            return Err(ConfigError::new(
                "server.max_body_bytes",
                "must be at least 1024",
            ));
        }
        if self.server.worker_threads == Some(0) {
            return Err(ConfigError::new(
                "server.worker_threads",
                "must be at least 1",
            ));
        }
        self.server.validate()?;
        self.storage.validate()?;
        for (name, chain) in &self.chains {
            chain.validate(name)?;
        }
        if let Some(router) = &self.router {
            router.validate(&self.chains)?;
        }
        if let Some(facilitator) = &self.facilitator {
            facilitator.validate(&self.chains)?;
        }
        Ok(())
    }

    /// The effective configuration as TOML. Secrets (the database URL) show as `<redacted>`;
    /// signer keys live in files, so only their paths are shown.
    pub fn render(&self) -> String {
        toml_render(self)
    }
}

impl ChainSettings {
    fn validate(&self, name: &str) -> Result<(), ConfigError> {
        let key = |field: &str| format!("chains.{name}.{field}");
        if name.is_empty()
            || !name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
        {
            return Err(ConfigError::new(
                format!("chains.{name}"),
                "network names use letters, digits, '-' and '_'",
            ));
        }
        if self.chain_id == 0 {
            return Err(ConfigError::new(key("chain_id"), "must be greater than 0"));
        }
        if self.rpc_urls.is_empty() {
            return Err(ConfigError::new(
                key("rpc_urls"),
                "at least one URL is required",
            ));
        }
        // The URL itself is not repeated: it may carry a provider key.
        for (i, url) in self.rpc_urls.iter().enumerate() {
            let url = url.expose();
            if !(url.starts_with("http://") || url.starts_with("https://")) {
                return Err(ConfigError::new(
                    key("rpc_urls"),
                    format!("entry {i} is not an http(s) URL"),
                ));
            }
        }
        for (i, url) in self.ws_urls.iter().enumerate() {
            let url = url.expose();
            if !(url.starts_with("ws://") || url.starts_with("wss://")) {
                return Err(ConfigError::new(
                    key("ws_urls"),
                    format!("entry {i} is not a ws(s) URL"),
                ));
            }
        }
        if !(self.native_price.is_finite() && self.native_price > 0.0) {
            return Err(ConfigError::new(
                key("native_price"),
                "must be a positive number",
            ));
        }
        if self.poll_interval_ms == 0 || self.request_timeout_ms == 0 {
            return Err(ConfigError::new(
                key("poll_interval_ms"),
                "intervals must be greater than 0",
            ));
        }
        if let Some(cap) = &self.max_fee_per_gas {
            U256::from_dec_str(cap).map_err(|_| {
                ConfigError::new(key("max_fee_per_gas"), "not a decimal wei amount")
            })?;
        }
        if let Some(cap) = &self.max_settlement_cost_wei {
            U256::from_dec_str(cap)
                .ok()
                .filter(|c| !c.is_zero())
                .ok_or_else(|| {
                    ConfigError::new(
                        key("max_settlement_cost_wei"),
                        "not a decimal wei amount above 0",
                    )
                })?;
        }
        if self.max_concurrent_requests == 0 {
            return Err(ConfigError::new(
                key("max_concurrent_requests"),
                "must be at least 1",
            ));
        }
        if self.max_batch_calls == 0 {
            return Err(ConfigError::new(
                key("max_batch_calls"),
                "must be at least 1",
            ));
        }
        if self.max_settlement_gas < 50_000 {
            return Err(ConfigError::new(
                key("max_settlement_gas"),
                "must be at least 50000 (a transferWithAuthorization takes about 80000)",
            ));
        }
        if self.confirmations == 0 {
            return Err(ConfigError::new(
                key("confirmations"),
                "must be at least 1 (the including block)",
            ));
        }
        if self.finality_depth < self.confirmations || self.finality_depth > KEPT_BLOCKS {
            return Err(ConfigError::new(
                key("finality_depth"),
                format!("must be between confirmations and {KEPT_BLOCKS}"),
            ));
        }
        for (symbol, token) in &self.tokens {
            token.address.parse::<Address>().map_err(|_| {
                ConfigError::new(key(&format!("tokens.{symbol}.address")), "not a 0x address")
            })?;
        }
        Ok(())
    }

    pub fn max_fee_cap(&self) -> Option<U256> {
        self.max_fee_per_gas
            .as_deref()
            .and_then(|s| U256::from_dec_str(s).ok())
    }

    pub fn max_settlement_cost(&self) -> Option<U256> {
        self.max_settlement_cost_wei
            .as_deref()
            .and_then(|s| U256::from_dec_str(s).ok())
    }
}

impl RouterSettings {
    fn validate(&self, chains: &BTreeMap<String, ChainSettings>) -> Result<(), ConfigError> {
        if self.chains.is_empty() {
            return Err(ConfigError::new(
                "router.chains",
                "at least one chain is required",
            ));
        }
        for name in &self.chains {
            if !chains.contains_key(name) {
                return Err(ConfigError::new(
                    "router.chains",
                    format!("no [chains.{name}] section"),
                ));
            }
        }
        if self.chain_timeout_ms == 0 {
            return Err(ConfigError::new(
                "router.chain_timeout_ms",
                "must be greater than 0",
            ));
        }
        if !(self.gas_headroom.is_finite() && (0.0..=10.0).contains(&self.gas_headroom)) {
            return Err(ConfigError::new(
                "router.gas_headroom",
                "must be between 0 and 10",
            ));
        }
        Ok(())
    }
}

impl FacilitatorSettings {
    fn validate(&self, chains: &BTreeMap<String, ChainSettings>) -> Result<(), ConfigError> {
        if self.networks.is_empty() {
            return Err(ConfigError::new(
                "facilitator.networks",
                "at least one network is required",
            ));
        }
        for name in &self.networks {
            let chain = chains.get(name).ok_or_else(|| {
                ConfigError::new(
                    "facilitator.networks",
                    format!("no [chains.{name}] section"),
                )
            })?;
            if chain.tokens.is_empty() {
                return Err(ConfigError::new(
                    format!("chains.{name}.tokens"),
                    "a served network needs at least one ERC-3009 token",
                ));
            }
        }
        if self.settle_timeout_secs == 0 {
            return Err(ConfigError::new(
                "facilitator.settle_timeout_secs",
                "must be greater than 0",
            ));
        }
        if self.max_batch == 0 {
            return Err(ConfigError::new(
                "facilitator.max_batch",
                "must be greater than 0",
            ));
        }
        if self.retention_days == 0 {
            return Err(ConfigError::new(
                "facilitator.retention_days",
                "must be at least 1",
            ));
        }
        self.validate_versions(chains)
    }

    fn validate_versions(
        &self,
        chains: &BTreeMap<String, ChainSettings>,
    ) -> Result<(), ConfigError> {
        let key = "facilitator.x402_versions";
        if self.x402_versions.is_empty() {
            return Err(ConfigError::new(key, "at least one version is required"));
        }
        if let Some(v) = self.x402_versions.iter().find(|v| !matches!(v, 1 | 2)) {
            return Err(ConfigError::new(
                key,
                format!("version {v} is not one of 1, 2"),
            ));
        }
        if self.serves_version(2) {
            // v2 names a network by chain id (eip155:<id>): two served networks with one id
            // would make that name ambiguous.
            let mut seen = BTreeMap::new();
            for name in &self.networks {
                if let Some(other) = seen.insert(chains[name].chain_id, name) {
                    return Err(ConfigError::new(
                        key,
                        format!(
                            "x402 v2 names networks by chain id, and {other} and {name} share chain id {}",
                            chains[name].chain_id
                        ),
                    ));
                }
            }
        }
        Ok(())
    }
}

/// `config` lowercases environment keys, while network names in files keep their case
/// (`chainX`). Each `ROUTERD__A__B` variable is matched segment by segment, ignoring case and
/// reading `_` for `-`, against the keys the files define, so `ROUTERD__CHAINS__CHAINX__RPC_URLS`
/// reaches `[chains.chainX]`. A value for a list key is split on commas.
fn env_overrides(
    file_tree: &Map<String, Value>,
    env: &HashMap<String, String>,
) -> Result<Vec<(String, Value)>, ConfigError> {
    let prefix = format!("{ENV_PREFIX}__");
    let mut overrides = Vec::new();
    for (name, raw) in env {
        let Some(rest) = name.strip_prefix(&prefix) else {
            continue;
        };
        let segments: Vec<String> = rest.split("__").map(str::to_lowercase).collect();
        if segments.iter().any(String::is_empty) {
            return Err(ConfigError::new(name.clone(), "empty key segment"));
        }
        let (path, existing) = resolve_case_insensitive(file_tree, &segments);
        let value = if is_list_key(&path, existing) {
            let items: Vec<Value> = raw
                .split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(|s| Value::new(None, s.to_string()))
                .collect();
            Value::new(None, ValueKind::Array(items))
        } else {
            Value::new(None, raw.clone())
        };
        overrides.push((path.join("."), value));
    }
    overrides.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(overrides)
}

/// How a key compares with an environment variable's segment: case aside, and `-` written as `_`
/// (systemd and shells do not allow `-` in variable names: `chainX-testnet` is `CHAINX_TESTNET`).
fn env_segment(key: &str) -> String {
    key.to_lowercase().replace('-', "_")
}

fn resolve_case_insensitive<'a>(
    tree: &'a Map<String, Value>,
    segments: &[String],
) -> (Vec<String>, Option<&'a Value>) {
    let mut path = Vec::with_capacity(segments.len());
    let mut level = Some(tree);
    let mut found = None;
    for segment in segments {
        let hit = level.and_then(|map| {
            map.iter()
                .find(|(k, _)| env_segment(k) == env_segment(segment))
        });
        match hit {
            Some((key, value)) => {
                path.push(key.clone());
                found = Some(value);
                level = match &value.kind {
                    ValueKind::Table(inner) => Some(inner),
                    _ => None,
                };
            }
            None => {
                path.push(segment.clone());
                found = None;
                level = None;
            }
        }
    }
    (path, found)
}

const LIST_KEYS: &[&str] = &["rpc_urls", "networks", "chains", "prefer"];

fn is_list_key(path: &[String], existing: Option<&Value>) -> bool {
    matches!(existing.map(|v| &v.kind), Some(ValueKind::Array(_)))
        || path
            .last()
            .is_some_and(|last| LIST_KEYS.contains(&last.as_str()) && path.len() >= 2)
}

/// Pulls the key out of a `config` error so the exit message names it (`server.bogus` for an
/// unknown field `bogus` in `[server]`).
fn config_error_key(error: &config::ConfigError) -> String {
    let text = error.to_string();
    if let (Some(field), Some(parent)) = (
        between(&text, "unknown field `", "`"),
        between(&text, "for key `", "`"),
    ) {
        return format!("{parent}.{field}");
    }
    for marker in ["for key `", "key `"] {
        if let Some(start) = text.find(marker) {
            let rest = &text[start + marker.len()..];
            if let Some(end) = rest.find('`') {
                return rest[..end].to_string();
            }
        }
    }
    if let Some(start) = text.find("unknown field `") {
        let rest = &text[start + "unknown field `".len()..];
        if let Some(end) = rest.find('`') {
            return rest[..end].to_string();
        }
    }
    "config".to_string()
}

fn between<'a>(text: &'a str, start: &str, end: &str) -> Option<&'a str> {
    let rest = &text[text.find(start)? + start.len()..];
    Some(&rest[..rest.find(end)?])
}

fn toml_render(settings: &Settings) -> String {
    let value = serde_json::to_value(settings).unwrap_or_default();
    let mut out = String::new();
    render_table(&mut out, "", &value);
    out
}

/// Minimal TOML writer for the effective config: scalars and arrays first, then sub-tables.
fn render_table(out: &mut String, prefix: &str, value: &serde_json::Value) {
    let Some(map) = value.as_object() else { return };
    let has_scalars = map.values().any(|v| !v.is_object() && !v.is_null());
    if !prefix.is_empty() && has_scalars {
        out.push_str(&format!("\n[{prefix}]\n"));
    }
    for (key, v) in map {
        if v.is_object() || v.is_null() {
            continue;
        }
        out.push_str(&format!("{} = {}\n", toml_key(key), v));
    }
    for (key, v) in map {
        if v.is_object() {
            let sub = if prefix.is_empty() {
                toml_key(key)
            } else {
                format!("{prefix}.{}", toml_key(key))
            };
            render_table(out, &sub, v);
        }
    }
}

fn toml_key(key: &str) -> String {
    if key
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
    {
        key.to_string()
    } else {
        format!("{key:?}")
    }
}

/// Where the default configuration lives when `--config` is not given.
pub fn default_config_path() -> &'static Path {
    Path::new("conf/default.toml")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(dir: &Path, name: &str, body: &str) -> PathBuf {
        let path = dir.join(name);
        std::fs::write(&path, body).unwrap();
        path
    }

    const BASE: &str = r#"
[server]
listen = "127.0.0.1:9000"
[chains.chainX]
chain_id = 1
kind = "l1"
rpc_urls = ["http://127.0.0.1:8545"]
[chains.chainX.tokens.USDC]
address = "0x5FbDB2315678afecb367f032d93F642f64180aa3"
eip712_name = "USD Coin"
eip712_version = "2"
[facilitator]
networks = ["chainX"]
"#;

    fn temp_dir() -> PathBuf {
        let dir = std::env::temp_dir().join(format!(
            "routerd-config-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    /// Writes `body` to `name` in this test's directory and loads it alone, without environment.
    fn load(name: &str, body: &str) -> Result<Settings, ConfigError> {
        let path = write(&temp_dir(), name, body);
        Settings::load_from(&[path], &HashMap::new())
    }

    #[test]
    fn max_batch_calls_defaults_to_64_and_zero_is_refused() {
        let settings = load("batch.toml", BASE).unwrap();
        assert_eq!(settings.chains["chainX"].max_batch_calls, 64);
        let body = BASE.replace("chain_id = 1\n", "chain_id = 1\nmax_batch_calls = 0\n");
        let error = load("zero-batch.toml", &body).unwrap_err();
        assert_eq!(error.key, "chains.chainX.max_batch_calls");
    }

    #[test]
    fn worker_threads_default_to_half_the_cores_and_zero_is_refused() {
        let settings = load("threads.toml", BASE).unwrap();
        assert_eq!(
            settings.server.worker_threads(),
            ServerSettings::default_worker_threads()
        );
        let body = BASE.replace("[server]\n", "[server]\nworker_threads = 0\n");
        let error = load("zero-threads.toml", &body).unwrap_err();
        assert_eq!(error.key, "server.worker_threads");
        let body = BASE.replace("[server]\n", "[server]\nworker_threads = 3\n");
        let settings = load("three-threads.toml", &body).unwrap();
        assert_eq!(settings.server.worker_threads(), 3);
    }

    #[test]
    fn endpoints_show_scheme_and_host_only() {
        let shown = |url: &str| Endpoint(url.to_string()).shown();
        assert_eq!(
            shown("https://base-mainnet.example/v2/KEY123?apikey=S3CRET"),
            "https://base-mainnet.example/…"
        );
        assert_eq!(
            shown("http://user:pw@127.0.0.1:8545"),
            "http://127.0.0.1:8545"
        );
        assert_eq!(
            shown("wss://node.example?token=S3CRET"),
            "wss://node.example/…"
        );
        let debug = format!("{:?}", Endpoint("https://h/KEY".to_string()));
        assert!(!debug.contains("KEY"));
    }

    #[test]
    fn env_override_reaches_mixed_case_network() {
        let dir = temp_dir();
        let path = write(&dir, "a.toml", BASE);
        let env = HashMap::from([(
            "ROUTERD__CHAINS__CHAINX__RPC_URLS".to_string(),
            "http://a:1, http://b:2".to_string(),
        )]);
        let settings = Settings::load_from(&[path], &env).unwrap();
        let urls: Vec<&str> = settings.chains["chainX"]
            .rpc_urls
            .iter()
            .map(Endpoint::expose)
            .collect();
        assert_eq!(urls, vec!["http://a:1", "http://b:2"]);
    }

    #[test]
    fn env_override_reaches_dashed_network_with_underscores() {
        let dir = temp_dir();
        let body = BASE
            .replace("chains.chainX", "chains.chainX-testnet")
            .replace("[\"chainX\"]", "[\"chainX-testnet\"]");
        let path = write(&dir, "dashed.toml", &body);
        let env = HashMap::from([(
            "ROUTERD__CHAINS__CHAINX_TESTNET__RPC_URLS".to_string(),
            "http://c:3".to_string(),
        )]);
        let settings = Settings::load_from(&[path], &env).unwrap();
        assert_eq!(
            settings.chains["chainX-testnet"].rpc_urls[0].expose(),
            "http://c:3"
        );
    }

    #[test]
    fn later_file_overrides_earlier() {
        let dir = temp_dir();
        let a = write(&dir, "base.toml", BASE);
        let b = write(&dir, "over.toml", "[server]\nlisten = \"127.0.0.1:9100\"\n");
        let settings = Settings::load_from(&[a, b], &HashMap::new()).unwrap();
        assert_eq!(settings.server.listen.port(), 9100);
    }

    #[test]
    fn settlement_keys_default_and_their_bad_values_name_the_key() {
        let settings = load("defaults.toml", BASE).unwrap();
        let chain = &settings.chains["chainX"];
        assert_eq!((chain.confirmations, chain.finality_depth), (1, 64));
        assert_eq!(chain.max_settlement_cost(), None);
        assert_eq!(settings.facilitator.as_ref().unwrap().retention_days, 30);
        let chain_line = "rpc_urls = [\"http://127.0.0.1:8545\"]";
        for (line, key) in [
            ("confirmations = 0", "chains.chainX.confirmations"),
            ("finality_depth = 0", "chains.chainX.finality_depth"),
            ("finality_depth = 300", "chains.chainX.finality_depth"),
            (
                "max_settlement_cost_wei = \"0x10\"",
                "chains.chainX.max_settlement_cost_wei",
            ),
        ] {
            let body = BASE.replace(chain_line, &format!("{chain_line}\n{line}"));
            let err = load("bad-settlement.toml", &body).unwrap_err();
            assert_eq!(err.key, key, "{line}");
        }
        let body = format!("{BASE}retention_days = 0\n");
        let err = load("bad-retention.toml", &body).unwrap_err();
        assert_eq!(err.key, "facilitator.retention_days");
    }

    #[test]
    fn x402_versions_default_to_v1_and_bad_lists_name_the_key() {
        let settings = load("versions.toml", BASE).unwrap();
        let facilitator = settings.facilitator.unwrap();
        assert_eq!(facilitator.x402_versions, vec![1]);
        assert!(!facilitator.allow_http_resource);
        for line in ["x402_versions = []", "x402_versions = [1, 3]"] {
            let err = load("bad-versions.toml", &format!("{BASE}{line}\n")).unwrap_err();
            assert_eq!(err.key, "facilitator.x402_versions", "{line}");
        }
        let settings = load("v2.toml", &format!("{BASE}x402_versions = [1, 2]\n")).unwrap();
        assert!(settings.facilitator.unwrap().serves_version(2));
    }

    #[test]
    fn storage_keys_default_read_the_credential_file_and_never_show_the_url() {
        let dir = temp_dir();
        let settings = load("storage-defaults.toml", BASE).unwrap();
        assert_eq!(settings.storage.backend, StorageBackend::Sled);
        assert_eq!(settings.storage.lease_ttl_secs, 10);
        assert!(settings
            .storage
            .instance_id
            .ends_with(&format!("-{}", std::process::id())));
        let body = format!("[storage]\nbackend = \"postgres\"\n{BASE}");
        let path = write(&dir, "storage-pg.toml", &body);
        let err = Settings::load_from(std::slice::from_ref(&path), &HashMap::new()).unwrap_err();
        assert_eq!(err.key, "storage.postgres_url");
        let url = "postgres://routerd:s3cret-pw@db.internal:5433/routerd";
        let credentials = dir.join("credentials");
        std::fs::create_dir_all(&credentials).unwrap();
        std::fs::write(credentials.join("postgres-url"), format!("{url}\n")).unwrap();
        let env = HashMap::from([(
            "CREDENTIALS_DIRECTORY".to_string(),
            credentials.display().to_string(),
        )]);
        let settings = Settings::load_from(std::slice::from_ref(&path), &env).unwrap();
        assert_eq!(
            settings.storage.postgres_url.as_ref().unwrap().expose(),
            url
        );
        assert!(
            !settings.render().contains("s3cret"),
            "{}",
            settings.render()
        );
        assert!(!format!("{settings:?}").contains("s3cret"));
        // The environment wins over the credential file.
        let env = HashMap::from([(
            "ROUTERD__STORAGE__POSTGRES_URL".to_string(),
            "postgres://other@h/db".to_string(),
        )]);
        let settings = Settings::load_from(std::slice::from_ref(&path), &env).unwrap();
        assert_eq!(
            settings.storage.postgres_url.unwrap().expose(),
            "postgres://other@h/db"
        );
        for (line, key) in [
            ("postgres_url = \"not a url\"", "storage.postgres_url"),
            (
                "postgres_url = \"postgres://a@h/d\"\nlease_ttl_secs = 0",
                "storage.lease_ttl_secs",
            ),
            (
                "postgres_url = \"postgres://a@h/d\"\ninstance_id = \" \"",
                "storage.instance_id",
            ),
        ] {
            let body = format!("[storage]\nbackend = \"postgres\"\n{line}\n{BASE}");
            let err = load("storage-bad.toml", &body).unwrap_err();
            assert_eq!(err.key, key, "{line}");
            assert!(!err.to_string().contains("not a url"), "{err}");
        }
    }

    #[test]
    fn bad_value_names_the_key() {
        let dir = temp_dir();
        let path = write(
            &dir,
            "bad.toml",
            &BASE.replace("chain_id = 1", "chain_id = 0"),
        );
        let err = Settings::load_from(&[path], &HashMap::new()).unwrap_err();
        assert_eq!(err.key, "chains.chainX.chain_id");
    }

    #[test]
    fn unknown_key_is_named() {
        let dir = temp_dir();
        let path = write(
            &dir,
            "unknown.toml",
            &format!("{BASE}\n[storage]\npth = \"x\"\n"),
        );
        let err = Settings::load_from(&[path], &HashMap::new()).unwrap_err();
        assert_eq!(err.key, "storage.pth", "{err}");
    }

    #[test]
    fn served_network_needs_tokens() {
        let body = BASE
            .replace("[chains.chainX.tokens.USDC]", "[other]")
            .replace("address =", "x =");
        assert!(load("notoken.toml", &body).is_err());
    }

    #[test]
    fn neither_router_nor_facilitator_is_an_error() {
        let err = load("empty.toml", "[server]\nlisten = \"127.0.0.1:1\"\n").unwrap_err();
        assert_eq!(err.key, "router");
    }
}
