//! Property tests for every parser that reads client input: whatever bytes arrive, the answer is
//! a value or a named error, never a panic; and what parses round-trips.

use ethers_core::types::U256;
use proptest::prelude::*;
use routerd::evm::{hex_bytes, hex_decode};
use routerd::evm::{parse_address, parse_decimal};
use routerd::facilitator::protocol::v1::PaymentRequest;
use routerd::router::types::RouterTransaction;
use routerd::server::wire_errors::{parse_body, parse_body_with};

proptest! {
    #[test]
    fn decimal_round_trips(n in any::<[u64; 4]>()) {
        let value = U256(n);
        prop_assert_eq!(parse_decimal(&value.to_string()), Some(value));
    }

    #[test]
    fn decimal_never_panics(s in ".{0,100}") {
        let _ = parse_decimal(&s);
    }

    #[test]
    fn hex_round_trips(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
        prop_assert_eq!(hex_decode(&hex_bytes(&bytes)), Some(bytes));
    }

    #[test]
    fn hex_and_addresses_never_panic(s in "(0x)?[0-9a-fA-Fg-z]{0,70}") {
        let _ = hex_decode(&s);
        let _ = parse_address(&s);
    }

    #[test]
    fn router_validation_never_panics(
        from in "(0x)?[0-9a-fA-F]{0,42}",
        to in "(0x)?[0-9a-fA-F]{0,42}",
        data in "(0x)?[0-9a-fA-F]{0,9}",
        value in "(0x)?[0-9a-fA-F-]{0,80}",
    ) {
        let tx = RouterTransaction { from, to, data, value };
        if let Err(e) = tx.validate() {
            prop_assert!(["from", "to", "data", "value"].contains(&e.field));
        }
    }

    #[test]
    fn body_parsing_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..300)) {
        let _ = parse_body::<serde_json::Value>(&bytes);
        let _ = parse_body_with::<PaymentRequest>(&bytes, PaymentRequest::OBJECTS);
    }

    #[test]
    fn any_json_gets_an_answer_naming_a_place(value in json_value(3)) {
        let bytes = serde_json::to_vec(&value).unwrap();
        if let Err(e) = parse_body_with::<PaymentRequest>(&bytes, PaymentRequest::OBJECTS) {
            prop_assert_eq!(e.status.as_u16(), 400);
            prop_assert!(e.message.contains(':'), "{}", e.message);
        }
    }
}

fn json_value(depth: u32) -> impl Strategy<Value = serde_json::Value> {
    let leaf = prop_oneof![
        Just(serde_json::Value::Null),
        any::<bool>().prop_map(serde_json::Value::from),
        any::<i64>().prop_map(serde_json::Value::from),
        "[a-z0-9x]{0,12}".prop_map(serde_json::Value::from),
    ];
    leaf.prop_recursive(depth, 32, 6, |inner| {
        let keys = prop_oneof![
            Just("x402Version".to_string()),
            Just("paymentPayload".to_string()),
            Just("paymentRequirements".to_string()),
            Just("payload".to_string()),
            Just("authorization".to_string()),
            "[a-z]{1,6}",
        ];
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..4).prop_map(serde_json::Value::from),
            proptest::collection::btree_map(keys, inner, 0..5)
                .prop_map(|m| serde_json::Value::Object(m.into_iter().collect())),
        ]
    })
}
