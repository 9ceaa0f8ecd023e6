//! Hex as EVM nodes and clients write it: quantities, bytes, addresses and 32-byte words. One
//! copy of each parser, for what clients send and what nodes answer alike.

use ethers_core::types::{H256, U256};
use serde_json::Value;

pub use crate::primitives::hex_bytes;

pub fn hex_u256(n: U256) -> String {
    format!("{n:#x}")
}

/// Decodes `0x`-prefixed hex with an even number of digits.
pub fn hex_decode(s: &str) -> Option<Vec<u8>> {
    let digits = s.strip_prefix("0x").or_else(|| s.strip_prefix("0X"))?;
    // const-hex checks every digit (vectorised: verify decodes kilobytes of lens calls and
    // answers), but would take a second `0x` (or `0X`) as a prefix too.
    if matches!(digits.as_bytes(), [b'0', b'x' | b'X', ..]) {
        return None;
    }
    const_hex::decode(digits).ok()
}

/// Reads a JSON-RPC hex quantity (`"0x1a"`).
pub fn parse_quantity(value: &Value) -> Option<U256> {
    let s = value.as_str()?;
    let digits = s.strip_prefix("0x")?;
    if digits.is_empty() || digits.len() > 64 {
        return None;
    }
    U256::from_str_radix(digits, 16).ok()
}

pub fn parse_u64(value: &Value) -> Option<u64> {
    parse_quantity(value)
        .filter(|n| *n <= U256::from(u64::MAX))
        .map(|n| n.as_u64())
}

/// A 32-byte value written `0x` + 64 hex digits: a nonce, a digest, a block or transaction hash.
pub fn parse_h256(s: &str) -> Option<H256> {
    let digits = s.strip_prefix("0x")?;
    let bytes = hex_decode(s).filter(|_| digits.len() == 64)?;
    (bytes.len() == 32).then(|| H256::from_slice(&bytes))
}

/// Reads an ABI-encoded word answer of `eth_call` (`0x` + 64 hex digits).
pub fn parse_word(value: &Value) -> Option<U256> {
    let bytes = hex_decode(value.as_str()?)?;
    (bytes.len() >= 32).then(|| U256::from_big_endian(&bytes[..32]))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn hex_round_trip() {
        assert_eq!(hex_decode("0x00ff10"), Some(vec![0, 255, 16]));
        assert_eq!(hex_decode("0x0"), None);
        assert_eq!(hex_decode("00"), None);
        assert_eq!(hex_decode("0xzz"), None);
        assert_eq!(hex_decode("0x0x00"), None);
        // Found by the fuzzer: a second prefix in capitals left 31 bytes for a 32-byte hash.
        assert_eq!(hex_decode("0x0X00"), None);
        let nonce = format!("0x0X{}", "0".repeat(62));
        assert_eq!(parse_h256(&nonce), None);
        assert_eq!(hex_decode("0XAbCd"), Some(vec![0xab, 0xcd]));
        for bad in [
            "0x 0",
            "0x00g0",
            "0x0\u{e9}",
            "0x+1",
            "0x00 ",
            "0x-0",
            "0x0\n",
        ] {
            assert_eq!(hex_decode(bad), None, "{bad:?}");
        }
        let long = format!("0x{}zz", "ab".repeat(600));
        assert_eq!(hex_decode(&long), None);
        assert_eq!(hex_bytes([0, 255, 16]), "0x00ff10");
    }

    #[test]
    fn quantities() {
        assert_eq!(parse_quantity(&json!("0x1a")), Some(U256::from(26)));
        assert_eq!(parse_quantity(&json!("1a")), None);
        assert_eq!(parse_quantity(&json!("0x")), None);
        assert_eq!(parse_u64(&json!("0x10000000000000000")), None);
        assert_eq!(hex_u256(U256::from(255)), "0xff");
        assert_eq!(hex_u256(U256::zero()), "0x0");
    }
}
