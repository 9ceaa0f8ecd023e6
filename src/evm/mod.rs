//! EVM primitives, with no I/O and no knowledge of their users: hex and quantity parsers, fee
//! arithmetic, revert data, the ERC-3009 token's typed data and calldata, ERC-6492's wrapper,
//! and Permit2's typed data and calls. Every room above reads and writes chain values through here.

pub mod authorization_logs;
pub mod batch;
pub mod erc3009;
pub mod erc6492;
pub mod fee_history;
pub mod fees;
mod hex;
pub mod logs;
mod nonce;
pub mod permit2;
mod revert;
mod values;

pub use fee_history::RecentFees;
pub use fees::{Fees, TxFees};
pub use hex::{hex_bytes, hex_decode, hex_u256, parse_h256, parse_quantity, parse_u64, parse_word};
pub use nonce::NonceRead;
pub use revert::{error_string, revert_message};
pub use values::{parse_address, parse_checksummed, parse_decimal, parse_uint};
