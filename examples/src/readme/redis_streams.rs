//! README, "Redis Streams consumption and publishing": the relay writes
//! the outbox to a stream with `XADD`, a consumer group runs a handler
//! keyed by the entry's `msg_id` field (`{m.stream}:{m.msg_id}`, the
//! outbox msg_id), and `XACK`s only after the handler's transaction.

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

/// The consumer's handler: the deduction keyed by the entry's msg_id.
#[idempotent(
    key = "rs:{m.stream}:{m.msg_id}",
    strategy = state_machine,
    table = "readme_coupon",
    id = msg.coupon_id,
    from = CouponState::Unused,
    to = CouponState::Used,
)]
pub async fn deduct_from_redis_stream(
    tx: &mut PgConnection,
    m: &idem_runtime::redis_streams::Message,
    msg: &DeductCoupon,
) -> Result<(), sqlx::Error> {
    sqlx::query("INSERT INTO readme_deduction (coupon_id, order_id) VALUES ($1, $2)")
        .bind(msg.coupon_id)
        .bind(msg.order_id)
        .execute(&mut *tx)
        .await?;
    Ok(())
}

/// Starts the consumer and the publishing relay on the Redis at
/// `redis_url`, and stops both once `until` completes.
pub async fn consume_and_publish(pool: PgPool, redis_url: &str, until: impl Future<Output = ()>) -> Result<(), Error> {
    // README: redis_streams
    use idem_runtime::redis_streams::{self, Consumer, Publisher};

    let redis = redis_streams::client(redis_url)?;

    // Consumer: the group created if missing (XGROUP CREATE … MKSTREAM);
    // XACK only after the handler committed (or answered Duplicate).
    let db = pool.clone();
    let consumer = Consumer::new(redis.clone(), "readme.rs.deduct", "deduct", move |m: redis_streams::Message, msg: DeductCoupon| {
        let pool = db.clone();
        async move { deduct_from_redis_stream(&pool, &m, &msg).await }   // key = "rs:{m.stream}:{m.msg_id}"
    })
    .max_attempts(5)                                                   // then XADD readme.rs.deduct:dlq
    .backoff(Duration::from_secs(1), Duration::from_secs(60))
    .claim_after(Duration::from_secs(30))                              // XAUTOCLAIM a dead consumer's entries
    .spawn()
    .await?;

    // Publisher: XADD … msg_id <outbox msg_id> payload <json>; success
    // only once Redis answered the entry's id.
    let publisher = Publisher::new(redis).max_len(100_000);
    let relay = Relay::new(pool.clone()).route("readme.rs.deduct", publisher.route()).spawn();
    // README: end
    until.await;
    relay.shutdown().await;
    consumer.shutdown().await
}
