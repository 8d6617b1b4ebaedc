//! README, "RabbitMQ consumption and publishing": the relay publishes the
//! outbox to RabbitMQ, the consumer runs a handler keyed by the AMQP
//! delivery (`{m.queue}:{m.message_id}`).

use super::state_machine::DeductCoupon;
use idem_runtime::outbox::Relay;
use idem_runtime::{Error, State, idempotent};
use sqlx::{PgConnection, PgPool};
use std::future::Future;

#[derive(Clone, Copy, State)]
enum CouponState {
    Unused,
    Used,
}

/// The consumer's handler: the deduction keyed by the AMQP delivery.
#[idempotent(
    key = "mq:{m.queue}:{m.message_id}",
    strategy = state_machine,
    table = "readme_coupon",
    id = msg.coupon_id,
    from = CouponState::Unused,
    to = CouponState::Used,
)]
pub async fn deduct_from_queue(
    tx: &mut PgConnection,
    m: &idem_runtime::amqp::Message,
    msg: &DeductCoupon,
) -> Result<(), sqlx::Error> {
    sqlx::query("INSERT INTO readme_deduction (coupon_id, order_id) VALUES ($1, $2)")
        .bind(msg.coupon_id)
        .bind(msg.order_id)
        .execute(&mut *tx)
        .await?;
    Ok(())
}

/// Declares the topology, starts the consumer and the publishing relay,
/// and stops both once `until` completes.
pub async fn consume_and_publish(pool: PgPool, until: impl Future<Output = ()>) -> Result<(), Error> {
    // README: rabbitmq
    use idem_runtime::amqp::{self, Consumer, Publisher, Topology};

    let conn = amqp::connect("amqp://guest:guest@127.0.0.1:5672/%2f").await?;
    Topology::new("readme.coupon.deduct").bind("readme.orders", "readme.mq.deduct").declare(&conn).await?;

    // Consumer: ack only after the handler committed (or answered Duplicate).
    let db = pool.clone();
    let consumer = Consumer::new(conn.clone(), "readme.coupon.deduct", move |m: amqp::Message, msg: DeductCoupon| {
        let pool = db.clone();
        async move { deduct_from_queue(&pool, &m, &msg).await }   // key = "mq:{m.queue}:{m.message_id}"
    })
    .prefetch(16)
    .max_attempts(5)
    .spawn()
    .await?;

    // Publisher: the outbox relay forwards messages with message_id = the outbox msg_id.
    let publisher = Publisher::new(conn.clone(), "readme.orders");
    let relay = Relay::new(pool.clone()).route("readme.mq.deduct", publisher.route()).spawn();
    // README: end
    until.await;
    relay.shutdown().await;
    consumer.shutdown().await
}
