//! The settlement ledger's model: what a settlement is, the only ways it moves on, what it is
//! keyed by and why it failed. Plain data and pure transitions, no I/O: the store keeps it, the
//! facilitator drives it, and neither is known here.

mod claim;
mod family;
pub mod keys;
mod reason;
pub mod record;
mod stored;

pub use claim::{EvmTerms, SvmTerms, Terms};
pub use family::{EvmPart, EvmRecord, SvmPart, SvmRecord, SvmSettlement};
pub use keys::{
    Account, AccountId, LaneId, Payer, PaymentId, PaymentKey, Permit2Nonce, RouterNonceKey,
    SvmAccount,
};
pub use reason::Reason;
pub use record::{
    depth, Asking, Attempt, Inclusion, Lost, Outcome, Pass, Record, RequestTag, State, TagKind,
    TransferMethod,
};
