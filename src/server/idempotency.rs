//! Request keys of settle requests (access.md §1), bound to a hash of the body they came with.
//! The `Idempotency-Key` header is a retry key: a request carrying the key its payment was
//! claimed with is that request again and gets its answer. x402 v2's `payment-identifier` id,
//! which the payer writes and does not sign, only names its payment for the caller: another
//! payment under it is refused, the same payment is a duplicate.

use ethers_core::types::H256;
use ethers_core::utils::keccak256;
use http::HeaderMap;

use super::wire_errors::WireError;
use crate::ledger::{RequestTag, TagKind};

pub const HEADER: &str = "idempotency-key";

/// The request's `Idempotency-Key` header: 1 to 128 characters of `[A-Za-z0-9_.:-]`.
pub fn header_key(headers: &HeaderMap) -> Result<Option<String>, WireError> {
    let Some(value) = headers.get(HEADER) else {
        return Ok(None);
    };
    let valid = |key: &str| {
        (1..=128).contains(&key.len())
            && key
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"_.:-".contains(&b))
    };
    match value.to_str() {
        Ok(key) if valid(key) => Ok(Some(key.to_string())),
        _ => Err(WireError::bad_request(
            "Idempotency-Key: expected 1 to 128 characters of [A-Za-z0-9_.:-]",
        )),
    }
}

/// The tag of one payment in a request: the key (an array element's own is the key and its
/// index, `key#i`), and the hash of the body, or of the element, it came with.
pub fn tag(key: Option<&str>, element: Option<usize>, body: &[u8]) -> Option<RequestTag> {
    let key = key?;
    Some(RequestTag {
        key: match element {
            Some(i) => format!("{key}#{i}"),
            None => key.to_string(),
        },
        body: body_hash(body),
        kind: TagKind::Header,
    })
}

/// The key of a payer's `payment-identifier` `id`, scoped to the caller (`who`: an API key's
/// name or a client address). `@` starts no header key, so the two never meet.
pub fn identifier_tag(who: &str, id: &str, body: &[u8]) -> RequestTag {
    RequestTag {
        key: format!("@{who}/{id}"),
        body: body_hash(body),
        kind: TagKind::PaymentIdentifier,
    }
}

/// The hash a body is bound by.
pub fn body_hash(body: &[u8]) -> H256 {
    H256(keccak256(body))
}

/// Keys of different callers never meet: each is prefixed by its scope, an API key's name
/// (`shop-a/…`) or without keys the client (`ip:203.0.113.7/…`).
pub fn scoped(tag: RequestTag, scope: &str) -> RequestTag {
    RequestTag {
        key: format!("{scope}/{}", tag.key),
        ..tag
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(value: &str) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert(HEADER, value.parse().unwrap());
        headers
    }

    #[test]
    fn keys_of_the_allowed_characters_and_length_only() {
        assert_eq!(header_key(&HeaderMap::new()).unwrap(), None);
        assert_eq!(
            header_key(&headers("order-17:try.1_a")).unwrap().as_deref(),
            Some("order-17:try.1_a")
        );
        for bad in ["", "has space", "slash/", "é", &"k".repeat(129)] {
            let mut h = HeaderMap::new();
            if let Ok(v) = bad.parse() {
                h.insert(HEADER, v);
                let error = header_key(&h).unwrap_err();
                assert!(error.message.starts_with("Idempotency-Key"), "{bad}");
            }
        }
    }

    #[test]
    fn an_element_is_tagged_apart_and_bodies_are_told_apart() {
        let single = tag(Some("k"), None, b"{}").unwrap();
        let element = tag(Some("k"), Some(2), b"{}").unwrap();
        assert_eq!(single.key, "k");
        assert_eq!(element.key, "k#2");
        assert_eq!(single.body, element.body);
        assert_ne!(tag(Some("k"), None, b"{ }").unwrap().body, single.body);
        assert!(tag(None, None, b"{}").is_none());
    }
}
