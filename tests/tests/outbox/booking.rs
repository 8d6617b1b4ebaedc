//! A failing handler slower than its lease never runs past
//! `max_attempts` (the model's open finding, `idem-model/tests/findings.rs`),
//! on every backend against the real servers, per message and batched.
//!
//! The handler's transaction holds its message's row locked; the
//! heartbeat skips a locked row, so the lease runs out while the handler
//! runs. Its failure used to be written by the relay after the rollback:
//! another relay could claim the message in between, and the attempt went
//! unrecorded. The failure is now booked in the handler's own transaction
//! (per message) or in the batch's (batched), before the row is let go.
//! The test forces the moment between the rollback and the relay's own
//! write open (`testing::set_settle_delay`), with a second relay polling:
//! with the bookkeeping moved back out (`testing::set_broken_failure_booking`,
//! the control) the relays take the message from each other and run it
//! past `max_attempts`, and on.
//!
//! Its tests run one at a time, and beside no other test of the binary
//! that commits through idem (`common::hooks`): the hooks are
//! process-wide.

use crate::common::hooks;
use crate::common::relay::*;
use std::sync::Arc;
use std::sync::atomic::AtomicU32;

macro_rules! booking_tests {
    ($module:ident, $db:ty, $dialect:expr, $pool:expr) => {
        mod $module {
            #![allow(dead_code)]
            relay_fixtures!($module, $db, $dialect, $pool);

            /// A handler whose body outlasts the lease, then fails (a retry
            /// could heal it).
            #[idempotent(
                                                key = "booking:{msg.coupon_id}:{msg.order_id}",
                                                strategy = state_machine,
                                                table = "idem_r_coupon",
                                                id = msg.coupon_id,
                                                from = CouponState::Unused,
                                                to = CouponState::Used,
                                            )]
            async fn slow_failure(
                tx: &mut Transaction<'_, Db>,
                msg: &Deduct,
                pause: Duration,
            ) -> Result<(), Error> {
                let _ = tx;
                tokio::time::sleep(pause).await;
                Err(Error::retryable("downstream unavailable"))
            }

            /// One message, two relays of one attempt each; the first
            /// runs the slow, failing handler past its lease. `(runs,
            /// attempts, status, last_error)`.
            async fn race(
                batched: bool,
                broken: bool,
            ) -> Option<(u32, Vec<i32>, String, Option<String>)> {
                let _one = hooks::exclusive().await;
                let pool = pool().await?;
                let topic = topic(if batched { "bookbatch" } else { "book" });
                produce(&pool, &topic, 1).await;
                idem_runtime::testing::set_broken_failure_booking(broken);
                // Wide open: the moment between the rollback and the
                // relay's own failure write.
                idem_runtime::testing::set_settle_delay(Duration::from_millis(1500));
                let runs = Arc::new(AtomicU32::new(0));
                let relay = |name: &str| {
                    let runs = runs.clone();
                    let relay = Relay::new(pool.clone())
                        .owner(format!("{name}-{topic}"))
                        .lease(Duration::from_millis(300))
                        .poll_interval(Duration::from_millis(10))
                        .max_attempts(1)
                        .route(topic.clone(), move |d, m: Deduct| {
                            let runs = runs.clone();
                            async move {
                                runs.fetch_add(1, Ordering::SeqCst);
                                slow_failure(d.source(), &m, Duration::from_millis(900)).await
                            }
                        });
                    match batched {
                        true => relay.commit_batch(2),
                        false => relay,
                    }
                };
                let first = relay("a").spawn();
                // The second relay starts once the first holds the message.
                let start = Instant::now();
                while runs.load(Ordering::SeqCst) == 0 {
                    assert!(
                        start.elapsed() < Duration::from_secs(20),
                        "the first relay never ran the handler"
                    );
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
                let second = relay("b").spawn();
                let start = Instant::now();
                // Fixed: until dead-lettered; the control: until it ran twice.
                while match broken {
                    false => by_status(&pool, &topic, "failed").await == 0,
                    true => runs.load(Ordering::SeqCst) < 2,
                } {
                    assert!(
                        start.elapsed() < Duration::from_secs(20),
                        "never dead-lettered, nor run twice"
                    );
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                // Both relays' pending writes land (or find nothing to do).
                tokio::time::sleep(Duration::from_millis(1700)).await;
                first.shutdown().await;
                second.shutdown().await;
                let (status, error): (String, Option<String>) = sqlx::query_as(sql(
                    D,
                    "SELECT status, last_error FROM idem_outbox WHERE topic = ?",
                ))
                .bind(&topic)
                .fetch_one(&pool)
                .await
                .expect("row");
                Some((
                    runs.load(Ordering::SeqCst),
                    attempts_of(&pool, &topic).await,
                    status,
                    error,
                ))
            }

            async fn never_past_max_attempts(batched: bool) {
                let Some((runs, attempts, status, error)) = race(batched, false).await else {
                    return;
                };
                let error = error.unwrap_or_default();
                assert_eq!(
                    (runs, attempts, status.as_str()),
                    (1, vec![1], "failed"),
                    "{error}"
                );
                assert!(error.contains("gave up after 1 attempts"), "{error}");
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn a_slow_failing_handler_never_runs_past_max_attempts() {
                never_past_max_attempts(false).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn a_slow_failing_batch_never_runs_past_max_attempts() {
                never_past_max_attempts(true).await;
            }

            /// The control: the failure left to the relay's write after the
            /// rollback, the second relay takes the message in between.
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            #[cfg_attr(not(idem_broken), ignore = "a control of a deliberately broken build: RUSTFLAGS=\"--cfg idem_broken\"")]
            async fn control_with_the_bookkeeping_after_the_rollback_it_runs_twice() {
                control(false).await;
            }

            /// The same for a batch: its failure left to the relay's write
            /// after the batch's commit.
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            #[cfg_attr(not(idem_broken), ignore = "a control of a deliberately broken build: RUSTFLAGS=\"--cfg idem_broken\"")]
            async fn control_with_the_bookkeeping_after_the_batch_it_runs_twice() {
                control(true).await;
            }

            async fn control(batched: bool) {
                let Some((runs, attempts, ..)) = race(batched, true).await else {
                    return;
                };
                // Each relay's write finds the message claimed by the other,
                // which runs it again: past max_attempts (1), and on.
                assert!(
                    runs >= 2 && attempts[0] >= 2,
                    "runs {runs}, attempts {attempts:?}"
                );
            }
        }
    };
}

idem_testkit::for_each_backend!(booking_tests);

macro_rules! unknown_commit_tests {
    ($module:ident, $db:ty, $dialect:expr, $pool:expr) => {
        mod $module {
            #![allow(dead_code)]
            relay_fixtures!($module, $db, $dialect, $pool);

            /// The model's finding 3: the handler's commit (its effect and
            /// the message's success mark) lands, its acknowledgement is
            /// lost, and the relay's read-back fails too. On the last
            /// attempt, the failure bookkeeping must not write over that
            /// success (it cannot tell that the commit did not land): the
            /// message stays `success`, deducted once. It used to be
            /// dead-lettered, its effect done.
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn an_unknown_commit_whose_read_back_fails_is_never_reverted() {
                let _one = hooks::exclusive().await;
                let Some(pool) = pool().await else { return };
                let topic = topic("unknown");
                let coupon = produce(&pool, &topic, 1).await;
                idem_runtime::testing::set_lost_ack_kinds(&[idem_runtime::testing::Kind::Call]);
                idem_runtime::testing::set_lost_ack_rate(1.0);
                idem_runtime::testing::set_unreadable_read_backs(true);
                let relay = Relay::new(pool.clone())
                    .max_attempts(1)
                    .route(topic.clone(), |d, m: Deduct| async move {
                        deduct(d.source(), &m).await
                    });
                run_once_retrying(&relay, true).await;
                idem_runtime::testing::set_lost_ack_rate(0.0);
                let (status, error): (String, Option<String>) = sqlx::query_as(sql(
                    D,
                    "SELECT status, last_error FROM idem_outbox WHERE topic = ?",
                ))
                .bind(&topic)
                .fetch_one(&pool)
                .await
                .expect("row");
                assert_eq!(deductions(&pool, coupon).await, 1, "the effect committed");
                assert_eq!(status, "success", "never dead-lettered: {error:?}");
            }

            /// Issue 23, point 4: a route whose handler does not take its
            /// source (a publisher's) has its message marked by the relay;
            /// every acknowledgement of that mark lost, on the last
            /// attempt: the mark is read back, never taken for a failure.
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn a_lost_relay_mark_acknowledgement_is_read_back_never_dead_lettered() {
                let _one = hooks::exclusive().await;
                let Some(pool) = pool().await else { return };
                let topic = topic("lostmark");
                let coupon = produce(&pool, &topic, 1).await;
                idem_runtime::testing::set_lost_ack_kinds(&[idem_runtime::testing::Kind::Success]);
                idem_runtime::testing::set_lost_ack_rate(1.0);
                let db = pool.clone();
                // A short lease: the mark's tries go on for half of it.
                let relay = Relay::new(pool.clone())
                    .max_attempts(1)
                    .lease(Duration::from_secs(2))
                    .route(topic.clone(), move |_d, m: Deduct| {
                        let db = db.clone();
                        async move { deduct(&db, &m).await }
                    });
                run_once_retrying(&relay, true).await;
                idem_runtime::testing::set_lost_ack_rate(0.0);
                let lost =
                    idem_runtime::testing::lost_acks_on(idem_runtime::testing::Kind::Success);
                assert!(lost >= 1, "the mark's acknowledgement was lost");
                assert_eq!(deductions(&pool, coupon).await, 1);
                assert_eq!(
                    by_status(&pool, &topic, "success").await,
                    1,
                    "read back as a success"
                );
                assert_eq!(relay.stats().dead_lettered(), 0);
            }
        }
    };
}

mod unknown_commit {
    use super::*;
    idem_testkit::for_each_backend!(unknown_commit_tests);
}
