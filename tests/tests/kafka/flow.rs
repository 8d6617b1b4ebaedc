//! A slow partition holds back only itself: two partitions, the first
//! one's records held by their handler (a gate the test opens), the
//! second's free. With a 16 KiB read-ahead per partition, the consumer
//! pauses fetching the held one and the free one's records all land
//! while none of the held one's has; then the gate opens and the held
//! partition, paused and resumed many times over, lands every record
//! once. Counted in the database; every offset committed.
//!
//! And a paused partition is fetched again after a rebalance gives it
//! back: librdkafka keeps a partition the application paused paused
//! across a revocation, so the consumer resumes what is revoked (without
//! it, the held partition never came back: the second test timed out).
//! And a retry copy due far off waits no longer than the longest
//! back-off (without the bound, its partition waited for the day).

use crate::common::hooks;
use crate::common::kafka::*;
use idem_testkit::cluster::kafka::KafkaBroker;
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};
use tokio::sync::watch;

/// Writes `u` to `partition` of `topic`, with its message id.
async fn send(p: &FutureProducer, topic: &str, partition: i32, u: &Use) {
    let body = serde_json::to_vec(u).unwrap();
    let id = format!("m-{}", u.coupon_id);
    let headers = OwnedHeaders::new().insert(Header {
        key: kafka::MSG_ID_HEADER,
        value: Some(&id),
    });
    let record = FutureRecord::<(), _>::to(topic)
        .partition(partition)
        .payload(&body)
        .headers(headers);
    p.send(record, Duration::from_secs(10))
        .await
        .map_err(|(e, _)| e)
        .expect("send");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_partition_holds_back_only_itself() {
    let _one = hooks::shared().await;
    let _servers = hooks::own_servers().await;
    let Some(broker) = KafkaBroker::start() else {
        return;
    };
    let Some((pool, d)) = database("postgres").await else {
        return;
    };
    let brokers = broker.bootstrap();
    let t = Topology::new(unique("k_flow")).partitions(2);
    t.declare(&brokers).await.expect("declare");
    let held = coupons(&pool, d, 400).await;
    let free = coupons(&pool, d, 100).await;
    let producer: FutureProducer = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", &brokers)
        .create()
        .expect("producer");
    for c in &held {
        let u = Use {
            coupon_id: *c,
            slow_ms: 1,
            ..Use::default()
        };
        send(&producer, &t.topic, 0, &u).await;
    }
    for c in &free {
        let u = Use {
            coupon_id: *c,
            ..Use::default()
        };
        send(&producer, &t.topic, 1, &u).await;
    }
    let (gate, opened) = watch::channel(false);
    let p = pool.clone();
    let group = unique("k_flow_group");
    let running = Consumer::new(&brokers, &group, &t.topic, move |m: Message, u: Use| {
        let (pool, mut opened) = (p.clone(), opened.clone());
        async move {
            if u.slow_ms > 0 {
                let _ = opened.wait_for(|open| *open).await;
            }
            award(&pool, &m, &u, d, "flow").await
        }
    })
    .buffer(16 * 1024)
    .max_in_flight(4)
    .spawn()
    .await
    .expect("consumer");
    let awarded = |coupons: &[i64]| {
        let (pool, lo, hi) = (pool.clone(), coupons[0], coupons[coupons.len() - 1]);
        async move {
            let n: i64 = sqlx::query_scalar(sql(
                d,
                "SELECT COUNT(*) FROM idem_k_award WHERE coupon_id BETWEEN ? AND ?",
            ))
            .bind(lo)
            .bind(hi)
            .fetch_one(&pool)
            .await
            .expect("awards");
            n as usize
        }
    };
    wait_for(
        "the free partition's records, the held one paused",
        Duration::from_secs(60),
        || async { awarded(&free).await == free.len() },
    )
    .await;
    assert_eq!(awarded(&held).await, 0, "the held partition's gate is shut");
    gate.send_replace(true);
    wait_for(
        "the held partition's records",
        Duration::from_secs(120),
        || async { awarded(&held).await == held.len() },
    )
    .await;
    until_committed(&brokers, &group, &t.topic, 2, Duration::from_secs(30)).await;
    let c = counts(&running);
    running.shutdown().await.expect("clean shutdown");
    eprintln!(
        "kafka flow: {} held and {} free records; (received, executed, duplicates, retried, dead, settle_failed) = {c:?}",
        held.len(),
        free.len()
    );
    assert_eq!(
        c.1,
        (held.len() + free.len()) as u64,
        "each record once: {c:?}"
    );
}

/// A member that joins `group`, polls until it has an assignment (the
/// group rebalanced), then leaves without committing anything.
fn join_and_leave(brokers: &str, group: &str, topic: &str) {
    use rdkafka::consumer::{BaseConsumer, Consumer as _};
    let c: BaseConsumer = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("group.id", group)
        .set("enable.auto.commit", "false")
        .set("session.timeout.ms", "6000")
        .set("heartbeat.interval.ms", "1000")
        .create()
        .expect("a second member");
    c.subscribe(&[topic]).expect("subscribe");
    let start = Instant::now();
    while c.assignment().map_or(0, |a| a.count()) == 0 {
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "the second member got no assignment"
        );
        let _ = c.poll(Duration::from_millis(100));
    }
    // Dropped: it leaves the group, and the group rebalances again.
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_partition_is_fetched_again_after_a_rebalance() {
    let _one = hooks::shared().await;
    let _servers = hooks::own_servers().await;
    let Some(broker) = KafkaBroker::start() else {
        return;
    };
    let Some((pool, d)) = database("postgres").await else {
        return;
    };
    let brokers = broker.bootstrap();
    let t = Topology::new(unique("k_flow_rebalance")).partitions(2);
    t.declare(&brokers).await.expect("declare");
    let held = coupons(&pool, d, 200).await;
    let free = coupons(&pool, d, 20).await;
    let producer: FutureProducer = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", &brokers)
        .create()
        .expect("producer");
    for c in &held {
        let u = Use {
            coupon_id: *c,
            slow_ms: 1,
            ..Use::default()
        };
        send(&producer, &t.topic, 0, &u).await;
    }
    for c in &free {
        let u = Use {
            coupon_id: *c,
            ..Use::default()
        };
        send(&producer, &t.topic, 1, &u).await;
    }
    let (gate, opened) = watch::channel(false);
    let p = pool.clone();
    let group = unique("k_flow_rebalance_group");
    let running = Consumer::new(&brokers, &group, &t.topic, move |m: Message, u: Use| {
        let (pool, mut opened) = (p.clone(), opened.clone());
        async move {
            if u.slow_ms > 0 {
                let _ = opened.wait_for(|open| *open).await;
            }
            award(&pool, &m, &u, d, "flow").await
        }
    })
    .buffer(16 * 1024)
    .max_in_flight(4)
    .set("session.timeout.ms", "6000")
    .set("heartbeat.interval.ms", "1000")
    .spawn()
    .await
    .expect("consumer");
    let awarded = |coupons: &[i64]| {
        let (pool, lo, hi) = (pool.clone(), coupons[0], coupons[coupons.len() - 1]);
        async move {
            let n: i64 = sqlx::query_scalar(sql(
                d,
                "SELECT COUNT(DISTINCT coupon_id) FROM idem_k_award WHERE coupon_id BETWEEN ? AND ?",
            ))
            .bind(lo)
            .bind(hi)
            .fetch_one(&pool)
            .await
            .expect("awards");
            n as usize
        }
    };
    // The free partition done: the held one's records are read, and the
    // partition paused (200 records weigh far more than 16 KiB).
    wait_for(
        "the free partition's records",
        Duration::from_secs(60),
        || async { awarded(&free).await == free.len() },
    )
    .await;
    // A member joins and leaves: two rebalances, after which this
    // consumer holds both partitions again.
    let (b, g, topic) = (brokers.clone(), group.clone(), t.topic.clone());
    tokio::task::spawn_blocking(move || join_and_leave(&b, &g, &topic))
        .await
        .expect("the second member");
    gate.send_replace(true);
    wait_for(
        "the held partition's records after the rebalances",
        Duration::from_secs(90),
        || async { awarded(&held).await == held.len() },
    )
    .await;
    until_committed(&brokers, &group, &t.topic, 2, Duration::from_secs(30)).await;
    let c = counts(&running);
    running.shutdown().await.expect("clean shutdown");
    eprintln!(
        "kafka flow across a rebalance: (received, executed, duplicates, retried, dead, settle_failed) = {c:?}"
    );
    assert_once_awarded(&pool, d, &held).await;
}

/// Every coupon of `coupons` awarded exactly once.
async fn assert_once_awarded(pool: &AnyPool, d: Dialect, coupons: &[i64]) {
    for (c, _, _, awards) in effects(pool, d, coupons).await {
        assert_eq!(awards, 1, "coupon {c} awarded {awards} times");
    }
}

/// A retry copy due in a day (written by hand, or by a clock that jumped)
/// runs after the consumer's longest back-off, not a day later.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_copy_due_far_off_waits_no_longer_than_the_longest_back_off() {
    let _one = hooks::shared().await;
    let _servers = hooks::own_servers().await;
    let Some(broker) = KafkaBroker::start() else {
        return;
    };
    let Some((pool, d)) = database("postgres").await else {
        return;
    };
    let brokers = broker.bootstrap();
    let t = Topology::new(unique("k_far_off"));
    t.declare(&brokers).await.expect("declare");
    let coupon = coupons(&pool, d, 1).await;
    let producer: FutureProducer = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", &brokers)
        .create()
        .expect("producer");
    let in_a_day = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis()
        + 86_400_000;
    let (id, due) = (format!("m-{}", coupon[0]), in_a_day.to_string());
    let headers = OwnedHeaders::new()
        .insert(Header {
            key: kafka::MSG_ID_HEADER,
            value: Some(&id),
        })
        .insert(Header {
            key: kafka::ORIGIN_TOPIC_HEADER,
            value: Some(&t.topic),
        })
        .insert(Header {
            key: kafka::ATTEMPT_HEADER,
            value: Some("2"),
        })
        .insert(Header {
            key: kafka::NOT_BEFORE_HEADER,
            value: Some(&due),
        });
    let body = serde_json::to_vec(&Use {
        coupon_id: coupon[0],
        ..Use::default()
    })
    .unwrap();
    producer
        .send(
            FutureRecord::<(), _>::to(&t.retry_topic)
                .payload(&body)
                .headers(headers),
            Duration::from_secs(10),
        )
        .await
        .map_err(|(e, _)| e)
        .expect("send");
    let running = consumer(
        &brokers,
        &unique("k_far_off_group"),
        &t.topic,
        &pool,
        d,
        "far",
    )
    .spawn()
    .await
    .expect("consumer");
    // The longest back-off is 200 ms (`consumer`): a day is cut to it.
    wait_for("the copy's effects", Duration::from_secs(30), || async {
        done(&pool, d, &coupon).await == 1
    })
    .await;
    running.shutdown().await.expect("clean shutdown");
    assert_once(&pool, d, &coupon).await;
}
