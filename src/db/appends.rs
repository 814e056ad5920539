//! The appends' lock (Postgres): every transaction that appends to `ledger_entries` or
//! `alert_events` holds an advisory lock, shared, until it commits, and a reader that
//! follows one of those tables by `seq` takes it alone for a moment to learn the `seq` up
//! to which every row is settled.
//!
//! Appends run several at a time (the drain's two lanes, several instances), and take
//! their `seq`s as their rows go in: one may commit higher numbers before another commits
//! lower ones. A reader that moved past a `seq` not yet visible would never read its row.
//! SQLite has one writer at a time, and needs none of this.

use sqlx::PgPool;

/// The advisory lock ("qlappend" in ASCII).
pub(crate) const APPENDS: i64 = 0x716c_6170_7065_6e64;

/// An append's transaction begins with its share of [`APPENDS`], in the same round trip.
pub(crate) const BEGIN_APPEND: &str =
    "BEGIN; SELECT pg_advisory_xact_lock_shared(8173014559320534628)";

/// How long [`settled_seq`] waits for the appends in flight: far longer than one takes.
const SETTLE_WAIT: &str = "SET LOCAL lock_timeout = '10s'";

/// A table that appends write and readers follow by `seq`.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Followed {
    /// `ledger_entries`.
    Entries,
    /// `alert_events`, the outbox.
    Events,
}

/// The highest `seq` of `table` up to which every row is settled: committed, or never to
/// be. A reader that follows `table` by `seq` (a verify, a checkpoint, the webhooks'
/// dispatcher) reads up to this number only. It waits (at most 10 s) until no append is
/// in flight, and takes the highest `seq` then, which any later append exceeds.
pub(crate) async fn settled_seq(
    pool: &PgPool,
    table: Followed,
) -> Result<Option<i64>, sqlx::Error> {
    let mut tx = pool.begin().await?;
    sqlx::query(SETTLE_WAIT).execute(&mut *tx).await?;
    sqlx::query("SELECT pg_advisory_xact_lock($1)")
        .bind(APPENDS)
        .execute(&mut *tx)
        .await?;
    let seq: Option<i64> = sqlx::query_scalar(match table {
        Followed::Entries => "SELECT max(seq) FROM ledger_entries",
        Followed::Events => "SELECT max(seq) FROM alert_events",
    })
    .fetch_one(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(seq)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_append_begins_with_its_share_of_the_appends_lock() {
        assert!(BEGIN_APPEND.ends_with(&format!("({APPENDS})")));
    }
}
