//! One codec for both backends: how a record becomes a stored row (its key, its JSON, whether it
//! is finished, its account and the value it still exposes) and how a stored row becomes a
//! record again. A backend decides where the row goes, never what it holds.

use ethers_core::types::U256;
use serde::Serialize;

use super::StoreError;
use crate::ledger::Record;

/// A record as every backend writes it.
pub struct Row {
    /// `PaymentKey::storage_key`.
    pub id: String,
    /// The record's JSON (text: PostgreSQL stores it as such, sled as its bytes).
    pub encoded: String,
    /// Set once the record is terminal with a finish time: it leaves the unfinished index for
    /// the finished one (pruned after `retention_days`).
    pub finished_at: Option<u64>,
    /// `Account::storage_key`: whose balance its exposure counts against.
    pub account: String,
    /// The value it still exposes (`Record::exposes`), if any.
    pub exposure: Option<U256>,
    /// For a Permit2 record: the nonce it spends and whether it approves Permit2.
    pub permit2: Option<Permit2Row>,
}

/// What a Permit2 record holds while in flight.
pub struct Permit2Row {
    /// `Permit2Nonce::storage_key`.
    pub nonce: String,
    /// `Permit2Nonce::owner_key`: Permit2 claims of one owner serialise under it.
    pub owner: String,
    pub approves: bool,
}

impl Row {
    pub fn of(record: &Record) -> Self {
        Row {
            id: record.key().storage_key(),
            encoded: serde_json::to_string(record).expect("stored values serialize"),
            finished_at: record.finished_at.filter(|_| record.state.is_terminal()),
            account: record.account().storage_key(),
            exposure: record.exposes().then_some(record.value),
            permit2: record.permit2_nonce().map(|nonce| Permit2Row {
                nonce: nonce.storage_key(),
                owner: nonce.owner_key(),
                approves: record.evm().is_some_and(|evm| evm.approves_permit2),
            }),
        }
    }

    /// Where an embedded store's exposure index keeps it, so that an account's exposures are
    /// the entries under `account|`: its id, which begins so for every EVM record (and so as
    /// earlier releases wrote it), else `account|id` (a Solana record: its key names no account).
    pub fn exposure_key(&self) -> String {
        match self.id.strip_prefix(self.account.as_str()) {
            Some(rest) if rest.starts_with('|') => self.id.clone(),
            _ => format!("{}|{}", self.account, self.id),
        }
    }

    /// The one finished/unfinished rule: unfinished until terminal with a finish time.
    pub fn unfinished(&self) -> bool {
        self.finished_at.is_none()
    }
}

/// JSON, the stored form of records and of a backend's own small values (leases, reservations).
pub fn encode<T: Serialize>(value: &T) -> Vec<u8> {
    serde_json::to_vec(value).expect("stored values serialize")
}

/// The record stored under `id`; `Corrupt` (naming the key) when it does not read.
pub fn decode(id: &str, bytes: &[u8]) -> Result<Record, StoreError> {
    serde_json::from_slice(bytes).map_err(|e| StoreError::Corrupt {
        key: id.to_string(),
        detail: e.to_string(),
    })
}
