//! The trace through Redis Streams: a message enqueued inside a span,
//! published by the relay (`Publisher::route`, which stores its
//! `traceparent` header as the field `h.traceparent`), and consumed: the
//! consumer's `redis_stream_entry` span is in the enqueuing span's trace.

use super::{enqueue_in_span, exporter, one_trace};
use crate::common::hooks;
use crate::common::redis_streams::*;
use idem_runtime::outbox::Relay;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_trace_from_the_request_through_a_stream_to_the_consumer() {
    let _hooks = hooks::shared().await;
    exporter();
    let Some(client) = shared_redis().await else {
        return;
    };
    let Some((pool, d)) = database("postgres").await else {
        return;
    };
    let topic = unique("idem_rs_otel");
    let msg_id = format!("o-{}", ids(1));
    let enqueued = enqueue_in_span(&pool, &topic, &msg_id, serde_json::json!({ "n": 1 })).await;

    let relay = Relay::new(pool.clone())
        .route(topic.clone(), Publisher::new(client.clone()).route())
        .poll_interval(Duration::from_millis(20))
        .spawn();
    wait_for("the relay to publish", Duration::from_secs(8), || {
        let (pool, topic) = (pool.clone(), topic.clone());
        async move {
            let left: i64 = sqlx::query_scalar(sql(
                d,
                "SELECT COUNT(*) FROM idem_outbox WHERE topic = ? AND status <> 'success'",
            ))
            .bind(topic)
            .fetch_one(&pool)
            .await
            .expect("pending");
            left == 0
        }
    })
    .await;
    relay.shutdown().await;

    let seen = Arc::new(AtomicUsize::new(0));
    let s = seen.clone();
    let consumer = Consumer::new(
        client.clone(),
        &topic,
        "otel",
        move |_: Message, _: serde_json::Value| {
            s.fetch_add(1, Ordering::SeqCst);
            async move { Ok::<_, Error>(Outcome::Executed(())) }
        },
    )
    .spawn()
    .await
    .expect("consumer");
    wait_for("the entry handled", Duration::from_secs(8), || {
        let n = seen.load(Ordering::SeqCst);
        async move { n >= 1 }
    })
    .await;

    one_trace(enqueued, "redis", &topic, &topic, &msg_id).await;
    consumer.shutdown().await.expect("clean shutdown");
}
