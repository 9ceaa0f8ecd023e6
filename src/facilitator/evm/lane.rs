//! A signer lane: one signer key on one network, and the handle callers use to reach its
//! worker (worker.rs signs, follower.rs follows the chain). Callers only count settlements on a
//! lane and queue records to it; the worker alone gives out the signer's nonces.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use ethers_core::types::{Address, U256};
use tokio::sync::mpsc;

use crate::chain::{Chain, FeeCap};
use crate::facilitator::settlement::answer_times::AnswerTimes;
use crate::facilitator::settlement::cooldown::Cooldown;
use crate::facilitator::settlement::waiters::Waiters;
use crate::guard::Guard;
use crate::ledger::{EvmRecord, LaneId, Outcome};
use crate::signer::Signer;
use crate::store::Lease;

/// Gas a signer must afford at the current price to be chosen for a settlement.
pub const SETTLEMENT_GAS: u64 = 150_000;
/// Without fee keys set by the operator, replacements stop at this multiple of the price the
/// transaction was first signed at (access.md §2: unbounded escalation is never the default),
/// and at the network's default cap (`FeeCap`) if that is lower.
const DEFAULT_BUMP_CEILING: u64 = 4;
/// Settlements waiting for a lane's worker; senders wait when it is full.
const QUEUE: usize = 1024;

/// What the lane is allowed to pay, from the chain's settings.
#[derive(Debug, Clone)]
pub struct LaneSettings {
    pub confirmations: u64,
    pub finality_depth: u64,
    pub bump_after_blocks: u64,
    /// The absolute cap per gas: configured, the network's preset, or derived from its blocks.
    pub max_fee_per_gas: FeeCap,
    pub max_settlement_cost: Option<U256>,
    /// Whether the operator set a fee key (`max_fee_per_gas` or `max_settlement_cost_wei`):
    /// then bumps go up to the caps; otherwise also no higher than `DEFAULT_BUMP_CEILING`
    /// times the first price.
    pub operator_caps: bool,
}

impl LaneSettings {
    /// The highest price per gas for a transaction of `gas` gas (`None` only while a derived
    /// cap is not known yet and no cost cap is set).
    pub(super) fn cap(&self, gas: u64) -> Option<U256> {
        let by_cost = self.max_settlement_cost.map(|c| c / U256::from(gas.max(1)));
        match (self.max_fee_per_gas.get(), by_cost) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// The highest price per gas a replacement may pay: the caps, and without fee keys of the
    /// operator's also `DEFAULT_BUMP_CEILING` times `first`, the price the transaction was
    /// first signed at.
    pub(super) fn bump_cap(&self, gas: u64, first: U256) -> U256 {
        let relative = first.saturating_mul(DEFAULT_BUMP_CEILING.into());
        match self.cap(gas) {
            Some(cap) if self.operator_caps => cap,
            Some(cap) => cap.min(relative),
            None => relative,
        }
    }
}

/// The handle callers hold; the worker behind it owns the nonces.
pub struct Lane {
    pub id: LaneId,
    pub(super) chain: Arc<Chain>,
    pub(super) signer: Arc<Signer>,
    pub(super) settings: LaneSettings,
    pub(super) queue: mpsc::Sender<EvmRecord>,
    pub(super) under_way: AtomicUsize,
    pub(super) funded: AtomicBool,
    /// Where a settlement that reverted on chain sends its payer.
    pub(super) cooldown: Arc<Cooldown>,
    /// The worker's steps (see [`Guard`]).
    pub guard: Guard,
    /// The lease while this instance holds the lane (set by its worker).
    lease: Mutex<Option<Lease>>,
}

impl Lane {
    pub fn new(
        chain: Arc<Chain>,
        signer: Arc<Signer>,
        settings: LaneSettings,
        cooldown: Arc<Cooldown>,
    ) -> (Arc<Self>, mpsc::Receiver<EvmRecord>) {
        let (queue, receiver) = mpsc::channel(QUEUE);
        let guard = Guard::new(format!(
            "signer lane {} {}",
            chain.name,
            crate::evm::hex_bytes(signer.address)
        ));
        let lane = Arc::new(Self {
            id: LaneId {
                network: chain.name.clone(),
                signer: signer.address,
            },
            chain,
            signer,
            settings,
            queue,
            under_way: AtomicUsize::new(0),
            funded: AtomicBool::new(true),
            cooldown,
            guard,
            lease: Mutex::new(None),
        });
        (lane, receiver)
    }

    pub fn network(&self) -> &str {
        &self.id.network
    }

    pub fn signer_address(&self) -> Address {
        self.id.signer
    }

    /// Settlements chosen for this lane and not answered yet.
    pub fn under_way(&self) -> usize {
        self.under_way.load(Ordering::Relaxed)
    }

    /// The lane's lease, while this instance holds it.
    pub fn lease(&self) -> Option<Lease> {
        self.lease.lock().expect("lease lock").clone()
    }

    pub(super) fn set_lease(&self, lease: Option<Lease>) {
        *self.lease.lock().expect("lease lock") = lease;
    }

    /// Whether the signer could pay for a settlement at the last head.
    pub fn funded(&self) -> bool {
        self.funded.load(Ordering::Relaxed)
    }

    /// Counts a settlement on this lane from the moment it is chosen, so a burst spreads over
    /// every key; the count drops when the settlement is answered or the reservation dropped.
    pub fn reserve(self: &Arc<Self>) -> Reservation {
        self.under_way.fetch_add(1, Ordering::Relaxed);
        Reservation {
            lane: Some(self.clone()),
        }
    }

    pub(super) fn answered(&self) {
        let _ = self
            .under_way
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1));
    }

    /// Moves a settlement, and its count, to `other`'s worker. Never waits on `other`'s queue:
    /// two workers moving work to each other must not deadlock. A full (or closed) queue keeps
    /// it here, still counted here: answers it then.
    pub(super) fn pass(&self, other: &Lane, record: EvmRecord) -> Option<EvmRecord> {
        // Counted on `other` before its worker can answer it: `answered` never goes below zero,
        // so a count added after the answer would stay.
        other.under_way.fetch_add(1, Ordering::Relaxed);
        self.answered();
        let refused = other.queue.try_send(record).err()?;
        other.answered();
        self.under_way.fetch_add(1, Ordering::Relaxed);
        Some(refused.into_inner())
    }
}

/// A settlement counted on a lane before it is handed to the worker.
pub struct Reservation {
    lane: Option<Arc<Lane>>,
}

impl Reservation {
    pub fn lane(&self) -> &Arc<Lane> {
        self.lane.as_ref().expect("held until submitted")
    }

    /// Hands a claimed record to the worker; the worker now answers for the count (the
    /// reservation is spent: dropping it counts nothing).
    pub async fn submit(&mut self, record: EvmRecord) {
        let lane = self.lane.take().expect("held until submitted");
        if lane.queue.send(record).await.is_err() {
            tracing::error!(lane = %lane.id, "lane worker has stopped");
        }
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        if let Some(lane) = &self.lane {
            lane.answered();
        }
    }
}

/// Every lane of every network; a worker uses it to move a settlement its signer cannot pay for.
#[derive(Default)]
pub struct Lanes {
    by_network: HashMap<String, Vec<Arc<Lane>>>,
    pub(super) lost: AtomicU64,
    /// Block-to-answer times of the settlements answered here.
    answer_times: AnswerTimes,
}

impl Lanes {
    /// The lanes, answering into `answer_times`.
    pub fn new(lanes: Vec<Arc<Lane>>, answer_times: AnswerTimes) -> Self {
        let mut by_network: HashMap<String, Vec<Arc<Lane>>> = HashMap::new();
        for lane in lanes {
            by_network
                .entry(lane.network().to_string())
                .or_default()
                .push(lane);
        }
        Self {
            by_network,
            lost: AtomicU64::new(0),
            answer_times,
        }
    }

    pub fn all(&self) -> impl Iterator<Item = &Arc<Lane>> {
        self.by_network.values().flatten()
    }

    pub fn find(&self, id: &LaneId) -> Option<&Arc<Lane>> {
        self.by_network
            .get(&id.network)?
            .iter()
            .find(|l| l.id == *id)
    }

    /// The funded lane held here with the fewest settlements under way (a lane not held here
    /// only when none is; any lane when none is funded).
    pub fn pick(&self, network: &str, except: Option<&LaneId>) -> Option<&Arc<Lane>> {
        let candidates = self
            .by_network
            .get(network)?
            .iter()
            .filter(|l| Some(&l.id) != except);
        candidates
            .min_by_key(|l| (l.lease().is_none(), !l.funded(), l.under_way()))
            .filter(|l| except.is_none() || l.funded())
    }

    /// The lane of `signer` on `network`: an `upto` payment names the signer that must send it.
    pub fn of_signer(&self, network: &str, signer: Address) -> Option<&Arc<Lane>> {
        self.by_network
            .get(network)?
            .iter()
            .find(|l| l.id.signer == signer)
    }

    /// Settlements answered with success whose transaction can no longer land.
    pub fn lost(&self) -> u64 {
        self.lost.load(Ordering::Relaxed)
    }

    pub fn answer_times(&self) -> &AnswerTimes {
        &self.answer_times
    }

    /// Tells the callers waiting on `record` (included on `lane`'s chain) its outcome, and
    /// times their answer from its block as the head watcher first saw it.
    pub(super) fn answer(
        &self,
        lane: &Lane,
        waiters: &Waiters,
        record: &EvmRecord,
        outcome: Outcome,
    ) {
        let block = record.state.inclusion().map(|i| i.block);
        let seen = block.and_then(|b| lane.chain.head.first_seen(b));
        if waiters.done(record, outcome) {
            if let Some(seen) = seen {
                self.answer_times.observe("evm", seen.elapsed());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(max_fee: Option<u64>, max_cost: Option<u64>) -> LaneSettings {
        LaneSettings {
            confirmations: 1,
            finality_depth: 64,
            bump_after_blocks: 3,
            max_fee_per_gas: match max_fee {
                Some(cap) => FeeCap::Set(cap.into()),
                None => FeeCap::Derived(Default::default()),
            },
            max_settlement_cost: max_cost.map(U256::from),
            operator_caps: max_fee.is_some() || max_cost.is_some(),
        }
    }

    #[test]
    fn bumps_stop_at_the_configured_caps_or_by_default_at_a_multiple_of_the_first_price() {
        let first = U256::from(10);
        assert_eq!(settings(None, None).bump_cap(100, first), U256::from(40));
        assert_eq!(
            settings(Some(25), None).bump_cap(100, first),
            U256::from(25)
        );
        assert_eq!(
            settings(Some(25), Some(1_000)).bump_cap(100, first),
            U256::from(10)
        );
    }

    #[test]
    fn without_operator_caps_a_default_cap_bounds_the_first_price_and_the_bumps() {
        let first = U256::from(10);
        let derived = settings(None, None);
        assert_eq!(derived.cap(100), None, "not derived yet");
        let FeeCap::Derived(cell) = &derived.max_fee_per_gas else {
            unreachable!()
        };
        cell.set(U256::from(25)).unwrap();
        assert_eq!(derived.cap(100), Some(U256::from(25)));
        assert_eq!(derived.bump_cap(100, first), U256::from(25));
        assert_eq!(derived.bump_cap(100, U256::from(5)), U256::from(20));
        // A preset cap is no operator key: the relative ceiling still applies under it.
        let preset = LaneSettings {
            max_fee_per_gas: FeeCap::Set(U256::from(100)),
            ..settings(None, None)
        };
        assert_eq!(preset.bump_cap(100, first), U256::from(40));
        assert_eq!(preset.bump_cap(100, U256::from(30)), U256::from(100));
    }
}
