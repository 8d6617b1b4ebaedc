//! A relay refuses a database without idem's tables, or with tables of an
//! older schema version: its task ends at once with a configuration error
//! naming the versions and `idem migrate`, its handle's status says so, and
//! it wrote nothing. Once migrated, the same database runs it.

use crate::scratch::Scratch;
use idem_runtime::outbox::Relay;
use idem_runtime::task::{TaskError, TaskStatus};
use idem_runtime::{Dialect, Error, Outcome, SCHEMA_VERSION};
use idem_testkit::sql;
use std::time::Duration;

macro_rules! refusal_tests {
    ($module:ident, $db:ty, $dialect:expr, $pool:expr) => {
        mod $module {
            use super::*;
            use sqlx::Pool;
            type Db = $db;
            const D: Dialect = $dialect;
            const TOPIC: &str = "lifecycle.refused";

            fn relay(pool: &Pool<Db>) -> Relay<Db> {
                Relay::new(pool.clone())
                    .route(TOPIC, |_d, _m: serde_json::Value| async {
                        Ok(Outcome::Executed(()))
                    })
                    .poll_interval(Duration::from_millis(10))
            }

            /// Spawns a relay on `pool` and returns the error it ended with.
            async fn refusal(pool: &Pool<Db>) -> String {
                let handle = relay(pool).spawn();
                tokio::time::timeout(Duration::from_secs(20), handle.finished())
                    .await
                    .expect("refused at once, not retried");
                let TaskStatus::Failed(reason) = handle.status() else {
                    panic!("{:?}", handle.status());
                };
                let ended = handle.shutdown_within(Duration::from_secs(1)).await;
                assert!(
                    matches!(ended, Err(TaskError::Failed(Error::Config { .. }))),
                    "{ended:?}"
                );
                let once = relay(pool).run_once().await;
                assert!(matches!(once, Err(Error::Config { .. })), "{once:?}");
                assert!(reason.contains("idem migrate"), "{reason}");
                assert!(
                    reason.contains(&format!("version {SCHEMA_VERSION}")),
                    "{reason}"
                );
                reason
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn a_relay_refuses_a_database_without_idem_tables() {
                let Some((pool, name)) = <Db as Scratch>::scratch().await else {
                    return;
                };
                sqlx::query("CREATE TABLE lc_app (id BIGINT PRIMARY KEY)")
                    .execute(&pool)
                    .await
                    .expect("the application's own table");
                let reason = refusal(&pool).await;
                assert!(reason.contains("no idem schema version"), "{reason}");
                let tables = idem_runtime::existing_tables(&pool).await.expect("tables");
                assert!(
                    tables.iter().all(|(_, exists)| !exists),
                    "the relay created nothing: {tables:?}"
                );
                <Db as Scratch>::drop(&name).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn a_relay_refuses_an_older_schema_and_runs_once_migrated() {
                let Some((pool, name)) = <Db as Scratch>::scratch().await else {
                    return;
                };
                idem_runtime::schema::migrate_to(&pool, 2)
                    .await
                    .expect("a version-2 database");
                let reason = refusal(&pool).await;
                assert!(reason.contains("schema version 2"), "{reason}");
                let version: i64 =
                    sqlx::query_scalar("SELECT MAX(version) FROM idem_schema_version")
                        .fetch_one(&pool)
                        .await
                        .expect("version");
                assert_eq!(version, 2, "the relay upgraded nothing");
                idem_runtime::migrate(&pool).await.expect("migrate");
                let mut tx = pool.begin().await.expect("begin");
                idem_runtime::outbox::enqueue(&mut tx, TOPIC, "m-1", &serde_json::json!({}))
                    .await
                    .expect("enqueue");
                tx.commit().await.expect("commit");
                let handle = relay(&pool).spawn();
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
                assert_eq!(handle.status(), TaskStatus::Running);
                let report = handle
                    .shutdown_within(Duration::from_secs(20))
                    .await
                    .expect("a clean stop");
                assert_eq!(report.stats.executed, 1, "{report:?}");
                drop(pool);
                <Db as Scratch>::drop(&name).await;
            }
        }
    };
}

idem_testkit::for_each_backend!(refusal_tests);
