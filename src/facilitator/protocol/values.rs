//! Rules 4 and 5 of x402-facilitator.md §2, shared by every version: the strings a version's
//! request carries become the typed values of the one [`Request`], or the first failure in rule
//! order, naming its [`Field`]. Nothing here knows which version carried the strings.

use ethers_core::types::{Address, U256};
use serde::Deserialize;
use serde_json::{Map, Number, Value};

use crate::evm;
use crate::evm::erc3009::TransferAuthorization;
use crate::evm::{parse_address, parse_decimal};
use crate::facilitator::request::{Field, Invalid, Request};
use crate::facilitator::request::{Served, TokenInfo};
use crate::ledger::Reason;

/// The `exact` scheme's EVM payload; both versions carry it.
#[derive(Debug, Clone, Deserialize)]
pub struct ExactEvmPayload {
    pub signature: String,
    pub authorization: Authorization,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Authorization {
    pub from: String,
    pub to: String,
    pub value: String,
    pub valid_after: String,
    pub valid_before: String,
    pub nonce: String,
}

/// A request's strings for rules 4 and 5, borrowed from whichever version carried them.
pub struct Values<'a> {
    /// The configured name of the served network the request names.
    pub network: &'a str,
    pub amount: &'a str,
    pub resource: &'a str,
    pub pay_to: &'a str,
    pub asset: &'a str,
    pub max_timeout_seconds: &'a Number,
    pub extra: Option<&'a Map<String, Value>>,
    pub payload: &'a ExactEvmPayload,
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
    let (authorization, signature) = payload(values.payload, served.max_signature_bytes())?;
    Ok(Request {
        network: values.network.to_string(),
        asset: terms.asset,
        pay_to: terms.pay_to,
        amount: terms.amount,
        resource: values.resource.to_string(),
        max_timeout_seconds: terms.max_timeout_seconds,
        authorization,
        signature,
    })
}

/// The requirements' values, once parsed.
struct Terms {
    amount: U256,
    pay_to: Address,
    asset: Address,
    max_timeout_seconds: u64,
}

/// Rule 4: the requirements' values, and that they name a token configured for the network.
fn requirements(
    values: &Values<'_>,
    tokens: &[TokenInfo],
    allow_http: bool,
) -> Result<Terms, Invalid> {
    let bad = |field, problem: &str| Invalid::field(Reason::PaymentRequirements, field, problem);
    let amount = parse_decimal(values.amount)
        .filter(|v| !v.is_zero())
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
    })
}

fn resource_allowed(resource: &str, allow_http: bool) -> bool {
    let scheme_ok = resource.starts_with("https://")
        || (allow_http && resource.starts_with("http://") && resource.len() > "http://".len());
    scheme_ok && (11..=2048).contains(&resource.len())
}

/// Rule 5: the payload's values.
pub fn payload(
    payload: &ExactEvmPayload,
    max_signature_bytes: usize,
) -> Result<(TransferAuthorization, Vec<u8>), Invalid> {
    let a = &payload.authorization;
    let bad = |field, problem: &str| Invalid::field(Reason::Payload, field, problem);
    if payload.signature.len() > 2 + 2 * max_signature_bytes {
        return Err(bad(
            Field::Signature,
            &format!("longer than {max_signature_bytes} bytes (facilitator.max_signature_bytes)"),
        ));
    }
    let signature = evm::hex_decode(&payload.signature)
        .filter(|s| !s.is_empty())
        .ok_or_else(|| bad(Field::Signature, "not 0x-hex"))?;
    let address =
        |field, text: &str| parse_address(text).ok_or_else(|| bad(field, "not a 0x address"));
    let uint =
        |field, text: &str| parse_decimal(text).ok_or_else(|| bad(field, "not a decimal uint256"));
    let auth = TransferAuthorization {
        from: address(Field::From, &a.from)?,
        to: address(Field::To, &a.to)?,
        value: uint(Field::Value, &a.value)?,
        valid_after: uint(Field::ValidAfter, &a.valid_after)?,
        valid_before: uint(Field::ValidBefore, &a.valid_before)?,
        nonce: evm::parse_h256(&a.nonce)
            .ok_or_else(|| bad(Field::Nonce, "not 0x + 64 hex digits"))?,
    };
    Ok((auth, signature))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn http_resources_only_when_allowed() {
        assert!(resource_allowed("https://a.example/x", false));
        assert!(!resource_allowed("http://127.0.0.1:3000/x", false));
        assert!(resource_allowed("http://127.0.0.1:3000/x", true));
        assert!(!resource_allowed("ftp://a.example/x", true));
        assert!(!resource_allowed("https://", true));
    }
}
