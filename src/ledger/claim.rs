//! How a record begins: one constructor for every family's claim, so that a stored record's
//! fields are filled in one place. A Solana record keeps, in the fields an EVM one stores its
//! token and payer in, what earlier releases wrote there (the first 20 bytes of its mint and of
//! its source token account; zeros and empties in the rest): records of either release read the
//! same, and their account keys stay those the stores index them by.

use ethers_core::types::{Address, Bytes, H256, U256};
use solana_pubkey::Pubkey;

use super::record::{Asking, Record, State, SvmSettlement, TransferMethod};

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
        let (evm, svm) = match terms {
            Terms::Evm(evm) => (evm, None),
            Terms::Svm(svm) => (
                EvmTerms {
                    token: stored_prefix(&svm.mint),
                    payer: stored_prefix(&svm.source),
                    pay_to: Address::zero(),
                    nonce: H256(svm.signature_digest),
                    valid_before: 0,
                    method: TransferMethod::default(),
                    approves_permit2: false,
                    via: None,
                    sender: None,
                    calldata: Bytes::new(),
                    gas_limit: 0,
                },
                Some(svm.settlement),
            ),
        };
        Record {
            network,
            token: evm.token,
            payer: evm.payer,
            pay_to: evm.pay_to,
            value,
            nonce: evm.nonce,
            valid_before: evm.valid_before,
            digest,
            method: evm.method,
            approves_permit2: evm.approves_permit2,
            via: evm.via,
            sender: evm.sender,
            calldata: evm.calldata,
            gas_limit: evm.gas_limit,
            request: None,
            payment_id: None,
            state: State::Claimed,
            attempts: Vec::new(),
            outcome: None,
            lost: false,
            finished_at: None,
            svm,
        }
    }

    /// The claim as `asking` makes it: its request key and the payer's payment id.
    pub fn asked_by(mut self, asking: &Asking) -> Record {
        self.request = asking.tag.clone();
        self.payment_id = asking.payment_id.clone();
        self
    }
}
