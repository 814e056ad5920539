//! The webhook tables (`webhooks`, `webhook_deliveries`) on Postgres or SQLite: each query
//! is written once, and [`on_pool!`] types it against the pool at hand.

use crate::db::{ColumnType, Pool};
use chrono::{DateTime, Utc};

/// Runs `$body` with `$p` bound to whichever pool `$pool` is (the body is checked for
/// each kind of database).
macro_rules! on_pool {
    ($pool:expr, $p:ident => $body:expr) => {
        match $pool {
            Pool::Postgres($p) => $body,
            Pool::Sqlite($p) => $body,
        }
    };
}

/// One attempt of a delivery, as [`WebhookStore::attempted`] records it.
pub(crate) struct Attempted<'a> {
    pub(crate) delivery: &'a Delivery,
    /// The endpoint's HTTP status, if it answered.
    pub(crate) status: Option<i64>,
    /// Why it failed, if it did.
    pub(crate) error: Option<String>,
    /// When it is due again (`None`: delivered).
    pub(crate) next: Option<DateTime<Utc>>,
}

/// A failed query: the database is down or refused it.
#[derive(Debug, thiserror::Error)]
#[error("the webhook tables: {0}")]
pub(crate) struct StoreError(#[from] sqlx::Error);

impl StoreError {
    /// Whether the row to insert exists already.
    pub(crate) fn is_conflict(&self) -> bool {
        matches!(&self.0, sqlx::Error::Database(e) if e.is_unique_violation())
    }
}

type Result<T> = std::result::Result<T, StoreError>;

/// An endpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Webhook {
    pub(crate) id: String,
    pub(crate) url: String,
    pub(crate) secret: String,
    pub(crate) previous_secret: Option<String>,
    pub(crate) previous_until: Option<DateTime<Utc>>,
    /// Event types it receives; empty, all.
    pub(crate) events: Vec<String>,
    /// Action globs it receives events of; empty, all.
    pub(crate) actions: Vec<String>,
    pub(crate) enabled: bool,
    pub(crate) failing_since: Option<DateTime<Utc>>,
    pub(crate) disabled_at: Option<DateTime<Utc>>,
    pub(crate) created_at: DateTime<Utc>,
    pub(crate) updated_at: DateTime<Utc>,
}

impl Webhook {
    /// The secrets that sign a delivery at `now`: the current one, and the previous one
    /// while its grace lasts.
    pub(crate) fn signing_secrets(&self, now: DateTime<Utc>) -> Vec<&str> {
        let mut secrets = vec![self.secret.as_str()];
        if let (Some(previous), Some(until)) = (&self.previous_secret, self.previous_until) {
            if now < until {
                secrets.push(previous);
            }
        }
        secrets
    }

    /// Whether it receives an event of `event_type` about `action`.
    pub(crate) fn wants(&self, event_type: &str, action: &str) -> bool {
        let typed = self.events.is_empty() || self.events.iter().any(|e| e == event_type);
        let acted = self.actions.is_empty()
            || self.actions.iter().any(|glob| {
                crate::domain::ActionGlob::parse("actions", glob).is_ok_and(|g| g.matches(action))
            });
        typed && acted
    }
}

type WebhookRow = (
    String,
    String,
    String,
    Option<String>,
    Option<DateTime<Utc>>,
    String,
    String,
    bool,
    Option<DateTime<Utc>>,
    Option<DateTime<Utc>>,
    DateTime<Utc>,
    DateTime<Utc>,
);

const WEBHOOK_COLUMNS: &str = "id, url, secret, previous_secret, previous_until, events, \
     actions, enabled, failing_since, disabled_at, created_at, updated_at";

fn split(list: &str) -> Vec<String> {
    list.split(',')
        .filter(|s| !s.is_empty())
        .map(str::to_owned)
        .collect()
}

fn webhook_of(row: WebhookRow) -> Webhook {
    let (
        id,
        url,
        secret,
        previous_secret,
        previous_until,
        events,
        actions,
        enabled,
        failing_since,
        disabled_at,
        created_at,
        updated_at,
    ) = row;
    Webhook {
        id,
        url,
        secret,
        previous_secret,
        previous_until,
        events: split(&events),
        actions: split(&actions),
        enabled,
        failing_since,
        disabled_at,
        created_at,
        updated_at,
    }
}

/// One delivery as its log shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Delivery {
    pub(crate) webhook_id: String,
    pub(crate) event_id: String,
    pub(crate) event_type: String,
    pub(crate) payload: String,
    pub(crate) state: String,
    pub(crate) attempts: i64,
    pub(crate) next_attempt_at: DateTime<Utc>,
    pub(crate) last_status: Option<i64>,
    pub(crate) last_error: Option<String>,
    pub(crate) created_at: DateTime<Utc>,
    pub(crate) delivered_at: Option<DateTime<Utc>>,
}

const DELIVERY_COLUMNS: &str = "webhook_id, event_id, event_type, payload, state, attempts, \
     next_attempt_at, last_status, last_error, created_at, delivered_at";

impl<'r, R> sqlx::FromRow<'r, R> for Delivery
where
    R: sqlx::Row,
    &'r str: sqlx::ColumnIndex<R>,
    i64: ColumnType<R::Database>,
    String: ColumnType<R::Database>,
    DateTime<Utc>: ColumnType<R::Database>,
    Option<i64>: ColumnType<R::Database>,
    Option<String>: ColumnType<R::Database>,
    Option<DateTime<Utc>>: ColumnType<R::Database>,
{
    /// A row of [`DELIVERY_COLUMNS`], read by name.
    fn from_row(row: &'r R) -> sqlx::Result<Self> {
        Ok(Self {
            webhook_id: row.try_get("webhook_id")?,
            event_id: row.try_get("event_id")?,
            event_type: row.try_get("event_type")?,
            payload: row.try_get("payload")?,
            state: row.try_get("state")?,
            attempts: row.try_get("attempts")?,
            next_attempt_at: row.try_get("next_attempt_at")?,
            last_status: row.try_get("last_status")?,
            last_error: row.try_get("last_error")?,
            created_at: row.try_get("created_at")?,
            delivered_at: row.try_get("delivered_at")?,
        })
    }
}

/// An alert event waiting in the outbox.
type EventRow = (i64, String, String, String);

/// The webhook tables.
#[derive(Debug, Clone)]
pub(crate) struct WebhookStore {
    pool: Pool,
}

impl WebhookStore {
    pub(crate) fn new(pool: Pool) -> Self {
        Self { pool }
    }

    /// The `seq` of the outbox up to which every event is settled: committed, or never to
    /// be. Appends run several at a time and may commit out of `seq` order (see
    /// `db::appends`); on SQLite, one writer at a time. 0 for none.
    pub(crate) async fn settled_event_seq(&self) -> Result<i64> {
        let seq = match &self.pool {
            Pool::Postgres(p) => {
                crate::db::appends::settled_seq(p, crate::db::appends::Followed::Events).await?
            }
            Pool::Sqlite(p) => {
                sqlx::query_scalar("SELECT MAX(seq) FROM alert_events")
                    .fetch_one(p)
                    .await?
            }
        };
        Ok(seq.unwrap_or(0))
    }

    /// Creates `w`; its cursor starts after the newest settled event (it receives what
    /// comes next).
    pub(crate) async fn insert(&self, w: &Webhook) -> Result<()> {
        let cursor = self.settled_event_seq().await?;
        on_pool!(&self.pool, p => {
            sqlx::query(&format!(
                "INSERT INTO webhooks ({WEBHOOK_COLUMNS}, cursor_seq) VALUES ($1, $2, $3, $4, \
                 $5, $6, $7, $8, $9, $10, $11, $12, $13)"
            ))
            .bind(&w.id).bind(&w.url).bind(&w.secret).bind(&w.previous_secret)
            .bind(w.previous_until).bind(w.events.join(",")).bind(w.actions.join(","))
            .bind(w.enabled).bind(w.failing_since).bind(w.disabled_at)
            .bind(w.created_at).bind(w.updated_at).bind(cursor)
            .execute(p).await?;
        });
        Ok(())
    }

    /// Every endpoint, by id.
    pub(crate) async fn list(&self) -> Result<Vec<Webhook>> {
        let sql = format!("SELECT {WEBHOOK_COLUMNS} FROM webhooks ORDER BY id");
        let rows: Vec<WebhookRow> =
            on_pool!(&self.pool, p => sqlx::query_as(&sql).fetch_all(p).await?);
        Ok(rows.into_iter().map(webhook_of).collect())
    }

    /// One endpoint.
    pub(crate) async fn get(&self, id: &str) -> Result<Option<Webhook>> {
        let sql = format!("SELECT {WEBHOOK_COLUMNS} FROM webhooks WHERE id = $1");
        let row: Option<WebhookRow> = on_pool!(&self.pool, p => {
            sqlx::query_as(&sql).bind(id).fetch_optional(p).await?
        });
        Ok(row.map(webhook_of))
    }

    /// Writes `w`'s changeable fields (URL, filters, enabled, secrets, failure state);
    /// false if there is no such endpoint.
    pub(crate) async fn update(&self, w: &Webhook) -> Result<bool> {
        let done = on_pool!(&self.pool, p => {
            sqlx::query(
                "UPDATE webhooks SET url = $2, secret = $3, previous_secret = $4, \
                 previous_until = $5, events = $6, actions = $7, enabled = $8, \
                 failing_since = $9, disabled_at = $10, updated_at = $11 WHERE id = $1",
            )
            .bind(&w.id).bind(&w.url).bind(&w.secret).bind(&w.previous_secret)
            .bind(w.previous_until).bind(w.events.join(",")).bind(w.actions.join(","))
            .bind(w.enabled).bind(w.failing_since).bind(w.disabled_at).bind(w.updated_at)
            .execute(p).await?.rows_affected()
        });
        Ok(done == 1)
    }

    /// Deletes an endpoint and its deliveries; false if there was none.
    pub(crate) async fn delete(&self, id: &str) -> Result<bool> {
        let done = on_pool!(&self.pool, p => {
            let mut tx = p.begin().await?;
            sqlx::query("DELETE FROM webhook_deliveries WHERE webhook_id = $1")
                .bind(id).execute(&mut *tx).await?;
            let done = sqlx::query("DELETE FROM webhooks WHERE id = $1")
                .bind(id).execute(&mut *tx).await?.rows_affected();
            tx.commit().await?;
            done
        });
        Ok(done == 1)
    }

    /// Up to `limit` events after `w`'s cursor, and up to the settled `upto`
    /// ([`Self::settled_event_seq`]: an event with a lower `seq` may commit after one with
    /// a higher, and a cursor moved past it would never deliver it), become its deliveries
    /// (those it wants), due at `now`, and its cursor moves past them; a cursor that moved
    /// meanwhile (another dispatcher) leaves everything as it was. How many events it
    /// looked at.
    pub(crate) async fn fan_out(
        &self,
        w: &Webhook,
        now: DateTime<Utc>,
        limit: i64,
        upto: i64,
    ) -> Result<usize> {
        on_pool!(&self.pool, p => {
            let mut tx = p.begin().await?;
            let (cursor,): (i64,) = sqlx::query_as("SELECT cursor_seq FROM webhooks WHERE id = $1")
                .bind(&w.id).fetch_one(&mut *tx).await?;
            let events: Vec<EventRow> = sqlx::query_as(
                "SELECT seq, id, event_type, CAST(payload AS TEXT) FROM alert_events \
                 WHERE seq > $1 AND seq <= $3 ORDER BY seq LIMIT $2",
            )
            .bind(cursor).bind(limit).bind(upto).fetch_all(&mut *tx).await?;
            let Some(&(last, ..)) = events.last() else {
                return Ok(0);
            };
            for (seq, id, event_type, payload) in &events {
                let action = serde_json::from_str::<serde_json::Value>(payload)
                    .ok()
                    .and_then(|v| v["action"].as_str().map(str::to_owned))
                    .unwrap_or_default();
                if !w.wants(event_type, &action) {
                    continue;
                }
                sqlx::query(&format!(
                    "INSERT INTO webhook_deliveries ({DELIVERY_COLUMNS}, event_seq) \
                     VALUES ($1, $2, $3, $4, 'pending', 0, $5, NULL, NULL, $5, NULL, $6) \
                     ON CONFLICT (webhook_id, event_id) DO NOTHING"
                ))
                .bind(&w.id).bind(id).bind(event_type).bind(payload).bind(now).bind(*seq)
                .execute(&mut *tx).await?;
            }
            let moved = sqlx::query("UPDATE webhooks SET cursor_seq = $2 WHERE id = $1 AND cursor_seq = $3")
                .bind(&w.id).bind(last).bind(cursor).execute(&mut *tx).await?.rows_affected();
            if moved == 1 {
                tx.commit().await?;
            }
            Ok(events.len())
        })
    }

    /// A delivery of `event` to `webhook_id` alone, due now (a test event).
    pub(crate) async fn enqueue(
        &self,
        webhook_id: &str,
        event_id: &str,
        event_type: &str,
        payload: &str,
        now: DateTime<Utc>,
    ) -> Result<()> {
        on_pool!(&self.pool, p => {
            sqlx::query(&format!(
                "INSERT INTO webhook_deliveries ({DELIVERY_COLUMNS}, event_seq) \
                 VALUES ($1, $2, $3, $4, 'pending', 0, $5, NULL, NULL, $5, NULL, 0)"
            ))
            .bind(webhook_id).bind(event_id).bind(event_type).bind(payload).bind(now)
            .execute(p).await?;
        });
        Ok(())
    }

    /// Claims up to `limit` deliveries of `webhook_id` due at `now`: each is due again
    /// only at `until` (past the attempt's timeout), so no other dispatcher attempts it
    /// meanwhile. The deliveries claimed, oldest event first.
    pub(crate) async fn claim(
        &self,
        webhook_id: &str,
        now: DateTime<Utc>,
        until: DateTime<Utc>,
        limit: i64,
    ) -> Result<Vec<Delivery>> {
        let sql = format!(
            "UPDATE webhook_deliveries SET next_attempt_at = $3 \
             WHERE webhook_id = $1 AND state = 'pending' AND next_attempt_at <= $2 \
             AND event_id IN (SELECT event_id FROM webhook_deliveries WHERE webhook_id = $1 \
             AND state = 'pending' AND next_attempt_at <= $2 \
             ORDER BY event_seq, created_at LIMIT $4) \
             RETURNING {DELIVERY_COLUMNS}"
        );
        let mut claimed: Vec<Delivery> = on_pool!(&self.pool, p => {
            sqlx::query_as(&sql).bind(webhook_id).bind(now).bind(until).bind(limit)
                .fetch_all(p).await?
        });
        claimed.sort_by_key(|d| d.created_at);
        Ok(claimed)
    }

    /// Records a batch of attempts made at `now`, in one transaction (one write of the
    /// database for the batch, beside the ledger's): each delivered (its `next` `None`),
    /// or failed and due again at `next`; and the deliveries claimed but not attempted
    /// (`released`), due again at `now`.
    pub(crate) async fn attempted(
        &self,
        attempts: &[Attempted<'_>],
        released: &[Delivery],
        now: DateTime<Utc>,
    ) -> Result<()> {
        const RELEASE: &str = "UPDATE webhook_deliveries SET next_attempt_at = $3 \
             WHERE webhook_id = $1 AND event_id = $2";
        const SQL: &str = "UPDATE webhook_deliveries SET state = $3, attempts = attempts + 1, \
             next_attempt_at = $4, last_status = $5, last_error = $6, delivered_at = $7 \
             WHERE webhook_id = $1 AND event_id = $2";
        on_pool!(&self.pool, p => {
            let mut tx = p.begin().await?;
            for a in attempts {
                let (state, next_at, delivered_at) = match a.next {
                    None => ("delivered", now, Some(now)),
                    Some(at) => ("pending", at, None),
                };
                sqlx::query(SQL)
                    .bind(&a.delivery.webhook_id).bind(&a.delivery.event_id).bind(state)
                    .bind(next_at).bind(a.status).bind(a.error.as_deref()).bind(delivered_at)
                    .execute(&mut *tx).await?;
            }
            for d in released {
                sqlx::query(RELEASE).bind(&d.webhook_id).bind(&d.event_id).bind(now)
                    .execute(&mut *tx).await?;
            }
            tx.commit().await?;
        });
        Ok(())
    }

    /// The newest `limit` deliveries of `webhook_id`.
    pub(crate) async fn deliveries(&self, webhook_id: &str, limit: i64) -> Result<Vec<Delivery>> {
        let sql = format!(
            "SELECT {DELIVERY_COLUMNS} FROM webhook_deliveries WHERE webhook_id = $1 \
             ORDER BY created_at DESC, event_seq DESC LIMIT $2"
        );
        Ok(on_pool!(&self.pool, p => {
            sqlx::query_as(&sql).bind(webhook_id).bind(limit).fetch_all(p).await?
        }))
    }

    /// Forgets deliveries made before `before`.
    pub(crate) async fn forget_delivered(&self, before: DateTime<Utc>) -> Result<u64> {
        Ok(on_pool!(&self.pool, p => {
            sqlx::query("DELETE FROM webhook_deliveries WHERE state = 'delivered' AND delivered_at < $1")
                .bind(before).execute(p).await?.rows_affected()
        }))
    }

    /// The events ever written (the outbox's highest `seq`), its depth (events not yet
    /// fanned out to some enabled endpoint) and the time of the oldest delivery pending.
    pub(crate) async fn backlog(&self) -> Result<(i64, i64, Option<DateTime<Utc>>)> {
        on_pool!(&self.pool, p => {
            let (emitted,): (i64,) = sqlx::query_as("SELECT COALESCE(MAX(seq), 0) FROM alert_events")
                .fetch_one(p).await?;
            let (depth,): (i64,) = sqlx::query_as(
                "SELECT COUNT(*) FROM alert_events WHERE seq > \
                 (SELECT COALESCE(MIN(cursor_seq), (SELECT COALESCE(MAX(seq), 0) FROM alert_events)) \
                  FROM webhooks WHERE enabled)",
            ).fetch_one(p).await?;
            let (oldest,): (Option<DateTime<Utc>>,) = sqlx::query_as(
                "SELECT MIN(created_at) FROM webhook_deliveries WHERE state = 'pending'",
            ).fetch_one(p).await?;
            Ok((emitted, depth, oldest))
        })
    }
}
