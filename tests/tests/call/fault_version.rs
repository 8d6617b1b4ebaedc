//! Controls: the article's broken designs, written by hand, run through the
//! same concurrent test as the `#[idempotent]` handlers — and caught. They
//! prove that the concurrency tests in `strategies_*.rs` can fail.
//!
//! 1. The "fault version" of section 03: the coupon's state is read outside
//!    the transaction, so concurrent retries both read UNUSED and both
//!    deduct.
//! 2. The record table's "fatal race": query the record, and if absent run
//!    the business logic and write the record — without a unique index.
//!
//! The race is forced, not left to the odds of 64 callers at once: in each
//! round the first two callers wait for each other between their check and
//! their write, and the others start only once they have met (a [`Gate`]),
//! so both always see nothing done. (Left to
//! the odds, one loaded suite run saw MariaDB serialize all 5 rounds.)

use idem_runtime::Dialect;
use idem_testkit::{concurrently, ids, sql};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use tokio::sync::Barrier;

const CONCURRENCY: usize = 64;
const ROUNDS: usize = 5;

/// One round's forced interleaving. The first two callers (the pair) each
/// check, meet at a barrier, then write: both checks come before either
/// write. Every other caller starts only once the pair has met, so none of
/// their writes can come before the pair's checks.
struct Gate {
    pair: Arc<Barrier>,
    met: Arc<tokio::sync::watch::Sender<bool>>,
    asked: AtomicUsize,
}

/// A caller's part in a [`Gate`].
enum Role {
    /// Check, meet the other of the pair, write.
    Pair(Arc<Barrier>, Arc<tokio::sync::watch::Sender<bool>>),
    /// Wait for the pair to meet, then check and write.
    After(tokio::sync::watch::Receiver<bool>),
}

impl Gate {
    fn new() -> Self {
        Gate {
            pair: Arc::new(Barrier::new(2)),
            met: Arc::new(tokio::sync::watch::channel(false).0),
            asked: AtomicUsize::new(0),
        }
    }

    /// The next caller's role.
    fn next(&self) -> Role {
        match self.asked.fetch_add(1, Ordering::SeqCst) < 2 {
            true => Role::Pair(self.pair.clone(), self.met.clone()),
            false => Role::After(self.met.subscribe()),
        }
    }
}

impl Role {
    /// Before the check.
    async fn before_check(&mut self) {
        if let Role::After(met) = self {
            let _ = met.wait_for(|m| *m).await;
        }
    }

    /// Between the check and the write, whatever the check saw (a pair
    /// member that stopped there would leave the other waiting). A pair
    /// member whose check failed never comes: after 30 s the other goes
    /// on alone (the round then likely catches nothing, and says so)
    /// rather than hang the suite.
    async fn after_check(&self) {
        if let Role::Pair(pair, met) = self {
            let _ = tokio::time::timeout(std::time::Duration::from_secs(30), pair.wait()).await;
            met.send_replace(true);
        }
    }
}

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
            async fn consume_coupon_msg_fault_version(pool: Pool<Db>, msg_id: String, coupon_id: i64, mut gate: Role) -> Result<(), sqlx::Error> {
                gate.before_check().await;
                // Query OUTSIDE the transaction: concurrent retries read a stale snapshot.
                let status: String = sqlx::query_scalar(sql(D, "SELECT status FROM idem_f_coupon WHERE id = ?"))
                    .bind(coupon_id)
                    .fetch_one(&pool)
                    .await?;
                gate.after_check().await;
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
            async fn notify_check_then_insert(pool: Pool<Db>, key: String, mut gate: Role) -> Result<(), sqlx::Error> {
                gate.before_check().await;
                let mut tx = pool.begin().await?;
                let seen: i64 = sqlx::query_scalar(sql(D, "SELECT COUNT(*) FROM idem_f_record WHERE idempotency_key = ?"))
                    .bind(&key)
                    .fetch_one(&mut *tx)
                    .await?;
                gate.after_check().await;
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
                    let gate = Gate::new();
                    let results = concurrently(CONCURRENCY, || consume_coupon_msg_fault_version(pool.clone(), format!("m-{coupon}"), coupon, gate.next())).await;
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
                    let gate = Gate::new();
                    let results = concurrently(CONCURRENCY, || notify_check_then_insert(pool.clone(), key.clone(), gate.next())).await;
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
