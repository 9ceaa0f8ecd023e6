//! What every version's EVM request carries for rules 4 and 5 of x402-facilitator.md §2: the
//! payload shapes and the strings [`Values`] that `facilitator::evm::lower` parses into the one
//! typed request. Nothing here knows which version carried the strings.

use serde::Deserialize;
use serde_json::{Map, Number, Value};

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
