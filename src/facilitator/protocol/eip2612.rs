//! x402 v2's `eip2612GasSponsoring` extension: a payer who has not approved Permit2 sends an
//! EIP-2612 permit that approves it, and the settlement submits that permit first (the proxies'
//! `settleWithPermit`), so the payer never pays gas. Its `info` is checked here against the
//! Permit2 payment it rides with, in `@x402/evm`'s terms.

use ethers_core::types::H256;
use serde::Deserialize;
use serde_json::Value;

use crate::evm::erc3009::split_signature;
use crate::evm::permit2::{self, Eip2612Permit};
use crate::evm::{parse_address, parse_decimal};
use crate::facilitator::evm::request::Request;
use crate::facilitator::outcome::Invalid;
use crate::ledger::Reason;

/// The extension's key in `paymentPayload.extensions`.
pub const KEY: &str = "eip2612GasSponsoring";

#[derive(Deserialize)]
struct Info {
    from: String,
    asset: String,
    spender: String,
    amount: String,
    deadline: String,
    signature: String,
}

/// The permit of `extension` (the extension's object), for the Permit2 payment `request`.
pub fn permit(extension: &Value, request: &Request) -> Result<Eip2612Permit, Invalid> {
    let format = |problem: &str| {
        Invalid::new(
            Reason::Eip2612Format,
            format!("paymentPayload.extensions.{KEY}.info: {problem}"),
        )
    };
    let info: Info = extension
        .get("info")
        .and_then(|info| serde_json::from_value(info.clone()).ok())
        .ok_or_else(|| format("missing, or not the extension's fields"))?;
    let address = |text: &str, name: &str| {
        parse_address(text).ok_or_else(|| format(&format!("{name} is not a 0x address")))
    };
    let uint = |text: &str, name: &str| {
        parse_decimal(text).ok_or_else(|| format(&format!("{name} is not a decimal uint256")))
    };
    let signature = crate::evm::hex_decode(&info.signature)
        .filter(|bytes| split_signature(bytes).is_some())
        .ok_or_else(|| format("signature is not a 65-byte signature"))?;
    let mismatch = |reason, what: &str| {
        Err(Invalid::new(
            reason,
            format!("paymentPayload.extensions.{KEY}.info.{what}"),
        ))
    };
    if address(&info.from, "from")? != request.authorization.from {
        return mismatch(Reason::Eip2612From, "from is not the payer");
    }
    if address(&info.asset, "asset")? != request.asset {
        return mismatch(Reason::Eip2612Asset, "asset is not the requirements' asset");
    }
    if address(&info.spender, "spender")? != permit2::PERMIT2 {
        return mismatch(Reason::Eip2612Spender, "spender is not Permit2");
    }
    let value = uint(&info.amount, "amount")?;
    if value != request.authorization.value {
        return mismatch(
            Reason::Eip2612Amount,
            "amount is not permit2Authorization.permitted.amount",
        );
    }
    Ok(Eip2612Permit {
        value,
        deadline: uint(&info.deadline, "deadline")?,
        v: signature[64],
        r: H256::from_slice(&signature[..32]),
        s: H256::from_slice(&signature[32..64]),
    })
}
