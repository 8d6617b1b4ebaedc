//! The trace from an HTTP request: a request carrying a W3C `traceparent`
//! reaches a handler behind the `Idempotency-Key` layer, whose
//! `idempotent_request` span continues the caller's trace; the message the
//! handler enqueues carries it, and the relay's `outbox_delivery` span is
//! in it. A retry of the request (replayed) enqueues nothing more. Under
//! the application's own traced span, the request's span stays in that
//! span's trace.

use super::{attribute, delivered, exporter};
use crate::common::hooks;
use crate::common::http;
use axum::Router;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use idem_runtime::http::{Idempotency, RequestTx};
use idem_runtime::outbox::Relay;
use opentelemetry::trace::{SpanId, TraceId};
use sqlx::{Sqlite, SqlitePool};
use std::time::{Duration, Instant};

/// The caller's trace and its span the request comes from.
const TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const PARENT: &str = "00f067aa0ba902b7";

fn caller(parts: &axum::http::request::Parts) -> Option<String> {
    Some(parts.headers.get("x-api-key")?.to_str().ok()?.to_owned())
}

/// `POST /orders`: enqueues one message, named by the request's key.
async fn order(
    axum::extract::State(topic): axum::extract::State<String>,
    headers: axum::http::HeaderMap,
    mut tx: RequestTx<Sqlite>,
) -> Response {
    let key = headers["idempotency-key"]
        .to_str()
        .unwrap_or("")
        .trim_matches('"')
        .to_owned();
    let conn = match tx.conn() {
        Ok(conn) => conn,
        Err(e) => return (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response(),
    };
    match idem_runtime::outbox::enqueue(conn, &topic, &key, &serde_json::json!({ "key": key }))
        .await
    {
        Ok(_) => StatusCode::CREATED.into_response(),
        Err(e) => (StatusCode::SERVICE_UNAVAILABLE, e.to_string()).into_response(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_trace_from_the_http_request_through_the_relay() {
    let _hooks = hooks::shared().await;
    exporter();
    let pool: SqlitePool = idem_testkit::sqlite(4).await;
    let topic = idem_testkit::unique("otel_http");
    let scope: &'static str = Box::leak(idem_testkit::unique("otel_http").into_boxed_str());
    let policy = Idempotency::new(scope, caller);
    let router = Router::new()
        .route("/orders", post(order).layer(policy.layer(&pool)))
        .with_state(topic.clone());
    let base = http::serve(router).await;
    let key = format!("o-{}", idem_testkit::ids(1));
    let send = || {
        http::client()
            .post(format!("{base}/orders"))
            .header("x-api-key", "caller-1")
            .header("idempotency-key", format!("\"{key}\""))
            .header("traceparent", format!("00-{TRACE}-{PARENT}-01"))
            .body("{}")
            .send()
    };
    assert_eq!(send().await.expect("send").status().as_u16(), 201);
    assert_eq!(send().await.expect("retry").status().as_u16(), 201);

    let stored: Vec<Option<String>> =
        sqlx::query_scalar("SELECT headers FROM idem_outbox WHERE topic = ?")
            .bind(&topic)
            .fetch_all(&pool)
            .await
            .expect("headers");
    assert_eq!(stored.len(), 1, "the retry was replayed, not run");
    let headers: std::collections::BTreeMap<String, String> =
        serde_json::from_str(stored[0].as_deref().expect("headers stored")).expect("JSON");
    let request = request_span(scope).await;
    let trace = TraceId::from_hex(TRACE).expect("trace id");
    assert_eq!(request.span_context.trace_id(), trace, "the caller's trace");
    assert_eq!(
        request.parent_span_id,
        SpanId::from_hex(PARENT).expect("span id")
    );
    assert!(request.parent_span_is_remote);
    assert_eq!(
        headers["traceparent"],
        format!("00-{TRACE}-{}-01", request.span_context.span_id()),
        "the message is enqueued under the request's span"
    );

    let relay = Relay::new(pool.clone())
        .route(topic.clone(), |_, _: serde_json::Value| async {
            Ok::<_, idem_runtime::Error>(idem_runtime::Outcome::Executed(()))
        })
        .poll_interval(Duration::from_millis(20))
        .spawn();
    let delivery = delivered(&topic, &key).await;
    relay.shutdown().await;
    assert_eq!(delivery.span_context.trace_id(), trace, "one trace");
    assert_eq!(delivery.parent_span_id, request.span_context.span_id());
    assert_eq!(
        attribute(&delivery, "messaging.destination.name").as_deref(),
        Some(topic.as_str())
    );
}

/// The first `idempotent_request` span of `scope`, waited for.
async fn request_span(scope: &str) -> opentelemetry_sdk::trace::SpanData {
    let start = Instant::now();
    loop {
        let spans = exporter().get_finished_spans().expect("finished spans");
        if let Some(span) = spans.into_iter().find(|s| {
            s.name == "idempotent_request"
                && s.attributes
                    .iter()
                    .any(|kv| kv.key.as_str() == "scope" && kv.value.as_str() == scope)
        }) {
            return span;
        }
        assert!(start.elapsed() < Duration::from_secs(20), "no request span");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// An application tracing its requests itself: the layer's span is under
/// the application's span, in its trace, whatever the header says.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_the_applications_span_the_header_is_left_to_it() {
    use tracing::Instrument as _;
    let _hooks = hooks::shared().await;
    exporter();
    let pool: SqlitePool = idem_testkit::sqlite(2).await;
    let scope: &'static str = Box::leak(idem_testkit::unique("otel_app").into_boxed_str());
    let policy = Idempotency::new(scope, caller);
    let router = Router::new()
        .route("/orders", post(order).layer(policy.layer(&pool)))
        .with_state(idem_testkit::unique("otel_app"))
        .layer(axum::middleware::from_fn(
            |req: axum::extract::Request, next: axum::middleware::Next| {
                next.run(req).instrument(tracing::info_span!("app_request"))
            },
        ));
    let base = http::serve(router).await;
    let answer = http::client()
        .post(format!("{base}/orders"))
        .header("x-api-key", "caller-1")
        .header("idempotency-key", format!("\"a-{}\"", idem_testkit::ids(1)))
        .header("traceparent", format!("00-{TRACE}-{PARENT}-01"))
        .body("{}")
        .send()
        .await
        .expect("send");
    assert_eq!(answer.status().as_u16(), 201);
    let request = request_span(scope).await;
    let spans = exporter().get_finished_spans().expect("finished spans");
    let app = spans
        .iter()
        .find(|s| s.name == "app_request" && s.span_context.span_id() == request.parent_span_id)
        .expect("the request span is under the application's span");
    assert_eq!(request.span_context.trace_id(), app.span_context.trace_id());
    assert_ne!(
        request.span_context.trace_id(),
        TraceId::from_hex(TRACE).unwrap()
    );
}
