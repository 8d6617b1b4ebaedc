//! What the relay tests share (`outbox/`): the coupon message, and each
//! backend's tables, handlers and counting helpers (`relay_fixtures!`). The
//! backends a suite runs on: `idem_testkit::for_each_backend!`. Each module
//! uses only part of it.

pub(crate) use super::coupons::{CouponState, Deduct};
pub(crate) use idem_runtime::Dialect;
pub(crate) use idem_runtime::outbox::Relay;
pub(crate) use idem_runtime::{Error, Outcome, idempotent};
pub(crate) use idem_testkit::{ids, sql};

// Not every test binary that includes this module counts atomics.
#[allow(unused_imports)]
pub(crate) use std::sync::atomic::Ordering;
pub(crate) use std::time::{Duration, Instant};

/// The tables, handlers and helpers of one backend's module: `$module` its
/// name (in the topics), `$db` the database, `$dialect` its dialect, `$pool`
/// an `Option<Pool<$db>>` expression (`None`: skipped).
macro_rules! relay_fixtures {
    ($module:ident, $db:ty, $dialect:expr, $pool:expr) => {
            use super::*;
            use sqlx::{Pool, Transaction};
            type Db = $db;
            const D: Dialect = $dialect;
            const TOPIC: &str = concat!("relay-test.", stringify!($module));

            async fn pool() -> Option<Pool<Db>> {
                let pool: Pool<Db> = $pool?;
                let mut tx = pool.begin().await.expect("begin");
                if D == Dialect::Postgres {
                    sqlx::query("SELECT pg_advisory_xact_lock(77003)").execute(&mut *tx).await.expect("lock");
                }
                for stmt in [
                    "CREATE TABLE IF NOT EXISTS idem_r_coupon (id BIGINT PRIMARY KEY, status VARCHAR(16) NOT NULL)",
                    "CREATE TABLE IF NOT EXISTS idem_r_deduction (coupon_id BIGINT NOT NULL, order_id BIGINT NOT NULL)",
                ] {
                    sqlx::query(stmt).execute(&mut *tx).await.expect("create table");
                }
                tx.commit().await.expect("commit");
                Some(pool)
            }

            #[idempotent(
                key = "coupon-deduct:{msg.coupon_id}:{msg.order_id}",
                strategy = state_machine,
                table = "idem_r_coupon",
                id = msg.coupon_id,
                from = CouponState::Unused,
                to = CouponState::Used,
            )]
            async fn deduct(tx: &mut Transaction<'_, Db>, msg: &Deduct) -> Result<(), sqlx::Error> {
                sqlx::query(sql(D, "INSERT INTO idem_r_deduction (coupon_id, order_id) VALUES (?, ?)"))
                    .bind(msg.coupon_id)
                    .bind(msg.order_id)
                    .execute(&mut **tx)
                    .await?;
                Ok(())
            }

            /// The same handler, with a body slower than the leases below.
            #[idempotent(
                key = "coupon-deduct:{msg.coupon_id}:{msg.order_id}",
                strategy = state_machine,
                table = "idem_r_coupon",
                id = msg.coupon_id,
                from = CouponState::Unused,
                to = CouponState::Used,
            )]
            async fn deduct_slow(tx: &mut Transaction<'_, Db>, msg: &Deduct, pause: Duration) -> Result<(), sqlx::Error> {
                tokio::time::sleep(pause).await;
                sqlx::query(sql(D, "INSERT INTO idem_r_deduction (coupon_id, order_id) VALUES (?, ?)"))
                    .bind(msg.coupon_id)
                    .bind(msg.order_id)
                    .execute(&mut **tx)
                    .await?;
                Ok(())
            }

            /// `relay.run_once()`, run again after a retryable error (two
            /// claims of parallel tests can deadlock on MariaDB; the relay's
            /// own loop retries after its poll interval) and, with
            /// `until_claimed`, after a round that claimed nothing.
            async fn run_once_retrying(relay: &Relay<Db>, until_claimed: bool) -> usize {
                let start = Instant::now();
                loop {
                    match relay.run_once().await {
                        Ok(n) if n > 0 || !until_claimed => return n,
                        Ok(_) => {}
                        Err(e) if e.is_retryable() => eprintln!("claim retried: {e}"),
                        Err(e) => panic!("run_once: {e}"),
                    }
                    assert!(start.elapsed() < Duration::from_secs(20), "no claim in 20 s");
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            }

            /// Waits until `owner` holds `n` messages of `topic` (as committed),
            /// then until their lease of `lease` has run out.
            async fn held_then_expired(pool: &Pool<Db>, topic: &str, owner: &str, n: i64, lease: Duration) {
                let start = Instant::now();
                loop {
                    // Each claim writes the relay's owner, `#` and its number.
                    let held: i64 = sqlx::query_scalar(sql(D, "SELECT COUNT(*) FROM idem_outbox WHERE topic = ? AND lease_owner LIKE ?"))
                        .bind(topic)
                        .bind(format!("{owner}#%"))
                        .fetch_one(pool)
                        .await
                        .expect("count");
                    if held >= n {
                        break;
                    }
                    assert!(start.elapsed() < Duration::from_secs(20), "{owner} never claimed");
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
                tokio::time::sleep(lease + Duration::from_millis(200)).await;
            }

            async fn attempts_of(pool: &Pool<Db>, topic: &str) -> Vec<i32> {
                sqlx::query_scalar(sql(D, "SELECT attempts FROM idem_outbox WHERE topic = ? ORDER BY id"))
                    .bind(topic)
                    .fetch_all(pool)
                    .await
                    .expect("attempts")
            }

            /// The producer side: the coupon ("order paid") and its
            /// deduction message commit together.
            async fn produce(pool: &Pool<Db>, topic: &str, copies: usize) -> i64 {
                let coupon = ids(1);
                let mut tx = <Db as idem_runtime::Backend>::begin(pool).await.expect("begin");
                sqlx::query(sql(D, "INSERT INTO idem_r_coupon (id, status) VALUES (?, 'UNUSED')"))
                    .bind(coupon)
                    .execute(&mut *tx)
                    .await
                    .expect("insert coupon");
                let payload = serde_json::json!({"coupon_id": coupon, "order_id": coupon + 1});
                for copy in 0..copies {
                    let msg = idem_runtime::outbox::enqueue(&mut tx, topic, &format!("m-{coupon}-{copy}"), &payload)
                        .await
                        .expect("enqueue");
                    assert!(msg.is_new());
                }
                tx.commit().await.expect("commit");
                coupon
            }

            async fn scalar(pool: &Pool<Db>, q: &'static str, bind: String) -> i64 {
                sqlx::query_scalar(sql(D, q)).bind(bind).fetch_one(pool).await.expect("query")
            }

            async fn deductions(pool: &Pool<Db>, coupon: i64) -> i64 {
                sqlx::query_scalar(sql(D, "SELECT COUNT(*) FROM idem_r_deduction WHERE coupon_id = ?"))
                    .bind(coupon)
                    .fetch_one(pool)
                    .await
                    .expect("count")
            }

            async fn by_status(pool: &Pool<Db>, topic: &str, status: &str) -> i64 {
                sqlx::query_scalar(sql(D, "SELECT COUNT(*) FROM idem_outbox WHERE topic = ? AND status = ?"))
                    .bind(topic)
                    .bind(status)
                    .fetch_one(pool)
                    .await
                    .expect("count")
            }

            /// Waits until no message of `topic` is pending (at most 60 s).
            async fn drained(pool: &Pool<Db>, topic: &str) {
                let start = Instant::now();
                while by_status(pool, topic, "pending").await > 0 {
                    assert!(start.elapsed() < Duration::from_secs(60), "outbox of {topic} did not drain");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }

            fn topic(name: &str) -> String {
                format!("{TOPIC}.{name}.{}", ids(1))
            }
    };
}
