//! The trace through NATS JetStream: a message enqueued inside a span,
//! published by the relay (`Publisher::route`, which carries its
//! `traceparent` header), and consumed: the consumer's `nats_delivery` span
//! is in the enqueuing span's trace.

use super::{enqueue_in_span, exporter, one_trace};
use crate::common::hooks;
use crate::common::nats::*;
use idem_runtime::outbox::Relay;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_trace_from_the_request_through_jetstream_to_the_consumer() {
    let _hooks = hooks::shared().await;
    exporter();
    let Some((pool, js, _table)) = servers().await else {
        return;
    };
    let t = topology(&js, "otel", |t| t).await;
    let topic = t.subjects[0].clone();
    let msg_id = format!("o-{}", ids(1));
    let enqueued = enqueue_in_span(&pool, &topic, &msg_id, serde_json::json!({ "item": 1 })).await;

    let publisher = Publisher::new(js.clone()).expected_stream(&t.stream);
    let relay = Relay::new(pool.clone())
        .route(topic.clone(), publisher.route())
        .poll_interval(Duration::from_millis(20))
        .spawn();
    drained(&pool, &topic, Duration::from_secs(8)).await;
    relay.shutdown().await;

    let seen = Arc::new(AtomicUsize::new(0));
    let s = seen.clone();
    let consumer = Consumer::new(
        js.clone(),
        &t.stream,
        &t.consumer,
        move |_: Message, _: serde_json::Value| {
            s.fetch_add(1, Ordering::SeqCst);
            async move { Ok::<_, Error>(Outcome::Executed(())) }
        },
    )
    .spawn()
    .await
    .expect("consumer");
    until("the delivery", Duration::from_secs(8), || {
        seen.load(Ordering::SeqCst) >= 1
    })
    .await;

    one_trace(enqueued, "nats", &topic, &t.stream, &msg_id).await;
    consumer.shutdown().await.expect("clean shutdown");
    teardown(&js, &t).await;
}
