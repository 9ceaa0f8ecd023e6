//! Nonce reservations per (chain, sender): back-to-back routed calls get consecutive nonces even
//! before the first transaction reaches the chain's pending pool, whichever instance they reach
//! when the store is shared. The rule is `store::next_router_nonce`.

use crate::store::{Storage, StoreError};

#[derive(Clone)]
pub struct NonceBook {
    store: Storage,
    ttl_secs: u64,
}

impl NonceBook {
    pub fn new(store: Storage, ttl_secs: u64) -> Self {
        Self { store, ttl_secs }
    }

    /// Hands out the nonce for the next transaction of `sender` on `chain`, given the chain's
    /// pending count, and stores it durably before returning.
    pub async fn reserve(
        &self,
        chain: &str,
        sender: &str,
        pending: u64,
        now: u64,
    ) -> Result<u64, StoreError> {
        let key = format!("{chain}|{sender}");
        self.store
            .reserve_router_nonce(&key, pending, now, self.ttl_secs)
            .await
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::store::sled::Store;

    #[tokio::test]
    async fn reservations_survive_a_reopen() {
        let dir = std::env::temp_dir().join(format!("routerd-nonces-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        {
            let book = NonceBook::new(Arc::new(Store::open(&dir).unwrap()), 120);
            assert_eq!(book.reserve("l1", "0xa", 3, 10).await.unwrap(), 3);
            assert_eq!(book.reserve("l1", "0xa", 3, 11).await.unwrap(), 4);
            assert_eq!(book.reserve("l2", "0xa", 3, 11).await.unwrap(), 3);
        }
        let book = NonceBook::new(Arc::new(Store::open(&dir).unwrap()), 120);
        assert_eq!(book.reserve("l1", "0xa", 3, 12).await.unwrap(), 5);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
