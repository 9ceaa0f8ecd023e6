//! Write-ahead settlement records in sled, keyed by payment. A record exists before anything is
//! signed; the signed raw transaction is stored and flushed before it is broadcast; the outcome
//! is stored once known. On start, unfinished records are handed back for resumption.

use ethers_core::types::{Address, Bytes, H256};
use serde::{Deserialize, Serialize};

use crate::store::{Store, StoreError};

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Outcome {
    pub success: bool,
    pub reason: Option<String>,
    pub message: Option<String>,
    pub transaction: H256,
}

/// One signed transaction for a settlement; fee bumps add attempts with the same nonce.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Attempt {
    pub hash: H256,
    pub raw: Bytes,
    pub max_fee_per_gas: ethers_core::types::U256,
    pub priority_fee: ethers_core::types::U256,
    pub sent_at_block: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Record {
    pub network: String,
    pub token: Address,
    pub payer: Address,
    pub value: ethers_core::types::U256,
    pub nonce: H256,
    pub valid_before: u64,
    /// The EIP-712 digest settled: a replay must carry the same authorization to be told the outcome.
    pub digest: H256,
    /// `transferWithAuthorization` calldata, kept so a fee bump can re-sign it.
    pub calldata: Bytes,
    pub gas_limit: u64,
    pub signer: Option<Address>,
    pub signer_nonce: Option<u64>,
    pub attempts: Vec<Attempt>,
    pub outcome: Option<Outcome>,
}

impl Record {
    pub fn latest_hash(&self) -> Option<H256> {
        self.attempts.last().map(|a| a.hash)
    }
}

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

    pub fn get(&self, key: &str) -> Result<Option<Record>, StoreError> {
        Store::get_json(&self.store.settlements, key)
    }

    /// Creates the record only if none exists: the single point where duplicates are told apart.
    pub fn claim(&self, key: &str, record: &Record) -> Result<Claim, StoreError> {
        let swapped = self.store.settlements.compare_and_swap(
            key,
            None as Option<&[u8]>,
            Some(Store::encode(record)),
        )?;
        match swapped {
            Ok(()) => Ok(Claim::Claimed),
            Err(current) => {
                let bytes = current.current.unwrap_or_default();
                let existing = serde_json::from_slice(&bytes).map_err(|e| StoreError::Corrupt {
                    key: key.to_string(),
                    detail: e.to_string(),
                })?;
                Ok(Claim::Exists(Box::new(existing)))
            }
        }
    }

    /// Stores a new signed attempt and the signer's next nonce together, then flushes: after this
    /// returns, a crash cannot lose the transaction or reuse its nonce.
    pub async fn record_attempt(
        &self,
        key: &str,
        record: &Record,
        lane_key: &str,
        next_nonce: u64,
    ) -> Result<(), StoreError> {
        use sled::Transactional;
        let encoded = Store::encode(record);
        (&self.store.settlements, &self.store.signer_nonces)
            .transaction(|(settlements, nonces)| {
                settlements.insert(key, encoded.as_slice())?;
                nonces.insert(lane_key, &next_nonce.to_be_bytes())?;
                Ok::<_, sled::transaction::ConflictableTransactionError<()>>(())
            })
            .map_err(|e| match e {
                sled::transaction::TransactionError::Storage(e) => StoreError::Sled(e),
                sled::transaction::TransactionError::Abort(()) => {
                    unreachable!("the transaction never aborts")
                }
            })?;
        self.store.flush().await
    }

    pub async fn save(&self, key: &str, record: &Record) -> Result<(), StoreError> {
        self.store.settlements.insert(key, Store::encode(record))?;
        self.store.flush().await
    }

    /// Forgets a claim that never produced a transaction, so the payment can be settled again.
    pub async fn release(&self, key: &str) -> Result<(), StoreError> {
        self.store.settlements.remove(key)?;
        self.store.flush().await
    }

    pub fn stored_lane_nonce(&self, lane_key: &str) -> Result<Option<u64>, StoreError> {
        Ok(self.store.signer_nonces.get(lane_key)?.and_then(|v| {
            let bytes: [u8; 8] = v.as_ref().try_into().ok()?;
            Some(u64::from_be_bytes(bytes))
        }))
    }

    pub async fn set_lane_nonce(&self, lane_key: &str, next: u64) -> Result<(), StoreError> {
        self.store
            .signer_nonces
            .insert(lane_key, &next.to_be_bytes())?;
        self.store.flush().await
    }

    /// Every record without an outcome: claims to drop, transactions to follow up.
    pub fn unfinished(&self) -> Result<Vec<(String, Record)>, StoreError> {
        let mut out = Vec::new();
        for entry in self.store.settlements.iter() {
            let (key, bytes) = entry?;
            let key = String::from_utf8_lossy(&key).to_string();
            let record: Record =
                serde_json::from_slice(&bytes).map_err(|e| StoreError::Corrupt {
                    key: key.clone(),
                    detail: e.to_string(),
                })?;
            if record.outcome.is_none() {
                out.push((key, record));
            }
        }
        Ok(out)
    }
}
