//! Known networks: the EVM network names of x402 v1 with their chain ids and their default
//! ERC-3009 token, shipped in the binary so that `[chains.base-sepolia]` with its `rpc_urls` is a
//! whole chain. A configuration names a known network by its x402 v1 name (`base-sepolia`) or by
//! its CAIP-2 id (`eip155:84532`); `resolve` fills what the configuration leaves out.
//!
//! Taken from the official packages' own tables, never guessed:
//! - `x402` 1.2.0 (x402 v1): `EvmNetworkToChainId` (its network names) and its USDC table
//!   (`src/types/shared/evm/config.ts`: address and EIP-712 name per chain id; `getDefaultAsset`
//!   gives every one EIP-712 version "2");
//! - `@x402/evm` 2.27.0: `EVM_NETWORK_CHAIN_ID_MAP` (the v1 names it still maps) and
//!   `DEFAULT_ASSETS` (the default asset per CAIP-2 id, the first entry of a chain being the one
//!   `getDefaultAsset` gives).
//!
//! Where both packages list a chain, the names, chain ids, addresses and EIP-712 domains agree
//! (x402 1.2.0 writes some addresses in lower case; they are written here with their EIP-55
//! checksum). Each entry says which package it comes from. Entries of `DEFAULT_ASSETS` with
//! `assetTransferMethod: "permit2"` are not ERC-3009 tokens and are left out of the token
//! presets: megaeth's MegaUSD (0xFAfDdbb3FC7688494971a79cc65DCa3EF82079E7, EIP-712 "MegaUSD"
//! version "1", 18 decimals), and the Permit2 assets of chains without a v1 name (Mezo, Radius,
//! Igra). Chains with a default asset but no v1 name in either package (Arbitrum One and Sepolia,
//! Celo Sepolia, XDC, HPP, ADI) are not known networks: routerd names a chain by its v1 name.
//!
//! `kind` and `fee_model` are routerd's, not the packages': `l1` for a chain that settles on
//! nothing else, `l2` for a rollup on Ethereum, `l3` for the third kind (an app-chain, an L3 or a
//! side-chain); `op-stack` where the chain charges the OP Stack's L1 data fee (Base).
//!
//! `max_fee_gwei` is routerd's too (access.md §2, "No single answer sets the price"): the default
//! `max_fee_per_gas`, a small multiple of what the network's blocks pay per gas at their busiest,
//! so that no node answer makes a settlement dearer than that. Rollups and app-chains whose blocks
//! pay well under a gwei get 10 gwei; chains with a floor on the base fee get a multiple of it
//! (Celo 25 gwei: 250; Story 16: 500; Monad 100: 2000; Polygon 25-30, with busy days in the
//! thousands: 3000) and IoTeX, whose price is fixed near 1000 gwei, 5000; Ethereum, Sepolia,
//! Avalanche and Flare, whose busiest blocks paid a hundred gwei or more, 500. Where the chain's
//! pricing is not documented in the packages (peaq, Sei, Stable) the cap is a generous 1000. An
//! operator who pays more, or wants less, sets `max_fee_per_gas`.

use super::schema::{ChainKind, FeeModel};

/// A known network and what it gives a chain that names it.
#[derive(Debug, PartialEq, Eq)]
pub struct Preset {
    /// The x402 v1 network name, which is also the configuration key of the chain.
    pub name: &'static str,
    pub chain_id: u64,
    pub kind: ChainKind,
    /// `None`: routerd's default (`auto`).
    pub fee_model: Option<FeeModel>,
    /// The default `max_fee_per_gas`, in gwei.
    pub max_fee_gwei: u64,
    /// The default ERC-3009 token, under its symbol; `None` where neither package has one.
    pub token: Option<PresetToken>,
}

/// A token preset: the default asset of its chain in the official packages.
#[derive(Debug, PartialEq, Eq)]
pub struct PresetToken {
    pub symbol: &'static str,
    pub address: &'static str,
    pub eip712_name: &'static str,
    pub eip712_version: &'static str,
    /// Every preset token has ERC-3009; Permit2 moves any ERC-20.
    pub transfer_methods: &'static [&'static str],
}

const fn token(
    symbol: &'static str,
    address: &'static str,
    eip712_name: &'static str,
    eip712_version: &'static str,
) -> Option<PresetToken> {
    Some(PresetToken {
        symbol,
        address,
        eip712_name,
        eip712_version,
        transfer_methods: &["eip3009", "permit2"],
    })
}

const fn usdc(address: &'static str, eip712_name: &'static str) -> Option<PresetToken> {
    token("USDC", address, eip712_name, "2")
}

/// The default cap of rollups and app-chains whose blocks pay well under a gwei per gas.
const ROLLUP_MAX_FEE_GWEI: u64 = 10;

const fn preset(
    name: &'static str,
    chain_id: u64,
    kind: ChainKind,
    token: Option<PresetToken>,
) -> Preset {
    Preset {
        name,
        chain_id,
        kind,
        fee_model: None,
        max_fee_gwei: ROLLUP_MAX_FEE_GWEI,
        token,
    }
}

/// `preset` with a default cap of `max_fee_gwei`.
const fn priced(max_fee_gwei: u64, preset: Preset) -> Preset {
    Preset {
        max_fee_gwei,
        ..preset
    }
}

const GWEI: u128 = 1_000_000_000;

impl Preset {
    /// The default `max_fee_per_gas` in wei, as the configuration writes it.
    pub fn max_fee_per_gas(&self) -> String {
        (u128::from(self.max_fee_gwei) * GWEI).to_string()
    }
}

/// Every known network, by name.
pub const PRESETS: &[Preset] = &[
    // x402 1.2.0 (name, chain id, USDC); @x402/evm 2.27.0 (name, chain id; no default asset).
    preset(
        "abstract",
        2741,
        ChainKind::L2,
        usdc("0x84A71ccD554Cc1b02749b35d22F684CC8ec987e1", "Bridged USDC"),
    ),
    preset(
        "abstract-testnet",
        11124,
        ChainKind::L2,
        usdc("0xe4C7fBB0a626ed208021ccabA6Be1566905E2dFc", "Bridged USDC"),
    ),
    // Both packages.
    priced(
        500,
        preset(
            "avalanche",
            43114,
            ChainKind::L1,
            usdc("0xB97EF9Ef8734C71904D8002F8b6Bc66Dd9c48a6E", "USD Coin"),
        ),
    ),
    // x402 1.2.0; @x402/evm 2.27.0 has the name, no default asset.
    priced(
        500,
        preset(
            "avalanche-fuji",
            43113,
            ChainKind::L1,
            usdc("0x5425890298aed601595a70AB815c96711a31Bc65", "USD Coin"),
        ),
    ),
    // Both packages.
    Preset {
        fee_model: Some(FeeModel::OpStack),
        ..preset(
            "base",
            8453,
            ChainKind::L2,
            usdc("0x833589fCD6eDb6E08f4c7C32D4f71b54bdA02913", "USD Coin"),
        )
    },
    // Both packages.
    Preset {
        fee_model: Some(FeeModel::OpStack),
        ..preset(
            "base-sepolia",
            84532,
            ChainKind::L2,
            usdc("0x036CbD53842c5426634e7929541eC2318f3dCF7e", "USDC"),
        )
    },
    // @x402/evm 2.27.0 only; its first asset (USDT and USAT follow it there, not preset here).
    priced(
        250,
        preset(
            "celo",
            42220,
            ChainKind::L2,
            usdc("0xcebA9300f2b948710d2653dD7B07f33A8B32118C", "USDC"),
        ),
    ),
    // x402 1.2.0; @x402/evm 2.27.0 has the name, no default asset.
    preset(
        "educhain",
        41923,
        ChainKind::L3,
        usdc(
            "0x12a272A581feE5577A5dFa371afEB4b2F3a8C2F8",
            "Bridged USDC (Stargate)",
        ),
    ),
    // @x402/evm 2.27.0 only.
    priced(
        500,
        preset(
            "ethereum",
            1,
            ChainKind::L1,
            usdc("0xA0b86991c6218b36c1d19D4a2e9Eb0cE3606eB48", "USD Coin"),
        ),
    ),
    // @x402/evm 2.27.0 only: USD₮0, EIP-3009.
    priced(
        500,
        preset(
            "flare",
            14,
            ChainKind::L1,
            token(
                "USDT0",
                "0xe7cd86e13AC4309349F30B3435a9d337750fC82D",
                "USD\u{20AE}0",
                "1",
            ),
        ),
    ),
    // x402 1.2.0; @x402/evm 2.27.0 has the name, no default asset.
    priced(
        5000,
        preset(
            "iotex",
            4689,
            ChainKind::L1,
            usdc("0xcDf79194C6C285077A58da47641D4dBe51F63542", "Bridged USDC"),
        ),
    ),
    // @x402/evm 2.27.0 only; its default asset (MegaUSD) is Permit2, not ERC-3009.
    preset("megaeth", 4326, ChainKind::L2, None),
    // @x402/evm 2.27.0 only.
    priced(
        2000,
        preset(
            "monad",
            143,
            ChainKind::L1,
            usdc("0x754704Bc059F8C67012fEd69BC8A327a5aafb603", "USDC"),
        ),
    ),
    // x402 1.2.0; @x402/evm 2.27.0 has the name, no default asset.
    priced(
        1000,
        preset(
            "peaq",
            3338,
            ChainKind::L1,
            usdc("0xbbA60da06c2c5424f03f7434542280FCAd453d10", "USDC"),
        ),
    ),
    // Both packages.
    priced(
        3000,
        preset(
            "polygon",
            137,
            ChainKind::L3,
            usdc("0x3c499c542cEF5E3811e1192ce70d8cC03d5c3359", "USD Coin"),
        ),
    ),
    // x402 1.2.0; @x402/evm 2.27.0 has the name, no default asset.
    priced(
        3000,
        preset(
            "polygon-amoy",
            80002,
            ChainKind::L3,
            usdc("0x41E94Eb019C0762f9Bfcf9Fb1E58725BfB0e7582", "USDC"),
        ),
    ),
    // Both packages.
    priced(
        1000,
        preset(
            "sei",
            1329,
            ChainKind::L1,
            usdc("0xe15fC38F6D8c56aF07bbCBe3BAf5708A2Bf42392", "USDC"),
        ),
    ),
    // Both packages.
    priced(
        1000,
        preset(
            "sei-testnet",
            1328,
            ChainKind::L1,
            usdc("0x4fCF1784B31630811181f670Aea7A7bEF803eaED", "USDC"),
        ),
    ),
    // @x402/evm 2.27.0 only, without a default asset.
    priced(500, preset("sepolia", 11_155_111, ChainKind::L1, None)),
    // x402 1.2.0; @x402/evm 2.27.0 has the name, no default asset.
    preset(
        "skale-base-sepolia",
        324_705_682,
        ChainKind::L3,
        usdc(
            "0x2e08028E3C4c2356572E096d8EF835cD5C6030bD",
            "Bridged USDC (SKALE Bridge)",
        ),
    ),
    // @x402/evm 2.27.0 only: USDT0, EIP-3009.
    priced(
        1000,
        preset(
            "stable",
            988,
            ChainKind::L1,
            token(
                "USDT0",
                "0x779Ded0c9e1022225f8E0630b35a9b54bE713736",
                "USDT0",
                "1",
            ),
        ),
    ),
    // @x402/evm 2.27.0 only: USDT0, EIP-3009.
    priced(
        1000,
        preset(
            "stable-testnet",
            2201,
            ChainKind::L1,
            token(
                "USDT0",
                "0x78Cf24370174180738C5B8E352B6D14c83a6c9A9",
                "USDT0",
                "1",
            ),
        ),
    ),
    // x402 1.2.0; @x402/evm 2.27.0 has the name, no default asset.
    priced(
        500,
        preset(
            "story",
            1514,
            ChainKind::L1,
            usdc("0xF1815bd50389c46847f0Bda824eC8da914045D14", "Bridged USDC"),
        ),
    ),
];

/// Where the table comes from, as `check-config` and the README say it.
pub const SOURCES: &str = "x402 1.2.0, @x402/evm 2.27.0";

const EIP155: &str = "eip155:";

impl Preset {
    /// The CAIP-2 id x402 v2 names this network by.
    pub fn caip2(&self) -> String {
        format!("{EIP155}{}", self.chain_id)
    }
}

/// The known network a configuration key names: its v1 name exactly, or `eip155:` and its decimal
/// chain id (no leading zeros, as x402 v2 writes it).
pub fn find(key: &str) -> Option<&'static Preset> {
    if let Some(preset) = PRESETS.iter().find(|p| p.name == key) {
        return Some(preset);
    }
    let id = key.strip_prefix(EIP155)?;
    if id.starts_with('0') || !id.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let id: u64 = id.parse().ok()?;
    PRESETS.iter().find(|p| p.chain_id == id)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use ethers_core::types::Address;
    use ethers_core::utils::to_checksum;

    use super::*;

    #[test]
    fn names_and_chain_ids_are_unique_and_addresses_checksummed() {
        let names: BTreeSet<_> = PRESETS.iter().map(|p| p.name).collect();
        let ids: BTreeSet<_> = PRESETS.iter().map(|p| p.chain_id).collect();
        assert_eq!((names.len(), ids.len()), (PRESETS.len(), PRESETS.len()));
        for token in PRESETS.iter().filter_map(|p| p.token.as_ref()) {
            let address: Address = token.address.parse().unwrap();
            assert_eq!(to_checksum(&address, None), token.address);
        }
    }

    #[test]
    fn a_known_network_is_found_by_its_name_or_its_caip2_id_only() {
        assert_eq!(find("base-sepolia").unwrap().chain_id, 84532);
        assert_eq!(find("eip155:84532").unwrap().name, "base-sepolia");
        assert_eq!(find("eip155:1").unwrap().name, "ethereum");
        for key in [
            "Base-Sepolia",
            "eip155:084532",
            "eip155:",
            "eip155:31337",
            "84532",
            "chainX",
        ] {
            assert_eq!(find(key), None, "{key}");
        }
    }
}
