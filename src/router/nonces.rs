//! Nonce reservations per (chain, sender): back-to-back routed calls get consecutive nonces even
//! before the first transaction reaches the chain's pending pool.

use serde::{Deserialize, Serialize};

use crate::store::{Store, StoreError};

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq)]
struct Reservation {
    /// The last nonce handed out.
    last: u64,
    /// When it was handed out (unix seconds).
    at: u64,
}

#[derive(Clone)]
pub struct NonceBook {
    store: Store,
    ttl_secs: u64,
}

impl NonceBook {
    pub fn new(store: Store, ttl_secs: u64) -> Self {
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
        let mut handed_out = pending;
        // Atomic read-modify-write: concurrent calls for one sender each get their own nonce.
        self.store.router_nonces.fetch_and_update(&key, |old| {
            let previous = old.and_then(|bytes| serde_json::from_slice::<Reservation>(bytes).ok());
            handed_out = next_nonce(previous, pending, now, self.ttl_secs);
            Some(Store::encode(&Reservation {
                last: handed_out,
                at: now,
            }))
        })?;
        self.store.flush().await?;
        Ok(handed_out)
    }
}

/// The chain's pending nonce, unless a reservation newer than the TTL is ahead of it.
fn next_nonce(previous: Option<Reservation>, pending: u64, now: u64, ttl_secs: u64) -> u64 {
    match previous {
        Some(r) if now.saturating_sub(r.at) < ttl_secs => pending.max(r.last + 1),
        _ => pending,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn consecutive_until_the_chain_catches_up_or_the_reservation_expires() {
        let r = |last, at| Some(Reservation { last, at });
        assert_eq!(next_nonce(None, 5, 100, 120), 5);
        assert_eq!(next_nonce(r(5, 100), 5, 101, 120), 6);
        assert_eq!(next_nonce(r(6, 101), 5, 102, 120), 7);
        // The chain moved past the reservation: follow the chain.
        assert_eq!(next_nonce(r(6, 101), 9, 102, 120), 9);
        // Unused reservation expired: back to the chain's count.
        assert_eq!(next_nonce(r(6, 101), 5, 300, 120), 5);
    }

    #[tokio::test]
    async fn reservations_survive_a_reopen() {
        let dir = std::env::temp_dir().join(format!("routerd-nonces-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        {
            let book = NonceBook::new(Store::open(&dir).unwrap(), 120);
            assert_eq!(book.reserve("l1", "0xa", 3, 10).await.unwrap(), 3);
            assert_eq!(book.reserve("l1", "0xa", 3, 11).await.unwrap(), 4);
            assert_eq!(book.reserve("l2", "0xa", 3, 11).await.unwrap(), 3);
        }
        let book = NonceBook::new(Store::open(&dir).unwrap(), 120);
        assert_eq!(book.reserve("l1", "0xa", 3, 12).await.unwrap(), 5);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
