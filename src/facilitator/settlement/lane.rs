//! One worker per (network, signer): the only place that gives out, signs with, and follows that
//! signer's nonces. Invariants:
//! - a nonce never goes backwards and is never given back once signed: a nonce a settlement
//!   gives up (it moved to another signer, or expired) is filled by the next settlement or by a
//!   0-value self-transfer;
//! - every signed transaction is stored (with the lane's next nonce) and flushed before it is
//!   broadcast, and a batch of settlements signed together shares one flush;
//! - at every new head the worker reads the chain's nonce for the signer, fetches receipts only
//!   for the nonces the chain says were used, follows inclusions until `finality_depth`,
//!   re-sends what a reorganisation or a forgetful node removed, bumps only the transaction that
//!   blocks the lane, and fills gaps, so the lane never stays wedged for long.
//!
//! The worker owns its state alone (no lock): callers reach it through a channel.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use ethers_core::types::{Address, Bytes, H256, U256};
use serde_json::{json, Value};
use tokio::sync::mpsc;

use super::ledger::Ledger;
use super::state::{Attempt, Inclusion, LaneId, Lost, Outcome, Record, State};
use super::waiters::{Progress, Waiters};
use crate::chain::{self, Call, CallResult, Canonical, Chain, Head, Refusal, TxFees};
use crate::clock::unix_now;
use crate::facilitator::erc3009;
use crate::facilitator::types::Reason;
use crate::signer::{Signer, UnsignedTx};

/// Gas of a 0-value self-transfer that fills a nonce.
const FILLER_GAS: u64 = 21_000;
/// Gas a signer must afford at the current price to be chosen for a settlement.
pub const SETTLEMENT_GAS: u64 = 150_000;
/// Heads without the chain's nonce moving, with transactions waiting, before they are all sent
/// again (the node may have forgotten its pool).
const STALL_BEFORE_RESEND: u64 = 2;
/// Heads a nonce may look used by somebody else before the settlement moves to a new nonce: a
/// load-balanced endpoint may answer the nonce and the receipt from different nodes.
const MISSES_BEFORE_MOVE: u8 = 2;
/// Settlements signed together at most, sharing one flush and one broadcast batch.
const MAX_BATCH: usize = 256;
/// Settlements waiting for a lane's worker; senders wait when it is full.
const QUEUE: usize = 1024;

/// What the lane is allowed to pay, from the chain's settings.
#[derive(Debug, Clone)]
pub struct LaneSettings {
    pub confirmations: u64,
    pub finality_depth: u64,
    pub bump_after_blocks: u64,
    pub max_fee_per_gas: Option<U256>,
    pub max_settlement_cost: Option<U256>,
}

impl LaneSettings {
    /// The highest price per gas for a transaction of `gas` gas.
    fn cap(&self, gas: u64) -> Option<U256> {
        let by_cost = self.max_settlement_cost.map(|c| c / U256::from(gas.max(1)));
        match (self.max_fee_per_gas, by_cost) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }
}

/// The handle callers hold; the worker behind it owns the nonces.
pub struct Lane {
    pub id: LaneId,
    chain: Arc<Chain>,
    signer: Arc<Signer>,
    settings: LaneSettings,
    queue: mpsc::Sender<Record>,
    under_way: AtomicUsize,
    funded: AtomicBool,
}

impl Lane {
    pub fn new(
        chain: Arc<Chain>,
        signer: Arc<Signer>,
        settings: LaneSettings,
    ) -> (Arc<Self>, mpsc::Receiver<Record>) {
        let (queue, receiver) = mpsc::channel(QUEUE);
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

    /// Whether the signer could pay for a settlement at the last head.
    pub fn funded(&self) -> bool {
        self.funded.load(Ordering::Relaxed)
    }

    pub fn chain(&self) -> &Arc<Chain> {
        &self.chain
    }

    /// Counts a settlement on this lane from the moment it is chosen, so a burst spreads over
    /// every key; the count drops when the settlement is answered or the reservation dropped.
    pub fn reserve(self: &Arc<Self>) -> Reservation {
        self.under_way.fetch_add(1, Ordering::Relaxed);
        Reservation {
            lane: Some(self.clone()),
        }
    }

    fn answered(&self) {
        let _ = self
            .under_way
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1));
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

    /// Hands a claimed record to the worker; the worker now answers for the count.
    pub async fn submit(mut self, record: Record) {
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
    lost: AtomicU64,
}

impl Lanes {
    pub fn new(lanes: Vec<Arc<Lane>>) -> Self {
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

    /// The funded lane with the fewest settlements under way (any lane when none is funded).
    pub fn pick(&self, network: &str, except: Option<&LaneId>) -> Option<&Arc<Lane>> {
        let candidates = self
            .by_network
            .get(network)?
            .iter()
            .filter(|l| Some(&l.id) != except);
        candidates
            .min_by_key(|l| (!l.funded(), l.under_way()))
            .filter(|l| except.is_none() || l.funded())
    }

    /// Settlements answered with success whose transaction can no longer land.
    pub fn lost(&self) -> u64 {
        self.lost.load(Ordering::Relaxed)
    }
}

/// What occupies one nonce of the lane.
enum Slot {
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
    fn attempts(&self) -> Vec<&Attempt> {
        match self {
            Slot::Settlement { record, .. } => record.live_attempts().collect(),
            Slot::Filler { attempts } => attempts.iter().collect(),
        }
    }

    fn latest(&self) -> Option<&Attempt> {
        self.attempts().last().copied()
    }

    fn is_included(&self) -> bool {
        matches!(self, Slot::Settlement { record, .. } if matches!(record.state, State::Included { .. }))
    }
}

pub struct Worker {
    lane: Arc<Lane>,
    lanes: Arc<Lanes>,
    ledger: Ledger,
    waiters: Arc<Waiters>,
    next_nonce: u64,
    slots: BTreeMap<u64, Slot>,
    /// Records waiting for a nonce: new claims, and settlements whose nonce was taken.
    to_sign: Vec<Record>,
    last_chain_nonce: Option<u64>,
    stalled: u64,
    /// Nonces below `next_nonce` with nothing in them, seen at the previous head.
    gaps_seen: Vec<u64>,
}

impl Worker {
    /// Loads the lane's nonce and the settlements it had under way, and sends them all again
    /// before returning: the daemon serves only after this.
    pub async fn start(
        lane: Arc<Lane>,
        lanes: Arc<Lanes>,
        ledger: Ledger,
        waiters: Arc<Waiters>,
        resumed: Vec<Record>,
    ) -> Result<Self, crate::store::StoreError> {
        let stored = ledger.lane_nonce(&lane.id)?.unwrap_or(0);
        let chain_pending = transaction_count(&lane, "pending").await.unwrap_or(0);
        let mut worker = Self {
            lane,
            lanes,
            ledger,
            waiters,
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
        loop {
            tokio::select! {
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
    async fn sign_waiting(&mut self) {
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
            .commit_signed(&self.lane.id, self.next_nonce, &refs)
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
    fn gaps(&self) -> std::collections::VecDeque<u64> {
        let Some(floor) = self.last_chain_nonce else {
            return Default::default();
        };
        (floor..self.next_nonce)
            .filter(|n| !self.slots.contains_key(n))
            .collect()
    }

    fn take_nonce(&mut self, gaps: &mut std::collections::VecDeque<u64>) -> u64 {
        gaps.pop_front().unwrap_or_else(|| {
            self.next_nonce += 1;
            self.next_nonce - 1
        })
    }

    fn sign(
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
    async fn broadcast(&self, raws: &[Bytes]) -> Vec<Option<Refusal>> {
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

    async fn abandon(&mut self, record: Record, why: String) {
        let key = record.key();
        if record.attempts.is_empty() {
            if let Err(e) = self.ledger.release(&key).await {
                tracing::error!(payment = %key, error = %e, "could not release a claim");
            }
        }
        self.lane.answered();
        self.waiters.finish(&key, Progress::Abandoned(why));
    }

    // ---- following the chain -------------------------------------------------------------

    async fn on_head(&mut self, head: &Head) {
        let Some((chain_nonce, balance)) = self.read_lane(head).await else {
            return;
        };
        let market = head.fees.for_transaction();
        let needed = market
            .max_fee_per_gas()
            .saturating_mul(SETTLEMENT_GAS.into());
        self.lane.funded.store(balance >= needed, Ordering::Relaxed);
        if chain_nonce > self.next_nonce {
            // Transactions sent with this key outside routerd: never hand those nonces out.
            tracing::warn!(lane = %self.lane.id, chain_nonce, next = self.next_nonce, "signer nonce used outside routerd");
            self.next_nonce = chain_nonce;
            if let Err(e) = self.ledger.set_lane_nonce(&self.lane.id, chain_nonce).await {
                tracing::error!(lane = %self.lane.id, error = %e, "could not store the lane nonce");
            }
        }
        let mut resend = self.check_reorgs(head);
        self.find_inclusions(head, chain_nonce).await;
        self.confirm(head).await;
        resend.extend(self.expire(head, chain_nonce, market).await);
        resend.extend(self.unstick(head, chain_nonce, market).await);
        self.fill_gaps(head, chain_nonce, market).await;
        self.broadcast(&resend).await;
        self.last_chain_nonce = Some(chain_nonce);
        self.sign_waiting().await;
    }

    /// The chain's nonce for the signer (transactions mined) and its balance, in one batch.
    async fn read_lane(&self, head: &Head) -> Option<(u64, U256)> {
        let address = json!(format!("{:?}", self.lane.signer.address));
        let block = json!(format!("{:#x}", head.number));
        let calls = [
            Call::new(
                "eth_getTransactionCount",
                vec![address.clone(), block.clone()],
            ),
            Call::new("eth_getBalance", vec![address, block]),
        ];
        let answers = self.lane.chain.client.batch(&calls).await.ok()?;
        let nonce = answers[0].as_ref().ok().and_then(chain::parse_u64)?;
        let balance = answers[1].as_ref().ok().and_then(chain::parse_quantity)?;
        Some((nonce, balance))
    }

    /// Inclusions whose block left the canonical chain go back to `Sent`; answers their raw
    /// transactions to send again (same nonce, same hash).
    fn check_reorgs(&mut self, head: &Head) -> Vec<Bytes> {
        let mut resend = Vec::new();
        for slot in self.slots.values_mut() {
            let Slot::Settlement { record, .. } = slot else {
                continue;
            };
            let State::Included { inclusion, .. } = record.state else {
                continue;
            };
            if self
                .lane
                .chain
                .head
                .canonical(inclusion.block, inclusion.block_hash)
                != Canonical::No
            {
                continue;
            }
            tracing::warn!(payment = %record.key(), block = inclusion.block, head = head.number, "settlement's block left the canonical chain; sending it again");
            record.reorged();
            if let Some(attempt) = record
                .attempts
                .iter()
                .find(|a| a.hash == inclusion.transaction)
            {
                resend.push(attempt.raw.clone());
            }
        }
        resend
    }

    /// Receipts for the nonces the chain says were used and that are not known as included.
    async fn find_inclusions(&mut self, head: &Head, chain_nonce: u64) {
        let asked: Vec<(u64, H256)> = self
            .slots
            .range(..chain_nonce)
            .filter(|(_, slot)| !slot.is_included())
            .flat_map(|(nonce, slot)| slot.attempts().into_iter().map(|a| (*nonce, a.hash)))
            .collect();
        if asked.is_empty() {
            return;
        }
        let calls: Vec<Call> = asked
            .iter()
            .map(|(_, hash)| {
                Call::new(
                    "eth_getTransactionReceipt",
                    vec![json!(format!("{hash:?}"))],
                )
            })
            .collect();
        let Ok(answers) = self.lane.chain.client.batch(&calls).await else {
            return;
        };
        let mut found: BTreeMap<u64, Inclusion> = BTreeMap::new();
        for ((nonce, hash), answer) in asked.iter().zip(&answers) {
            if let Some(inclusion) = inclusion_of(*hash, answer, head.number) {
                found.insert(*nonce, inclusion);
            }
        }
        let nonces: Vec<u64> = self.slots.range(..chain_nonce).map(|(n, _)| *n).collect();
        let mut moved = Vec::new();
        for nonce in nonces {
            let inclusion = found.get(&nonce).copied();
            match self.slots.get_mut(&nonce) {
                Some(Slot::Filler { .. }) => {
                    // Mined, or the nonce went to something else: either way it is used.
                    self.slots.remove(&nonce);
                }
                Some(Slot::Settlement { record, misses })
                    if !matches!(record.state, State::Included { .. }) =>
                {
                    match inclusion {
                        Some(inclusion) => {
                            record.included(inclusion);
                            *misses = 0;
                            if let Err(e) = self.ledger.save(record, false).await {
                                tracing::error!(payment = %record.key(), error = %e, "could not store an inclusion");
                            }
                        }
                        None => {
                            *misses += 1;
                            if *misses >= MISSES_BEFORE_MOVE {
                                moved.push(nonce);
                            }
                        }
                    }
                }
                _ => {}
            }
        }
        for nonce in moved {
            if let Some(Slot::Settlement { record, .. }) = self.slots.remove(&nonce) {
                self.nonce_taken(*record).await;
            }
        }
    }

    /// Our nonce was used by a transaction that is not ours. If the authorization is still
    /// unused the settlement is signed again at a new nonce; otherwise somebody else settled it.
    async fn nonce_taken(&mut self, mut record: Record) {
        let key = record.key();
        let call = chain::eth_call(
            record.token,
            &erc3009::authorization_state(record.payer, record.nonce),
            "latest",
        );
        let used = match self.lane.chain.client.batch(&[call]).await {
            Ok(answers) => answers[0].as_ref().ok().and_then(chain::parse_word),
            Err(_) => None,
        };
        match used {
            Some(word) if word.is_zero() => {
                tracing::warn!(payment = %key, nonce = ?record.state.nonce(), "signer nonce used by another transaction; signing the settlement again at a new nonce");
                self.to_sign.push(record);
            }
            Some(_) => {
                tracing::error!(payment = %key, "authorization used by a transaction that is not routerd's");
                record.expire(Lost::AuthorizationUsedElsewhere, unix_now());
                self.finished(record).await;
            }
            None => {
                // Cannot tell now: look again at the next head.
                let nonce = record.state.nonce().expect("followed");
                self.slots.insert(
                    nonce,
                    Slot::Settlement {
                        record: Box::new(record),
                        misses: 0,
                    },
                );
            }
        }
    }

    /// Answers inclusions that are `confirmations` deep; stops following those past
    /// `finality_depth`.
    async fn confirm(&mut self, head: &Head) {
        let settings = self.lane.settings.clone();
        let mut done = Vec::new();
        let nonces: Vec<u64> = self.slots.keys().copied().collect();
        for nonce in nonces {
            let Some(Slot::Settlement { record, .. }) = self.slots.get_mut(&nonce) else {
                continue;
            };
            let State::Included { inclusion, .. } = record.state else {
                continue;
            };
            let revert = if inclusion.succeeded || record.outcome.is_some() {
                None
            } else {
                Some(diagnose_revert(&self.lane.chain, record, inclusion.transaction).await)
            };
            if record.confirm(head.number, settings.confirmations, || {
                revert.expect("diagnosed above")
            }) {
                if let Err(e) = self.ledger.save(record, true).await {
                    tracing::error!(payment = %record.key(), error = %e, "could not store a settlement outcome");
                    continue;
                }
                let outcome = record.outcome.clone().expect("just confirmed");
                tracing::info!(payment = %record.key(), success = outcome.success, transaction = ?outcome.transaction, "settlement answered");
                self.lane.answered();
                self.waiters.finish(&record.key(), Progress::Done(outcome));
            }
            if record.finalize(head.number, settings.finality_depth, unix_now()) {
                done.push(nonce);
            }
        }
        for nonce in done {
            if let Some(Slot::Settlement { record, .. }) = self.slots.remove(&nonce) {
                if let Err(e) = self.ledger.save(&record, false).await {
                    tracing::error!(payment = %record.key(), error = %e, "could not store a final state");
                }
            }
        }
    }

    /// Settlements not mined by the time the chain passed their `validBefore` can never land:
    /// record that, and put a self-transfer in their nonce so the transaction that would revert
    /// is replaced.
    async fn expire(&mut self, head: &Head, chain_nonce: u64, market: TxFees) -> Vec<Bytes> {
        let expired: Vec<u64> = self
            .slots
            .range(chain_nonce..)
            .filter(|(_, slot)| match slot {
                Slot::Settlement { record, .. } => {
                    !slot.is_included() && head.timestamp >= record.valid_before
                }
                Slot::Filler { .. } => false,
            })
            .map(|(n, _)| *n)
            .collect();
        let mut resend = Vec::new();
        for nonce in expired {
            let Some(Slot::Settlement { mut record, .. }) = self.slots.remove(&nonce) else {
                continue;
            };
            tracing::warn!(payment = %record.key(), nonce, "authorization expired before the settlement was mined");
            let previous = record.latest().map(|a| a.fees).unwrap_or(market);
            record.expire(Lost::ValidBeforePassed, unix_now());
            let filler = self.filler(nonce, previous.replacement(market), head.number);
            resend.push(filler.raw.clone());
            self.slots.insert(
                nonce,
                Slot::Filler {
                    attempts: vec![filler],
                },
            );
            self.finished(*record).await;
        }
        resend
    }

    /// When the chain's nonce stops moving while transactions wait: send them all again (the
    /// node may have dropped its pool), and after `bump_after_blocks` replace the one that
    /// blocks the lane with higher fees, within the caps.
    async fn unstick(&mut self, head: &Head, chain_nonce: u64, market: TxFees) -> Vec<Bytes> {
        let waiting = self
            .slots
            .range(chain_nonce..)
            .any(|(_, s)| !s.is_included());
        if !waiting || self.last_chain_nonce != Some(chain_nonce) {
            self.stalled = 0;
            return Vec::new();
        }
        self.stalled += 1;
        let mut resend = Vec::new();
        if self.stalled.is_multiple_of(STALL_BEFORE_RESEND) {
            resend.extend(
                self.slots
                    .range(chain_nonce..)
                    .filter(|(_, s)| !s.is_included())
                    .filter_map(|(_, s)| s.latest().map(|a| a.raw.clone())),
            );
        }
        if self.stalled >= self.lane.settings.bump_after_blocks {
            if let Some(raw) = self.bump(chain_nonce, head, market).await {
                resend.push(raw);
            }
        }
        resend
    }

    /// Replaces the transaction at `nonce` with higher fees if the caps allow it.
    async fn bump(&mut self, nonce: u64, head: &Head, market: TxFees) -> Option<Bytes> {
        let (latest, gas) = {
            let slot = self.slots.get(&nonce)?;
            let latest = slot.latest()?.clone();
            let gas = match slot {
                Slot::Settlement { record, .. } => record.gas_limit,
                Slot::Filler { .. } => FILLER_GAS,
            };
            (latest, gas)
        };
        if head.number < latest.sent_at_block + self.lane.settings.bump_after_blocks {
            return None;
        }
        let fees = latest
            .fees
            .replacement(market)
            .capped(self.lane.settings.cap(gas));
        if !fees.replaces(&latest.fees) {
            tracing::warn!(lane = %self.lane.id, nonce, max_fee = %latest.fees.max_fee_per_gas(), "transaction cannot be mined under the configured fee caps; not bumped");
            return None;
        }
        tracing::info!(lane = %self.lane.id, nonce, max_fee = %fees.max_fee_per_gas(), "replacing the transaction that blocks the lane with higher fees");
        let call = match self.slots.get(&nonce)? {
            Slot::Settlement { record, .. } => Some((record.token, record.calldata.clone())),
            Slot::Filler { .. } => None,
        };
        let attempt = match &call {
            Some((token, calldata)) => self.sign(nonce, *token, calldata, gas, fees, head.number),
            None => self.filler(nonce, fees, head.number),
        };
        match self.slots.get_mut(&nonce)? {
            Slot::Settlement { record, .. } => {
                let raw = attempt.raw.clone();
                record.signed(attempt);
                record.sent();
                let record = record.clone();
                if let Err(e) = self.ledger.save(&record, true).await {
                    tracing::error!(payment = %record.key(), error = %e, "could not store a replacement");
                    return None;
                }
                self.waiters
                    .sent(&record.key(), record.latest().expect("signed").hash);
                Some(raw)
            }
            Slot::Filler { attempts } => {
                let raw = attempt.raw.clone();
                attempts.push(attempt);
                Some(raw)
            }
        }
    }

    /// Nonces below `next_nonce` that nothing occupies, seen empty at two heads in a row (a
    /// settlement arriving meanwhile takes them first), get a self-transfer.
    async fn fill_gaps(&mut self, head: &Head, chain_nonce: u64, market: TxFees) {
        let gaps: Vec<u64> = (chain_nonce..self.next_nonce)
            .filter(|n| !self.slots.contains_key(n))
            .collect();
        let due: Vec<u64> = gaps
            .iter()
            .copied()
            .filter(|n| self.gaps_seen.contains(n))
            .collect();
        self.gaps_seen = gaps;
        if due.is_empty() || !self.lane.funded() {
            return;
        }
        let fees = market.capped(self.lane.settings.cap(FILLER_GAS));
        let mut raws = Vec::new();
        for nonce in due {
            tracing::info!(lane = %self.lane.id, nonce, "filling an unused signer nonce with a self-transfer");
            let attempt = self.filler(nonce, fees, head.number);
            raws.push(attempt.raw.clone());
            self.slots.insert(
                nonce,
                Slot::Filler {
                    attempts: vec![attempt],
                },
            );
        }
        self.broadcast(&raws).await;
    }

    fn filler(&self, nonce: u64, fees: TxFees, block: u64) -> Attempt {
        let fees = fees.capped(self.lane.settings.cap(FILLER_GAS));
        self.sign(
            nonce,
            self.lane.signer.address,
            &Bytes::default(),
            FILLER_GAS,
            fees,
            block,
        )
    }

    /// Stores a terminal state reached without inclusion and tells the waiters.
    async fn finished(&mut self, record: Record) {
        let key = record.key();
        if let Err(e) = self.ledger.save(&record, true).await {
            tracing::error!(payment = %key, error = %e, "could not store a settlement's end");
        }
        if record.lost {
            self.lanes.lost.fetch_add(1, Ordering::Relaxed);
            tracing::error!(payment = %key, "settlement answered as successful can no longer land: the payment is lost");
        } else if let Some(outcome) = record.outcome.clone() {
            self.lane.answered();
            self.waiters.finish(&key, Progress::Done(outcome));
        }
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

/// A receipt in a block at or below `head` (a node ahead of our head is asked again later).
fn inclusion_of(hash: H256, answer: &CallResult, head: u64) -> Option<Inclusion> {
    let receipt: &Value = answer.as_ref().ok()?;
    let block = receipt.get("blockNumber").and_then(chain::parse_u64)?;
    let block_hash = receipt.get("blockHash").and_then(chain::head::parse_hash)?;
    (block <= head).then_some(Inclusion {
        block,
        block_hash,
        transaction: hash,
        succeeded: receipt.get("status").and_then(chain::parse_u64) == Some(1),
    })
}

/// A mined settlement that reverted: find out why, for the payer.
async fn diagnose_revert(chain: &Chain, record: &Record, hash: H256) -> Outcome {
    let calls = [
        chain::eth_call(
            record.token,
            &erc3009::authorization_state(record.payer, record.nonce),
            "latest",
        ),
        chain::eth_call(record.token, &erc3009::balance_of(record.payer), "latest"),
    ];
    let answers = chain.client.batch(&calls).await.unwrap_or_default();
    let word = |i: usize| {
        answers
            .get(i)
            .and_then(|a| a.as_ref().ok())
            .and_then(chain::parse_word)
    };
    let (reason, message) = if word(0).is_some_and(|w| !w.is_zero()) {
        (
            Reason::Payload,
            "authorization nonce was used before the settlement was mined",
        )
    } else if word(1).is_some_and(|b| b < record.value) {
        (
            Reason::InsufficientFunds,
            "payer balance fell before the settlement was mined",
        )
    } else {
        (Reason::Payload, "settlement transaction reverted")
    };
    Outcome {
        success: false,
        reason: Some(reason),
        message: Some(message.to_string()),
        transaction: Some(hash),
    }
}
