//! The code that runs each dialect's statements, written once for every
//! backend: each concept trait has one blanket implementation here, over
//! the four sealed backends, reading the dialect's [`SqlSet`] (data) for
//! what differs.

use super::sql::SqlSet;
use super::types::{NewRecord, StoredRecord};
use super::{CallStore, Migrate, StateSql, sealed::Sealed};
use idem_syntax::is_identifier;

use crate::lease::OutboxLease;
use crate::state::EntityIdValue;
use sqlx::{Database, Pool, Transaction};

/// `impl<DB> $trait for DB` for every sealed backend whose driver runs
/// and binds what idem needs (the four of them): the bounds are written
/// once, here.
macro_rules! for_every_backend {
    (impl $tr:ident for DB { $($body:tt)* }) => {
        impl<DB> $tr for DB
        where
            DB: Sealed,
            for<'c> &'c mut <DB as Database>::Connection: sqlx::Executor<'c, Database = DB>,
            <DB as Database>::Arguments: sqlx::IntoArguments<DB>,
            usize: sqlx::ColumnIndex<<DB as Database>::Row>,
            str: sqlx::Type<DB>,
            for<'q> &'q str: sqlx::Encode<'q, DB>,
            for<'q> Option<&'q str>: sqlx::Encode<'q, DB>,
            String: sqlx::Type<DB> + for<'r> sqlx::Decode<'r, DB>,
            i64: sqlx::Type<DB> + for<'q> sqlx::Encode<'q, DB> + for<'r> sqlx::Decode<'r, DB>,
            i32: sqlx::Type<DB> + for<'q> sqlx::Encode<'q, DB> + for<'r> sqlx::Decode<'r, DB>,
            f64: sqlx::Type<DB> + for<'q> sqlx::Encode<'q, DB> + for<'r> sqlx::Decode<'r, DB>,
        {
            $($body)*
        }
    };
}

/// Begins a call's transaction: [`Backend::begin`](super::Backend::begin).
pub(crate) fn begin<DB: Sealed>(
    pool: &Pool<DB>,
) -> impl std::future::Future<Output = Result<Transaction<'static, DB>, sqlx::Error>> + Send + '_ {
    crate::tx::begin(pool, DB::dialect_of_pool(pool).sql().begin)
}

/// A fixed statement. (Passing the `&'static str` through this function
/// keeps its lifetime visible to the `Send` check of the generic futures,
/// which otherwise asks for `SqlSafeStr` on every `&str`.)
pub(crate) fn stmt(s: &'static str) -> sqlx::SqlStr {
    sqlx::SqlSafeStr::into_sql_str(s)
}

/// sqlx's `.persistent(…)` for every statement idem prepares: the
/// unnamed statement in transaction-pooling mode (see
/// [`pooler`](crate::pooler)), a named and cached one otherwise.
pub(crate) fn persist() -> bool {
    crate::pooler::persistent()
}

/// Runs a statement that goes to a pool in autocommit, `|conn| future`
/// (a future of `Result<_, sqlx::Error>` on `conn`, an executor): on the
/// pool itself, or, in transaction-pooling mode on PostgreSQL, inside
/// `BEGIN … COMMIT` on one connection, so that a pooler keeps the
/// statement's two round trips on one server connection. A failed
/// statement rolls the transaction back; a failed `COMMIT` is the
/// statement's error (the same outcome as an autocommit's).
macro_rules! on_pool {
    ($pool:expr, |$conn:ident| $body:expr) => {{
        let pool = $pool;
        if crate::pooler::wrap_autocommit(DB::dialect_of_pool(pool)) {
            match crate::backend::store::begin(pool).await {
                Err(e) => Err(e),
                Ok(mut tx) => {
                    let out = {
                        let $conn = &mut *tx;
                        $body.await
                    };
                    match out {
                        Ok(v) => tx.commit().await.map(|()| v),
                        Err(e) => Err(e),
                    }
                }
            }
        } else {
            let $conn = pool;
            $body.await
        }
    }};
}

/// The SQL of the transaction's dialect.
fn sql_of<DB: Sealed>(tx: &Transaction<'_, DB>) -> &'static SqlSet {
    DB::dialect_of_tx(tx).sql()
}

/// Binds an entity id.
macro_rules! bind_id {
    ($q:expr, $id:expr) => {
        match $id {
            EntityIdValue::Int(i) => $q.bind(*i),
            EntityIdValue::Text(s) => $q.bind(s.as_str()),
        }
    };
}

/// Binds an interval of `secs` seconds the dialect's way: fractional
/// seconds, or whole microseconds.
macro_rules! bind_secs {
    ($q:expr, $sql:expr, $secs:expr) => {
        if $sql.micros {
            $q.bind(($secs * 1e6) as i64)
        } else {
            $q.bind($secs)
        }
    };
}

/// [`Backend::claim_record`], for every backend (unused in a build
/// without one: the core built alone for an entry point's crate).
#[cfg_attr(
    not(any(
        feature = "sqlite",
        feature = "postgres",
        feature = "mysql",
        feature = "any"
    )),
    allow(dead_code)
)]
pub(crate) async fn claim_record<DB>(
    tx: &mut Transaction<'_, DB>,
    rec: &NewRecord<'_>,
) -> Result<bool, sqlx::Error>
where
    DB: Sealed,
    for<'c> &'c mut <DB as Database>::Connection: sqlx::Executor<'c, Database = DB>,
    <DB as Database>::Arguments: sqlx::IntoArguments<DB>,
    str: sqlx::Type<DB>,
    for<'q> &'q str: sqlx::Encode<'q, DB>,
    i64: sqlx::Type<DB> + for<'q> sqlx::Encode<'q, DB>,
{
    let done = sqlx::query(stmt(sql_of(tx).claim_record))
        .persistent(persist())
        .bind(rec.key)
        .bind(rec.biz_type)
        .bind(rec.biz_no)
        .bind(rec.fingerprint)
        .bind(rec.ttl_secs)
        .execute(&mut **tx)
        .await?;
    Ok(DB::rows_affected(&done) == 1)
}

for_every_backend! {
impl CallStore for DB {
    async fn lock_state<'a>(
        tx: &'a mut Transaction<'_, Self>,
        sql: &'a StateSql,
        id: &'a EntityIdValue,
    ) -> Result<Option<(String, Option<String>)>, sqlx::Error> {
        let q = sqlx::query_as(sqlx::AssertSqlSafe(sql.lock.as_str())).persistent(persist());
        bind_id!(q, id).fetch_optional(&mut **tx).await
    }

    async fn mark_lock_state<'a>(
        tx: &'a mut Transaction<'_, Self>,
        sql: &'a StateSql,
        lease: &'a OutboxLease,
        id: &'a EntityIdValue,
    ) -> Result<(i64, Option<(String, Option<String>)>), sqlx::Error> {
        let Some(text) = sql.lock_marked.as_deref() else {
            return Err(sqlx::Error::Protocol(
                "no folded outbox update and state read in this dialect".into(),
            ));
        };
        let q = sqlx::query_as::<_, (i64, Option<String>, Option<String>)>(sqlx::AssertSqlSafe(text))
            .persistent(persist())
            .bind(lease.id)
            .bind(lease.topic.as_str())
            .bind(lease.owner.as_str())
            .bind(lease.attempt);
        let (marked, state, key) = bind_id!(q, id).fetch_one(&mut **tx).await?;
        Ok((marked, state.map(|s| (s, key))))
    }

    async fn transition<'a>(
        tx: &'a mut Transaction<'_, Self>,
        sql: &'a StateSql,
        id: &'a EntityIdValue,
        from: &'static str,
        to: &'static str,
        key: Option<&'a str>,
    ) -> Result<u64, sqlx::Error> {
        let mut q = sqlx::query(sqlx::AssertSqlSafe(sql.transition.as_str()))
            .persistent(persist())
            .bind(to);
        if sql.with_key {
            q = q.bind(key.unwrap_or_default());
        }
        let q = bind_id!(q, id).bind(from);
        Ok(DB::rows_affected(&q.execute(&mut **tx).await?))
    }

    async fn fetch_record<'a>(
        tx: &'a mut Transaction<'_, Self>,
        biz_type: &'a str,
        key: &'a str,
    ) -> Result<Option<StoredRecord>, sqlx::Error> {
        let row: Option<(String, Option<String>)> = sqlx::query_as(stmt(sql_of(tx).fetch_record))
            .persistent(persist())
            .bind(key)
            .bind(biz_type)
            .fetch_optional(&mut **tx)
            .await?;
        Ok(row.map(|(fingerprint, result)| StoredRecord {
            fingerprint,
            result,
        }))
    }

    async fn record_ttl_left<'a>(
        tx: &'a mut Transaction<'_, Self>,
        biz_type: &'a str,
        key: &'a str,
    ) -> Result<Option<i64>, sqlx::Error> {
        sqlx::query_scalar(stmt(sql_of(tx).record_ttl_left))
            .persistent(persist())
            .bind(key)
            .bind(biz_type)
            .fetch_optional(&mut **tx)
            .await
    }

    async fn store_result<'a>(
        tx: &'a mut Transaction<'_, Self>,
        biz_type: &'a str,
        key: &'a str,
        result: &'a str,
    ) -> Result<(), sqlx::Error> {
        sqlx::query(stmt(sql_of(tx).store_result))
            .persistent(persist())
            .bind(result)
            .bind(key)
            .bind(biz_type)
            .execute(&mut **tx)
            .await?;
        Ok(())
    }

    async fn sqlite_index_columns<'a>(
        tx: &'a mut Transaction<'_, Self>,
        name: &'a str,
    ) -> Result<Vec<String>, sqlx::Error> {
        let Some(sql) = sql_of(tx).index_columns else {
            return Ok(Vec::new());
        };
        let rows: Vec<(String, Option<String>)> = sqlx::query_as(stmt(sql))
            .persistent(persist())
            .bind(name)
            .fetch_all(&mut **tx)
            .await?;
        Ok(rows
            .into_iter()
            .map(|(t, c)| format!("{t}.{}", c.unwrap_or_default()))
            .collect())
    }

    async fn exec(
        tx: &mut Transaction<'_, Self>,
        sql: &'static str,
    ) -> Result<(), sqlx::Error> {
        sqlx::query(stmt(sql)).persistent(persist()).execute(&mut **tx).await?;
        Ok(())
    }
}
}

mod outbox;
mod requests;

for_every_backend! {
impl Migrate for DB {
    async fn execute_on<'a>(
        conn: &'a mut Self::Connection,
        sql: &'a str,
    ) -> Result<u64, sqlx::Error> {
        Ok(DB::rows_affected(&sqlx::query(sqlx::AssertSqlSafe(sql))
            .persistent(persist())
            .execute(conn)
            .await?))
    }

    async fn fetch_i64<'a>(
        conn: &'a mut Self::Connection,
        sql: &'a str,
    ) -> Result<i64, sqlx::Error> {
        sqlx::query_scalar(sqlx::AssertSqlSafe(sql))
            .persistent(persist())
            .fetch_one(conn)
            .await
    }

    async fn table_exists<'a>(
        pool: &'a Pool<Self>,
        table: &'a str,
    ) -> Result<bool, sqlx::Error> {
        if !is_identifier(table) {
            return Err(sqlx::Error::Protocol(format!("`{table}` is not a table name")));
        }
        let text = format!("SELECT COUNT(*) FROM {table} WHERE 1 = 0");
        let q = sqlx::query(sqlx::AssertSqlSafe(text)).persistent(persist());
        match on_pool!(pool, |conn| q.execute(conn)) {
            Ok(_) => Ok(true),
            // Not an answer about the table: a pooler in transaction mode.
            Err(e) if crate::backend::classify::pooler_error(&e).is_some() => Err(e),
            Err(_) => Ok(false),
        }
    }
}
}
