//! The channel mirror as verify and settle use it: every state routerd reads or causes is
//! written to the store (`ChannelStore`, shared by every instance), and the rules that only an
//! older state could pass (rules 9-10, a refund's nonce) are judged against the higher of the
//! chain's and the mirror's `totalClaimed` and `refundNonce`. A lagging or rolled-back node that
//! answers a state from before a claim routerd settled cannot make it accept a voucher at or
//! below that claim. A channel the mirror lacks is rebuilt by the chain's read.

use std::collections::HashMap;
use std::sync::Mutex;

use ethers_core::types::H256;

use super::verify::ChannelState;
use crate::store::{ChannelKey, ChannelSnapshot, Storage};

/// Channels whose last write this process remembers; past it the memory starts afresh (a write
/// too many, never a check too few: the store holds the floor).
const REMEMBERED: usize = 4096;

pub struct Mirror {
    store: Storage,
    /// What this process last wrote per channel: a flood of verifies of one state writes once.
    written: Mutex<HashMap<ChannelKey, ChannelState>>,
}

impl Mirror {
    pub fn new(store: Storage) -> Self {
        Mirror {
            store,
            written: Mutex::default(),
        }
    }

    /// The state to judge the chain's `read` by, after recording it: its `totalClaimed` and
    /// `refundNonce` raised to the mirror's. A store out of reach leaves the floor this process
    /// wrote itself.
    pub async fn judge(&self, network: &str, channel: H256, read: ChannelState) -> ChannelState {
        let key = key(network, channel);
        let stored = match self.store.channel(&key).await {
            Ok(stored) => stored.map(state_of),
            Err(e) => {
                tracing::warn!(%network, channel = %format!("{channel:#x}"), error = %e, "channel mirror unread");
                None
            }
        };
        let own = self.last_written(&key);
        // An entry missing from the store (lost, or never written) is rebuilt by this read.
        self.write(key, &read, stored.is_none()).await;
        [stored, own].into_iter().flatten().fold(read, floored)
    }

    /// Writes a state routerd read or caused, unless this process wrote the same one last
    /// (`always`: even then).
    async fn write(&self, key: ChannelKey, state: &ChannelState, always: bool) {
        if !always && self.last_written(&key).as_ref() == Some(state) {
            return;
        }
        let snapshot = ChannelSnapshot {
            balance: state.balance,
            total_claimed: state.total_claimed,
            withdraw_requested_at: state.withdraw_requested_at,
            refund_nonce: state.refund_nonce,
            at: crate::clock::unix_now(),
        };
        if let Err(e) = self.store.put_channel(&key, &snapshot).await {
            tracing::warn!(network = %key.network, channel = %format!("{:#x}", key.channel), error = %e, "channel mirror unwritten");
        }
        let mut written = self.written.lock().unwrap_or_else(|e| e.into_inner());
        if written.len() >= REMEMBERED && !written.contains_key(&key) {
            written.clear();
        }
        written.insert(key, *state);
    }

    /// What a claim routerd settled caused: the channel claimed up to `total_claimed`, its other
    /// fields as last known (`read`: the chain's, asked for when the mirror knows nothing).
    /// False, and nothing written, when nothing is known of the channel.
    pub async fn claimed(
        &self,
        network: &str,
        channel: H256,
        total_claimed: u128,
        read: Option<ChannelState>,
    ) -> bool {
        let key = key(network, channel);
        let stored = self.store.channel(&key).await.ok().flatten().map(state_of);
        let floors = [stored, self.last_written(&key)];
        let known = floors.into_iter().flatten().fold(read, |base, floor| {
            Some(base.map_or(floor, |base| floored(base, floor)))
        });
        let Some(known) = known else {
            return false;
        };
        let caused = ChannelState {
            total_claimed: known.total_claimed.max(total_claimed),
            ..known
        };
        self.write(key, &caused, false).await;
        true
    }

    fn last_written(&self, key: &ChannelKey) -> Option<ChannelState> {
        let written = self.written.lock().unwrap_or_else(|e| e.into_inner());
        written.get(key).copied()
    }
}

fn key(network: &str, channel: H256) -> ChannelKey {
    ChannelKey {
        network: network.to_string(),
        channel,
    }
}

fn state_of(snapshot: ChannelSnapshot) -> ChannelState {
    ChannelState {
        balance: snapshot.balance,
        total_claimed: snapshot.total_claimed,
        withdraw_requested_at: snapshot.withdraw_requested_at,
        refund_nonce: snapshot.refund_nonce,
    }
}

/// `read` with what only grows on chain no lower than `floor`'s; the rest as read.
fn floored(read: ChannelState, floor: ChannelState) -> ChannelState {
    ChannelState {
        total_claimed: read.total_claimed.max(floor.total_claimed),
        refund_nonce: read.refund_nonce.max(floor.refund_nonce),
        ..read
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use ethers_core::types::U256;

    use super::*;

    fn state(balance: u128, total_claimed: u128, refund_nonce: u64) -> ChannelState {
        ChannelState {
            balance,
            total_claimed,
            withdraw_requested_at: 0,
            refund_nonce: U256::from(refund_nonce),
        }
    }

    fn store(name: &str) -> Storage {
        let dir = crate::testing::temp_dir(&format!("mirror-{name}"));
        Arc::new(crate::store::sled::Store::open(&dir).unwrap())
    }

    #[tokio::test]
    async fn a_stale_read_is_judged_by_what_routerd_claimed() {
        let store = store("stale");
        let mirror = Mirror::new(store.clone());
        let channel = H256::repeat_byte(7);
        let before = state(1000, 100, 1);
        assert_eq!(mirror.judge("base", channel, before).await, before);
        assert!(mirror.claimed("base", channel, 400, None).await);
        // A node behind the claim answers the state before it.
        let judged = mirror.judge("base", channel, before).await;
        assert_eq!(judged, state(1000, 400, 1));
        // Another process on the same store (a restart, another instance) judges alike.
        let other = Mirror::new(store.clone());
        assert_eq!(other.judge("base", channel, before).await, judged);
        // A refund nonce seen once is never judged lower; a newer balance is taken as read.
        other.judge("base", channel, state(900, 400, 3)).await;
        let judged = mirror.judge("base", channel, state(800, 100, 1)).await;
        assert_eq!(judged, state(800, 400, 3));
        // Another network's channel of the same id is its own.
        assert_eq!(mirror.judge("sepolia", channel, before).await, before);
    }

    #[tokio::test]
    async fn the_chains_read_rebuilds_a_missing_entry() {
        let store = store("rebuild");
        let mirror = Mirror::new(store.clone());
        let channel = H256::repeat_byte(8);
        // Nothing known: a claim has nothing to raise, and writes nothing.
        assert!(!mirror.claimed("base", channel, 5, None).await);
        let read = state(50, 10, 0);
        assert_eq!(mirror.judge("base", channel, read).await, read);
        let key = key("base", channel);
        let stored = store.channel(&key).await.unwrap().map(state_of);
        assert_eq!(stored, Some(read));
        // A claim of a channel known only by the chain's read after it.
        let fresh = H256::repeat_byte(9);
        assert!(mirror.claimed("base", fresh, 30, Some(read)).await);
        let stored = store.channel(&super::key("base", fresh)).await.unwrap();
        assert_eq!(stored.map(state_of), Some(state(50, 30, 0)));
    }

    #[tokio::test]
    async fn the_same_state_read_again_is_not_written_again() {
        let store = store("flood");
        let mirror = Mirror::new(store.clone());
        let channel = H256::repeat_byte(10);
        let key = key("base", channel);
        let read = state(50, 10, 0);
        // This process last wrote `read`; the store holds another instance's older write.
        mirror.written.lock().unwrap().insert(key.clone(), read);
        let theirs = ChannelSnapshot {
            balance: 50,
            total_claimed: 20,
            withdraw_requested_at: 0,
            refund_nonce: U256::zero(),
            at: 5,
        };
        store.put_channel(&key, &theirs).await.unwrap();
        // The same state read again is judged by the store, and not written.
        assert_eq!(mirror.judge("base", channel, read).await, state(50, 20, 0));
        assert_eq!(store.channel(&key).await.unwrap(), Some(theirs));
        // A changed one is.
        mirror.judge("base", channel, state(60, 10, 0)).await;
        let stored = store.channel(&key).await.unwrap().unwrap();
        assert_eq!((stored.balance, stored.total_claimed), (60, 20));
    }
}
