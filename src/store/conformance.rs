//! One suite, every backend: what the daemon relies on from its store. sled runs with the unit
//! tests; PostgreSQL runs against a real server when `ROUTERD_TEST_POSTGRES_URL` names one
//! (scripts/test-postgres starts a throwaway cluster and sets it). Each case gets two handles
//! on one store, as two instances would have.
#![cfg(test)]

use std::sync::Arc;
use std::time::Duration;

use ethers_core::types::{Address, H256, U256};

use super::{
    next_router_nonce, ChannelKey, ChannelSnapshot, Claim, Limits, Listing, PayerCooldown,
    Permit2Clash, Sent, Storage, StoreError,
};
use crate::ledger::{
    Inclusion, LaneId, Outcome, Pass, Payer, PaymentKey, Record, RequestTag, RouterNonceKey, State,
};
use solana_pubkey::Pubkey;

mod claims;
mod lanes;
mod router;
mod shared;

use claims::*;
use lanes::*;
use router::*;
use shared::*;

const LONG: Duration = Duration::from_secs(600);

use crate::testing::record;

fn lane() -> LaneId {
    LaneId {
        network: "net".to_string(),
        signer: Address::repeat_byte(9),
    }
}

fn signed(mut record: Record, nonce: u64) -> Record {
    record.signed(crate::testing::attempt(lane().signer, nonce));
    record
}

fn finished(mut record: Record, at: u64) -> Record {
    let inclusion = Inclusion {
        block: 5,
        block_hash: H256::repeat_byte(5),
        transaction: H256::repeat_byte(6),
        succeeded: true,
    };
    record.state = State::Final { inclusion };
    record.outcome = Some(Outcome {
        success: true,
        reason: None,
        message: None,
        transaction: Some(inclusion.transaction),
    });
    record.finished_at = Some(at);
    record
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a server: scripts/test-postgres runs it"]
async fn postgres_work_queue() {
    let (a, b) = open_postgres("queue").await;
    the_work_queue_hands_each_claim_to_one_lane_and_a_takeover_inherits(&a, &b).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a server: scripts/test-postgres runs it"]
async fn postgres_work_queue_named_signer() {
    let (a, b) = open_postgres("queue_named").await;
    a_claim_naming_its_signer_goes_to_that_signers_lane_only(&a, &b).await;
}

/// Every case, each on a fresh store from `open` (called twice per store: two handles).
macro_rules! conformance {
    ($module:ident, $open:path $(, $attr:meta)?) => {
        mod $module {
            use super::*;

            async fn run<F, Fut>(name: &str, case: F)
            where
                F: FnOnce(Storage, Storage) -> Fut,
                Fut: std::future::Future<Output = ()>,
            {
                let (a, b) = $open(name).await;
                case(a, b).await;
            }

            $(#[$attr])?
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn claims_once_and_releases() {
                run("claims", |a, b| async move { super::claims_once_and_releases(&a, &b).await }).await;
            }

            $(#[$attr])?
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn a_solana_settlement_is_claimed_once_and_read_back_whole() {
                run("solana", |a, b| async move { super::a_solana_settlement_is_claimed_once_and_read_back_whole(&a, &b).await }).await;
            }

            $(#[$attr])?
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn concurrent_claims_have_one_winner() {
                run("concurrent", |a, b| async move { super::concurrent_claims_have_one_winner(&a, &b).await }).await;
            }

            $(#[$attr])?
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn terminal_records_leave_unfinished_and_are_pruned() {
                run("terminal", |a, b| async move { super::terminal_records_leave_unfinished_and_are_pruned(&a, &b).await }).await;
            }

            $(#[$attr])?
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn one_holder_per_lane_and_the_fence_stops_the_old_one() {
                run("leases", |a, b| async move { super::one_holder_per_lane_and_the_fence_stops_the_old_one(&a, &b).await }).await;
            }

            $(#[$attr])?
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn a_request_key_names_one_payment() {
                run("request_keys", |a, b| async move { super::a_request_key_names_one_payment(&a, &b).await }).await;
            }

            $(#[$attr])?
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn a_pass_is_taken_once() {
                run("passes", |a, b| async move { super::a_pass_is_taken_once(&a, &b).await }).await;
            }

            $(#[$attr])?
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn permit2_claims_keep_to_allowance_nonce_and_approval() {
                run("permit2_claims", |a, b| async move { super::permit2_claims_keep_to_allowance_nonce_and_approval(&a, &b).await }).await;
            }

            $(#[$attr])?
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn exposure_adds_up_per_account() {
                run("exposure", |a, b| async move { super::exposure_adds_up_per_account(&a, &b).await }).await;
            }

            $(#[$attr])?
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn cooldowns_are_shared_and_pruned() {
                run("cooldowns", |a, b| async move { super::cooldowns_are_shared_and_pruned(&a, &b).await }).await;
            }

            $(#[$attr])?
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn a_solana_cooldown_is_kept_under_its_whole_key() {
                run("solana_cooldowns", |a, b| async move { super::a_solana_cooldown_is_kept_under_its_whole_key(&a, &b).await }).await;
            }

            $(#[$attr])?
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn a_solana_cooldown_in_the_earlier_layout_is_found() {
                run("landed_cooldowns", |a, b| async move { super::a_solana_cooldown_in_the_earlier_layout_is_found(&a, &b).await }).await;
            }

            $(#[$attr])?
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn two_solana_sources_sharing_20_bytes_are_exposed_apart() {
                run("solana_sources", |a, b| async move { super::two_solana_sources_sharing_20_bytes_are_exposed_apart(&a, &b).await }).await;
            }

            $(#[$attr])?
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn a_landed_solana_record_is_exposed_and_ended_under_its_key() {
                run("landed_solana", |a, b| async move { super::a_landed_solana_record_is_exposed_and_ended_under_its_key(&a, &b).await }).await;
            }

            $(#[$attr])?
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn the_channel_mirror_never_lowers_what_only_grows() {
                run("channel_mirror", |a, b| async move { super::the_channel_mirror_never_lowers_what_only_grows(&a, &b).await }).await;
            }

            $(#[$attr])?
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn two_writers_of_a_channel_keep_the_highest_claim() {
                run("channel_writers", |a, b| async move { super::two_writers_of_a_channel_keep_the_highest_claim(&a, &b).await }).await;
            }

            $(#[$attr])?
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn one_refund_holder_per_channel() {
                run("refund_holds", |a, b| async move { super::one_refund_holder_per_channel(&a, &b).await }).await;
            }

            $(#[$attr])?
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn expired_router_reservations_are_deleted() {
                run("router_prune", |a, b| async move { super::expired_router_reservations_are_deleted(&a, &b).await }).await;
            }

            $(#[$attr])?
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn the_catalogue_is_bounded_ordered_and_expires() {
                run("catalogue", |a, b| async move { super::the_catalogue_is_bounded_ordered_and_expires(&a, &b).await }).await;
            }

            $(#[$attr])?
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn router_nonces_follow_the_rule() {
                run("router_rule", |a, b| async move { super::router_nonces_follow_the_rule(&a, &b).await }).await;
            }

            $(#[$attr])?
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn a_broadcast_confirms_the_reservation() {
                run("router_confirm", |a, b| async move { super::a_broadcast_confirms_the_reservation(&a, &b).await }).await;
            }

            $(#[$attr])?
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn sent_transactions_are_found_until_forgotten() {
                run("router_sent", |a, b| async move { super::sent_transactions_are_found_until_forgotten(&a, &b).await }).await;
            }

            $(#[$attr])?
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn sent_transactions_are_bounded_oldest_first() {
                run("router_sent_bound", |a, b| async move { super::sent_transactions_are_bounded_oldest_first(&a, &b).await }).await;
            }

            $(#[$attr])?
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn router_nonces_are_consecutive_across_handles() {
                run("router", |a, b| async move { super::router_nonces_are_consecutive_across_handles(&a, &b).await }).await;
            }
        }
    };
}

/// sled allows one process per directory: both handles are the same store.
async fn open_sled(name: &str) -> (Storage, Storage) {
    let dir = crate::testing::temp_dir(&format!("conformance-{name}"));
    let store: Storage = Arc::new(super::sled_v1::open(&dir).await.unwrap());
    (store.clone(), store)
}

/// A fresh database per case on the server `ROUTERD_TEST_POSTGRES_URL` names, and two
/// connection pools to it.
async fn open_postgres(name: &str) -> (Storage, Storage) {
    let url = fresh_database(&format!("routerd_conformance_{name}")).await;
    let a: Storage = Arc::new(super::postgres::PgStore::connect(&url).await.unwrap());
    let b: Storage = Arc::new(super::postgres::PgStore::connect(&url).await.unwrap());
    (a, b)
}

/// An empty database named `database` on the server `ROUTERD_TEST_POSTGRES_URL` names; its URL.
pub(super) async fn fresh_database(database: &str) -> String {
    let admin_url = std::env::var("ROUTERD_TEST_POSTGRES_URL")
        .expect("ROUTERD_TEST_POSTGRES_URL: scripts/test-postgres sets it");
    let (admin, connection) = tokio_postgres::connect(&admin_url, tokio_postgres::NoTls)
        .await
        .expect("connecting to the test server");
    tokio::spawn(connection);
    // CREATE DATABASE copies template1, which must not be in use: one at a time.
    static CREATING: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
    let creating = CREATING.lock().await;
    for statement in [
        format!("DROP DATABASE IF EXISTS {database}"),
        format!("CREATE DATABASE {database}"),
    ] {
        admin.batch_execute(&statement).await.unwrap();
    }
    drop(creating);
    let mut config: tokio_postgres::Config = admin_url.parse().unwrap();
    config.dbname(database);
    postgres_url(&config)
}

/// The URL of `config` (host, port, user, database: the test cluster trusts local users).
fn postgres_url(config: &tokio_postgres::Config) -> String {
    let host = match &config.get_hosts()[0] {
        tokio_postgres::config::Host::Tcp(h) => h.clone(),
        tokio_postgres::config::Host::Unix(p) => p.display().to_string(),
    };
    format!(
        "postgres://{}@{}:{}/{}",
        config.get_user().unwrap_or("postgres"),
        host,
        config.get_ports().first().copied().unwrap_or(5432),
        config.get_dbname().unwrap_or("postgres")
    )
}

conformance!(sled_backend, open_sled);
conformance!(
    postgres_backend,
    open_postgres,
    ignore = "needs a server: scripts/test-postgres runs it"
);
