//! Settlement: verify -> claim in the ledger -> a lane signs, stores and broadcasts -> the lane
//! follows the chain until the transaction is `confirmations` deep (answer) and then
//! `finality_depth` deep (final). The HTTP caller waits on the answer within its deadline; the
//! settlement itself lives in its lane and, through the ledger, survives the process.
//!
//! An answer is handed only to a request that carries the settled authorization (the same
//! EIP-712 digest) and whose requirements that authorization meets: a success can never be given
//! to a merchant whose payment it is not. The transaction and record a claim stores are
//! `call`'s; what a request is told of a payment claimed before it is `known`'s, through the
//! settlement core shared with every family.

mod call;
mod calls;
mod known;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use ethers_core::types::U256;
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;
use tracing::Instrument;

use super::lane::{Lane, Lanes, Reservation};
use super::request::{Method, Request};
use super::verify::{Payer, Payment, Trial, Tried, Verifier};
use super::worker::Worker;
use crate::chain::{Budget, Unreachable};
use crate::clock::unix_now;
use crate::evm;
use crate::facilitator::outcome::{Invalid, SettleError, Settled};
use crate::facilitator::settlement::answer_times::AnswerTimes;
use crate::facilitator::settlement::recheck::{exposure_may_clear, next_head, MAX_RECHECKS};
use crate::facilitator::settlement::waiters::{Progress, Waiters};
use crate::facilitator::settlement::{key_taken, pass_on, ClaimOn};
use crate::ledger::Reason;
use crate::ledger::{Asking, EvmRecord, LaneId, PaymentKey, Record};
use crate::store::{Claim, Lease, Limits, Storage, StoreError};
use call::{gas_limit, new_record, permit2_allowance, refusal, SettlementCall};
use known::Known;

/// The settlement ledger, lanes and leases, in whichever backend is configured.
pub type Ledger = Storage;

/// Who this instance is when it holds a lane, and how long a lease lasts unrenewed.
#[derive(Debug, Clone)]
pub struct LeaseSettings {
    pub holder: String,
    pub ttl: Duration,
}

/// How often finished records older than the retention are pruned.
const PRUNE_EVERY: Duration = Duration::from_secs(3600);

pub struct Settler {
    verifier: Arc<Verifier>,
    ledger: Ledger,
    lanes: Arc<Lanes>,
    waiters: Arc<Waiters>,
    /// The lane workers' queues until `start` hands them to their workers.
    queues: Mutex<Vec<(Arc<Lane>, mpsc::Receiver<EvmRecord>)>>,
    settle_timeout: Duration,
    retention: Duration,
    lease: LeaseSettings,
}

impl Settler {
    pub fn new(
        verifier: Arc<Verifier>,
        ledger: Ledger,
        lanes: Vec<(Arc<Lane>, mpsc::Receiver<EvmRecord>)>,
        settle_timeout: Duration,
        retention: Duration,
        lease: LeaseSettings,
        answer_times: AnswerTimes,
    ) -> Arc<Self> {
        let handles = lanes.iter().map(|(l, _)| l.clone()).collect();
        Arc::new(Self {
            verifier,
            ledger,
            lanes: Arc::new(Lanes::new(handles, answer_times)),
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
        let mut by_lane: std::collections::HashMap<LaneId, Vec<EvmRecord>> = Default::default();
        for record in self.ledger.unfinished().await? {
            let Ok(record) = EvmRecord::try_from(record) else {
                // A Solana settlement: the Solana family follows it (`facilitator::svm`).
                continue;
            };
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
                let outcome = Box::pin(self.await_stored(record.into_record(), pending.deadline));
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

/// A settlement whose request has done its part (`Settler::begin`): answered, or waiting.
pub struct Begun(Stage);

enum Stage {
    Answered(Settled),
    /// Claimed here and handed to the lane: its progress to wait on.
    Submitted(Box<Pending>, watch::Receiver<Progress>),
    /// Claimed and queued for an instance holding a lane of its network.
    Queued(Box<Pending>, Box<EvmRecord>),
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
    Ready(Box<EvmRecord>, Payer),
    Answered(Settled),
}

/// What claiming a payment led to.
/// What one try at settling came to (`try_claim`).
enum Attempt {
    /// Claimed here and handed to the lane: its progress to wait on.
    Submitted(watch::Receiver<Progress>),
    /// Claimed and queued for an instance holding a lane of its network.
    Queued(Box<EvmRecord>),
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
