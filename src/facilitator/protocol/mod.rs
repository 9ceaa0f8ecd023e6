//! The wire layer of the x402 versions: each version's shapes map into the one version-free
//! request the rule engine and the ledger use, and their answers back into that version's
//! names. v1's shapes are the engine's own (`types`); v2's live in `v2`. The version lives here
//! only: past this layer a payment is the same payment whichever version carried it.

pub mod v2;

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
    use super::*;
    use serde_json::json;

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
