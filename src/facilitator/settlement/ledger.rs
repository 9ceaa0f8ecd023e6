//! Settlement records in the store, keyed by payment. A record exists before anything is signed;
//! every signed attempt is stored together with its lane's next nonce, and flushed, before it is
//! broadcast; state changes follow. Two indexes keep start-up and pruning independent of history:
//! `unfinished` (payment key -> nothing) and `finished` (finish time ++ payment key -> nothing).

use sled::transaction::{ConflictableTransactionError, TransactionError};
use sled::Transactional;

use super::state::{LaneId, PaymentKey, Record};
use crate::store::{Store, StoreError};

pub enum Claim {
    /// This caller owns the settlement.
    Claimed,
    /// Somebody else does, or did: here is what is stored.
    Exists(Box<Record>),
}

#[derive(Clone)]
pub struct Ledger {
    store: Store,
}

impl Ledger {
    pub fn new(store: Store) -> Self {
        Self { store }
    }

    pub fn get(&self, key: &PaymentKey) -> Result<Option<Record>, StoreError> {
        Store::get_json(&self.store.settlements, &key.to_string())
    }

    /// Creates the record only if none exists: the single point where duplicates are told apart.
    pub fn claim(&self, key: &PaymentKey, record: &Record) -> Result<Claim, StoreError> {
        let id = key.to_string();
        let encoded = Store::encode(record);
        let existing = (&self.store.settlements, &self.store.unfinished)
            .transaction(|(settlements, unfinished)| {
                if let Some(current) = settlements.get(id.as_bytes())? {
                    return Ok(Some(current));
                }
                settlements.insert(id.as_bytes(), encoded.as_slice())?;
                unfinished.insert(id.as_bytes(), &[])?;
                Ok::<_, ConflictableTransactionError<()>>(None)
            })
            .map_err(storage)?;
        match existing {
            None => Ok(Claim::Claimed),
            Some(bytes) => Ok(Claim::Exists(Box::new(decode(&id, &bytes)?))),
        }
    }

    /// Stores freshly signed attempts and the lane's next nonce in one transaction, then flushes:
    /// after this returns, a crash can neither lose the transactions nor reuse their nonces.
    pub async fn commit_signed(
        &self,
        lane: &LaneId,
        next_nonce: u64,
        records: &[&Record],
    ) -> Result<(), StoreError> {
        let lane_id = lane.to_string();
        let encoded: Vec<(String, Vec<u8>)> = records
            .iter()
            .map(|r| (r.key().to_string(), Store::encode(r)))
            .collect();
        (&self.store.settlements, &self.store.signer_nonces)
            .transaction(|(settlements, nonces)| {
                for (id, bytes) in &encoded {
                    settlements.insert(id.as_bytes(), bytes.as_slice())?;
                }
                nonces.insert(lane_id.as_bytes(), &next_nonce.to_be_bytes())?;
                Ok::<_, ConflictableTransactionError<()>>(())
            })
            .map_err(storage)?;
        self.store.flush().await
    }

    /// Stores a state change; a terminal one moves the record from the unfinished index to the
    /// finished one. `durable` waits for the flush (answers depend on it); progress notes do not.
    pub async fn save(&self, record: &Record, durable: bool) -> Result<(), StoreError> {
        let id = record.key().to_string();
        let encoded = Store::encode(record);
        let finished = record
            .finished_at
            .filter(|_| record.state.is_terminal())
            .map(|at| finished_key(at, &id));
        (
            &self.store.settlements,
            &self.store.unfinished,
            &self.store.finished,
        )
            .transaction(|(settlements, unfinished, done)| {
                settlements.insert(id.as_bytes(), encoded.as_slice())?;
                if let Some(finished) = &finished {
                    unfinished.remove(id.as_bytes())?;
                    done.insert(finished.as_slice(), &[])?;
                }
                Ok::<_, ConflictableTransactionError<()>>(())
            })
            .map_err(storage)?;
        if durable {
            self.store.flush().await?;
        }
        Ok(())
    }

    /// Makes every save so far durable (one group commit).
    pub async fn flush(&self) -> Result<(), StoreError> {
        self.store.flush().await
    }

    /// Forgets a claim that never produced a transaction, so the payment can be settled again.
    pub async fn release(&self, key: &PaymentKey) -> Result<(), StoreError> {
        let id = key.to_string();
        (&self.store.settlements, &self.store.unfinished)
            .transaction(|(settlements, unfinished)| {
                settlements.remove(id.as_bytes())?;
                unfinished.remove(id.as_bytes())?;
                Ok::<_, ConflictableTransactionError<()>>(())
            })
            .map_err(storage)?;
        self.store.flush().await
    }

    pub fn lane_nonce(&self, lane: &LaneId) -> Result<Option<u64>, StoreError> {
        Ok(self
            .store
            .signer_nonces
            .get(lane.to_string())?
            .and_then(|v| Some(u64::from_be_bytes(v.as_ref().try_into().ok()?))))
    }

    pub async fn set_lane_nonce(&self, lane: &LaneId, next: u64) -> Result<(), StoreError> {
        self.store
            .signer_nonces
            .insert(lane.to_string(), &next.to_be_bytes())?;
        self.store.flush().await
    }

    /// Every record not in a terminal state, read through the index: start-up reads only these.
    pub fn unfinished(&self) -> Result<Vec<Record>, StoreError> {
        let mut out = Vec::new();
        for entry in self.store.unfinished.iter() {
            let (id, _) = entry?;
            let id = String::from_utf8_lossy(&id).to_string();
            match self.store.settlements.get(id.as_bytes())? {
                Some(bytes) => out.push(decode(&id, &bytes)?),
                None => {
                    self.store.unfinished.remove(id.as_bytes())?;
                }
            }
        }
        Ok(out)
    }

    /// Deletes finished records that ended before `cutoff` (unix seconds); answers how many.
    pub fn prune(&self, cutoff: u64) -> Result<usize, StoreError> {
        let mut pruned = 0;
        for entry in self.store.finished.range(..cutoff.to_be_bytes().to_vec()) {
            let (index_key, _) = entry?;
            let id = &index_key[8..];
            self.store.settlements.remove(id)?;
            self.store.finished.remove(&index_key)?;
            pruned += 1;
        }
        Ok(pruned)
    }
}

impl Ledger {
    /// Rewrites version 1 records (no states, no indexes) as version 2 records, once. Claims that
    /// never produced a transaction are dropped (nothing was sent; the caller may settle again);
    /// records with an outcome become final (their block is unknown: 0); the rest are resumed.
    pub async fn migrate_v1(&self) -> Result<usize, StoreError> {
        if !self.store.is_v1()? {
            return Ok(0);
        }
        let now = crate::clock::unix_now();
        let mut migrated = 0;
        for entry in self.store.settlements.iter() {
            let (id, bytes) = entry?;
            let id = String::from_utf8_lossy(&id).to_string();
            let old: v1::Record =
                serde_json::from_slice(&bytes).map_err(|e| StoreError::Corrupt {
                    key: id.clone(),
                    detail: e.to_string(),
                })?;
            match old.upgrade(now) {
                None => {
                    self.store.settlements.remove(id.as_bytes())?;
                }
                Some(record) => {
                    if !record.state.is_terminal() {
                        self.store.unfinished.insert(id.as_bytes(), &[])?;
                    }
                    self.save(&record, false).await?;
                    migrated += 1;
                }
            }
        }
        self.store.finish_migration().await?;
        Ok(migrated)
    }
}

/// The record as routerd wrote it before settlement states existed.
mod v1 {
    use ethers_core::types::{Address, Bytes, H256, U256};
    use serde::Deserialize;

    use super::super::state::{self, Inclusion, State};
    use crate::chain::TxFees;
    use crate::facilitator::types::Reason;

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

    impl Record {
        pub fn upgrade(self, now: u64) -> Option<state::Record> {
            let (signer, nonce) = (self.signer?, self.signer_nonce?);
            let attempts: Vec<state::Attempt> = self
                .attempts
                .into_iter()
                .map(|a| state::Attempt {
                    signer,
                    nonce,
                    hash: a.hash,
                    raw: a.raw,
                    // Version 1 stored a legacy price in both fields.
                    fees: if a.max_fee_per_gas == a.priority_fee {
                        TxFees::Legacy {
                            gas_price: a.max_fee_per_gas,
                        }
                    } else {
                        TxFees::Eip1559 {
                            max_fee: a.max_fee_per_gas,
                            priority_fee: a.priority_fee,
                        }
                    },
                    sent_at_block: a.sent_at_block,
                })
                .collect();
            if attempts.is_empty() {
                return None;
            }
            // transferWithAuthorization(from, to, ...): `to` is the second word after the selector.
            let pay_to = self
                .calldata
                .get(4 + 44..4 + 64)
                .map(Address::from_slice)
                .unwrap_or_default();
            let (state, outcome, finished_at) = match self.outcome {
                None => (State::Sent { nonce }, None, None),
                Some(o) => {
                    let inclusion = Inclusion {
                        block: 0,
                        block_hash: H256::zero(),
                        transaction: o.transaction,
                        succeeded: o.success,
                    };
                    let state = if o.success {
                        State::Final { inclusion }
                    } else {
                        State::Reverted { inclusion }
                    };
                    let reason = o.reason.map(|name| {
                        if name == Reason::InsufficientFunds.settle_name() {
                            Reason::InsufficientFunds
                        } else {
                            Reason::Payload
                        }
                    });
                    let outcome = state::Outcome {
                        success: o.success,
                        reason,
                        message: o.message,
                        transaction: Some(o.transaction),
                    };
                    (state, Some(outcome), Some(now))
                }
            };
            Some(state::Record {
                network: self.network,
                token: self.token,
                payer: self.payer,
                pay_to,
                value: self.value,
                nonce: self.nonce,
                valid_before: self.valid_before,
                digest: self.digest,
                calldata: self.calldata,
                gas_limit: self.gas_limit,
                state,
                attempts,
                outcome,
                lost: false,
                finished_at,
            })
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
            assert_eq!(record.pay_to, Address::repeat_byte(7));
            assert_eq!(record.state.name(), "final");
            assert_eq!(record.attempts[0].nonce, 5);
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

fn finished_key(at: u64, id: &str) -> Vec<u8> {
    let mut key = at.to_be_bytes().to_vec();
    key.extend_from_slice(id.as_bytes());
    key
}

fn decode(id: &str, bytes: &[u8]) -> Result<Record, StoreError> {
    serde_json::from_slice(bytes).map_err(|e| StoreError::Corrupt {
        key: id.to_string(),
        detail: e.to_string(),
    })
}

fn storage(e: TransactionError<()>) -> StoreError {
    match e {
        TransactionError::Storage(e) => StoreError::Sled(e),
        TransactionError::Abort(()) => unreachable!("the transaction never aborts"),
    }
}
