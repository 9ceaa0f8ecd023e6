//! What the REST routes read: a body within its bounds, a payment in the wire type of the
//! mechanism serving its kind (straight into it where that is safe, else field by field naming
//! the field that fails), who asks to settle it and whether their API key may, and whether a
//! `POST /` body is JSON-RPC. The routes hold a payment as the facilitator's [`Payment`] and
//! match on no wire type.

use http::StatusCode;
use http_body_util::{BodyExt, Limited};
use jsonrpsee::server::HttpBody;

use super::Asker;
use crate::facilitator::{Facilitator, Payment};
use crate::ledger::{Asking, Pass};
use crate::server::auth::Key;
use crate::server::idempotency;
use crate::server::wire_errors::{parse_body, WireError};
use crate::server::App;

/// One payment body, in the wire type of the mechanism serving its kind.
pub(crate) fn parse_payment_body<'f>(
    facilitator: &'f Facilitator,
    bytes: &[u8],
) -> Result<Box<dyn Payment + 'f>, WireError> {
    match facilitator.read_payment_direct(bytes) {
        Some(payment) => Ok(payment),
        None => parse_payment(facilitator, parse_body(bytes)?, ""),
    }
}

/// A body already read as JSON, checked field by field: a failure names the field, after
/// `prefix` (an array settle's `[i]`).
pub(crate) fn parse_payment<'f>(
    facilitator: &'f Facilitator,
    body: serde_json::Value,
    prefix: &str,
) -> Result<Box<dyn Payment + 'f>, WireError> {
    facilitator
        .read_payment(body, prefix)
        .map_err(WireError::bad_request)
}

/// Who asks to settle a payment (`payment_id`: its `payment-identifier`, as read): the request's `Idempotency-Key` (scoped to the API key, else
/// to the client) is its retry key; without one, v2's `payment-identifier` id is the key that
/// names the payment for this caller (never a retry key); the caller and the hash of `body` are
/// its pass for the pending rule. The id is read, and checked, whether or not a header is set.
pub(crate) fn asking(
    payment_id: Result<Option<&str>, String>,
    asker: &Asker,
    header: Option<&str>,
    element: Option<usize>,
    body: &[u8],
) -> Result<Asking, WireError> {
    let payment_id =
        payment_id.map_err(|field| WireError::bad_request(prefixed(element, field)))?;
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
        payee_scoped: asker.key.as_deref().is_some_and(|k| k.is_scoped()),
        payment_id: payment_id.map(str::to_string),
        pass: Pass {
            caller: asker.who.0.clone(),
            body: idempotency::body_hash(body),
        },
    })
}

/// 403 when the caller's key may not verify or settle for this payment's payTo.
pub(super) fn allowed(payment: &dyn Payment, caller: Option<&Key>) -> Result<(), WireError> {
    let Some(key) = caller else {
        return Ok(());
    };
    match key.may_pay(payment.payee()) {
        true => Ok(()),
        false => Err(key.forbidden()),
    }
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
