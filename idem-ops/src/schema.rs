//! The runtime's own tables, created and upgraded with one call.
//!
//! The schema is versioned: `idem_schema_version` holds one row per version
//! applied. Version 1 is the tables as the first release created them
//! ([`statements`]); each later version is an ordered list of upgrade
//! statements. A database without the version table (new, or created by a
//! release before versioning) gets version 1 (`CREATE … IF NOT EXISTS`,
//! which leaves existing tables alone) and then every upgrade, so a new
//! database and an upgraded one end with the same tables.

use crate::sql::{MigrateLock, OpsSql as SqlSet};
use idem_core::{Backend, Dialect, Error};
use sqlx::{Connection, Pool};

/// The schema version this release creates and upgrades to.
///
/// 1. The tables of the first release.
/// 2. Records unique per `(idempotency_key, biz_type)` (was: per key) and
///    `expire_time` after `create_time` (a CHECK; rows that broke it, the
///    zero dates MariaDB's `INSERT IGNORE` stored for an expiry past year
///    9999, get the longest ttl); the history's key index covers
///    `biz_type`; MariaDB: every key column (`idempotency_key`, `biz_type`,
///    `biz_no`, `topic`, `msg_id`, online and history) in a NO PAD binary
///    collation, so `"k "` and `"k"` are two keys.
/// 3. Outbox messages' `ordering_key` and `headers` (online and history),
///    the index of a key's messages by id; MariaDB: `idem_outbox_key`,
///    whose rows serialize the enqueues of one ordering key.
/// 4. The operator's tables: `idem_outbox_attempt` (each message's failed
///    attempts and the operator's actions on it, bounded per message),
///    `idem_topic_pause` (topics the relays do not claim) and
///    `idem_process` (the relays and consumers alive, with their
///    heartbeats).
///
/// The same constant as `idem_core`'s, which a relay checks before it
/// claims (`idem_runtime::check_schema`).
pub const SCHEMA_VERSION: i64 = idem_core::SCHEMA_VERSION;

/// The statements creating idem's tables as the first release did
/// (schema version 1) on `dialect`, in order; each is safe to run twice.
/// [`migrate`] runs them, then upgrades the tables to the current version.
pub fn statements(dialect: Dialect) -> &'static [&'static str] {
    crate::sql::of(dialect).schema
}

/// Creates idem's tables (`idem_record`, `idem_outbox`, and their history
/// tables `idem_record_history`, `idem_outbox_history`, see
/// `idem_runtime::archive`) and their indexes if they do not exist,
/// and upgrades tables created by an earlier release in place, keeping
/// their rows. Safe to run twice, and concurrently with itself.
///
/// The version reached is kept in `idem_schema_version`
/// ([`SCHEMA_VERSION`]). A database of a newer version is an
/// [`Error::Config`], and nothing changes.
///
/// Concurrent runs wait for each other: PostgreSQL takes an advisory lock
/// and upgrades in one transaction; SQLite upgrades in one `BEGIN
/// IMMEDIATE` transaction (rebuilding `idem_record` where a constraint
/// changes); MariaDB / MySQL, whose DDL is not transactional, hold
/// `GET_LOCK('idem_migrate')` on a dedicated connection and record each
/// version as soon as its statements (each atomic, and written to be
/// re-run after a crash between them on MariaDB) are done. An upgrade
/// rewrites the tables it alters: on a large MariaDB record table, run it
/// at a quiet time.
///
/// ```no_run
/// # async fn f() -> Result<(), idem_runtime::Error> {
/// let pool = sqlx::SqlitePool::connect("sqlite::memory:").await?;
/// idem_runtime::migrate(&pool).await?;
/// # Ok(()) }
/// ```
pub async fn migrate<DB: Backend>(pool: &Pool<DB>) -> Result<(), Error> {
    migrate_to(pool, SCHEMA_VERSION).await
}

/// [`migrate`] to version `target` only (at most [`SCHEMA_VERSION`]): a
/// database as an earlier release's `migrate` left it, for tests of the
/// upgrade from it.
#[doc(hidden)]
pub async fn migrate_to<DB: Backend>(pool: &Pool<DB>, target: i64) -> Result<(), Error> {
    let target = target.min(SCHEMA_VERSION);
    let sql = crate::sql::of(DB::pool_dialect(pool));
    match &sql.migrate.lock {
        MigrateLock::Session {
            acquire,
            release,
            busy,
        } => {
            // A connection of its own: if anything fails it is closed, and
            // the server releases the lock with the session.
            let mut conn = pool.acquire().await?.detach();
            if DB::fetch_i64(&mut conn, acquire).await? != 1 {
                return Err(Error::Database(sqlx::Error::Protocol(busy.to_string())));
            }
            let result = upgrade::<DB>(&mut conn, sql, target).await;
            let released = DB::fetch_i64(&mut conn, release).await;
            let _ = conn.close().await;
            result?;
            released?;
            Ok(())
        }
        MigrateLock::Transaction { begin, lock } => {
            let mut conn = pool.acquire().await?;
            let mut tx = match begin {
                Some(begin) => (*conn).begin_with(*begin).await?,
                None => (*conn).begin().await?,
            };
            if let Some(lock) = lock {
                DB::execute_on(&mut *tx, lock).await?;
            }
            upgrade::<DB>(&mut *tx, sql, target).await?;
            tx.commit().await?;
            Ok(())
        }
    }
}

/// Brings the schema to version `target`, under the caller's lock.
async fn upgrade<DB: Backend>(
    conn: &mut DB::Connection,
    sql: &SqlSet,
    target: i64,
) -> Result<(), Error> {
    DB::execute_on(
        conn,
        "CREATE TABLE IF NOT EXISTS idem_schema_version (version BIGINT NOT NULL PRIMARY KEY)",
    )
    .await?;
    let current = DB::fetch_i64(
        conn,
        "SELECT COALESCE(MAX(version), 0) FROM idem_schema_version",
    )
    .await?;
    if current > SCHEMA_VERSION {
        return Err(Error::Config {
            reason: format!(
                "idem's tables are at schema version {current}, newer than this release's \
                 {SCHEMA_VERSION}: upgrade idem"
            ),
        });
    }
    if current >= target {
        return Ok(());
    }
    let probe = match sql.migrate.flavor_probe {
        Some(probe) => DB::fetch_i64(conn, probe).await?,
        None => 0,
    };
    for (n, step) in steps(sql, probe).iter().enumerate() {
        let version = n as i64 + 1;
        if version <= current || version > target {
            continue;
        }
        for stmt in step {
            DB::execute_on(conn, stmt).await?;
        }
        DB::execute_on(
            conn,
            &format!("INSERT INTO idem_schema_version (version) VALUES ({version})"),
        )
        .await?;
    }
    Ok(())
}

/// The statements of every version, in order: `steps[v - 1]` brings
/// version `v - 1` to `v` (each database's file holds its own).
fn steps(sql: &SqlSet, probe: i64) -> Vec<Vec<String>> {
    let base: Vec<String> = sql.schema.iter().map(|s| s.to_string()).collect();
    let mut all = vec![base];
    all.extend((sql.migrate.upgrades)(probe));
    all
}

/// idem's tables, in the order [`migrate`] creates them.
pub const TABLES: [&str; 4] = [
    "idem_record",
    "idem_outbox",
    "idem_record_history",
    "idem_outbox_history",
];

/// Which of [`TABLES`] exist (and can be read), in that order.
pub async fn existing_tables<DB: Backend>(
    pool: &Pool<DB>,
) -> Result<Vec<(&'static str, bool)>, Error> {
    let mut found = Vec::with_capacity(TABLES.len());
    for t in TABLES {
        found.push((t, DB::table_exists(pool, t).await?));
    }
    Ok(found)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_dialect_reaches_the_current_version() {
        for d in [Dialect::Postgres, Dialect::MySql, Dialect::Sqlite] {
            for probe in [0, 1] {
                let steps = steps(crate::sql::of(d), probe);
                assert_eq!(steps.len() as i64, SCHEMA_VERSION, "{d:?}");
                assert!(steps.iter().all(|s| !s.is_empty()), "{d:?}");
            }
        }
    }
}
