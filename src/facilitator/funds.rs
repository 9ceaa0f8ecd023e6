//! The signers' and fee payers' funds that `/ready` and `/metrics` report, as last read
//! (access.md §3c: an ops read costs no upstream request of its own). An EVM network's signers
//! are read again once its head has moved, so at most once per block; a Solana cluster's fee
//! payers at most once per slot time (`Due::After`). One network's read is single-flight: scrapes
//! that come meanwhile wait for it and answer what it read. A read that did not answer in full
//! is tried again after [`RETRY_FAILED`] at the soonest, so a silent node costs no more either.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use ethers_core::types::H256;
use tokio::sync::Mutex as AsyncMutex;

/// How soon a read that failed (in whole or in part) may be tried again.
pub const RETRY_FAILED: Duration = Duration::from_secs(1);

/// When a network's last read stops being what to answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Due {
    /// EVM: read again at a head other than this one (number and hash).
    NewHead(u64, H256),
    /// Solana: read again once the last read is this old.
    After(Duration),
}

/// One network's last read.
struct Read<T> {
    /// `Due::NewHead`'s head it was read at; `None` for a cluster read by time.
    head: Option<(u64, H256)>,
    at: Instant,
    /// Every account answered.
    complete: bool,
    funds: Vec<T>,
}

impl<T> Read<T> {
    fn fresh(&self, due: Due, now: Instant) -> bool {
        let age = now.saturating_duration_since(self.at);
        match due {
            Due::NewHead(number, hash) => {
                self.head == Some((number, hash)) && (self.complete || age < RETRY_FAILED)
            }
            Due::After(every) => age < if self.complete { every } else { RETRY_FAILED },
        }
    }
}

type Slot<T> = Arc<AsyncMutex<Option<Read<T>>>>;

/// The last read of each network, by name.
pub struct Kept<T>(Mutex<HashMap<String, Slot<T>>>);

impl<T> Default for Kept<T> {
    fn default() -> Self {
        Self(Mutex::new(HashMap::new()))
    }
}

impl<T: Clone> Kept<T> {
    /// `network`'s funds: its last read while fresh by `due`, else what `read` answers now
    /// (the funds, and whether every account answered).
    pub async fn get<F>(&self, network: &str, due: Due, read: impl FnOnce() -> F) -> Vec<T>
    where
        F: Future<Output = (Vec<T>, bool)>,
    {
        let slot = {
            // Held for a lookup only: a step that panicked meanwhile left whole entries.
            let mut slots = self.0.lock().unwrap_or_else(PoisonError::into_inner);
            slots.entry(network.to_string()).or_default().clone()
        };
        let mut last = slot.lock().await;
        if let Some(read) = last.as_ref().filter(|r| r.fresh(due, Instant::now())) {
            return read.funds.clone();
        }
        let (funds, complete) = read().await;
        *last = Some(Read {
            head: match due {
                Due::NewHead(number, hash) => Some((number, hash)),
                Due::After(_) => None,
            },
            at: Instant::now(),
            complete,
            funds: funds.clone(),
        });
        funds
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(head: Option<(u64, H256)>, complete: bool, at: Instant) -> Read<()> {
        Read {
            head,
            at,
            complete,
            funds: Vec::new(),
        }
    }

    #[test]
    fn an_evm_read_holds_until_the_head_moves() {
        let now = Instant::now();
        let (a, b) = (H256::repeat_byte(1), H256::repeat_byte(2));
        let later = now + Duration::from_secs(3600);
        let done = read(Some((7, a)), true, now);
        assert!(
            done.fresh(Due::NewHead(7, a), later),
            "no new block: no read"
        );
        assert!(!done.fresh(Due::NewHead(8, b), now), "a new block");
        assert!(!done.fresh(Due::NewHead(7, b), now), "the block replaced");
        let failed = read(Some((7, a)), false, now);
        assert!(failed.fresh(Due::NewHead(7, a), now + RETRY_FAILED / 2));
        assert!(!failed.fresh(Due::NewHead(7, a), now + RETRY_FAILED));
    }

    #[test]
    fn a_read_by_time_holds_for_its_time() {
        let (now, every) = (Instant::now(), Duration::from_millis(400));
        let due = Due::After(every);
        let done = read(None, true, now);
        assert!(done.fresh(due, now + every / 2));
        assert!(!done.fresh(due, now + every));
        let failed = read(None, false, now);
        assert!(failed.fresh(due, now + every));
        assert!(!failed.fresh(due, now + RETRY_FAILED));
    }

    #[tokio::test]
    async fn one_read_per_due_however_many_ask_at_once() {
        let kept: Arc<Kept<u32>> = Arc::default();
        let reads = Arc::new(std::sync::atomic::AtomicU32::new(0));
        let due = Due::NewHead(1, H256::zero());
        let ask = |due| {
            let (kept, reads) = (kept.clone(), reads.clone());
            async move {
                kept.get("base", due, || async {
                    let n = reads.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1;
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    (vec![n], true)
                })
                .await
            }
        };
        let answers = futures::future::join_all((0..50).map(|_| ask(due))).await;
        assert!(answers.iter().all(|a| a == &[1]), "{answers:?}");
        assert_eq!(ask(Due::NewHead(2, H256::zero())).await, [2]);
        assert_eq!(reads.load(std::sync::atomic::Ordering::SeqCst), 2);
    }
}
