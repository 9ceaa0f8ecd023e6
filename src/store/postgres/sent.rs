//! PostgreSQL's record of the transactions the router forwarded, by hash.

use async_trait::async_trait;
use ethers_core::types::H256;

use super::{int, pg, uint, PgStore};
use crate::store::{Sent, SentStore, StoreError};

#[async_trait]
impl SentStore for PgStore {
    async fn remember_sent(&self, hash: H256, sent: &Sent) -> Result<(), StoreError> {
        self.execute(
            "INSERT INTO router_sent (hash, chain, sent_at) VALUES ($1, $2, $3)
             ON CONFLICT (hash) DO UPDATE SET chain = $2, sent_at = greatest(router_sent.sent_at, $3)",
            &[&format!("{hash:#x}"), &sent.chain, &int(sent.at)?],
        )
        .await
    }

    async fn sent(&self, hash: H256) -> Result<Option<Sent>, StoreError> {
        let row = self
            .client()
            .await?
            .query_opt(
                "SELECT chain, sent_at FROM router_sent WHERE hash = $1",
                &[&format!("{hash:#x}")],
            )
            .await
            .map_err(pg)?;
        Ok(row.map(|r| Sent {
            chain: r.get(0),
            at: uint(r.get(1)),
        }))
    }

    async fn forget_sent(&self, cutoff: u64) -> Result<usize, StoreError> {
        let forgotten = self
            .client()
            .await?
            .execute(
                "DELETE FROM router_sent WHERE sent_at < $1",
                &[&int(cutoff)?],
            )
            .await
            .map_err(pg)?;
        Ok(forgotten as usize)
    }

    /// Every instance trims the one table to the same bound; the index on `sent_at` orders it.
    async fn forget_sent_beyond(&self, keep: usize) -> Result<usize, StoreError> {
        let keep = i64::try_from(keep).unwrap_or(i64::MAX);
        let forgotten = self
            .client()
            .await?
            .execute(
                "DELETE FROM router_sent WHERE hash IN
                   (SELECT hash FROM router_sent ORDER BY sent_at DESC, hash DESC OFFSET $1)",
                &[&keep],
            )
            .await
            .map_err(pg)?;
        Ok(forgotten as usize)
    }
}
