//! A store written by the release before this one (53628ba, tests/fixtures/store-53628ba/) opens
//! here, sled and PostgreSQL alike, and every record, index, lane nonce, request key and router
//! reservation in it is found as that release left it. The keys' and records' encodings are
//! the ones it wrote (`ledger::keys`), so opening migrates nothing; this test is what keeps it so.
//!
//! How the fixture was written: release_fixture.rs `include!`d into the tree of 53628ba (with
//! the old `settlement::state` module for `ledger`) and its `write_fixture` run on
//! an empty sled directory, and on an empty PostgreSQL database then dumped with
//! `pg_dump --inserts --no-owner --no-privileges` (psql's `\restrict` lines removed).

#![cfg(test)]

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use ethers_core::types::{Address, Bytes, H256, U256};
use serde_json::json;

use super::{Claim, Limits, Storage};
use crate::evm::TxFees;
use crate::ledger::{Attempt, Inclusion, LaneId, Lost, Outcome, Reason, Record, RouterNonceKey};

include!("release_fixture.rs");

fn fixture_router_key() -> RouterNonceKey {
    let key = RouterNonceKey {
        chain: "l1".to_string(),
        sender: Address::repeat_byte(0x70),
        caller: "ip:127.0.0.1".to_string(),
    };
    assert_eq!(key.storage_key(), FIXTURE_ROUTER_KEY);
    key
}

const FIXTURE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/store-53628ba");

/// What the release wrote, read back by this one.
async fn finds_everything(store: &Storage) {
    for record in fixture_records() {
        let found = store.get(&record.key()).await.unwrap();
        let found = found.unwrap_or_else(|| panic!("record {} is lost", record.key()));
        assert_eq!(
            serde_json::to_value(&found).unwrap(),
            serde_json::to_value(&record).unwrap(),
            "record {} reads back as written",
            record.key()
        );
    }
    let mut unfinished: Vec<H256> = store
        .unfinished()
        .await
        .unwrap()
        .iter()
        .filter_map(|r| r.evm().map(|e| e.nonce))
        .collect();
    unfinished.sort();
    assert_eq!(
        unfinished,
        [1, 2, 3, 4].map(H256::repeat_byte),
        "the unfinished index"
    );
    assert_eq!(
        store.lane_nonce(&fixture_lane()).await.unwrap(),
        Some(9),
        "the lane's next nonce"
    );
    // A request key still names its payment: another payment under it is refused.
    let mut other = fixture_claim(20);
    other.request = fixture_claim(2).request;
    let taken = store
        .claim(&other.key(), &other, None, &Limits::balance(U256::MAX))
        .await
        .unwrap();
    assert!(matches!(taken, Claim::KeyTaken), "the request keys");
    // Payer 0x21 has claims 1 and 3 (1000 + 3000) still exposing its balance.
    let mut next = fixture_claim(11);
    next.request = None;
    let limit = U256::from(4000 + 11_000 - 1);
    match store
        .claim(&next.key(), &next, None, &Limits::balance(limit))
        .await
        .unwrap()
    {
        Claim::OverLimit { exposed } => assert_eq!(exposed, U256::from(4000), "the exposure"),
        _ => panic!("the exposure of payer 0x21 is lost"),
    }
    let reserved = store
        .reserve_router_nonce(&fixture_router_key(), 3, FIXTURE_AT + 1, 120, 16)
        .await
        .unwrap();
    assert_eq!(reserved, Some(5), "the router's reservations");
    assert_eq!(
        store.prune(FIXTURE_AT + 1).await.unwrap(),
        4,
        "the finished index"
    );
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), target).unwrap();
        }
    }
}

#[tokio::test]
async fn sled_store_of_the_previous_release() {
    let dir = crate::testing::temp_dir("upgrade-sled");
    copy_dir(&Path::new(FIXTURE).join("sled"), &dir);
    let store: Storage = Arc::new(super::sled_v1::open(&dir).await.unwrap());
    finds_everything(&store).await;
}

/// What this release writes the same way reads back the same: the check above is of the data,
/// not of one store's history.
#[tokio::test]
async fn sled_store_written_by_this_release() {
    let dir = crate::testing::temp_dir("upgrade-fresh");
    let store: Storage = Arc::new(super::sled_v1::open(&dir).await.unwrap());
    write_fixture(&store).await;
    finds_everything(&store).await;
}

#[tokio::test]
#[ignore = "needs a server: scripts/test-postgres runs it"]
async fn postgres_store_of_the_previous_release() {
    let url = super::conformance::fresh_database("routerd_upgrade").await;
    let (client, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(connection);
    let dump = std::fs::read_to_string(Path::new(FIXTURE).join("postgres.sql")).unwrap();
    client.batch_execute(&dump).await.unwrap();
    let store: Storage = Arc::new(super::postgres::PgStore::connect(&url).await.unwrap());
    finds_everything(&store).await;
}
