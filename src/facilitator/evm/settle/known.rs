//! What a request is told of a payment claimed before it: a settlement running here (its
//! waiters), or a record in the store (settled, or being settled by another instance). Only
//! the same signed authorization with requirements it meets is bound to what is known; the
//! claimant and its retries are told the outcome, anybody else the transaction, as a failure
//! (the settlement core's `duplicate`).

use std::time::Duration;

use ethers_core::types::H256;
use tokio::sync::watch;
use tokio::time::Instant;

use super::Settler;
use crate::facilitator::evm::verify::{check_terms, Payment};
use crate::facilitator::outcome::{Invalid, SettleError, Settled};
use crate::facilitator::settlement::waiters::{Progress, Running};
use crate::facilitator::settlement::{caller_of, duplicate, pass_on, with_pass, Caller};
use crate::ledger::{Asking, LaneId, Outcome, PaymentKey, Reason, Record, RequestTag};

/// How often a duplicate waiting on a settlement it does not run reads its record again.
const STORED_POLL: Duration = Duration::from_millis(50);

impl Settler {
    /// What a running settlement or the ledger already says of this payment, if anything,
    /// bound to this request.
    pub(super) async fn known(
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
    pub(super) async fn with_pass(
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

    /// The answer to a request for a payment already claimed: the claimant's outcome for the
    /// claimant and its retries; for anybody else, the transaction as a failure.
    pub(super) async fn answer_known(
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
    pub(super) async fn await_stored(
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

    pub(super) async fn wait(
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

/// How far a settlement ahead of this request went, as far as this request may be told.
pub(super) enum Known {
    Bound(Found, Caller),
    /// The request is not bound to what is known: judged on its own, it fails.
    Unmet(Invalid),
}

pub(super) enum Found {
    Running(watch::Receiver<Progress>),
    Finished(Outcome),
    /// Stored without an outcome, and not running in this process.
    Unfinished(Box<Record>),
}

impl Known {
    pub(super) fn from_running(
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

    pub(super) fn from_record(
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
