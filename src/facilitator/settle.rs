//! Settlement: verify -> claim in the ledger -> sign with a lane's nonce -> store -> broadcast ->
//! follow receipts at block cadence -> store the outcome. The HTTP caller waits on the outcome
//! with a deadline; the settlement itself runs in its own task and survives the caller, and
//! (through the ledger) the process.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ethers_core::types::{Address, Bytes, H256, U256};
use serde_json::json;
use tokio::sync::watch;

use super::erc3009;
use super::ledger::{Attempt, Claim, Ledger, Outcome, Record};
use super::types::{PaymentRequest, Reason, SettleResponse};
use super::verify::{payer_of, unix_now, Invalid, Payment, Verifier};
use crate::chain::{self, Call, Chain, Fees, Unreachable};
use crate::signer::{Signer, UnsignedTx};
use crate::store::StoreError;

/// Gas assumed when a node answers an estimate it cannot parse (USDC's call uses about 80 000).
const FALLBACK_GAS_LIMIT: u64 = 150_000;
/// Gas added on top of the node's estimate for `transferWithAuthorization`.
const GAS_HEADROOM_PERCENT: u64 = 25;
/// Fee increase of a replacement transaction; nodes require at least 10%.
const FEE_BUMP_PERCENT: u64 = 20;
/// How many times a broadcast is retried with a fresh nonce after "nonce too low".
const NONCE_RESYNC_ATTEMPTS: usize = 3;

#[derive(Debug, thiserror::Error)]
pub enum SettleError {
    #[error(transparent)]
    Unreachable(#[from] Unreachable),
    /// Still unknown at the deadline: the hash once broadcast, `None` while still being signed.
    #[error("{}", pending_message(.0))]
    Pending(Option<H256>),
    #[error("the network refused the settlement transaction: {0}")]
    Refused(String),
    #[error(transparent)]
    Store(#[from] StoreError),
}

fn pending_message(hash: &Option<H256>) -> String {
    match hash {
        Some(hash) => {
            format!("settlement pending: {hash:?}; settle the same payment again for the outcome")
        }
        None => {
            "settlement pending: not yet broadcast; settle the same payment again for the outcome"
                .to_string()
        }
    }
}

/// What waiters on a settlement learn from its task.
#[derive(Debug, Clone)]
enum Progress {
    Signing,
    /// Broadcast; the latest transaction hash (fee bumps replace it).
    Sent(H256),
    Done(Outcome),
    /// Nothing was sent; the claim is released so the payment can be settled again.
    Abandoned(String),
}

/// One signer key on one network, with its own nonce sequence.
pub struct Lane {
    key: String,
    chain: Arc<Chain>,
    signer: Arc<Signer>,
    next_nonce: tokio::sync::Mutex<Option<u64>>,
    pending: AtomicUsize,
}

impl Lane {
    pub fn new(chain: Arc<Chain>, signer: Arc<Signer>) -> Arc<Self> {
        Arc::new(Self {
            key: format!("{}|{:?}", chain.name, signer.address),
            chain,
            signer,
            next_nonce: tokio::sync::Mutex::new(None),
            pending: AtomicUsize::new(0),
        })
    }

    pub fn network(&self) -> &str {
        &self.chain.name
    }

    pub fn signer_address(&self) -> Address {
        self.signer.address
    }

    pub fn pending(&self) -> usize {
        self.pending.load(Ordering::Relaxed)
    }
}

/// A settlement's hold on a lane: counted in the lane's `pending` while alive.
struct LaneLease {
    lane: Arc<Lane>,
}

impl LaneLease {
    fn new(lane: Arc<Lane>) -> Self {
        lane.pending.fetch_add(1, Ordering::Relaxed);
        Self { lane }
    }
}

impl Drop for LaneLease {
    fn drop(&mut self) {
        self.lane.pending.fetch_sub(1, Ordering::Relaxed);
    }
}

pub struct Settler {
    verifier: Arc<Verifier>,
    ledger: Ledger,
    lanes: HashMap<String, Vec<Arc<Lane>>>,
    inflight: Mutex<HashMap<String, watch::Receiver<Progress>>>,
    settle_timeout: Duration,
    bump_after_blocks: u64,
}

impl Settler {
    pub fn new(
        verifier: Arc<Verifier>,
        ledger: Ledger,
        lanes: Vec<Arc<Lane>>,
        settle_timeout: Duration,
        bump_after_blocks: u64,
    ) -> Arc<Self> {
        let mut by_network: HashMap<String, Vec<Arc<Lane>>> = HashMap::new();
        for lane in lanes {
            by_network
                .entry(lane.network().to_string())
                .or_default()
                .push(lane);
        }
        Arc::new(Self {
            verifier,
            ledger,
            lanes: by_network,
            inflight: Mutex::new(HashMap::new()),
            settle_timeout,
            bump_after_blocks,
        })
    }

    pub fn lanes(&self) -> impl Iterator<Item = &Arc<Lane>> {
        self.lanes.values().flatten()
    }

    pub fn pending_settlements(&self) -> usize {
        self.inflight.lock().expect("inflight lock").len()
    }

    pub async fn settle(
        self: &Arc<Self>,
        request: &PaymentRequest,
    ) -> Result<SettleResponse, SettleError> {
        let answer = Answer {
            payer: payer_of(request),
            network: request.payment_requirements.network.clone(),
        };
        let payment = match self.verifier.check_local(request) {
            Ok(payment) => payment,
            Err(failure) => return Ok(answer.failed(&failure)),
        };
        let key = payment.key();
        let deadline = self.deadline(payment.auth.valid_before);
        if let Some(known) = self.known(&key, payment.digest)? {
            return self.answer_known(known, &answer, deadline).await;
        }
        let lease = self.pick_lane(&payment.network.name);
        let (calldata, gas_limit) = match self.prepare(&payment, &lease.lane).await? {
            Ok(prepared) => prepared,
            Err(failure) => {
                // A concurrent duplicate may have settled this very authorization while we read
                // the chain (its nonce then reads as used): its outcome is the answer.
                if let Some(known) = self.known(&key, payment.digest)? {
                    return self.answer_known(known, &answer, deadline).await;
                }
                return Ok(answer.failed(&failure));
            }
        };
        let record = new_record(&payment, calldata, gas_limit);
        let progress = match self.claim(&key, &record)? {
            Ok(sender) => {
                let receiver = sender.subscribe();
                tokio::spawn(self.clone().run(key, record, lease, sender));
                receiver
            }
            Err(known) => return self.answer_known(known, &answer, deadline).await,
        };
        self.wait(progress, &answer, deadline).await
    }

    /// Verify's chain rules and the gas estimate of the settlement call, in one batch: the
    /// calldata and gas limit to sign, or why the payment fails.
    async fn prepare(
        &self,
        payment: &Payment<'_>,
        lane: &Lane,
    ) -> Result<Result<(Bytes, u64), Invalid>, Unreachable> {
        let smart_wallet = payment.recovered != Some(payment.auth.from);
        let calldata =
            erc3009::transfer_with_authorization(&payment.auth, &payment.signature, smart_wallet);
        let estimate = Call::new(
            "eth_estimateGas",
            vec![json!({
                "from": format!("{:?}", lane.signer.address),
                "to": format!("{:?}", payment.token.address),
                "data": chain::hex_bytes(&calldata),
            })],
        );
        let (verdict, extra) = self.verifier.check_on_chain(payment, &[estimate]).await?;
        Ok(verdict.and_then(|()| match &extra[0] {
            Ok(v) => {
                let estimate = chain::parse_u64(v).unwrap_or(FALLBACK_GAS_LIMIT);
                Ok((calldata, estimate * (100 + GAS_HEADROOM_PERCENT) / 100))
            }
            Err(e) => Err(Invalid {
                reason: Reason::Payload,
                message: format!("transferWithAuthorization would revert: {}", e.message),
            }),
        }))
    }

    /// What the ledger or a running task already knows of this payment, if anything.
    fn known(&self, key: &str, digest: H256) -> Result<Option<Known>, SettleError> {
        if let Some(progress) = self.inflight.lock().expect("inflight lock").get(key) {
            return Ok(Some(Known::Running(progress.clone())));
        }
        Ok(self
            .ledger
            .get(key)?
            .map(|record| Known::from_record(record, digest)))
    }

    /// Creates the ledger record and registers the task's progress under one lock, so a
    /// concurrent duplicate either sees the running task or the stored record, never neither.
    fn claim(
        &self,
        key: &str,
        record: &Record,
    ) -> Result<Result<watch::Sender<Progress>, Known>, SettleError> {
        let mut inflight = self.inflight.lock().expect("inflight lock");
        if let Some(progress) = inflight.get(key) {
            return Ok(Err(Known::Running(progress.clone())));
        }
        match self.ledger.claim(key, record)? {
            Claim::Claimed => {
                let (sender, receiver) = watch::channel(Progress::Signing);
                inflight.insert(key.to_string(), receiver);
                Ok(Ok(sender))
            }
            Claim::Exists(existing) => Ok(Err(Known::from_record(*existing, record.digest))),
        }
    }

    async fn answer_known(
        &self,
        known: Known,
        answer: &Answer,
        deadline: Duration,
    ) -> Result<SettleResponse, SettleError> {
        match known {
            Known::Running(progress) => self.wait(progress, answer, deadline).await,
            Known::Finished(outcome) => Ok(answer.settled(&outcome)),
            Known::Unfinished(hash) => Err(SettleError::Pending(hash)),
            Known::Conflict => Ok(answer.failed(&Invalid {
                reason: Reason::Payload,
                message: "authorization nonce already used by another authorization".to_string(),
            })),
        }
    }

    async fn wait(
        &self,
        mut progress: watch::Receiver<Progress>,
        answer: &Answer,
        deadline: Duration,
    ) -> Result<SettleResponse, SettleError> {
        let finished = |p: &Progress| matches!(p, Progress::Done(_) | Progress::Abandoned(_));
        let settled = tokio::time::timeout(deadline, progress.wait_for(finished))
            .await
            .map(|waited| waited.map(|state| state.clone()));
        match settled {
            Ok(Ok(state)) => match state {
                Progress::Done(outcome) => Ok(answer.settled(&outcome)),
                Progress::Abandoned(reason) => Err(SettleError::Refused(reason)),
                Progress::Signing | Progress::Sent(_) => {
                    unreachable!("wait_for returns a finished state")
                }
            },
            // Out of time (or shutting down): the ledger keeps the record and the task goes on.
            Ok(Err(_)) | Err(_) => match &*progress.borrow() {
                Progress::Sent(hash) => Err(SettleError::Pending(Some(*hash))),
                _ => Err(SettleError::Pending(None)),
            },
        }
    }

    /// The wait is bounded by the earlier of the authorization's expiry (plus a block) and the
    /// configured settle timeout.
    fn deadline(&self, valid_before: U256) -> Duration {
        let now = unix_now();
        let until_expiry = if valid_before > U256::from(u64::MAX) {
            u64::MAX
        } else {
            valid_before.as_u64().saturating_sub(now).saturating_add(2)
        };
        self.settle_timeout.min(Duration::from_secs(until_expiry))
    }

    /// The lane with the fewest settlements under way, counted from the moment it is chosen so
    /// that a burst spreads over every key.
    fn pick_lane(&self, network: &str) -> LaneLease {
        let lanes = &self.lanes[network];
        let lane = lanes
            .iter()
            .min_by_key(|l| l.pending())
            .expect("every served network has a lane");
        LaneLease::new(lane.clone())
    }

    fn lane_for(&self, network: &str, signer: Option<Address>) -> Option<Arc<Lane>> {
        self.lanes
            .get(network)?
            .iter()
            .find(|l| Some(l.signer.address) == signer)
            .cloned()
    }

    /// Resumes every settlement the ledger holds without an outcome. Runs before serving.
    pub async fn recover(self: &Arc<Self>) -> Result<usize, SettleError> {
        let unfinished = self.ledger.unfinished()?;
        let mut resumed = 0;
        for (key, record) in unfinished {
            if record.attempts.is_empty() {
                // Claimed but never signed: nothing reached the network.
                self.ledger.release(&key).await?;
                continue;
            }
            let Some(chain) = self
                .verifier
                .networks()
                .find(|n| n.name == record.network)
                .map(|n| n.chain.clone())
            else {
                tracing::warn!(payment = %key, "settlement on a network no longer served; left in the store");
                continue;
            };
            let (sender, receiver) =
                watch::channel(Progress::Sent(record.latest_hash().unwrap_or_default()));
            self.inflight
                .lock()
                .expect("inflight lock")
                .insert(key.clone(), receiver);
            let lane = self.lane_for(&record.network, record.signer);
            tokio::spawn(self.clone().resume(key, record, chain, lane, sender));
            resumed += 1;
        }
        Ok(resumed)
    }

    /// The task that owns one settlement from signing to outcome.
    async fn run(
        self: Arc<Self>,
        key: String,
        mut record: Record,
        lease: LaneLease,
        progress: watch::Sender<Progress>,
    ) {
        let lane = lease.lane.clone();
        let chain = lane.chain.clone();
        let result = match self.send_first(&key, &mut record, &lane).await {
            Ok(()) => {
                progress.send_replace(Progress::Sent(record.latest_hash().expect("sent")));
                self.follow(&key, &mut record, &chain, Some(&lane), &progress)
                    .await
            }
            Err(refusal) => {
                if let Err(e) = self.ledger.release(&key).await {
                    tracing::error!(payment = %key, error = %e, "could not release an abandoned claim");
                }
                Err(refusal)
            }
        };
        drop(lease);
        self.finish(&key, result, &progress);
    }

    async fn resume(
        self: Arc<Self>,
        key: String,
        mut record: Record,
        chain: Arc<Chain>,
        lane: Option<Arc<Lane>>,
        progress: watch::Sender<Progress>,
    ) {
        tracing::info!(payment = %key, transaction = ?record.latest_hash(), "resuming settlement");
        // The node may have lost the transaction while routerd was down; sending the stored bytes
        // again is harmless if it did not ("already known", or mined: "nonce too low").
        if let Some(latest) = record.attempts.last() {
            rebroadcast(&chain, &latest.raw.clone()).await;
        }
        let result = self
            .follow(&key, &mut record, &chain, lane.as_ref(), &progress)
            .await;
        self.finish(&key, result, &progress);
    }

    fn finish(
        &self,
        key: &str,
        result: Result<Outcome, String>,
        progress: &watch::Sender<Progress>,
    ) {
        let state = match result {
            Ok(outcome) => {
                tracing::info!(payment = %key, success = outcome.success, transaction = ?outcome.transaction, reason = ?outcome.reason, "settlement finished");
                Progress::Done(outcome)
            }
            Err(reason) => {
                tracing::warn!(payment = %key, %reason, "settlement abandoned before reaching the network");
                Progress::Abandoned(reason)
            }
        };
        self.inflight.lock().expect("inflight lock").remove(key);
        progress.send_replace(state);
    }

    /// Signs with the lane's next nonce, stores, broadcasts. On a refusal that proves nothing
    /// was accepted, the nonce and the claim are given back.
    async fn send_first(&self, key: &str, record: &mut Record, lane: &Lane) -> Result<(), String> {
        let mut next_nonce = lane.next_nonce.lock().await;
        for _ in 0..NONCE_RESYNC_ATTEMPTS {
            let nonce = match *next_nonce {
                Some(n) => n,
                None => self.initial_nonce(lane).await.map_err(|e| e.to_string())?,
            };
            let head = lane.chain.latest_head().await.map_err(|e| e.to_string())?;
            let fees = head.fees.capped(lane.chain.settings.max_fee_cap());
            self.sign_and_store(key, record, lane, nonce, fees, head.number)
                .await
                .map_err(|e| e.to_string())?;
            *next_nonce = Some(nonce + 1);
            let attempt = record.attempts.last().expect("just signed");
            match broadcast(&lane.chain, &attempt.raw).await {
                Broadcast::Accepted | Broadcast::Unknown => return Ok(()),
                Broadcast::NonceTooLow => {
                    tracing::info!(lane = %lane.key, nonce, "nonce taken outside routerd; resyncing");
                    record.attempts.pop();
                    *next_nonce = Some(self.chain_nonce(lane).await.map_err(|e| e.to_string())?);
                }
                Broadcast::Refused(reason) => {
                    record.attempts.pop();
                    *next_nonce = Some(nonce);
                    self.ledger
                        .set_lane_nonce(&lane.key, nonce)
                        .await
                        .map_err(|e| e.to_string())?;
                    return Err(reason);
                }
            }
        }
        Err("could not obtain a usable signer nonce".to_string())
    }

    async fn sign_and_store(
        &self,
        key: &str,
        record: &mut Record,
        lane: &Lane,
        nonce: u64,
        fees: Fees,
        block: u64,
    ) -> Result<(), StoreError> {
        let tx = UnsignedTx {
            chain_id: lane.chain.settings.chain_id,
            nonce,
            to: record.token,
            data: record.calldata.clone(),
            gas_limit: record.gas_limit,
            fees,
        };
        let (hash, raw) = lane.signer.sign_transaction(&tx);
        let priority_fee = match fees {
            Fees::Eip1559 { priority_fee, .. } => priority_fee,
            Fees::Legacy { gas_price } => gas_price,
        };
        record.signer = Some(lane.signer.address);
        record.signer_nonce = Some(nonce);
        record.attempts.push(Attempt {
            hash,
            raw,
            max_fee_per_gas: fees.max_fee_per_gas(),
            priority_fee,
            sent_at_block: block,
        });
        self.ledger
            .record_attempt(key, record, &lane.key, nonce + 1)
            .await
    }

    /// The lane's first nonce: the larger of what the store last handed out and what the chain
    /// has seen, so neither a restart nor transactions sent elsewhere cause a reuse.
    async fn initial_nonce(&self, lane: &Lane) -> Result<u64, SettleError> {
        let stored = self.ledger.stored_lane_nonce(&lane.key)?.unwrap_or(0);
        Ok(stored.max(self.chain_nonce(lane).await?))
    }

    async fn chain_nonce(&self, lane: &Lane) -> Result<u64, SettleError> {
        let answer = lane
            .chain
            .client
            .call(
                "eth_getTransactionCount",
                vec![
                    json!(format!("{:?}", lane.signer.address)),
                    json!("pending"),
                ],
            )
            .await?;
        answer
            .ok()
            .as_ref()
            .and_then(chain::parse_u64)
            .ok_or_else(|| {
                SettleError::Refused("eth_getTransactionCount gave no number".to_string())
            })
    }

    /// Watches receipts at every new block until the outcome is known. Re-sends the transaction
    /// if the node lost it, and replaces it with higher fees when it lingers.
    async fn follow(
        &self,
        key: &str,
        record: &mut Record,
        chain: &Chain,
        lane: Option<&Arc<Lane>>,
        progress: &watch::Sender<Progress>,
    ) -> Result<Outcome, String> {
        let mut heads = chain.head.subscribe();
        let mut checked_at_block = None;
        loop {
            let head = chain.head.current();
            let block = head.as_ref().map(|h| h.number);
            if block != checked_at_block || block.is_none() {
                let checked = self.check_receipts(record, chain).await;
                tracing::debug!(payment = %key, ?block, found = ?checked.as_ref().map(|o| o.is_some()), "receipt check");
                match checked {
                    Ok(Some(outcome)) => {
                        record.outcome = Some(outcome.clone());
                        if let Err(e) = self.ledger.save(key, record).await {
                            tracing::error!(payment = %key, error = %e, "could not store a settlement outcome");
                        }
                        return Ok(outcome);
                    }
                    Ok(None) => {
                        if let Some(head) = &head {
                            self.keep_alive(key, record, chain, lane, head.number, head.fees)
                                .await;
                            progress
                                .send_replace(Progress::Sent(record.latest_hash().expect("sent")));
                        }
                        checked_at_block = block;
                    }
                    Err(e) => tracing::debug!(payment = %key, error = %e, "receipt check failed"),
                }
            }
            let poll = Duration::from_millis(chain.settings.poll_interval_ms);
            let _ = tokio::time::timeout(poll * 4, heads.changed()).await;
        }
    }

    async fn check_receipts(
        &self,
        record: &Record,
        chain: &Chain,
    ) -> Result<Option<Outcome>, Unreachable> {
        let calls: Vec<Call> = record
            .attempts
            .iter()
            .map(|a| {
                Call::new(
                    "eth_getTransactionReceipt",
                    vec![json!(format!("{:?}", a.hash))],
                )
            })
            .collect();
        let answers = chain.client.batch(&calls).await?;
        for (attempt, answer) in record.attempts.iter().zip(answers) {
            let Ok(receipt) = answer else { continue };
            if receipt.is_null() {
                continue;
            }
            let status = receipt.get("status").and_then(chain::parse_u64);
            if status == Some(1) {
                return Ok(Some(Outcome {
                    success: true,
                    reason: None,
                    message: None,
                    transaction: attempt.hash,
                }));
            }
            return Ok(Some(
                self.diagnose_revert(record, chain, attempt.hash).await,
            ));
        }
        Ok(None)
    }

    /// A mined settlement that reverted: find out why, for the payer.
    async fn diagnose_revert(&self, record: &Record, chain: &Chain, hash: H256) -> Outcome {
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
            reason: Some(reason.settle_name().to_string()),
            message: Some(message.to_string()),
            transaction: hash,
        }
    }

    /// Every `bump_after_blocks` without a receipt: re-broadcast the latest attempt (the node may
    /// have dropped it) or, while the authorization is still valid, replace it with higher fees.
    async fn keep_alive(
        &self,
        key: &str,
        record: &mut Record,
        chain: &Chain,
        lane: Option<&Arc<Lane>>,
        block: u64,
        current_fees: Fees,
    ) {
        let Some(latest) = record.attempts.last() else {
            return;
        };
        if block < latest.sent_at_block + self.bump_after_blocks {
            return;
        }
        let still_valid = U256::from(unix_now() + 2) < U256::from(record.valid_before);
        let signer_nonce = record.signer_nonce;
        match (lane, still_valid, signer_nonce) {
            (Some(lane), true, Some(nonce)) => {
                let previous = previous_fees(latest, current_fees);
                let fees = previous
                    .bumped(FEE_BUMP_PERCENT)
                    .capped(chain.settings.max_fee_cap());
                if fees.max_fee_per_gas() <= latest.max_fee_per_gas {
                    return rebroadcast(chain, &latest.raw.clone()).await;
                }
                tracing::info!(payment = %key, nonce, "replacing a lingering settlement with higher fees");
                if let Err(e) = self
                    .sign_and_store(key, record, lane, nonce, fees, block)
                    .await
                {
                    tracing::error!(payment = %key, error = %e, "could not store a replacement");
                    return;
                }
                let raw = record.attempts.last().expect("just signed").raw.clone();
                rebroadcast(chain, &raw).await;
            }
            _ => {
                let raw = latest.raw.clone();
                if let Some(last) = record.attempts.last_mut() {
                    last.sent_at_block = block;
                }
                rebroadcast(chain, &raw).await;
            }
        }
    }
}

fn previous_fees(attempt: &Attempt, current: Fees) -> Fees {
    match current {
        Fees::Eip1559 {
            base_fee,
            priority_fee,
        } => Fees::Eip1559 {
            base_fee: base_fee
                .max((attempt.max_fee_per_gas.saturating_sub(attempt.priority_fee)) / 2),
            priority_fee: priority_fee.max(attempt.priority_fee),
        },
        Fees::Legacy { gas_price } => Fees::Legacy {
            gas_price: gas_price.max(attempt.max_fee_per_gas),
        },
    }
}

enum Broadcast {
    Accepted,
    /// The node could not be asked; the stored transaction is re-sent while it is followed.
    Unknown,
    NonceTooLow,
    Refused(String),
}

async fn broadcast(chain: &Chain, raw: &Bytes) -> Broadcast {
    match chain
        .client
        .call("eth_sendRawTransaction", vec![json!(chain::hex_bytes(raw))])
        .await
    {
        Ok(Ok(_)) => Broadcast::Accepted,
        Ok(Err(e)) => {
            let message = e.message.to_lowercase();
            if message.contains("already known") || message.contains("known transaction") {
                Broadcast::Accepted
            } else if message.contains("nonce too low") || message.contains("nonce is too low") {
                Broadcast::NonceTooLow
            } else if message.contains("underpriced") {
                // Another transaction holds this nonce in the pool: ours is still valid to follow.
                Broadcast::Accepted
            } else {
                Broadcast::Refused(e.message)
            }
        }
        Err(_) => Broadcast::Unknown,
    }
}

async fn rebroadcast(chain: &Chain, raw: &Bytes) {
    if let Broadcast::Refused(reason) = broadcast(chain, raw).await {
        tracing::debug!(chain = %chain.name, %reason, "re-broadcast refused");
    }
}

fn new_record(payment: &Payment<'_>, calldata: Bytes, gas_limit: u64) -> Record {
    let valid_before = payment.auth.valid_before.min(U256::from(u64::MAX)).as_u64();
    Record {
        network: payment.network.name.clone(),
        token: payment.token.address,
        payer: payment.auth.from,
        value: payment.auth.value,
        nonce: payment.auth.nonce,
        valid_before,
        digest: payment.digest,
        calldata,
        gas_limit,
        signer: None,
        signer_nonce: None,
        attempts: Vec::new(),
        outcome: None,
    }
}

enum Known {
    Running(watch::Receiver<Progress>),
    Finished(Outcome),
    /// The ledger holds another authorization under the same (network, asset, from, nonce).
    Conflict,
    /// Stored without an outcome and followed by no task (its network is no longer served).
    Unfinished(Option<H256>),
}

impl Known {
    fn from_record(record: Record, digest: H256) -> Self {
        match record.outcome {
            _ if record.digest != digest => Known::Conflict,
            Some(outcome) => Known::Finished(outcome),
            None => Known::Unfinished(record.latest_hash()),
        }
    }
}

/// The fields every settle answer carries, whatever happened.
struct Answer {
    payer: String,
    network: String,
}

impl Answer {
    fn failed(&self, failure: &Invalid) -> SettleResponse {
        SettleResponse {
            success: false,
            error_reason: Some(failure.reason.settle_name().to_string()),
            error_message: Some(failure.message.clone()),
            payer: self.payer.clone(),
            transaction: String::new(),
            network: self.network.clone(),
        }
    }

    fn settled(&self, outcome: &Outcome) -> SettleResponse {
        SettleResponse {
            success: outcome.success,
            error_reason: outcome.reason.clone(),
            error_message: outcome.message.clone(),
            payer: self.payer.clone(),
            transaction: format!("{:?}", outcome.transaction),
            network: self.network.clone(),
        }
    }
}
