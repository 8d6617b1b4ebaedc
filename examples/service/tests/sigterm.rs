//! The service as an orchestrator runs it: started as a process, sent
//! requests (each twice with its Idempotency-Key, some orders again under
//! another key), then SIGTERM while its relay still has messages to
//! deliver. It must finish its requests and its relay's messages, exit 0,
//! and have acted once: every order placed once, every coupon deducted
//! once, every answer replayed. Started again on the same database, it
//! delivers whatever the stop left pending, still once. With an
//! OpenTelemetry collector's address, a request's trace reaches it: the
//! request's span, the relay's delivery and the handler's call, in the
//! caller's trace.

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const ORDERS: i64 = 40;

/// The service's process, killed if a test fails before it exits.
struct Service {
    child: Child,
    base: String,
}

impl Service {
    fn start(db: &str, work_ms: u64) -> Service {
        Service::start_with(db, work_ms, &[])
    }

    fn start_with(db: &str, work_ms: u64, env: &[(&str, &str)]) -> Service {
        let mut child = Command::new(env!("CARGO_BIN_EXE_idem-example-service"))
            .envs(env.iter().copied())
            .env("DATABASE_URL", db)
            .env("BIND", "127.0.0.1:0")
            .env("DEDUCT_WORK_MS", work_ms.to_string())
            .env("RUST_LOG", "info")
            .stdout(Stdio::piped())
            .spawn()
            .expect("start the service");
        let mut line = String::new();
        BufReader::new(child.stdout.take().expect("stdout"))
            .read_line(&mut line)
            .expect("read its address");
        let addr = line
            .trim()
            .strip_prefix("listening on ")
            .expect("listening on ADDR");
        Service {
            child,
            base: format!("http://{addr}"),
        }
    }

    /// Sends SIGTERM, as an orchestrator stops a container.
    fn terminate(&self) {
        let ok = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .expect("kill")
            .success();
        assert!(ok, "kill -TERM");
    }

    fn wait(&mut self, within: Duration) -> ExitStatus {
        let start = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait().expect("wait") {
                return status;
            }
            assert!(
                start.elapsed() < within,
                "the service did not exit within {within:?}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Service {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `POST /orders` as caller `key`'s client: (status, body).
async fn order(http: &reqwest::Client, base: &str, key: &str, order: i64) -> (u16, String) {
    let body = format!(r#"{{"order_id":{order},"coupon_id":{}}}"#, 1000 + order);
    let res = http
        .post(format!("{base}/orders"))
        .header("content-type", "application/json")
        .header("x-api-key", "svc-test")
        .header("idempotency-key", key)
        .body(body)
        .send()
        .await
        .expect("POST /orders");
    (res.status().as_u16(), res.text().await.expect("body"))
}

async fn count(pool: &sqlx::SqlitePool, q: &'static str) -> i64 {
    sqlx::query_scalar(q).fetch_one(pool).await.expect(q)
}

fn database() -> (PathBuf, String) {
    let dir = std::env::temp_dir().join(format!(
        "idem-service-{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("clock")
            .as_nanos()
    ));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let url = format!("sqlite://{}?mode=rwc", dir.join("service.db").display());
    (dir, url)
}

/// Each order twice under its key (the retry replayed), five of them again
/// under new keys (answered by the record), then the probes.
async fn requests(http: &reqwest::Client, base: &str) {
    for n in 0..ORDERS {
        let key = format!("order-{n}");
        let first = order(http, base, &key, n).await;
        assert_eq!(first, (201, "order placed".to_owned()), "order {n}");
        // The client's retry: the stored answer, not a second order.
        assert_eq!(
            order(http, base, &key, n).await,
            first,
            "replay of order {n}"
        );
    }
    // The same orders under new keys: the record answers, no second order.
    for n in 0..5 {
        let again = order(http, base, &format!("other-{n}"), n).await;
        assert_eq!(again, (200, "order already placed".to_owned()));
    }
    let health = http
        .get(format!("{base}/healthz"))
        .send()
        .await
        .expect("healthz");
    assert_eq!(health.status().as_u16(), 200);
    let metrics = http
        .get(format!("{base}/metrics"))
        .send()
        .await
        .expect("metrics")
        .text()
        .await
        .expect("metrics body");
    assert!(metrics.contains("# HELP"), "described metrics:\n{metrics}");
}

#[tokio::test]
async fn sigterm_drains_the_service_and_it_exits_0_having_acted_once() {
    let (dir, url) = database();
    // 40 deductions of a second each, 4 at a time: ten seconds of work,
    // most of it left when the stop comes, right after the requests (a
    // second or two of them even on a loaded machine).
    let mut service = Service::start(&url, 1000);
    let http = reqwest::Client::new();
    requests(&http, &service.base).await;

    let pool = sqlx::SqlitePool::connect(&url)
        .await
        .expect("open the database");
    let stopped_with = count(&pool, "SELECT COUNT(*) FROM svc_deduction").await;
    service.terminate();
    let status = service.wait(Duration::from_secs(60));
    assert!(status.success(), "exit status {status:?}");
    assert!(
        stopped_with < ORDERS,
        "the stop came after the relay had finished: test nothing"
    );

    // Drained: nothing in flight was cut off (no lease left behind), and
    // what was delivered acted once.
    assert_eq!(count(&pool, "SELECT COUNT(*) FROM svc_order").await, ORDERS);
    assert_eq!(
        count(
            &pool,
            "SELECT COUNT(*) FROM idem_outbox WHERE lease_owner IS NOT NULL"
        )
        .await,
        0
    );
    assert_eq!(
        count(
            &pool,
            "SELECT COUNT(*) FROM idem_outbox WHERE status = 'failed'"
        )
        .await,
        0
    );
    let delivered = count(
        &pool,
        "SELECT COUNT(*) FROM idem_outbox WHERE status = 'success'",
    )
    .await;
    assert_eq!(
        count(&pool, "SELECT COUNT(*) FROM svc_deduction").await,
        delivered
    );

    // Started again: the rest is delivered, each coupon deducted once.
    let mut service = Service::start(&url, 0);
    let start = Instant::now();
    while count(
        &pool,
        "SELECT COUNT(*) FROM idem_outbox WHERE status = 'success'",
    )
    .await
        < ORDERS
    {
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "not drained after the restart"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    service.terminate();
    assert!(service.wait(Duration::from_secs(30)).success());
    assert_eq!(
        count(&pool, "SELECT COUNT(*) FROM svc_deduction").await,
        ORDERS
    );
    assert_eq!(
        count(&pool, "SELECT COUNT(DISTINCT coupon_id) FROM svc_deduction").await,
        ORDERS
    );
    assert_eq!(
        count(
            &pool,
            "SELECT COUNT(*) FROM svc_coupon WHERE status = 'USED'"
        )
        .await,
        ORDERS
    );
    pool.close().await;
    let _ = std::fs::remove_dir_all(dir);
}

/// The caller's trace and span a traced request comes from.
const TRACE: &str = "0af7651916cd43dd8448eb211c80319c";
const PARENT: &str = "b7ad6b7169203331";

/// An OTLP/HTTP collector on a loopback port: the bodies of the exports
/// posted to `/v1/traces`, and its endpoint.
async fn collector() -> (Arc<Mutex<Vec<Vec<u8>>>>, String) {
    let bodies: Arc<Mutex<Vec<Vec<u8>>>> = Arc::default();
    let kept = bodies.clone();
    let app = axum::Router::new().route(
        "/v1/traces",
        axum::routing::post(move |body: axum::body::Bytes| {
            kept.lock().expect("bodies").push(body.to_vec());
            async { "" }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let endpoint = format!("http://{}", listener.local_addr().expect("address"));
    tokio::spawn(async move { axum::serve(listener, app).await });
    (bodies, endpoint)
}

fn hex_bytes(hex: &str) -> Vec<u8> {
    (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).expect("hex"))
        .collect()
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

// Two workers: the collector answers while the test waits for the exit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_requests_trace_reaches_the_collector_through_the_relay() {
    let (bodies, endpoint) = collector().await;
    let (dir, url) = database();
    let env = [
        ("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint.as_str()),
        ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf"),
    ];
    let mut service = Service::start_with(&url, 0, &env);
    let res = reqwest::Client::new()
        .post(format!("{}/orders", service.base))
        .header("content-type", "application/json")
        .header("x-api-key", "svc-trace")
        .header("idempotency-key", "traced-1")
        .header("traceparent", format!("00-{TRACE}-{PARENT}-01"))
        .body(r#"{"order_id":7,"coupon_id":1007}"#)
        .send()
        .await
        .expect("POST /orders");
    assert_eq!(res.status().as_u16(), 201);
    let pool = sqlx::SqlitePool::connect(&url)
        .await
        .expect("open the database");
    let start = Instant::now();
    while count(&pool, "SELECT COUNT(*) FROM svc_deduction").await < 1 {
        assert!(start.elapsed() < Duration::from_secs(30), "not delivered");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // The exit flushes what the batch processor holds (an export it
    // could not finish would say so on stderr and take 5 s).
    service.terminate();
    let status = tokio::task::block_in_place(|| service.wait(Duration::from_secs(30)));
    assert!(status.success());
    pool.close().await;
    let _ = std::fs::remove_dir_all(dir);

    let all: Vec<u8> = bodies.lock().expect("bodies").concat();
    assert!(!all.is_empty(), "nothing exported");
    // The relay's delivery under its OpenTelemetry name
    // (`process <topic>`).
    for span in ["idempotent_request", "process coupon.deduct", "idempotent"] {
        assert!(contains(&all, span.as_bytes()), "no {span} span exported");
    }
    // The caller's trace id, as the spans' 16 raw bytes: the request's,
    // the delivery's and the handler's spans each carry it.
    let trace = hex_bytes(TRACE);
    let carried = all.windows(trace.len()).filter(|w| *w == trace).count();
    assert!(carried >= 3, "the caller's trace in {carried} span(s)");
}
