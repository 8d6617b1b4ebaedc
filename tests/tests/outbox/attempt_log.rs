//! The attempt log (`idem_outbox_attempt`, schema version 4) as the relay
//! writes it, on every backend against the real servers: one row per
//! failed attempt it settles (outcome `retry` or `dead`, the error as
//! `last_error` holds it, the claim's lease owner as the actor), none for
//! a success, none for a settle whose lease was lost, at most
//! `ATTEMPT_LOG_MAX` per message (the newest), per message and batched.
//! Every assertion reads the database.

use crate::common::hooks;
use crate::common::relay::*;
use idem_runtime::outbox::ATTEMPT_LOG_MAX;
use std::sync::Arc;
use std::sync::atomic::AtomicU32;

/// A message's attempt log: `(attempt, outcome, detail, actor)`, oldest
/// first.
type LogRow = (i32, String, Option<String>, Option<String>);

macro_rules! attempt_log_tests {
    ($module:ident, $db:ty, $dialect:expr, $pool:expr) => {
        mod $module {
            #![allow(dead_code)]
            relay_fixtures!($module, $db, $dialect, $pool);

            /// A handler whose call fails, booked in its own transaction
            /// (and, batched, in the batch's).
            #[idempotent(
                key = "attempt-log:{msg.coupon_id}:{msg.order_id}",
                strategy = state_machine,
                table = "idem_r_coupon",
                id = msg.coupon_id,
                from = CouponState::Unused,
                to = CouponState::Used,
            )]
            async fn failing(tx: &mut Transaction<'_, Db>, msg: &Deduct) -> Result<(), Error> {
                let _ = (tx, msg);
                Err(Error::retryable("the ledger is unavailable"))
            }

            async fn log_of(pool: &Pool<Db>, id: i64) -> Vec<LogRow> {
                sqlx::query_as(sql(
                    D,
                    "SELECT attempt, outcome, detail, actor FROM idem_outbox_attempt \
                     WHERE outbox_id = ? ORDER BY id",
                ))
                .bind(id)
                .fetch_all(pool)
                .await
                .expect("attempt log")
            }

            /// The message of `topic`: id, status, attempts, last_error.
            async fn message(pool: &Pool<Db>, topic: &str) -> (i64, String, i32, Option<String>) {
                sqlx::query_as(sql(
                    D,
                    "SELECT id, status, attempts, last_error FROM idem_outbox WHERE topic = ?",
                ))
                .bind(topic)
                .fetch_one(pool)
                .await
                .expect("message")
            }

            /// `run_once` until the message of `topic` is no longer
            /// pending (a retry waits out a 1 ms back-off).
            async fn settle_all(relay: &Relay<Db>, pool: &Pool<Db>, topic: &str) {
                let start = Instant::now();
                while by_status(pool, topic, "pending").await > 0 {
                    assert!(start.elapsed() < Duration::from_secs(60), "{topic} never settled");
                    run_once_retrying(relay, false).await;
                }
            }

            /// A relay of `topic` whose plain handler fails its first
            /// `fails` runs (`boom 1`, `boom 2`, …), then succeeds.
            fn failing_relay(pool: &Pool<Db>, topic: &str, owner: &str, fails: u32, max: u32) -> Relay<Db> {
                let runs = Arc::new(AtomicU32::new(0));
                Relay::new(pool.clone())
                    .owner(owner)
                    .max_attempts(max)
                    .backoff(Duration::from_millis(1), Duration::from_millis(1))
                    .route(topic.to_string(), move |_d, _m: serde_json::Value| {
                        let n = runs.fetch_add(1, Ordering::SeqCst) + 1;
                        async move {
                            match n <= fails {
                                true => Err(Error::retryable(format!("boom {n}"))),
                                false => Ok(Outcome::Executed(())),
                            }
                        }
                    })
            }

            async fn enqueue_one(pool: &Pool<Db>, topic: &str) {
                let mut tx = <Db as idem_runtime::Backend>::begin(pool).await.expect("begin");
                idem_runtime::outbox::enqueue(&mut tx, topic, "m-1", &serde_json::json!({"n": 1}))
                    .await
                    .expect("enqueue");
                tx.commit().await.expect("commit");
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn three_failures_then_a_success_leave_three_retry_rows() {
                let _hooks = hooks::shared().await;
                let Some(pool) = pool().await else { return };
                let topic = topic("log3");
                let owner = format!("log3-{}", ids(1));
                enqueue_one(&pool, &topic).await;
                let relay = failing_relay(&pool, &topic, &owner, 3, 10);
                settle_all(&relay, &pool, &topic).await;
                let (id, status, attempts, last_error) = message(&pool, &topic).await;
                assert_eq!((status.as_str(), attempts), ("success", 4));
                let log = log_of(&pool, id).await;
                assert_eq!(log.len(), 3, "{log:?}");
                for (k, (attempt, outcome, detail, actor)) in log.iter().enumerate() {
                    assert_eq!(*attempt, k as i32 + 1, "{log:?}");
                    assert_eq!(outcome, "retry");
                    let detail = detail.as_deref().unwrap_or_default();
                    assert!(detail.contains(&format!("boom {}", k + 1)), "{detail}");
                    let actor = actor.as_deref().unwrap_or_default();
                    assert!(actor.starts_with(&format!("{owner}#")), "{actor}");
                }
                assert_eq!(log[2].2, last_error, "the detail is the stored last_error");
                // Each failed attempt was a claim of its own.
                let actors: std::collections::HashSet<_> = log.iter().map(|r| r.3.clone()).collect();
                assert_eq!(actors.len(), 3);
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn a_dead_letter_ends_its_log_with_a_dead_row() {
                let _hooks = hooks::shared().await;
                let Some(pool) = pool().await else { return };
                let topic = topic("logdead");
                produce(&pool, &topic, 1).await;
                let relay = Relay::new(pool.clone())
                    .max_attempts(2)
                    .backoff(Duration::from_millis(1), Duration::from_millis(1))
                    .route(topic.clone(), |d, m: Deduct| async move {
                        failing(d.source(), &m).await
                    });
                settle_all(&relay, &pool, &topic).await;
                let (id, status, attempts, last_error) = message(&pool, &topic).await;
                assert_eq!((status.as_str(), attempts), ("failed", 2));
                let log = log_of(&pool, id).await;
                let shape: Vec<(i32, &str)> = log.iter().map(|r| (r.0, r.1.as_str())).collect();
                assert_eq!(shape, [(1, "retry"), (2, "dead")], "{log:?}");
                assert_eq!(log[1].2, last_error);
                assert!(log[0].2.as_deref().unwrap_or_default().contains("the ledger is unavailable"));
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn forty_failures_keep_the_newest_rows_only() {
                let _hooks = hooks::shared().await;
                let Some(pool) = pool().await else { return };
                let topic = topic("log40");
                let owner = format!("log40-{}", ids(1));
                enqueue_one(&pool, &topic).await;
                let relay = failing_relay(&pool, &topic, &owner, 40, 100);
                let start = Instant::now();
                while relay.stats().retried() < 40 {
                    assert!(start.elapsed() < Duration::from_secs(120), "40 failures");
                    run_once_retrying(&relay, false).await;
                }
                let (id, status, attempts, _) = message(&pool, &topic).await;
                assert_eq!((status.as_str(), attempts), ("pending", 40));
                let log = log_of(&pool, id).await;
                assert_eq!(log.len(), ATTEMPT_LOG_MAX, "{log:?}");
                let numbers: Vec<i32> = log.iter().map(|r| r.0).collect();
                let newest: Vec<i32> = (41 - ATTEMPT_LOG_MAX as i32..=40).collect();
                assert_eq!(numbers, newest);
                assert!(log[31].2.as_deref().unwrap_or_default().contains("boom 40"));
            }

            /// The handler loses its lease to another relay before it
            /// fails: its lease runs out (`locked_until` set back, as a
            /// slow handler's would), relay B claims the message and
            /// delivers it, then A's handler fails and A's settle finds
            /// the message no longer its own.
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn a_settle_whose_lease_was_lost_logs_nothing() {
                let _hooks = hooks::shared().await;
                let Some(pool) = pool().await else { return };
                let topic = topic("loglost");
                enqueue_one(&pool, &topic).await;
                let b = Relay::new(pool.clone())
                    .owner(format!("thief-{}", ids(1)))
                    .route(topic.clone(), |_d, _m: serde_json::Value| async {
                        Ok(Outcome::Executed(()))
                    });
                let a = Relay::new(pool.clone())
                    .owner(format!("loser-{}", ids(1)))
                    .route(topic.clone(), move |d, _m: serde_json::Value| {
                        let (b, pool, id) = (b.clone(), d.pool().clone(), d.message().id);
                        async move {
                            sqlx::query(sql(D, "UPDATE idem_outbox SET locked_until = created_at WHERE id = ?"))
                                .bind(id)
                                .execute(&pool)
                                .await
                                .expect("lease run out");
                            assert_eq!(run_once_retrying(&b, true).await, 1, "B takes it over");
                            Err::<Outcome<()>, _>(Error::retryable("too late"))
                        }
                    });
                assert_eq!(run_once_retrying(&a, true).await, 1);
                assert_eq!(a.stats().stale(), 1, "A's settle found the message taken");
                assert_eq!(a.stats().retried(), 0);
                let (id, status, attempts, last_error) = message(&pool, &topic).await;
                assert_eq!((status.as_str(), attempts, last_error), ("success", 2, None));
                assert!(log_of(&pool, id).await.is_empty(), "nothing logged");
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn a_batched_relay_logs_its_failures_the_same_way() {
                let _hooks = hooks::shared().await;
                let Some(pool) = pool().await else { return };
                let topic = topic("logbatch");
                produce(&pool, &topic, 2).await;
                let owner = format!("logbatch-{}", ids(1));
                let relay = Relay::new(pool.clone())
                    .owner(owner.clone())
                    .commit_batch(2)
                    .concurrency(2)
                    .max_attempts(2)
                    .backoff(Duration::from_millis(1), Duration::from_millis(1))
                    .route(topic.clone(), |d, m: Deduct| async move {
                        failing(d.source(), &m).await
                    });
                settle_all(&relay, &pool, &topic).await;
                assert!(relay.stats().batches() > 0, "delivered in batches");
                let ids: Vec<(i64, String, i32)> = sqlx::query_as(sql(
                    D,
                    "SELECT id, status, attempts FROM idem_outbox WHERE topic = ? ORDER BY id",
                ))
                .bind(&topic)
                .fetch_all(&pool)
                .await
                .expect("messages");
                assert_eq!(ids.len(), 2);
                for (id, status, attempts) in ids {
                    assert_eq!((status.as_str(), attempts), ("failed", 2));
                    let log = log_of(&pool, id).await;
                    let shape: Vec<(i32, &str)> = log.iter().map(|r| (r.0, r.1.as_str())).collect();
                    assert_eq!(shape, [(1, "retry"), (2, "dead")], "{log:?}");
                    for row in &log {
                        let actor = row.3.as_deref().unwrap_or_default();
                        assert!(actor.starts_with(&format!("{owner}#")), "{actor}");
                    }
                }
            }
        }
    };
}

idem_testkit::for_each_backend!(attempt_log_tests);
