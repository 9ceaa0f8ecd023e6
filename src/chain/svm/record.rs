//! A transaction as the cluster recorded it (`getTransaction`): whether it ran, and how the token
//! balances it touched moved. A status answer says only that a node believes the signature landed;
//! the record is the transaction's own account of what it did, so a settlement's success is
//! decided on it (access.md 3c).

use std::collections::BTreeMap;

use serde_json::Value;

use super::SolanaError;
use crate::chain::client::RpcError;

const METHOD: &str = "getTransaction";

/// What a landed transaction did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TransactionRecord {
    pub slot: u64,
    /// `meta.err`, as the node wrote it; `None` when the transaction ran.
    pub error: Option<String>,
    /// Token balances before and after, by the account's index in the message.
    balances: BTreeMap<u64, (Option<u64>, Option<u64>)>,
}

impl TransactionRecord {
    /// Whether exactly `amount` left the account at `source` and reached the one at
    /// `destination` (indexes in the message). An account without a balance before held none.
    pub fn moved(&self, source: u8, destination: u8, amount: u64) -> bool {
        let change = |index: u8| {
            let (pre, post) = self.balances.get(&u64::from(index))?;
            Some(i128::from((*post)?) - i128::from(pre.unwrap_or(0)))
        };
        let amount = i128::from(amount);
        change(source) == Some(-amount) && change(destination) == Some(amount)
    }
}

/// `getTransaction`'s answer: `None` when the node has no record of the signature.
pub(super) fn read(
    answer: Result<Value, RpcError>,
) -> Result<Option<TransactionRecord>, SolanaError> {
    let answer = answer.map_err(|error| SolanaError::Rpc {
        method: METHOD,
        error,
    })?;
    if answer.is_null() {
        return Ok(None);
    }
    let malformed = |what| SolanaError::Malformed {
        method: METHOD,
        what,
    };
    let slot = answer.get("slot").and_then(Value::as_u64);
    let slot = slot.ok_or(malformed("no slot"))?;
    let meta = answer.get("meta").filter(|m| m.is_object());
    let meta = meta.ok_or(malformed("no meta"))?;
    let mut balances: BTreeMap<u64, (Option<u64>, Option<u64>)> = BTreeMap::new();
    for (field, post) in [("preTokenBalances", false), ("postTokenBalances", true)] {
        for (index, amount) in token_balances(meta.get(field)).ok_or(malformed(field))? {
            let entry = balances.entry(index).or_default();
            *(if post { &mut entry.1 } else { &mut entry.0 }) = Some(amount);
        }
    }
    Ok(Some(TransactionRecord {
        slot,
        error: meta
            .get("err")
            .filter(|err| !err.is_null())
            .map(Value::to_string),
        balances,
    }))
}

/// `[{accountIndex, uiTokenAmount: {amount: "<integer>"}}]` as (index, amount); `None` when it
/// is not that (an absent list is an empty one: a node may omit it for a failed transaction).
fn token_balances(list: Option<&Value>) -> Option<Vec<(u64, u64)>> {
    let Some(list) = list.filter(|l| !l.is_null()) else {
        return Some(Vec::new());
    };
    list.as_array()?
        .iter()
        .map(|entry| {
            let index = entry.get("accountIndex")?.as_u64()?;
            let amount = entry.get("uiTokenAmount")?.get("amount")?.as_str()?;
            Some((index, amount.parse().ok()?))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn balance(index: u64, amount: u64) -> Value {
        json!({"accountIndex": index, "mint": "m", "uiTokenAmount": {"amount": amount.to_string(), "decimals": 6}})
    }

    fn answer(err: Value, pre: Vec<Value>, post: Vec<Value>) -> Value {
        json!({"slot": 9, "meta": {"err": err, "preTokenBalances": pre, "postTokenBalances": post}})
    }

    #[test]
    fn a_transfer_is_read_from_the_balances_it_moved() {
        let ran = answer(
            Value::Null,
            vec![balance(1, 500), balance(2, 0)],
            vec![balance(1, 400), balance(2, 100)],
        );
        let record = read(Ok(ran)).unwrap().unwrap();
        assert_eq!((record.slot, record.error.as_deref()), (9, None));
        assert!(record.moved(1, 2, 100));
        assert!(!record.moved(1, 2, 99), "another amount");
        assert!(!record.moved(2, 1, 100), "the other way");
        assert!(!record.moved(1, 3, 100), "an account it did not touch");
        // A destination with no balance before held nothing.
        let fresh = answer(
            Value::Null,
            vec![balance(1, 100)],
            vec![balance(1, 0), balance(2, 100)],
        );
        assert!(read(Ok(fresh)).unwrap().unwrap().moved(1, 2, 100));
        // Nothing moved: a payment to itself, or a transfer that took a fee on the way.
        let same = answer(Value::Null, vec![balance(1, 100)], vec![balance(1, 100)]);
        assert!(!read(Ok(same)).unwrap().unwrap().moved(1, 1, 100));
    }

    #[test]
    fn an_unknown_signature_is_none_and_a_malformed_record_an_error() {
        assert_eq!(read(Ok(Value::Null)).unwrap(), None);
        let failed = json!({"slot": 3, "meta": {"err": {"InstructionError": [2, {"Custom": 1}]}}});
        let record = read(Ok(failed)).unwrap().unwrap();
        assert!(record.error.unwrap().contains("InstructionError"));
        for bad in [
            json!({"meta": {}}),
            json!({"slot": 1}),
            json!({"slot": 1, "meta": {"preTokenBalances": [{"accountIndex": 1}]}}),
            json!({"slot": 1, "meta": {"postTokenBalances": {"accountIndex": 1}}}),
        ] {
            assert!(matches!(read(Ok(bad)), Err(SolanaError::Malformed { .. })));
        }
    }
}
