//! The trace through RocketMQ: a message enqueued inside a span, published
//! by the relay (`Publisher::route`, which carries its `traceparent` as a
//! user property), and consumed: the consumer's `rocketmq_message` span is
//! in the enqueuing span's trace.

use super::{enqueue_in_span, exporter, one_trace};
use crate::common::hooks;
use crate::common::rocketmq::*;
use idem_runtime::outbox::Relay;
use idem_testkit::cluster::rocketmq::RocketMq;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_trace_from_the_request_through_rocketmq_to_the_consumer() {
    let _hooks = hooks::shared().await;
    let _servers = hooks::own_servers().await;
    exporter();
    let Some(cluster) = RocketMq::start() else {
        return;
    };
    let Some((pool, d)) = database("sqlite").await else {
        return;
    };
    let namesrv = cluster.namesrv_addr();
    let topic = unique("r_otel");
    cluster.create_topic(&topic, 2).await;
    let msg_id = format!("o-{}", ids(1));
    let enqueued = enqueue_in_span(&pool, &topic, &msg_id, serde_json::json!({ "item": 1 })).await;

    let runtime = rocketmq::runtime::shared().expect("the client runtime");
    let publisher = Publisher::connect_with(
        &namesrv,
        unique("r_otel_producer"),
        Some(cluster.client_options()),
        runtime,
    )
    .await
    .expect("publisher");
    let relay = Relay::new(pool.clone())
        .route(&topic, publisher.route())
        .poll_interval(Duration::from_millis(20))
        .spawn();
    idem_testkit::published(&pool, d, &topic, Duration::from_secs(60)).await;
    relay.shutdown().await;
    publisher.shutdown().await;

    let seen = Arc::new(AtomicUsize::new(0));
    let s = seen.clone();
    let consumer = Consumer::new(
        &namesrv,
        unique("idem_r_otel_reader"),
        &topic,
        move |_: Message, _: serde::de::IgnoredAny| {
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

    one_trace(enqueued, "rocketmq", &topic, &topic, &msg_id).await;
    consumer.shutdown().await.expect("clean shutdown");
}
