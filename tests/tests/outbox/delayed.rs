//! Delayed messages (`EnqueueOptions::delay`) on every backend: none is
//! delivered before its time (checked by the database's clock in the
//! handler's transaction, and by the test's clock from before the
//! enqueue), none is lost when the relay is restarted while they wait,
//! and a failed attempt of a delayed message waits out its back-off. On
//! PostgreSQL a relay that is pushed to wakes when a delayed message falls
//! due, not at its next poll.

use crate::common::hooks;
use crate::common::relay::*;

macro_rules! delayed_tests {
    ($module:ident, $db:ty, $dialect:expr, $pool:expr) => {
        mod $module {
            #![allow(dead_code)]
            relay_fixtures!($module, $db, $dialect, $pool);
            use idem_runtime::outbox::{EnqueueOptions, enqueue_with};
            use std::sync::{Arc, Mutex};

            /// One delayed message: its name and delay.
            #[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
            pub(crate) struct Later {
                name: String,
                delay_ms: u64,
            }

            /// The test's tables, created once: on PostgreSQL under the
            /// fixtures' lock (two sessions creating one table at once
            /// collide in its catalog).
            async fn tables(pool: &Pool<Db>) {
                let mut tx = pool.begin().await.expect("begin");
                if D == Dialect::Postgres {
                    sqlx::query("SELECT pg_advisory_xact_lock(77003)").execute(&mut *tx).await.expect("lock");
                }
                for stmt in [
                    "CREATE TABLE IF NOT EXISTS idem_d_effect (name VARCHAR(128) NOT NULL)",
                    "CREATE TABLE IF NOT EXISTS idem_d_early (name VARCHAR(128) NOT NULL)",
                ] {
                    sqlx::query(stmt).execute(&mut *tx).await.expect("create table");
                }
                tx.commit().await.expect("commit");
            }

            /// The effect, once; recorded as early when the database's
            /// clock says the message is not due yet.
            #[idempotent(key = "delayed:{m.name}", strategy = record, biz_type = "idem_d_later")]
            async fn act(tx: &mut Transaction<'_, Db>, m: &Later, id: i64) -> Result<(), sqlx::Error> {
                let due = match D {
                    Dialect::Postgres => sql(D, "SELECT COUNT(*) FROM idem_outbox WHERE id = ? AND next_attempt_at <= clock_timestamp()"),
                    Dialect::MySql => sql(D, "SELECT COUNT(*) FROM idem_outbox WHERE id = ? AND next_attempt_at <= UTC_TIMESTAMP(6)"),
                    _ => sql(D, "SELECT COUNT(*) FROM idem_outbox WHERE id = ? AND next_attempt_at <= strftime('%Y-%m-%d %H:%M:%f', 'now')"),
                };
                let due: i64 = sqlx::query_scalar(due).bind(id).fetch_one(&mut **tx).await?;
                if due == 0 {
                    sqlx::query(sql(D, "INSERT INTO idem_d_early (name) VALUES (?)")).bind(&m.name).execute(&mut **tx).await?;
                }
                sqlx::query(sql(D, "INSERT INTO idem_d_effect (name) VALUES (?)")).bind(&m.name).execute(&mut **tx).await?;
                Ok(())
            }

            /// Enqueues `later` on `topic`; when each was enqueued (before
            /// its transaction began) by the test's clock.
            async fn produce_later(pool: &Pool<Db>, topic: &str, later: &[Later]) -> Vec<Instant> {
                let mut at = Vec::new();
                for m in later {
                    at.push(Instant::now());
                    let mut tx = pool.begin().await.expect("begin");
                    let options = EnqueueOptions::new().delay(Duration::from_millis(m.delay_ms));
                    enqueue_with(&mut tx, topic, &m.name, &serde_json::json!(m), &options).await.expect("enqueue");
                    tx.commit().await.expect("commit");
                }
                at
            }

            type Log = Arc<Mutex<Vec<(String, Instant)>>>;

            fn relay(pool: &Pool<Db>, topic: &str, log: &Log) -> Relay<Db> {
                let log = log.clone();
                Relay::new(pool.clone())
                    .route(topic.to_owned(), move |d, m: Later| {
                        let log = log.clone();
                        async move {
                            log.lock().unwrap().push((m.name.clone(), Instant::now()));
                            let id = d.message().id;
                            act(d.source(), &m, id).await
                        }
                    })
                    .poll_interval(Duration::from_millis(10))
            }

            async fn count(pool: &Pool<Db>, q: &'static str, topic: &str) -> i64 {
                scalar(pool, q, format!("{topic}%")).await
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn delayed_messages_are_neither_early_nor_lost_across_a_restart() {
                let _hooks = hooks::shared().await;
                let Some(pool) = pool().await else { return };
                tables(&pool).await;
                let topic = topic("later");
                let later: Vec<Later> = (0..12)
                    .map(|n| Later { name: format!("{topic}-{n}"), delay_ms: 100 * n })
                    .collect();
                let log: Log = Default::default();
                let enqueued = produce_later(&pool, &topic, &later).await;
                let first = relay(&pool, &topic, &log).spawn();
                idem_testkit::wait_for("the first messages", Duration::from_secs(30), || async {
                    log.lock().unwrap().len() >= 3
                })
                .await;
                // Restarted while the later ones wait.
                first.shutdown().await;
                let second = relay(&pool, &topic, &log).spawn();
                drained(&pool, &topic).await;
                second.shutdown().await;
                let effects = count(&pool, "SELECT COUNT(*) FROM idem_d_effect WHERE name LIKE ?", &topic).await;
                let early = count(&pool, "SELECT COUNT(*) FROM idem_d_early WHERE name LIKE ?", &topic).await;
                assert_eq!((effects, early), (12, 0), "effects, and effects before their time");
                for (name, ran) in log.lock().unwrap().iter() {
                    let n = later.iter().position(|m| &m.name == name).expect("a message of the test");
                    let waited = ran.duration_since(enqueued[n]);
                    // The database's clock is read in milliseconds or finer.
                    let due = Duration::from_millis(later[n].delay_ms).saturating_sub(Duration::from_millis(2));
                    assert!(waited >= due, "{name} ran {waited:?} after its enqueue, delayed {}ms", later[n].delay_ms);
                }
            }

            /// A delayed message whose first attempt fails runs again
            /// after its back-off, counted from that attempt.
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn a_delayed_message_s_retry_waits_out_its_back_off() {
                let _hooks = hooks::shared().await;
                let Some(pool) = pool().await else { return };
                tables(&pool).await;
                let topic = topic("retry");
                let m = Later { name: format!("{topic}-0"), delay_ms: 300 };
                let enqueued = produce_later(&pool, &topic, std::slice::from_ref(&m)).await[0];
                let runs: Log = Default::default();
                let log = runs.clone();
                let relay = Relay::new(pool.clone())
                    .route(topic.clone(), move |d, m: Later| {
                        let log = log.clone();
                        async move {
                            let first = log.lock().unwrap().is_empty();
                            log.lock().unwrap().push((m.name.clone(), Instant::now()));
                            if first {
                                return Err(Error::retryable("the first attempt fails"));
                            }
                            let id = d.message().id;
                            act(d.source(), &m, id).await
                        }
                    })
                    .poll_interval(Duration::from_millis(10))
                    .backoff(Duration::from_millis(400), Duration::from_millis(400))
                    .spawn();
                drained(&pool, &topic).await;
                relay.shutdown().await;
                let runs = runs.lock().unwrap().clone();
                assert_eq!(runs.len(), 2);
                assert!(runs[0].1.duration_since(enqueued) >= Duration::from_millis(298), "the first attempt came early");
                // Jittered between half and all of the back-off.
                let gap = runs[1].1.duration_since(runs[0].1);
                assert!(gap >= Duration::from_millis(195), "the retry came {gap:?} after the failure");
            }

            /// PostgreSQL, pushed to: a relay polling once a minute claims
            /// a delayed message when it falls due.
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn a_pushed_relay_wakes_when_a_delayed_message_falls_due() {
                if D != Dialect::Postgres {
                    return;
                }
                let _hooks = hooks::shared().await;
                let Some(pool) = pool().await else { return };
                tables(&pool).await;
                let topic = topic("pushed");
                let log: Log = Default::default();
                let relay = relay(&pool, &topic, &log).poll_interval(Duration::from_secs(60)).push_wakeup(true).spawn();
                // The relay's first claim, empty, then its listener.
                idem_testkit::wait_for("the first claim", Duration::from_secs(30), || async {
                    relay.stats().claims() >= 1
                })
                .await;
                tokio::time::sleep(Duration::from_millis(300)).await;
                let m = Later { name: format!("{topic}-0"), delay_ms: 1000 };
                let enqueued = produce_later(&pool, &topic, std::slice::from_ref(&m)).await[0];
                idem_testkit::wait_for("the delayed message, long before the next poll", Duration::from_secs(20), || async {
                    !log.lock().unwrap().is_empty()
                })
                .await;
                let waited = log.lock().unwrap()[0].1.duration_since(enqueued);
                relay.shutdown().await;
                assert!(waited >= Duration::from_millis(998), "ran {waited:?} after the enqueue");
            }
        }
    };
}

idem_testkit::for_each_backend!(delayed_tests);
