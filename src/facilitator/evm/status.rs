//! The EVM status route's answer (`GET /settlements/{network}/{asset}/{from}/{nonce}`): a record
//! as callers see it. The route speaks no x402 version; its reason names are v1's settle names,
//! which v2 shares.

use serde::Serialize;

use crate::evm;
use crate::facilitator::protocol::v1;
use crate::facilitator::types::StatusOutcome;
use crate::ledger::{self, EvmPart, Record};

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

/// The record of an EVM settlement (`part`, its EVM part), with its inclusion's depth at `head` when
/// the head is known.
pub fn answer(record: &Record, part: &EvmPart, head: Option<u64>) -> SettlementStatus {
    // Records migrated from store version 1 know their transaction, not its block.
    let inclusion = record.state.inclusion();
    let block = inclusion.filter(|i| !i.block_hash.is_zero());
    let transaction = inclusion
        .map(|i| i.transaction)
        .or_else(|| part.latest().map(|a| a.hash));
    SettlementStatus {
        network: record.network.clone(),
        asset: evm::hex_bytes(part.token),
        payer: evm::hex_bytes(part.payer),
        nonce: evm::hex_bytes(part.nonce),
        pay_to: evm::hex_bytes(part.pay_to),
        value: record.value.to_string(),
        digest: evm::hex_bytes(record.digest),
        payment_identifier: record.payment_id.clone(),
        state: record.state.name(),
        transaction: transaction.map(evm::hex_bytes),
        signer: part.latest().map(|a| evm::hex_bytes(a.signer)),
        signer_nonce: part.latest().map(|a| a.nonce),
        block: block.map(|i| i.block),
        block_hash: block.map(|i| evm::hex_bytes(i.block_hash)),
        confirmations: match (block, head) {
            (Some(i), Some(head)) => ledger::depth(head, i.block),
            _ => 0,
        },
        outcome: record.outcome.as_ref().map(|o| StatusOutcome {
            success: o.success,
            transaction: o.transaction.map(evm::hex_bytes),
            error_reason: o.reason.map(v1::settle_reason),
            error_message: o.message.clone(),
        }),
        lost: record.lost,
    }
}
