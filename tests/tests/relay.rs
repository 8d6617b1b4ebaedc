//! The outbox relay on every backend, against the real servers: it drains
//! every message through its `#[idempotent]` handler exactly once in
//! effect; poison messages are dead-lettered with their reason without
//! holding up the others; failures back off and retry; bookkeeping after a
//! failed attempt never overwrites a success; a crashed relay's leases
//! expire and its messages are taken over; shutdown finishes in-flight work
//! and stops claiming. Every assertion counts rows in the database.

use idem_runtime::__private::Dialect;
use idem_runtime::outbox::Relay;
use idem_runtime::{Error, Outcome, State, idempotent};
use idem_tests::{ids, sql};
use serde::{Deserialize, Serialize};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

#[derive(Debug, Clone, Copy, PartialEq, Eq, State)]
pub enum CouponState {
    Unused,
    Used,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Deduct {
    pub coupon_id: i64,
    pub order_id: i64,
}

macro_rules! relay_tests {
    ($module:ident, $db:ty, $dialect:expr, $pool:expr) => {
        mod $module {
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

            /// Waits until `owner` holds `n` messages of `topic` (as committed),
            /// then until their lease of `lease` has run out.
            async fn held_then_expired(pool: &Pool<Db>, topic: &str, owner: &str, n: i64, lease: Duration) {
                let start = Instant::now();
                loop {
                    let held: i64 = sqlx::query_scalar(sql(D, "SELECT COUNT(*) FROM idem_outbox WHERE topic = ? AND lease_owner = ?"))
                        .bind(topic)
                        .bind(owner)
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
                    idem_runtime::outbox::enqueue(&mut tx, topic, &format!("m-{coupon}-{copy}"), &payload)
                        .await
                        .expect("enqueue");
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

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn relay_drains_every_message_once_in_effect() {
                let Some(pool) = pool().await else { return };
                let topic = topic("drain");
                let mut coupons = Vec::new();
                for n in 0..60 {
                    // Every third coupon has its message twice (a producer retry).
                    coupons.push(produce(&pool, &topic, if n % 3 == 0 { 2 } else { 1 }).await);
                }
                let relay = Relay::new(pool.clone())
                    .route(topic.clone(), |d, m: Deduct| async move { deduct(d.source(), &m).await })
                    .batch_size(16)
                    .concurrency(8)
                    .spawn();
                drained(&pool, &topic).await;
                let (executed, duplicates) = (
                    relay.stats().executed.load(Ordering::Relaxed),
                    relay.stats().duplicates.load(Ordering::Relaxed),
                );
                relay.shutdown().await;
                for c in &coupons {
                    assert_eq!(deductions(&pool, *c).await, 1, "coupon {c}");
                }
                assert_eq!(by_status(&pool, &topic, "success").await, 80);
                assert_eq!((executed, duplicates), (60, 20));
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn poison_messages_are_dead_lettered_without_holding_up_others() {
                let Some(pool) = pool().await else { return };
                let topic = topic("poison");
                let mut tx = <Db as idem_runtime::Backend>::begin(&pool).await.unwrap();
                // Unparsable for the route's payload type, and a key that is invalid (empty part).
                let bad = idem_runtime::outbox::enqueue(&mut tx, &topic, "bad-shape", &serde_json::json!({"coupon": "x"})).await.unwrap();
                tx.commit().await.unwrap();
                let mut good = Vec::new();
                for _ in 0..20 {
                    good.push(produce(&pool, &topic, 1).await);
                }
                let relay = Relay::new(pool.clone())
                    .route(topic.clone(), |d, m: Deduct| async move { deduct(d.source(), &m).await })
                    .spawn();
                drained(&pool, &topic).await;
                relay.shutdown().await;
                assert_eq!(by_status(&pool, &topic, "failed").await, 1);
                assert_eq!(by_status(&pool, &topic, "success").await, 20);
                let reason: String = sqlx::query_scalar(sql(D, "SELECT last_error FROM idem_outbox WHERE id = ?"))
                    .bind(bad)
                    .fetch_one(&pool)
                    .await
                    .unwrap();
                assert!(reason.contains("unparsable payload"), "{reason}");
                for c in good {
                    assert_eq!(deductions(&pool, c).await, 1);
                }
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn non_retryable_errors_dead_letter_at_once_with_their_reason() {
                let Some(pool) = pool().await else { return };
                let topic = topic("illegal");
                // A coupon that is neither UNUSED nor USED: illegal state.
                let coupon = produce(&pool, &topic, 1).await;
                sqlx::query(sql(D, "UPDATE idem_r_coupon SET status = 'EXPIRED' WHERE id = ?"))
                    .bind(coupon)
                    .execute(&pool)
                    .await
                    .unwrap();
                let relay = Relay::new(pool.clone())
                    .route(topic.clone(), |d, m: Deduct| async move { deduct(d.source(), &m).await });
                while relay.run_once().await.unwrap() > 0 {}
                let (status, attempts, reason): (String, i32, String) =
                    sqlx::query_as(sql(D, "SELECT status, attempts, last_error FROM idem_outbox WHERE topic = ?"))
                        .bind(&topic)
                        .fetch_one(&pool)
                        .await
                        .unwrap();
                assert_eq!((status.as_str(), attempts), ("failed", 1), "dead-lettered on the first attempt");
                assert!(reason.starts_with("illegal_state"), "{reason}");
                assert_eq!(deductions(&pool, coupon).await, 0);
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn failed_attempts_back_off_then_succeed_or_give_up() {
                let Some(pool) = pool().await else { return };
                let topic = topic("retry");
                let flaky = produce(&pool, &topic, 1).await;
                let tries = Arc::new(AtomicUsize::new(0));
                let t = tries.clone();
                let relay = Relay::new(pool.clone())
                    .route(topic.clone(), move |d, m: Deduct| {
                        let n = t.fetch_add(1, Ordering::SeqCst);
                        async move {
                            if n < 2 {
                                return Err(Error::retryable("downstream busy"));
                            }
                            deduct(d.source(), &m).await
                        }
                    })
                    .backoff(Duration::from_millis(20), Duration::from_millis(100))
                    .max_attempts(5)
                    .spawn();
                drained(&pool, &topic).await;
                relay.shutdown().await;
                let (status, attempts, reason): (String, i32, Option<String>) =
                    sqlx::query_as(sql(D, "SELECT status, attempts, last_error FROM idem_outbox WHERE topic = ?"))
                        .bind(&topic)
                        .fetch_one(&pool)
                        .await
                        .unwrap();
                assert_eq!((status.as_str(), attempts), ("success", 3));
                assert!(reason.unwrap_or_default().contains("downstream busy"));
                assert_eq!(deductions(&pool, flaky).await, 1);

                // Always failing: dead-lettered after max_attempts.
                let topic = format!("{topic}.hopeless");
                let hopeless = produce(&pool, &topic, 1).await;
                let relay = Relay::new(pool.clone())
                    .route(topic.clone(), |_d, _m: Deduct| async move { Err::<Outcome<()>, _>(Error::retryable("still down")) })
                    .backoff(Duration::from_millis(10), Duration::from_millis(20))
                    .max_attempts(3)
                    .spawn();
                drained(&pool, &topic).await;
                relay.shutdown().await;
                let (status, attempts, reason): (String, i32, String) =
                    sqlx::query_as(sql(D, "SELECT status, attempts, last_error FROM idem_outbox WHERE topic = ?"))
                        .bind(&topic)
                        .fetch_one(&pool)
                        .await
                        .unwrap();
                assert_eq!((status.as_str(), attempts), ("failed", 3));
                assert!(reason.contains("gave up after 3 attempts"), "{reason}");
                assert_eq!(deductions(&pool, hopeless).await, 0);
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn failure_reported_after_commit_never_overwrites_success() {
                let Some(pool) = pool().await else { return };
                let topic = topic("lostack");
                let coupon = produce(&pool, &topic, 1).await;
                // The handler commits (marking the message), then its caller
                // sees an error: the lost acknowledgement, from the relay's view.
                let relay = Relay::new(pool.clone()).route(topic.clone(), |d, m: Deduct| async move {
                    let _executed = deduct(d.source(), &m).await?;
                    Err::<Outcome<()>, _>(Error::retryable("commit acknowledgement lost"))
                });
                relay.run_once().await.unwrap();
                assert_eq!(by_status(&pool, &topic, "success").await, 1, "the success stays");
                assert_eq!(relay.stats().stale.load(Ordering::Relaxed), 1);
                assert_eq!(relay.run_once().await.unwrap(), 0, "nothing left to retry");
                assert_eq!(deductions(&pool, coupon).await, 1);
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn crashed_relay_leases_expire_and_another_takes_over() {
                let Some(pool) = pool().await else { return };
                let topic = topic("crash");
                let mut coupons = Vec::new();
                for _ in 0..5 {
                    coupons.push(produce(&pool, &topic, 1).await);
                }
                // Relay A claims everything, then "dies" mid-handler.
                let a = Relay::new(pool.clone())
                    .route(topic.clone(), |_d, _m: Deduct| async move {
                        std::future::pending::<()>().await;
                        Ok(Outcome::Executed(()))
                    })
                    .lease(Duration::from_millis(1500))
                    .owner("relay-a");
                let crashed = tokio::spawn(async move { a.run_once().await });
                let start = Instant::now();
                while scalar(&pool, "SELECT COUNT(*) FROM idem_outbox WHERE lease_owner = ?", "relay-a".into()).await < 5 {
                    assert!(start.elapsed() < Duration::from_secs(10));
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                crashed.abort();
                let b = Relay::new(pool.clone())
                    .route(topic.clone(), |d, m: Deduct| async move { deduct(d.source(), &m).await })
                    .owner("relay-b");
                assert_eq!(b.run_once().await.unwrap(), 0, "leases still held by A");
                tokio::time::sleep(Duration::from_millis(1600)).await;
                assert_eq!(b.run_once().await.unwrap(), 5, "expired leases are taken over");
                assert_eq!(by_status(&pool, &topic, "success").await, 5);
                for c in coupons {
                    assert_eq!(deductions(&pool, c).await, 1);
                }
                let attempts: Vec<i32> = sqlx::query_scalar(sql(D, "SELECT attempts FROM idem_outbox WHERE topic = ?"))
                    .bind(&topic)
                    .fetch_all(&pool)
                    .await
                    .unwrap();
                assert_eq!(attempts, vec![2; 5], "A's attempt and B's");
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn shutdown_finishes_in_flight_work_and_stops_claiming() {
                let Some(pool) = pool().await else { return };
                let topic = topic("shutdown");
                for _ in 0..4 {
                    produce(&pool, &topic, 1).await;
                }
                let relay = Relay::new(pool.clone())
                    .route(topic.clone(), |d, m: Deduct| async move {
                        tokio::time::sleep(Duration::from_millis(300)).await;
                        deduct(d.source(), &m).await
                    })
                    .poll_interval(Duration::from_millis(20))
                    .spawn();
                let start = Instant::now();
                while relay.stats().claimed.load(Ordering::Relaxed) < 4 {
                    assert!(start.elapsed() < Duration::from_secs(10));
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
                relay.shutdown().await;
                assert_eq!(by_status(&pool, &topic, "success").await, 4, "in-flight work finished");
                produce(&pool, &topic, 1).await;
                tokio::time::sleep(Duration::from_millis(200)).await;
                assert_eq!(by_status(&pool, &topic, "pending").await, 1, "nothing claims after shutdown");
            }

            // ---- lease fencing and renewal (issue 8, item 7) --------------

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn a_handler_that_outlives_its_lease_never_commits_on_a_dead_letter() {
                let Some(pool) = pool().await else { return };
                let topic = topic("outlive");
                let coupon = produce(&pool, &topic, 1).await;
                // A's handler takes 2 s under a 300 ms lease.
                let a = Relay::new(pool.clone())
                    .route(topic.clone(), |d, m: Deduct| async move {
                        deduct_slow(d.source(), &m, Duration::from_millis(2000)).await
                    })
                    .lease(Duration::from_millis(300))
                    .owner("relay-slow");
                let slow = tokio::spawn(async move { a.run_once().await });
                held_then_expired(&pool, &topic, "relay-slow", 1, Duration::from_millis(300)).await;
                // B finds A's lease expired; its retry is rejected for good,
                // which dead-letters the message if B may claim it.
                let b = Relay::new(pool.clone())
                    .route(topic.clone(), |d, m: Deduct| async move {
                        if d.message().attempts > 1 {
                            return Err(Error::permanent("downstream rejected the retry"));
                        }
                        deduct(d.source(), &m).await
                    })
                    .owner("relay-strict");
                b.run_once().await.unwrap();
                slow.await.unwrap().unwrap();
                let failed = by_status(&pool, &topic, "failed").await;
                let done = deductions(&pool, coupon).await;
                assert!(!(failed == 1 && done == 1), "dead-lettered although its effect committed");
                assert_eq!((by_status(&pool, &topic, "success").await, done), (1, 1));
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn a_running_handler_keeps_its_lease() {
                let Some(pool) = pool().await else { return };
                let topic = topic("heartbeat");
                let coupon = produce(&pool, &topic, 1).await;
                // A handler that is not given its outbox source (the relay
                // marks the message after it): only the lease protects it.
                let a = Relay::new(pool.clone())
                    .route(topic.clone(), |d, m: Deduct| async move {
                        tokio::time::sleep(Duration::from_millis(1500)).await;
                        deduct(d.pool(), &m).await
                    })
                    .lease(Duration::from_millis(300))
                    .owner("relay-long");
                let long = tokio::spawn(async move { a.run_once().await });
                held_then_expired(&pool, &topic, "relay-long", 1, Duration::from_millis(300)).await;
                let b = Relay::new(pool.clone())
                    .route(topic.clone(), |d, m: Deduct| async move { deduct(d.source(), &m).await })
                    .owner("relay-other");
                assert_eq!(b.run_once().await.unwrap(), 0, "the lease of a running handler was renewed");
                long.await.unwrap().unwrap();
                assert_eq!(attempts_of(&pool, &topic).await, vec![1]);
                assert_eq!(by_status(&pool, &topic, "success").await, 1);
                assert_eq!(deductions(&pool, coupon).await, 1);
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn claimed_messages_never_wait_out_their_lease_in_the_queue() {
                let Some(pool) = pool().await else { return };
                let topic = topic("queue");
                let mut coupons = Vec::new();
                for _ in 0..6 {
                    coupons.push(produce(&pool, &topic, 1).await);
                }
                // One handler slot each, 250 ms per message, 400 ms leases:
                // a relay that claimed its whole batch would let the tail of
                // it expire while queued, and the other relay run it again.
                let relay = |owner: &'static str| {
                    Relay::new(pool.clone())
                        .route(topic.clone(), |d, m: Deduct| async move {
                            deduct_slow(d.source(), &m, Duration::from_millis(250)).await
                        })
                        .concurrency(1)
                        .batch_size(6)
                        .lease(Duration::from_millis(400))
                        .poll_interval(Duration::from_millis(20))
                        .owner(owner)
                        .spawn()
                };
                let (a, b) = (relay("relay-q1"), relay("relay-q2"));
                drained(&pool, &topic).await;
                a.shutdown().await;
                b.shutdown().await;
                assert_eq!(attempts_of(&pool, &topic).await, vec![1; 6], "no message ran twice");
                for c in coupons {
                    assert_eq!(deductions(&pool, c).await, 1);
                }
            }
        }
    };
}

relay_tests!(
    postgres,
    sqlx::Postgres,
    Dialect::Postgres,
    idem_tests::postgres(16).await
);
relay_tests!(
    mariadb,
    sqlx::MySql,
    Dialect::MySql,
    idem_tests::mysql(16).await
);
relay_tests!(
    sqlite,
    sqlx::Sqlite,
    Dialect::Sqlite,
    Some(idem_tests::sqlite(8).await)
);
