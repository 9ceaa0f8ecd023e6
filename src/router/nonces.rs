//! Nonce reservations per (chain, sender, caller): back-to-back routed calls from one caller
//! get consecutive nonces even before the first transaction reaches the chain's pending pool,
//! whichever instance they reach when the store is shared. Another caller naming the same
//! sender never moves them: each caller's answers start from the chain's pending nonce
//! (access.md §6). The rule is `store::next_router_nonce`.

use std::time::Duration;

use crate::clock::unix_now;
use crate::ledger::RouterNonceKey;
use crate::store::{Storage, StoreError};

/// How often expired reservations are deleted, at most: a shorter TTL prunes as often as it
/// expires them.
const PRUNE_EVERY: Duration = Duration::from_secs(60);

#[derive(Clone)]
pub struct NonceBook {
    store: Storage,
    ttl_secs: u64,
    max_ahead: u64,
}

impl NonceBook {
    pub fn new(store: Storage, ttl_secs: u64, max_ahead: u64) -> Self {
        Self {
            store,
            ttl_secs,
            max_ahead,
        }
    }

    pub fn max_ahead(&self) -> u64 {
        self.max_ahead
    }

    /// Hands out the nonce for the next transaction of the key's sender on its chain to its
    /// caller (an API key's name or a client address), given the chain's pending count, and
    /// stores it durably before returning; `None` when the caller is `max_ahead` reservations
    /// past it already.
    pub async fn reserve(
        &self,
        key: &RouterNonceKey,
        pending: u64,
        now: u64,
    ) -> Result<Option<u64>, StoreError> {
        self.store
            .reserve_router_nonce(key, pending, now, self.ttl_secs, self.max_ahead)
            .await
    }

    /// Deletes expired reservations every TTL (at most every [`PRUNE_EVERY`]), for good: the
    /// store holds what the last TTL or two handed out, however many senders strangers name.
    pub async fn prune_periodically(self) {
        let every = Duration::from_secs(self.ttl_secs.max(1)).min(PRUNE_EVERY);
        loop {
            let cutoff = unix_now().saturating_sub(self.ttl_secs);
            match self.store.prune_router_nonces(cutoff).await {
                Ok(0) => {}
                Ok(pruned) => tracing::debug!(pruned, "deleted expired router reservations"),
                Err(e) => {
                    tracing::error!(error = %e, "could not delete expired router reservations")
                }
            }
            tokio::time::sleep(every).await;
        }
    }

    /// The key's sender broadcast `nonce` through routerd: the caller's next reservation comes
    /// after it, even before the chain's pending count moves.
    pub async fn confirm(
        &self,
        key: &RouterNonceKey,
        nonce: u64,
        now: u64,
    ) -> Result<(), StoreError> {
        self.store
            .confirm_router_nonce(key, nonce, now, self.ttl_secs)
            .await
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::store::sled::Store;
    use ethers_core::types::Address;

    fn key(chain: &str, caller: &str) -> RouterNonceKey {
        RouterNonceKey {
            chain: chain.to_string(),
            sender: Address::repeat_byte(0xa),
            caller: caller.to_string(),
        }
    }

    #[tokio::test]
    async fn reservations_survive_a_reopen() {
        let dir = crate::testing::temp_dir("nonces");
        {
            let book = NonceBook::new(Arc::new(Store::open(&dir).unwrap()), 120, 16);
            assert_eq!(
                book.reserve(&key("l1", "me"), 3, 10).await.unwrap(),
                Some(3)
            );
            assert_eq!(
                book.reserve(&key("l1", "me"), 3, 11).await.unwrap(),
                Some(4)
            );
            assert_eq!(
                book.reserve(&key("l2", "me"), 3, 11).await.unwrap(),
                Some(3)
            );
            // Another caller naming the same sender starts from the pending nonce.
            assert_eq!(
                book.reserve(&key("l1", "other"), 3, 11).await.unwrap(),
                Some(3)
            );
        }
        let book = NonceBook::new(Arc::new(crate::testing::reopen(&dir)), 120, 16);
        assert_eq!(
            book.reserve(&key("l1", "me"), 3, 12).await.unwrap(),
            Some(5)
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}
