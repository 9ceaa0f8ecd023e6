//! How a record begins: one constructor for every family's claim, so that a record's fields are
//! filled in one place. How each family's record is stored is `stored`'s.

use ethers_core::types::{Address, Bytes, H256, U256};
use solana_pubkey::Pubkey;

use super::family::{EvmPart, EvmRecord, Family, SvmPart, SvmRecord, SvmSettlement};
use super::keys::SvmAccount;
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
/// its exposure counts against, and the signed transaction (the write-ahead). The settlement
/// stores the mint and source as these keys spell them (base58), whatever it was given: the
/// account reads back from them.
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
                exposed: SvmAccount::Whole {
                    mint: svm.mint,
                    source: svm.source,
                },
                settlement: SvmSettlement {
                    mint: svm.mint.to_string(),
                    source: Some(svm.source.to_string()),
                    ..svm.settlement
                },
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

    use crate::ledger::{Account, AccountId, Payer, PaymentKey, SvmAccount};

    fn keys() -> (Pubkey, Pubkey) {
        (
            Pubkey::new_from_array([0x11; 32]),
            Pubkey::new_from_array([0x22; 32]),
        )
    }

    /// A Solana record as the landed Solana release stored it (its settlement has no source).
    fn landed() -> serde_json::Value {
        crate::testing::landed_solana_record(0x5a)
    }

    /// A Solana claim is stored in the landed release's layout (so that release reads it), its
    /// settlement naming its mint and source in full, and reads back with its account in full.
    #[test]
    fn a_solana_claim_is_stored_in_the_landed_layout_with_its_keys_in_full() {
        let (mint, source) = keys();
        let terms = SvmTerms {
            signature_digest: [0x5a; 32],
            mint,
            source,
            settlement: crate::testing::svm_settlement(),
        };
        let record = Record::new(
            "solana-devnet".into(),
            U256::from(1000),
            H256::repeat_byte(0xd0),
            Terms::Svm(terms),
        );
        let mut written = landed();
        written["svm"]["mint"] = json!(mint.to_string());
        written["svm"]["source"] = json!(source.to_string());
        assert_eq!(serde_json::to_value(&record).unwrap(), written);
        let read: Record = serde_json::from_value(written.clone()).unwrap();
        assert_eq!(serde_json::to_value(&read).unwrap(), written);
        assert_eq!(read.account(), Account::svm("solana-devnet", mint, source));
        assert_eq!(read.account(), record.account());
        assert_eq!(read.key(), PaymentKey::svm("solana-devnet", [0x5a; 32]));
    }

    /// A record of the landed Solana release reads back unchanged, its key and account those
    /// that release indexed it by: no migration.
    #[test]
    fn a_solana_record_of_the_landed_release_reads_back_unchanged() {
        let landed = landed();
        let read: Record = serde_json::from_value(landed.clone()).unwrap();
        assert_eq!(serde_json::to_value(&read).unwrap(), landed);
        assert_eq!(read.key(), PaymentKey::svm("solana-devnet", [0x5a; 32]));
        let account = read.account();
        assert_eq!(
            account.id,
            AccountId::Svm(SvmAccount::Landed {
                mint: [0x11; 20],
                source: [0x22; 20]
            })
        );
        assert_eq!(
            account.storage_key(),
            format!("solana-devnet|0x{}|0x{}", "11".repeat(20), "22".repeat(20))
        );
        assert_eq!(read.paid_by(), None, "the fixture's authority is not a key");
        let mut paid = read;
        let source = keys().1;
        paid.svm_mut().unwrap().settlement.payer = source.to_string();
        assert_eq!(paid.paid_by(), Some(Payer::Svm(source)));
    }

    /// A stored source that is no key is a record that does not read, naming the field.
    #[test]
    fn a_solana_source_that_is_no_key_does_not_read() {
        let mut stored = landed();
        stored["svm"]["mint"] = json!(keys().0.to_string());
        stored["svm"]["source"] = json!("not a key");
        let error = serde_json::from_value::<Record>(stored).unwrap_err();
        assert!(error.to_string().contains("svm.source"), "{error}");
    }
}
