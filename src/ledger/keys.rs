//! What the ledger is keyed by, each key with one storage encoding that both backends use. The
//! encodings are those routerd has always written (`network|0xasset|0xfrom|0xnonce`, lowercase
//! hex): a store of an earlier release is read as it is. `Display` shows the same text, for logs.

use std::fmt;

use ethers_core::types::{Address, H256};
use solana_pubkey::Pubkey;

use super::claim::stored_prefix;
use crate::primitives::hex_bytes;

/// A payment: its network and what names it there, in its family's terms. Each family's key has
/// the one storage encoding earlier releases wrote for it, so both read the same stores.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PaymentKey {
    pub network: String,
    pub id: PaymentId,
}

/// What names a payment on its network.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum PaymentId {
    /// x402-facilitator.md §3: (asset, from, nonce).
    Evm {
        asset: Address,
        from: Address,
        nonce: H256,
    },
    /// svm.md §4: the SHA-256 of its fee payer's signature (ed25519 signs deterministically and
    /// the message names its fee payer: one message, one signature).
    Svm { signature_digest: [u8; 32] },
}

/// Where a Solana key's encoding has the EVM key's asset and payer: earlier releases wrote a
/// Solana payment beside EVM ones as `network|<zero address>|<zero address>|0x<digest>`.
const NO_ADDRESS: &str = "0x0000000000000000000000000000000000000000";

impl PaymentKey {
    /// An EVM payment's key.
    pub fn evm(network: String, asset: Address, from: Address, nonce: H256) -> Self {
        PaymentKey {
            network,
            id: PaymentId::Evm { asset, from, nonce },
        }
    }

    /// A Solana payment's key.
    pub fn svm(network: &str, signature_digest: [u8; 32]) -> Self {
        PaymentKey {
            network: network.to_string(),
            id: PaymentId::Svm { signature_digest },
        }
    }

    /// The record's primary key in every backend.
    pub fn storage_key(&self) -> String {
        let network = &self.network;
        match &self.id {
            PaymentId::Evm { asset, from, nonce } => format!(
                "{network}|{}|{}|{}",
                hex_bytes(asset),
                hex_bytes(from),
                hex_bytes(nonce)
            ),
            PaymentId::Svm { signature_digest } => format!(
                "{network}|{NO_ADDRESS}|{NO_ADDRESS}|{}",
                hex_bytes(signature_digest)
            ),
        }
    }
}

/// Who pays, in their family's terms: the one a revert cooldown refuses (access.md §2).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Payer {
    Evm(Address),
    /// A transfer's authority (or a token account that an earlier release cooled down).
    Svm(Pubkey),
}

impl Payer {
    /// The 20 bytes its cooldown is stored and kept under: the address, or a Solana key's first
    /// 20, as earlier releases stored them (so their cooldowns still refuse).
    pub fn cooldown_id(&self) -> Address {
        match self {
            Payer::Evm(address) => *address,
            Payer::Svm(key) => stored_prefix(key),
        }
    }
}

impl fmt::Display for PaymentKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.storage_key())
    }
}

/// One payer's funds in one token on one network: what the payer-exposure rule (access.md §2)
/// adds its unfinished settlements up on. A Solana account is a token account of a mint, each
/// known by its first 20 bytes ([`Account::svm`]): the key earlier releases indexed it by.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Account {
    pub network: String,
    pub asset: Address,
    pub payer: Address,
}

impl Account {
    /// A Solana token account of `mint` (`source`), under the key earlier releases gave it:
    /// the first 20 bytes of each.
    pub fn svm(network: &str, mint: &Pubkey, source: &Pubkey) -> Self {
        Account {
            network: network.to_string(),
            asset: stored_prefix(mint),
            payer: stored_prefix(source),
        }
    }

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

    /// A Solana payer's cooldown and account are kept where earlier releases kept them.
    #[test]
    fn a_solana_payer_and_account_encode_as_before() {
        let key = Pubkey::new_from_array(std::array::from_fn(|i| i as u8));
        let prefix = Address::from_slice(&key.to_bytes()[..20]);
        assert_eq!(Payer::Svm(key).cooldown_id(), prefix);
        assert_eq!(Payer::Evm(prefix).cooldown_id(), prefix);
        let mint = Pubkey::new_from_array([0xAB; 32]);
        assert_eq!(
            Account::svm("solana-devnet", &mint, &key).storage_key(),
            format!("solana-devnet|0x{}|{}", "ab".repeat(20), hex_bytes(prefix))
        );
    }

    /// The encodings are what earlier releases wrote: changing one orphans every stored record.
    #[test]
    fn storage_encodings_are_the_ones_on_disk() {
        let key = PaymentKey::evm(
            "base".into(),
            Address::repeat_byte(0xAB),
            Address::repeat_byte(1),
            H256::repeat_byte(2),
        );
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
