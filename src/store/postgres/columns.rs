//! A settlement record as PostgreSQL's columns take it: one row through the one codec
//! (`store::rows`), and the arrays the batched upsert takes.

use tokio_postgres::types::ToSql;

use super::int;
use crate::ledger::Record;
use crate::store::rows::{self, Row};
use crate::store::StoreError;

/// The record in a `record` column (JSON text), through the one codec.
pub(super) fn decode(id: &str, text: &str) -> Result<Record, StoreError> {
    rows::decode(id, text.as_bytes())
}

/// A [`Row`] as PostgreSQL's columns take it: the JSON as text, the finish time as bigint, the
/// exposure in decimal for `numeric`.
pub(super) struct Columns {
    pub(super) key: String,
    pub(super) text: String,
    pub(super) unfinished: bool,
    pub(super) finished_at: Option<i64>,
    pub(super) account: String,
    pub(super) exposure: Option<String>,
    pub(super) permit2_nonce: Option<String>,
    pub(super) permit2_approves: bool,
    /// The key Permit2 claims of the record's owner serialise under.
    pub(super) permit2_owner: Option<String>,
}

pub(super) fn columns(record: &Record) -> Result<Columns, StoreError> {
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

pub(super) const UPSERT_RECORDS: &str = "INSERT INTO settlements
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
pub(super) struct RecordColumns {
    pub(super) keys: Vec<String>,
    pub(super) texts: Vec<String>,
    pub(super) unfinished: Vec<bool>,
    pub(super) finished: Vec<Option<i64>>,
    pub(super) accounts: Vec<String>,
    pub(super) exposures: Vec<Option<String>>,
    pub(super) permit2_nonces: Vec<Option<String>>,
    pub(super) permit2_approves: Vec<bool>,
}

impl RecordColumns {
    pub(super) fn params(&self) -> [&(dyn ToSql + Sync); 8] {
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

pub(super) fn record_columns(records: &[&Record]) -> Result<RecordColumns, StoreError> {
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
