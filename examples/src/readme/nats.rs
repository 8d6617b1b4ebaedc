//! README, "NATS JetStream consumption and publishing": the relay
//! publishes the outbox to a stream, the consumer runs a handler keyed by
//! the JetStream delivery (`{m.stream}:{m.message_id}`, the message id
//! being the `Nats-Msg-Id` header = the outbox msg_id).

use super::state_machine::DeductCoupon;
use idem_runtime::outbox::Relay;
use idem_runtime::{Error, State, idempotent};
use sqlx::{PgConnection, PgPool};
use std::future::Future;
use std::time::Duration;

#[derive(Clone, Copy, State)]
enum CouponState {
    Unused,
    Used,
}

/// The consumer's handler: the deduction keyed by the JetStream delivery.
#[idempotent(
    key = "mq:{m.stream}:{m.message_id}",
    strategy = state_machine,
    table = "readme_coupon",
    id = msg.coupon_id,
    from = CouponState::Unused,
    to = CouponState::Used,
)]
pub async fn deduct_from_stream(
    tx: &mut PgConnection,
    m: &idem_runtime::nats::Message,
    msg: &DeductCoupon,
) -> Result<(), sqlx::Error> {
    sqlx::query("INSERT INTO readme_deduction (coupon_id, order_id) VALUES ($1, $2)")
        .bind(msg.coupon_id)
        .bind(msg.order_id)
        .execute(&mut *tx)
        .await?;
    Ok(())
}

/// Declares the stream and consumer, starts the consumer and the
/// publishing relay, and stops both once `until` completes.
pub async fn consume_and_publish(pool: PgPool, until: impl Future<Output = ()>) -> Result<(), Error> {
    // README: nats
    use idem_runtime::nats::{self, Consumer, Publisher, Topology};

    let js = nats::connect("nats://127.0.0.1:4222").await?;
    let t = Topology::new("README_COUPONS", "readme.js.deduct", "deduct")
        .duplicate_window(Duration::from_secs(120))   // the front layer: republishes inside it are dropped
        .ack_wait(Duration::from_secs(30))
        .max_deliver(5);
    t.declare(&js).await?;

    // Consumer: ack only after the handler committed (or answered Duplicate).
    let db = pool.clone();
    let consumer = Consumer::new(js.clone(), "README_COUPONS", "deduct", move |m: nats::Message, msg: DeductCoupon| {
        let pool = db.clone();
        async move { deduct_from_stream(&pool, &m, &msg).await }   // key = "mq:{m.stream}:{m.message_id}"
    })
    .dead_letter_subject(&t.dead_letter_subject)
    .spawn()
    .await?;

    // Publisher: Nats-Msg-Id = the outbox msg_id; success only after the stream's ack.
    let publisher = Publisher::new(js.clone()).expected_stream("README_COUPONS");
    let relay = Relay::new(pool.clone()).route("readme.js.deduct", publisher.route()).spawn();
    // README: end
    until.await;
    relay.shutdown().await;
    consumer.shutdown().await
}
