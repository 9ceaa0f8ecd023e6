//! Version 1 sled stores (records without states or indexes) are rewritten as version 2 once,
//! at open. Claims that never produced a transaction are dropped (nothing was sent; the caller
//! may settle again); records with an outcome become final (their block is unknown: 0); the
//! rest are resumed.

use std::path::Path;

use super::sled::Store;
use super::{SettlementStore, StoreError};

/// Opens the sled store at `path`, rewriting a version 1 store as version 2 first.
pub async fn open(path: &Path) -> Result<Store, StoreError> {
    let store = Store::open(path)?;
    let migrated = migrate(&store).await?;
    if migrated > 0 {
        tracing::info!(migrated, "settlement records migrated from store version 1");
    }
    Ok(store)
}

async fn migrate(store: &Store) -> Result<usize, StoreError> {
    if !store.is_v1()? {
        return Ok(0);
    }
    let now = crate::clock::unix_now();
    let mut migrated = 0;
    for entry in store.settlements.iter() {
        let (id, bytes) = entry?;
        let id = String::from_utf8_lossy(&id).to_string();
        let old: v1::Record = serde_json::from_slice(&bytes).map_err(|e| StoreError::Corrupt {
            key: id.clone(),
            detail: e.to_string(),
        })?;
        match old.upgrade(now) {
            None => {
                store.settlements.remove(id.as_bytes())?;
            }
            Some(record) => {
                store.save(&[&record], false).await?;
                migrated += 1;
            }
        }
    }
    store.finish_migration().await?;
    Ok(migrated)
}

/// The record as routerd wrote it before settlement states existed.
mod v1 {
    use ethers_core::types::{Address, Bytes, H256, U256};
    use serde::Deserialize;

    use crate::evm::{erc3009, TxFees};
    use crate::ledger::{self, Inclusion, Reason, State};

    #[derive(Deserialize)]
    pub struct Attempt {
        hash: H256,
        raw: Bytes,
        max_fee_per_gas: U256,
        priority_fee: U256,
        sent_at_block: u64,
    }

    #[derive(Deserialize)]
    pub struct Outcome {
        success: bool,
        reason: Option<String>,
        message: Option<String>,
        transaction: H256,
    }

    #[derive(Deserialize)]
    pub struct Record {
        network: String,
        token: Address,
        payer: Address,
        value: U256,
        nonce: H256,
        valid_before: u64,
        digest: H256,
        calldata: Bytes,
        gas_limit: u64,
        signer: Option<Address>,
        signer_nonce: Option<u64>,
        attempts: Vec<Attempt>,
        outcome: Option<Outcome>,
    }

    impl Attempt {
        fn upgrade(self, signer: Address, nonce: u64) -> ledger::Attempt {
            ledger::Attempt {
                signer,
                nonce,
                hash: self.hash,
                raw: self.raw,
                // Version 1 stored a legacy price in both fields.
                fees: if self.max_fee_per_gas == self.priority_fee {
                    TxFees::Legacy {
                        gas_price: self.max_fee_per_gas,
                    }
                } else {
                    TxFees::Eip1559 {
                        max_fee: self.max_fee_per_gas,
                        priority_fee: self.priority_fee,
                    }
                },
                sent_at_block: self.sent_at_block,
            }
        }
    }

    impl Outcome {
        /// The terminal state and the answer of a settlement that had one (its block unknown).
        fn upgrade(self) -> (State, ledger::Outcome) {
            let inclusion = Inclusion {
                block: 0,
                block_hash: H256::zero(),
                transaction: self.transaction,
                succeeded: self.success,
            };
            let state = if self.success {
                State::Final { inclusion }
            } else {
                State::Reverted { inclusion }
            };
            // Version 1 stored the wire name; only this one was told apart.
            let reason = self.reason.map(|name| match name.as_str() {
                "insufficient_funds" => Reason::InsufficientFunds,
                _ => Reason::Payload,
            });
            let outcome = ledger::Outcome {
                success: self.success,
                reason,
                message: self.message,
                transaction: Some(self.transaction),
            };
            (state, outcome)
        }
    }

    impl Record {
        pub fn upgrade(self, now: u64) -> Option<ledger::Record> {
            let (signer, nonce) = (self.signer?, self.signer_nonce?);
            let attempts: Vec<ledger::Attempt> = self
                .attempts
                .into_iter()
                .map(|a| a.upgrade(signer, nonce))
                .collect();
            if attempts.is_empty() {
                return None;
            }
            let (state, outcome, finished_at) = match self.outcome.map(Outcome::upgrade) {
                None => (State::Sent { nonce }, None, None),
                Some((state, outcome)) => (state, Some(outcome), Some(now)),
            };
            let terms = ledger::EvmTerms {
                token: self.token,
                payer: self.payer,
                pay_to: erc3009::payee(&self.calldata).unwrap_or_default(),
                nonce: self.nonce,
                valid_before: self.valid_before,
                method: Default::default(),
                approves_permit2: false,
                via: None,
                sender: None,
                calldata: self.calldata,
                gas_limit: self.gas_limit,
            };
            let terms = ledger::Terms::Evm(terms);
            let mut record = ledger::Record::new(self.network, self.value, self.digest, terms);
            record.state = state;
            record.evm_mut()?.attempts = attempts;
            (record.outcome, record.finished_at) = (outcome, finished_at);
            Some(record)
        }
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        #[test]
        fn a_settled_v1_record_becomes_final_and_an_unsigned_claim_is_dropped() {
            let mut calldata = vec![0xe3, 0xee, 0x16, 0x0e];
            calldata.extend_from_slice(&[0u8; 32]);
            let mut to = [0u8; 32];
            to[12..].copy_from_slice(&[7u8; 20]);
            calldata.extend_from_slice(&to);
            let json = serde_json::json!({
                "network": "n", "token": Address::repeat_byte(1), "payer": Address::repeat_byte(2),
                "value": "0x3e8", "nonce": H256::repeat_byte(3), "valid_before": 10,
                "digest": H256::repeat_byte(4), "calldata": Bytes::from(calldata), "gas_limit": 90000,
                "signer": Address::repeat_byte(9), "signer_nonce": 5,
                "attempts": [{"hash": H256::repeat_byte(6), "raw": "0x01", "max_fee_per_gas": "0x2",
                              "priority_fee": "0x1", "sent_at_block": 3}],
                "outcome": {"success": true, "reason": null, "message": null, "transaction": H256::repeat_byte(6)}
            });
            let old: Record = serde_json::from_value(json.clone()).unwrap();
            let record = old.upgrade(100).unwrap();
            assert_eq!(record.evm().unwrap().pay_to, Address::repeat_byte(7));
            assert_eq!(record.state.name(), "final");
            assert_eq!(record.latest().unwrap().nonce, 5);
            assert!(record.outcome.unwrap().success);
            let mut claim = json;
            claim["attempts"] = serde_json::json!([]);
            claim["signer"] = serde_json::Value::Null;
            claim["outcome"] = serde_json::Value::Null;
            let old: Record = serde_json::from_value(claim).unwrap();
            assert!(old.upgrade(100).is_none());
        }
    }
}
