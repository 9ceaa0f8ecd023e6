//! The worker of one signer lane: the only place that gives out, signs with, and follows that
//! signer's nonces. Invariants:
//! - a nonce never goes backwards and is never given back once signed: a nonce a settlement
//!   gives up (it moved to another signer, or expired) is filled by the next settlement or by a
//!   0-value self-transfer;
//! - every signed transaction is stored (with the lane's next nonce) and flushed before it is
//!   broadcast, and a batch of settlements signed together shares one flush;
//! - what happens at each new head is in follower.rs.
//!
//! The worker owns its state alone (no lock): callers reach it through the lane's queue.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use ethers_core::types::{Address, Bytes};
use serde_json::json;
use tokio::sync::mpsc;

use super::lane::{Lane, Lanes};
use super::state::{Attempt, Record, State};
use super::waiters::{Progress, Waiters};
use super::{LeaseSettings, Ledger};
use crate::chain::{self, Call, Refusal, TxFees};
use crate::signer::UnsignedTx;
use crate::store::{Lease, StoreError};

/// Gas of a 0-value self-transfer that fills a nonce.
pub(super) const FILLER_GAS: u64 = 21_000;
/// Settlements signed together at most, sharing one flush and one broadcast batch.
const MAX_BATCH: usize = 256;

/// What occupies one nonce of the lane.
pub(super) enum Slot {
    Settlement {
        record: Box<Record>,
        misses: u8,
    },
    /// A 0-value self-transfer that uses up a nonce nothing else will.
    Filler {
        attempts: Vec<Attempt>,
    },
}

impl Slot {
    pub(super) fn attempts(&self) -> Vec<&Attempt> {
        match self {
            Slot::Settlement { record, .. } => record.live_attempts().collect(),
            Slot::Filler { attempts } => attempts.iter().collect(),
        }
    }

    pub(super) fn latest(&self) -> Option<&Attempt> {
        match self {
            Slot::Settlement { record, .. } => record.live_attempts().last(),
            Slot::Filler { attempts } => attempts.last(),
        }
    }

    pub(super) fn is_included(&self) -> bool {
        matches!(self, Slot::Settlement { record, .. } if matches!(record.state, State::Included { .. }))
    }
}

pub struct Worker {
    pub(super) lane: Arc<Lane>,
    pub(super) lanes: Arc<Lanes>,
    pub(super) ledger: Ledger,
    pub(super) waiters: Arc<Waiters>,
    /// The lane's lease: every signed write names it.
    pub(super) lease: Lease,
    lease_settings: LeaseSettings,
    pub(super) next_nonce: u64,
    pub(super) slots: BTreeMap<u64, Slot>,
    /// Records waiting for a nonce: new claims, and settlements whose nonce was taken.
    pub(super) to_sign: Vec<Record>,
    pub(super) last_chain_nonce: Option<u64>,
    pub(super) stalled: u64,
    /// Nonces below `next_nonce` with nothing in them, seen at the previous head.
    pub(super) gaps_seen: Vec<u64>,
}

impl Worker {
    /// Loads the lane's nonce and the settlements it had under way, and sends them all again
    /// before returning: the daemon serves only after this.
    pub async fn start(
        lane: Arc<Lane>,
        lanes: Arc<Lanes>,
        ledger: Ledger,
        waiters: Arc<Waiters>,
        lease_settings: &LeaseSettings,
        resumed: Vec<Record>,
    ) -> Result<Self, StoreError> {
        let lease = ledger
            .acquire(&lane.id, &lease_settings.holder, lease_settings.ttl)
            .await?
            .ok_or_else(|| StoreError::LeaseLost(lane.id.to_string()))?;
        let stored = ledger.lane_nonce(&lane.id).await?.unwrap_or(0);
        let chain_pending = transaction_count(&lane, "pending").await.unwrap_or(0);
        let mut worker = Self {
            lane,
            lanes,
            ledger,
            waiters,
            lease,
            lease_settings: lease_settings.clone(),
            next_nonce: stored.max(chain_pending),
            slots: BTreeMap::new(),
            to_sign: Vec::new(),
            last_chain_nonce: None,
            stalled: 0,
            gaps_seen: Vec::new(),
        };
        let mut raws = Vec::new();
        for mut record in resumed {
            // Inclusions are found again from receipts: the block may have changed while down.
            record.reorged();
            match record.state.nonce() {
                Some(nonce) => {
                    worker.next_nonce = worker.next_nonce.max(nonce + 1);
                    if let Some(latest) = record.latest() {
                        raws.push(latest.raw.clone());
                    }
                    if record.outcome.is_none() {
                        worker.lane.under_way.fetch_add(1, Ordering::Relaxed);
                    }
                    worker.slots.insert(
                        nonce,
                        Slot::Settlement {
                            record: Box::new(record),
                            misses: 0,
                        },
                    );
                }
                None => worker.to_sign.push(record),
            }
        }
        worker.broadcast(&raws).await;
        Ok(worker)
    }

    pub async fn run(mut self, mut queue: mpsc::Receiver<Record>) {
        let mut heads = self.lane.chain.head.subscribe();
        let mut renewal = tokio::time::interval(self.lease_settings.ttl / 3);
        loop {
            tokio::select! {
                _ = renewal.tick() => self.renew_lease().await,
                received = queue.recv() => {
                    let Some(record) = received else { return };
                    self.to_sign.push(record);
                    while self.to_sign.len() < MAX_BATCH {
                        match queue.try_recv() {
                            Ok(record) => self.to_sign.push(record),
                            Err(_) => break,
                        }
                    }
                    self.sign_waiting().await;
                }
                changed = heads.changed() => {
                    if changed.is_err() {
                        return;
                    }
                    let head = heads.borrow_and_update().clone();
                    if let Some(head) = head {
                        self.on_head(&head).await;
                    }
                }
            }
        }
    }

    // ---- signing -------------------------------------------------------------------------

    /// Gives each waiting record a nonce, signs, stores all in one flush, then broadcasts them
    /// in nonce order in one batch.
    pub(super) async fn sign_waiting(&mut self) {
        if self.to_sign.is_empty() {
            return;
        }
        let Ok(head) = self.lane.chain.latest_head().await else {
            return; // they wait for the next head
        };
        let market = head.fees.for_transaction();
        let records = std::mem::take(&mut self.to_sign);
        let before = self.next_nonce;
        let mut signed = Vec::with_capacity(records.len());
        let mut gaps = self.gaps();
        for mut record in records {
            let nonce = self.take_nonce(&mut gaps);
            let fees = market.capped(self.lane.settings.cap(record.gas_limit));
            let attempt = self.sign(
                nonce,
                record.token,
                &record.calldata,
                record.gas_limit,
                fees,
                head.number,
            );
            record.signed(attempt);
            signed.push(record);
        }
        let refs: Vec<&Record> = signed.iter().collect();
        if let Err(e) = self
            .ledger
            .commit_signed(&self.lease, self.next_nonce, &refs)
            .await
        {
            // Nothing left the process: the nonces can be given back.
            tracing::error!(lane = %self.lane.id, error = %e, "could not store signed settlements");
            self.next_nonce = before;
            for record in signed {
                self.abandon(record, format!("could not store the settlement: {e}"))
                    .await;
            }
            return;
        }
        let raws: Vec<Bytes> = signed
            .iter()
            .map(|r| r.latest().expect("just signed").raw.clone())
            .collect();
        let answers = self.broadcast(&raws).await;
        for (mut record, answer) in signed.into_iter().zip(answers) {
            let nonce = record.state.nonce().expect("just signed");
            match answer {
                Some(Refusal::InsufficientFunds) => {
                    self.lane.funded.store(false, Ordering::Relaxed);
                    if let Some(other) = self.lanes.pick(self.lane.network(), Some(&self.lane.id)) {
                        tracing::warn!(lane = %self.lane.id, to = %other.id, nonce, "signer cannot pay for gas; settlement moves to another signer");
                        // This nonce is now a gap: the next settlement or a self-transfer fills it.
                        other.under_way.fetch_add(1, Ordering::Relaxed);
                        self.lane.answered();
                        // Never wait on another worker's queue: two workers moving work to
                        // each other must not deadlock. A full queue keeps it here.
                        match other.queue.try_send(record) {
                            Ok(()) => continue,
                            Err(e) => {
                                other.answered();
                                self.lane.under_way.fetch_add(1, Ordering::Relaxed);
                                record = match e {
                                    mpsc::error::TrySendError::Full(r)
                                    | mpsc::error::TrySendError::Closed(r) => r,
                                };
                            }
                        }
                    }
                    tracing::warn!(lane = %self.lane.id, nonce, "signer cannot pay for gas and no other signer can; the settlement waits");
                }
                Some(Refusal::Other) => {
                    tracing::warn!(lane = %self.lane.id, nonce, "node refused the settlement; it is sent again at the next blocks");
                }
                _ => {
                    record.sent();
                    // Informative (recovery treats signed and sent alike): no flush to wait for.
                    if let Err(e) = self.ledger.save(&record, false).await {
                        tracing::error!(payment = %record.key(), error = %e, "could not store a sent state");
                    }
                    self.waiters
                        .sent(&record.key(), record.latest().expect("signed").hash);
                }
            }
            self.slots.insert(
                nonce,
                Slot::Settlement {
                    record: Box::new(record),
                    misses: 0,
                },
            );
        }
    }

    /// Nonces between the chain's and `next_nonce` that nothing occupies: given first to new
    /// settlements, so a nonce given up is filled by real work before a self-transfer.
    pub(super) fn gaps(&self) -> std::collections::VecDeque<u64> {
        let Some(floor) = self.last_chain_nonce else {
            return Default::default();
        };
        (floor..self.next_nonce)
            .filter(|n| !self.slots.contains_key(n))
            .collect()
    }

    pub(super) fn take_nonce(&mut self, gaps: &mut std::collections::VecDeque<u64>) -> u64 {
        gaps.pop_front().unwrap_or_else(|| {
            self.next_nonce += 1;
            self.next_nonce - 1
        })
    }

    pub(super) fn sign(
        &self,
        nonce: u64,
        to: Address,
        data: &Bytes,
        gas: u64,
        fees: TxFees,
        block: u64,
    ) -> Attempt {
        let tx = UnsignedTx {
            chain_id: self.lane.chain.settings.chain_id,
            nonce,
            to,
            data: data.clone(),
            gas_limit: gas,
            fees,
        };
        let (hash, raw) = self.lane.signer.sign_transaction(&tx);
        Attempt {
            signer: self.lane.signer.address,
            nonce,
            hash,
            raw,
            fees,
            sent_at_block: block,
        }
    }

    /// Sends raw transactions in one batch; answers, per transaction, the refusal if any
    /// (`None` also when the node could not be asked: it is sent again later).
    pub(super) async fn broadcast(&self, raws: &[Bytes]) -> Vec<Option<Refusal>> {
        if raws.is_empty() {
            return Vec::new();
        }
        let calls: Vec<Call> = raws
            .iter()
            .map(|raw| Call::new("eth_sendRawTransaction", vec![json!(chain::hex_bytes(raw))]))
            .collect();
        match self.lane.chain.client.batch(&calls).await {
            Ok(answers) => answers
                .iter()
                .map(|a| match a {
                    Ok(_) => None,
                    Err(e) => match e.refusal() {
                        Refusal::AlreadyKnown => None,
                        other => {
                            tracing::debug!(lane = %self.lane.id, error = %e, "broadcast refused");
                            Some(other)
                        }
                    },
                })
                .collect(),
            Err(e) => {
                tracing::warn!(lane = %self.lane.id, error = %e, "broadcast failed; sent again at the next blocks");
                vec![None; raws.len()]
            }
        }
    }

    /// Renews the lease before it runs out. A failure to reach the store is only logged: the
    /// fence, not the clock, keeps a lane from being signed on by two instances.
    async fn renew_lease(&mut self) {
        let settings = &self.lease_settings;
        match self
            .ledger
            .acquire(&self.lane.id, &settings.holder, settings.ttl)
            .await
        {
            Ok(Some(lease)) => self.lease = lease,
            Ok(None) => {
                tracing::warn!(lane = %self.lane.id, "lane lease taken by another instance")
            }
            Err(e) => {
                tracing::warn!(lane = %self.lane.id, error = %e, "could not renew the lane lease")
            }
        }
    }

    pub(super) async fn abandon(&mut self, record: Record, why: String) {
        let key = record.key();
        if record.attempts.is_empty() {
            if let Err(e) = self.ledger.release(&key).await {
                tracing::error!(payment = %key, error = %e, "could not release a claim");
            }
        }
        self.lane.answered();
        self.waiters.finish(&key, Progress::Abandoned(why));
    }
}

async fn transaction_count(lane: &Lane, block: &str) -> Option<u64> {
    let answer = lane
        .chain
        .client
        .call(
            "eth_getTransactionCount",
            vec![json!(format!("{:?}", lane.signer.address)), json!(block)],
        )
        .await
        .ok()?
        .ok()?;
    chain::parse_u64(&answer)
}
