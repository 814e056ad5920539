//! The `counter_snapshots` table: the engine's
//! [`SnapshotStore`](crate::engine::recovery::snapshot::SnapshotStore) port over the ledger's
//! database, Postgres or SQLite, written once for both as the ledger is.
//!
//! A snapshot is a few rows, one per encoded part, each repeating the header; saving
//! deletes every older row in the same transaction, so at most one snapshot is kept, and
//! a crash while saving leaves the previous one whole. The checkpoints saved after it that
//! hold only what changed (`counter_snapshot_deltas`) are rows of the same shape, each
//! naming the snapshot it starts from and the checkpoint it follows; a full snapshot
//! deletes them.

use super::sql::{db_error, SqlLedgerStore};
use crate::db::{ColumnType, Sql};
use crate::engine::ledger::LedgerError;
use crate::engine::recovery::snapshot::{SnapshotStore, StoredDelta, StoredSnapshot};
use async_trait::async_trait;
use chrono::{DateTime, Utc};
use sqlx::query::Query;
use sqlx::{ColumnIndex, Database, Encode, Executor, IntoArguments, Row, Type};
use std::sync::Arc;

/// Opens the snapshot table of the database `database_url` names, on a pool of its own
/// (used at start and at shutdown only). Does not migrate.
pub(crate) async fn connect(database_url: &str) -> anyhow::Result<Arc<dyn SnapshotStore>> {
    Ok(match crate::db::open(database_url, 2).await? {
        crate::db::Pool::Postgres(pool) => Arc::new(SqlLedgerStore { pool }),
        crate::db::Pool::Sqlite(pool) => Arc::new(SqlLedgerStore { pool }),
    })
}

/// Inserts one part of a snapshot.
const INSERT: &str = "INSERT INTO counter_snapshots \
     (covered_seq, part, parts, format, covered_id, prefix, taken_at, data) \
     VALUES ($1, $2, $3, $4, $5, $6, $7, $8)";

/// Every part of every snapshot kept, newest snapshot first, each in part order.
const SELECT: &str = "SELECT covered_seq, part, parts, format, covered_id, prefix, taken_at, \
     data FROM counter_snapshots ORDER BY covered_seq DESC, part";

/// Inserts one part of a delta.
const INSERT_DELTA: &str = "INSERT INTO counter_snapshot_deltas \
     (base_seq, after_seq, covered_seq, part, parts, format, covered_id, prefix, taken_at, data) \
     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)";

/// Inserts the first part of a delta only if it follows the newest checkpoint kept: the
/// snapshot covering `$1` is the one kept, and `$2` is the newest checkpoint of its chain.
/// A write first, so that SQLite takes its write lock (waiting for it) before it reads.
const INSERT_DELTA_IF_NEWEST: &str = "INSERT INTO counter_snapshot_deltas \
     (base_seq, after_seq, covered_seq, part, parts, format, covered_id, prefix, taken_at, data) \
     SELECT $1, $2, $3, $4, $5, $6, $7, $8, $9, $10 \
     WHERE (SELECT MAX(covered_seq) FROM counter_snapshots) = $1 \
     AND COALESCE((SELECT MAX(covered_seq) FROM counter_snapshot_deltas WHERE base_seq = $1), $1) = $2";

/// Every part of the deltas of one snapshot (`$1`), in the order they were saved.
const SELECT_DELTAS: &str = "SELECT base_seq, after_seq, covered_seq, part, parts, format, \
     covered_id, prefix, taken_at, data FROM counter_snapshot_deltas WHERE base_seq = $1 \
     ORDER BY covered_seq, part";

/// One row: the snapshot's header and one part.
struct PartRow {
    part: i32,
    parts: i32,
    header: StoredSnapshot,
    data: Vec<u8>,
}

/// Puts rows (newest snapshot first, by part) together into the newest snapshot.
fn assemble(rows: Vec<PartRow>) -> Result<Option<StoredSnapshot>, LedgerError> {
    let mut rows = rows.into_iter();
    let Some(first) = rows.next() else {
        return Ok(None);
    };
    let (parts, mut snapshot) = (first.parts, first.header);
    snapshot.parts.push(first.data);
    let mut expected = 1;
    if first.part != 0 {
        return Err(incomplete(&snapshot));
    }
    for row in rows.take_while(|row| row.header.covered_seq == snapshot.covered_seq) {
        if row.part != expected || row.parts != parts || row.header != snapshot_header(&snapshot) {
            return Err(incomplete(&snapshot));
        }
        snapshot.parts.push(row.data);
        expected += 1;
    }
    if expected != parts {
        return Err(incomplete(&snapshot));
    }
    Ok(Some(snapshot))
}

/// `snapshot` without its parts, to compare headers.
fn snapshot_header(snapshot: &StoredSnapshot) -> StoredSnapshot {
    StoredSnapshot {
        parts: Vec::new(),
        ..snapshot.clone()
    }
}

/// The error of a snapshot whose parts do not add up.
fn incomplete(snapshot: &StoredSnapshot) -> LedgerError {
    LedgerError::Corrupt(format!(
        "the counter snapshot covering seq {} has missing or mismatched parts",
        snapshot.covered_seq
    ))
}

/// One row of [`SELECT`] as a [`PartRow`].
fn part_row<DB>(row: &DB::Row) -> Result<PartRow, LedgerError>
where
    DB: Database,
    for<'q> &'q str: ColumnIndex<DB::Row>,
    i32: ColumnType<DB>,
    i64: ColumnType<DB>,
    String: ColumnType<DB>,
    Option<String>: ColumnType<DB>,
    DateTime<Utc>: ColumnType<DB>,
    Vec<u8>: ColumnType<DB>,
{
    let taken_at: DateTime<Utc> = row.try_get("taken_at").map_err(db_error)?;
    Ok(PartRow {
        part: row.try_get("part").map_err(db_error)?,
        parts: row.try_get("parts").map_err(db_error)?,
        header: StoredSnapshot {
            format: row.try_get("format").map_err(db_error)?,
            covered_seq: row.try_get("covered_seq").map_err(db_error)?,
            covered_id: row.try_get("covered_id").map_err(db_error)?,
            prefix: row.try_get("prefix").map_err(db_error)?,
            taken_at,
            parts: Vec::new(),
        },
        data: row.try_get("data").map_err(db_error)?,
    })
}

/// Binds the columns every part row has, `covered_seq` to `data` in the order [`INSERT`]
/// names them (and [`INSERT_DELTA`] after its two seqs), for part `part` of `parts`.
fn bind_part<'q, DB>(
    query: Query<'q, DB, DB::Arguments<'q>>,
    snapshot: &'q StoredSnapshot,
    (part, parts): (i32, i32),
    data: &'q [u8],
) -> Query<'q, DB, DB::Arguments<'q>>
where
    DB: Database,
    for<'a> &'a str: Encode<'a, DB> + Type<DB>,
    for<'a> Option<&'a str>: Encode<'a, DB>,
    for<'a> &'a [u8]: Encode<'a, DB> + Type<DB>,
    i32: ColumnType<DB>,
    i64: ColumnType<DB>,
    DateTime<Utc>: ColumnType<DB>,
{
    query
        .bind(snapshot.covered_seq)
        .bind(part)
        .bind(parts)
        .bind(snapshot.format)
        .bind(snapshot.covered_id.as_deref())
        .bind(snapshot.prefix.as_str())
        .bind(snapshot.taken_at)
        .bind(data)
}

/// Deletes every snapshot and delta kept, on `tx` (a transaction: saving a snapshot
/// replaces them all at once).
async fn delete_every_snapshot<DB>(tx: &mut DB::Connection) -> Result<(), LedgerError>
where
    DB: Database,
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
    for<'q> DB::Arguments<'q>: IntoArguments<'q, DB>,
{
    for table in ["counter_snapshots", "counter_snapshot_deltas"] {
        sqlx::query(&format!("DELETE FROM {table}"))
            .execute(&mut *tx)
            .await
            .map_err(db_error)?;
    }
    Ok(())
}

/// Puts delta rows (by `covered_seq`, then part) together, up to the first that does not
/// add up.
fn assemble_deltas(rows: Vec<(i64, i64, PartRow)>) -> Vec<StoredDelta> {
    let mut deltas: Vec<StoredDelta> = Vec::new();
    let mut open: Option<(StoredDelta, i32)> = None;
    for (base_seq, after_seq, row) in rows {
        if let Some((delta, parts)) = open.take() {
            if delta.snapshot.covered_seq == row.header.covered_seq {
                let expected = i32::try_from(delta.snapshot.parts.len()).unwrap_or(i32::MAX);
                let same = row.parts == parts
                    && row.part == expected
                    && row.header == snapshot_header(&delta.snapshot)
                    && (base_seq, after_seq) == (delta.base_seq, delta.after_seq);
                if !same {
                    return deltas;
                }
                let mut delta = delta;
                delta.snapshot.parts.push(row.data);
                open = Some((delta, parts));
                continue;
            }
            if delta.snapshot.parts.len() != usize::try_from(parts).unwrap_or(0) {
                return deltas;
            }
            deltas.push(delta);
        }
        if row.part != 0 {
            return deltas;
        }
        let mut snapshot = row.header;
        snapshot.parts.push(row.data);
        let delta = StoredDelta {
            base_seq,
            after_seq,
            snapshot,
        };
        open = Some((delta, row.parts));
    }
    if let Some((delta, parts)) = open {
        if delta.snapshot.parts.len() == usize::try_from(parts).unwrap_or(0) {
            deltas.push(delta);
        }
    }
    deltas
}

#[async_trait]
impl<DB> SnapshotStore for SqlLedgerStore<DB>
where
    DB: Sql,
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
    for<'q> DB::Arguments<'q>: IntoArguments<'q, DB>,
    for<'q> &'q str: Encode<'q, DB> + Type<DB> + ColumnIndex<DB::Row>,
    for<'q> Option<&'q str>: Encode<'q, DB>,
    for<'q> &'q [u8]: Encode<'q, DB> + Type<DB>,
    usize: ColumnIndex<DB::Row>,
    i32: ColumnType<DB>,
    i64: ColumnType<DB>,
    String: ColumnType<DB>,
    Option<i64>: ColumnType<DB>,
    Option<String>: ColumnType<DB>,
    DateTime<Utc>: ColumnType<DB>,
    Vec<u8>: ColumnType<DB>,
{
    async fn save(&self, snapshot: &StoredSnapshot) -> Result<(), LedgerError> {
        let parts = i32::try_from(snapshot.parts.len())
            .map_err(|_| LedgerError::Corrupt("a snapshot of too many parts".into()))?;
        let mut tx = self.pool.begin().await.map_err(db_error)?;
        delete_every_snapshot::<DB>(&mut tx).await?;
        for (part, data) in (0..parts).zip(&snapshot.parts) {
            bind_part(sqlx::query(INSERT), snapshot, (part, parts), data)
                .execute(&mut *tx)
                .await
                .map_err(db_error)?;
        }
        tx.commit().await.map_err(db_error)
    }

    async fn save_delta(&self, delta: &StoredDelta) -> Result<bool, LedgerError> {
        let snapshot = &delta.snapshot;
        let parts = i32::try_from(snapshot.parts.len())
            .map_err(|_| LedgerError::Corrupt("a delta of too many parts".into()))?;
        let mut tx = self.pool.begin().await.map_err(db_error)?;
        for (part, data) in (0..parts).zip(&snapshot.parts) {
            let insert = match part {
                0 => INSERT_DELTA_IF_NEWEST,
                _ => INSERT_DELTA,
            };
            let query = sqlx::query(insert)
                .bind(delta.base_seq)
                .bind(delta.after_seq);
            let inserted = bind_part(query, snapshot, (part, parts), data)
                .execute(&mut *tx)
                .await
                .map_err(db_error)?;
            // Not after the newest checkpoint: nothing saved (the transaction rolls back).
            if DB::rows_affected(&inserted) == 0 {
                return Ok(false);
            }
        }
        tx.commit().await.map_err(db_error)?;
        Ok(true)
    }

    async fn deltas(&self, base_seq: i64) -> Result<Vec<StoredDelta>, LedgerError> {
        let rows = sqlx::query(SELECT_DELTAS)
            .bind(base_seq)
            .fetch_all(&self.pool)
            .await
            .map_err(db_error)?;
        let rows = rows
            .iter()
            .map(|row| {
                Ok((
                    row.try_get("base_seq").map_err(db_error)?,
                    row.try_get("after_seq").map_err(db_error)?,
                    part_row::<DB>(row)?,
                ))
            })
            .collect::<Result<Vec<_>, LedgerError>>()?;
        Ok(assemble_deltas(rows))
    }

    async fn latest(&self) -> Result<Option<StoredSnapshot>, LedgerError> {
        let rows = sqlx::query(SELECT)
            .fetch_all(&self.pool)
            .await
            .map_err(db_error)?;
        assemble(rows.iter().map(part_row::<DB>).collect::<Result<_, _>>()?)
    }

    async fn latest_covered(&self) -> Result<Option<i64>, LedgerError> {
        let base: Option<i64> =
            sqlx::query_scalar("SELECT MAX(covered_seq) FROM counter_snapshots")
                .fetch_one(&self.pool)
                .await
                .map_err(db_error)?;
        let Some(base) = base else {
            return Ok(None);
        };
        let head: Option<i64> = sqlx::query_scalar(
            "SELECT MAX(covered_seq) FROM counter_snapshot_deltas WHERE base_seq = $1",
        )
        .bind(base)
        .fetch_one(&self.pool)
        .await
        .map_err(db_error)?;
        Ok(Some(head.unwrap_or(base).max(base)))
    }

    async fn delete_all(&self) -> Result<(), LedgerError> {
        let mut tx = self.pool.begin().await.map_err(db_error)?;
        delete_every_snapshot::<DB>(&mut tx).await?;
        tx.commit().await.map_err(db_error)
    }

    async fn last_entry(&self) -> Result<Option<(i64, String)>, LedgerError> {
        let row = sqlx::query("SELECT seq, id FROM ledger_entries ORDER BY seq DESC LIMIT 1")
            .fetch_optional(&self.pool)
            .await
            .map_err(db_error)?;
        row.map(|row| {
            Ok((
                row.try_get("seq").map_err(db_error)?,
                row.try_get("id").map_err(db_error)?,
            ))
        })
        .transpose()
    }

    async fn entry_id_at(&self, seq: i64) -> Result<Option<String>, LedgerError> {
        sqlx::query_scalar("SELECT id FROM ledger_entries WHERE seq = $1")
            .bind(seq)
            .fetch_optional(&self.pool)
            .await
            .map_err(db_error)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn snapshot(covered_seq: i64, parts: &[&[u8]]) -> StoredSnapshot {
        StoredSnapshot {
            format: 1,
            covered_seq,
            covered_id: Some(format!("entry-{covered_seq}")),
            prefix: "ql".to_owned(),
            taken_at: DateTime::from_timestamp_millis(1_800_000_000_123).expect("in range"),
            parts: parts.iter().map(|p| p.to_vec()).collect(),
        }
    }

    fn delta(base_seq: i64, after_seq: i64, covered_seq: i64, parts: &[&[u8]]) -> StoredDelta {
        StoredDelta {
            base_seq,
            after_seq,
            snapshot: snapshot(covered_seq, parts),
        }
    }

    /// A store on a new, migrated SQLite file named after `what`: the file, its URL, the store.
    async fn new_store(what: &str) -> (std::path::PathBuf, String, Arc<dyn SnapshotStore>) {
        let file = std::env::temp_dir().join(format!(
            "quota-ledger-{what}-{}.db",
            uuid::Uuid::new_v4().simple()
        ));
        let url = format!("sqlite://{}", file.display());
        crate::db::migrate_url(&url).await.expect("migrating");
        let store = connect(&url).await.expect("opening");
        (file, url, store)
    }

    #[tokio::test]
    async fn deltas_follow_the_newest_checkpoint_only_and_a_full_snapshot_drops_them() {
        let (file, _, store) = new_store("deltas").await;
        assert!(
            !store
                .save_delta(&delta(9, 9, 12, &[b"d"]))
                .await
                .expect("answers"),
            "no snapshot to follow"
        );
        store.save(&snapshot(9, &[b"full"])).await.expect("saves");
        let first = delta(9, 9, 12, &[b"one", b"two"]);
        assert!(store.save_delta(&first).await.expect("saves"));
        assert!(
            !store
                .save_delta(&delta(9, 9, 14, &[b"fork"]))
                .await
                .expect("answers"),
            "12 is the newest: a delta after 9 is refused"
        );
        assert!(
            !store
                .save_delta(&delta(8, 12, 14, &[b"x"]))
                .await
                .expect("answers"),
            "not the kept snapshot's chain"
        );
        let second = delta(9, 12, 15, &[b"three"]);
        assert!(store.save_delta(&second).await.expect("saves"));
        assert_eq!(store.deltas(9).await.expect("reads"), vec![first, second]);
        assert_eq!(store.latest_covered().await.expect("reads"), Some(15));
        assert_eq!(
            store.latest().await.expect("reads"),
            Some(snapshot(9, &[b"full"]))
        );

        store.save(&snapshot(20, &[b"again"])).await.expect("saves");
        assert_eq!(store.deltas(9).await.expect("reads"), vec![]);
        assert_eq!(store.latest_covered().await.expect("reads"), Some(20));
        assert!(store
            .save_delta(&delta(20, 20, 21, &[b"d"]))
            .await
            .expect("saves"));
        store.delete_all().await.expect("deletes");
        assert_eq!(store.deltas(20).await.expect("reads"), vec![]);
        assert_eq!(store.latest_covered().await.expect("reads"), None);
        let _ = std::fs::remove_file(&file);
    }

    #[test]
    fn deltas_are_read_up_to_the_first_whose_parts_do_not_add_up() {
        let row = |covered_seq: i64, part: i32, parts: i32| {
            let header = snapshot(covered_seq, &[]);
            (
                1,
                covered_seq - 1,
                PartRow {
                    part,
                    parts,
                    header,
                    data: vec![u8::try_from(part).expect("a small part number")],
                },
            )
        };
        let whole = assemble_deltas(vec![row(2, 0, 2), row(2, 1, 2), row(3, 0, 1)]);
        assert_eq!(whole.len(), 2);
        assert_eq!(whole[0].snapshot.parts, vec![vec![0], vec![1]]);
        let torn = assemble_deltas(vec![row(2, 0, 2), row(3, 0, 1)]);
        assert_eq!(
            torn,
            vec![],
            "the first lacks a part: nothing after it either"
        );
        let tail = assemble_deltas(vec![row(2, 0, 1), row(3, 0, 2)]);
        assert_eq!(tail.len(), 1, "the last lacks a part");
    }

    #[tokio::test]
    async fn the_newest_snapshot_replaces_the_others_and_comes_back_whole() {
        let (file, url, store) = new_store("snapshot").await;
        assert_eq!(store.latest().await.expect("reads"), None);
        assert_eq!(store.last_entry().await.expect("reads"), None);

        store
            .save(&snapshot(9, &[b"one", b"two", b""]))
            .await
            .expect("saves");
        let newest = snapshot(12, &[b"three", b"four"]);
        store.save(&newest).await.expect("saves");
        assert_eq!(store.latest().await.expect("reads"), Some(newest));
        assert_eq!(store.latest_covered().await.expect("reads"), Some(12));

        let crate::db::Pool::Sqlite(pool) = crate::db::open(&url, 1).await.expect("opening") else {
            panic!("a SQLite URL opens a SQLite pool");
        };
        let deleted = sqlx::query("DELETE FROM counter_snapshots WHERE part = 0")
            .execute(&pool)
            .await
            .expect("deleting");
        assert_eq!(deleted.rows_affected(), 1, "only the newest is kept");
        let read = store.latest().await;
        assert!(matches!(read, Err(LedgerError::Corrupt(_))), "{read:?}");
        store.delete_all().await.expect("deletes");
        assert_eq!(store.latest().await.expect("reads"), None);
        pool.close().await;
        let _ = std::fs::remove_file(&file);
    }
}
