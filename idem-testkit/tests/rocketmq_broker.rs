//! The RocketMQ harness (`idem_testkit::cluster::rocketmq::RocketMq`) on a
//! real rocketmq-rust 1.0.0 name server and broker.
//!
//! `produce_poll_commit_resume`: a topic of 4 queues, 40 keyed messages
//! with a user property from a `DefaultMQProducer`, all read by a lite
//! pull consumer (`DefaultLitePullConsumer`, auto commit off); it commits
//! the offsets past the first 20 (`commit_sync_with_map`, persisted) and
//! shuts down; a second consumer of the group gets exactly the 20 never
//! committed, and the broker reports the committed offsets.
//!
//! `master_killed_and_restarted`: a master and a slave; the facts of a
//! master crash and restart on the same store, in the module docs of
//! `cluster::rocketmq`.

use idem_testkit::cluster::rocketmq::RocketMq;
use idem_testkit::cluster::rocketmq::client::{
    ClientResult, DefaultLitePullConsumer, DefaultMQProducer,
};
use idem_testkit::cluster::rocketmq::model::common::consumer::consume_from_where::ConsumeFromWhere;
use idem_testkit::cluster::rocketmq::model::common::message::message_ext::MessageExt;
use idem_testkit::cluster::rocketmq::model::common::message::message_queue::MessageQueue;
use idem_testkit::cluster::rocketmq::model::common::message::message_single::Message;
use idem_testkit::cluster::rocketmq::model::result::{SendResult, SendStatus};
use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

/// How long any one wait of the tests may last.
const DEADLINE: Duration = Duration::from_secs(60);

/// A message as read back.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Got {
    queue: i32,
    offset: i64,
    key: String,
    body: String,
    tag: String,
    /// How many times it was read.
    reads: usize,
}

fn message(topic: &str, n: usize) -> Message {
    Message::builder()
        .topic(topic)
        .tags("idem")
        .key(format!("key-{n}"))
        .body_slice(format!("body-{n}").as_bytes())
        .raw_property("n", n.to_string())
        .expect("a user property")
        .build_unchecked()
}

async fn send(producer: &DefaultMQProducer, topic: &str, n: usize) -> ClientResult<SendResult> {
    let result = producer.send_with_timeout(message(topic, n), 3000).await?;
    Ok(result.expect("a synchronous send returns its result"))
}

/// The `n` property of a message read back.
fn n_of(m: &MessageExt) -> usize {
    m.properties()
        .get("n")
        .expect("the n property")
        .parse()
        .expect("a number")
}

async fn consumer(mq: &RocketMq, group: &str, topic: &str) -> DefaultLitePullConsumer {
    let consumer = DefaultLitePullConsumer::builder(
        idem_testkit::cluster::rocketmq::client_runtime("rocketmq-broker-test"),
    )
    .client_options(mq.client_options())
    .name_server_addr(mq.namesrv_addr())
    .consumer_group(group)
    .consume_from_where(ConsumeFromWhere::ConsumeFromFirstOffset)
    .auto_commit(false)
    .pull_batch_size(16)
    .poll_timeout_millis(200)
    // A pull parked at the broker (long polling) holds `shutdown` until it
    // returns: 20 s with the default, 2 s with this.
    .broker_suspend_max_time_millis(2000)
    .consumer_timeout_millis_when_suspend(5000)
    .build()
    .expect("build the consumer");
    consumer.subscribe(topic).await.expect("subscribe");
    consumer.start().await.expect("start the consumer");
    assert!(!consumer.is_auto_commit().await);
    consumer
}

/// Polls until `done` holds for what was read (by `n`) or `within` passed.
async fn poll_until(
    consumer: &DefaultLitePullConsumer,
    got: &mut BTreeMap<usize, Got>,
    within: Duration,
    done: impl Fn(&BTreeMap<usize, Got>) -> bool,
) -> bool {
    let deadline = Instant::now() + within;
    while !done(got) {
        if Instant::now() >= deadline {
            return false;
        }
        for m in consumer.poll_with_timeout(200).await {
            let body = m.body().map(|b| String::from_utf8_lossy(&b).into_owned());
            let entry = got.entry(n_of(&m)).or_insert_with(|| Got {
                queue: m.queue_id(),
                offset: m.queue_offset(),
                key: m
                    .properties()
                    .get("KEYS")
                    .map(ToString::to_string)
                    .unwrap_or_default(),
                body: body.unwrap_or_default(),
                tag: m.get_tags().map(|t| t.to_string()).unwrap_or_default(),
                reads: 0,
            });
            entry.reads += 1;
        }
    }
    true
}

/// Per queue, the offset just past the messages numbered below `below`
/// (sent in order, they are a prefix of each queue).
fn offsets_below(
    got: &BTreeMap<usize, Got>,
    below: usize,
    queues: &[MessageQueue],
) -> HashMap<MessageQueue, i64> {
    let mut offsets = HashMap::new();
    for mq in queues {
        let next = got
            .iter()
            .filter(|(n, g)| **n < below && g.queue == mq.queue_id())
            .map(|(_, g)| g.offset + 1)
            .max();
        if let Some(next) = next {
            offsets.insert(mq.clone(), next);
        }
    }
    offsets
}

async fn assigned(consumer: &DefaultLitePullConsumer) -> Vec<MessageQueue> {
    let mut queues: Vec<MessageQueue> = consumer
        .assignment()
        .await
        .expect("the assignment")
        .into_iter()
        .collect();
    queues.sort_by_key(MessageQueue::queue_id);
    queues
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn produce_poll_commit_resume() {
    const MESSAGES: usize = 40;
    const COMMITTED: usize = 20;
    let Some(mq) = RocketMq::start() else {
        return;
    };
    let topic = idem_testkit::unique("idem-rmq");
    let group = idem_testkit::unique("idem-rmq-group");
    mq.create_topic(&topic, 4).await;
    let mut producer = mq
        .producer(&idem_testkit::unique("idem-rmq-producer"))
        .await;
    for n in 0..MESSAGES {
        let result = send(&producer, &topic, n).await.expect("send");
        assert_eq!(result.send_status, SendStatus::SendOk);
        assert!(result.msg_id.is_some_and(|id| !id.is_empty()));
    }

    let begun = Instant::now();
    let first = consumer(&mq, &group, &topic).await;
    let mut got = BTreeMap::new();
    let all = poll_until(&first, &mut got, DEADLINE, |g| g.len() == MESSAGES).await;
    eprintln!(
        "timing: the first consumer read all in {:?}",
        begun.elapsed()
    );
    assert!(all, "read {} of {MESSAGES}\n{}", got.len(), mq.log_tail(20));
    let queues = assigned(&first).await;
    assert_eq!(queues.len(), 4, "{queues:?}");
    for (n, g) in &got {
        assert_eq!(g.reads, 1, "message {n} read twice");
        assert_eq!(g.key, format!("key-{n}"));
        assert_eq!(g.body, format!("body-{n}"));
        assert_eq!(g.tag, "idem");
    }
    let commit = offsets_below(&got, COMMITTED, &queues);
    assert_eq!(commit.len(), 4, "the first 20 are on every queue");
    first.commit_sync_with_map(commit.clone(), true).await;
    for (queue, offset) in &commit {
        let committed = first.committed(queue).await.expect("committed offset");
        assert_eq!(committed, *offset, "{queue:?}");
    }
    let begun = Instant::now();
    first.shutdown().await;
    eprintln!("timing: shutdown in {:?}", begun.elapsed());
    let begun = Instant::now();

    let second = consumer(&mq, &group, &topic).await;
    let mut again = BTreeMap::new();
    let rest = poll_until(&second, &mut again, DEADLINE, |g| {
        g.len() == MESSAGES - COMMITTED
    })
    .await;
    assert!(rest, "read {:?} of the 20 not committed", again.keys());
    eprintln!(
        "timing: the second consumer read the rest in {:?}",
        begun.elapsed()
    );
    // Nothing more comes: the committed ones are not redelivered.
    poll_until(&second, &mut again, Duration::from_secs(2), |_| false).await;
    let expected: Vec<usize> = (COMMITTED..MESSAGES).collect();
    assert_eq!(again.keys().copied().collect::<Vec<_>>(), expected);
    for (n, g) in &again {
        assert_eq!(Some(g.offset), got.get(n).map(|g| g.offset));
    }
    second.shutdown().await;
    producer.shutdown().await;
}

/// Sends `ns` until each is stored or `within` passed; returns how long
/// the first success took and the first error seen.
async fn send_until_ok(
    producer: &DefaultMQProducer,
    topic: &str,
    ns: std::ops::Range<usize>,
    within: Duration,
) -> (Option<Duration>, Option<String>) {
    let begun = Instant::now();
    let mut first_ok = None;
    let mut first_error = None;
    for n in ns {
        loop {
            match send(producer, topic, n).await {
                Ok(r) if r.send_status == SendStatus::SendOk => {
                    first_ok.get_or_insert(begun.elapsed());
                    break;
                }
                Ok(r) => {
                    first_error.get_or_insert(format!("{:?}", r.send_status));
                }
                Err(e) => {
                    first_error.get_or_insert(format!("{e}"));
                }
            }
            if begun.elapsed() > within {
                return (first_ok, first_error);
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    (first_ok, first_error)
}

fn numbers(got: &BTreeMap<usize, Got>) -> String {
    let ns: Vec<usize> = got.keys().copied().collect();
    match (ns.first(), ns.last()) {
        (Some(a), Some(b)) if b - a + 1 == ns.len() => format!("{a}..={b}"),
        _ => format!("{ns:?}"),
    }
}

/// Phase 1, all up: 20 messages on 2 queues, read by a consumer of
/// `group`, which commits the first 10. Returns what it read.
async fn before_the_crash(
    mq: &RocketMq,
    producer: &DefaultMQProducer,
    topic: &str,
    group: &str,
) -> BTreeMap<usize, Got> {
    let (ok, error) = send_until_ok(producer, topic, 0..20, DEADLINE).await;
    assert!(ok.is_some(), "send: {error:?}\n{}", mq.log_tail(20));
    let c = consumer(mq, group, topic).await;
    let mut got = BTreeMap::new();
    let all = poll_until(&c, &mut got, DEADLINE, |g| g.len() == 20).await;
    assert!(all, "read {} of 20\n{}", got.len(), mq.log_tail(20));
    let commit = offsets_below(&got, 10, &assigned(&c).await);
    c.commit_sync_with_map(commit.clone(), true).await;
    for (queue, offset) in &commit {
        assert_eq!(c.committed(queue).await.ok(), Some(*offset), "{queue:?}");
    }
    c.shutdown().await;
    got
}

/// How long the slave may take to copy the master's consumer offsets
/// (its synchronisation runs every 10 s, after 10 s).
const SLAVE_SYNC: Duration = Duration::from_secs(12);

/// Phase 2, the master killed: a new group reads nothing from the slave,
/// commits offsets anyway (they go to the slave), and a send fails.
async fn master_down(mq: &mut RocketMq, producer: &DefaultMQProducer, topic: &str, fresh: &str) {
    mq.kill9_master();
    let killed = Instant::now();
    let c = consumer(mq, fresh, topic).await;
    let mut got = BTreeMap::new();
    poll_until(&c, &mut got, SLAVE_READ, |_| false).await;
    let queues = assigned(&c).await;
    eprintln!(
        "fact: master down: a new group, assigned {} queues, read {} in {:?} after the kill",
        queues.len(),
        numbers(&got),
        killed.elapsed()
    );
    assert!(
        got.is_empty(),
        "the slave served reads: rocketmq-rust now builds the slave's consume queues; update cluster::rocketmq's docs"
    );
    let commit: HashMap<MessageQueue, i64> = queues.iter().map(|q| (q.clone(), 5)).collect();
    c.commit_sync_with_map(commit, true).await;
    let mut read_back = Vec::new();
    for queue in &queues {
        read_back.push(c.committed(queue).await.map_err(|e| e.to_string()));
    }
    eprintln!(
        "fact: master down: the new group committed 5 on each queue; committed() reads {read_back:?}"
    );
    c.shutdown().await;
    let (ok, error) = send_until_ok(producer, topic, 20..21, Duration::from_secs(3)).await;
    eprintln!("fact: master down: sends for 3 s: first success {ok:?}, first error {error:?}");
    assert!(ok.is_none(), "a send succeeded with the master down");
}

/// How long a consumer started with the master down polls the slave.
const SLAVE_READ: Duration = Duration::from_secs(10);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn master_killed_and_restarted() {
    let Some(mut mq) = RocketMq::start_with_slave() else {
        return;
    };
    let topic = idem_testkit::unique("idem-rmq-ha");
    let group = idem_testkit::unique("idem-rmq-ha-group");
    let fresh = idem_testkit::unique("idem-rmq-ha-fresh");
    mq.create_topic(&topic, 2).await;
    let mut producer = mq
        .producer(&idem_testkit::unique("idem-rmq-producer"))
        .await;
    let mut before = before_the_crash(&mq, &producer, &topic, &group).await;
    tokio::time::sleep(SLAVE_SYNC).await;
    master_down(&mut mq, &producer, &topic, &fresh).await;

    let restarted = Instant::now();
    mq.restart_master();
    let ready = restarted.elapsed();
    let (ok, error) = send_until_ok(&producer, &topic, 21..25, DEADLINE).await;
    eprintln!(
        "fact: restart: ready in {ready:?}, a send succeeds {ok:?} later, first error {error:?}"
    );
    assert!(
        ok.is_some(),
        "no send after the restart: {error:?}\n{}",
        mq.log_tail(20)
    );
    // The group's offsets committed before the crash survived it: a new
    // consumer reads exactly the 10 never committed and the new ones.
    let c = consumer(&mq, &group, &topic).await;
    let mut got = BTreeMap::new();
    let want: Vec<usize> = (10..20).chain(21..25).collect();
    poll_until(&c, &mut got, DEADLINE, |g| g.len() >= want.len()).await;
    poll_until(&c, &mut got, Duration::from_secs(1), |_| false).await;
    eprintln!(
        "fact: restart: the group read {} by {:?} after the restart",
        numbers(&got),
        restarted.elapsed()
    );
    assert_eq!(got.keys().copied().collect::<Vec<_>>(), want);
    before.retain(|n, _| *n >= 10);
    for (n, g) in &before {
        assert_eq!(
            got.get(n).map(|g| (g.queue, g.offset)),
            Some((g.queue, g.offset))
        );
    }
    c.shutdown().await;
    let c = consumer(&mq, &fresh, &topic).await;
    let mut committed = Vec::new();
    for queue in assigned(&c).await {
        committed.push(c.committed(&queue).await.map_err(|e| e.to_string()));
    }
    eprintln!(
        "fact: restart: the group that committed 5 while the master was down reads committed() {committed:?}"
    );
    c.shutdown().await;
    producer.shutdown().await;
}
