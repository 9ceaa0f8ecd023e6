//! The version-free EVM request. A [`Request`] is a payment as verify and settle take it,
//! whichever x402 version carried it: every value typed, and the rules that need only the
//! request and the served configuration (x402-facilitator.md §2, rules 1-5) passed. Its verdict
//! (`Invalid`, naming fields by `Field`) is every family's: `facilitator::outcome`.

use ethers_core::types::{Address, Bytes, H256, U256};

use crate::evm::erc3009::TransferAuthorization;
use crate::evm::permit2::Eip2612Permit;
use crate::ledger::TransferMethod;

/// One payment, parsed: what every rule from rule 6 on and the settlement read.
#[derive(Debug, Clone, PartialEq)]
pub struct Request {
    /// The configured name of the served network the payment is for.
    pub network: String,
    /// A token configured for `network`.
    pub asset: Address,
    pub pay_to: Address,
    /// What the requirements ask; above 0.
    pub amount: U256,
    pub resource: String,
    pub max_timeout_seconds: u64,
    /// What the payer signed. A Permit2 authorization is carried in the same terms: its owner,
    /// its witness's `to` and `validAfter`, its amount, its deadline and its nonce; a Permit2
    /// deposit's `to` is its spender (the collector), its `validAfter` 0.
    pub authorization: TransferAuthorization,
    /// How the funds move.
    pub method: Method,
    /// A Permit2 payer's EIP-2612 approval of Permit2, submitted in the settlement itself
    /// (x402 v2's `eip2612GasSponsoring`).
    pub eip2612: Option<Eip2612Permit>,
    /// Non-empty, and no longer than `facilitator.max_signature_bytes`.
    pub signature: Vec<u8>,
    /// The contract call that executes the authorization, when it is not the token's own or a
    /// proxy's (`Method::Eip3009Receive`, `Method::Permit2Deposit`).
    pub through: Option<Through>,
}

/// A contract call that executes a payer's authorization inside it: a `batch-settlement`
/// deposit, whose collector submits the `receiveWithAuthorization` or Permit2's
/// `permitWitnessTransferFrom`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Through {
    pub contract: Address,
    pub calldata: Bytes,
}

/// How a payment's funds move, as its payload says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Method {
    /// `transferWithAuthorization` on the token (ERC-3009).
    Eip3009,
    /// Permit2's `permitWitnessTransferFrom`, through x402's exact proxy as the spender.
    Permit2,
    /// x402's `upto` scheme: Permit2 through the upto proxy, which transfers what the
    /// requirements charge (at most the permitted amount) when `facilitator` sends it.
    Permit2Upto { facilitator: Address },
    /// ERC-3009's `receiveWithAuthorization`, submitted by its `to` (a deposit collector) inside
    /// the call `Request::through` names.
    Eip3009Receive,
    /// A `batch-settlement` deposit through Permit2: `permitWitnessTransferFrom` with the Permit2
    /// deposit collector as the spender (`authorization.to`) and a witness naming `channel`,
    /// submitted by that collector inside the call `Request::through` names.
    Permit2Deposit { channel: H256 },
}

impl Method {
    /// Through Permit2: `exact`, `upto` or a deposit.
    pub fn is_permit2(self) -> bool {
        matches!(
            self,
            Method::Permit2 | Method::Permit2Upto { .. } | Method::Permit2Deposit { .. }
        )
    }

    /// How the ledger stores it: `upto` and deposits through Permit2 move funds through Permit2
    /// too (its nonce bitmap, the payer's allowance of it).
    pub fn transfer_method(self) -> TransferMethod {
        match self.is_permit2() {
            true => TransferMethod::Permit2,
            false => TransferMethod::Eip3009,
        }
    }

    /// Its name in `transfer_methods`.
    pub fn name(self) -> &'static str {
        match self.is_permit2() {
            true => "permit2",
            false => "eip3009",
        }
    }
}

/// A token the facilitator settles, as configured.
pub struct TokenInfo {
    pub address: Address,
    pub eip712_name: String,
    pub eip712_version: String,
    pub domain_separator: H256,
    /// `transfer_methods`: ERC-3009 (`transferWithAuthorization`), Permit2, or both.
    pub eip3009: bool,
    pub permit2: bool,
}

/// What the lowering of a request needs to know of the configuration.
pub trait Served {
    /// The tokens of a served network; `None` when the network is not served.
    fn tokens(&self, network: &str) -> Option<&[TokenInfo]>;
    /// `facilitator.allow_http_resource`: rule 4 also accepts `http://` resources.
    fn allow_http_resource(&self) -> bool;
    /// `facilitator.max_signature_bytes`: longer signatures fail rule 5.
    fn max_signature_bytes(&self) -> usize;
}
