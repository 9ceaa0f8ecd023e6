//! sled's channel mirror: one snapshot per (network, channel), merged by the one rule
//! (`ChannelSnapshot::merged_over`) in one atomic update.

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
}
