//! Callers waiting on a settlement that is under way in this process, by payment. A std `Mutex`
//! (not tokio's): it is held only for map operations, never across an `.await`. A duplicate that
//! finds no waiter here reads the stored record instead (settled by another instance, or claimed
//! here a moment before its waiter was registered).

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard};

use ethers_core::types::H256;
use tokio::sync::watch;

use crate::ledger::{Outcome, PaymentKey, Record, RequestTag};

/// What waiters learn about a settlement.
#[derive(Debug, Clone)]
pub enum Progress {
    Signing,
    /// Broadcast; the latest transaction hash (fee bumps and re-signing replace it).
    Sent(H256),
    Done(Outcome),
    /// Nothing was sent and the claim is released: the payment may be settled again.
    Abandoned(String),
    /// This instance no longer holds the settlement (a lane's lease lost): another instance
    /// settles it (see the store).
    Elsewhere,
}

impl Progress {
    pub fn finished(&self) -> bool {
        matches!(
            self,
            Progress::Done(_) | Progress::Abandoned(_) | Progress::Elsewhere
        )
    }
}

pub struct Entry {
    digest: H256,
    request: Option<RequestTag>,
    sender: watch::Sender<Progress>,
    /// The claiming request's `settlement` span (disabled without telemetry, or for a
    /// settlement resumed at start): the lane's work on it is traced there, and it ends when
    /// the entry goes and the caller has its answer.
    span: tracing::Span,
}

/// A settlement under way here, as a caller arriving for the same payment finds it.
pub struct Running {
    /// The authorization being settled.
    pub digest: H256,
    /// The claiming request's tag: a retry carrying it is that request again.
    pub request: Option<RequestTag>,
    pub progress: watch::Receiver<Progress>,
}

#[derive(Default)]
pub struct Waiters {
    entries: Mutex<HashMap<PaymentKey, Entry>>,
}

pub type Registry<'a> = MutexGuard<'a, HashMap<PaymentKey, Entry>>;

impl Waiters {
    pub fn lock(&self) -> Registry<'_> {
        self.entries.lock().expect("waiters lock")
    }

    /// The settlement under way under `key`, with a receiver of its progress.
    pub fn get(&self, key: &PaymentKey) -> Option<Running> {
        self.lock().get(key).map(|e| Running {
            digest: e.digest,
            request: e.request.clone(),
            progress: e.sender.subscribe(),
        })
    }

    pub fn register(
        registry: &mut Registry<'_>,
        key: PaymentKey,
        digest: H256,
        request: Option<RequestTag>,
        start: Progress,
        span: tracing::Span,
    ) -> watch::Receiver<Progress> {
        let (sender, receiver) = watch::channel(start);
        registry.insert(
            key,
            Entry {
                digest,
                request,
                sender,
                span,
            },
        );
        receiver
    }

    /// Sent as `hash` (its span learns the transaction; what else the family's sender records
    /// there, it records itself).
    pub fn sent(&self, key: &PaymentKey, hash: H256) {
        if let Some(entry) = self.lock().get(key) {
            if !entry.span.is_disabled() {
                entry.span.record("transaction", format!("{hash:?}"));
            }
            entry.sender.send_replace(Progress::Sent(hash));
        }
    }

    /// The span of the settlement under way under `key`, for the lane's work on it.
    pub fn span(&self, key: &PaymentKey) -> tracing::Span {
        self.lock()
            .get(key)
            .map_or_else(tracing::Span::none, |e| e.span.clone())
    }

    /// `record` is answered with its outcome: its span learns the including block. Answers
    /// whether a caller was waiting here.
    pub fn done(&self, record: &Record, outcome: Outcome) -> bool {
        if let Some(entry) = self.lock().get(&record.key()) {
            if let Some(inclusion) = record.state.inclusion() {
                entry.span.record("block", inclusion.block);
            }
            entry.span.record("success", outcome.success);
        }
        self.finish(&record.key(), Progress::Done(outcome))
    }

    /// Hands the final answer to every waiter and forgets the settlement; answers whether it
    /// was under way here.
    pub fn finish(&self, key: &PaymentKey, progress: Progress) -> bool {
        let entry = self.lock().remove(key);
        if let Some(entry) = &entry {
            entry.sender.send_replace(progress);
        }
        entry.is_some()
    }

    pub fn count(&self) -> usize {
        self.lock().len()
    }
}
