//! Values as clients write them: addresses (any case, or held to their EIP-55 checksum) and
//! uint256 amounts (decimal, or hex or decimal). One copy of each, for the router, the
//! facilitator and the server alike.

use ethers_core::types::{Address, U256};
use ethers_core::utils::to_checksum;

use super::hex_decode;

/// `^0x[0-9a-fA-F]{40}$`, case-insensitive as the spec's pattern allows.
pub fn parse_address(s: &str) -> Option<Address> {
    let digits = s.strip_prefix("0x")?;
    (digits.len() == 40 && digits.bytes().all(|b| b.is_ascii_hexdigit()))
        .then(|| hex_decode(s).map(|b| Address::from_slice(&b)))
        .flatten()
}

/// A decimal uint256: digits only, no sign, spaces or hex, at most 2^256-1.
pub fn parse_decimal(s: &str) -> Option<U256> {
    if s.is_empty() || s.len() > 78 || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    U256::from_dec_str(s).ok()
}

/// `0x` + 40 hex digits; mixed case must be a valid EIP-55 checksum.
pub fn parse_checksummed(s: &str) -> Result<Address, &'static str> {
    let digits = s
        .strip_prefix("0x")
        .ok_or("expected 0x followed by 40 hex digits")?;
    if digits.len() != 40 || !digits.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err("expected 0x followed by 40 hex digits");
    }
    let address =
        Address::from_slice(&hex_decode(s).ok_or("expected 0x followed by 40 hex digits")?);
    let mixed = digits.bytes().any(|b| b.is_ascii_lowercase())
        && digits.bytes().any(|b| b.is_ascii_uppercase());
    if mixed && to_checksum(&address, None) != s {
        return Err("mixed-case address with an invalid EIP-55 checksum");
    }
    Ok(address)
}

/// A uint256 written in hex (`0x` + 1 to 64 digits) or in decimal ([`parse_decimal`]).
pub fn parse_uint(s: &str) -> Option<U256> {
    if let Some(hex) = s.strip_prefix("0x") {
        if hex.is_empty() || hex.len() > 64 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
            return None;
        }
        return U256::from_str_radix(hex, 16).ok();
    }
    parse_decimal(s)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::evm::parse_h256;

    #[test]
    fn decimals_reject_sign_hex_space_and_overflow() {
        assert_eq!(parse_decimal("1000"), Some(U256::from(1000)));
        assert_eq!(parse_decimal("007"), Some(U256::from(7)));
        for bad in ["", "-1", "+1", "0x10", " 1", "1 ", "1.0", "1e3"] {
            assert_eq!(parse_decimal(bad), None, "{bad:?}");
        }
        let max = U256::MAX.to_string();
        assert_eq!(parse_decimal(&max), Some(U256::MAX));
        assert_eq!(parse_decimal(&format!("{max}0")), None);
        assert_eq!(
            parse_decimal(
                "115792089237316195423570985008687907853269984665640564039457584007913129639936"
            ),
            None
        );
    }

    #[test]
    fn eip55s_own_examples_are_taken_and_a_wrong_case_refused() {
        for written in [
            "0x5aAeb6053F3E94C9b9A09f33669435E7Ef1BeAed",
            "0xfB6916095ca1df60bB79Ce92cE3Ea74c37c5d359",
            "0xdbF03B407c01E7cD3CBea99509d93f8DDDC8C6FB",
            "0xD1220A0cf47c7B9Be7A2E6BA89F429762e7b9aDb",
        ] {
            assert_eq!(
                parse_checksummed(written),
                Ok(parse_address(written).unwrap())
            );
            let wrong = written.replacen('a', "A", 1);
            assert!(parse_checksummed(&wrong).is_err(), "{wrong}");
        }
    }

    #[test]
    fn addresses_and_nonces() {
        assert!(parse_address("0x70997970C51812dc3A010C7d01b50e0d17dc79C8").is_some());
        assert!(parse_address("0x70997970c51812dc3a010c7d01b50e0d17dc79c8").is_some());
        for bad in [
            "70997970c51812dc3a010c7d01b50e0d17dc79c8",
            "0x7099",
            "0x70997970c51812dc3a010c7d01b50e0d17dc79cz",
            "0X70997970c51812dc3a010c7d01b50e0d17dc79c8",
        ] {
            assert!(parse_address(bad).is_none(), "{bad}");
        }
        assert!(parse_h256(&format!("0x{}", "ab".repeat(32))).is_some());
        assert!(parse_h256(&format!("0x{}", "ab".repeat(31))).is_none());
    }

    #[test]
    fn uints_in_hex_or_decimal() {
        assert_eq!(parse_uint("0x10"), Some(U256::from(16)));
        assert_eq!(parse_uint("16"), Some(U256::from(16)));
        assert_eq!(parse_uint("0x"), None);
        assert_eq!(parse_uint("-1"), None);
        assert!(parse_checksummed("0x70997970C51812dc3A010C7d01b50e0d17dc79C8").is_ok());
        assert!(parse_checksummed("0x70997970C51812dc3A010C7d01b50e0d17dc79c8").is_err());
    }
}
