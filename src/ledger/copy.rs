//! Appends on Postgres through `COPY` (binary): the entries are encoded here into
//! Postgres's binary copy format and copied into `ledger_entries` in one statement, which
//! parses and plans nothing per entry (a multi-row `VALUES` bound twelve parameters per
//! entry, 500 entries a statement) and checks no conflict: under `ON CONFLICT DO NOTHING`
//! every row was first looked up in each unique index, a third of Postgres's B-tree work
//! in a profile of the drain.
//!
//! `COPY` cannot skip an entry already there, which a drain meets when it retries a batch
//! whose commit it did not see: that batch's `COPY` fails on the unique key, and it is
//! inserted again through a staging table of the session, by one `INSERT … SELECT … ON
//! CONFLICT DO NOTHING`, which skips what is there.

use super::sql::{column_amount, db_error, SqlLedgerStore, ROWS_PER_INSERT};
use crate::domain::LedgerEntry;
use crate::engine::alerts::AlertEvent;
use crate::engine::codec;
use crate::engine::ledger::LedgerError;
use chrono::{DateTime, Utc};
use sqlx::postgres::PgConnection;
use sqlx::PgPool;

/// The columns copied, in the order [`encode`] writes them (the store's insert columns).
const COLUMNS: &str = "id, at, kind, action, subject, amount, consumption_id, hold_id, \
     idempotency_key, policies, detail, attributes, totals, folded, folded_ids";

/// The session's staging table, created by its first retried batch (quietly: `IF NOT
/// EXISTS` notices otherwise) and emptied at every commit.
const STAGING: [&str; 2] = [
    "SET LOCAL client_min_messages = warning",
    "CREATE TEMP TABLE IF NOT EXISTS ledger_staging (\
         id text, at timestamptz, kind text, action text, subject text, amount bigint, \
         consumption_id text, hold_id text, idempotency_key text, policies jsonb, \
         detail text, attributes jsonb, totals jsonb, folded bigint, folded_ids text) ON COMMIT DELETE ROWS",
];

/// Adds alert `events` to the outbox outside an entry's transaction, holding the
/// appends' lock as an append does (`db::appends`).
pub(super) async fn add_events(pool: &PgPool, events: &[AlertEvent]) -> Result<(), LedgerError> {
    let mut tx = pool
        .begin_with(crate::db::appends::BEGIN_APPEND)
        .await
        .map_err(db_error)?;
    for chunk in events.chunks(ROWS_PER_INSERT) {
        SqlLedgerStore::<sqlx::Postgres>::insert_events(&mut tx, chunk).await?;
    }
    tx.commit().await.map_err(db_error)
}

/// Inserts `entries`, and the alert `events` they record, in one transaction, skipping
/// those already there; returns how many entries were new.
pub(super) async fn append(
    pool: &PgPool,
    entries: &[LedgerEntry],
    events: &[AlertEvent],
) -> Result<u64, LedgerError> {
    let data = encode(entries)?;
    match append_copied(pool, &data, events, false).await {
        Err(Attempt::Duplicate) => match append_copied(pool, &data, events, true).await {
            Err(Attempt::Duplicate) => Err(LedgerError::Corrupt(
                "an entry is there twice after skipping duplicates".to_owned(),
            )),
            Err(Attempt::Failed(error)) => Err(error),
            Ok(inserted) => Ok(inserted),
        },
        Err(Attempt::Failed(error)) => Err(error),
        Ok(inserted) => Ok(inserted),
    }
}

/// How one try of an append failed.
enum Attempt {
    /// An entry is there already (a unique key broken).
    Duplicate,
    Failed(LedgerError),
}

impl From<sqlx::Error> for Attempt {
    fn from(error: sqlx::Error) -> Self {
        match &error {
            sqlx::Error::Database(db) if db.code().as_deref() == Some("23505") => {
                Attempt::Duplicate
            }
            _ => Attempt::Failed(db_error(error)),
        }
    }
}

impl From<LedgerError> for Attempt {
    fn from(error: LedgerError) -> Self {
        Attempt::Failed(error)
    }
}

/// One transaction: the copy of `data` (into `ledger_entries`, or through the staging
/// table when `skipping` entries already there), and the alert `events`.
///
/// The entries go in one statement, whose trigger adds to the hourly rollups at its end,
/// in key order (and the denials' after the hours'): two appends at once (the drain's
/// lanes, several instances' drains) lock those rows in the same order, and cannot
/// deadlock. (Inserted over several statements, each locking its own hours, they did:
/// appends were then taken one at a time.)
async fn append_copied(
    pool: &PgPool,
    data: &[u8],
    events: &[AlertEvent],
    skipping: bool,
) -> Result<u64, Attempt> {
    let mut tx = pool.begin_with(crate::db::appends::BEGIN_APPEND).await?;
    let inserted = if skipping {
        for statement in STAGING {
            sqlx::query(statement).execute(&mut *tx).await?;
        }
        copy(&mut tx, "ledger_staging", data).await?;
        sqlx::query(&format!(
            "INSERT INTO ledger_entries ({COLUMNS}) SELECT {COLUMNS} FROM ledger_staging \
             ON CONFLICT DO NOTHING"
        ))
        .execute(&mut *tx)
        .await?
        .rows_affected()
    } else {
        copy(&mut tx, "ledger_entries", data).await?
    };
    for chunk in events.chunks(ROWS_PER_INSERT) {
        SqlLedgerStore::<sqlx::Postgres>::insert_events(&mut tx, chunk).await?;
    }
    tx.commit().await?;
    Ok(inserted)
}

/// Copies `data` into `table`; returns the rows copied.
async fn copy(conn: &mut PgConnection, table: &str, data: &[u8]) -> Result<u64, sqlx::Error> {
    let mut copy = conn
        .copy_in_raw(&format!(
            "COPY {table} ({COLUMNS}) FROM STDIN (FORMAT binary)"
        ))
        .await?;
    copy.send(data).await?;
    copy.finish().await
}

/// Microseconds from the Unix epoch to Postgres's (2000-01-01 UTC).
const POSTGRES_EPOCH_US: i64 = 946_684_800_000_000;

/// `entries` in Postgres's binary copy format, one tuple each with the fields of
/// [`COLUMNS`].
pub(crate) fn encode(entries: &[LedgerEntry]) -> Result<Vec<u8>, LedgerError> {
    let mut out = Vec::with_capacity(64 + entries.len() * 400);
    // The signature, no flags, no header extension.
    out.extend_from_slice(b"PGCOPY\n\xff\r\n\0");
    out.extend_from_slice(&0_i32.to_be_bytes());
    out.extend_from_slice(&0_i32.to_be_bytes());
    for e in entries {
        let id = e.id.to_string();
        let amount = column_amount(&id, e.amount)?;
        let policies = codec::policies_column(&e.policies, &e.subject, &e.attributes);
        let policies = serde_json::to_vec(&policies)
            .map_err(|error| LedgerError::Corrupt(format!("{id}: {error}")))?;
        let attributes = codec::attributes_column(&e.attributes)
            .map(|a| serde_json::to_vec(&a))
            .transpose()
            .map_err(|error| LedgerError::Corrupt(format!("{id}: {error}")))?;
        let totals = codec::totals_column(&e.totals)
            .map(|t| serde_json::to_vec(&t))
            .transpose()
            .map_err(|error| LedgerError::Corrupt(format!("{id}: {error}")))?;
        out.extend_from_slice(&15_i16.to_be_bytes());
        text(&mut out, Some(&id));
        field(&mut out, Some(&micros(e.at).to_be_bytes()));
        text(&mut out, Some(e.kind.as_str()));
        text(&mut out, Some(e.action.as_str()));
        text(&mut out, Some(e.subject.as_str()));
        field(&mut out, Some(&amount.to_be_bytes()));
        text(&mut out, e.consumption_id.map(|c| c.to_string()).as_deref());
        text(&mut out, e.hold_id.map(|h| h.to_string()).as_deref());
        text(
            &mut out,
            e.idempotency_key.as_ref().map(|k| k.to_string()).as_deref(),
        );
        jsonb(&mut out, Some(&policies));
        text(&mut out, codec::encode_detail(e).as_deref());
        jsonb(&mut out, attributes.as_deref());
        jsonb(&mut out, totals.as_deref());
        let folded = super::rows::folded_column(e).map(i64::to_be_bytes);
        field(&mut out, folded.as_ref().map(|b| b.as_slice()));
        text(&mut out, super::rows::folded_ids_column(e).as_deref());
    }
    out.extend_from_slice(&(-1_i16).to_be_bytes());
    Ok(out)
}

/// `at` as a `timestamptz`: microseconds since Postgres's epoch.
fn micros(at: DateTime<Utc>) -> i64 {
    at.timestamp_micros() - POSTGRES_EPOCH_US
}

/// A field: its length and bytes, or -1 for NULL.
fn field(out: &mut Vec<u8>, bytes: Option<&[u8]>) {
    match bytes {
        Some(bytes) => {
            let len = i32::try_from(bytes.len()).unwrap_or(i32::MAX);
            out.extend_from_slice(&len.to_be_bytes());
            out.extend_from_slice(bytes);
        }
        None => out.extend_from_slice(&(-1_i32).to_be_bytes()),
    }
}

fn text(out: &mut Vec<u8>, value: Option<&str>) {
    field(out, value.map(str::as_bytes));
}

/// A `jsonb` field: version 1, then the JSON text.
fn jsonb(out: &mut Vec<u8>, json: Option<&[u8]>) {
    match json {
        Some(json) => {
            let len = i32::try_from(json.len() + 1).unwrap_or(i32::MAX);
            out.extend_from_slice(&len.to_be_bytes());
            out.push(1);
            out.extend_from_slice(json);
        }
        None => out.extend_from_slice(&(-1_i32).to_be_bytes()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamps_count_from_the_postgres_epoch() {
        let epoch = DateTime::parse_from_rfc3339("2000-01-01T00:00:00Z")
            .expect("a time")
            .with_timezone(&Utc);
        assert_eq!(micros(epoch), 0);
        assert_eq!(
            micros(epoch + chrono::Duration::milliseconds(1_500)),
            1_500_000
        );
        assert_eq!(micros(DateTime::UNIX_EPOCH), -POSTGRES_EPOCH_US);
    }

    #[test]
    fn no_entries_is_the_signature_and_the_trailer() {
        let data = encode(&[]).expect("encoding");
        assert_eq!(&data[..11], b"PGCOPY\n\xff\r\n\0");
        assert_eq!(&data[11..19], [0; 8]);
        assert_eq!(&data[19..], [0xff, 0xff]);
    }

    #[test]
    fn fields_carry_their_length_and_null_is_minus_one() {
        let mut out = Vec::new();
        text(&mut out, Some("ab"));
        text(&mut out, None);
        jsonb(&mut out, Some(b"{}"));
        assert_eq!(
            out,
            [0, 0, 0, 2, b'a', b'b', 0xff, 0xff, 0xff, 0xff, 0, 0, 0, 3, 1, b'{', b'}']
        );
    }
}
