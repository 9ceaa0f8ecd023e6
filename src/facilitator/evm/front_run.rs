//! Front-runs (access.md §1): somebody copies a settlement routerd has broadcast and mines it
//! from another account first. When that transaction executed the payer's authorization with
//! exactly the signed effect, the payment is settled, once, by it: its payer did nothing wrong
//! (no cooldown), and a transaction of ours still unmined is replaced by a self-transfer rather
//! than left to revert. An ERC-3009 authorization is recognised by the token's logs, which name
//! the nonce used; a Permit2 one, whose use writes no log, only by a copy of routerd's own call.

use ethers_core::types::{Address, Bytes, H256};
use serde_json::{json, Value};

use super::inclusions::inclusion_of;
use super::ledger_nonce::record_nonce_read;
use super::worker::{Slot, Worker};
use crate::chain::Traffic;
use crate::chain::{self, Batch, Chain, Head};
use crate::clock::unix_now;
use crate::evm;
use crate::evm::authorization_logs::{SignedCall, SignedTransfer};
use crate::evm::TxFees;
use crate::ledger::{depth, EvmRecord, Inclusion, State, TransferMethod};

/// The most of a payer's transfers since routerd's first attempt that are read for a copy of a
/// Permit2 settlement: a copy follows that attempt closely, and each is one read.
const COPIES_READ: usize = 32;

/// What the chain says of a settlement whose authorization nonce is used.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Lookup {
    /// A transaction that is not ours executed it with the signed effect, `confirmations` deep.
    FrontRun(Inclusion),
    /// Nothing of the kind: no such transaction since ours was signed, or one with another
    /// effect (a cancellation, another payee, a revert), or one of ours.
    None,
    /// The node could not say, or the front-run is not deep enough yet: ask at a later head.
    NotYet,
}

/// The effect the payer signed, as far as the chain can show who executed it.
enum Effect {
    /// ERC-3009: the token's `AuthorizationUsed` names the nonce, its `Transfer` follows.
    Logged(SignedTransfer),
    /// Permit2: a copy of routerd's call, found among the payer's transfers.
    Copied(SignedCall),
}

impl Effect {
    fn of(record: &EvmRecord) -> Option<Effect> {
        let evm = record.part();
        match evm.method {
            TransferMethod::Eip3009 => Some(Effect::Logged(SignedTransfer {
                token: evm.token,
                from: evm.payer,
                to: evm.pay_to,
                value: record.value,
                nonce: evm.nonce,
            })),
            TransferMethod::Permit2 => Some(Effect::Copied(SignedCall {
                token: evm.token,
                from: evm.payer,
                value: record.value,
                contract: evm.call_target(),
                calldata: Bytes::clone(&evm.calldata),
            })),
            TransferMethod::Call => None,
        }
    }

    /// The token whose logs show it, and the topics of those logs.
    fn logged_as(&self) -> (Address, Vec<H256>) {
        match self {
            Effect::Logged(transfer) => (transfer.token, transfer.used_topics().to_vec()),
            Effect::Copied(call) => (call.token, call.transfer_topics().to_vec()),
        }
    }

    fn executed_in(&self, logs: &[Value]) -> bool {
        match self {
            Effect::Logged(transfer) => transfer.executed_in(logs),
            Effect::Copied(call) => call.moved_in(logs),
        }
    }
}

/// The transaction that used `record`'s authorization nonce after our first transaction was
/// signed, if it is not ours and had exactly the signed effect. A use before that is no front-run
/// of ours: routerd cannot know that no other facilitator answered a success for it.
pub(super) async fn front_runner(
    chain: &Chain,
    record: &EvmRecord,
    head: &Head,
    confirmations: u64,
) -> Lookup {
    let attempts = &record.part().attempts;
    let (Some(effect), Some(first)) = (Effect::of(record), attempts.first()) else {
        return Lookup::None;
    };
    let Some(logged) = logged_since(chain, &effect, first.sent_at_block + 1, head).await else {
        return Lookup::NotYet;
    };
    let mut theirs = logged
        .into_iter()
        .filter(|h| !attempts.iter().any(|a| a.hash == *h));
    let used_by = match &effect {
        Effect::Logged(_) => theirs.next(),
        Effect::Copied(call) => match copy_among(chain, call, &first_distinct(theirs)).await {
            Some(copy) => copy,
            None => return Lookup::NotYet,
        },
    };
    match used_by {
        Some(hash) => judge(chain, &effect, hash, head, confirmations).await,
        None => Lookup::None,
    }
}

/// The transactions of the logs that show `effect` from block `from` to `head`, in order, or
/// `None` when the node cannot say.
async fn logged_since(chain: &Chain, effect: &Effect, from: u64, head: &Head) -> Option<Vec<H256>> {
    let (token, topics) = effect.logged_as();
    let filter = json!({
        "address": evm::hex_bytes(token),
        "topics": topics.iter().map(evm::hex_bytes).collect::<Vec<_>>(),
        "fromBlock": format!("{from:#x}"),
        "toBlock": format!("{:#x}", head.number),
    });
    let logs = chain
        .client
        .call(Traffic::Own, "eth_getLogs", vec![filter])
        .await
        .ok()?
        .ok()?;
    let hashes = logs
        .as_array()?
        .iter()
        .filter(|log| log.get("removed") != Some(&Value::Bool(true)))
        .filter_map(|log| log.get("transactionHash").and_then(chain::head::parse_hash))
        .collect();
    Some(hashes)
}

/// The first of `hashes` that is a copy of `call`, read in one request; `None` when the node
/// cannot say.
async fn copy_among(chain: &Chain, call: &SignedCall, hashes: &[H256]) -> Option<Option<H256>> {
    if hashes.is_empty() {
        return Some(None);
    }
    let mut batch = Batch::new();
    let slots: Vec<_> = hashes
        .iter()
        .map(|hash| {
            let params = vec![json!(evm::hex_bytes(hash))];
            batch.add(chain::Call::new("eth_getTransactionByHash", params))
        })
        .collect();
    let answers = chain.client.ask(Traffic::Own, &batch).await.ok()?;
    for (hash, slot) in hashes.iter().zip(slots) {
        match answers.get(slot) {
            Ok(transaction) if call.is_copy(transaction) => return Some(Some(*hash)),
            Ok(_) => {}
            Err(_) => return None,
        }
    }
    Some(None)
}

/// The first `COPIES_READ` distinct of `hashes`, in order (a transaction may log several transfers).
fn first_distinct(hashes: impl Iterator<Item = H256>) -> Vec<H256> {
    let mut distinct = Vec::new();
    for hash in hashes {
        if distinct.len() == COPIES_READ {
            break;
        }
        if !distinct.contains(&hash) {
            distinct.push(hash);
        }
    }
    distinct
}

/// Whether transaction `hash` executed `effect`, read from its receipt.
async fn judge(
    chain: &Chain,
    effect: &Effect,
    hash: H256,
    head: &Head,
    confirmations: u64,
) -> Lookup {
    let params = vec![json!(evm::hex_bytes(hash))];
    let Ok(answer) = chain
        .client
        .call(Traffic::Own, "eth_getTransactionReceipt", params)
        .await
    else {
        return Lookup::NotYet;
    };
    let Some(inclusion) = inclusion_of(hash, &answer, head.number) else {
        return Lookup::NotYet; // not served yet, or in a block past our head
    };
    let logs = answer
        .as_ref()
        .ok()
        .and_then(|r| r.get("logs"))
        .and_then(Value::as_array);
    match logs {
        _ if depth(head.number, inclusion.block) < confirmations => Lookup::NotYet,
        Some(logs) if inclusion.succeeded && effect.executed_in(logs) => {
            Lookup::FrontRun(inclusion)
        }
        _ => Lookup::None,
    }
}

impl Worker {
    /// While the lane is stalled, settlements not mined yet whose authorization reads used at
    /// this head may have been front-run: each one that was is answered a success by the other
    /// transaction, and a self-transfer replaces ours at its nonce (it could only revert now).
    /// Answers the self-transfers to broadcast.
    pub(super) async fn forestalled(
        &mut self,
        head: &Head,
        chain_nonce: u64,
        market: TxFees,
    ) -> Vec<Bytes> {
        let mut resend = Vec::new();
        for nonce in self.used_elsewhere(head, chain_nonce).await {
            let Some(Slot::Settlement { record, .. }) = self.nonces.slots.get(&nonce) else {
                continue;
            };
            let confirmations = self.lane.settings.confirmations;
            let Lookup::FrontRun(by) =
                front_runner(&self.lane.chain, record, head, confirmations).await
            else {
                continue; // it stays, and is answered by what becomes of it
            };
            let Some(Slot::Settlement { mut record, .. }) = self.nonces.slots.remove(&nonce) else {
                continue;
            };
            tracing::warn!(payment = %record.key(), by = ?by.transaction, nonce, "authorization executed by another transaction first; answered by it, and a self-transfer replaces ours");
            let previous = record.latest().map_or(market, |a| a.fees);
            let filler = self.filler(nonce, previous.replacement(market), head.number);
            resend.push(filler.raw.clone());
            self.nonces.slots.insert(nonce, Slot::filler(filler));
            let answered_now = record.front_run(by, unix_now());
            self.finished(*record, answered_now).await;
        }
        resend
    }

    /// The nonces, from `chain_nonce` on, of settlements not mined yet whose authorization nonce
    /// reads used at `head` (one batch of reads).
    async fn used_elsewhere(&self, head: &Head, chain_nonce: u64) -> Vec<u64> {
        let block = format!("{:#x}", head.number);
        let mut batch = Batch::new();
        let mut asked = Vec::new();
        for (nonce, slot) in self.nonces.slots.range(chain_nonce..) {
            let Slot::Settlement { record, .. } = slot else {
                continue;
            };
            let unmined = matches!(record.state, State::Signed { .. } | State::Sent { .. });
            if unmined && Effect::of(record).is_some() {
                let read = record_nonce_read(record.part());
                let slot = batch.add(chain::eth_call(read.target, &read.call, &block));
                asked.push((*nonce, read, slot));
            }
        }
        if asked.is_empty() {
            return Vec::new();
        }
        let Ok(answers) = self.lane.chain.client.ask(Traffic::Own, &batch).await else {
            return Vec::new();
        };
        asked
            .into_iter()
            .filter(|(_, read, slot)| {
                let word = answers.get(*slot).as_ref().ok().and_then(evm::parse_word);
                word.is_some_and(|w| read.used(w))
            })
            .map(|(nonce, _, _)| nonce)
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_copy_is_looked_for_among_the_first_distinct_transactions() {
        let h = |n: u8| H256::repeat_byte(n);
        let logged = [h(1), h(2), h(1), h(3)];
        assert_eq!(first_distinct(logged.into_iter()), vec![h(1), h(2), h(3)]);
        let many = (0..=u8::MAX).map(h);
        let read = first_distinct(many);
        assert_eq!(read.len(), COPIES_READ);
        assert_eq!(
            read[COPIES_READ - 1],
            h(COPIES_READ as u8 - 1),
            "in log order"
        );
    }
}
