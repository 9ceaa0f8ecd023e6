//! One follower per cluster, the Solana side of the EVM lanes' follower: one task asks for every
//! followed signature in one `getSignatureStatuses` per tick (shared by all settlements and every
//! claimant waiting on one: a retry waits on the same follower, no second loop), then
//! `getTransaction` once for each that reached the commitment. Only the chain decides: the
//! transaction's own record (success when it ran and moved the amount, else its failure), or
//! expiry once the block height is past the blockhash's last valid one and it is still unknown;
//! the same signed bytes are sent again while they may land.
//!
//! A settlement is claimed before its blockhash bound is read: the first tick after its send
//! reads the latest blockhash's `lastValidBlockHeight` (one call for all sent since the last
//! tick), later than the payer could have signed, so it never expires one too early; a record
//! stored without it (0) is given it again when followed after a restart.

use std::collections::hash_map::Entry;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{watch, Notify};
use tokio::time::Instant;
use tracing::Instrument;

use super::settle::cool_down;
use crate::chain::svm::{Looks, SignatureStatus, SolanaChain, TransactionRecord};
use crate::clock::unix_now;
use crate::facilitator::settlement::cooldown::Cooldown;
use crate::ledger::{Lost, Record, SvmRecord, SvmSettlement};
use crate::store::Storage;
use crate::svm::{transfer_indexes, PaymentTransaction};

/// How often the followed signatures are read while no slot is due: a status changes once a slot
/// (400 ms), and the reads come often while the next slot is due (`Looks`), so a settlement is
/// answered within a few milliseconds of the slot that brings it to the commitment.
const TICK: Duration = Duration::from_millis(100);
/// How often a transaction the cluster does not know yet is sent again.
const RESEND_EVERY: Duration = Duration::from_secs(2);
/// How long a sent transaction may be unknown before the block height is read with the statuses:
/// one that lands in the next slot never costs the read.
const UNKNOWN_GRACE: Duration = Duration::from_secs(1);
/// The failure of a transaction that ran without moving the amount from the source to the
/// destination.
const NOT_MOVED: &str = "it ran, but the token balances did not move by the amount";

/// The end of a followed settlement, once stored: `None` until then.
pub(super) type Ending = watch::Receiver<Option<Arc<Ended>>>;

/// A followed settlement's end, with when the status that ended it arrived (its block-to-answer
/// time starts there).
pub(super) struct Ended {
    pub(super) record: Record,
    pub(super) seen: Instant,
}

pub(super) struct Follower {
    chain: Arc<SolanaChain>,
    ledger: Storage,
    cooldown: Arc<Cooldown>,
    /// By signature.
    followed: Mutex<HashMap<String, Followed>>,
    wake: Notify,
}

struct Followed {
    record: SvmRecord,
    sent_at: Option<Instant>,
    /// Since when the cluster has not known the signature (`None` once it did).
    unknown_since: Option<Instant>,
    /// The settlement's span: its end is recorded on it.
    span: tracing::Span,
    /// While what its last status means is still being worked out (its record read, its end
    /// stored): the ticks meanwhile do not ask for it again.
    busy: bool,
    ended: watch::Sender<Option<Arc<Ended>>>,
}

/// What one signature's tick found.
enum Landing {
    /// Recorded at the commitment: `error` when it failed or moved other than the amount.
    Ended { slot: u64, error: Option<String> },
    /// Landed, not yet at the commitment, or its record could not be read this time.
    Pending,
    /// Not known to have landed.
    Unknown,
}

impl Follower {
    /// The cluster's follower, its task started.
    pub(super) fn start(
        chain: Arc<SolanaChain>,
        ledger: Storage,
        cooldown: Arc<Cooldown>,
    ) -> Arc<Self> {
        let follower = Arc::new(Self {
            chain,
            ledger,
            cooldown,
            followed: Mutex::new(HashMap::new()),
            wake: Notify::new(),
        });
        tokio::spawn(follower.clone().run());
        follower
    }

    /// Follows a stored settlement (`sent_at`: when it was sent, if it was) until it ends; one
    /// already followed is not followed twice: its end is the same.
    pub(super) fn follow(
        &self,
        record: SvmRecord,
        sent_at: Option<Instant>,
        span: tracing::Span,
    ) -> Ending {
        let signature = record.part().settlement.signature.clone();
        let mut followed = self.followed.lock().expect("not poisoned");
        let ending = match followed.entry(signature) {
            Entry::Occupied(entry) => entry.get().ended.subscribe(),
            Entry::Vacant(entry) => {
                let (ended, ending) = watch::channel(None);
                let unknown_since = None;
                entry.insert(Followed {
                    record,
                    sent_at,
                    unknown_since,
                    span,
                    busy: false,
                    ended,
                });
                ending
            }
        };
        drop(followed);
        self.wake.notify_one();
        ending
    }

    async fn run(self: Arc<Self>) {
        // The slots' pace outlives a rest: the next settlement's reads are due with its slot.
        let mut looks = Looks::new(TICK);
        loop {
            if self.followed.lock().expect("not poisoned").is_empty() {
                self.wake.notified().await;
                continue;
            }
            let started = Instant::now();
            if let Some(slot) = self.clone().tick().await {
                looks.read(started.into_std(), slot);
            }
            // Every TICK from the start of the last (at once after a slow read), sooner when a
            // slot is due.
            let now = Instant::now();
            let due = now + looks.next_look(now.into_std());
            tokio::time::sleep_until(due.min(started + TICK)).await;
        }
    }

    /// One read of every followed signature not busy, and what follows from it, in tasks of their
    /// own: a slow record or store does not hold the next tick back. Answers the slot read at.
    async fn tick(self: Arc<Self>) -> Option<u64> {
        let (asked, height, bound) = self.asks();
        if asked.is_empty() {
            return None;
        }
        let signatures: Vec<String> = asked.iter().map(|(s, _)| s.signature.clone()).collect();
        let read = match self.chain.follow_read(&signatures, height, bound).await {
            Ok(read) => read,
            Err(e) => {
                tracing::warn!(chain = %self.chain.name, error = %e, "could not read the settlements' statuses; trying again");
                signatures.iter().for_each(|signature| self.free(signature));
                return None;
            }
        };
        if let Some(bound) = read.last_valid_block_height {
            self.bound(&signatures, bound);
        }
        for ((svm, span), status) in asked.into_iter().zip(read.statuses) {
            let follower = self.clone();
            let height = read.block_height;
            let one = async move {
                let signature = svm.signature.clone();
                follower.one(svm, status, height).await;
                follower.free(&signature);
            };
            tokio::spawn(one.instrument(span));
        }
        read.slot
    }

    /// A settlement whose tick is done, if it is still followed.
    fn free(&self, signature: &str) {
        let mut followed = self.followed.lock().expect("not poisoned");
        if let Some(f) = followed.get_mut(signature) {
            f.busy = false;
        }
    }

    /// Each followed settlement not busy (and its span), now busy, whether the block height is to
    /// be read (one has been unknown past the grace), and whether the latest blockhash is (one
    /// has no bound).
    fn asks(&self) -> (Vec<(SvmSettlement, tracing::Span)>, bool, bool) {
        let mut followed = self.followed.lock().expect("not poisoned");
        let height = followed.values().any(|f| {
            f.unknown_since
                .is_some_and(|at| at.elapsed() >= UNKNOWN_GRACE)
        });
        let asked: Vec<(SvmSettlement, tracing::Span)> = followed
            .values_mut()
            .filter(|f| !f.busy)
            .map(|f| {
                f.busy = true;
                (f.record.part().settlement.clone(), f.span.clone())
            })
            .collect();
        let bound = asked
            .iter()
            .any(|(svm, _)| svm.last_valid_block_height == 0);
        (asked, height, bound)
    }

    /// The bound of those of `signatures` without one: read after they were sent.
    fn bound(&self, signatures: &[String], bound: u64) {
        let mut followed = self.followed.lock().expect("not poisoned");
        for signature in signatures {
            let svm = followed
                .get_mut(signature)
                .map(|f| &mut f.record.part_mut().settlement);
            if let Some(svm) = svm.filter(|svm| svm.last_valid_block_height == 0) {
                svm.last_valid_block_height = bound;
            }
        }
    }

    /// One settlement's tick: its end, or a send again.
    async fn one(&self, svm: SvmSettlement, status: Option<SignatureStatus>, height: Option<u64>) {
        // When the status arrived: a status at the commitment makes its slot seen then.
        let seen = Instant::now();
        let landing = landing(&self.chain, &svm, status).await;
        let signature = &svm.signature;
        let expired = {
            let mut followed = self.followed.lock().expect("not poisoned");
            let Some(f) = followed.get_mut(signature) else {
                return;
            };
            let bound = f.record.part().settlement.last_valid_block_height;
            match landing {
                Landing::Ended { .. } => false,
                Landing::Pending => {
                    f.unknown_since = None;
                    false
                }
                Landing::Unknown => {
                    f.unknown_since.get_or_insert_with(Instant::now);
                    height.is_some_and(|h| bound > 0 && h > bound)
                }
            }
        };
        match landing {
            Landing::Ended { slot, error } => {
                let failed = error.is_some();
                let end = |r: &mut Record| {
                    r.landed(slot, error, unix_now());
                };
                self.end(signature, Some((slot, failed)), seen, end).await
            }
            Landing::Unknown if expired => {
                let end = |r: &mut Record| {
                    r.expire(Lost::BlockHeightExceeded, unix_now());
                };
                self.end(signature, None, Instant::now(), end).await
            }
            Landing::Unknown if self.resend_due(signature) => {
                if let Err(e) = self.chain.send_transaction(&svm.transaction).await {
                    tracing::warn!(chain = %self.chain.name, signature = %signature, error = %e, "sendTransaction failed; trying again");
                }
            }
            Landing::Unknown | Landing::Pending => {}
        }
    }

    /// Whether an unknown transaction is to be sent again now (then marked sent).
    fn resend_due(&self, signature: &str) -> bool {
        let mut followed = self.followed.lock().expect("not poisoned");
        let Some(f) = followed.get_mut(signature) else {
            return false;
        };
        let due = f.sent_at.is_none_or(|at| at.elapsed() >= RESEND_EVERY);
        if due {
            f.sent_at = Some(Instant::now());
        }
        due
    }

    /// Ends a settlement: stored durably (`landed`: its slot and whether it failed), its payer
    /// cooled down when it failed, its waiters told. A store that fails keeps it followed: the
    /// next tick reads it again.
    async fn end(
        &self,
        signature: &str,
        landed: Option<(u64, bool)>,
        seen: Instant,
        end: impl FnOnce(&mut Record),
    ) {
        let record = self
            .followed
            .lock()
            .expect("not poisoned")
            .get(signature)
            .map(|f| f.record.clone());
        let Some(mut record) = record else { return };
        end(&mut record);
        if let Err(e) = self.ledger.save(&[record.as_record()], true).await {
            tracing::error!(chain = %self.chain.name, signature = %signature, error = %e, "could not store the settlement's end; reading it again");
            return;
        }
        let svm = record.part().settlement.clone();
        if let Some((_, true)) = landed {
            tracing::warn!(chain = %self.chain.name, signature = %signature, payer = %svm.payer, "a Solana settlement failed on chain: its payer (the transfer's authority) is cooled down");
            cool_down(&self.cooldown, &record).await;
        }
        let Some(followed) = self
            .followed
            .lock()
            .expect("not poisoned")
            .remove(signature)
        else {
            return;
        };
        if let Some((slot, failed)) = landed {
            followed.span.record("block", slot);
            followed.span.record("success", !failed);
        }
        followed.ended.send_replace(Some(Arc::new(Ended {
            record: record.into_record(),
            seen,
        })));
    }
}

/// The end of a followed settlement, or `None` once `deadline` passes first.
pub(super) async fn until(mut ending: Ending, deadline: Instant) -> Option<Ended> {
    let ended = tokio::time::timeout_at(deadline, ending.wait_for(Option::is_some)).await;
    let ended = ended.ok()?.ok()?;
    ended.as_deref().map(|e| Ended {
        record: e.record.clone(),
        seen: e.seen,
    })
}

/// What a status means, checked against the transaction's own record when it claims the
/// commitment: one status answer (a node that says `confirmed` of a transaction that never
/// landed) does not make a success, the record does (access.md 3c).
async fn landing(
    chain: &SolanaChain,
    svm: &SvmSettlement,
    status: Option<SignatureStatus>,
) -> Landing {
    match status {
        None => Landing::Unknown,
        Some(status) if !status.committed => Landing::Pending,
        Some(_) => match chain.transaction_record(&svm.signature).await {
            Ok(Some(landed)) => Landing::Ended {
                slot: landed.slot,
                error: outcome_error(&landed, svm),
            },
            Ok(None) => {
                tracing::warn!(chain = %chain.name, signature = %svm.signature, "a status at the commitment, but the cluster has no record of the transaction: not believed");
                Landing::Unknown
            }
            Err(e) => {
                tracing::warn!(chain = %chain.name, signature = %svm.signature, error = %e, "could not read the transaction's record; trying again");
                Landing::Pending
            }
        },
    }
}

/// Why a recorded transaction is no success: its error on chain, or token balances that did not
/// move by exactly the amount from the source to the destination.
fn outcome_error(landed: &TransactionRecord, svm: &SvmSettlement) -> Option<String> {
    if let Some(error) = &landed.error {
        return Some(error.clone());
    }
    let indexes = PaymentTransaction::decode(&svm.transaction)
        .ok()
        .and_then(|tx| transfer_indexes(&tx));
    let moved =
        indexes.is_some_and(|(source, destination)| landed.moved(source, destination, svm.amount));
    (!moved).then(|| NOT_MOVED.to_string())
}
