//! Solana primitives for the `exact` scheme, with no I/O and no knowledge of their users: the
//! payer's wire transaction (decoded, its signatures checked, signed by the fee payer), the
//! instruction rules a payment transaction must follow, and associated token account derivation.
//! Nothing here imports `evm`, nor the reverse: the two chain families meet only in the rooms above.

mod ata;
pub mod exact;
pub mod mint;
mod programs;
mod transaction;

pub use ata::associated_token_address;
pub use exact::{
    check, max_settlement_fee, transfer_indexes, Limits, Refusal, Requirements, Transfer,
};
pub use mint::MintRefusal;
pub use programs::TokenProgram;
pub use solana_keypair::Keypair;
pub use solana_pubkey::Pubkey;
pub use solana_signature::Signature;
pub use transaction::{DecodeError, MessageHash, PaymentTransaction, SignedTransaction};
