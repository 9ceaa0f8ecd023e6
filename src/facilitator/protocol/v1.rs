//! x402 version 1 on the wire: its request and answer shapes, its field paths and its reason
//! names. A v1 request is lowered into the version-free [`Request`] by rules 1-3 in v1's terms
//! and then the shared rules 4-5; answers are raised back into v1's names here. Strings stay
//! strings in these shapes: a wrong JSON type is a shape error (HTTP 400), a wrong value inside
//! a string is a failed rule (HTTP 200), and that split is the lowering's.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Number, Value};

use super::values::{ExactEvmPayload, Payload, Scheme, Values};
use crate::evm;
use crate::evm::parse_address;
use crate::facilitator::outcome::Settled;
use crate::facilitator::outcome::{Field, Invalid};
use crate::ledger::Reason;
use ethers_core::utils::to_checksum;

/// A v1 request; `P` is its family's payload (`facilitator::svm::wire` carries Solana's).
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PaymentRequest<P = ExactEvmPayload> {
    pub x402_version: Number,
    pub payment_payload: PaymentPayload<P>,
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
pub struct PaymentPayload<P = ExactEvmPayload> {
    pub x402_version: Number,
    pub scheme: String,
    pub network: String,
    pub payload: P,
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

/// The `/verify` answer; v2's has the same fields.
#[derive(Debug, Clone, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct VerifyResponse {
    pub is_valid: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub invalid_reason: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub invalid_message: Option<String>,
    pub payer: String,
    /// A scheme's own facts about the payment (`batch-settlement`: the channel's snapshot).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub extra: Option<serde_json::Value>,
}

/// The `/settle` answer; v2's has the same fields.
#[derive(Debug, Clone, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct SettleResponse {
    pub success: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error_reason: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error_message: Option<String>,
    pub payer: String,
    pub transaction: String,
    pub network: String,
    /// `upto` (v2): what was charged.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub amount: Option<String>,
    /// A scheme's own facts about the settlement (`batch-settlement`: `channelState`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub extra: Option<serde_json::Value>,
}

/// v1's path of a field in its request.
pub fn path(field: Field) -> &'static str {
    match field {
        Field::Amount => "paymentRequirements.maxAmountRequired",
        Field::Resource => "paymentRequirements.resource",
        Field::PayTo => "paymentRequirements.payTo",
        Field::Asset => "paymentRequirements.asset",
        Field::MaxTimeoutSeconds => "paymentRequirements.maxTimeoutSeconds",
        Field::ExtraName => "paymentRequirements.extra.name",
        Field::ExtraVersion => "paymentRequirements.extra.version",
        Field::Signature => "paymentPayload.payload.signature",
        Field::From => "paymentPayload.payload.authorization.from",
        Field::To => "paymentPayload.payload.authorization.to",
        Field::Value => "paymentPayload.payload.authorization.value",
        Field::ValidAfter => "paymentPayload.payload.authorization.validAfter",
        Field::ValidBefore => "paymentPayload.payload.authorization.validBefore",
        Field::Nonce => "paymentPayload.payload.authorization.nonce",
        Field::Authorization => "paymentPayload.payload.authorization",
        // Only v2 carries Permit2; the paths are the same in both.
        Field::Permit2From => "paymentPayload.payload.permit2Authorization.from",
        Field::Permit2Token => "paymentPayload.payload.permit2Authorization.permitted.token",
        Field::Permit2Amount => "paymentPayload.payload.permit2Authorization.permitted.amount",
        Field::Permit2Spender => "paymentPayload.payload.permit2Authorization.spender",
        Field::Permit2Nonce => "paymentPayload.payload.permit2Authorization.nonce",
        Field::Permit2Deadline => "paymentPayload.payload.permit2Authorization.deadline",
        Field::WitnessTo => "paymentPayload.payload.permit2Authorization.witness.to",
        Field::WitnessValidAfter => {
            "paymentPayload.payload.permit2Authorization.witness.validAfter"
        }
        Field::WitnessFacilitator => {
            "paymentPayload.payload.permit2Authorization.witness.facilitator"
        }
    }
}

/// Rules 1-3 in v1's terms: the strings the shared rules 4-5 read, or the first failure.
pub fn values(request: &PaymentRequest) -> Result<Values<'_>, Invalid> {
    let payload = &request.payment_payload;
    let required = &request.payment_requirements;
    let is_one = |n: &Number| n.as_u64() == Some(1);
    if !is_one(&request.x402_version) || !is_one(&payload.x402_version) {
        return Err(Invalid::new(Reason::X402Version, "x402Version must be 1"));
    }
    if payload.scheme != "exact" || required.scheme != "exact" {
        return Err(Invalid::new(
            Reason::Scheme,
            "scheme must be \"exact\" in payload and requirements",
        ));
    }
    if payload.network != required.network {
        return Err(Invalid::new(
            Reason::Network,
            "payload and requirements name different networks",
        ));
    }
    // v1 names a network by its configured name; whether it is served is rule 3's last test,
    // made by the shared parse.
    Ok(Values {
        network: &required.network,
        scheme: Scheme::Exact,
        amount: &required.max_amount_required,
        resource: &required.resource,
        pay_to: &required.pay_to,
        asset: &required.asset,
        max_timeout_seconds: &required.max_timeout_seconds,
        extra: required.extra.as_ref(),
        payload: Payload::from(&payload.payload),
    })
}

/// `payer` of every answer: the checksummed `from`, or the string as sent.
pub fn payer_of(payload: Payload<'_>) -> String {
    let from = payload.payer().unwrap_or_default();
    parse_address(from)
        .map(|a| to_checksum(&a, None))
        .unwrap_or_else(|| from.to_string())
}

/// The `/verify` answer for a verdict on `request`.
pub fn verify_answer(request: &PaymentRequest, verdict: Result<(), Invalid>) -> VerifyResponse {
    let failure = verdict.err();
    VerifyResponse {
        is_valid: failure.is_none(),
        invalid_reason: failure.as_ref().map(|f| verify_reason(f.reason)),
        invalid_message: failure.map(|f| f.message.render(path)),
        payer: payer_of(Payload::from(&request.payment_payload.payload)),
        extra: None,
    }
}

/// The `/settle` answer for what settling `request` came to, in v1's names.
pub fn settle_answer(request: &PaymentRequest, settled: Settled) -> SettleResponse {
    SettleResponse {
        success: settled.success,
        error_reason: settled.reason.map(|r| settle_reason(r).to_string()),
        error_message: settled.message.map(|m| m.render(path)),
        payer: payer_of(Payload::from(&request.payment_payload.payload)),
        transaction: settled.transaction.map(evm::hex_bytes).unwrap_or_default(),
        network: request.payment_requirements.network.clone(),
        amount: None,
        extra: None,
    }
}

/// v1's verify name of a reason (x402-facilitator.md §2).
pub fn verify_reason(reason: Reason) -> &'static str {
    match reason {
        Reason::X402Version => "invalid_x402_version",
        Reason::Scheme => "invalid_scheme",
        Reason::Network => "invalid_network",
        Reason::PaymentRequirements => "invalid_payment_requirements",
        Reason::Payload => "invalid_payload",
        Reason::FromKyt => "invalid_exact_evm_payload_authorization_from_address_kyt",
        Reason::ToKyt => "invalid_exact_evm_payload_authorization_to_address_kyt",
        Reason::TypedDataMessage => "invalid_exact_evm_payload_authorization_typed_data_message",
        Reason::ValueTooLow => "invalid_exact_evm_payload_authorization_value_too_low",
        Reason::Value => "invalid_exact_evm_payload_authorization_value",
        Reason::ValidAfter => "invalid_exact_evm_payload_authorization_valid_after",
        Reason::ValidBefore => "invalid_exact_evm_payload_authorization_valid_before",
        Reason::Signature => "invalid_exact_evm_payload_signature",
        Reason::SignatureAddress => "invalid_exact_evm_payload_signature_address",
        Reason::InsufficientFunds => "insufficient_funds",
        // v1's list has no name for it.
        Reason::AlreadySettled | Reason::Erc6492Factory => "invalid_payload",
        // v1 carries no Permit2 payment.
        Reason::Permit2Token
        | Reason::Permit2Spender
        | Reason::Permit2Allowance
        | Reason::UptoFacilitator
        | Reason::UptoOverPermit
        | Reason::UptoPermitAmount
        | Reason::Eip2612Format
        | Reason::Eip2612From
        | Reason::Eip2612Asset
        | Reason::Eip2612Spender
        | Reason::Eip2612Amount
        | Reason::Eip2612Deadline => "invalid_payload",
    }
}

/// v1's settle name of a reason: the settle list lacks two verify reasons; they fold into their
/// nearest neighbours. Also the names of the status route, which speaks no version.
pub fn settle_reason(reason: Reason) -> &'static str {
    match reason {
        Reason::ValueTooLow => verify_reason(Reason::Value),
        Reason::Signature => verify_reason(Reason::SignatureAddress),
        other => verify_reason(other),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::facilitator::outcome::Message;

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
        for reason in Reason::ALL {
            assert!(SETTLE_LIST.contains(&settle_reason(reason)), "{reason:?}");
        }
        assert_eq!(
            settle_reason(Reason::ValueTooLow),
            "invalid_exact_evm_payload_authorization_value"
        );
        assert_eq!(
            settle_reason(Reason::Signature),
            "invalid_exact_evm_payload_signature_address"
        );
    }

    #[test]
    fn messages_name_v1_fields() {
        let render = |message: Message| message.render(path);
        assert_eq!(
            render(Message::Field(
                Field::Amount,
                "not a decimal amount above 0".into()
            )),
            "paymentRequirements.maxAmountRequired: not a decimal amount above 0"
        );
        assert_eq!(
            render(Message::Field(
                Field::Resource,
                "not an https:// URL".into()
            )),
            "paymentRequirements.resource: not an https:// URL"
        );
        assert_eq!(
            render(Message::Field(Field::ExtraName, "x".into())),
            "paymentRequirements.extra.name: x"
        );
        assert_eq!(
            render(Message::Field(Field::ValidAfter, "x".into())),
            "paymentPayload.payload.authorization.validAfter: x"
        );
        assert_eq!(
            render(Message::ValueBelowAmount),
            "authorization.value is below maxAmountRequired"
        );
        assert_eq!(
            render(Message::ValueAboveAmount),
            "authorization.value exceeds maxAmountRequired"
        );
        assert_eq!(
            render(Message::ToIsNotPayTo),
            "authorization.to is not paymentRequirements.payTo"
        );
    }
}
