//! Headers and ordering keys in RocketMQ messages: messages enqueued with
//! headers and an ordering key, forwarded by the relay with
//! `Publisher::route`, are read back by a consumer with every header as a
//! user property (`Message::property`, `Message::user_headers`) and the
//! key (`Message::ordering_key`); a key's messages share one queue (the
//! queue its hash selects), where round robin would have spread them. A
//! user header named like idem's own (`IDEM_MSG_ID`) or a RocketMQ system
//! property (`KEYS`) is not carried.

use crate::common::hooks;
use crate::common::rocketmq::*;
use idem_runtime::outbox::{EnqueueOptions, Relay, enqueue_with};
use idem_runtime::rocketmq::{MSG_ID_PROPERTY, ORDERING_KEY_PROPERTY, TOPIC_PROPERTY};
use idem_testkit::cluster::rocketmq::RocketMq;
use std::sync::{Arc, Mutex};

const QUEUES: u32 = 4;

/// Three messages of each ordering key (header `seq` 1 to 3), with user
/// headers named like idem's own and RocketMQ's, and one without a key.
async fn enqueued(pool: &AnyPool, topic: &str) {
    let mut tx = pool.begin().await.expect("begin");
    for key in ["order-42", "order-7"] {
        for n in 1..=3 {
            let options = EnqueueOptions::new()
                .ordering_key(key)
                .header("tenant", "acme")
                .header("seq", n.to_string())
                .header("IDEM_MSG_ID", "forged")
                .header("idem_topic", "forged")
                .header("KEYS", "forged");
            let payload = serde_json::json!({ "n": n });
            enqueue_with(&mut tx, topic, &format!("{key}-{n}"), &payload, &options)
                .await
                .expect("enqueue");
        }
    }
    let plain = EnqueueOptions::new().header("tenant", "globex");
    enqueue_with(&mut tx, topic, "plain", &serde_json::json!({}), &plain)
        .await
        .expect("enqueue");
    tx.commit().await.expect("commit");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_ordering_key_selects_the_queue_and_every_header_is_carried() {
    let _one = hooks::exclusive().await;
    let _servers = hooks::own_servers().await;
    let Some(cluster) = RocketMq::start() else {
        return;
    };
    let Some((pool, d)) = database("postgres").await else {
        return;
    };
    let namesrv = cluster.namesrv_addr();
    let topic = unique("r_headers");
    cluster.create_topic(&topic, QUEUES).await;
    enqueued(&pool, &topic).await;

    let runtime = rocketmq::runtime::shared().expect("the client runtime");
    let publisher = Publisher::connect_with(
        &namesrv,
        unique("r_headers_producer"),
        Some(cluster.client_options()),
        runtime,
    )
    .await
    .expect("publisher");
    let relay = Relay::new(pool.clone())
        .route(&topic, publisher.route())
        .poll_interval(Duration::from_millis(20))
        .spawn();
    idem_testkit::published(&pool, d, &topic, Duration::from_secs(60)).await;
    relay.shutdown().await;
    publisher.shutdown().await;

    let seen: Arc<Mutex<Vec<Message>>> = Arc::default();
    let s = seen.clone();
    let reader = Consumer::new(
        &namesrv,
        unique("idem_r_headers_reader"),
        &topic,
        move |m: Message, _: serde::de::IgnoredAny| {
            s.lock().unwrap().push(m);
            async move { Ok::<_, Error>(Outcome::Executed(())) }
        },
    )
    .spawn()
    .await
    .expect("a reader");
    wait_for("every message read", Duration::from_secs(30), || {
        let n = seen.lock().unwrap().len();
        async move { n >= 7 }
    })
    .await;
    reader.shutdown().await.expect("reader shutdown");
    let seen = seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 7, "{seen:?}");

    for key in ["order-42", "order-7"] {
        let mut of_key: Vec<&Message> = seen
            .iter()
            .filter(|m| m.ordering_key() == Some(key))
            .collect();
        assert_eq!(of_key.len(), 3, "{key}: {seen:?}");
        let queue = (&of_key[0].broker_name, of_key[0].queue_id);
        assert!(
            of_key.iter().all(|m| (&m.broker_name, m.queue_id) == queue),
            "{key}: one queue for the key: {of_key:?}"
        );
        // In the queue, in enqueue order.
        of_key.sort_by_key(|m| m.queue_offset);
        let seqs: Vec<&str> = of_key.iter().filter_map(|m| m.property("seq")).collect();
        assert_eq!(seqs, ["1", "2", "3"], "{key}");
        for m in &of_key {
            // Idem's properties hold the outbox's values.
            assert!(m.msg_id.starts_with(key), "{m:?}");
            assert_eq!(m.property(MSG_ID_PROPERTY), Some(m.msg_id.as_str()));
            assert_eq!(m.property(TOPIC_PROPERTY), Some(topic.as_str()));
            assert_eq!(m.property(ORDERING_KEY_PROPERTY), Some(key));
            assert_eq!(
                m.keys,
                std::slice::from_ref(&m.msg_id),
                "KEYS is idem's: {m:?}"
            );
            assert_eq!(m.property("idem_topic"), None);
            assert_eq!(m.property("tenant"), Some("acme"));
            let user = m.user_headers();
            assert_eq!(user.get("tenant").map(String::as_str), Some("acme"));
            assert!(user.contains_key("seq"), "{user:?}");
            assert!(
                user.keys()
                    .all(|k| !k.to_ascii_uppercase().starts_with("IDEM_") && k != "KEYS"),
                "idem's and RocketMQ's own are no user headers: {user:?}"
            );
        }
    }
    let plain: Vec<&Message> = seen.iter().filter(|m| m.msg_id == "plain").collect();
    assert_eq!(plain.len(), 1);
    assert_eq!(plain[0].property("tenant"), Some("globex"));
    assert_eq!(plain[0].ordering_key(), None);
}
