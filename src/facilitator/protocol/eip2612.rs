//! x402 v2's `eip2612GasSponsoring` extension: a payer who has not approved Permit2 sends an
//! EIP-2612 permit that approves it, and the settlement submits that permit first (the proxies'
//! `settleWithPermit`), so the payer never pays gas. Its `info` is checked against the Permit2
//! payment it rides with by the EVM lowering (`facilitator::evm::lower`), in `@x402/evm`'s terms.

/// The extension's key in `paymentPayload.extensions`.
pub const KEY: &str = "eip2612GasSponsoring";
