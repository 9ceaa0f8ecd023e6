//! The settlement record the bench's store examples write (`seed-ledger`, `store-memory`): an
//! ERC-3009 payment of 1,000 on base-sepolia, claimed and not yet signed. Each example gives it
//! its own nonce, payer, digest, deadline and calldata, then moves it on through the ledger.

use ethers_core::types::{Address, Bytes, H256};
use routerd::ledger::{EvmTerms, Record, Terms};

/// What tells one bench record apart from another.
pub struct Payment {
    pub nonce: H256,
    pub payer: Address,
    pub digest: H256,
    pub valid_before: u64,
    pub calldata: Bytes,
}

pub fn claimed(payment: Payment) -> Record {
    let terms = EvmTerms {
        token: Address::repeat_byte(0x11),
        payer: payment.payer,
        pay_to: Address::repeat_byte(0x33),
        nonce: payment.nonce,
        valid_before: payment.valid_before,
        method: Default::default(),
        approves_permit2: false,
        via: None,
        sender: None,
        calldata: payment.calldata,
        gas_limit: 100_000,
    };
    Record::new(
        "base-sepolia".to_string(),
        1000.into(),
        payment.digest,
        Terms::Evm(terms),
    )
}
