//! PostgreSQL's router nonce reservations: one statement per reservation, mirroring the rule
//! in `store::next_router_nonce`.

use async_trait::async_trait;

use super::{int, pg, uint, PgStore};
use crate::ledger::RouterNonceKey;
use crate::store::{RouterNonceStore, StoreError};

#[async_trait]
impl RouterNonceStore for PgStore {
    async fn reserve_router_nonce(
        &self,
        key: &RouterNonceKey,
        pending: u64,
        now: u64,
        ttl_secs: u64,
        max_ahead: u64,
    ) -> Result<Option<u64>, StoreError> {
        // store::next_router_nonce, in one statement: concurrent reservations queue on the row,
        // and one too far ahead updates nothing and returns no row.
        let row = self
            .client()
            .await?
            .query_opt(
                "INSERT INTO router_nonces (key, last_nonce, handed_at) VALUES ($1, $2, $3)
                 ON CONFLICT (key) DO UPDATE SET
                     last_nonce = CASE WHEN $3 - router_nonces.handed_at < $4
                                       THEN greatest($2, router_nonces.last_nonce + 1)
                                       ELSE $2 END,
                     handed_at = $3
                 WHERE CASE WHEN $3 - router_nonces.handed_at < $4
                            THEN greatest($2, router_nonces.last_nonce + 1)
                            ELSE $2 END < $2 + $5
                 RETURNING last_nonce",
                &[
                    &key.storage_key(),
                    &int(pending)?,
                    &int(now)?,
                    &int(ttl_secs)?,
                    &int(max_ahead)?,
                ],
            )
            .await
            .map_err(pg)?;
        Ok(row.map(|r| uint(r.get(0))))
    }

    async fn confirm_router_nonce(
        &self,
        key: &RouterNonceKey,
        nonce: u64,
        now: u64,
        ttl_secs: u64,
    ) -> Result<(), StoreError> {
        // store::confirmed_router_nonce, in one statement.
        self.execute(
            "INSERT INTO router_nonces (key, last_nonce, handed_at) VALUES ($1, $2, $3)
             ON CONFLICT (key) DO UPDATE SET
                 last_nonce = CASE WHEN $3 - router_nonces.handed_at < $4
                                        AND router_nonces.last_nonce > $2
                                   THEN router_nonces.last_nonce ELSE $2 END,
                 handed_at = CASE WHEN $3 - router_nonces.handed_at < $4
                                       AND router_nonces.last_nonce > $2
                                  THEN router_nonces.handed_at ELSE $3 END",
            &[
                &key.storage_key(),
                &int(nonce)?,
                &int(now)?,
                &int(ttl_secs)?,
            ],
        )
        .await
    }

    async fn prune_router_nonces(&self, cutoff: u64) -> Result<usize, StoreError> {
        let pruned = self
            .client()
            .await?
            .execute(
                "DELETE FROM router_nonces WHERE handed_at < $1",
                &[&int(cutoff)?],
            )
            .await
            .map_err(pg)?;
        Ok(pruned as usize)
    }
}
