//! sled's router nonce reservations: one atomic read-modify-write per (chain, sender, caller).

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use super::Store;
use crate::ledger::RouterNonceKey;
use crate::store::rows;
use crate::store::{confirmed_router_nonce, next_router_nonce, RouterNonceStore, StoreError};

/// A router reservation as stored.
#[derive(Serialize, Deserialize)]
struct RouterReservation {
    /// The last nonce handed out.
    last: u64,
    /// When it was handed out (unix seconds).
    at: u64,
}

impl RouterReservation {
    /// The stored reservation's (last, at); `None` for bytes that do not read as one.
    fn read(bytes: &[u8]) -> Option<(u64, u64)> {
        serde_json::from_slice::<RouterReservation>(bytes)
            .ok()
            .map(|r| (r.last, r.at))
    }
}

#[async_trait]
impl RouterNonceStore for Store {
    async fn reserve_router_nonce(
        &self,
        key: &RouterNonceKey,
        pending: u64,
        now: u64,
        ttl_secs: u64,
        max_ahead: u64,
    ) -> Result<Option<u64>, StoreError> {
        let mut handed_out = None;
        // Atomic read-modify-write: concurrent calls for one sender each get their own nonce.
        self.router_nonces
            .fetch_and_update(key.storage_key(), |old| {
                let previous = old.and_then(RouterReservation::read);
                handed_out = next_router_nonce(previous, pending, now, ttl_secs, max_ahead);
                match handed_out {
                    Some(last) => Some(rows::encode(&RouterReservation { last, at: now })),
                    None => old.map(<[u8]>::to_vec),
                }
            })?;
        self.flush().await?;
        Ok(handed_out)
    }

    async fn confirm_router_nonce(
        &self,
        key: &RouterNonceKey,
        nonce: u64,
        now: u64,
        ttl_secs: u64,
    ) -> Result<(), StoreError> {
        self.router_nonces
            .fetch_and_update(key.storage_key(), |old| {
                let previous = old.and_then(RouterReservation::read);
                let (last, at) = confirmed_router_nonce(previous, nonce, now, ttl_secs);
                Some(rows::encode(&RouterReservation { last, at }))
            })?;
        self.flush().await
    }

    async fn prune_router_nonces(&self, cutoff: u64) -> Result<usize, StoreError> {
        let mut pruned = 0;
        for entry in self.router_nonces.iter() {
            let (key, bytes) = entry?;
            let expired = RouterReservation::read(&bytes).is_none_or(|(_, at)| at < cutoff);
            // Only the value read: a reservation renewed meanwhile stays.
            if expired
                && self
                    .router_nonces
                    .compare_and_swap(&key, Some(bytes), None::<&[u8]>)?
                    .is_ok()
            {
                pruned += 1;
            }
        }
        Ok(pruned)
    }
}
