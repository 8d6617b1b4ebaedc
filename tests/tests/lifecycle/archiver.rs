//! The archiver's periodic task stopped by a cancellation token, in a
//! private database (an archiver moves every finished row it sees): it
//! moved the finished messages before, its status says it stopped, and its
//! report has the totals.

use crate::scratch::Scratch;
use idem_runtime::archive::Archiver;
use idem_runtime::outbox::Relay;
use idem_runtime::task::TaskStatus;
use idem_runtime::{Dialect, Outcome};
use idem_testkit::sql;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

macro_rules! archiver_tests {
    ($module:ident, $db:ty, $dialect:expr, $pool:expr) => {
        mod $module {
            use super::*;
            use sqlx::Pool;
            type Db = $db;
            const D: Dialect = $dialect;
            const TOPIC: &str = "lifecycle.archived";

            async fn count(pool: &Pool<Db>, table: &'static str) -> i64 {
                let q = match table {
                    "idem_outbox" => "SELECT COUNT(*) FROM idem_outbox",
                    _ => "SELECT COUNT(*) FROM idem_outbox_history",
                };
                sqlx::query_scalar(sql(D, q))
                    .fetch_one(pool)
                    .await
                    .expect("count")
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn an_archiver_stops_on_a_cancellation_token() {
                let Some((pool, name)) = <Db as Scratch>::scratch().await else {
                    return;
                };
                idem_runtime::migrate(&pool).await.expect("migrate");
                let mut tx = pool.begin().await.expect("begin");
                for n in 0..3 {
                    let id = format!("m-{n}");
                    idem_runtime::outbox::enqueue(&mut tx, TOPIC, &id, &serde_json::json!(n))
                        .await
                        .expect("enqueue");
                }
                tx.commit().await.expect("commit");
                let drained = Relay::new(pool.clone())
                    .route(TOPIC, |_d, _n: u32| async { Ok(Outcome::Executed(())) })
                    .drain()
                    .await
                    .expect("drain");
                assert_eq!(drained.stats.executed, 3);
                let token = CancellationToken::new();
                let archiver = Archiver::new(pool.clone())
                    .outbox_retention(Duration::ZERO)
                    .spawn(Duration::from_millis(50))
                    .stop_on(token.clone().cancelled_owned());
                idem_testkit::wait_for(
                    "the messages archived",
                    Duration::from_secs(20),
                    || async { count(&pool, "idem_outbox_history").await == 3 },
                )
                .await;
                assert_eq!(archiver.status(), TaskStatus::Running);
                token.cancel();
                idem_testkit::wait_for("the archiver stopped", Duration::from_secs(20), || async {
                    archiver.is_finished()
                })
                .await;
                assert_eq!(archiver.status(), TaskStatus::Stopped);
                let report = archiver
                    .shutdown_within(Duration::from_secs(5))
                    .await
                    .expect("a clean stop");
                assert!(!report.abandoned, "{report:?}");
                assert_eq!(report.totals.outbox, 3, "{report:?}");
                assert_eq!(count(&pool, "idem_outbox").await, 0);
                drop(pool);
                <Db as Scratch>::drop(&name).await;
            }
        }
    };
}

idem_testkit::for_each_backend!(archiver_tests);
