//! The sled backend (embedded, one instance): one tree per kind of state, a schema version, and
//! the flush that makes a write durable before anything depending on it leaves the process. sled
//! locks its directory, so one process at a time uses it; leases are kept anyway, so every
//! backend answers the conformance suite alike.

mod channels;
mod cooldowns;
mod discovery;
mod lanes;
mod router_nonces;
mod sent;
mod settlements;

use std::collections::HashMap;
use std::ffi::OsString;
use std::fs::File;
use std::os::unix::fs::DirEntryExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use std::time::{SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use sled::transaction::{ConflictableTransactionError, TransactionError};
use sled::{Db, Tree};

use super::{rows, Backend, Lease, StoreError};

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
    /// Payer's whole key (`Payer::storage_bytes`: an address's 20 bytes, a Solana key's 32) ->
    /// end of its revert cooldown (8 bytes, big-endian unix seconds).
    cooldowns: Tree,
    /// Channel id (32 bytes) ++ network name -> the channel mirror's snapshot (`channels.rs`).
    channels: Tree,
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
    /// Channel refunds held (`channels.rs`): in memory, since one process owns a sled store.
    refund_holds: Arc<std::sync::Mutex<channels::RefundHolds>>,
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
            channels: db.open_tree("channel_mirror")?,
            listings: db.open_tree("listings")?,
            listings_by_time: db.open_tree("listings_by_time")?,
            listing: Arc::default(),
            claims: Arc::default(),
            refund_holds: Arc::default(),
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
        let reopened = crate::testing::reopen(&dir);
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
        let reopened = crate::testing::reopen(&dir);
        assert_eq!(reopened.settlements.len(), 50);
        drop(reopened);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
