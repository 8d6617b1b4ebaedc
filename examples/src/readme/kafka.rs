//! README, "Kafka consumption and publishing": the relay publishes the
//! outbox to a topic with the idempotent producer, a consumer group runs a
//! handler keyed by the message's id (`{m.topic}:{m.msg_id}`, the id being
//! the `Idem-Msg-Id` header = the outbox msg_id).

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

/// The consumer's handler: the deduction keyed by the message's id.
#[idempotent(
    key = "kafka:{m.topic}:{m.msg_id}",
    strategy = state_machine,
    table = "readme_coupon",
    id = msg.coupon_id,
    from = CouponState::Unused,
    to = CouponState::Used,
)]
pub async fn deduct_from_topic(
    tx: &mut PgConnection,
    m: &idem_runtime::kafka::Message,
    msg: &DeductCoupon,
) -> Result<(), sqlx::Error> {
    sqlx::query("INSERT INTO readme_deduction (coupon_id, order_id) VALUES ($1, $2)")
        .bind(msg.coupon_id)
        .bind(msg.order_id)
        .execute(&mut *tx)
        .await?;
    Ok(())
}

/// Creates the topics, starts the consumer and the publishing relay on
/// the broker at `brokers`, and stops both once `until` completes.
pub async fn consume_and_publish(pool: PgPool, brokers: &str, until: impl Future<Output = ()>) -> Result<(), Error> {
    // README: kafka
    use idem_runtime::kafka::{self, Consumer, Publisher, Topology};

    // readme.kafka.deduct, with its retry and dead-letter topics.
    Topology::new("readme.kafka.deduct").partitions(3).declare(brokers).await?;

    // Consumer: an offset is committed only after its record's handler
    // committed (or answered Duplicate), in order per partition.
    let db = pool.clone();
    let consumer = Consumer::new(brokers, "deduct", "readme.kafka.deduct", move |m: kafka::Message, msg: DeductCoupon| {
        let pool = db.clone();
        async move { deduct_from_topic(&pool, &m, &msg).await }   // key = "kafka:{m.topic}:{m.msg_id}"
    })
    .max_attempts(5)                                              // then readme.kafka.deduct.dlt
    .backoff(Duration::from_secs(1), Duration::from_secs(60))     // through readme.kafka.deduct.retry
    .spawn()
    .await?;

    // Publisher: idempotent producer, acks=all; one coupon's messages in
    // one partition; success only after the broker's acknowledgement.
    let publisher = Publisher::new(brokers)?.key_field("coupon_id");
    let relay = Relay::new(pool.clone()).route("readme.kafka.deduct", publisher.route()).spawn();
    // README: end
    until.await;
    relay.shutdown().await;
    consumer.shutdown().await
}
