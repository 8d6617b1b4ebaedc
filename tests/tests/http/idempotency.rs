//! `Idempotency-Key` requests over real HTTP (reqwest against an axum
//! server on loopback), on PostgreSQL, SQLite and MariaDB: concurrent
//! duplicates give one effect; a response lost after the commit and the
//! client's retries give the first answer, byte for byte, and no second
//! effect; another payload under a used key is 422 with no effect; a
//! request in flight is 409; a missing or malformed key is 400; a request
//! that died in flight blocks its key until its lease runs out, then the
//! key is taken over; retries of a key whose slow handler outlived its lease
//! answer 409 without taking the pool from other requests; a route whose key
//! is optional runs keyless requests without a record. Effects are counted
//! in each test's own table. On PostgreSQL, the claim in the handler's
//! transaction (`requests::claim_in`) is tested on its own too.

use crate::common::http;

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use idem_runtime::Dialect;
use idem_runtime::http::{IDEMPOTENT_REPLAYED, Idempotency, IdempotentRequest, RequestTx};
use idem_runtime::outbox::enqueue;
use idem_runtime::{CallerTx, idempotent};
use idem_testkit::{ids, sql, unique};
use serde::{Deserialize, Serialize};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;
use tokio::sync::Semaphore;

/// Holds handlers in flight until the test lets them go.
#[derive(Debug)]
struct Gate {
    /// A permit per handler that reached its effect.
    entered: Semaphore,
    /// Handlers wait for a permit here, when the gate holds them.
    open: Semaphore,
    /// How many handlers still to hold.
    holds: AtomicUsize,
}

impl Gate {
    fn new(holds: usize) -> Arc<Self> {
        Arc::new(Gate {
            entered: Semaphore::new(0),
            open: Semaphore::new(0),
            holds: AtomicUsize::new(holds),
        })
    }
    fn open() -> Arc<Self> {
        Gate::new(0)
    }
    fn holding() -> Arc<Self> {
        Gate::new(usize::MAX)
    }
    /// Holds the first handler only.
    fn holding_first() -> Arc<Self> {
        Gate::new(1)
    }
    fn release(&self) {
        self.open.add_permits(1000);
    }
    async fn pass(&self) {
        self.entered.add_permits(1);
        if self
            .holds
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |h| h.checked_sub(1))
            .is_ok()
        {
            self.open.acquire().await.expect("open").forget();
        }
    }
    async fn wait_entered(&self) {
        self.entered.acquire().await.expect("entered").forget();
    }
}

/// The caller: the `x-api-key` header.
fn api_key(parts: &axum::http::request::Parts) -> Option<String> {
    parts
        .headers
        .get("x-api-key")?
        .to_str()
        .ok()
        .map(str::to_owned)
}

/// The status of a `POST` whose body is sent chunked, without a
/// `Content-Length` (the layer finds its size as it reads it).
async fn chunked_status(base: &str, path: &str, body: &str) -> u16 {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let addr = base.trim_start_matches("http://");
    let mut s = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let mut req = format!(
        "POST {path} HTTP/1.1\r\nhost: {addr}\r\nx-api-key: caller-1\r\n\
         idempotency-key: \"{}\"\r\ncontent-type: application/json\r\n\
         transfer-encoding: chunked\r\nconnection: close\r\n\r\n",
        unique("chunked")
    )
    .into_bytes();
    for chunk in body.as_bytes().chunks(100) {
        req.extend_from_slice(format!("{:x}\r\n", chunk.len()).as_bytes());
        req.extend_from_slice(chunk);
        req.extend_from_slice(b"\r\n");
    }
    req.extend_from_slice(b"0\r\n\r\n");
    // The server may answer and close before it has read all of it.
    let _ = s.write_all(&req).await;
    let mut head = Vec::new();
    let mut buf = [0u8; 512];
    while !head.windows(2).any(|w| w == b"\r\n") {
        match s.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => head.extend_from_slice(&buf[..n]),
        }
    }
    let line = String::from_utf8_lossy(&head);
    line.split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("no status line: {line}"))
}

/// The record key of `header` (an `Idempotency-Key` header value, a quoted
/// string) for `caller`, as the layer derives it; the fixture checks it
/// against a stored record, so a change of the derivation fails loudly.
fn record_key(caller: &str, header: &str) -> String {
    use sha2::{Digest, Sha256};
    let key = header.trim_matches('"');
    let mut h = Sha256::new();
    h.update((caller.len() as u64).to_be_bytes());
    h.update(caller.as_bytes());
    h.update(key.as_bytes());
    let hex: String = h.finalize().iter().map(|b| format!("{b:02x}")).collect();
    format!("http:{hex}")
}

macro_rules! backend_tests {
    ($module:ident, $db:ty, $dialect:expr, |$max:ident| $pool:expr) => {
        mod $module {
            use super::*;
            type Db = $db;

            #[derive(Clone)]
            struct App {
                pool: sqlx::Pool<Db>,
                table: String,
                policy: Idempotency,
                gate: Arc<Gate>,
                delay: Duration,
            }

            /// `POST /orders`: one row per execution; the answer carries
            /// the row count and a value unique to this execution, so a
            /// replay is told from a second execution by its bytes.
            async fn create_order(State(app): State<App>, req: IdempotentRequest) -> Response {
                let mut call = match app.policy.begin(&app.pool, &req).await {
                    Ok(call) => call,
                    Err(answer) => return answer,
                };
                app.gate.pass().await;
                tokio::time::sleep(app.delay).await;
                let insert = sql($dialect, "INSERT INTO {t} (body) VALUES (?)");
                let q = sqlx::AssertSqlSafe(insert.0.replace("{t}", &app.table));
                let count = sqlx::AssertSqlSafe(format!("SELECT COUNT(*) FROM {}", app.table));
                let done = async {
                    sqlx::query(q).bind(req.body().to_vec()).execute(call.tx().conn()?).await?;
                    let n: i64 = sqlx::query_scalar(count).fetch_one(call.tx().conn()?).await?;
                    Ok::<_, idem_runtime::Error>(n)
                };
                let n = match done.await {
                    Ok(n) => n,
                    Err(e) => return call.abandon((StatusCode::SERVICE_UNAVAILABLE, e.to_string())).await,
                };
                let nonce = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .unwrap()
                    .as_nanos();
                let body = format!("{{\"order\":{n},\"execution\":\"{nonce}\"}}");
                call.finish((
                    StatusCode::CREATED,
                    [("content-type", "application/json"), ("x-order", "created")],
                    body,
                ))
                .await
            }

            struct Fixture {
                base: String,
                pool: sqlx::Pool<Db>,
                table: String,
                scope: &'static str,
                gate: Arc<Gate>,
            }

            async fn fixture(gate: Arc<Gate>, delay: Duration, lease: Duration) -> Option<Fixture> {
                fixture_with(gate, delay, lease, false, 8).await
            }

            /// The fixture on a pool of `max` connections.
            async fn fixture_with(gate: Arc<Gate>, delay: Duration, lease: Duration, optional: bool, max: u32) -> Option<Fixture> {
                let $max = max;
                let pool: sqlx::Pool<Db> = $pool?;
                let table = unique("http_orders");
                let ddl = match $dialect {
                    Dialect::Postgres => "CREATE TABLE {t} (id BIGSERIAL PRIMARY KEY, body BYTEA)",
                    Dialect::MySql => "CREATE TABLE {t} (id BIGINT AUTO_INCREMENT PRIMARY KEY, body BLOB)",
                    Dialect::Sqlite => "CREATE TABLE {t} (id INTEGER PRIMARY KEY AUTOINCREMENT, body BLOB)",
                };
                sqlx::query(sqlx::AssertSqlSafe(ddl.replace("{t}", &table)))
                    .execute(&pool)
                    .await
                    .expect("create table");
                // One scope per test: its records never meet another test's.
                let scope: &'static str = Box::leak(unique("http").into_boxed_str());
                let mut policy = Idempotency::new(scope, api_key)
                    .lease(lease)
                    .policy("https://example.invalid/docs/idempotency");
                if optional {
                    policy = policy.optional();
                }
                let app = App { pool: pool.clone(), table: table.clone(), policy, gate: gate.clone(), delay };
                let router = Router::new().route("/orders", post(create_order)).with_state(app);
                Some(Fixture { base: http::serve(router).await, pool, table, scope, gate })
            }

            impl Fixture {
                fn post(&self, key: Option<&str>, body: &str) -> reqwest::RequestBuilder {
                    self.post_as("caller-1", key, body)
                }

                fn post_as(&self, caller: &str, key: Option<&str>, body: &str) -> reqwest::RequestBuilder {
                    let mut r = http::client()
                        .post(format!("{}/orders", self.base))
                        .header("x-api-key", caller)
                        .body(body.to_owned());
                    if let Some(k) = key {
                        r = r.header("idempotency-key", k);
                    }
                    r
                }

                async fn effects(&self) -> i64 {
                    let q = sqlx::AssertSqlSafe(format!("SELECT COUNT(*) FROM {}", self.table));
                    sqlx::query_scalar(q).fetch_one(&self.pool).await.expect("count")
                }

                /// A fresh key (for caller-1) whose record sorts between
                /// the record just before `held`'s and `held`'s, in the
                /// records' unique index (which leads with the key).
                async fn key_sorting_right_before(&self, held: &str) -> String {
                    let held_record = record_key("caller-1", held);
                    let stored: Option<String> = sqlx::query_scalar(sql($dialect, "SELECT idempotency_key FROM idem_record WHERE biz_type = ?"))
                        .bind(self.scope)
                        .fetch_optional(&self.pool)
                        .await
                        .expect("the held key's record");
                    match stored {
                        Some(stored) => assert_eq!(stored, held_record, "the records' key derivation changed: update record_key here"),
                        // PostgreSQL: the in-flight row is not committed.
                        None => assert_eq!($dialect, Dialect::Postgres, "the held key has no record"),
                    }
                    let before: Option<String> = sqlx::query_scalar(sql(
                        $dialect,
                        "SELECT MAX(idempotency_key) FROM idem_record WHERE idempotency_key < ?",
                    ))
                    .bind(&held_record)
                    .fetch_one(&self.pool)
                    .await
                    .expect("the record before");
                    let before = before.unwrap_or_default();
                    let base = key("fresh");
                    (0u64..)
                        .map(|i| format!("{}-{i}\"", base.trim_end_matches('"')))
                        .find(|k| {
                            let r = record_key("caller-1", k);
                            r.as_str() > before.as_str() && r < held_record
                        })
                        .expect("a key in the gap")
                }

                async fn records(&self) -> i64 {
                    let q = sql($dialect, "SELECT COUNT(*) FROM idem_record WHERE biz_type = ?");
                    sqlx::query_scalar(q).bind(self.scope).fetch_one(&self.pool).await.expect("count")
                }
            }

            fn key(tag: &str) -> String {
                format!("\"{tag}-{}\"", ids(1))
            }

            async fn answer(r: reqwest::Response) -> (u16, bool, String) {
                let status = r.status().as_u16();
                let replayed = r.headers().get(IDEMPOTENT_REPLAYED).is_some_and(|v| v == "true");
                (status, replayed, r.text().await.expect("body"))
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn concurrent_duplicates_run_once() {
                let Some(f) = fixture(Gate::open(), Duration::from_millis(300), Duration::from_secs(60)).await else { return };
                let k = key("conc");
                let f = Arc::new(f);
                let barrier = Arc::new(tokio::sync::Barrier::new(12));
                let mut tasks = Vec::new();
                for _ in 0..12 {
                    let (f, k, b) = (f.clone(), k.clone(), barrier.clone());
                    tasks.push(tokio::spawn(async move {
                        b.wait().await;
                        answer(f.post(Some(&k), "{\"item\":1}").send().await.expect("send")).await
                    }));
                }
                let mut created = Vec::new();
                for t in tasks {
                    let (status, replayed, body) = t.await.unwrap();
                    match status {
                        201 => created.push((replayed, body)),
                        409 => assert!(body.contains("in progress"), "{body}"),
                        other => panic!("unexpected {other}: {body}"),
                    }
                }
                assert_eq!(created.iter().filter(|(r, _)| !r).count(), 1, "{created:?}");
                assert_eq!(f.effects().await, 1);
                assert_eq!(f.records().await, 1);
                // Every later retry: the first answer, byte for byte.
                let first = created.iter().find(|(r, _)| !r).unwrap().1.clone();
                let (status, replayed, body) = answer(f.post(Some(&k), "{\"item\":1}").send().await.unwrap()).await;
                assert_eq!((status, replayed, body), (201, true, first));
                assert_eq!(f.effects().await, 1);
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn lost_response_then_retries_replay_the_first_answer() {
                let Some(f) = fixture(Gate::open(), Duration::ZERO, Duration::from_secs(60)).await else { return };
                let k = key("lost");
                // The client sends, the server commits, the answer never
                // arrives: the client gives up and hangs up.
                let lost = f
                    .post(Some(&k), "{\"item\":2}")
                    .header(http::LOSE, "1")
                    .timeout(Duration::from_millis(700))
                    .send()
                    .await;
                assert!(lost.is_err_and(|e| e.is_timeout()));
                let mut bodies = Vec::new();
                for _ in 0..3 {
                    let r = f.post(Some(&k), "{\"item\":2}").send().await.unwrap();
                    assert_eq!(r.headers()["x-order"], "created");
                    assert_eq!(r.headers()["content-type"], "application/json");
                    bodies.push(answer(r).await);
                }
                assert!(bodies.iter().all(|b| b.0 == 201 && b.1), "{bodies:?}");
                assert!(bodies.iter().all(|b| b.2 == bodies[0].2), "{bodies:?}");
                assert!(bodies[0].2.starts_with("{\"order\":1,"), "{bodies:?}");
                assert_eq!(f.effects().await, 1);
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn client_hangs_up_mid_request_then_the_retry_runs_once() {
                let Some(f) = fixture(Gate::open(), Duration::from_millis(1500), Duration::from_secs(60)).await else { return };
                let k = key("hangup");
                // The server drops the handler with the connection:
                // nothing commits, the key is freed.
                let gone = f.post(Some(&k), "{}").timeout(Duration::from_millis(300)).send().await;
                assert!(gone.is_err());
                // Until the handler notices, the key is held (409) or
                // freed: retry until it runs.
                let mut got = None;
                for _ in 0..40 {
                    let (status, replayed, body) = answer(f.post(Some(&k), "{}").send().await.unwrap()).await;
                    if status == 201 {
                        got = Some((replayed, body));
                        break;
                    }
                    assert_eq!(status, 409, "{body}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                // The cancelled handler rolled back: the retry executed.
                let (replayed, body) = got.expect("the retry ran");
                assert!(!replayed, "{body}");
                assert!(body.starts_with("{\"order\":1,"), "{body}");
                assert_eq!(f.effects().await, 1);
            }

            #[tokio::test]
            async fn another_payload_under_a_used_key_is_422() {
                let Some(f) = fixture(Gate::open(), Duration::ZERO, Duration::from_secs(60)).await else { return };
                let k = key("mismatch");
                let (status, _, _) = answer(f.post(Some(&k), "{\"amount\":10}").send().await.unwrap()).await;
                assert_eq!(status, 201);
                let r = f.post(Some(&k), "{\"amount\":99}").send().await.unwrap();
                assert_eq!(r.headers()["content-type"], "application/problem+json");
                assert!(r.headers()["link"].to_str().unwrap().contains("rel=\"describedby\""));
                let (status, replayed, body) = answer(r).await;
                assert_eq!((status, replayed), (422, false), "{body}");
                assert!(body.contains("already used"), "{body}");
                assert_eq!(f.effects().await, 1);
                // Another caller's key space: the same key is a new request.
                let other = f
                    .post_as("caller-2", Some(&k), "{\"amount\":99}")
                    .send()
                    .await
                    .unwrap();
                assert_eq!(other.status(), 201);
                assert_eq!(f.effects().await, 2);
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn a_request_in_flight_answers_409() {
                let Some(f) = fixture(Gate::holding(), Duration::ZERO, Duration::from_secs(60)).await else { return };
                let k = key("inflight");
                let first = tokio::spawn(f.post(Some(&k), "{}").send());
                f.gate.wait_entered().await;
                let (status, _, body) = answer(f.post(Some(&k), "{}").send().await.unwrap()).await;
                assert_eq!(status, 409, "{body}");
                assert_eq!(f.effects().await, 0);
                // PostgreSQL claims in the handler's transaction: the
                // in-flight row is not committed; elsewhere it is.
                let in_flight = if $dialect == Dialect::Postgres { 0 } else { 1 };
                assert_eq!(f.records().await, in_flight);
                f.gate.release();
                let (status, replayed, body) = answer(first.await.unwrap().unwrap()).await;
                assert_eq!((status, replayed), (201, false), "{body}");
                let (status, replayed, again) = answer(f.post(Some(&k), "{}").send().await.unwrap()).await;
                assert_eq!((status, replayed, again), (201, true, body));
                assert_eq!(f.effects().await, 1);
            }

            #[tokio::test]
            async fn missing_or_malformed_keys_are_400() {
                let Some(f) = fixture(Gate::open(), Duration::ZERO, Duration::from_secs(60)).await else { return };
                let (status, _, body) = answer(f.post(None, "{}").send().await.unwrap()).await;
                assert_eq!(status, 400);
                assert!(body.contains("requires an Idempotency-Key"), "{body}");
                let long = format!("\"{}\"", "k".repeat(129));
                for bad in ["\"unterminated", "two words", "a,b", "\"\"", long.as_str()] {
                    let (status, _, body) = answer(f.post(Some(bad), "{}").send().await.unwrap()).await;
                    assert_eq!(status, 400, "{bad}: {body}");
                    assert!(body.contains("malformed"), "{bad}: {body}");
                }
                let twice = f
                    .post(Some("\"a\""), "{}")
                    .header("idempotency-key", "\"b\"")
                    .send()
                    .await
                    .unwrap();
                assert_eq!(twice.status(), 400);
                // No caller: 401.
                let anonymous = http::client()
                    .post(format!("{}/orders", f.base))
                    .header("idempotency-key", "\"k\"")
                    .send()
                    .await
                    .unwrap();
                assert_eq!(anonymous.status(), 401);
                assert_eq!(f.effects().await, 0);
                assert_eq!(f.records().await, 0);
            }

            #[tokio::test]
            async fn an_optional_key_runs_keyless_requests_without_a_record() {
                let Some(f) = fixture_with(Gate::open(), Duration::ZERO, Duration::from_secs(60), true, 8).await else { return };
                for _ in 0..2 {
                    let (status, replayed, body) = answer(f.post(None, "{}").send().await.unwrap()).await;
                    assert_eq!((status, replayed), (201, false), "{body}");
                }
                assert_eq!(f.effects().await, 2);
                assert_eq!(f.records().await, 0);
                // With a key, the same route dedupes.
                let k = key("optional");
                for _ in 0..2 {
                    assert_eq!(f.post(Some(&k), "{}").send().await.unwrap().status(), 201);
                }
                assert_eq!(f.effects().await, 3);
                assert_eq!(f.records().await, 1);
            }

            #[tokio::test]
            async fn a_request_that_died_in_flight_holds_its_key_until_its_lease_ends() {
                let Some(f) = fixture(Gate::open(), Duration::ZERO, Duration::from_secs(60)).await else { return };
                let k = key("crash");
                assert_eq!(f.post(Some(&k), "{}").send().await.unwrap().status(), 201);
                // Turn the record into what a process that died in flight
                // leaves: its lease, no answer, no effect.
                let (held, expired) = match $dialect {
                    Dialect::Postgres => (
                        "UPDATE idem_record SET result = '{\"lease\":\"dead\"}', expire_time = now() + interval '1 hour' WHERE biz_type = $1",
                        "UPDATE idem_record SET create_time = now() - interval '2 hours', expire_time = now() - interval '1 hour' WHERE biz_type = $1",
                    ),
                    Dialect::MySql => (
                        "UPDATE idem_record SET result = '{\"lease\":\"dead\"}', expire_time = DATE_ADD(UTC_TIMESTAMP(6), INTERVAL 1 HOUR) WHERE biz_type = ?",
                        "UPDATE idem_record SET create_time = DATE_SUB(UTC_TIMESTAMP(6), INTERVAL 2 HOUR), expire_time = DATE_SUB(UTC_TIMESTAMP(6), INTERVAL 1 HOUR) WHERE biz_type = ?",
                    ),
                    Dialect::Sqlite => (
                        "UPDATE idem_record SET result = '{\"lease\":\"dead\"}', expire_time = strftime('%Y-%m-%d %H:%M:%f', 'now', '+1 hours') WHERE biz_type = ?",
                        "UPDATE idem_record SET create_time = strftime('%Y-%m-%d %H:%M:%f', 'now', '-2 hours'), expire_time = strftime('%Y-%m-%d %H:%M:%f', 'now', '-1 hours') WHERE biz_type = ?",
                    ),
                };
                sqlx::query(held).bind(f.scope).execute(&f.pool).await.unwrap();
                sqlx::query(sqlx::AssertSqlSafe(format!("DELETE FROM {}", f.table))).execute(&f.pool).await.unwrap();
                let (status, _, body) = answer(f.post(Some(&k), "{}").send().await.unwrap()).await;
                assert_eq!(status, 409, "{body}");
                assert_eq!(f.effects().await, 0);
                // The lease ran out: the next request takes the key over.
                sqlx::query(expired).bind(f.scope).execute(&f.pool).await.unwrap();
                let (status, replayed, body) = answer(f.post(Some(&k), "{}").send().await.unwrap()).await;
                assert_eq!((status, replayed), (201, false), "{body}");
                assert_eq!(f.effects().await, 1);
                let (status, replayed, again) = answer(f.post(Some(&k), "{}").send().await.unwrap()).await;
                assert_eq!((status, replayed, again), (201, true, body));
                assert_eq!(f.records().await, 1);
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn retries_past_a_slow_handlers_lease_answer_409_and_leave_the_pool_free() {
                // A pool of 5; the slow handler's transaction holds one.
                let Some(f) = fixture_with(Gate::holding_first(), Duration::ZERO, Duration::from_secs(1), false, 5).await else { return };
                let f = Arc::new(f);
                let k = key("slow");
                let first = tokio::spawn({
                    let (f, k) = (f.clone(), k.clone());
                    async move { answer(f.post(Some(&k), "{}").send().await.expect("send")).await }
                });
                f.gate.wait_entered().await;
                // Past its lease, and alive: its transaction holds the key.
                tokio::time::sleep(Duration::from_millis(1500)).await;
                // A guard against hanging, not a time asserted.
                let guard = Duration::from_secs(15);
                let send = |f: Arc<Fixture>, k: String, body: &'static str| async move {
                    match f.post(Some(&k), body).timeout(guard).send().await {
                        Ok(r) => Ok(answer(r).await),
                        Err(e) => Err(format!("{e} (timed out: {})", e.is_timeout())),
                    }
                };
                // Picked before the retries take the pool's connections (on
                // SQLite they wait for the write lock holding them).
                let fresh_key = f.key_sorting_right_before(&k).await;
                let retries: Vec<_> = (0..20).map(|_| tokio::spawn(send(f.clone(), k.clone(), "{}"))).collect();
                // An unrelated request meanwhile, once the retries are in,
                // with a key whose record sorts right before the slow one's
                // (`fresh_key`):
                // on MariaDB a fence that locked the gap before its row (a
                // next-key lock) would hold this insert until the slow
                // handler commits (1 run in 15 when the keys fell so by
                // chance).
                let fresh = tokio::spawn({
                    let send = send(f.clone(), fresh_key, "{\"fresh\":1}");
                    async move {
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        send.await
                    }
                });
                if $dialect == Dialect::Sqlite {
                    // SQLite has no row locks: the slow handler's transaction
                    // holds the database's write lock, which every writer
                    // (the fresh key's in-flight row too) waits for.
                    let f = f.clone();
                    tokio::spawn(async move {
                        tokio::time::sleep(Duration::from_secs(2)).await;
                        f.gate.release();
                    });
                }
                let fresh = fresh.await.unwrap();
                assert!(matches!(&fresh, Ok((201, false, _))), "the fresh key: {fresh:?}");
                for retry in retries {
                    match retry.await.unwrap() {
                        Ok((409, false, body)) => assert!(body.contains("in progress"), "{body}"),
                        // SQLite: it waited for the write lock, then found the answer.
                        Ok((201, true, _)) if $dialect == Dialect::Sqlite => {}
                        other => panic!("a retry of the slow key: {other:?}"),
                    }
                }
                f.gate.release();
                let (status, replayed, body) = first.await.unwrap();
                assert_eq!((status, replayed), (201, false), "{body}");
                let (status, replayed, again) = answer(f.post(Some(&k), "{}").send().await.unwrap()).await;
                assert_eq!((status, replayed, again), (201, true, body));
                assert_eq!(f.effects().await, 2);
            }

            // ------------------------------------------------ composition

            /// What a composed request books: an order, in the fixture's table.
            #[derive(Debug, Clone, Serialize, Deserialize)]
            struct Booking {
                table: String,
                order: i64,
            }

            /// The `record` handler run inside the request's transaction:
            /// one row per execution.
            #[idempotent(key = "http-book:{b.table}:{b.order}", strategy = record, biz_type = "http_book")]
            async fn book(tx: &mut <$db as sqlx::Database>::Connection, b: &Booking) -> Result<(), sqlx::Error> {
                let insert = sql($dialect, "INSERT INTO {t} (body) VALUES (?)");
                sqlx::query(sqlx::AssertSqlSafe(insert.0.replace("{t}", &b.table)))
                    .bind(b.order.to_string().into_bytes())
                    .execute(&mut *tx)
                    .await?;
                Ok(())
            }

            #[derive(Debug, Deserialize)]
            struct Order {
                id: i64,
            }

            #[derive(Clone)]
            struct Comp {
                pool: sqlx::Pool<Db>,
                table: String,
                topic: String,
                policy: Idempotency,
                delay: Duration,
            }

            /// Asks the handler to fail after its effects: `abandon`,
            /// `drop` (by hand), anything (behind the layer: a 500).
            const FAIL: &str = "x-test-fail";

            /// The effects: the record call and an outbox message, in the
            /// request's transaction; the order's rows seen from inside it.
            async fn effects(app: &Comp, tx: &mut CallerTx<Db>, order: i64) -> Result<i64, idem_runtime::Error> {
                tokio::time::sleep(app.delay).await;
                // Executed or Duplicate: the rows tell, not the outcome.
                let _outcome = book(&mut *tx, &Booking { table: app.table.clone(), order }).await?;
                let msg = serde_json::json!({ "order": order });
                enqueue(tx.transaction()?, &app.topic, &order.to_string(), &msg).await?;
                let count = sql($dialect, "SELECT COUNT(*) FROM {t} WHERE body = ?");
                let n: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(count.0.replace("{t}", &app.table)))
                    .bind(order.to_string().into_bytes())
                    .fetch_one(tx.conn()?)
                    .await?;
                Ok(n)
            }

            /// 201 with the rows seen and a value unique to this execution.
            fn created(n: i64) -> Response {
                let nonce = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .unwrap()
                    .as_nanos();
                (StatusCode::CREATED, format!("{{\"rows\":{n},\"execution\":\"{nonce}\"}}")).into_response()
            }

            /// `POST /by-hand`: `begin`, the effects in `call.tx()`, `finish`.
            async fn by_hand(State(app): State<Comp>, req: IdempotentRequest) -> Response {
                let mut call = match app.policy.begin(&app.pool, &req).await {
                    Ok(call) => call,
                    Err(answer) => return answer,
                };
                let order: Order = match req.json() {
                    Ok(order) => order,
                    Err(answer) => return call.abandon(answer).await,
                };
                let fail = req.parts().headers.get(FAIL).map(|v| v.as_bytes().to_vec());
                match (effects(&app, call.tx(), order.id).await, fail.as_deref()) {
                    (Err(e), _) => call.abandon((StatusCode::SERVICE_UNAVAILABLE, e.to_string())).await,
                    (Ok(_), Some(b"abandon")) => call.abandon(StatusCode::INTERNAL_SERVER_ERROR).await,
                    (Ok(_), Some(b"drop")) => {
                        drop(call);
                        StatusCode::INTERNAL_SERVER_ERROR.into_response()
                    }
                    (Ok(n), _) => call.finish(created(n)).await,
                }
            }

            /// `POST /layered`: a plain handler behind the layer.
            async fn layered(
                State(app): State<Comp>,
                headers: HeaderMap,
                mut tx: RequestTx<Db>,
                Json(order): Json<Order>,
            ) -> Response {
                match effects(&app, &mut tx, order.id).await {
                    Err(e) => (StatusCode::SERVICE_UNAVAILABLE, e.to_string()).into_response(),
                    Ok(_) if headers.contains_key(FAIL) => {
                        (StatusCode::INTERNAL_SERVER_ERROR, "failed after its effects").into_response()
                    }
                    Ok(n) => created(n),
                }
            }

            /// `POST /leaky`: keeps its transaction in a task past its answer.
            async fn leaky(State(app): State<Comp>, mut tx: RequestTx<Db>, Json(order): Json<Order>) -> Response {
                let n = effects(&app, &mut tx, order.id).await.expect("effects");
                tokio::spawn(async move {
                    tokio::time::sleep(Duration::from_millis(300)).await;
                    drop(tx);
                });
                created(n)
            }

            const MAX_BODY: usize = 1024;

            struct Composed {
                base: String,
                pool: sqlx::Pool<Db>,
                table: String,
                topic: String,
                scope: &'static str,
            }

            async fn composed(delay: Duration) -> Option<Composed> {
                let $max = 8;
                let pool: sqlx::Pool<Db> = $pool?;
                let table = unique("http_books");
                let ddl = match $dialect {
                    Dialect::Postgres => "CREATE TABLE {t} (id BIGSERIAL PRIMARY KEY, body BYTEA)",
                    Dialect::MySql => "CREATE TABLE {t} (id BIGINT AUTO_INCREMENT PRIMARY KEY, body BLOB)",
                    Dialect::Sqlite => "CREATE TABLE {t} (id INTEGER PRIMARY KEY AUTOINCREMENT, body BLOB)",
                };
                sqlx::query(sqlx::AssertSqlSafe(ddl.replace("{t}", &table)))
                    .execute(&pool)
                    .await
                    .expect("create table");
                let scope: &'static str = Box::leak(unique("http").into_boxed_str());
                let topic = unique("http_topic");
                let policy = Idempotency::new(scope, api_key).policy("https://example.invalid/docs/idempotency");
                let app = Comp { pool: pool.clone(), table: table.clone(), topic: topic.clone(), policy: policy.clone(), delay };
                let layer = policy.layer(&pool).max_body(MAX_BODY);
                let router = Router::new()
                    .route("/by-hand", post(by_hand))
                    .route("/layered", post(layered).layer(layer.clone()))
                    .route("/leaky", post(leaky).layer(layer))
                    .route("/unlayered", post(layered))
                    .with_state(app);
                Some(Composed { base: http::serve(router).await, pool, table, topic, scope })
            }

            impl Composed {
                fn post(&self, path: &str, key: &str, order: i64) -> reqwest::RequestBuilder {
                    http::client()
                        .post(format!("{}{path}", self.base))
                        .header("x-api-key", "caller-1")
                        .header("content-type", "application/json")
                        .header("idempotency-key", key)
                        .body(format!("{{\"id\":{order}}}"))
                }

                /// The order's effect rows, outbox rows and record-call
                /// records, committed.
                async fn rows(&self, order: i64) -> (i64, i64, i64) {
                    let q = sql($dialect, "SELECT COUNT(*) FROM {t} WHERE body = ?");
                    let effects: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(q.0.replace("{t}", &self.table)))
                        .bind(order.to_string().into_bytes())
                        .fetch_one(&self.pool)
                        .await
                        .expect("count effects");
                    let q = sql($dialect, "SELECT COUNT(*) FROM idem_outbox WHERE topic = ? AND msg_id = ?");
                    let outbox: i64 = sqlx::query_scalar(q)
                        .bind(&self.topic)
                        .bind(order.to_string())
                        .fetch_one(&self.pool)
                        .await
                        .expect("count outbox");
                    let q = sql($dialect, "SELECT COUNT(*) FROM idem_record WHERE biz_type = 'http_book' AND idempotency_key = ?");
                    let booked: i64 = sqlx::query_scalar(q)
                        .bind(format!("http-book:{}:{order}", self.table))
                        .fetch_one(&self.pool)
                        .await
                        .expect("count book records");
                    (effects, outbox, booked)
                }

                /// The request records of the scope: (all, answered).
                async fn requests(&self) -> (i64, i64) {
                    let q = sql($dialect, "SELECT COUNT(*) FROM idem_record WHERE biz_type = ?");
                    let all: i64 = sqlx::query_scalar(q).bind(self.scope).fetch_one(&self.pool).await.expect("count");
                    let q = sql($dialect, "SELECT COUNT(*) FROM idem_record WHERE biz_type = ? AND result NOT LIKE '{\"lease\"%'");
                    let answered: i64 = sqlx::query_scalar(q).bind(self.scope).fetch_one(&self.pool).await.expect("count");
                    (all, answered)
                }

                /// Waits until no request record of the scope is left and,
                /// on PostgreSQL, no session holds `key`'s transaction lock:
                /// a dropped request frees its key in the background (its
                /// transaction's rollback is sent as its connection goes
                /// back to the pool).
                async fn wait_freed(&self, key: &str) {
                    for _ in 0..50 {
                        if self.requests().await.0 == 0 && self.key_locks(key).await == 0 {
                            return;
                        }
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                    panic!("the key is still held: {:?}, {} locks", self.requests().await, self.key_locks(key).await);
                }

                /// PostgreSQL: the sessions holding `key`'s advisory lock
                /// (the id `postgres::REQUESTS.claim_in` takes, split into
                /// `pg_locks`' two halves); 0 elsewhere.
                async fn key_locks(&self, key: &str) -> i64 {
                    if $dialect != Dialect::Postgres {
                        return 0;
                    }
                    sqlx::query_scalar(
                        "SELECT COUNT(*) FROM pg_locks WHERE locktype = 'advisory' AND objsubid = 1 \
                         AND ((classid::bigint << 32) | objid::bigint) = \
                         hashtextextended(length($1) || ':' || $1 || $2, 4243)",
                    )
                    .bind(self.scope)
                    .bind(record_key("caller-1", key))
                    .fetch_one(&self.pool)
                    .await
                    .expect("count the key's locks")
                }

                /// A request with the key, once and again: the first runs
                /// the effects, the retry replays its answer byte for byte.
                async fn runs_once_then_replays(&self, path: &str, key: &str, order: i64) {
                    let (status, replayed, first) = answer(self.post(path, key, order).send().await.unwrap()).await;
                    assert_eq!((status, replayed), (201, false), "{first}");
                    assert!(first.starts_with("{\"rows\":1,"), "{first}");
                    let (status, replayed, again) = answer(self.post(path, key, order).send().await.unwrap()).await;
                    assert_eq!((status, replayed, again), (201, true, first));
                    assert_eq!(self.rows(order).await, (1, 1, 1));
                }

                /// A request that failed after its effects left nothing: no
                /// effect, no outbox row, no record call, the key freed;
                /// then the same request acts once.
                async fn left_nothing_then_acts_once(&self, path: &str, key: &str, order: i64) {
                    self.wait_freed(key).await;
                    assert_eq!(self.rows(order).await, (0, 0, 0));
                    assert_eq!(self.requests().await, (0, 0));
                    self.runs_once_then_replays(path, key, order).await;
                    assert_eq!(self.requests().await, (1, 1));
                }
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn by_hand_a_record_call_and_an_outbox_message_commit_with_the_answer() {
                let Some(f) = composed(Duration::ZERO).await else { return };
                f.runs_once_then_replays("/by-hand", &key("bh-ok"), ids(1)).await;
                assert_eq!(f.requests().await, (1, 1));
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn by_hand_a_failure_after_the_effects_leaves_nothing() {
                let Some(f) = composed(Duration::ZERO).await else { return };
                for mode in ["abandon", "drop"] {
                    let (k, order) = (key(&format!("bh-{mode}")), ids(1));
                    let failed = f.post("/by-hand", &k, order).header(FAIL, mode).send().await.unwrap();
                    assert_eq!(failed.status(), 500, "{mode}");
                    f.left_nothing_then_acts_once("/by-hand", &k, order).await;
                    // The next mode starts from no record of the scope.
                    sqlx::query(sql($dialect, "DELETE FROM idem_record WHERE biz_type = ?"))
                        .bind(f.scope)
                        .execute(&f.pool)
                        .await
                        .unwrap();
                }
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn layered_a_record_call_and_an_outbox_message_commit_with_the_answer() {
                let Some(f) = composed(Duration::ZERO).await else { return };
                f.runs_once_then_replays("/layered", &key("ly-ok"), ids(1)).await;
                assert_eq!(f.requests().await, (1, 1));
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn layered_a_5xx_after_the_effects_leaves_nothing() {
                let Some(f) = composed(Duration::ZERO).await else { return };
                let (k, order) = (key("ly-5xx"), ids(1));
                let r = f.post("/layered", &k, order).header(FAIL, "1").send().await.unwrap();
                assert!(!r.headers().contains_key(IDEMPOTENT_REPLAYED));
                let (status, _, body) = answer(r).await;
                assert_eq!((status, body.as_str()), (500, "failed after its effects"));
                f.left_nothing_then_acts_once("/layered", &k, order).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn layered_concurrent_duplicates_act_once() {
                let Some(f) = composed(Duration::from_millis(300)).await else { return };
                let f = Arc::new(f);
                let (k, order) = (key("ly-conc"), ids(1));
                let barrier = Arc::new(tokio::sync::Barrier::new(8));
                let mut tasks = Vec::new();
                for _ in 0..8 {
                    let (f, k, b) = (f.clone(), k.clone(), barrier.clone());
                    tasks.push(tokio::spawn(async move {
                        b.wait().await;
                        answer(f.post("/layered", &k, order).send().await.expect("send")).await
                    }));
                }
                let mut created = Vec::new();
                for t in tasks {
                    let (status, replayed, body) = t.await.unwrap();
                    match status {
                        201 => created.push((replayed, body)),
                        409 => assert!(body.contains("in progress"), "{body}"),
                        other => panic!("unexpected {other}: {body}"),
                    }
                }
                assert_eq!(created.iter().filter(|(r, _)| !r).count(), 1, "{created:?}");
                assert_eq!(f.rows(order).await, (1, 1, 1));
                let first = created.iter().find(|(r, _)| !r).unwrap().1.clone();
                let (status, replayed, body) = answer(f.post("/layered", &k, order).send().await.unwrap()).await;
                assert_eq!((status, replayed, body), (201, true, first));
                assert_eq!(f.rows(order).await, (1, 1, 1));
                assert_eq!(f.requests().await, (1, 1));
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn layered_misuses_are_loud() {
                let Some(f) = composed(Duration::ZERO).await else { return };
                // The extractor on a route without the layer.
                let order = ids(1);
                let (status, _, body) = answer(f.post("/unlayered", &key("ly-nolayer"), order).send().await.unwrap()).await;
                assert_eq!(status, 500, "{body}");
                assert!(body.contains("without Idempotency::layer"), "{body}");
                // Over the body limit, declared or streamed: 413 before the key.
                let big = format!("{{\"id\":1,\"pad\":\"{}\"}}", "x".repeat(MAX_BODY));
                let r = f.post("/layered", &key("ly-big"), 1).body(big.clone()).send().await.unwrap();
                assert_eq!(r.headers()["content-type"], "application/problem+json");
                assert_eq!(r.status(), 413);
                assert_eq!(chunked_status(&f.base, "/layered", &big).await, 413);
                assert_eq!(chunked_status(&f.base, "/layered", "{\"id\":1}").await, 201);
                // A body its extractor refuses: an answer like any other, kept.
                let k = key("ly-notjson");
                let bad = || {
                    http::client()
                        .post(format!("{}/layered", f.base))
                        .header("x-api-key", "caller-1")
                        .header("idempotency-key", &k)
                        .body("{\"id\":")
                };
                let (status, replayed, refused) = answer(bad().send().await.unwrap()).await;
                assert_eq!((status, replayed), (415, false), "{refused}");
                let (status, replayed, again) = answer(bad().send().await.unwrap()).await;
                assert_eq!((status, replayed, again), (415, true, refused));
                // The transaction kept past the answer: 500, nothing kept.
                let (k, order) = (key("ly-leak"), ids(1));
                let (status, _, body) = answer(f.post("/leaky", &k, order).send().await.unwrap()).await;
                assert_eq!(status, 500, "{body}");
                assert!(body.contains("still holds its RequestTx"), "{body}");
                sqlx::query(sql($dialect, "DELETE FROM idem_record WHERE biz_type = ? AND result NOT LIKE '{\"lease\"%'"))
                    .bind(f.scope)
                    .execute(&f.pool)
                    .await
                    .unwrap();
                f.wait_freed(&k).await;
                assert_eq!(f.rows(order).await, (0, 0, 0));
                assert_eq!(f.rows(1).await, (1, 1, 1));
            }
        }
    };
}

idem_testkit::for_each_backend!(backend_tests; postgres(|max|), sqlite(|max|), mariadb(|max|));

/// `requests::claim` on PostgreSQL, one statement whose commit does not
/// wait for the WAL flush: what it answers, what it leaves on the pooled
/// connection, and that it never waits for a row a running handler holds.
mod postgres_claim {
    use idem_runtime::requests::{self, Claim, NewRecord};
    use idem_testkit::unique;

    fn record<'a>(key: &'a str, ttl_secs: i64) -> NewRecord<'a> {
        NewRecord {
            key,
            biz_type: "http-claim-test",
            biz_no: key,
            fingerprint: "fp",
            ttl_secs,
        }
    }

    #[tokio::test]
    async fn a_claim_answers_claimed_then_found_and_leaves_its_connection_synchronous() {
        // One connection: the claim's and every statement after it.
        let Some(pool) = idem_testkit::postgres(1).await else {
            return;
        };
        let key = unique("claim");
        let first = requests::claim(&pool, &record(&key, 60), "lease-1")
            .await
            .unwrap();
        assert!(matches!(first, Claim::Claimed(_)), "{first:?}");
        // The setting was this statement's transaction's alone.
        let sync: String = sqlx::query_scalar("SHOW synchronous_commit")
            .fetch_one(&pool)
            .await
            .unwrap();
        assert_eq!(sync, "on");
        let again = requests::claim(&pool, &record(&key, 60), "lease-2")
            .await
            .unwrap();
        match again {
            Claim::Found(found) => {
                assert_eq!(found.fingerprint, "fp");
                assert_eq!(found.result.as_deref(), Some("lease-1"));
                assert!(!found.expired);
            }
            other => panic!("a second claim of the key: {other:?}"),
        }
        // An expired lease is found as expired (the caller takes it over):
        // a row claimed, then aged past its lease.
        let old = unique("claim-expired");
        let c = requests::claim(&pool, &record(&old, 60), "lease-3")
            .await
            .unwrap();
        assert!(matches!(c, Claim::Claimed(_)), "{c:?}");
        sqlx::query(
            "UPDATE idem_record SET create_time = now() - interval '2 minutes', \
             expire_time = now() - interval '1 minute' WHERE idempotency_key = $1",
        )
        .bind(&old)
        .execute(&pool)
        .await
        .unwrap();
        match requests::claim(&pool, &record(&old, 60), "lease-4")
            .await
            .unwrap()
        {
            Claim::Found(found) => assert!(found.expired, "{found:?}"),
            other => panic!("a claim of an expired key: {other:?}"),
        }
        let leases: Vec<String> = sqlx::query_scalar(
            "SELECT result FROM idem_record WHERE idempotency_key IN ($1, $2) ORDER BY result",
        )
        .bind(&key)
        .bind(&old)
        .fetch_all(&pool)
        .await
        .unwrap();
        assert_eq!(leases, ["lease-1", "lease-3"]);
    }

    #[tokio::test]
    async fn a_claim_of_a_key_whose_handler_runs_answers_found_without_waiting() {
        let Some(pool) = idem_testkit::postgres(2).await else {
            return;
        };
        let key = unique("claim-held");
        let c = requests::claim(&pool, &record(&key, 60), "lease-1")
            .await
            .unwrap();
        assert!(matches!(c, Claim::Claimed(_)), "{c:?}");
        // The handler's transaction: the row fenced (updated, locked).
        let mut tx = pool.begin().await.unwrap();
        sqlx::query("UPDATE idem_record SET expire_time = now() + interval '60 seconds' WHERE idempotency_key = $1")
            .bind(&key)
            .execute(&mut *tx)
            .await
            .unwrap();
        // An insert of the key would wait for that transaction; the claim
        // reads the row first and answers at once. (The time-out is a guard
        // against hanging, not a time asserted.)
        let found = tokio::time::timeout(
            std::time::Duration::from_secs(20),
            requests::claim(&pool, &record(&key, 60), "lease-2"),
        )
        .await
        .expect("the claim waited for the handler's transaction")
        .unwrap();
        assert!(matches!(found, Claim::Found(_)), "{found:?}");
        tx.rollback().await.unwrap();
    }
}

/// `requests::claim_in` on PostgreSQL, the claim in the handler's
/// transaction: it writes no row, a concurrent duplicate is busy at once
/// (the control: the key's row alone shows it nothing), the answered row
/// commits with the completion, nothing of a rolled-back request stays, a
/// request of the key committed meanwhile fails the completion, an expired
/// lease is taken over in the transaction.
mod postgres_claim_in {
    use idem_runtime::requests::{self, Claim, NewRecord};
    use idem_testkit::unique;
    use sqlx::PgPool;
    use std::time::Duration;

    const SCOPE: &str = "http-claim-in-test";
    /// A guard against hanging, not a time asserted.
    const GUARD: Duration = Duration::from_secs(20);

    fn record<'a>(key: &'a str, fp: &'a str) -> NewRecord<'a> {
        NewRecord {
            key,
            biz_type: SCOPE,
            biz_no: key,
            fingerprint: fp,
            ttl_secs: 60,
        }
    }

    /// The committed rows of `key`, as every other transaction sees them.
    async fn committed(pool: &PgPool, key: &str) -> Vec<String> {
        sqlx::query_scalar(
            "SELECT result FROM idem_record WHERE idempotency_key = $1 AND biz_type = $2",
        )
        .bind(key)
        .bind(SCOPE)
        .fetch_all(pool)
        .await
        .unwrap()
    }

    /// The server process of `tx`'s connection.
    async fn pid(tx: &mut sqlx::Transaction<'static, sqlx::Postgres>) -> i32 {
        sqlx::query_scalar("SELECT pg_backend_pid()")
            .fetch_one(&mut **tx)
            .await
            .unwrap()
    }

    /// Waits until a session waits for a lock that `blocker` holds: a
    /// wait observed, never a time assumed.
    async fn blocked_by(pool: &PgPool, blocker: i32) {
        tokio::time::timeout(GUARD, async {
            loop {
                let n: i64 = sqlx::query_scalar(
                    "SELECT COUNT(*) FROM pg_stat_activity WHERE $1 = ANY(pg_blocking_pids(pid))",
                )
                .bind(blocker)
                .fetch_one(pool)
                .await
                .unwrap();
                if n > 0 {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
        .await
        .unwrap_or_else(|_| panic!("no session waited for {blocker}'s locks"));
    }

    /// The rows of `key` that `tx` sees (its own uncommitted ones too).
    async fn seen_by(tx: &mut sqlx::Transaction<'static, sqlx::Postgres>, key: &str) -> i64 {
        sqlx::query_scalar(
            "SELECT COUNT(*) FROM idem_record WHERE idempotency_key = $1 AND biz_type = $2",
        )
        .bind(key)
        .bind(SCOPE)
        .fetch_one(&mut **tx)
        .await
        .unwrap()
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_duplicate_is_busy_at_once_and_the_key_commits_with_its_answer() {
        let Some(pool) = idem_testkit::postgres(4).await else {
            return;
        };
        assert!(requests::claims_in_transaction(&pool));
        let key = unique("claim-in");
        let mut first = pool.begin().await.unwrap();
        let row = match requests::claim_in(&mut first, &record(&key, "fp"))
            .await
            .unwrap()
        {
            Some(Claim::Claimed(row)) => row,
            other => panic!("a claim of a new key: {other:?}"),
        };
        // The claim writes no row, not even one only this transaction sees:
        // the completion writes the answered one.
        assert!(row.unwritten, "{row:?}");
        assert_eq!(seen_by(&mut first, &key).await, 0);
        assert!(committed(&pool, &key).await.is_empty());

        // A duplicate meanwhile: busy, without waiting for the first.
        let mut dup = pool.begin().await.unwrap();
        let busy = tokio::time::timeout(GUARD, requests::claim_in(&mut dup, &record(&key, "fp")))
            .await
            .expect("the duplicate waited for the first request")
            .unwrap();
        assert!(matches!(busy, Some(Claim::Busy)), "{busy:?}");
        dup.rollback().await.unwrap();

        // The control: the key's row alone tells a duplicate nothing (a
        // claim without the key's lock would run it a second time).
        assert_eq!(requests::find(&pool, &key, SCOPE).await.unwrap(), None);

        let done = requests::complete(
            &mut first,
            row,
            &record(&key, "fp"),
            "lease-1",
            "answer",
            60,
        )
        .await
        .unwrap();
        assert!(done);
        assert_eq!(seen_by(&mut first, &key).await, 1);
        first.commit().await.unwrap();
        assert_eq!(committed(&pool, &key).await, ["answer"]);
        // Kept for the answer's ttl, with the claim's fields.
        let (biz_no, fp, ttl): (String, String, f64) = sqlx::query_as(
            "SELECT biz_no, fingerprint, EXTRACT(EPOCH FROM expire_time - create_time)::float8 \
             FROM idem_record WHERE idempotency_key = $1 AND biz_type = $2",
        )
        .bind(&key)
        .bind(SCOPE)
        .fetch_one(&pool)
        .await
        .unwrap();
        assert_eq!(
            (biz_no.as_str(), fp.as_str(), ttl),
            (key.as_str(), "fp", 60.0)
        );

        // After the commit: the answer is found (the lock was released).
        let mut again = pool.begin().await.unwrap();
        match requests::claim_in(&mut again, &record(&key, "fp"))
            .await
            .unwrap()
        {
            Some(Claim::Found(found)) => {
                assert_eq!(
                    (found.fingerprint.as_str(), found.result.as_deref()),
                    ("fp", Some("answer"))
                );
            }
            other => panic!("a claim after the answer: {other:?}"),
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_rolled_back_or_dropped_claim_leaves_nothing() {
        // One connection: a dropped transaction's rollback is sent as its
        // connection goes back to the pool, before the next statement gets it.
        let Some(pool) = idem_testkit::postgres(1).await else {
            return;
        };
        let key = unique("claim-in-drop");
        for end in ["rollback", "drop"] {
            let mut tx = pool.begin().await.unwrap();
            let c = requests::claim_in(&mut tx, &record(&key, "fp"))
                .await
                .unwrap();
            assert!(matches!(c, Some(Claim::Claimed(_))), "{end}: {c:?}");
            match end {
                "rollback" => tx.rollback().await.unwrap(),
                _ => drop(tx),
            }
            assert!(committed(&pool, &key).await.is_empty(), "{end}");
        }
        // The key is free: claimed again, not busy (the lock went too).
        let mut tx = pool.begin().await.unwrap();
        let c = requests::claim_in(&mut tx, &record(&key, "fp"))
            .await
            .unwrap();
        assert!(matches!(c, Some(Claim::Claimed(_))), "{c:?}");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_key_committed_meanwhile_by_a_request_without_the_lock_fails_the_completion() {
        // A request of a process that claims before its transaction (the
        // other protocol, as in a rolling upgrade), whose row is not
        // committed when this claim reads, and commits while this
        // completion's insert waits for it.
        let Some(pool) = idem_testkit::postgres(3).await else {
            return;
        };
        let key = unique("claim-in-race");
        // The request's effect, to see it rolled back.
        sqlx::query("CREATE TABLE IF NOT EXISTS idem_http_claim_in_effect (key TEXT NOT NULL)")
            .execute(&pool)
            .await
            .unwrap();
        let mut other = pool.begin().await.unwrap();
        let other_pid = pid(&mut other).await;
        sqlx::query(
            "INSERT INTO idem_record \
             (idempotency_key, biz_type, biz_no, fingerprint, result, create_time, expire_time) \
             VALUES ($1, $2, $1, 'fp', 'answer', now(), now() + interval '1 hour')",
        )
        .bind(&key)
        .bind(SCOPE)
        .execute(&mut *other)
        .await
        .unwrap();
        let mut tx = pool.begin().await.unwrap();
        // Neither the uncommitted row nor a lock: the key is this claim's.
        let row = match requests::claim_in(&mut tx, &record(&key, "fp"))
            .await
            .unwrap()
        {
            Some(Claim::Claimed(row)) => row,
            other => panic!("the claim: {other:?}"),
        };
        sqlx::query("INSERT INTO idem_http_claim_in_effect (key) VALUES ($1)")
            .bind(&key)
            .execute(&mut *tx)
            .await
            .unwrap();
        let completion = tokio::spawn({
            let key = key.clone();
            async move {
                let done =
                    requests::complete(&mut tx, row, &record(&key, "fp"), "mine", "mine", 60)
                        .await
                        .unwrap();
                (done, tx)
            }
        });
        blocked_by(&pool, other_pid).await;
        other.commit().await.unwrap();
        let (done, tx) = completion.await.unwrap();
        assert!(!done, "the completion inserted a second answer");
        tx.rollback().await.unwrap();
        assert_eq!(committed(&pool, &key).await, ["answer"]);
        let effects: i64 =
            sqlx::query_scalar("SELECT COUNT(*) FROM idem_http_claim_in_effect WHERE key = $1")
                .bind(&key)
                .fetch_one(&pool)
                .await
                .unwrap();
        assert_eq!(effects, 0, "the effect of the request that lost stayed");
        // Its retry finds the answer.
        let mut again = pool.begin().await.unwrap();
        match requests::claim_in(&mut again, &record(&key, "fp"))
            .await
            .unwrap()
        {
            Some(Claim::Found(found)) => assert_eq!(found.result.as_deref(), Some("answer")),
            other => panic!("the retry's claim: {other:?}"),
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_expired_lease_is_taken_over_in_the_transaction() {
        let Some(pool) = idem_testkit::postgres(3).await else {
            return;
        };
        let key = unique("claim-in-expired");
        // What a request of the other protocol that died leaves.
        let c = requests::claim(&pool, &record(&key, "fp"), "dead")
            .await
            .unwrap();
        assert!(matches!(c, Claim::Claimed(_)), "{c:?}");
        sqlx::query("UPDATE idem_record SET create_time = now() - interval '2 minutes', expire_time = now() - interval '1 minute' WHERE idempotency_key = $1")
            .bind(&key)
            .execute(&pool)
            .await
            .unwrap();
        let mut tx = pool.begin().await.unwrap();
        match requests::claim_in(&mut tx, &record(&key, "fp"))
            .await
            .unwrap()
        {
            Some(Claim::Found(found)) => assert!(found.expired, "{found:?}"),
            other => panic!("a claim of an expired lease: {other:?}"),
        }
        let taken = requests::take_over_in(&mut tx, &key, SCOPE, "dead", "mine", 60)
            .await
            .unwrap();
        assert!(taken.is_some());
        // Held by this transaction: a take-over elsewhere skips it at once.
        let elsewhere = tokio::time::timeout(
            GUARD,
            requests::take_over(&pool, &key, SCOPE, "dead", "theirs", 60),
        )
        .await
        .expect("the take-over waited for the transaction")
        .unwrap();
        assert!(elsewhere.is_none());
        // Rolled back: the expired lease again, for the next request.
        tx.rollback().await.unwrap();
        assert_eq!(committed(&pool, &key).await, ["dead"]);

        // Taken over again and completed: the row is updated in place.
        let mut tx = pool.begin().await.unwrap();
        let row = requests::take_over_in(&mut tx, &key, SCOPE, "dead", "mine", 60)
            .await
            .unwrap()
            .expect("the expired lease");
        assert!(!row.unwritten, "{row:?}");
        let done = requests::complete(&mut tx, row, &record(&key, "fp"), "mine", "answer", 60)
            .await
            .unwrap();
        assert!(done);
        tx.commit().await.unwrap();
        assert_eq!(committed(&pool, &key).await, ["answer"]);
    }
}
