//! PostgreSQL's revert cooldowns: one end per payer, never shortened.

use async_trait::async_trait;

use super::{int, pg, uint, PgStore};
use crate::evm::hex_bytes;
use crate::ledger::Payer;
use crate::store::{CooldownStore, PayerCooldown, StoreError};

/// A payer as `payer_cooldowns` keys it: its whole key in lowercase hex (an address's 20 bytes,
/// as every release wrote them; a Solana key's 32), which the text column takes as it is.
fn payer_key(payer: &Payer) -> String {
    hex_bytes(payer.storage_bytes())
}

/// The payer a `payer_cooldowns` key names.
fn payer_of(key: &str) -> Result<Payer, StoreError> {
    const_hex::decode(key)
        .ok()
        .and_then(|bytes| Payer::from_storage_bytes(&bytes))
        .ok_or_else(|| StoreError::Corrupt {
            key: key.to_string(),
            detail: "not a payer's key (20 or 32 bytes in hex)".to_string(),
        })
}

#[async_trait]
impl CooldownStore for PgStore {
    async fn cool_down(&self, cooldown: PayerCooldown) -> Result<(), StoreError> {
        self.execute(
            "INSERT INTO payer_cooldowns (payer, until_at) VALUES ($1, $2)
             ON CONFLICT (payer) DO UPDATE
                 SET until_at = greatest(payer_cooldowns.until_at, EXCLUDED.until_at)",
            &[&payer_key(&cooldown.payer), &int(cooldown.until)?],
        )
        .await
    }

    async fn cooldown_of(&self, payer: &Payer, now: u64) -> Result<Option<u64>, StoreError> {
        let row = self
            .client()
            .await?
            .query_opt(
                "SELECT until_at FROM payer_cooldowns WHERE payer = $1 AND until_at > $2",
                &[&payer_key(payer), &int(now)?],
            )
            .await
            .map_err(pg)?;
        Ok(row.map(|r| uint(r.get(0))))
    }

    async fn cooldowns(&self, now: u64) -> Result<Vec<PayerCooldown>, StoreError> {
        let rows = self
            .client()
            .await?
            .query(
                "SELECT payer, until_at FROM payer_cooldowns WHERE until_at > $1",
                &[&int(now)?],
            )
            .await
            .map_err(pg)?;
        rows.iter()
            .map(|r| {
                Ok(PayerCooldown {
                    payer: payer_of(r.get(0))?,
                    until: uint(r.get(1)),
                })
            })
            .collect()
    }

    async fn prune_cooldowns(&self, now: u64) -> Result<usize, StoreError> {
        let pruned = self
            .client()
            .await?
            .execute(
                "DELETE FROM payer_cooldowns WHERE until_at <= $1",
                &[&int(now)?],
            )
            .await
            .map_err(pg)?;
        Ok(pruned as usize)
    }
}
