//! The stream lost under a running consumer, as a Redis that keeps
//! nothing on disk loses it in a restart (here: `DEL`, on the shared
//! Redis), then written to again: the consumer's read answers `NOGROUP`,
//! it creates the group again from the start of the new stream, and the
//! entries written after the loss all act once. (What the lost stream
//! held unread would be gone: the reason to run streams on a Redis with
//! persistence.)

use crate::common::hooks;
use crate::common::redis_streams::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_stream_s_group_is_created_again_and_read_from_the_start() {
    let _one = hooks::shared().await;
    let Some(client) = shared_redis().await else {
        return;
    };
    let Some((pool, d)) = database("sqlite").await else {
        return;
    };
    let stream = unique("idem_rs_lost");
    let group = "effects";
    let coupons = coupons(&pool, d, 20).await;
    let (before, after) = coupons.split_at(10);
    let running = consumer(&client, &stream, group, &pool, d, "solo")
        .spawn()
        .await
        .expect("consumer");
    let publisher = Publisher::new(client.clone());
    let job = |c| Use {
        coupon_id: c,
        ..Use::default()
    };
    publish(&publisher, &stream, before, 1, job).await;
    wait_for(
        "the first ten acknowledged",
        Duration::from_secs(30),
        || {
            let (pool, client, stream) = (&pool, &client, &stream);
            async move {
                done(pool, d, before).await == before.len()
                    && pending(client, stream, group).await == 0
            }
        },
    )
    .await;
    // The loss: the stream and its group gone.
    delete(&client, &[&stream]).await;
    publish(&publisher, &stream, after, 1, job).await;
    wait_for(
        "the entries written after the loss acted on",
        Duration::from_secs(30),
        || {
            let (pool, client, stream) = (&pool, &client, &stream);
            async move {
                done(pool, d, after).await == after.len()
                    && pending(client, stream, group).await == 0
            }
        },
    )
    .await;
    let c = counts(&running);
    let failures = running.stats().pull_failures();
    running.shutdown().await.expect("clean shutdown");
    delete(&client, &[&stream, &format!("{stream}:dlq")]).await;
    eprintln!(
        "redis streams, stream lost: (received, executed, duplicates, retried, dead, settle_failed) = {c:?}, reads failed {failures}"
    );
    assert_once(&pool, d, &coupons).await;
    assert_eq!(c.4, 0, "nothing dead-lettered: {c:?}");
}
