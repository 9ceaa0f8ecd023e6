//! The wire layer of the x402 versions, side by side: `v1` and `v2` each lower their request
//! into the one version-free, already-parsed `facilitator::evm::request::Request` (their own rules
//! 1-3, then the shared rules 4-5 of `values`), and raise verdicts and settlements back into
//! their own names and field paths. The version lives here only: past this layer a payment is
//! the same payment whichever version carried it.

pub mod eip2612;
pub mod status;
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
    use std::collections::BTreeMap;

    use ethers_core::types::{Address, H256};
    use serde_json::json;

    use super::*;
    use crate::facilitator::evm::request::Request;
    use crate::facilitator::evm::request::Served;
    use crate::facilitator::evm::request::TokenInfo;
    use crate::facilitator::outcome::Invalid;
    use crate::ledger::Reason;

    const ASSET: &str = "0x036CbD53842c5426634e7929541eC2318f3dCF7e";
    const PAYER: &str = "0x70997970C51812dc3A010C7d01b50e0d17dc79C8";
    const PAY_TO: &str = "0x3C44CdDdB6a900fa2b585dd299e03d12FA4293BC";

    /// base-sepolia, serving one token.
    struct Config;

    impl Served for Config {
        fn tokens(&self, network: &str) -> Option<&[TokenInfo]> {
            static TOKENS: std::sync::OnceLock<Vec<TokenInfo>> = std::sync::OnceLock::new();
            let tokens = TOKENS.get_or_init(|| {
                vec![TokenInfo {
                    address: ASSET.parse().unwrap(),
                    eip712_name: "USDC".into(),
                    eip712_version: "2".into(),
                    domain_separator: H256::zero(),
                    eip3009: true,
                    permit2: false,
                }]
            });
            (network == "base-sepolia").then_some(tokens.as_slice())
        }

        fn allow_http_resource(&self) -> bool {
            false
        }

        fn max_signature_bytes(&self) -> usize {
            100
        }
    }

    fn payload() -> serde_json::Value {
        json!({
            "signature": format!("0x{}", "11".repeat(65)),
            "authorization": {
                "from": PAYER, "to": PAY_TO, "value": "1000", "validAfter": "0",
                "validBefore": "9999999999", "nonce": format!("0x{}", "ab".repeat(32)),
            },
        })
    }

    fn v1_body() -> serde_json::Value {
        json!({
            "x402Version": 1,
            "paymentPayload": {
                "x402Version": 1, "scheme": "exact", "network": "base-sepolia", "payload": payload(),
            },
            "paymentRequirements": {
                "scheme": "exact", "network": "base-sepolia", "maxAmountRequired": "1000",
                "resource": "https://shop.example/weather", "description": "", "mimeType": "",
                "payTo": PAY_TO, "maxTimeoutSeconds": 60, "asset": ASSET,
                "extra": {"name": "USDC", "version": "2"},
            },
        })
    }

    fn v2_body() -> serde_json::Value {
        let required = json!({
            "scheme": "exact", "network": "eip155:84532", "amount": "1000", "asset": ASSET,
            "payTo": PAY_TO, "maxTimeoutSeconds": 60, "extra": {"name": "USDC", "version": "2"},
        });
        json!({
            "x402Version": 2,
            "paymentPayload": {
                "x402Version": 2, "resource": {"url": "https://shop.example/weather"},
                "accepted": required, "payload": payload(),
            },
            "paymentRequirements": required,
        })
    }

    /// Each version's lowering of its body after `change`: the request, or the refusal's
    /// reason and message as that version renders it.
    fn lower_both(
        change: impl Fn(&mut serde_json::Value, u8),
    ) -> [Result<Request, (Reason, String)>; 2] {
        let (mut one, mut two) = (v1_body(), v2_body());
        change(&mut one, 1);
        change(&mut two, 2);
        let said = |path: fn(_) -> _| move |f: Invalid| (f.reason, f.message.render(path));
        let one: v1::PaymentRequest = serde_json::from_value(one).unwrap();
        let two: v2::PaymentRequest = serde_json::from_value(two).unwrap();
        let by_chain_id = BTreeMap::from([(84532, "base-sepolia".to_string())]);
        [
            v1::lower(&one, &Config).map_err(said(v1::path)),
            v2::lower(&two, &by_chain_id, &Config).map_err(said(v2::path)),
        ]
    }

    fn requirements(body: &mut serde_json::Value) -> &mut serde_json::Value {
        &mut body["paymentRequirements"]
    }

    fn authorization(body: &mut serde_json::Value) -> &mut serde_json::Value {
        &mut body["paymentPayload"]["payload"]["authorization"]
    }

    #[test]
    fn both_versions_lower_into_the_same_request() {
        let [one, two] = lower_both(|_, _| {});
        let one = one.unwrap();
        assert_eq!(Ok(one.clone()), two);
        assert_eq!(one.network, "base-sepolia");
        assert_eq!(one.asset, ASSET.parse::<Address>().unwrap());
        assert_eq!(one.amount, 1000.into());
        assert_eq!(one.authorization.from, PAYER.parse::<Address>().unwrap());
        assert_eq!(one.signature.len(), 65);
    }

    #[test]
    fn refusals_name_the_field_as_each_version_spells_it() {
        let [one, two] = lower_both(|b, v| {
            let field = if v == 1 {
                "maxAmountRequired"
            } else {
                "amount"
            };
            requirements(b)[field] = json!("0");
            if v == 2 {
                b["paymentPayload"]["accepted"]["amount"] = json!("0");
            }
        });
        let refused = |m: &str| Err((Reason::PaymentRequirements, m.to_string()));
        assert_eq!(
            one,
            refused("paymentRequirements.maxAmountRequired: not a decimal amount above 0")
        );
        assert_eq!(
            two,
            refused("paymentRequirements.amount: not a decimal amount above 0")
        );
        let [one, two] = lower_both(|b, v| match v {
            1 => requirements(b)["resource"] = json!("http://shop.example/weather"),
            _ => b["paymentPayload"]["resource"]["url"] = json!("http://shop.example/weather"),
        });
        let problem = "not an https:// URL of 11 to 2048 characters";
        assert_eq!(
            one,
            refused(&format!("paymentRequirements.resource: {problem}"))
        );
        assert_eq!(
            two,
            refused(&format!("paymentPayload.resource.url: {problem}"))
        );
    }

    #[test]
    fn the_first_failure_in_rule_order_wins() {
        // Rule 4's token check comes before rule 5's payload values.
        for refused in lower_both(|b, v| {
            requirements(b)["asset"] = json!(PAYER);
            if v == 2 {
                b["paymentPayload"]["accepted"]["asset"] = json!(PAYER);
            }
            b["paymentPayload"]["payload"]["signature"] = json!("0xzz");
        }) {
            assert_eq!(
                refused,
                Err((
                    Reason::PaymentRequirements,
                    "paymentRequirements.asset: not a token this facilitator settles on that network"
                        .to_string()
                ))
            );
        }
        for refused in lower_both(|b, _| {
            authorization(b)["validAfter"] = json!("-1");
            authorization(b)["nonce"] = json!("0x12");
        }) {
            assert_eq!(
                refused,
                Err((
                    Reason::Payload,
                    "paymentPayload.payload.authorization.validAfter: not a decimal uint256"
                        .to_string()
                ))
            );
        }
        for refused in lower_both(|b, _| requirements(b)["extra"]["version"] = json!("1")) {
            assert_eq!(
                refused,
                Err((
                    Reason::PaymentRequirements,
                    "paymentRequirements.extra.version: does not match the token's EIP-712 domain"
                        .to_string()
                ))
            );
        }
    }

    #[test]
    fn rules_one_to_three_are_each_versions_own() {
        let [one, two] = lower_both(|b, v| {
            requirements(b)["network"] = json!(if v == 1 { "base" } else { "eip155:8453" });
            let payload = &mut b["paymentPayload"];
            match v {
                1 => payload["network"] = json!("base"),
                _ => payload["accepted"]["network"] = json!("eip155:8453"),
            }
        });
        assert_eq!(
            one,
            Err((
                Reason::Network,
                "network \"base\" is not served".to_string()
            ))
        );
        assert_eq!(
            two,
            Err((
                Reason::Network,
                "network \"eip155:8453\" is not served (eip155:<chain id> of a served chain)"
                    .to_string()
            ))
        );
    }

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
