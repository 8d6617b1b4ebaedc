//! A record's ttl is bounded at run time, and the record insert cannot
//! swallow anything but the duplicate: an out-of-range expiry is an error
//! on every backend, never a row silently dropped (SQLite's `INSERT OR
//! IGNORE`) or a zero date stored (MariaDB's `INSERT IGNORE`), and
//! `expire_time` is after `create_time`. Against the real servers.

use idem_runtime::__private::{Call, Record};
use idem_runtime::Dialect;
use idem_runtime::testing::NewRecord;
use idem_runtime::{Backend, Error, MAX_TTL_SECS, Source};
use idem_testkit::{ids, sql};

macro_rules! ttl_tests {
    ($module:ident, $db:ty, $dialect:expr, $pool:expr) => {
        mod $module {
            use super::*;
            use sqlx::Pool;
            type Db = $db;
            const D: Dialect = $dialect;

            async fn pool() -> Option<Pool<Db>> {
                $pool
            }

            fn record(ttl_secs: i64) -> Record {
                Record {
                    biz_type: "ttl_test",
                    biz_no: None,
                    ttl_secs,
                    fingerprint: "f".repeat(64),
                }
            }

            async fn guard(pool: &Pool<Db>, ttl_secs: i64) -> Result<(), Error> {
                let key = format!("ttl:{}", ids(1));
                let span = tracing::Span::none();
                Call::open::<_, String>(Source::from(pool), key, &record(ttl_secs), span)
                    .await
                    .map(|_| ())
            }

            #[tokio::test]
            async fn the_call_rejects_a_ttl_out_of_bounds_before_any_sql() {
                let Some(pool) = pool().await else { return };
                for ttl in [3_000_000 * 86_400, MAX_TTL_SECS + 1, 0, -5] {
                    let err = guard(&pool, ttl)
                        .await
                        .expect_err(&format!("ttl {ttl} accepted"));
                    assert!(matches!(err, Error::Config { .. }), "ttl {ttl}: {err}");
                    assert!(format!("{err:#}").contains("ttl"), "{err:#}");
                    assert!(!err.is_retryable());
                }
                assert!(guard(&pool, MAX_TTL_SECS).await.is_ok());
                assert!(guard(&pool, 1).await.is_ok());
            }

            async fn claim(pool: &Pool<Db>, ttl_secs: i64) -> Result<bool, sqlx::Error> {
                let key = format!("ttl-sql:{}", ids(1));
                let rec = NewRecord {
                    key: &key,
                    biz_type: "ttl_test",
                    biz_no: &key,
                    fingerprint: "f",
                    ttl_secs,
                };
                let mut tx = <Db as Backend>::begin(pool).await?;
                let claimed = <Db as Backend>::claim_record(&mut tx, &rec).await?;
                // What was stored, if anything (read in the same transaction).
                let n: i64 = sqlx::query_scalar(sql(
                    D,
                    "SELECT COUNT(*) FROM idem_record WHERE idempotency_key = ?",
                ))
                .bind(key.clone())
                .fetch_one(&mut *tx)
                .await?;
                assert_eq!(
                    n,
                    i64::from(claimed),
                    "claim said {claimed} but {n} rows are stored"
                );
                tx.rollback().await?;
                Ok(claimed)
            }

            #[tokio::test]
            async fn the_record_insert_errors_on_an_expiry_it_cannot_store() {
                let Some(pool) = pool().await else { return };
                // Far beyond every backend's range: an error, not an
                // ignored row.
                let err = claim(&pool, 1_000_000_000_000_000)
                    .await
                    .expect_err("absurd expiry accepted");
                eprintln!("absurd ttl: {err}");
                // 3 000 000 days: past MariaDB's year 9999 and SQLite's
                // strftime range; PostgreSQL stores it (year 10226).
                match claim(&pool, 3_000_000 * 86_400).await {
                    Ok(claimed) => {
                        assert_eq!(D, Dialect::Postgres, "stored an out-of-range expiry");
                        assert!(claimed);
                    }
                    Err(e) => eprintln!("3000000d: {e}"),
                }
                // expire_time must be after create_time.
                for ttl in [0, -60] {
                    let err = claim(&pool, ttl)
                        .await
                        .expect_err(&format!("ttl {ttl} stored"));
                    eprintln!("ttl {ttl}: {err}");
                }
                assert!(claim(&pool, MAX_TTL_SECS).await.expect("the longest ttl"));
            }
        }
    };
}

idem_testkit::for_each_backend!(ttl_tests; postgres(2), mariadb(2) as mysql, sqlite(1));

/// The finding behind MariaDB's `INSERT IGNORE`: sqlx connects with
/// `CLIENT_FOUND_ROWS`, so `INSERT … ON DUPLICATE KEY UPDATE id = id`
/// reports one affected row both when it inserted and when the key
/// existed: it cannot tell a claim from a duplicate.
#[tokio::test]
async fn mariadb_on_duplicate_key_update_counts_a_duplicate_like_an_insert() {
    let Some(pool) = idem_testkit::mysql(1).await else {
        return;
    };
    let table = idem_testkit::unique("idem_t_odku");
    let create = format!(
        "CREATE TABLE {table} (id BIGINT AUTO_INCREMENT PRIMARY KEY, k VARCHAR(16) NOT NULL, UNIQUE KEY (k))"
    );
    sqlx::query(sqlx::AssertSqlSafe(create))
        .execute(&pool)
        .await
        .expect("create");
    let insert = format!("INSERT INTO {table} (k) VALUES ('a') ON DUPLICATE KEY UPDATE id = id");
    let first = sqlx::query(sqlx::AssertSqlSafe(insert.clone()))
        .execute(&pool)
        .await
        .expect("insert");
    let second = sqlx::query(sqlx::AssertSqlSafe(insert))
        .execute(&pool)
        .await
        .expect("duplicate");
    eprintln!(
        "ON DUPLICATE KEY UPDATE id = id: inserted -> {} rows, existing -> {} rows",
        first.rows_affected(),
        second.rows_affected()
    );
    sqlx::query(sqlx::AssertSqlSafe(format!("DROP TABLE {table}")))
        .execute(&pool)
        .await
        .expect("drop");
    assert_eq!((first.rows_affected(), second.rows_affected()), (1, 1));
}
