//! The sled backend (embedded, one instance): one tree per kind of state, a schema version, and
//! the flush that makes a write durable before anything depending on it leaves the process. sled
//! locks its directory, so one process at a time uses it; leases are kept anyway, so every
//! backend answers the conformance suite alike.

use std::collections::HashMap;
use std::ffi::OsString;
use std::fs::File;
use std::os::unix::fs::DirEntryExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use sled::transaction::{ConflictableTransactionError, TransactionError, TransactionalTree};
use sled::{Db, Transactional, Tree};

use super::{
    confirmed_router_nonce, next_router_nonce,
    rows::{self, Row},
    Backend, Claim, CooldownStore, DiscoveryStore, InFlight, LaneStore, Lease, Limits, Listing,
    PayerCooldown, RouterNonceStore, Sent, SentStore, SettlementStore, StoreError,
};
use crate::ledger::{Account, LaneId, Pass, PaymentKey, Record, RouterNonceKey};
use ethers_core::types::{Address, H256, U256};

/// Version 2: settlement records with explicit states, and the unfinished/finished indexes.
const SCHEMA_VERSION: &[u8] = b"2";
/// Version 1 stores open, and the facilitator's ledger migrates their records at start.
const SCHEMA_V1: &[u8] = b"1";

/// sled's page cache, sized explicitly: the daemon's whole memory budget is under 48 MiB.
const CACHE_BYTES: u64 = 16 * 1024 * 1024;

/// Group commit: every caller of `flush` takes a ticket; one physical flush covers every ticket
/// taken before it started, so a burst of settlements pays for one fsync, not one each.
#[derive(Default)]
struct GroupCommit {
    requested: AtomicU64,
    /// The highest ticket known durable; the lock also serialises physical flushes.
    durable: tokio::sync::Mutex<u64>,
    physical: AtomicU64,
    /// The entries (name, inode) each directory had when it was last `fsync`ed.
    synced_dirs: std::sync::Mutex<HashMap<PathBuf, Vec<(OsString, u64)>>>,
}

#[derive(Clone)]
pub struct Store {
    db: Db,
    path: PathBuf,
    commit: Arc<GroupCommit>,
    /// Settlement records by payment key (facilitator ledger).
    pub settlements: Tree,
    /// Payment keys of settlements not in a terminal state: what start-up resumes.
    pub unfinished: Tree,
    /// Finish time (8 bytes, big-endian unix seconds) ++ payment key: what pruning deletes.
    pub finished: Tree,
    /// Next nonce per (network, signer).
    pub signer_nonces: Tree,
    /// Nonce reservations per (chain, sender) handed out by the router.
    pub router_nonces: Tree,
    /// Transaction hash (32 bytes) -> the chain the router sent it to and when (`SentRow`).
    router_sent: Tree,
    /// Lease per (network, signer): holder, fence, expiry.
    lane_leases: Tree,
    /// Payment key -> value (32 bytes, big-endian) of each settlement that still exposes its
    /// payer's balance; keys of one account share its prefix (`Account` then `|`).
    exposure: Tree,
    /// Request key -> payment key of the record it was claimed with.
    request_keys: Tree,
    /// Payment key -> the pass a pending answer granted (`Pass` as JSON).
    passes: Tree,
    /// Payment key -> value (32 bytes) and whether it approves Permit2 (1 byte) of each Permit2
    /// settlement in flight; keyed as `exposure` is.
    permit2_exposure: Tree,
    /// `Permit2Nonce` -> payment key of the Permit2 settlement in flight that spends it.
    permit2_nonces: Tree,
    /// Payer address (20 bytes) -> end of its revert cooldown (8 bytes, big-endian unix seconds).
    cooldowns: Tree,
    /// Listing id -> `ListingRow` (discovery catalogue).
    listings: Tree,
    /// Settle time (8 bytes, big-endian unix seconds) ++ listing id: the catalogue in the order
    /// it is read, evicted and expired.
    listings_by_time: Tree,
    /// Serialises catalogue writes: a listing and its time index change together, and the cap
    /// is counted after each.
    listing: Arc<std::sync::Mutex<()>>,
    /// Serialises claims: an account's exposure is summed and the claim added as one step.
    claims: Arc<std::sync::Mutex<()>>,
}

impl Store {
    pub fn open(path: &Path) -> Result<Self, StoreError> {
        let db = sled::Config::new()
            .path(path)
            .mode(sled::Mode::HighThroughput)
            .cache_capacity(CACHE_BYTES)
            .open()?;
        let meta = db.open_tree("meta")?;
        match meta.get("schema")? {
            None => {
                meta.insert("schema", SCHEMA_VERSION)?;
            }
            Some(v) if v.as_ref() == SCHEMA_VERSION || v.as_ref() == SCHEMA_V1 => {}
            Some(v) => {
                return Err(StoreError::Schema(format!(
                    "store at {} has schema version {}; this routerd reads version 2",
                    path.display(),
                    String::from_utf8_lossy(&v)
                )))
            }
        }
        let lane_leases = db.open_tree("lane_leases")?;
        void_leases(&lane_leases)?;
        Ok(Self {
            settlements: db.open_tree("settlements")?,
            unfinished: db.open_tree("unfinished")?,
            finished: db.open_tree("finished")?,
            signer_nonces: db.open_tree("signer_nonces")?,
            router_nonces: db.open_tree("router_nonces")?,
            router_sent: db.open_tree("router_sent")?,
            exposure: db.open_tree("exposure")?,
            request_keys: db.open_tree("request_keys")?,
            passes: db.open_tree("passes")?,
            permit2_exposure: db.open_tree("permit2_exposure")?,
            permit2_nonces: db.open_tree("permit2_nonces")?,
            cooldowns: db.open_tree("cooldowns")?,
            listings: db.open_tree("listings")?,
            listings_by_time: db.open_tree("listings_by_time")?,
            listing: Arc::default(),
            claims: Arc::default(),
            lane_leases,
            db,
            path: path.to_path_buf(),
            commit: Arc::default(),
        })
    }

    /// Makes every write so far durable, on disk and through the device cache.
    ///
    /// sled 0.34 flushes with `sync_file_range` on Linux, which neither writes file metadata nor
    /// flushes the device cache: a power loss could lose a "flushed" write. So after sled's flush
    /// its files and directory get a real `fsync`. The blocking work runs on tokio's blocking
    /// pool (sled's `flush_async` stalled with about fifty concurrent flushers).
    pub async fn flush(&self) -> Result<(), StoreError> {
        let ticket = self.commit.requested.fetch_add(1, Ordering::SeqCst) + 1;
        let mut durable = self.commit.durable.lock().await;
        if *durable >= ticket {
            return Ok(()); // a flush that started after our write covered it
        }
        let covered = self.commit.requested.load(Ordering::SeqCst);
        let db = self.db.clone();
        let path = self.path.clone();
        let commit = self.commit.clone();
        tokio::task::spawn_blocking(move || sync_to_disk(&db, &path, &commit))
            .await
            .map_err(|e| StoreError::unavailable(format!("cannot make writes durable: {e}")))??;
        release_deferred();
        self.commit.physical.fetch_add(1, Ordering::Relaxed);
        *durable = covered;
        Ok(())
    }

    /// Whether the settlement records are still in version 1's shape.
    pub fn is_v1(&self) -> Result<bool, StoreError> {
        let meta = self.db.open_tree("meta")?;
        Ok(meta.get("schema")?.is_some_and(|v| v.as_ref() == SCHEMA_V1))
    }

    /// Marks the store as version 2 once the ledger has migrated every record.
    pub async fn finish_migration(&self) -> Result<(), StoreError> {
        self.db
            .open_tree("meta")?
            .insert("schema", SCHEMA_VERSION)?;
        self.flush().await
    }

    /// Opens the store and migrates version 1 settlement records, if any.
    /// Physical flushes so far (each one covers every write before it).
    pub fn physical_flushes(&self) -> u64 {
        self.commit.physical.load(Ordering::Relaxed)
    }

    /// Typed JSON access to one key of a tree.
    pub fn get_json<T: serde::de::DeserializeOwned>(
        tree: &Tree,
        key: &str,
    ) -> Result<Option<T>, StoreError> {
        match tree.get(key)? {
            None => Ok(None),
            Some(bytes) => {
                serde_json::from_slice(&bytes)
                    .map(Some)
                    .map_err(|e| StoreError::Corrupt {
                        key: key.to_string(),
                        detail: e.to_string(),
                    })
            }
        }
    }
}

/// sled's own errors (its I/O, a corrupt page) are the backend's detail.
impl From<sled::Error> for StoreError {
    fn from(e: sled::Error) -> Self {
        StoreError::Backend(Box::new(e))
    }
}

/// A lane's lease as stored: who holds it, its fence, and until when (unix milliseconds).
#[derive(Serialize, Deserialize)]
struct StoredLease {
    holder: String,
    fence: u64,
    expires_ms: u64,
}

/// sled locks its directory: whoever held a lease before this process opened it is gone, so its
/// leases end now (their fences stay, and the next holder's is larger).
fn void_leases(leases: &Tree) -> Result<(), StoreError> {
    for entry in leases.iter() {
        let (id, bytes) = entry?;
        if let Ok(mut lease) = serde_json::from_slice::<StoredLease>(&bytes) {
            lease.expires_ms = 0;
            leases.insert(id, rows::encode(&lease))?;
        }
    }
    Ok(())
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// Aborts a sled transaction when the lease in `leases` is not `lease`.
fn check_lease(
    leases: &sled::transaction::TransactionalTree,
    lease: &Lease,
) -> Result<(), ConflictableTransactionError<StoreError>> {
    let id = lease.lane.storage_key();
    let current = leases
        .get(id.as_bytes())?
        .and_then(|bytes| serde_json::from_slice::<StoredLease>(&bytes).ok());
    match current {
        Some(c) if c.holder == lease.holder && c.fence == lease.fence => Ok(()),
        _ => Err(ConflictableTransactionError::Abort(StoreError::LeaseLost(
            id,
        ))),
    }
}

fn transaction_error(e: TransactionError<StoreError>) -> StoreError {
    match e {
        TransactionError::Storage(e) => e.into(),
        TransactionError::Abort(e) => e,
    }
}

impl Store {
    /// The trees a claim writes and a release clears, in one transaction.
    fn record_trees(&self) -> (&Tree, &Tree, &Tree, &Tree, &Tree, &Tree) {
        (
            &self.settlements,
            &self.unfinished,
            &self.exposure,
            &self.request_keys,
            &self.permit2_exposure,
            &self.permit2_nonces,
        )
    }

    /// The record stored under `id`, if any.
    fn stored(&self, id: &str) -> Result<Option<Record>, StoreError> {
        let Some(bytes) = self.settlements.get(id.as_bytes())? else {
            return Ok(None);
        };
        rows::decode(id, &bytes).map(Some)
    }

    /// The account's settlements in flight, added up.
    fn in_flight(&self, account: &Account) -> Result<InFlight, StoreError> {
        let prefix = format!("{}|", account.storage_key());
        let mut in_flight = InFlight {
            value: exposed(&self.exposure, account)?,
            ..InFlight::default()
        };
        for entry in self.permit2_exposure.scan_prefix(prefix.as_bytes()) {
            let (_, held) = entry?;
            let value = U256::from_big_endian(&held[..32.min(held.len())]);
            in_flight.permit2_value = in_flight.permit2_value.saturating_add(value);
            in_flight.permit2 += 1;
            in_flight.approvals += u64::from(held.get(32) == Some(&1));
        }
        Ok(in_flight)
    }

    /// Whether a payment other than `id` in flight spends the Permit2 nonce of `row`.
    fn nonce_held(&self, row: &Row, id: &str) -> Result<bool, StoreError> {
        let Some(permit2) = &row.permit2 else {
            return Ok(false);
        };
        let holder = self.permit2_nonces.get(permit2.nonce.as_bytes())?;
        Ok(holder.is_some_and(|holder| holder != id.as_bytes()))
    }
}

/// Keeps a Permit2 row's hold on its account's allowance and its nonce while it is in flight,
/// and lets both go once it is not (or, with `released`, is gone).
fn hold_permit2(
    row: &Row,
    released: bool,
    holds: &TransactionalTree,
    nonces: &TransactionalTree,
) -> Result<(), ConflictableTransactionError<StoreError>> {
    let Some(permit2) = &row.permit2 else {
        return Ok(());
    };
    let (id, nonce) = (row.id.as_bytes(), permit2.nonce.as_bytes());
    match row.exposure.filter(|_| !released) {
        Some(value) => {
            let mut held = word(value).to_vec();
            held.push(u8::from(permit2.approves));
            holds.insert(id, held)?;
            nonces.insert(nonce, id)?;
        }
        None => {
            holds.remove(id)?;
            if nonces.get(nonce)?.is_some_and(|holder| holder == id) {
                nonces.remove(nonce)?;
            }
        }
    }
    Ok(())
}

fn word(value: U256) -> [u8; 32] {
    let mut bytes = [0u8; 32];
    value.to_big_endian(&mut bytes);
    bytes
}

/// The values the account's settlements still expose, added up.
fn exposed(exposure: &Tree, account: &Account) -> Result<U256, StoreError> {
    let prefix = format!("{}|", account.storage_key());
    let mut total = U256::zero();
    for entry in exposure.scan_prefix(prefix.as_bytes()) {
        let (_, value) = entry?;
        total = total.saturating_add(U256::from_big_endian(&value));
    }
    Ok(total)
}

fn finished_key(at: u64, id: &str) -> Vec<u8> {
    let mut key = at.to_be_bytes().to_vec();
    key.extend_from_slice(id.as_bytes());
    key
}

#[async_trait]
impl SettlementStore for Store {
    async fn get(&self, key: &PaymentKey) -> Result<Option<Record>, StoreError> {
        Store::get_json(&self.settlements, &key.storage_key())
    }

    async fn exposed(&self, account: &Account) -> Result<U256, StoreError> {
        exposed(&self.exposure, account)
    }

    /// One instance: the claimer always signs, so nothing is queued.
    async fn claim(
        &self,
        key: &PaymentKey,
        record: &Record,
        _taken_by: Option<&Lease>,
        limits: &Limits,
    ) -> Result<Claim, StoreError> {
        let id = key.storage_key();
        let _claiming = self.claims.lock().expect("claims lock");
        if let Some(current) = self.settlements.get(id.as_bytes())? {
            return Ok(Claim::Exists(Box::new(rows::decode(&id, &current)?)));
        }
        let request_key = record.request.as_ref().map(|tag| tag.key.as_bytes());
        if let Some(key) = request_key {
            if self
                .request_keys
                .get(key)?
                .is_some_and(|owner| owner != id.as_bytes())
            {
                return Ok(Claim::KeyTaken);
            }
        }
        // The row as `save` writes it, and as PostgreSQL's claim does: one codec, one rule.
        let row = Row::of(record);
        let in_flight = self.in_flight(&record.account())?;
        if let Some(refused) = in_flight.refuses(record, limits, self.nonce_held(&row, &id)?) {
            return Ok(refused);
        }
        let exposes = row.exposure.map(word);
        self.record_trees()
            .transaction(
                |(settlements, unfinished, exposure, request_keys, holds, nonces)| {
                    settlements.insert(id.as_bytes(), row.encoded.as_bytes())?;
                    unfinished.insert(id.as_bytes(), &[])?;
                    if let Some(value) = &exposes {
                        exposure.insert(row.exposure_key().as_bytes(), value)?;
                    }
                    if let Some(key) = request_key {
                        request_keys.insert(key, id.as_bytes())?;
                    }
                    hold_permit2(&row, false, holds, nonces)
                },
            )
            .map_err(transaction_error)?;
        Ok(Claim::Claimed)
    }

    async fn save(&self, records: &[&Record], durable: bool) -> Result<(), StoreError> {
        let rows: Vec<Row> = records.iter().map(|r| Row::of(r)).collect();
        (
            &self.settlements,
            &self.unfinished,
            &self.finished,
            &self.exposure,
            &self.permit2_exposure,
            &self.permit2_nonces,
        )
            .transaction(|(settlements, unfinished, done, exposure, holds, nonces)| {
                for row in &rows {
                    hold_permit2(row, false, holds, nonces)?;
                    settlements.insert(row.id.as_bytes(), row.encoded.as_bytes())?;
                    let exposure_key = row.exposure_key();
                    match row.exposure {
                        Some(value) => exposure.insert(exposure_key.as_bytes(), &word(value))?,
                        None => exposure.remove(exposure_key.as_bytes())?,
                    };
                    match row.finished_at {
                        Some(at) => {
                            unfinished.remove(row.id.as_bytes())?;
                            done.insert(finished_key(at, &row.id), &[])?;
                        }
                        None => {
                            unfinished.insert(row.id.as_bytes(), &[])?;
                        }
                    }
                }
                Ok::<_, ConflictableTransactionError<StoreError>>(())
            })
            .map_err(transaction_error)?;
        if durable {
            self.flush().await?;
        }
        Ok(())
    }

    async fn release(&self, key: &PaymentKey) -> Result<(), StoreError> {
        let id = key.storage_key();
        let Some(record) = self.stored(&id)? else {
            return Ok(());
        };
        let row = Row::of(&record);
        let request_key = record.request.map(|tag| tag.key);
        self.record_trees()
            .transaction(
                |(settlements, unfinished, exposure, request_keys, holds, nonces)| {
                    settlements.remove(id.as_bytes())?;
                    unfinished.remove(id.as_bytes())?;
                    exposure.remove(row.exposure_key().as_bytes())?;
                    if let Some(request_key) = &request_key {
                        request_keys.remove(request_key.as_bytes())?;
                    }
                    hold_permit2(&row, true, holds, nonces)
                },
            )
            .map_err(transaction_error)?;
        self.passes.remove(id.as_bytes())?;
        self.flush().await
    }

    async fn grant_pass(&self, key: &PaymentKey, pass: &Pass) -> Result<(), StoreError> {
        self.passes
            .insert(key.storage_key().as_bytes(), encode_pass(pass))?;
        self.flush().await
    }

    async fn take_pass(&self, key: &PaymentKey, pass: &Pass) -> Result<bool, StoreError> {
        let id = key.storage_key();
        let taken =
            self.passes
                .compare_and_swap(id.as_bytes(), Some(encode_pass(pass)), None::<&[u8]>)?;
        Ok(taken.is_ok())
    }

    async fn unfinished(&self) -> Result<Vec<Record>, StoreError> {
        let mut out = Vec::new();
        for entry in self.unfinished.iter() {
            let (id, _) = entry?;
            let id = String::from_utf8_lossy(&id).to_string();
            match self.settlements.get(id.as_bytes())? {
                Some(bytes) => out.push(rows::decode(&id, &bytes)?),
                None => {
                    self.unfinished.remove(id.as_bytes())?;
                }
            }
        }
        Ok(out)
    }

    async fn prune(&self, cutoff: u64) -> Result<usize, StoreError> {
        let mut pruned = 0;
        for entry in self.finished.range(..cutoff.to_be_bytes().to_vec()) {
            let (index_key, _) = entry?;
            let id = &index_key[8..];
            let stored = self.stored(&String::from_utf8_lossy(id))?;
            if let Some(request_key) = stored.and_then(|record| record.request) {
                self.request_keys.remove(request_key.key.as_bytes())?;
            }
            self.settlements.remove(id)?;
            self.passes.remove(id)?;
            self.finished.remove(&index_key)?;
            pruned += 1;
        }
        Ok(pruned)
    }
}

/// A pass as stored: compared byte for byte when taken.
fn encode_pass(pass: &Pass) -> Vec<u8> {
    serde_json::to_vec(pass).expect("a pass serializes")
}

#[async_trait]
impl LaneStore for Store {
    async fn acquire(
        &self,
        lane: &LaneId,
        holder: &str,
        ttl: Duration,
    ) -> Result<Option<Lease>, StoreError> {
        let id = lane.storage_key();
        let now = now_ms();
        let fence = self
            .lane_leases
            .transaction(|leases| {
                let current = leases
                    .get(id.as_bytes())?
                    .and_then(|bytes| serde_json::from_slice::<StoredLease>(&bytes).ok());
                let fence = match &current {
                    Some(c) if c.holder == holder => c.fence,
                    Some(c) if c.expires_ms > now => return Ok(None),
                    Some(c) => c.fence + 1,
                    None => 1,
                };
                let stored = StoredLease {
                    holder: holder.to_string(),
                    fence,
                    expires_ms: now.saturating_add(ttl.as_millis() as u64),
                };
                leases.insert(id.as_bytes(), rows::encode(&stored))?;
                Ok::<_, ConflictableTransactionError<StoreError>>(Some(fence))
            })
            .map_err(transaction_error)?;
        self.flush().await?;
        Ok(fence.map(|fence| Lease {
            lane: lane.clone(),
            holder: holder.to_string(),
            fence,
        }))
    }

    async fn surrender(&self, lease: &Lease) -> Result<(), StoreError> {
        let id = lease.lane.storage_key();
        let released = self.lane_leases.transaction(|leases| {
            check_lease(leases, lease)?;
            let stored = StoredLease {
                holder: lease.holder.clone(),
                fence: lease.fence,
                expires_ms: 0,
            };
            leases.insert(id.as_bytes(), rows::encode(&stored))?;
            Ok(())
        });
        match released.map_err(transaction_error) {
            Ok(()) | Err(StoreError::LeaseLost(_)) => self.flush().await,
            Err(e) => Err(e),
        }
    }

    async fn lane_nonce(&self, lane: &LaneId) -> Result<Option<u64>, StoreError> {
        Ok(self
            .signer_nonces
            .get(lane.storage_key())?
            .and_then(|v| Some(u64::from_be_bytes(v.as_ref().try_into().ok()?))))
    }

    async fn commit_signed(
        &self,
        lease: &Lease,
        next_nonce: u64,
        records: &[&Record],
    ) -> Result<(), StoreError> {
        let lane_id = lease.lane.storage_key();
        let encoded: Vec<(String, Vec<u8>)> = records
            .iter()
            .map(|r| (r.key().storage_key(), rows::encode(r)))
            .collect();
        (&self.settlements, &self.signer_nonces, &self.lane_leases)
            .transaction(|(settlements, nonces, leases)| {
                check_lease(leases, lease)?;
                for (id, bytes) in &encoded {
                    settlements.insert(id.as_bytes(), bytes.as_slice())?;
                }
                nonces.insert(lane_id.as_bytes(), &next_nonce.to_be_bytes())?;
                Ok(())
            })
            .map_err(transaction_error)?;
        self.flush().await
    }

    async fn take_queued(&self, _lease: &Lease, _limit: usize) -> Result<Vec<Record>, StoreError> {
        Ok(Vec::new())
    }

    async fn requeue(&self, _keys: &[PaymentKey]) -> Result<(), StoreError> {
        Ok(())
    }
}

/// A router reservation as stored.
#[derive(Serialize, Deserialize)]
struct RouterReservation {
    /// The last nonce handed out.
    last: u64,
    /// When it was handed out (unix seconds).
    at: u64,
}

impl RouterReservation {
    /// The stored reservation's (last, at); `None` for bytes that do not read as one.
    fn read(bytes: &[u8]) -> Option<(u64, u64)> {
        serde_json::from_slice::<RouterReservation>(bytes)
            .ok()
            .map(|r| (r.last, r.at))
    }
}

#[async_trait]
impl RouterNonceStore for Store {
    async fn reserve_router_nonce(
        &self,
        key: &RouterNonceKey,
        pending: u64,
        now: u64,
        ttl_secs: u64,
        max_ahead: u64,
    ) -> Result<Option<u64>, StoreError> {
        let mut handed_out = None;
        // Atomic read-modify-write: concurrent calls for one sender each get their own nonce.
        self.router_nonces
            .fetch_and_update(key.storage_key(), |old| {
                let previous = old.and_then(RouterReservation::read);
                handed_out = next_router_nonce(previous, pending, now, ttl_secs, max_ahead);
                match handed_out {
                    Some(last) => Some(rows::encode(&RouterReservation { last, at: now })),
                    None => old.map(<[u8]>::to_vec),
                }
            })?;
        self.flush().await?;
        Ok(handed_out)
    }

    async fn confirm_router_nonce(
        &self,
        key: &RouterNonceKey,
        nonce: u64,
        now: u64,
        ttl_secs: u64,
    ) -> Result<(), StoreError> {
        self.router_nonces
            .fetch_and_update(key.storage_key(), |old| {
                let previous = old.and_then(RouterReservation::read);
                let (last, at) = confirmed_router_nonce(previous, nonce, now, ttl_secs);
                Some(rows::encode(&RouterReservation { last, at }))
            })?;
        self.flush().await
    }

    async fn prune_router_nonces(&self, cutoff: u64) -> Result<usize, StoreError> {
        let mut pruned = 0;
        for entry in self.router_nonces.iter() {
            let (key, bytes) = entry?;
            let expired = RouterReservation::read(&bytes).is_none_or(|(_, at)| at < cutoff);
            // Only the value read: a reservation renewed meanwhile stays.
            if expired
                && self
                    .router_nonces
                    .compare_and_swap(&key, Some(bytes), None::<&[u8]>)?
                    .is_ok()
            {
                pruned += 1;
            }
        }
        Ok(pruned)
    }
}

/// A forwarded transaction as stored.
#[derive(Serialize, Deserialize)]
struct SentRow {
    chain: String,
    at: u64,
}

#[async_trait]
impl SentStore for Store {
    async fn remember_sent(&self, hash: H256, sent: &Sent) -> Result<(), StoreError> {
        let row = SentRow {
            chain: sent.chain.clone(),
            at: sent.at,
        };
        self.router_sent
            .insert(hash.as_bytes(), rows::encode(&row))?;
        self.flush().await
    }

    async fn sent(&self, hash: H256) -> Result<Option<Sent>, StoreError> {
        let Some(bytes) = self.router_sent.get(hash.as_bytes())? else {
            return Ok(None);
        };
        let row: SentRow = serde_json::from_slice(&bytes).map_err(|e| StoreError::Corrupt {
            key: format!("router_sent/{hash:#x}"),
            detail: e.to_string(),
        })?;
        Ok(Some(Sent {
            chain: row.chain,
            at: row.at,
        }))
    }

    /// A scan of every row: pruning runs rarely, and the tree has no time index to keep.
    async fn forget_sent(&self, cutoff: u64) -> Result<usize, StoreError> {
        let mut forgotten = 0;
        for entry in self.router_sent.iter() {
            let (hash, bytes) = entry?;
            let at = serde_json::from_slice::<SentRow>(&bytes).map_or(0, |row| row.at);
            if at < cutoff {
                self.router_sent.remove(hash)?;
                forgotten += 1;
            }
        }
        Ok(forgotten)
    }

    /// A scan of every row, as for [`Self::forget_sent`]: the relay calls it once per hundredth
    /// of the bound remembered, not per send.
    async fn forget_sent_beyond(&self, keep: usize) -> Result<usize, StoreError> {
        let mut rows = Vec::new();
        for entry in self.router_sent.iter() {
            let (hash, bytes) = entry?;
            let at = serde_json::from_slice::<SentRow>(&bytes).map_or(0, |row| row.at);
            rows.push((at, hash));
        }
        if rows.len() <= keep {
            return Ok(0);
        }
        rows.sort_unstable();
        let oldest = rows.len() - keep;
        for (_, hash) in &rows[..oldest] {
            self.router_sent.remove(hash)?;
        }
        Ok(oldest)
    }
}

/// A stored cooldown end (8 bytes, big-endian); anything else reads as ended.
fn cooldown_end(bytes: &[u8]) -> u64 {
    bytes.try_into().map(u64::from_be_bytes).unwrap_or(0)
}

#[async_trait]
impl CooldownStore for Store {
    /// Flushed: a cooldown must outlive a crash right after the revert that caused it.
    async fn cool_down(&self, cooldown: PayerCooldown) -> Result<(), StoreError> {
        self.cooldowns
            .fetch_and_update(cooldown.payer.as_bytes(), |old| {
                let until = old.map_or(0, cooldown_end).max(cooldown.until);
                Some(until.to_be_bytes().to_vec())
            })?;
        self.flush().await
    }

    async fn cooldown_of(&self, payer: Address, now: u64) -> Result<Option<u64>, StoreError> {
        let until = self.cooldowns.get(payer.as_bytes())?;
        Ok(until.map(|b| cooldown_end(&b)).filter(|until| *until > now))
    }

    async fn cooldowns(&self, now: u64) -> Result<Vec<PayerCooldown>, StoreError> {
        let mut out = Vec::new();
        for entry in self.cooldowns.iter() {
            let (payer, until) = entry?;
            let until = cooldown_end(&until);
            if until > now && payer.len() == Address::len_bytes() {
                out.push(PayerCooldown {
                    payer: Address::from_slice(&payer),
                    until,
                });
            }
        }
        Ok(out)
    }

    async fn prune_cooldowns(&self, now: u64) -> Result<usize, StoreError> {
        let mut pruned = 0;
        for entry in self.cooldowns.iter() {
            let (payer, until) = entry?;
            // Removed only if unchanged: a cooldown imposed meanwhile stays.
            if cooldown_end(&until) <= now
                && self
                    .cooldowns
                    .compare_and_swap(&payer, Some(until), None as Option<&[u8]>)?
                    .is_ok()
            {
                pruned += 1;
            }
        }
        Ok(pruned)
    }
}

/// A listing as the `listings` tree holds it.
#[derive(Serialize, Deserialize)]
struct ListingRow {
    settled_at: u64,
    encoded: String,
}

fn listing_time_key(settled_at: u64, id: &str) -> Vec<u8> {
    let mut key = settled_at.to_be_bytes().to_vec();
    key.extend_from_slice(id.as_bytes());
    key
}

fn decode_listing(id: &[u8], bytes: &[u8]) -> Result<Listing, StoreError> {
    let id = String::from_utf8_lossy(id).to_string();
    let row: ListingRow = serde_json::from_slice(bytes).map_err(|e| StoreError::Corrupt {
        key: format!("listings/{id}"),
        detail: e.to_string(),
    })?;
    Ok(Listing {
        id,
        settled_at: row.settled_at,
        encoded: row.encoded,
    })
}

impl Store {
    /// Deletes one listing and its time index entry; the caller holds the `listing` lock.
    fn unlist(&self, id: &[u8]) -> Result<(), StoreError> {
        if let Some(old) = self.listings.remove(id)? {
            let old = decode_listing(id, &old)?;
            let time_key = listing_time_key(old.settled_at, &old.id);
            self.listings_by_time.remove(time_key)?;
        }
        Ok(())
    }
}

#[async_trait]
impl DiscoveryStore for Store {
    async fn list(&self, listing: &Listing, max_listings: usize) -> Result<(), StoreError> {
        let _one_writer = self.listing.lock().unwrap_or_else(|e| e.into_inner());
        self.unlist(listing.id.as_bytes())?;
        let row = ListingRow {
            settled_at: listing.settled_at,
            encoded: listing.encoded.clone(),
        };
        self.listings
            .insert(listing.id.as_bytes(), rows::encode(&row))?;
        self.listings_by_time
            .insert(listing_time_key(listing.settled_at, &listing.id), &[])?;
        // The last in read order goes first: the oldest second, and in it the last id.
        while self.listings_by_time.len() > max_listings {
            let Some((oldest, _)) = self.listings_by_time.first()? else {
                break;
            };
            let last = self.listings_by_time.scan_prefix(&oldest[..8]).next_back();
            let Some((last, _)) = last.transpose()? else {
                break;
            };
            self.unlist(&last[8..])?;
        }
        Ok(())
    }

    async fn listings(
        &self,
        since: u64,
        visit: &mut (dyn FnMut(Listing) + Send),
    ) -> Result<(), StoreError> {
        // Newest first: the time index backwards. Ties (one second) are ordered by id.
        let mut second: Vec<Listing> = Vec::new();
        for entry in self.listings_by_time.range(since.to_be_bytes()..).rev() {
            let (key, _) = entry?;
            let Some(bytes) = self.listings.get(&key[8..])? else {
                continue;
            };
            let listing = decode_listing(&key[8..], &bytes)?;
            if second
                .first()
                .is_some_and(|l| l.settled_at != listing.settled_at)
            {
                second.drain(..).rev().for_each(&mut *visit);
            }
            second.push(listing);
        }
        second.drain(..).rev().for_each(visit);
        Ok(())
    }

    async fn unlist_before(&self, cutoff: u64) -> Result<usize, StoreError> {
        let _one_writer = self.listing.lock().unwrap_or_else(|e| e.into_inner());
        let mut unlisted = 0;
        for entry in self.listings_by_time.range(..cutoff.to_be_bytes()) {
            let (key, _) = entry?;
            self.unlist(&key[8..])?;
            unlisted += 1;
        }
        Ok(unlisted)
    }
}

#[async_trait]
impl Backend for Store {
    fn shared(&self) -> bool {
        false
    }

    async fn flush(&self) -> Result<(), StoreError> {
        Store::flush(self).await
    }

    fn describe(&self) -> String {
        self.path.display().to_string()
    }
}

/// sled's flush, then `fsync` of everything sled keeps in the store directory: `db` (the log),
/// `conf`, `snap.*`, and `blobs/<lsn>` (pages too large for a log segment, which sled writes with
/// no sync at all), then of `blobs/` and the store directory themselves when their entries
/// changed, so that files sled created or renamed are found after a power loss. Every file is
/// synced on every flush: syncing a clean file costs next to nothing. A directory whose entries
/// (names and inodes) are those it had at its last `fsync` is not synced again: that costs
/// milliseconds on some filesystems, and its on-disk entries are already the current ones.
fn sync_to_disk(db: &Db, path: &Path, commit: &GroupCommit) -> Result<(), StoreError> {
    db.flush()?;
    release_deferred();
    let blobs = path.join("blobs");
    for dir in [blobs.as_path(), path] {
        let entries = sync_files_in(dir)?;
        let mut synced = commit.synced_dirs.lock().expect("no panics while held");
        if synced.get(dir) != Some(&entries) {
            sync_path(dir)?;
            synced.insert(dir.to_path_buf(), entries);
        }
    }
    Ok(())
}

/// Hands this thread's deferred frees to crossbeam-epoch's global queue, and runs those no
/// thread can still see. sled frees a sealed log buffer (512 KiB) and a replaced tree node only
/// through `crossbeam_epoch`'s `defer`, which keeps up to 64 of them in the calling thread's own
/// bag until it fills: on a busy daemon, megabytes of buffers already written and nodes already
/// replaced (10 MiB at the settle bench's peak). Called on the two threads that write to sled
/// most (the one that asked for the flush, and the one that ran it), once per physical flush,
/// it costs one pin per group commit.
fn release_deferred() {
    crossbeam_epoch::pin().flush();
}

fn io_error(path: &Path, e: std::io::Error) -> StoreError {
    StoreError::unavailable(format!(
        "cannot make writes durable: {}: {e}",
        path.display()
    ))
}

/// `fsync` of each regular file in `dir`; answers the directory's entries, sorted. A file sled
/// removed or renamed since the listing (an old snapshot, a collected blob,
/// `snap.*.generating`) needs none: sled syncs a snapshot before renaming it, and the
/// directory's own `fsync` records the new name.
fn sync_files_in(dir: &Path) -> Result<Vec<(OsString, u64)>, StoreError> {
    let mut entries = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(|e| io_error(dir, e))? {
        let entry = entry.map_err(|e| io_error(dir, e))?;
        entries.push((entry.file_name(), entry.ino()));
        let file = entry.path();
        let result = entry.file_type().and_then(|t| {
            if t.is_file() {
                File::open(&file)?.sync_all()
            } else {
                Ok(())
            }
        });
        match result {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(io_error(&file, e)),
            _ => {}
        }
    }
    entries.sort();
    Ok(entries)
}

/// `fsync` of one file or directory that must exist.
fn sync_path(path: &Path) -> Result<(), StoreError> {
    File::open(path)
        .and_then(|f| f.sync_all())
        .map_err(|e| io_error(path, e))
}

#[cfg(test)]
mod durability_tests {
    use super::*;

    fn temp_store(name: &str) -> PathBuf {
        crate::testing::temp_dir(&format!("store-{name}"))
    }

    /// What sled 0.34 keeps in the store directory (the files `sync_to_disk` syncs), and a flushed
    /// write, large enough to go to a blob file, read back after reopening.
    #[tokio::test]
    async fn flushed_writes_survive_reopening() {
        let dir = temp_store("reopen");
        let store = Store::open(&dir).unwrap();
        let big = vec![7u8; 300 * 1024];
        store.settlements.insert("small", &[1u8][..]).unwrap();
        store.settlements.insert("big", big.clone()).unwrap();
        store.flush().await.unwrap();
        assert_eq!(store.physical_flushes(), 1);
        for file in ["db", "conf"] {
            assert!(dir.join(file).is_file(), "{file}");
        }
        let blobs: Vec<_> = std::fs::read_dir(dir.join("blobs")).unwrap().collect();
        assert!(!blobs.is_empty(), "the large value went to blobs/");
        drop(store);
        let reopened = Store::open(&dir).unwrap();
        assert_eq!(
            reopened.settlements.get("small").unwrap().unwrap(),
            &[1u8][..]
        );
        assert_eq!(reopened.settlements.get("big").unwrap().unwrap(), &big[..]);
        drop(reopened);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn concurrent_flushes_share_physical_flushes_and_survive_reopening() {
        let dir = temp_store("group");
        let store = Store::open(&dir).unwrap();
        let mut tasks = Vec::new();
        for i in 0..50u32 {
            let store = store.clone();
            tasks.push(tokio::spawn(async move {
                store.settlements.insert(i.to_be_bytes(), &[1]).unwrap();
                store.flush().await.unwrap();
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
        assert!(
            store.physical_flushes() < 50,
            "{}",
            store.physical_flushes()
        );
        drop(store);
        let reopened = Store::open(&dir).unwrap();
        assert_eq!(reopened.settlements.len(), 50);
        drop(reopened);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
