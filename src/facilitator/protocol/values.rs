//! Rules 4 and 5 of x402-facilitator.md §2, shared by every version: the strings a version's
//! request carries become the typed values of the one [`Request`], or the first failure in rule
//! order, naming its [`Field`]. Nothing here knows which version carried the strings.

use ethers_core::types::{Address, H256, U256};
use serde::Deserialize;
use serde_json::{Map, Number, Value};

use crate::evm;
use crate::evm::erc3009::TransferAuthorization;
use crate::evm::permit2;
use crate::evm::{parse_address, parse_decimal};
use crate::facilitator::evm::request::{Method, Request};
use crate::facilitator::evm::request::{Served, TokenInfo};
use crate::facilitator::outcome::{Field, Invalid};
use crate::ledger::Reason;

/// The `exact` scheme's EVM payload as v1 carries it: ERC-3009 only.
#[derive(Debug, Clone, Deserialize)]
pub struct ExactEvmPayload {
    pub signature: String,
    pub authorization: Authorization,
}

/// v2's: ERC-3009's `authorization`, or Permit2's `permit2Authorization`.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ExactEvmPayloadV2 {
    pub signature: String,
    #[serde(default)]
    pub authorization: Option<Authorization>,
    #[serde(default)]
    pub permit2_authorization: Option<Box<Permit2Payload>>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Permit2Payload {
    pub from: String,
    pub permitted: Permitted,
    pub spender: String,
    pub nonce: String,
    pub deadline: String,
    pub witness: Witness,
}

#[derive(Debug, Clone, Deserialize)]
pub struct Permitted {
    pub token: String,
    pub amount: String,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Witness {
    pub to: String,
    pub valid_after: String,
    /// `upto` only: who may settle it.
    #[serde(default)]
    pub facilitator: Option<String>,
}

/// The payment scheme a request names (rule 2): v1 has only `exact`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scheme {
    Exact,
    /// x402's `upto` (v2, Permit2): the requirements' amount is what is charged, at most the
    /// permitted amount, and may be zero.
    Upto,
}

/// A payload's signature and what it signs, whichever version carried it.
#[derive(Clone)]
pub struct Payload<'a> {
    pub signature: &'a str,
    pub signed: Signed<'a>,
}

#[derive(Clone)]
pub enum Signed<'a> {
    Eip3009(&'a Authorization),
    Permit2(&'a Permit2Payload),
    /// Neither authorization object.
    Missing,
}

impl<'a> From<&'a ExactEvmPayload> for Payload<'a> {
    fn from(payload: &'a ExactEvmPayload) -> Self {
        Payload {
            signature: &payload.signature,
            signed: Signed::Eip3009(&payload.authorization),
        }
    }
}

impl<'a> From<&'a ExactEvmPayloadV2> for Payload<'a> {
    fn from(payload: &'a ExactEvmPayloadV2) -> Self {
        let signed = match (&payload.permit2_authorization, &payload.authorization) {
            (Some(permit2), _) => Signed::Permit2(permit2),
            (None, Some(authorization)) => Signed::Eip3009(authorization),
            (None, None) => Signed::Missing,
        };
        Payload {
            signature: &payload.signature,
            signed,
        }
    }
}

impl Payload<'_> {
    /// Who pays, as sent.
    pub fn payer(&self) -> Option<&str> {
        match &self.signed {
            Signed::Eip3009(a) => Some(&a.from),
            Signed::Permit2(p) => Some(&p.from),
            Signed::Missing => None,
        }
    }

    /// The authorization's nonce, as sent.
    pub fn nonce(&self) -> Option<&str> {
        match &self.signed {
            Signed::Eip3009(a) => Some(&a.nonce),
            Signed::Permit2(p) => Some(&p.nonce),
            Signed::Missing => None,
        }
    }
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
    pub scheme: Scheme,
    pub amount: &'a str,
    pub resource: &'a str,
    pub pay_to: &'a str,
    pub asset: &'a str,
    pub max_timeout_seconds: &'a Number,
    pub extra: Option<&'a Map<String, Value>>,
    pub payload: Payload<'a>,
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
        Method::Eip3009 => terms.token.eip3009,
        Method::Permit2 | Method::Permit2Upto { .. } => terms.token.permit2,
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
