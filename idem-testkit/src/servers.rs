//! Pools on the real servers of this machine, with idem's tables, and the
//! skip rule: a server that is down skips the test locally and fails it
//! when `CI=true` (or `CI=1`).

use crate::names::unique;
use sqlx::Connection;
use sqlx::mysql::{MySqlConnectOptions, MySqlPoolOptions};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions};
use sqlx::{MySqlPool, PgPool, SqlitePool};
use std::cell::RefCell;
use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

/// PostgreSQL URL: `IDEM_TEST_POSTGRES_URL`, default (also when set but
/// empty) the local server.
pub fn postgres_url() -> String {
    crate::env_setting("IDEM_TEST_POSTGRES_URL")
        .unwrap_or_else(|| "postgres://postgres@127.0.0.1:5432/test".into())
}

/// MariaDB URL: `IDEM_TEST_MYSQL_URL`, default (also when set but empty)
/// the local server.
pub fn mysql_url() -> String {
    crate::env_setting("IDEM_TEST_MYSQL_URL")
        .unwrap_or_else(|| "mysql://root@127.0.0.1:3306/test".into())
}

/// A fresh SQLite file URL (WAL) for `sqlx::Any`. The file is removed,
/// with its `-wal` and `-shm`, when the test ends ([`scratch_file`]).
pub fn sqlite_url() -> String {
    let path = scratch_file(&format!("idem-test-{}.db", unique("any")));
    format!("sqlite://{}?mode=rwc", path.display())
}

/// A path in the temporary directory for a SQLite database file named
/// `name`, removed (with its `-wal`, `-shm` and `-journal`) when the
/// calling thread ends: a test's, since libtest runs each test on a thread
/// of its own, which ends once the test's runtime, and with it every pool
/// and task of the test, is gone. A file made on a runtime's worker thread
/// goes when that runtime shuts down.
///
/// [`sqlite`] and [`sqlite_url`] take their files here, so that a test run
/// leaves no `idem-test-*.db` behind, also where a test failed or killed
/// a process mid-write.
pub fn scratch_file(name: &str) -> PathBuf {
    let path = std::env::temp_dir().join(name);
    // During the thread's own teardown nothing is registered any more:
    // the file is then left, as before.
    let _ = SCRATCH_FILES.try_with(|files| files.0.borrow_mut().push(path.clone()));
    path
}

/// The files [`scratch_file`] handed out on this thread.
struct ScratchFiles(RefCell<Vec<PathBuf>>);

impl Drop for ScratchFiles {
    fn drop(&mut self) {
        for path in self.0.get_mut().drain(..) {
            let _ = std::fs::remove_file(&path);
            for suffix in ["-wal", "-shm", "-journal"] {
                let mut name = path.clone().into_os_string();
                name.push(suffix);
                let _ = std::fs::remove_file(name);
            }
        }
    }
}

thread_local! {
    static SCRATCH_FILES: ScratchFiles = const { ScratchFiles(RefCell::new(Vec::new())) };
}

fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true" || v == "1")
}

/// A server is unreachable: in CI that fails the test, locally it is skipped.
///
/// Returns `None` so a caller can write `return unreachable(…).map(…)` or
/// simply ignore it and return early.
///
/// # Panics
///
/// When `CI` is `true` or `1`.
pub fn unreachable(what: &str, err: impl std::fmt::Display) -> Option<std::convert::Infallible> {
    if in_ci() {
        panic!("{what} is unreachable and CI=true: {err}");
    }
    eprintln!("SKIPPED: {what} is unreachable ({err}); start it to run this test");
    None
}

/// A pool on the local PostgreSQL with idem's tables, or `None` (skipped).
pub async fn postgres(max: u32) -> Option<PgPool> {
    let opts = PgConnectOptions::from_str(&postgres_url()).expect("valid URL");
    // One direct attempt first: a refused connection fails at once, where
    // the pool would keep retrying until its acquire time-out.
    if let Err(e) = sqlx::PgConnection::connect_with(&opts).await {
        unreachable(&format!("PostgreSQL at {}", postgres_url()), e);
        return None;
    }
    match PgPoolOptions::new()
        .max_connections(max)
        .acquire_timeout(Duration::from_secs(30))
        .connect_with(opts)
        .await
    {
        Ok(pool) => {
            idem_runtime::migrate(&pool)
                .await
                .expect("migrate postgres");
            Some(pool)
        }
        Err(e) => {
            unreachable(&format!("PostgreSQL at {}", postgres_url()), e);
            None
        }
    }
}

/// A pool on the local MariaDB with idem's tables, or `None` (skipped).
pub async fn mysql(max: u32) -> Option<MySqlPool> {
    let opts = MySqlConnectOptions::from_str(&mysql_url()).expect("valid URL");
    if let Err(e) = sqlx::MySqlConnection::connect_with(&opts).await {
        unreachable(&format!("MariaDB at {}", mysql_url()), e);
        return None;
    }
    match MySqlPoolOptions::new()
        .max_connections(max)
        .acquire_timeout(Duration::from_secs(30))
        .connect_with(opts)
        .await
    {
        Ok(pool) => {
            idem_runtime::migrate(&pool).await.expect("migrate mariadb");
            Some(pool)
        }
        Err(e) => {
            unreachable(&format!("MariaDB at {}", mysql_url()), e);
            None
        }
    }
}

/// A pool on a fresh SQLite file in the temporary directory (WAL), with
/// idem's tables, removed when the test ends ([`scratch_file`]). SQLite
/// needs no server, so this never skips.
pub async fn sqlite(max: u32) -> SqlitePool {
    let path = scratch_file(&format!("idem-test-{}.db", unique("f")));
    let opts = SqliteConnectOptions::new()
        .filename(&path)
        .create_if_missing(true)
        .journal_mode(SqliteJournalMode::Wal)
        .busy_timeout(Duration::from_secs(30));
    let pool = SqlitePoolOptions::new()
        .max_connections(max)
        .connect_with(opts)
        .await
        .expect("open sqlite file");
    idem_runtime::migrate(&pool).await.expect("migrate sqlite");
    pool
}

/// A `sqlx::Any` pool on `url` with idem's tables, or `None` (skipped).
///
/// Installs sqlx's default drivers; on SQLite every connection gets a 30 s
/// busy time-out.
pub async fn any(url: &str, max: u32) -> Option<sqlx::AnyPool> {
    sqlx::any::install_default_drivers();
    if let Err(e) = sqlx::AnyConnection::connect(url).await {
        unreachable(&format!("the database at {url}"), e);
        return None;
    }
    let pool = sqlx::any::AnyPoolOptions::new()
        .max_connections(max)
        .acquire_timeout(Duration::from_secs(30))
        .after_connect(|conn, _| {
            Box::pin(async move {
                if conn.backend_name() == "SQLite" {
                    sqlx::query("PRAGMA busy_timeout = 30000")
                        .execute(&mut *conn)
                        .await?;
                }
                Ok(())
            })
        })
        .connect(url)
        .await
        .expect("any pool");
    idem_runtime::migrate(&pool).await.expect("migrate");
    Some(pool)
}

/// A pool on the database `name` of the local PostgreSQL server (created
/// when missing; the name must be a plain identifier), with idem's tables,
/// or `None` (skipped). For tests that need several databases: shards.
///
/// # Panics
///
/// When the database cannot be created or migrated.
pub async fn postgres_database(name: &str, max: u32) -> Option<PgPool> {
    assert!(plain_identifier(name), "database name {name:?}");
    let opts = PgConnectOptions::from_str(&postgres_url()).expect("valid URL");
    let mut admin = match sqlx::PgConnection::connect_with(&opts).await {
        Ok(conn) => conn,
        Err(e) => {
            unreachable(&format!("PostgreSQL at {}", postgres_url()), e);
            return None;
        }
    };
    let exists: bool = sqlx::query_scalar(
        "SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_database WHERE datname = $1)",
    )
    .bind(name)
    .fetch_one(&mut admin)
    .await
    .expect("look the database up");
    if !exists {
        let create = format!("CREATE DATABASE {name}");
        if let Err(e) = sqlx::raw_sql(sqlx::AssertSqlSafe(create))
            .execute(&mut admin)
            .await
        {
            // Another test created it meanwhile: 42P04, or the catalog's
            // unique index (23505) when both ran at once.
            let code = e
                .as_database_error()
                .and_then(|d| d.code().map(|c| c.into_owned()));
            assert!(
                matches!(code.as_deref(), Some("42P04" | "23505")),
                "create database {name}: {e}"
            );
        }
    }
    let pool = PgPoolOptions::new()
        .max_connections(max)
        .acquire_timeout(Duration::from_secs(30))
        .connect_with(opts.database(name))
        .await
        .expect("connect to the new database");
    idem_runtime::migrate(&pool)
        .await
        .expect("migrate postgres");
    Some(pool)
}

/// A pool on the database `name` of the local MariaDB server (created when
/// missing; a plain identifier), with idem's tables, or `None` (skipped).
///
/// # Panics
///
/// When the database cannot be created or migrated.
pub async fn mysql_database(name: &str, max: u32) -> Option<MySqlPool> {
    assert!(plain_identifier(name), "database name {name:?}");
    let opts = MySqlConnectOptions::from_str(&mysql_url()).expect("valid URL");
    let mut admin = match sqlx::MySqlConnection::connect_with(&opts).await {
        Ok(conn) => conn,
        Err(e) => {
            unreachable(&format!("MariaDB at {}", mysql_url()), e);
            return None;
        }
    };
    let create = format!("CREATE DATABASE IF NOT EXISTS {name}");
    sqlx::raw_sql(sqlx::AssertSqlSafe(create))
        .execute(&mut admin)
        .await
        .expect("create database");
    let pool = MySqlPoolOptions::new()
        .max_connections(max)
        .acquire_timeout(Duration::from_secs(30))
        .connect_with(opts.database(name))
        .await
        .expect("connect to the new database");
    idem_runtime::migrate(&pool).await.expect("migrate mariadb");
    Some(pool)
}

/// `url` with its database replaced by `name` (its query string kept): the
/// URL of a database [`postgres_database`] or [`mysql_database`] made, for
/// a `sqlx::Any` pool or a process.
///
/// ```
/// let url = idem_testkit::database_url("postgres://u@h:5432/test?sslmode=disable", "other");
/// assert_eq!(url, "postgres://u@h:5432/other?sslmode=disable");
/// ```
pub fn database_url(url: &str, name: &str) -> String {
    let (base, query) = match url.split_once('?') {
        Some((b, q)) => (b, Some(q)),
        None => (url, None),
    };
    let (server, _) = base.rsplit_once('/').expect("a URL with a database");
    match query {
        Some(q) => format!("{server}/{name}?{q}"),
        None => format!("{server}/{name}"),
    }
}

fn plain_identifier(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 63
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
}
