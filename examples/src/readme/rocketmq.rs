//! README, "RocketMQ consumption and publishing": the relay publishes the
//! outbox to a topic, marking each message only after the broker's
//! `SEND_OK`; a consumer group runs a handler keyed by the article's
//! `{topic}:{msgId}` (the msgId being the `IDEM_MSG_ID` property = the
//! outbox msg_id).

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
    key = "rocketmq:{m.topic}:{m.msg_id}",
    strategy = state_machine,
    table = "readme_coupon",
    id = msg.coupon_id,
    from = CouponState::Unused,
    to = CouponState::Used,
)]
pub async fn deduct_from_rocketmq(
    tx: &mut PgConnection,
    m: &idem_runtime::rocketmq::Message,
    msg: &DeductCoupon,
) -> Result<(), sqlx::Error> {
    sqlx::query("INSERT INTO readme_deduction (coupon_id, order_id) VALUES ($1, $2)")
        .bind(msg.coupon_id)
        .bind(msg.order_id)
        .execute(&mut *tx)
        .await?;
    Ok(())
}

/// Starts the consumer and the publishing relay through the name server
/// at `namesrv`, on `topic` (created with its queues beforehand, or by the
/// broker's auto-creation), and stops both once `until` completes.
pub async fn consume_and_publish(
    pool: PgPool,
    namesrv: &str,
    topic: &str,
    until: impl Future<Output = ()>,
) -> Result<(), Error> {
    // README: rocketmq
    use idem_runtime::rocketmq::{self, Consumer, Publisher};

    // Consumer: a queue's offset is committed only after its messages'
    // handlers committed (or answered Duplicate), in order per queue.
    let db = pool.clone();
    let consumer = Consumer::new(namesrv, "deduct", topic, move |m: rocketmq::Message, msg: DeductCoupon| {
        let pool = db.clone();
        async move { deduct_from_rocketmq(&pool, &m, &msg).await }   // key = "rocketmq:{m.topic}:{m.msg_id}"
    })
    .max_attempts(16)                                                // then %DLQ%deduct
    .backoff(Duration::from_secs(1), Duration::from_secs(60))        // retried in place, as orderly consumption does
    .spawn()
    .await?;

    // Publisher: each outbox message marked only after the broker's SEND_OK;
    // the outbox topic "readme.rocketmq.deduct" published to `topic`.
    let publisher = Publisher::connect(namesrv).await?.topic(topic);
    let relay = Relay::new(pool.clone()).route("readme.rocketmq.deduct", publisher.route()).spawn();
    // README: end
    until.await;
    relay.shutdown().await;
    publisher.shutdown().await;
    consumer.shutdown().await
}
