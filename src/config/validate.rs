//! What each value may be. Checks run in a fixed order and the first failure is reported, its
//! `ConfigError` naming the key at fault (`chains.<name>.<field>` for a chain's keys).

use std::collections::{BTreeMap, HashSet};

use ethers_core::types::{Address, U256};

use super::presets::{self, Preset};
use super::{
    ChainSettings, ConfigError, FacilitatorSettings, RouterSettings, ServerSettings, Settings,
    StorageBackend, StorageSettings, KEPT_BLOCKS,
};

impl Settings {
    pub(super) fn validate(&self) -> Result<(), ConfigError> {
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
        self.telemetry.validate()?;
        for (name, chain) in &self.chains {
            chain.validate(name, self.provenance.preset(name))?;
        }
        for (name, chain) in &self.solana_chains {
            chain.validate(name)?;
        }
        if let Some(router) = &self.router {
            refuse_solana(
                "router.chains",
                &router.chains,
                "the router routes EVM transactions",
            )?;
            router.validate(&self.chains)?;
        }
        if let Some(facilitator) = &self.facilitator {
            facilitator.validate(&self.chains)?;
            for name in facilitator.solana_networks() {
                if !self.solana_chains.contains_key(name) {
                    return Err(ConfigError::new(
                        "facilitator.networks",
                        format!("no [chains.{name}] section (a known Solana network: its rpc_urls are enough)"),
                    ));
                }
            }
        }
        Ok(())
    }
}

impl ServerSettings {
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
        if self.max_relay_answer_bytes < 1024 {
            return Err(ConfigError::new(
                "server.max_relay_answer_bytes",
                "must be at least 1024",
            ));
        }
        Ok(())
    }
}

impl StorageSettings {
    fn validate(&self) -> Result<(), ConfigError> {
        if self.backend == StorageBackend::Postgres {
            match &self.postgres_url {
                None => return Err(ConfigError::new(
                    "storage.postgres_url",
                    "required with storage.backend = \"postgres\" (or ROUTERD__STORAGE__POSTGRES_URL, or $CREDENTIALS_DIRECTORY/postgres-url)",
                )),
                Some(url) if url.expose().parse::<tokio_postgres::Config>().is_err() => {
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

/// The key of `field` in the chain called `name`.
fn chain_key(name: &str, field: &str) -> String {
    format!("chains.{name}.{field}")
}

/// A network name (the `<name>` of `[chains.<name>]`): letters, digits, `-` and `_` only.
fn validate_network_name(name: &str) -> Result<(), ConfigError> {
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
    Ok(())
}

impl ChainSettings {
    /// The checks of `[chains.<name>]`, in this order; the first that fails is reported.
    /// `preset`: the known network the chain is, if any.
    fn validate(&self, name: &str, preset: Option<&Preset>) -> Result<(), ConfigError> {
        validate_network_name(name)?;
        if self.chain_id == 0 {
            return Err(ConfigError::new(
                chain_key(name, "chain_id"),
                "must be greater than 0",
            ));
        }
        // The key is the network's x402 v1 name, which x402 clients map to the preset's chain
        // id: with another id, v1 and v2 (eip155:<chain_id>) would name two different chains.
        if let Some(preset) = preset.filter(|p| p.chain_id != self.chain_id) {
            return Err(ConfigError::new(
                chain_key(name, "chain_id"),
                format!(
                    "{name} is the known network with chain id {}; another chain needs a key of its own",
                    preset.chain_id
                ),
            ));
        }
        self.validate_endpoints(name)?;
        self.validate_price_and_intervals(name)?;
        self.validate_fee_caps(name)?;
        self.validate_upstream_limits(name)?;
        self.validate_settlement_bounds(name)?;
        self.validate_tokens(name)
    }

    /// At least one RPC URL, each http(s); WebSocket URLs ws(s). The URL itself is not repeated
    /// in the message: it may carry a provider key.
    fn validate_endpoints(&self, name: &str) -> Result<(), ConfigError> {
        if self.rpc_urls.is_empty() {
            return Err(ConfigError::new(
                chain_key(name, "rpc_urls"),
                "at least one URL is required",
            ));
        }
        for (i, url) in self.rpc_urls.iter().enumerate() {
            let url = url.expose();
            if !(url.starts_with("http://") || url.starts_with("https://")) {
                return Err(ConfigError::new(
                    chain_key(name, "rpc_urls"),
                    format!("entry {i} is not an http(s) URL"),
                ));
            }
        }
        for (i, url) in self.ws_urls.iter().enumerate() {
            let url = url.expose();
            if !(url.starts_with("ws://") || url.starts_with("wss://")) {
                return Err(ConfigError::new(
                    chain_key(name, "ws_urls"),
                    format!("entry {i} is not a ws(s) URL"),
                ));
            }
        }
        Ok(())
    }

    fn validate_price_and_intervals(&self, name: &str) -> Result<(), ConfigError> {
        if !(self.native_price.is_finite() && self.native_price > 0.0) {
            return Err(ConfigError::new(
                chain_key(name, "native_price"),
                "must be a positive number",
            ));
        }
        if self.poll_interval_ms == 0 || self.request_timeout_ms == 0 {
            return Err(ConfigError::new(
                chain_key(name, "poll_interval_ms"),
                "intervals must be greater than 0",
            ));
        }
        Ok(())
    }

    /// The caps on what the facilitator pays: decimal wei amounts.
    fn validate_fee_caps(&self, name: &str) -> Result<(), ConfigError> {
        if let Some(cap) = &self.max_fee_per_gas {
            U256::from_dec_str(cap).map_err(|_| {
                ConfigError::new(
                    chain_key(name, "max_fee_per_gas"),
                    "not a decimal wei amount",
                )
            })?;
        }
        if let Some(cap) = &self.max_settlement_cost_wei {
            U256::from_dec_str(cap)
                .ok()
                .filter(|c| !c.is_zero())
                .ok_or_else(|| {
                    ConfigError::new(
                        chain_key(name, "max_settlement_cost_wei"),
                        "not a decimal wei amount above 0",
                    )
                })?;
        }
        Ok(())
    }

    /// How many upstream calls may be in flight, and in one batch.
    fn validate_upstream_limits(&self, name: &str) -> Result<(), ConfigError> {
        if self.max_concurrent_requests == 0 {
            return Err(ConfigError::new(
                chain_key(name, "max_concurrent_requests"),
                "must be at least 1",
            ));
        }
        if self.max_batch_calls == 0 {
            return Err(ConfigError::new(
                chain_key(name, "max_batch_calls"),
                "must be at least 1",
            ));
        }
        if self.max_call_gas < 21_000 {
            return Err(ConfigError::new(
                chain_key(name, "max_call_gas"),
                "must be at least 21000 (the least any call takes)",
            ));
        }
        Ok(())
    }

    /// The facilitator's bounds on a settlement: its gas, its confirmations, and how long it is
    /// followed for reorganisations (no deeper than the head watcher remembers).
    fn validate_settlement_bounds(&self, name: &str) -> Result<(), ConfigError> {
        if self.max_settlement_gas < 50_000 {
            return Err(ConfigError::new(
                chain_key(name, "max_settlement_gas"),
                "must be at least 50000 (a transferWithAuthorization takes about 80000)",
            ));
        }
        if self.confirmations == 0 {
            return Err(ConfigError::new(
                chain_key(name, "confirmations"),
                "must be at least 1 (the including block)",
            ));
        }
        if self.finality_depth < self.confirmations || self.finality_depth > KEPT_BLOCKS {
            return Err(ConfigError::new(
                chain_key(name, "finality_depth"),
                format!("must be between confirmations and {KEPT_BLOCKS}"),
            ));
        }
        Ok(())
    }

    fn validate_tokens(&self, name: &str) -> Result<(), ConfigError> {
        for (symbol, token) in &self.tokens {
            token.address.parse::<Address>().map_err(|_| {
                ConfigError::new(
                    chain_key(name, &format!("tokens.{symbol}.address")),
                    "not a 0x address",
                )
            })?;
            if token.transfer_methods.is_empty() {
                return Err(ConfigError::new(
                    chain_key(name, &format!("tokens.{symbol}.transfer_methods")),
                    "at least one of \"eip3009\", \"permit2\" is required",
                ));
            }
        }
        Ok(())
    }
}

/// A list that may not name a Solana cluster: its chains are not EVM chains.
fn refuse_solana(key: &str, names: &[String], why: &str) -> Result<(), ConfigError> {
    match names
        .iter()
        .find(|name| super::solana::find(name).is_some())
    {
        Some(name) => Err(ConfigError::new(
            key,
            format!("{name} is a Solana network: {why}"),
        )),
        None => Ok(()),
    }
}

/// Why a chain named in `router.chains` or `facilitator.networks` is missing.
fn no_section(name: &str) -> String {
    match presets::find(name) {
        Some(_) => format!("no [chains.{name}] section (a known network: its rpc_urls are enough)"),
        None => format!("no [chains.{name}] section"),
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
                return Err(ConfigError::new("router.chains", no_section(name)));
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
        if self.max_sent_remembered == 0 {
            return Err(ConfigError::new(
                "router.max_sent_remembered",
                "must be at least 1",
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
        for name in self.evm_networks() {
            let chain = chains
                .get(name)
                .ok_or_else(|| ConfigError::new("facilitator.networks", no_section(name)))?;
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
        if self.batch_max_calls_per_tx == 0 {
            return Err(ConfigError::new(
                "facilitator.batch_max_calls_per_tx",
                "must be at least 1",
            ));
        }
        self.erc6492_factories()?;
        self.validate_discovery()?;
        self.validate_versions(chains)
    }

    fn validate_discovery(&self) -> Result<(), ConfigError> {
        let at_least_one = [
            (
                "facilitator.discovery_ttl_secs",
                self.discovery_ttl_secs as usize,
            ),
            (
                "facilitator.discovery_max_entries",
                self.discovery_max_entries,
            ),
            (
                "facilitator.discovery_max_entry_bytes",
                self.discovery_max_entry_bytes,
            ),
        ];
        match at_least_one.into_iter().find(|(_, value)| *value == 0) {
            Some((key, _)) => Err(ConfigError::new(key, "must be greater than 0")),
            None => Ok(()),
        }
    }

    /// `facilitator.erc6492_factories`, parsed.
    pub fn erc6492_factories(&self) -> Result<HashSet<Address>, ConfigError> {
        self.erc6492_factories
            .iter()
            .enumerate()
            .map(|(i, factory)| {
                factory.parse::<Address>().map_err(|_| {
                    ConfigError::new(
                        format!("facilitator.erc6492_factories[{i}]"),
                        "not a 0x address",
                    )
                })
            })
            .collect()
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
            for name in self.evm_networks() {
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

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use crate::config::testing::{load, temp_dir, write, BASE};
    use crate::config::{ServerSettings, Settings};

    #[test]
    fn max_batch_calls_defaults_to_64_and_zero_is_refused() {
        let settings = load("batch.toml", BASE).unwrap();
        assert_eq!(settings.chains["chainX"].max_batch_calls, 64);
        let body = BASE.replace("chain_id = 1\n", "chain_id = 1\nmax_batch_calls = 0\n");
        let error = load("zero-batch.toml", &body).unwrap_err();
        assert_eq!(error.key, "chains.chainX.max_batch_calls");
    }

    #[test]
    fn worker_threads_default_to_half_the_cores_but_two_on_two() {
        let defaults: Vec<usize> = [1, 2, 3, 4, 8, 16]
            .into_iter()
            .filter_map(std::num::NonZeroUsize::new)
            .map(ServerSettings::worker_threads_for)
            .collect();
        assert_eq!(defaults, [1, 2, 2, 2, 4, 8]);
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
