//! x402 v1 wire types. Strings stay strings here: a wrong JSON type is a shape error (HTTP 400),
//! a wrong value inside a string is a failed check (HTTP 200), and that split happens in verify.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Number, Value};

use super::verify::Invalid;
use crate::ledger::Reason;

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PaymentRequest {
    pub x402_version: Number,
    pub payment_payload: PaymentPayload,
    pub payment_requirements: PaymentRequirements,
}

impl PaymentRequest {
    /// Paths that must be JSON objects (see `parse_body_with`).
    pub const OBJECTS: &'static [&'static str] = &[
        "",
        "paymentPayload",
        "paymentPayload.payload",
        "paymentPayload.payload.authorization",
        "paymentRequirements",
    ];
}

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PaymentPayload {
    pub x402_version: Number,
    pub scheme: String,
    pub network: String,
    pub payload: ExactEvmPayload,
}

#[derive(Debug, Clone, Deserialize)]
pub struct ExactEvmPayload {
    pub signature: String,
    pub authorization: Authorization,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Authorization {
    pub from: String,
    pub to: String,
    pub value: String,
    pub valid_after: String,
    pub valid_before: String,
    pub nonce: String,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PaymentRequirements {
    pub scheme: String,
    pub network: String,
    pub max_amount_required: String,
    pub resource: String,
    pub description: String,
    pub mime_type: String,
    #[serde(default)]
    pub output_schema: Option<Map<String, Value>>,
    pub pay_to: String,
    pub max_timeout_seconds: Number,
    pub asset: String,
    #[serde(default)]
    pub extra: Option<Map<String, Value>>,
}

#[derive(Debug, Clone, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct VerifyResponse {
    pub is_valid: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub invalid_reason: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub invalid_message: Option<String>,
    pub payer: String,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct SettleResponse {
    pub success: bool,
    /// The typed reason behind `error_reason`, for the wire layer of each protocol version.
    #[serde(skip)]
    pub reason: Option<Reason>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error_reason: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error_message: Option<String>,
    pub payer: String,
    pub transaction: String,
    pub network: String,
}

impl SettleResponse {
    /// The answer for a payment refused before settlement, in v1's names.
    pub fn refused(failure: &Invalid, payer: String, network: String) -> Self {
        SettleResponse {
            success: false,
            reason: Some(failure.reason),
            error_reason: Some(failure.reason.settle_name().to_string()),
            error_message: Some(failure.message.clone()),
            payer,
            transaction: String::new(),
            network,
        }
    }
}

/// `GET /settlements/{network}/{asset}/{from}/{nonce}`: what happened to one payment.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SettlementStatus {
    pub network: String,
    pub asset: String,
    pub payer: String,
    pub nonce: String,
    /// claimed, signed, sent, included, final, reverted or expired.
    pub state: &'static str,
    pub transaction: Option<String>,
    pub signer: Option<String>,
    pub signer_nonce: Option<u64>,
    pub block: Option<u64>,
    pub block_hash: Option<String>,
    /// Blocks deep the inclusion is (1 = in the head block); 0 while not included.
    pub confirmations: u64,
    pub outcome: Option<StatusOutcome>,
    /// A success was answered and the transaction can no longer land.
    pub lost: bool,
}

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct StatusOutcome {
    pub success: bool,
    pub transaction: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error_reason: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error_message: Option<String>,
}

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SupportedKind {
    pub x402_version: u32,
    pub scheme: &'static str,
    pub network: String,
}

/// `GET /supported`. `extensions` and `signers` are x402 v2's fields: present when v2 is served.
#[derive(Debug, Clone, Serialize)]
pub struct SupportedResponse {
    pub kinds: Vec<SupportedKind>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub extensions: Option<Vec<&'static str>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub signers: Option<std::collections::BTreeMap<&'static str, Vec<String>>>,
}

/// The wire names of a [`Reason`], per list (x402-facilitator.md §2).
impl Reason {
    /// Every reason, for tests that check each has a name.
    #[cfg(test)]
    pub const ALL: [Reason; 16] = [
        Reason::X402Version,
        Reason::Scheme,
        Reason::Network,
        Reason::PaymentRequirements,
        Reason::Payload,
        Reason::FromKyt,
        Reason::ToKyt,
        Reason::TypedDataMessage,
        Reason::ValueTooLow,
        Reason::Value,
        Reason::ValidAfter,
        Reason::ValidBefore,
        Reason::Signature,
        Reason::SignatureAddress,
        Reason::InsufficientFunds,
        Reason::AlreadySettled,
    ];

    pub fn verify_name(self) -> &'static str {
        match self {
            Reason::X402Version => "invalid_x402_version",
            Reason::Scheme => "invalid_scheme",
            Reason::Network => "invalid_network",
            Reason::PaymentRequirements => "invalid_payment_requirements",
            Reason::Payload => "invalid_payload",
            Reason::FromKyt => "invalid_exact_evm_payload_authorization_from_address_kyt",
            Reason::ToKyt => "invalid_exact_evm_payload_authorization_to_address_kyt",
            Reason::TypedDataMessage => {
                "invalid_exact_evm_payload_authorization_typed_data_message"
            }
            Reason::ValueTooLow => "invalid_exact_evm_payload_authorization_value_too_low",
            Reason::Value => "invalid_exact_evm_payload_authorization_value",
            Reason::ValidAfter => "invalid_exact_evm_payload_authorization_valid_after",
            Reason::ValidBefore => "invalid_exact_evm_payload_authorization_valid_before",
            Reason::Signature => "invalid_exact_evm_payload_signature",
            Reason::SignatureAddress => "invalid_exact_evm_payload_signature_address",
            Reason::InsufficientFunds => "insufficient_funds",
            Reason::AlreadySettled => "invalid_payload",
        }
    }

    /// The settle list lacks two verify reasons; they fold into their nearest neighbours.
    pub fn settle_name(self) -> &'static str {
        match self {
            Reason::ValueTooLow => Reason::Value.verify_name(),
            Reason::Signature => Reason::SignatureAddress.verify_name(),
            other => other.verify_name(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settle_names_are_all_in_the_settle_list() {
        const SETTLE_LIST: &[&str] = &[
            "insufficient_funds",
            "invalid_scheme",
            "invalid_network",
            "invalid_x402_version",
            "invalid_payment_requirements",
            "invalid_payload",
            "invalid_exact_evm_payload_authorization_value",
            "invalid_exact_evm_payload_authorization_valid_after",
            "invalid_exact_evm_payload_authorization_valid_before",
            "invalid_exact_evm_payload_authorization_typed_data_message",
            "invalid_exact_evm_payload_authorization_from_address_kyt",
            "invalid_exact_evm_payload_authorization_to_address_kyt",
            "invalid_exact_evm_payload_signature_address",
        ];
        use Reason::*;
        for reason in Reason::ALL {
            assert!(SETTLE_LIST.contains(&reason.settle_name()), "{reason:?}");
        }
        assert_eq!(
            ValueTooLow.settle_name(),
            "invalid_exact_evm_payload_authorization_value"
        );
        assert_eq!(
            Signature.settle_name(),
            "invalid_exact_evm_payload_signature_address"
        );
    }
}
