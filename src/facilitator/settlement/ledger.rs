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
