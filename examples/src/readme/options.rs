//! README, "Ordering keys, delays, headers and per-topic limits": one
//! order's messages in the order they were enqueued, a reminder half an
//! hour later, a tenant header for the handlers, an SMS topic held to its
//! provider's limits.

use idem_runtime::idempotent;
use idem_runtime::outbox::Delivery;
use sqlx::{PgConnection, PgPool, Postgres};
use std::future::Future;
use std::time::Duration;

/// One step of an order's life.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
pub struct OrderEvent { pub order_id: i64 }

/// Logs the step `d.topic` of the order with the delivery's tenant header,
/// once per message.
#[idempotent(key = "step:{d.topic}:{d.msg_id}", strategy = record, biz_type = "readme_order_step", fingerprint = [d])]
pub async fn log_step(tx: &mut PgConnection, d: &Delivery<Postgres>, e: &OrderEvent) -> Result<(), sqlx::Error> {
    sqlx::query("INSERT INTO readme_order_log (order_id, step, tenant) VALUES ($1, $2, $3)")
        .bind(e.order_id).bind(&d.topic).bind(d.header("tenant")).execute(&mut *tx).await?;
    Ok(())
}

/// Enqueues order `order_id`'s messages, then relays until `shutdown`.
pub async fn order_life(pool: PgPool, order_id: i64, shutdown: impl Future<Output = ()>) -> Result<(), idem_runtime::Error> {
    // README: options
    use idem_runtime::outbox::{enqueue_with, EnqueueOptions, Relay, TopicLimit};

    let order = serde_json::json!({ "order_id": order_id });
    // One key per order: "created" runs before "paid", one at a time, whatever the relays.
    let in_order = EnqueueOptions::new().ordering_key(format!("order-{order_id}")).header("tenant", "acme");
    let mut tx = pool.begin().await?;
    enqueue_with(&mut tx, "readme.order.created", &format!("created-{order_id}"), &order, &in_order).await?;
    enqueue_with(&mut tx, "readme.order.paid", &format!("paid-{order_id}"), &order, &in_order).await?;
    // Not delivered before 30 minutes from now (by the database's clock).
    let later = EnqueueOptions::new().delay(Duration::from_secs(30 * 60));
    enqueue_with(&mut tx, "readme.order.remind", &format!("remind-{order_id}"), &order, &later).await?;
    tx.commit().await?;

    let relay = Relay::new(pool.clone())
        .route("readme.order.created", |d, e: OrderEvent| async move { log_step(d.source(), &d, &e).await })
        .route("readme.order.paid", |d, e: OrderEvent| async move { log_step(d.source(), &d, &e).await })
        .route("readme.order.remind", |d, e: OrderEvent| async move { log_step(d.source(), &d, &e).await })
        .route("readme.sms.send", |d, e: OrderEvent| async move { log_step(d.source(), &d, &e).await })
        // The SMS provider takes 20 requests a second, 4 at once: the other topics keep their pace.
        .topic_limit("readme.sms.send", TopicLimit::new().concurrency(4).per_second(20.0))
        .spawn();
    // README: end
    shutdown.await;
    relay.shutdown().await;
    Ok(())
}
