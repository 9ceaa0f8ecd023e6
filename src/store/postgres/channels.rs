//! PostgreSQL's channel mirror: one row per (network, channel), merged by the one rule
//! (`ChannelSnapshot::merged_over`) in one upsert, so writers of several instances never lower it;
//! and the channels' refund holds, one holder per channel across instances.

use std::time::Duration;

use async_trait::async_trait;
use ethers_core::types::U256;
use tokio_postgres::Row;

use super::{int, pg, uint, PgStore};
use crate::evm::hex_bytes;
use crate::store::{ChannelKey, ChannelSnapshot, ChannelStore, StoreError};

/// The amounts travel as decimal text (`numeric` has no Rust type here).
const PUT: &str = "INSERT INTO channel_mirror AS m
         (network, channel, balance, total_claimed, withdraw_requested_at, refund_nonce, read_at)
     VALUES ($1, $2, $3::text::numeric, $4::text::numeric, $5, $6::text::numeric, $7)
     ON CONFLICT (network, channel) DO UPDATE SET
         total_claimed = greatest(m.total_claimed, EXCLUDED.total_claimed),
         refund_nonce = greatest(m.refund_nonce, EXCLUDED.refund_nonce),
         balance = CASE WHEN EXCLUDED.read_at >= m.read_at
             THEN EXCLUDED.balance ELSE m.balance END,
         withdraw_requested_at = CASE WHEN EXCLUDED.read_at >= m.read_at
             THEN EXCLUDED.withdraw_requested_at ELSE m.withdraw_requested_at END,
         read_at = greatest(m.read_at, EXCLUDED.read_at)
     RETURNING balance::text, total_claimed::text, withdraw_requested_at, refund_nonce::text,
         read_at";

const GET: &str = "SELECT balance::text, total_claimed::text, withdraw_requested_at,
         refund_nonce::text, read_at
     FROM channel_mirror WHERE network = $1 AND channel = $2";

/// Taken when free, run out, or already the holder's (then extended).
const HOLD: &str = "INSERT INTO channel_refund_holds AS h (network, channel, holder, expires_at)
     VALUES ($1, $2, $3, now() + make_interval(secs => $4::float8))
     ON CONFLICT (network, channel) DO UPDATE SET
         holder = EXCLUDED.holder,
         expires_at = EXCLUDED.expires_at
     WHERE h.holder = EXCLUDED.holder OR h.expires_at <= now()
     RETURNING holder";

const RELEASE: &str =
    "DELETE FROM channel_refund_holds WHERE network = $1 AND channel = $2 AND holder = $3";

fn snapshot(key: &ChannelKey, row: &Row) -> Result<ChannelSnapshot, StoreError> {
    let corrupt = || StoreError::Corrupt {
        key: format!("{}|{:#x}", key.network, key.channel),
        detail: "not a channel snapshot".to_string(),
    };
    let amount = |i: usize| row.get::<_, &str>(i).parse::<u128>().map_err(|_| corrupt());
    Ok(ChannelSnapshot {
        balance: amount(0)?,
        total_claimed: amount(1)?,
        withdraw_requested_at: uint(row.get(2)),
        refund_nonce: U256::from_dec_str(row.get(3)).map_err(|_| corrupt())?,
        at: uint(row.get(4)),
    })
}

#[async_trait]
impl ChannelStore for PgStore {
    async fn put_channel(
        &self,
        key: &ChannelKey,
        put: &ChannelSnapshot,
    ) -> Result<ChannelSnapshot, StoreError> {
        let row = self
            .client()
            .await?
            .query_one(
                PUT,
                &[
                    &key.network,
                    &hex_bytes(key.channel),
                    &put.balance.to_string(),
                    &put.total_claimed.to_string(),
                    &int(put.withdraw_requested_at)?,
                    &put.refund_nonce.to_string(),
                    &int(put.at)?,
                ],
            )
            .await
            .map_err(pg)?;
        snapshot(key, &row)
    }

    async fn channel(&self, key: &ChannelKey) -> Result<Option<ChannelSnapshot>, StoreError> {
        let row = self
            .client()
            .await?
            .query_opt(GET, &[&key.network, &hex_bytes(key.channel)])
            .await
            .map_err(pg)?;
        row.map(|row| snapshot(key, &row)).transpose()
    }

    async fn hold_refund(
        &self,
        key: &ChannelKey,
        holder: &str,
        ttl: Duration,
    ) -> Result<bool, StoreError> {
        let row = self
            .client()
            .await?
            .query_opt(
                HOLD,
                &[
                    &key.network,
                    &hex_bytes(key.channel),
                    &holder,
                    &ttl.as_secs_f64(),
                ],
            )
            .await
            .map_err(pg)?;
        Ok(row.is_some())
    }

    async fn release_refund(&self, key: &ChannelKey, holder: &str) -> Result<(), StoreError> {
        self.execute(RELEASE, &[&key.network, &hex_bytes(key.channel), &holder])
            .await
    }
}
