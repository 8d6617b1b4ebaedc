//! The article's "the broker's master fails over, unacknowledged messages
//! are redelivered", reproduced: a three-node JetStream cluster started by
//! the test, an R3 stream, a producer committing outbox messages that a
//! relay publishes while a consumer runs the `#[idempotent]` handler into
//! PostgreSQL; mid-run the stream's leader is killed with SIGKILL, and
//! started again a moment later. Every message acts exactly once (double
//! 0, lost 0, counted in the database), and the run prints what the
//! failover cost: redeliveries, duplicates answered, acks and publishes
//! that failed and were retried.

use crate::common::hooks;
use crate::common::nats::*;
use idem_runtime::outbox::{Relay, enqueue};
use idem_testkit::cluster::nats::NatsCluster;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_the_stream_leader_mid_run_loses_nothing_and_doubles_nothing() {
    let _hooks = hooks::shared().await;
    let _servers = hooks::own_servers().await;
    let Some(pool) = idem_testkit::postgres(12).await else {
        return;
    };
    let Some(cluster) = NatsCluster::start(3).await else {
        return;
    };
    let table = effects_table(&pool).await;
    let js = cluster.connect().await;
    let stream = unique("IDEM_FAILOVER");
    let subject = format!("idem.{}.jobs", stream.to_lowercase());
    let t = Topology::new(&stream, &subject, "worker")
        .replicas(3)
        .ack_wait(Duration::from_secs(2))
        .max_deliver(50);
    t.declare(&js).await.expect("declare the R3 stream");
    let info = js
        .get_stream(&stream)
        .await
        .unwrap()
        .get_info()
        .await
        .unwrap();
    let replicas = info.cluster.as_ref().map_or(0, |c| c.replicas.len());
    assert_eq!(info.config.num_replicas, 3);
    assert_eq!(replicas, 2, "a leader and two replicas");

    // The node to kill leads the stream and the consumer both (the
    // consumer's state has a RAFT group of its own): the "broker master"
    // holding the deliveries not yet acknowledged. Step the consumer's
    // leader down until it lands there.
    let leader = cluster
        .stream_leader(&js, &stream)
        .await
        .expect("the stream has a leader");
    let start = Instant::now();
    loop {
        match cluster.consumer_leader(&js, &stream, "worker").await {
            Some(l) if l == leader => break,
            Some(_) => {
                let _ = cluster.step_down_consumer(&js, &stream, "worker").await;
            }
            None => {}
        }
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "consumer leader not moved"
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    assert_eq!(cluster.stream_leader(&js, &stream).await, Some(leader));
    // The consumer's connection is to that node too; after the kill it
    // reconnects to another one.
    let consumer_js = cluster.connect_node(leader).await;
    // Leaders seen from a node that survives.
    let mut observer = cluster.connect_node((leader + 1) % cluster.size()).await;
    // A request to a stream with no leader goes unanswered: ask often.
    observer.set_timeout(Duration::from_millis(250));

    const N: usize = 300;
    let begun = Instant::now();

    // Producer: N outbox messages committed over about three seconds.
    let producer = {
        let pool = pool.clone();
        let subject = subject.clone();
        tokio::spawn(async move {
            let mut items = Vec::with_capacity(N);
            for _ in 0..N {
                let item = ids(1);
                // 20 ms a handler: deliveries are in flight when the node dies.
                let job = Job {
                    slow_ms: 20,
                    ..Job::new(item)
                };
                let mut tx = pool.begin().await.unwrap();
                enqueue(&mut tx, &subject, &format!("job-{item}"), &job.json())
                    .await
                    .unwrap();
                tx.commit().await.unwrap();
                items.push(item);
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            items
        })
    };
    // Relay: publishes each message, waits for the stream's ack.
    let relay = Relay::new(pool.clone())
        .route(
            subject.clone(),
            Publisher::new(js.clone()).expected_stream(&stream).route(),
        )
        .backoff(Duration::from_millis(100), Duration::from_millis(500))
        .max_attempts(50)
        .poll_interval(Duration::from_millis(20))
        .spawn();
    // Consumer: the idempotent handler into PostgreSQL.
    let consumer = Consumer::new(consumer_js, &stream, "worker", acting(&pool, &table))
        .max_in_flight(16)
        .backoff(Duration::from_millis(100), Duration::from_millis(500))
        .pull_wait(Duration::from_millis(500))
        .dead_letter_subject(&t.dead_letter_subject)
        .spawn()
        .await
        .expect("consumer");

    // Mid-run: kill the stream's leader.
    until("a third of the effects", Duration::from_secs(20), || {
        consumer.stats().executed() >= (N / 3) as u64
    })
    .await;
    let before = consumer.stats().executed();
    cluster.kill9(leader);
    let killed_at = begun.elapsed();
    eprintln!(
        "nats failover: killed n{leader} (stream and consumer leader) at {:.1} s, {before} of {N} effects",
        killed_at.as_secs_f64()
    );
    // A new leader among the two others.
    let start = Instant::now();
    let new_leader = loop {
        match cluster.stream_leader(&observer, &stream).await {
            Some(l) if l != leader => break l,
            _ => {
                assert!(start.elapsed() < Duration::from_secs(20), "no new leader");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    };
    let elected_in = start.elapsed();
    tokio::time::sleep(Duration::from_millis(1_000)).await;
    cluster.restart(leader).await;

    let items = producer.await.unwrap();
    // Every message published, then every one handled.
    let start = Instant::now();
    loop {
        let pending: i64 = sqlx::query_scalar(
            "SELECT COUNT(*) FROM idem_outbox WHERE topic = $1 AND status <> 'success'",
        )
        .bind(&subject)
        .fetch_one(&pool)
        .await
        .unwrap();
        let done = all_effects(&pool, &table).await;
        if pending == 0 && done >= N as i64 {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(40),
            "not drained: {pending} outbox rows pending, {done} of {N} effects\n{}",
            cluster.log_tail(leader, 30)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Whatever the server still hands out again is settled too.
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    let drained_in = begun.elapsed();
    let rs = relay.stats();
    let (relay_retried, relay_dead) = (rs.retried(), rs.dead_lettered());
    relay.shutdown().await;
    let s = consumer.stats();
    consumer.shutdown().await.expect("clean shutdown");

    let (double, lost) = double_and_lost(&pool, &table, &items).await;
    let stored_copies = stored(&js, &stream).await;
    let dead = stored(&js, &t.dead_letter_stream).await;
    eprintln!(
        "nats failover: {N} messages, double {double}, lost {lost}; first answer naming a \
         new leader (n{new_leader}) {:.1} s after the kill; drained {:.1} s after the start; stream copies {stored_copies}; \
         consumer: received {} ({} beyond one per message), redelivered {}, executed {}, duplicates {}, retried {}, \
         dead letters {}, settle failures {}, pull failures {}; relay: retried {relay_retried}, \
         dead letters {relay_dead}",
        elected_in.as_secs_f64(),
        drained_in.as_secs_f64(),
        s.received(),
        s.received().saturating_sub(N as u64),
        s.redelivered(),
        s.executed(),
        s.duplicates(),
        s.retried(),
        s.dead_lettered(),
        s.settle_failed(),
        s.pull_failures(),
    );
    assert_eq!((double, lost), (0, 0));
    assert_eq!(all_effects(&pool, &table).await, N as i64);
    // An execution whose ack was lost in the failover is acked later as
    // a duplicate: at most one execution acked per message.
    assert!(s.executed() <= N as u64);
    assert_eq!(dead, 0, "no dead letters");
    assert_eq!(relay_dead, 0);
    drop_table(&pool, &table).await;
    drop(cluster);
}
