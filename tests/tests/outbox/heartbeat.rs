//! Process heartbeats (`idem_process`, schema version 4), on every backend
//! against the real servers: a spawned relay's row (its owner, kind
//! `relay`, its topics, this host and pid) appears, its `heartbeat_at`
//! moves, a row deleted under it is written again, and the row is gone
//! after the relay's shutdown; a `Heartbeat` of its own (a consumer's)
//! deletes its row when stopped. Every assertion reads the database.

use crate::common::hooks;
use crate::common::relay::*;
use idem_runtime::process::{Heartbeat, hostname};

/// The heartbeat interval of the relays here.
const EVERY: Duration = Duration::from_millis(20);

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

/// A process's row: kind, name, host, pid.
type ProcessRow = (String, String, Option<String>, Option<i64>);

macro_rules! heartbeat_tests {
    ($module:ident, $db:ty, $dialect:expr, $pool:expr) => {
        mod $module {
            #![allow(dead_code)]
            relay_fixtures!($module, $db, $dialect, $pool);

            /// `heartbeat_at` as text, and whether it is past `started_at`.
            const BEAT: &str = match D {
                Dialect::Postgres => {
                    "SELECT heartbeat_at::text, CAST(CASE WHEN heartbeat_at > started_at THEN 1 ELSE 0 END AS BIGINT) \
                     FROM idem_process WHERE id = ?"
                }
                Dialect::MySql => {
                    "SELECT CAST(heartbeat_at AS CHAR), CAST(CASE WHEN heartbeat_at > started_at THEN 1 ELSE 0 END AS SIGNED) \
                     FROM idem_process WHERE id = ?"
                }
                _ => {
                    "SELECT heartbeat_at, CASE WHEN heartbeat_at > started_at THEN 1 ELSE 0 END \
                     FROM idem_process WHERE id = ?"
                }
            };

            async fn row(pool: &Pool<Db>, id: &str) -> Option<ProcessRow> {
                sqlx::query_as(sql(D, "SELECT kind, name, host, pid FROM idem_process WHERE id = ?"))
                    .bind(id)
                    .fetch_optional(pool)
                    .await
                    .expect("process row")
            }

            async fn beat(pool: &Pool<Db>, id: &str) -> Option<(String, i64)> {
                sqlx::query_as(sql(D, BEAT))
                    .bind(id)
                    .fetch_optional(pool)
                    .await
                    .expect("heartbeat_at")
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn a_spawned_relay_keeps_its_row_until_it_stops() {
                let _hooks = hooks::shared().await;
                let Some(pool) = pool().await else { return };
                let (a, b) = (topic("hb-b"), topic("hb-a"));
                let owner = format!("hb-{}", ids(1));
                let relay = Relay::new(pool.clone())
                    .owner(owner.clone())
                    .heartbeat_interval(EVERY)
                    .route(a.clone(), |_d, _m: serde_json::Value| async { Ok(Outcome::Executed(())) })
                    .route(b.clone(), |_d, _m: serde_json::Value| async { Ok(Outcome::Executed(())) });
                assert_eq!(relay.settings().heartbeat_interval, EVERY);
                let handle = relay.spawn();
                until("the relay's row", || async { row(&pool, &owner).await.is_some() }).await;
                let (kind, name, host, pid) = row(&pool, &owner).await.expect("row");
                assert_eq!(kind, "relay");
                // Its topics, sorted, joined with ','.
                assert_eq!(name, format!("{b},{a}"));
                assert_eq!(host.as_deref(), hostname());
                assert_eq!(pid, Some(i64::from(std::process::id())));
                let (first, _) = beat(&pool, &owner).await.expect("beat");
                until("heartbeat_at to move", || async {
                    matches!(beat(&pool, &owner).await, Some((at, 1)) if at != first)
                })
                .await;
                // Deleted under it (an operator's clean-up): written again.
                sqlx::query(sql(D, "DELETE FROM idem_process WHERE id = ?"))
                    .bind(&owner)
                    .execute(&pool)
                    .await
                    .expect("delete");
                until("the row written again", || async { row(&pool, &owner).await.is_some() }).await;
                handle.shutdown().await;
                assert_eq!(row(&pool, &owner).await, None, "deleted at shutdown");
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn a_heartbeat_of_its_own_deletes_its_row_when_stopped() {
                let Some(pool) = pool().await else { return };
                let id = format!("consumer-{}", ids(1));
                let name = "q".repeat(300);
                let hb = Heartbeat::builder(id.clone(), "consumer", name)
                    .interval(EVERY)
                    .host(Some("box-1"))
                    .start(pool.clone());
                assert_eq!(hb.id(), id);
                until("the consumer's row", || async { row(&pool, &id).await.is_some() }).await;
                let (kind, name, host, _) = row(&pool, &id).await.expect("row");
                assert_eq!((kind.as_str(), host.as_deref()), ("consumer", Some("box-1")));
                assert_eq!(name, "q".repeat(256), "cut to the column");
                assert!(hb.stop().await.expect("stop"), "a row deleted");
                assert_eq!(row(&pool, &id).await, None);
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn a_dropped_heartbeat_deletes_its_row_in_the_background() {
                let Some(pool) = pool().await else { return };
                let id = format!("dropped-{}", ids(1));
                let hb = Heartbeat::builder(id.clone(), "consumer", "q").interval(EVERY).start(pool.clone());
                until("the row", || async { row(&pool, &id).await.is_some() }).await;
                drop(hb);
                until("the row deleted", || async { row(&pool, &id).await.is_none() }).await;
            }
        }
    };
}

idem_testkit::for_each_backend!(heartbeat_tests);

/// PostgreSQL: a heartbeat stopped while its write waits for a lock.
macro_rules! stalled_heartbeat_tests {
    ($module:ident, $db:ty, $dialect:expr, $pool:expr) => {
        mod $module {
            #![allow(dead_code)]
            relay_fixtures!($module, $db, $dialect, $pool);

            /// How many sessions wait for a lock in a statement starting
            /// with `head` on `idem_process`.
            async fn waiting(pool: &Pool<Db>, head: &str) -> i64 {
                sqlx::query_scalar(
                    "SELECT COUNT(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' \
                     AND query LIKE $1",
                )
                .bind(format!("{head} idem_process%"))
                .fetch_one(pool)
                .await
                .expect("pg_stat_activity")
            }

            /// The row an earlier beat wrote is deleted by a transaction
            /// still open, so the next beat's upsert waits for it. The
            /// heartbeat is stopped then: its delete must come after that
            /// write, whose row would otherwise outlive the process. (Before
            /// the fix the waiting write was dropped and the delete sent at
            /// once; it found the old row gone when the transaction
            /// committed, and the write then inserted a row nothing deleted.)
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn a_heartbeat_stopped_during_its_write_leaves_no_row() {
                let Some(pool) = pool().await else { return };
                let id = format!("stalled-{}", ids(1));
                sqlx::query(
                    "INSERT INTO idem_process (id, kind, name, started_at, heartbeat_at) \
                     VALUES ($1, 'consumer', 'q', now(), now())",
                )
                .bind(&id)
                .execute(&pool)
                .await
                .expect("an earlier beat's row");
                let mut tx = pool.begin().await.expect("begin");
                sqlx::query("DELETE FROM idem_process WHERE id = $1")
                    .bind(&id)
                    .execute(&mut *tx)
                    .await
                    .expect("delete under a lock");
                let hb = Heartbeat::builder(id.clone(), "consumer", "q")
                    .interval(EVERY)
                    .start(pool.clone());
                until("the beat waiting for the lock", || async {
                    waiting(&pool, "INSERT INTO").await > 0
                })
                .await;
                let stop = tokio::spawn(hb.stop());
                // The broken heartbeat's delete waits too, at once; the
                // fixed one's waits for the write. (Up to 1 s: the fixed
                // one never comes.)
                let start = Instant::now();
                while waiting(&pool, "DELETE FROM").await == 0
                    && start.elapsed() < Duration::from_secs(1)
                {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
                tx.commit().await.expect("commit");
                let _ = stop.await.expect("the stop's task");
                let left: Option<String> =
                    sqlx::query_scalar("SELECT kind FROM idem_process WHERE id = $1")
                        .bind(&id)
                        .fetch_optional(&pool)
                        .await
                        .expect("process row");
                assert_eq!(left, None, "the stopped heartbeat left its row");
            }
        }
    };
}

idem_testkit::for_each_backend!(stalled_heartbeat_tests; postgres as postgres_stalled);
