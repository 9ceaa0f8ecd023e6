//! `[chains.<name>.contracts]`: where the `batch-settlement` scheme's contracts are on an EVM
//! chain. They are deployed with CREATE2 at one address on every chain, so every EVM chain has
//! them as presets (`resolve` fills them in and notes where each came from); a chain where they
//! live elsewhere overrides them field by field.
//!
//! The addresses are read and kept as [`Address`]es: a value that is not one is refused while
//! loading, naming its key (`chains.<name>.contracts.<field>`), and `check-config` shows each
//! with its EIP-55 checksum.

use ethers_core::types::Address;
use ethers_core::utils::to_checksum;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// One of the scheme's contracts: its key under `[chains.<name>.contracts]` and its preset.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BatchContract {
    /// `x402BatchSettlement`: the channels' escrow.
    BatchSettlement,
    /// `ERC3009DepositCollector`: deposits by ERC-3009 authorization.
    Erc3009DepositCollector,
    /// `Permit2DepositCollector`: deposits through Permit2.
    Permit2DepositCollector,
}

impl BatchContract {
    pub const ALL: [BatchContract; 3] = [
        BatchContract::BatchSettlement,
        BatchContract::Erc3009DepositCollector,
        BatchContract::Permit2DepositCollector,
    ];

    /// The contract's key under `[chains.<name>.contracts]`.
    pub fn key(self) -> &'static str {
        match self {
            BatchContract::BatchSettlement => "batch_settlement",
            BatchContract::Erc3009DepositCollector => "erc3009_deposit_collector",
            BatchContract::Permit2DepositCollector => "permit2_deposit_collector",
        }
    }

    /// The CREATE2 address of the x402 foundation's deployment (spec: batch-settlement.md).
    pub fn preset(self) -> &'static str {
        match self {
            BatchContract::BatchSettlement => "0x4020074e9dF2ce1deE5A9C1b5c3f541D02a10003",
            BatchContract::Erc3009DepositCollector => "0x4020806089470a89826cB9fB1f4059150b550004",
            BatchContract::Permit2DepositCollector => "0x4020425FAf3B746C082C2f942b4E5159887B0005",
        }
    }

    fn preset_address(self) -> Address {
        self.preset().parse().expect("a preset is an address")
    }
}

/// `[chains.<name>.contracts]`, resolved: the addresses the scheme calls on this chain.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct BatchContracts {
    #[serde(with = "address_text", default = "preset_batch_settlement")]
    pub batch_settlement: Address,
    #[serde(with = "address_text", default = "preset_erc3009_deposit_collector")]
    pub erc3009_deposit_collector: Address,
    #[serde(with = "address_text", default = "preset_permit2_deposit_collector")]
    pub permit2_deposit_collector: Address,
}

impl BatchContracts {
    pub fn get(&self, contract: BatchContract) -> Address {
        match contract {
            BatchContract::BatchSettlement => self.batch_settlement,
            BatchContract::Erc3009DepositCollector => self.erc3009_deposit_collector,
            BatchContract::Permit2DepositCollector => self.permit2_deposit_collector,
        }
    }
}

impl Default for BatchContracts {
    fn default() -> Self {
        Self {
            batch_settlement: preset_batch_settlement(),
            erc3009_deposit_collector: preset_erc3009_deposit_collector(),
            permit2_deposit_collector: preset_permit2_deposit_collector(),
        }
    }
}

fn preset_batch_settlement() -> Address {
    BatchContract::BatchSettlement.preset_address()
}
fn preset_erc3009_deposit_collector() -> Address {
    BatchContract::Erc3009DepositCollector.preset_address()
}
fn preset_permit2_deposit_collector() -> Address {
    BatchContract::Permit2DepositCollector.preset_address()
}

/// An address as the configuration writes it: `0x` and 40 hex digits, shown checksummed. The
/// `config` crate adds the key to the message of a value refused here.
mod address_text {
    use super::*;

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Address, D::Error> {
        let text = String::deserialize(d)?;
        let digits = text.strip_prefix("0x").unwrap_or("");
        if digits.len() != 40 {
            return Err(serde::de::Error::custom("not a 0x address"));
        }
        text.parse()
            .map_err(|_| serde::de::Error::custom("not a 0x address"))
    }

    pub fn serialize<S: Serializer>(address: &Address, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&to_checksum(address, None))
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::{BatchContract, BatchContracts};
    use crate::config::testing::{load, temp_dir, write, BASE};
    use crate::config::{ConfigError, Settings};

    const OTHER: &str = "0x5FbDB2315678afecb367f032d93F642f64180aa3";
    const CHAIN_LINE: &str = "rpc_urls = [\"http://127.0.0.1:8545\"]\n";

    fn load_with_env(body: &str, env: &[(&str, &str)]) -> Result<Settings, ConfigError> {
        let path = write(&temp_dir(), "batch-env.toml", body);
        let env: HashMap<String, String> = env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Settings::load_from(&[path], &env)
    }

    /// `BASE` with `[chains.chainX.contracts]` holding `lines`.
    fn with_contracts(lines: &str) -> String {
        BASE.replace(
            "[chains.chainX.tokens.USDC]",
            &format!("[chains.chainX.contracts]\n{lines}\n[chains.chainX.tokens.USDC]"),
        )
    }

    #[test]
    fn every_chain_has_the_presets_known_network_or_not() {
        let settings = load("contracts.toml", BASE).unwrap();
        assert_eq!(
            settings.chains["chainX"].contracts,
            BatchContracts::default()
        );
        let contracts = &settings.chains["chainX"].contracts;
        assert_eq!(
            format!("{:?}", contracts.batch_settlement),
            "0x4020074e9df2ce1dee5a9c1b5c3f541d02a10003"
        );
        assert_eq!(
            format!("{:?}", contracts.erc3009_deposit_collector),
            "0x4020806089470a89826cb9fb1f4059150b550004"
        );
        assert_eq!(
            format!("{:?}", contracts.permit2_deposit_collector),
            "0x4020425faf3b746c082c2f942b4e5159887b0005"
        );
        let body = "[chains.base-sepolia]\nrpc_urls = [\"http://127.0.0.1:8545\"]\n[facilitator]\nnetworks = [\"base-sepolia\"]\n";
        let settings = load("contracts-known.toml", body).unwrap();
        let contracts = &settings.chains["base-sepolia"].contracts;
        assert_eq!(*contracts, BatchContracts::default());
        let origin = settings.provenance.origin(&[
            "chains",
            "base-sepolia",
            "contracts",
            "permit2_deposit_collector",
        ]);
        assert_eq!(origin.map(|o| o.as_str()), Some("preset"));
    }

    #[test]
    fn a_file_or_the_environment_overrides_a_contract_field_by_field() {
        let body = with_contracts(&format!("batch_settlement = \"{OTHER}\""));
        let settings = load("contracts-file.toml", &body).unwrap();
        let contracts = &settings.chains["chainX"].contracts;
        assert_eq!(contracts.batch_settlement, OTHER.parse().unwrap());
        assert_eq!(
            contracts.get(BatchContract::Permit2DepositCollector),
            BatchContract::Permit2DepositCollector
                .preset()
                .parse()
                .unwrap()
        );
        let path = ["chains", "chainX", "contracts", "batch_settlement"];
        let origin = settings.provenance.origin(&path).map(|o| o.as_str());
        assert_eq!(origin, Some("file"));
        let env = [(
            "ROUTERD__CHAINS__CHAINX__CONTRACTS__ERC3009_DEPOSIT_COLLECTOR",
            OTHER,
        )];
        let settings = load_with_env(BASE, &env).unwrap();
        let contracts = &settings.chains["chainX"].contracts;
        assert_eq!(contracts.erc3009_deposit_collector, OTHER.parse().unwrap());
        assert_eq!(
            contracts.batch_settlement,
            BatchContracts::default().batch_settlement
        );
        let path = ["chains", "chainX", "contracts", "erc3009_deposit_collector"];
        let origin = settings.provenance.origin(&path).map(|o| o.as_str());
        assert_eq!(origin, Some("environment"));
    }

    #[test]
    fn a_contract_that_is_no_address_is_refused_naming_its_key() {
        for contract in BatchContract::ALL {
            for bad in ["0x1234", "nope", "4020074e9dF2ce1deE5A9C1b5c3f541D02a10003"] {
                let body = with_contracts(&format!("{} = \"{bad}\"", contract.key()));
                let err = load("contracts-bad.toml", &body).unwrap_err();
                let key = format!("chains.chainX.contracts.{}", contract.key());
                assert_eq!(err.key, key, "{bad}: {err}");
            }
        }
        let err = load("contracts-unknown.toml", &with_contracts("escrow = \"0x\"")).unwrap_err();
        assert_eq!(err.key, "chains.chainX.contracts.escrow", "{err}");
        // A known network keyed by its CAIP-2 id is named as the file wrote it.
        let body = format!(
            "[chains.\"eip155:84532\"]\n{CHAIN_LINE}[chains.\"eip155:84532\".contracts]\nbatch_settlement = \"0x12\"\n[facilitator]\nnetworks = [\"eip155:84532\"]\n"
        );
        let err = load("contracts-caip2.toml", &body).unwrap_err();
        assert_eq!(err.key, "chains.eip155:84532.contracts.batch_settlement");
    }

    #[test]
    fn check_config_shows_the_contracts_checksummed_with_their_origin_when_the_scheme_is_on() {
        let body = format!(
            "{}batch_settlement = true\n",
            with_contracts(&format!("batch_settlement = \"{}\"", OTHER.to_lowercase()))
        );
        let rendered = load("contracts-render.toml", &body).unwrap().render();
        assert!(
            rendered.contains("[chains.chainX.contracts]\n"),
            "{rendered}"
        );
        assert!(
            rendered.contains(&format!("batch_settlement = \"{OTHER}\"  # file\n")),
            "{rendered}"
        );
        let preset = BatchContract::Erc3009DepositCollector.preset();
        let line = format!("erc3009_deposit_collector = \"{preset}\"  # preset\n");
        assert!(rendered.contains(&line), "{rendered}");
        // Off, the scheme reads no contract, and check-config shows none.
        let rendered = load("contracts-off.toml", BASE).unwrap().render();
        assert!(!rendered.contains("contracts"), "{rendered}");
    }

    #[test]
    fn the_facilitator_keys_default_to_off_no_key_and_100_calls() {
        let settings = load("batch-defaults.toml", BASE).unwrap();
        let facilitator = settings.facilitator.unwrap();
        assert!(!facilitator.batch_settlement);
        assert_eq!(facilitator.receiver_authorizer_key_file, "");
        assert_eq!(facilitator.batch_max_calls_per_tx, 100);
        let body = format!(
            "{BASE}batch_settlement = true\nreceiver_authorizer_key_file = \"/etc/routerd/authorizer.key\"\nbatch_max_calls_per_tx = 7\n"
        );
        let facilitator = load("batch-file.toml", &body).unwrap().facilitator.unwrap();
        assert!(facilitator.batch_settlement);
        assert_eq!(
            facilitator.receiver_authorizer_key_file,
            "/etc/routerd/authorizer.key"
        );
        assert_eq!(facilitator.batch_max_calls_per_tx, 7);
    }

    #[test]
    fn the_environment_sets_the_facilitator_keys() {
        let env = [
            ("ROUTERD__FACILITATOR__BATCH_SETTLEMENT", "true"),
            ("ROUTERD__FACILITATOR__BATCH_MAX_CALLS_PER_TX", "12"),
            (
                "ROUTERD__FACILITATOR__RECEIVER_AUTHORIZER_KEY_FILE",
                "/run/authorizer.key",
            ),
        ];
        let settings = load_with_env(BASE, &env).unwrap();
        let facilitator = settings.facilitator.unwrap();
        assert!(facilitator.batch_settlement);
        assert_eq!(facilitator.batch_max_calls_per_tx, 12);
        assert_eq!(
            facilitator.receiver_authorizer_key_file,
            "/run/authorizer.key"
        );
        let env = [("ROUTERD__FACILITATOR__BATCH_MAX_CALLS_PER_TX", "0")];
        let err = load_with_env(BASE, &env).unwrap_err();
        assert_eq!(err.key, "facilitator.batch_max_calls_per_tx");
    }

    #[test]
    fn batch_max_calls_per_tx_below_one_is_refused_naming_the_key() {
        let err = load(
            "batch-zero.toml",
            &format!("{BASE}batch_max_calls_per_tx = 0\n"),
        );
        let err = err.unwrap_err();
        assert_eq!(
            err.to_string(),
            "facilitator.batch_max_calls_per_tx: must be at least 1"
        );
        let err = load(
            "batch-neg.toml",
            &format!("{BASE}batch_max_calls_per_tx = -1\n"),
        );
        assert_eq!(err.unwrap_err().key, "facilitator.batch_max_calls_per_tx");
    }

    #[test]
    fn check_config_shows_the_authorizer_key_file_never_the_key() {
        const KEY: &str = "0x59c6995e998f97a5a0044966f0945389dc9e86dae88c7a8412f4603b6b78690d";
        let dir = temp_dir();
        let key_file = write(&dir, "authorizer.key", &format!("{KEY}\n"));
        let body = format!(
            "{BASE}batch_settlement = true\nreceiver_authorizer_key_file = {:?}\n",
            key_file.display().to_string()
        );
        let rendered = load("batch-key.toml", &body).unwrap().render();
        let line = format!(
            "receiver_authorizer_key_file = {:?}\n",
            key_file.display().to_string()
        );
        assert!(rendered.contains(&line), "{rendered}");
        assert!(rendered.contains("batch_settlement = true\n"), "{rendered}");
        assert!(
            rendered.contains("batch_max_calls_per_tx = 100\n"),
            "{rendered}"
        );
        assert!(!rendered.contains(&KEY[2..]), "{rendered}");
    }
}
