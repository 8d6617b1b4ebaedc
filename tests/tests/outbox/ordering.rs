//! Ordering keys (`EnqueueOptions::ordering_key`) on every backend: the
//! messages of one key run one at a time and settle in enqueue order,
//! across two relays (one of them committing in batches), with producer
//! duplicates and lost commit acknowledgements; a failing head holds back
//! its own key only, until it succeeds or is dead-lettered (then the rest
//! goes on, or waits with `OnDeadHead::Hold`). Order is checked in the
//! database: each step's handler reads its key's last step under a row
//! lock, in its own transaction, and records any step that does not
//! follow it. The control claims without the ordering guard and sees
//! steps of one key run side by side and out of order.

use crate::common::hooks;
use crate::common::relay::*;
use std::collections::HashSet;
use std::sync::Mutex;

/// Steps of each key.
const STEPS: i64 = 8;

/// One step of a key's sequence.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub(crate) struct Step {
    key: String,
    seq: i64,
}

/// Which keys have a step's body running (inside its transaction, before
/// its commit: once committed, the step is settled and its key's next
/// step may be claimed), and the keys a second body started for while
/// one ran.
#[derive(Debug, Default)]
struct InFlight {
    running: Mutex<HashSet<String>>,
    overlapped: Mutex<Vec<String>>,
}

/// Every test's steps: keys are unique per test.
static FLIGHT: std::sync::LazyLock<InFlight> = std::sync::LazyLock::new(InFlight::default);

/// A step's body running for `key`, until dropped.
struct Running(String);

impl Running {
    fn enter(key: &str) -> Running {
        if !FLIGHT.running.lock().unwrap().insert(key.to_owned()) {
            FLIGHT.overlapped.lock().unwrap().push(key.to_owned());
        }
        Running(key.to_owned())
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        FLIGHT.running.lock().unwrap().remove(&self.0);
    }
}

/// How many times a step's body started while another of its key ran,
/// for the keys of `topic`.
fn overlaps(topic: &str) -> usize {
    let overlapped = FLIGHT.overlapped.lock().unwrap();
    overlapped.iter().filter(|k| k.starts_with(topic)).count()
}

macro_rules! ordering_tests {
    ($module:ident, $db:ty, $dialect:expr, $pool:expr) => {
        mod $module {
            #![allow(dead_code)]
            relay_fixtures!($module, $db, $dialect, $pool);
            use super::{Running, STEPS, Step, overlaps};
            use idem_runtime::outbox::{EnqueueOptions, OnDeadHead, enqueue_with};
            use std::sync::atomic::{AtomicBool, AtomicUsize};
            use std::sync::Arc;

            /// The test's tables, created once: on PostgreSQL under the
            /// fixtures' lock (two sessions creating one table at once
            /// collide in its catalog).
            async fn tables(pool: &Pool<Db>) {
                let mut tx = pool.begin().await.expect("begin");
                if D == Dialect::Postgres {
                    sqlx::query("SELECT pg_advisory_xact_lock(77003)").execute(&mut *tx).await.expect("lock");
                }
                for stmt in [
                    "CREATE TABLE IF NOT EXISTS idem_o_key (k VARCHAR(128) PRIMARY KEY, last BIGINT NOT NULL, steps BIGINT NOT NULL)",
                    "CREATE TABLE IF NOT EXISTS idem_o_bad (k VARCHAR(128) NOT NULL, seq BIGINT NOT NULL, last BIGINT NOT NULL)",
                ] {
                    sqlx::query(stmt).execute(&mut *tx).await.expect("create table");
                }
                tx.commit().await.expect("commit");
            }

            /// The step, acting once: out of order (not the step after
            /// its key's last) it is recorded in `idem_o_bad`.
            #[idempotent(key = "ordered:{m.key}:{m.seq}", strategy = record, biz_type = "idem_o_step")]
            async fn step(tx: &mut Transaction<'_, Db>, m: &Step) -> Result<(), sqlx::Error> {
                let _running = Running::enter(&m.key);
                tokio::time::sleep(Duration::from_millis(15)).await;
                let read = match D {
                    Dialect::Sqlite => sql(D, "SELECT last FROM idem_o_key WHERE k = ?"),
                    _ => sql(D, "SELECT last FROM idem_o_key WHERE k = ? FOR UPDATE"),
                };
                let last: i64 = sqlx::query_scalar(read).bind(&m.key).fetch_one(&mut **tx).await?;
                if m.seq != last + 1 {
                    sqlx::query(sql(D, "INSERT INTO idem_o_bad (k, seq, last) VALUES (?, ?, ?)"))
                        .bind(&m.key)
                        .bind(m.seq)
                        .bind(last)
                        .execute(&mut **tx)
                        .await?;
                }
                sqlx::query(sql(D, "UPDATE idem_o_key SET last = ?, steps = steps + 1 WHERE k = ?"))
                    .bind(m.seq)
                    .bind(&m.key)
                    .execute(&mut **tx)
                    .await?;
                Ok(())
            }

            /// Enqueues `STEPS` steps of each of `keys` on `topic`, key by
            /// key (the oldest due messages are all one key's), each twice
            /// (the second is `Already`).
            async fn produce_steps(pool: &Pool<Db>, topic: &str, keys: &[String]) {
                for key in keys {
                    sqlx::query(sql(D, "INSERT INTO idem_o_key (k, last, steps) VALUES (?, 0, 0)"))
                        .bind(key)
                        .execute(pool)
                        .await
                        .expect("key row");
                    for seq in 1..=STEPS {
                        let m = Step { key: key.clone(), seq };
                        let options = EnqueueOptions::new().ordering_key(key.as_str()).header("seq", seq.to_string());
                        for copy in 0..2 {
                            let mut tx = pool.begin().await.expect("begin");
                            let done = enqueue_with(&mut tx, topic, &format!("{key}-{seq}"), &serde_json::json!(m), &options)
                                .await
                                .expect("enqueue");
                            assert_eq!(done.is_new(), copy == 0);
                            tx.commit().await.expect("commit");
                        }
                    }
                }
            }

            async fn key_state(pool: &Pool<Db>, key: &str) -> (i64, i64) {
                sqlx::query_as(sql(D, "SELECT last, steps FROM idem_o_key WHERE k = ?"))
                    .bind(key)
                    .fetch_one(pool)
                    .await
                    .expect("key state")
            }

            async fn bad_steps(pool: &Pool<Db>, keys: &[String]) -> i64 {
                let mut n = 0;
                for key in keys {
                    n += scalar(pool, "SELECT COUNT(*) FROM idem_o_bad WHERE k = ?", key.clone()).await;
                }
                n
            }

            /// A relay of `topic` running `step`.
            fn relay(pool: &Pool<Db>, topic: &str) -> Relay<Db> {
                Relay::new(pool.clone())
                    .route(topic.to_owned(), move |d, m: Step| async move {
                        assert_eq!(d.header("seq"), Some(m.seq.to_string().as_str()));
                        assert_eq!(d.ordering_key(), Some(m.key.as_str()));
                        step(d.source(), &m).await
                    })
                    .concurrency(4)
                    .batch_size(8)
                    .poll_interval(Duration::from_millis(10))
                    .backoff(Duration::from_millis(10), Duration::from_millis(50))
            }

            /// Two relays (one batching) drain 5 keys' steps through lost
            /// acknowledgements: the overlaps seen, the steps out of
            /// order, and whether each key ran every step once.
            async fn run(lost_acks: f64) -> Option<(usize, i64, bool)> {
                let pool = pool().await?;
                tables(&pool).await;
                let topic = topic("ordered");
                let keys: Vec<String> = (0..5).map(|k| format!("{topic}-k{k}")).collect();
                produce_steps(&pool, &topic, &keys).await;
                idem_runtime::testing::set_lost_ack_rate(lost_acks);
                let one = relay(&pool, &topic).spawn();
                let two = relay(&pool, &topic).commit_batch(4).spawn();
                drained(&pool, &topic).await;
                idem_runtime::testing::set_lost_ack_rate(0.0);
                one.shutdown().await;
                two.shutdown().await;
                let mut complete = true;
                for key in &keys {
                    complete &= key_state(&pool, key).await == (STEPS, STEPS);
                }
                assert_eq!(by_status(&pool, &topic, "success").await, 5 * STEPS);
                Some((overlaps(&topic), bad_steps(&pool, &keys).await, complete))
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn a_key_s_messages_run_one_at_a_time_in_enqueue_order() {
                let _hooks = hooks::exclusive().await;
                let Some((overlaps, bad, complete)) = run(0.2).await else { return };
                assert_eq!(overlaps, 0, "steps of one key ran side by side");
                assert_eq!(bad, 0, "steps settled out of order");
                assert!(complete, "a key did not run each step once");
            }

            /// The control: the claim without its ordering guard.
            #[cfg_attr(
                not(idem_broken),
                ignore = "a control: needs RUSTFLAGS=\"--cfg idem_broken\" (see .ci/run)"
            )]
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn control_unordered_claims_run_a_key_side_by_side() {
                let _hooks = hooks::exclusive().await;
                idem_runtime::testing::set_broken_unordered(true);
                let result = run(0.0).await;
                idem_runtime::testing::set_broken_unordered(false);
                let Some((overlaps, bad, _)) = result else { return };
                eprintln!("control, {}: {overlaps} overlaps, {bad} steps out of order", stringify!($module));
                // SQLite runs one write transaction at a time: its steps'
                // bodies never overlap, they run out of order.
                assert!(bad > 0, "the test did not catch unordered claims");
                assert!(overlaps > 0 || D == Dialect::Sqlite, "no overlap seen");
            }

            /// A head failing until `release` holds back its key only; once
            /// released the key drains in order.
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn a_failing_head_holds_back_only_its_own_key() {
                let _hooks = hooks::shared().await;
                let Some(pool) = pool().await else { return };
                tables(&pool).await;
                let topic = topic("head");
                let (stuck, free) = (format!("{topic}-stuck"), format!("{topic}-free"));
                produce_steps(&pool, &topic, &[stuck.clone(), free.clone()]).await;
                let release = Arc::new(AtomicBool::new(false));
                let attempts = Arc::new(AtomicUsize::new(0));
                let (r, a, head) = (release.clone(), attempts.clone(), stuck.clone());
                let relay = Relay::new(pool.clone())
                    .route(topic.clone(), move |d, m: Step| {
                        let (r, a) = (r.clone(), a.clone());
                        let failing = m.key == head && m.seq == 1;
                        async move {
                            if failing && !r.load(Ordering::SeqCst) {
                                a.fetch_add(1, Ordering::SeqCst);
                                return Err(Error::retryable("the head's downstream is down"));
                            }
                            step(d.source(), &m).await
                        }
                    })
                    .poll_interval(Duration::from_millis(10))
                    .backoff(Duration::from_millis(10), Duration::from_millis(20))
                    .max_attempts(u32::MAX)
                    .spawn();
                idem_testkit::wait_for("the free key to drain", Duration::from_secs(60), || async {
                    key_state(&pool, &free).await.0 == STEPS
                })
                .await;
                idem_testkit::wait_for("the head to fail three times", Duration::from_secs(60), || async {
                    attempts.load(Ordering::SeqCst) >= 3
                })
                .await;
                assert_eq!(key_state(&pool, &stuck).await, (0, 0), "a step ran behind its failing head");
                release.store(true, Ordering::SeqCst);
                drained(&pool, &topic).await;
                relay.shutdown().await;
                assert_eq!(key_state(&pool, &stuck).await, (STEPS, STEPS));
                assert_eq!(bad_steps(&pool, &[stuck, free]).await, 0);
            }

            /// A dead head: the rest of its key goes on (the default), or
            /// waits until the dead one is requeued (`OnDeadHead::Hold`).
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn a_dead_head_lets_the_key_go_on_or_holds_it() {
                let _hooks = hooks::shared().await;
                let Some(pool) = pool().await else { return };
                tables(&pool).await;
                for mode in [OnDeadHead::Continue, OnDeadHead::Hold] {
                    let topic = topic("dead");
                    let key = format!("{topic}-k");
                    produce_steps(&pool, &topic, std::slice::from_ref(&key)).await;
                    let release = Arc::new(AtomicBool::new(false));
                    let r = release.clone();
                    let relay = Relay::new(pool.clone())
                        .route(topic.clone(), move |d, m: Step| {
                            let r = r.clone();
                            async move {
                                if m.seq == 1 && !r.load(Ordering::SeqCst) {
                                    return Err(Error::retryable("poison"));
                                }
                                step(d.source(), &m).await
                            }
                        })
                        .on_dead_head(mode)
                        .max_attempts(2)
                        .poll_interval(Duration::from_millis(10))
                        .backoff(Duration::from_millis(10), Duration::from_millis(10));
                    let handle = relay.clone().spawn();
                    idem_testkit::wait_for("the head's dead letter", Duration::from_secs(60), || async {
                        by_status(&pool, &topic, "failed").await == 1
                    })
                    .await;
                    match mode {
                        OnDeadHead::Continue => {
                            drained(&pool, &topic).await;
                            // Steps 2.. ran, in order, after the dead step 1.
                            let bad = bad_steps(&pool, std::slice::from_ref(&key)).await;
                            assert_eq!((key_state(&pool, &key).await, bad), ((STEPS, STEPS - 1), 1));
                        }
                        _ => {
                            // Many claims later the rest still waits.
                            let claims = relay.stats().claims();
                            idem_testkit::wait_for("20 more claims", Duration::from_secs(60), || async {
                                relay.stats().claims() >= claims + 20
                            })
                            .await;
                            assert_eq!(key_state(&pool, &key).await, (0, 0), "a step ran behind its dead head");
                            assert_eq!(by_status(&pool, &topic, "pending").await, STEPS - 1);
                            // Requeued and healed, the key drains in order.
                            release.store(true, Ordering::SeqCst);
                            sqlx::query(sql(D, "UPDATE idem_outbox SET status = 'pending', attempts = 0 WHERE topic = ? AND status = 'failed'"))
                                .bind(&topic)
                                .execute(&pool)
                                .await
                                .expect("requeue");
                            drained(&pool, &topic).await;
                            assert_eq!(key_state(&pool, &key).await, (STEPS, STEPS));
                            assert_eq!(bad_steps(&pool, std::slice::from_ref(&key)).await, 0);
                        }
                    }
                    handle.shutdown().await;
                }
            }
        }
    };
}

idem_testkit::for_each_backend!(ordering_tests);
