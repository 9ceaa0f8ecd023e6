//! PostgreSQL's discovery catalogue: one row per listing, evicted by when it was last settled.

use async_trait::async_trait;

use super::{int, pg, uint, PgStore};
use crate::store::{DiscoveryStore, Listing, StoreError};

#[async_trait]
impl DiscoveryStore for PgStore {
    /// One transaction: instances listing together never leave more than the cap.
    async fn list(&self, listing: &Listing, max_listings: usize) -> Result<(), StoreError> {
        let mut client = self.client().await?;
        let transaction = client.transaction().await.map_err(pg)?;
        transaction
            .execute(
                "INSERT INTO discovery_listings (id, settled_at, listing) VALUES ($1, $2, $3)
                 ON CONFLICT (id) DO UPDATE SET settled_at = $2, listing = $3",
                &[&listing.id, &int(listing.settled_at)?, &listing.encoded],
            )
            .await
            .map_err(pg)?;
        transaction
            .execute(
                "DELETE FROM discovery_listings WHERE id IN (
                     SELECT id FROM discovery_listings ORDER BY settled_at DESC, id OFFSET $1)",
                &[&int(max_listings as u64)?],
            )
            .await
            .map_err(pg)?;
        transaction.commit().await.map_err(pg)
    }

    async fn listings(
        &self,
        since: u64,
        visit: &mut (dyn FnMut(Listing) + Send),
    ) -> Result<(), StoreError> {
        use futures::TryStreamExt;
        let client = self.client().await?;
        let rows = client
            .query_raw(
                "SELECT id, settled_at, listing FROM discovery_listings WHERE settled_at >= $1
                 ORDER BY settled_at DESC, id",
                [int(since)?],
            )
            .await
            .map_err(pg)?;
        futures::pin_mut!(rows);
        while let Some(row) = rows.try_next().await.map_err(pg)? {
            visit(Listing {
                id: row.get(0),
                settled_at: uint(row.get(1)),
                encoded: row.get(2),
            });
        }
        Ok(())
    }

    async fn unlist_before(&self, cutoff: u64) -> Result<usize, StoreError> {
        let unlisted = self
            .client()
            .await?
            .execute(
                "DELETE FROM discovery_listings WHERE settled_at < $1",
                &[&int(cutoff)?],
            )
            .await
            .map_err(pg)?;
        Ok(unlisted as usize)
    }
}
