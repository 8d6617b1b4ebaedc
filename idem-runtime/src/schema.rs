//! The runtime's own tables, created and upgraded with one call.
//!
//! The schema is versioned: `idem_schema_version` holds one row per version
//! applied. Version 1 is the tables as the first release created them
//! ([`Dialect::schema`]); each later version is an ordered list of upgrade
//! statements. A database without the version table (new, or created by a
//! release before versioning) gets version 1 (`CREATE … IF NOT EXISTS`,
//! which leaves existing tables alone) and then every upgrade, so a new
//! database and an upgraded one end with the same tables.

use crate::Error;
use crate::backend::{Backend, Dialect};
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
pub const SCHEMA_VERSION: i64 = 2;

/// MariaDB's `GET_LOCK` name, and how long to wait for it (seconds).
const MYSQL_LOCK: &str = "idem_migrate";
const MYSQL_LOCK_WAIT: u32 = 600;
/// PostgreSQL's advisory lock key.
const PG_LOCK: i64 = 4_242_424_242;

/// Creates idem's tables (`idem_record`, `idem_outbox`, and their history
/// tables `idem_record_history`, `idem_outbox_history`, see
/// [`archive`](crate::archive)) and their indexes if they do not exist,
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
    let dialect = DB::pool_dialect(pool);
    match dialect {
        Dialect::MySql => {
            // A connection of its own: if anything fails it is closed, and
            // the server releases the lock with the session.
            let mut conn = pool.acquire().await?.detach();
            let lock = format!(
                "SELECT CAST(COALESCE(GET_LOCK('{MYSQL_LOCK}', {MYSQL_LOCK_WAIT}), 0) AS SIGNED)"
            );
            if DB::fetch_i64(&mut conn, &lock).await? != 1 {
                return Err(Error::Database(sqlx::Error::Protocol(format!(
                    "migrate: another migration held the `{MYSQL_LOCK}` lock for {MYSQL_LOCK_WAIT} s"
                ))));
            }
            let result = upgrade::<DB>(&mut conn, dialect).await;
            let release =
                format!("SELECT CAST(COALESCE(RELEASE_LOCK('{MYSQL_LOCK}'), 0) AS SIGNED)");
            let released = DB::fetch_i64(&mut conn, &release).await;
            let _ = conn.close().await;
            result?;
            released?;
            Ok(())
        }
        Dialect::Postgres | Dialect::Sqlite => {
            let mut conn = pool.acquire().await?;
            let mut tx = if dialect == Dialect::Sqlite {
                (*conn).begin_with("BEGIN IMMEDIATE").await?
            } else {
                (*conn).begin().await?
            };
            if dialect == Dialect::Postgres {
                // Concurrent migrations wait for each other instead of
                // racing on the catalog.
                DB::execute_on(
                    &mut *tx,
                    &format!("SELECT pg_advisory_xact_lock({PG_LOCK})"),
                )
                .await?;
            }
            upgrade::<DB>(&mut *tx, dialect).await?;
            tx.commit().await?;
            Ok(())
        }
    }
}

/// Brings the schema to [`SCHEMA_VERSION`], under the caller's lock.
async fn upgrade<DB: Backend>(conn: &mut DB::Connection, dialect: Dialect) -> Result<(), Error> {
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
    if current == SCHEMA_VERSION {
        return Ok(());
    }
    let flavor = match dialect {
        Dialect::MySql => {
            let mariadb = DB::fetch_i64(
                conn,
                "SELECT COUNT(*) FROM information_schema.COLLATIONS \
                 WHERE COLLATION_NAME = 'utf8mb4_nopad_bin'",
            )
            .await?;
            if mariadb > 0 {
                MySqlFlavor::MariaDb
            } else {
                MySqlFlavor::MySql8
            }
        }
        _ => MySqlFlavor::MariaDb,
    };
    for (n, step) in steps(dialect, flavor).iter().enumerate() {
        let version = n as i64 + 1;
        if version <= current {
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

/// Which MariaDB-protocol server: the collations and the DDL differ.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum MySqlFlavor {
    /// MariaDB: `utf8mb4_nopad_bin`, `IF [NOT] EXISTS` on indexes and
    /// constraints.
    MariaDb,
    /// MySQL 8: `utf8mb4_0900_bin` (NO PAD); no `IF [NOT] EXISTS` there.
    MySql8,
}

/// The statements of every version, in order: `steps[v - 1]` brings
/// version `v - 1` to `v`.
fn steps(dialect: Dialect, flavor: MySqlFlavor) -> Vec<Vec<String>> {
    let base: Vec<String> = dialect.schema().iter().map(|s| s.to_string()).collect();
    let v2: Vec<String> = match dialect {
        Dialect::Postgres => PG_V2.iter().map(|s| s.to_string()).collect(),
        Dialect::Sqlite => LITE_V2.iter().map(|s| s.to_string()).collect(),
        Dialect::MySql => mysql_v2(flavor),
    };
    vec![base, v2]
}

/// Version 2 on PostgreSQL (one transaction).
const PG_V2: &[&str] = &[
    "UPDATE idem_record SET expire_time = create_time + interval '3650 days' \
     WHERE expire_time <= create_time",
    "ALTER TABLE idem_record DROP CONSTRAINT IF EXISTS uk_idem_record_key",
    // (key, biz_type): the same uniqueness as (biz_type, key), and the
    // index also serves the operator's look-up by key alone.
    "ALTER TABLE idem_record ADD CONSTRAINT uk_idem_record_key_type UNIQUE (idempotency_key, biz_type)",
    "ALTER TABLE idem_record ADD CONSTRAINT ck_idem_record_expire CHECK (expire_time > create_time)",
    "DROP INDEX IF EXISTS idx_idem_record_history_key",
    "CREATE INDEX IF NOT EXISTS idx_idem_record_history_key_type \
     ON idem_record_history (idempotency_key, biz_type)",
];

/// Version 2 on SQLite (one `BEGIN IMMEDIATE` transaction): a constraint
/// cannot be changed in place, so `idem_record` is rebuilt, keeping its
/// ids and its AUTOINCREMENT sequence (an archived record's id is never
/// handed out again: the history's primary key is that id).
const LITE_V2: &[&str] = &[
    "UPDATE idem_record SET expire_time = strftime('%Y-%m-%d %H:%M:%f', create_time, '+3650 days') \
     WHERE expire_time <= create_time",
    "CREATE TABLE idem_record_v2 (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        idempotency_key TEXT NOT NULL CHECK (length(idempotency_key) <= 128),
        biz_type TEXT NOT NULL,
        biz_no TEXT NOT NULL,
        fingerprint TEXT NOT NULL,
        result TEXT,
        create_time TEXT NOT NULL DEFAULT (strftime('%Y-%m-%d %H:%M:%f', 'now')),
        expire_time TEXT NOT NULL,
        CONSTRAINT uk_idem_record_key_type UNIQUE (idempotency_key, biz_type),
        CONSTRAINT ck_idem_record_expire CHECK (expire_time > create_time)
    )",
    "INSERT INTO idem_record_v2 \
     (id, idempotency_key, biz_type, biz_no, fingerprint, result, create_time, expire_time) \
     SELECT id, idempotency_key, biz_type, biz_no, fingerprint, result, create_time, expire_time \
     FROM idem_record",
    "DELETE FROM sqlite_sequence WHERE name = 'idem_record_v2'",
    "INSERT INTO sqlite_sequence (name, seq) \
     SELECT 'idem_record_v2', seq FROM sqlite_sequence WHERE name = 'idem_record'",
    "DROP TABLE idem_record",
    "ALTER TABLE idem_record_v2 RENAME TO idem_record",
    "CREATE INDEX IF NOT EXISTS idx_idem_record_expire ON idem_record (expire_time)",
    "DROP INDEX IF EXISTS idx_idem_record_history_key",
    "CREATE INDEX IF NOT EXISTS idx_idem_record_history_key_type \
     ON idem_record_history (idempotency_key, biz_type)",
];

/// Version 2 on MariaDB / MySQL: one `ALTER TABLE` per table (each atomic;
/// on MariaDB each can run again after a crash before the version was
/// recorded).
fn mysql_v2(flavor: MySqlFlavor) -> Vec<String> {
    let (c, if_exists, if_not_exists) = match flavor {
        MySqlFlavor::MariaDb => ("utf8mb4_nopad_bin", "IF EXISTS ", "IF NOT EXISTS "),
        MySqlFlavor::MySql8 => ("utf8mb4_0900_bin", "", ""),
    };
    let col = |name: &str, len: u32| {
        format!("MODIFY {name} VARCHAR({len}) CHARACTER SET utf8mb4 COLLATE {c} NOT NULL")
    };
    let record_keys = [
        col("idempotency_key", 128),
        col("biz_type", 64),
        col("biz_no", 128),
    ]
    .join(", ");
    let outbox_keys = [col("topic", 128), col("msg_id", 128)].join(", ");
    vec![
        "UPDATE idem_record SET expire_time = DATE_ADD(create_time, INTERVAL 3650 DAY) \
         WHERE expire_time <= create_time"
            .to_string(),
        format!(
            "ALTER TABLE idem_record {record_keys}, \
             DROP INDEX {if_exists}uk_idem_record_key, \
             ADD UNIQUE KEY {if_not_exists}uk_idem_record_key_type (idempotency_key, biz_type), \
             ADD CONSTRAINT {if_not_exists}ck_idem_record_expire CHECK (expire_time > create_time)"
        ),
        format!("ALTER TABLE idem_outbox {outbox_keys}"),
        format!(
            "ALTER TABLE idem_record_history {record_keys}, \
             DROP INDEX {if_exists}idx_idem_record_history_key, \
             ADD KEY {if_not_exists}idx_idem_record_history_key_type (idempotency_key, biz_type)"
        ),
        format!("ALTER TABLE idem_outbox_history {outbox_keys}"),
    ]
}
