//! A handler cancelled while its `BEGIN` is in flight must not poison the
//! pool.
//!
//! sqlx counts a transaction only once the server's reply to `BEGIN` has
//! arrived. A future dropped in between (a `tokio::time::timeout`, a web
//! framework dropping the request of a client that hung up) used to return
//! its pooled connection with the server-side transaction open: later
//! autocommit writes on it were never committed, reads saw a frozen
//! snapshot, locks stayed held.
//!
//! Against the real servers, through the fault proxy holding the reply to
//! `BEGIN`: a pool of one connection, a generated handler called under a
//! time-out shorter than the hold; then the pool's connection must not be
//! inside a transaction (PostgreSQL: `pg_stat_activity`; MariaDB:
//! `information_schema.INNODB_TRX`), and an autocommit write through the
//! pool must be visible from another connection.
//!
//! Each backend also has a control: the same scenario with sqlx's own
//! `Pool::begin` as the cancelled call, which must leave the connection
//! inside its transaction (if sqlx ever makes `Pool::begin` safe, the
//! control fails and says so).
//!
//! On SQLite the `BEGIN IMMEDIATE` is held by another connection holding
//! the write lock, on the native pool and on `sqlx::Any`. SQLite's driver
//! is the exception among sqlx's (`idem_core::tx` says so): its worker
//! thread rolls back a `BEGIN` whose caller is gone, and sqlx's own
//! `Pool::begin_with` is held to that. The control cancels a raw
//! `BEGIN IMMEDIATE` statement (which the driver does not track), whose
//! open transaction the same checks catch.

use std::str::FromStr;
use std::time::Duration;

use idem_runtime::idempotent;
use idem_testkit::proxy::FaultProxy;
use idem_testkit::{unique, unreachable};
use serde::Serialize;
use sqlx::{AssertSqlSafe, Connection};

/// Every test is bounded: a bug must fail, not hang.
const LIMIT: Duration = Duration::from_secs(60);
/// How long the proxy holds the reply to `BEGIN`.
const HOLD: Duration = Duration::from_millis(1500);
/// The caller's time-out: well inside the hold.
const CANCEL_AFTER: Duration = Duration::from_millis(300);

#[derive(Debug, Serialize)]
struct Touch {
    id: i64,
}

/// What is cancelled during `BEGIN`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Cancelled {
    /// A generated handler (idem's `Backend::begin`).
    Handler,
    /// The control: sqlx's `Pool::begin`.
    PoolBegin,
}

mod postgres {
    use super::*;
    use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
    use sqlx::{PgConnection, Postgres, Transaction};

    #[idempotent(key = "cancel-pg:{t.id}", strategy = record, biz_type = "cancel_touch")]
    async fn touch(tx: &mut Transaction<'_, Postgres>, t: &Touch) -> Result<i64, sqlx::Error> {
        sqlx::query_scalar("SELECT 1::int8")
            .fetch_one(&mut **tx)
            .await
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn cancelled_during_begin_leaves_no_open_transaction() {
        tokio::time::timeout(LIMIT, run(Cancelled::Handler))
            .await
            .expect("test time-out");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn control_sqlx_pool_begin_cancelled_leaves_an_open_transaction() {
        tokio::time::timeout(LIMIT, run(Cancelled::PoolBegin))
            .await
            .expect("test time-out");
    }

    async fn run(call: Cancelled) {
        let url = idem_testkit::postgres_url();
        let mut direct = match PgConnection::connect(&url).await {
            Ok(c) => c,
            Err(e) => {
                unreachable(&format!("PostgreSQL at {url}"), e);
                return;
            }
        };
        // idem's tables.
        idem_testkit::postgres(1).await.expect("pool").close().await;
        let table = unique("cancel");
        sqlx::query(AssertSqlSafe(format!(
            "CREATE TABLE {table} (id BIGINT PRIMARY KEY)"
        )))
        .execute(&mut direct)
        .await
        .expect("create table");

        let proxy = FaultProxy::for_url(&url, 0.0).await.expect("start proxy");
        let app = unique("idem_cancel");
        let opts = PgConnectOptions::from_str(&proxy.url(&url))
            .expect("proxy URL")
            .application_name(&app);
        let pool = PgPoolOptions::new()
            .max_connections(1)
            .acquire_timeout(Duration::from_secs(20))
            .connect_with(opts)
            .await
            .expect("pool through the proxy");
        sqlx::query("SELECT 1")
            .execute(&pool)
            .await
            .expect("warm up");

        proxy.set_begin_hold(HOLD);
        let id = idem_testkit::id_base() + if call == Cancelled::Handler { 1 } else { 11 };
        let cancelled = match call {
            Cancelled::Handler => tokio::time::timeout(CANCEL_AFTER, touch(&pool, &Touch { id }))
                .await
                .map(drop),
            Cancelled::PoolBegin => tokio::time::timeout(CANCEL_AFTER, pool.begin())
                .await
                .map(drop),
        };
        assert!(cancelled.is_err(), "the call must still wait on BEGIN");
        assert!(proxy.begins_seen() >= 1, "the proxy saw no BEGIN");
        proxy.set_begin_hold(Duration::ZERO);
        // The held reply arrives, the connection goes back to the pool.
        tokio::time::sleep(HOLD + Duration::from_millis(700)).await;
        assert_eq!(proxy.begins_held(), 1, "the reply to BEGIN was not held");

        // An autocommit write through the pool (its one connection).
        sqlx::query(AssertSqlSafe(format!(
            "INSERT INTO {table} (id) VALUES (1)"
        )))
        .execute(&pool)
        .await
        .expect("autocommit insert");

        let states: Vec<String> = sqlx::query_scalar(
            "SELECT coalesce(state, '') FROM pg_catalog.pg_stat_activity WHERE application_name = $1",
        )
        .bind(&app)
        .fetch_all(&mut direct)
        .await
        .expect("pg_stat_activity");
        let visible: i64 = sqlx::query_scalar(AssertSqlSafe(format!(
            "SELECT count(*) FROM {table} WHERE id = 1"
        )))
        .fetch_one(&mut direct)
        .await
        .expect("count");
        // The handler works afterwards, on the pool's connection.
        let again = touch(&pool, &Touch { id: id + 1 }).await;

        pool.close().await;
        sqlx::query(AssertSqlSafe(format!("DROP TABLE {table}")))
            .execute(&mut direct)
            .await
            .expect("drop table");

        assert!(
            !states.is_empty(),
            "the pool's session is not in pg_stat_activity"
        );
        if call == Cancelled::PoolBegin {
            assert!(
                states.iter().any(|s| s == "idle in transaction") && visible == 0,
                "control: sqlx's Pool::begin no longer leaves the connection in a \
                 transaction (states {states:?}, visible {visible})"
            );
            return;
        }
        assert!(again.expect("a call after the cancelled one").is_executed());
        assert!(
            !states.is_empty(),
            "the pool's session is not in pg_stat_activity"
        );
        assert!(
            !states.iter().any(|s| s == "idle in transaction"),
            "the pool's connection was left inside a transaction: {states:?}"
        );
        assert_eq!(
            visible, 1,
            "the autocommit write through the pool is not visible"
        );
    }
}

mod mariadb {
    use super::*;
    use sqlx::mysql::MySqlPoolOptions;
    use sqlx::{MySql, MySqlConnection, Transaction};

    #[idempotent(key = "cancel-my:{t.id}", strategy = record, biz_type = "cancel_touch")]
    async fn touch(tx: &mut Transaction<'_, MySql>, t: &Touch) -> Result<i64, sqlx::Error> {
        sqlx::query_scalar("SELECT CAST(1 AS SIGNED)")
            .fetch_one(&mut **tx)
            .await
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn cancelled_during_begin_leaves_no_open_transaction() {
        tokio::time::timeout(LIMIT, run(Cancelled::Handler))
            .await
            .expect("test time-out");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn control_sqlx_pool_begin_cancelled_leaves_an_open_transaction() {
        tokio::time::timeout(LIMIT, run(Cancelled::PoolBegin))
            .await
            .expect("test time-out");
    }

    async fn run(call: Cancelled) {
        let url = idem_testkit::mysql_url();
        let mut direct = match MySqlConnection::connect(&url).await {
            Ok(c) => c,
            Err(e) => {
                unreachable(&format!("MariaDB at {url}"), e);
                return;
            }
        };
        idem_testkit::mysql(1).await.expect("pool").close().await;
        let table = unique("cancel");
        sqlx::query(AssertSqlSafe(format!(
            "CREATE TABLE {table} (id BIGINT PRIMARY KEY) ENGINE=InnoDB"
        )))
        .execute(&mut direct)
        .await
        .expect("create table");

        let proxy = FaultProxy::for_url(&url, 0.0).await.expect("start proxy");
        let pool = MySqlPoolOptions::new()
            .max_connections(1)
            .acquire_timeout(Duration::from_secs(20))
            .connect(&proxy.url(&url))
            .await
            .expect("pool through the proxy");
        let thread: u64 = sqlx::query_scalar("SELECT CONNECTION_ID()")
            .fetch_one(&pool)
            .await
            .expect("connection id");

        proxy.set_begin_hold(HOLD);
        let id = idem_testkit::id_base() + if call == Cancelled::Handler { 1 } else { 11 };
        let cancelled = match call {
            Cancelled::Handler => tokio::time::timeout(CANCEL_AFTER, touch(&pool, &Touch { id }))
                .await
                .map(drop),
            Cancelled::PoolBegin => tokio::time::timeout(CANCEL_AFTER, pool.begin())
                .await
                .map(drop),
        };
        assert!(cancelled.is_err(), "the call must still wait on BEGIN");
        assert!(proxy.begins_seen() >= 1, "the proxy saw no BEGIN");
        proxy.set_begin_hold(Duration::ZERO);
        tokio::time::sleep(HOLD + Duration::from_millis(700)).await;
        assert_eq!(proxy.begins_held(), 1, "the reply to BEGIN was not held");

        sqlx::query(AssertSqlSafe(format!(
            "INSERT INTO {table} (id) VALUES (1)"
        )))
        .execute(&pool)
        .await
        .expect("autocommit insert");
        // The pool's connection now: the same one, or its replacement.
        let now: u64 = sqlx::query_scalar("SELECT CONNECTION_ID()")
            .fetch_one(&pool)
            .await
            .expect("connection id");

        let open: i64 = sqlx::query_scalar(
            "SELECT COUNT(*) FROM information_schema.INNODB_TRX WHERE trx_mysql_thread_id IN (?, ?)",
        )
        .bind(thread)
        .bind(now)
        .fetch_one(&mut direct)
        .await
        .expect("INNODB_TRX");
        let visible: i64 = sqlx::query_scalar(AssertSqlSafe(format!(
            "SELECT COUNT(*) FROM {table} WHERE id = 1"
        )))
        .fetch_one(&mut direct)
        .await
        .expect("count");

        pool.close().await;
        sqlx::query(AssertSqlSafe(format!("DROP TABLE {table}")))
            .execute(&mut direct)
            .await
            .expect("drop table");

        if call == Cancelled::PoolBegin {
            // The bug's evidence is the autocommit write that returned Ok
            // and never committed: it ran inside the transaction sqlx did
            // not know about, which is still open (one INNODB_TRX row) or
            // was rolled back with its connection (none).
            assert!(
                visible == 0 && open <= 1,
                "control: sqlx's Pool::begin no longer leaves the connection in a \
                 transaction (INNODB_TRX rows {open}, visible {visible})"
            );
            return;
        }
        assert_eq!(
            open, 0,
            "the pool's connection was left inside a transaction"
        );
        assert_eq!(
            visible, 1,
            "the autocommit write through the pool is not visible"
        );
    }
}

mod sqlite {
    use super::*;
    use futures::future::BoxFuture;
    use sqlx::sqlite::{SqliteConnectOptions, SqliteConnection};
    use sqlx::{Any, AnyPool, Sqlite, SqlitePool, Transaction};

    #[idempotent(key = "cancel-lite:{t.id}", strategy = record, biz_type = "cancel_touch")]
    async fn touch(tx: &mut Transaction<'_, Sqlite>, t: &Touch) -> Result<i64, sqlx::Error> {
        sqlx::query_scalar("SELECT 1").fetch_one(&mut **tx).await
    }

    #[idempotent(key = "cancel-any:{t.id}", strategy = record, biz_type = "cancel_touch")]
    async fn touch_any(tx: &mut Transaction<'_, Any>, t: &Touch) -> Result<i64, sqlx::Error> {
        sqlx::query_scalar("SELECT 1").fetch_one(&mut **tx).await
    }

    /// One pool of one connection on a SQLite file, whichever driver.
    trait OnePool: Clone + Send + Sync + 'static {
        fn insert(&self, sql: String) -> BoxFuture<'_, Result<(), sqlx::Error>>;
        fn touch(&self, id: i64) -> BoxFuture<'_, Result<bool, String>>;
        fn pool_begin(&self) -> BoxFuture<'_, ()>;
        fn raw_begin(&self) -> BoxFuture<'_, ()>;
    }

    /// `OnePool` for a pool type, its calls through the handler `touch`.
    macro_rules! one_pool {
        ($pool:ty, $touch:ident) => {
            impl OnePool for $pool {
                fn insert(&self, sql: String) -> BoxFuture<'_, Result<(), sqlx::Error>> {
                    Box::pin(async move {
                        sqlx::query(AssertSqlSafe(sql))
                            .execute(self)
                            .await
                            .map(drop)
                    })
                }
                fn touch(&self, id: i64) -> BoxFuture<'_, Result<bool, String>> {
                    Box::pin(async move {
                        $touch(self, &Touch { id })
                            .await
                            .map(|o| o.is_executed())
                            .map_err(|e| e.to_string())
                    })
                }
                fn pool_begin(&self) -> BoxFuture<'_, ()> {
                    Box::pin(async move { drop(self.begin_with("BEGIN IMMEDIATE").await) })
                }
                fn raw_begin(&self) -> BoxFuture<'_, ()> {
                    Box::pin(async move {
                        let _ = sqlx::query("BEGIN IMMEDIATE").execute(self).await;
                    })
                }
            }
        };
    }

    one_pool!(SqlitePool, touch);
    one_pool!(AnyPool, touch_any);

    /// What is cancelled on SQLite.
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    enum Call {
        Handler,
        PoolBegin,
        /// The control: a `BEGIN IMMEDIATE` statement.
        Raw,
    }

    /// The pool's `BEGIN IMMEDIATE` waits for the write lock `blocker`
    /// holds; the call is cancelled meanwhile, then the lock is released.
    /// Returns whether an autocommit write through the pool afterwards is
    /// visible to another connection.
    async fn cancelled_then_visible(pool: impl OnePool, file: &std::path::Path, call: Call) -> i64 {
        let opts = SqliteConnectOptions::new().filename(file);
        let mut blocker = SqliteConnection::connect_with(&opts)
            .await
            .expect("a second connection");
        let table = unique("cancel");
        sqlx::query(AssertSqlSafe(format!(
            "CREATE TABLE {table} (id INTEGER PRIMARY KEY)"
        )))
        .execute(&mut blocker)
        .await
        .expect("create table");
        sqlx::query("BEGIN IMMEDIATE")
            .execute(&mut blocker)
            .await
            .expect("take the write lock");
        let id = idem_testkit::id_base() + 21;
        let waited = tokio::time::timeout(CANCEL_AFTER, async {
            match call {
                Call::Handler => drop(pool.touch(id).await),
                Call::PoolBegin => pool.pool_begin().await,
                Call::Raw => pool.raw_begin().await,
            }
        })
        .await;
        assert!(
            waited.is_err(),
            "the call must still wait for the write lock"
        );
        sqlx::query("COMMIT")
            .execute(&mut blocker)
            .await
            .expect("release the write lock");
        // Queued behind the cancelled BEGIN on the pool's one connection
        // (its worker runs commands in order): after its rollback, if any.
        pool.insert(format!("INSERT INTO {table} (id) VALUES (1)"))
            .await
            .expect("autocommit insert");
        let visible: i64 = sqlx::query_scalar(AssertSqlSafe(format!(
            "SELECT COUNT(*) FROM {table} WHERE id = 1"
        )))
        .fetch_one(&mut blocker)
        .await
        .expect("count");
        if call == Call::Handler && visible == 1 {
            assert!(
                pool.touch(id + 1)
                    .await
                    .expect("a call after the cancelled one"),
                "the next call executes"
            );
        }
        visible
    }

    async fn native(call: Call) -> i64 {
        let pool = idem_testkit::sqlite(1).await;
        let file = pool.connect_options().get_filename().to_owned();
        let visible = cancelled_then_visible(pool.clone(), &file, call).await;
        pool.close().await;
        visible
    }

    async fn any(call: Call) -> Option<i64> {
        let url = idem_testkit::sqlite_url();
        let pool = idem_testkit::any(&url, 1).await?;
        let file = std::path::PathBuf::from(
            url.trim_start_matches("sqlite://")
                .trim_end_matches("?mode=rwc"),
        );
        let visible = cancelled_then_visible(pool.clone(), &file, call).await;
        pool.close().await;
        Some(visible)
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn cancelled_during_begin_leaves_no_open_transaction() {
        let visible = tokio::time::timeout(LIMIT, native(Call::Handler))
            .await
            .expect("test time-out");
        assert_eq!(
            visible, 1,
            "the autocommit write through the pool is not visible"
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn cancelled_during_begin_on_any_leaves_no_open_transaction() {
        let visible = tokio::time::timeout(LIMIT, any(Call::Handler))
            .await
            .expect("test time-out");
        assert_eq!(
            visible,
            Some(1),
            "the autocommit write through the pool is not visible"
        );
    }

    /// sqlx's own `Pool::begin_with` (`BEGIN IMMEDIATE`, as idem's),
    /// cancelled, leaves no transaction open on SQLite.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn sqlx_pool_begin_cancelled_leaves_no_open_transaction() {
        let native = tokio::time::timeout(LIMIT, native(Call::PoolBegin))
            .await
            .expect("test time-out");
        let any = tokio::time::timeout(LIMIT, any(Call::PoolBegin))
            .await
            .expect("test time-out");
        assert_eq!(
            (native, any),
            (1, Some(1)),
            "sqlx's SQLite driver no longer rolls back a cancelled BEGIN (idem_core::tx's \
             documentation says it does)"
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn control_a_cancelled_begin_statement_leaves_an_open_transaction() {
        let visible = tokio::time::timeout(LIMIT, native(Call::Raw))
            .await
            .expect("test time-out");
        assert_eq!(
            visible, 0,
            "control: the checks above do not catch a transaction left open"
        );
    }
}
