//! The trace through Kafka: a message enqueued inside a span, published by
//! the relay (`Publisher::route`, which carries its `traceparent` as a
//! record header), and consumed: the consumer's `kafka_record` span is in
//! the enqueuing span's trace.

use super::{enqueue_in_span, exporter, one_trace};
use crate::common::hooks;
use crate::common::kafka::*;
use idem_runtime::outbox::Relay;
use idem_testkit::cluster::kafka::KafkaBroker;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_trace_from_the_request_through_kafka_to_the_consumer() {
    let _hooks = hooks::shared().await;
    let _servers = hooks::own_servers().await;
    exporter();
    let Some(broker) = KafkaBroker::start() else {
        return;
    };
    let Some((pool, d)) = database("sqlite").await else {
        return;
    };
    let brokers = broker.bootstrap();
    let t = Topology::new(unique("k_otel"));
    t.declare(&brokers).await.expect("declare");
    let topic = t.topic.clone();
    let msg_id = format!("o-{}", ids(1));
    let enqueued = enqueue_in_span(&pool, &topic, &msg_id, serde_json::json!({ "item": 1 })).await;

    let publisher = Publisher::new(&brokers).expect("publisher");
    let relay = Relay::new(pool.clone())
        .route(&topic, publisher.route())
        .poll_interval(Duration::from_millis(20))
        .spawn();
    idem_testkit::published(&pool, d, &topic, Duration::from_secs(60)).await;
    relay.shutdown().await;

    let seen = Arc::new(AtomicUsize::new(0));
    let s = seen.clone();
    let consumer = Consumer::new(
        &brokers,
        unique("k_otel_group"),
        &topic,
        move |_: Message, _: serde_json::Value| {
            s.fetch_add(1, Ordering::SeqCst);
            async move { Ok::<_, Error>(Outcome::Executed(())) }
        },
    )
    .spawn()
    .await
    .expect("consumer");
    wait_for("the delivery", Duration::from_secs(60), || {
        let n = seen.load(Ordering::SeqCst);
        async move { n >= 1 }
    })
    .await;

    one_trace(enqueued, "kafka", &topic, &topic, &msg_id).await;
    consumer.shutdown().await.expect("clean shutdown");
}
