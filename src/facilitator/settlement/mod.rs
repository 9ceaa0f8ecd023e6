//! What every family's settlement shares, in no family's words: who a request is to a payment
//! already claimed (the claimant, a retry under its `Idempotency-Key`, or the identical request
//! a pending answer passed the outcome on to; anybody else), what anybody else is told (never
//! the success: one success per payment, access.md §1), the passes a pending answer grants,
//! the exposure recheck of a claim refused beside the payer's settlements under way, and the
//! callers waiting on a settlement under way here (`waiters`). Each family's mechanism
//! (`facilitator::evm`, `facilitator::svm`) signs, sends and follows; this core decides what a
//! caller is told.

pub mod answer_times;
pub mod cooldown;
pub mod recheck;
pub mod waiters;

use crate::facilitator::outcome::{Message, SettleError, Settled};
use crate::ledger::{Asking, PaymentKey, Reason, Record, RequestTag, TagKind};
use crate::store::{Storage, StoreError};

/// Who a request is to the settlement of its payment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Caller {
    /// The request that claimed the payment, or a retry of it.
    Claimant,
    /// Any other request carrying the same payment.
    Another,
}

/// What verify says of a payment whose nonce is claimed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClaimOn {
    BeingSettled,
    Settled,
}

/// Who a request is to the settlement of its payment: the request that claimed it (the same
/// `Idempotency-Key`: a retry), or another one. A header key claimed with another body is an
/// error. The payer's `payment-identifier` never makes a claimant: the same payment under it
/// is a duplicate like any other (access.md §1).
pub fn caller_of(
    claimed_by: Option<&RequestTag>,
    tag: Option<&RequestTag>,
) -> Result<Caller, SettleError> {
    match (claimed_by, tag) {
        (Some(first), Some(this))
            if first.key == this.key
                && first.kind == TagKind::Header
                && this.kind == TagKind::Header =>
        {
            match first.body == this.body {
                true => Ok(Caller::Claimant),
                false => Err(SettleError::KeyReused(this.key.clone())),
            }
        }
        _ => Ok(Caller::Another),
    }
}

/// A request the claimant's pending answer passed the outcome on to is the claimant now
/// (access.md §1); the store hands each pass to one request.
pub async fn with_pass(
    ledger: &Storage,
    caller: Caller,
    key: &PaymentKey,
    asking: &Asking,
) -> Result<Caller, StoreError> {
    match caller {
        Caller::Another if ledger.take_pass(key, &asking.pass).await? => Ok(Caller::Claimant),
        caller => Ok(caller),
    }
}

/// An answer to a settle, as far as whether it tells its caller "pending".
pub trait Answer {
    fn pending(&self) -> bool;
}

impl Answer for Result<Settled, SettleError> {
    fn pending(&self) -> bool {
        matches!(self, Err(SettleError::Pending(_)))
    }
}

/// A claimant told "pending" passes the outcome on to its identical next request.
pub async fn pass_on<A: Answer>(
    ledger: &Storage,
    outcome: A,
    key: &PaymentKey,
    asking: &Asking,
) -> A {
    if outcome.pending() && asking.passes_on() {
        if let Err(e) = ledger.grant_pass(key, &asking.pass).await {
            tracing::warn!(payment = %key, error = %e, "could not keep the pending answer's pass");
        }
    }
    outcome
}

/// The answer to a claim refused for its request key: a header's key, or the payer's
/// `payment-identifier` id, already names another payment.
pub fn key_taken(record: &Record) -> SettleError {
    match (&record.request, &record.payment_id) {
        (Some(tag), Some(id)) if tag.kind == TagKind::PaymentIdentifier => {
            SettleError::IdentifierReused(id.clone())
        }
        (tag, _) => {
            SettleError::KeyReused(tag.as_ref().map_or_else(String::new, |t| t.key.clone()))
        }
    }
}

/// What another request than the claimant is told: never the success, only which
/// transaction settles the payment (access.md §1).
pub fn duplicate(outcome: Result<Settled, SettleError>) -> Result<Settled, SettleError> {
    let (transaction, message) = match outcome {
        Ok(settled) if settled.success => {
            let hash = settled
                .transaction
                .map(|hash| format!("{hash:#x}"))
                .unwrap_or_default();
            (settled.transaction, format!("already settled by {hash}"))
        }
        Err(SettleError::Pending(Some(hash))) => {
            let message = format!("already being settled by {hash:#x}");
            (Some(hash), message)
        }
        other => return other,
    };
    Ok(Settled {
        success: false,
        reason: Some(Reason::AlreadySettled),
        message: Some(Message::Text(message)),
        transaction,
    })
}

#[cfg(test)]
mod tests {
    use ethers_core::types::H256;

    use super::*;

    #[test]
    fn a_duplicate_is_told_the_transaction_in_full_hex_never_the_success() {
        let hash = H256::from_low_u64_be(0xabc);
        let full = format!("0x{}abc", "0".repeat(61));
        let settled = Settled {
            success: true,
            reason: None,
            message: None,
            transaction: Some(hash),
        };
        let told = duplicate(Ok(settled)).unwrap();
        assert!(!told.success);
        assert_eq!(told.reason, Some(Reason::AlreadySettled));
        assert_eq!(
            told.message,
            Some(Message::Text(format!("already settled by {full}")))
        );
        let told = duplicate(Err(SettleError::Pending(Some(hash)))).unwrap();
        assert_eq!(
            told.message,
            Some(Message::Text(format!("already being settled by {full}")))
        );
        assert!(matches!(
            duplicate(Err(SettleError::Pending(None))),
            Err(SettleError::Pending(None))
        ));
    }
}
