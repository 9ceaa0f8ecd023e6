//! What the ledger is keyed by, each key with one storage encoding that both backends use. The
//! encodings are those routerd has always written (`network|0xasset|0xfrom|0xnonce`, lowercase
//! hex): a store of an earlier release is read as it is. `Display` shows the same text, for logs.

use std::fmt;

use ethers_core::types::{Address, H256};

use crate::primitives::hex_bytes;

/// A payment, as x402-facilitator.md §3 identifies it: (network, asset, from, nonce).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PaymentKey {
    pub network: String,
    pub asset: Address,
    pub from: Address,
    pub nonce: H256,
}

impl PaymentKey {
    /// A Solana payment: its network (which names the family) and its message hash; the EVM
    /// fields are zero. Stored as `network|0x0…0|0x0…0|0x<message hash>`, beside EVM keys.
    pub fn svm(network: &str, message_hash: [u8; 32]) -> Self {
        PaymentKey {
            network: network.to_string(),
            asset: Address::zero(),
            from: Address::zero(),
            nonce: H256(message_hash),
        }
    }

    /// The record's primary key in every backend.
    pub fn storage_key(&self) -> String {
        format!(
            "{}|{}|{}|{}",
            self.network,
            hex_bytes(self.asset),
            hex_bytes(self.from),
            hex_bytes(self.nonce)
        )
    }
}

impl fmt::Display for PaymentKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.storage_key())
    }
}

/// One payer's funds in one token on one network: what the payer-exposure rule (access.md §2)
/// adds its unfinished settlements up on.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Account {
    pub network: String,
    pub asset: Address,
    pub payer: Address,
}

impl Account {
    /// The key its exposure is kept and serialised under.
    pub fn storage_key(&self) -> String {
        format!(
            "{}|{}|{}",
            self.network,
            hex_bytes(self.asset),
            hex_bytes(self.payer)
        )
    }
}

/// A Permit2 nonce of one owner on one network. Permit2 keeps one nonce bitmap per owner, for
/// every token: two payments of different tokens under the same nonce cannot both settle.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Permit2Nonce {
    pub network: String,
    pub owner: Address,
    pub nonce: H256,
}

impl Permit2Nonce {
    /// The key under which an in-flight payment holds it, and claims of its owner serialise.
    pub fn storage_key(&self) -> String {
        format!(
            "{}|{}|{}",
            self.network,
            hex_bytes(self.owner),
            hex_bytes(self.nonce)
        )
    }

    /// The key claims of its owner on its network serialise under (Permit2's nonces span tokens).
    pub fn owner_key(&self) -> String {
        format!("{}|{}", self.network, hex_bytes(self.owner))
    }
}

/// One signer key on one network: its own nonce sequence.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct LaneId {
    pub network: String,
    pub signer: Address,
}

impl LaneId {
    /// The key of its lease and next nonce.
    pub fn storage_key(&self) -> String {
        format!("{}|{}", self.network, hex_bytes(self.signer))
    }
}

impl fmt::Display for LaneId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.storage_key())
    }
}

/// The router's nonce reservations of one sender on one chain, as one caller (an API key's name
/// or a client address) sees them (access.md §6).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct RouterNonceKey {
    pub chain: String,
    pub sender: Address,
    pub caller: String,
}

impl RouterNonceKey {
    pub fn storage_key(&self) -> String {
        format!("{}|{}|{}", self.chain, hex_bytes(self.sender), self.caller)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The encodings are what earlier releases wrote: changing one orphans every stored record.
    #[test]
    fn storage_encodings_are_the_ones_on_disk() {
        let key = PaymentKey {
            network: "base".into(),
            asset: Address::repeat_byte(0xAB),
            from: Address::repeat_byte(1),
            nonce: H256::repeat_byte(2),
        };
        assert_eq!(
            key.storage_key(),
            format!(
                "base|0x{}|0x{}|0x{}",
                "ab".repeat(20),
                "01".repeat(20),
                "02".repeat(32)
            )
        );
        assert_eq!(
            PaymentKey::svm("solana-devnet", [3; 32]).storage_key(),
            format!(
                "solana-devnet|0x{}|0x{}|0x{}",
                "00".repeat(20),
                "00".repeat(20),
                "03".repeat(32)
            )
        );
        let lane = LaneId {
            network: "base".into(),
            signer: Address::repeat_byte(0xCD),
        };
        // Earlier releases wrote the signer with `{:?}`: the same full lowercase hex.
        assert_eq!(
            lane.storage_key(),
            format!("base|{:?}", Address::repeat_byte(0xCD))
        );
        let account = Account {
            network: "base".into(),
            asset: Address::repeat_byte(0xAB),
            payer: Address::repeat_byte(1),
        };
        assert_eq!(
            account.storage_key(),
            format!("base|0x{}|0x{}", "ab".repeat(20), "01".repeat(20))
        );
        let router = RouterNonceKey {
            chain: "l1".into(),
            sender: Address::repeat_byte(0xEF),
            caller: "ip:127.0.0.1".into(),
        };
        assert_eq!(
            router.storage_key(),
            format!("l1|0x{}|ip:127.0.0.1", "ef".repeat(20))
        );
    }
}
