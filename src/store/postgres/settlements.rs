//! PostgreSQL's settlement records: the claim (one transaction under the account's lock),
//! saves, releases, passes, resumption and pruning.

use async_trait::async_trait;
use ethers_core::types::U256;
use tokio_postgres::error::SqlState;

use super::columns::{columns, decode, record_columns, UPSERT_RECORDS};
use super::{int, pg, uint, PgStore};
use crate::evm::hex_bytes;
use crate::ledger::{Account, Pass, PaymentKey, Record};
use crate::store::{Claim, InFlight, Lease, Limits, SettlementStore, StoreError};

#[async_trait]
impl SettlementStore for PgStore {
    async fn get(&self, key: &PaymentKey) -> Result<Option<Record>, StoreError> {
        let id = key.storage_key();
        let row = self
            .client()
            .await?
            .query_opt(
                "SELECT record FROM settlements WHERE payment_key = $1",
                &[&id],
            )
            .await
            .map_err(pg)?;
        row.map(|r| decode(&id, r.get(0))).transpose()
    }

    async fn exposed(&self, account: &Account) -> Result<U256, StoreError> {
        let keys = account.exposure_keys();
        let row = self
            .client()
            .await?
            .query_one(
                "SELECT coalesce(sum(exposure), 0)::text
                 FROM settlements WHERE account = ANY($1) AND exposure IS NOT NULL",
                &[&keys],
            )
            .await
            .map_err(pg)?;
        U256::from_dec_str(row.get(0)).map_err(|_| {
            StoreError::unavailable(format!(
                "PostgreSQL: exposure of {} is not a uint256",
                keys[0]
            ))
        })
    }

    /// One transaction under the account's advisory lock (and, for Permit2, then its owner's:
    /// Permit2 nonces span tokens), so that claims of one payer on several instances are added
    /// up one after another: the stored record if the payment exists, else the account's
    /// settlements in flight weighed, else the record and its queue entry.
    async fn claim(
        &self,
        key: &PaymentKey,
        record: &Record,
        taken_by: Option<&Lease>,
        limits: &Limits,
    ) -> Result<Claim, StoreError> {
        let id = key.storage_key();
        let c = columns(record)?;
        let lane = taken_by.map(|l| l.lane.storage_key());
        let fence = taken_by.map(|l| int(l.fence)).transpose()?;
        let mut client = self.client().await?;
        let tx = client.transaction().await.map_err(pg)?;
        // Always the account first, the owner last: two claims never wait on each other's lock.
        for lock in std::iter::once(&c.account).chain(&c.permit2_owner) {
            tx.execute(
                "SELECT pg_advisory_xact_lock(hashtextextended($1, 0))",
                &[lock],
            )
            .await
            .map_err(pg)?;
        }
        let existing = tx
            .query_opt(
                "SELECT record FROM settlements WHERE payment_key = $1",
                &[&id],
            )
            .await
            .map_err(pg)?;
        if let Some(row) = existing {
            return Ok(Claim::Exists(Box::new(decode(&id, row.get(0))?)));
        }
        let request_key = record.request.as_ref().map(|tag| tag.key.as_str());
        if key_taken(&tx, request_key).await? {
            return Ok(Claim::KeyTaken);
        }
        let in_flight = in_flight(&tx, &record.account().exposure_keys()).await?;
        let nonce_held = nonce_held(&tx, c.permit2_nonce.as_deref(), &id).await?;
        if let Some(refused) = in_flight.refuses(record, limits, nonce_held) {
            return Ok(refused);
        }
        let inserted = tx
            .execute(
                "WITH claimed AS (
                 INSERT INTO settlements (payment_key, record, unfinished, account, exposure,
                     request_key, permit2_nonce, permit2_approves)
                 VALUES ($1, $2, true, $6, $7::text::numeric, $8, $9, $10)
                 RETURNING payment_key
             )
             INSERT INTO settlement_queue (payment_key, network, lane, fence, signer)
             SELECT payment_key, $3, $4, $5, $11 FROM claimed",
                &[
                    &id,
                    &c.text,
                    &key.network,
                    &lane,
                    &fence,
                    &c.account,
                    &c.exposure,
                    &request_key,
                    &c.permit2_nonce,
                    &c.permit2_approves,
                    &record.evm().and_then(|evm| evm.sender).map(hex_bytes),
                ],
            )
            .await;
        match inserted {
            // Another payer's claim took the key a moment ago (its lock is not ours).
            Err(e) if e.code() == Some(&SqlState::UNIQUE_VIOLATION) => Ok(Claim::KeyTaken),
            Err(e) => Err(pg(e)),
            Ok(_) => {
                tx.commit().await.map_err(pg)?;
                Ok(Claim::Claimed)
            }
        }
    }

    async fn save(&self, records: &[&Record], _durable: bool) -> Result<(), StoreError> {
        let columns = record_columns(records)?;
        self.execute(UPSERT_RECORDS, &columns.params()).await
    }

    async fn release(&self, key: &PaymentKey) -> Result<(), StoreError> {
        self.execute(
            "DELETE FROM settlements WHERE payment_key = $1",
            &[&key.storage_key()],
        )
        .await
    }

    async fn grant_pass(&self, key: &PaymentKey, pass: &Pass) -> Result<(), StoreError> {
        self.execute(
            "INSERT INTO settlement_passes (payment_key, caller, body)
                 SELECT payment_key, $2, $3 FROM settlements WHERE payment_key = $1
             ON CONFLICT (payment_key) DO UPDATE SET caller = $2, body = $3",
            &[&key.storage_key(), &pass.caller, &pass.body.as_bytes()],
        )
        .await
    }

    async fn take_pass(&self, key: &PaymentKey, pass: &Pass) -> Result<bool, StoreError> {
        let taken = self
            .client()
            .await?
            .execute(
                "DELETE FROM settlement_passes
                 WHERE payment_key = $1 AND caller = $2 AND body = $3",
                &[&key.storage_key(), &pass.caller, &pass.body.as_bytes()],
            )
            .await
            .map_err(pg)?;
        Ok(taken == 1)
    }

    async fn unfinished(&self) -> Result<Vec<Record>, StoreError> {
        let rows = self
            .client()
            .await?
            .query(
                "SELECT payment_key, record FROM settlements WHERE unfinished",
                &[],
            )
            .await
            .map_err(pg)?;
        rows.iter().map(|r| decode(r.get(0), r.get(1))).collect()
    }

    async fn prune(&self, cutoff: u64) -> Result<usize, StoreError> {
        let pruned = self
            .client()
            .await?
            .execute(
                "DELETE FROM settlements WHERE NOT unfinished AND finished_at < $1",
                &[&int(cutoff)?],
            )
            .await
            .map_err(pg)?;
        Ok(pruned as usize)
    }
}

/// Whether another record holds `request_key` (within the claim's transaction).
async fn key_taken(
    tx: &tokio_postgres::Transaction<'_>,
    request_key: Option<&str>,
) -> Result<bool, StoreError> {
    let Some(request_key) = request_key else {
        return Ok(false);
    };
    let row = tx
        .query_opt(
            "SELECT 1 FROM settlements WHERE request_key = $1",
            &[&request_key],
        )
        .await
        .map_err(pg)?;
    Ok(row.is_some())
}

/// The account's records still in flight, added up under its `exposure_keys` (within the
/// claim's transaction, under the account's lock).
async fn in_flight(
    tx: &tokio_postgres::Transaction<'_>,
    keys: &[String],
) -> Result<InFlight, StoreError> {
    let row = tx
        .query_one(
            "SELECT coalesce(sum(exposure), 0)::text,
                 coalesce(sum(exposure) FILTER (WHERE permit2_nonce IS NOT NULL), 0)::text,
                 count(*) FILTER (WHERE permit2_nonce IS NOT NULL),
                 count(*) FILTER (WHERE permit2_approves)
             FROM settlements WHERE account = ANY($1) AND exposure IS NOT NULL",
            &[&keys],
        )
        .await
        .map_err(pg)?;
    let total = |i: usize| {
        U256::from_dec_str(row.get(i)).map_err(|_| {
            StoreError::unavailable(format!(
                "PostgreSQL: exposure of {} is not a uint256",
                keys[0]
            ))
        })
    };
    let count = |i: usize| uint(row.get(i));
    Ok(InFlight {
        value: total(0)?,
        permit2_value: total(1)?,
        permit2: count(2),
        approvals: count(3),
    })
}

/// Whether a record other than `id` in flight spends the Permit2 nonce `nonce` (within the
/// claim's transaction, under the owner's lock).
async fn nonce_held(
    tx: &tokio_postgres::Transaction<'_>,
    nonce: Option<&str>,
    id: &str,
) -> Result<bool, StoreError> {
    let Some(nonce) = nonce else {
        return Ok(false);
    };
    let row = tx
        .query_opt(
            "SELECT 1 FROM settlements
             WHERE permit2_nonce = $1 AND exposure IS NOT NULL AND payment_key <> $2",
            &[&nonce, &id],
        )
        .await
        .map_err(pg)?;
    Ok(row.is_some())
}
