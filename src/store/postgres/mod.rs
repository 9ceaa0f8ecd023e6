//! The PostgreSQL backend: several routerd instances share one database. Every write is one
//! statement or one transaction, committed durably (PostgreSQL's `synchronous_commit` default:
//! the commit is fsynced before it returns). Invariants:
//! - a claim is one `INSERT ... ON CONFLICT DO NOTHING` keyed by payment, so two instances never
//!   both own a payment;
//! - a lane's lease is taken with one conditional upsert, and every signed write first updates
//!   the lane row where the fence still matches, in the same transaction: the row lock orders a
//!   takeover against an old holder's write, and after the takeover that write matches nothing;
//! - lease expiry is judged by the database's clock, never by the instances' clocks;
//! - the schema is created and migrated by routerd at start, under an advisory lock, so
//!   instances starting together migrate once. The URL never appears in errors or logs.

mod channels;
mod columns;
mod cooldowns;
mod discovery;
mod lanes;
mod router_nonces;
mod sent;
mod settlements;

use std::time::Duration;

use async_trait::async_trait;
use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod, Runtime};
use tokio_postgres::types::ToSql;
use tokio_postgres::NoTls;

use super::{Backend, StoreError};

/// Connections per instance: the operator provisions instances x this on the server.
pub const POOL_SIZE: usize = 16;
/// How long a request waits to connect, or for a free connection, before failing clearly.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// The advisory lock instances take while migrating ("routerd" in ASCII).
const MIGRATION_LOCK: i64 = 0x0072_6f75_7465_7264;

/// Schema versions in order; each runs once, in one transaction, and is never edited.
const MIGRATIONS: &[(i32, &str)] = &[
    (
        1,
        "CREATE TABLE settlements (
         payment_key text PRIMARY KEY,
         record text NOT NULL,
         unfinished boolean NOT NULL,
         finished_at bigint
     );
     CREATE INDEX settlements_unfinished ON settlements (payment_key) WHERE unfinished;
     CREATE INDEX settlements_finished_at ON settlements (finished_at)
         WHERE finished_at IS NOT NULL;
     CREATE TABLE signer_lanes (
         lane text PRIMARY KEY,
         next_nonce bigint,
         holder text NOT NULL,
         fence bigint NOT NULL,
         expires_at timestamptz NOT NULL
     );
     CREATE TABLE router_nonces (
         key text PRIMARY KEY,
         last_nonce bigint NOT NULL,
         handed_at bigint NOT NULL
     );",
    ),
    (
        2,
        // The work queue: a claim until its first signed attempt is stored. `lane` and `fence`
        // say who took it (NULL: free for any lane of `network`).
        "CREATE TABLE settlement_queue (
             payment_key text PRIMARY KEY REFERENCES settlements ON DELETE CASCADE,
             network text NOT NULL,
             lane text,
             fence bigint,
             queued_at timestamptz NOT NULL DEFAULT now()
         );
         CREATE INDEX settlement_queue_network ON settlement_queue (network, queued_at);",
    ),
    (
        3,
        // The payer-exposure rule: `exposure` is the value a record still exposes of its
        // account's balance (NULL once answered or ended), summed per `account` at each claim.
        // `request_key` names one payment (the retry key of the request that claimed it).
        "ALTER TABLE settlements ADD COLUMN account text, ADD COLUMN exposure numeric(78, 0),
             ADD COLUMN request_key text;
         CREATE INDEX settlements_exposure ON settlements (account) WHERE exposure IS NOT NULL;
         CREATE UNIQUE INDEX settlements_request_key ON settlements (request_key)
             WHERE request_key IS NOT NULL;",
    ),
    (
        4,
        // The Permit2 rules: `permit2_nonce` is the owner's Permit2 nonce a Permit2 record
        // spends (`Permit2Nonce`), `permit2_approves` whether it approves Permit2 by an EIP-2612
        // permit; both count while the record exposes (`exposure IS NOT NULL`).
        "ALTER TABLE settlements ADD COLUMN permit2_nonce text,
             ADD COLUMN permit2_approves boolean NOT NULL DEFAULT false;
         CREATE INDEX settlements_permit2_nonce ON settlements (permit2_nonce)
             WHERE exposure IS NOT NULL AND permit2_nonce IS NOT NULL;",
    ),
    (
        5,
        // The pending rule: the caller and body hash whose next settle of the payment is told
        // its outcome. It goes with its record.
        "CREATE TABLE settlement_passes (
             payment_key text PRIMARY KEY REFERENCES settlements ON DELETE CASCADE,
             caller text NOT NULL,
             body bytea NOT NULL
         );",
    ),
    (
        6,
        // Transactions the router forwarded: which chain a wallet's hash is asked on.
        "CREATE TABLE router_sent (
             hash text PRIMARY KEY,
             chain text NOT NULL,
             sent_at bigint NOT NULL
         );
         CREATE INDEX router_sent_at ON router_sent (sent_at);",
    ),
    (
        7,
        // Revert cooldowns (access.md §3): a payer refused until `until_at` (unix seconds),
        // honoured by every instance and after restarts.
        "CREATE TABLE payer_cooldowns (
             payer text PRIMARY KEY,
             until_at bigint NOT NULL
         );
         CREATE INDEX payer_cooldowns_until ON payer_cooldowns (until_at);",
    ),
    (
        8,
        // The only signer that may send a queued claim (`EvmPart::sender`, an `upto` witness's
        // facilitator); NULL: any lane of its network.
        "ALTER TABLE settlement_queue ADD COLUMN signer text;",
    ),
    (
        9,
        // The discovery catalogue (x402 `bazaar`): one row per listing id, the facilitator's
        // JSON as text, read and evicted by when it was last settled.
        "CREATE TABLE discovery_listings (
             id text PRIMARY KEY,
             settled_at bigint NOT NULL,
             listing text NOT NULL
         );
         CREATE INDEX discovery_listings_settled ON discovery_listings (settled_at, id);",
    ),
    (
        10,
        // The batch-settlement channel mirror: the last state routerd read or caused per
        // channel (`channel` in lowercase hex), and when (`read_at`, unix seconds).
        "CREATE TABLE channel_mirror (
             network text NOT NULL,
             channel text NOT NULL,
             balance numeric(39, 0) NOT NULL,
             total_claimed numeric(39, 0) NOT NULL,
             withdraw_requested_at bigint NOT NULL,
             refund_nonce numeric(78, 0) NOT NULL,
             read_at bigint NOT NULL,
             PRIMARY KEY (network, channel)
         );",
    ),
    (
        11,
        // Who settles a channel's refund now, across instances, until `expires_at` (the
        // server's clock, as the lanes' leases).
        "CREATE TABLE channel_refund_holds (
             network text NOT NULL,
             channel text NOT NULL,
             holder text NOT NULL,
             expires_at timestamptz NOT NULL,
             PRIMARY KEY (network, channel)
         );",
    ),
];

pub struct PgStore {
    pool: Pool,
    described: String,
}

/// The error and its causes ("db error" alone says nothing; the server's message is a cause).
fn pg(e: impl std::error::Error) -> StoreError {
    let mut message = e.to_string();
    let mut cause = e.source();
    while let Some(inner) = cause {
        message.push_str(": ");
        message.push_str(&inner.to_string());
        cause = inner.source();
    }
    StoreError::unavailable(format!("PostgreSQL: {message}"))
}

fn int(value: u64) -> Result<i64, StoreError> {
    i64::try_from(value)
        .map_err(|_| StoreError::unavailable(format!("PostgreSQL: {value} exceeds bigint")))
}

fn uint(value: i64) -> u64 {
    u64::try_from(value).unwrap_or(0)
}

/// host:port/database, for the banner and `check-config`: never the user or password.
fn describe(config: &tokio_postgres::Config) -> String {
    let hosts: Vec<String> = config
        .get_hosts()
        .iter()
        .map(|h| match h {
            tokio_postgres::config::Host::Tcp(name) => name.clone(),
            tokio_postgres::config::Host::Unix(path) => path.display().to_string(),
        })
        .collect();
    let port = config.get_ports().first().copied().unwrap_or(5432);
    format!(
        "postgres:{}:{port}/{}",
        hosts.join(","),
        config.get_dbname().unwrap_or("")
    )
}

fn parse(url: &str) -> Result<tokio_postgres::Config, StoreError> {
    let mut config: tokio_postgres::Config = url.parse().map_err(|_| {
        StoreError::unavailable("PostgreSQL: storage.postgres_url is not a connection URL")
    })?;
    if config.get_connect_timeout().is_none() {
        config.connect_timeout(CONNECT_TIMEOUT);
    }
    if config.get_application_name().is_none() {
        config.application_name("routerd");
    }
    // The schema's `IF NOT EXISTS` statements raise NOTICEs, which tokio-postgres logs at INFO
    // on every start; warnings and errors still reach the log.
    let options = match config.get_options() {
        Some(given) => format!("{given} -c client_min_messages=warning"),
        None => "-c client_min_messages=warning".to_string(),
    };
    config.options(&options);
    Ok(config)
}

impl PgStore {
    /// Connects and brings the schema to this routerd's version.
    pub async fn connect(url: &str) -> Result<Self, StoreError> {
        let store = Self::pool(url)?;
        store.migrate().await?;
        Ok(store)
    }

    fn pool(url: &str) -> Result<Self, StoreError> {
        let config = parse(url)?;
        let described = describe(&config);
        let manager = Manager::from_config(
            config,
            NoTls,
            ManagerConfig {
                recycling_method: RecyclingMethod::Fast,
            },
        );
        let pool = Pool::builder(manager)
            .max_size(POOL_SIZE)
            .runtime(Runtime::Tokio1)
            .wait_timeout(Some(CONNECT_TIMEOUT))
            .create_timeout(Some(CONNECT_TIMEOUT))
            .build()
            .map_err(pg)?;
        Ok(Self { pool, described })
    }

    /// Connects without changing anything: the server version and the schema version found
    /// (0 before the first start), for `check-config`.
    pub async fn probe(url: &str) -> Result<(String, String, i32), StoreError> {
        let store = Self::pool(url)?;
        let client = store.client().await?;
        let server: String = client
            .query_one("SHOW server_version", &[])
            .await
            .map_err(pg)?
            .get(0);
        let created: bool = client
            .query_one("SELECT to_regclass('routerd_migrations') IS NOT NULL", &[])
            .await
            .map_err(pg)?
            .get(0);
        let schema: i32 = if created {
            client
                .query_one(
                    "SELECT coalesce(max(version), 0) FROM routerd_migrations",
                    &[],
                )
                .await
                .map_err(pg)?
                .get(0)
        } else {
            0
        };
        Ok((store.described.clone(), server, schema))
    }

    /// The schema version this routerd writes.
    pub fn schema_version() -> i32 {
        MIGRATIONS.last().map(|(v, _)| *v).unwrap_or(0)
    }

    async fn client(&self) -> Result<deadpool_postgres::Client, StoreError> {
        self.pool.get().await.map_err(pg)
    }

    /// One statement on a pooled connection, outside any transaction.
    async fn execute(&self, sql: &str, params: &[&(dyn ToSql + Sync)]) -> Result<(), StoreError> {
        self.client()
            .await?
            .execute(sql, params)
            .await
            .map_err(pg)?;
        Ok(())
    }

    async fn migrate(&self) -> Result<(), StoreError> {
        let mut client = self.client().await?;
        let tx = client.transaction().await.map_err(pg)?;
        tx.execute("SELECT pg_advisory_xact_lock($1)", &[&MIGRATION_LOCK])
            .await
            .map_err(pg)?;
        tx.batch_execute(
            "CREATE TABLE IF NOT EXISTS routerd_migrations (
                 version integer PRIMARY KEY,
                 applied_at timestamptz NOT NULL DEFAULT now()
             )",
        )
        .await
        .map_err(pg)?;
        let current: i32 = tx
            .query_one(
                "SELECT coalesce(max(version), 0) FROM routerd_migrations",
                &[],
            )
            .await
            .map_err(pg)?
            .get(0);
        if current > Self::schema_version() {
            return Err(StoreError::Schema(format!(
                "store: the database schema is at version {current}; this routerd knows up to {}",
                Self::schema_version()
            )));
        }
        for (version, sql) in MIGRATIONS.iter().filter(|(v, _)| *v > current) {
            tx.batch_execute(sql).await.map_err(pg)?;
            tx.execute(
                "INSERT INTO routerd_migrations (version) VALUES ($1)",
                &[version],
            )
            .await
            .map_err(pg)?;
            tracing::info!(version, "database schema migrated");
        }
        tx.commit().await.map_err(pg)
    }
}

#[async_trait]
impl Backend for PgStore {
    fn shared(&self) -> bool {
        true
    }

    /// Every commit is already durable.
    async fn flush(&self) -> Result<(), StoreError> {
        Ok(())
    }

    fn describe(&self) -> String {
        self.described.clone()
    }
}
