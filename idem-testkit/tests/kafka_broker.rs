//! The Kafka broker harness (`idem_testkit::cluster::kafka::KafkaBroker`)
//! on a real nisshi: a topic of 3 partitions made through CreateTopics, 30
//! keyed records with headers from an idempotent producer (`acks=all`),
//! read in a consumer group that commits by hand the offsets past the
//! first 20 records. The broker is then killed with SIGKILL and started
//! again on the same SQLite file: the committed offsets and all 30 records
//! are still there, the producer of before the crash sends again, and a
//! second consumer of the group starts at the committed offsets (it reads
//! the 10 records never committed and the new one, nothing committed).

use idem_testkit::cluster::kafka::KafkaBroker;
use idem_testkit::cluster::kafka::rdkafka::consumer::{CommitMode, Consumer, StreamConsumer};
use idem_testkit::cluster::kafka::rdkafka::message::{Header, Headers, Message, OwnedHeaders};
use idem_testkit::cluster::kafka::rdkafka::producer::{FutureProducer, FutureRecord};
use idem_testkit::cluster::kafka::rdkafka::{Offset, TopicPartitionList};
use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

/// Records produced before the crash.
const RECORDS: usize = 30;
/// The first records produced, whose offsets the first consumer commits.
const COMMITTED: usize = 20;
const PARTITIONS: i32 = 3;
/// Distinct keys: each is used by 3 of the 30 records.
const KEYS: usize = 10;
/// How long any one wait of the test may last.
const DEADLINE: Duration = Duration::from_secs(60);

/// A record as read back: where it is and what it holds.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Record {
    partition: i32,
    offset: i64,
    key: String,
    payload: String,
    /// The `n` header: the record's number in produce order.
    n: usize,
    /// Every header, in order.
    headers: Vec<(String, String)>,
}

fn key(n: usize) -> String {
    format!("key-{}", n % KEYS)
}

fn headers(n: usize) -> OwnedHeaders {
    OwnedHeaders::new()
        .insert(Header {
            key: "n",
            value: Some(&n.to_string()),
        })
        .insert(Header {
            key: "origin",
            value: Some("kafka_broker test"),
        })
}

fn read(m: &impl Message) -> Record {
    let text = |b: Option<&[u8]>| String::from_utf8(b.unwrap_or_default().to_vec()).unwrap();
    let headers: Vec<(String, String)> = m
        .headers()
        .map(|h| {
            h.iter()
                .map(|h| (h.key.to_owned(), text(h.value)))
                .collect()
        })
        .unwrap_or_default();
    let n = headers
        .iter()
        .find(|(k, _)| k == "n")
        .map(|(_, v)| v.parse().unwrap())
        .expect("the n header");
    Record {
        partition: m.partition(),
        offset: m.offset(),
        key: text(m.key()),
        payload: text(m.payload()),
        n,
        headers,
    }
}

async fn produce(producer: &FutureProducer, topic: &str, n: usize) -> Record {
    let (key, payload) = (key(n), format!("record {n}"));
    let record = FutureRecord::to(topic)
        .key(&key)
        .payload(&payload)
        .headers(headers(n));
    let delivery = producer
        .send(record, DEADLINE)
        .await
        .unwrap_or_else(|(e, _)| panic!("produce record {n}: {e}"));
    Record {
        partition: delivery.partition,
        offset: delivery.offset,
        key,
        payload,
        n,
        headers: vec![
            ("n".into(), n.to_string()),
            ("origin".into(), "kafka_broker test".into()),
        ],
    }
}

fn consumer(broker: &KafkaBroker, group: &str) -> StreamConsumer {
    broker
        .client_config()
        .set("group.id", group)
        .set("enable.auto.commit", "false")
        .set("auto.offset.reset", "earliest")
        .set("session.timeout.ms", "6000")
        .set("heartbeat.interval.ms", "1000")
        .create()
        .expect("create a consumer")
}

/// Receives until `want` records were read; panics on a record not in
/// `expected` (keyed by partition and offset) or after [`DEADLINE`].
async fn receive(
    consumer: &StreamConsumer,
    expected: &BTreeMap<(i32, i64), Record>,
    want: usize,
) -> BTreeMap<(i32, i64), Record> {
    let deadline = Instant::now() + DEADLINE;
    let mut got = BTreeMap::new();
    while got.len() < want {
        let left = deadline.saturating_duration_since(Instant::now());
        let message = tokio::time::timeout(left, consumer.recv())
            .await
            .unwrap_or_else(|_| panic!("{} of {want} records read in {DEADLINE:?}", got.len()))
            .expect("read a record");
        let record = read(&message);
        let at = (record.partition, record.offset);
        assert_eq!(
            expected.get(&at),
            Some(&record),
            "read a record not expected"
        );
        assert!(got.insert(at, record).is_none(), "read {at:?} twice");
    }
    got
}

fn partitions(topic: &str, offsets: &BTreeMap<i32, i64>) -> TopicPartitionList {
    let mut list = TopicPartitionList::new();
    for (&p, &offset) in offsets {
        list.add_partition_offset(topic, p, Offset::Offset(offset))
            .unwrap();
    }
    list
}

/// The group's committed offsets, asked until the coordinator answers.
fn committed(consumer: &StreamConsumer, topic: &str) -> BTreeMap<i32, i64> {
    let mut query = TopicPartitionList::new();
    for p in 0..PARTITIONS {
        query.add_partition(topic, p);
    }
    let deadline = Instant::now() + DEADLINE;
    loop {
        match consumer.committed_offsets(query.clone(), Duration::from_secs(10)) {
            Ok(list) => {
                return list
                    .elements()
                    .iter()
                    .map(|e| match e.offset() {
                        Offset::Offset(o) => (e.partition(), o),
                        other => panic!(
                            "partition {} has no committed offset: {other:?}",
                            e.partition()
                        ),
                    })
                    .collect();
            }
            Err(e) if Instant::now() < deadline => {
                eprintln!("committed offsets: {e}; asking again");
                std::thread::sleep(Duration::from_millis(200));
            }
            Err(e) => panic!("committed offsets: {e}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_and_committed_offsets_survive_a_broker_crash() {
    let Some(mut broker) = KafkaBroker::start() else {
        return;
    };
    let topic = idem_testkit::unique("orders");
    let group = idem_testkit::unique("billing");
    broker.create_topic(&topic, PARTITIONS).await;

    let producer: FutureProducer = broker
        .client_config()
        .set("enable.idempotence", "true")
        .set("acks", "all")
        .create()
        .expect("create the producer");
    let mut produced = BTreeMap::new();
    for n in 0..RECORDS {
        let record = produce(&producer, &topic, n).await;
        produced.insert((record.partition, record.offset), record);
    }
    // Each key in one partition, every partition used.
    let mut placed: BTreeMap<&str, BTreeSet<i32>> = BTreeMap::new();
    for r in produced.values() {
        placed.entry(&r.key).or_default().insert(r.partition);
    }
    assert!(
        placed.values().all(|ps| ps.len() == 1),
        "a key in two partitions: {placed:?}"
    );
    let used: BTreeSet<i32> = produced.keys().map(|&(p, _)| p).collect();
    assert_eq!(used.len(), 3, "partitions used: {used:?}");

    // The first member reads all 30 and commits past the first 20.
    let first = consumer(&broker, &group);
    first.subscribe(&[&topic]).unwrap();
    let begun = Instant::now();
    let read_first = receive(&first, &produced, RECORDS).await;
    eprintln!("first consumer: 30 records in {:?}", begun.elapsed());
    let mut commit: BTreeMap<i32, i64> = (0..PARTITIONS).map(|p| (p, 0)).collect();
    for r in read_first.values().filter(|r| r.n < COMMITTED) {
        let next = commit.get_mut(&r.partition).unwrap();
        *next = (*next).max(r.offset + 1);
    }
    first
        .commit(&partitions(&topic, &commit), CommitMode::Sync)
        .expect("commit");
    assert_eq!(committed(&first, &topic), commit);
    drop(first);

    broker.kill9();
    broker.restart();

    // The offsets and the records are still there.
    let second = consumer(&broker, &group);
    assert_eq!(
        committed(&second, &topic),
        commit,
        "committed offsets after the crash"
    );
    let mut ends = BTreeMap::new();
    for p in 0..PARTITIONS {
        let (low, high) = second
            .fetch_watermarks(&topic, p, Duration::from_secs(10))
            .expect("watermarks");
        assert_eq!(low, 0, "partition {p}'s first offset");
        ends.insert(p, high);
    }
    let mut stored = BTreeMap::new();
    for &(p, _) in produced.keys() {
        *stored.entry(p).or_insert(0) += 1;
    }
    assert_eq!(ends, stored, "records per partition after the crash");
    let reader = consumer(&broker, &idem_testkit::unique("reader"));
    let mut everything = TopicPartitionList::new();
    for p in 0..PARTITIONS {
        everything
            .add_partition_offset(&topic, p, Offset::Beginning)
            .unwrap();
    }
    reader.assign(&everything).unwrap();
    let all = receive(&reader, &produced, RECORDS).await;
    assert_eq!(all, produced, "0 records lost");
    drop(reader);

    // The producer of before the crash goes on.
    let after = produce(&producer, &topic, RECORDS).await;
    assert_eq!(
        after.offset, ends[&after.partition],
        "the record produced after the restart"
    );

    // The second member starts at the committed offsets: the 10 records
    // never committed and the new one, nothing committed.
    let mut rest: BTreeMap<(i32, i64), Record> = produced
        .into_iter()
        .filter(|(_, r)| r.n >= COMMITTED)
        .collect();
    rest.insert((after.partition, after.offset), after);
    assert!(rest.keys().all(|(p, o)| *o >= commit[p]));
    second.subscribe(&[&topic]).unwrap();
    let begun = Instant::now();
    let read_second = receive(&second, &rest, rest.len()).await;
    eprintln!(
        "second consumer: {} records in {:?}",
        read_second.len(),
        begun.elapsed()
    );
    assert_eq!(read_second, rest);
}
