//! What a reverted call says.

use ethers_core::abi::{decode, ParamType, Token};
use ethers_core::utils::id;

use super::hex_bytes;

/// The reason in revert data encoded as `Error(string)`, as Solidity's `require` and
/// `revert("...")` write it.
pub fn error_string(data: &[u8]) -> Option<String> {
    if data.len() < 4 || data[..4] != id("Error(string)") {
        return None;
    }
    match decode(&[ParamType::String], &data[4..]).ok()?.pop()? {
        Token::String(reason) => Some(reason),
        _ => None,
    }
}

/// What revert data says, for a person: its `Error(string)` reason, or the data itself.
pub fn revert_message(data: &[u8]) -> String {
    match error_string(data) {
        Some(reason) => reason,
        None if data.is_empty() => "execution reverted".to_string(),
        None => format!("execution reverted with {}", hex_bytes(data)),
    }
}
