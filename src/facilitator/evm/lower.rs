//! The EVM lowering: a version's strings ([`Values`], after its own rules 1-3 in `protocol`)
//! become the one typed [`Request`] by rules 4 and 5 of x402-facilitator.md §2, or the first
//! failure in rule order, naming its [`Field`]; v2's `eip2612GasSponsoring` permit is checked
//! against the Permit2 payment it rides with. Nothing here knows which version carried the
//! strings.

use std::collections::BTreeMap;

use ethers_core::types::{Address, H256, U256};
use serde::Deserialize;
use serde_json::Value;

use super::request::{Method, Request, Served, TokenInfo};
use crate::evm;
use crate::evm::erc3009::{split_signature, TransferAuthorization};
use crate::evm::permit2::{self, Eip2612Permit};
use crate::evm::{parse_address, parse_decimal};
use crate::facilitator::outcome::{Field, Invalid};
use crate::facilitator::protocol::eip2612::KEY;
use crate::facilitator::protocol::values::{Authorization, Payload, Permit2Payload};
use crate::facilitator::protocol::values::{Scheme, Signed, Values};
use crate::facilitator::protocol::{v1, v2};
use crate::ledger::Reason;

/// Rules 1-3 in v1's terms, then the shared rules 4-5: the version-free request, or the first
/// failure.
pub fn lower_v1(request: &v1::PaymentRequest, served: &dyn Served) -> Result<Request, Invalid> {
    parse(v1::values(request)?, served)
}

/// v2's own rules, then the shared rules 4-5 and the `eip2612GasSponsoring` permit of a
/// Permit2 payment. `by_chain_id` maps served chain ids to configured network names.
pub fn lower_v2(
    request: &v2::PaymentRequest,
    by_chain_id: &BTreeMap<u64, String>,
    served: &dyn Served,
) -> Result<Request, Invalid> {
    let mut lowered = parse(v2::values(request, by_chain_id)?, served)?;
    let sponsored = v2::eip2612_extension(request);
    if let Some(extension) = sponsored.filter(|_| lowered.method.is_permit2()) {
        lowered.eip2612 = Some(permit(extension, &lowered)?);
    }
    Ok(lowered)
}

/// Rules 4 then 5 on a request whose rules 1-3 passed.
pub fn parse(values: Values<'_>, served: &dyn Served) -> Result<Request, Invalid> {
    let tokens = served.tokens(values.network).ok_or_else(|| {
        // Rule 3's last test: v1 names the network as configured, and it is served or not
        // here; v2 found it by its chain id, so it is served.
        Invalid::new(
            Reason::Network,
            format!("network {:?} is not served", values.network),
        )
    })?;
    let terms = requirements(&values, tokens, served.allow_http_resource())?;
    let (authorization, permit2, signature) =
        payload(&values.payload, served.max_signature_bytes())?;
    let method = match (permit2, values.scheme) {
        (Some(permitted), scheme) => check_permit2(&permitted, &terms, scheme)?,
        (None, Scheme::Exact) => Method::Eip3009,
        (None, Scheme::Upto) => {
            return Err(Invalid::field(
                Reason::Payload,
                Field::Authorization,
                "upto is paid through Permit2 only (permit2Authorization)",
            ))
        }
    };
    let allowed = match method {
        Method::Eip3009 | Method::Eip3009Receive => terms.token.eip3009,
        Method::Permit2 | Method::Permit2Upto { .. } | Method::Permit2Deposit { .. } => {
            terms.token.permit2
        }
    };
    if !allowed {
        return Err(Invalid::field(
            Reason::PaymentRequirements,
            Field::Asset,
            format!(
                "not settled here by {} (the token's transfer_methods)",
                method.name()
            ),
        ));
    }
    Ok(Request {
        network: values.network.to_string(),
        asset: terms.asset,
        pay_to: terms.pay_to,
        amount: terms.amount,
        resource: values.resource.to_string(),
        max_timeout_seconds: terms.max_timeout_seconds,
        authorization,
        method,
        eip2612: None,
        signature,
        through: None,
    })
}

/// The requirements' values, once parsed.
struct Terms<'a> {
    amount: U256,
    pay_to: Address,
    asset: Address,
    max_timeout_seconds: u64,
    token: &'a TokenInfo,
}

/// Rule 4: the requirements' values, and that they name a token configured for the network.
fn requirements<'t>(
    values: &Values<'_>,
    tokens: &'t [TokenInfo],
    allow_http: bool,
) -> Result<Terms<'t>, Invalid> {
    let bad = |field, problem: &str| Invalid::field(Reason::PaymentRequirements, field, problem);
    // An upto charge may be nothing: the resource was not used.
    let amount = parse_decimal(values.amount)
        .filter(|v| !v.is_zero() || values.scheme == Scheme::Upto)
        .ok_or_else(|| bad(Field::Amount, "not a decimal amount above 0"))?;
    if !resource_allowed(values.resource, allow_http) {
        return Err(bad(
            Field::Resource,
            if allow_http {
                "not an http:// or https:// URL of 11 to 2048 characters"
            } else {
                "not an https:// URL of 11 to 2048 characters"
            },
        ));
    }
    let pay_to =
        parse_address(values.pay_to).ok_or_else(|| bad(Field::PayTo, "not a 0x address"))?;
    let asset = parse_address(values.asset).ok_or_else(|| bad(Field::Asset, "not a 0x address"))?;
    let max_timeout_seconds = values
        .max_timeout_seconds
        .as_u64()
        .filter(|&t| t >= 1)
        .ok_or_else(|| {
            bad(
                Field::MaxTimeoutSeconds,
                "must be a whole number of at least 1",
            )
        })?;
    let token = tokens.iter().find(|t| t.address == asset).ok_or_else(|| {
        bad(
            Field::Asset,
            "not a token this facilitator settles on that network",
        )
    })?;
    for (field, name, expected) in [
        (Field::ExtraName, "name", &token.eip712_name),
        (Field::ExtraVersion, "version", &token.eip712_version),
    ] {
        match values.extra.and_then(|e| e.get(name)) {
            None | Some(Value::Null) => {}
            Some(Value::String(given)) if given == expected => {}
            Some(_) => return Err(bad(field, "does not match the token's EIP-712 domain")),
        }
    }
    Ok(Terms {
        amount,
        pay_to,
        asset,
        max_timeout_seconds,
        token,
    })
}

fn resource_allowed(resource: &str, allow_http: bool) -> bool {
    let scheme_ok = resource.starts_with("https://")
        || (allow_http && resource.starts_with("http://") && resource.len() > "http://".len());
    scheme_ok && (11..=2048).contains(&resource.len())
}

/// What a Permit2 authorization permits beyond ERC-3009's terms.
pub struct Permit2Terms {
    pub token: Address,
    pub spender: Address,
    /// `upto`'s witness: who may settle it.
    pub facilitator: Option<Address>,
}

/// Rule 5: the payload's values. A Permit2 authorization is carried in ERC-3009's terms (owner,
/// payee, amount, validAfter, deadline as validBefore, nonce), with the token and spender it
/// names.
pub fn payload(
    payload: &Payload<'_>,
    max_signature_bytes: usize,
) -> Result<(TransferAuthorization, Option<Permit2Terms>, Vec<u8>), Invalid> {
    let signature = signature(payload.signature, max_signature_bytes)?;
    let (authorization, permit2) = match &payload.signed {
        Signed::Eip3009(a) => (authorization(a)?, None),
        Signed::Permit2(p) => {
            let (authorization, terms) = permit2_values(p)?;
            (authorization, Some(terms))
        }
        Signed::Missing => {
            return Err(Invalid::field(
                Reason::Payload,
                Field::Authorization,
                "missing (neither authorization nor permit2Authorization)",
            ))
        }
    };
    Ok((authorization, permit2, signature))
}

fn signature(signature: &str, max_signature_bytes: usize) -> Result<Vec<u8>, Invalid> {
    let bad = |problem: &str| Invalid::field(Reason::Payload, Field::Signature, problem);
    if signature.len() > 2 + 2 * max_signature_bytes {
        return Err(bad(&format!(
            "longer than {max_signature_bytes} bytes (facilitator.max_signature_bytes)"
        )));
    }
    evm::hex_decode(signature)
        .filter(|s| !s.is_empty())
        .ok_or_else(|| bad("not 0x-hex"))
}

fn address(field: Field, text: &str) -> Result<Address, Invalid> {
    parse_address(text).ok_or_else(|| Invalid::field(Reason::Payload, field, "not a 0x address"))
}

fn uint(field: Field, text: &str) -> Result<U256, Invalid> {
    parse_decimal(text)
        .ok_or_else(|| Invalid::field(Reason::Payload, field, "not a decimal uint256"))
}

fn authorization(a: &Authorization) -> Result<TransferAuthorization, Invalid> {
    Ok(TransferAuthorization {
        from: address(Field::From, &a.from)?,
        to: address(Field::To, &a.to)?,
        value: uint(Field::Value, &a.value)?,
        valid_after: uint(Field::ValidAfter, &a.valid_after)?,
        valid_before: uint(Field::ValidBefore, &a.valid_before)?,
        nonce: evm::parse_h256(&a.nonce).ok_or_else(|| {
            Invalid::field(Reason::Payload, Field::Nonce, "not 0x + 64 hex digits")
        })?,
    })
}

fn permit2_values(p: &Permit2Payload) -> Result<(TransferAuthorization, Permit2Terms), Invalid> {
    let authorization = TransferAuthorization {
        from: address(Field::Permit2From, &p.from)?,
        to: address(Field::WitnessTo, &p.witness.to)?,
        value: uint(Field::Permit2Amount, &p.permitted.amount)?,
        valid_after: uint(Field::WitnessValidAfter, &p.witness.valid_after)?,
        valid_before: uint(Field::Permit2Deadline, &p.deadline)?,
        nonce: H256(uint(Field::Permit2Nonce, &p.nonce)?.into()),
    };
    let terms = Permit2Terms {
        token: address(Field::Permit2Token, &p.permitted.token)?,
        spender: address(Field::Permit2Spender, &p.spender)?,
        facilitator: p
            .witness
            .facilitator
            .as_deref()
            .map(|f| address(Field::WitnessFacilitator, f))
            .transpose()?,
    };
    Ok((authorization, terms))
}

/// A Permit2 authorization must permit the requirements' asset and name the scheme's x402 proxy
/// as the spender: only those proxies pay no one but the witness's `to`. An `upto` witness names
/// its facilitator.
fn check_permit2(
    permitted: &Permit2Terms,
    terms: &Terms<'_>,
    scheme: Scheme,
) -> Result<Method, Invalid> {
    if permitted.token != terms.asset {
        return Err(Invalid::field(
            Reason::Permit2Token,
            Field::Permit2Token,
            "is not the requirements' asset",
        ));
    }
    let (proxy, which) = match scheme {
        Scheme::Exact => (
            permit2::EXACT_PROXY,
            "exact Permit2 proxy (0x402085c248EeA27D92E8b30b2C58ed07f9E20001)",
        ),
        Scheme::Upto => (
            permit2::UPTO_PROXY,
            "upto Permit2 proxy (0x4020A4f3b7b90ccA423B9fabCc0CE57C6C240002)",
        ),
    };
    if permitted.spender != proxy {
        return Err(Invalid::field(
            Reason::Permit2Spender,
            Field::Permit2Spender,
            format!("is not x402's {which}"),
        ));
    }
    match (scheme, permitted.facilitator) {
        (Scheme::Exact, _) => Ok(Method::Permit2),
        (Scheme::Upto, Some(facilitator)) => Ok(Method::Permit2Upto { facilitator }),
        (Scheme::Upto, None) => Err(Invalid::field(
            Reason::Payload,
            Field::WitnessFacilitator,
            "missing (upto names who may settle it)",
        )),
    }
}

#[derive(Deserialize)]
struct Info {
    from: String,
    asset: String,
    spender: String,
    amount: String,
    deadline: String,
    signature: String,
}

/// The permit of `extension` (the extension's object), for the Permit2 payment `request`.
pub fn permit(extension: &Value, request: &Request) -> Result<Eip2612Permit, Invalid> {
    let format = |problem: &str| {
        Invalid::new(
            Reason::Eip2612Format,
            format!("paymentPayload.extensions.{KEY}.info: {problem}"),
        )
    };
    let info: Info = extension
        .get("info")
        .and_then(|info| serde_json::from_value(info.clone()).ok())
        .ok_or_else(|| format("missing, or not the extension's fields"))?;
    let address = |text: &str, name: &str| {
        parse_address(text).ok_or_else(|| format(&format!("{name} is not a 0x address")))
    };
    let uint = |text: &str, name: &str| {
        parse_decimal(text).ok_or_else(|| format(&format!("{name} is not a decimal uint256")))
    };
    let signature = crate::evm::hex_decode(&info.signature)
        .filter(|bytes| split_signature(bytes).is_some())
        .ok_or_else(|| format("signature is not a 65-byte signature"))?;
    let mismatch = |reason, what: &str| {
        Err(Invalid::new(
            reason,
            format!("paymentPayload.extensions.{KEY}.info.{what}"),
        ))
    };
    if address(&info.from, "from")? != request.authorization.from {
        return mismatch(Reason::Eip2612From, "from is not the payer");
    }
    if address(&info.asset, "asset")? != request.asset {
        return mismatch(Reason::Eip2612Asset, "asset is not the requirements' asset");
    }
    if address(&info.spender, "spender")? != permit2::PERMIT2 {
        return mismatch(Reason::Eip2612Spender, "spender is not Permit2");
    }
    let value = uint(&info.amount, "amount")?;
    if value != request.authorization.value {
        return mismatch(
            Reason::Eip2612Amount,
            "amount is not permit2Authorization.permitted.amount",
        );
    }
    Ok(Eip2612Permit {
        value,
        deadline: uint(&info.deadline, "deadline")?,
        v: signature[64],
        r: H256::from_slice(&signature[..32]),
        s: H256::from_slice(&signature[32..64]),
    })
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

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
            lower_v1(&one, &Config).map_err(said(v1::path)),
            lower_v2(&two, &by_chain_id, &Config).map_err(said(v2::path)),
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
    fn http_resources_only_when_allowed() {
        assert!(resource_allowed("https://a.example/x", false));
        assert!(!resource_allowed("http://127.0.0.1:3000/x", false));
        assert!(resource_allowed("http://127.0.0.1:3000/x", true));
        assert!(!resource_allowed("ftp://a.example/x", true));
        assert!(!resource_allowed("https://", true));
    }
}
