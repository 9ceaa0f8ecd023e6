//! What a lane's worker does at each new head: read the chain's nonce for the signer, find where
//! the nonces the chain says were used landed (`inclusions`), follow inclusions until
//! `finality_depth`, send again what a reorganisation or a forgetful node removed, replace only
//! the transaction that blocks the lane, expire what can no longer land, and fill gaps, so the
//! lane never stays wedged for long.

use std::sync::atomic::Ordering;
use std::time::Instant;

use ethers_core::types::{Bytes, H256, U256};
use serde_json::json;

mod stall;

use super::front_run::{front_runner, Lookup};
use super::inclusions::{self, Asked, Found};
use super::lane::{Lane, SETTLEMENT_GAS};
use super::ledger_nonce::record_nonce_read;
use super::worker::{Slot, Worker, FILLER_GAS};
use crate::chain::Traffic;
use crate::chain::{self, Batch, Call, Canonical, Chain, Head};
use crate::clock::unix_now;
use crate::evm;
use crate::evm::erc3009;
use crate::evm::{NonceRead, TxFees};
use crate::ledger::{depth, Attempt, EvmRecord, Inclusion, Lost, Outcome, Record, State};
use crate::ledger::{Payer, Reason};
use crate::store::StoreError;

/// Heads without the chain's nonce moving, with transactions waiting, before they are all sent
/// again (the node may have forgotten its pool).
const STALL_BEFORE_RESEND: u64 = 2;
/// Heads a nonce may look used by somebody else before the settlement moves to a new nonce: a
/// load-balanced endpoint may answer the nonce and the receipt from different nodes.
const MISSES_BEFORE_MOVE: u8 = 2;

/// What the follower keeps from one head to the next; a lane taken over starts without it.
#[derive(Default)]
pub(super) struct Seen {
    /// The chain's nonce for the signer at the previous head.
    pub(super) chain_nonce: Option<u64>,
    /// Heads in a row at which the chain's nonce did not move while transactions waited.
    pub(super) stalled: u64,
    /// Nonces below the next one with nothing in them, seen at the previous head.
    pub(super) gaps: Vec<u64>,
    /// The number of the previous head followed: logs are read from the block after it.
    pub(super) head: Option<u64>,
}

impl Worker {
    pub(super) async fn on_head(&mut self, head: &Head) {
        let started = Instant::now();
        let waited = started.saturating_duration_since(head.fetched_at);
        if self.current_lease().await.is_none() {
            return; // standby: the holder follows this lane
        }
        let leased = started.elapsed();
        let Some((chain_nonce, balance)) = self.read_lane(head).await else {
            return;
        };
        let read = started.elapsed();
        let market = head.fees.for_transaction();
        let needed = market
            .max_fee_per_gas()
            .saturating_mul(SETTLEMENT_GAS.into());
        self.lane.funded.store(balance >= needed, Ordering::Relaxed);
        if chain_nonce > self.nonces.next {
            // Transactions sent with this key outside routerd: never hand those nonces out.
            tracing::warn!(lane = %self.lane.id, chain_nonce, next = self.nonces.next, "signer nonce used outside routerd");
            self.nonces.next = chain_nonce;
            if let Some(lease) = &self.store.lease {
                if let Err(e) = self.store.ledger.set_lane_nonce(lease, chain_nonce).await {
                    tracing::error!(lane = %self.lane.id, error = %e, "could not store the lane nonce");
                }
            }
        }
        let mut resend = self.check_reorgs(head, chain_nonce);
        let included = self.find_inclusions(head, chain_nonce).await;
        let found = started.elapsed();
        self.confirm(head, &included).await;
        // Where the time from a head to its answers goes: how long the head waited for the
        // worker, then each step's end since the worker took it.
        tracing::debug!(
            lane = %self.lane.id,
            head = head.number,
            included = included.len(),
            waited_us = waited.as_micros() as u64,
            lease_us = leased.as_micros() as u64,
            lane_read_us = read.as_micros() as u64,
            inclusions_us = found.as_micros() as u64,
            answered_us = started.elapsed().as_micros() as u64,
            "head followed"
        );
        resend.extend(self.expire(head, chain_nonce, market).await);
        resend.extend(self.unstick(head, chain_nonce, market).await);
        self.fill_gaps(head, chain_nonce, market).await;
        self.broadcast(&resend).await;
        self.seen.chain_nonce = Some(chain_nonce);
        self.seen.head = Some(head.number);
        self.sign_waiting().await;
    }

    /// The chain's nonce for the signer (transactions mined) and its balance, in one batch.
    async fn read_lane(&self, head: &Head) -> Option<(u64, U256)> {
        let address = json!(evm::hex_bytes(self.lane.signer.address));
        let block = json!(format!("{:#x}", head.number));
        let mut batch = Batch::new();
        let nonce = batch.add(Call::new(
            "eth_getTransactionCount",
            vec![address.clone(), block.clone()],
        ));
        let balance = batch.add(Call::new("eth_getBalance", vec![address, block]));
        let answers = self
            .lane
            .chain
            .client
            .ask(Traffic::Own, &batch)
            .await
            .ok()?;
        let nonce = answers.get(nonce).as_ref().ok().and_then(evm::parse_u64)?;
        let balance = answers
            .get(balance)
            .as_ref()
            .ok()
            .and_then(evm::parse_quantity)?;
        Some((nonce, balance))
    }

    /// Inclusions whose block left the canonical chain go back to `Sent`; answers their raw
    /// transactions to send again (same nonce, same hash). The watcher knows the blocks it saw;
    /// for an older one (one mined before a restart) the chain's nonce at this head speaks: an
    /// inclusion at or below the head whose nonce the chain has not used is not on the chain.
    fn check_reorgs(&mut self, head: &Head, chain_nonce: u64) -> Vec<Bytes> {
        let mut resend = Vec::new();
        for (nonce, slot) in self.nonces.slots.iter_mut() {
            let Slot::Settlement { record, .. } = slot else {
                continue;
            };
            let State::Included { inclusion, .. } = record.state else {
                continue;
            };
            let gone = match self
                .lane
                .chain
                .head
                .canonical(inclusion.block, inclusion.block_hash)
            {
                Canonical::No => true,
                Canonical::Yes => false,
                Canonical::Unknown => *nonce >= chain_nonce && inclusion.block <= head.number,
            };
            if !gone {
                continue;
            }
            tracing::warn!(payment = %record.key(), block = inclusion.block, head = head.number, "settlement's block left the canonical chain; sending it again");
            record.reorged();
            let attempts = &record.part().attempts;
            if let Some(attempt) = attempts.iter().find(|a| a.hash == inclusion.transaction) {
                resend.push(attempt.raw.clone());
            }
        }
        resend
    }

    /// Inclusions of the nonces the chain says were used and that are not known as included
    /// (`inclusions::look_up`). Answers the nonces of the settlements included now, in order;
    /// `confirm` stores them.
    async fn find_inclusions(&mut self, head: &Head, chain_nonce: u64) -> Vec<u64> {
        // A filler's nonce is used up whatever landed in it: nothing to look for.
        let asked: Vec<Asked> = self
            .nonces
            .slots
            .range(..chain_nonce)
            .filter_map(|(nonce, slot)| match slot {
                Slot::Settlement { record, .. } if !slot.is_included() => Some((*nonce, record)),
                _ => None,
            })
            .flat_map(|(nonce, record)| {
                let evm = record.part();
                evm.live_attempts(&record.state).map(move |a| Asked {
                    nonce,
                    hash: a.hash,
                    token: evm.token,
                    payer: evm.payer,
                })
            })
            .collect();
        let since = self.seen.head.map_or(head.number, |h| h + 1);
        let Found {
            included: found,
            unknown,
        } = inclusions::look_up(&self.lane.chain, head, since, &asked).await;
        let nonces: Vec<u64> = self
            .nonces
            .slots
            .range(..chain_nonce)
            .map(|(n, _)| *n)
            .collect();
        let mut moved = Vec::new();
        let mut included = Vec::new();
        for nonce in nonces {
            let inclusion = found.get(&nonce).copied();
            match self.nonces.slots.get_mut(&nonce) {
                Some(Slot::Filler { .. }) => {
                    // Mined, or the nonce went to something else: either way it is used.
                    self.nonces.slots.remove(&nonce);
                }
                Some(Slot::Settlement { record, misses })
                    if !matches!(record.state, State::Included { .. }) =>
                {
                    match inclusion {
                        Some(inclusion) => {
                            record.included(inclusion);
                            *misses = 0;
                            included.push(nonce);
                        }
                        None if unknown.contains(&nonce) => {}
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
            if let Some(Slot::Settlement { record, .. }) = self.nonces.slots.remove(&nonce) {
                self.nonce_taken(*record, head).await;
            }
        }
        included
    }

    /// Our nonce was used by a transaction that is not ours. If the authorization is still
    /// unused the settlement is signed again at a new nonce; otherwise somebody else settled it.
    async fn nonce_taken(&mut self, record: EvmRecord, head: &Head) {
        let key = record.key();
        let mut batch = Batch::new();
        let (nonce_read, call) = nonce_call(&record);
        let state = batch.add(call);
        let used = match self.lane.chain.client.ask(Traffic::Own, &batch).await {
            Ok(answers) => answers.get(state).as_ref().ok().and_then(evm::parse_word),
            Err(_) => None,
        };
        match used.map(|word| nonce_read.used(word)) {
            Some(false) => {
                tracing::warn!(payment = %key, nonce = ?record.state.nonce(), "signer nonce used by another transaction; signing the settlement again at a new nonce");
                self.nonces.to_sign.push(record);
            }
            Some(true) => self.used_elsewhere_at_a_taken_nonce(record, head).await,
            None => {
                // Cannot tell now: look again at the next head.
                let nonce = record.state.nonce().expect("followed");
                self.nonces.slots.insert(nonce, Slot::settlement(record));
            }
        }
    }

    /// The authorization of a settlement whose signer nonce somebody else's transaction took
    /// was used too: by a front-run with the signed effect (settled by it), or otherwise (lost).
    async fn used_elsewhere_at_a_taken_nonce(&mut self, mut record: EvmRecord, head: &Head) {
        let confirmations = self.lane.settings.confirmations;
        let answered_now = match front_runner(&self.lane.chain, &record, head, confirmations).await
        {
            Lookup::FrontRun(by) => {
                tracing::warn!(payment = %record.key(), by = ?by.transaction, "authorization executed by another transaction first; answered by it");
                record.front_run(by, unix_now())
            }
            Lookup::NotYet => {
                let nonce = record.state.nonce().expect("followed");
                self.nonces.slots.insert(nonce, Slot::settlement(record));
                return; // looked at again at the next head
            }
            Lookup::None => {
                tracing::error!(payment = %record.key(), "authorization used by a transaction that is not routerd's");
                record.expire(Lost::AuthorizationUsedElsewhere, unix_now())
            }
        };
        self.finished(record, answered_now).await;
    }

    /// Answers inclusions that are `confirmations` deep; stops following those past
    /// `finality_depth`. Every record changed at this head (included, confirmed) is stored in one
    /// write and one flush before any caller is told: a full block confirms hundreds at once,
    /// and a write and an fsync each would hold the lane (and its signing) for seconds. With one
    /// confirmation a settlement is included and confirmed at the same head, and stored once.
    /// An inclusion not stored before a crash is found again from its receipt.
    ///
    /// `included` (sorted) are the nonces found included at this head.
    async fn confirm(&mut self, head: &Head, included: &[u64]) {
        let settings = self.lane.settings.clone();
        let mut changed = Vec::new();
        let mut answers = Vec::new();
        let mut front_runs = Vec::new();
        let nonces: Vec<u64> = self.nonces.slots.keys().copied().collect();
        for nonce in nonces {
            let Some(Slot::Settlement { record, .. }) = self.nonces.slots.get_mut(&nonce) else {
                continue;
            };
            let State::Included { inclusion, .. } = record.state else {
                continue;
            };
            let due = record.outcome.is_none()
                && depth(head.number, inclusion.block) >= settings.confirmations;
            let verdict = match inclusion.succeeded || !due {
                true => None,
                false => Some(judge_revert(&self.lane, record, inclusion, head).await),
            };
            let confirmed = match verdict {
                Some(Reverted::FrontRun(by)) => {
                    front_runs.push((nonce, by));
                    false
                }
                Some(Reverted::Wait) => false,
                Some(Reverted::Failed(outcome)) => {
                    record.confirm(head.number, settings.confirmations, || outcome)
                }
                None => record.confirm(head.number, settings.confirmations, || {
                    unreachable!("a revert is answered only once judged")
                }),
            };
            if confirmed {
                answers.push(nonce);
            }
            if confirmed || included.binary_search(&nonce).is_ok() {
                changed.push(nonce);
            }
        }
        self.settled_by_others(front_runs).await;
        if !self.store_and_answer(&changed, &answers).await {
            return; // finality waits for the next head too
        }
        let mut finals = Vec::new();
        for (nonce, slot) in self.nonces.slots.iter_mut() {
            if let Slot::Settlement { record, .. } = slot {
                if record.finalize(head.number, settings.finality_depth, unix_now()) {
                    finals.push(*nonce);
                }
            }
        }
        if let Err(e) = self.store(&finals).await {
            tracing::error!(error = %e, settlements = finals.len(), "could not store final states");
        }
        for nonce in finals {
            self.nonces.slots.remove(&nonce);
        }
    }

    /// Settlements whose own transaction reverted because another one executed their
    /// authorization first, with its signed effect: each is answered a success by that one and
    /// no longer followed (its signer nonce is used by our reverted transaction).
    async fn settled_by_others(&mut self, front_runs: Vec<(u64, Inclusion)>) {
        for (nonce, by) in front_runs {
            if let Some(Slot::Settlement { mut record, .. }) = self.nonces.slots.remove(&nonce) {
                tracing::warn!(payment = %record.key(), by = ?by.transaction, "settlement reverted: another transaction executed the authorization first; answered by it");
                let answered_now = record.front_run(by, unix_now());
                self.finished(*record, answered_now).await;
            }
        }
    }

    /// The settlement records of `nonces`, in one write (not flushed).
    async fn store(&self, nonces: &[u64]) -> Result<(), StoreError> {
        if nonces.is_empty() {
            return Ok(());
        }
        let records: Vec<&Record> = nonces
            .iter()
            .filter_map(|nonce| match self.nonces.slots.get(nonce) {
                Some(Slot::Settlement { record, .. }) => Some(record.as_record()),
                _ => None,
            })
            .collect();
        self.store.ledger.save(&records, false).await
    }

    /// Stores the records of `changed` and tells the callers of `answers` (some of them) their
    /// outcomes once the store holds them durably. When it cannot, nobody is told and those
    /// outcomes are dropped, to be confirmed again at the next head (a shared database may be
    /// back by then); answers whether the store took them.
    async fn store_and_answer(&mut self, changed: &[u64], answers: &[u64]) -> bool {
        let stored = match self.store(changed).await {
            Ok(()) if answers.is_empty() => return true,
            Ok(()) => self.store.ledger.flush().await,
            Err(e) => Err(e),
        };
        if let Err(e) = stored {
            tracing::error!(error = %e, settlements = changed.len(), "could not store the settlements this head changed");
            for nonce in answers {
                if let Some(Slot::Settlement { record, .. }) = self.nonces.slots.get_mut(nonce) {
                    record.outcome = None;
                }
            }
            return false;
        }
        for nonce in answers {
            let Some(Slot::Settlement { record, .. }) = self.nonces.slots.get(nonce) else {
                continue;
            };
            let key = record.key();
            let outcome = record.outcome.clone().expect("confirm sets the outcome");
            tracing::info!(payment = %key, success = outcome.success, transaction = ?outcome.transaction, "settlement answered");
            self.lane.answered();
            self.out
                .lanes
                .answer(&self.lane, &self.out.waiters, record, outcome);
        }
        // The callers just told go out before this lane goes on (signing what queued during
        // the head, the block's finality): on the runtime's one thread they would otherwise
        // wait for all of that, tens of milliseconds after a full block.
        if !answers.is_empty() {
            tokio::task::yield_now().await;
        }
        true
    }

    pub(super) fn filler(&self, nonce: u64, fees: TxFees, block: u64) -> Attempt {
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

    /// Stores a terminal state reached without inclusion; tells the waiters when its failure is
    /// their answer (`answered_now`), or reports a success already answered as lost.
    pub(super) async fn finished(&mut self, record: EvmRecord, answered_now: bool) {
        let key = record.key();
        if let Err(e) = self.store.ledger.save(&[&record], true).await {
            tracing::error!(payment = %key, error = %e, "could not store a settlement's end");
        }
        if record.lost {
            self.out.lanes.lost.fetch_add(1, Ordering::Relaxed);
            tracing::error!(payment = %key, "settlement answered as successful can no longer land: the payment is lost");
        }
        if let Some(outcome) = record.outcome.clone().filter(|_| answered_now) {
            self.lane.answered();
            self.out.waiters.done(&record, outcome);
        }
    }
}

/// The read of whether the record's authorization nonce is used now, and how to judge its answer.
fn nonce_call(record: &EvmRecord) -> (NonceRead, Call) {
    let read = record_nonce_read(record.part());
    let call = chain::eth_call(read.target, &read.call, "latest");
    (read, call)
}

/// How many heads past `confirmations` a revert waits for a node that cannot say whether it was
/// front-run, before it is answered as a revert.
const FRONT_RUN_PATIENCE: u64 = 3;

/// What a reverted inclusion of ours, `confirmations` deep, is answered.
enum Reverted {
    /// Another transaction executed the authorization first, with its signed effect.
    FrontRun(Inclusion),
    /// The node cannot say yet whether it was front-run.
    Wait,
    /// A failure, its payer cooled down.
    Failed(Outcome),
}

/// A front-run, or else a revert diagnosed for the payer. Only a revert cools the payer down:
/// its trial succeeded, or nothing was sent, so its wallet or balance answered the chain
/// differently, at the operator's expense. A payer whose authorization somebody else executed
/// did nothing of the kind.
async fn judge_revert(
    lane: &Lane,
    record: &EvmRecord,
    inclusion: Inclusion,
    head: &Head,
) -> Reverted {
    let confirmations = lane.settings.confirmations;
    match front_runner(&lane.chain, record, head, confirmations).await {
        Lookup::FrontRun(by) => return Reverted::FrontRun(by),
        Lookup::NotYet
            if depth(head.number, inclusion.block) < confirmations + FRONT_RUN_PATIENCE =>
        {
            return Reverted::Wait;
        }
        Lookup::NotYet | Lookup::None => {}
    }
    lane.cooldown.impose(&Payer::Evm(record.part().payer)).await;
    Reverted::Failed(diagnose_revert(&lane.chain, record, inclusion.transaction).await)
}

/// A mined settlement that reverted: find out why, for the payer.
async fn diagnose_revert(chain: &Chain, record: &EvmRecord, hash: H256) -> Outcome {
    let mut batch = Batch::new();
    let (nonce_read, call) = nonce_call(record);
    let state = batch.add(call);
    let evm = record.part();
    let balance = batch.add(chain::eth_call(
        evm.token,
        &erc3009::balance_of(evm.payer),
        "latest",
    ));
    let answers = chain.client.ask(Traffic::Own, &batch).await.ok();
    let word = |slot: chain::Slot| {
        answers
            .as_ref()
            .and_then(|a| a.get(slot).as_ref().ok())
            .and_then(evm::parse_word)
    };
    let (reason, message) = if word(state).is_some_and(|w| nonce_read.used(w)) {
        (
            Reason::Payload,
            "authorization nonce was used before the settlement was mined",
        )
    } else if word(balance).is_some_and(|b| b < record.value) {
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
