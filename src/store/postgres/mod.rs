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

use std::time::Duration;

use async_trait::async_trait;
use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod, Runtime};
use ethers_core::types::{Address, H256, U256};
use tokio_postgres::error::SqlState;
use tokio_postgres::types::ToSql;
use tokio_postgres::NoTls;

use super::rows::{self, Row};
use super::{
    Backend, Claim, CooldownStore, DiscoveryStore, InFlight, LaneStore, Lease, Limits, Listing,
    PayerCooldown, RouterNonceStore, Sent, SentStore, SettlementStore, StoreError,
};
use crate::evm::hex_bytes;
use crate::ledger::{Account, LaneId, Pass, PaymentKey, Record, RouterNonceKey};

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
        // The only signer that may send a queued claim (`Record::sender`, an `upto` witness's
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

/// The record in a `record` column (JSON text), through the one codec.
fn decode(id: &str, text: &str) -> Result<Record, StoreError> {
    rows::decode(id, text.as_bytes())
}

/// A [`Row`] as PostgreSQL's columns take it: the JSON as text, the finish time as bigint, the
/// exposure in decimal for `numeric`.
struct Columns {
    key: String,
    text: String,
    unfinished: bool,
    finished_at: Option<i64>,
    account: String,
    exposure: Option<String>,
    permit2_nonce: Option<String>,
    permit2_approves: bool,
    /// The key Permit2 claims of the record's owner serialise under.
    permit2_owner: Option<String>,
}

fn columns(record: &Record) -> Result<Columns, StoreError> {
    let row = Row::of(record);
    Ok(Columns {
        unfinished: row.unfinished(),
        finished_at: row.finished_at.map(int).transpose()?,
        text: row.encoded,
        key: row.id,
        account: row.account,
        exposure: row.exposure.map(|value| value.to_string()),
        permit2_approves: row.permit2.as_ref().is_some_and(|p| p.approves),
        permit2_owner: row.permit2.as_ref().map(|p| p.owner.clone()),
        permit2_nonce: row.permit2.map(|p| p.nonce),
    })
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

const UPSERT_RECORDS: &str = "INSERT INTO settlements
         (payment_key, record, unfinished, finished_at, account, exposure, permit2_nonce,
          permit2_approves)
     SELECT k, r, u, f, a, e::numeric, n, p
     FROM unnest($1::text[], $2::text[], $3::boolean[], $4::bigint[], $5::text[], $6::text[],
         $7::text[], $8::boolean[])
         AS t(k, r, u, f, a, e, n, p)
     ON CONFLICT (payment_key) DO UPDATE SET record = EXCLUDED.record,
         unfinished = EXCLUDED.unfinished, finished_at = EXCLUDED.finished_at,
         account = EXCLUDED.account, exposure = EXCLUDED.exposure,
         permit2_nonce = EXCLUDED.permit2_nonce, permit2_approves = EXCLUDED.permit2_approves";

/// The arrays `UPSERT_RECORDS` takes.
#[derive(Default)]
struct RecordColumns {
    keys: Vec<String>,
    texts: Vec<String>,
    unfinished: Vec<bool>,
    finished: Vec<Option<i64>>,
    accounts: Vec<String>,
    exposures: Vec<Option<String>>,
    permit2_nonces: Vec<Option<String>>,
    permit2_approves: Vec<bool>,
}

impl RecordColumns {
    fn params(&self) -> [&(dyn ToSql + Sync); 8] {
        [
            &self.keys,
            &self.texts,
            &self.unfinished,
            &self.finished,
            &self.accounts,
            &self.exposures,
            &self.permit2_nonces,
            &self.permit2_approves,
        ]
    }
}

fn record_columns(records: &[&Record]) -> Result<RecordColumns, StoreError> {
    let mut out = RecordColumns::default();
    for record in records {
        let c = columns(record)?;
        out.keys.push(c.key);
        out.texts.push(c.text);
        out.unfinished.push(c.unfinished);
        out.finished.push(c.finished_at);
        out.accounts.push(c.account);
        out.exposures.push(c.exposure);
        out.permit2_nonces.push(c.permit2_nonce);
        out.permit2_approves.push(c.permit2_approves);
    }
    Ok(out)
}

#[async_trait]
impl SettlementStore for PgStore {
    async fn get(&self, key: &PaymentKey) -> Result<Option<Record>, StoreError> {
        let id = key.storage_key();
        let row = self
            .client()
            .await?
            .query_opt(
                "SELECT record FROM settlements WHERE payment_key = $1",
                &[&id],
            )
            .await
            .map_err(pg)?;
        row.map(|r| decode(&id, r.get(0))).transpose()
    }

    async fn exposed(&self, account: &Account) -> Result<U256, StoreError> {
        let account = account.storage_key();
        let row = self
            .client()
            .await?
            .query_one(
                "SELECT coalesce(sum(exposure), 0)::text
                 FROM settlements WHERE account = $1 AND exposure IS NOT NULL",
                &[&account],
            )
            .await
            .map_err(pg)?;
        U256::from_dec_str(row.get(0)).map_err(|_| {
            StoreError::unavailable(format!(
                "PostgreSQL: exposure of {account} is not a uint256"
            ))
        })
    }

    /// One transaction under the account's advisory lock (and, for Permit2, then its owner's:
    /// Permit2 nonces span tokens), so that claims of one payer on several instances are added
    /// up one after another: the stored record if the payment exists, else the account's
    /// settlements in flight weighed, else the record and its queue entry.
    async fn claim(
        &self,
        key: &PaymentKey,
        record: &Record,
        taken_by: Option<&Lease>,
        limits: &Limits,
    ) -> Result<Claim, StoreError> {
        let id = key.storage_key();
        let c = columns(record)?;
        let lane = taken_by.map(|l| l.lane.storage_key());
        let fence = taken_by.map(|l| int(l.fence)).transpose()?;
        let mut client = self.client().await?;
        let tx = client.transaction().await.map_err(pg)?;
        // Always the account first, the owner last: two claims never wait on each other's lock.
        for lock in std::iter::once(&c.account).chain(&c.permit2_owner) {
            tx.execute(
                "SELECT pg_advisory_xact_lock(hashtextextended($1, 0))",
                &[lock],
            )
            .await
            .map_err(pg)?;
        }
        let existing = tx
            .query_opt(
                "SELECT record FROM settlements WHERE payment_key = $1",
                &[&id],
            )
            .await
            .map_err(pg)?;
        if let Some(row) = existing {
            return Ok(Claim::Exists(Box::new(decode(&id, row.get(0))?)));
        }
        let request_key = record.request.as_ref().map(|tag| tag.key.as_str());
        if key_taken(&tx, request_key).await? {
            return Ok(Claim::KeyTaken);
        }
        let in_flight = in_flight(&tx, &c.account).await?;
        let nonce_held = nonce_held(&tx, c.permit2_nonce.as_deref(), &id).await?;
        if let Some(refused) = in_flight.refuses(record, limits, nonce_held) {
            return Ok(refused);
        }
        let inserted = tx
            .execute(
                "WITH claimed AS (
                 INSERT INTO settlements (payment_key, record, unfinished, account, exposure,
                     request_key, permit2_nonce, permit2_approves)
                 VALUES ($1, $2, true, $6, $7::text::numeric, $8, $9, $10)
                 RETURNING payment_key
             )
             INSERT INTO settlement_queue (payment_key, network, lane, fence, signer)
             SELECT payment_key, $3, $4, $5, $11 FROM claimed",
                &[
                    &id,
                    &c.text,
                    &key.network,
                    &lane,
                    &fence,
                    &c.account,
                    &c.exposure,
                    &request_key,
                    &c.permit2_nonce,
                    &c.permit2_approves,
                    &record.sender.map(hex_bytes),
                ],
            )
            .await;
        match inserted {
            // Another payer's claim took the key a moment ago (its lock is not ours).
            Err(e) if e.code() == Some(&SqlState::UNIQUE_VIOLATION) => Ok(Claim::KeyTaken),
            Err(e) => Err(pg(e)),
            Ok(_) => {
                tx.commit().await.map_err(pg)?;
                Ok(Claim::Claimed)
            }
        }
    }

    async fn save(&self, records: &[&Record], _durable: bool) -> Result<(), StoreError> {
        let columns = record_columns(records)?;
        self.execute(UPSERT_RECORDS, &columns.params()).await
    }

    async fn release(&self, key: &PaymentKey) -> Result<(), StoreError> {
        self.execute(
            "DELETE FROM settlements WHERE payment_key = $1",
            &[&key.storage_key()],
        )
        .await
    }

    async fn grant_pass(&self, key: &PaymentKey, pass: &Pass) -> Result<(), StoreError> {
        self.execute(
            "INSERT INTO settlement_passes (payment_key, caller, body)
                 SELECT payment_key, $2, $3 FROM settlements WHERE payment_key = $1
             ON CONFLICT (payment_key) DO UPDATE SET caller = $2, body = $3",
            &[&key.storage_key(), &pass.caller, &pass.body.as_bytes()],
        )
        .await
    }

    async fn take_pass(&self, key: &PaymentKey, pass: &Pass) -> Result<bool, StoreError> {
        let taken = self
            .client()
            .await?
            .execute(
                "DELETE FROM settlement_passes
                 WHERE payment_key = $1 AND caller = $2 AND body = $3",
                &[&key.storage_key(), &pass.caller, &pass.body.as_bytes()],
            )
            .await
            .map_err(pg)?;
        Ok(taken == 1)
    }

    async fn unfinished(&self) -> Result<Vec<Record>, StoreError> {
        let rows = self
            .client()
            .await?
            .query(
                "SELECT payment_key, record FROM settlements WHERE unfinished",
                &[],
            )
            .await
            .map_err(pg)?;
        rows.iter().map(|r| decode(r.get(0), r.get(1))).collect()
    }

    async fn prune(&self, cutoff: u64) -> Result<usize, StoreError> {
        let pruned = self
            .client()
            .await?
            .execute(
                "DELETE FROM settlements WHERE NOT unfinished AND finished_at < $1",
                &[&int(cutoff)?],
            )
            .await
            .map_err(pg)?;
        Ok(pruned as usize)
    }
}

/// Whether another record holds `request_key` (within the claim's transaction).
async fn key_taken(
    tx: &tokio_postgres::Transaction<'_>,
    request_key: Option<&str>,
) -> Result<bool, StoreError> {
    let Some(request_key) = request_key else {
        return Ok(false);
    };
    let row = tx
        .query_opt(
            "SELECT 1 FROM settlements WHERE request_key = $1",
            &[&request_key],
        )
        .await
        .map_err(pg)?;
    Ok(row.is_some())
}

/// The account's records still in flight, added up (within the claim's transaction, under the
/// account's lock).
async fn in_flight(
    tx: &tokio_postgres::Transaction<'_>,
    account: &str,
) -> Result<InFlight, StoreError> {
    let row = tx
        .query_one(
            "SELECT coalesce(sum(exposure), 0)::text,
                 coalesce(sum(exposure) FILTER (WHERE permit2_nonce IS NOT NULL), 0)::text,
                 count(*) FILTER (WHERE permit2_nonce IS NOT NULL),
                 count(*) FILTER (WHERE permit2_approves)
             FROM settlements WHERE account = $1 AND exposure IS NOT NULL",
            &[&account],
        )
        .await
        .map_err(pg)?;
    let total = |i: usize| {
        U256::from_dec_str(row.get(i)).map_err(|_| {
            StoreError::unavailable(format!(
                "PostgreSQL: exposure of {account} is not a uint256"
            ))
        })
    };
    let count = |i: usize| uint(row.get(i));
    Ok(InFlight {
        value: total(0)?,
        permit2_value: total(1)?,
        permit2: count(2),
        approvals: count(3),
    })
}

/// Whether a record other than `id` in flight spends the Permit2 nonce `nonce` (within the
/// claim's transaction, under the owner's lock).
async fn nonce_held(
    tx: &tokio_postgres::Transaction<'_>,
    nonce: Option<&str>,
    id: &str,
) -> Result<bool, StoreError> {
    let Some(nonce) = nonce else {
        return Ok(false);
    };
    let row = tx
        .query_opt(
            "SELECT 1 FROM settlements
             WHERE permit2_nonce = $1 AND exposure IS NOT NULL AND payment_key <> $2",
            &[&nonce, &id],
        )
        .await
        .map_err(pg)?;
    Ok(row.is_some())
}

/// Moves the lane's next nonce under the lease; the row lock it takes orders it against a
/// takeover.
const FENCED_NONCE: &str =
    "UPDATE signer_lanes SET next_nonce = $4 WHERE lane = $1 AND holder = $2 AND fence = $3";

#[async_trait]
impl LaneStore for PgStore {
    async fn acquire(
        &self,
        lane: &LaneId,
        holder: &str,
        ttl: Duration,
    ) -> Result<Option<Lease>, StoreError> {
        let row = self
            .client()
            .await?
            .query_opt(
                "INSERT INTO signer_lanes (lane, holder, fence, expires_at)
                 VALUES ($1, $2, 1, now() + make_interval(secs => $3::float8))
                 ON CONFLICT (lane) DO UPDATE SET
                     fence = CASE WHEN signer_lanes.holder = EXCLUDED.holder
                                  THEN signer_lanes.fence ELSE signer_lanes.fence + 1 END,
                     holder = EXCLUDED.holder,
                     expires_at = EXCLUDED.expires_at
                 WHERE signer_lanes.holder = EXCLUDED.holder OR signer_lanes.expires_at <= now()
                 RETURNING fence",
                &[&lane.storage_key(), &holder, &ttl.as_secs_f64()],
            )
            .await
            .map_err(pg)?;
        Ok(row.map(|r| Lease {
            lane: lane.clone(),
            holder: holder.to_string(),
            fence: uint(r.get(0)),
        }))
    }

    async fn surrender(&self, lease: &Lease) -> Result<(), StoreError> {
        self.execute(
            "UPDATE signer_lanes SET expires_at = now()
                 WHERE lane = $1 AND holder = $2 AND fence = $3",
            &[&lease.lane.storage_key(), &lease.holder, &int(lease.fence)?],
        )
        .await
    }

    async fn lane_nonce(&self, lane: &LaneId) -> Result<Option<u64>, StoreError> {
        let row = self
            .client()
            .await?
            .query_opt(
                "SELECT next_nonce FROM signer_lanes WHERE lane = $1",
                &[&lane.storage_key()],
            )
            .await
            .map_err(pg)?;
        Ok(row.and_then(|r| r.get::<_, Option<i64>>(0)).map(uint))
    }

    async fn commit_signed(
        &self,
        lease: &Lease,
        next_nonce: u64,
        records: &[&Record],
    ) -> Result<(), StoreError> {
        let lane = lease.lane.storage_key();
        let columns = record_columns(records)?;
        let mut client = self.client().await?;
        let tx = client.transaction().await.map_err(pg)?;
        let fenced = tx
            .execute(
                FENCED_NONCE,
                &[&lane, &lease.holder, &int(lease.fence)?, &int(next_nonce)?],
            )
            .await
            .map_err(pg)?;
        if fenced == 0 {
            return Err(StoreError::LeaseLost(lane)); // the transaction rolls back on drop
        }
        if !columns.keys.is_empty() {
            tx.execute(UPSERT_RECORDS, &columns.params())
                .await
                .map_err(pg)?;
            // Signed: from now on the lane's unfinished records carry it, not the queue.
            tx.execute(
                "DELETE FROM settlement_queue WHERE payment_key = ANY($1)",
                &[&columns.keys],
            )
            .await
            .map_err(pg)?;
        }
        tx.commit().await.map_err(pg)
    }

    async fn take_queued(&self, lease: &Lease, limit: usize) -> Result<Vec<Record>, StoreError> {
        let lane = lease.lane.storage_key();
        let rows = self
            .client()
            .await?
            .query(
                "UPDATE settlement_queue q SET lane = $2, fence = $3
                 FROM (SELECT payment_key FROM settlement_queue
                       WHERE network = $1 AND (lane IS NULL OR (lane = $2 AND fence < $3))
                         AND (signer IS NULL OR signer = $6)
                       ORDER BY queued_at
                       FOR UPDATE SKIP LOCKED
                       LIMIT $4) picked,
                      settlements s
                 WHERE q.payment_key = picked.payment_key AND s.payment_key = q.payment_key
                   AND EXISTS (SELECT 1 FROM signer_lanes
                               WHERE signer_lanes.lane = $2 AND holder = $5 AND fence = $3)
                 RETURNING q.payment_key, s.record",
                &[
                    &lease.lane.network,
                    &lane,
                    &int(lease.fence)?,
                    &int(limit as u64)?,
                    &lease.holder,
                    &hex_bytes(lease.lane.signer),
                ],
            )
            .await
            .map_err(pg)?;
        rows.iter().map(|r| decode(r.get(0), r.get(1))).collect()
    }

    async fn requeue(&self, keys: &[PaymentKey]) -> Result<(), StoreError> {
        let keys: Vec<String> = keys.iter().map(PaymentKey::storage_key).collect();
        self.execute(
            "UPDATE settlement_queue SET lane = NULL, fence = NULL WHERE payment_key = ANY($1)",
            &[&keys],
        )
        .await
    }
}

#[async_trait]
impl RouterNonceStore for PgStore {
    async fn reserve_router_nonce(
        &self,
        key: &RouterNonceKey,
        pending: u64,
        now: u64,
        ttl_secs: u64,
        max_ahead: u64,
    ) -> Result<Option<u64>, StoreError> {
        // store::next_router_nonce, in one statement: concurrent reservations queue on the row,
        // and one too far ahead updates nothing and returns no row.
        let row = self
            .client()
            .await?
            .query_opt(
                "INSERT INTO router_nonces (key, last_nonce, handed_at) VALUES ($1, $2, $3)
                 ON CONFLICT (key) DO UPDATE SET
                     last_nonce = CASE WHEN $3 - router_nonces.handed_at < $4
                                       THEN greatest($2, router_nonces.last_nonce + 1)
                                       ELSE $2 END,
                     handed_at = $3
                 WHERE CASE WHEN $3 - router_nonces.handed_at < $4
                            THEN greatest($2, router_nonces.last_nonce + 1)
                            ELSE $2 END < $2 + $5
                 RETURNING last_nonce",
                &[
                    &key.storage_key(),
                    &int(pending)?,
                    &int(now)?,
                    &int(ttl_secs)?,
                    &int(max_ahead)?,
                ],
            )
            .await
            .map_err(pg)?;
        Ok(row.map(|r| uint(r.get(0))))
    }

    async fn confirm_router_nonce(
        &self,
        key: &RouterNonceKey,
        nonce: u64,
        now: u64,
        ttl_secs: u64,
    ) -> Result<(), StoreError> {
        // store::confirmed_router_nonce, in one statement.
        self.execute(
            "INSERT INTO router_nonces (key, last_nonce, handed_at) VALUES ($1, $2, $3)
             ON CONFLICT (key) DO UPDATE SET
                 last_nonce = CASE WHEN $3 - router_nonces.handed_at < $4
                                        AND router_nonces.last_nonce > $2
                                   THEN router_nonces.last_nonce ELSE $2 END,
                 handed_at = CASE WHEN $3 - router_nonces.handed_at < $4
                                       AND router_nonces.last_nonce > $2
                                  THEN router_nonces.handed_at ELSE $3 END",
            &[
                &key.storage_key(),
                &int(nonce)?,
                &int(now)?,
                &int(ttl_secs)?,
            ],
        )
        .await
    }

    async fn prune_router_nonces(&self, cutoff: u64) -> Result<usize, StoreError> {
        let pruned = self
            .client()
            .await?
            .execute(
                "DELETE FROM router_nonces WHERE handed_at < $1",
                &[&int(cutoff)?],
            )
            .await
            .map_err(pg)?;
        Ok(pruned as usize)
    }
}

#[async_trait]
impl SentStore for PgStore {
    async fn remember_sent(&self, hash: H256, sent: &Sent) -> Result<(), StoreError> {
        self.execute(
            "INSERT INTO router_sent (hash, chain, sent_at) VALUES ($1, $2, $3)
             ON CONFLICT (hash) DO UPDATE SET chain = $2, sent_at = greatest(router_sent.sent_at, $3)",
            &[&format!("{hash:#x}"), &sent.chain, &int(sent.at)?],
        )
        .await
    }

    async fn sent(&self, hash: H256) -> Result<Option<Sent>, StoreError> {
        let row = self
            .client()
            .await?
            .query_opt(
                "SELECT chain, sent_at FROM router_sent WHERE hash = $1",
                &[&format!("{hash:#x}")],
            )
            .await
            .map_err(pg)?;
        Ok(row.map(|r| Sent {
            chain: r.get(0),
            at: uint(r.get(1)),
        }))
    }

    async fn forget_sent(&self, cutoff: u64) -> Result<usize, StoreError> {
        let forgotten = self
            .client()
            .await?
            .execute(
                "DELETE FROM router_sent WHERE sent_at < $1",
                &[&int(cutoff)?],
            )
            .await
            .map_err(pg)?;
        Ok(forgotten as usize)
    }

    /// Every instance trims the one table to the same bound; the index on `sent_at` orders it.
    async fn forget_sent_beyond(&self, keep: usize) -> Result<usize, StoreError> {
        let keep = i64::try_from(keep).unwrap_or(i64::MAX);
        let forgotten = self
            .client()
            .await?
            .execute(
                "DELETE FROM router_sent WHERE hash IN
                   (SELECT hash FROM router_sent ORDER BY sent_at DESC, hash DESC OFFSET $1)",
                &[&keep],
            )
            .await
            .map_err(pg)?;
        Ok(forgotten as usize)
    }
}

/// A payer as `payer_cooldowns` keys it (lowercase hex).
fn payer_key(payer: Address) -> String {
    hex_bytes(payer)
}

#[async_trait]
impl CooldownStore for PgStore {
    async fn cool_down(&self, cooldown: PayerCooldown) -> Result<(), StoreError> {
        self.execute(
            "INSERT INTO payer_cooldowns (payer, until_at) VALUES ($1, $2)
             ON CONFLICT (payer) DO UPDATE
                 SET until_at = greatest(payer_cooldowns.until_at, EXCLUDED.until_at)",
            &[&payer_key(cooldown.payer), &int(cooldown.until)?],
        )
        .await
    }

    async fn cooldown_of(&self, payer: Address, now: u64) -> Result<Option<u64>, StoreError> {
        let row = self
            .client()
            .await?
            .query_opt(
                "SELECT until_at FROM payer_cooldowns WHERE payer = $1 AND until_at > $2",
                &[&payer_key(payer), &int(now)?],
            )
            .await
            .map_err(pg)?;
        Ok(row.map(|r| uint(r.get(0))))
    }

    async fn cooldowns(&self, now: u64) -> Result<Vec<PayerCooldown>, StoreError> {
        let rows = self
            .client()
            .await?
            .query(
                "SELECT payer, until_at FROM payer_cooldowns WHERE until_at > $1",
                &[&int(now)?],
            )
            .await
            .map_err(pg)?;
        rows.iter()
            .map(|r| {
                let payer: &str = r.get(0);
                Ok(PayerCooldown {
                    payer: payer.parse().map_err(|_| StoreError::Corrupt {
                        key: payer.to_string(),
                        detail: "not a payer address".to_string(),
                    })?,
                    until: uint(r.get(1)),
                })
            })
            .collect()
    }

    async fn prune_cooldowns(&self, now: u64) -> Result<usize, StoreError> {
        let pruned = self
            .client()
            .await?
            .execute(
                "DELETE FROM payer_cooldowns WHERE until_at <= $1",
                &[&int(now)?],
            )
            .await
            .map_err(pg)?;
        Ok(pruned as usize)
    }
}

#[async_trait]
impl DiscoveryStore for PgStore {
    /// One transaction: instances listing together never leave more than the cap.
    async fn list(&self, listing: &Listing, max_listings: usize) -> Result<(), StoreError> {
        let mut client = self.client().await?;
        let transaction = client.transaction().await.map_err(pg)?;
        transaction
            .execute(
                "INSERT INTO discovery_listings (id, settled_at, listing) VALUES ($1, $2, $3)
                 ON CONFLICT (id) DO UPDATE SET settled_at = $2, listing = $3",
                &[&listing.id, &int(listing.settled_at)?, &listing.encoded],
            )
            .await
            .map_err(pg)?;
        transaction
            .execute(
                "DELETE FROM discovery_listings WHERE id IN (
                     SELECT id FROM discovery_listings ORDER BY settled_at DESC, id OFFSET $1)",
                &[&int(max_listings as u64)?],
            )
            .await
            .map_err(pg)?;
        transaction.commit().await.map_err(pg)
    }

    async fn listings(
        &self,
        since: u64,
        visit: &mut (dyn FnMut(Listing) + Send),
    ) -> Result<(), StoreError> {
        use futures::TryStreamExt;
        let client = self.client().await?;
        let rows = client
            .query_raw(
                "SELECT id, settled_at, listing FROM discovery_listings WHERE settled_at >= $1
                 ORDER BY settled_at DESC, id",
                [int(since)?],
            )
            .await
            .map_err(pg)?;
        futures::pin_mut!(rows);
        while let Some(row) = rows.try_next().await.map_err(pg)? {
            visit(Listing {
                id: row.get(0),
                settled_at: uint(row.get(1)),
                encoded: row.get(2),
            });
        }
        Ok(())
    }

    async fn unlist_before(&self, cutoff: u64) -> Result<usize, StoreError> {
        let unlisted = self
            .client()
            .await?
            .execute(
                "DELETE FROM discovery_listings WHERE settled_at < $1",
                &[&int(cutoff)?],
            )
            .await
            .map_err(pg)?;
        Ok(unlisted as usize)
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
