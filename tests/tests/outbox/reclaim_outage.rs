//! An outage attempt stays uncounted when a claim that began before the
//! attempt failed takes its message once the database is back.
//!
//! The order, forced: a handler holds its message; the relay's next claim
//! is held before it takes a connection (`testing::hold_claims`, where a
//! claim waiting for a connection through an outage sits); the database
//! goes down (a proxy closing every connection), the handler fails in the
//! outage and its release cannot be written (kept, `Unrecorded`); the
//! message's lease runs out; the database comes back and the held claim
//! runs, taking the message over its run-out lease. That claim must not
//! count the outage attempt: the message settles with one attempt. The
//! control keeps the claim's attempt (`set_broken_reclaim_counted`) and
//! sees two: the restart tests' "held messages counted a second attempt",
//! which this order produced once in CI.
//!
//! PostgreSQL and MariaDB, through a proxy that takes them down; SQLite
//! has no connection to lose.

use crate::common::hooks;
use crate::common::relay::*;
use idem_runtime::outbox::Settlement;
use idem_runtime::testing;
use idem_testkit::proxy::FaultProxy;
use std::sync::Arc;
use std::sync::atomic::AtomicUsize;
use tokio::sync::Notify;

const LEASE: Duration = Duration::from_secs(1);

/// Lets the claims go again, also when a test fails.
struct Released;

impl Drop for Released {
    fn drop(&mut self) {
        testing::hold_claims(false);
    }
}

/// Waits for `what` for at most 60 s.
async fn until(what: &str, mut done: impl FnMut() -> bool) {
    let start = Instant::now();
    while !done() {
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

macro_rules! reclaim_tests {
    ($module:ident, $db:ty, $dialect:expr, $pool:expr, $url:expr) => {
        mod $module {
            #![allow(dead_code)]
            relay_fixtures!($module, $db, $dialect, $pool);

            /// The message's `attempts` once it settled, and its status.
            async fn run() -> Option<(i32, String)> {
                let direct = pool().await?;
                let url: String = $url;
                let proxy = FaultProxy::for_url(&url, 0.0).await.expect("start proxy");
                let pool = sqlx::pool::PoolOptions::<Db>::new()
                    .max_connections(4)
                    .acquire_timeout(Duration::from_secs(1))
                    .connect(&proxy.url(&url))
                    .await
                    .expect("pool through the proxy");
                let topic = topic("reclaim.outage");
                let coupon = produce(&direct, &topic, 1).await;
                let (calls, go) = (Arc::new(AtomicUsize::new(0)), Arc::new(Notify::new()));
                let unrecorded = Arc::new(AtomicUsize::new(0));
                let (c, g, u) = (calls.clone(), go.clone(), unrecorded.clone());
                let relay = Relay::new(pool.clone())
                    .on_settled(move |s| {
                        if matches!(s.settlement, Settlement::Unrecorded) {
                            u.fetch_add(1, Ordering::SeqCst);
                        }
                    })
                    .route(topic.clone(), move |d, m: Deduct| {
                        let (c, g) = (c.clone(), g.clone());
                        async move {
                            if c.fetch_add(1, Ordering::SeqCst) == 0 {
                                g.notified().await;
                                return Err(Error::broker_unavailable(
                                    "test",
                                    "the broker is down",
                                ));
                            }
                            deduct(d.source(), &m).await
                        }
                    })
                    .lease(LEASE)
                    .concurrency(2)
                    .poll_interval(Duration::from_millis(20))
                    .outage_retry(Duration::from_millis(200))
                    .spawn();
                until("the first attempt", || calls.load(Ordering::SeqCst) == 1).await;
                let _released = Released;
                testing::hold_claims(true);
                until("a held claim", || testing::claims_waiting() >= 1).await;
                proxy.set_down(true);
                go.notify_one();
                until("the attempt's release kept", || {
                    unrecorded.load(Ordering::SeqCst) == 1
                })
                .await;
                // Its lease, renewed last before the outage, runs out.
                tokio::time::sleep(LEASE + Duration::from_millis(500)).await;
                proxy.set_down(false);
                testing::hold_claims(false);
                drained(&direct, &topic).await;
                relay.shutdown().await;
                assert_eq!(deductions(&direct, coupon).await, 1, "acts once");
                let attempts = attempts_of(&direct, &topic).await;
                let status: String =
                    sqlx::query_scalar(sql(D, "SELECT status FROM idem_outbox WHERE topic = ?"))
                        .bind(&topic)
                        .fetch_one(&direct)
                        .await
                        .expect("status");
                Some((attempts[0], status))
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn a_claim_begun_before_an_outage_attempt_failed_does_not_count_it() {
                let _hooks = hooks::exclusive().await;
                let Some((attempts, status)) = run().await else {
                    return;
                };
                assert_eq!(status, "success");
                assert_eq!(attempts, 1, "the outage attempt counted");
            }

            /// The control: the claim keeps its attempt.
            #[cfg_attr(
                not(idem_broken),
                ignore = "a control: needs RUSTFLAGS=\"--cfg idem_broken\" (see .ci/run)"
            )]
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn control_reclaim_counted_counts_the_outage_attempt() {
                let _hooks = hooks::exclusive().await;
                testing::set_broken_reclaim_counted(true);
                let run = run().await;
                testing::set_broken_reclaim_counted(false);
                let Some((attempts, _)) = run else { return };
                assert_eq!(attempts, 2, "the control's claim kept its attempt");
            }
        }
    };
}

idem_testkit::for_each_backend!(reclaim_tests;
    postgres => (idem_testkit::postgres_url()),
    mariadb => (idem_testkit::mysql_url()),
);
