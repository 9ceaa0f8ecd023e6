//! sled's signer lanes: leases with their fences, and each lane's next nonce, written with the
//! signed attempts under the lease in one transaction.

use std::time::Duration;

use async_trait::async_trait;
use sled::transaction::ConflictableTransactionError;
use sled::Transactional;

use super::{check_lease, now_ms, transaction_error, Store, StoredLease};
use crate::ledger::{LaneId, PaymentKey, Record};
use crate::store::rows;
use crate::store::{LaneStore, Lease, StoreError};

#[async_trait]
impl LaneStore for Store {
    async fn acquire(
        &self,
        lane: &LaneId,
        holder: &str,
        ttl: Duration,
    ) -> Result<Option<Lease>, StoreError> {
        let id = lane.storage_key();
        let now = now_ms();
        let fence = self
            .lane_leases
            .transaction(|leases| {
                let current = leases
                    .get(id.as_bytes())?
                    .and_then(|bytes| serde_json::from_slice::<StoredLease>(&bytes).ok());
                let fence = match &current {
                    Some(c) if c.holder == holder => c.fence,
                    Some(c) if c.expires_ms > now => return Ok(None),
                    Some(c) => c.fence + 1,
                    None => 1,
                };
                let stored = StoredLease {
                    holder: holder.to_string(),
                    fence,
                    expires_ms: now.saturating_add(ttl.as_millis() as u64),
                };
                leases.insert(id.as_bytes(), rows::encode(&stored))?;
                Ok::<_, ConflictableTransactionError<StoreError>>(Some(fence))
            })
            .map_err(transaction_error)?;
        self.flush().await?;
        Ok(fence.map(|fence| Lease {
            lane: lane.clone(),
            holder: holder.to_string(),
            fence,
        }))
    }

    async fn surrender(&self, lease: &Lease) -> Result<(), StoreError> {
        let id = lease.lane.storage_key();
        let released = self.lane_leases.transaction(|leases| {
            check_lease(leases, lease)?;
            let stored = StoredLease {
                holder: lease.holder.clone(),
                fence: lease.fence,
                expires_ms: 0,
            };
            leases.insert(id.as_bytes(), rows::encode(&stored))?;
            Ok(())
        });
        match released.map_err(transaction_error) {
            Ok(()) | Err(StoreError::LeaseLost(_)) => self.flush().await,
            Err(e) => Err(e),
        }
    }

    async fn lane_nonce(&self, lane: &LaneId) -> Result<Option<u64>, StoreError> {
        Ok(self
            .signer_nonces
            .get(lane.storage_key())?
            .and_then(|v| Some(u64::from_be_bytes(v.as_ref().try_into().ok()?))))
    }

    async fn commit_signed(
        &self,
        lease: &Lease,
        next_nonce: u64,
        records: &[&Record],
    ) -> Result<(), StoreError> {
        let lane_id = lease.lane.storage_key();
        let encoded: Vec<(String, Vec<u8>)> = records
            .iter()
            .map(|r| (r.key().storage_key(), rows::encode(r)))
            .collect();
        (&self.settlements, &self.signer_nonces, &self.lane_leases)
            .transaction(|(settlements, nonces, leases)| {
                check_lease(leases, lease)?;
                for (id, bytes) in &encoded {
                    settlements.insert(id.as_bytes(), bytes.as_slice())?;
                }
                nonces.insert(lane_id.as_bytes(), &next_nonce.to_be_bytes())?;
                Ok(())
            })
            .map_err(transaction_error)?;
        self.flush().await
    }

    async fn take_queued(&self, _lease: &Lease, _limit: usize) -> Result<Vec<Record>, StoreError> {
        Ok(Vec::new())
    }

    async fn requeue(&self, _keys: &[PaymentKey]) -> Result<(), StoreError> {
        Ok(())
    }
}
