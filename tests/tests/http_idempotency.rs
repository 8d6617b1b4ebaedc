//! `Idempotency-Key` requests over real HTTP (reqwest against an axum
//! server on loopback), on PostgreSQL, SQLite and MariaDB: concurrent
//! duplicates give one effect; a response lost after the commit and the
//! client's retries give the first answer, byte for byte, and no second
//! effect; another payload under a used key is 422 with no effect; a
//! request in flight is 409; a missing or malformed key is 400; a request
//! that died in flight blocks its key until its lease runs out, then the
//! key is taken over; a route whose key is optional runs keyless requests
//! without a record. Effects are counted in each test's own table.

#[path = "common/http.rs"]
mod http;

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::Response;
use axum::routing::post;
use idem_runtime::__private::Dialect;
use idem_runtime::http::{IDEMPOTENT_REPLAYED, Idempotency, IdempotentRequest};
use idem_testkit::{ids, sql, unique};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Semaphore;

/// Holds handlers in flight until the test lets them go.
#[derive(Debug)]
struct Gate {
    /// A permit per handler that reached its effect.
    entered: Semaphore,
    /// Handlers wait for a permit here, when the gate holds them.
    open: Semaphore,
    held: bool,
}

impl Gate {
    fn new(held: bool) -> Arc<Self> {
        Arc::new(Gate {
            entered: Semaphore::new(0),
            open: Semaphore::new(0),
            held,
        })
    }
    fn open() -> Arc<Self> {
        Gate::new(false)
    }
    fn holding() -> Arc<Self> {
        Gate::new(true)
    }
    fn release(&self) {
        self.open.add_permits(1000);
    }
    async fn pass(&self) {
        self.entered.add_permits(1);
        if self.held {
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

macro_rules! backend_tests {
    ($module:ident, $db:ty, $dialect:expr, $pool:expr) => {
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
                fixture_with(gate, delay, lease, false).await
            }

            async fn fixture_with(gate: Arc<Gate>, delay: Duration, lease: Duration, optional: bool) -> Option<Fixture> {
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
                let Some(f) = fixture_with(Gate::open(), Duration::ZERO, Duration::from_secs(60), true).await else { return };
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
        }
    };
}

backend_tests!(
    postgres,
    sqlx::Postgres,
    Dialect::Postgres,
    idem_testkit::postgres(8).await
);
backend_tests!(
    sqlite,
    sqlx::Sqlite,
    Dialect::Sqlite,
    Some(idem_testkit::sqlite(8).await)
);
backend_tests!(
    mariadb,
    sqlx::MySql,
    Dialect::MySql,
    idem_testkit::mysql(8).await
);
