//! Failing claims: with the outbox table renamed away under a running
//! relay (in a private database), every claim fails; the relay warns once,
//! backs off instead of claiming every poll, and says once that claims
//! succeed again when the table is back, then delivers the message that
//! waited, once.

use crate::capture::Capture;
use crate::scratch::Scratch;
use idem_runtime::outbox::Relay;
use idem_runtime::{Dialect, Outcome};
use idem_testkit::sql;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;
use tracing::Level;
use tracing_subscriber::layer::SubscriberExt;

const FAILING: &str = "outbox claims are failing";
const AGAIN: &str = "outbox claims still failing";
const BACK: &str = "outbox claims succeed again";

macro_rules! claim_failure_tests {
    ($module:ident, $db:ty, $dialect:expr, $pool:expr) => {
        mod $module {
            use super::*;
            use sqlx::Pool;
            type Db = $db;
            const D: Dialect = $dialect;
            const TOPIC: &str = "lifecycle.claims";

            async fn rename(pool: &Pool<Db>, from: &str, to: &str) {
                let text = <Db as Scratch>::rename(from, to);
                sqlx::raw_sql(sqlx::AssertSqlSafe(text))
                    .execute(pool)
                    .await
                    .expect("rename");
            }

            // Current-thread: the relay's tasks run on the test's thread,
            // where the capture is the default subscriber.
            #[tokio::test]
            async fn claim_failures_are_logged_once_per_change_and_backed_off() {
                let Some((pool, name)) = <Db as Scratch>::scratch().await else {
                    return;
                };
                idem_runtime::migrate(&pool).await.expect("migrate");
                let capture = Capture::default();
                let _default = tracing::subscriber::set_default(
                    tracing_subscriber::registry().with(capture.clone()),
                );
                let mut tx = pool.begin().await.expect("begin");
                idem_runtime::outbox::enqueue(&mut tx, TOPIC, "m-1", &serde_json::json!({}))
                    .await
                    .expect("enqueue");
                tx.commit().await.expect("commit");
                rename(&pool, "idem_outbox", "idem_outbox_away").await;
                let calls = Arc::new(AtomicUsize::new(0));
                let c = calls.clone();
                let handle = Relay::new(pool.clone())
                    .route(TOPIC, move |_d, _m: serde_json::Value| {
                        c.fetch_add(1, Ordering::SeqCst);
                        async { Ok(Outcome::Executed(())) }
                    })
                    .poll_interval(Duration::from_millis(10))
                    .push_wakeup(false)
                    .spawn();
                idem_testkit::wait_for("claims failing", Duration::from_secs(20), || async {
                    capture.count(Level::WARN, FAILING) > 0
                })
                .await;
                // A window of failing claims: at a 10 ms poll, about 150
                // claims without a back-off.
                tokio::time::sleep(Duration::from_millis(1500)).await;
                let failures = 1 + capture.count(Level::DEBUG, AGAIN);
                assert!(
                    (3..=20).contains(&failures),
                    "{failures} failed claims in 1.5 s"
                );
                assert_eq!(
                    capture.idem_events(Level::WARN).len(),
                    1,
                    "{:?}",
                    capture.idem_events(Level::WARN)
                );
                assert_eq!(capture.count(Level::INFO, BACK), 0);
                assert!(
                    handle.status().is_running(),
                    "failing claims do not end the relay"
                );
                rename(&pool, "idem_outbox_away", "idem_outbox").await;
                idem_testkit::wait_for(
                    "the message delivered",
                    Duration::from_secs(20),
                    || async {
                        let done: i64 = sqlx::query_scalar(sql(
                            D,
                            "SELECT COUNT(*) FROM idem_outbox WHERE status = 'success'",
                        ))
                        .fetch_one(&pool)
                        .await
                        .expect("count");
                        done == 1
                    },
                )
                .await;
                assert_eq!(capture.count(Level::INFO, BACK), 1);
                assert_eq!(capture.count(Level::WARN, FAILING), 1);
                let report = handle
                    .shutdown_within(Duration::from_secs(20))
                    .await
                    .expect("a clean stop");
                assert_eq!(report.stats.executed, 1, "{report:?}");
                assert_eq!(calls.load(Ordering::SeqCst), 1);
                drop(pool);
                <Db as Scratch>::drop(&name).await;
            }
        }
    };
}

idem_testkit::for_each_backend!(claim_failure_tests);
