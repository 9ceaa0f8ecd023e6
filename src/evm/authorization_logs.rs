//! What a token's logs say a payer's authorization did: where to look for the transaction that
//! used it (`eth_getLogs` topics), and whether that transaction had exactly the signed effect. A
//! transaction that is not routerd's may execute a payer's authorization first (a front-run);
//! its payment is settled only if the value moved as signed (access.md §1).

use std::sync::LazyLock;

use ethers_core::types::{Address, Bytes, H256, U256};
use ethers_core::utils::keccak256;
use serde_json::Value;

use super::hex::hex_decode;
use super::logs::{address_topic as topic, Log};
use super::values::parse_address;

/// `AuthorizationUsed(address indexed authorizer, bytes32 indexed nonce)`.
static AUTHORIZATION_USED: LazyLock<H256> =
    LazyLock::new(|| H256(keccak256("AuthorizationUsed(address,bytes32)")));
/// `Transfer(address indexed from, address indexed to, uint256 value)`.
static TRANSFER: LazyLock<H256> =
    LazyLock::new(|| H256(keccak256("Transfer(address,address,uint256)")));

/// What an executed `transferWithAuthorization` does: `value` of `token` moves from `from` to
/// `to`, and `nonce` of `from` is marked used.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SignedTransfer {
    pub token: Address,
    pub from: Address,
    pub to: Address,
    pub value: U256,
    pub nonce: H256,
}

/// The `topics` of an `eth_getLogs` filter (on the tokens' addresses) that finds the tokens'
/// transfers out of any of `payers`: `[Transfer, [from, ...]]`, the second an OR of its entries.
/// Every way routerd settles an EVM payment moves the payer's tokens, so only these are read,
/// not every transfer of a busy token.
pub fn transfers_out_of(payers: impl IntoIterator<Item = Address>) -> (H256, Vec<H256>) {
    (*TRANSFER, payers.into_iter().map(topic).collect())
}

impl SignedTransfer {
    /// The `topics` of an `eth_getLogs` filter (on the token's address) that finds the log
    /// marking this nonce used.
    pub fn used_topics(&self) -> [H256; 3] {
        [*AUTHORIZATION_USED, topic(self.from), self.nonce]
    }

    /// Whether `logs` (one transaction's, in order) show this authorization executed with exactly
    /// its effect: the token's `AuthorizationUsed(from, nonce)` directly followed by its
    /// `Transfer(from, to, value)`, as the token's `transferWithAuthorization` writes them. Each
    /// use pairs with its own transfer, so a transfer of another authorization in the same
    /// transaction does not count, and a cancellation (`AuthorizationCanceled`) never does.
    pub fn executed_in(&self, logs: &[Value]) -> bool {
        let logs: Vec<Option<Log>> = logs.iter().map(Log::parse).collect();
        logs.windows(2).any(|pair| match pair {
            [Some(used), Some(transfer)] => self.is_use(used) && self.is_transfer(transfer),
            _ => false,
        })
    }

    fn is_use(&self, log: &Log) -> bool {
        log.address == self.token && log.topics == self.used_topics()
    }

    fn is_transfer(&self, log: &Log) -> bool {
        log.address == self.token
            && log.topics == [*TRANSFER, topic(self.from), topic(self.to)]
            && log.data.len() == 32
            && U256::from_big_endian(&log.data) == self.value
    }
}

/// What a Permit2 settlement does: `value` of `token` leaves `from`, by routerd's call of
/// `contract` with `calldata` (x402's proxy, or a deposit into a channel). Permit2 marks a nonce
/// used without a log, and the token's `Transfer` does not name the permit, so only a copy of
/// routerd's own call (the same contract, the same calldata: the same permit, witness and
/// amount) is known to have had the signed effect. It moved the payer's tokens, so it is found
/// among the payer's transfers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SignedCall {
    pub token: Address,
    pub from: Address,
    pub value: U256,
    pub contract: Address,
    pub calldata: Bytes,
}

impl SignedCall {
    /// The `topics` of an `eth_getLogs` filter (on the token's address) that finds the payer's
    /// transfers, a copy's among them.
    pub fn transfer_topics(&self) -> [H256; 2] {
        [*TRANSFER, topic(self.from)]
    }

    /// Whether `transaction` (as `eth_getTransactionByHash` answers it) calls the same contract
    /// with the same calldata.
    pub fn is_copy(&self, transaction: &Value) -> bool {
        let field = |name| transaction.get(name).and_then(Value::as_str);
        let to = field("to").and_then(parse_address);
        let input = field("input").and_then(hex_decode);
        to == Some(self.contract) && input.as_deref() == Some(self.calldata.as_ref())
    }

    /// Whether `logs` (one transaction's) show `value` of the token leaving the payer.
    pub fn moved_in(&self, logs: &[Value]) -> bool {
        logs.iter().filter_map(Log::parse).any(|log| {
            log.is(self.token, &self.transfer_topics())
                && log.data.len() == 32
                && U256::from_big_endian(&log.data) == self.value
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::evm::hex_bytes;
    use serde_json::json;

    fn transfer() -> SignedTransfer {
        SignedTransfer {
            token: Address::repeat_byte(1),
            from: Address::repeat_byte(2),
            to: Address::repeat_byte(3),
            value: U256::from(1000),
            nonce: H256::repeat_byte(4),
        }
    }

    fn log(address: Address, topics: &[H256], value: u64) -> Value {
        let mut data = [0u8; 32];
        U256::from(value).to_big_endian(&mut data);
        json!({
            "address": hex_bytes(address),
            "topics": topics.iter().map(hex_bytes).collect::<Vec<_>>(),
            "data": hex_bytes(data),
            "logIndex": "0x0",
        })
    }

    fn used(t: &SignedTransfer) -> Value {
        log(t.token, &t.used_topics(), 0)
    }

    fn moved(t: &SignedTransfer, to: Address, value: u64) -> Value {
        log(t.token, &[*TRANSFER, topic(t.from), topic(to)], value)
    }

    #[test]
    fn the_use_of_the_nonce_followed_by_the_signed_transfer_is_the_signed_effect() {
        let t = transfer();
        assert!(t.executed_in(&[used(&t), moved(&t, t.to, 1000)]));
        let unrelated = log(Address::repeat_byte(9), &[*TRANSFER], 5);
        assert!(t.executed_in(&[
            unrelated.clone(),
            used(&t),
            moved(&t, t.to, 1000),
            unrelated
        ]));
        assert_eq!(
            hex_bytes(*AUTHORIZATION_USED),
            "0x98de503528ee59b575ef0c0a2576a82497bfc029a5685b209e9ec333479b10a5"
        );
    }

    #[test]
    fn any_other_effect_is_not_the_payment() {
        let t = transfer();
        let cases: [(&str, Vec<Value>); 6] = [
            (
                "another payee",
                vec![used(&t), moved(&t, Address::repeat_byte(8), 1000)],
            ),
            ("another value", vec![used(&t), moved(&t, t.to, 999)]),
            ("the nonce used, nothing moved", vec![used(&t)]),
            (
                "a transfer before the use",
                vec![moved(&t, t.to, 1000), used(&t)],
            ),
            (
                "another token's logs",
                vec![
                    log(Address::repeat_byte(7), &t.used_topics(), 0),
                    log(
                        Address::repeat_byte(7),
                        &[*TRANSFER, topic(t.from), topic(t.to)],
                        1000,
                    ),
                ],
            ),
            (
                "another nonce's transfer",
                vec![
                    used(&t),
                    used(&SignedTransfer {
                        nonce: H256::repeat_byte(5),
                        ..t
                    }),
                    moved(&t, t.to, 1000),
                ],
            ),
        ];
        for (case, logs) in cases {
            assert!(!t.executed_in(&logs), "{case}");
        }
    }

    #[test]
    fn transfers_out_of_the_payers_match_the_signed_transfer_topics() {
        let t = transfer();
        let (event, from) = transfers_out_of([t.from, Address::repeat_byte(9)]);
        let signed = [*TRANSFER, topic(t.from), topic(t.to)];
        assert_eq!(event, signed[0], "the Transfer event");
        assert_eq!(
            from[0], signed[1],
            "the payer, left-padded as an indexed address"
        );
        assert_eq!(from.len(), 2);
    }

    fn call() -> SignedCall {
        SignedCall {
            token: Address::repeat_byte(1),
            from: Address::repeat_byte(2),
            value: U256::from(1000),
            contract: Address::repeat_byte(6),
            calldata: Bytes::from(vec![0xab, 0xcd, 0x01]),
        }
    }

    #[test]
    fn only_the_same_call_with_the_same_calldata_is_a_copy() {
        let c = call();
        let tx = |to: Address, input: &str| json!({"to": hex_bytes(to), "input": input});
        assert!(c.is_copy(&tx(c.contract, "0xabcd01")));
        assert!(
            c.is_copy(&tx(c.contract, "0xABCD01")),
            "hex case is not the call"
        );
        let others = [
            ("another contract", tx(Address::repeat_byte(7), "0xabcd01")),
            ("other calldata", tx(c.contract, "0xabcd02")),
            ("longer calldata", tx(c.contract, "0xabcd0100")),
            ("a deployment", json!({"to": null, "input": "0xabcd01"})),
            ("no input", json!({"to": hex_bytes(c.contract)})),
        ];
        for (case, transaction) in others {
            assert!(!c.is_copy(&transaction), "{case}");
        }
    }

    #[test]
    fn a_copy_moved_the_value_out_of_the_payer() {
        let c = call();
        let out = |token, from, value| {
            log(
                token,
                &[*TRANSFER, topic(from), topic(Address::repeat_byte(3))],
                value,
            )
        };
        assert!(c.moved_in(&[out(c.token, c.from, 1000)]));
        assert!(!c.moved_in(&[out(c.token, c.from, 999)]), "another value");
        assert!(
            !c.moved_in(&[out(Address::repeat_byte(9), c.from, 1000)]),
            "another token"
        );
        assert!(
            !c.moved_in(&[out(c.token, Address::repeat_byte(8), 1000)]),
            "another payer"
        );
        assert!(!c.moved_in(&[]), "nothing moved");
    }
}
