//! A consumer group acting once, against the shared Redis and each
//! database: a state machine and a record subscribed to one consumer
//! (fan-out), every message written twice (a relay's retry after a lost
//! `XADD` reply) and ten of them three times, a quarter of the handlers'
//! commit acknowledgements lost, one coupon in six failing its first try.
//! Counted in the database: each coupon used once and awarded once;
//! every entry acknowledged (none pending), none dead-lettered.

use crate::common::hooks;
use crate::common::redis_streams::*;

async fn acts_once(backend: &str) {
    let _one = hooks::exclusive().await;
    let Some(client) = shared_redis().await else {
        return;
    };
    let Some((pool, d)) = database(backend).await else {
        return;
    };
    let stream = unique("idem_rs_once");
    let group = "effects";
    let coupons = coupons(&pool, d, 60).await;
    let publisher = Publisher::new(client.clone());
    publish(&publisher, &stream, &coupons, 2, |c| Use {
        coupon_id: c,
        fail_attempts: u32::from(c % 6 == 0),
    })
    .await;
    let first = &coupons[..10];
    publish(&publisher, &stream, first, 1, |c| Use {
        coupon_id: c,
        ..Use::default()
    })
    .await;

    let lost_before = idem_runtime::testing::lost_acks();
    idem_runtime::testing::set_lost_ack_rate(0.25);
    let running = consumer(&client, &stream, group, &pool, d, "solo")
        .spawn()
        .await
        .expect("consumer");
    wait_for(
        "every coupon used and awarded",
        Duration::from_secs(90),
        || {
            let (pool, coupons) = (&pool, &coupons);
            async move { done(pool, d, coupons).await == coupons.len() }
        },
    )
    .await;
    let expected = (coupons.len() * 2 + first.len()) as u64;
    wait_for("every entry settled", Duration::from_secs(30), || {
        let (_, e, dup, _, dead, _) = counts(&running);
        async move { e + dup + dead >= expected }
    })
    .await;
    idem_runtime::testing::set_lost_ack_rate(0.0);
    let c = counts(&running);
    running.shutdown().await.expect("clean shutdown");
    let left = pending(&client, &stream, group).await;
    let dead = entries(&client, &format!("{stream}:dlq")).await;
    delete(&client, &[&stream, &format!("{stream}:dlq")]).await;
    eprintln!(
        "redis streams acts once ({backend}): {expected} entries for {} coupons; (received, executed, duplicates, retried, dead, settle_failed) = {c:?}, lost acks {}",
        coupons.len(),
        idem_runtime::testing::lost_acks() - lost_before
    );

    assert_once(&pool, d, &coupons).await;
    assert_eq!(left, 0, "every entry acknowledged");
    assert!(dead.is_empty(), "nothing dead-lettered: {dead:?}");
    assert_eq!(c.4, 0, "nothing dead-lettered: {c:?}");
    let retried = coupons.iter().filter(|c| *c % 6 == 0).count() as u64;
    assert!(c.3 >= retried, "each failing coupon tried again: {c:?}");
    assert!(
        c.2 >= (coupons.len() + first.len()) as u64,
        "the copies answered Duplicate: {c:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acts_once_on_postgres() {
    acts_once("postgres").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acts_once_on_mariadb() {
    acts_once("mysql").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acts_once_on_sqlite() {
    acts_once("sqlite").await;
}
