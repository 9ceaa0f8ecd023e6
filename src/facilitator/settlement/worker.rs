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
use tokio::time::Instant;

use super::lane::{Lane, Lanes};
use super::waiters::{Progress, Waiters};
use super::{LeaseSettings, Ledger};
use crate::chain::{Call, Refusal};
use crate::clock::unix_now;
use crate::evm;
use crate::evm::TxFees;
use crate::ledger::{Attempt, Lost, Record, State};
use crate::signer::UnsignedTx;
use crate::store::{Lease, StoreError};

/// Gas of a 0-value self-transfer that fills a nonce.
pub(super) const FILLER_GAS: u64 = 21_000;
/// Settlements signed together at most, sharing one flush and one broadcast batch.
pub(super) const MAX_BATCH: usize = 256;
/// How often a lane held here looks for claims queued by other instances (shared store only).
const QUEUE_POLL: std::time::Duration = std::time::Duration::from_millis(50);

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
    /// The lane's lease while this instance holds it: every signed write names it.
    pub(super) lease: Option<Lease>,
    pub(super) lease_settings: LeaseSettings,
    /// Until when the lease is surely still ours (by this process's clock): past it, the lease
    /// is renewed before anything more is signed.
    pub(super) lease_fresh_until: Instant,
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
    /// Takes the lane's lease and, holding it, loads the lane's nonce and the settlements it had
    /// under way and sends them all again before returning: the daemon serves only after this.
    /// A lane another live instance holds starts in standby (lease.rs).
    pub async fn start(
        lane: Arc<Lane>,
        lanes: Arc<Lanes>,
        ledger: Ledger,
        waiters: Arc<Waiters>,
        lease_settings: &LeaseSettings,
        resumed: Vec<Record>,
    ) -> Result<Self, StoreError> {
        let asked_at = Instant::now();
        let lease = ledger
            .acquire(&lane.id, &lease_settings.holder, lease_settings.ttl)
            .await?;
        let mut worker = Self {
            lane,
            lanes,
            ledger,
            waiters,
            lease: None,
            lease_settings: lease_settings.clone(),
            lease_fresh_until: asked_at,
            next_nonce: 0,
            slots: BTreeMap::new(),
            to_sign: Vec::new(),
            last_chain_nonce: None,
            stalled: 0,
            gaps_seen: Vec::new(),
        };
        match lease {
            Some(lease) => worker.take_over(lease, resumed, asked_at).await?,
            None => {
                tracing::info!(lane = %worker.lane.id, "lane held by another instance; standing by")
            }
        }
        Ok(worker)
    }

    /// Resumes stored settlements of this lane: registers their waiters, occupies their nonces
    /// and sends their latest transactions again.
    pub(super) async fn adopt(&mut self, resumed: Vec<Record>) {
        let mut raws = Vec::new();
        for mut record in resumed {
            // Inclusions are found again from receipts: the block may have changed while down.
            record.reorged();
            match record.state.nonce() {
                Some(nonce) => {
                    self.next_nonce = self.next_nonce.max(nonce + 1);
                    if let Some(latest) = record.latest() {
                        raws.push(latest.raw.clone());
                        if record.outcome.is_none() {
                            self.lane.under_way.fetch_add(1, Ordering::Relaxed);
                            Waiters::register(
                                &mut self.waiters.lock(),
                                record.key(),
                                record.digest,
                                record.request.clone(),
                                Progress::Sent(latest.hash),
                            );
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
                None => self.to_sign.push(record),
            }
        }
        self.broadcast(&raws).await;
    }

    pub async fn run(mut self, mut queue: mpsc::Receiver<Record>) {
        let mut heads = self.lane.chain.head.subscribe();
        let mut renewal = tokio::time::interval(self.lease_settings.ttl / 3);
        let mut shared_queue = tokio::time::interval(QUEUE_POLL);
        let shared = self.ledger.shared();
        // Every step runs through the lane's guard: one that panics (a node answer nobody
        // foresaw) is logged, and the worker keeps its nonces and goes on with the next.
        let lane = self.lane.clone();
        loop {
            tokio::select! {
                _ = renewal.tick() => {
                    lane.guard.step(self.renew()).await;
                }
                _ = shared_queue.tick(), if shared && self.lease.is_some() => {
                    lane.guard.step(async {
                        if self.take_queued().await {
                            self.sign_waiting().await;
                        }
                    }).await;
                }
                received = queue.recv() => {
                    let Some(record) = received else { return };
                    self.to_sign.push(record);
                    while self.to_sign.len() < MAX_BATCH {
                        match queue.try_recv() {
                            Ok(record) => self.to_sign.push(record),
                            Err(_) => break,
                        }
                    }
                    lane.guard.step(self.sign_waiting()).await;
                }
                changed = heads.changed() => {
                    if changed.is_err() {
                        return;
                    }
                    let head = heads.borrow_and_update().clone();
                    if let Some(head) = head {
                        lane.guard.step(self.on_head(&head)).await;
                    }
                }
            }
        }
    }

    /// Renews the lease, then works as if a head had come: just taken over, it follows the
    /// chain from where it is now (what the previous holder sent may all be mined already, and
    /// an idle chain brings no new head to find those inclusions at); else it signs what waits.
    async fn renew(&mut self) {
        let standing_by = self.lease.is_none();
        self.keep_lease().await;
        match self.lane.chain.head.current() {
            Some(head) if standing_by && self.lease.is_some() => self.on_head(&head).await,
            _ => self.sign_waiting().await,
        }
    }

    // ---- signing -------------------------------------------------------------------------

    /// Gives each waiting record a nonce, signs, stores all in one flush, then broadcasts them
    /// in nonce order in one batch.
    pub(super) async fn sign_waiting(&mut self) {
        if self.to_sign.is_empty() {
            return;
        }
        let Some(lease) = self.current_lease().await else {
            let records = std::mem::take(&mut self.to_sign);
            self.hand_over(records).await;
            return;
        };
        let Ok(head) = self.lane.chain.latest_head().await else {
            return; // they wait for the next head
        };
        let market = head.fees.for_transaction();
        let records = std::mem::take(&mut self.to_sign);
        // Kept to sign again if a shared database is briefly out of reach.
        let unsigned = if self.ledger.shared() {
            records.clone()
        } else {
            Vec::new()
        };
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
            .commit_signed(&lease, self.next_nonce, &refs)
            .await
        {
            // Nothing left the process: the nonces can be given back.
            self.next_nonce = before;
            match e {
                StoreError::LeaseLost(_) => {
                    tracing::warn!(lane = %self.lane.id, "lane lease lost before signing; its settlements go to the new holder");
                    self.hand_over(signed).await;
                    self.step_down().await;
                }
                // A shared database out of reach: the claims stay, and are signed again at the
                // next head (callers see pending meanwhile, and their retries find the claim).
                e if e.is_unavailable() && self.ledger.shared() => {
                    tracing::error!(lane = %self.lane.id, error = %e, "could not store signed settlements; signing them again at the next head");
                    self.to_sign = unsigned;
                }
                e => {
                    tracing::error!(lane = %self.lane.id, error = %e, "could not store signed settlements");
                    for record in signed {
                        self.abandon(record, format!("could not store the settlement: {e}"))
                            .await;
                    }
                }
            }
            return;
        }
        let raws: Vec<Bytes> = signed
            .iter()
            .map(|r| r.latest().expect("just signed").raw.clone())
            .collect();
        let answers = self.broadcast(&raws).await;
        let mut fillers = Vec::new();
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
                    fillers.push(self.refused(record, nonce, market, head.number).await);
                    continue;
                }
                _ => {
                    record.sent();
                    // Informative (recovery treats signed and sent alike): no flush to wait for.
                    if let Err(e) = self.ledger.save(&[&record], false).await {
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
        self.broadcast(&fillers).await;
    }

    /// A settlement the node refused for a reason that sending it again will not change (not
    /// its nonce, not its price) must not hold the lane (access.md §3): it is answered as
    /// failed, and a self-transfer takes its nonce. Answers the self-transfer to broadcast.
    async fn refused(
        &mut self,
        mut record: Record,
        nonce: u64,
        market: TxFees,
        block: u64,
    ) -> Bytes {
        tracing::warn!(lane = %self.lane.id, payment = %record.key(), nonce, "node refused the settlement transaction; answered as failed, and its nonce goes to a self-transfer");
        let answered_now = record.expire(Lost::Refused, unix_now());
        let filler = self.filler(nonce, market, block);
        let raw = filler.raw.clone();
        self.slots.insert(
            nonce,
            Slot::Filler {
                attempts: vec![filler],
            },
        );
        self.finished(record, answered_now).await;
        raw
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
            .map(|raw| Call::new("eth_sendRawTransaction", vec![json!(evm::hex_bytes(raw))]))
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

pub(super) async fn transaction_count(lane: &Lane, block: &str) -> Option<u64> {
    let answer = lane
        .chain
        .client
        .call(
            "eth_getTransactionCount",
            vec![
                json!(crate::evm::hex_bytes(lane.signer.address)),
                json!(block),
            ],
        )
        .await
        .ok()?
        .ok()?;
    evm::parse_u64(&answer)
}
