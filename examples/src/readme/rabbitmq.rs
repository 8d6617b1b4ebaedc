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

/// The second subscriber of the fanned-out queue: a notice, a record in a
/// scope of its own, keyed by the AMQP delivery.
#[idempotent(key = "mq-paid:{m.queue}:{m.message_id}", strategy = record, biz_type = "readme_mq_paid_notice")]
pub async fn notify_from_queue(
    tx: &mut PgConnection,
    m: &idem_runtime::amqp::Message,
    msg: &DeductCoupon,
) -> Result<(), sqlx::Error> {
    sqlx::query("INSERT INTO readme_notice (user_id, text) VALUES ($1, 'mq-paid')")
        .bind(msg.order_id)
        .execute(&mut *tx)
        .await?;
    Ok(())
}

/// One queue, two handlers: the relay publishes `readme.mq.paid`, the
/// fanned-out consumer deducts the coupon and sends the notice, each once;
/// both stop once `until` completes.
pub async fn consume_fanned_out(pool: PgPool, until: impl Future<Output = ()>) -> Result<(), Error> {
    use idem_runtime::amqp::{self, Consumer, Publisher, Topology};
    let conn = amqp::connect("amqp://guest:guest@127.0.0.1:5672/%2f").await?;
    Topology::new("readme.order.effects").bind("readme.orders", "readme.mq.paid").declare(&conn).await?;
    // README: rabbitmq_fanout
    let (p1, p2) = (pool.clone(), pool.clone());
    let consumer = Consumer::fan_out(conn.clone(), "readme.order.effects")
        .subscribe("deduct_coupon", move |m: amqp::Message, msg: DeductCoupon| {
            let pool = p1.clone();
            async move { deduct_from_queue(&pool, &m, &msg).await }
        })
        .subscribe("notify_paid", move |m: amqp::Message, msg: DeductCoupon| {
            let pool = p2.clone();
            async move { notify_from_queue(&pool, &m, &msg).await }
        })
        .spawn()
        .await?;
    // README: end
    let publisher = Publisher::new(conn.clone(), "readme.orders");
    let relay = Relay::new(pool.clone()).route("readme.mq.paid", publisher.route()).spawn();
    until.await;
    relay.shutdown().await;
    consumer.shutdown().await
}
