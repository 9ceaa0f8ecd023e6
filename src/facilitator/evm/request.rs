//! The version-free request and verdict. A [`Request`] is a payment as verify and settle take it,
//! whichever x402 version carried it: every value typed, and the rules that need only the
//! request and the served configuration (x402-facilitator.md §2, rules 1-5) passed. A refusal
//! names the fields it means by [`Field`], never by text: each version spells them when it
//! raises the answer, so no message is ever rewritten.

use ethers_core::types::{Address, H256, U256};

use crate::evm::erc3009::TransferAuthorization;
use crate::evm::permit2::Eip2612Permit;
use crate::ledger::{Reason, TransferMethod};

/// One payment, parsed: what every rule from rule 6 on and the settlement read.
#[derive(Debug, Clone, PartialEq)]
pub struct Request {
    /// The configured name of the served network the payment is for.
    pub network: String,
    /// A token configured for `network`.
    pub asset: Address,
    pub pay_to: Address,
    /// What the requirements ask; above 0.
    pub amount: U256,
    pub resource: String,
    pub max_timeout_seconds: u64,
    /// What the payer signed. A Permit2 authorization is carried in the same terms: its owner,
    /// its witness's `to` and `validAfter`, its amount, its deadline and its nonce.
    pub authorization: TransferAuthorization,
    /// How the funds move.
    pub method: Method,
    /// A Permit2 payer's EIP-2612 approval of Permit2, submitted in the settlement itself
    /// (x402 v2's `eip2612GasSponsoring`).
    pub eip2612: Option<Eip2612Permit>,
    /// Non-empty, and no longer than `facilitator.max_signature_bytes`.
    pub signature: Vec<u8>,
}

/// How a payment's funds move, as its payload says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Method {
    /// `transferWithAuthorization` on the token (ERC-3009).
    Eip3009,
    /// Permit2's `permitWitnessTransferFrom`, through x402's exact proxy as the spender.
    Permit2,
    /// x402's `upto` scheme: Permit2 through the upto proxy, which transfers what the
    /// requirements charge (at most the permitted amount) when `facilitator` sends it.
    Permit2Upto { facilitator: Address },
}

impl Method {
    /// Through Permit2, `exact` or `upto`.
    pub fn is_permit2(self) -> bool {
        matches!(self, Method::Permit2 | Method::Permit2Upto { .. })
    }

    /// How the ledger stores it: `upto` moves funds through Permit2 too.
    pub fn transfer_method(self) -> TransferMethod {
        match self {
            Method::Eip3009 => TransferMethod::Eip3009,
            Method::Permit2 | Method::Permit2Upto { .. } => TransferMethod::Permit2,
        }
    }

    /// Its name in `transfer_methods`.
    pub fn name(self) -> &'static str {
        match self {
            Method::Eip3009 => "eip3009",
            Method::Permit2 | Method::Permit2Upto { .. } => "permit2",
        }
    }
}

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

/// A token the facilitator settles, as configured.
pub struct TokenInfo {
    pub address: Address,
    pub eip712_name: String,
    pub eip712_version: String,
    pub domain_separator: H256,
    /// `transfer_methods`: ERC-3009 (`transferWithAuthorization`), Permit2, or both.
    pub eip3009: bool,
    pub permit2: bool,
}

/// What the lowering of a request needs to know of the configuration.
pub trait Served {
    /// The tokens of a served network; `None` when the network is not served.
    fn tokens(&self, network: &str) -> Option<&[TokenInfo]>;
    /// `facilitator.allow_http_resource`: rule 4 also accepts `http://` resources.
    fn allow_http_resource(&self) -> bool;
    /// `facilitator.max_signature_bytes`: longer signatures fail rule 5.
    fn max_signature_bytes(&self) -> usize;
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
