//! Controls: the article's broken designs, written by hand, run through the
//! same concurrent test as the `#[idempotent]` handlers — and caught. They
//! prove that the concurrency tests in `strategies_*.rs` can fail.
//!
//! 1. The "fault version" of section 03: the coupon's state is read outside
//!    the transaction, so concurrent retries both read UNUSED and both
//!    deduct.
//! 2. The record table's "fatal race": query the record, and if absent run
//!    the business logic and write the record — without a unique index.

use idem_runtime::Dialect;
use idem_testkit::{concurrently, ids, sql};

const CONCURRENCY: usize = 64;
const ROUNDS: usize = 5;

macro_rules! fault_tests {
    ($module:ident, $db:ty, $dialect:expr, $pool:expr) => {
        mod $module {
            use super::*;
            use sqlx::Pool;
            type Db = $db;
            const D: Dialect = $dialect;

            async fn pool() -> Option<Pool<Db>> {
                let pool: Pool<Db> = $pool?;
                let mut tx = pool.begin().await.expect("begin");
                if D == Dialect::Postgres {
                    sqlx::query("SELECT pg_advisory_xact_lock(77002)").execute(&mut *tx).await.expect("lock");
                }
                for stmt in [
                    "CREATE TABLE IF NOT EXISTS idem_f_coupon (id BIGINT PRIMARY KEY, status VARCHAR(16) NOT NULL)",
                    "CREATE TABLE IF NOT EXISTS idem_f_deduction (coupon_id BIGINT NOT NULL, msg_id VARCHAR(128) NOT NULL)",
                    // The record table of the naive design: no unique index.
                    "CREATE TABLE IF NOT EXISTS idem_f_record (idempotency_key VARCHAR(128) NOT NULL)",
                    "CREATE TABLE IF NOT EXISTS idem_f_notice (msg_id VARCHAR(128) NOT NULL)",
                ] {
                    sqlx::query(stmt).execute(&mut *tx).await.expect("create table");
                }
                tx.commit().await.expect("commit");
                Some(pool)
            }

            /// The article's fault version, line by line.
            async fn consume_coupon_msg_fault_version(pool: Pool<Db>, msg_id: String, coupon_id: i64) -> Result<(), sqlx::Error> {
                // Query OUTSIDE the transaction: concurrent retries read a stale snapshot.
                let status: String = sqlx::query_scalar(sql(D, "SELECT status FROM idem_f_coupon WHERE id = ?"))
                    .bind(coupon_id)
                    .fetch_one(&pool)
                    .await?;
                if status != "UNUSED" {
                    return Ok(()); // "Duplicate message, coupon already deducted"
                }
                let mut tx = pool.begin().await?;
                sqlx::query(sql(D, "INSERT INTO idem_f_deduction (coupon_id, msg_id) VALUES (?, ?)"))
                    .bind(coupon_id)
                    .bind(&msg_id)
                    .execute(&mut *tx)
                    .await?;
                sqlx::query(sql(D, "UPDATE idem_f_coupon SET status = 'USED' WHERE id = ?"))
                    .bind(coupon_id)
                    .execute(&mut *tx)
                    .await?;
                tx.commit().await
            }

            /// The record table without atomicity: query, then act, then write.
            async fn notify_check_then_insert(pool: Pool<Db>, key: String) -> Result<(), sqlx::Error> {
                let mut tx = pool.begin().await?;
                let seen: i64 = sqlx::query_scalar(sql(D, "SELECT COUNT(*) FROM idem_f_record WHERE idempotency_key = ?"))
                    .bind(&key)
                    .fetch_one(&mut *tx)
                    .await?;
                if seen > 0 {
                    return Ok(());
                }
                sqlx::query(sql(D, "INSERT INTO idem_f_notice (msg_id) VALUES (?)")).bind(&key).execute(&mut *tx).await?;
                sqlx::query(sql(D, "INSERT INTO idem_f_record (idempotency_key) VALUES (?)")).bind(&key).execute(&mut *tx).await?;
                tx.commit().await
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn fault_version_double_deducts_under_concurrent_retries() {
                let Some(pool) = pool().await else { return };
                let mut extra = 0;
                for _ in 0..ROUNDS {
                    let coupon = ids(1);
                    sqlx::query(sql(D, "INSERT INTO idem_f_coupon (id, status) VALUES (?, 'UNUSED')"))
                        .bind(coupon)
                        .execute(&pool)
                        .await
                        .unwrap();
                    let results = concurrently(CONCURRENCY, || consume_coupon_msg_fault_version(pool.clone(), format!("m-{coupon}"), coupon)).await;
                    assert!(results.iter().all(Result::is_ok), "{results:?}");
                    let n: i64 = sqlx::query_scalar(sql(D, "SELECT COUNT(*) FROM idem_f_deduction WHERE coupon_id = ?"))
                        .bind(coupon)
                        .fetch_one(&pool)
                        .await
                        .unwrap();
                    assert!(n >= 1);
                    extra += n - 1;
                }
                eprintln!("{}: the fault version made {extra} extra deductions in {ROUNDS} coupons", stringify!($module));
                assert!(extra > 0, "the concurrent test must catch the fault version double-deducting");
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn check_then_insert_record_executes_twice() {
                let Some(pool) = pool().await else { return };
                let mut extra = 0;
                for _ in 0..ROUNDS {
                    let key = format!("notice:{}", ids(1));
                    let results = concurrently(CONCURRENCY, || notify_check_then_insert(pool.clone(), key.clone())).await;
                    // Deadlocks may abort some attempts; only effects count.
                    let _ = results;
                    let n: i64 = sqlx::query_scalar(sql(D, "SELECT COUNT(*) FROM idem_f_notice WHERE msg_id = ?"))
                        .bind(&key)
                        .fetch_one(&pool)
                        .await
                        .unwrap();
                    extra += (n - 1).max(0);
                }
                eprintln!("{}: check-then-insert made {extra} extra notices", stringify!($module));
                assert!(extra > 0, "the concurrent test must catch a non-atomic record check");
            }
        }
    };
}

idem_testkit::for_each_backend!(fault_tests; postgres, mariadb);
