//! Solana's `exact` on the wire, in both versions: the payload (`{transaction}`), the lowering
//! of a v1 or v2 request onto a Solana [`Payment`] (each version's rules 1 to 3, then the
//! requirement values in Solana's types), and the reason names: v1 the seed's
//! `invalid_exact_svm_payload_*`, v2 `@x402/svm` 2.27.0's. The table that maps every check to
//! its two names is [`reason`]; the README prints it.

use std::str::FromStr;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Number, Value};

use super::{Failure, Party, Payment, SvmExact, SvmNetwork, SvmSettled, Verified, Version};
use crate::facilitator::outcome::SettleError;
use crate::facilitator::outcome::{Field, Invalid, Spelling};
use crate::facilitator::protocol::v1::{self, SettleResponse, VerifyResponse};
use crate::facilitator::protocol::v2;
use crate::facilitator::types::StatusOutcome;
use crate::ledger::{Reason, Record, State};
use crate::svm::{PaymentTransaction, Pubkey, Refusal};

/// `paymentPayload.payload`: the payer's transaction, base64 of its wire bytes.
#[derive(Debug, Clone, Deserialize)]
pub struct ExactSvmPayload {
    pub transaction: String,
}

pub type V1Request = v1::PaymentRequest<ExactSvmPayload>;
pub type V2Request = v2::PaymentRequest<ExactSvmPayload>;

/// Paths that must be JSON objects (see `parse_body_with`).
pub const V1_OBJECTS: &[&str] = &[
    "",
    "paymentPayload",
    "paymentPayload.payload",
    "paymentRequirements",
];
pub const V2_OBJECTS: &[&str] = &[
    "",
    "paymentPayload",
    "paymentPayload.resource",
    "paymentPayload.accepted",
    "paymentPayload.payload",
    "paymentPayload.extensions",
    "paymentRequirements",
];

/// Why a Solana request is refused: a rule every family shares, or one of Solana's own.
#[derive(Debug, Clone, PartialEq)]
pub enum Refused {
    Shared(Invalid),
    Svm(Failure),
}

impl From<Invalid> for Refused {
    fn from(invalid: Invalid) -> Self {
        Refused::Shared(invalid)
    }
}

impl From<Failure> for Refused {
    fn from(failure: Failure) -> Self {
        Refused::Svm(failure)
    }
}

/// The requirement values both versions carry, by v1's or v2's names.
struct Terms<'a> {
    amount: &'a str,
    pay_to: &'a str,
    asset: &'a str,
    max_timeout_seconds: &'a Number,
    extra: Option<&'a Map<String, Value>>,
    transaction: &'a str,
}

/// Rules 1 to 3 in v1's terms, then the values.
pub fn lower_v1(request: &V1Request, svm: &SvmExact) -> Result<Payment, Refused> {
    let payload = &request.payment_payload;
    let required = &request.payment_requirements;
    let is_one = |n: &Number| n.as_u64() == Some(1);
    if !is_one(&request.x402_version) || !is_one(&payload.x402_version) {
        return Err(invalid(Reason::X402Version, "x402Version must be 1"));
    }
    if payload.scheme != "exact" || required.scheme != "exact" {
        return Err(invalid(
            Reason::Scheme,
            "scheme must be \"exact\" in payload and requirements",
        ));
    }
    if payload.network != required.network {
        return Err(invalid(
            Reason::Network,
            "payload and requirements name different networks",
        ));
    }
    let network = svm.network(&required.network).ok_or_else(|| {
        invalid(
            Reason::Network,
            format!("network {:?} is not served", required.network),
        )
    })?;
    let terms = Terms {
        amount: &required.max_amount_required,
        pay_to: &required.pay_to,
        asset: &required.asset,
        max_timeout_seconds: &required.max_timeout_seconds,
        extra: required.extra.as_ref(),
        transaction: &payload.payload.transaction,
    };
    lower_terms(Version::V1, network, svm, terms)
}

/// Rules 1 to 3 in v2's terms and v2's own (`accepted` agrees with the requirements), then the
/// values.
pub fn lower_v2(request: &V2Request, svm: &SvmExact) -> Result<Payment, Refused> {
    let payload = &request.payment_payload;
    let (accepted, required) = (&payload.accepted, &request.payment_requirements);
    let is_two = |n: &Number| n.as_u64() == Some(2);
    if !is_two(&payload.x402_version) || request.x402_version.as_ref().is_some_and(|n| !is_two(n)) {
        return Err(invalid(Reason::X402Version, "x402Version must be 2"));
    }
    if accepted.scheme != "exact" || required.scheme != "exact" {
        return Err(invalid(
            Reason::Scheme,
            "scheme must be \"exact\" in paymentPayload.accepted and paymentRequirements",
        ));
    }
    if accepted.network != required.network {
        return Err(invalid(
            Reason::Network,
            "paymentPayload.accepted and paymentRequirements name different networks",
        ));
    }
    let network = svm
        .networks()
        .iter()
        .find(|n| n.caip2 == required.network)
        .ok_or_else(|| {
            invalid(
                Reason::Network,
                format!(
                    "network {:?} is not served (solana:<genesis hash prefix> of a served cluster)",
                    required.network
                ),
            )
        })?;
    for (field, a, r) in [
        ("amount", &accepted.amount, &required.amount),
        ("asset", &accepted.asset, &required.asset),
        ("payTo", &accepted.pay_to, &required.pay_to),
    ] {
        if a != r {
            return Err(invalid(
                Reason::PaymentRequirements,
                format!("paymentPayload.accepted.{field} differs from paymentRequirements.{field}"),
            ));
        }
    }
    let terms = Terms {
        amount: &required.amount,
        pay_to: &required.pay_to,
        asset: &required.asset,
        max_timeout_seconds: &required.max_timeout_seconds,
        extra: required.extra.as_ref(),
        transaction: &payload.payload.transaction,
    };
    lower_terms(Version::V2, network, svm, terms)
}

/// The requirement values (rule 4), the fee payer (rule 2's first half) and the transaction's
/// decoding (rule 1's first half), in that order.
fn lower_terms(
    version: Version,
    network: &SvmNetwork,
    svm: &SvmExact,
    terms: Terms,
) -> Result<Payment, Refused> {
    let requirements =
        |field, problem: &str| Invalid::field(Reason::PaymentRequirements, field, problem);
    let amount = terms
        .amount
        .parse::<u64>()
        .ok()
        .filter(|a| *a > 0 && terms.amount.bytes().all(|b| b.is_ascii_digit()))
        .ok_or_else(|| requirements(Field::Amount, "not a decimal amount above 0 within u64"))?;
    let pay_to = Pubkey::from_str(terms.pay_to)
        .map_err(|_| requirements(Field::PayTo, "not a base58 Solana address"))?;
    let mint = Pubkey::from_str(terms.asset)
        .ok()
        .filter(|mint| network.mints.contains(mint))
        .ok_or_else(|| {
            requirements(
                Field::Asset,
                "not a mint this facilitator settles on that network",
            )
        })?;
    if terms.max_timeout_seconds.as_u64().is_none_or(|s| s < 1) {
        return Err(
            requirements(Field::MaxTimeoutSeconds, "must be an integer of at least 1").into(),
        );
    }
    let extra = |key: &str| terms.extra.and_then(|e| e.get(key));
    let memo = match extra("memo") {
        None | Some(Value::Null) => None,
        Some(Value::String(memo)) => Some(memo.clone()),
        Some(_) => {
            return Err(invalid(
                Reason::PaymentRequirements,
                "paymentRequirements.extra.memo: not a string",
            ))
        }
    };
    let fee_payer = match extra("feePayer").and_then(Value::as_str) {
        None => return Err(Failure::MissingFeePayer.into()),
        Some(key) => Pubkey::from_str(key)
            .ok()
            .filter(|key| svm.fee_payers().contains(key))
            .ok_or(Failure::FeePayerNotManaged)?,
    };
    let transaction = PaymentTransaction::decode(terms.transaction).map_err(Failure::Decode)?;
    Ok(Payment {
        version,
        network: network.name,
        mint,
        pay_to,
        amount,
        fee_payer,
        memo,
        transaction,
        wire: terms.transaction.to_string(),
    })
}

fn invalid(reason: Reason, message: impl Into<String>) -> Refused {
    Refused::Shared(Invalid::new(reason, message.into()))
}

/// The payer of a Solana payment: the signer after the fee payer (the transfer's authority in
/// the transactions the clients build), or "" when the transaction does not decode.
fn payer_of(transaction: &str) -> String {
    PaymentTransaction::decode(transaction)
        .ok()
        .and_then(|tx| tx.signers().get(1).map(Pubkey::to_string))
        .unwrap_or_default()
}

/// `/verify`'s answer in `version`'s names.
pub fn verify_answer(
    version: Version,
    transaction: &str,
    verdict: &Result<Verified, Refused>,
) -> VerifyResponse {
    let (payer, failure) = match verdict {
        Ok(verified) => (verified.transfer.authority.to_string(), None),
        Err(refused) => (payer_of(transaction), Some(refused)),
    };
    VerifyResponse {
        is_valid: failure.is_none(),
        invalid_reason: failure.map(|f| reason(version, f)),
        invalid_message: failure.map(|f| message(version, f)),
        payer,
        extra: None,
    }
}

fn message(version: Version, refused: &Refused) -> String {
    let spelling: Spelling = match version {
        Version::V1 => v1::path,
        Version::V2 => v2::path,
    };
    match refused {
        Refused::Shared(invalid) => invalid.message.render(spelling),
        Refused::Svm(failure) => failure.to_string(),
    }
}

/// v1's name of a Solana settlement that ended in failure: on chain, or its blockhash expired.
fn v1_settle_failure(state: &State) -> &'static str {
    match state {
        State::Landed { .. } => "settle_exact_svm_transaction_failed",
        _ => "settle_exact_svm_block_height_exceeded",
    }
}

/// `GET /settlements/{network}/{signature}`: what happened to one Solana payment.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SvmSettlementStatus {
    /// The v1 name of the network.
    pub network: String,
    /// The transaction's signature (base58): the fee payer's.
    pub signature: String,
    /// pending (stored, signed, sent or about to be), final, failed or expired.
    pub state: &'static str,
    /// The slot it landed in, once it reached the commitment.
    pub slot: Option<u64>,
    /// Slots confirmed above it, as the cluster answers now; `None` once the cluster has rooted
    /// (finalized) it, while it is unknown there, or when the cluster cannot be reached.
    pub confirmations: Option<u64>,
    pub payer: String,
    pub pay_to: String,
    /// The amount in the mint's smallest unit, as a decimal string.
    pub amount: String,
    pub mint: String,
    /// The payer's x402 v2 `payment-identifier` id, when its payload carried one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub payment_identifier: Option<String>,
    pub outcome: Option<StatusOutcome>,
}

/// The status route's answer for a stored Solana settlement (v1's reason names, as the EVM
/// status route's); its confirmations are the cluster's, read by the caller.
pub fn status_answer(record: &Record) -> Option<SvmSettlementStatus> {
    let svm = &record.svm()?.settlement;
    let (state, slot) = match record.state {
        State::Landed { slot, succeeded } => {
            (if succeeded { "final" } else { "failed" }, Some(slot))
        }
        State::Expired { .. } => ("expired", None),
        _ => ("pending", None),
    };
    Some(SvmSettlementStatus {
        network: record.network.clone(),
        signature: svm.signature.clone(),
        state,
        slot,
        confirmations: None,
        payer: svm.payer.clone(),
        pay_to: svm.pay_to.clone(),
        amount: svm.amount.to_string(),
        mint: svm.mint.clone(),
        payment_identifier: record.payment_id.clone(),
        outcome: record.outcome.as_ref().map(|o| StatusOutcome {
            success: o.success,
            transaction: (state != "expired").then(|| svm.signature.clone()),
            error_reason: (!o.success).then(|| v1_settle_failure(&record.state)),
            error_message: o.message.clone(),
        }),
    })
}

/// The `/settle` answer to `request`, in its version's names (svm.md §4). A success names the
/// transaction's signature; a failure on chain v1 `settle_exact_svm_transaction_failed`, v2
/// `transaction_failed` (as `@x402/svm`); an expired blockhash v1
/// `settle_exact_svm_block_height_exceeded`; another request's settlement of the same
/// transaction v1 `invalid_payload`, v2 `duplicate_settlement`, with the signature; still unknown
/// at the deadline v2 `settlement_pending` with the signature, v1 the pending error (HTTP 400
/// `{error: 504}`).
pub fn settle_answer(
    request: &SvmRequest,
    settled: Result<SvmSettled, SettleError>,
) -> Result<SettleResponse, SettleError> {
    let version = request.version();
    let answer =
        |reason: Option<&str>, message: Option<String>, transaction: String| SettleResponse {
            success: reason.is_none(),
            error_reason: reason.map(str::to_string),
            error_message: message,
            payer: payer_of(request.transaction()),
            transaction,
            network: request.terms().0.to_string(),
            amount: None,
            extra: None,
        };
    let by_version = |v1: &'static str, v2: &'static str| match version {
        Version::V1 => v1,
        Version::V2 => v2,
    };
    Ok(match settled? {
        SvmSettled::Refused(refused) => answer(
            Some(reason(version, &refused)),
            Some(message(version, &refused)),
            String::new(),
        ),
        SvmSettled::Ended(record) => {
            let signature = record.svm().map(|s| s.settlement.signature.clone());
            let signature = signature.unwrap_or_default();
            let message = record.outcome.as_ref().and_then(|o| o.message.clone());
            match record.state {
                State::Landed {
                    succeeded: true, ..
                } => answer(None, None, signature),
                ref ended => answer(
                    Some(by_version(v1_settle_failure(ended), "transaction_failed")),
                    message,
                    signature,
                ),
            }
        }
        SvmSettled::Duplicate { signature, ended } => {
            let settled = if ended { "settled" } else { "being settled" };
            answer(
                Some(by_version("invalid_payload", "duplicate_settlement")),
                Some(format!("already {settled} by {signature}")),
                signature,
            )
        }
        SvmSettled::Pending { signature } => match version {
            Version::V1 => return Err(SettleError::PendingSignature(signature)),
            Version::V2 => answer(
                Some(v2::SETTLEMENT_PENDING),
                Some(SettleError::PendingSignature(signature.clone()).to_string()),
                signature,
            ),
        },
    })
}

/// The name of a refusal in `version`: the shared rules keep their version's names; Solana's
/// own checks map as the README's table says.
pub fn reason(version: Version, refused: &Refused) -> &'static str {
    match (refused, version) {
        (Refused::Shared(invalid), Version::V1) => v1::verify_reason(invalid.reason),
        (Refused::Shared(invalid), Version::V2) => v2::reason_name(invalid.reason),
        (Refused::Svm(failure), Version::V1) => v1_name(failure),
        (Refused::Svm(failure), Version::V2) => v2_name(failure),
    }
}

const TX: &str = "invalid_exact_svm_payload_transaction";

/// The seed's names: the closest one for each check.
fn v1_name(failure: &Failure) -> &'static str {
    match failure {
        Failure::MissingFeePayer | Failure::FeePayerNotManaged => "invalid_payment_requirements",
        Failure::Decode(_) => TX,
        Failure::SourceMissing => "invalid_exact_svm_payload_transaction_sender_ata_not_found",
        Failure::RecipientMissing => "invalid_exact_svm_payload_transaction_receiver_ata_not_found",
        Failure::InsufficientFunds { .. } | Failure::Exposed { .. } => "insufficient_funds",
        Failure::CooledDown { .. } => "invalid_payload",
        Failure::Simulation(_) => "invalid_exact_svm_payload_transaction_simulation_failed",
        Failure::DenyListed(party) => deny_listed(*party),
        Failure::Mint(_) => "invalid_payment_requirements",
        Failure::Rule(refusal) => match refusal {
            Refusal::SignatureInvalid | Refusal::LookupTables | Refusal::FeePayerMismatch => TX,
            Refusal::InstructionCount => "invalid_exact_svm_payload_transaction_instructions_length",
            Refusal::ComputeLimitInstruction | Refusal::ComputeLimitTooHigh => {
                "invalid_exact_svm_payload_transaction_instructions_compute_limit_instruction"
            }
            Refusal::ComputePriceInstruction => {
                "invalid_exact_svm_payload_transaction_instructions_compute_price_instruction"
            }
            Refusal::ComputePriceTooHigh | Refusal::PriorityFeeTooHigh { .. } => {
                "invalid_exact_svm_payload_transaction_instructions_compute_price_instruction_too_high"
            }
            // The seed has no name for it: its generic transaction reason.
            Refusal::ExcessiveSigners { .. } => TX,
            Refusal::NoTransferInstruction => {
                "invalid_exact_svm_payload_transaction_instruction_not_spl_token_transfer_checked"
            }
            Refusal::UnknownInstruction { .. } | Refusal::MemoCount | Refusal::MemoMismatch => {
                "invalid_exact_svm_payload_transaction_instructions"
            }
            Refusal::MintMismatch => "invalid_exact_svm_payload_transaction_not_a_transfer_instruction",
            Refusal::RecipientMismatch | Refusal::SelfPayment => {
                "invalid_exact_svm_payload_transaction_transfer_to_incorrect_ata"
            }
            Refusal::AmountMismatch => "invalid_exact_svm_payload_transaction_amount_mismatch",
            Refusal::AuthorityIsFeePayer => {
                "invalid_exact_svm_payload_transaction_fee_payer_transferring_funds"
            }
            Refusal::FeePayerInAccounts => {
                "invalid_exact_svm_payload_transaction_fee_payer_included_in_instruction_accounts"
            }
        },
    }
}

/// A deny-listed payer or payee, named as an EVM one is in v2 (`Reason::FromKyt`,
/// `Reason::ToKyt`); v1's KYT names are the EVM payload's, so Solana's v1 answers the same.
fn deny_listed(party: Party) -> &'static str {
    match party {
        Party::Payer => "invalid_payload",
        Party::Payee => "invalid_payment_requirements",
    }
}

/// `@x402/svm` 2.27.0's names (its `exact` facilitator's verify).
fn v2_name(failure: &Failure) -> &'static str {
    match failure {
        Failure::MissingFeePayer => "invalid_exact_svm_payload_missing_fee_payer",
        Failure::FeePayerNotManaged => "invalid_exact_svm_fee_payer_not_managed_by_facilitator",
        Failure::Decode(_) => "invalid_exact_svm_payload_transaction_could_not_be_decoded",
        Failure::RecipientMissing => "invalid_exact_svm_payload_recipient_mismatch",
        Failure::InsufficientFunds { .. } | Failure::Exposed { .. } => "insufficient_funds",
        Failure::CooledDown { .. } => "invalid_payload",
        Failure::DenyListed(party) => deny_listed(*party),
        Failure::Mint(_) => "invalid_payment_requirements",
        // @x402/svm learns both from its simulation.
        Failure::SourceMissing | Failure::Simulation(_) => {
            "invalid_exact_svm_transaction_simulation_failed"
        }
        Failure::Rule(refusal) => match refusal {
            Refusal::SignatureInvalid => "invalid_exact_svm_payload_signature_invalid",
            Refusal::LookupTables => TX,
            Refusal::FeePayerMismatch => "invalid_exact_svm_fee_payer_mismatch",
            Refusal::InstructionCount => "invalid_exact_svm_payload_transaction_instructions_length",
            Refusal::ComputeLimitInstruction => {
                "invalid_exact_svm_payload_transaction_instructions_compute_limit_instruction"
            }
            Refusal::ComputeLimitTooHigh => {
                "invalid_exact_svm_payload_transaction_instructions_compute_limit_instruction_too_high"
            }
            Refusal::ComputePriceInstruction => {
                "invalid_exact_svm_payload_transaction_instructions_compute_price_instruction"
            }
            Refusal::ComputePriceTooHigh | Refusal::PriorityFeeTooHigh { .. } => {
                "invalid_exact_svm_payload_transaction_instructions_compute_price_instruction_too_high"
            }
            Refusal::ExcessiveSigners { .. } => "invalid_exact_svm_payload_excessive_signers",
            Refusal::NoTransferInstruction => "invalid_exact_svm_payload_no_transfer_instruction",
            Refusal::UnknownInstruction { position } => match position {
                3 => "invalid_exact_svm_payload_unknown_fourth_instruction",
                4 => "invalid_exact_svm_payload_unknown_fifth_instruction",
                5 => "invalid_exact_svm_payload_unknown_sixth_instruction",
                _ => "invalid_exact_svm_payload_unknown_seventh_instruction",
            },
            Refusal::MintMismatch => "invalid_exact_svm_payload_mint_mismatch",
            Refusal::RecipientMismatch | Refusal::SelfPayment => {
                "invalid_exact_svm_payload_recipient_mismatch"
            }
            Refusal::AmountMismatch => "invalid_exact_svm_payload_amount_mismatch",
            Refusal::AuthorityIsFeePayer | Refusal::FeePayerInAccounts => {
                "invalid_exact_svm_payload_transaction_fee_payer_transferring_funds"
            }
            Refusal::MemoCount => "invalid_exact_svm_payload_memo_count",
            Refusal::MemoMismatch => "invalid_exact_svm_payload_memo_mismatch",
        },
    }
}

/// A Solana request in the wire format of its version.
#[derive(Debug, Clone)]
pub enum SvmRequest {
    V1(V1Request),
    V2(V2Request),
}

impl SvmRequest {
    pub fn version(&self) -> Version {
        match self {
            SvmRequest::V1(_) => Version::V1,
            SvmRequest::V2(_) => Version::V2,
        }
    }

    pub fn transaction(&self) -> &str {
        match self {
            SvmRequest::V1(r) => &r.payment_payload.payload.transaction,
            SvmRequest::V2(r) => &r.payment_payload.payload.transaction,
        }
    }

    /// The requirements' network, payTo and asset, as sent.
    pub fn terms(&self) -> (&str, &str, &str) {
        match self {
            SvmRequest::V1(r) => {
                let q = &r.payment_requirements;
                (&q.network, &q.pay_to, &q.asset)
            }
            SvmRequest::V2(r) => {
                let q = &r.payment_requirements;
                (&q.network, &q.pay_to, &q.asset)
            }
        }
    }

    pub fn lower(&self, svm: &SvmExact) -> Result<Payment, Refused> {
        match self {
            SvmRequest::V1(r) => lower_v1(r, svm),
            SvmRequest::V2(r) => lower_v2(r, svm),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ledger::{Lost, SvmSettlement};
    use serde_json::json;

    const SIG: &str = "5sig";

    fn request(version: Version) -> SvmRequest {
        let network = match version {
            Version::V1 => "solana-devnet",
            Version::V2 => "solana:EtWTRABZaYq6iMfeYKouRu166VU2xqa1",
        };
        let required = json!({
            "scheme": "exact", "network": network, "maxAmountRequired": "1", "amount": "1",
            "resource": "https://r.example", "description": "", "mimeType": "", "payTo": "p",
            "maxTimeoutSeconds": 60, "asset": "m",
        });
        match version {
            Version::V1 => SvmRequest::V1(
                serde_json::from_value(json!({
                    "x402Version": 1,
                    "paymentPayload": {"x402Version": 1, "scheme": "exact", "network": network,
                        "payload": {"transaction": "AQ=="}},
                    "paymentRequirements": required,
                }))
                .unwrap(),
            ),
            Version::V2 => SvmRequest::V2(
                serde_json::from_value(json!({
                    "x402Version": 2,
                    "paymentPayload": {"x402Version": 2, "accepted": required,
                        "resource": {"url": "https://r.example"}, "payload": {"transaction": "AQ=="}},
                    "paymentRequirements": required,
                }))
                .unwrap(),
            ),
        }
    }

    fn record(end: impl FnOnce(&mut Record)) -> Box<Record> {
        let mut record = crate::testing::svm_record("net", 1);
        record.svm_mut().unwrap().settlement = SvmSettlement {
            signature: SIG.into(),
            transaction: "AQ==".into(),
            last_valid_block_height: 10,
            payer: "payer".into(),
            pay_to: "p".into(),
            mint: "m".into(),
            source: None,
            amount: 1,
            error: None,
        };
        end(&mut record);
        Box::new(record)
    }

    fn named(version: Version, settled: SvmSettled) -> (bool, Option<String>, String) {
        let answer = settle_answer(&request(version), Ok(settled)).unwrap();
        (answer.success, answer.error_reason, answer.transaction)
    }

    #[test]
    fn each_settle_outcome_in_each_version_names_the_signature() {
        for version in [Version::V1, Version::V2] {
            let landed = record(|r| {
                r.landed(5, None, 1);
            });
            assert_eq!(
                named(version, SvmSettled::Ended(landed)),
                (true, None, SIG.into())
            );
        }
        let failed = || {
            record(|r| {
                r.landed(5, Some("{}".into()), 1);
            })
        };
        let expired = || {
            record(|r| {
                r.expire(Lost::BlockHeightExceeded, 1);
            })
        };
        let reason = |version, settled| named(version, settled).1.unwrap();
        assert_eq!(
            reason(Version::V1, SvmSettled::Ended(failed())),
            "settle_exact_svm_transaction_failed"
        );
        assert_eq!(
            reason(Version::V2, SvmSettled::Ended(failed())),
            "transaction_failed"
        );
        assert_eq!(
            reason(Version::V1, SvmSettled::Ended(expired())),
            "settle_exact_svm_block_height_exceeded"
        );
        assert_eq!(
            reason(Version::V2, SvmSettled::Ended(expired())),
            "transaction_failed"
        );
        let duplicate = || SvmSettled::Duplicate {
            signature: SIG.into(),
            ended: true,
        };
        assert_eq!(
            named(Version::V1, duplicate()),
            (false, Some("invalid_payload".into()), SIG.into())
        );
        assert_eq!(
            named(Version::V2, duplicate()),
            (false, Some("duplicate_settlement".into()), SIG.into())
        );
        let pending = || SvmSettled::Pending {
            signature: SIG.into(),
        };
        assert_eq!(
            named(Version::V2, pending()),
            (false, Some("settlement_pending".into()), SIG.into())
        );
        assert!(matches!(
            settle_answer(&request(Version::V1), Ok(pending())),
            Err(SettleError::PendingSignature(s)) if s == SIG
        ));
        let status = status_answer(&expired()).unwrap();
        assert_eq!((status.state, status.slot), ("expired", None));
        let outcome = status.outcome.unwrap();
        assert_eq!(
            outcome.error_reason,
            Some("settle_exact_svm_block_height_exceeded")
        );
        assert_eq!(outcome.transaction, None);
        let status = status_answer(&failed()).unwrap();
        assert_eq!((status.state, status.slot), ("failed", Some(5)));
        assert_eq!(
            status_answer(&crate::testing::record(1)).map(|s| s.state),
            None
        );
    }
}
