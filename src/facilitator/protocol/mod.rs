//! The wire layer of the x402 versions, side by side: `v1` and `v2` each check their own rules
//! 1-3 and hand the strings of their request (`values`) to the family's lowering (the EVM one is
//! `facilitator::evm::lower`), and raise verdicts and settlements back into their own names and
//! field paths. The version lives here only: past this layer a payment is
//! the same payment whichever version carried it.

pub mod eip2612;
pub mod read;
pub mod v1;
pub mod v2;
pub mod values;

use serde_json::Value;

/// The x402 version a request body speaks, as it says: its top-level `x402Version`, or, where
/// that is absent (v2's own examples leave it out), `paymentPayload.x402Version`.
pub fn version_of(body: &Value) -> Option<u64> {
    body.get("x402Version")
        .or_else(|| body.get("paymentPayload")?.get("x402Version"))
        .and_then(Value::as_u64)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn the_body_names_its_version() {
        assert_eq!(version_of(&json!({"x402Version": 2})), Some(2));
        assert_eq!(
            version_of(&json!({"paymentPayload": {"x402Version": 2}})),
            Some(2)
        );
        assert_eq!(
            version_of(&json!({"x402Version": 1, "paymentPayload": {"x402Version": 2}})),
            Some(1)
        );
        assert_eq!(version_of(&json!({"x402Version": "2"})), None);
        assert_eq!(version_of(&json!([])), None);
    }
}
