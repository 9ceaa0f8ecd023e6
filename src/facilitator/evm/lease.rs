//! A lane's lease (store.rs: one holder per lane, a fence on every signed write). Invariants:
//! - a worker signs only while it holds the lease, and renews it every TTL/3; past TTL without a
//!   renewal (a paused process, an unreachable database) it renews before signing anything more;
//! - a worker that loses the lease drops everything it had under way without writing: the next
//!   holder resumes those settlements from the store, and their callers here read the outcome
//!   from the store (`Progress::Elsewhere`);
//! - a worker that gains a lease (at start, or when the holder stopped renewing) resumes the
//!   lane's stored settlements and the claims queued for it before signing new ones.

use std::sync::atomic::Ordering;

use tokio::time::Instant;

use super::follower::Seen;
use super::worker::{transaction_count, Slot, Worker, MAX_BATCH};
use super::{LeaseSettings, Ledger};
use crate::facilitator::settlement::waiters::Progress;
use crate::ledger::{EvmRecord, LaneId};
use crate::store::{Lease, StoreError};

/// The store, and the lane's lease in it while this instance holds the lane.
pub(super) struct LeaseHold {
    pub(super) ledger: Ledger,
    /// The lane's lease while this instance holds it: every signed write names it.
    pub(super) lease: Option<Lease>,
    pub(super) settings: LeaseSettings,
    /// Until when the lease is surely still ours (by this process's clock): past it, the lease
    /// is renewed before anything more is signed.
    fresh_until: Instant,
}

impl LeaseHold {
    /// Without the lease yet: `take_over` gives it.
    pub(super) fn new(ledger: Ledger, settings: LeaseSettings, asked_at: Instant) -> Self {
        Self {
            ledger,
            lease: None,
            settings,
            fresh_until: asked_at,
        }
    }
}

impl Worker {
    /// The lease, renewed first if this process cannot be sure it still holds it.
    pub(super) async fn current_lease(&mut self) -> Option<Lease> {
        if self.store.lease.is_some() && Instant::now() >= self.store.fresh_until {
            self.keep_lease().await;
        }
        self.store.lease.clone()
    }

    /// Renews the lease, or takes the lane over when its holder stopped renewing. A failure to
    /// reach the store is only logged: the fence, not the clock, keeps a lane from being signed
    /// on by two instances.
    pub(super) async fn keep_lease(&mut self) {
        let settings = &self.store.settings;
        let asked_at = Instant::now();
        let acquired = self
            .store
            .ledger
            .acquire(&self.lane.id, &settings.holder, settings.ttl)
            .await;
        match acquired {
            Ok(Some(lease)) if self.store.lease.is_some() => self.hold(lease, asked_at),
            Ok(Some(lease)) => {
                tracing::warn!(lane = %self.lane.id, fence = lease.fence, "taking the lane over");
                let resumed = match self.stored_settlements().await {
                    Ok(resumed) => resumed,
                    Err(e) => {
                        tracing::error!(lane = %self.lane.id, error = %e, "could not read the lane's settlements; taking over at the next renewal");
                        return;
                    }
                };
                if let Err(e) = self.take_over(lease, resumed, asked_at).await {
                    tracing::error!(lane = %self.lane.id, error = %e, "could not take the lane over");
                    self.step_down().await;
                }
            }
            Ok(None) if self.store.lease.is_some() => {
                tracing::warn!(lane = %self.lane.id, "lane lease taken by another instance");
                self.step_down().await;
            }
            Ok(None) => {}
            Err(e) => {
                tracing::warn!(lane = %self.lane.id, error = %e, "could not renew the lane lease")
            }
        }
    }

    /// Starts holding the lane: its nonce, its stored settlements, the claims queued for it.
    pub(super) async fn take_over(
        &mut self,
        lease: Lease,
        resumed: Vec<EvmRecord>,
        asked_at: Instant,
    ) -> Result<(), StoreError> {
        let stored = self
            .store
            .ledger
            .lane_nonce(&self.lane.id)
            .await?
            .unwrap_or(0);
        let chain_pending = transaction_count(&self.lane, "pending").await.unwrap_or(0);
        self.nonces.next = stored.max(chain_pending);
        // What the follower saw belongs to the previous holder's time: start afresh.
        self.seen = Seen::default();
        self.hold(lease, asked_at);
        self.adopt(resumed).await;
        self.take_queued().await;
        Ok(())
    }

    /// Holds `lease`, asked for at `asked_at`, here and on the lane's handle.
    fn hold(&mut self, lease: Lease, asked_at: Instant) {
        self.lane.set_lease(Some(lease.clone()));
        self.store.lease = Some(lease);
        self.store.fresh_until = asked_at + self.store.settings.ttl;
    }

    /// The unfinished settlements whose latest transaction is this lane's.
    async fn stored_settlements(&self) -> Result<Vec<EvmRecord>, StoreError> {
        let lane = &self.lane.id;
        Ok(self
            .store
            .ledger
            .unfinished()
            .await?
            .into_iter()
            .filter_map(|r| EvmRecord::try_from(r).ok())
            .filter(|r| {
                r.latest().is_some_and(|a| {
                    LaneId {
                        network: r.network.clone(),
                        signer: a.signer,
                    } == *lane
                })
            })
            .collect())
    }

    /// Moves claims queued for this lane into `to_sign`; answers whether there were any.
    pub(super) async fn take_queued(&mut self) -> bool {
        let Some(lease) = &self.store.lease else {
            return false;
        };
        let room = MAX_BATCH.saturating_sub(self.nonces.to_sign.len());
        match self.store.ledger.take_queued(lease, room).await {
            Ok(records) if records.is_empty() => false,
            Ok(records) => {
                // The queue holds the claims of EVM lanes only.
                let records: Vec<EvmRecord> = records
                    .into_iter()
                    .filter_map(|r| EvmRecord::try_from(r).ok())
                    .collect();
                self.lane
                    .under_way
                    .fetch_add(records.len(), Ordering::Relaxed);
                self.nonces.to_sign.extend(records);
                true
            }
            Err(e) => {
                tracing::warn!(lane = %self.lane.id, error = %e, "could not read the settlement queue");
                false
            }
        }
    }

    /// Stops holding the lane: whatever was under way here is the next holder's.
    pub(super) async fn step_down(&mut self) {
        self.store.lease = None;
        self.lane.set_lease(None);
        let waiting = std::mem::take(&mut self.nonces.to_sign);
        self.hand_over(waiting).await;
        for slot in std::mem::take(&mut self.nonces.slots).into_values() {
            if let Slot::Settlement { record, .. } = slot {
                if record.outcome.is_none() {
                    self.lane.answered();
                    self.out.waiters.finish(&record.key(), Progress::Elsewhere);
                }
            }
        }
    }

    /// Records this worker will not sign: given back to the queue (any lane of the network may
    /// take them), their callers told to read the outcome from the store.
    pub(super) async fn hand_over(&mut self, records: Vec<EvmRecord>) {
        if records.is_empty() {
            return;
        }
        let keys: Vec<_> = records.iter().map(|r| r.key()).collect();
        if let Err(e) = self.store.ledger.requeue(&keys).await {
            // Still queued under this lane's old fence: its next holder takes them.
            tracing::warn!(lane = %self.lane.id, error = %e, "could not give settlements back to the queue");
        }
        for key in keys {
            self.lane.answered();
            self.out.waiters.finish(&key, Progress::Elsewhere);
        }
    }
}
