//! The answers no single version's request shapes: a settlement's status (in v1's reason
//! names, as it always was) and the supported kinds of every served version. Each version's
//! requests and its verify and settle answers are its own (`protocol::v1`, `protocol::v2`).

use serde::Serialize;

/// `GET /settlements/{network}/{asset}/{from}/{nonce}`: what happened to one payment.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SettlementStatus {
    pub network: String,
    pub asset: String,
    pub payer: String,
    pub nonce: String,
    /// What identifies the authorization, so that a merchant can tell that a success is its own
    /// payment: where the funds go, how much, and the EIP-712 digest the payer signed.
    pub pay_to: String,
    /// The value in the token's smallest unit, as a decimal string (as x402 writes amounts).
    pub value: String,
    pub digest: String,
    /// The payer's x402 v2 `payment-identifier` id, when its payload carried one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub payment_identifier: Option<String>,
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
    /// `upto`'s: the `facilitatorAddress` its witness must name.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub extra: Option<serde_json::Value>,
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
