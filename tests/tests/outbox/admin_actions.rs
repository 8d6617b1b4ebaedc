//! The operator's actions and detail reads (`admin::{message, attempts,
//! discard, retry_now, pause, resume, paused, processes, request}`) on
//! every backend, against the real servers: what each one changes in the
//! tables (the message rows, the history, the attempt log, the paused
//! topics), what it refuses (a message a relay is delivering, bad input)
//! and that a relay then does what the rows say. Every test has a
//! database of its own, its idem tables emptied first.

use crate::common::hooks;
use crate::common::http;
use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::Response;
use axum::routing::post;
use idem_runtime::http::{Idempotency, IdempotentRequest};
use idem_runtime::outbox::Relay;
use idem_runtime::outbox::admin::{self, Requeue, RequeueTarget};
use idem_runtime::{Dialect, Error, Outcome};
use idem_testkit::{sql, unique};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

fn is_config(r: Result<impl std::fmt::Debug, Error>) -> bool {
    matches!(r, Err(Error::Config { .. }))
}

/// The caller the HTTP layer of [`request`] tests keys by.
fn api_key(parts: &axum::http::request::Parts) -> Option<String> {
    parts
        .headers
        .get("x-api-key")?
        .to_str()
        .ok()
        .map(str::to_owned)
}

const ACTOR: &str = "cli:tester";

macro_rules! action_tests {
    ($module:ident, $db:ty, $dialect:expr, |$name:ident| $pool:expr) => {
        mod $module {
            use super::*;
            use sqlx::Pool;
            type Db = $db;
            const D: Dialect = $dialect;

            /// A pool on this test's own database, its idem tables empty.
            async fn pool(test: &str) -> Option<Pool<Db>> {
                let $name = format!("idem_t_actions_{}_{test}", stringify!($module));
                let pool: Pool<Db> = $pool?;
                for table in [
                    "idem_outbox", "idem_outbox_history", "idem_outbox_attempt", "idem_topic_pause",
                    "idem_process", "idem_record", "idem_record_history",
                ] {
                    sqlx::query(sqlx::AssertSqlSafe(format!("DELETE FROM {table}")))
                        .execute(&pool)
                        .await
                        .expect("empty the table");
                }
                Some(pool)
            }

            /// "Now" plus a bound number of seconds (negative: ago).
            fn shifted() -> &'static str {
                match D {
                    Dialect::Postgres => "now() + make_interval(secs => ?::float8)",
                    Dialect::MySql => "DATE_ADD(UTC_TIMESTAMP(6), INTERVAL ? SECOND)",
                    Dialect::Sqlite => "strftime('%Y-%m-%d %H:%M:%f', 'now', ? || ' seconds')",
                }
            }

            fn now() -> &'static str {
                match D {
                    Dialect::Postgres => "now()",
                    Dialect::MySql => "UTC_TIMESTAMP(6)",
                    Dialect::Sqlite => "strftime('%Y-%m-%d %H:%M:%f', 'now')",
                }
            }

            /// The statement, `?` numbered on PostgreSQL.
            fn q(text: String) -> sqlx::AssertSqlSafe<String> {
                sql(D, Box::leak(text.into_boxed_str()))
            }

            /// `n` new pending messages of `topic`; their ids.
            async fn enqueue(pool: &Pool<Db>, topic: &str, n: usize) -> Vec<i64> {
                let mut tx = pool.begin().await.expect("begin");
                let mut ids = Vec::new();
                for i in 0..n {
                    let payload = serde_json::json!({ "n": i });
                    let done = idem_runtime::outbox::enqueue(&mut tx, topic, &format!("{topic}-{i}"), &payload)
                        .await
                        .expect("enqueue");
                    ids.push(done.id());
                }
                tx.commit().await.expect("commit");
                ids
            }

            /// Runs `UPDATE idem_outbox SET {set} WHERE id = ?` (`set` binds
            /// `secs` first when it holds a `?`).
            async fn update(pool: &Pool<Db>, id: i64, set: &str, secs: Option<i64>) {
                let text = format!("UPDATE idem_outbox SET {set} WHERE id = ?");
                let mut query = sqlx::query(q(text));
                if let Some(s) = secs {
                    query = query.bind(s);
                }
                let done = query.bind(id).execute(pool).await.expect("update");
                assert_eq!(done.rows_affected(), 1);
            }

            /// Dead-letters a message: failed, `attempts` 5, `last_error` boom.
            async fn dead(pool: &Pool<Db>, id: i64) {
                update(pool, id, "status = 'failed', attempts = 5, last_error = 'boom'", None).await;
            }

            /// A relay's live lease on a pending message, for 60 s more.
            async fn leased(pool: &Pool<Db>, id: i64) {
                let set = format!("lease_owner = 'relay-x#1', locked_until = {}", shifted());
                update(pool, id, &set, Some(60)).await;
            }

            async fn count(pool: &Pool<Db>, text: &str, id: i64) -> i64 {
                sqlx::query_scalar(q(text.to_string())).bind(id).fetch_one(pool).await.expect("count")
            }

            /// Message `id`: status, attempts, last_error, online.
            async fn online(pool: &Pool<Db>, id: i64) -> Option<(String, i32, Option<String>)> {
                sqlx::query_as(q("SELECT status, attempts, last_error FROM idem_outbox WHERE id = ?".into()))
                    .bind(id)
                    .fetch_optional(pool)
                    .await
                    .expect("row")
            }

            /// Message `id`'s archived row: status, last_error.
            async fn archived(pool: &Pool<Db>, id: i64) -> Option<(String, Option<String>)> {
                sqlx::query_as(q("SELECT status, last_error FROM idem_outbox_history WHERE id = ?".into()))
                    .bind(id)
                    .fetch_optional(pool)
                    .await
                    .expect("row")
            }

            /// Message `id`'s attempt log: (attempt, outcome, detail, actor), oldest first.
            async fn log(pool: &Pool<Db>, id: i64) -> Vec<(i32, String, Option<String>, Option<String>)> {
                sqlx::query_as(q(
                    "SELECT attempt, outcome, detail, actor FROM idem_outbox_attempt WHERE outbox_id = ? ORDER BY id".into(),
                ))
                .bind(id)
                .fetch_all(pool)
                .await
                .expect("log")
            }

            /// Waits until `text` (one `?`: `id`) counts at least one row.
            async fn until(pool: &Pool<Db>, text: &str, id: i64) {
                let start = Instant::now();
                while count(pool, text, id).await == 0 {
                    assert!(start.elapsed() < Duration::from_secs(20), "not within 20 s: {text}");
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn message_and_attempts_read_online_then_archived() {
                let Some(pool) = pool("detail").await else { return };
                let id = enqueue(&pool, "detail", 1).await[0];
                let m = admin::message(&pool, id).await.unwrap().expect("online");
                assert_eq!((m.id, m.topic.as_str(), m.msg_id.as_str()), (id, "detail", "detail-0"));
                assert_eq!(serde_json::from_str::<serde_json::Value>(&m.payload).unwrap(), serde_json::json!({ "n": 0 }));
                assert_eq!((m.status.as_str(), m.attempts, m.archived_at), ("pending", 0, None));
                assert_eq!((m.lease_owner, m.locked_until, m.last_error), (None, None, None));
                assert!(m.created_at <= m.updated_at);
                assert_eq!(admin::message(&pool, id + 1000).await.unwrap(), None);
                // 40 failed attempts written as a relay writes them.
                for n in 1..=40 {
                    let text = format!(
                        "INSERT INTO idem_outbox_attempt (outbox_id, attempt, outcome, detail, actor, at) \
                         VALUES (?, ?, 'retry', ?, 'relay-x#1', {})",
                        now()
                    );
                    sqlx::query(q(text)).bind(id).bind(n).bind(format!("boom {n}")).execute(&pool).await.unwrap();
                }
                let read = admin::attempts(&pool, id).await.unwrap();
                let numbers: Vec<i64> = read.iter().map(|a| a.attempt).collect();
                assert_eq!(numbers, (9..=40).collect::<Vec<i64>>(), "the newest 32, oldest first");
                assert_eq!(read[0].detail.as_deref(), Some("boom 9"));
                assert_eq!(read[0].actor.as_deref(), Some("relay-x#1"));
                // Discarded: read from the history, the log trimmed to 32 with the action last.
                let done = admin::discard(&pool, &[id], "  not wanted ", ACTOR).await.unwrap();
                assert_eq!(done.done, vec![id]);
                let m = admin::message(&pool, id).await.unwrap().expect("archived");
                assert_eq!((m.status.as_str(), m.last_error.as_deref()), ("failed", Some("discarded: not wanted")));
                assert!(m.archived_at.is_some());
                assert_eq!(log(&pool, id).await.len(), 32);
                let read = admin::attempts(&pool, id).await.unwrap();
                let last = read.last().unwrap();
                assert_eq!((last.outcome.as_str(), last.detail.as_deref(), last.actor.as_deref()),
                    ("discarded", Some("not wanted"), Some(ACTOR)));
                assert_eq!(read[0].attempt, 10);
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn discard_moves_dead_and_pending_messages_and_refuses_the_rest() {
                let Some(pool) = pool("discard").await else { return };
                let ids = enqueue(&pool, "disc", 4).await;
                let (failed, pending, delivered, held) = (ids[0], ids[1], ids[2], ids[3]);
                dead(&pool, failed).await;
                update(&pool, delivered, "status = 'success'", None).await;
                leased(&pool, held).await;
                // Bad input changes nothing.
                assert!(is_config(admin::discard(&pool, &[failed], " ", ACTOR).await));
                assert!(is_config(admin::discard(&pool, &[failed], &"x".repeat(501), ACTOR).await));
                assert!(is_config(admin::discard(&pool, &[], "why", ACTOR).await));
                assert!(is_config(admin::discard(&pool, &[failed], "why", "").await));
                assert_eq!(online(&pool, failed).await.unwrap().0, "failed");
                let unknown = held + 1000;
                let r = admin::discard(&pool, &[failed, pending, delivered, held, unknown, failed], "bad data", ACTOR)
                    .await
                    .unwrap();
                assert_eq!((r.done, r.in_flight, r.skipped), (vec![failed, pending], vec![held], vec![delivered, unknown]));
                for id in [failed, pending] {
                    assert_eq!(online(&pool, id).await, None, "moved out of idem_outbox");
                    assert_eq!(archived(&pool, id).await, Some(("failed".into(), Some("discarded: bad data".into()))));
                    let entry = log(&pool, id).await;
                    let attempts = if id == failed { 5 } else { 0 };
                    assert_eq!(entry, vec![(attempts, "discarded".into(), Some("bad data".into()), Some(ACTOR.into()))]);
                }
                assert_eq!(online(&pool, held).await.unwrap().0, "pending", "in flight: untouched");
                assert_eq!(online(&pool, delivered).await.unwrap().0, "success");
                for id in [held, delivered] {
                    assert_eq!(archived(&pool, id).await, None);
                    assert!(log(&pool, id).await.is_empty());
                }
                // A requeue of every dead letter does not bring them back.
                let all = Requeue { target: RequeueTarget::AllFailed, max_id: None, dry_run: false };
                assert_eq!(admin::requeue(&pool, &all).await.unwrap().requeued, 0);
                assert_eq!(online(&pool, failed).await, None);
                assert_eq!(admin::message(&pool, failed).await.unwrap().unwrap().status, "failed");
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn discard_refuses_a_message_a_relay_is_delivering() {
                let _hooks = hooks::shared().await;
                let Some(pool) = pool("inflight").await else { return };
                let topic = unique("held");
                let id = enqueue(&pool, &topic, 1).await[0];
                let release = Arc::new(tokio::sync::Notify::new());
                let delivered = Arc::new(AtomicUsize::new(0));
                let (r, n) = (release.clone(), delivered.clone());
                let relay = Relay::new(pool.clone())
                    .route(topic.clone(), move |_d, _m: serde_json::Value| {
                        let (r, n) = (r.clone(), n.clone());
                        async move {
                            r.notified().await;
                            n.fetch_add(1, Ordering::SeqCst);
                            Ok(Outcome::Executed(()))
                        }
                    })
                    .owner("relay-held");
                let run = tokio::spawn(async move { relay.run_once().await });
                let live = format!("SELECT COUNT(*) FROM idem_outbox WHERE id = ? AND locked_until > {}", now());
                until(&pool, &live, id).await;
                let r = admin::discard(&pool, &[id], "too late", ACTOR).await.unwrap();
                assert_eq!((r.done, r.in_flight, r.skipped), (vec![], vec![id], vec![]));
                let retry = admin::retry_now(&pool, &[id], ACTOR).await.unwrap();
                assert_eq!(retry.in_flight, vec![id]);
                assert_eq!(online(&pool, id).await.unwrap().0, "pending");
                assert_eq!(archived(&pool, id).await, None);
                release.notify_one();
                assert_eq!(run.await.unwrap().unwrap(), 1);
                assert_eq!(online(&pool, id).await.unwrap().0, "success", "delivered by the relay");
                assert_eq!(delivered.load(Ordering::SeqCst), 1);
                assert!(log(&pool, id).await.iter().all(|e| e.1 != "discarded" && e.1 != "retry_now"));
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn retry_now_makes_dead_and_waiting_messages_due() {
                let _hooks = hooks::shared().await;
                let Some(pool) = pool("retry").await else { return };
                let topic = unique("retry");
                let ids = enqueue(&pool, &topic, 4).await;
                let (failed, waiting, delivered, held) = (ids[0], ids[1], ids[2], ids[3]);
                dead(&pool, failed).await;
                let later = format!("attempts = 2, last_error = 'flaky', next_attempt_at = {}", shifted());
                update(&pool, waiting, &later, Some(3600)).await;
                update(&pool, delivered, "status = 'success'", None).await;
                leased(&pool, held).await;
                assert!(is_config(admin::retry_now(&pool, &[failed], "a\nb").await));
                let r = admin::retry_now(&pool, &[failed, waiting, delivered, held], ACTOR).await.unwrap();
                assert_eq!((r.done, r.in_flight, r.skipped), (vec![failed, waiting], vec![held], vec![delivered]));
                assert_eq!(online(&pool, failed).await, Some(("pending".into(), 0, Some("requeued: boom".into()))));
                assert_eq!(online(&pool, waiting).await, Some(("pending".into(), 2, Some("flaky".into()))));
                let due = format!("SELECT COUNT(*) FROM idem_outbox WHERE id = ? AND next_attempt_at <= {}", now());
                for id in [failed, waiting] {
                    assert_eq!(count(&pool, &due, id).await, 1, "due now");
                }
                assert_eq!(log(&pool, failed).await, vec![(5, "retry_now".into(), None, Some(ACTOR.into()))]);
                assert_eq!(log(&pool, waiting).await, vec![(2, "retry_now".into(), None, Some(ACTOR.into()))]);
                assert!(log(&pool, held).await.is_empty() && log(&pool, delivered).await.is_empty());
                // A relay delivers both now, and only them.
                let relay = Relay::new(pool.clone())
                    .route(topic.clone(), |_d, _m: serde_json::Value| async move { Ok(Outcome::Executed(())) });
                assert_eq!(relay.run_once().await.unwrap(), 2);
                for id in [failed, waiting] {
                    assert_eq!(online(&pool, id).await.unwrap().0, "success");
                }
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn requeue_logs_each_message_it_requeues() {
                let Some(pool) = pool("requeue").await else { return };
                let ids = enqueue(&pool, "rq", 2).await;
                dead(&pool, ids[0]).await;
                let what = Requeue { target: RequeueTarget::Ids(ids.clone()), max_id: None, dry_run: false };
                assert!(is_config(admin::requeue_by(&pool, &what, "").await));
                assert_eq!(admin::requeue_by(&pool, &what, ACTOR).await.unwrap().requeued, 1);
                assert_eq!(log(&pool, ids[0]).await, vec![(5, "requeued".into(), None, Some(ACTOR.into()))]);
                assert!(log(&pool, ids[1]).await.is_empty(), "pending: not requeued");
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn pause_resume_and_the_paused_topics() {
                let Some(pool) = pool("pause").await else { return };
                assert!(admin::pause(&pool, "mail", "  smtp down ", ACTOR).await.unwrap());
                assert!(!admin::pause(&pool, "mail", "another", "console").await.unwrap(), "paused already");
                assert!(admin::pause(&pool, "billing", "", "console").await.unwrap());
                assert!(is_config(admin::pause(&pool, "", "x", ACTOR).await));
                assert!(is_config(admin::pause(&pool, "a\u{0}b", "x", ACTOR).await));
                assert!(is_config(admin::pause(&pool, &"t".repeat(129), "x", ACTOR).await));
                assert!(is_config(admin::pause(&pool, "t", &"x".repeat(501), ACTOR).await));
                let rows: Vec<(String, Option<String>, Option<String>)> =
                    sqlx::query_as("SELECT topic, reason, paused_by FROM idem_topic_pause ORDER BY topic")
                        .fetch_all(&pool)
                        .await
                        .unwrap();
                assert_eq!(rows, vec![
                    ("billing".into(), None, Some("console".into())),
                    ("mail".into(), Some("smtp down".into()), Some(ACTOR.into())),
                ]);
                let listed = admin::paused(&pool).await.unwrap();
                let topics: Vec<&str> = listed.iter().map(|p| p.topic.as_str()).collect();
                assert_eq!(topics, ["billing", "mail"]);
                assert_eq!(listed[1].reason.as_deref(), Some("smtp down"));
                assert!(admin::resume(&pool, "mail", ACTOR).await.unwrap());
                assert!(!admin::resume(&pool, "mail", ACTOR).await.unwrap(), "not paused any more");
                assert!(is_config(admin::resume(&pool, "", ACTOR).await));
                let left: Vec<String> = sqlx::query_scalar("SELECT topic FROM idem_topic_pause").fetch_all(&pool).await.unwrap();
                assert_eq!(left, ["billing"]);
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn processes_by_kind_name_and_id_with_their_heartbeat_age() {
                let Some(pool) = pool("processes").await else { return };
                let text = format!(
                    "INSERT INTO idem_process (id, kind, name, host, pid, started_at, heartbeat_at) \
                     VALUES (?, ?, ?, ?, ?, {0}, {0})",
                    shifted()
                );
                let rows: [(&str, &str, &str, Option<&str>, Option<i64>, i64); 4] = [
                    ("r-2", "relay", "mail", Some("h1"), Some(42), -30),
                    ("r-1", "relay", "mail", None, None, -5),
                    ("c-1", "consumer", "q.orders", Some("h2"), Some(7), -1),
                    ("r-0", "relay", "billing", Some("h1"), Some(9), -2),
                ];
                for (id, kind, name, host, pid, ago) in rows {
                    sqlx::query(q(text.clone()))
                        .bind(id).bind(kind).bind(name).bind(host).bind(pid).bind(ago - 100).bind(ago)
                        .execute(&pool)
                        .await
                        .unwrap();
                }
                let all = admin::processes(&pool).await.unwrap();
                let order: Vec<&str> = all.iter().map(|p| p.id.as_str()).collect();
                assert_eq!(order, ["c-1", "r-0", "r-1", "r-2"]);
                let r2 = &all[3];
                assert_eq!((r2.kind.as_str(), r2.name.as_str(), r2.host.as_deref(), r2.pid), ("relay", "mail", Some("h1"), Some(42)));
                assert_eq!(all[2].host, None);
                assert!(r2.heartbeat_age >= Duration::from_secs(29) && r2.heartbeat_age < Duration::from_secs(120), "{:?}", r2.heartbeat_age);
                assert!(all[0].heartbeat_age < r2.heartbeat_age);
                assert!(r2.started_at < r2.heartbeat_at);
            }

            #[derive(Clone)]
            struct App {
                pool: Pool<Db>,
                policy: Idempotency,
            }

            async fn create(State(app): State<App>, req: IdempotentRequest) -> Response {
                match app.policy.begin(&app.pool, &req).await {
                    Ok(call) => call.finish((StatusCode::CREATED, "made")).await,
                    Err(answer) => answer,
                }
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn request_finds_what_the_idempotency_layer_stored() {
                let Some(pool) = pool("request").await else { return };
                let scope: &'static str = Box::leak(unique("adm").into_boxed_str());
                let app = App { pool: pool.clone(), policy: Idempotency::new(scope, api_key) };
                let base = http::serve(Router::new().route("/orders", post(create)).with_state(app)).await;
                let sent = http::client()
                    .post(format!("{base}/orders"))
                    .header("x-api-key", "alice")
                    .header("idempotency-key", "\"order-7\"")
                    .body("{}")
                    .send()
                    .await
                    .expect("request");
                assert_eq!(sent.status().as_u16(), 201);
                let found = admin::request(&pool, "order-7", "alice").await.unwrap().expect("stored");
                let stored: String = sqlx::query_scalar(sql(D, "SELECT idempotency_key FROM idem_record WHERE biz_type = ?"))
                    .bind(scope)
                    .fetch_one(&pool)
                    .await
                    .unwrap();
                assert_eq!(found.record_key, stored, "the layer's key derivation");
                assert_eq!((found.scope.as_str(), found.key.as_str(), found.state.as_str()), (scope, "order-7", "answered"));
                assert_eq!((found.response_status, found.response_body.as_deref()), (Some(201), Some("made")));
                assert!(found.created_at < found.expires_at && found.archived_at.is_none());
                assert_eq!(admin::request(&pool, "order-7", "bob").await.unwrap(), None, "another caller's key");
                assert_eq!(admin::request(&pool, "order-8", "alice").await.unwrap(), None);
                assert!(is_config(admin::request(&pool, "", "alice").await));
                assert!(is_config(admin::request(&pool, "k\u{e9}", "alice").await));
                assert!(is_config(admin::request(&pool, "k", "").await));
            }
        }
    };
}

idem_testkit::for_each_backend!(action_tests;
    postgres { |name| idem_testkit::postgres_database(&name, 4).await },
    mariadb { |name| idem_testkit::mysql_database(&name, 4).await },
    sqlite {
        |name| {
            let _ = &name;
            Some(idem_testkit::sqlite(4).await)
        }
    },
);
