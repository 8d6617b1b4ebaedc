//! README, "The outbox and its relay": the producer enqueues in its own
//! transaction, the relay delivers to the handler keyed by the delivery.

use super::state_machine::{DeductCoupon, deduct_coupon};
use sqlx::PgPool;
use std::future::Future;
use std::time::Duration;

/// Marks order `order_id` paid and enqueues the deduction of coupon `c`
/// in the same transaction; then relays until `shutdown` completes.
pub async fn pay_and_relay(
    pool: PgPool,
    order_id: i64,
    c: i64,
    shutdown: impl Future<Output = ()>,
) -> Result<(), idem_runtime::Error> {
    // README: outbox
    use idem_runtime::outbox::{enqueue, Relay};

    // Producer: "order paid" and its "deduct coupon" message commit or roll back together.
    let mut tx = pool.begin().await?;
    sqlx::query("UPDATE readme_orders SET status = 'PAID' WHERE id = $1").bind(order_id).execute(&mut *tx).await?;
    // Enqueued::New(id); Enqueued::Already(id) when a retried producer finds it committed.
    enqueue(&mut tx, "readme.coupon.deduct", &format!("order-{order_id}"), &serde_json::json!({ "coupon_id": c, "order_id": order_id })).await?;
    tx.commit().await?;

    // Relay: a tokio task delivering each due message to its #[idempotent] handler,
    // which keys on the delivery's topic and id (`d`): the payload carries neither.
    let relay = Relay::new(pool.clone())
        .route("readme.coupon.deduct", |d, msg: DeductCoupon| async move { deduct_coupon(d.source(), &d, &msg).await })
        .batch_size(64)          // most messages claimed per round
        .concurrency(16)         // handlers at once
        .lease(Duration::from_secs(30))
        .max_attempts(10)
        .backoff(Duration::from_millis(200), Duration::from_secs(60))
        .spawn();
    shutdown.await;              // the application's stop signal, e.g. tokio::signal::ctrl_c()
    relay.shutdown().await;      // stops claiming, finishes what is in flight
    // README: end
    Ok(())
}
