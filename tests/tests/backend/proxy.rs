//! The fault-injection proxy (`idem_testkit::proxy`): the article's "lost
//! commit acknowledgement", for real.
//!
//! Against the real servers: through the proxy, a `COMMIT` whose reply is
//! dropped fails on the client with an I/O error, while the row is in the
//! table (the server committed), through the simple and the extended
//! protocol. The framing, against fake servers on loopback, is tested in
//! the kit itself (`idem-testkit/tests/proxy_framing.rs`).

use std::collections::BTreeSet;
use std::time::Duration;

use idem_runtime::Dialect;
use idem_testkit::proxy::FaultProxy;
use idem_testkit::{sql, unique, unreachable};

/// Every test is bounded: a proxy bug must fail, not hang.
const LIMIT: Duration = Duration::from_secs(60);

/// Asserts that a commit failed the way a lost acknowledgement fails: an
/// I/O error, not an answer from the database.
fn assert_io_error(err: &sqlx::Error) {
    assert!(
        matches!(err, sqlx::Error::Io(_)),
        "expected an I/O error from the lost acknowledgement, got {err:?}"
    );
}

macro_rules! backend_tests {
    ($module:ident, $db:ty, $dialect:expr, $url:expr, $what:literal) => {
        mod $module {
            use super::*;
            use sqlx::pool::PoolOptions;
            use sqlx::{AssertSqlSafe, Connection, Pool};

            type Db = $db;
            type Conn = <Db as sqlx::Database>::Connection;
            const D: Dialect = $dialect;

            fn base_url() -> String {
                $url
            }

            /// A direct connection (not through the proxy), or `None`:
            /// skipped locally when the server is down.
            async fn direct() -> Option<Conn> {
                match Conn::connect(&base_url()).await {
                    Ok(c) => Some(c),
                    Err(e) => {
                        unreachable(&format!("{} at {}", $what, base_url()), e);
                        None
                    }
                }
            }

            async fn create_table(conn: &mut Conn) -> String {
                let table = unique("proxy");
                sqlx::query(AssertSqlSafe(format!(
                    "CREATE TABLE {table} (id BIGINT PRIMARY KEY)"
                )))
                .execute(&mut *conn)
                .await
                .expect("create table");
                table
            }

            async fn drop_table(conn: &mut Conn, table: &str) {
                sqlx::query(AssertSqlSafe(format!("DROP TABLE {table}")))
                    .execute(&mut *conn)
                    .await
                    .expect("drop table");
            }

            async fn ids_in(conn: &mut Conn, table: &str) -> BTreeSet<i64> {
                sqlx::query_scalar::<Db, i64>(AssertSqlSafe(format!("SELECT id FROM {table}")))
                    .fetch_all(&mut *conn)
                    .await
                    .expect("select ids")
                    .into_iter()
                    .collect()
            }

            fn insert(table: &str) -> AssertSqlSafe<String> {
                let text = sql(D, "INSERT INTO TABLE_NAME (id) VALUES (?)").0;
                AssertSqlSafe(text.replace("TABLE_NAME", table))
            }

            /// One single-row transaction on a pool through the proxy.
            async fn insert_one(pool: &Pool<Db>, table: &str, id: i64) -> Result<(), sqlx::Error> {
                let mut tx = pool.begin().await?;
                sqlx::query(insert(table))
                    .bind(id)
                    .execute(&mut *tx)
                    .await?;
                tx.commit().await
            }

            /// The acknowledgement of the COMMIT is lost: the client sees an
            /// I/O error, yet the server committed the row.
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn lost_ack_but_committed() {
                tokio::time::timeout(LIMIT, async {
                    let Some(mut direct) = direct().await else {
                        return;
                    };
                    let table = create_table(&mut direct).await;
                    let proxy = FaultProxy::for_url(&base_url(), 1.0)
                        .await
                        .expect("start proxy");

                    let mut conn = Conn::connect(&proxy.url(&base_url()))
                        .await
                        .expect("connect through the proxy");
                    let mut tx = conn.begin().await.expect("begin");
                    sqlx::query(insert(&table))
                        .bind(1_i64)
                        .execute(&mut *tx)
                        .await
                        .expect("insert");
                    let err = tx
                        .commit()
                        .await
                        .expect_err("the COMMIT's reply was dropped");
                    assert_io_error(&err);
                    drop(conn);

                    assert_eq!(proxy.commits_seen(), 1);
                    assert_eq!(proxy.acks_dropped(), 1);
                    // The server did commit.
                    assert_eq!(ids_in(&mut direct, &table).await, BTreeSet::from([1]));
                    drop_table(&mut direct, &table).await;
                })
                .await
                .expect("test timed out");
            }

            /// With the drop fraction at 0, the proxy is transparent.
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn no_drops_all_commit() {
                const N: i64 = 30;
                tokio::time::timeout(LIMIT, async {
                    let Some(mut direct) = direct().await else {
                        return;
                    };
                    let table = create_table(&mut direct).await;
                    let proxy = FaultProxy::for_url(&base_url(), 0.0)
                        .await
                        .expect("start proxy");
                    let pool: Pool<Db> = PoolOptions::new()
                        .max_connections(4)
                        .connect(&proxy.url(&base_url()))
                        .await
                        .expect("pool through the proxy");

                    let results = futures::future::join_all((0..N).map(|id| {
                        let (pool, table) = (pool.clone(), table.clone());
                        async move { insert_one(&pool, &table, id).await }
                    }))
                    .await;
                    for r in results {
                        r.expect("commit through a transparent proxy");
                    }
                    pool.close().await;

                    assert_eq!(proxy.commits_seen(), N as u64);
                    assert_eq!(proxy.acks_dropped(), 0);
                    assert_eq!(ids_in(&mut direct, &table).await, (0..N).collect());
                    drop_table(&mut direct, &table).await;
                })
                .await
                .expect("test timed out");
            }

            /// Half the acknowledgements lost: every commit the client saw
            /// fail is nevertheless in the table, as are all the others.
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn half_dropped_all_committed() {
                const N: i64 = 40;
                const WORKERS: i64 = 4;
                tokio::time::timeout(LIMIT, async {
                    let Some(mut direct) = direct().await else {
                        return;
                    };
                    let table = create_table(&mut direct).await;
                    let proxy = FaultProxy::for_url(&base_url(), 0.5)
                        .await
                        .expect("start proxy");
                    // A broken connection is discarded; the pool opens new ones.
                    let pool: Pool<Db> = PoolOptions::new()
                        .min_connections(0)
                        .max_connections(WORKERS as u32)
                        .test_before_acquire(true)
                        .connect(&proxy.url(&base_url()))
                        .await
                        .expect("pool through the proxy");

                    let workers = (0..WORKERS).map(|w| {
                        let (pool, table) = (pool.clone(), table.clone());
                        async move {
                            let mut outcome = Vec::new();
                            for id in (0..N).filter(|id| id % WORKERS == w) {
                                outcome.push((id, insert_one(&pool, &table, id).await));
                            }
                            outcome
                        }
                    });
                    let outcomes: Vec<_> = futures::future::join_all(workers)
                        .await
                        .into_iter()
                        .flatten()
                        .collect();
                    pool.close().await;

                    let mut failed = BTreeSet::new();
                    for (id, r) in outcomes {
                        if let Err(e) = r {
                            assert_io_error(&e);
                            failed.insert(id);
                        }
                    }
                    assert_eq!(proxy.commits_seen(), N as u64);
                    assert_eq!(failed.len() as u64, proxy.acks_dropped());
                    assert!(
                        !failed.is_empty(),
                        "0 of {N} acknowledgements dropped at 0.5"
                    );
                    assert!(
                        failed.len() < N as usize,
                        "all {N} acknowledgements dropped at 0.5"
                    );
                    // Committed, all of them: the failed ones included.
                    let present = ids_in(&mut direct, &table).await;
                    assert!(
                        failed.is_subset(&present),
                        "a commit reported failed was lost"
                    );
                    assert_eq!(present, (0..N).collect());
                    drop_table(&mut direct, &table).await;
                })
                .await
                .expect("test timed out");
            }

            /// The fraction can be changed while connections are open.
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn drop_fraction_is_adjustable() {
                tokio::time::timeout(LIMIT, async {
                    let Some(mut direct) = direct().await else {
                        return;
                    };
                    let table = create_table(&mut direct).await;
                    let proxy = FaultProxy::for_url(&base_url(), 0.0)
                        .await
                        .expect("start proxy");
                    let mut conn = Conn::connect(&proxy.url(&base_url()))
                        .await
                        .expect("connect through the proxy");
                    for id in 0..3_i64 {
                        let mut tx = conn.begin().await.expect("begin");
                        sqlx::query(insert(&table))
                            .bind(id)
                            .execute(&mut *tx)
                            .await
                            .expect("insert");
                        tx.commit().await.expect("commit while disabled");
                    }
                    proxy.set_drop_fraction(1.0);
                    let mut tx = conn.begin().await.expect("begin");
                    sqlx::query(insert(&table))
                        .bind(3_i64)
                        .execute(&mut *tx)
                        .await
                        .expect("insert");
                    assert_io_error(&tx.commit().await.expect_err("commit once enabled"));
                    drop(conn);
                    assert_eq!((proxy.commits_seen(), proxy.acks_dropped()), (4, 1));
                    assert_eq!(ids_in(&mut direct, &table).await, (0..4).collect());
                    drop_table(&mut direct, &table).await;
                })
                .await
                .expect("test timed out");
            }
        }
    };
}

idem_testkit::for_each_backend!(backend_tests;
    postgres { idem_testkit::postgres_url() } => ("PostgreSQL"),
    mariadb { idem_testkit::mysql_url() } => ("MariaDB"),
);

/// PostgreSQL: a `COMMIT` sent as a prepared statement (`sqlx::query`,
/// extended protocol: Parse, Bind, Execute, Sync) is found too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_commit_through_extended_protocol() {
    use sqlx::{AssertSqlSafe, Connection, PgConnection};
    tokio::time::timeout(LIMIT, async {
        let base = idem_testkit::postgres_url();
        let mut direct = match PgConnection::connect(&base).await {
            Ok(c) => c,
            Err(e) => {
                unreachable(&format!("PostgreSQL at {base}"), e);
                return;
            }
        };
        let table = unique("proxy");
        sqlx::query(AssertSqlSafe(format!(
            "CREATE TABLE {table} (id BIGINT PRIMARY KEY)"
        )))
        .execute(&mut direct)
        .await
        .expect("create table");
        let proxy = FaultProxy::for_url(&base, 1.0).await.expect("start proxy");
        let mut conn = PgConnection::connect(&proxy.url(&base))
            .await
            .expect("connect");
        sqlx::query("BEGIN")
            .execute(&mut conn)
            .await
            .expect("begin");
        sqlx::query(AssertSqlSafe(format!(
            "INSERT INTO {table} (id) VALUES ($1)"
        )))
        .bind(7_i64)
        .execute(&mut conn)
        .await
        .expect("insert");
        let err = sqlx::query("COMMIT")
            .execute(&mut conn)
            .await
            .expect_err("the COMMIT's reply was dropped");
        assert_io_error(&err);
        drop(conn);
        assert_eq!((proxy.commits_seen(), proxy.acks_dropped()), (1, 1));
        let n: i64 = sqlx::query_scalar(AssertSqlSafe(format!("SELECT COUNT(*) FROM {table}")))
            .fetch_one(&mut direct)
            .await
            .expect("count");
        assert_eq!(n, 1, "the server committed");
        sqlx::query(AssertSqlSafe(format!("DROP TABLE {table}")))
            .execute(&mut direct)
            .await
            .expect("drop table");
    })
    .await
    .expect("test timed out");
}
