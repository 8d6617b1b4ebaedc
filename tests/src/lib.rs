//! Support for idem's integration tests: connections to the real servers
//! on this machine, with the skip rule (skipped locally when a server is
//! down, a failure when `CI=true`), and per-test table names.

pub mod proxy;

use sqlx::Connection;
use sqlx::mysql::{MySqlConnectOptions, MySqlPoolOptions};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions};
use sqlx::{MySqlPool, PgPool, SqlitePool};
use std::str::FromStr;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

/// PostgreSQL URL: `IDEM_TEST_POSTGRES_URL`, default the local server.
pub fn postgres_url() -> String {
    std::env::var("IDEM_TEST_POSTGRES_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into())
}

/// MariaDB URL: `IDEM_TEST_MYSQL_URL`, default the local server.
pub fn mysql_url() -> String {
    std::env::var("IDEM_TEST_MYSQL_URL")
        .unwrap_or_else(|_| "mysql://root@127.0.0.1:3306/test".into())
}

fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true" || v == "1")
}

/// A server is unreachable: in CI that fails the test, locally it is skipped.
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
/// idem's tables. SQLite needs no server, so this never skips.
pub async fn sqlite(max: u32) -> SqlitePool {
    let path = std::env::temp_dir().join(format!("idem-test-{}.db", unique("f")));
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

/// A name no other test (or earlier run) uses: `prefix_<pid>_<n>`.
pub fn unique(prefix: &str) -> String {
    static N: AtomicU32 = AtomicU32::new(0);
    format!(
        "{prefix}_{}_{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

/// A statement written with `?` placeholders, in the given dialect
/// (PostgreSQL gets `$1, $2, …`).
pub fn sql(
    dialect: idem_runtime::__private::Dialect,
    text: &'static str,
) -> sqlx::AssertSqlSafe<String> {
    if dialect != idem_runtime::__private::Dialect::Postgres {
        return sqlx::AssertSqlSafe(text.to_string());
    }
    let mut out = String::with_capacity(text.len() + 8);
    let mut n = 0;
    for c in text.chars() {
        if c == '?' {
            n += 1;
            out.push_str(&format!("${n}"));
        } else {
            out.push(c);
        }
    }
    sqlx::AssertSqlSafe(out)
}

/// A process-wide id base, so rows of this run never collide with rows of
/// an earlier run left in a shared server's tables.
pub fn id_base() -> i64 {
    static BASE: std::sync::OnceLock<i64> = std::sync::OnceLock::new();
    *BASE.get_or_init(|| {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("clock after 1970")
            .as_nanos() as i64;
        // 10^6 ids per run, distinct across runs.
        (nanos / 1_000) % 1_000_000_000 * 1_000_000
    })
}

/// A fresh id range of `n` ids.
pub fn ids(n: i64) -> i64 {
    static NEXT: std::sync::atomic::AtomicI64 = std::sync::atomic::AtomicI64::new(0);
    id_base() + NEXT.fetch_add(n, Ordering::Relaxed)
}

/// Runs `n` calls at once: each is spawned, and one barrier releases them
/// together, the way a burst of redeliveries arrives.
pub async fn concurrently<F, Fut, T>(n: usize, f: F) -> Vec<T>
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = T> + Send + 'static,
    T: Send + 'static,
{
    let barrier = std::sync::Arc::new(tokio::sync::Barrier::new(n));
    let tasks: Vec<_> = (0..n)
        .map(|_| {
            let b = barrier.clone();
            let fut = f();
            tokio::spawn(async move {
                b.wait().await;
                fut.await
            })
        })
        .collect();
    let mut out = Vec::with_capacity(n);
    for t in tasks {
        out.push(t.await.expect("task panicked"));
    }
    out
}

/// A `sqlx::Any` pool on `url` with idem's tables, or `None` (skipped).
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

/// A fresh SQLite file URL (WAL) for `sqlx::Any`.
pub fn sqlite_url() -> String {
    let path = std::env::temp_dir().join(format!("idem-test-{}.db", unique("any")));
    format!("sqlite://{}?mode=rwc", path.display())
}

/// Redis URL: `IDEM_TEST_REDIS_URL`, default the local server.
pub fn redis_url() -> String {
    std::env::var("IDEM_TEST_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379/".into())
}

/// Whether the local Redis answers (else the test is skipped, or fails in CI).
pub async fn redis_up() -> bool {
    let probe = async {
        let client = redis::Client::open(redis_url())?;
        let mut conn = client.get_multiplexed_async_connection().await?;
        redis::cmd("PING").query_async::<String>(&mut conn).await
    };
    match tokio::time::timeout(Duration::from_secs(2), probe).await {
        Ok(Ok(_)) => true,
        Ok(Err(e)) => {
            unreachable(&format!("Redis at {}", redis_url()), e);
            false
        }
        Err(_) => {
            unreachable(&format!("Redis at {}", redis_url()), "timed out");
            false
        }
    }
}

/// The value of a Redis key, read directly.
pub async fn redis_get(key: &str) -> Option<String> {
    let client = redis::Client::open(redis_url()).expect("redis url");
    let mut conn = client
        .get_multiplexed_async_connection()
        .await
        .expect("redis connection");
    redis::cmd("GET")
        .arg(key)
        .query_async(&mut conn)
        .await
        .expect("GET")
}
