//! The outbox relay publishing to RocketMQ (`rocketmq::Publisher` as its
//! route) and a consumer group acting on what it published, on
//! PostgreSQL: with the broker's answer to a quarter of the messages'
//! first sends lost after the broker stored them (each a second copy of
//! its message in the topic, answered `Duplicate`) and a quarter of the
//! relay's and the handlers' commit acknowledgements lost; and with the
//! broker master killed (SIGKILL) and restarted on its store mid-run (the
//! relay's sends in the outage given back uncounted, nothing
//! dead-lettered). Counted in the database: each coupon used and awarded
//! once; every outbox row `success`.

use crate::common::hooks;
use crate::common::rocketmq::*;
use idem_runtime::outbox::{Delivery, Relay, enqueue};
use idem_testkit::cluster::rocketmq::RocketMq;

const QUEUES: u32 = 4;

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

async fn pending(pool: &AnyPool, d: Dialect, topic: &str) -> i64 {
    sqlx::query_scalar(sql(
        d,
        "SELECT COUNT(*) FROM idem_outbox WHERE topic = ? AND status <> 'success'",
    ))
    .bind(topic)
    .fetch_one(pool)
    .await
    .expect("pending")
}

async fn publisher(cluster: &RocketMq) -> Publisher {
    let runtime = rocketmq::runtime::shared().expect("the client runtime");
    Publisher::connect_with(
        cluster.namesrv_addr(),
        unique("r_relay_producer"),
        Some(cluster.client_options()),
        runtime,
    )
    .await
    .expect("publisher")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_publisher_loses_acknowledgements() {
    let _one = hooks::exclusive().await;
    let _servers = hooks::own_servers().await;
    let Some(cluster) = RocketMq::start() else {
        return;
    };
    let Some((pool, d)) = database("postgres").await else {
        return;
    };
    let namesrv = cluster.namesrv_addr();
    let topic = unique("r_relay_lost");
    cluster.create_topic(&topic, QUEUES).await;
    let coupons = enqueued(&pool, d, &topic, 80).await;
    idem_runtime::testing::set_lost_ack_rate(0.25);
    // The broker's answer to every fourth coupon's first send is lost
    // after the broker stored the message: the relay sends it again.
    let publisher = publisher(&cluster).await;
    let p = publisher.clone();
    let relay = Relay::new(pool.clone())
        .route(&topic, move |d: Delivery<Any>, u: Use| {
            let p = p.clone();
            async move {
                let m = d.message();
                p.publish(&m.topic, &m.msg_id, m.payload.as_bytes()).await?;
                if m.attempts == 1 && u.coupon_id % 4 == 0 {
                    return Err(Error::retryable("the broker's answer was lost"));
                }
                Ok(Outcome::Executed(()))
            }
        })
        .poll_interval(Duration::from_millis(20))
        .backoff(Duration::from_millis(20), Duration::from_millis(100))
        .spawn();
    let running = consumer(
        &namesrv,
        &unique("r_relay_lost_group"),
        &topic,
        &pool,
        d,
        "solo",
    )
    .spawn()
    .await
    .expect("consumer");
    wait_for("the outbox drained", Duration::from_secs(60), || {
        let (pool, topic) = (&pool, &topic);
        async move { pending(pool, d, topic).await == 0 }
    })
    .await;
    wait_for(
        "every coupon used and awarded",
        Duration::from_secs(60),
        || {
            let (pool, coupons) = (&pool, &coupons);
            async move { done(pool, d, coupons).await == coupons.len() }
        },
    )
    .await;
    // Every fourth coupon's message is in the topic twice.
    let copies = (coupons.len() + coupons.iter().filter(|c| *c % 4 == 0).count()) as u64;
    wait_for("every copy settled", Duration::from_secs(30), || {
        let (_, e, dup, ..) = counts(&running);
        async move { e + dup >= copies }
    })
    .await;
    idem_runtime::testing::set_lost_ack_rate(0.0);
    let c = counts(&running);
    let r = relay.stats().snapshot();
    relay.shutdown().await;
    publisher.shutdown().await;
    running.shutdown().await.expect("clean shutdown");
    eprintln!(
        "rocketmq publisher, lost acks: {} messages, {copies} copies; relay {r:?}; consumer (received, executed, duplicates, retried, dead, settle_failed) = {c:?}",
        coupons.len()
    );
    assert_once(&pool, d, &coupons).await;
    assert_eq!(c.4, 0, "no dead letter: {c:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_master_restarts_mid_run() {
    let _one = hooks::shared().await;
    let _servers = hooks::own_servers().await;
    let Some(mut cluster) = RocketMq::start() else {
        return;
    };
    let Some((pool, d)) = database("postgres").await else {
        return;
    };
    let namesrv = cluster.namesrv_addr();
    let topic = unique("r_restart");
    cluster.create_topic(&topic, QUEUES).await;
    let mut coupons = enqueued(&pool, d, &topic, 150).await;
    let publisher = publisher(&cluster).await;
    // Three attempts: an outage counted as attempts would dead-letter.
    let relay = Relay::new(pool.clone())
        .route(&topic, publisher.route())
        .max_attempts(3)
        .poll_interval(Duration::from_millis(20))
        .outage_retry(Duration::from_millis(500))
        .spawn();
    let running = consumer(
        &namesrv,
        &unique("r_restart_group"),
        &topic,
        &pool,
        d,
        "solo",
    )
    .client_options(cluster.client_options())
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
    cluster.kill9_master();
    let at_kill = done(&pool, d, &coupons).await;
    // Messages enqueued while the master is down: the relay's sends fail
    // in the outage until it is back.
    coupons.extend(enqueued(&pool, d, &topic, 150).await);
    wait_for(
        "the relay seeing the outage",
        Duration::from_secs(60),
        || {
            let outages = relay.stats().outages();
            async move { outages > 0 }
        },
    )
    .await;
    cluster.restart_master();
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
        let (pool, topic) = (&pool, &topic);
        async move { pending(pool, d, topic).await == 0 }
    })
    .await;
    let c = counts(&running);
    let r = relay.stats().snapshot();
    relay.shutdown().await;
    publisher.shutdown().await;
    running.shutdown().await.expect("clean shutdown");
    eprintln!(
        "rocketmq master restart: {} messages, {at_kill} done at the kill; relay {r:?}; consumer (received, executed, duplicates, retried, dead, settle_failed) = {c:?}",
        coupons.len()
    );
    assert_once(&pool, d, &coupons).await;
    assert_eq!(r.dead_lettered, 0, "no outbox message dead-lettered: {r:?}");
    assert_eq!(c.4, 0, "no message dead-lettered: {c:?}");
}
