//! Record lifecycle on every backend, against the real servers: the
//! archiver moves expired records (and finished outbox messages) to the
//! history tables under concurrent handler traffic without losing a record
//! or letting a key inside its retention window execute twice; a crash in
//! the middle of archiving resumes and moves everything exactly once;
//! archived records stay queryable by key. Every assertion counts rows in
//! the database.

use idem_runtime::Dialect;
use idem_runtime::archive::{Archiver, RecordInfo, find_record};
use idem_runtime::{Error, Outcome, idempotent};
use idem_testkit::{ids, sql};
use serde::{Deserialize, Serialize};
use std::future::Future;
use std::time::{Duration, Instant};

#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Note {
    pub(crate) key: String,
}

/// The record of a key, when one handler writes it (one business type).
fn first(found: Vec<RecordInfo>) -> Option<RecordInfo> {
    assert!(found.len() <= 1, "{found:?}");
    found.into_iter().next()
}

/// An outbox retention no test row reaches: archivers of the record tests
/// leave the outbox alone.
const NEVER: Duration = Duration::from_secs(3650 * 86_400);

/// Retryable failures of handler calls in this process (reported only).
static RETRIED: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// Calls a handler until it answers, retrying what a relay would retry (a
/// deadlock victim, a record archived under a concurrent duplicate).
async fn deliver<F, Fut>(call: F)
where
    F: Fn() -> Fut,
    Fut: Future<Output = Result<Outcome<String>, Error>>,
{
    for _ in 0..200 {
        match call().await {
            Ok(_) => return,
            Err(e) if e.is_retryable() => {
                RETRIED.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(5)).await
            }
            Err(e) => panic!("non-retryable: {e}"),
        }
    }
    panic!("still failing after 200 attempts");
}

macro_rules! archive_tests {
    ($module:ident, $db:ty, $dialect:expr, $pool:expr) => {
        mod $module {
            use super::*;
            use sqlx::{Pool, Transaction};
            type Db = $db;
            const D: Dialect = $dialect;
            const NAME: &str = stringify!($module);

            async fn pool() -> Option<Pool<Db>> {
                let pool: Pool<Db> = $pool?;
                let mut tx = pool.begin().await.expect("begin");
                if D == Dialect::Postgres {
                    sqlx::query("SELECT pg_advisory_xact_lock(77011)").execute(&mut *tx).await.expect("lock");
                }
                let stmts: &[&str] = match D {
                    Dialect::MySql => &["CREATE TABLE IF NOT EXISTS idem_a_effect \
                        (k VARCHAR(128) NOT NULL, KEY idx_idem_a_effect_k (k))"],
                    _ => &[
                        "CREATE TABLE IF NOT EXISTS idem_a_effect (k VARCHAR(128) NOT NULL)",
                        "CREATE INDEX IF NOT EXISTS idx_idem_a_effect_k ON idem_a_effect (k)",
                    ],
                };
                for stmt in stmts {
                    sqlx::query(*stmt).execute(&mut *tx).await.expect("create table");
                }
                tx.commit().await.expect("commit");
                Some(pool)
            }

            /// Expires one second after it executed.
            #[idempotent(key = "arch-short:{n.key}", strategy = record, biz_type = "arch_short", ttl = "1s")]
            async fn short(tx: &mut Transaction<'_, Db>, n: &Note) -> Result<String, sqlx::Error> {
                sqlx::query(sql(D, "INSERT INTO idem_a_effect (k) VALUES (?)"))
                    .bind(format!("arch-short:{}", n.key))
                    .execute(&mut **tx)
                    .await?;
                Ok(format!("done {}", n.key))
            }

            /// Inside its retention window for the whole test.
            #[idempotent(key = "arch-long:{n.key}", strategy = record, biz_type = "arch_long", ttl = "1h")]
            async fn long(tx: &mut Transaction<'_, Db>, n: &Note) -> Result<String, sqlx::Error> {
                sqlx::query(sql(D, "INSERT INTO idem_a_effect (k) VALUES (?)"))
                    .bind(format!("arch-long:{}", n.key))
                    .execute(&mut **tx)
                    .await?;
                Ok(format!("done {}", n.key))
            }

            async fn count(pool: &Pool<Db>, q: &'static str, key: &str) -> i64 {
                sqlx::query_scalar(sql(D, q)).bind(key.to_string()).fetch_one(pool).await.expect("count")
            }

            async fn effects(pool: &Pool<Db>, key: &str) -> i64 {
                count(pool, "SELECT COUNT(*) FROM idem_a_effect WHERE k = ?", key).await
            }

            async fn online(pool: &Pool<Db>, key: &str) -> i64 {
                count(pool, "SELECT COUNT(*) FROM idem_record WHERE idempotency_key = ?", key).await
            }

            async fn history(pool: &Pool<Db>, key: &str) -> i64 {
                count(pool, "SELECT COUNT(*) FROM idem_record_history WHERE idempotency_key = ?", key).await
            }

            async fn expired_online(pool: &Pool<Db>, prefix: &str) -> i64 {
                let q = match D {
                    Dialect::Postgres => "SELECT COUNT(*) FROM idem_record WHERE idempotency_key LIKE ? AND expire_time < now()",
                    Dialect::MySql => "SELECT COUNT(*) FROM idem_record WHERE idempotency_key LIKE ? AND expire_time < NOW(6)",
                    Dialect::Sqlite => "SELECT COUNT(*) FROM idem_record WHERE idempotency_key LIKE ? \
                        AND expire_time < strftime('%Y-%m-%d %H:%M:%f', 'now')",
                };
                count(pool, q, &format!("{prefix}%")).await
            }

            fn run_tag() -> String {
                format!("{NAME}-{}", ids(1))
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn archiving_under_concurrent_traffic_loses_nothing_and_never_reexecutes_a_retained_key() {
                let _serial = crate::exclusive(D).await;
                let Some(pool) = pool().await else { return };
                let tag = run_tag();
                let notes: Vec<Note> = (0..20).map(|i| Note { key: format!("{tag}-{i}") }).collect();
                // Expired rows others left in the shared tables first, so the
                // archiver below spends its time on this test's records.
                Archiver::new(pool.clone()).outbox_retention(NEVER).run_once(|_| {}).await.expect("drain");
                let archiver = Archiver::new(pool.clone())
                    .batch_size(3)
                    .outbox_retention(NEVER)
                    .spawn(Duration::from_millis(20));
                // Redeliveries: every key, twice at once, round after round,
                // for more than three seconds — short-ttl records expire and
                // are archived between rounds while the long-ttl ones are
                // hammered with duplicates.
                let start = Instant::now();
                let mut rounds = 0;
                while rounds < 8 || start.elapsed() < Duration::from_millis(3500) {
                    let mut tasks = Vec::new();
                    for n in &notes {
                        for _ in 0..2 {
                            let (p, n1) = (pool.clone(), n.clone());
                            tasks.push(tokio::spawn(async move { deliver(|| short(&p, &n1)).await }));
                            let (p, n1) = (pool.clone(), n.clone());
                            tasks.push(tokio::spawn(async move { deliver(|| long(&p, &n1)).await }));
                        }
                    }
                    for t in tasks {
                        t.await.expect("delivery panicked");
                    }
                    rounds += 1;
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                let failed_batches = archiver.errors();
                let during = archiver.shutdown().await;
                assert!(during.records > 0, "the archiver moved records during the traffic: {during:?}");

                // Let every short record expire, then drain.
                tokio::time::sleep(Duration::from_millis(1200)).await;
                Archiver::new(pool.clone()).batch_size(3).outbox_retention(NEVER).run_once(|_| {}).await.expect("drain");

                let mut short_executions = 0;
                for n in &notes {
                    let key = format!("arch-long:{}", n.key);
                    assert_eq!(effects(&pool, &key).await, 1, "{key} is inside its retention: executed once");
                    assert_eq!((online(&pool, &key).await, history(&pool, &key).await), (1, 0), "{key} never moved");

                    let key = format!("arch-short:{}", n.key);
                    let (done, on, hist) = (effects(&pool, &key).await, online(&pool, &key).await, history(&pool, &key).await);
                    assert!(done >= 1, "{key} executed");
                    // One record per execution: none lost, none copied twice.
                    assert_eq!(on + hist, done, "{key}: {on} online + {hist} archived for {done} executions");
                    assert_eq!(on, 0, "{key} expired and was archived");
                    short_executions += done;
                }
                // The expired keys were archived mid-run and their later
                // duplicates executed again: exactly why a record's ttl must
                // outlast every duplicate (RetentionPolicy::check).
                assert!(short_executions > notes.len() as i64, "expired keys were reused: {short_executions}");
                eprintln!(
                    "{NAME}: {rounds} rounds; archiver during traffic {during:?} ({failed_batches} failed batches); \
                     {short_executions} executions of {} short-ttl keys; {} retried calls in this process",
                    notes.len(),
                    RETRIED.load(std::sync::atomic::Ordering::Relaxed)
                );
                assert_eq!(expired_online(&pool, &format!("arch-short:{tag}")).await, 0);
            }

            /// Inserts `n` records that expired an hour ago; returns their keys.
            async fn expired_records(pool: &Pool<Db>, tag: &str, n: usize) -> Vec<String> {
                let keys: Vec<String> = (0..n).map(|i| format!("arch-crash:{tag}-{i}")).collect();
                // Written two hours ago, expired one hour ago.
                let past = match D {
                    Dialect::Postgres => "now() - interval '2 hours', now() - interval '1 hour'",
                    Dialect::MySql => "DATE_SUB(UTC_TIMESTAMP(6), INTERVAL 2 HOUR), DATE_SUB(UTC_TIMESTAMP(6), INTERVAL 1 HOUR)",
                    Dialect::Sqlite => "strftime('%Y-%m-%d %H:%M:%f', 'now', '-2 hours'), \
                        strftime('%Y-%m-%d %H:%M:%f', 'now', '-1 hours')",
                };
                for chunk in keys.chunks(100) {
                    let mut text = String::from(
                        "INSERT INTO idem_record (idempotency_key, biz_type, biz_no, fingerprint, result, create_time, expire_time) VALUES ",
                    );
                    for (i, _) in chunk.iter().enumerate() {
                        if i > 0 {
                            text.push_str(", ");
                        }
                        let p = |k: usize| if D == Dialect::Postgres { format!("${k}") } else { "?".into() };
                        text.push_str(&format!("({}, 'arch_crash', {}, 'f', '\"r\"', {past})", p(2 * i + 1), p(2 * i + 2)));
                    }
                    let mut q = sqlx::query(sqlx::AssertSqlSafe(text));
                    for k in chunk {
                        q = q.bind(k.clone()).bind(k.clone());
                    }
                    q.execute(pool).await.expect("insert expired records");
                }
                keys
            }

            async fn archived_count(pool: &Pool<Db>, tag: &str) -> i64 {
                count(pool, "SELECT COUNT(*) FROM idem_record_history WHERE idempotency_key LIKE ?", &format!("arch-crash:{tag}-%")).await
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn a_crash_mid_archive_resumes_and_moves_everything_exactly_once() {
                let _serial = crate::exclusive(D).await;
                let Some(pool) = pool().await else { return };
                let tag = run_tag();
                // Older expired rows in the shared tables first: the
                // archivers below must be busy with this test's rows.
                Archiver::new(pool.clone()).outbox_retention(NEVER).run_once(|_| {}).await.expect("drain");
                let keys = expired_records(&pool, &tag, 600).await;
                let archiver = Archiver::new(pool.clone()).batch_size(7).outbox_retention(NEVER);

                // A few batches, then the process "dies" (the archiver is dropped).
                for _ in 0..3 {
                    archiver.run_batch().await.expect("batch");
                }
                drop(archiver);

                // Then archivers killed at arbitrary points, in the middle of
                // a batch's transaction as often as not — sometimes during
                // its BEGIN, which must not leave a pooled connection inside
                // a transaction holding locks (the resume below would then
                // skip rows, fail on MariaDB, or wait on SQLite's lock).
                // Short delays, and no more kills once half is moved: on a
                // fast SQLite run an archiver left alone for 30 ms moves all
                // 600 rows, and the crash would not be mid-way.
                for delay_ms in [0u64, 1, 3, 2, 5, 1, 2, 4, 0, 3, 1, 5, 2, 0, 4, 1] {
                    if archived_count(&pool, &tag).await * 2 >= keys.len() as i64 {
                        break;
                    }
                    let a = Archiver::new(pool.clone()).batch_size(7).outbox_retention(NEVER);
                    let task = tokio::spawn(async move { a.run_once(|_| {}).await });
                    tokio::time::sleep(Duration::from_millis(delay_ms)).await;
                    task.abort();
                    let _ = task.await;
                }
                let moved_before = archived_count(&pool, &tag).await;
                assert!(moved_before > 0 && moved_before < keys.len() as i64, "crashed mid-way: {moved_before}");

                // Re-running continues where it stopped.
                let mut batches = 0;
                let report = Archiver::new(pool.clone())
                    .batch_size(50)
                    .outbox_retention(NEVER)
                    .run_once(|so_far| {
                        batches += 1;
                        assert_eq!(so_far.batches, batches, "progress after every batch");
                    })
                    .await
                    .expect("resume");
                assert!(report.batches >= 1);
                for key in &keys {
                    assert_eq!((online(&pool, key).await, history(&pool, key).await), (0, 1), "{key}: archived exactly once");
                }
                assert_eq!(archived_count(&pool, &tag).await, keys.len() as i64);
                assert_eq!(expired_online(&pool, &format!("arch-crash:{tag}")).await, 0);
                let info = find_record(&pool, &keys[0], None).await.map(first).expect("find").expect("archived record found");
                assert!(info.archived);
                assert_eq!(info.result.as_deref(), Some("\"r\""));
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn find_record_finds_online_and_archived_keys() {
                let _serial = crate::exclusive(D).await;
                let Some(pool) = pool().await else { return };
                let tag = run_tag();
                let (kept, expiring) = (Note { key: format!("{tag}-kept") }, Note { key: format!("{tag}-exp") });
                assert!(long(&pool, &kept).await.expect("long").is_executed());
                assert!(short(&pool, &expiring).await.expect("short").is_executed());

                let info = find_record(&pool, &format!("arch-long:{}", kept.key), None).await.map(first).expect("find").expect("online");
                assert!(!info.archived && info.archived_at.is_none(), "{info:?}");
                assert_eq!(info.key, format!("arch-long:{}", kept.key));
                assert_eq!(info.biz_type, "arch_long");
                assert_eq!(info.biz_no, info.key);
                assert_eq!(info.fingerprint.len(), 64);
                assert_eq!(info.result.as_deref(), Some(format!("\"done {}\"", kept.key).as_str()));
                assert!(info.create_time < info.expire_time, "{info:?}");
                let json = serde_json::to_value(&info).expect("serialize");
                assert_eq!(json["archived"], false);

                let key = format!("arch-short:{}", expiring.key);
                let archive = || async {
                    let a = Archiver::new(pool.clone()).batch_size(100).outbox_retention(NEVER);
                    let start = Instant::now();
                    while online(&pool, &key).await > 0 {
                        assert!(start.elapsed() < Duration::from_secs(30), "{key} was not archived");
                        tokio::time::sleep(Duration::from_millis(200)).await;
                        a.run_once(|_| {}).await.expect("archive");
                    }
                };
                archive().await;
                let info = find_record(&pool, &key, None).await.map(first).expect("find").expect("archived");
                assert!(info.archived, "{info:?}");
                let first_archived_at = info.archived_at.expect("archived_at");
                assert_eq!(info.biz_type, "arch_short");
                assert_eq!(info.result.as_deref(), Some(format!("\"done {}\"", expiring.key).as_str()));

                // Expired and archived, the key is free: reused, it is online
                // again; archived again, history holds both and find_record
                // answers the latest.
                assert!(short(&pool, &expiring).await.expect("reuse").is_executed());
                assert!(!find_record(&pool, &key, None).await.map(first).unwrap().unwrap().archived);
                archive().await;
                assert_eq!(history(&pool, &key).await, 2);
                let info = find_record(&pool, &key, None).await.map(first).expect("find").expect("archived again");
                assert!(info.archived && info.archived_at.unwrap() >= first_archived_at, "{info:?}");

                assert!(find_record(&pool, &format!("arch-none:{tag}"), None).await.map(first).expect("find").is_none());
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn finished_outbox_messages_past_retention_move_and_pending_ones_never_do() {
                let _serial = crate::exclusive(D).await;
                let Some(pool) = pool().await else { return };
                let topic = format!("archive-test.{}", run_tag());
                let mut tx = <Db as idem_runtime::Backend>::begin(&pool).await.unwrap();
                for m in ["old-success", "old-failed", "old-pending", "new-success", "new-pending"] {
                    assert!(idem_runtime::outbox::enqueue(&mut tx, &topic, m, &serde_json::json!({"m": m})).await.unwrap().is_new());
                }
                tx.commit().await.unwrap();
                let two_days_ago = match D {
                    Dialect::Postgres => "now() - interval '2 days'",
                    Dialect::MySql => "DATE_SUB(NOW(6), INTERVAL 2 DAY)",
                    Dialect::Sqlite => "strftime('%Y-%m-%d %H:%M:%f', 'now', '-2 days')",
                };
                for (m, status) in [("old-success", "success"), ("old-failed", "failed"), ("old-pending", "pending"), ("new-success", "success")] {
                    let set_old = if m.starts_with("old") { format!(", updated_at = {two_days_ago}") } else { String::new() };
                    let mut text = format!("UPDATE idem_outbox SET status = ?{set_old}, attempts = 3 WHERE topic = ? AND msg_id = ?");
                    if D == Dialect::Postgres {
                        text = text.replacen('?', "$1", 1).replacen('?', "$2", 1).replacen('?', "$3", 1);
                    }
                    sqlx::query(sqlx::AssertSqlSafe(text)).bind(status).bind(&topic).bind(m).execute(&pool).await.unwrap();
                }
                let archiver = Archiver::new(pool.clone()).batch_size(1).outbox_retention(Duration::from_secs(86_400));
                archiver.run_once(|_| {}).await.expect("archive");
                // Run twice: nothing more moves, nothing is copied twice.
                archiver.run_once(|_| {}).await.expect("archive again");

                let rows = |table: &'static str| {
                    let pool = pool.clone();
                    let topic = topic.clone();
                    async move {
                        let q = match table {
                            "online" => "SELECT msg_id, status FROM idem_outbox WHERE topic = ? ORDER BY msg_id",
                            _ => "SELECT msg_id, status FROM idem_outbox_history WHERE topic = ? ORDER BY msg_id",
                        };
                        sqlx::query_as::<_, (String, String)>(sql(D, q)).bind(topic).fetch_all(&pool).await.unwrap()
                    }
                };
                let pair = |m: &str, s: &str| (m.to_string(), s.to_string());
                assert_eq!(rows("history").await, vec![pair("old-failed", "failed"), pair("old-success", "success")]);
                assert_eq!(
                    rows("online").await,
                    vec![pair("new-pending", "pending"), pair("new-success", "success"), pair("old-pending", "pending")]
                );
                // The archived copy keeps every column.
                let (attempts, payload): (i32, String) = sqlx::query_as(sql(D, "SELECT attempts, payload FROM idem_outbox_history WHERE topic = ? AND msg_id = ?"))
                    .bind(&topic)
                    .bind("old-success")
                    .fetch_one(&pool)
                    .await
                    .unwrap();
                assert_eq!((attempts, payload.contains("old-success")), (3, true));
            }
        }
    };
}

idem_testkit::for_each_backend!(archive_tests;
    postgres, mariadb, sqlite, any_postgres, any_mariadb, any_sqlite
);
