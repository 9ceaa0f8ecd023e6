//! Per-channel order: a refund of a channel waits for the one ahead of it in this process to be
//! answered, so that each is judged against the channel (and its refund nonce) the other left;
//! one that cannot get its turn within `WAIT` is answered `channel_busy`, to try again shortly.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ethers_core::types::H256;
use tokio::sync::{Mutex as Turn, OwnedMutexGuard};

use super::reason::{BatchReason, Refusal};

/// How long a request waits for its channel's turn.
const WAIT: Duration = Duration::from_secs(5);

#[derive(Default)]
pub struct ChannelOrder {
    turns: Mutex<HashMap<H256, Arc<Turn<()>>>>,
}

/// A channel's turn, held until dropped.
pub struct Held {
    _guard: OwnedMutexGuard<()>,
}

impl ChannelOrder {
    /// `channel`'s turn, or `channel_busy` when it does not come within the wait.
    pub async fn turn(&self, channel: H256) -> Result<Held, Refusal> {
        self.turn_within(channel, WAIT).await
    }

    async fn turn_within(&self, channel: H256, wait: Duration) -> Result<Held, Refusal> {
        let turn = {
            let mut turns = self.turns.lock().expect("channel turns");
            // Turns nobody holds or waits for are dropped as the map grows.
            if turns.len() > 1024 {
                turns.retain(|_, t| Arc::strong_count(t) > 1);
            }
            turns.entry(channel).or_default().clone()
        };
        match tokio::time::timeout(wait, turn.lock_owned()).await {
            Ok(guard) => Ok(Held { _guard: guard }),
            Err(_) => Err(Refusal::new(
                BatchReason::ChannelBusy,
                "another refund of this channel is being settled: try again shortly",
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_second_request_waits_its_turn_and_is_told_busy_past_the_wait() {
        let order = ChannelOrder::default();
        let channel = H256::repeat_byte(1);
        let first = order.turn(channel).await.expect("free");
        let other = order.turn(H256::repeat_byte(2)).await;
        assert!(other.is_ok(), "another channel is not held up");
        let short = Duration::from_millis(20);
        let busy = order
            .turn_within(channel, short)
            .await
            .err()
            .expect("held past the wait");
        assert_eq!(busy.reason, BatchReason::ChannelBusy);
        drop(first);
        assert!(order.turn(channel).await.is_ok());
    }
}
