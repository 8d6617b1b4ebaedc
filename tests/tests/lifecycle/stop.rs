//! A spawned relay stopped by a cancellation token, by a future, and
//! within a deadline that abandons a slow handler (whose message another
//! relay claims again once its lease ran out, and which acts once); its
//! status while it runs and once it stopped.

use crate::common::hooks;
use crate::common::relay::*;
use idem_runtime::task::TaskStatus;
use std::sync::Arc;
use tokio_util::sync::CancellationToken;

macro_rules! stop_tests {
    ($module:ident, $db:ty, $dialect:expr, $pool:expr) => {
        mod $module {
            // The shared fixtures serve every relay module; this one uses
            // only part of them.
            #![allow(dead_code)]
            relay_fixtures!($module, $db, $dialect, $pool);

            fn relay(pool: &Pool<Db>, topic: &str) -> Relay<Db> {
                Relay::new(pool.clone())
                    .route(topic.to_owned(), |d, m: Deduct| async move {
                        deduct(d.source(), &m).await
                    })
                    .poll_interval(Duration::from_millis(20))
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn a_relay_stops_on_a_cancellation_token() {
                let _hooks = hooks::shared().await;
                let Some(pool) = pool().await else { return };
                let topic = topic("token");
                let mut coupons = Vec::new();
                for _ in 0..5 {
                    coupons.push(produce(&pool, &topic, 1).await);
                }
                let token = CancellationToken::new();
                let handle = relay(&pool, &topic).spawn_until(token.clone().cancelled_owned());
                drained(&pool, &topic).await;
                assert_eq!(handle.status(), TaskStatus::Running);
                assert!(!handle.is_finished());
                token.cancel();
                tokio::time::timeout(Duration::from_secs(20), handle.finished())
                    .await
                    .expect("the relay stops on its token");
                assert_eq!(handle.status(), TaskStatus::Stopped);
                // Stopped: a message enqueued now is nobody's.
                let late = produce(&pool, &topic, 1).await;
                let report = handle
                    .shutdown_within(Duration::from_secs(5))
                    .await
                    .expect("a clean stop");
                assert!(report.abandoned.is_empty(), "{report:?}");
                assert_eq!(report.stats.executed, 5, "{report:?}");
                for c in &coupons {
                    assert_eq!(deductions(&pool, *c).await, 1, "coupon {c}");
                }
                assert_eq!(deductions(&pool, late).await, 0);
                assert_eq!(by_status(&pool, &topic, "success").await, 5);
                assert_eq!(
                    by_status(&pool, &topic, "pending").await,
                    1,
                    "claimed after the stop"
                );
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn a_relay_runs_until_a_future() {
                let _hooks = hooks::shared().await;
                let Some(pool) = pool().await else { return };
                let topic = topic("future");
                let mut coupons = Vec::new();
                for _ in 0..3 {
                    coupons.push(produce(&pool, &topic, 1).await);
                }
                let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
                let run =
                    tokio::spawn(relay(&pool, &topic).run_until(stopped, Duration::from_secs(20)));
                drained(&pool, &topic).await;
                assert!(!run.is_finished(), "runs until its future");
                stop.send(()).expect("the relay waits for its future");
                let report = tokio::time::timeout(Duration::from_secs(20), run)
                    .await
                    .expect("stopped on its future")
                    .expect("no panic")
                    .expect("a clean stop");
                assert!(report.abandoned.is_empty(), "{report:?}");
                assert_eq!(report.stats.executed, 3, "{report:?}");
                for c in &coupons {
                    assert_eq!(deductions(&pool, *c).await, 1, "coupon {c}");
                }
                assert_eq!(by_status(&pool, &topic, "success").await, 3);
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn a_deadline_abandons_a_slow_handler_whose_message_acts_once_later() {
                let _hooks = hooks::shared().await;
                let Some(pool) = pool().await else { return };
                let topic = topic("deadline");
                let coupon = produce(&pool, &topic, 1).await;
                let started = Arc::new(tokio::sync::Notify::new());
                let s = started.clone();
                let slow = Relay::new(pool.clone())
                    .route(topic.clone(), move |d, m: Deduct| {
                        s.notify_one();
                        async move { deduct_slow(d.source(), &m, Duration::from_secs(120)).await }
                    })
                    .lease(Duration::from_secs(1))
                    .poll_interval(Duration::from_millis(20))
                    .spawn();
                tokio::time::timeout(Duration::from_secs(20), started.notified())
                    .await
                    .expect("the slow handler started");
                let report = slow
                    .shutdown_within(Duration::from_millis(300))
                    .await
                    .expect("stopped at the deadline");
                let id: i64 =
                    sqlx::query_scalar(sql(D, "SELECT id FROM idem_outbox WHERE topic = ?"))
                        .bind(&topic)
                        .fetch_one(&pool)
                        .await
                        .expect("the message");
                assert_eq!(report.abandoned, [id], "{report:?}");
                assert_eq!(
                    (report.finished, report.stats.executed),
                    (0, 0),
                    "{report:?}"
                );
                // Aborted before its body's write: nothing happened yet.
                assert_eq!(deductions(&pool, coupon).await, 0);
                assert_eq!(by_status(&pool, &topic, "pending").await, 1);
                // Another relay takes it once its lease has run out.
                let next = relay(&pool, &topic).lease(Duration::from_secs(1)).spawn();
                drained(&pool, &topic).await;
                let report = next
                    .shutdown_within(Duration::from_secs(20))
                    .await
                    .expect("a clean stop");
                assert_eq!(
                    (report.stats.executed, report.stats.reclaimed),
                    (1, 1),
                    "{report:?}"
                );
                assert_eq!(deductions(&pool, coupon).await, 1, "acted once");
                assert_eq!(by_status(&pool, &topic, "success").await, 1);
                assert_eq!(
                    attempts_of(&pool, &topic).await,
                    [2],
                    "the abandoned attempt, then the one that acted"
                );
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn a_panicking_handler_leaves_the_relay_running() {
                let _hooks = hooks::shared().await;
                let Some(pool) = pool().await else { return };
                let topic = topic("panic");
                let coupon = produce(&pool, &topic, 1).await;
                let calls = Arc::new(std::sync::atomic::AtomicUsize::new(0));
                let c = calls.clone();
                let handle = Relay::new(pool.clone())
                    .route(topic.clone(), move |d, m: Deduct| {
                        let first = c.fetch_add(1, Ordering::SeqCst) == 0;
                        async move {
                            if first {
                                panic!("the handler's first call panics");
                            }
                            deduct(d.source(), &m).await
                        }
                    })
                    .backoff(Duration::from_millis(10), Duration::from_millis(10))
                    .poll_interval(Duration::from_millis(20))
                    .spawn();
                drained(&pool, &topic).await;
                assert_eq!(
                    handle.status(),
                    TaskStatus::Running,
                    "a handler's panic is a failed attempt"
                );
                let report = handle
                    .shutdown_within(Duration::from_secs(20))
                    .await
                    .expect("a clean stop");
                assert_eq!(
                    (report.stats.retried, report.stats.executed),
                    (1, 1),
                    "{report:?}"
                );
                assert_eq!(deductions(&pool, coupon).await, 1);
                assert_eq!(attempts_of(&pool, &topic).await, [2]);
            }
        }
    };
}

idem_testkit::for_each_backend!(stop_tests);
