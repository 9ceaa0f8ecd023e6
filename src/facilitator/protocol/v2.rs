//! x402 version 2 on the wire: its request shapes, its field paths, its CAIP-2 network names and
//! its reason names. A v2 request yields the strings its family's mechanism lowers after the
//! rules only v2 has; answers are raised back into v2's names (in v1's answer shapes, whose fields v2
//! kept). Nothing past this module knows which version carried a payment, so the ledger binds a
//! v2 payment and its v1 replay alike.
//!
//! Rule order, first failure wins: x402Version (1), scheme (2), network (3), then v2's own
//! requirement rules (4: `accepted` agrees with `paymentRequirements`, a resource is named), then
//! the shared rules 4 and 5 (`values`).

use std::collections::BTreeMap;

use serde::Deserialize;
use serde_json::{Map, Number, Value};

use super::eip2612;
use super::v1::{self, SettleResponse, VerifyResponse};
use super::values::{ExactEvmPayloadV2, Payload, Scheme, Values};
use crate::evm;
use crate::facilitator::outcome::{Field, Invalid};
use crate::facilitator::outcome::{SettleError, Settled};
use crate::ledger::Reason;

/// `eip155:<chain id>`: the CAIP-2 namespace of EVM chains.
const EIP155: &str = "eip155:";

/// The extension whose `info.id` names one payment for its retries: a settle carrying it is
/// treated as one carrying that id in an `Idempotency-Key` header (access.md §1).
pub const PAYMENT_IDENTIFIER: &str = "payment-identifier";

/// A v2 request; `P` is its family's payload (`facilitator::svm::wire` carries Solana's).
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PaymentRequest<P = ExactEvmPayloadV2> {
    /// The spec's own examples leave it out; the official client sends it.
    #[serde(default)]
    pub x402_version: Option<Number>,
    pub payment_payload: PaymentPayload<P>,
    pub payment_requirements: PaymentRequirements,
}

impl PaymentRequest {
    /// Paths that must be JSON objects (see `parse_body_with`).
    pub const OBJECTS: &'static [&'static str] = &[
        "",
        "paymentPayload",
        "paymentPayload.resource",
        "paymentPayload.accepted",
        "paymentPayload.payload",
        "paymentPayload.payload.authorization",
        "paymentPayload.payload.permit2Authorization",
        "paymentPayload.payload.permit2Authorization.permitted",
        "paymentPayload.payload.permit2Authorization.witness",
        "paymentPayload.extensions",
        "paymentRequirements",
    ];
}

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PaymentPayload<P = ExactEvmPayloadV2> {
    pub x402_version: Number,
    #[serde(default)]
    pub resource: Option<ResourceInfo>,
    pub accepted: PaymentRequirements,
    pub payload: P,
    /// Extensions the client echoes; routerd reads `payment-identifier`, `eip2612GasSponsoring`
    /// and `bazaar` (README: x402 v2 extensions).
    #[serde(default)]
    pub extensions: Option<Map<String, Value>>,
}

impl<P> PaymentPayload<P> {
    /// The `payment-identifier` extension's id, when the client sent one: 16 to 128 characters
    /// of `[A-Za-z0-9_-]`, as the extension's schema says. Anything else names the field.
    pub fn payment_identifier(&self) -> Result<Option<&str>, String> {
        const FIELD: &str = "paymentPayload.extensions.payment-identifier.info.id";
        let id = self
            .extensions
            .as_ref()
            .and_then(|e| e.get(PAYMENT_IDENTIFIER))
            .and_then(|e| e.get("info"))
            .and_then(|info| info.get("id"));
        let Some(id) = id else {
            return Ok(None);
        };
        let valid = |id: &str| {
            (16..=128).contains(&id.len())
                && id
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
        };
        match id.as_str() {
            Some(id) if valid(id) => Ok(Some(id)),
            _ => Err(format!(
                "{FIELD}: expected 16 to 128 characters of [A-Za-z0-9_-]"
            )),
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ResourceInfo {
    pub url: String,
    #[serde(default)]
    pub description: Option<String>,
    #[serde(default)]
    pub mime_type: Option<String>,
    /// The bazaar's service metadata, read as any JSON: a field that breaks its rule is dropped
    /// from the catalogue (`discovery::sanitize`), never a reason to refuse the payment. Boxed:
    /// rarely sent, and a request stays small.
    #[serde(default)]
    pub service_name: Option<Box<Value>>,
    #[serde(default)]
    pub tags: Option<Box<Value>>,
    #[serde(default)]
    pub icon_url: Option<Box<Value>>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PaymentRequirements {
    pub scheme: String,
    pub network: String,
    pub amount: String,
    pub asset: String,
    pub pay_to: String,
    pub max_timeout_seconds: Number,
    #[serde(default)]
    pub extra: Option<Map<String, Value>>,
}

/// The CAIP-2 name of a chain.
pub fn network_id(chain_id: u64) -> String {
    format!("{EIP155}{chain_id}")
}

/// The served network a CAIP-2 name stands for: `eip155:` and the decimal chain id of a served
/// chain, nothing else (no leading zeros, no configured names).
pub fn served_network<'a>(
    caip2: &str,
    by_chain_id: &'a BTreeMap<u64, String>,
) -> Option<&'a String> {
    let id = caip2.strip_prefix(EIP155)?;
    if id.is_empty() || id.starts_with('0') || !id.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    by_chain_id.get(&id.parse().ok()?)
}

/// v2's path of a field in its request: v1's, where v2 neither moved nor renamed it.
pub fn path(field: Field) -> &'static str {
    match field {
        Field::Amount => "paymentRequirements.amount",
        Field::Resource => "paymentPayload.resource.url",
        other => v1::path(other),
    }
}

/// v2's own rules: the strings the shared rules 4-5 read, or the first failure.
/// `by_chain_id` maps served chain ids to configured network names.
pub fn values<'a>(
    request: &'a PaymentRequest,
    by_chain_id: &'a BTreeMap<u64, String>,
) -> Result<Values<'a>, Invalid> {
    let payload = &request.payment_payload;
    let required = &request.payment_requirements;
    let (network, resource, scheme) = check(request, by_chain_id)?;
    Ok(Values {
        network,
        scheme,
        amount: &required.amount,
        resource: &resource.url,
        pay_to: &required.pay_to,
        asset: &required.asset,
        max_timeout_seconds: &required.max_timeout_seconds,
        extra: required.extra.as_ref(),
        payload: Payload::from(&payload.payload),
    })
}

/// The `eip2612GasSponsoring` extension the payload carries, if any.
pub fn eip2612_extension<P>(request: &PaymentRequest<P>) -> Option<&Value> {
    let extensions = request.payment_payload.extensions.as_ref();
    extensions.and_then(|e| e.get(eip2612::KEY))
}

/// Rules 1-3 in v2's terms and v2's own requirement rules: the configured name of the served
/// network, the resource paid for, and the scheme (`exact`, or `upto` through Permit2).
fn check<'a>(
    request: &'a PaymentRequest,
    by_chain_id: &'a BTreeMap<u64, String>,
) -> Result<(&'a str, &'a ResourceInfo, Scheme), Invalid> {
    let payload = &request.payment_payload;
    let accepted = &payload.accepted;
    let required = &request.payment_requirements;
    let is_two = |n: &Number| n.as_u64() == Some(2);
    if !is_two(&payload.x402_version) || request.x402_version.as_ref().is_some_and(|n| !is_two(n)) {
        return Err(invalid(Reason::X402Version, "x402Version must be 2"));
    }
    let scheme = match (accepted.scheme.as_str(), required.scheme.as_str()) {
        ("exact", "exact") => Scheme::Exact,
        ("upto", "upto") => Scheme::Upto,
        _ => {
            return Err(invalid(
                Reason::Scheme,
                "scheme must be \"exact\" or \"upto\", the same in paymentPayload.accepted and paymentRequirements",
            ))
        }
    };
    if accepted.network != required.network {
        return Err(invalid(
            Reason::Network,
            "paymentPayload.accepted and paymentRequirements name different networks",
        ));
    }
    let Some(network) = served_network(&required.network, by_chain_id) else {
        return Err(invalid(
            Reason::Network,
            format!(
                "network {:?} is not served (eip155:<chain id> of a served chain)",
                required.network
            ),
        ));
    };
    let differs = |field: &str| {
        invalid(
            Reason::PaymentRequirements,
            format!("paymentPayload.accepted.{field} differs from paymentRequirements.{field}"),
        )
    };
    // An upto settle charges what was used: its requirements' amount may be below the one the
    // payer accepted (the permitted amount, which the permit itself bounds).
    if accepted.amount != required.amount && scheme == Scheme::Exact {
        return Err(differs("amount"));
    }
    if !accepted.asset.eq_ignore_ascii_case(&required.asset) {
        return Err(differs("asset"));
    }
    if !accepted.pay_to.eq_ignore_ascii_case(&required.pay_to) {
        return Err(differs("payTo"));
    }
    let Some(resource) = &payload.resource else {
        return Err(invalid(
            Reason::PaymentRequirements,
            "paymentPayload.resource: missing; routerd checks the resource URL it is paid for",
        ));
    };
    Ok((network, resource, scheme))
}

fn invalid(reason: Reason, message: impl Into<String>) -> Invalid {
    Invalid::new(reason, message.into())
}

/// v2's name of a reason (x402 v2 specification §9), on verify and settle alike. v2 has no KYT
/// reasons: a refused payer is an invalid payload, a refused payTo invalid requirements (the
/// message says which).
pub fn reason_name(reason: Reason) -> &'static str {
    match reason {
        Reason::X402Version => "invalid_x402_version",
        Reason::Scheme => "invalid_scheme",
        Reason::Network => "invalid_network",
        Reason::PaymentRequirements | Reason::ToKyt => "invalid_payment_requirements",
        Reason::Payload | Reason::FromKyt => "invalid_payload",
        Reason::TypedDataMessage => "invalid_exact_evm_payload_recipient_mismatch",
        Reason::ValueTooLow | Reason::Value => "invalid_exact_evm_payload_authorization_value",
        Reason::ValidAfter => "invalid_exact_evm_payload_authorization_valid_after",
        Reason::ValidBefore => "invalid_exact_evm_payload_authorization_valid_before",
        Reason::Signature | Reason::SignatureAddress => "invalid_exact_evm_payload_signature",
        Reason::InsufficientFunds => "insufficient_funds",
        // `@x402/evm`'s name for an authorization whose nonce is used.
        Reason::AlreadySettled => "invalid_exact_evm_nonce_already_used",
        Reason::Erc6492Factory => "eip6492_factory_not_allowed",
        Reason::Permit2Token => "permit2_token_mismatch",
        Reason::Permit2Spender => "invalid_permit2_spender",
        Reason::Permit2Allowance => "permit2_allowance_required",
        Reason::UptoFacilitator => "upto_facilitator_mismatch",
        Reason::UptoOverPermit => "invalid_upto_evm_payload_settlement_exceeds_amount",
        Reason::UptoPermitAmount => "permit2_amount_mismatch",
        Reason::Eip2612Format => "invalid_eip2612_extension_format",
        Reason::Eip2612From => "eip2612_from_mismatch",
        Reason::Eip2612Asset => "eip2612_asset_mismatch",
        Reason::Eip2612Spender => "eip2612_spender_not_permit2",
        Reason::Eip2612Amount => "permit2_2612_amount_mismatch",
        Reason::Eip2612Deadline => "eip2612_deadline_expired",
    }
}

/// The settle answer's reason while the transaction is broadcast and its outcome still unknown.
pub const SETTLEMENT_PENDING: &str = "settlement_pending";

/// The `/verify` answer for a verdict on `request`, in v2's names.
pub fn verify_answer(request: &PaymentRequest, verdict: Result<(), Invalid>) -> VerifyResponse {
    let failure = verdict.err();
    VerifyResponse {
        is_valid: failure.is_none(),
        invalid_reason: failure.as_ref().map(|f| reason_name(f.reason)),
        invalid_message: failure.map(|f| f.message.render(path)),
        payer: v1::payer_of(Payload::from(&request.payment_payload.payload)),
        extra: None,
    }
}

/// The `/settle` outcome of `request` raised into v2: v2's reason names, the network as the
/// request gave it, and an outcome still unknown after broadcast as `settlement_pending` with
/// the hash (before broadcast there is no hash, and the error body stays).
pub fn settle_answer(
    request: &PaymentRequest,
    outcome: Result<Settled, SettleError>,
) -> Result<SettleResponse, SettleError> {
    let payer = v1::payer_of(Payload::from(&request.payment_payload.payload));
    let network = request.payment_requirements.network.clone();
    let required = &request.payment_requirements;
    let charged =
        |success: bool| (success && required.scheme == "upto").then(|| required.amount.clone());
    match outcome {
        Ok(settled) => Ok(SettleResponse {
            amount: charged(settled.success),
            success: settled.success,
            error_reason: settled.reason.map(|r| reason_name(r).to_string()),
            error_message: settled.message.map(|m| m.render(path)),
            payer,
            transaction: settled.transaction.map(evm::hex_bytes).unwrap_or_default(),
            network,
            extra: None,
        }),
        Err(SettleError::Pending(Some(hash))) => Ok(SettleResponse {
            amount: None,
            success: false,
            error_reason: Some(SETTLEMENT_PENDING.to_string()),
            error_message: Some(SettleError::Pending(Some(hash)).to_string()),
            payer,
            transaction: evm::hex_bytes(hash),
            network,
            extra: None,
        }),
        Err(other) => Err(other),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::facilitator::outcome::Message;

    fn served() -> BTreeMap<u64, String> {
        BTreeMap::from([(84532, "base-sepolia".to_string())])
    }

    #[test]
    fn caip2_names_only_served_chain_ids() {
        let served = served();
        assert_eq!(
            served_network("eip155:84532", &served).map(String::as_str),
            Some("base-sepolia")
        );
        for other in [
            "eip155:1",
            "eip155:084532",
            "eip155:",
            "eip155:84532 ",
            "base-sepolia",
            "solana:84532",
            "EIP155:84532",
        ] {
            assert_eq!(served_network(other, &served), None, "{other}");
        }
        assert_eq!(network_id(84532), "eip155:84532");
    }

    #[test]
    fn messages_name_v2_fields() {
        let render = |message: Message| message.render(path);
        assert_eq!(
            render(Message::ValueBelowAmount),
            "authorization.value is below amount"
        );
        assert_eq!(
            render(Message::ValueAboveAmount),
            "authorization.value exceeds amount"
        );
        assert_eq!(
            render(Message::Field(
                Field::Resource,
                "not an https:// URL of 11 to 2048 characters".into()
            )),
            "paymentPayload.resource.url: not an https:// URL of 11 to 2048 characters"
        );
        assert_eq!(
            render(Message::Field(
                Field::Amount,
                "not a decimal amount above 0".into()
            )),
            "paymentRequirements.amount: not a decimal amount above 0"
        );
        assert_eq!(
            render(Message::ToIsNotPayTo),
            "authorization.to is not paymentRequirements.payTo"
        );
        assert_eq!(
            render(Message::Field(Field::Nonce, "x".into())),
            "paymentPayload.payload.authorization.nonce: x"
        );
    }

    #[test]
    fn every_reason_has_a_name_from_the_v2_list() {
        const V2_LIST: &[&str] = &[
            "insufficient_funds",
            "invalid_exact_evm_payload_authorization_valid_after",
            "invalid_exact_evm_payload_authorization_valid_before",
            "invalid_exact_evm_payload_authorization_value",
            "invalid_exact_evm_nonce_already_used",
            // `@x402/evm`'s, for a factory it is not configured to call (ERC-6492).
            "eip6492_factory_not_allowed",
            // `@x402/evm`'s, for the Permit2 rules.
            "permit2_token_mismatch",
            "invalid_permit2_spender",
            "permit2_allowance_required",
            "upto_facilitator_mismatch",
            "invalid_upto_evm_payload_settlement_exceeds_amount",
            "permit2_amount_mismatch",
            "invalid_eip2612_extension_format",
            "eip2612_from_mismatch",
            "eip2612_asset_mismatch",
            "eip2612_spender_not_permit2",
            "permit2_2612_amount_mismatch",
            "eip2612_deadline_expired",
            "invalid_exact_evm_payload_signature",
            "invalid_exact_evm_payload_recipient_mismatch",
            "invalid_network",
            "invalid_payload",
            "invalid_payment_requirements",
            "invalid_scheme",
            "invalid_x402_version",
        ];
        for reason in Reason::ALL {
            assert!(V2_LIST.contains(&reason_name(reason)), "{reason:?}");
        }
    }
}
