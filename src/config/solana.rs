//! Solana networks (`svm.md` section 1): the known clusters, their settings and their checks. A
//! Solana network is configured under `[chains.<name>]` as an EVM one is, with Solana's keys (no
//! chain id: a cluster is named by its genesis hash). `resolve` moves these chains to
//! [`super::Settings::solana_chains`] before the typed settings are read, and `render` shows them
//! under `chains` again, so that the file and `check-config` speak of one `chains` table.

use std::collections::BTreeMap;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use super::redacted::Endpoint;
use super::ConfigError;

/// A known Solana cluster, from `@x402/svm` 2.27.0's network table and USDC mints.
#[derive(Debug, PartialEq, Eq)]
pub struct SolanaPreset {
    /// The x402 v1 network name, which is also the configuration key of the chain.
    pub name: &'static str,
    /// The cluster's genesis hash: `getGenesisHash` must answer it at start.
    pub genesis_hash: &'static str,
    pub usdc_mint: &'static str,
}

pub const SOLANA_PRESETS: &[SolanaPreset] = &[
    SolanaPreset {
        name: "solana",
        genesis_hash: "5eykt4UsFv8P8NJdTREpY1vzqKqZKvdpKuc147dw2N9d",
        usdc_mint: "EPjFWdd5AufqSSqeM2qN1xzybapC8G4wEGGkZwyTDt1v",
    },
    SolanaPreset {
        name: "solana-devnet",
        genesis_hash: "EtWTRABZaYq6iMfeYKouRu166VU2xqa1wcaWoxPkrZBG",
        usdc_mint: "4zMMC9srt5Ri5X14GAgXhaHii3GnPAEERYPJgZJDncDU",
    },
];

/// USDC's decimals on every Solana cluster.
pub const USDC_DECIMALS: u8 = 6;

/// CAIP-2 names a Solana cluster by the first 32 characters of its genesis hash.
const CAIP2_REFERENCE_LEN: usize = 32;

impl SolanaPreset {
    /// The CAIP-2 id x402 v2 names this cluster by.
    pub fn caip2(&self) -> String {
        format!("solana:{}", &self.genesis_hash[..CAIP2_REFERENCE_LEN])
    }

    /// `key` is [`Self::caip2`], read without writing it: every payment's network is looked up.
    fn is_caip2(&self, key: &str) -> bool {
        key.strip_prefix("solana:") == Some(&self.genesis_hash[..CAIP2_REFERENCE_LEN])
    }
}

/// The known Solana cluster a configuration key names: its v1 name or its CAIP-2 id.
pub fn find(key: &str) -> Option<&'static SolanaPreset> {
    SOLANA_PRESETS
        .iter()
        .find(|p| p.name == key || p.is_caip2(key))
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct SolanaChainSettings {
    pub rpc_urls: Vec<Endpoint>,
    /// The commitment at which a settlement answers success.
    #[serde(default)]
    pub commitment: Commitment,
    /// Cap on a payment transaction's SetComputeUnitLimit: with the price cap, what the fee
    /// payer can spend on one settlement.
    #[serde(default = "default_max_compute_units")]
    pub max_compute_units: u32,
    /// Cap on a payment's priority fee (compute unit limit times unit price, in lamports): what
    /// the fee payer may spend beyond the signature fees, whatever the limit and price allow.
    #[serde(default = "default_max_priority_fee_lamports")]
    pub max_priority_fee_lamports: u64,
    /// Longer than a blockhash lives (about 60 to 90 seconds), so that a settle's wait ends in
    /// an outcome, not a timeout, while the node answers.
    #[serde(default = "default_settle_timeout")]
    pub settle_timeout_secs: u64,
    /// Bound on one upstream request to this cluster.
    #[serde(default = "default_request_timeout")]
    pub request_timeout_ms: u64,
    /// Callers' reads in flight on this cluster, per kind (verify, settle), as on an EVM chain:
    /// over it a caller is answered 503 at once (access.md 3b, 3c).
    #[serde(default = "super::schema::default_max_caller_reads")]
    pub max_caller_reads: usize,
    #[serde(default)]
    pub tokens: BTreeMap<String, SolanaTokenSettings>,
}

/// An SPL Token or Token-2022 mint.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct SolanaTokenSettings {
    /// Base58.
    pub mint: String,
    pub decimals: u8,
}

/// `processed` is not offered: a processed transaction can still be dropped with its fork.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Commitment {
    #[default]
    Confirmed,
    Finalized,
}

impl Commitment {
    /// As Solana's JSON-RPC spells it.
    pub fn name(self) -> &'static str {
        match self {
            Commitment::Confirmed => "confirmed",
            Commitment::Finalized => "finalized",
        }
    }
}

/// Solana's own cap on the compute units of one transaction.
const MAX_TRANSACTION_COMPUTE_UNITS: u32 = 1_400_000;

/// What SPL Token's and Token-2022's TransferChecked need (about 6,000 and 10,000 units), with
/// the compute budget instructions, a memo and room to spare; `@x402/svm` asks 20,000.
fn default_max_compute_units() -> u32 {
    40_000
}
/// 40,000 units at 250,000 micro-lamports: far above what the clients ask (1 micro-lamport per
/// unit), far below the 200,000 lamports the 5 lamports per unit cap alone would allow.
fn default_max_priority_fee_lamports() -> u64 {
    10_000
}
fn default_settle_timeout() -> u64 {
    90
}
fn default_request_timeout() -> u64 {
    5000
}

impl SolanaChainSettings {
    /// The checks of a Solana `[chains.<name>]`, in this order; the first that fails is reported.
    pub(super) fn validate(&self, name: &str) -> Result<(), ConfigError> {
        let key = |field: &str| format!("chains.{name}.{field}");
        if self.rpc_urls.is_empty() {
            return Err(ConfigError::new(
                key("rpc_urls"),
                "at least one URL is required",
            ));
        }
        for (i, url) in self.rpc_urls.iter().enumerate() {
            let url = url.expose();
            if !(url.starts_with("http://") || url.starts_with("https://")) {
                return Err(ConfigError::new(
                    key("rpc_urls"),
                    format!("entry {i} is not an http(s) URL"),
                ));
            }
        }
        if !(1..=MAX_TRANSACTION_COMPUTE_UNITS).contains(&self.max_compute_units) {
            return Err(ConfigError::new(
                key("max_compute_units"),
                format!("must be between 1 and {MAX_TRANSACTION_COMPUTE_UNITS}"),
            ));
        }
        for (field, value) in [
            ("settle_timeout_secs", self.settle_timeout_secs),
            ("request_timeout_ms", self.request_timeout_ms),
            ("max_caller_reads", self.max_caller_reads as u64),
        ] {
            if value == 0 {
                return Err(ConfigError::new(key(field), "must be at least 1"));
            }
        }
        for (symbol, token) in &self.tokens {
            if solana_pubkey::Pubkey::from_str(&token.mint).is_err() {
                return Err(ConfigError::new(
                    key(&format!("tokens.{symbol}.mint")),
                    "not a base58 Solana address",
                ));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use crate::config::testing::{load, BASE};
    use crate::config::Commitment;

    const DEVNET_CAIP2: &str = "solana:EtWTRABZaYq6iMfeYKouRu166VU2xqa1";
    const DEVNET_USDC: &str = "4zMMC9srt5Ri5X14GAgXhaHii3GnPAEERYPJgZJDncDU";
    const RPC: &str = "rpc_urls = [\"https://devnet.example/rpc?api-key=KEY123\"]\n";

    fn with_chain(key: &str, body: &str) -> String {
        format!("{BASE}\n[chains.{key:?}]\n{RPC}{body}")
    }

    #[test]
    fn a_cluster_is_found_by_its_name_or_its_whole_caip2_id() {
        for preset in super::SOLANA_PRESETS {
            assert_eq!(super::find(preset.name).unwrap().name, preset.name);
            assert_eq!(super::find(&preset.caip2()).unwrap().name, preset.name);
        }
        assert!(super::find(&DEVNET_CAIP2[..20]).is_none());
        assert!(super::find(&format!("{DEVNET_CAIP2}x")).is_none());
        assert!(super::find(&DEVNET_CAIP2["solana:".len()..]).is_none());
    }

    #[test]
    fn a_known_cluster_with_only_rpc_urls_gets_usdc_and_the_defaults() {
        let settings = load("solana-preset.toml", &with_chain("solana-devnet", "")).unwrap();
        let chain = &settings.solana_chains["solana-devnet"];
        let usdc = &chain.tokens["USDC"];
        assert_eq!((usdc.mint.as_str(), usdc.decimals), (DEVNET_USDC, 6));
        assert_eq!(chain.commitment, Commitment::Confirmed);
        assert_eq!(chain.max_caller_reads, 1024);
        assert_eq!(
            (
                chain.max_compute_units,
                chain.max_priority_fee_lamports,
                chain.settle_timeout_secs
            ),
            (40_000, 10_000, 90)
        );
        assert!(!settings.chains.contains_key("solana-devnet"));
        let path = ["chains", "solana-devnet", "tokens", "USDC", "mint"];
        assert_eq!(
            settings.provenance.origin(&path).map(|o| o.as_str()),
            Some("preset")
        );
    }

    #[test]
    fn a_cluster_keyed_by_its_caip2_id_takes_its_v1_name_and_errors_keep_the_written_key() {
        let settings = load("solana-caip2.toml", &with_chain(DEVNET_CAIP2, "")).unwrap();
        assert!(settings.solana_chains.contains_key("solana-devnet"));
        let bad = with_chain(
            DEVNET_CAIP2,
            "[chains.\"solana:EtWTRABZaYq6iMfeYKouRu166VU2xqa1\".tokens.USDC]\nmint = \"0xnot\"\n",
        );
        let error = load("solana-caip2-bad.toml", &bad).unwrap_err();
        assert_eq!(error.key, format!("chains.{DEVNET_CAIP2}.tokens.USDC.mint"));
        let twice = format!(
            "{}\n[chains.solana-devnet]\n{RPC}",
            with_chain(DEVNET_CAIP2, "")
        );
        assert!(load("solana-twice.toml", &twice).is_err());
    }

    #[test]
    fn named_tokens_replace_the_preset_and_bad_values_name_their_key() {
        let mint = "TokenzQdBNbLqP5VEhdkAS6EPFLC1PQnBqCXEpPxuEb";
        let t22 = format!("[chains.solana-devnet.tokens.T22]\nmint = \"{mint}\"\ndecimals = 9\n");
        let settings = load("solana-t22.toml", &with_chain("solana-devnet", &t22)).unwrap();
        let tokens = &settings.solana_chains["solana-devnet"].tokens;
        assert_eq!(tokens.keys().collect::<Vec<_>>(), ["T22"]);
        for (body, key) in [
            (
                "max_compute_units = 0\n",
                "chains.solana-devnet.max_compute_units",
            ),
            (
                "settle_timeout_secs = 0\n",
                "chains.solana-devnet.settle_timeout_secs",
            ),
            (
                "max_caller_reads = 0\n",
                "chains.solana-devnet.max_caller_reads",
            ),
            (
                "commitment = \"processed\"\n",
                "chains.solana-devnet.commitment",
            ),
            ("rpc_urls = []\n", "chains.solana-devnet.rpc_urls"),
        ] {
            let body = with_chain("solana-devnet", body).replacen(
                RPC,
                "",
                usize::from(body.starts_with("rpc")),
            );
            let error = load("solana-bad.toml", &body).unwrap_err();
            assert_eq!(error.key, key, "{body}");
        }
    }

    #[test]
    fn the_router_refuses_a_cluster_the_facilitator_serves_one() {
        let router = format!(
            "{}\n[router]\nchains = [\"solana-devnet\"]\n",
            with_chain("solana-devnet", "")
        );
        assert_eq!(
            load("solana-router.toml", &router).unwrap_err().key,
            "router.chains"
        );
        let served = with_chain("solana-devnet", "").replace(
            "networks = [\"chainX\"]",
            &format!("networks = [\"chainX\", \"{DEVNET_CAIP2}\"]"),
        );
        let facilitator = load("solana-served.toml", &served)
            .unwrap()
            .facilitator
            .unwrap();
        assert_eq!(facilitator.solana_networks(), ["solana-devnet"]);
        assert_eq!(facilitator.evm_networks().collect::<Vec<_>>(), ["chainX"]);
        let unconfigured = BASE.replace(
            "networks = [\"chainX\"]",
            "networks = [\"chainX\", \"solana-devnet\"]",
        );
        assert_eq!(
            load("solana-unconfigured.toml", &unconfigured)
                .unwrap_err()
                .key,
            "facilitator.networks"
        );
    }

    #[test]
    fn check_config_shows_a_cluster_under_chains_with_its_url_redacted() {
        let settings = load("solana-render.toml", &with_chain("solana-devnet", "")).unwrap();
        let shown = settings.render();
        assert!(shown.contains("[chains.solana-devnet]"), "{shown}");
        assert!(
            shown.contains(&format!("a known Solana network ({DEVNET_CAIP2})")),
            "{shown}"
        );
        assert!(
            shown.contains(&format!("mint = \"{DEVNET_USDC}\"  # preset")),
            "{shown}"
        );
        assert!(
            !shown.contains("KEY123") && !shown.contains("solana_chains"),
            "{shown}"
        );
        let cluster = &shown[shown.find("[chains.solana-devnet]").unwrap()..];
        assert!(!cluster.contains("max_fee_per_gas"), "{shown}");
    }
}
