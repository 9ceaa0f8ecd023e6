//! What routerd stores, as traits, and the backends behind them: sled (embedded, one instance,
//! the default) and PostgreSQL (several instances sharing one database). Invariants every
//! backend keeps, checked by one conformance suite (conformance.rs):
//! - a payment is claimed at most once: `claim` creates the record only if none exists;
//! - signed attempts and their lane's next nonce are written together, and only under the lane's
//!   current lease (fencing token): an instance that lost its lease cannot store a signature, so
//!   it never broadcasts one;
//! - a write a caller waits on (`durable`) is on disk when the call returns;
//! - a claimed settlement is in the work queue until its first signed attempt is stored: taken
//!   by the lane that claimed it (under that lane's fence), or free for any lane of its network.
//!   A lane's next holder (a larger fence) takes over what the previous holder had taken.
//!   A claim that names its signer (`Record::sender`) is taken only by that signer's lane;
//! - a payer's revert cooldown, once stored, is seen by every handle and outlives the process;
//!   a later end is never shortened by an earlier one.

mod conformance;
pub mod postgres;
mod rows;
pub mod sled;
mod sled_v1;
mod upgrade_tests;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use ethers_core::types::{Address, U256};

use crate::config::{StorageBackend, StorageSettings};
use crate::ledger::{LaneId, PaymentKey, Record, RouterNonceKey};

/// What went wrong, in words every backend can say: callers decide on the kind, and the
/// backend's own error rides along, boxed, for the log (never a URL or a password).
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// Out of reach, or unable to make writes durable: a retry later may work.
    #[error("store: {0}")]
    Unavailable(Detail),
    #[error("store: record {key} is corrupt: {detail}")]
    Corrupt { key: String, detail: String },
    /// Written by a routerd this one cannot read (the message names the store).
    #[error("{0}")]
    Schema(String),
    /// The lane's lease moved to another instance: nothing was written.
    #[error("store: lane {0} is leased to another instance")]
    LeaseLost(String),
    /// Any other failure the backend reports.
    #[error("store: {0}")]
    Backend(Detail),
}

/// A backend's own error.
pub type Detail = Box<dyn std::error::Error + Send + Sync>;

impl StoreError {
    /// The store cannot be reached: `detail` says which and why.
    pub fn unavailable(detail: impl Into<String>) -> Self {
        StoreError::Unavailable(detail.into().into())
    }

    /// Whether the failure is the store being out of reach (a retry later may work), as
    /// opposed to data or schema problems.
    pub fn is_unavailable(&self) -> bool {
        matches!(self, StoreError::Unavailable(_))
    }
}

/// The outcome of claiming a payment.
pub enum Claim {
    /// This caller owns the settlement.
    Claimed,
    /// Somebody else does, or did: here is what is stored.
    Exists(Box<Record>),
    /// Nothing was stored: the payer's settlements that still expose its balance (`exposed`)
    /// and this one add up to more than the limit.
    OverLimit { exposed: U256 },
    /// Nothing was stored: the record's request key already names another payment.
    KeyTaken,
}

/// The right to sign on one lane: `fence` grows every time the lane changes hands, and every
/// signed write names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lease {
    pub lane: LaneId,
    pub holder: String,
    pub fence: u64,
}

/// Settlement records keyed by payment, with the unfinished and finished indexes.
#[async_trait]
pub trait SettlementStore: Send + Sync {
    async fn get(&self, key: &PaymentKey) -> Result<Option<Record>, StoreError>;
    /// Creates the record only if none exists: the single point where duplicates are told apart.
    /// The new claim enters the work queue taken by `taken_by` (the claiming instance signs it)
    /// or, with `None`, free for whichever instance holds a lane of its network. It is refused
    /// when the values of its account's records that still expose (`Record::exposes`) plus its
    /// own exceed `limit`; claims of one account are serialised, also across instances. The
    /// record's request key (`Record::request`) names one payment: kept with the record, and a
    /// claim of another payment under it is refused (`KeyTaken`).
    async fn claim(
        &self,
        key: &PaymentKey,
        record: &Record,
        taken_by: Option<&Lease>,
        limit: U256,
    ) -> Result<Claim, StoreError>;
    /// Stores state changes, all of them or none; a terminal one leaves the unfinished index for
    /// the finished one. `durable` waits until the write is on disk (answers depend on it).
    async fn save(&self, records: &[&Record], durable: bool) -> Result<(), StoreError>;
    /// Forgets a claim that never produced a transaction, so the payment can be settled again.
    async fn release(&self, key: &PaymentKey) -> Result<(), StoreError>;
    /// Every record not in a terminal state.
    async fn unfinished(&self) -> Result<Vec<Record>, StoreError>;
    /// Deletes finished records that ended before `cutoff` (unix seconds); answers how many.
    async fn prune(&self, cutoff: u64) -> Result<usize, StoreError>;
}

/// Signer lanes: who may sign on each, and the next nonce it gives out.
#[async_trait]
pub trait LaneStore: Send + Sync {
    /// Takes or renews the lease of `lane` for `holder` when it is free, expired or already
    /// `holder`'s, for `ttl` from now; `None` while another holder's lease runs. Taking it from
    /// another holder (or for the first time) gives a new, larger fence.
    async fn acquire(
        &self,
        lane: &LaneId,
        holder: &str,
        ttl: Duration,
    ) -> Result<Option<Lease>, StoreError>;
    /// Gives a lease up at once (clean shutdown), so another instance need not wait for its TTL.
    async fn surrender(&self, lease: &Lease) -> Result<(), StoreError>;
    async fn lane_nonce(&self, lane: &LaneId) -> Result<Option<u64>, StoreError>;
    /// Stores the lane's next nonce under `lease`; `LeaseLost` if the lease has moved.
    async fn set_lane_nonce(&self, lease: &Lease, next: u64) -> Result<(), StoreError> {
        self.commit_signed(lease, next, &[]).await
    }
    /// Stores freshly signed attempts and the lane's next nonce in one durable transaction under
    /// `lease`: after it returns, a crash can neither lose the transactions nor reuse their
    /// nonces; `LeaseLost` (and nothing written) if the lease has moved.
    async fn commit_signed(
        &self,
        lease: &Lease,
        next_nonce: u64,
        records: &[&Record],
    ) -> Result<(), StoreError>;
    /// Takes up to `limit` claims from the work queue for `lease`'s lane: free ones of its
    /// network that its signer may send (`Record::sender` names it, or nobody), and those its lane took
    /// under an older fence (a previous holder's). `SKIP
    /// LOCKED`: instances polling together never take the same claim.
    async fn take_queued(&self, lease: &Lease, limit: usize) -> Result<Vec<Record>, StoreError>;
    /// Frees queued claims a lane took but will not sign (it lost its lease).
    async fn requeue(&self, keys: &[PaymentKey]) -> Result<(), StoreError>;
}

/// The router's last nonce handed out per (chain, sender, caller).
#[async_trait]
pub trait RouterNonceStore: Send + Sync {
    /// Hands out and durably stores the next nonce of `key` by [`next_router_nonce`]; `None`
    /// (and nothing stored) when it would be `max_ahead` or more past `pending`.
    async fn reserve_router_nonce(
        &self,
        key: &RouterNonceKey,
        pending: u64,
        now: u64,
        ttl_secs: u64,
        max_ahead: u64,
    ) -> Result<Option<u64>, StoreError>;
}

/// A payer refused until `until` (unix seconds) because a settlement of theirs reverted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PayerCooldown {
    pub payer: Address,
    pub until: u64,
}

/// Revert cooldowns (access.md §2, §3): shared by every instance of the store, kept over
/// restarts.
#[async_trait]
pub trait CooldownStore: Send + Sync {
    /// Refuses the payer until `cooldown.until`; a later end already stored stays.
    async fn cool_down(&self, cooldown: PayerCooldown) -> Result<(), StoreError>;
    /// When `payer`'s refusal ends, if it ends after `now`.
    async fn cooldown_of(&self, payer: Address, now: u64) -> Result<Option<u64>, StoreError>;
    /// Every refusal that ends after `now`.
    async fn cooldowns(&self, now: u64) -> Result<Vec<PayerCooldown>, StoreError>;
    /// Deletes refusals that ended at or before `now`; answers how many.
    async fn prune_cooldowns(&self, now: u64) -> Result<usize, StoreError>;
}

/// One backend: everything routerd stores.
#[async_trait]
pub trait Backend: SettlementStore + LaneStore + RouterNonceStore + CooldownStore {
    /// Whether other instances may share this store (their settlements appear in it).
    fn shared(&self) -> bool;
    /// Makes every write so far durable (before exit).
    async fn flush(&self) -> Result<(), StoreError>;
    /// Where the data lives, for the start-up banner (never credentials).
    fn describe(&self) -> String;
}

pub type Storage = Arc<dyn Backend>;

/// Opens the configured backend; PostgreSQL's schema is created or migrated here.
pub async fn open(settings: &StorageSettings) -> Result<Storage, StoreError> {
    match settings.backend {
        StorageBackend::Sled => Ok(Arc::new(sled_v1::open(&settings.path).await?)),
        StorageBackend::Postgres => {
            let url = settings.postgres_url.as_ref().ok_or_else(|| {
                StoreError::unavailable("PostgreSQL: storage.postgres_url is not set")
            })?;
            Ok(Arc::new(postgres::PgStore::connect(url.expose()).await?))
        }
    }
}

/// The router's rule: the chain's pending nonce, unless the last reservation (`last`, handed
/// out at `at`) is newer than the TTL and ahead of it; `None` when that is `max_ahead` or more
/// past the pending nonce. PostgreSQL's statement mirrors it.
pub fn next_router_nonce(
    previous: Option<(u64, u64)>,
    pending: u64,
    now: u64,
    ttl: u64,
    max_ahead: u64,
) -> Option<u64> {
    let next = match previous {
        Some((last, at)) if now.saturating_sub(at) < ttl => pending.max(last.saturating_add(1)),
        _ => pending,
    };
    (next < pending.saturating_add(max_ahead)).then_some(next)
}

#[cfg(test)]
mod rule_tests {
    use super::next_router_nonce;

    #[test]
    fn consecutive_until_the_chain_catches_up_or_the_reservation_expires() {
        assert_eq!(next_router_nonce(None, 5, 100, 120, 16), Some(5));
        assert_eq!(next_router_nonce(Some((5, 100)), 5, 101, 120, 16), Some(6));
        assert_eq!(next_router_nonce(Some((6, 101)), 5, 102, 120, 16), Some(7));
        // The chain moved past the reservation: follow the chain.
        assert_eq!(next_router_nonce(Some((6, 101)), 9, 102, 120, 16), Some(9));
        // Unused reservation expired: back to the chain's count.
        assert_eq!(next_router_nonce(Some((6, 101)), 5, 300, 120, 16), Some(5));
        // At most max_ahead reservations past the pending nonce.
        assert_eq!(
            next_router_nonce(Some((19, 101)), 5, 102, 120, 16),
            Some(20)
        );
        assert_eq!(next_router_nonce(Some((20, 101)), 5, 102, 120, 16), None);
    }
}
