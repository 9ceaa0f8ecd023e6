//! What a cluster's follower reads each tick, in one batch: the block height when a followed
//! transaction may have expired (read first, so that a signature still unknown after a height past
//! its blockhash's last valid one can never land), every followed signature's status
//! (`getSignatureStatuses`, up to 256 a call), and the latest blockhash's `lastValidBlockHeight`
//! when a settlement sent since the last tick has no bound yet.

use std::time::{Duration, Instant};

use serde_json::{json, Value};

use super::{context_value, last_valid_height, SignatureStatus, SolanaChain, SolanaError};
use crate::chain::cadence::Cadence;
use crate::chain::client::Call;
use crate::chain::traffic::Traffic;

/// Signatures one `getSignatureStatuses` may ask for (a node refuses more).
const STATUSES_PER_CALL: usize = 256;

/// One tick's read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FollowRead {
    /// When asked for.
    pub block_height: Option<u64>,
    /// One per signature asked, in order: `None` while the cluster does not know it.
    pub statuses: Vec<Option<SignatureStatus>>,
    /// When asked for: no blockhash a payer signed before this read stays valid longer.
    pub last_valid_block_height: Option<u64>,
    /// The slot the statuses were read at (their answer's context), when the node said.
    pub slot: Option<u64>,
}

/// When a cluster's follower reads next. A status changes once a slot, so the reads follow the
/// slots they report as the EVM head poller follows blocks (`Cadence`): at the interval until
/// shortly before the next slot is due, then often until it is there. At the interval alone a
/// settlement would be answered half an interval after its slot on average.
pub struct Looks {
    cadence: Cadence,
    slot: Option<u64>,
}

impl Looks {
    pub fn new(interval: Duration) -> Self {
        Self {
            cadence: Cadence::new(interval),
            slot: None,
        }
    }

    /// The read sent at `at` found the cluster at `slot`. The first read places no slot: when
    /// it began is not known.
    pub fn read(&mut self, at: Instant, slot: u64) {
        if let Some(last) = self.slot.filter(|last| slot > *last) {
            self.cadence.arrived_after(at, slot - last);
        }
        self.slot = Some(self.slot.map_or(slot, |last| last.max(slot)));
    }

    /// How long to wait, from `now`, before reading again.
    pub fn next_look(&self, now: Instant) -> Duration {
        self.cadence.next_look(now)
    }
}

impl SolanaChain {
    /// The statuses of `signatures` (base58), with the block height first when `height`, and the
    /// latest blockhash's last valid block height at the commitment when `bound`.
    pub async fn follow_read(
        &self,
        signatures: &[String],
        height: bool,
        bound: bool,
    ) -> Result<FollowRead, SolanaError> {
        let commitment = json!({"commitment": self.commitment()});
        let mut calls = Vec::new();
        if height {
            calls.push(Call::new("getBlockHeight", vec![commitment.clone()]));
        }
        let history = json!({"searchTransactionHistory": true});
        for chunk in signatures.chunks(STATUSES_PER_CALL) {
            let params = vec![json!(chunk), history.clone()];
            calls.push(Call::new("getSignatureStatuses", params));
        }
        if bound {
            calls.push(Call::new("getLatestBlockhash", vec![commitment]));
        }
        let mut answers = self.client.batch(Traffic::Own, &calls).await?.into_iter();
        let mut next = || {
            answers
                .next()
                .expect("the client answers every call of a batch")
        };
        let block_height = match height {
            true => Some(block_height(next())?),
            false => None,
        };
        let mut statuses = Vec::with_capacity(signatures.len());
        let mut slot = None;
        for chunk in signatures.chunks(STATUSES_PER_CALL) {
            const METHOD: &str = "getSignatureStatuses";
            let answer = next();
            slot = slot.max(context_slot(&answer));
            let value = context_value(METHOD, answer)?;
            let value = value.as_array().filter(|v| v.len() == chunk.len());
            let value = value.ok_or(SolanaError::Malformed {
                method: METHOD,
                what: "not one status per signature",
            })?;
            statuses.extend(value.iter().map(|s| self.signature_status(s)));
        }
        let last_valid_block_height = match bound {
            true => Some(last_valid_height(next())?),
            false => None,
        };
        Ok(FollowRead {
            block_height,
            statuses,
            last_valid_block_height,
            slot,
        })
    }
}

/// An answer's `context.slot`.
fn context_slot(answer: &Result<Value, crate::chain::client::RpcError>) -> Option<u64> {
    answer.as_ref().ok()?.get("context")?.get("slot")?.as_u64()
}

fn block_height(answer: Result<Value, crate::chain::client::RpcError>) -> Result<u64, SolanaError> {
    const METHOD: &str = "getBlockHeight";
    let height = answer.map_err(|error| SolanaError::Rpc {
        method: METHOD,
        error,
    })?;
    height.as_u64().ok_or(SolanaError::Malformed {
        method: METHOD,
        what: "not a height",
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: fn(u64) -> Duration = Duration::from_millis;

    #[test]
    fn the_reads_come_often_only_while_the_next_slot_is_due() {
        let t0 = Instant::now();
        let mut looks = Looks::new(MS(100));
        // Slots every 400 ms, each read 5 ms into it; the first read places nothing.
        for i in 0..6 {
            looks.read(t0 + MS(i * 400 + 5), 10 + i);
        }
        assert_eq!(looks.next_look(t0 + MS(2010)), MS(100));
        assert_eq!(
            looks.next_look(t0 + MS(2345)),
            MS(20),
            "up to the lead before the slot"
        );
        assert_eq!(looks.next_look(t0 + MS(2370)), MS(10));
        // A node behind a balancer answering an older slot moves nothing.
        looks.read(t0 + MS(2380), 12);
        assert_eq!(looks.next_look(t0 + MS(2385)), MS(10));
    }

    #[test]
    fn after_a_rest_the_next_slot_is_due_where_the_pace_puts_it() {
        let t0 = Instant::now();
        let mut looks = Looks::new(MS(100));
        for i in 0..6 {
            looks.read(t0 + MS(i * 400), 100 + i);
        }
        // Nothing followed for 20 s (50 slots); the next settlement's first read is at 22,050.
        looks.read(t0 + MS(22_050), 155);
        // Slot 155 began at 22,000 by the pace: 156 is due at 22,400.
        assert_eq!(looks.next_look(t0 + MS(22_060)), MS(100));
        assert_eq!(looks.next_look(t0 + MS(22_370)), MS(10));
    }
}
