//! Retry keys of settle requests (access.md §1): the `Idempotency-Key` header, or in x402 v2 the
//! `payment-identifier` extension's id, bound to a hash of the body it came with. A request
//! carrying the key its payment was claimed with is that request again and gets its answer.

use ethers_core::types::H256;
use ethers_core::utils::keccak256;
use http::HeaderMap;

use super::wire_errors::WireError;
use crate::ledger::RequestTag;

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
        body: H256(keccak256(body)),
    })
}

/// Keys of different API keys never meet: each is prefixed by the key's name (`shop-a/…`).
pub fn scoped(tag: RequestTag, scope: Option<&str>) -> RequestTag {
    match scope {
        Some(name) => RequestTag {
            key: format!("{name}/{}", tag.key),
            body: tag.body,
        },
        None => tag,
    }
}

/// `body` as serde_json writes it: the same JSON whether it came alone or as an array's
/// element, whatever its spacing.
pub fn canonical(body: &[u8]) -> Vec<u8> {
    serde_json::from_slice::<serde_json::Value>(body)
        .and_then(|value| serde_json::to_vec(&value))
        .unwrap_or_else(|_| body.to_vec())
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

    #[test]
    fn canonical_json_ignores_spacing() {
        assert_eq!(
            canonical(br#"{ "a" : [1, 2] }"#),
            canonical(br#"{"a":[1,2]}"#)
        );
    }
}
