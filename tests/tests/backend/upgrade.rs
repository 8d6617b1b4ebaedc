//! `migrate` upgrades a database created by the previous release in place:
//! the tables are created with that release's DDL (`upgrade/old_schema.rs`,
//! exactly as it shipped), filled with rows, then migrated — twice at once, and
//! once more. The rows survive, and the new rules hold: records unique per
//! `(biz_type, key)`, keys compared byte for byte on MariaDB, `expire_time`
//! after `create_time`, SQLite's id sequence kept. Against the real
//! servers, each in a fresh schema (PostgreSQL), database (MariaDB) or file
//! (SQLite) of its own.

use idem_runtime::Dialect;
use idem_runtime::testing::NewRecord;
use idem_runtime::{Backend, SCHEMA_VERSION};
use idem_testkit::sql;
use sqlx::Pool;

// The previous release's DDL (idem-runtime/src/backend.rs at 838c97b), verbatim.
mod old_schema;
use old_schema::{OLD_LITE, OLD_MY, OLD_PG};

/// A fresh PostgreSQL schema, and a pool whose search path is it.
async fn fresh_postgres() -> Option<(Pool<sqlx::Postgres>, String)> {
    use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
    use std::str::FromStr;
    let admin = idem_testkit::postgres(1).await?;
    let schema = idem_testkit::unique("idem_up");
    sqlx::query(sqlx::AssertSqlSafe(format!("CREATE SCHEMA {schema}")))
        .execute(&admin)
        .await
        .expect("create schema");
    let opts = PgConnectOptions::from_str(&idem_testkit::postgres_url())
        .expect("url")
        .options([("search_path", schema.as_str())]);
    let pool = PgPoolOptions::new()
        .max_connections(4)
        .connect_with(opts)
        .await
        .expect("pool");
    Some((pool, schema))
}

async fn drop_postgres(schema: &str) {
    let admin = idem_testkit::postgres(1).await.expect("admin");
    sqlx::query(sqlx::AssertSqlSafe(format!("DROP SCHEMA {schema} CASCADE")))
        .execute(&admin)
        .await
        .expect("drop schema");
}

/// A fresh MariaDB database, and a pool on it.
async fn fresh_mysql() -> Option<(Pool<sqlx::MySql>, String)> {
    use sqlx::mysql::{MySqlConnectOptions, MySqlPoolOptions};
    use std::str::FromStr;
    let admin = idem_testkit::mysql(1).await?;
    let db = idem_testkit::unique("idem_up");
    sqlx::query(sqlx::AssertSqlSafe(format!("CREATE DATABASE {db}")))
        .execute(&admin)
        .await
        .expect("create database");
    let opts = MySqlConnectOptions::from_str(&idem_testkit::mysql_url())
        .expect("url")
        .database(&db);
    let pool = MySqlPoolOptions::new()
        .max_connections(4)
        .connect_with(opts)
        .await
        .expect("pool");
    Some((pool, db))
}

async fn drop_mysql(db: &str) {
    let admin = idem_testkit::mysql(1).await.expect("admin");
    sqlx::query(sqlx::AssertSqlSafe(format!("DROP DATABASE {db}")))
        .execute(&admin)
        .await
        .expect("drop database");
}

/// A fresh SQLite file.
async fn fresh_sqlite() -> Option<(Pool<sqlx::Sqlite>, String)> {
    use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions};
    let path = idem_testkit::scratch_file(&format!("idem-test-{}.db", idem_testkit::unique("up")));
    let opts = SqliteConnectOptions::new()
        .filename(&path)
        .create_if_missing(true)
        .journal_mode(SqliteJournalMode::Wal)
        .busy_timeout(std::time::Duration::from_secs(30));
    let pool = SqlitePoolOptions::new()
        .max_connections(4)
        .connect_with(opts)
        .await
        .expect("open");
    Some((pool, path.display().to_string()))
}

async fn drop_sqlite(path: &str) {
    let _ = std::fs::remove_file(path);
}

/// The same through `sqlx::Any`: a URL to a fresh schema or database.
async fn fresh_any(url: String) -> Pool<sqlx::Any> {
    sqlx::any::install_default_drivers();
    sqlx::any::AnyPoolOptions::new()
        .max_connections(4)
        .connect(&url)
        .await
        .expect("any pool")
}

async fn fresh_any_postgres() -> Option<(Pool<sqlx::Any>, String)> {
    let (pool, schema) = fresh_postgres().await?;
    pool.close().await;
    let base = idem_testkit::postgres_url();
    let sep = if base.contains('?') { '&' } else { '?' };
    let url = format!("{base}{sep}options=-c%20search_path%3D{schema}");
    let pool = fresh_any(url).await;
    let current: String = sqlx::query_scalar("SELECT CAST(current_schema() AS TEXT)")
        .fetch_one(&pool)
        .await
        .expect("schema");
    assert_eq!(current, schema);
    Some((pool, schema))
}

async fn fresh_any_mysql() -> Option<(Pool<sqlx::Any>, String)> {
    let (pool, db) = fresh_mysql().await?;
    pool.close().await;
    let base = idem_testkit::mysql_url();
    let (server, _) = base.rsplit_once('/').expect("a database in the URL");
    let pool = fresh_any(format!("{server}/{db}")).await;
    let current: String = sqlx::query_scalar("SELECT CAST(DATABASE() AS CHAR)")
        .fetch_one(&pool)
        .await
        .expect("database");
    assert_eq!(current, db);
    Some((pool, db))
}

macro_rules! upgrade_tests {
    ($module:ident, $db:ty, $dialect:expr, $fresh:expr, $old:expr, $drop:ident) => {
        mod $module {
            use super::*;
            type Db = $db;
            const D: Dialect = $dialect;

            /// A literal timestamp far in the future, in the dialect.
            fn later() -> &'static str {
                match D {
                    Dialect::Postgres => "TIMESTAMPTZ '2099-01-01 00:00:00+00'",
                    _ => "'2099-01-01 00:00:00.000'",
                }
            }

            async fn exec(pool: &Pool<Db>, text: String) -> Result<u64, sqlx::Error> {
                Ok(sqlx::query(sqlx::AssertSqlSafe(text)).execute(pool).await?.rows_affected())
            }

            async fn count(pool: &Pool<Db>, text: &'static str) -> i64 {
                sqlx::query_scalar(sql(D, text)).fetch_one(pool).await.expect(text)
            }

            async fn insert_record(pool: &Pool<Db>, key: &str, biz_type: &str) -> Result<u64, sqlx::Error> {
                exec(pool, format!(
                    "INSERT INTO idem_record (idempotency_key, biz_type, biz_no, fingerprint, result, expire_time) \
                     VALUES ('{key}', '{biz_type}', 'n', 'f', '\"x\"', {})", later()
                )).await
            }

            #[tokio::test]
            async fn migrate_upgrades_the_previous_schema_in_place_keeping_its_rows() {
                let Some((pool, name)) = $fresh else { return };
                // The previous release's tables, with rows.
                {
                    let mut tx = pool.begin().await.expect("begin");
                    for stmt in $old {
                        sqlx::query(*stmt).execute(&mut *tx).await.expect(stmt);
                    }
                    tx.commit().await.expect("commit");
                }
                for k in ["k1", "k2", "k3"] {
                    insert_record(&pool, k, "a").await.expect("old record");
                }
                exec(&pool, "DELETE FROM idem_record WHERE idempotency_key = 'k3'".into()).await.expect("delete");
                exec(&pool, format!(
                    "INSERT INTO idem_record_history (id, idempotency_key, biz_type, biz_no, fingerprint, result, \
                     create_time, expire_time, archived_at) VALUES (3, 'k3', 'a', 'n', 'f', NULL, {0}, {0}, {0})", later()
                )).await.expect("history");
                exec(&pool, "INSERT INTO idem_outbox (topic, msg_id, payload) VALUES ('t', 'm-1', '{}')".into())
                    .await
                    .expect("outbox");
                if D == Dialect::MySql {
                    // What `INSERT IGNORE` stored for a ttl past year 9999.
                    exec(&pool, "INSERT INTO idem_record (idempotency_key, biz_type, biz_no, fingerprint, expire_time) \
                        VALUES ('k-zero', 'a', 'n', 'f', '0000-00-00 00:00:00')".into()).await.expect("zero date");
                }
                let old_records = count(&pool, "SELECT COUNT(*) FROM idem_record").await;
                // The upgrade, twice at once, then once more.
                let (a, b) = tokio::join!(idem_runtime::migrate(&pool), idem_runtime::migrate(&pool));
                a.expect("first migrate");
                b.expect("concurrent migrate");
                idem_runtime::migrate(&pool).await.expect("migrate again");
                let version: i64 = sqlx::query_scalar("SELECT MAX(version) FROM idem_schema_version")
                    .fetch_one(&pool)
                    .await
                    .expect("version");
                assert_eq!(version, SCHEMA_VERSION);
                // The rows survived.
                assert_eq!(count(&pool, "SELECT COUNT(*) FROM idem_record").await, old_records);
                assert_eq!(count(&pool, "SELECT COUNT(*) FROM idem_record WHERE idempotency_key = 'k1' AND result = '\"x\"'").await, 1);
                assert_eq!(count(&pool, "SELECT COUNT(*) FROM idem_record_history WHERE idempotency_key = 'k3'").await, 1);
                assert_eq!(count(&pool, "SELECT COUNT(*) FROM idem_outbox WHERE msg_id = 'm-1'").await, 1);
                if D == Dialect::MySql {
                    // The zero date was repaired to the longest ttl.
                    assert_eq!(count(&pool, "SELECT COUNT(*) FROM idem_record WHERE idempotency_key = 'k-zero' \
                        AND expire_time = DATE_ADD(create_time, INTERVAL 3650 DAY)").await, 1);
                }
                // A new record never reuses an archived record's id.
                let mut tx = <Db as Backend>::begin(&pool).await.expect("begin");
                let rec = NewRecord { key: "k-new", biz_type: "a", biz_no: "n", fingerprint: "f", ttl_secs: 60 };
                assert!(<Db as Backend>::claim_record(&mut tx, &rec).await.expect("claim"));
                tx.commit().await.expect("commit");
                let id: i64 = sqlx::query_scalar("SELECT id FROM idem_record WHERE idempotency_key = 'k-new'")
                    .fetch_one(&pool)
                    .await
                    .expect("id");
                assert!(id > 3, "new record got id {id}, the id of an archived record");
                // Unique per (biz_type, key).
                insert_record(&pool, "k1", "b").await.expect("same key, other biz_type");
                let dup = insert_record(&pool, "k1", "a").await.expect_err("same key and biz_type");
                assert!(matches!(&dup, sqlx::Error::Database(d) if d.is_unique_violation()), "{dup}");
                // Byte-for-byte keys (MariaDB was PAD SPACE).
                insert_record(&pool, "k1 ", "a").await.expect("trailing space");
                exec(&pool, "INSERT INTO idem_outbox (topic, msg_id, payload) VALUES ('t', 'm-1 ', '{}')".into())
                    .await
                    .expect("msg_id with a trailing space");
                // expire_time after create_time.
                let past = match D {
                    Dialect::Postgres => "TIMESTAMPTZ '2000-01-01 00:00:00+00'",
                    _ => "'2000-01-01 00:00:00.000'",
                };
                let bad = exec(&pool, format!(
                    "INSERT INTO idem_record (idempotency_key, biz_type, biz_no, fingerprint, expire_time) \
                     VALUES ('k-past', 'a', 'n', 'f', {past})"
                )).await;
                assert!(bad.is_err(), "a record expiring before it was created was stored");
                pool.close().await;
                $drop(&name).await;
            }

            /// Version 2 (what the release before ordering keys, delays
            /// and headers created) to 3: the outbox keeps its rows, its
            /// pending messages are delivered by the new relay, and new
            /// messages carry keys and headers.
            #[tokio::test]
            async fn migrate_upgrades_a_version_2_outbox_in_place() {
                use idem_runtime::Outcome;
                use idem_runtime::outbox::{EnqueueOptions, Relay, enqueue_with};
                use std::sync::{Arc, Mutex};
                let Some((pool, name)) = $fresh else { return };
                idem_runtime::schema::migrate_to(&pool, 2).await.expect("version 2");
                let version: i64 = sqlx::query_scalar("SELECT MAX(version) FROM idem_schema_version")
                    .fetch_one(&pool)
                    .await
                    .expect("version");
                assert_eq!(version, 2);
                let v3_insert = "INSERT INTO idem_outbox (topic, msg_id, payload, ordering_key) \
                    VALUES ('up', 'k', '{}', 'key')";
                assert!(exec(&pool, v3_insert.into()).await.is_err(), "version 2 has no ordering_key");
                for (msg, status) in [("m-1", "pending"), ("m-2", "pending"), ("m-0", "success")] {
                    exec(&pool, format!(
                        "INSERT INTO idem_outbox (topic, msg_id, payload, status) \
                         VALUES ('up', '{msg}', '{{\"n\": 1}}', '{status}')"
                    )).await.expect("a version 2 row");
                }
                let (a, b) = tokio::join!(idem_runtime::migrate(&pool), idem_runtime::migrate(&pool));
                a.expect("first migrate");
                b.expect("concurrent migrate");
                idem_runtime::migrate(&pool).await.expect("migrate again");
                let version: i64 = sqlx::query_scalar("SELECT MAX(version) FROM idem_schema_version")
                    .fetch_one(&pool)
                    .await
                    .expect("version");
                assert_eq!(version, SCHEMA_VERSION);
                assert_eq!(count(&pool, "SELECT COUNT(*) FROM idem_outbox WHERE ordering_key IS NULL AND headers IS NULL").await, 3);
                // New messages with a key and headers, then the old ones
                // and the new delivered by the new relay.
                let mut tx = pool.begin().await.expect("begin");
                for n in 0..2 {
                    let options = EnqueueOptions::new().ordering_key("order-1").header("n", n.to_string());
                    enqueue_with(&mut tx, "up", &format!("new-{n}"), &serde_json::json!({ "n": n }), &options)
                        .await
                        .expect("enqueue with options");
                }
                tx.commit().await.expect("commit");
                let seen = Arc::new(Mutex::new(Vec::new()));
                let log = seen.clone();
                let relay = Relay::new(pool.clone()).route("up", move |d, _m: serde_json::Value| {
                    let log = log.clone();
                    async move {
                        let entry = (d.msg_id.clone(), d.ordering_key().map(str::to_owned), d.header("n").map(str::to_owned));
                        log.lock().unwrap().push(entry);
                        Ok(Outcome::Executed(()))
                    }
                });
                while relay.run_once().await.expect("a round") > 0 {}
                let mut seen = seen.lock().unwrap().clone();
                seen.sort();
                assert_eq!(seen, [
                    ("m-1".to_owned(), None, None),
                    ("m-2".to_owned(), None, None),
                    ("new-0".to_owned(), Some("order-1".to_owned()), Some("0".to_owned())),
                    ("new-1".to_owned(), Some("order-1".to_owned()), Some("1".to_owned())),
                ]);
                assert_eq!(count(&pool, "SELECT COUNT(*) FROM idem_outbox WHERE status = 'success'").await, 5);
                pool.close().await;
                $drop(&name).await;
            }
        }
    };
}

idem_testkit::for_each_backend!(upgrade_tests;
    postgres { fresh_postgres().await } => (OLD_PG, drop_postgres),
    mariadb { fresh_mysql().await } as mysql => (OLD_MY, drop_mysql),
    sqlite { fresh_sqlite().await } => (OLD_LITE, drop_sqlite),
    any_postgres { fresh_any_postgres().await } => (OLD_PG, drop_postgres),
    any_mariadb { fresh_any_mysql().await } as any_mysql => (OLD_MY, drop_mysql),
);

/// MariaDB's DDL is not transactional: a migration that died after its
/// first `ALTER TABLE`, before recording the version, runs again cleanly.
#[tokio::test]
async fn mariadb_resumes_an_upgrade_that_died_half_way() {
    let Some((pool, db)) = fresh_mysql().await else {
        return;
    };
    for stmt in OLD_MY {
        sqlx::query(*stmt).execute(&pool).await.expect(stmt);
    }
    sqlx::query(
        "INSERT INTO idem_record (idempotency_key, biz_type, biz_no, fingerprint, expire_time) \
         VALUES ('k1', 'a', 'n', 'f', '2099-01-01 00:00:00')",
    )
    .execute(&pool)
    .await
    .expect("old record");
    // What the first statements of version 2 did before the crash.
    sqlx::query("CREATE TABLE idem_schema_version (version BIGINT NOT NULL PRIMARY KEY)")
        .execute(&pool)
        .await
        .expect("version table");
    sqlx::query("INSERT INTO idem_schema_version (version) VALUES (1)")
        .execute(&pool)
        .await
        .expect("version 1");
    sqlx::query(
        "ALTER TABLE idem_record \
         MODIFY idempotency_key VARCHAR(128) CHARACTER SET utf8mb4 COLLATE utf8mb4_nopad_bin NOT NULL, \
         DROP INDEX uk_idem_record_key, \
         ADD UNIQUE KEY uk_idem_record_key_type (idempotency_key, biz_type), \
         ADD CONSTRAINT ck_idem_record_expire CHECK (expire_time > create_time)",
    )
    .execute(&pool)
    .await
    .expect("half the upgrade");
    idem_runtime::migrate(&pool).await.expect("resume");
    let version: i64 = sqlx::query_scalar("SELECT MAX(version) FROM idem_schema_version")
        .fetch_one(&pool)
        .await
        .expect("version");
    assert_eq!(version, SCHEMA_VERSION);
    let indexes: Vec<String> = sqlx::query_scalar(
        "SELECT DISTINCT CAST(INDEX_NAME AS CHAR) FROM information_schema.STATISTICS \
         WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = 'idem_record' ORDER BY 1",
    )
    .fetch_all(&pool)
    .await
    .expect("indexes");
    assert_eq!(
        indexes,
        [
            "idx_idem_record_expire",
            "PRIMARY",
            "uk_idem_record_key_type"
        ]
    );
    let collations: Vec<String> = sqlx::query_scalar(
        "SELECT CAST(COLLATION_NAME AS CHAR) FROM information_schema.COLUMNS \
         WHERE TABLE_SCHEMA = DATABASE() AND COLUMN_NAME IN \
         ('idempotency_key', 'biz_type', 'biz_no', 'topic', 'msg_id')",
    )
    .fetch_all(&pool)
    .await
    .expect("collations");
    // Five key columns online and in the history, and version 4's
    // paused topic.
    assert_eq!(collations.len(), 11);
    assert!(
        collations.iter().all(|c| c == "utf8mb4_nopad_bin"),
        "{collations:?}"
    );
    let n: i64 =
        sqlx::query_scalar("SELECT COUNT(*) FROM idem_record WHERE idempotency_key = 'k1'")
            .fetch_one(&pool)
            .await
            .expect("rows");
    assert_eq!(n, 1);
    pool.close().await;
    drop_mysql(&db).await;
}
