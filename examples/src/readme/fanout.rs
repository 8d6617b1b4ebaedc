//! README, "One message, several handlers": a paid order's message both
//! deducts its coupon and sends a notice, each acting once.

use super::state_machine::{DeductCoupon, deduct_coupon};
use idem_runtime::idempotent;
use idem_runtime::outbox::Delivery;
use sqlx::{PgConnection, PgPool, Postgres};
use std::future::Future;

/// The second subscriber: a notice for the order, a record in a scope of
/// its own.
#[idempotent(key = "paid:{d.topic}:{d.msg_id}", strategy = record, biz_type = "readme_paid_notice", fingerprint = [d])]
pub async fn notify_paid(tx: &mut PgConnection, d: &Delivery<Postgres>, msg: &DeductCoupon) -> Result<(), sqlx::Error> {
    sqlx::query("INSERT INTO readme_notice (user_id, text) VALUES ($1, 'paid')").bind(msg.order_id).execute(&mut *tx).await?;
    Ok(())
}

/// Relays `topic` to both subscribers until `shutdown` completes.
pub async fn fan_out(pool: PgPool, shutdown: impl Future<Output = ()>) {
    // README: fanout
    let relay = idem_runtime::outbox::Relay::new(pool.clone())
        .subscribe("readme.order.paid", "deduct_coupon", |d, msg: DeductCoupon| async move {
            deduct_coupon(d.source(), &d, &msg).await
        })
        .subscribe("readme.order.paid", "notify_paid", |d, msg: DeductCoupon| async move {
            notify_paid(d.source(), &d, &msg).await
        })
        .spawn();
    // README: end
    shutdown.await;
    relay.shutdown().await;
}
