//! What the ledger is keyed by, each key with one storage encoding that both backends use. The
//! encodings are those routerd has always written (`network|0xasset|0xfrom|0xnonce`, lowercase
//! hex): a store of an earlier release is read as it is. `Display` shows the same text, for logs.

use std::fmt;

use ethers_core::types::{Address, H256};
use solana_pubkey::Pubkey;

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

/// Who pays, in their family's terms: the one a revert cooldown refuses (access.md §2). Its
/// cooldown is stored under its whole key ([`Payer::storage_bytes`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Payer {
    Evm(Address),
    /// A transfer's authority (or a token account that an earlier release cooled down).
    Svm(Pubkey),
}

impl Payer {
    /// The bytes its cooldown is stored under: the family's whole key (an address's 20 bytes,
    /// as every release stored them; a Solana key's 32).
    pub fn storage_bytes(&self) -> &[u8] {
        match self {
            Payer::Evm(address) => address.as_bytes(),
            Payer::Svm(key) => key.as_ref(),
        }
    }

    /// The payer whose cooldown is stored under `bytes`: 20 bytes are an EVM address, 32 a
    /// Solana key; anything else is no payer.
    pub fn from_storage_bytes(bytes: &[u8]) -> Option<Payer> {
        match bytes.len() {
            20 => Some(Payer::Evm(Address::from_slice(bytes))),
            32 => Some(Payer::Svm(Pubkey::try_from(bytes).ok()?)),
            _ => None,
        }
    }

    /// Where the landed Solana release stored this payer's cooldown, if elsewhere: a Solana key's
    /// first 20 bytes, which read back as an EVM address. Such a cooldown still refuses the payer
    /// until it ends; nothing is stored there any more, so it is only ever read.
    pub fn earlier_cooldown(&self) -> Option<Payer> {
        match self {
            Payer::Evm(_) => None,
            Payer::Svm(key) => Some(Payer::Evm(Address::from_slice(&key.as_ref()[..20]))),
        }
    }
}

/// A payer in its family's spelling, for logs: an address in lowercase hex, a Solana key in
/// base58.
impl fmt::Display for Payer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Payer::Evm(address) => write!(f, "{address:#x}"),
            Payer::Svm(key) => write!(f, "{key}"),
        }
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
    pub id: AccountId,
}

/// What names an account on its network, in its family's terms.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AccountId {
    /// A token and the address holding it.
    Evm {
        asset: Address,
        holder: Address,
    },
    Svm(SvmAccount),
}

/// A Solana account: a mint and a token account of it (a transfer's source).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SvmAccount {
    /// Each key in full.
    Whole { mint: Pubkey, source: Pubkey },
    /// As the landed Solana release keyed it: the first 20 bytes of the mint and of the source.
    /// Only records that release stored name it (read by `stored`, which finds no full source
    /// in them), so that their exposure is counted and removed under the key it was indexed
    /// under; no new record is keyed so.
    Landed { mint: [u8; 20], source: [u8; 20] },
}

impl Account {
    /// An EVM payer's balance of `asset`.
    pub fn evm(network: &str, asset: Address, holder: Address) -> Self {
        Account {
            network: network.to_string(),
            id: AccountId::Evm { asset, holder },
        }
    }

    /// A Solana token account of `mint` (`source`).
    pub fn svm(network: &str, mint: Pubkey, source: Pubkey) -> Self {
        Account {
            network: network.to_string(),
            id: AccountId::Svm(SvmAccount::Whole { mint, source }),
        }
    }

    /// The key its exposure is kept and serialised under: `network|0x<asset>|0x<holder>` in
    /// lowercase hex, as every release wrote it; a Solana account's keys in full (32 bytes
    /// each), or the 20 of each that the landed Solana release wrote.
    pub fn storage_key(&self) -> String {
        let (asset, holder): (&[u8], &[u8]) = match &self.id {
            AccountId::Evm { asset, holder } => (asset.as_bytes(), holder.as_bytes()),
            AccountId::Svm(SvmAccount::Whole { mint, source }) => (mint.as_ref(), source.as_ref()),
            AccountId::Svm(SvmAccount::Landed { mint, source }) => (mint, source),
        };
        format!(
            "{}|{}|{}",
            self.network,
            hex_bytes(asset),
            hex_bytes(holder)
        )
    }

    /// The keys its settlements in flight are indexed under: its own and, for a Solana account
    /// in full, the one the landed Solana release keyed its records by (the first 20 bytes of
    /// each). A record that release stored may still spend this token account until it ends,
    /// so it counts against this balance too, as it counted against every account sharing
    /// those bytes.
    pub fn exposure_keys(&self) -> Vec<String> {
        let mut keys = vec![self.storage_key()];
        if let AccountId::Svm(svm @ SvmAccount::Whole { .. }) = self.id {
            let (mint, source) = svm.landed_key();
            let landed = Account {
                network: self.network.clone(),
                id: AccountId::Svm(SvmAccount::Landed { mint, source }),
            };
            keys.push(landed.storage_key());
        }
        keys
    }
}

impl SvmAccount {
    /// The first 20 bytes of its mint and of its source: what the landed Solana release keyed
    /// it by (and wrote in a record's token and payer fields).
    pub fn landed_key(self) -> ([u8; 20], [u8; 20]) {
        let first = |key: Pubkey| std::array::from_fn(|i| key.as_ref()[i]);
        match self {
            SvmAccount::Whole { mint, source } => (first(mint), first(source)),
            SvmAccount::Landed { mint, source } => (mint, source),
        }
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

    fn shared_prefix(last: u8) -> Pubkey {
        Pubkey::new_from_array(std::array::from_fn(|i| if i < 20 { i as u8 } else { last }))
    }

    /// A payer's cooldown is kept under its whole key: an address's 20 bytes as ever, a Solana
    /// key's 32, read back in their family; two Solana keys sharing 20 bytes are two payers.
    #[test]
    fn a_payer_is_kept_under_its_whole_key() {
        let evm = Payer::Evm(Address::repeat_byte(0x51));
        assert_eq!(evm.storage_bytes(), [0x51; 20]);
        assert_eq!(Payer::from_storage_bytes(&[0x51; 20]), Some(evm));
        let (one, two) = (shared_prefix(1), shared_prefix(2));
        assert_eq!(Payer::Svm(one).storage_bytes(), one.to_bytes());
        assert_ne!(
            Payer::Svm(one).storage_bytes(),
            Payer::Svm(two).storage_bytes()
        );
        assert_eq!(
            Payer::from_storage_bytes(&one.to_bytes()),
            Some(Payer::Svm(one))
        );
        assert_eq!(Payer::from_storage_bytes(&[1; 21]), None);
        assert_eq!(evm.earlier_cooldown(), None);
        // Where the landed Solana release kept a Solana payer's cooldown.
        let landed = Payer::Evm(Address::from_slice(&one.to_bytes()[..20]));
        assert_eq!(Payer::Svm(one).earlier_cooldown(), Some(landed));
        assert_eq!(Payer::Svm(two).earlier_cooldown(), Some(landed));
    }

    /// Logs name a payer as its family writes it.
    #[test]
    fn a_payer_is_shown_in_its_familys_spelling() {
        let evm = Payer::Evm(Address::repeat_byte(0xAB));
        assert_eq!(evm.to_string(), format!("0x{}", "ab".repeat(20)));
        let key: Pubkey = "So11111111111111111111111111111111111111112"
            .parse()
            .unwrap();
        assert_eq!(
            Payer::Svm(key).to_string(),
            "So11111111111111111111111111111111111111112"
        );
    }

    /// A Solana account is its mint and source in full: two sources sharing 20 bytes are two
    /// accounts. One the landed Solana release keyed keeps that key, and what it indexed counts
    /// against the account in full too.
    #[test]
    fn a_solana_account_is_its_keys_in_full() {
        let mint = Pubkey::new_from_array([0xAB; 32]);
        let (one, two) = (shared_prefix(1), shared_prefix(2));
        let whole = Account::svm("solana-devnet", mint, one);
        assert_eq!(
            whole.storage_key(),
            format!("solana-devnet|0x{}|{}", "ab".repeat(32), hex_bytes(one))
        );
        assert_ne!(
            whole.storage_key(),
            Account::svm("solana-devnet", mint, two).storage_key()
        );
        let landed = Account {
            network: "solana-devnet".into(),
            id: AccountId::Svm(SvmAccount::Landed {
                mint: [0xAB; 20],
                source: std::array::from_fn(|i| i as u8),
            }),
        };
        assert_eq!(
            landed.storage_key(),
            format!(
                "solana-devnet|0x{}|{}",
                "ab".repeat(20),
                hex_bytes(&one.to_bytes()[..20])
            )
        );
        // Its records still in flight count against the account in full; it is keyed by itself.
        assert_eq!(
            whole.exposure_keys(),
            [whole.storage_key(), landed.storage_key()]
        );
        assert_eq!(landed.exposure_keys(), [landed.storage_key()]);
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
        let account = Account::evm("base", Address::repeat_byte(0xAB), Address::repeat_byte(1));
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
