//! What a payment comes to, in no version's and no family's words: why it fails (`Invalid`,
//! naming the fields it means by [`Field`], never by text: each version spells them when it
//! raises the answer, so no message is ever rewritten), what settling it came to (`Settled`),
//! and why a settle has no outcome to tell (`SettleError`). The wire layer (`protocol`) renders
//! these; every family's mechanism and the settlement core produce them. It imports neither.

use ethers_core::types::H256;

use crate::chain::{Overloaded, Unreachable};
use crate::ledger::{Outcome, Reason};
use crate::store::StoreError;

/// A field of the request that a refusal names. Its path differs between versions (v1's
/// `paymentRequirements.maxAmountRequired` is v2's `paymentRequirements.amount`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Field {
    Amount,
    Resource,
    PayTo,
    Asset,
    MaxTimeoutSeconds,
    ExtraName,
    ExtraVersion,
    Signature,
    From,
    To,
    Value,
    ValidAfter,
    ValidBefore,
    Nonce,
    /// The payload's authorization object, whichever kind.
    Authorization,
    Permit2From,
    Permit2Token,
    Permit2Amount,
    Permit2Spender,
    Permit2Nonce,
    Permit2Deadline,
    WitnessTo,
    WitnessValidAfter,
    WitnessFacilitator,
}

/// A version's spelling of the fields: the JSON path of each in that version's request.
pub type Spelling = fn(Field) -> &'static str;

/// Why a payment fails, in words a version renders with its own [`Spelling`].
#[derive(Debug, Clone, PartialEq)]
pub enum Message {
    /// Words that name no renamed field: the same in every version.
    Text(String),
    /// A field's value is refused: `<path>: <problem>`.
    Field(Field, String),
    /// Rule 8: `authorization.to` is not the requirements' payTo.
    ToIsNotPayTo,
    /// Rule 9: `authorization.value` is below the amount asked.
    ValueBelowAmount,
    /// Rule 10: `authorization.value` is above the amount asked (exact means exact).
    ValueAboveAmount,
    /// `authorization.from` is the payTo: a self-payment moves no value (access.md 3c).
    SelfPayment,
}

impl Message {
    /// The message as the version with spelling `path` says it.
    pub fn render(&self, path: Spelling) -> String {
        // The terms rules name the amount by its bare name, as the requirements spell it.
        let amount = || path(Field::Amount).rsplit('.').next().unwrap_or_default();
        match self {
            Message::Text(text) => text.clone(),
            Message::Field(field, problem) => format!("{}: {problem}", path(*field)),
            Message::ToIsNotPayTo => format!("authorization.to is not {}", path(Field::PayTo)),
            Message::ValueBelowAmount => format!("authorization.value is below {}", amount()),
            Message::ValueAboveAmount => format!("authorization.value exceeds {}", amount()),
            Message::SelfPayment => format!(
                "authorization.from is {}: a self-payment moves no value, only the facilitator's gas would be spent",
                path(Field::PayTo)
            ),
        }
    }
}

impl From<String> for Message {
    fn from(text: String) -> Self {
        Message::Text(text)
    }
}

impl From<&str> for Message {
    fn from(text: &str) -> Self {
        Message::Text(text.to_string())
    }
}

/// A payment that fails a rule: the rule's reason, and why in typed words.
#[derive(Debug, Clone, PartialEq)]
pub struct Invalid {
    pub reason: Reason,
    pub message: Message,
}

impl Invalid {
    pub fn new(reason: Reason, message: impl Into<Message>) -> Self {
        Invalid {
            reason,
            message: message.into(),
        }
    }

    /// A field's value refused under `reason` (rule 4 or 5).
    pub fn field(reason: Reason, field: Field, problem: impl Into<String>) -> Self {
        Invalid {
            reason,
            message: Message::Field(field, problem.into()),
        }
    }
}

/// What settling a payment came to, in no version's words: each version raises it into its
/// own answer (`protocol`), with the payer and network as its request gave them.
#[derive(Debug, Clone, PartialEq)]
pub struct Settled {
    pub success: bool,
    pub reason: Option<Reason>,
    pub message: Option<Message>,
    /// The settling transaction; `None` when nothing was sent.
    pub transaction: Option<H256>,
}

impl Settled {
    /// A payment refused before anything was sent.
    pub fn failed(failure: Invalid) -> Self {
        Settled {
            success: false,
            reason: Some(failure.reason),
            message: Some(failure.message),
            transaction: None,
        }
    }

    /// A stored outcome.
    pub fn of(outcome: &Outcome) -> Self {
        Settled {
            success: outcome.success,
            reason: outcome.reason,
            message: outcome.message.clone().map(Message::Text),
            transaction: outcome.transaction,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum SettleError {
    #[error(transparent)]
    Unreachable(#[from] Unreachable),
    /// The chain's budget for callers' reads of this kind is spent: busy, try again shortly.
    #[error(transparent)]
    Overloaded(#[from] Overloaded),
    /// Still unknown at the deadline: the hash once broadcast, `None` while still being signed.
    #[error("{}", pending_message(.0))]
    Pending(Option<H256>),
    /// A Solana transaction sent, its outcome still unknown at the deadline: its signature.
    #[error("settlement pending: {0}; settle the same payment again for the outcome")]
    PendingSignature(String),
    /// Nothing was sent and the claim is released: the same payment may be settled again.
    #[error("the settlement was not sent: {0}; settle the same payment again")]
    Abandoned(String),
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The request's idempotency key was first used with another body.
    #[error("Idempotency-Key {0:?} was first used with another request body")]
    KeyReused(String),
    /// The payer's `payment-identifier` id already names another payment of this caller.
    #[error(
        "paymentPayload.extensions.payment-identifier.info.id {0:?} already names another payment"
    )]
    IdentifierReused(String),
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

#[cfg(test)]
mod tests {
    use super::*;

    fn short(field: Field) -> &'static str {
        match field {
            Field::Amount => "requirements.price",
            Field::PayTo => "requirements.to",
            _ => "other",
        }
    }

    #[test]
    fn messages_name_fields_in_the_given_spelling() {
        assert_eq!(
            Message::Field(Field::Amount, "not a number".into()).render(short),
            "requirements.price: not a number"
        );
        assert_eq!(
            Message::ValueBelowAmount.render(short),
            "authorization.value is below price"
        );
        assert_eq!(
            Message::ValueAboveAmount.render(short),
            "authorization.value exceeds price"
        );
        assert_eq!(
            Message::ToIsNotPayTo.render(short),
            "authorization.to is not requirements.to"
        );
        assert_eq!(Message::from("as is").render(short), "as is");
    }
}
