//! What routerd stores, as traits, and the backends behind them: sled (embedded, one instance,
//! the default) and PostgreSQL (several instances sharing one database). Invariants every
//! backend keeps, checked by one conformance suite (conformance.rs):
//! - a payment is claimed at most once: `claim` creates the record only if none exists;
//! - a claim fits beside its account's settlements in flight ([`InFlight::refuses`]): their
//!   values within the payer's balance, their Permit2 values within its Permit2 allowance, an
//!   EIP-2612 approval alone among them, and no other in flight under its Permit2 nonce;
//! - signed attempts and their lane's next nonce are written together, and only under the lane's
//!   current lease (fencing token): an instance that lost its lease cannot store a signature, so
//!   it never broadcasts one;
//! - a write a caller waits on (`durable`) is on disk when the call returns;
//! - a claimed settlement is in the work queue until its first signed attempt is stored: taken
//!   by the lane that claimed it (under that lane's fence), or free for any lane of its network.
//!   A lane's next holder (a larger fence) takes over what the previous holder had taken.
//!   A claim that names its signer (`EvmPart::sender`) is taken only by that signer's lane;
//! - a payer's revert cooldown, once stored, is seen by every handle and outlives the process;
//!   a later end is never shortened by an earlier one;
//! - a channel's mirror never lowers its `totalClaimed` or `refundNonce` (they only grow on
//!   chain: a lower one is a stale read), whichever handle writes and in whatever order;
//! - the discovery catalogue holds at most its cap of listings, one per id, the least recently
//!   settled evicted first, and is read most recently settled first.

mod conformance;
pub mod postgres;
mod rows;
pub mod sled;
mod sled_v1;
mod upgrade_tests;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use ethers_core::types::{H256, U256};

use crate::config::{StorageBackend, StorageSettings};
use crate::ledger::{Account, LaneId, Pass, Payer, PaymentKey, Record, RouterNonceKey};

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
#[derive(Debug)]
pub enum Claim {
    /// This caller owns the settlement.
    Claimed,
    /// Somebody else does, or did: here is what is stored.
    Exists(Box<Record>),
    /// Nothing was stored: the payer's settlements that still expose its balance (`exposed`)
    /// and this one add up to more than the limit.
    OverLimit { exposed: U256 },
    /// Nothing was stored: the payer's Permit2 settlements in flight (`exposed`) and this one
    /// add up to more than its Permit2 allowance.
    OverAllowance { exposed: U256 },
    /// Nothing was stored: another Permit2 settlement in flight would make this one revert.
    Permit2Clash(Permit2Clash),
    /// Nothing was stored: the record's request key already names another payment.
    KeyTaken,
}

/// Why a Permit2 payment cannot be in flight beside another of its payer's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Permit2Clash {
    /// One of them approves Permit2 by an EIP-2612 permit: the permit sets the allowance (the
    /// others' would be lost) and spends the token's one permit nonce (a second permit fails).
    Approval,
    /// Another payment of the payer, of any token, spends the same Permit2 nonce: Permit2 keeps
    /// one nonce bitmap per owner.
    Nonce,
}

/// What a claim is held to beside its payment being new, as the settle's chain read saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// The account's values in flight, the claim's included, stay within it.
    pub balance: U256,
    /// The account's Permit2 values in flight, the claim's included, stay within it (the
    /// payer's allowance of Permit2), for a Permit2 claim.
    pub permit2_allowance: U256,
}

impl Limits {
    /// A balance, and no Permit2 allowance to keep to.
    pub fn balance(balance: U256) -> Self {
        Limits {
            balance,
            permit2_allowance: U256::MAX,
        }
    }
}

/// The settlements of one account still in flight (`Record::exposes`), as a claim weighs them.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct InFlight {
    pub value: U256,
    /// The Permit2 ones' values, and how many there are.
    pub permit2_value: U256,
    pub permit2: u64,
    /// How many approve Permit2 by an EIP-2612 permit.
    pub approvals: u64,
}

impl InFlight {
    /// Why `record` may not be claimed beside these (every backend's one rule), `None` when it
    /// fits; `nonce_held`: another payment in flight spends its Permit2 nonce.
    pub fn refuses(&self, record: &Record, limits: &Limits, nonce_held: bool) -> Option<Claim> {
        if self.value.saturating_add(record.value) > limits.balance {
            return Some(Claim::OverLimit {
                exposed: self.value,
            });
        }
        record.permit2_nonce()?;
        if nonce_held {
            return Some(Claim::Permit2Clash(Permit2Clash::Nonce));
        }
        if self.approvals > 0
            || (record.evm().is_some_and(|evm| evm.approves_permit2) && self.permit2 > 0)
        {
            return Some(Claim::Permit2Clash(Permit2Clash::Approval));
        }
        if self.permit2_value.saturating_add(record.value) > limits.permit2_allowance {
            return Some(Claim::OverAllowance {
                exposed: self.permit2_value,
            });
        }
        None
    }
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
    /// when it does not fit beside its account's records in flight ([`InFlight::refuses`]);
    /// claims of one account, and Permit2 claims of one owner, are serialised, also across
    /// instances. The
    /// record's request key (`Record::request`) names one payment: kept with the record, and a
    /// claim of another payment under it is refused (`KeyTaken`).
    async fn claim(
        &self,
        key: &PaymentKey,
        record: &Record,
        taken_by: Option<&Lease>,
        limits: &Limits,
    ) -> Result<Claim, StoreError>;
    /// What the account's settlements in flight still expose, added up: what a claim of the
    /// account weighs, read without claiming (verify counts it, access.md §2).
    async fn exposed(&self, account: &Account) -> Result<U256, StoreError>;
    /// Stores state changes, all of them or none; a terminal one leaves the unfinished index for
    /// the finished one. `durable` waits until the write is on disk (answers depend on it).
    async fn save(&self, records: &[&Record], durable: bool) -> Result<(), StoreError>;
    /// Forgets a claim that never produced a transaction, so the payment can be settled again.
    async fn release(&self, key: &PaymentKey) -> Result<(), StoreError>;
    /// Hands the next settle of `key` made with `pass` (its caller and body) the outcome: the
    /// claimant was answered "pending" (access.md §1). One pass per payment; a new one replaces
    /// it. It goes with its record.
    async fn grant_pass(&self, key: &PaymentKey, pass: &Pass) -> Result<(), StoreError>;
    /// Takes the pass of `key` if it is `pass`: true for exactly one taker per grant, also
    /// across instances.
    async fn take_pass(&self, key: &PaymentKey, pass: &Pass) -> Result<bool, StoreError>;
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
    /// network that its signer may send (`EvmPart::sender` names it, or nobody), and those its lane took
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
    /// Records durably that the key's sender broadcast `nonce` through routerd, by
    /// [`confirmed_router_nonce`]: the caller's next reservation comes after it.
    async fn confirm_router_nonce(
        &self,
        key: &RouterNonceKey,
        nonce: u64,
        now: u64,
        ttl_secs: u64,
    ) -> Result<(), StoreError>;
    /// Deletes the reservations last handed out before `cutoff` (unix seconds): past their TTL
    /// they no longer count (`next_router_nonce`), and strangers naming ever new senders must
    /// not grow the store for good (access.md §3b). Answers how many.
    async fn prune_router_nonces(&self, cutoff: u64) -> Result<usize, StoreError>;
}

/// A transaction the router forwarded: the chain it went to, and when (unix seconds).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sent {
    pub chain: String,
    pub at: u64,
}

/// Transactions the router forwarded, by hash: a wallet asking after one is answered from the
/// chain it went to.
#[async_trait]
pub trait SentStore: Send + Sync {
    /// Stores durably that `hash` went to `sent.chain`; sent again, the later record stays.
    async fn remember_sent(&self, hash: H256, sent: &Sent) -> Result<(), StoreError>;
    async fn sent(&self, hash: H256) -> Result<Option<Sent>, StoreError>;
    /// Forgets transactions sent before `cutoff` (unix seconds); answers how many.
    async fn forget_sent(&self, cutoff: u64) -> Result<usize, StoreError>;
    /// Forgets all but the `keep` latest sent transactions, oldest first; answers how many.
    async fn forget_sent_beyond(&self, keep: usize) -> Result<usize, StoreError>;
}

/// A payer refused until `until` (unix seconds) because a settlement of theirs reverted. Kept
/// under the payer's whole key (`Payer::storage_bytes`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PayerCooldown {
    pub payer: Payer,
    pub until: u64,
}

/// Revert cooldowns (access.md §2, §3): shared by every instance of the store, kept over
/// restarts.
#[async_trait]
pub trait CooldownStore: Send + Sync {
    /// Refuses the payer until `cooldown.until`; a later end already stored stays.
    async fn cool_down(&self, cooldown: PayerCooldown) -> Result<(), StoreError>;
    /// When `payer`'s refusal ends, if it ends after `now`.
    async fn cooldown_of(&self, payer: &Payer, now: u64) -> Result<Option<u64>, StoreError>;
    /// Every refusal that ends after `now`.
    async fn cooldowns(&self, now: u64) -> Result<Vec<PayerCooldown>, StoreError>;
    /// Deletes refusals that ended at or before `now`; answers how many.
    async fn prune_cooldowns(&self, now: u64) -> Result<usize, StoreError>;
}

/// One entry of the discovery catalogue (x402 `bazaar`): the store keeps it opaque, as the
/// facilitator encoded it, keyed by `id` and ordered by when it was last settled.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listing {
    pub id: String,
    /// Unix milliseconds of the settlement that last listed it.
    pub settled_at: u64,
    /// The facilitator's JSON.
    pub encoded: String,
}

/// The discovery catalogue: bounded, shared by every instance of the store. Not flushed: a
/// listing lost in a crash comes back with the resource's next settlement.
#[async_trait]
pub trait DiscoveryStore: Send + Sync {
    /// Stores `listing` under its id (replacing what was there), then deletes the least
    /// recently settled listings beyond `max_listings`.
    async fn list(&self, listing: &Listing, max_listings: usize) -> Result<(), StoreError>;
    /// Hands `visit` every listing settled at or after `since`, most recently settled first
    /// (ties by id), one at a time: a reader holds one listing in memory, not the catalogue.
    async fn listings(
        &self,
        since: u64,
        visit: &mut (dyn FnMut(Listing) + Send),
    ) -> Result<(), StoreError>;
    /// Deletes listings settled before `cutoff` (unix milliseconds); answers how many.
    async fn unlist_before(&self, cutoff: u64) -> Result<usize, StoreError>;
}

/// A batch-settlement channel, as the mirror keys it: its network's configured name and id.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ChannelKey {
    pub network: String,
    pub channel: H256,
}

/// The last state routerd read or caused for a channel, and when (unix seconds).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChannelSnapshot {
    pub balance: u128,
    pub total_claimed: u128,
    pub withdraw_requested_at: u64,
    pub refund_nonce: U256,
    pub at: u64,
}

impl ChannelSnapshot {
    /// `self` written over `stored` (every backend's one rule): `totalClaimed` and `refundNonce`
    /// only grow on chain, so the higher of each stays; balance and withdrawal come from the
    /// newer write (a tie: `self`).
    pub fn merged_over(self, stored: Option<ChannelSnapshot>) -> ChannelSnapshot {
        let Some(stored) = stored else {
            return self;
        };
        let newer = if self.at >= stored.at { self } else { stored };
        ChannelSnapshot {
            total_claimed: self.total_claimed.max(stored.total_claimed),
            refund_nonce: self.refund_nonce.max(stored.refund_nonce),
            ..newer
        }
    }
}

/// The channel mirror of batch-settlement: per channel, the last snapshot any instance read or
/// caused, so a node answering an older state cannot lower what routerd judges vouchers by.
#[async_trait]
pub trait ChannelStore: Send + Sync {
    /// Stores `snapshot` merged over what is stored ([`ChannelSnapshot::merged_over`]), as one
    /// step also across instances; answers what is stored after it.
    async fn put_channel(
        &self,
        key: &ChannelKey,
        snapshot: &ChannelSnapshot,
    ) -> Result<ChannelSnapshot, StoreError>;
    async fn channel(&self, key: &ChannelKey) -> Result<Option<ChannelSnapshot>, StoreError>;
    /// Holds `key`'s refund for `holder` for `ttl`, unless another holder's hold has not run
    /// out: whether `holder` holds it now. One holder across every instance sharing the store,
    /// so that no two sign the channel's one refund nonce at once.
    async fn hold_refund(
        &self,
        key: &ChannelKey,
        holder: &str,
        ttl: Duration,
    ) -> Result<bool, StoreError>;
    /// Ends `holder`'s hold of `key`'s refund (nothing when another holds it).
    async fn release_refund(&self, key: &ChannelKey, holder: &str) -> Result<(), StoreError>;
}

/// One backend: everything routerd stores.
#[async_trait]
pub trait Backend:
    SettlementStore
    + LaneStore
    + RouterNonceStore
    + SentStore
    + CooldownStore
    + DiscoveryStore
    + ChannelStore
{
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

/// What a broadcast of `nonce` leaves as the last reservation: a fresh reservation ahead of it
/// (handed out, not broadcast yet) stays as it is and expires as it would have; otherwise the
/// broadcast nonce is the last one handed out, from `now`. PostgreSQL's statement mirrors it.
pub fn confirmed_router_nonce(
    previous: Option<(u64, u64)>,
    nonce: u64,
    now: u64,
    ttl: u64,
) -> (u64, u64) {
    match previous {
        Some((last, at)) if now.saturating_sub(at) < ttl && last > nonce => (last, at),
        _ => (nonce, now),
    }
}

#[cfg(test)]
mod rule_tests {
    use super::{confirmed_router_nonce, next_router_nonce};

    #[test]
    fn a_broadcast_moves_the_reservation_to_its_nonce_unless_one_is_ahead() {
        assert_eq!(confirmed_router_nonce(None, 4, 100, 120), (4, 100));
        assert_eq!(confirmed_router_nonce(Some((2, 90)), 4, 100, 120), (4, 100));
        assert_eq!(confirmed_router_nonce(Some((4, 90)), 4, 100, 120), (4, 100));
        // Reserved ahead and unsent: left to expire as it would have.
        assert_eq!(confirmed_router_nonce(Some((6, 90)), 4, 100, 120), (6, 90));
        // Reserved ahead but expired: the broadcast is what counts.
        assert_eq!(confirmed_router_nonce(Some((6, 90)), 4, 300, 120), (4, 300));
        // Then the next reservation comes after the broadcast one.
        assert_eq!(next_router_nonce(Some((4, 100)), 4, 101, 120, 16), Some(5));
    }

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
