//! [`ArchiveStore`] for every backend.

use super::{ArchiveStore, persist, sql_of_pool, stmt};
use crate::archive::{ArchiveTable, RecordInfo};
use crate::timestamp::{parse, parse_opt};
use idem_core::Backend;
use sqlx::{Database, Pool};

/// The connection of an archiving batch: closed instead of going back to
/// the pool unless the batch finished. A batch cancelled halfway (its task
/// aborted, its future dropped) can leave the server inside a transaction
/// that sqlx does not know about (cancelled during `BEGIN`), holding row
/// locks (or SQLite's write lock) for whoever gets the connection next;
/// closing the connection makes the server roll it back.
struct CloseUnlessDone<DB: Database> {
    conn: sqlx::pool::PoolConnection<DB>,
    done: bool,
}

impl<DB: Database> Drop for CloseUnlessDone<DB> {
    fn drop(&mut self) {
        if !self.done {
            self.conn.close_on_drop();
        }
    }
}

type OnlineRow = (
    String,
    String,
    String,
    String,
    Option<String>,
    String,
    String,
);
type HistoryRow = (
    String,
    String,
    String,
    String,
    Option<String>,
    String,
    String,
    String,
);

fn record_info(row: OnlineRow, archived_at: Option<String>) -> Result<RecordInfo, sqlx::Error> {
    let (key, biz_type, biz_no, fingerprint, result, create_time, expire_time) = row;
    Ok(RecordInfo {
        key,
        biz_type,
        biz_no,
        fingerprint,
        result,
        create_time: parse(&create_time)?,
        expire_time: parse(&expire_time)?,
        archived: archived_at.is_some(),
        archived_at: parse_opt(archived_at)?,
    })
}

for_every_backend! {
impl ArchiveStore for DB {
    async fn archive_batch(
        pool: &Pool<Self>,
        table: ArchiveTable,
        limit: i64,
        retention_secs: f64,
    ) -> Result<u64, sqlx::Error> {
        use sqlx::Connection as _;
        let sql = sql_of_pool(pool);
        let stmts = sql.archive(table);
        // The outbox's condition has one bind, the retention: seconds,
        // or whole microseconds on MariaDB (DATE_SUB … MICROSECOND).
        let retention = match table {
            ArchiveTable::Records => None,
            ArchiveTable::Outbox => Some(retention_secs),
        };
        let mut guard = CloseUnlessDone {
            conn: pool.acquire().await?,
            done: false,
        };
        let conn: &mut Self::Connection = &mut guard.conn;
        if let Some(prelude) = sql.archive_prelude {
            sqlx::query(stmt(prelude)).persistent(persist()).execute(&mut *conn).await?;
        }
        let mut tx = match sql.archive_begin {
            Some(begin) => conn.begin_with(stmt(begin)).await?,
            None => conn.begin().await?,
        };
        let mut q = sqlx::query_scalar::<_, i64>(stmt(stmts.select)).persistent(persist());
        if let Some(r) = retention {
            q = bind_secs!(q, sql, r);
        }
        let ids: Vec<i64> = q.bind(limit).fetch_all(&mut *tx).await?;
        if ids.is_empty() {
            tx.commit().await?;
            guard.done = true;
            return Ok(0);
        }
        let first = 1 + usize::from(retention.is_some());
        let list = sql.placeholders(first, ids.len());
        let mut moved = [0u64; 2];
        for (n, prefix) in [stmts.copy, stmts.delete].into_iter().enumerate() {
            let text = format!("{prefix}{list})");
            let mut q = sqlx::query(sqlx::AssertSqlSafe(text)).persistent(persist());
            if let Some(r) = retention {
                q = bind_secs!(q, sql, r);
            }
            for id in &ids {
                q = q.bind(*id);
            }
            moved[n] = DB::rows_changed(&q.execute(&mut *tx).await?);
        }
        let [copied, deleted] = moved;
        if copied != deleted {
            // Impossible while the rows are locked and the clock moves
            // forward; never commit a half-moved batch.
            tx.rollback().await?;
            return Err(sqlx::Error::Protocol(format!(
                "archive batch rolled back: {copied} rows copied to history but {deleted} deleted"
            )));
        }
        tx.commit().await?;
        guard.done = true;
        Ok(deleted)
    }

    async fn archive_status(
        pool: &Pool<Self>,
        retention_secs: f64,
    ) -> Result<(i64, i64, i64, i64, Option<String>, Option<String>), sqlx::Error> {
        let sql = sql_of_pool(pool);
        let records = sqlx::query_scalar::<_, i64>(stmt(sql.archive_record.count))
            .persistent(persist());
        let records = on_pool!(pool, |conn| records.fetch_one(conn))?;
        let outbox = sqlx::query_scalar::<_, i64>(stmt(sql.archive_outbox.count))
            .persistent(persist());
        let outbox = bind_secs!(outbox, sql, retention_secs);
        let outbox = on_pool!(pool, |conn| outbox.fetch_one(conn))?;
        let mut history = [(0i64, None::<String>), (0, None)];
        for (n, table) in ["idem_record_history", "idem_outbox_history"].into_iter().enumerate() {
            let text = format!(
                "SELECT COUNT(*), {} FROM {table}",
                (sql.admin.ts_text)("MAX(archived_at)")
            );
            let q = sqlx::query_as::<_, (i64, Option<String>)>(sqlx::AssertSqlSafe(text))
                .persistent(persist());
            history[n] = on_pool!(pool, |conn| q.fetch_one(conn))?;
        }
        let [(record_history, last_record), (outbox_history, last_outbox)] = history;
        Ok((records, outbox, record_history, outbox_history, last_record, last_outbox))
    }

    async fn lookup_record<'a>(
        pool: &'a Pool<Self>,
        key: &'a str,
        biz_type: Option<&'a str>,
    ) -> Result<Vec<RecordInfo>, sqlx::Error> {
        let sql = sql_of_pool(pool);
        let typed = if biz_type.is_some() {
            format!(" AND biz_type = {}", sql.placeholders(2, 1))
        } else {
            String::new()
        };
        let text = format!("{}{typed}", sql.find_online);
        // The history, newest first: the first row of each business
        // type without an online record is its latest archived one.
        let history = format!("{}{typed} ORDER BY archived_at DESC, id DESC", sql.find_history);
        let mut q = sqlx::query_as::<_, OnlineRow>(sqlx::AssertSqlSafe(text))
            .persistent(persist())
            .bind(key);
        if let Some(t) = biz_type {
            q = q.bind(t);
        }
        let online = q;
        let mut q = sqlx::query_as::<_, HistoryRow>(sqlx::AssertSqlSafe(history))
            .persistent(persist())
            .bind(key);
        if let Some(t) = biz_type {
            q = q.bind(t);
        }
        let online = on_pool!(pool, |conn| online.fetch_all(conn))?;
        let history = on_pool!(pool, |conn| q.fetch_all(conn))?;
        let mut found = online
            .into_iter()
            .map(|row| record_info(row, None))
            .collect::<Result<Vec<_>, _>>()?;
        for (k, t, n, f, r, c, e, at) in history {
            if !found.iter().any(|i| i.biz_type == t) {
                found.push(record_info((k, t, n, f, r, c, e), Some(at))?);
            }
        }
        found.sort_by(|a, b| a.biz_type.cmp(&b.biz_type));
        Ok(found)
    }
}
}
