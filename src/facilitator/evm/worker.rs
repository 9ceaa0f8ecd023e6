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
//!
//! One `Worker`, its `impl` in three files, one concern each:
//! - worker.rs (here): the state (`Nonces`, `Out`), start and the main loop, and signing:
//!   assign and sign (`assign_and_sign`), what a failed store write does to a batch
//!   (`after_commit_failure`), where the node's answer sends each settlement (`route`);
//! - lease.rs: the store and the lane's lease (`LeaseHold`): renewal, takeover, standing
//!   down, handing settlements back to the queue;
//! - follower.rs: what happens at each new head, and what it keeps from one to the next
//!   (`Seen`).

use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::Ordering;
use std::sync::Arc;

use ethers_core::types::{Address, Bytes};
use serde_json::json;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tracing::Instrument;

use super::follower::Seen;
use super::lane::{Lane, Lanes};
use super::lease::LeaseHold;
use super::{LeaseSettings, Ledger};
use crate::chain::Traffic;
use crate::chain::{Call, Refusal};
use crate::clock::unix_now;
use crate::evm;
use crate::evm::TxFees;
use crate::facilitator::settlement::waiters::{Progress, Waiters};
use crate::ledger::{Attempt, EvmRecord, Lost, Record, State};
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
        record: Box<EvmRecord>,
        misses: u8,
    },
    /// A 0-value self-transfer that uses up a nonce nothing else will.
    Filler {
        attempts: Vec<Attempt>,
    },
}

impl Slot {
    /// A settlement that has just taken (or taken again) its nonce: no heads missed yet.
    pub(super) fn settlement(record: EvmRecord) -> Self {
        Slot::Settlement {
            record: Box::new(record),
            misses: 0,
        }
    }

    /// A self-transfer signed into a nonce.
    pub(super) fn filler(attempt: Attempt) -> Self {
        Slot::Filler {
            attempts: vec![attempt],
        }
    }

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

/// The lane's nonces: the next one to give out, what occupies those given out, and the records
/// waiting for one.
#[derive(Default)]
pub(super) struct Nonces {
    /// The lowest nonce never given out; stored with every signed batch.
    pub(super) next: u64,
    pub(super) slots: BTreeMap<u64, Slot>,
    /// Records waiting for a nonce: new claims, and settlements whose nonce was taken.
    pub(super) to_sign: Vec<EvmRecord>,
}

impl Nonces {
    /// Nonces from `floor` up to `next` that nothing occupies.
    pub(super) fn free(&self, floor: u64) -> impl Iterator<Item = u64> + '_ {
        (floor..self.next).filter(|n| !self.slots.contains_key(n))
    }

    /// The first of `gaps`, else a new nonce.
    fn take(&mut self, gaps: &mut VecDeque<u64>) -> u64 {
        gaps.pop_front().unwrap_or_else(|| {
            self.next += 1;
            self.next - 1
        })
    }
}

/// What the worker shares with the rest of the process: where its answers go out.
pub(super) struct Out {
    /// Every lane: where a settlement this signer cannot pay for moves; the count of lost ones.
    pub(super) lanes: Arc<Lanes>,
    /// The callers waiting on this lane's settlements.
    pub(super) waiters: Arc<Waiters>,
}

pub struct Worker {
    /// The lane's identity, signer, chain and settings, and the counts callers read (lane.rs).
    pub(super) lane: Arc<Lane>,
    /// The other lanes and the callers waiting.
    pub(super) out: Out,
    /// The store, and the lane's lease in it (lease.rs).
    pub(super) store: LeaseHold,
    /// The signer's nonces and what occupies them; the records waiting for one.
    pub(super) nonces: Nonces,
    /// What the follower saw at the previous head (follower.rs).
    pub(super) seen: Seen,
}

/// Settlements given nonces and signed together, not stored yet.
struct Batch {
    /// The lease they were signed under: the write that stores them names it.
    lease: Lease,
    /// The fees of the head they were signed at, and its number.
    market: TxFees,
    block: u64,
    signed: Vec<EvmRecord>,
    /// The same records before signing, kept (shared store only) to sign again.
    unsigned: Vec<EvmRecord>,
    /// The lane's next nonce before this batch, to give its nonces back if it is not stored.
    next_before: u64,
}

/// What becomes of a signed batch the store did not take. Nothing of it left the process, so
/// its nonces are given back whichever it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum CommitFailure {
    /// The lane's lease moved to another instance: its settlements go to the new holder.
    HandOver,
    /// A shared database out of reach: the claims stay, and are signed again at the next head
    /// (callers see pending meanwhile, and their retries find the claim).
    SignAgain,
    /// Anything else: the settlements are abandoned, their callers told nothing was sent.
    Abandon,
}

/// The commit-failure policy (see `CommitFailure`). An embedded store that fails is not
/// "briefly out of reach": only a shared one is waited for.
fn after_commit_failure(error: &StoreError, shared: bool) -> CommitFailure {
    match error {
        StoreError::LeaseLost(_) => CommitFailure::HandOver,
        e if e.is_unavailable() && shared => CommitFailure::SignAgain,
        _ => CommitFailure::Abandon,
    }
}

/// Where a stored settlement goes once the node answered its broadcast.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Route {
    /// Taken, or not refused for good: followed at its nonce from now on.
    Sent,
    /// The signer cannot pay for gas: another signer's lane takes it if one can.
    AnotherSigner,
    /// Refused as it is: answered as failed, and a self-transfer takes its nonce.
    Refused,
}

/// Only two refusals change a settlement's course at once. The others leave it followed like
/// a sent transaction: a nonce too low is found mined, or moved to a new nonce, at the next
/// heads; an underpriced or busy one is sent again, and bumped, by the follower. An unclear
/// answer is no refusal: the node may have taken the transaction, so it keeps its nonce and is
/// answered by what the chain shows (access.md §2).
fn route(answer: Option<Refusal>) -> Route {
    match answer {
        Some(Refusal::InsufficientFunds) => Route::AnotherSigner,
        Some(Refusal::Rejected) => Route::Refused,
        _ => Route::Sent,
    }
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
        resumed: Vec<EvmRecord>,
    ) -> Result<Self, StoreError> {
        let asked_at = Instant::now();
        let lease = ledger
            .acquire(&lane.id, &lease_settings.holder, lease_settings.ttl)
            .await?;
        let mut worker = Self {
            lane,
            out: Out { lanes, waiters },
            store: LeaseHold::new(ledger, lease_settings.clone(), asked_at),
            nonces: Nonces::default(),
            seen: Seen::default(),
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
    pub(super) async fn adopt(&mut self, resumed: Vec<EvmRecord>) {
        let mut raws = Vec::new();
        for mut record in resumed {
            // Inclusions are found again from receipts: the block may have changed while down.
            record.reorged();
            match record.state.nonce() {
                Some(nonce) => {
                    self.nonces.next = self.nonces.next.max(nonce + 1);
                    if let Some(latest) = record.latest() {
                        raws.push(latest.raw.clone());
                        if record.outcome.is_none() {
                            self.lane.under_way.fetch_add(1, Ordering::Relaxed);
                            Waiters::register(
                                &mut self.out.waiters.lock(),
                                record.key(),
                                record.digest,
                                record.request.clone(),
                                Progress::Sent(latest.hash),
                                tracing::Span::none(),
                            );
                        }
                    }
                    self.nonces.slots.insert(nonce, Slot::settlement(record));
                }
                None => self.nonces.to_sign.push(record),
            }
        }
        self.broadcast(&raws).await;
    }

    pub async fn run(mut self, mut queue: mpsc::Receiver<EvmRecord>) {
        let mut heads = self.lane.chain.head.subscribe();
        let mut renewal = tokio::time::interval(self.store.settings.ttl / 3);
        let mut shared_queue = tokio::time::interval(QUEUE_POLL);
        let shared = self.store.ledger.shared();
        // Every step runs through the lane's guard: one that panics (a node answer nobody
        // foresaw) is logged, and the worker keeps its nonces and goes on with the next.
        let lane = self.lane.clone();
        loop {
            // A new head first: the callers whose settlements it confirmed are waiting for
            // their answers, and signing what queued meanwhile can follow it.
            tokio::select! {
                biased;
                changed = heads.changed() => {
                    if changed.is_err() {
                        return;
                    }
                    let head = heads.borrow_and_update().clone();
                    if let Some(head) = head {
                        lane.guard.step(self.on_head(&head)).await;
                    }
                }
                _ = renewal.tick() => {
                    lane.guard.step(self.renew()).await;
                }
                _ = shared_queue.tick(), if shared && self.store.lease.is_some() => {
                    lane.guard.step(async {
                        if self.take_queued().await {
                            self.sign_waiting().await;
                        }
                    }).await;
                }
                received = queue.recv() => {
                    let Some(record) = received else { return };
                    self.nonces.to_sign.push(record);
                    while self.nonces.to_sign.len() < MAX_BATCH {
                        match queue.try_recv() {
                            Ok(record) => self.nonces.to_sign.push(record),
                            Err(_) => break,
                        }
                    }
                    lane.guard.step(self.sign_waiting()).await;
                }
            }
        }
    }

    /// Renews the lease, then works as if a head had come: just taken over, it follows the
    /// chain from where it is now (what the previous holder sent may all be mined already, and
    /// an idle chain brings no new head to find those inclusions at); else it signs what waits.
    async fn renew(&mut self) {
        let standing_by = self.store.lease.is_none();
        self.keep_lease().await;
        match self.lane.chain.head.current() {
            Some(head) if standing_by && self.store.lease.is_some() => self.on_head(&head).await,
            _ => self.sign_waiting().await,
        }
    }

    // ---- signing -------------------------------------------------------------------------

    /// Gives each waiting record a nonce, signs, stores all in one flush, then broadcasts them
    /// in nonce order in one batch. The store write comes first: nothing signed leaves the
    /// process before it is stored with the lane's next nonce, so that after a crash whatever
    /// the network may have is resumed from the store and no nonce is given out twice.
    pub(super) async fn sign_waiting(&mut self) {
        let started = Instant::now();
        let Some(batch) = self.assign_and_sign().await else {
            return;
        };
        let signed = started.elapsed();
        let count = batch.signed.len();
        let records: Vec<&Record> = batch.signed.iter().map(EvmRecord::as_record).collect();
        let committed = self
            .store
            .ledger
            .commit_signed(&batch.lease, self.nonces.next, &records)
            .await;
        let stored = started.elapsed();
        match committed {
            Ok(()) => self.send_signed(batch).await,
            Err(e) => self.commit_failed(batch, e).await,
        }
        // What a batch holds the lane for: a head that comes meanwhile waits for all of it.
        tracing::debug!(
            lane = %self.lane.id,
            settlements = count,
            signed_us = signed.as_micros() as u64,
            stored_us = stored.as_micros() as u64,
            sent_us = started.elapsed().as_micros() as u64,
            "batch signed"
        );
    }

    /// Holding the lease, takes every record waiting for a nonce, gives each one (the gaps
    /// first) and signs it at the latest head's fees within the caps; stores and sends nothing.
    /// Without the lease the records go back to the queue; without a head they wait for the next.
    async fn assign_and_sign(&mut self) -> Option<Batch> {
        if self.nonces.to_sign.is_empty() {
            return None;
        }
        let Some(lease) = self.current_lease().await else {
            let records = std::mem::take(&mut self.nonces.to_sign);
            self.hand_over(records).await;
            return None;
        };
        let Ok(head) = self.lane.chain.latest_head().await else {
            return None; // they wait for the next head
        };
        let market = head.fees.for_transaction();
        let records = std::mem::take(&mut self.nonces.to_sign);
        // Kept to sign again if a shared database is briefly out of reach.
        let unsigned = if self.store.ledger.shared() {
            records.clone()
        } else {
            Vec::new()
        };
        let next_before = self.nonces.next;
        let mut signed = Vec::with_capacity(records.len());
        let mut gaps = self.gaps();
        for mut record in records {
            let nonce = self.nonces.take(&mut gaps);
            let evm = record.part();
            let fees = market.capped(self.lane.settings.cap(evm.gas_limit));
            let attempt = self.sign(
                nonce,
                evm.call_target(),
                &evm.calldata,
                evm.gas_limit,
                fees,
                head.number,
            );
            record.signed(attempt);
            signed.push(record);
        }
        Some(Batch {
            lease,
            market,
            block: head.number,
            signed,
            unsigned,
            next_before,
        })
    }

    /// The store did not take the batch: its settlements go where `after_commit_failure` says.
    async fn commit_failed(&mut self, batch: Batch, e: StoreError) {
        // Nothing left the process: the nonces can be given back.
        self.nonces.next = batch.next_before;
        match after_commit_failure(&e, self.store.ledger.shared()) {
            CommitFailure::HandOver => {
                tracing::warn!(lane = %self.lane.id, "lane lease lost before signing; its settlements go to the new holder");
                self.hand_over(batch.signed).await;
                self.step_down().await;
            }
            CommitFailure::SignAgain => {
                tracing::error!(lane = %self.lane.id, error = %e, "could not store signed settlements; signing them again at the next head");
                self.nonces.to_sign = batch.unsigned;
            }
            CommitFailure::Abandon => {
                tracing::error!(lane = %self.lane.id, error = %e, "could not store signed settlements");
                for record in batch.signed {
                    self.abandon(record, format!("could not store the settlement: {e}"))
                        .await;
                }
            }
        }
    }

    /// Broadcasts a stored batch in nonce order in one batch, routes each settlement by the
    /// node's answer, then broadcasts the self-transfers that took refused settlements' nonces.
    async fn send_signed(&mut self, batch: Batch) {
        let raws: Vec<Bytes> = batch
            .signed
            .iter()
            .map(|r| r.latest().expect("just signed").raw.clone())
            .collect();
        // One broadcast for the whole batch: traced under its first settlement's span.
        let span = batch
            .signed
            .first()
            .map_or_else(tracing::Span::none, |r| self.out.waiters.span(&r.key()));
        let answers = self.broadcast(&raws).instrument(span).await;
        let (market, block) = (batch.market, batch.block);
        let mut fillers = Vec::new();
        let mut sent = Vec::with_capacity(batch.signed.len());
        for (record, answer) in batch.signed.into_iter().zip(answers) {
            let nonce = record.state.nonce().expect("just signed");
            match route(answer) {
                Route::Sent => sent.push(record),
                Route::AnotherSigner => self.another_signer(record, nonce).await,
                Route::Refused => fillers.push(self.refused(record, nonce, market, block).await),
            }
        }
        self.sent(sent).await;
        self.broadcast(&fillers).await;
    }

    /// A settlement its signer cannot pay gas for: moved to another signer's lane when one can
    /// take it (its nonce here is a gap now), else kept at its nonce.
    async fn another_signer(&mut self, record: EvmRecord, nonce: u64) {
        if record.part().sender.is_some() {
            self.sender_unfunded(record, nonce).await;
        } else if let Some(stays) = self.move_unfunded(record, nonce) {
            self.nonces.slots.insert(nonce, Slot::settlement(stays));
        }
    }

    /// Settlements the node took (or may take when sent again): `Sent`, stored in one write,
    /// their callers told the hash, and followed at their nonces. One write for the whole
    /// broadcast rather than one a settlement: the lane answers the next head only after this.
    async fn sent(&mut self, mut records: Vec<EvmRecord>) {
        if records.is_empty() {
            return;
        }
        records.iter_mut().for_each(|r| r.sent());
        // Informative (recovery treats signed and sent alike): no flush to wait for.
        let refs: Vec<&Record> = records.iter().map(EvmRecord::as_record).collect();
        if let Err(e) = self.store.ledger.save(&refs, false).await {
            tracing::error!(lane = %self.lane.id, settlements = records.len(), error = %e, "could not store sent states");
        }
        for record in records {
            announce_sent(&self.out.waiters, &record);
            let nonce = record.state.nonce().expect("just signed");
            self.nonces.slots.insert(nonce, Slot::settlement(record));
        }
    }

    /// The signer cannot pay for gas: the settlement moves to another signer's lane when one
    /// takes it (this nonce is then a gap: the next settlement or a self-transfer fills it);
    /// else it waits here at its nonce, as signed. Answers it when it stays.
    fn move_unfunded(&self, mut record: EvmRecord, nonce: u64) -> Option<EvmRecord> {
        self.lane.funded.store(false, Ordering::Relaxed);
        if let Some(other) = self
            .out
            .lanes
            .pick(self.lane.network(), Some(&self.lane.id))
        {
            tracing::warn!(lane = %self.lane.id, to = %other.id, nonce, "signer cannot pay for gas; settlement moves to another signer");
            match self.lane.pass(other, record) {
                None => return None,
                Some(kept) => record = kept, // the other lane's queue is full
            }
        }
        tracing::warn!(lane = %self.lane.id, nonce, "signer cannot pay for gas and no other signer can; the settlement waits");
        Some(record)
    }

    /// A settlement only this signer may send (`EvmPart::sender`, an `upto` witness's
    /// facilitator), which cannot pay for gas: another signer's transaction would revert at the
    /// operator's expense, so it fails now, with nothing sent (access.md §2), and its nonce here
    /// is a gap the next settlement or a self-transfer fills once the signer is funded.
    async fn sender_unfunded(&mut self, mut record: EvmRecord, nonce: u64) {
        self.lane.funded.store(false, Ordering::Relaxed);
        tracing::warn!(lane = %self.lane.id, payment = %record.key(), nonce, "the signer an upto payment names cannot pay for gas; it fails unsent, no other signer may send it");
        let answered_now = record.expire(Lost::SenderUnfunded, unix_now());
        self.finished(record, answered_now).await;
    }

    /// A settlement the node refused for a reason that sending it again will not change (not
    /// its nonce, not its price) must not hold the lane (access.md §3): it is answered as
    /// failed, and a self-transfer takes its nonce. Answers the self-transfer to broadcast.
    async fn refused(
        &mut self,
        mut record: EvmRecord,
        nonce: u64,
        market: TxFees,
        block: u64,
    ) -> Bytes {
        tracing::warn!(lane = %self.lane.id, payment = %record.key(), nonce, "node refused the settlement transaction; answered as failed, and its nonce goes to a self-transfer");
        let answered_now = record.expire(Lost::Refused, unix_now());
        let filler = self.filler(nonce, market, block);
        let raw = filler.raw.clone();
        self.nonces.slots.insert(nonce, Slot::filler(filler));
        self.finished(record, answered_now).await;
        raw
    }

    /// Nonces between the chain's and the next one that nothing occupies: given first to new
    /// settlements, so a nonce given up is filled by real work before a self-transfer.
    fn gaps(&self) -> VecDeque<u64> {
        let Some(floor) = self.seen.chain_nonce else {
            return Default::default();
        };
        self.nonces.free(floor).collect()
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
        match self.lane.chain.client.batch(Traffic::Own, &calls).await {
            Ok(answers) => answers
                .iter()
                .map(|a| match a {
                    Ok(_) => None,
                    Err(e) => match e.refusal() {
                        Refusal::AlreadyKnown => None,
                        Refusal::Unclear => {
                            tracing::warn!(lane = %self.lane.id, error = %e, "broadcast answered with an unclear error; followed as sent");
                            Some(Refusal::Unclear)
                        }
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

    pub(super) async fn abandon(&mut self, record: EvmRecord, why: String) {
        let key = record.key();
        if record.latest().is_none() {
            if let Err(e) = self.store.ledger.release(&key).await {
                tracing::error!(payment = %key, error = %e, "could not release a claim");
            }
        }
        self.lane.answered();
        self.out.waiters.finish(&key, Progress::Abandoned(why));
    }
}

pub(super) async fn transaction_count(lane: &Lane, block: &str) -> Option<u64> {
    let answer = lane
        .chain
        .client
        .call(
            Traffic::Own,
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

/// Tells a settlement's waiters it was sent as its latest attempt: its span learns the signer
/// and nonce here, the transaction from the waiters.
pub(super) fn announce_sent(waiters: &Waiters, record: &EvmRecord) {
    let attempt = record.latest().expect("signed");
    let key = record.key();
    let span = waiters.span(&key);
    if !span.is_disabled() {
        span.record("signer", evm::hex_bytes(attempt.signer));
        span.record("nonce", attempt.nonce);
    }
    waiters.sent(&key, attempt.hash);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_batch_the_store_did_not_take_goes_to_the_new_holder_waits_or_is_abandoned() {
        let lost = StoreError::LeaseLost("base/0x01".to_string());
        let unreachable = [
            StoreError::unavailable("PostgreSQL: connection refused"),
            StoreError::unavailable("cannot make writes durable: fsync failed"),
        ];
        let broken = [
            StoreError::Corrupt {
                key: "k".to_string(),
                detail: "bad json".to_string(),
            },
            StoreError::Schema("store: the database schema is at version 3".to_string()),
        ];
        for shared in [true, false] {
            // The lease moved: whatever the store, the new holder signs them.
            assert_eq!(after_commit_failure(&lost, shared), CommitFailure::HandOver);
            for e in &broken {
                assert_eq!(after_commit_failure(e, shared), CommitFailure::Abandon);
            }
        }
        for e in &unreachable {
            // Only a shared database is waited for; the claims are signed again.
            assert_eq!(after_commit_failure(e, true), CommitFailure::SignAgain);
            assert_eq!(after_commit_failure(e, false), CommitFailure::Abandon);
        }
    }

    #[test]
    fn only_an_unpayable_or_a_clear_refusal_changes_a_settlements_course() {
        assert_eq!(
            route(Some(Refusal::InsufficientFunds)),
            Route::AnotherSigner
        );
        assert_eq!(route(Some(Refusal::Rejected)), Route::Refused);
        for followed in [
            None,
            Some(Refusal::Unclear),
            Some(Refusal::AlreadyKnown),
            Some(Refusal::NonceTooLow),
            Some(Refusal::Underpriced),
            Some(Refusal::Busy),
        ] {
            assert_eq!(route(followed), Route::Sent);
        }
    }
}
