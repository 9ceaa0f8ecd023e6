//! Why a payment failed, as the ledger stores it. The stored names are spelled out here, one per
//! variant, so that renaming a variant or a wire name never changes what is on disk; the wire
//! names of each protocol version are the facilitator's (`facilitator::protocol`).

use serde::{Deserialize, Serialize};

/// Why a payment fails verification, in the order of the rules (x402-facilitator.md §2).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Reason {
    #[serde(rename = "X402Version")]
    X402Version,
    #[serde(rename = "Scheme")]
    Scheme,
    #[serde(rename = "Network")]
    Network,
    #[serde(rename = "PaymentRequirements")]
    PaymentRequirements,
    #[serde(rename = "Payload")]
    Payload,
    #[serde(rename = "FromKyt")]
    FromKyt,
    #[serde(rename = "ToKyt")]
    ToKyt,
    #[serde(rename = "TypedDataMessage")]
    TypedDataMessage,
    #[serde(rename = "ValueTooLow")]
    ValueTooLow,
    #[serde(rename = "Value")]
    Value,
    #[serde(rename = "ValidAfter")]
    ValidAfter,
    #[serde(rename = "ValidBefore")]
    ValidBefore,
    #[serde(rename = "Signature")]
    Signature,
    #[serde(rename = "SignatureAddress")]
    SignatureAddress,
    #[serde(rename = "InsufficientFunds")]
    InsufficientFunds,
    /// The payment's nonce is claimed for settlement: being settled or settled (access.md §1).
    #[serde(rename = "AlreadySettled")]
    AlreadySettled,
    /// An ERC-6492 signature names a factory not on `facilitator.erc6492_factories`.
    #[serde(rename = "Erc6492Factory")]
    Erc6492Factory,
    /// A Permit2 authorization permits another token than the requirements' asset.
    #[serde(rename = "Permit2Token")]
    Permit2Token,
    /// A Permit2 authorization names another spender than x402's exact proxy.
    #[serde(rename = "Permit2Spender")]
    Permit2Spender,
    /// The payer has not approved Permit2 for the amount.
    #[serde(rename = "Permit2Allowance")]
    Permit2Allowance,
    /// An `upto` witness names a facilitator that is not one of this facilitator's signers.
    #[serde(rename = "UptoFacilitator")]
    UptoFacilitator,
    /// An `upto` charge above the permitted amount.
    #[serde(rename = "UptoOverPermit")]
    UptoOverPermit,
    /// At verify, an `upto` permit that does not permit exactly the requirements' maximum.
    #[serde(rename = "UptoPermitAmount")]
    UptoPermitAmount,
    /// An `eip2612GasSponsoring` extension whose info is not the extension's fields.
    #[serde(rename = "Eip2612Format")]
    Eip2612Format,
    /// Its permit is not the payer's, not for the asset, not for Permit2, not for the
    /// permitted amount, or expired.
    #[serde(rename = "Eip2612From")]
    Eip2612From,
    #[serde(rename = "Eip2612Asset")]
    Eip2612Asset,
    #[serde(rename = "Eip2612Spender")]
    Eip2612Spender,
    #[serde(rename = "Eip2612Amount")]
    Eip2612Amount,
    #[serde(rename = "Eip2612Deadline")]
    Eip2612Deadline,
}

impl Reason {
    /// Every reason, for tests that check each has a name in every list.
    #[cfg(test)]
    pub const ALL: [Reason; 29] = [
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
        Reason::Erc6492Factory,
        Reason::Permit2Token,
        Reason::Permit2Spender,
        Reason::Permit2Allowance,
        Reason::UptoFacilitator,
        Reason::UptoOverPermit,
        Reason::UptoPermitAmount,
        Reason::Eip2612Format,
        Reason::Eip2612From,
        Reason::Eip2612Asset,
        Reason::Eip2612Spender,
        Reason::Eip2612Amount,
        Reason::Eip2612Deadline,
    ];
}
