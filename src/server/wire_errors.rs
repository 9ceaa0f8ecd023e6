//! The one place where typed errors become wire errors: the spec's `{error, message}` body with
//! its HTTP status, and JSON-RPC error objects.

use http::StatusCode;
use jsonrpsee::server::HttpResponse;
use jsonrpsee::types::ErrorObjectOwned;
use serde::Serialize;

use crate::chain::{self, Unreachable};
use crate::facilitator::discovery::query::QueryError;
use crate::facilitator::protocol::read;
use crate::facilitator::SettleError;
use crate::router::{RelayError, RouteError};

/// An error answered as `{"error": <int>, "message": "..."}`.
#[derive(Debug, Clone)]
pub struct WireError {
    pub status: StatusCode,
    pub code: i32,
    pub message: String,
    /// Structured detail: per-chain reasons of a routing refusal.
    pub data: Option<serde_json::Value>,
    /// `Retry-After` of a 429, in seconds.
    pub retry_after_secs: Option<u64>,
}

impl WireError {
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, 400, message)
    }

    pub fn new(status: StatusCode, code: i32, message: impl Into<String>) -> Self {
        Self {
            status,
            code,
            message: message.into(),
            data: None,
            retry_after_secs: None,
        }
    }

    pub fn not_found(path: &str) -> Self {
        Self::new(StatusCode::NOT_FOUND, 404, format!("no route {path}"))
    }

    pub fn method_not_allowed(method: &http::Method, path: &str, allowed: &str) -> Self {
        Self::new(
            StatusCode::METHOD_NOT_ALLOWED,
            405,
            format!("{method} is not allowed on {path}; use {allowed}"),
        )
    }

    pub fn too_large(limit: u32) -> Self {
        Self::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            413,
            format!("body larger than server.max_body_bytes ({limit} bytes)"),
        )
    }

    /// The `{error, message[, data]}` body.
    pub fn body(&self) -> serde_json::Value {
        #[derive(Serialize)]
        struct Body<'a> {
            error: i32,
            message: &'a str,
            #[serde(skip_serializing_if = "Option::is_none")]
            data: Option<&'a serde_json::Value>,
        }
        serde_json::to_value(Body {
            error: self.code,
            message: &self.message,
            data: self.data.as_ref(),
        })
        .expect("error bodies serialize")
    }

    pub fn into_response(self) -> HttpResponse {
        let mut response = json_response(self.status, &self.body());
        if let Some(secs) = self.retry_after_secs {
            response
                .headers_mut()
                .insert(http::header::RETRY_AFTER, secs.into());
        }
        response
    }
}

/// The spec answers failures of the network with HTTP 400 and the gateway code in `error`.
impl From<Unreachable> for WireError {
    fn from(e: Unreachable) -> Self {
        Self::new(StatusCode::BAD_REQUEST, 502, e.to_string())
    }
}

/// A discovery route's query parameter that does not read: 400 naming it.
impl From<QueryError> for WireError {
    fn from(e: QueryError) -> Self {
        Self::bad_request(e.to_string())
    }
}

impl From<SettleError> for WireError {
    fn from(e: SettleError) -> Self {
        let code = match &e {
            SettleError::Unreachable(_) => 502,
            SettleError::Overloaded(_) => 503,
            SettleError::Pending(_) | SettleError::PendingSignature(_) => 504,
            SettleError::Abandoned(_) => 503,
            SettleError::KeyReused(_) | SettleError::IdentifierReused(_) => 409,
            // A shared database out of reach: the service is unavailable, nothing is lost.
            SettleError::Store(inner) if inner.is_unavailable() => 503,
            SettleError::Store(_) => 500,
        };
        // The store's own words (a database's error text, a file path) stay in the log.
        let message = match &e {
            SettleError::Store(inner) => {
                tracing::error!(error = %inner, "store failure during settle");
                STORE_FAILED.to_string()
            }
            other => other.to_string(),
        };
        if let SettleError::Overloaded(_) = e {
            // The one 5xx by design: an overload, answered at once (access.md §3b).
            let mut busy = Self::new(StatusCode::SERVICE_UNAVAILABLE, code, message);
            busy.retry_after_secs = Some(chain::traffic::RETRY_AFTER_SECS);
            return busy;
        }
        Self::new(StatusCode::BAD_REQUEST, code, message)
    }
}

/// What a caller is told of a store failure; the log has the rest.
const STORE_FAILED: &str =
    "the store could not be read or written; nothing was lost, try again (the log says more)";

impl From<RouteError> for WireError {
    fn from(e: RouteError) -> Self {
        if let RouteError::Store(inner) = &e {
            tracing::error!(error = %inner, "store failure while routing");
        }
        let code = match &e {
            RouteError::NoFeasibleChain(_) => -32000,
            RouteError::AllUnreachable(_) | RouteError::Store(_) => -32603,
            // EIP-1474's "limit exceeded".
            RouteError::TooFarAhead(..) => -32005,
        };
        let data = match &e {
            RouteError::NoFeasibleChain(quotes) | RouteError::AllUnreachable(quotes) => {
                serde_json::to_value(quotes).ok()
            }
            RouteError::Store(_) | RouteError::TooFarAhead(..) => None,
        };
        let message = match &e {
            RouteError::Store(_) => STORE_FAILED.to_string(),
            other => other.to_string(),
        };
        Self {
            status: StatusCode::BAD_REQUEST,
            code,
            message,
            data,
            retry_after_secs: None,
        }
    }
}

/// A wallet's call: what routerd refuses itself in JSON-RPC's codes, the node's own refusals
/// and reverts as the node said them (its text and data were scrubbed of the URL by the chain
/// client). A spent read budget is EIP-1474's "limit exceeded" with HTTP 503 and `Retry-After`
/// where the envelope is routerd's own (`POST /chains/<name>`); an answer over its bound is
/// "limit exceeded" too.
impl From<RelayError> for WireError {
    fn from(e: RelayError) -> Self {
        let code = match &e {
            RelayError::Raw(_)
            | RelayError::UnknownChain(_)
            | RelayError::WrongChain { .. }
            | RelayError::InvalidParams(_)
            | RelayError::Refused(_) => -32602,
            RelayError::MethodNotFound(_) => -32601,
            RelayError::Busy(_) | RelayError::AnswerTooLarge { .. } => LIMIT_EXCEEDED,
            RelayError::Node(node) => node.code,
            RelayError::Unreachable(_) | RelayError::Store(_) => -32603,
        };
        let message = match &e {
            RelayError::Store(inner) => {
                tracing::error!(error = %inner, "store failure while relaying");
                STORE_FAILED.to_string()
            }
            other => other.to_string(),
        };
        let (status, retry_after_secs) = match &e {
            RelayError::Busy(_) => (
                StatusCode::SERVICE_UNAVAILABLE,
                Some(chain::traffic::RETRY_AFTER_SECS),
            ),
            _ => (StatusCode::BAD_REQUEST, None),
        };
        let data = match e {
            RelayError::Node(node) => node.data,
            _ => None,
        };
        Self {
            status,
            code,
            message,
            data,
            retry_after_secs,
        }
    }
}

/// EIP-1474's "limit exceeded".
pub const LIMIT_EXCEEDED: i32 = -32005;

/// JSON-RPC view of the same errors, for the router methods.
impl From<WireError> for ErrorObjectOwned {
    fn from(e: WireError) -> Self {
        ErrorObjectOwned::owned(e.code, e.message, e.data)
    }
}

pub fn json_response<T: Serialize>(status: StatusCode, body: &T) -> HttpResponse {
    json_bytes_response(
        status,
        serde_json::to_vec(body).expect("wire types serialize"),
    )
}

/// A JSON body already serialized.
pub fn json_bytes_response(status: StatusCode, bytes: Vec<u8>) -> HttpResponse {
    http::Response::builder()
        .status(status)
        .header(http::header::CONTENT_TYPE, "application/json")
        .body(bytes.into())
        .expect("static response parts")
}

pub fn text_response(status: StatusCode, content_type: &'static str, body: String) -> HttpResponse {
    http::Response::builder()
        .status(status)
        .header(http::header::CONTENT_TYPE, content_type)
        .body(body.into())
        .expect("static response parts")
}

/// Parses a JSON body into `T`; a failure names the field path
/// (`paymentPayload.payload.authorization.nonce: missing`). `objects` lists the paths that must
/// be JSON objects: serde would otherwise read a struct from an array, positionally.
pub fn parse_body_with<T: serde::de::DeserializeOwned>(
    bytes: &[u8],
    objects: &[&str],
) -> Result<T, WireError> {
    parse_value_with(parse_body(bytes)?, objects, "")
}

/// As [`parse_body_with`], for one element of an array body; `prefix` is its place (`[2]`).
pub fn parse_value_with<T: serde::de::DeserializeOwned>(
    value: serde_json::Value,
    objects: &[&str],
    prefix: &str,
) -> Result<T, WireError> {
    read::read_value(value, objects, prefix).map_err(WireError::bad_request)
}

/// Parses a JSON body into `T`, naming the field path of a failure.
pub fn parse_body<T: serde::de::DeserializeOwned>(bytes: &[u8]) -> Result<T, WireError> {
    // A good body skips the path tracking; a bad one is read again with it, for the message.
    if let Ok(value) = serde_json::from_slice(bytes) {
        return Ok(value);
    }
    let mut deserializer = serde_json::Deserializer::from_slice(bytes);
    let value = serde_path_to_error::deserialize(&mut deserializer)
        .map_err(|e| WireError::bad_request(read::describe_parse_error(e)))?;
    deserializer.end().map_err(|e| {
        WireError::bad_request(format!(
            "body is not valid JSON: {}",
            read::strip_position(&e.to_string())
        ))
    })?;
    Ok(value)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::facilitator::protocol::v1::PaymentRequest;

    fn message(body: &str) -> String {
        parse_body_with::<PaymentRequest>(body.as_bytes(), PaymentRequest::OBJECTS)
            .unwrap_err()
            .message
    }

    #[test]
    fn messages_name_the_field() {
        assert!(message("{").starts_with("body is not valid JSON"));
        assert_eq!(
            message("[]"),
            "body: invalid type: array, expected an object"
        );
        assert_eq!(
            message("7"),
            "body: invalid type: integer `7`, expected struct PaymentRequest"
        );
        assert_eq!(message("{}"), "x402Version: missing");
        let body = r#"{"x402Version":1,"paymentPayload":{"x402Version":1,"scheme":"exact","network":"n","payload":{"signature":"0x","authorization":{"from":"a","to":"b","value":"1","validAfter":"0","validBefore":"1"}}},"paymentRequirements":{}}"#;
        assert_eq!(
            message(body),
            "paymentPayload.payload.authorization.nonce: missing"
        );
        let body = body.replace(r#""value":"1""#, r#""value":1"#);
        assert!(
            message(&body).starts_with("paymentPayload.payload.authorization.value: invalid type")
        );
        let body = body
            .replace(r#""authorization":{"#, r#""authorization":[{"#)
            .replace(r#""validBefore":"1"}"#, r#""validBefore":"1"}]"#);
        assert_eq!(
            message(&body),
            "paymentPayload.payload.authorization: invalid type: array, expected an object"
        );
    }

    #[test]
    fn trailing_garbage_is_rejected() {
        assert!(parse_body::<serde_json::Value>(b"{} x").is_err());
    }
}
