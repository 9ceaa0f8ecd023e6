//! Where a lane's sent transactions landed, read at a head.
//!
//! The logs of the blocks since the last head come first: a log exists only in a transaction
//! that succeeded (a revert discards them), so a log of the payment's token in one of our
//! transactions proves its inclusion and its success. Only the tokens' transfers out of the
//! asked payers are read, not every transfer of a busy token. One `eth_getLogs` for a block of
//! 381 settlements costs a node a fraction of their 381 receipts (anvil: about 6 ms against 45).
//! What the logs do not show (a revert, an older block, a node that answered nothing) is read
//! from its receipt, as before: the logs only shorten the way to the common answer.

use std::collections::{BTreeMap, BTreeSet, HashSet};

use ethers_core::types::{Address, H256};
use serde_json::{json, Value};

use crate::chain::{self, Call, CallResult, Chain, Traffic};
use crate::evm;
use crate::evm::authorization_logs::transfers_out_of;
use crate::ledger::Inclusion;

/// The most blocks one read of logs spans; a worker that missed more heads reads receipts.
const MAX_LOG_BLOCKS: u64 = 32;

/// One sent transaction whose inclusion is looked for.
pub(super) struct Asked {
    pub nonce: u64,
    pub hash: H256,
    /// The token whose logs a successful settlement emits.
    pub token: Address,
    /// Whose tokens it moves: the `from` of the token's `Transfer` log.
    pub payer: Address,
}

/// What the node said about the asked transactions.
#[derive(Default)]
pub(super) struct Found {
    /// By nonce: the inclusion found for one of its transactions.
    pub included: BTreeMap<u64, Inclusion>,
    /// Nonces with a receipt the node failed to look up: no news, so not a miss.
    pub unknown: BTreeSet<u64>,
}

/// The inclusions at or below `head` of the asked transactions; logs are read from block
/// `since` on (the block after the last head followed). Nothing asked, nothing sent.
pub(super) async fn look_up(
    chain: &Chain,
    head: &chain::Head,
    since: u64,
    asked: &[Asked],
) -> Found {
    let mut found = Found::default();
    let shown = from_logs(chain, head.number, since, asked).await;
    for a in asked {
        if let Some(inclusion) = shown.get(&a.hash) {
            found.included.insert(a.nonce, *inclusion);
        }
    }
    let rest: Vec<&Asked> = asked
        .iter()
        .filter(|a| !found.included.contains_key(&a.nonce))
        .collect();
    if rest.is_empty() {
        return found;
    }
    let calls: Vec<Call> = rest.iter().map(|a| receipt_call(a.hash)).collect();
    let Ok(answers) = chain.client.batch(Traffic::Own, &calls).await else {
        found.unknown.extend(rest.iter().map(|a| a.nonce));
        return found;
    };
    for (asked, answer) in rest.iter().zip(&answers) {
        if answer.is_err() {
            found.unknown.insert(asked.nonce);
        } else if let Some(inclusion) = inclusion_of(asked.hash, answer, head.number) {
            found.included.insert(asked.nonce, inclusion);
        }
    }
    found
}

fn receipt_call(hash: H256) -> Call {
    Call::new(
        "eth_getTransactionReceipt",
        vec![json!(evm::hex_bytes(hash))],
    )
}

/// Successful inclusions, by transaction, shown by the asked tokens' logs in blocks `since` to
/// `head`. Empty when there is nothing to read, the span is too long or the node failed.
async fn from_logs(
    chain: &Chain,
    head: u64,
    since: u64,
    asked: &[Asked],
) -> BTreeMap<H256, Inclusion> {
    let tokens: BTreeSet<Address> = asked.iter().map(|a| a.token).collect();
    let since = since.min(head);
    if tokens.is_empty() || head - since >= MAX_LOG_BLOCKS {
        return BTreeMap::new();
    }
    let (transfer, payers) =
        transfers_out_of(asked.iter().map(|a| a.payer).collect::<BTreeSet<_>>());
    let filter = json!({
        "fromBlock": format!("{since:#x}"),
        "toBlock": format!("{head:#x}"),
        "address": tokens.iter().map(evm::hex_bytes).collect::<Vec<_>>(),
        "topics": [evm::hex_bytes(transfer), payers.iter().map(evm::hex_bytes).collect::<Vec<_>>()],
    });
    let answers = chain
        .client
        .batch(Traffic::Own, &[Call::new("eth_getLogs", vec![filter])])
        .await;
    let Some(Ok(Value::Array(logs))) = answers.ok().and_then(|a| a.into_iter().next()) else {
        return BTreeMap::new();
    };
    let ours: HashSet<H256> = asked.iter().map(|a| a.hash).collect();
    logs.iter()
        .filter_map(|log| log_inclusion(log, since..=head))
        .filter(|inclusion| ours.contains(&inclusion.transaction))
        .map(|inclusion| (inclusion.transaction, inclusion))
        .collect()
}

/// The successful inclusion a log shows, if it is a log in a block of `span`, not removed.
pub(crate) fn log_inclusion(log: &Value, span: std::ops::RangeInclusive<u64>) -> Option<Inclusion> {
    if log.get("removed").and_then(Value::as_bool) == Some(true) {
        return None;
    }
    let block = log.get("blockNumber").and_then(evm::parse_u64)?;
    span.contains(&block).then_some(Inclusion {
        block,
        block_hash: log.get("blockHash").and_then(chain::head::parse_hash)?,
        transaction: log
            .get("transactionHash")
            .and_then(chain::head::parse_hash)?,
        succeeded: true,
    })
}

/// A receipt in a block at or below `head` (a node ahead of our head is asked again later).
pub(crate) fn inclusion_of(hash: H256, answer: &CallResult, head: u64) -> Option<Inclusion> {
    let receipt: &Value = answer.as_ref().ok()?;
    let block = receipt.get("blockNumber").and_then(evm::parse_u64)?;
    let block_hash = receipt.get("blockHash").and_then(chain::head::parse_hash)?;
    (block <= head).then_some(Inclusion {
        block,
        block_hash,
        transaction: hash,
        succeeded: receipt.get("status").and_then(evm::parse_u64) == Some(1),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn log(block: u64, removed: bool) -> Value {
        json!({
            "address": evm::hex_bytes(Address::repeat_byte(0xaa)),
            "blockNumber": format!("{block:#x}"),
            "blockHash": evm::hex_bytes(H256::repeat_byte(0x22)),
            "transactionHash": evm::hex_bytes(H256::repeat_byte(0x33)),
            "removed": removed,
        })
    }

    #[test]
    fn a_log_shows_a_successful_inclusion_in_its_block() {
        let inclusion = log_inclusion(&log(7, false), 5..=8).expect("in the span");
        assert_eq!(inclusion.block, 7);
        assert_eq!(inclusion.block_hash, H256::repeat_byte(0x22));
        assert_eq!(inclusion.transaction, H256::repeat_byte(0x33));
        assert!(inclusion.succeeded);
    }

    #[test]
    fn a_removed_log_or_one_outside_the_span_shows_nothing() {
        assert!(log_inclusion(&log(7, true), 5..=8).is_none());
        assert!(
            log_inclusion(&log(9, false), 5..=8).is_none(),
            "above the head"
        );
        assert!(
            log_inclusion(&log(4, false), 5..=8).is_none(),
            "before the span"
        );
    }

    #[test]
    fn a_log_without_its_block_hash_or_transaction_shows_nothing() {
        for field in ["blockHash", "transactionHash", "blockNumber"] {
            let mut log = log(7, false);
            log.as_object_mut().unwrap().remove(field);
            assert!(log_inclusion(&log, 5..=8).is_none(), "{field} missing");
        }
    }
}
