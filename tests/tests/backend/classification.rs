//! Which database errors are retryable, on the real servers: each backend's
//! codes are read from its own driver error, so PostgreSQL's `22021` (a NUL
//! byte in a text value, from an attacker's payload) is permanent while
//! deadlocks, MariaDB's "record has changed since last read" (`1020`) and a
//! busy SQLite database are transient.

use std::time::Duration;

use idem_runtime::is_transient;
use idem_testkit::{unique, unreachable};
use sqlx::{AssertSqlSafe, Connection};

const LIMIT: Duration = Duration::from_secs(60);

fn code(e: &sqlx::Error) -> String {
    e.as_database_error()
        .and_then(|d| d.code())
        .map(|c| c.into_owned())
        .unwrap_or_else(|| format!("not a database error: {e}"))
}

mod postgres {
    use super::*;
    use sqlx::PgConnection;

    async fn connect() -> Option<PgConnection> {
        let url = idem_testkit::postgres_url();
        match PgConnection::connect(&url).await {
            Ok(c) => Some(c),
            Err(e) => {
                unreachable(&format!("PostgreSQL at {url}"), e);
                None
            }
        }
    }

    /// A NUL byte in a text bind: `22021`, permanent (it used to be
    /// "retryable": 22021 & 0xff is SQLite's busy code 5).
    #[tokio::test]
    async fn nul_byte_in_text_is_permanent() {
        let Some(mut conn) = connect().await else {
            return;
        };
        let err = sqlx::query_scalar::<_, String>("SELECT $1::text")
            .bind("pay\0load")
            .fetch_one(&mut conn)
            .await
            .expect_err("a NUL byte in text must fail");
        assert_eq!(code(&err), "22021", "{err}");
        assert!(!is_transient(&err), "22021 must be permanent: {err}");
        assert!(!idem_runtime::Error::Database(err).is_retryable());
    }

    /// The same through `sqlx::Any`: the driver's error comes through.
    #[tokio::test]
    async fn nul_byte_through_any_is_permanent() {
        sqlx::any::install_default_drivers();
        let url = idem_testkit::postgres_url();
        let Ok(mut conn) = sqlx::AnyConnection::connect(&url).await else {
            unreachable(&format!("PostgreSQL at {url}"), "connect failed");
            return;
        };
        let err = sqlx::query_scalar::<_, String>("SELECT $1::text")
            .bind("pay\0load")
            .fetch_one(&mut conn)
            .await
            .expect_err("a NUL byte in text must fail");
        assert_eq!(code(&err), "22021", "{err}");
        assert!(!is_transient(&err), "22021 must be permanent: {err}");
    }

    /// Insufficient privilege (`42501`) and a division by zero (`22012`):
    /// permanent.
    #[tokio::test]
    async fn other_errors_are_permanent() {
        let Some(mut conn) = connect().await else {
            return;
        };
        let err = sqlx::query("SELECT 1 / 0")
            .execute(&mut conn)
            .await
            .unwrap_err();
        assert_eq!(code(&err), "22012");
        assert!(!is_transient(&err), "{err}");
        let err = sqlx::query("DO $$ BEGIN RAISE EXCEPTION USING ERRCODE = '42501'; END $$")
            .execute(&mut conn)
            .await
            .unwrap_err();
        assert_eq!(code(&err), "42501");
        assert!(!is_transient(&err), "{err}");
    }

    /// Two transactions locking two rows in opposite orders: one of them
    /// gets `40P01`, transient.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn deadlock_is_transient() {
        tokio::time::timeout(LIMIT, async {
            let Some(mut a) = connect().await else { return };
            let mut b = connect().await.expect("second connection");
            let table = unique("deadlock");
            sqlx::query(AssertSqlSafe(format!(
                "CREATE TABLE {table} (id BIGINT PRIMARY KEY, n BIGINT NOT NULL)"
            )))
            .execute(&mut a)
            .await
            .unwrap();
            sqlx::query(AssertSqlSafe(format!(
                "INSERT INTO {table} VALUES (1, 0), (2, 0)"
            )))
            .execute(&mut a)
            .await
            .unwrap();
            let update =
                |id: i64| AssertSqlSafe(format!("UPDATE {table} SET n = n + 1 WHERE id = {id}"));
            let mut ta = a.begin().await.unwrap();
            let mut tb = b.begin().await.unwrap();
            sqlx::query(update(1)).execute(&mut *ta).await.unwrap();
            sqlx::query(update(2)).execute(&mut *tb).await.unwrap();
            let (ra, rb) = tokio::join!(
                sqlx::query(update(2)).execute(&mut *ta),
                sqlx::query(update(1)).execute(&mut *tb),
            );
            let err = match (ra, rb) {
                (Err(e), Ok(_)) | (Ok(_), Err(e)) => e,
                other => panic!("expected exactly one deadlock victim: {other:?}"),
            };
            drop((ta, tb));
            drop(b);
            sqlx::query(AssertSqlSafe(format!("DROP TABLE {table}")))
                .execute(&mut a)
                .await
                .unwrap();
            assert_eq!(code(&err), "40P01", "{err}");
            assert!(is_transient(&err), "a deadlock must be transient: {err}");
        })
        .await
        .expect("test time-out");
    }
}

mod mariadb {
    use super::*;
    use sqlx::MySqlConnection;

    async fn connect() -> Option<MySqlConnection> {
        let url = idem_testkit::mysql_url();
        match MySqlConnection::connect(&url).await {
            Ok(c) => Some(c),
            Err(e) => {
                unreachable(&format!("MariaDB at {url}"), e);
                None
            }
        }
    }

    fn number(e: &sqlx::Error) -> u16 {
        e.as_database_error()
            .and_then(|d| d.try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>())
            .map(|d| d.number())
            .unwrap_or_else(|| panic!("not a MariaDB error: {e}"))
    }

    async fn table_with_two_rows(conn: &mut MySqlConnection) -> String {
        let table = unique("conflict");
        sqlx::query(AssertSqlSafe(format!(
            "CREATE TABLE {table} (id BIGINT PRIMARY KEY, n BIGINT NOT NULL) ENGINE=InnoDB"
        )))
        .execute(&mut *conn)
        .await
        .unwrap();
        sqlx::query(AssertSqlSafe(format!(
            "INSERT INTO {table} VALUES (1, 0), (2, 0)"
        )))
        .execute(&mut *conn)
        .await
        .unwrap();
        table
    }

    /// Opposite lock orders: `1213`, transient.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn deadlock_is_transient() {
        tokio::time::timeout(LIMIT, async {
            let Some(mut a) = connect().await else { return };
            let mut b = connect().await.expect("second connection");
            let table = table_with_two_rows(&mut a).await;
            let update =
                |id: i64| AssertSqlSafe(format!("UPDATE {table} SET n = n + 1 WHERE id = {id}"));
            let mut ta = a.begin().await.unwrap();
            let mut tb = b.begin().await.unwrap();
            sqlx::query(update(1)).execute(&mut *ta).await.unwrap();
            sqlx::query(update(2)).execute(&mut *tb).await.unwrap();
            let (ra, rb) = tokio::join!(
                sqlx::query(update(2)).execute(&mut *ta),
                sqlx::query(update(1)).execute(&mut *tb),
            );
            let err = match (ra, rb) {
                (Err(e), Ok(_)) | (Ok(_), Err(e)) => e,
                other => panic!("expected exactly one deadlock victim: {other:?}"),
            };
            drop((ta, tb));
            drop(b);
            sqlx::query(AssertSqlSafe(format!("DROP TABLE {table}")))
                .execute(&mut a)
                .await
                .unwrap();
            assert_eq!(number(&err), 1213, "{err}");
            assert!(is_transient(&err), "a deadlock must be transient: {err}");
        })
        .await
        .expect("test time-out");
    }

    /// Snapshot isolation (the default from MariaDB 11.6, a session
    /// setting here): a row changed and committed by another transaction
    /// since this one's snapshot cannot be updated: `1020`, transient.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn record_changed_since_last_read_is_transient() {
        tokio::time::timeout(LIMIT, async {
            let Some(mut a) = connect().await else { return };
            let mut b = connect().await.expect("second connection");
            if let Err(e) = sqlx::query("SET SESSION innodb_snapshot_isolation = ON")
                .execute(&mut a)
                .await
            {
                eprintln!("SKIPPED: this server has no innodb_snapshot_isolation ({e})");
                return;
            }
            let table = table_with_two_rows(&mut a).await;
            let mut ta = a.begin().await.unwrap();
            // The snapshot is taken at the first read.
            sqlx::query(AssertSqlSafe(format!("SELECT n FROM {table} WHERE id = 1")))
                .execute(&mut *ta)
                .await
                .unwrap();
            sqlx::query(AssertSqlSafe(format!(
                "UPDATE {table} SET n = 5 WHERE id = 1"
            )))
            .execute(&mut b)
            .await
            .unwrap();
            let err = sqlx::query(AssertSqlSafe(format!(
                "UPDATE {table} SET n = n + 1 WHERE id = 1"
            )))
            .execute(&mut *ta)
            .await
            .expect_err("a write conflict under snapshot isolation");
            drop(ta);
            sqlx::query(AssertSqlSafe(format!("DROP TABLE {table}")))
                .execute(&mut b)
                .await
                .unwrap();
            assert_eq!(number(&err), 1020, "{err}");
            assert!(is_transient(&err), "1020 must be transient: {err}");
        })
        .await
        .expect("test time-out");
    }

    /// A duplicate key (`1062`): permanent.
    #[tokio::test]
    async fn duplicate_key_is_permanent() {
        let Some(mut a) = connect().await else { return };
        let table = table_with_two_rows(&mut a).await;
        let err = sqlx::query(AssertSqlSafe(format!("INSERT INTO {table} VALUES (1, 0)")))
            .execute(&mut a)
            .await
            .unwrap_err();
        sqlx::query(AssertSqlSafe(format!("DROP TABLE {table}")))
            .execute(&mut a)
            .await
            .unwrap();
        assert_eq!(number(&err), 1062);
        assert!(!is_transient(&err), "{err}");
    }
}

mod sqlite {
    use super::*;
    use sqlx::SqliteConnection;
    use sqlx::sqlite::SqliteConnectOptions;

    /// A second writer with no busy time-out while the first holds the
    /// write lock: `SQLITE_BUSY` (5), transient.
    #[tokio::test]
    async fn busy_is_transient() {
        let path = idem_testkit::scratch_file(&format!("{}.db", unique("idem-busy")));
        let opts = SqliteConnectOptions::new()
            .filename(&path)
            .create_if_missing(true)
            .busy_timeout(Duration::ZERO);
        let mut a = SqliteConnection::connect_with(&opts).await.unwrap();
        let mut b = SqliteConnection::connect_with(&opts).await.unwrap();
        sqlx::query("CREATE TABLE t (id INTEGER PRIMARY KEY)")
            .execute(&mut a)
            .await
            .unwrap();
        let ta = a.begin_with("BEGIN IMMEDIATE").await.unwrap();
        let err = sqlx::query("INSERT INTO t (id) VALUES (1)")
            .execute(&mut b)
            .await
            .expect_err("the write lock is held");
        drop(ta);
        let _ = std::fs::remove_file(&path);
        assert_eq!(code(&err), "5", "{err}");
        assert!(is_transient(&err), "SQLITE_BUSY must be transient: {err}");

        // A unique violation (2067): permanent.
        let err = sqlx::query("INSERT INTO t (id) VALUES (1), (1)")
            .execute(&mut a)
            .await
            .unwrap_err();
        assert!(!is_transient(&err), "{err}");
    }
}
