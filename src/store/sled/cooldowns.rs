//! sled's revert cooldowns: one end per payer, never shortened, keyed by the payer's whole key
//! (`Payer::storage_bytes`: 20 bytes for an address, 32 for a Solana key).

use async_trait::async_trait;

use super::Store;
use crate::ledger::Payer;
use crate::store::{CooldownStore, PayerCooldown, StoreError};

/// A stored cooldown end (8 bytes, big-endian); anything else reads as ended.
fn cooldown_end(bytes: &[u8]) -> u64 {
    bytes.try_into().map(u64::from_be_bytes).unwrap_or(0)
}

#[async_trait]
impl CooldownStore for Store {
    /// Flushed: a cooldown must outlive a crash right after the revert that caused it.
    async fn cool_down(&self, cooldown: PayerCooldown) -> Result<(), StoreError> {
        self.cooldowns
            .fetch_and_update(cooldown.payer.storage_bytes(), |old| {
                let until = old.map_or(0, cooldown_end).max(cooldown.until);
                Some(until.to_be_bytes().to_vec())
            })?;
        self.flush().await
    }

    async fn cooldown_of(&self, payer: &Payer, now: u64) -> Result<Option<u64>, StoreError> {
        let until = self.cooldowns.get(payer.storage_bytes())?;
        Ok(until.map(|b| cooldown_end(&b)).filter(|until| *until > now))
    }

    async fn cooldowns(&self, now: u64) -> Result<Vec<PayerCooldown>, StoreError> {
        let mut out = Vec::new();
        for entry in self.cooldowns.iter() {
            let (payer, until) = entry?;
            let until = cooldown_end(&until);
            match Payer::from_storage_bytes(&payer) {
                Some(payer) if until > now => out.push(PayerCooldown { payer, until }),
                _ => {}
            }
        }
        Ok(out)
    }

    async fn prune_cooldowns(&self, now: u64) -> Result<usize, StoreError> {
        let mut pruned = 0;
        for entry in self.cooldowns.iter() {
            let (payer, until) = entry?;
            // Removed only if unchanged: a cooldown imposed meanwhile stays.
            if cooldown_end(&until) <= now
                && self
                    .cooldowns
                    .compare_and_swap(&payer, Some(until), None as Option<&[u8]>)?
                    .is_ok()
            {
                pruned += 1;
            }
        }
        Ok(pruned)
    }
}
