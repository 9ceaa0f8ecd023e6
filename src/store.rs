//! The sled database: one tree per kind of state, a schema version, and the flush that makes a
//! write durable before anything depending on it leaves the process.

use std::path::Path;

use sled::{Db, Tree};

/// Version 2: settlement records with explicit states, and the unfinished/finished indexes.
const SCHEMA_VERSION: &[u8] = b"2";

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("store: {0}")]
    Sled(#[from] sled::Error),
    #[error("store: record {key} is corrupt: {detail}")]
    Corrupt { key: String, detail: String },
    #[error("store at {0} has schema version {1}; this routerd reads version 2")]
    Schema(String, String),
}

#[derive(Clone)]
pub struct Store {
    db: Db,
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
}

impl Store {
    pub fn open(path: &Path) -> Result<Self, StoreError> {
        let db = sled::Config::new()
            .path(path)
            .mode(sled::Mode::HighThroughput)
            .open()?;
        let meta = db.open_tree("meta")?;
        match meta.get("schema")? {
            None => {
                meta.insert("schema", SCHEMA_VERSION)?;
            }
            Some(v) if v.as_ref() == SCHEMA_VERSION => {}
            Some(v) => {
                return Err(StoreError::Schema(
                    path.display().to_string(),
                    String::from_utf8_lossy(&v).to_string(),
                ))
            }
        }
        Ok(Self {
            settlements: db.open_tree("settlements")?,
            unfinished: db.open_tree("unfinished")?,
            finished: db.open_tree("finished")?,
            signer_nonces: db.open_tree("signer_nonces")?,
            router_nonces: db.open_tree("router_nonces")?,
            db,
        })
    }

    /// Makes every write so far durable. sled 0.34's `flush_async` can stall when many tasks
    /// flush at once (seen with fifty concurrent settlements), so the blocking `flush` runs on
    /// tokio's blocking pool instead.
    pub async fn flush(&self) -> Result<(), StoreError> {
        let db = self.db.clone();
        tokio::task::spawn_blocking(move || db.flush())
            .await
            .map_err(|e| StoreError::Corrupt {
                key: "flush".to_string(),
                detail: e.to_string(),
            })??;
        Ok(())
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

    pub fn encode<T: serde::Serialize>(value: &T) -> Vec<u8> {
        serde_json::to_vec(value).expect("store records serialize")
    }
}
