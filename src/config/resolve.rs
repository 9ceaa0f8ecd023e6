//! The known networks (`presets`) applied to the layered configuration, before it becomes typed
//! settings: a chain keyed by a known network's CAIP-2 id takes the network's v1 name as its key
//! (and so do the references to it in `router.chains` and `facilitator.networks`), and a known
//! network's chain gets from its preset every preset value that neither the files nor the
//! environment give. Where each preset value came from is kept for `check-config`.
//!
//! The key a chain ends up with is its x402 v1 network name, as for any chain; x402 v2 names it
//! `eip155:<chain_id>`, and the preset's chain id is the only one a known network's key may have
//! (`validate` holds it), so both names stay true to the chain.

use std::collections::{BTreeMap, BTreeSet};

use config::{Map, Value, ValueKind};
use serde::Serialize;

use super::batch::BatchContract;
use super::presets::{self, Preset, PresetToken};
use super::solana::{self, SolanaPreset, USDC_DECIMALS};
use super::ConfigError;

/// Where a value of the effective configuration came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    /// routerd's table of known networks: neither the files nor the environment set it.
    Preset,
    File,
    Environment,
}

impl Origin {
    pub fn as_str(self) -> &'static str {
        match self {
            Origin::Preset => "preset",
            Origin::File => "file",
            Origin::Environment => "environment",
        }
    }
}

/// What the known networks did to one configuration.
#[derive(Debug, Clone, Default)]
pub struct Provenance {
    /// The chains that are known networks, by key.
    known: BTreeMap<String, &'static Preset>,
    /// The chains that are known Solana clusters, by key.
    solana: BTreeMap<String, &'static SolanaPreset>,
    /// The CAIP-2 id a chain was keyed by in the configuration, by the v1 name it now has.
    written_as: BTreeMap<String, String>,
    /// Where each value a preset has came from, by its path (`chains`, the key, the field...).
    origins: BTreeMap<Vec<String>, Origin>,
}

impl Provenance {
    /// The preset of the chain keyed `key`, when it is a known network.
    pub fn preset(&self, key: &str) -> Option<&'static Preset> {
        self.known.get(key).copied()
    }

    /// The known Solana cluster of the chain keyed `key`, when it is one.
    pub fn solana_preset(&self, key: &str) -> Option<&'static SolanaPreset> {
        self.solana.get(key).copied()
    }

    /// The CAIP-2 id the chain keyed `key` had in the configuration, when it had one.
    pub fn written_as(&self, key: &str) -> Option<&str> {
        self.written_as.get(key).map(String::as_str)
    }

    /// Where the value at `path` came from, for a value a preset has.
    pub fn origin(&self, path: &[&str]) -> Option<Origin> {
        let path: Vec<String> = path.iter().map(|s| s.to_string()).collect();
        self.origins.get(&path).copied()
    }

    /// `error` named by the key the configuration used: `chains.eip155:84532.rpc_urls` for a
    /// chain written so, not the `chains.base-sepolia.rpc_urls` it became.
    pub(super) fn in_written_terms(&self, mut error: ConfigError) -> ConfigError {
        if let Some(rest) = error.key.strip_prefix(SOLANA_CHAINS) {
            error.key = format!("chains{rest}");
        }
        for (name, written) in &self.written_as {
            let prefix = format!("chains.{name}");
            let rest = error.key.strip_prefix(&prefix);
            if let Some(rest) = rest.filter(|r| r.is_empty() || r.starts_with('.')) {
                error.key = format!("chains.{written}{rest}");
            }
        }
        error
    }
}

/// Applies the known networks to `tree`, the files' values with the environment's over them;
/// `from_env` holds the paths the environment set.
pub(super) fn apply(
    tree: &mut Map<String, Value>,
    from_env: &[Vec<String>],
) -> Result<Provenance, ConfigError> {
    let mut provenance = Provenance::default();
    rename_references(tree);
    let from_env: BTreeSet<Vec<String>> = from_env.iter().map(|p| in_v1_terms(p)).collect();
    let solana_chains = take_solana_chains(tree, &from_env, &mut provenance)?;
    if !solana_chains.is_empty() {
        let table = Value::new(None, ValueKind::Table(solana_chains));
        tree.insert(SOLANA_CHAINS.to_string(), table);
    }
    let Some(ValueKind::Table(chains)) = tree.get_mut("chains").map(|v| &mut v.kind) else {
        return Ok(provenance);
    };
    provenance.written_as.extend(rename_caip2_keys(chains)?);
    let mut filler = Filler {
        from_env: &from_env,
        origins: &mut provenance.origins,
    };
    for (key, chain) in chains.iter_mut() {
        // Anything but a table is left to serde, which names the key.
        let ValueKind::Table(fields) = &mut chain.kind else {
            continue;
        };
        let path = ["chains".to_string(), key.clone()];
        filler.contracts(&path, fields);
        let Some(preset) = presets::find(key) else {
            continue;
        };
        provenance.known.insert(key.clone(), preset);
        filler.chain(&path, fields, preset);
    }
    Ok(provenance)
}

/// Where the Solana chains go in the tree: their keys are not an EVM chain's, so they are read
/// into a table of their own (`Settings::solana_chains`).
const SOLANA_CHAINS: &str = "solana_chains";

/// Takes the known Solana clusters out of `chains`, keyed by their v1 names and filled from their
/// presets; a cluster configured under both of its names is refused.
fn take_solana_chains(
    tree: &mut Map<String, Value>,
    from_env: &BTreeSet<Vec<String>>,
    provenance: &mut Provenance,
) -> Result<Map<String, Value>, ConfigError> {
    let mut taken = Map::new();
    let Some(ValueKind::Table(chains)) = tree.get_mut("chains").map(|v| &mut v.kind) else {
        return Ok(taken);
    };
    let keys: Vec<(String, &'static SolanaPreset)> = chains
        .keys()
        .filter_map(|key| solana::find(key).map(|p| (key.clone(), p)))
        .collect();
    let mut filler = Filler {
        from_env,
        origins: &mut provenance.origins,
    };
    for (key, preset) in keys {
        let name = preset.name.to_string();
        if taken.contains_key(&name) {
            return Err(ConfigError::new(
                format!("chains.{key}"),
                format!("{key} is the known network {name}, configured under another name too"),
            ));
        }
        let mut chain = chains.remove(&key).expect("a key listed above");
        if key != name {
            provenance.written_as.insert(name.clone(), key);
        }
        provenance.solana.insert(name.clone(), preset);
        // Anything but a table is left to serde, which names the key.
        if let ValueKind::Table(fields) = &mut chain.kind {
            filler.solana_chain(&["chains".to_string(), name.clone()], fields, preset);
        }
        taken.insert(name, chain);
    }
    Ok(taken)
}

/// Keys a chain keyed by a known network's CAIP-2 id by the network's v1 name; two keys for one
/// network are refused. Returns the CAIP-2 ids by the names that replaced them.
fn rename_caip2_keys(
    chains: &mut Map<String, Value>,
) -> Result<BTreeMap<String, String>, ConfigError> {
    let caip2_keys: Vec<(String, &'static Preset)> = chains
        .keys()
        .filter_map(|key| presets::find(key).map(|p| (key.clone(), p)))
        .filter(|(key, preset)| key != preset.name)
        .collect();
    let mut written_as = BTreeMap::new();
    for (key, preset) in caip2_keys {
        if chains.contains_key(preset.name) {
            return Err(ConfigError::new(
                format!("chains.{key}"),
                format!(
                    "{key} is the known network {0}, which [chains.{0}] configures too",
                    preset.name
                ),
            ));
        }
        let chain = chains.remove(&key).expect("a key listed above");
        chains.insert(preset.name.to_string(), chain);
        written_as.insert(preset.name.to_string(), key);
    }
    Ok(written_as)
}

/// `router.chains` and `facilitator.networks` name a known network by its v1 name, as its chain
/// is keyed, however they wrote it.
fn rename_references(tree: &mut Map<String, Value>) {
    for (section, list) in [("router", "chains"), ("facilitator", "networks")] {
        let Some(ValueKind::Table(table)) = tree.get_mut(section).map(|v| &mut v.kind) else {
            continue;
        };
        let Some(ValueKind::Array(items)) = table.get_mut(list).map(|v| &mut v.kind) else {
            continue;
        };
        for item in items {
            if let ValueKind::String(name) = &mut item.kind {
                if let Some(preset) = presets::find(name) {
                    *name = preset.name.to_string();
                } else if let Some(preset) = solana::find(name) {
                    *name = preset.name.to_string();
                }
            }
        }
    }
}

/// `path` with a known network's chain named by its v1 name.
fn in_v1_terms(path: &[String]) -> Vec<String> {
    let mut path = path.to_vec();
    if let [section, key, ..] = path.as_mut_slice() {
        if section == "chains" {
            if let Some(preset) = presets::find(key) {
                *key = preset.name.to_string();
            }
        }
    }
    path
}

/// Fills a known network's chain from its preset, noting where each value came from.
struct Filler<'a> {
    from_env: &'a BTreeSet<Vec<String>>,
    origins: &'a mut BTreeMap<Vec<String>, Origin>,
}

impl Filler<'_> {
    fn chain(&mut self, path: &[String], chain: &mut Map<String, Value>, preset: &Preset) {
        self.field(path, chain, "chain_id", preset.chain_id.into());
        self.field(path, chain, "kind", text(&preset.kind).into());
        if let Some(model) = &preset.fee_model {
            self.field(path, chain, "fee_model", text(model).into());
        }
        self.field(
            path,
            chain,
            "max_fee_per_gas",
            preset.max_fee_per_gas().into(),
        );
        if let Some(token) = &preset.token {
            self.token(path, chain, token);
        }
    }

    /// The preset token, under its symbol, when the chain names no tokens; completed field by
    /// field when the chain names that symbol. A chain that names other tokens only gets none:
    /// a `tokens` table is the list of tokens the operator settles.
    fn token(&mut self, path: &[String], chain: &mut Map<String, Value>, token: &PresetToken) {
        let Some(fields) = preset_token(chain, token.symbol) else {
            return;
        };
        let path = [path, &["tokens".to_string(), token.symbol.to_string()]].concat();
        self.field(&path, fields, "address", token.address.into());
        self.field(&path, fields, "eip712_name", token.eip712_name.into());
        self.field(&path, fields, "eip712_version", token.eip712_version.into());
        let methods = token
            .transfer_methods
            .iter()
            .map(|&m| Value::from(m))
            .collect();
        self.field(&path, fields, "transfer_methods", ValueKind::Array(methods));
    }

    /// The `batch-settlement` contracts, preset on every EVM chain (one CREATE2 address each),
    /// known network or not.
    fn contracts(&mut self, path: &[String], chain: &mut Map<String, Value>) {
        let table = chain
            .entry("contracts".to_string())
            .or_insert_with(|| Value::new(None, ValueKind::Table(Map::new())));
        // Anything but a table is left to serde, which names the key.
        let ValueKind::Table(fields) = &mut table.kind else {
            return;
        };
        let path = [path, &["contracts".to_string()]].concat();
        for contract in BatchContract::ALL {
            self.field(&path, fields, contract.key(), contract.preset().into());
        }
    }

    /// A Solana cluster's USDC mint, as [`Filler::token`] fills an EVM chain's token.
    fn solana_chain(
        &mut self,
        path: &[String],
        chain: &mut Map<String, Value>,
        preset: &SolanaPreset,
    ) {
        let Some(fields) = preset_token(chain, "USDC") else {
            return;
        };
        let path = [path, &["tokens".to_string(), "USDC".to_string()]].concat();
        self.field(&path, fields, "mint", preset.usdc_mint.into());
        self.field(&path, fields, "decimals", u64::from(USDC_DECIMALS).into());
    }

    /// `table[key]`, the preset's value where nothing set it.
    fn field(
        &mut self,
        path: &[String],
        table: &mut Map<String, Value>,
        key: &str,
        preset: ValueKind,
    ) {
        let path = [path, &[key.to_string()]].concat();
        let origin = if !table.contains_key(key) {
            table.insert(key.to_string(), Value::new(None, preset));
            Origin::Preset
        } else if self.from_env.contains(&path) {
            Origin::Environment
        } else {
            Origin::File
        };
        self.origins.insert(path, origin);
    }
}

/// The fields of the preset token `symbol` of `chain`: the token is added when the chain names
/// no tokens, and left out (`None`) when it names others only.
fn preset_token<'c>(
    chain: &'c mut Map<String, Value>,
    symbol: &str,
) -> Option<&'c mut Map<String, Value>> {
    let tokens = chain
        .entry("tokens".to_string())
        .or_insert_with(|| Value::new(None, one_entry(symbol, Map::new())));
    let ValueKind::Table(tokens) = &mut tokens.kind else {
        return None;
    };
    match tokens.get_mut(symbol).map(|v| &mut v.kind) {
        Some(ValueKind::Table(fields)) => Some(fields),
        _ => None,
    }
}

/// A table of one table.
fn one_entry(key: &str, inner: Map<String, Value>) -> ValueKind {
    let inner = Value::new(None, ValueKind::Table(inner));
    ValueKind::Table(Map::from_iter([(key.to_string(), inner)]))
}

/// A unit variant as the configuration writes it (`l2`, `op-stack`); it serializes as a string,
/// and an empty one would be refused naming its key.
fn text<T: Serialize>(value: &T) -> String {
    serde_json::to_value(value)
        .ok()
        .and_then(|v| v.as_str().map(str::to_owned))
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use crate::config::testing::{load, temp_dir, write};
    use crate::config::{ChainKind, ConfigError, FeeModel, Settings};

    const BASE_SEPOLIA_USDC: &str = "0x036CbD53842c5426634e7929541eC2318f3dCF7e";
    const OTHER_TOKEN: &str = "0x5FbDB2315678afecb367f032d93F642f64180aa3";

    /// A facilitator serving `network`, with `chain` as the body of `[chains.<key>]`.
    fn served(key: &str, network: &str, chain: &str) -> String {
        format!("[chains.{key}]\n{chain}\n[facilitator]\nnetworks = [\"{network}\"]\n")
    }

    const RPC: &str = "rpc_urls = [\"https://base-sepolia.example/v2/KEY123\"]\n";

    fn load_with_env(body: &str, env: &[(&str, &str)]) -> Result<Settings, ConfigError> {
        let path = write(&temp_dir(), "presets-env.toml", body);
        let env: HashMap<String, String> = env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Settings::load_from(&[path], &env)
    }

    fn origin(settings: &Settings, path: &str) -> Option<&'static str> {
        let path: Vec<&str> = path.split('.').collect();
        settings.provenance.origin(&path).map(|o| o.as_str())
    }

    #[test]
    fn a_known_network_with_only_rpc_urls_gets_its_chain_id_kind_fee_model_and_usdc() {
        let settings = load("preset.toml", &served("base-sepolia", "base-sepolia", RPC)).unwrap();
        let chain = &settings.chains["base-sepolia"];
        assert_eq!(chain.chain_id, 84532);
        assert_eq!(chain.kind, ChainKind::L2);
        assert_eq!(chain.fee_model, FeeModel::OpStack);
        let usdc = &chain.tokens["USDC"];
        assert_eq!(usdc.address, BASE_SEPOLIA_USDC);
        assert_eq!((&*usdc.eip712_name, &*usdc.eip712_version), ("USDC", "2"));
        for field in ["chain_id", "kind", "fee_model", "tokens.USDC.address"] {
            let path = format!("chains.base-sepolia.{field}");
            assert_eq!(origin(&settings, &path), Some("preset"), "{field}");
        }
        let rendered = settings.render();
        assert!(rendered.contains("# base-sepolia: a known network (eip155:84532)"));
        assert!(
            rendered.contains("chain_id = 84532  # preset\n"),
            "{rendered}"
        );
        assert!(!rendered.contains("KEY123"), "{rendered}");
    }

    #[test]
    fn every_field_the_file_gives_overrides_the_preset_field_by_field() {
        let chain = format!(
            "{RPC}fee_model = \"eip1559\"\n[chains.base-sepolia.tokens.USDC]\neip712_name = \"USD Coin\"\n"
        );
        let settings = load(
            "override.toml",
            &served("base-sepolia", "base-sepolia", &chain),
        );
        let settings = settings.unwrap();
        let chain = &settings.chains["base-sepolia"];
        assert_eq!(chain.fee_model, FeeModel::Eip1559);
        let usdc = &chain.tokens["USDC"];
        assert_eq!(usdc.eip712_name, "USD Coin");
        assert_eq!(
            (&*usdc.address, &*usdc.eip712_version),
            (BASE_SEPOLIA_USDC, "2")
        );
        let usdc_origin = |field: &str| {
            origin(
                &settings,
                &format!("chains.base-sepolia.tokens.USDC.{field}"),
            )
        };
        assert_eq!(usdc_origin("eip712_name"), Some("file"));
        assert_eq!(usdc_origin("eip712_version"), Some("preset"));
        let rendered = settings.render();
        assert!(
            rendered.contains("eip712_name = \"USD Coin\"  # file\n"),
            "{rendered}"
        );
        assert!(
            rendered.contains("fee_model = \"eip1559\"  # file\n"),
            "{rendered}"
        );
    }

    #[test]
    fn the_environment_overrides_a_preset_and_can_configure_a_known_network_alone() {
        let body = "[facilitator]\nnetworks = [\"base-sepolia\"]\n";
        let env = [
            (
                "ROUTERD__CHAINS__BASE_SEPOLIA__RPC_URLS",
                "http://127.0.0.1:8545",
            ),
            (
                "ROUTERD__CHAINS__BASE_SEPOLIA__TOKENS__USDC__ADDRESS",
                OTHER_TOKEN,
            ),
        ];
        let settings = load_with_env(body, &env).unwrap();
        let chain = &settings.chains["base-sepolia"];
        assert_eq!(chain.rpc_urls[0].expose(), "http://127.0.0.1:8545");
        assert_eq!(chain.tokens["USDC"].address, OTHER_TOKEN);
        assert_eq!(chain.tokens["USDC"].eip712_name, "USDC");
        let path = "chains.base-sepolia.tokens.USDC.address";
        assert_eq!(origin(&settings, path), Some("environment"));
        assert!(settings.render().contains("  # environment\n"));
        // Over a file that gives the same field, the environment wins and says so.
        let chain =
            format!("{RPC}[chains.base-sepolia.tokens.USDC]\naddress = \"{BASE_SEPOLIA_USDC}\"\n");
        let settings = load_with_env(&served("base-sepolia", "base-sepolia", &chain), &env[1..]);
        let settings = settings.unwrap();
        assert_eq!(
            settings.chains["base-sepolia"].tokens["USDC"].address,
            OTHER_TOKEN
        );
        assert_eq!(origin(&settings, path), Some("environment"));
    }

    #[test]
    fn a_key_that_is_no_known_network_needs_every_field_as_before() {
        let err = load("unknown.toml", &served("chainX", "chainX", RPC)).unwrap_err();
        let missing = "config: missing configuration field \"chains.chainX.chain_id\"";
        assert_eq!(err.to_string(), missing);
        // Base Sepolia's chain id under another key is a chain like any other.
        let chain = format!("chain_id = 84532\nkind = \"l2\"\n{RPC}");
        let err = load("unknown-id.toml", &served("chainX", "chainX", &chain)).unwrap_err();
        assert_eq!(err.key, "chains.chainX.tokens");
        let body = format!("[chains.chainX]\n{chain}[router]\nchains = [\"chainX\"]\n");
        let settings = load("unknown-router.toml", &body).unwrap();
        assert!(settings.chains["chainX"].tokens.is_empty());
        assert_eq!(settings.chains["chainX"].fee_model, FeeModel::Auto);
        assert!(!settings.render().contains("# preset"));
        // A CAIP-2 id that is no known network is refused as a name, as before.
        let body =
            format!("[chains.\"eip155:31337\"]\n{chain}[router]\nchains = [\"eip155:31337\"]\n");
        let err = load("unknown-caip2.toml", &body).unwrap_err();
        assert_eq!(err.key, "chains.eip155:31337");
    }

    #[test]
    fn a_known_network_keyed_by_its_caip2_id_takes_its_v1_name() {
        let key = "\"eip155:84532\"";
        let settings = load("caip2.toml", &served(key, "eip155:84532", RPC)).unwrap();
        assert_eq!(settings.chains["base-sepolia"].chain_id, 84532);
        assert_eq!(settings.facilitator.unwrap().networks, ["base-sepolia"]);
        let env = [(
            "ROUTERD__CHAINS__BASE_SEPOLIA__RPC_URLS",
            "http://127.0.0.1:1",
        )];
        let settings = load_with_env(&served(key, "base-sepolia", RPC), &env).unwrap();
        assert_eq!(
            settings.chains["base-sepolia"].rpc_urls[0].expose(),
            "http://127.0.0.1:1"
        );
        let note =
            "# base-sepolia: a known network (eip155:84532, the key the configuration gives it)";
        assert!(settings.render().contains(note), "{}", settings.render());
        // Errors name the key as the configuration wrote it.
        let err = load(
            "caip2-bad.toml",
            &served(key, "base-sepolia", "rpc_urls = []\n"),
        );
        assert_eq!(err.unwrap_err().key, "chains.eip155:84532.rpc_urls");
        let both = format!(
            "{}[chains.base-sepolia]\n{RPC}",
            served(key, "base-sepolia", RPC)
        );
        assert_eq!(
            load("both.toml", &both).unwrap_err().key,
            "chains.eip155:84532"
        );
    }

    #[test]
    fn a_known_network_keeps_its_chain_id() {
        let body = served(
            "base-sepolia",
            "base-sepolia",
            &format!("chain_id = 8453\n{RPC}"),
        );
        let err = load("other-id.toml", &body).unwrap_err();
        assert_eq!(err.key, "chains.base-sepolia.chain_id");
        assert!(err.message.contains("chain id 84532"), "{err}");
        let body = served(
            "base-sepolia",
            "base-sepolia",
            &format!("chain_id = 0\n{RPC}"),
        );
        let err = load("zero-id.toml", &body).unwrap_err();
        assert_eq!(
            err.to_string(),
            "chains.base-sepolia.chain_id: must be greater than 0"
        );
    }

    #[test]
    fn a_tokens_table_without_the_preset_symbol_is_the_whole_list() {
        let token = format!(
            "[chains.base-sepolia.tokens.EURC]\naddress = \"{OTHER_TOKEN}\"\neip712_name = \"EURC\"\neip712_version = \"2\"\n"
        );
        let body = served("base-sepolia", "base-sepolia", &format!("{RPC}{token}"));
        let settings = load("eurc.toml", &body).unwrap();
        let symbols: Vec<&String> = settings.chains["base-sepolia"].tokens.keys().collect();
        assert_eq!(symbols, ["EURC"]);
        // A known network without a token preset needs its tokens, as any served network.
        let err = load("sepolia.toml", &served("sepolia", "sepolia", RPC)).unwrap_err();
        assert_eq!(err.key, "chains.sepolia.tokens");
    }
}
