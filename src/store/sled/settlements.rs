//! sled's settlement records: the claim (one transaction over the record, its indexes, its
//! exposure and its Permit2 holds), saves, releases, passes, resumption and pruning.

use async_trait::async_trait;
use sled::transaction::{ConflictableTransactionError, TransactionalTree};
use sled::{Transactional, Tree};

use super::{transaction_error, Store};
use crate::ledger::{Account, Pass, PaymentKey, Record};
use crate::store::rows::{self, Row};
use crate::store::{Claim, InFlight, Lease, Limits, SettlementStore, StoreError};
use ethers_core::types::U256;

impl Store {
    /// The trees a claim writes and a release clears, in one transaction.
    fn record_trees(&self) -> (&Tree, &Tree, &Tree, &Tree, &Tree, &Tree) {
        (
            &self.settlements,
            &self.unfinished,
            &self.exposure,
            &self.request_keys,
            &self.permit2_exposure,
            &self.permit2_nonces,
        )
    }

    /// The record stored under `id`, if any.
    fn stored(&self, id: &str) -> Result<Option<Record>, StoreError> {
        let Some(bytes) = self.settlements.get(id.as_bytes())? else {
            return Ok(None);
        };
        rows::decode(id, &bytes).map(Some)
    }

    /// The account's settlements in flight, added up.
    fn in_flight(&self, account: &Account) -> Result<InFlight, StoreError> {
        let prefix = format!("{}|", account.storage_key());
        let mut in_flight = InFlight {
            value: exposed(&self.exposure, account)?,
            ..InFlight::default()
        };
        for entry in self.permit2_exposure.scan_prefix(prefix.as_bytes()) {
            let (_, held) = entry?;
            let value = U256::from_big_endian(&held[..32.min(held.len())]);
            in_flight.permit2_value = in_flight.permit2_value.saturating_add(value);
            in_flight.permit2 += 1;
            in_flight.approvals += u64::from(held.get(32) == Some(&1));
        }
        Ok(in_flight)
    }

    /// Whether a payment other than `id` in flight spends the Permit2 nonce of `row`.
    fn nonce_held(&self, row: &Row, id: &str) -> Result<bool, StoreError> {
        let Some(permit2) = &row.permit2 else {
            return Ok(false);
        };
        let holder = self.permit2_nonces.get(permit2.nonce.as_bytes())?;
        Ok(holder.is_some_and(|holder| holder != id.as_bytes()))
    }
}

/// Keeps a Permit2 row's hold on its account's allowance and its nonce while it is in flight,
/// and lets both go once it is not (or, with `released`, is gone).
fn hold_permit2(
    row: &Row,
    released: bool,
    holds: &TransactionalTree,
    nonces: &TransactionalTree,
) -> Result<(), ConflictableTransactionError<StoreError>> {
    let Some(permit2) = &row.permit2 else {
        return Ok(());
    };
    let (id, nonce) = (row.id.as_bytes(), permit2.nonce.as_bytes());
    match row.exposure.filter(|_| !released) {
        Some(value) => {
            let mut held = word(value).to_vec();
            held.push(u8::from(permit2.approves));
            holds.insert(id, held)?;
            nonces.insert(nonce, id)?;
        }
        None => {
            holds.remove(id)?;
            if nonces.get(nonce)?.is_some_and(|holder| holder == id) {
                nonces.remove(nonce)?;
            }
        }
    }
    Ok(())
}

fn word(value: U256) -> [u8; 32] {
    let mut bytes = [0u8; 32];
    value.to_big_endian(&mut bytes);
    bytes
}

/// The values the account's settlements still expose, added up under its `exposure_keys`.
fn exposed(exposure: &Tree, account: &Account) -> Result<U256, StoreError> {
    let mut total = U256::zero();
    for key in account.exposure_keys() {
        for entry in exposure.scan_prefix(format!("{key}|").as_bytes()) {
            let (_, value) = entry?;
            total = total.saturating_add(U256::from_big_endian(&value));
        }
    }
    Ok(total)
}

fn finished_key(at: u64, id: &str) -> Vec<u8> {
    let mut key = at.to_be_bytes().to_vec();
    key.extend_from_slice(id.as_bytes());
    key
}

#[async_trait]
impl SettlementStore for Store {
    async fn get(&self, key: &PaymentKey) -> Result<Option<Record>, StoreError> {
        Store::get_json(&self.settlements, &key.storage_key())
    }

    async fn exposed(&self, account: &Account) -> Result<U256, StoreError> {
        exposed(&self.exposure, account)
    }

    /// One instance: the claimer always signs, so nothing is queued.
    async fn claim(
        &self,
        key: &PaymentKey,
        record: &Record,
        _taken_by: Option<&Lease>,
        limits: &Limits,
    ) -> Result<Claim, StoreError> {
        let id = key.storage_key();
        let _claiming = self.claims.lock().expect("claims lock");
        if let Some(current) = self.settlements.get(id.as_bytes())? {
            return Ok(Claim::Exists(Box::new(rows::decode(&id, &current)?)));
        }
        let request_key = record.request.as_ref().map(|tag| tag.key.as_bytes());
        if let Some(key) = request_key {
            if self
                .request_keys
                .get(key)?
                .is_some_and(|owner| owner != id.as_bytes())
            {
                return Ok(Claim::KeyTaken);
            }
        }
        // The row as `save` writes it, and as PostgreSQL's claim does: one codec, one rule.
        let row = Row::of(record);
        let in_flight = self.in_flight(&record.account())?;
        if let Some(refused) = in_flight.refuses(record, limits, self.nonce_held(&row, &id)?) {
            return Ok(refused);
        }
        let exposes = row.exposure.map(word);
        self.record_trees()
            .transaction(
                |(settlements, unfinished, exposure, request_keys, holds, nonces)| {
                    settlements.insert(id.as_bytes(), row.encoded.as_bytes())?;
                    unfinished.insert(id.as_bytes(), &[])?;
                    if let Some(value) = &exposes {
                        exposure.insert(row.exposure_key().as_bytes(), value)?;
                    }
                    if let Some(key) = request_key {
                        request_keys.insert(key, id.as_bytes())?;
                    }
                    hold_permit2(&row, false, holds, nonces)
                },
            )
            .map_err(transaction_error)?;
        Ok(Claim::Claimed)
    }

    async fn save(&self, records: &[&Record], durable: bool) -> Result<(), StoreError> {
        let rows: Vec<Row> = records.iter().map(|r| Row::of(r)).collect();
        (
            &self.settlements,
            &self.unfinished,
            &self.finished,
            &self.exposure,
            &self.permit2_exposure,
            &self.permit2_nonces,
        )
            .transaction(|(settlements, unfinished, done, exposure, holds, nonces)| {
                for row in &rows {
                    hold_permit2(row, false, holds, nonces)?;
                    settlements.insert(row.id.as_bytes(), row.encoded.as_bytes())?;
                    let exposure_key = row.exposure_key();
                    match row.exposure {
                        Some(value) => exposure.insert(exposure_key.as_bytes(), &word(value))?,
                        None => exposure.remove(exposure_key.as_bytes())?,
                    };
                    match row.finished_at {
                        Some(at) => {
                            unfinished.remove(row.id.as_bytes())?;
                            done.insert(finished_key(at, &row.id), &[])?;
                        }
                        None => {
                            unfinished.insert(row.id.as_bytes(), &[])?;
                        }
                    }
                }
                Ok::<_, ConflictableTransactionError<StoreError>>(())
            })
            .map_err(transaction_error)?;
        if durable {
            self.flush().await?;
        }
        Ok(())
    }

    async fn release(&self, key: &PaymentKey) -> Result<(), StoreError> {
        let id = key.storage_key();
        let Some(record) = self.stored(&id)? else {
            return Ok(());
        };
        let row = Row::of(&record);
        let request_key = record.request.map(|tag| tag.key);
        self.record_trees()
            .transaction(
                |(settlements, unfinished, exposure, request_keys, holds, nonces)| {
                    settlements.remove(id.as_bytes())?;
                    unfinished.remove(id.as_bytes())?;
                    exposure.remove(row.exposure_key().as_bytes())?;
                    if let Some(request_key) = &request_key {
                        request_keys.remove(request_key.as_bytes())?;
                    }
                    hold_permit2(&row, true, holds, nonces)
                },
            )
            .map_err(transaction_error)?;
        self.passes.remove(id.as_bytes())?;
        self.flush().await
    }

    async fn grant_pass(&self, key: &PaymentKey, pass: &Pass) -> Result<(), StoreError> {
        self.passes
            .insert(key.storage_key().as_bytes(), encode_pass(pass))?;
        self.flush().await
    }

    async fn take_pass(&self, key: &PaymentKey, pass: &Pass) -> Result<bool, StoreError> {
        let id = key.storage_key();
        let taken =
            self.passes
                .compare_and_swap(id.as_bytes(), Some(encode_pass(pass)), None::<&[u8]>)?;
        Ok(taken.is_ok())
    }

    async fn unfinished(&self) -> Result<Vec<Record>, StoreError> {
        let mut out = Vec::new();
        for entry in self.unfinished.iter() {
            let (id, _) = entry?;
            let id = String::from_utf8_lossy(&id).to_string();
            match self.settlements.get(id.as_bytes())? {
                Some(bytes) => out.push(rows::decode(&id, &bytes)?),
                None => {
                    self.unfinished.remove(id.as_bytes())?;
                }
            }
        }
        Ok(out)
    }

    async fn prune(&self, cutoff: u64) -> Result<usize, StoreError> {
        let mut pruned = 0;
        for entry in self.finished.range(..cutoff.to_be_bytes().to_vec()) {
            let (index_key, _) = entry?;
            let id = &index_key[8..];
            let stored = self.stored(&String::from_utf8_lossy(id))?;
            if let Some(request_key) = stored.and_then(|record| record.request) {
                self.request_keys.remove(request_key.key.as_bytes())?;
            }
            self.settlements.remove(id)?;
            self.passes.remove(id)?;
            self.finished.remove(&index_key)?;
            pruned += 1;
        }
        Ok(pruned)
    }
}

/// A pass as stored: compared byte for byte when taken.
fn encode_pass(pass: &Pass) -> Vec<u8> {
    serde_json::to_vec(pass).expect("a pass serializes")
}
