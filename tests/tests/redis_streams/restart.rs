//! Redis killed (SIGKILL) and restarted mid-run on its own append-only
//! file (`appendonly yes`, `appendfsync always`: the stream, the group
//! and its pending entries come back), under the outbox relay publishing
//! to it and the consumer reading it, on PostgreSQL. Messages are
//! enqueued while Redis is down; the test waits until both the relay's
//! publishes and the consumer's reads have failed in the outage before
//! Redis comes back. Both reconnect on their own; the relay gives the
//! publishes that failed in the outage back uncounted and the consumer
//! claims the entries whose `XACK` failed: every coupon used and awarded
//! once, nothing dead-lettered, nothing left pending.

use crate::common::hooks;
use crate::common::redis_streams::*;
use idem_runtime::outbox::{Relay, enqueue};
use idem_testkit::cluster::redis::RedisServer;

/// `n` coupons and their messages in the outbox, in one transaction.
async fn enqueued(pool: &AnyPool, d: Dialect, topic: &str, n: usize) -> Vec<i64> {
    let coupons = coupons(pool, d, n).await;
    let mut tx = pool.begin().await.expect("begin");
    for c in &coupons {
        let u = Use {
            coupon_id: *c,
            ..Use::default()
        };
        enqueue(
            &mut tx,
            topic,
            &format!("m-{c}"),
            &serde_json::to_value(&u).unwrap(),
        )
        .await
        .expect("enqueue");
    }
    tx.commit().await.expect("commit");
    coupons
}

async fn unpublished(pool: &AnyPool, d: Dialect, topic: &str) -> i64 {
    sqlx::query_scalar(sql(
        d,
        "SELECT COUNT(*) FROM idem_outbox WHERE topic = ? AND status <> 'success'",
    ))
    .bind(topic)
    .fetch_one(pool)
    .await
    .expect("unpublished")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_restarts_mid_run() {
    let _one = hooks::shared().await;
    let _servers = hooks::own_servers().await;
    let Some(mut server) = RedisServer::start_persistent() else {
        return;
    };
    let Some((pool, d)) = database("postgres").await else {
        return;
    };
    let client = redis_streams::client(&server.url()).expect("client");
    let stream = unique("idem_rs_restart");
    let group = "effects";
    let mut coupons = enqueued(&pool, d, &stream, 120).await;
    // Three attempts: an outage counted as attempts would dead-letter.
    let relay = Relay::new(pool.clone())
        .route(&stream, Publisher::new(client.clone()).route())
        .max_attempts(3)
        .poll_interval(Duration::from_millis(20))
        .outage_retry(Duration::from_millis(300))
        .spawn();
    let running = consumer(&client, &stream, group, &pool, d, "solo")
        .max_attempts(2)
        .spawn()
        .await
        .expect("consumer");
    wait_for(
        "a third of the coupons used",
        Duration::from_secs(60),
        || {
            let (pool, coupons) = (&pool, &coupons);
            async move { done(pool, d, coupons).await >= coupons.len() / 3 }
        },
    )
    .await;
    server.kill9();
    let at_kill = done(&pool, d, &coupons).await;
    let reads_before = running.stats().pull_failures();
    // Messages enqueued while Redis is down: the relay's publishes fail in
    // the outage until it is back.
    coupons.extend(enqueued(&pool, d, &stream, 120).await);
    wait_for(
        "the relay and the consumer seeing the outage",
        Duration::from_secs(60),
        || {
            let outages = relay.stats().outages();
            let reads = running.stats().pull_failures();
            async move { outages > 0 && reads > reads_before }
        },
    )
    .await;
    server.restart();
    wait_for(
        "every coupon used and awarded",
        Duration::from_secs(120),
        || {
            let (pool, coupons) = (&pool, &coupons);
            async move { done(pool, d, coupons).await == coupons.len() }
        },
    )
    .await;
    wait_for("the outbox drained", Duration::from_secs(60), || {
        let (pool, stream) = (&pool, &stream);
        async move { unpublished(pool, d, stream).await == 0 }
    })
    .await;
    wait_for("every entry acknowledged", Duration::from_secs(60), || {
        let (client, stream) = (&client, &stream);
        async move { pending(client, stream, group).await == 0 }
    })
    .await;
    let c = counts(&running);
    let claimed = running.claimed();
    let r = relay.stats().snapshot();
    relay.shutdown().await;
    running.shutdown().await.expect("clean shutdown");
    let stored = entries(&client, &stream).await.len();
    let dead = entries(&client, &format!("{stream}:dlq")).await;
    eprintln!(
        "redis streams, Redis restarted: {} messages, {at_kill} done at the kill, {stored} entries in the stream, {claimed} claimed; relay {r:?}; consumer (received, executed, duplicates, retried, dead, settle_failed) = {c:?}",
        coupons.len()
    );
    assert_once(&pool, d, &coupons).await;
    assert!(stored >= coupons.len(), "the stream survived the restart");
    assert_eq!(r.dead_lettered, 0, "no outbox message dead-lettered: {r:?}");
    assert_eq!(c.4, 0, "no entry dead-lettered: {c:?}");
    assert!(dead.is_empty(), "the dead-letter stream is empty: {dead:?}");
}
