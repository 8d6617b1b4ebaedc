//! Paused topics (`idem_topic_pause`, schema version 4), on every backend
//! against the real servers: a relay claims nothing of a paused topic
//! while it delivers the others, polls at its poll interval meanwhile
//! (never spins on the paused messages), and delivers the topic once
//! its pause row is deleted. The control (`testing::set_broken_ignore_pause`)
//! claims paused topics too, and the test sees it deliver one.
//!
//! The pause row is written with plain SQL: the operator's API that
//! writes it is tested on its own.

use crate::common::hooks;
use crate::common::relay::*;
use std::sync::Arc;
use std::sync::atomic::AtomicU32;

/// The poll interval of the relays here.
const POLL: Duration = Duration::from_millis(40);

/// Waits for `what` for at most 30 s.
async fn until<F: std::future::Future<Output = bool>>(what: &str, mut done: impl FnMut() -> F) {
    let start = Instant::now();
    while !done().await {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

macro_rules! pause_tests {
    ($module:ident, $db:ty, $dialect:expr, $pool:expr) => {
        mod $module {
            #![allow(dead_code)]
            relay_fixtures!($module, $db, $dialect, $pool);

            async fn pause(pool: &Pool<Db>, topic: &str) {
                sqlx::query(sql(
                    D,
                    "INSERT INTO idem_topic_pause (topic, reason, paused_by) VALUES (?, 'test', 'test')",
                ))
                .bind(topic)
                .execute(pool)
                .await
                .expect("pause");
            }

            async fn resume(pool: &Pool<Db>, topic: &str) {
                sqlx::query(sql(D, "DELETE FROM idem_topic_pause WHERE topic = ?"))
                    .bind(topic)
                    .execute(pool)
                    .await
                    .expect("resume");
            }

            async fn enqueue_one(pool: &Pool<Db>, topic: &str) {
                let mut tx = <Db as idem_runtime::Backend>::begin(pool).await.expect("begin");
                idem_runtime::outbox::enqueue(&mut tx, topic, "m-1", &serde_json::json!({"n": 1}))
                    .await
                    .expect("enqueue");
                tx.commit().await.expect("commit");
            }

            /// A relay of topics `a` and `b` counting each one's runs.
            fn relay(pool: &Pool<Db>, a: &str, b: &str) -> (Relay<Db>, Arc<AtomicU32>, Arc<AtomicU32>) {
                let (runs_a, runs_b) = (Arc::new(AtomicU32::new(0)), Arc::new(AtomicU32::new(0)));
                let (ra, rb) = (runs_a.clone(), runs_b.clone());
                let relay = Relay::new(pool.clone())
                    .poll_interval(POLL)
                    .route(a.to_string(), move |_d, _m: serde_json::Value| {
                        ra.fetch_add(1, Ordering::SeqCst);
                        async { Ok(Outcome::Executed(())) }
                    })
                    .route(b.to_string(), move |_d, _m: serde_json::Value| {
                        rb.fetch_add(1, Ordering::SeqCst);
                        async { Ok(Outcome::Executed(())) }
                    });
                (relay, runs_a, runs_b)
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn a_paused_topic_waits_and_the_others_go_on() {
                let _hooks = hooks::shared().await;
                let Some(pool) = pool().await else { return };
                let (a, b) = (topic("paused"), topic("running"));
                pause(&pool, &a).await;
                enqueue_one(&pool, &a).await;
                enqueue_one(&pool, &b).await;
                let (relay, runs_a, runs_b) = relay(&pool, &a, &b);
                let handle = relay.clone().spawn();
                until("B delivered", || async { by_status(&pool, &b, "success").await == 1 }).await;
                // Claims after B's: each one passed A over.
                let first = relay.stats().claims();
                until("a claim after B's", || async { relay.stats().claims() > first }).await;
                let (from, since) = (relay.stats().claims(), Instant::now());
                until("five more claims", || async { relay.stats().claims() >= from + 5 }).await;
                // No spin: an idle relay claims once per poll interval.
                assert!(
                    since.elapsed() >= 3 * POLL,
                    "5 claims in {:?}: the relay spins on the paused message",
                    since.elapsed()
                );
                assert_eq!(runs_a.load(Ordering::SeqCst), 0, "A was delivered while paused");
                let (status, attempts): (String, i32) = sqlx::query_as(sql(
                    D,
                    "SELECT status, attempts FROM idem_outbox WHERE topic = ?",
                ))
                .bind(&a)
                .fetch_one(&pool)
                .await
                .expect("A");
                assert_eq!((status.as_str(), attempts), ("pending", 0), "A never claimed");
                resume(&pool, &a).await;
                until("A delivered", || async { by_status(&pool, &a, "success").await == 1 }).await;
                handle.shutdown().await;
                assert_eq!(runs_a.load(Ordering::SeqCst), 1, "A delivered once");
                assert_eq!(runs_b.load(Ordering::SeqCst), 1, "B delivered once");
                assert_eq!(attempts_of(&pool, &a).await, [1]);
            }

            /// The control: a claim that ignores pauses delivers A.
            #[cfg_attr(
                not(idem_broken),
                ignore = "a control: needs RUSTFLAGS=\"--cfg idem_broken\" (see .ci/run)"
            )]
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn control_ignore_pause_delivers_a_paused_topic() {
                let _hooks = hooks::exclusive().await;
                let Some(pool) = pool().await else { return };
                let (a, b) = (topic("paused"), topic("running"));
                pause(&pool, &a).await;
                enqueue_one(&pool, &a).await;
                idem_runtime::testing::set_broken_ignore_pause(true);
                // Read when the routes are set: the relay is built broken.
                let (relay, runs_a, _) = relay(&pool, &a, &b);
                let handle = relay.spawn();
                until("the paused A delivered", || async {
                    by_status(&pool, &a, "success").await == 1
                })
                .await;
                handle.shutdown().await;
                assert_eq!(runs_a.load(Ordering::SeqCst), 1);
                resume(&pool, &a).await;
            }
        }
    };
}

idem_testkit::for_each_backend!(pause_tests);
