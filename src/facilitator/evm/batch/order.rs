//! Per-channel order: a refund of a channel waits for the one ahead of it to be answered, so that
//! each is judged against the channel (and its refund nonce) the other left. In this process the
//! refunds of a channel queue for its turn; across the instances sharing a store, the turn's
//! holder also holds the channel's refund there. One that cannot get both within `WAIT` is
//! answered `channel_busy`, to try again shortly.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ethers_core::types::H256;
use tokio::sync::{Mutex as Turn, OwnedMutexGuard};
use tokio::time::Instant;

use super::reason::{BatchReason, Refusal};
use crate::store::{ChannelKey, Storage, StoreError};

/// How long a request waits for its channel's turn.
const WAIT: Duration = Duration::from_secs(5);
/// How often a request waiting for another instance's hold asks the store again.
const POLL: Duration = Duration::from_millis(100);

pub struct ChannelOrder {
    turns: Mutex<HashMap<H256, Arc<Turn<()>>>>,
    store: Storage,
    /// This instance (`storage.instance_id`); each hold adds its own serial to it.
    instance: String,
    serial: AtomicU64,
    /// How long a hold lasts unless released: longer than a refund takes to be answered, so
    /// that a holder that died lets the channel go by itself.
    hold: Duration,
}

/// A channel's turn, held until dropped; its hold in the store until released or run out.
pub struct Held {
    _guard: OwnedMutexGuard<()>,
    store: Storage,
    key: ChannelKey,
    holder: String,
}

impl Held {
    /// Lets the next refund of the channel, on any instance, have it. Not called when the
    /// refund's transaction may still land (a pending answer): the hold runs out.
    pub async fn release(self) {
        if let Err(e) = self.store.release_refund(&self.key, &self.holder).await {
            tracing::warn!(error = %e, "a channel's refund hold was not released; it runs out");
        }
    }
}

impl ChannelOrder {
    pub fn new(store: Storage, instance: String, hold: Duration) -> Self {
        ChannelOrder {
            turns: Mutex::default(),
            store,
            instance,
            serial: AtomicU64::new(0),
            hold,
        }
    }

    /// `key`'s turn, or `channel_busy` when it does not come within the wait.
    pub async fn turn(&self, key: ChannelKey) -> Result<Result<Held, Refusal>, StoreError> {
        self.turn_within(key, WAIT).await
    }

    async fn turn_within(
        &self,
        key: ChannelKey,
        wait: Duration,
    ) -> Result<Result<Held, Refusal>, StoreError> {
        let deadline = Instant::now() + wait;
        let Ok(guard) = tokio::time::timeout_at(deadline, self.local(key.channel)).await else {
            return Ok(Err(busy()));
        };
        let serial = self.serial.fetch_add(1, Ordering::Relaxed);
        let holder = format!("{}/{serial}", self.instance);
        while !self.store.hold_refund(&key, &holder, self.hold).await? {
            if Instant::now() + POLL > deadline {
                return Ok(Err(busy()));
            }
            tokio::time::sleep(POLL).await;
        }
        let store = self.store.clone();
        Ok(Ok(Held {
            _guard: guard,
            store,
            key,
            holder,
        }))
    }

    /// The channel's turn in this process.
    async fn local(&self, channel: H256) -> OwnedMutexGuard<()> {
        let turn = {
            let mut turns = self.turns.lock().expect("channel turns");
            // Turns nobody holds or waits for are dropped as the map grows.
            if turns.len() > 1024 {
                turns.retain(|_, t| Arc::strong_count(t) > 1);
            }
            turns.entry(channel).or_default().clone()
        };
        turn.lock_owned().await
    }
}

fn busy() -> Refusal {
    Refusal::new(
        BatchReason::ChannelBusy,
        "another refund of this channel is being settled: try again shortly",
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(byte: u8) -> ChannelKey {
        ChannelKey {
            network: "base".to_string(),
            channel: H256::repeat_byte(byte),
        }
    }

    fn store(name: &str) -> Storage {
        let dir = crate::testing::temp_dir(name);
        Arc::new(crate::store::sled::Store::open(&dir).unwrap())
    }

    fn order(store: &Storage, instance: &str) -> ChannelOrder {
        ChannelOrder::new(store.clone(), instance.to_string(), Duration::from_secs(60))
    }

    async fn busy_within(order: &ChannelOrder, key: ChannelKey) -> BatchReason {
        let short = Duration::from_millis(250);
        let refused = order.turn_within(key, short).await.unwrap();
        refused.err().expect("held past the wait").reason
    }

    #[tokio::test]
    async fn a_second_request_waits_its_turn_and_is_told_busy_past_the_wait() {
        let order = order(&store("order-busy"), "one");
        let first = order.turn(key(1)).await.unwrap().expect("free");
        let other = order.turn(key(2)).await.unwrap();
        assert!(other.is_ok(), "another channel is not held up");
        assert_eq!(busy_within(&order, key(1)).await, BatchReason::ChannelBusy);
        first.release().await;
        assert!(order.turn(key(1)).await.unwrap().is_ok());
    }

    #[tokio::test]
    async fn another_instance_waits_for_the_hold_until_it_is_released() {
        let store = store("order-instances");
        let (one, two) = (order(&store, "one"), order(&store, "two"));
        let held = one.turn(key(3)).await.unwrap().expect("free");
        assert_eq!(busy_within(&two, key(3)).await, BatchReason::ChannelBusy);
        // Dropped without release (its transaction may still land): still held elsewhere.
        drop(held);
        assert_eq!(busy_within(&two, key(3)).await, BatchReason::ChannelBusy);
        let again = one.turn(key(4)).await.unwrap().expect("free");
        let waiting = tokio::spawn(async move { two.turn(key(4)).await.unwrap().is_ok() });
        tokio::time::sleep(Duration::from_millis(150)).await;
        again.release().await;
        assert!(waiting.await.unwrap(), "taken once released");
    }
}
