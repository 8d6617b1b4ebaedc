//! Trace context end to end (feature `opentelemetry`), on every backend:
//! a message enqueued inside a span carries the span's W3C `traceparent`
//! in its stored headers, and the relay's `outbox_delivery` span continues
//! that trace. The spans are exported to memory by an OpenTelemetry SDK
//! tracer behind `tracing-opentelemetry`, installed once for the binary
//! (the relay runs its deliveries in tasks of its own). Through RabbitMQ
//! to a consumer: `amqp.rs`; through NATS JetStream: `nats.rs`; through Redis Streams:
//! `redis_streams.rs`; through Kafka: `kafka.rs`; through RocketMQ: `rocketmq.rs`. From an
//! HTTP request behind the `Idempotency-Key` layer: `http.rs`.

#[macro_use]
#[path = "../common"]
// Shared with the other binaries; this one uses part of it.
#[allow(dead_code, unused_imports)]
mod common {
    pub(crate) mod amqp;
    pub(crate) mod brokers;
    pub(crate) mod coupons;
    pub(crate) mod hooks;
    pub(crate) mod http;
    pub(crate) mod kafka;
    pub(crate) mod nats;
    pub(crate) mod redis_streams;
    pub(crate) mod rocketmq;
    #[macro_use]
    pub(crate) mod relay;
}

mod amqp;
mod http;
mod kafka;
mod nats;
mod redis_streams;
mod rocketmq;

use crate::common::hooks;
use crate::common::relay::*;
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider, SpanData};
use std::sync::OnceLock;
use tracing_subscriber::layer::SubscriberExt as _;

/// The exporter every span of this binary ends in: the subscriber is set
/// once, as the global default, on the first call.
fn exporter() -> &'static InMemorySpanExporter {
    static EXPORTER: OnceLock<InMemorySpanExporter> = OnceLock::new();
    EXPORTER.get_or_init(|| {
        let exporter = InMemorySpanExporter::default();
        let provider = SdkTracerProvider::builder()
            .with_simple_exporter(exporter.clone())
            .build();
        let tracer = provider.tracer("idem-tests");
        let subscriber =
            tracing_subscriber::registry().with(tracing_opentelemetry::layer().with_tracer(tracer));
        tracing::subscriber::set_global_default(subscriber).expect("the only subscriber");
        exporter
    })
}

/// The exported span named `name` (its OpenTelemetry name, as
/// `process orders`) of the messaging system `system` whose
/// `messaging.message.id` is `msg_id`, waited for (a span is exported when
/// it closes).
async fn exported(system: &str, name: &str, msg_id: &str) -> SpanData {
    let start = Instant::now();
    loop {
        let spans = exporter().get_finished_spans().expect("finished spans");
        if let Some(span) = spans.into_iter().find(|s| {
            s.name == name
                && attribute(s, "messaging.system").as_deref() == Some(system)
                && attribute(s, "messaging.message.id").as_deref() == Some(msg_id)
        }) {
            return span;
        }
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "no {system} span {name} for {msg_id}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The relay's delivery span of message `msg_id` of `topic`.
async fn delivered(topic: &str, msg_id: &str) -> SpanData {
    exported("idem.outbox", &format!("process {topic}"), msg_id).await
}

fn attribute(span: &SpanData, key: &str) -> Option<String> {
    span.attributes
        .iter()
        .find(|kv| kv.key.as_str() == key)
        .map(|kv| kv.value.as_str().into_owned())
}

/// Enqueues message `msg_id` of `topic` inside a span `http_request`;
/// that span's trace and span ids.
async fn enqueue_in_span<DB: idem_runtime::Backend>(
    pool: &sqlx::Pool<DB>,
    topic: &str,
    msg_id: &str,
    payload: serde_json::Value,
) -> (opentelemetry::trace::TraceId, opentelemetry::trace::SpanId) {
    use opentelemetry::trace::TraceContextExt as _;
    use tracing::Instrument as _;
    use tracing_opentelemetry::OpenTelemetrySpanExt as _;
    async {
        let mut tx = <DB as idem_runtime::Backend>::begin(pool)
            .await
            .expect("begin");
        idem_runtime::outbox::enqueue(&mut tx, topic, msg_id, &payload)
            .await
            .expect("enqueue");
        tx.commit().await.expect("commit");
        let cx = tracing::Span::current().context();
        let sc = cx.span().span_context().clone();
        (sc.trace_id(), sc.span_id())
    }
    .instrument(tracing::info_span!("http_request"))
    .await
}

/// Asserts the hops of message `msg_id` of `topic`, enqueued in the span
/// `(trace_id, span_id)` and consumed from `destination` of the broker
/// `system`, as one trace of spans named and kinded per OpenTelemetry's
/// messaging conventions: the enqueuing span, the relay's delivery
/// (`process <topic>`, a consumer), the publish under it (`send <topic>`,
/// a producer), whose context the message carried to the broker, and the
/// consumer's `process <destination>`.
async fn one_trace(
    (trace_id, span_id): (opentelemetry::trace::TraceId, opentelemetry::trace::SpanId),
    system: &str,
    topic: &str,
    destination: &str,
    msg_id: &str,
) {
    use opentelemetry::trace::SpanKind;
    let delivery = delivered(topic, msg_id).await;
    assert_eq!(delivery.span_context.trace_id(), trace_id, "one trace");
    assert_eq!(
        delivery.parent_span_id, span_id,
        "the relay continues the enqueue"
    );
    assert!(delivery.parent_span_is_remote);
    assert_eq!(delivery.span_kind, SpanKind::Consumer);

    let publish = exported(system, &format!("send {topic}"), msg_id).await;
    assert_eq!(publish.span_context.trace_id(), trace_id, "one trace");
    assert_eq!(
        publish.parent_span_id,
        delivery.span_context.span_id(),
        "the publish runs under the delivery"
    );
    assert_eq!(publish.span_kind, SpanKind::Producer);
    assert_eq!(
        attribute(&publish, "messaging.operation.type").as_deref(),
        Some("send")
    );
    assert_eq!(
        attribute(&publish, "messaging.destination.name").as_deref(),
        Some(topic)
    );

    let consumed = exported(system, &format!("process {destination}"), msg_id).await;
    assert_eq!(consumed.span_context.trace_id(), trace_id, "one trace");
    assert_eq!(
        consumed.parent_span_id,
        publish.span_context.span_id(),
        "the consumer continues the publish"
    );
    assert!(consumed.parent_span_is_remote);
    assert_eq!(consumed.span_kind, SpanKind::Consumer);
    assert_eq!(
        attribute(&consumed, "messaging.operation.type").as_deref(),
        Some("process")
    );
    assert_eq!(
        attribute(&consumed, "messaging.destination.name").as_deref(),
        Some(destination)
    );
}

/// Asserts that the handler's `#[idempotent]` call ran in a span under
/// `delivery`, in its trace.
fn call_under(delivery: &SpanData) {
    let spans = exporter().get_finished_spans().expect("finished spans");
    assert!(
        spans.iter().any(|s| s.name == "idempotent"
            && s.parent_span_id == delivery.span_context.span_id()
            && s.span_context.trace_id() == delivery.span_context.trace_id()),
        "no idempotent span under the delivery"
    );
}

macro_rules! otel_tests {
    ($module:ident, $db:ty, $dialect:expr, $pool:expr) => {
        mod $module {
            // The shared fixtures serve every relay test binary; this one
            // uses only part of them.
            #![allow(dead_code)]
            relay_fixtures!($module, $db, $dialect, $pool);
            use super::{attribute, call_under, delivered, exporter};
            use opentelemetry::trace::{SpanId, TraceContextExt as _, TraceId};
            use tracing::Instrument as _;
            use tracing_opentelemetry::OpenTelemetrySpanExt as _;

            async fn headers_of(pool: &Pool<Db>, topic: &str) -> Option<String> {
                sqlx::query_scalar(sql(D, "SELECT headers FROM idem_outbox WHERE topic = ?"))
                    .bind(topic)
                    .fetch_one(pool)
                    .await
                    .expect("headers")
            }

            async fn deliver(pool: &Pool<Db>, topic: &str) {
                let relay = Relay::new(pool.clone())
                    .route(topic.to_owned(), |d, m: Deduct| async move {
                        deduct(d.source(), &m).await
                    });
                run_once_retrying(&relay, true).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn delivery_continues_the_enqueuing_trace() {
                let _hooks = hooks::shared().await;
                exporter();
                let Some(pool) = pool().await else { return };
                let topic = topic("traced");
                let request = tracing::info_span!("http_request");
                let (coupon, trace_id, span_id) = async {
                    let cx = tracing::Span::current().context();
                    let sc = cx.span().span_context().clone();
                    (produce(&pool, &topic, 1).await, sc.trace_id(), sc.span_id())
                }
                .instrument(request)
                .await;
                assert_ne!(trace_id, TraceId::INVALID);
                let stored = headers_of(&pool, &topic).await.expect("headers stored");
                let headers: std::collections::BTreeMap<String, String> =
                    serde_json::from_str(&stored).expect("a JSON object");
                assert_eq!(
                    headers["traceparent"],
                    format!("00-{trace_id}-{span_id}-01")
                );
                assert!(!headers.contains_key("tracestate"), "{stored}");

                deliver(&pool, &topic).await;
                let msg_id = format!("m-{coupon}-0");
                let delivery = delivered(&topic, &msg_id).await;
                assert_eq!(delivery.span_context.trace_id(), trace_id);
                assert_eq!(delivery.parent_span_id, span_id);
                assert!(delivery.parent_span_is_remote);
                assert_eq!(
                    attribute(&delivery, "messaging.system").as_deref(),
                    Some("idem.outbox")
                );
                assert_eq!(
                    attribute(&delivery, "messaging.operation.type").as_deref(),
                    Some("process")
                );
                assert_eq!(
                    attribute(&delivery, "messaging.destination.name"),
                    Some(topic.clone())
                );
                assert_eq!(deductions(&pool, coupon).await, 1);
                call_under(&delivery);
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn each_message_of_a_batch_continues_its_own_trace() {
                let _hooks = hooks::shared().await;
                exporter();
                let Some(pool) = pool().await else { return };
                let topic = topic("batched");
                let mut sent = Vec::new();
                for _ in 0..3 {
                    let traced = async {
                        let cx = tracing::Span::current().context();
                        let trace_id = cx.span().span_context().trace_id();
                        (produce(&pool, &topic, 1).await, trace_id)
                    }
                    .instrument(tracing::info_span!("http_request"))
                    .await;
                    sent.push(traced);
                }
                let relay = Relay::new(pool.clone())
                    .commit_batch(16)
                    .batch_size(16)
                    .route(topic.clone(), |d, m: Deduct| async move {
                        deduct(d.source(), &m).await
                    });
                while by_status(&pool, &topic, "pending").await > 0 {
                    run_once_retrying(&relay, false).await;
                }
                for (coupon, trace_id) in sent {
                    let delivery = delivered(&topic, &format!("m-{coupon}-0")).await;
                    assert_eq!(
                        delivery.span_context.trace_id(),
                        trace_id,
                        "coupon {coupon}"
                    );
                    assert_eq!(attribute(&delivery, "batch"), Some("true".to_owned()));
                    call_under(&delivery);
                    // The message's delivery links to its batch's span,
                    // which links back to the message's trace.
                    let batch = exporter()
                        .get_finished_spans()
                        .expect("finished spans")
                        .into_iter()
                        .find(|s| {
                            delivery
                                .links
                                .iter()
                                .any(|l| l.span_context == s.span_context)
                        })
                        .expect("the delivery links to an exported batch span");
                    assert_eq!(batch.name, format!("process {topic}"));
                    assert_eq!(batch.span_kind, opentelemetry::trace::SpanKind::Consumer);
                    assert_eq!(batch.parent_span_id, SpanId::INVALID, "a root span");
                    assert!(
                        batch
                            .links
                            .iter()
                            .any(|l| l.span_context.trace_id() == trace_id),
                        "the batch links to the trace of coupon {coupon}"
                    );
                    let count = batch
                        .attributes
                        .iter()
                        .find(|kv| kv.key.as_str() == "messaging.batch.message_count")
                        .map(|kv| kv.value.clone());
                    assert_eq!(
                        count,
                        Some(opentelemetry::Value::I64(batch.links.len() as i64)),
                        "one link per message of the batch"
                    );
                }
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn no_span_no_traceparent() {
                let _hooks = hooks::shared().await;
                exporter();
                let Some(pool) = pool().await else { return };
                let topic = topic("untraced");
                let coupon = produce(&pool, &topic, 1).await;
                assert_eq!(headers_of(&pool, &topic).await, None, "no headers stored");
                deliver(&pool, &topic).await;
                let delivery = delivered(&topic, &format!("m-{coupon}-0")).await;
                assert_eq!(delivery.parent_span_id, SpanId::INVALID, "a root span");
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn a_callers_traceparent_is_kept() {
                let _hooks = hooks::shared().await;
                exporter();
                let Some(pool) = pool().await else { return };
                let topic = topic("explicit");
                let parent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
                async {
                    let mut tx = <Db as idem_runtime::Backend>::begin(&pool)
                        .await
                        .expect("begin");
                    let options = idem_runtime::outbox::EnqueueOptions::new()
                        .header("traceparent", parent)
                        .header("tracestate", "congo=t61rcWkgMzE");
                    idem_runtime::outbox::enqueue_with(
                        &mut tx,
                        &topic,
                        "m-1",
                        &serde_json::json!({}),
                        &options,
                    )
                    .await
                    .expect("enqueue");
                    tx.commit().await.expect("commit");
                }
                .instrument(tracing::info_span!("http_request"))
                .await;
                let stored = headers_of(&pool, &topic).await.expect("headers stored");
                let headers: std::collections::BTreeMap<String, String> =
                    serde_json::from_str(&stored).expect("a JSON object");
                assert_eq!(headers["traceparent"], parent);
                assert_eq!(headers["tracestate"], "congo=t61rcWkgMzE");
            }
        }
    };
}

idem_testkit::for_each_backend!(otel_tests);
