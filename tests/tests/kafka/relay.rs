//! The outbox relay publishing to Kafka (`kafka::Publisher` as its route)
//! and a consumer group acting on what it published, on PostgreSQL: with
//! the broker's acknowledgement of a quarter of the messages' first sends
//! lost after the broker stored them (each a second copy of its message in
//! the topic, answered `Duplicate`) and a quarter of the relay's and the
//! handlers' commit acknowledgements lost, and with the
//! broker killed (SIGKILL) and restarted on its own storage mid-run (the
//! relay's sends in the outage given back uncounted, nothing
//! dead-lettered). Counted in the database: each coupon used and awarded
//! once; every outbox row `success`; every record's offset committed.

use crate::common::hooks;
use crate::common::kafka::*;
use idem_runtime::outbox::{Delivery, Relay, enqueue};
use idem_testkit::cluster::kafka::KafkaBroker;

const PARTITIONS: i32 = 3;

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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_publisher_loses_acknowledgements() {
    let _one = hooks::exclusive().await;
    let _servers = hooks::own_servers().await;
    let Some(broker) = KafkaBroker::start() else {
        return;
    };
    let Some((pool, d)) = database("postgres").await else {
        return;
    };
    let brokers = broker.bootstrap();
    let t = Topology::new(unique("k_relay_lost")).partitions(PARTITIONS);
    t.declare(&brokers).await.expect("declare");
    let coupons = enqueued(&pool, d, &t.topic, 80).await;
    let lost_before = idem_runtime::testing::lost_acks();
    idem_runtime::testing::set_lost_ack_rate(0.25);
    // The broker's acknowledgement of every fourth coupon's first send is
    // lost after the broker stored the record: the relay sends it again.
    let publisher = Publisher::new(&brokers).expect("publisher");
    let relay = Relay::new(pool.clone())
        .route(&t.topic, move |d: Delivery<Any>, u: Use| {
            let p = publisher.clone();
            async move {
                let m = d.message();
                let key = u.coupon_id.to_string();
                p.publish(&m.topic, &m.msg_id, Some(&key), m.payload.as_bytes())
                    .await?;
                if m.attempts == 1 && u.coupon_id % 4 == 0 {
                    return Err(Error::retryable("the broker's acknowledgement was lost"));
                }
                Ok(Outcome::Executed(()))
            }
        })
        .poll_interval(Duration::from_millis(20))
        .backoff(Duration::from_millis(20), Duration::from_millis(100))
        .spawn();
    let group = unique("k_relay_lost_group");
    let running = consumer(&brokers, &group, &t.topic, &pool, d, "solo")
        .spawn()
        .await
        .expect("consumer");
    wait_for("the outbox drained", Duration::from_secs(60), || {
        let (pool, topic) = (&pool, &t.topic);
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
    idem_runtime::testing::set_lost_ack_rate(0.0);
    let copies = records(&brokers, &t.topic, PARTITIONS);
    wait_for("every copy settled", Duration::from_secs(30), || {
        let (_, e, dup, ..) = counts(&running);
        async move { (e + dup) as i64 >= copies }
    })
    .await;
    let c = counts(&running);
    let r = relay.stats().snapshot();
    relay.shutdown().await;
    running.shutdown().await.expect("clean shutdown");
    let lost = idem_runtime::testing::lost_acks() - lost_before;
    eprintln!(
        "kafka publisher, lost acks: {} messages, {copies} records in the topic, {lost} acks lost; relay {r:?}; consumer (received, executed, duplicates, retried, dead, settle_failed) = {c:?}",
        coupons.len()
    );
    assert!(
        copies > coupons.len() as i64,
        "lost acknowledgements made the relay publish again: {copies} records for {} messages",
        coupons.len()
    );
    assert_once(&pool, d, &coupons).await;
    assert_eq!(c.4, 0, "no dead letter: {c:?}");
    assert_committed(&brokers, &group, &t.topic, PARTITIONS);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_broker_restarts_mid_run() {
    let _one = hooks::shared().await;
    let _servers = hooks::own_servers().await;
    let Some(mut broker) = KafkaBroker::start() else {
        return;
    };
    let Some((pool, d)) = database("postgres").await else {
        return;
    };
    let brokers = broker.bootstrap();
    let t = Topology::new(unique("k_restart")).partitions(PARTITIONS);
    t.declare(&brokers).await.expect("declare");
    let mut coupons = enqueued(&pool, d, &t.topic, 150).await;
    let publisher = Publisher::new(&brokers)
        .expect("publisher")
        .key_field("coupon_id")
        .timeout(Duration::from_secs(2))
        .expect("publisher");
    // Three attempts: an outage counted as attempts would dead-letter.
    let relay = Relay::new(pool.clone())
        .route(&t.topic, publisher.route())
        .max_attempts(3)
        .poll_interval(Duration::from_millis(20))
        .outage_retry(Duration::from_millis(500))
        .spawn();
    let group = unique("k_restart_group");
    let running = consumer(&brokers, &group, &t.topic, &pool, d, "solo")
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
    broker.kill9();
    let at_kill = done(&pool, d, &coupons).await;
    // Messages enqueued while the broker is down: the relay's sends fail
    // in the outage until it is back.
    coupons.extend(enqueued(&pool, d, &t.topic, 150).await);
    wait_for(
        "the relay seeing the outage",
        Duration::from_secs(60),
        || {
            let outages = relay.stats().outages();
            async move { outages > 0 }
        },
    )
    .await;
    broker.restart();
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
        let (pool, topic) = (&pool, &t.topic);
        async move { pending(pool, d, topic).await == 0 }
    })
    .await;
    let copies = records(&brokers, &t.topic, PARTITIONS);
    wait_for("every record settled", Duration::from_secs(30), || {
        let (_, e, dup, ..) = counts(&running);
        async move { (e + dup) as i64 >= copies }
    })
    .await;
    let c = counts(&running);
    let r = relay.stats().snapshot();
    relay.shutdown().await;
    running.shutdown().await.expect("clean shutdown");
    eprintln!(
        "kafka broker restart: {} messages, {at_kill} done at the kill, {copies} records; relay {r:?}; consumer (received, executed, duplicates, retried, dead, settle_failed) = {c:?}",
        coupons.len()
    );
    assert_once(&pool, d, &coupons).await;
    assert_eq!(r.dead_lettered, 0, "no outbox message dead-lettered: {r:?}");
    assert_eq!(c.4, 0, "no record dead-lettered: {c:?}");
    assert_committed(&brokers, &group, &t.topic, PARTITIONS);
}
