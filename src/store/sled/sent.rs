//! sled's record of the transactions the router forwarded, by hash.

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use super::Store;
use crate::store::rows;
use crate::store::{Sent, SentStore, StoreError};
use ethers_core::types::H256;

/// A forwarded transaction as stored.
#[derive(Serialize, Deserialize)]
struct SentRow {
    chain: String,
    at: u64,
}

#[async_trait]
impl SentStore for Store {
    async fn remember_sent(&self, hash: H256, sent: &Sent) -> Result<(), StoreError> {
        let row = SentRow {
            chain: sent.chain.clone(),
            at: sent.at,
        };
        self.router_sent
            .insert(hash.as_bytes(), rows::encode(&row))?;
        self.flush().await
    }

    async fn sent(&self, hash: H256) -> Result<Option<Sent>, StoreError> {
        let Some(bytes) = self.router_sent.get(hash.as_bytes())? else {
            return Ok(None);
        };
        let row: SentRow = serde_json::from_slice(&bytes).map_err(|e| StoreError::Corrupt {
            key: format!("router_sent/{hash:#x}"),
            detail: e.to_string(),
        })?;
        Ok(Some(Sent {
            chain: row.chain,
            at: row.at,
        }))
    }

    /// A scan of every row: pruning runs rarely, and the tree has no time index to keep.
    async fn forget_sent(&self, cutoff: u64) -> Result<usize, StoreError> {
        let mut forgotten = 0;
        for entry in self.router_sent.iter() {
            let (hash, bytes) = entry?;
            let at = serde_json::from_slice::<SentRow>(&bytes).map_or(0, |row| row.at);
            if at < cutoff {
                self.router_sent.remove(hash)?;
                forgotten += 1;
            }
        }
        Ok(forgotten)
    }

    /// A scan of every row, as for [`Self::forget_sent`]: the relay calls it once per hundredth
    /// of the bound remembered, not per send.
    async fn forget_sent_beyond(&self, keep: usize) -> Result<usize, StoreError> {
        let mut rows = Vec::new();
        for entry in self.router_sent.iter() {
            let (hash, bytes) = entry?;
            let at = serde_json::from_slice::<SentRow>(&bytes).map_or(0, |row| row.at);
            rows.push((at, hash));
        }
        if rows.len() <= keep {
            return Ok(0);
        }
        rows.sort_unstable();
        let oldest = rows.len() - keep;
        for (_, hash) in &rows[..oldest] {
            self.router_sent.remove(hash)?;
        }
        Ok(oldest)
    }
}
