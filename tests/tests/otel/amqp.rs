//! The trace through RabbitMQ: a message enqueued inside a span, published
//! by the relay (`Publisher::route`, which carries its `traceparent`
//! header), and consumed: the relay's `outbox_delivery` and the consumer's
//! `amqp_delivery` spans are in the enqueuing span's trace.

use super::{enqueue_in_span, exporter, one_trace};
use crate::common::amqp::*;
use crate::common::hooks;
use idem_runtime::outbox::Relay;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_trace_from_the_request_through_rabbitmq_to_the_consumer() {
    let _hooks = hooks::shared().await;
    exporter();
    let Some((pool, conn)) = servers().await else {
        return;
    };
    let (t, exchange, topic) = topology(&conn, "otel").await;
    let msg_id = format!("o-{}", ids(1));
    let enqueued = enqueue_in_span(&pool, &topic, &msg_id, serde_json::json!({ "n": 1 })).await;

    let relay = Relay::new(pool.clone())
        .route(
            topic.clone(),
            Publisher::new(conn.clone(), &exchange).route(),
        )
        .poll_interval(Duration::from_millis(20))
        .spawn();
    drained(&pool, &topic, Duration::from_secs(8)).await;
    relay.shutdown().await;

    let seen = Arc::new(AtomicUsize::new(0));
    let s = seen.clone();
    let consumer = Consumer::new(
        conn.clone(),
        &t.queue,
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

    one_trace(enqueued, "rabbitmq", &topic, &t.queue, &msg_id).await;
    consumer.shutdown().await.expect("clean shutdown");
    teardown(&conn, &t).await;
}
