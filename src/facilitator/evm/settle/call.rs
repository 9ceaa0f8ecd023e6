//! The transaction that settles an EVM payment and the record its claim stores:
//! `transferWithAuthorization`, or Permit2's proxy (`settle`, `settleWithPermit`, upto's), behind
//! a Multicall3 deployment for a wallet not yet deployed; a gas limit with headroom that never
//! passes `max_settlement_gas`; and why a claim that did not fit beside the payer's settlements
//! under way was refused.

use ethers_core::types::{Address, Bytes, U256};

use crate::evm::{erc3009, erc6492, permit2};
use crate::facilitator::evm::request::Method;
use crate::facilitator::evm::verify::{Payer, Payment};
use crate::facilitator::outcome::Invalid;
use crate::ledger::{Asking, EvmRecord, EvmTerms, Reason};
use crate::store::{Claim, Limits, Permit2Clash};

/// Gas added on top of the tried gas of `transferWithAuthorization`.
const GAS_HEADROOM_PERCENT: u64 = 25;

/// The Permit2 allowance a Permit2 payment's claim keeps to: the payer's, as read, or for one
/// carrying an EIP-2612 permit, what that permit sets it to (its value: the claim then keeps it
/// alone among the payer's Permit2 payments in flight).
pub(super) fn permit2_allowance(payment: &Payment<'_>, payer: &Payer) -> U256 {
    let read = payer.permit2_allowance.unwrap_or(U256::MAX);
    match &payment.eip2612 {
        Some(permit) => read.max(permit.value),
        None => read,
    }
}

/// Why a claim that did not fit beside the payer's settlements in flight was refused.
pub(super) fn refusal(refused: Claim, value: U256, payer: &Payer, limits: &Limits) -> Invalid {
    let (reason, message) = match refused {
        Claim::OverLimit { exposed } if exposed.saturating_add(value) <= payer.balance => (
            Reason::Payload,
            "a smart-wallet payer settles one payment at a time: settle again once its settlement under way is answered".to_string(),
        ),
        Claim::OverLimit { exposed } => (
            Reason::InsufficientFunds,
            format!(
                "payer balance {} does not cover this payment and its {exposed} still being settled",
                payer.balance
            ),
        ),
        Claim::OverAllowance { exposed } => (
            Reason::Permit2Allowance,
            format!(
                "the payer's Permit2 allowance {} does not cover this payment and its {exposed} still being settled through Permit2",
                limits.permit2_allowance
            ),
        ),
        Claim::Permit2Clash(Permit2Clash::Approval) => (
            Reason::Payload,
            "an EIP-2612 permit approving Permit2 rides with this payment or with another Permit2 payment of this payer and token still being settled: the permit sets the allowance and spends the token's one permit nonce, so it is settled alone; settle again once that one is answered".to_string(),
        ),
        Claim::Permit2Clash(Permit2Clash::Nonce) => (
            Reason::Payload,
            "another payment of this payer still being settled uses the same Permit2 nonce (Permit2's nonces are the owner's across all tokens)".to_string(),
        ),
        Claim::Claimed | Claim::Exists(_) | Claim::KeyTaken => {
            unreachable!("`claim` answers these itself")
        }
    };
    Invalid {
        reason,
        message: message.into(),
    }
}

/// The gas limit of a settlement that the trial measured at `tried` gas: with headroom, never
/// under the calldata floor (EIP-7623), never over `bound` (`max_settlement_gas`); a settlement
/// that needs more than `bound` is refused before anything is sent.
pub(super) fn gas_limit(tried: u64, calldata: &[u8], bound: u64) -> Result<u64, Invalid> {
    let needed = tried.max(erc3009::calldata_floor_gas(calldata));
    if needed > bound {
        return Err(Invalid {
            reason: Reason::Payload,
            message: format!(
                "the settlement needs {needed} gas, above this network's max_settlement_gas ({bound})"
            )
            .into(),
        });
    }
    let limit = needed.saturating_mul(100 + GAS_HEADROOM_PERCENT) / 100;
    Ok(limit.min(bound))
}

/// The transaction that settles a payment: `transferWithAuthorization` on the token, or, for a
/// wallet not yet deployed (ERC-6492), the deployment and that call in one Multicall3 call.
pub(super) struct SettlementCall {
    pub(super) to: Address,
    pub(super) data: Bytes,
}

impl SettlementCall {
    pub(super) fn of(payment: &Payment<'_>) -> Self {
        let (to, transfer) = match payment.method {
            Method::Eip3009 => {
                let smart_wallet = payment.recovered != Some(payment.auth.from);
                let call = erc3009::transfer_with_authorization(
                    &payment.auth,
                    &payment.signature,
                    smart_wallet,
                );
                (payment.token.address, call)
            }
            Method::Permit2 => (permit2::EXACT_PROXY, permit2_settle(payment)),
            Method::Eip3009Receive | Method::Permit2Deposit { .. } => match &payment.through {
                Some(through) => (through.contract, through.calldata.clone()),
                None => unreachable!("a deposit's authorization is lowered with its call"),
            },
            Method::Permit2Upto { .. } => (permit2::UPTO_PROXY, permit2_settle(payment)),
        };
        match payment.counterfactual.deployment() {
            Some(deployment) => SettlementCall {
                to: erc6492::MULTICALL3,
                data: erc6492::deploy_then_call(deployment, to, &transfer),
            },
            None => SettlementCall { to, data: transfer },
        }
    }
}

/// The proxy's call: `settle`, or `settleWithPermit` when the payer approves Permit2 by an
/// EIP-2612 permit in the same transaction.
fn permit2_settle(payment: &Payment<'_>) -> Bytes {
    let (auth, signature) = (payment.permit2(), &payment.signature);
    match (payment.method, &payment.eip2612) {
        (Method::Permit2Upto { .. }, None) => {
            permit2::settle_upto(&auth, payment.charge(), signature)
        }
        (Method::Permit2Upto { .. }, Some(permit)) => {
            permit2::settle_upto_with_permit(permit, &auth, payment.charge(), signature)
        }
        (_, None) => permit2::settle(&auth, signature),
        (_, Some(permit)) => permit2::settle_with_permit(permit, &auth, signature),
    }
}

pub(super) fn new_record(
    payment: &Payment<'_>,
    call: SettlementCall,
    gas_limit: u64,
    asking: &Asking,
) -> EvmRecord {
    let valid_before = payment.auth.valid_before.min(U256::from(u64::MAX)).as_u64();
    let terms = EvmTerms {
        token: payment.token.address,
        payer: payment.auth.from,
        pay_to: payment.auth.to,
        nonce: payment.auth.nonce,
        valid_before,
        method: payment.method.transfer_method(),
        approves_permit2: payment.eip2612.is_some(),
        via: (call.to != payment.token.address).then_some(call.to),
        sender: match payment.method {
            Method::Permit2Upto { facilitator } => Some(facilitator),
            _ => None,
        },
        calldata: call.data,
        gas_limit,
    };
    let (network, value) = (payment.network.name.clone(), payment.charge());
    EvmRecord::new(network, value, payment.digest, terms).asked_by(asking)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::facilitator::outcome::Message;

    #[test]
    fn the_gas_limit_has_headroom_covers_the_calldata_floor_and_keeps_the_bound() {
        let small = [1u8; 100];
        assert_eq!(gas_limit(80_000, &small, 300_000), Ok(100_000));
        // A long signature's calldata: its floor (21,000 + 40 per byte) is above the trial.
        let long = [1u8; 5_000];
        assert_eq!(gas_limit(110_000, &long, 300_000), Ok(276_250));
        // Headroom never takes the limit over the bound.
        assert_eq!(gas_limit(280_000, &small, 300_000), Ok(300_000));
        for (tried, calldata) in [(300_001, &small[..]), (50_000, &[1u8; 8_000][..])] {
            let refused = gas_limit(tried, calldata, 300_000).unwrap_err();
            assert_eq!(refused.reason, Reason::Payload);
            assert!(
                matches!(&refused.message, Message::Text(text) if text.contains("max_settlement_gas"))
            );
        }
    }
}
