//! What the REST routes read: a body within its bounds, a payment in its version's and
//! family's wire type (straight into it where that is safe, else field by field naming the
//! field that fails), a settlement's status path, and whether a `POST /` body is JSON-RPC; and
//! the facilitator entry each payment's wire type is served by, so the routes match on no
//! wire type.

use std::str::FromStr;

use http::StatusCode;
use http_body_util::{BodyExt, Limited};
use jsonrpsee::server::HttpBody;

use super::Asker;
use crate::evm;
use crate::evm::parse_address;
use crate::facilitator::protocol::v1::{PaymentRequest, SettleResponse, VerifyResponse};
use crate::facilitator::protocol::values::Payload;
use crate::facilitator::protocol::{self, v2};
use crate::facilitator::svm::wire::{self as svm, SvmRequest};
use crate::facilitator::{Facilitator, SettleError};
use crate::ledger::{Asking, Pass, PaymentKey};
use crate::server::auth::{Key, Payee};
use crate::server::idempotency;
use crate::server::ops::NetworkFamily;
use crate::server::wire_errors::{parse_body, parse_value_with, WireError};
use crate::server::App;

pub(crate) fn parse_status_path(rest: &str) -> Result<PaymentKey, WireError> {
    let parts: Vec<&str> = rest.split('/').collect();
    let [network, asset, from, nonce] = parts[..] else {
        return Err(WireError::bad_request(
            "path: expected /settlements/{network}/{asset}/{from}/{nonce} or /settlements/{network}/{signature}",
        ));
    };
    let address = |field: &str, value: &str| {
        parse_address(value)
            .ok_or_else(|| WireError::bad_request(format!("{field}: not a 0x address")))
    };
    let nonce = evm::parse_h256(nonce)
        .ok_or_else(|| WireError::bad_request("nonce: not 0x + 64 hex digits"))?;
    if network.is_empty() {
        return Err(WireError::bad_request("network: empty"));
    }
    let (asset, from) = (address("asset", asset)?, address("from", from)?);
    Ok(PaymentKey::evm(network.to_string(), asset, from, nonce))
}

/// A facilitator request in the wire format of its x402 version; a Solana one in Solana's.
pub(crate) enum Payment {
    V1(PaymentRequest),
    V2(v2::PaymentRequest),
    Svm(SvmRequest),
}

/// One payment body, as its version's wire type.
pub(super) fn parse_payment_body(
    facilitator: &Facilitator,
    bytes: &[u8],
) -> Result<Payment, WireError> {
    match parse_payment_direct(facilitator.serves_v2(), bytes) {
        Some(payment) => Ok(payment),
        None => parse_payment(facilitator.serves_v2(), parse_body(bytes)?, ""),
    }
}

/// The common body, read straight into its wire type without building a JSON tree first; `None`
/// sends it the checked way, which reads it the same and names the field of any failure.
///
/// Only a body that says its version at the top level, as a number, is read here: then it is
/// the version [`protocol::version_of`] reads. A body with no `[` anywhere cannot hold an array
/// where an object belongs, which serde's derive would otherwise read as a tuple of fields.
pub(crate) fn parse_payment_direct(serves_v2: bool, bytes: &[u8]) -> Option<Payment> {
    #[derive(serde::Deserialize)]
    struct Version {
        #[serde(rename = "x402Version")]
        version: Option<u64>,
        #[serde(rename = "paymentRequirements")]
        requirements: Option<Network>,
    }
    #[derive(serde::Deserialize)]
    struct Network {
        network: Option<String>,
    }
    if bytes.contains(&b'[') {
        return None;
    }
    let peek = serde_json::from_slice::<Version>(bytes).ok()?;
    // A Solana body goes the checked way, which reads the family from the network.
    let network = peek.requirements.and_then(|r| r.network);
    if network.as_deref().is_some_and(svm::is_solana) {
        return None;
    }
    let version = peek.version?;
    if reads_as_v2(Some(version), serves_v2) {
        serde_json::from_slice(bytes).ok().map(Payment::V2)
    } else {
        serde_json::from_slice(bytes).ok().map(Payment::V1)
    }
}

/// A body speaking version 2 is read as v2 where v2 is served; every other body is read as v1,
/// whose rule 1 refuses versions other than 1.
fn reads_as_v2(version: Option<u64>, serves_v2: bool) -> bool {
    version == Some(2) && serves_v2
}

/// A body already read as JSON, checked field by field: a failure names the field, after
/// `prefix` (an array settle's `[i]`).
pub(crate) fn parse_payment(
    serves_v2: bool,
    body: serde_json::Value,
    prefix: &str,
) -> Result<Payment, WireError> {
    let network = body.pointer("/paymentRequirements/network");
    if network.and_then(|n| n.as_str()).is_some_and(svm::is_solana) {
        let request = if reads_as_v2(protocol::version_of(&body), serves_v2) {
            SvmRequest::V2(parse_value_with(body, svm::V2_OBJECTS, prefix)?)
        } else {
            SvmRequest::V1(parse_value_with(body, svm::V1_OBJECTS, prefix)?)
        };
        return Ok(Payment::Svm(request));
    }
    if reads_as_v2(protocol::version_of(&body), serves_v2) {
        parse_value_with(body, v2::PaymentRequest::OBJECTS, prefix).map(Payment::V2)
    } else {
        parse_value_with(body, PaymentRequest::OBJECTS, prefix).map(Payment::V1)
    }
}

impl Payment {
    /// Who asks to settle this payment: the request's `Idempotency-Key` (scoped to the API key,
    /// else to the client) is its retry key; without one, v2's `payment-identifier` id is the key that names the
    /// payment for this caller (never a retry key); the caller and the hash of `body` are its
    /// pass for the pending rule. The id is read, and checked, whether or not a header is set.
    pub(crate) fn asking(
        &self,
        asker: &Asker,
        header: Option<&str>,
        element: Option<usize>,
        body: &[u8],
    ) -> Result<Asking, WireError> {
        let payment_id = match self {
            Payment::V2(p) => p
                .payment_payload
                .payment_identifier()
                .map_err(|field| WireError::bad_request(prefixed(element, field)))?,
            Payment::Svm(SvmRequest::V2(p)) => p
                .payment_payload
                .payment_identifier()
                .map_err(|field| WireError::bad_request(prefixed(element, field)))?,
            Payment::V1(_) | Payment::Svm(SvmRequest::V1(_)) => None,
        };
        // Keys are the caller's (access.md §3b): an API key's, else the client's, so another
        // client cannot occupy a merchant's key.
        let scope = asker
            .key
            .as_deref()
            .map_or(asker.who.0.as_str(), |k| k.name.as_str());
        let tag = match (header, payment_id) {
            (Some(_), _) => {
                idempotency::tag(header, element, body).map(|t| idempotency::scoped(t, scope))
            }
            (None, Some(id)) => Some(idempotency::identifier_tag(&asker.who.0, id, body)),
            (None, None) => None,
        };
        Ok(Asking {
            tag,
            payment_id: payment_id.map(str::to_string),
            pass: Pass {
                caller: asker.who.0.clone(),
                body: idempotency::body_hash(body),
            },
        })
    }

    /// The facilitator's verdict, from the entry that serves this payment's wire type.
    pub(super) async fn verify(
        &self,
        facilitator: &Facilitator,
    ) -> Result<VerifyResponse, SettleError> {
        match self {
            Payment::V1(p) => Box::pin(facilitator.verify(p)).await,
            Payment::V2(p) => Box::pin(facilitator.verify_v2(p)).await,
            Payment::Svm(p) => Box::pin(facilitator.verify_svm(p)).await,
        }
    }

    /// Settled by the entry that serves this payment's wire type; a v2 success may list its
    /// resource in the discovery catalogue, kept private when `caller`'s API key says so.
    pub(super) async fn settle(
        &self,
        facilitator: &Facilitator,
        asking: &Asking,
        caller: Option<&Key>,
    ) -> Result<SettleResponse, SettleError> {
        // Boxed per family: an EVM settlement waiting for its block does not carry Solana's state.
        match self {
            Payment::V1(p) => Box::pin(facilitator.settle(p, asking)).await,
            Payment::V2(p) => {
                let settled = Box::pin(facilitator.settle_v2(p, asking)).await;
                if let Ok(answer) = &settled {
                    let private = caller.is_some_and(Key::private_listings);
                    facilitator.discovered(p, answer, private).await;
                }
                settled
            }
            Payment::Svm(p) => Box::pin(facilitator.settle_svm(p, asking)).await,
        }
    }

    pub(super) fn family(&self) -> NetworkFamily {
        match self {
            Payment::V1(_) | Payment::V2(_) => NetworkFamily::Evm,
            Payment::Svm(_) => NetworkFamily::Svm,
        }
    }

    /// 403 when the caller's key may not verify or settle for this payment's payTo.
    pub(super) fn allowed(&self, caller: Option<&Key>) -> Result<(), WireError> {
        let Some(key) = caller else {
            return Ok(());
        };
        let pay_to = match self {
            Payment::V1(p) => parse_address(&p.payment_requirements.pay_to).map(Payee::Evm),
            Payment::V2(p) => parse_address(&p.payment_requirements.pay_to).map(Payee::Evm),
            Payment::Svm(p) => {
                let (_, pay_to, _) = p.terms();
                crate::svm::Pubkey::from_str(pay_to).ok().map(Payee::Svm)
            }
        };
        match key.may_pay(pay_to) {
            true => Ok(()),
            false => Err(key.forbidden()),
        }
    }

    /// network|asset|from|nonce, for the request's log line.
    pub(crate) fn label(&self) -> String {
        let (network, asset, payload) = match self {
            Payment::V1(p) => (
                &p.payment_requirements.network,
                &p.payment_requirements.asset,
                Payload::from(&p.payment_payload.payload),
            ),
            Payment::V2(p) => (
                &p.payment_requirements.network,
                &p.payment_requirements.asset,
                Payload::from(&p.payment_payload.payload),
            ),
            // A Solana payment is its message: the log names its network, payTo and asset.
            Payment::Svm(p) => {
                let (network, pay_to, asset) = p.terms();
                return format!("{network}|{asset}|{pay_to}");
            }
        };
        let (from, nonce) = (payload.payer(), payload.nonce());
        format!(
            "{network}|{asset}|{}|{}",
            from.unwrap_or_default(),
            nonce.unwrap_or_default()
        )
    }
}

/// The signature of `GET /settlements/{network}/{signature}`.
pub(super) fn parse_signature(signature: &str) -> Result<crate::svm::Signature, WireError> {
    signature
        .parse()
        .map_err(|_| WireError::bad_request("signature: not a base58 transaction signature"))
}

/// A field path inside an array settle's element `[i]`.
fn prefixed(element: Option<usize>, message: String) -> String {
    match element {
        Some(i) => format!("[{i}].{message}"),
        None => message,
    }
}

/// The whole body, within `server.max_body_bytes` and `server.request_read_timeout_ms`: a client
/// that sends its headers and then stalls is answered 408, and its connection closed.
pub async fn read_body(app: &App, body: HttpBody) -> Result<Vec<u8>, WireError> {
    let limit = app.max_body_bytes;
    let reading = Limited::new(body, limit as usize).collect();
    let Ok(read) = tokio::time::timeout(app.read_timeout, reading).await else {
        return Err(WireError::new(
            StatusCode::REQUEST_TIMEOUT,
            408,
            "body not received within server.request_read_timeout_ms",
        ));
    };
    match read {
        Ok(collected) => Ok(collected.to_bytes().to_vec()),
        Err(error) if error.is::<http_body_util::LengthLimitError>() => {
            Err(WireError::too_large(limit))
        }
        Err(error) => Err(WireError::bad_request(format!(
            "body could not be read: {error}"
        ))),
    }
}

pub(crate) fn first_json_byte(bytes: &[u8]) -> Option<u8> {
    bytes.iter().copied().find(|b| !b.is_ascii_whitespace())
}

/// JSON-RPC requests are arrays (batches) or objects carrying `"jsonrpc"`; anything that is not
/// JSON also goes to jsonrpsee, which answers a JSON-RPC parse error.
pub(crate) fn is_json_rpc(bytes: &[u8]) -> bool {
    /// The object's members skipped over, not built, noting whether `jsonrpc` is one of them
    /// (whatever its value, `null` included).
    #[derive(serde::Deserialize)]
    struct Members {
        #[serde(default)]
        jsonrpc: Present,
    }
    #[derive(Default)]
    struct Present(bool);
    impl<'de> serde::Deserialize<'de> for Present {
        fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
            serde::de::IgnoredAny::deserialize(d).map(|_| Present(true))
        }
    }
    match first_json_byte(bytes) {
        Some(b'[') => true,
        Some(b'{') => match serde_json::from_slice::<Members>(bytes) {
            Ok(members) => members.jsonrpc.0,
            Err(_) => true,
        },
        _ => true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const V1: &str = r#"{"x402Version":1,"paymentPayload":{"x402Version":1,"scheme":"exact","network":"base","payload":{"signature":"0x01","authorization":{"from":"0xa","to":"0xb","value":"1","validAfter":"0","validBefore":"9","nonce":"0xc"}}},"paymentRequirements":{"scheme":"exact","network":"base","maxAmountRequired":"1","resource":"https://r","description":"d \"q\"","mimeType":"m","payTo":"0xb","maxTimeoutSeconds":60,"asset":"0xd","extra":{"name":"USDC","version":"2"}}}"#;
    const V2: &str = r#"{"x402Version":2,"paymentPayload":{"x402Version":2,"resource":{"url":"https://r"},"accepted":{"scheme":"exact","network":"eip155:8453","amount":"1","asset":"0xd","payTo":"0xb","maxTimeoutSeconds":60},"payload":{"signature":"0x01","authorization":{"from":"0xa","to":"0xb","value":"1","validAfter":"0","validBefore":"9","nonce":"0xc"}}},"paymentRequirements":{"scheme":"exact","network":"eip155:8453","amount":"1","asset":"0xd","payTo":"0xb","maxTimeoutSeconds":60}}"#;

    /// What the checked path makes of a body, as text to compare.
    fn checked(serves_v2: bool, body: &str) -> Result<String, String> {
        parse_body(body.as_bytes())
            .and_then(|value| parse_payment(serves_v2, value, ""))
            .map(|p| describe(&p))
            .map_err(|e| e.message)
    }

    fn describe(payment: &Payment) -> String {
        match payment {
            Payment::V1(p) => format!("v1 {p:?}"),
            Payment::V2(p) => format!("v2 {p:?}"),
            Payment::Svm(p) => format!("svm {p:?}"),
        }
    }

    #[test]
    fn a_solana_body_is_read_in_solanas_shape_by_its_network() {
        let v2 = r#"{"x402Version":2,"paymentPayload":{"x402Version":2,"accepted":{"scheme":"exact","network":"solana:x","amount":"1","asset":"m","payTo":"p","maxTimeoutSeconds":60},"payload":{"transaction":"AA=="}},"paymentRequirements":{"scheme":"exact","network":"solana:x","amount":"1","asset":"m","payTo":"p","maxTimeoutSeconds":60}}"#;
        assert!(parse_payment_direct(true, v2.as_bytes()).is_none());
        assert!(checked(true, v2).unwrap().starts_with("svm V2("));
        let v1 = V1.replace("\"network\":\"base\"", "\"network\":\"solana-devnet\"");
        assert_eq!(
            checked(true, &v1).unwrap_err(),
            "paymentPayload.payload.transaction: missing"
        );
    }

    #[test]
    fn the_direct_read_agrees_with_the_checked_one_or_declines() {
        let bodies = [
            V1.to_string(),
            V2.to_string(),
            // duplicate keys: the checked read keeps the last one, the direct one declines
            V1.replacen(r#""x402Version":1,"#, r#""x402Version":2,"x402Version":1,"#, 1),
            // versions that are not a top-level number are for the checked read
            V2.replacen(r#""x402Version":2,"#, "", 1),
            V2.replacen(r#""x402Version":2"#, r#""x402Version":null"#, 1),
            V1.replacen(r#""x402Version":1"#, r#""x402Version":"1""#, 1),
            V1.replacen(r#""x402Version":1"#, r#""x402Version":1.0"#, 1),
            // an object given as an array, which serde's derive would read as a tuple
            V1.replacen(
                r#""authorization":{"from":"0xa","to":"0xb","value":"1","validAfter":"0","validBefore":"9","nonce":"0xc"}"#,
                r#""authorization":["0xa","0xb","1","0","9","0xc"]"#,
                1,
            ),
            // a `[` in a string: the direct read declines what it cannot tell apart
            V1.replacen(r#"\"q\""#, "[q]", 1),
            V1.replacen(r#""value":"1""#, r#""value":1"#, 1),
            V1.replacen(r#""payTo":"0xb","#, "", 1),
            format!("{V1} x"),
            "7".to_string(),
            "{}".to_string(),
        ];
        let mut direct_reads = 0;
        for body in &bodies {
            for serves_v2 in [false, true] {
                let Some(direct) = parse_payment_direct(serves_v2, body.as_bytes()) else {
                    continue;
                };
                direct_reads += 1;
                assert_eq!(Ok(describe(&direct)), checked(serves_v2, body), "{body}");
            }
        }
        // V1 with and without v2 served, V2 where v2 is served, and no other body
        assert_eq!(direct_reads, 3);
        let tuple = &bodies[7];
        assert!(parse_payment_direct(true, tuple.as_bytes()).is_none());
        assert_eq!(
            checked(true, tuple).unwrap_err(),
            "paymentPayload.payload.authorization: invalid type: array, expected an object"
        );
    }

    #[test]
    fn tells_json_rpc_from_rest() {
        assert!(is_json_rpc(br#"{"jsonrpc":"2.0","id":1,"method":"m"}"#));
        assert!(is_json_rpc(br#" [{"jsonrpc":"2.0"}]"#));
        assert!(is_json_rpc(b"not json"));
        assert!(is_json_rpc(br#"{"jsonrpc":null,"id":1}"#));
        assert!(is_json_rpc(br#"{"jsonrpc":"2.0","jsonrpc":"2.0"}"#));
        assert!(is_json_rpc(br#"{"from":"0x""#));
        assert!(!is_json_rpc(
            br#"{"from":"0x","to":"0x","data":"0x","value":"0"}"#
        ));
    }
}
