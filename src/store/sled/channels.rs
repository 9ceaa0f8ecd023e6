//! sled's channel mirror: one snapshot per (network, channel), merged by the one rule
//! (`ChannelSnapshot::merged_over`) in one atomic update; and the channels' refund holds.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use ethers_core::types::U256;

use super::Store;
use crate::store::{ChannelKey, ChannelSnapshot, ChannelStore, StoreError};

/// Balance, totalClaimed (16 bytes each), withdrawRequestedAt (8), refundNonce (32), at (8),
/// all big-endian.
const LEN: usize = 80;

/// The channel id (32 bytes), then the network's name: fixed-length first, so no two keys meet.
fn key_bytes(key: &ChannelKey) -> Vec<u8> {
    let mut bytes = key.channel.as_bytes().to_vec();
    bytes.extend_from_slice(key.network.as_bytes());
    bytes
}

/// Each held refund's holder and when its hold runs out. Kept in memory: a sled store is open
/// in one process only, and a hold ends with the process that took it.
#[derive(Default)]
pub(super) struct RefundHolds(HashMap<ChannelKey, (String, Instant)>);

impl RefundHolds {
    fn hold(&mut self, key: &ChannelKey, holder: &str, ttl: Duration) -> bool {
        let now = Instant::now();
        // Holds that ran out go as others are taken, so the map holds only live ones.
        self.0.retain(|_, (_, until)| *until > now);
        match self.0.get(key) {
            Some((other, _)) if other != holder => false,
            _ => {
                self.0.insert(key.clone(), (holder.to_string(), now + ttl));
                true
            }
        }
    }

    fn release(&mut self, key: &ChannelKey, holder: &str) {
        if self.0.get(key).is_some_and(|(h, _)| h == holder) {
            self.0.remove(key);
        }
    }
}

fn encode(snapshot: &ChannelSnapshot) -> Vec<u8> {
    let mut bytes = Vec::with_capacity(LEN);
    bytes.extend_from_slice(&snapshot.balance.to_be_bytes());
    bytes.extend_from_slice(&snapshot.total_claimed.to_be_bytes());
    bytes.extend_from_slice(&snapshot.withdraw_requested_at.to_be_bytes());
    let mut nonce = [0u8; 32];
    snapshot.refund_nonce.to_big_endian(&mut nonce);
    bytes.extend_from_slice(&nonce);
    bytes.extend_from_slice(&snapshot.at.to_be_bytes());
    bytes
}

fn decode(bytes: &[u8]) -> Option<ChannelSnapshot> {
    if bytes.len() != LEN {
        return None;
    }
    let u128_at = |i: usize| bytes[i..i + 16].try_into().ok().map(u128::from_be_bytes);
    let u64_at = |i: usize| bytes[i..i + 8].try_into().ok().map(u64::from_be_bytes);
    Some(ChannelSnapshot {
        balance: u128_at(0)?,
        total_claimed: u128_at(16)?,
        withdraw_requested_at: u64_at(32)?,
        refund_nonce: U256::from_big_endian(&bytes[40..72]),
        at: u64_at(72)?,
    })
}

fn corrupt(key: &ChannelKey) -> StoreError {
    StoreError::Corrupt {
        key: format!("{}|{:#x}", key.network, key.channel),
        detail: "not a channel snapshot".to_string(),
    }
}

#[async_trait]
impl ChannelStore for Store {
    /// Not flushed: a snapshot lost in a crash is read again from the chain.
    async fn put_channel(
        &self,
        key: &ChannelKey,
        snapshot: &ChannelSnapshot,
    ) -> Result<ChannelSnapshot, StoreError> {
        let stored = self.channels.update_and_fetch(key_bytes(key), |old| {
            Some(encode(&snapshot.merged_over(old.and_then(decode))))
        })?;
        stored
            .as_deref()
            .and_then(decode)
            .ok_or_else(|| corrupt(key))
    }

    async fn channel(&self, key: &ChannelKey) -> Result<Option<ChannelSnapshot>, StoreError> {
        match self.channels.get(key_bytes(key))? {
            None => Ok(None),
            Some(bytes) => decode(&bytes).map(Some).ok_or_else(|| corrupt(key)),
        }
    }

    async fn hold_refund(
        &self,
        key: &ChannelKey,
        holder: &str,
        ttl: Duration,
    ) -> Result<bool, StoreError> {
        let mut holds = self.refund_holds.lock().expect("refund holds");
        Ok(holds.hold(key, holder, ttl))
    }

    async fn release_refund(&self, key: &ChannelKey, holder: &str) -> Result<(), StoreError> {
        self.refund_holds
            .lock()
            .expect("refund holds")
            .release(key, holder);
        Ok(())
    }
}
