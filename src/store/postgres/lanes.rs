//! PostgreSQL's signer lanes: leases taken with one conditional upsert, judged by the
//! database's clock, and signed writes fenced by the lane row.

use std::time::Duration;

use async_trait::async_trait;

use super::columns::{decode, record_columns, UPSERT_RECORDS};
use super::{int, pg, uint, PgStore};
use crate::evm::hex_bytes;
use crate::ledger::{LaneId, PaymentKey, Record};
use crate::store::{LaneStore, Lease, StoreError};

/// Moves the lane's next nonce under the lease; the row lock it takes orders it against a
/// takeover.
const FENCED_NONCE: &str =
    "UPDATE signer_lanes SET next_nonce = $4 WHERE lane = $1 AND holder = $2 AND fence = $3";

#[async_trait]
impl LaneStore for PgStore {
    async fn acquire(
        &self,
        lane: &LaneId,
        holder: &str,
        ttl: Duration,
    ) -> Result<Option<Lease>, StoreError> {
        let row = self
            .client()
            .await?
            .query_opt(
                "INSERT INTO signer_lanes (lane, holder, fence, expires_at)
                 VALUES ($1, $2, 1, now() + make_interval(secs => $3::float8))
                 ON CONFLICT (lane) DO UPDATE SET
                     fence = CASE WHEN signer_lanes.holder = EXCLUDED.holder
                                  THEN signer_lanes.fence ELSE signer_lanes.fence + 1 END,
                     holder = EXCLUDED.holder,
                     expires_at = EXCLUDED.expires_at
                 WHERE signer_lanes.holder = EXCLUDED.holder OR signer_lanes.expires_at <= now()
                 RETURNING fence",
                &[&lane.storage_key(), &holder, &ttl.as_secs_f64()],
            )
            .await
            .map_err(pg)?;
        Ok(row.map(|r| Lease {
            lane: lane.clone(),
            holder: holder.to_string(),
            fence: uint(r.get(0)),
        }))
    }

    async fn surrender(&self, lease: &Lease) -> Result<(), StoreError> {
        self.execute(
            "UPDATE signer_lanes SET expires_at = now()
                 WHERE lane = $1 AND holder = $2 AND fence = $3",
            &[&lease.lane.storage_key(), &lease.holder, &int(lease.fence)?],
        )
        .await
    }

    async fn lane_nonce(&self, lane: &LaneId) -> Result<Option<u64>, StoreError> {
        let row = self
            .client()
            .await?
            .query_opt(
                "SELECT next_nonce FROM signer_lanes WHERE lane = $1",
                &[&lane.storage_key()],
            )
            .await
            .map_err(pg)?;
        Ok(row.and_then(|r| r.get::<_, Option<i64>>(0)).map(uint))
    }

    async fn commit_signed(
        &self,
        lease: &Lease,
        next_nonce: u64,
        records: &[&Record],
    ) -> Result<(), StoreError> {
        let lane = lease.lane.storage_key();
        let columns = record_columns(records)?;
        let mut client = self.client().await?;
        let tx = client.transaction().await.map_err(pg)?;
        let fenced = tx
            .execute(
                FENCED_NONCE,
                &[&lane, &lease.holder, &int(lease.fence)?, &int(next_nonce)?],
            )
            .await
            .map_err(pg)?;
        if fenced == 0 {
            return Err(StoreError::LeaseLost(lane)); // the transaction rolls back on drop
        }
        if !columns.keys.is_empty() {
            tx.execute(UPSERT_RECORDS, &columns.params())
                .await
                .map_err(pg)?;
            // Signed: from now on the lane's unfinished records carry it, not the queue.
            tx.execute(
                "DELETE FROM settlement_queue WHERE payment_key = ANY($1)",
                &[&columns.keys],
            )
            .await
            .map_err(pg)?;
        }
        tx.commit().await.map_err(pg)
    }

    async fn take_queued(&self, lease: &Lease, limit: usize) -> Result<Vec<Record>, StoreError> {
        let lane = lease.lane.storage_key();
        let rows = self
            .client()
            .await?
            .query(
                "UPDATE settlement_queue q SET lane = $2, fence = $3
                 FROM (SELECT payment_key FROM settlement_queue
                       WHERE network = $1 AND (lane IS NULL OR (lane = $2 AND fence < $3))
                         AND (signer IS NULL OR signer = $6)
                       ORDER BY queued_at
                       FOR UPDATE SKIP LOCKED
                       LIMIT $4) picked,
                      settlements s
                 WHERE q.payment_key = picked.payment_key AND s.payment_key = q.payment_key
                   AND EXISTS (SELECT 1 FROM signer_lanes
                               WHERE signer_lanes.lane = $2 AND holder = $5 AND fence = $3)
                 RETURNING q.payment_key, s.record",
                &[
                    &lease.lane.network,
                    &lane,
                    &int(lease.fence)?,
                    &int(limit as u64)?,
                    &lease.holder,
                    &hex_bytes(lease.lane.signer),
                ],
            )
            .await
            .map_err(pg)?;
        rows.iter().map(|r| decode(r.get(0), r.get(1))).collect()
    }

    async fn requeue(&self, keys: &[PaymentKey]) -> Result<(), StoreError> {
        let keys: Vec<String> = keys.iter().map(PaymentKey::storage_key).collect();
        self.execute(
            "UPDATE settlement_queue SET lane = NULL, fence = NULL WHERE payment_key = ANY($1)",
            &[&keys],
        )
        .await
    }
}
