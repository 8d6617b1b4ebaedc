//! A consumer group acting once, against a RocketMQ name server and
//! broker of the test's own and each database: a state machine and a
//! record subscribed to one consumer (fan-out), every message published
//! twice (a producer's second copy after a lost answer), a quarter of the
//! handlers' commit acknowledgements lost, messages that fail their first
//! attempt (run again in place) and a poison message (dead-lettered to
//! `%DLQ%{group}` with its reason while its queue goes on). Counted in the
//! database: each coupon used once and awarded once. The control runs a
//! plain handler on the same messages and counts the doubled effects the
//! assertions would catch.

use crate::common::hooks;
use crate::common::rocketmq::*;
use idem_testkit::cluster::rocketmq::RocketMq;

const QUEUES: u32 = 4;

async fn acts_once(backend: &str) {
    let _one = hooks::exclusive().await;
    let _servers = hooks::own_servers().await;
    let Some(cluster) = RocketMq::start() else {
        return;
    };
    let Some((pool, d)) = database(backend).await else {
        return;
    };
    let namesrv = cluster.namesrv_addr();
    let topic = unique("r_once");
    cluster.create_topic(&topic, QUEUES).await;
    let coupons = coupons(&pool, d, 40).await;
    let publisher = Publisher::connect(&namesrv).await.expect("publisher");
    // Every message twice; one coupon in six fails its first attempt.
    publish(&publisher, &topic, &coupons, 2, |c| Use {
        coupon_id: c,
        fail_attempts: u32::from(c % 6 == 0),
        ..Use::default()
    })
    .await;
    // A poison message between the others: JSON, but not a `Use`.
    publisher
        .publish(&topic, "poison-1", br#"{"coupon": "none"}"#)
        .await
        .expect("publish the poison message");
    let first = &coupons[..10];
    publish(&publisher, &topic, first, 1, |c| Use {
        coupon_id: c,
        ..Use::default()
    })
    .await;

    let group = unique("r_once_group");
    // The dead-letter topic made and routed ahead, as where the broker
    // does not create topics on a first send (`autoCreateTopicEnable`
    // off): the reader below then finds its route when it starts, rather
    // than depending on when the broker registers a topic it created on
    // the dead letter's send.
    let dead_letters = format!("%DLQ%{group}");
    cluster.create_topic(&dead_letters, 1).await;
    idem_runtime::testing::set_lost_ack_rate(0.25);
    let running = consumer(&namesrv, &group, &topic, &pool, d, "solo")
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
    // Every message settled: the three copies of the first ten, two of
    // the rest, and the poison message.
    let expected = (coupons.len() * 2 + first.len()) as u64;
    wait_for("every message settled", Duration::from_secs(30), || {
        let (_, e, dup, _, dead, _) = counts(&running);
        async move { e + dup + dead > expected }
    })
    .await;
    idem_runtime::testing::set_lost_ack_rate(0.0);
    let c = counts(&running);
    running.shutdown().await.expect("clean shutdown");
    eprintln!(
        "rocketmq acts once ({backend}): (received, executed, duplicates, retried, dead, settle_failed) = {c:?}, lost acks {}",
        idem_runtime::testing::lost_acks()
    );

    assert_once(&pool, d, &coupons).await;
    let letters = read_topic(&cluster, &dead_letters, DEAD_REASON_PROPERTY, 1).await;
    assert_eq!(letters.len(), 1, "one dead letter: {letters:?}");
    assert_eq!(letters[0].0, br#"{"coupon": "none"}"#);
    assert!(
        letters[0].1.contains("unparsable payload"),
        "the reason: {}",
        letters[0].1
    );
    let retried = coupons.iter().filter(|c| *c % 6 == 0).count() as u64;
    assert!(c.3 >= retried, "each failing coupon retried: {c:?}");
    assert!(
        c.2 >= coupons.len() as u64,
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

/// The control: a plain handler (no idem) on the same copies counts a
/// coupon once per copy: the duplicates the tests above would catch.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn control_a_plain_handler_acts_on_every_copy() {
    let _one = hooks::shared().await;
    let _servers = hooks::own_servers().await;
    let Some(cluster) = RocketMq::start() else {
        return;
    };
    let Some((pool, d)) = database("sqlite").await else {
        return;
    };
    let namesrv = cluster.namesrv_addr();
    let topic = unique("r_control");
    cluster.create_topic(&topic, QUEUES).await;
    let coupons = coupons(&pool, d, 20).await;
    let publisher = Publisher::connect(&namesrv).await.expect("publisher");
    publish(&publisher, &topic, &coupons, 2, |c| Use {
        coupon_id: c,
        ..Use::default()
    })
    .await;
    let p = pool.clone();
    let running = Consumer::new(
        &namesrv,
        unique("r_control_group"),
        &topic,
        move |_m: Message, u: Use| {
            let pool = p.clone();
            async move {
                sqlx::query(sql(
                    d,
                    "INSERT INTO idem_r_award (coupon_id, owner) VALUES (?, 'plain')",
                ))
                .bind(u.coupon_id)
                .execute(&pool)
                .await?;
                Ok::<_, Error>(Outcome::Executed(()))
            }
        },
    )
    .spawn()
    .await
    .expect("consumer");
    let copies = coupons.len() as u64 * 2;
    wait_for("every copy handled", Duration::from_secs(60), || {
        let (_, e, ..) = counts(&running);
        async move { e >= copies }
    })
    .await;
    running.shutdown().await.expect("clean shutdown");
    let doubled = effects(&pool, d, &coupons)
        .await
        .iter()
        .filter(|(.., awards)| *awards > 1)
        .count();
    assert_eq!(
        doubled,
        coupons.len(),
        "every coupon awarded twice without idem"
    );
}
