//! Settlement: verify -> claim in the ledger -> a lane signs, stores and broadcasts -> the lane
//! follows the chain until the transaction is `confirmations` deep (answer) and then
//! `finality_depth` deep (final). The HTTP caller waits on the answer within its deadline; the
//! settlement itself lives in its lane and, through the ledger, survives the process.
//!
//! An answer is handed only to a request that carries the settled authorization (the same
//! EIP-712 digest) and whose requirements that authorization meets: a success can never be given
//! to a merchant whose payment it is not.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use ethers_core::types::{Address, Bytes, H256, U256};
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;
use tracing::Instrument;

use super::lane::{Lane, Lanes, Reservation};
use super::request::{Method, Request};
use super::verify::{check_terms, Payer, Payment, Trial, Tried, Verifier};
use super::worker::Worker;
use crate::chain::{Budget, Unreachable};
use crate::clock::unix_now;
use crate::evm;
use crate::evm::{erc3009, erc6492, permit2};
use crate::facilitator::outcome::{Invalid, SettleError, Settled};
use crate::facilitator::settlement::recheck::{exposure_may_clear, next_head, MAX_RECHECKS};
use crate::facilitator::settlement::waiters::{Progress, Running, Waiters};
use crate::facilitator::settlement::{caller_of, duplicate, key_taken, pass_on, with_pass};
use crate::facilitator::settlement::{Caller, ClaimOn};
use crate::ledger::Reason;
use crate::ledger::{Asking, LaneId, Outcome, PaymentKey, Record, RequestTag, State};
use crate::store::{Claim, Lease, Limits, Permit2Clash, Storage, StoreError};

/// The settlement ledger, lanes and leases, in whichever backend is configured.
pub type Ledger = Storage;

/// Who this instance is when it holds a lane, and how long a lease lasts unrenewed.
#[derive(Debug, Clone)]
pub struct LeaseSettings {
    pub holder: String,
    pub ttl: Duration,
}

/// Gas added on top of the tried gas of `transferWithAuthorization`.
const GAS_HEADROOM_PERCENT: u64 = 25;
/// How often a duplicate waiting on a settlement it does not run reads its record again.
const STORED_POLL: Duration = Duration::from_millis(50);
/// How often finished records older than the retention are pruned.
const PRUNE_EVERY: Duration = Duration::from_secs(3600);

pub struct Settler {
    verifier: Arc<Verifier>,
    ledger: Ledger,
    lanes: Arc<Lanes>,
    waiters: Arc<Waiters>,
    /// The lane workers' queues until `start` hands them to their workers.
    queues: Mutex<Vec<(Arc<Lane>, mpsc::Receiver<Record>)>>,
    settle_timeout: Duration,
    retention: Duration,
    lease: LeaseSettings,
}

impl Settler {
    pub fn new(
        verifier: Arc<Verifier>,
        ledger: Ledger,
        lanes: Vec<(Arc<Lane>, mpsc::Receiver<Record>)>,
        settle_timeout: Duration,
        retention: Duration,
        lease: LeaseSettings,
    ) -> Arc<Self> {
        Arc::new(Self {
            verifier,
            ledger,
            lanes: Arc::new(Lanes::new(lanes.iter().map(|(l, _)| l.clone()).collect())),
            waiters: Arc::new(Waiters::default()),
            queues: Mutex::new(lanes),
            settle_timeout,
            retention,
            lease,
        })
    }

    pub fn lanes(&self) -> &Lanes {
        &self.lanes
    }

    pub fn pending_settlements(&self) -> usize {
        self.waiters.count()
    }

    /// Resumes every unfinished settlement and starts the lane workers; returns once each lane
    /// has sent again what it resumes. Call before serving. A lane another live instance holds
    /// starts in standby, and takes its settlements over if that instance stops renewing.
    pub async fn start(self: &Arc<Self>) -> Result<usize, SettleError> {
        let pruned = self.ledger.prune(self.prune_cutoff()).await?;
        if pruned > 0 {
            tracing::info!(pruned, "pruned finished settlement records");
        }
        let mut by_lane: std::collections::HashMap<LaneId, Vec<Record>> = Default::default();
        for record in self.ledger.unfinished().await? {
            if record.svm.is_some() {
                // A Solana settlement: the Solana family follows it (`facilitator::svm`).
                continue;
            }
            let Some(latest) = record.latest() else {
                // Claimed but never signed: nothing reached the network; the caller may retry.
                // In a shared store it may be another instance's claim in flight: left alone.
                if !self.ledger.shared() {
                    self.ledger.release(&record.key()).await?;
                }
                continue;
            };
            let lane = LaneId {
                network: record.network.clone(),
                signer: latest.signer,
            };
            if self.lanes.find(&lane).is_none() {
                tracing::warn!(payment = %record.key(), %lane, "settlement of a signer or network no longer configured; left in the store");
                continue;
            }
            by_lane.entry(lane).or_default().push(record);
        }
        let resumed = by_lane.values().map(Vec::len).sum();
        let queues = std::mem::take(&mut *self.queues.lock().expect("queues lock"));
        for (lane, queue) in queues {
            let records = by_lane.remove(&lane.id).unwrap_or_default();
            let worker = Worker::start(
                lane,
                self.lanes.clone(),
                self.ledger.clone(),
                self.waiters.clone(),
                &self.lease,
                records,
            )
            .await?;
            tokio::spawn(worker.run(queue));
        }
        tokio::spawn(self.clone().prune_periodically());
        Ok(resumed)
    }

    fn prune_cutoff(&self) -> u64 {
        unix_now().saturating_sub(self.retention.as_secs())
    }

    async fn prune_periodically(self: Arc<Self>) {
        let mut ticker = tokio::time::interval(PRUNE_EVERY);
        ticker.tick().await;
        loop {
            ticker.tick().await;
            match self.ledger.prune(self.prune_cutoff()).await {
                Ok(0) => {}
                Ok(pruned) => tracing::info!(pruned, "pruned finished settlement records"),
                Err(e) => tracing::error!(error = %e, "could not prune settlement records"),
            }
        }
    }

    /// Settles one payment. `asking` names the request: only the request that claimed the
    /// payment (a retry carrying its `Idempotency-Key`, or after a pending answer its identical
    /// next request) is told a success; every other settle of the same authorization is told
    /// the transaction that settled it, as a failure.
    ///
    /// Settling is [`Settler::begin`] then [`Settler::finish`]: a caller that boxes `begin` frees
    /// the payment, its reads and its record before the wait for the block, so that a
    /// settlement waiting for its answer holds the wait alone (1,000 of them at a time).
    pub async fn begin(&self, request: &Request, asking: &Asking) -> Result<Begun, SettleError> {
        let payment = match self.verifier.check_local(request) {
            Ok(payment) => payment,
            Err(failure) => return Ok(Begun::answered(Settled::failed(failure))),
        };
        let deadline = Instant::now() + self.wait_bound(payment.auth.valid_before);
        let key = payment.key();
        if let Some(known) = self.known(&key, &payment, asking).await? {
            return Ok(Begun(Stage::Known(Pending::here(key, deadline), known)));
        }
        if let Err(failure) = self
            .verifier
            .check_cooldown_stored(payment.auth.from)
            .await?
        {
            return Ok(Begun::answered(Settled::failed(failure)));
        }
        if let Method::Permit2Upto { .. } = payment.method {
            if payment.charge().is_zero() {
                let charged = Box::pin(self.charge_nothing(&payment)).await?;
                return Ok(Begun::answered(charged));
            }
        }
        let lane = match payment.method {
            // check_local made sure the witness names one of this facilitator's signers.
            Method::Permit2Upto { facilitator } => {
                self.lanes.of_signer(&payment.network.name, facilitator)
            }
            _ => self.lanes.pick(&payment.network.name, None),
        };
        let reservation = lane.expect("every served network has a lane").reserve();
        let span = settlement_span(reservation.lane());
        self.settle_on(&payment, reservation, asking, deadline)
            .instrument(span)
            .await
    }

    /// The answer to a settlement begun: at once, or when the lane (or the store) tells it.
    pub async fn finish(&self, begun: Begun, asking: &Asking) -> Result<Settled, SettleError> {
        let (pending, outcome) = match begun.0 {
            Stage::Answered(settled) => return Ok(settled),
            Stage::Known(pending, known) => {
                let Pending {
                    key,
                    deadline,
                    span,
                } = *pending;
                let answer = self.answer_known(known, &key, asking, deadline);
                return Box::pin(answer).instrument(span).await;
            }
            Stage::Submitted(pending, progress) => {
                let outcome = self.wait(progress, &pending.key, pending.deadline);
                let outcome = outcome.instrument(pending.span.clone()).await;
                (pending, outcome)
            }
            Stage::Queued(pending, record) => {
                let outcome = Box::pin(self.await_stored(*record, pending.deadline));
                let outcome = outcome.instrument(pending.span.clone()).await;
                (pending, outcome)
            }
        };
        let Pending { key, span, .. } = *pending;
        pass_on(&self.ledger, outcome, &key, asking)
            .instrument(span)
            .await
    }

    /// Prepares and claims on the lane `reservation` holds, in the `settlement` span.
    async fn settle_on(
        &self,
        payment: &Payment<'_>,
        mut reservation: Reservation,
        asking: &Asking,
        deadline: Instant,
    ) -> Result<Begun, SettleError> {
        let key = payment.key();
        // A settlement of the same payer mined in the block just read is out of the balance
        // already, but counts as exposure until its lane answers it (at `confirmations`): the
        // claim is tried again after each new head (or a short wait), a few times. A refused claim
        // stores nothing, so trying again cannot settle twice; only refusals pay the reads.
        let mut heads = payment.network.chain.head.subscribe();
        let mut rechecks = MAX_RECHECKS;
        loop {
            let attempt =
                Box::pin(self.try_claim(payment, &key, &mut reservation, asking, deadline));
            let pending = || Pending::here(key.clone(), deadline);
            match attempt.await? {
                Attempt::Submitted(progress) => {
                    return Ok(Begun(Stage::Submitted(pending(), progress)))
                }
                Attempt::Queued(record) => return Ok(Begun(Stage::Queued(pending(), record))),
                Attempt::Answered(settled) => return Ok(Begun::answered(settled)),
                Attempt::Known(known) => return Ok(Begun(Stage::Known(pending(), known))),
                Attempt::OverLimit(failure) if rechecks > 0 && exposure_may_clear(&failure) => {
                    rechecks -= 1;
                    if !next_head(&mut heads, deadline).await {
                        return Ok(Begun::answered(Settled::failed(failure)));
                    }
                }
                Attempt::OverLimit(failure) => {
                    return Ok(Begun::answered(Settled::failed(failure)))
                }
            }
        }
    }

    /// One try: the payment prepared, claimed and, when claimed here, handed to the lane.
    async fn try_claim(
        &self,
        payment: &Payment<'_>,
        key: &PaymentKey,
        reservation: &mut Reservation,
        asking: &Asking,
        deadline: Instant,
    ) -> Result<Attempt, SettleError> {
        let (record, payer) = match self
            .prepared(payment, reservation, asking, deadline)
            .await?
        {
            Prepared::Ready(record, payer) => (record, payer),
            Prepared::Answered(settled) => return Ok(Attempt::Answered(settled)),
        };
        let lease = reservation.lane().lease();
        let claimed = self.claim(key, &record, payment, lease.as_ref(), payer, asking);
        Ok(match claimed.await? {
            Claimed::Here(progress) => {
                reservation.submit(*record).await;
                Attempt::Submitted(progress)
            }
            Claimed::Queued => Attempt::Queued(record),
            Claimed::Known(known) => Attempt::Known(known),
            Claimed::OverLimit(failure) => Attempt::OverLimit(failure),
        })
    }

    /// An `upto` payment charged nothing: once the payment reads valid on chain, a success with
    /// no transaction, and nothing stored (the permit stays unused).
    async fn charge_nothing(&self, payment: &Payment<'_>) -> Result<Settled, SettleError> {
        let _read = payment.network.chain.client.admit(Budget::Settle)?;
        Ok(match self.verifier.check_on_chain(payment).await? {
            Ok(()) => Settled {
                success: true,
                reason: None,
                message: None,
                transaction: None,
            },
            Err(failure) => Settled::failed(failure),
        })
    }

    /// The record to claim for this payment and the payer as the chain read saw it, or the
    /// answer when the payment fails (or a duplicate settled it meanwhile).
    async fn prepared(
        &self,
        payment: &Payment<'_>,
        reservation: &Reservation,
        asking: &Asking,
        deadline: Instant,
    ) -> Result<Prepared, SettleError> {
        let _read = payment.network.chain.client.admit(Budget::Settle)?;
        let prepared = tokio::time::timeout_at(deadline, self.prepare(payment, reservation.lane()))
            .await
            .map_err(|_| Unreachable {
                chain: payment.network.name.clone(),
                detail: "timed out before the settlement could be prepared".to_string(),
            })??;
        match prepared {
            Ok((call, gas_limit, payer)) => Ok(Prepared::Ready(
                Box::new(new_record(payment, call, gas_limit, asking)),
                payer,
            )),
            Err(failure) => {
                // A concurrent duplicate may have settled this very authorization while we read
                // the chain (its nonce then reads as used): its outcome is the answer.
                let key = payment.key();
                if let Some(known) = self.known(&key, payment, asking).await? {
                    return Ok(Prepared::Answered(
                        self.answer_known(known, &key, asking, deadline).await?,
                    ));
                }
                Ok(Prepared::Answered(Settled::failed(failure)))
            }
        }
    }

    /// Whether this payment's nonce is claimed for settlement, by any authorization: verify
    /// answers such a payment invalid rather than let a merchant deliver on it (access.md §1).
    pub async fn claim_on(&self, payment: &Payment<'_>) -> Result<Option<ClaimOn>, StoreError> {
        let key = payment.key();
        if self.waiters.get(&key).is_some() {
            return Ok(Some(ClaimOn::BeingSettled));
        }
        Ok(self.ledger.get(&key).await?.map(|r| match r.outcome {
            Some(_) => ClaimOn::Settled,
            None => ClaimOn::BeingSettled,
        }))
    }

    /// What routerd knows of one payment, for the status route: its record, and the head of
    /// its network (for the inclusion's depth) when the network is served and its head known.
    pub async fn status(
        &self,
        key: &PaymentKey,
    ) -> Result<Option<(Record, Option<u64>)>, StoreError> {
        let Some(record) = self.ledger.get(key).await? else {
            return Ok(None);
        };
        let head = self
            .verifier
            .network(&key.network)
            .and_then(|n| n.chain.head.current())
            .map(|h| h.number);
        Ok(Some((record, head)))
    }

    /// Gives up the lanes held here (clean shutdown), so that another instance takes them over
    /// at once instead of after the lease TTL. Anything still signed here is fenced anyway.
    pub async fn surrender_lanes(&self) {
        for lease in self.lanes.all().filter_map(|lane| lane.lease()) {
            if let Err(e) = self.ledger.surrender(&lease).await {
                tracing::warn!(lane = %lease.lane, error = %e, "could not give the lane lease up");
            }
        }
    }

    /// Settlements answered as successful whose transaction can no longer land.
    pub fn lost_settlements(&self) -> u64 {
        self.lanes.lost()
    }

    /// Verify's chain rules and the settlement call tried, in one request: the call and gas
    /// limit to sign and the payer as the read saw it, or why the payment fails.
    async fn prepare(
        &self,
        payment: &Payment<'_>,
        lane: &Lane,
    ) -> Result<Result<(SettlementCall, u64, Payer), Invalid>, Unreachable> {
        let call = SettlementCall::of(payment);
        let chain = &payment.network.chain;
        let trial = Trial {
            sender: lane.signer_address(),
            // The upto proxy takes its transaction only from the witness's facilitator.
            sender_bound: matches!(payment.method, Method::Permit2Upto { .. }),
            target: call.to,
            calldata: &call.data,
            gas_price: chain
                .head
                .current()
                .map_or(U256::one(), |h| h.fees.effective_price().max(U256::one())),
        };
        let (verdict, tried, payer) = self.verifier.check_and_try(payment, &trial).await?;
        if let Err(failure) = verdict {
            return Ok(Err(failure));
        }
        Ok(match tried {
            Tried::Gas(gas) => {
                let bound = chain.settings.max_settlement_gas;
                gas_limit(gas, &call.data, bound).map(|limit| (call, limit, payer))
            }
            Tried::Reverted(reason) => Err(Invalid {
                reason: Reason::Payload,
                message: format!("transferWithAuthorization would revert: {reason}").into(),
            }),
        })
    }

    /// What a running settlement or the ledger already says of this payment, if anything,
    /// bound to this request.
    async fn known(
        &self,
        key: &PaymentKey,
        payment: &Payment<'_>,
        asking: &Asking,
    ) -> Result<Option<Known>, SettleError> {
        let tag = asking.tag.as_ref();
        let known = match self.waiters.get(key) {
            Some(running) => Some(Known::from_running(running, payment, tag)?),
            None => match self.ledger.get(key).await? {
                Some(record) => Some(Known::from_record(record, payment, tag)?),
                None => None,
            },
        };
        match known {
            Some(known) => Ok(Some(self.with_pass(known, key, asking).await?)),
            None => Ok(None),
        }
    }

    /// A request the claimant's pending answer passed the outcome on to is the claimant now.
    async fn with_pass(
        &self,
        known: Known,
        key: &PaymentKey,
        asking: &Asking,
    ) -> Result<Known, SettleError> {
        Ok(match known {
            Known::Bound(found, caller) => {
                Known::Bound(found, with_pass(&self.ledger, caller, key, asking).await?)
            }
            unmet => unmet,
        })
    }

    /// Creates the ledger record, then registers its waiters. The store's claim is atomic (also
    /// across instances), so exactly one caller registers; a duplicate arriving in between finds
    /// the stored record and waits for its outcome (`await_stored`). Without `lease` (no lane of
    /// this network is held here) the claim is queued for an instance that holds one. The payer's
    /// settlements still under way and this one may not add up to more than its balance (its
    /// Permit2 ones to more than its Permit2 allowance); a smart wallet settles one at a time,
    /// so that a wallet that answers the chain differently than the trial reverts once before
    /// its cooldown, not once per payment in flight.
    async fn claim(
        &self,
        key: &PaymentKey,
        record: &Record,
        payment: &Payment<'_>,
        lease: Option<&Lease>,
        payer: Payer,
        asking: &Asking,
    ) -> Result<Claimed, SettleError> {
        let limits = Limits {
            balance: match payer.is_contract {
                true => payer.balance.min(record.value),
                false => payer.balance,
            },
            permit2_allowance: permit2_allowance(payment, &payer),
        };
        let tag = record.request.as_ref();
        if let Some(running) = self.waiters.get(key) {
            let known = Known::from_running(running, payment, tag)?;
            return Ok(Claimed::Known(self.with_pass(known, key, asking).await?));
        }
        match self.ledger.claim(key, record, lease, &limits).await? {
            Claim::Claimed if lease.is_none() => Ok(Claimed::Queued),
            Claim::Claimed => Ok(Claimed::Here(Waiters::register(
                &mut self.waiters.lock(),
                key.clone(),
                record.digest,
                record.request.clone(),
                Progress::Signing,
                // `settle_on` runs in the settlement's span: the lane carries it on.
                tracing::Span::current(),
            ))),
            Claim::Exists(existing) => {
                let known = Known::from_record(*existing, payment, tag)?;
                Ok(Claimed::Known(self.with_pass(known, key, asking).await?))
            }
            Claim::KeyTaken => Err(key_taken(record)),
            refused => Ok(Claimed::OverLimit(refusal(
                refused,
                record.value,
                &payer,
                &limits,
            ))),
        }
    }

    /// The answer to a request for a payment already claimed: the claimant's outcome for the
    /// claimant and its retries; for anybody else, the transaction as a failure.
    async fn answer_known(
        &self,
        known: Known,
        key: &PaymentKey,
        asking: &Asking,
        deadline: Instant,
    ) -> Result<Settled, SettleError> {
        let (found, caller) = match known {
            Known::Unmet(failure) => return Ok(Settled::failed(failure)),
            Known::Bound(found, caller) => (found, caller),
        };
        let outcome = match found {
            Found::Running(progress) => self.wait(progress, key, deadline).await,
            Found::Finished(outcome) => Ok(Settled::of(&outcome)),
            Found::Unfinished(record) => self.await_stored(*record, deadline).await,
        };
        match caller {
            Caller::Claimant => pass_on(&self.ledger, outcome, key, asking).await,
            Caller::Another => duplicate(outcome),
        }
    }

    /// A bound, unfinished record this process is not waiting on: settled by another instance,
    /// or claimed here a moment ago. Its outcome is read back from the store until the deadline.
    /// A record of a lane no instance follows (a signer or network since removed, embedded
    /// store) is answered pending at once.
    async fn await_stored(
        &self,
        record: Record,
        deadline: Instant,
    ) -> Result<Settled, SettleError> {
        let key = record.key();
        let followed = self.ledger.shared()
            || record.latest().is_none_or(|a| {
                let lane = LaneId {
                    network: record.network.clone(),
                    signer: a.signer,
                };
                self.lanes.find(&lane).is_some()
            });
        let mut hash = record.latest().map(|a| a.hash);
        while followed && Instant::now() + STORED_POLL < deadline {
            tokio::time::sleep(STORED_POLL).await;
            let Some(current) = self.ledger.get(&key).await? else {
                return Err(SettleError::Abandoned(
                    "the claim was released before anything was sent".to_string(),
                ));
            };
            if let Some(outcome) = current.outcome {
                return Ok(Settled::of(&outcome));
            }
            hash = current.latest().map(|a| a.hash);
        }
        Err(SettleError::Pending(hash))
    }

    async fn wait(
        &self,
        mut progress: watch::Receiver<Progress>,
        key: &PaymentKey,
        deadline: Instant,
    ) -> Result<Settled, SettleError> {
        let settled = tokio::time::timeout_at(deadline, progress.wait_for(Progress::finished))
            .await
            .map(|waited| waited.map(|state| state.clone()));
        match settled {
            Ok(Ok(Progress::Done(outcome))) => Ok(Settled::of(&outcome)),
            Ok(Ok(Progress::Abandoned(reason))) => Err(SettleError::Abandoned(reason)),
            Ok(Ok(Progress::Elsewhere)) => Box::pin(self.await_elsewhere(key, deadline)).await,
            // Out of time (or shutting down): the ledger keeps the record and the lane goes on.
            _ => match &*progress.borrow() {
                Progress::Sent(hash) => Err(SettleError::Pending(Some(*hash))),
                _ => Err(SettleError::Pending(None)),
            },
        }
    }

    /// This instance lost the lane: another one settles it, and the store tells how.
    async fn await_elsewhere(
        &self,
        key: &PaymentKey,
        deadline: Instant,
    ) -> Result<Settled, SettleError> {
        match self.ledger.get(key).await? {
            Some(record) => self.await_stored(record, deadline).await,
            None => Err(SettleError::Abandoned(
                "the claim was released before anything was sent".to_string(),
            )),
        }
    }

    /// The wait is bounded by the earlier of the authorization's expiry (plus a block) and the
    /// configured settle timeout.
    fn wait_bound(&self, valid_before: U256) -> Duration {
        let until_expiry = if valid_before > U256::from(u64::MAX) {
            u64::MAX
        } else {
            valid_before
                .as_u64()
                .saturating_sub(unix_now())
                .saturating_add(2)
        };
        self.settle_timeout.min(Duration::from_secs(until_expiry))
    }
}

/// The span of one settlement, from the trial of its transaction and its claim to its answer,
/// a child of the request's. The
/// lane records the transaction's signer, nonce and hash as it broadcasts; the follower the
/// including block (`Waiters`). Fields are declared here to be recorded there.
fn settlement_span(lane: &Lane) -> tracing::Span {
    let empty = tracing::field::Empty;
    tracing::info_span!(
        "settlement",
        network = lane.network(),
        signer = %evm::hex_bytes(lane.signer_address()),
        nonce = empty,
        transaction = empty,
        block = empty,
        success = empty,
    )
}

/// The Permit2 allowance a Permit2 payment's claim keeps to: the payer's, as read, or for one
/// carrying an EIP-2612 permit, what that permit sets it to (its value: the claim then keeps it
/// alone among the payer's Permit2 payments in flight).
fn permit2_allowance(payment: &Payment<'_>, payer: &Payer) -> U256 {
    let read = payer.permit2_allowance.unwrap_or(U256::MAX);
    match &payment.eip2612 {
        Some(permit) => read.max(permit.value),
        None => read,
    }
}

/// Why a claim that did not fit beside the payer's settlements in flight was refused.
fn refusal(refused: Claim, value: U256, payer: &Payer, limits: &Limits) -> Invalid {
    let (reason, message) = match refused {
        Claim::OverLimit { exposed } if exposed.saturating_add(value) <= payer.balance => (
            Reason::Payload,
            "a smart-wallet payer settles one payment at a time: settle again once its settlement under way is answered".to_string(),
        ),
        Claim::OverLimit { exposed } => (
            Reason::InsufficientFunds,
            format!(
                "payer balance {} does not cover this payment and its {exposed} still being settled",
                payer.balance
            ),
        ),
        Claim::OverAllowance { exposed } => (
            Reason::Permit2Allowance,
            format!(
                "the payer's Permit2 allowance {} does not cover this payment and its {exposed} still being settled through Permit2",
                limits.permit2_allowance
            ),
        ),
        Claim::Permit2Clash(Permit2Clash::Approval) => (
            Reason::Payload,
            "an EIP-2612 permit approving Permit2 rides with this payment or with another Permit2 payment of this payer and token still being settled: the permit sets the allowance and spends the token's one permit nonce, so it is settled alone; settle again once that one is answered".to_string(),
        ),
        Claim::Permit2Clash(Permit2Clash::Nonce) => (
            Reason::Payload,
            "another payment of this payer still being settled uses the same Permit2 nonce (Permit2's nonces are the owner's across all tokens)".to_string(),
        ),
        Claim::Claimed | Claim::Exists(_) | Claim::KeyTaken => {
            unreachable!("`claim` answers these itself")
        }
    };
    Invalid {
        reason,
        message: message.into(),
    }
}

/// The gas limit of a settlement that the trial measured at `tried` gas: with headroom, never
/// under the calldata floor (EIP-7623), never over `bound` (`max_settlement_gas`); a settlement
/// that needs more than `bound` is refused before anything is sent.
fn gas_limit(tried: u64, calldata: &[u8], bound: u64) -> Result<u64, Invalid> {
    let needed = tried.max(erc3009::calldata_floor_gas(calldata));
    if needed > bound {
        return Err(Invalid {
            reason: Reason::Payload,
            message: format!(
                "the settlement needs {needed} gas, above this network's max_settlement_gas ({bound})"
            )
            .into(),
        });
    }
    let limit = needed.saturating_mul(100 + GAS_HEADROOM_PERCENT) / 100;
    Ok(limit.min(bound))
}

/// Whether a request may be told what is known under its payment key: only the same signed
/// authorization, with requirements it meets.
fn bind(digest: H256, payment: &Payment<'_>) -> Result<(), Invalid> {
    if digest != payment.digest {
        return Err(Invalid {
            reason: Reason::Payload,
            message: "authorization nonce already claimed by another authorization".into(),
        });
    }
    check_terms(payment)
}

/// The transaction that settles a payment: `transferWithAuthorization` on the token, or, for a
/// wallet not yet deployed (ERC-6492), the deployment and that call in one Multicall3 call.
struct SettlementCall {
    to: Address,
    data: Bytes,
}

impl SettlementCall {
    fn of(payment: &Payment<'_>) -> Self {
        let (to, transfer) = match payment.method {
            Method::Eip3009 => {
                let smart_wallet = payment.recovered != Some(payment.auth.from);
                let call = erc3009::transfer_with_authorization(
                    &payment.auth,
                    &payment.signature,
                    smart_wallet,
                );
                (payment.token.address, call)
            }
            Method::Permit2 => (permit2::EXACT_PROXY, permit2_settle(payment)),
            Method::Permit2Upto { .. } => (permit2::UPTO_PROXY, permit2_settle(payment)),
        };
        match payment.counterfactual.deployment() {
            Some(deployment) => SettlementCall {
                to: erc6492::MULTICALL3,
                data: erc6492::deploy_then_call(deployment, to, &transfer),
            },
            None => SettlementCall { to, data: transfer },
        }
    }
}

/// The proxy's call: `settle`, or `settleWithPermit` when the payer approves Permit2 by an
/// EIP-2612 permit in the same transaction.
fn permit2_settle(payment: &Payment<'_>) -> Bytes {
    let (auth, signature) = (payment.permit2(), &payment.signature);
    match (payment.method, &payment.eip2612) {
        (Method::Permit2Upto { .. }, None) => {
            permit2::settle_upto(&auth, payment.charge(), signature)
        }
        (Method::Permit2Upto { .. }, Some(permit)) => {
            permit2::settle_upto_with_permit(permit, &auth, payment.charge(), signature)
        }
        (_, None) => permit2::settle(&auth, signature),
        (_, Some(permit)) => permit2::settle_with_permit(permit, &auth, signature),
    }
}

fn new_record(
    payment: &Payment<'_>,
    call: SettlementCall,
    gas_limit: u64,
    asking: &Asking,
) -> Record {
    let valid_before = payment.auth.valid_before.min(U256::from(u64::MAX)).as_u64();
    Record {
        network: payment.network.name.clone(),
        token: payment.token.address,
        payer: payment.auth.from,
        pay_to: payment.auth.to,
        value: payment.charge(),
        nonce: payment.auth.nonce,
        valid_before,
        digest: payment.digest,
        method: payment.method.transfer_method(),
        approves_permit2: payment.eip2612.is_some(),
        via: (call.to != payment.token.address).then_some(call.to),
        sender: match payment.method {
            Method::Permit2Upto { facilitator } => Some(facilitator),
            _ => None,
        },
        calldata: call.data,
        gas_limit,
        request: asking.tag.clone(),
        payment_id: asking.payment_id.clone(),
        state: State::Claimed,
        attempts: Vec::new(),
        outcome: None,
        lost: false,
        finished_at: None,
        svm: None,
    }
}

/// A settlement whose request has done its part (`Settler::begin`): answered, or waiting.
pub struct Begun(Stage);

enum Stage {
    Answered(Settled),
    /// Claimed here and handed to the lane: its progress to wait on.
    Submitted(Box<Pending>, watch::Receiver<Progress>),
    /// Claimed and queued for an instance holding a lane of its network.
    Queued(Box<Pending>, Box<Record>),
    /// Claimed before: what this request may be told of it.
    Known(Box<Pending>, Known),
}

impl Begun {
    pub fn answered(settled: Settled) -> Self {
        Begun(Stage::Answered(settled))
    }
}

/// What a waiting settlement keeps: its key, its deadline and its span.
struct Pending {
    key: PaymentKey,
    deadline: Instant,
    span: tracing::Span,
}

impl Pending {
    /// The wait of `key` until `deadline`, in the span it was begun in.
    fn here(key: PaymentKey, deadline: Instant) -> Box<Self> {
        let span = tracing::Span::current();
        Box::new(Pending {
            key,
            deadline,
            span,
        })
    }
}

/// A payment prepared for its claim, or already answered.
enum Prepared {
    /// The record to claim, and the payer as the chain read saw it.
    Ready(Box<Record>, Payer),
    Answered(Settled),
}

/// What claiming a payment led to.
/// What one try at settling came to (`try_claim`).
enum Attempt {
    /// Claimed here and handed to the lane: its progress to wait on.
    Submitted(watch::Receiver<Progress>),
    /// Claimed and queued for an instance holding a lane of its network.
    Queued(Box<Record>),
    /// Failed before the claim, or settled meanwhile by a duplicate.
    Answered(Settled),
    Known(Known),
    /// Not claimed: the payer's balance does not cover it beside its settlements under way.
    OverLimit(Invalid),
}

enum Claimed {
    /// Claimed, and a lane here signs it.
    Here(watch::Receiver<Progress>),
    /// Claimed and queued for an instance holding a lane of its network.
    Queued,
    Known(Known),
    /// Not claimed: the payer's balance does not cover it beside its settlements under way.
    OverLimit(Invalid),
}

/// How far a settlement ahead of this request went, as far as this request may be told.
enum Known {
    Bound(Found, Caller),
    /// The request is not bound to what is known: judged on its own, it fails.
    Unmet(Invalid),
}

enum Found {
    Running(watch::Receiver<Progress>),
    Finished(Outcome),
    /// Stored without an outcome, and not running in this process.
    Unfinished(Box<Record>),
}

impl Known {
    fn from_running(
        running: Running,
        payment: &Payment<'_>,
        tag: Option<&RequestTag>,
    ) -> Result<Self, SettleError> {
        let caller = caller_of(running.request.as_ref(), tag)?;
        Ok(match bind(running.digest, payment) {
            Err(unmet) => Known::Unmet(unmet),
            Ok(()) => Known::Bound(Found::Running(running.progress), caller),
        })
    }

    fn from_record(
        record: Record,
        payment: &Payment<'_>,
        tag: Option<&RequestTag>,
    ) -> Result<Self, SettleError> {
        let caller = caller_of(record.request.as_ref(), tag)?;
        if let Err(unmet) = bind(record.digest, payment) {
            return Ok(Known::Unmet(unmet));
        }
        Ok(Known::Bound(
            match record.outcome {
                Some(outcome) => Found::Finished(outcome),
                None => Found::Unfinished(Box::new(record)),
            },
            caller,
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::facilitator::outcome::Message;

    #[test]
    fn the_gas_limit_has_headroom_covers_the_calldata_floor_and_keeps_the_bound() {
        let small = [1u8; 100];
        assert_eq!(gas_limit(80_000, &small, 300_000), Ok(100_000));
        // A long signature's calldata: its floor (21,000 + 40 per byte) is above the trial.
        let long = [1u8; 5_000];
        assert_eq!(gas_limit(110_000, &long, 300_000), Ok(276_250));
        // Headroom never takes the limit over the bound.
        assert_eq!(gas_limit(280_000, &small, 300_000), Ok(300_000));
        for (tried, calldata) in [(300_001, &small[..]), (50_000, &[1u8; 8_000][..])] {
            let refused = gas_limit(tried, calldata, 300_000).unwrap_err();
            assert_eq!(refused.reason, Reason::Payload);
            assert!(
                matches!(&refused.message, Message::Text(text) if text.contains("max_settlement_gas"))
            );
        }
    }
}
