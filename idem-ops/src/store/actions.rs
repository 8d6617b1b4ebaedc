//! [`ActionStore`] for every backend: one message in full, its attempt
//! log, the operator's actions on messages and topics, the processes.

use super::admin::{lossy, opt_text_column, text_column};
use super::{ActionStore, persist, sql_of_pool};
use crate::admin::{Act, Acted, Attempt, MessageDetail, PausedTopic, Process};
use crate::sql::OpsSql;
use crate::timestamp::{parse, parse_opt};
use idem_core::{Backend, Dialect};
use sqlx::{Database, Pool, Row};

/// The columns of a [`MessageDetail`] (decoded by [`detail_of`]), of the
/// online table, or of the history with `archived_at` last.
fn detail_columns(d: Dialect, sql: &OpsSql, archived: bool) -> String {
    let ts = sql.admin.ts_text;
    let text = |c| text_column(d, c);
    let opt = |c| opt_text_column(d, c);
    format!(
        "id, {}, {}, {}, {}, {}, status, attempts, {}, {}, {}, {}, {}, {}{}",
        text("topic"),
        text("msg_id"),
        text("payload"),
        opt("headers"),
        opt("ordering_key"),
        ts("next_attempt_at"),
        opt("lease_owner"),
        ts("locked_until"),
        opt("last_error"),
        ts("created_at"),
        ts("updated_at"),
        if archived {
            format!(", {}", ts("archived_at"))
        } else {
            String::new()
        }
    )
}

/// A row of [`detail_columns`].
fn detail_of<R: Row>(d: Dialect, r: &R, archived: bool) -> Result<MessageDetail, sqlx::Error>
where
    usize: sqlx::ColumnIndex<R>,
    String: sqlx::Type<R::Database> + for<'r> sqlx::Decode<'r, R::Database>,
    i64: sqlx::Type<R::Database> + for<'r> sqlx::Decode<'r, R::Database>,
    i32: sqlx::Type<R::Database> + for<'r> sqlx::Decode<'r, R::Database>,
{
    let text = |i: usize| r.try_get::<String, _>(i).map(|v| lossy(d, v));
    let opt = |i: usize| {
        r.try_get::<Option<String>, _>(i)
            .map(|v| v.map(|v| lossy(d, v)))
    };
    Ok(MessageDetail {
        id: r.try_get(0)?,
        topic: text(1)?,
        msg_id: text(2)?,
        payload: text(3)?,
        headers: opt(4)?,
        ordering_key: opt(5)?,
        status: r.try_get(6)?,
        attempts: i64::from(r.try_get::<i32, _>(7)?),
        next_attempt_at: parse(&r.try_get::<String, _>(8)?)?,
        lease_owner: opt(9)?,
        locked_until: parse_opt(r.try_get(10)?)?,
        last_error: opt(11)?,
        created_at: parse(&r.try_get::<String, _>(12)?)?,
        updated_at: parse(&r.try_get::<String, _>(13)?)?,
        archived_at: if archived {
            parse_opt(r.try_get(14)?)?
        } else {
            None
        },
    })
}

/// What an action reads of a message before it decides, the row locked:
/// status, attempts, whether a relay's lease on it is live.
struct Locked {
    status: String,
    attempts: i32,
    live: bool,
}

/// The fate of a message in `status` whose lease is `live`, under `what`.
fn decide(what: Act<'_>, m: &Locked) -> Acted {
    match (m.status.as_str(), what) {
        ("pending", _) if m.live => Acted::InFlight,
        ("pending" | "failed", _) => Acted::Done,
        _ => Acted::Skipped,
    }
}

for_every_backend! {
impl ActionStore for DB {
    async fn outbox_detail(pool: &Pool<Self>, id: i64) -> Result<Option<MessageDetail>, sqlx::Error> {
        let sql = sql_of_pool(pool);
        let d = DB::pool_dialect(pool);
        for (table, archived) in [("idem_outbox", false), ("idem_outbox_history", true)] {
            let text = sql.render(&format!(
                "SELECT {} FROM {table} WHERE id = ?",
                detail_columns(d, sql, archived)
            ));
            let q = sqlx::query(sqlx::AssertSqlSafe(text)).persistent(persist()).bind(id);
            if let Some(row) = on_pool!(pool, |conn| q.fetch_optional(conn))? {
                return detail_of(d, &row, archived).map(Some);
            }
        }
        Ok(None)
    }

    async fn outbox_attempt_log(
        pool: &Pool<Self>,
        id: i64,
        limit: i64,
    ) -> Result<Vec<Attempt>, sqlx::Error> {
        let sql = sql_of_pool(pool);
        let d = DB::pool_dialect(pool);
        let text = sql.render(&format!(
            "SELECT attempt, outcome, {}, {}, {} FROM idem_outbox_attempt \
             WHERE outbox_id = ? ORDER BY id DESC LIMIT ?",
            opt_text_column(d, "detail"),
            opt_text_column(d, "actor"),
            (sql.admin.ts_text)("at")
        ));
        let q = sqlx::query(sqlx::AssertSqlSafe(text))
            .persistent(persist())
            .bind(id)
            .bind(limit);
        let rows = on_pool!(pool, |conn| q.fetch_all(conn))?;
        let opt = |v: Option<String>| v.map(|v| lossy(d, v));
        rows.iter()
            .map(|r| {
                Ok(Attempt {
                    attempt: i64::from(r.try_get::<i32, _>(0)?),
                    outcome: r.try_get(1)?,
                    detail: opt(r.try_get(2)?),
                    actor: opt(r.try_get(3)?),
                    at: parse(&r.try_get::<String, _>(4)?)?,
                })
            })
            .collect()
    }

    async fn outbox_act<'a>(
        pool: &'a Pool<Self>,
        id: i64,
        what: Act<'a>,
    ) -> Result<Acted, sqlx::Error> {
        let sql = sql_of_pool(pool);
        let d = DB::pool_dialect(pool);
        let ts = sql.admin.ts_text;
        let read = sql.render(&format!(
            "SELECT status, attempts, {}, {} FROM idem_outbox WHERE id = ?{}",
            ts("locked_until"),
            ts(sql.admin.now),
            sql.row_lock
        ));
        // SQLite: `Backend::begin` takes the write lock up front; elsewhere
        // the read locks the row: a relay's claim or settlement of it
        // waits, or skips it, until this commits.
        let mut tx = DB::begin(pool).await?;
        let q = sqlx::query(sqlx::AssertSqlSafe(read)).persistent(persist()).bind(id);
        let Some(row) = q.fetch_optional(&mut *tx).await? else {
            return Ok(Acted::Skipped);
        };
        let locked_until = parse_opt(row.try_get(2)?)?;
        let now = parse(&row.try_get::<String, _>(3)?)?;
        let m = Locked {
            status: row.try_get(0)?,
            attempts: row.try_get(1)?,
            live: locked_until.is_some_and(|t| t > now),
        };
        let acted = decide(what, &m);
        if acted != Acted::Done {
            tx.rollback().await?;
            return Ok(acted);
        }
        let now = sql.admin.now;
        let (outcome, detail, actor) = match what {
            Act::Discard { reason, actor } => {
                let copy = sql.render(&format!(
                    "INSERT INTO idem_outbox_history (id, topic, msg_id, payload, status, attempts, \
                     next_attempt_at, lease_owner, locked_until, last_error, created_at, updated_at, \
                     ordering_key, headers, archived_at) \
                     SELECT id, topic, msg_id, payload, 'failed', attempts, next_attempt_at, \
                     lease_owner, locked_until, ?, created_at, {now}, ordering_key, headers, {now} \
                     FROM idem_outbox WHERE id = ?"
                ));
                let error = format!("discarded: {reason}");
                sqlx::query(sqlx::AssertSqlSafe(copy))
                    .persistent(persist())
                    .bind(error.as_str())
                    .bind(id)
                    .execute(&mut *tx)
                    .await?;
                let delete = sql.render("DELETE FROM idem_outbox WHERE id = ?");
                sqlx::query(sqlx::AssertSqlSafe(delete))
                    .persistent(persist())
                    .bind(id)
                    .execute(&mut *tx)
                    .await?;
                ("discarded", Some(reason), actor)
            }
            Act::RetryNow { actor } => {
                let change = if m.status == "failed" {
                    format!(
                        "UPDATE idem_outbox SET status = 'pending', attempts = 0, \
                         next_attempt_at = {now}, lease_owner = NULL, locked_until = NULL, \
                         last_error = {}, updated_at = {now} WHERE id = ? AND status = 'failed'",
                        sql.admin.requeued_error
                    )
                } else {
                    format!(
                        "UPDATE idem_outbox SET next_attempt_at = {now}, updated_at = {now} \
                         WHERE id = ? AND status = 'pending'"
                    )
                };
                sqlx::query(sqlx::AssertSqlSafe(sql.render(&change)))
                    .persistent(persist())
                    .bind(id)
                    .execute(&mut *tx)
                    .await?;
                ("retry_now", None, actor)
            }
        };
        DB::attempt_log_add(&mut *tx, d, id, m.attempts, outcome, detail, actor).await?;
        tx.commit().await?;
        Ok(Acted::Done)
    }

    async fn attempt_log_add<'a>(
        conn: &'a mut Self::Connection,
        d: Dialect,
        id: i64,
        attempt: i32,
        outcome: &'a str,
        detail: Option<&'a str>,
        actor: &'a str,
    ) -> Result<(), sqlx::Error> {
        let sql = crate::sql::of(d);
        let insert = sql.render(&format!(
            "INSERT INTO idem_outbox_attempt (outbox_id, attempt, outcome, detail, actor, at) \
             VALUES (?, ?, ?, ?, ?, {})",
            sql.admin.now
        ));
        sqlx::query(sqlx::AssertSqlSafe(insert))
            .persistent(persist())
            .bind(id)
            .bind(attempt)
            .bind(outcome)
            .bind(detail)
            .bind(actor)
            .execute(&mut *conn)
            .await?;
        DB::attempt_log_trim(conn, d, id).await
    }

    async fn attempt_log_trim(
        conn: &mut Self::Connection,
        d: Dialect,
        id: i64,
    ) -> Result<(), sqlx::Error> {
        let sql = crate::sql::of(d);
        // The newest ATTEMPT_LOG_MAX stay.
        let oldest_kept = sql.render(
            "SELECT id FROM idem_outbox_attempt WHERE outbox_id = ? ORDER BY id DESC LIMIT 1 OFFSET ?",
        );
        let cut: Option<i64> = sqlx::query_scalar(sqlx::AssertSqlSafe(oldest_kept))
            .persistent(persist())
            .bind(id)
            .bind(crate::admin::ATTEMPT_LOG_MAX - 1)
            .fetch_optional(&mut *conn)
            .await?;
        if let Some(cut) = cut {
            let trim = sql.render("DELETE FROM idem_outbox_attempt WHERE outbox_id = ? AND id < ?");
            sqlx::query(sqlx::AssertSqlSafe(trim))
                .persistent(persist())
                .bind(id)
                .bind(cut)
                .execute(&mut *conn)
                .await?;
        }
        Ok(())
    }

    async fn attempt_log_bulk<'a>(
        conn: &'a mut Self::Connection,
        d: Dialect,
        entries: &'a [(i64, i32)],
        outcome: &'a str,
        actor: &'a str,
    ) -> Result<(), sqlx::Error> {
        if entries.is_empty() {
            return Ok(());
        }
        let sql = crate::sql::of(d);
        let row = format!("(?, ?, ?, ?, {})", sql.admin.now);
        let insert = sql.render(&format!(
            "INSERT INTO idem_outbox_attempt (outbox_id, attempt, outcome, actor, at) VALUES {}",
            vec![row; entries.len()].join(", ")
        ));
        let mut q = sqlx::query(sqlx::AssertSqlSafe(insert)).persistent(persist());
        for &(id, attempt) in entries {
            q = q.bind(id).bind(attempt).bind(outcome).bind(actor);
        }
        q.execute(&mut *conn).await?;
        // Only the messages over the bound are trimmed, one by one.
        let over = sql.render(&format!(
            "SELECT outbox_id FROM idem_outbox_attempt WHERE outbox_id IN ({})              GROUP BY outbox_id HAVING COUNT(*) > ?",
            crate::sql::marks(entries.len())
        ));
        let mut q = sqlx::query_scalar::<_, i64>(sqlx::AssertSqlSafe(over)).persistent(persist());
        for &(id, _) in entries {
            q = q.bind(id);
        }
        let over = q.bind(crate::admin::ATTEMPT_LOG_MAX).fetch_all(&mut *conn).await?;
        for id in over {
            DB::attempt_log_trim(&mut *conn, d, id).await?;
        }
        Ok(())
    }

    async fn topic_pause<'a>(
        pool: &'a Pool<Self>,
        topic: &'a str,
        reason: Option<&'a str>,
        actor: &'a str,
    ) -> Result<bool, sqlx::Error> {
        let sql = sql_of_pool(pool);
        let q = sqlx::query(sqlx::AssertSqlSafe(sql.render(sql.admin.pause)))
            .persistent(persist())
            .bind(topic)
            .bind(reason)
            .bind(actor);
        let done = on_pool!(pool, |conn| q.execute(conn))?;
        Ok(DB::rows_changed(&done) > 0)
    }

    async fn topic_resume<'a>(pool: &'a Pool<Self>, topic: &'a str) -> Result<bool, sqlx::Error> {
        let text = sql_of_pool(pool).render("DELETE FROM idem_topic_pause WHERE topic = ?");
        let q = sqlx::query(sqlx::AssertSqlSafe(text)).persistent(persist()).bind(topic);
        let done = on_pool!(pool, |conn| q.execute(conn))?;
        Ok(DB::rows_changed(&done) > 0)
    }

    async fn topic_paused(pool: &Pool<Self>) -> Result<Vec<PausedTopic>, sqlx::Error> {
        let sql = sql_of_pool(pool);
        let d = DB::pool_dialect(pool);
        let text = format!(
            "SELECT {}, {}, {}, {} FROM idem_topic_pause",
            text_column(d, "topic"),
            opt_text_column(d, "reason"),
            opt_text_column(d, "paused_by"),
            (sql.admin.ts_text)("paused_at")
        );
        let q = sqlx::query(sqlx::AssertSqlSafe(text)).persistent(persist());
        let rows = on_pool!(pool, |conn| q.fetch_all(conn))?;
        let opt = |v: Option<String>| v.map(|v| lossy(d, v));
        rows.iter()
            .map(|r| {
                Ok(PausedTopic {
                    topic: lossy(d, r.try_get(0)?),
                    reason: opt(r.try_get(1)?),
                    paused_by: opt(r.try_get(2)?),
                    paused_at: parse(&r.try_get::<String, _>(3)?)?,
                })
            })
            .collect()
    }

    async fn process_list(pool: &Pool<Self>) -> Result<Vec<Process>, sqlx::Error> {
        let sql = sql_of_pool(pool);
        let d = DB::pool_dialect(pool);
        let ts = sql.admin.ts_text;
        let text = format!(
            "SELECT {}, {}, {}, {}, pid, {}, {}, {} FROM idem_process",
            text_column(d, "id"),
            text_column(d, "kind"),
            text_column(d, "name"),
            opt_text_column(d, "host"),
            ts("started_at"),
            ts("heartbeat_at"),
            (sql.admin.age_secs)("heartbeat_at"),
        );
        let q = sqlx::query(sqlx::AssertSqlSafe(text)).persistent(persist());
        let rows = on_pool!(pool, |conn| q.fetch_all(conn))?;
        rows.iter()
            .map(|r| {
                let age: Option<f64> = r.try_get(7)?;
                Ok(Process {
                    id: lossy(d, r.try_get(0)?),
                    kind: lossy(d, r.try_get(1)?),
                    name: lossy(d, r.try_get(2)?),
                    host: r.try_get::<Option<String>, _>(3)?.map(|v| lossy(d, v)),
                    pid: r.try_get(4)?,
                    started_at: parse(&r.try_get::<String, _>(5)?)?,
                    heartbeat_at: parse(&r.try_get::<String, _>(6)?)?,
                    heartbeat_age: std::time::Duration::try_from_secs_f64(
                        age.unwrap_or(0.0).max(0.0),
                    )
                    .unwrap_or(std::time::Duration::MAX),
                })
            })
            .collect()
    }
}
}
