//! [`AdminStore`] for every backend: the operator's queries, composed from
//! the dialect's [`AdminSql`](crate::sql::AdminSql) pieces.

use super::{ActionStore, AdminStore, persist, sql_of_pool};
use crate::admin::{OutboxMessage, RequeueTarget};
use crate::sql::{OpsSql, marks};
use idem_core::{Backend, Dialect};
use sqlx::{Database, Pool};

/// Ids per `UPDATE … WHERE id IN (…)` statement.
const CHUNK: usize = 500;

type MessageRow = (i64, String, String, String, i32, Option<String>, String);

/// A text column as the operator's reads select it. SQLite stores
/// whatever bytes it is given in a text column (a BLOB, or text that is no
/// UTF-8), which no `String` decodes: there the column is read as the hex
/// of its bytes (always ASCII) and [`lossy`] turns it back, lossily.
/// PostgreSQL and MariaDB hold valid UTF-8 only: the column as it is.
pub(super) fn text_column(d: Dialect, column: &str) -> String {
    match d {
        Dialect::Sqlite => format!("hex({column})"),
        Dialect::Postgres | Dialect::MySql => column.to_string(),
    }
}

/// [`text_column`] of a nullable column: NULL stays NULL (SQLite's
/// `hex(NULL)` is the empty string, which would read as `Some("")`).
pub(super) fn opt_text_column(d: Dialect, column: &str) -> String {
    match d {
        Dialect::Sqlite => format!("CASE WHEN {column} IS NULL THEN NULL ELSE hex({column}) END"),
        Dialect::Postgres | Dialect::MySql => column.to_string(),
    }
}

/// A value of a [`text_column`]: on SQLite its bytes, decoded with
/// U+FFFD for what is no UTF-8.
pub(super) fn lossy(d: Dialect, value: String) -> String {
    match d {
        Dialect::Sqlite => {
            let bytes: Vec<u8> = value
                .as_bytes()
                .chunks(2)
                .filter_map(|h| u8::from_str_radix(std::str::from_utf8(h).ok()?, 16).ok())
                .collect();
            String::from_utf8_lossy(&bytes).into_owned()
        }
        Dialect::Postgres | Dialect::MySql => value,
    }
}

fn message(
    d: Dialect,
    (id, topic, msg_id, status, attempts, last_error, updated_at): MessageRow,
) -> Result<OutboxMessage, sqlx::Error> {
    Ok(OutboxMessage {
        id,
        topic: lossy(d, topic),
        msg_id: lossy(d, msg_id),
        status,
        attempts: i64::from(attempts),
        last_error: last_error.map(|e| lossy(d, e)),
        updated_at: crate::timestamp::parse(&updated_at)?,
    })
}

/// The columns of an [`OutboxMessage`] (decoded by [`message`]).
fn message_columns(d: Dialect, sql: &OpsSql) -> String {
    format!(
        "id, {}, {}, status, attempts, {}, {}",
        text_column(d, "topic"),
        text_column(d, "msg_id"),
        opt_text_column(d, "last_error"),
        (sql.admin.ts_text)("updated_at")
    )
}

/// `(topic, status, count)` rows with their topic decoded.
fn topic_counts(d: Dialect, rows: Vec<(String, String, i64)>) -> Vec<(String, String, i64)> {
    rows.into_iter()
        .map(|(t, status, n)| (lossy(d, t), status, n))
        .collect()
}

/// The condition selecting `target`'s messages (binds: [`target_binds`]).
fn target_filter(target: &RequeueTarget) -> String {
    match target {
        RequeueTarget::Id(_) => " AND id = ?".to_string(),
        RequeueTarget::Topic(_) => " AND topic = ?".to_string(),
        RequeueTarget::AllFailed => String::new(),
        // No ids select nothing.
        RequeueTarget::Ids(ids) if ids.is_empty() => " AND 1 = 0".to_string(),
        RequeueTarget::Ids(ids) => format!(" AND id IN ({})", marks(ids.len())),
    }
}

/// The values [`target_filter`]'s condition binds, in order: ids as
/// numbers, a topic as text.
enum TargetBind<'a> {
    Id(i64),
    Topic(&'a str),
}

fn target_binds(target: &RequeueTarget) -> Vec<TargetBind<'_>> {
    match target {
        RequeueTarget::Id(id) => vec![TargetBind::Id(*id)],
        RequeueTarget::Topic(t) => vec![TargetBind::Topic(t)],
        RequeueTarget::AllFailed => Vec::new(),
        RequeueTarget::Ids(ids) => ids.iter().map(|id| TargetBind::Id(*id)).collect(),
    }
}

for_every_backend! {
impl AdminStore for DB {
    async fn outbox_counts<'a>(
        pool: &'a Pool<Self>,
        topic: Option<&'a str>,
    ) -> Result<Vec<(String, String, i64)>, sqlx::Error> {
        let d = DB::pool_dialect(pool);
        let filter = if topic.is_some() { " WHERE topic = ?" } else { "" };
        let text = sql_of_pool(pool).render(&format!(
            "SELECT {}, status, COUNT(*) FROM idem_outbox{filter} GROUP BY topic, status",
            text_column(d, "topic")
        ));
        let mut q = sqlx::query_as(sqlx::AssertSqlSafe(text)).persistent(persist());
        if let Some(t) = topic {
            q = q.bind(t);
        }
        Ok(topic_counts(d, on_pool!(pool, |conn| q.fetch_all(conn))?))
    }

    async fn outbox_open_counts<'a>(
        pool: &'a Pool<Self>,
        topic: Option<&'a str>,
    ) -> Result<Vec<(String, String, i64)>, sqlx::Error> {
        // `status` leads idx_idem_outbox_due: only the open rows are read.
        let d = DB::pool_dialect(pool);
        let and = if topic.is_some() { " AND topic = ?" } else { "" };
        let text = sql_of_pool(pool).render(&format!(
            "SELECT {}, status, COUNT(*) FROM idem_outbox \
             WHERE status IN ('pending', 'failed'){and} GROUP BY topic, status",
            text_column(d, "topic")
        ));
        let mut q = sqlx::query_as(sqlx::AssertSqlSafe(text)).persistent(persist());
        if let Some(t) = topic {
            q = q.bind(t);
        }
        Ok(topic_counts(d, on_pool!(pool, |conn| q.fetch_all(conn))?))
    }

    async fn outbox_pending_age<'a>(
        pool: &'a Pool<Self>,
        topic: Option<&'a str>,
    ) -> Result<Vec<(String, Option<f64>)>, sqlx::Error> {
        let sql = sql_of_pool(pool);
        let d = DB::pool_dialect(pool);
        let and = if topic.is_some() { " AND topic = ?" } else { "" };
        let text = sql.render(&format!(
            "SELECT {}, {} FROM idem_outbox WHERE status = 'pending'{and} GROUP BY topic",
            text_column(d, "topic"),
            sql.admin.pending_age
        ));
        let mut q = sqlx::query_as::<_, (String, Option<f64>)>(sqlx::AssertSqlSafe(text))
            .persistent(persist());
        if let Some(t) = topic {
            q = q.bind(t);
        }
        let rows = on_pool!(pool, |conn| q.fetch_all(conn))?;
        Ok(rows.into_iter().map(|(t, age)| (lossy(d, t), age)).collect())
    }

    async fn outbox_list<'a>(
        pool: &'a Pool<Self>,
        status: &'a str,
        topic: Option<&'a str>,
        after: Option<i64>,
        limit: i64,
    ) -> Result<Vec<OutboxMessage>, sqlx::Error> {
        let sql = sql_of_pool(pool);
        let and = if topic.is_some() { " AND topic = ?" } else { "" };
        let above = if after.is_some() { " AND id > ?" } else { "" };
        let d = DB::pool_dialect(pool);
        let text = sql.render(&format!(
            "SELECT {} FROM idem_outbox WHERE status = ?{and}{above} ORDER BY id LIMIT ?",
            message_columns(d, sql)
        ));
        let mut q = sqlx::query_as::<_, MessageRow>(sqlx::AssertSqlSafe(text))
            .persistent(persist())
            .bind(status);
        if let Some(t) = topic {
            q = q.bind(t);
        }
        if let Some(a) = after {
            q = q.bind(a);
        }
        let q = q.bind(limit);
        let rows = on_pool!(pool, |conn| q.fetch_all(conn))?;
        rows.into_iter().map(|r| message(d, r)).collect()
    }

    async fn outbox_requeue<'a>(
        pool: &'a Pool<Self>,
        target: &'a RequeueTarget,
        max_id: Option<i64>,
        dry_run: bool,
        actor: &'a str,
    ) -> Result<(Vec<OutboxMessage>, u64), sqlx::Error> {
        let sql = sql_of_pool(pool);
        let d = DB::pool_dialect(pool);
        let filter = target_filter(target);
        let upto = if max_id.is_some() { " AND id <= ?" } else { "" };
        let text = sql.render(&format!(
            "SELECT {} FROM idem_outbox WHERE status = 'failed'{filter}{upto} ORDER BY id{}",
            message_columns(d, sql),
            sql.row_lock
        ));
        // SQLite: the write lock up front (`Backend::begin` runs `BEGIN
        // IMMEDIATE` there), so the rows read are the rows changed;
        // elsewhere the SELECT … FOR UPDATE locks them. `Backend::begin`
        // also leaves no transaction open on the pool if this future is
        // dropped mid-BEGIN.
        let mut tx = DB::begin(pool).await?;
        let mut q = sqlx::query_as::<_, MessageRow>(sqlx::AssertSqlSafe(text))
            .persistent(persist());
        match target {
            RequeueTarget::Id(id) => q = q.bind(*id),
            RequeueTarget::Topic(topic) => q = q.bind(topic.as_str()),
            RequeueTarget::AllFailed => {}
            RequeueTarget::Ids(ids) => {
                for id in ids {
                    q = q.bind(*id);
                }
            }
        }
        if let Some(m) = max_id {
            q = q.bind(m);
        }
        let messages = q
            .fetch_all(&mut *tx)
            .await?
            .into_iter()
            .map(|r| message(d, r))
            .collect::<Result<Vec<OutboxMessage>, _>>()?;
        if dry_run {
            tx.rollback().await?;
            let n = messages.len() as u64;
            return Ok((messages, n));
        }
        let (now, prefixed) = (sql.admin.now, sql.admin.requeued_error);
        let mut requeued = 0u64;
        for chunk in messages.chunks(CHUNK) {
            let text = sql.render(&format!(
                "UPDATE idem_outbox SET status = 'pending', attempts = 0, next_attempt_at = {now}, \
                 lease_owner = NULL, locked_until = NULL, last_error = {prefixed}, updated_at = {now} \
                 WHERE status = 'failed' AND id IN ({})",
                marks(chunk.len())
            ));
            let mut q = sqlx::query(sqlx::AssertSqlSafe(text)).persistent(persist());
            for m in chunk {
                q = q.bind(m.id);
            }
            requeued += DB::rows_changed(&q.execute(&mut *tx).await?);
            let entries: Vec<(i64, i32)> = chunk
                .iter()
                .map(|m| (m.id, i32::try_from(m.attempts).unwrap_or(i32::MAX)))
                .collect();
            DB::attempt_log_bulk(&mut *tx, d, &entries, "requeued", actor).await?;
        }
        tx.commit().await?;
        Ok((messages, requeued))
    }

    async fn outbox_leases(
        pool: &Pool<Self>,
    ) -> Result<Vec<(String, i64, i64, Option<String>, Option<String>)>, sqlx::Error> {
        let sql = sql_of_pool(pool);
        let d = DB::pool_dialect(pool);
        let ts = sql.admin.ts_text;
        let text = sql.render(&format!(
            "SELECT {}, COUNT(*), COUNT(CASE WHEN locked_until > {} THEN 1 END), {}, {} \
             FROM idem_outbox WHERE status = 'pending' AND lease_owner IS NOT NULL \
             GROUP BY lease_owner ORDER BY lease_owner",
            text_column(d, "lease_owner"),
            sql.admin.now,
            ts("MIN(locked_until)"),
            ts("MAX(locked_until)"),
        ));
        let q = sqlx::query_as::<_, (String, i64, i64, Option<String>, Option<String>)>(
            sqlx::AssertSqlSafe(text),
        )
        .persistent(persist());
        let rows = on_pool!(pool, |conn| q.fetch_all(conn))?;
        Ok(rows
            .into_iter()
            .map(|(owner, n, live, first, last)| (lossy(d, owner), n, live, first, last))
            .collect())
    }

    async fn outbox_deliveries(
        pool: &Pool<Self>,
        window_secs: f64,
        bucket_secs: f64,
    ) -> Result<Vec<(i64, i64)>, sqlx::Error> {
        let sql = sql_of_pool(pool);
        let a = &sql.admin;
        let bucket = (a.floor_int)(&format!("{} / ?", (a.age_secs)("updated_at")));
        // One row per bucket: the messages are grouped by the server.
        let text = sql.render(&format!(
            "SELECT b, COUNT(*) FROM (SELECT {bucket} AS b FROM idem_outbox \
             WHERE status = 'success' AND updated_at > {}) d GROUP BY b",
            a.ago
        ));
        let q = sqlx::query_as(sqlx::AssertSqlSafe(text))
            .persistent(persist())
            .bind(bucket_secs);
        let q = bind_secs!(q, sql, window_secs);
        on_pool!(pool, |conn| q.fetch_all(conn))
    }

    async fn outbox_requeue_preview<'a>(
        pool: &'a Pool<Self>,
        target: &'a RequeueTarget,
        shown: i64,
    ) -> Result<(u64, Option<i64>, Vec<OutboxMessage>), sqlx::Error> {
        let sql = sql_of_pool(pool);
        let d = DB::pool_dialect(pool);
        let filter = target_filter(target);
        let count = sql.render(&format!(
            "SELECT COUNT(*), MAX(id) FROM idem_outbox WHERE status = 'failed'{filter}"
        ));
        let first = sql.render(&format!(
            "SELECT {} FROM idem_outbox WHERE status = 'failed'{filter} ORDER BY id LIMIT ?",
            message_columns(d, sql)
        ));
        let mut q = sqlx::query_as::<_, (i64, Option<i64>)>(sqlx::AssertSqlSafe(count))
            .persistent(persist());
        for b in target_binds(target) {
            q = match b {
                TargetBind::Id(id) => q.bind(id),
                TargetBind::Topic(t) => q.bind(t),
            };
        }
        let (n, max_id) = on_pool!(pool, |conn| q.fetch_one(conn))?;
        let mut q = sqlx::query_as::<_, MessageRow>(sqlx::AssertSqlSafe(first))
            .persistent(persist());
        for b in target_binds(target) {
            q = match b {
                TargetBind::Id(id) => q.bind(id),
                TargetBind::Topic(t) => q.bind(t),
            };
        }
        let q = q.bind(shown);
        let rows = on_pool!(pool, |conn| q.fetch_all(conn))?;
        let rows = rows.into_iter().map(|r| message(d, r)).collect::<Result<_, _>>()?;
        Ok((n.max(0) as u64, max_id, rows))
    }

    async fn outbox_status(
        pool: &Pool<Self>,
        id: i64,
    ) -> Result<Option<String>, sqlx::Error> {
        let text = sql_of_pool(pool).render("SELECT status FROM idem_outbox WHERE id = ?");
        let q = sqlx::query_scalar(sqlx::AssertSqlSafe(text)).persistent(persist()).bind(id);
        on_pool!(pool, |conn| q.fetch_optional(conn))
    }
}
}
