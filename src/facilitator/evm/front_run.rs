//! Front-runs (access.md §1): somebody copies a settlement routerd has broadcast and mines it
//! from another account first. When that transaction executed the payer's authorization with
//! exactly the signed effect, the payment is settled, once, by it: its payer did nothing wrong
//! (no cooldown), and a transaction of ours still unmined is replaced by a self-transfer rather
//! than left to revert. Only ERC-3009 authorizations are recognised: the token's logs name the
//! nonce used, so the transaction that used it is found and its effect read.

use ethers_core::types::{Bytes, H256};
use serde_json::{json, Value};

use super::inclusions::inclusion_of;
use super::ledger_nonce::record_nonce_read;
use super::worker::{Slot, Worker};
use crate::chain::Traffic;
use crate::chain::{self, Batch, Chain, Head};
use crate::clock::unix_now;
use crate::evm;
use crate::evm::authorization_logs::SignedTransfer;
use crate::evm::TxFees;
use crate::ledger::{depth, EvmRecord, Inclusion, State, TransferMethod};

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

/// The effect the payer signed, when the token's logs can show it (ERC-3009).
fn signed_transfer(record: &EvmRecord) -> Option<SignedTransfer> {
    let evm = record.part();
    (evm.method == TransferMethod::Eip3009).then_some(SignedTransfer {
        token: evm.token,
        from: evm.payer,
        to: evm.pay_to,
        value: record.value,
        nonce: evm.nonce,
    })
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
    let (Some(effect), Some(first)) = (signed_transfer(record), attempts.first()) else {
        return Lookup::None;
    };
    let filter = json!({
        "address": evm::hex_bytes(effect.token),
        "topics": effect.used_topics().iter().map(evm::hex_bytes).collect::<Vec<_>>(),
        "fromBlock": format!("{:#x}", first.sent_at_block + 1),
        "toBlock": format!("{:#x}", head.number),
    });
    let Ok(Ok(logs)) = chain
        .client
        .call(Traffic::Own, "eth_getLogs", vec![filter])
        .await
    else {
        return Lookup::NotYet;
    };
    let Some(logs) = logs.as_array() else {
        return Lookup::NotYet;
    };
    let used_by = logs
        .iter()
        .filter(|log| log.get("removed") != Some(&Value::Bool(true)))
        .filter_map(|log| log.get("transactionHash").and_then(chain::head::parse_hash))
        .find(|hash| !attempts.iter().any(|a| a.hash == *hash));
    match used_by {
        Some(hash) => judge(chain, &effect, hash, head, confirmations).await,
        None => Lookup::None,
    }
}

/// Whether transaction `hash` executed `effect`, read from its receipt.
async fn judge(
    chain: &Chain,
    effect: &SignedTransfer,
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
            if unmined && signed_transfer(record).is_some() {
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
