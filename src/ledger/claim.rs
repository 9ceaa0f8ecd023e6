//! How a record begins: one constructor for every family's claim, so that a record's fields are
//! filled in one place. How each family's record is stored is `stored`'s.

use ethers_core::types::{Address, Bytes, H256, U256};
use solana_pubkey::Pubkey;

use super::family::{EvmPart, EvmRecord, Family, SvmPart, SvmRecord, SvmSettlement};
use super::keys::Account;
use super::record::{Asking, Record, State, TransferMethod};

/// What an EVM claim settles: the authorization's terms and the transaction that carries them.
#[derive(Debug, Clone)]
pub struct EvmTerms {
    pub token: Address,
    pub payer: Address,
    pub pay_to: Address,
    pub nonce: H256,
    pub valid_before: u64,
    pub method: TransferMethod,
    pub approves_permit2: bool,
    pub via: Option<Address>,
    pub sender: Option<Address>,
    pub calldata: Bytes,
    pub gas_limit: u64,
}

/// What a Solana claim settles: the digest its key holds, the mint and source token account
/// its exposure counts against, and the signed transaction (the write-ahead).
#[derive(Debug, Clone)]
pub struct SvmTerms {
    pub signature_digest: [u8; 32],
    pub mint: Pubkey,
    pub source: Pubkey,
    pub settlement: SvmSettlement,
}

/// A claim's family and its terms.
#[derive(Debug, Clone)]
pub enum Terms {
    Evm(EvmTerms),
    Svm(SvmTerms),
}

/// The 20 bytes a Solana key is stored as where earlier releases stored an EVM address (a
/// Solana record's token and payer fields, an account's and a cooldown's keys): its first 20.
pub fn stored_prefix(key: &Pubkey) -> Address {
    Address::from_slice(&key.to_bytes()[..20])
}

impl Record {
    /// A claim of `value` on `network`: nothing signed or sent yet, nothing answered. `digest`
    /// is what only the same payment carries (the EIP-712 digest; a Solana message's hash).
    pub fn new(network: String, value: U256, digest: H256, terms: Terms) -> Record {
        let family = match terms {
            Terms::Evm(evm) => Family::Evm(EvmPart {
                token: evm.token,
                payer: evm.payer,
                pay_to: evm.pay_to,
                nonce: evm.nonce,
                valid_before: evm.valid_before,
                method: evm.method,
                approves_permit2: evm.approves_permit2,
                via: evm.via,
                sender: evm.sender,
                calldata: evm.calldata,
                gas_limit: evm.gas_limit,
                attempts: Vec::new(),
            }),
            Terms::Svm(svm) => Family::Svm(SvmPart {
                signature_digest: svm.signature_digest,
                exposed: Account::svm(&network, &svm.mint, &svm.source),
                settlement: svm.settlement,
            }),
        };
        Record {
            network,
            value,
            digest,
            request: None,
            payment_id: None,
            state: State::Claimed,
            outcome: None,
            lost: false,
            finished_at: None,
            family,
        }
    }

    /// The claim as `asking` makes it: its request key and the payer's payment id.
    pub fn asked_by(mut self, asking: &Asking) -> Record {
        self.request = asking.tag.clone();
        self.payment_id = asking.payment_id.clone();
        self
    }
}

impl EvmRecord {
    /// An EVM claim: [`Record::new`] of EVM terms, as the EVM lanes hold it.
    pub fn new(network: String, value: U256, digest: H256, terms: EvmTerms) -> EvmRecord {
        EvmRecord(Record::new(network, value, digest, Terms::Evm(terms)))
    }
}

impl SvmRecord {
    /// A Solana claim: [`Record::new`] of Solana terms, as the Solana followers hold it.
    pub fn new(network: String, value: U256, digest: H256, terms: SvmTerms) -> SvmRecord {
        SvmRecord(Record::new(network, value, digest, Terms::Svm(terms)))
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::ledger::{Payer, PaymentKey};

    /// A Solana claim is stored field for field as the landed release stored it (its JSON, its
    /// key and account), and reads back unchanged: no migration.
    #[test]
    fn a_solana_claim_is_stored_as_the_landed_release_stored_it() {
        let (mint, source) = (
            Pubkey::new_from_array([0x11; 32]),
            Pubkey::new_from_array([0x22; 32]),
        );
        let settlement = crate::testing::svm_settlement();
        let terms = SvmTerms {
            signature_digest: [0x5a; 32],
            mint,
            source,
            settlement: settlement.clone(),
        };
        let record = Record::new(
            "solana-devnet".into(),
            U256::from(1000),
            H256::repeat_byte(0xd0),
            Terms::Svm(terms),
        );
        let landed = json!({
            "network": "solana-devnet",
            "token": format!("0x{}", "11".repeat(20)),
            "payer": format!("0x{}", "22".repeat(20)),
            "pay_to": format!("0x{}", "00".repeat(20)),
            "value": "0x3e8",
            "nonce": format!("0x{}", "5a".repeat(32)),
            "valid_before": 0,
            "digest": format!("0x{}", "d0".repeat(32)),
            "calldata": "0x",
            "gas_limit": 0,
            "request": null,
            "state": "Claimed",
            "attempts": [],
            "outcome": null,
            "lost": false,
            "finished_at": null,
            "svm": serde_json::to_value(&settlement).unwrap(),
        });
        assert_eq!(serde_json::to_value(&record).unwrap(), landed);
        let read: Record = serde_json::from_value(landed.clone()).unwrap();
        assert_eq!(serde_json::to_value(&read).unwrap(), landed);
        assert_eq!(read.key(), PaymentKey::svm("solana-devnet", [0x5a; 32]));
        assert_eq!(
            read.account().storage_key(),
            format!("solana-devnet|0x{}|0x{}", "11".repeat(20), "22".repeat(20))
        );
        assert_eq!(read.paid_by(), None, "the fixture's authority is not a key");
        let mut paid = read;
        paid.svm_mut().unwrap().settlement.payer = source.to_string();
        assert_eq!(paid.paid_by(), Some(Payer::Svm(source)));
    }
}
