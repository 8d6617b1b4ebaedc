//! Headers and ordering keys in Kafka records: messages enqueued with
//! headers and an ordering key, forwarded by the relay with
//! `Publisher::route`, are records whose key is the ordering key (one
//! partition for the key) and whose headers hold every header, read back
//! with librdkafka's own consumer; a user header named like idem's own
//! (`Idem-Msg-Id`, `Idem-Topic`) or `content-type` is not carried, so the
//! record has idem's, once.

use crate::common::hooks;
use crate::common::kafka::*;
use idem_runtime::kafka::{MSG_ID_HEADER, ORDERING_KEY_HEADER, TOPIC_HEADER};
use idem_runtime::outbox::{EnqueueOptions, Relay, enqueue_with};
use idem_testkit::cluster::kafka::KafkaBroker;
use rdkafka::consumer::{BaseConsumer, Consumer as _};
use rdkafka::message::{Headers as _, Message as _};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};

const PARTITIONS: i32 = 3;

/// A record as read back: (partition, key, headers in order, payload).
type Record = (i32, Option<String>, Vec<(String, String)>, Vec<u8>);

/// The first `expect` records of `topic`, read from the start (20 s at
/// most).
fn records_of(brokers: &str, topic: &str, expect: usize) -> Vec<Record> {
    let c: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("group.id", unique("idem-k-headers"))
        .set("enable.auto.commit", "false")
        .create()
        .expect("a reading client");
    let mut tpl = TopicPartitionList::new();
    for p in 0..PARTITIONS {
        tpl.add_partition_offset(topic, p, Offset::Beginning)
            .unwrap();
    }
    c.assign(&tpl).expect("assign");
    let text = |b: &[u8]| String::from_utf8(b.to_vec()).expect("UTF-8");
    let mut out = Vec::new();
    let start = Instant::now();
    while out.len() < expect && start.elapsed() < Duration::from_secs(20) {
        let Some(Ok(m)) = c.poll(Duration::from_millis(200)) else {
            continue;
        };
        let headers = m.headers().map_or_else(Vec::new, |h| {
            h.iter()
                .map(|h| (h.key.to_owned(), text(h.value.unwrap_or_default())))
                .collect()
        });
        out.push((
            m.partition(),
            m.key().map(text),
            headers,
            m.payload().unwrap_or_default().to_vec(),
        ));
    }
    out
}

/// Four messages of ordering key `order-42` (header `seq` 1 to 4), with
/// user headers named like idem's own, and one without a key.
async fn enqueued(pool: &AnyPool, topic: &str) {
    let mut tx = pool.begin().await.expect("begin");
    for n in 1..=4 {
        let options = EnqueueOptions::new()
            .ordering_key("order-42")
            .header("tenant", "acme")
            .header("seq", n.to_string())
            .header("Idem-Msg-Id", "forged")
            .header("idem-topic", "forged")
            .header("Content-Type", "text/plain");
        let payload = serde_json::json!({ "n": n });
        enqueue_with(&mut tx, topic, &format!("k-{n}"), &payload, &options)
            .await
            .expect("enqueue");
    }
    let plain = EnqueueOptions::new().header("tenant", "globex");
    enqueue_with(&mut tx, topic, "plain", &serde_json::json!({}), &plain)
        .await
        .expect("enqueue");
    tx.commit().await.expect("commit");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_ordering_key_is_the_record_key_and_every_header_is_carried() {
    let _one = hooks::exclusive().await;
    let _servers = hooks::own_servers().await;
    let Some(broker) = KafkaBroker::start() else {
        return;
    };
    let Some((pool, d)) = database("postgres").await else {
        return;
    };
    let brokers = broker.bootstrap();
    let t = Topology::new(unique("k_headers")).partitions(PARTITIONS);
    t.declare(&brokers).await.expect("declare");
    let topic = t.topic.clone();
    enqueued(&pool, &topic).await;

    let publisher = Publisher::new(&brokers).expect("publisher");
    let relay = Relay::new(pool.clone())
        .route(&topic, publisher.route())
        .poll_interval(Duration::from_millis(20))
        .spawn();
    idem_testkit::published(&pool, d, &topic, Duration::from_secs(60)).await;
    relay.shutdown().await;

    let read = records_of(&brokers, &topic, 5);
    assert_eq!(read.len(), 5, "{read:?}");
    let named = |h: &[(String, String)], name: &str| -> Vec<String> {
        h.iter()
            .filter(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.clone())
            .collect()
    };
    let keyed: Vec<&Record> = read
        .iter()
        .filter(|r| r.1.as_deref() == Some("order-42"))
        .collect();
    assert_eq!(
        keyed.len(),
        4,
        "the ordering key is the record key: {read:?}"
    );
    assert!(
        keyed.iter().all(|r| r.0 == keyed[0].0),
        "one key, one partition: {read:?}"
    );
    // In the partition, in enqueue order.
    let seqs: Vec<Vec<String>> = keyed.iter().map(|r| named(&r.2, "seq")).collect();
    assert_eq!(seqs, [["1"], ["2"], ["3"], ["4"]]);
    for (partition, _, h, _) in &keyed {
        let msg_id = named(h, MSG_ID_HEADER);
        assert_eq!(
            msg_id.len(),
            1,
            "idem's id only, partition {partition}: {h:?}"
        );
        assert!(msg_id[0].starts_with("k-"), "{h:?}");
        assert_eq!(named(h, TOPIC_HEADER), std::slice::from_ref(&topic));
        assert_eq!(named(h, "content-type"), ["application/json"]);
        assert_eq!(named(h, ORDERING_KEY_HEADER), ["order-42"]);
        assert_eq!(named(h, "tenant"), ["acme"]);
        // idem's headers come first.
        assert_eq!(h[0].0, MSG_ID_HEADER);
    }
    let plain: Vec<&Record> = read
        .iter()
        .filter(|r| r.1.as_deref() == Some("plain"))
        .collect();
    assert_eq!(
        plain.len(),
        1,
        "without a key, the msg_id is the record key: {read:?}"
    );
    assert_eq!(named(&plain[0].2, "tenant"), ["globex"]);
    assert!(named(&plain[0].2, ORDERING_KEY_HEADER).is_empty());
}
