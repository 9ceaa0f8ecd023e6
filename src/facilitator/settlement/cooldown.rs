//! Payers whose settlement reverted on chain although its trial succeeded (access.md §2): the
//! operator paid for it, so the payer is refused for `facilitator.revert_cooldown_secs`. A
//! wallet that answers differently on chain than in the trial costs at most one reverted
//! settlement per period, across instances and restarts (access.md §3): the store keeps every
//! cooldown.
//!
//! Verify never reads the store for it (its hot path stays at one upstream request and no
//! database round trip): it asks a copy in memory, loaded at start and, on a shared store,
//! reloaded every `SHARED_REFRESH`. Settle, where the operator's money is at stake, also asks
//! the store for the payer at hand on a shared store, so a cooldown another instance imposed a
//! moment ago is honoured before anything is signed. An embedded store has no other writer: the
//! copy in memory is all of it.
//!
//! A payer is kept under its family's whole key. A cooldown the landed Solana release stored for
//! a Solana payer sits under its key's first 20 bytes (`Payer::earlier_cooldown`) and still
//! refuses that payer until it ends: memory knows it, as it knows every stored cooldown.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::clock::unix_now;
use crate::ledger::Payer;
use crate::store::{PayerCooldown, Storage, StoreError};

/// How often the copy in memory is reloaded from a shared store.
const SHARED_REFRESH: Duration = Duration::from_secs(1);
/// How often ended cooldowns are deleted from the store.
const PRUNE_EVERY: Duration = Duration::from_secs(60);

pub struct Cooldown {
    period: Duration,
    store: Storage,
    /// A payer (as the store keys it) -> unix time its refusal ends, as last read from the
    /// store or imposed here.
    until: Mutex<HashMap<Payer, u64>>,
    imposed: AtomicU64,
}

impl Cooldown {
    pub fn new(period: Duration, store: Storage) -> Self {
        Self {
            period,
            store,
            until: Mutex::default(),
            imposed: AtomicU64::new(0),
        }
    }

    /// Reads the stored cooldowns into memory: call before serving.
    pub async fn load(&self) -> Result<(), StoreError> {
        let now = unix_now();
        let stored = self.store.cooldowns(now).await?;
        let mut map = self.until.lock().expect("cooldown lock");
        map.retain(|_, end| *end > now);
        for cooldown in stored {
            let end = map.entry(cooldown.payer).or_default();
            *end = (*end).max(cooldown.until);
        }
        Ok(())
    }

    /// Keeps the copy in memory current (shared store) and the store free of ended cooldowns.
    pub fn spawn_upkeep(self: Arc<Self>) {
        tokio::spawn(async move {
            let mut refresh = tokio::time::interval(SHARED_REFRESH);
            let mut prune = tokio::time::interval(PRUNE_EVERY);
            let shared = self.store.shared();
            loop {
                tokio::select! {
                    _ = refresh.tick(), if shared => {
                        if let Err(e) = self.load().await {
                            tracing::warn!(error = %e, "could not read the revert cooldowns");
                        }
                    }
                    _ = prune.tick() => {
                        if let Err(e) = self.store.prune_cooldowns(unix_now()).await {
                            tracing::warn!(error = %e, "could not prune ended revert cooldowns");
                        }
                    }
                }
            }
        });
    }

    /// A settlement of `payer` reverted on chain. Refused here at once; stored for the other
    /// instances and the next start (a failed write is logged: this instance still refuses).
    pub async fn impose(&self, payer: &Payer) {
        let payer = *payer;
        let until = unix_now().saturating_add(self.period.as_secs());
        self.remember(payer, until);
        self.imposed.fetch_add(1, Ordering::Relaxed);
        tracing::warn!(%payer, seconds = self.period.as_secs(), "a settlement reverted on chain: payer refused for the revert cooldown");
        if self.period.is_zero() {
            return;
        }
        if let Err(e) = self.store.cool_down(PayerCooldown { payer, until }).await {
            tracing::error!(error = %e, "could not store a revert cooldown; only this instance refuses the payer");
        }
    }

    fn remember(&self, payer: Payer, until: u64) {
        let now = unix_now();
        let mut map = self.until.lock().expect("cooldown lock");
        map.retain(|_, end| *end > now);
        let end = map.entry(payer).or_default();
        *end = (*end).max(until);
    }

    /// Seconds left of `payer`'s refusal, if it is refused now, as known in memory: under its
    /// own key or where the landed Solana release stored it.
    pub fn refuses(&self, payer: &Payer) -> Option<u64> {
        let map = self.until.lock().expect("cooldown lock");
        let until = std::iter::once(*payer)
            .chain(payer.earlier_cooldown())
            .filter_map(|stored| map.get(&stored).copied())
            .max()?;
        let left = until.saturating_sub(unix_now());
        (left > 0).then_some(left)
    }

    /// Seconds left of `payer`'s refusal, also asking a shared store (another instance may
    /// have imposed it since the last reload) under the payer's own key: this release stores
    /// nothing in the earlier layout, and what is stored there is in memory since the last load.
    pub async fn refuses_stored(&self, payer: &Payer) -> Result<Option<u64>, StoreError> {
        if let Some(left) = self.refuses(payer) {
            return Ok(Some(left));
        }
        if !self.store.shared() {
            return Ok(None);
        }
        let now = unix_now();
        let Some(until) = self.store.cooldown_of(payer, now).await? else {
            return Ok(None);
        };
        self.remember(*payer, until);
        Ok(Some(until.saturating_sub(now)))
    }

    /// How many refusals were imposed by this instance since start.
    pub fn imposed(&self) -> u64 {
        self.imposed.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use ethers_core::types::Address;
    use solana_pubkey::Pubkey;

    use super::*;

    fn store(name: &str) -> Storage {
        let dir = crate::testing::temp_dir(&format!("cooldown-{name}"));
        Arc::new(crate::store::sled::Store::open(&dir).unwrap())
    }

    #[tokio::test]
    async fn a_payer_is_refused_for_the_period_and_others_are_not() {
        let cooldown = Cooldown::new(Duration::from_secs(60), store("period"));
        let payer = Payer::Evm(Address::repeat_byte(1));
        assert_eq!(cooldown.refuses(&payer), None);
        cooldown.impose(&payer).await;
        assert!(cooldown.refuses(&payer).is_some_and(|left| left <= 60));
        assert_eq!(cooldown.refuses(&Payer::Evm(Address::repeat_byte(2))), None);
        assert_eq!(cooldown.imposed(), 1);
        let none = Cooldown::new(Duration::ZERO, store("none"));
        none.impose(&payer).await;
        assert_eq!(none.refuses(&payer), None);
    }

    /// What one instance imposed, the next one (same store) refuses once loaded.
    #[tokio::test]
    async fn a_cooldown_outlives_the_instance_that_imposed_it() {
        let storage = store("restart");
        let payer = Payer::Evm(Address::repeat_byte(3));
        Cooldown::new(Duration::from_secs(60), storage.clone())
            .impose(&payer)
            .await;
        let next = Cooldown::new(Duration::from_secs(60), storage);
        assert_eq!(next.refuses(&payer), None, "nothing before loading");
        next.load().await.unwrap();
        assert!(next.refuses(&payer).is_some_and(|left| left <= 60));
        assert!(next.refuses_stored(&payer).await.unwrap().is_some());
    }

    /// A Solana payer is refused under its whole key: another key sharing its first 20 bytes is
    /// not, here nor in the next instance.
    #[tokio::test]
    async fn a_solana_payer_is_refused_under_its_whole_key() {
        let storage = store("solana");
        let key =
            |last| Pubkey::new_from_array(std::array::from_fn(|i| if i < 20 { 7 } else { last }));
        let (payer, neighbour) = (Payer::Svm(key(1)), Payer::Svm(key(2)));
        Cooldown::new(Duration::from_secs(60), storage.clone())
            .impose(&payer)
            .await;
        let next = Cooldown::new(Duration::from_secs(60), storage);
        next.load().await.unwrap();
        assert!(next.refuses(&payer).is_some());
        assert_eq!(next.refuses(&neighbour), None);
        assert_eq!(next.refuses_stored(&neighbour).await.unwrap(), None);
    }

    /// A cooldown the landed Solana release stored (under the key's first 20 bytes) still
    /// refuses that payer once loaded.
    #[tokio::test]
    async fn a_solana_cooldown_in_the_earlier_layout_still_refuses() {
        let storage = store("landed");
        let key = Pubkey::new_from_array([9; 32]);
        let until = unix_now() + 60;
        let landed = PayerCooldown {
            payer: Payer::Evm(Address::repeat_byte(9)),
            until,
        };
        storage.cool_down(landed).await.unwrap();
        let cooldown = Cooldown::new(Duration::from_secs(60), storage);
        cooldown.load().await.unwrap();
        assert!(cooldown.refuses(&Payer::Svm(key)).is_some());
        assert!(cooldown
            .refuses_stored(&Payer::Svm(key))
            .await
            .unwrap()
            .is_some());
        let other = Payer::Svm(Pubkey::new_from_array([8; 32]));
        assert_eq!(cooldown.refuses(&other), None);
    }
}
