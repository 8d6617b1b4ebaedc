//! The NATS JetStream link against the real nats-server and PostgreSQL:
//! outbox → relay + publisher → stream → pull consumer → `#[idempotent]`
//! handler. Redeliveries, nak'd retries, dead letters, the `max_deliver`
//! bound, progress acks under a slow handler (and the redelivery without
//! them), and republishes inside and past the stream's duplicate window
//! each give one effect, or none where none is due. Assertions count rows
//! in each test's own table and read the streams. The three-node cluster
//! with its leader killed is in `nats/cluster.rs`.

use crate::common::hooks;
use crate::common::nats::*;
use idem_runtime::outbox::{Relay, enqueue};
use jetstream::consumer::PullConsumer;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outbox_relay_stream_consumer_end_to_end_one_effect_each() {
    let _hooks = hooks::shared().await;
    let Some((pool, js, table)) = servers().await else {
        return;
    };
    let t = topology(&js, "e2e", |t| t).await;
    let topic = t.subjects[0].clone();
    const N: usize = 20;
    const REPUBLISHED: usize = 6;

    let mut items = Vec::new();
    for _ in 0..N {
        let item = ids(1);
        let mut tx = pool.begin().await.unwrap();
        enqueue(
            &mut tx,
            &topic,
            &format!("job-{item}"),
            &Job::new(item).json(),
        )
        .await
        .unwrap();
        tx.commit().await.unwrap();
        items.push(item);
    }
    let publisher = Publisher::new(js.clone()).expected_stream(&t.stream);
    let relay = Relay::new(pool.clone())
        .route(topic.clone(), publisher.route())
        .poll_interval(Duration::from_millis(20))
        .spawn();
    drained(&pool, &topic, Duration::from_secs(10)).await;
    relay.shutdown().await;
    assert_eq!(stored(&js, &t.stream).await, N as u64);

    // Republished inside the duplicate window (the relay's retry after a
    // lost ack): the stream answers duplicate and stores nothing.
    for &item in &items[..REPUBLISHED] {
        let ack = publisher
            .publish(&topic, &format!("job-{item}"), &Job::new(item).bytes())
            .await
            .unwrap();
        assert!(ack.duplicate, "inside the window");
    }
    assert_eq!(stored(&js, &t.stream).await, N as u64);

    let consumer = Consumer::new(js.clone(), &t.stream, &t.consumer, acting(&pool, &table))
        .max_in_flight(8)
        .spawn()
        .await
        .expect("consumer");
    until("every delivery acked", Duration::from_secs(10), || {
        counts(&consumer).1 >= N as u64
    })
    .await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let c = counts(&consumer);
    consumer.shutdown().await.expect("clean shutdown");
    assert_eq!(c, (N as u64, N as u64, 0, 0, 0, 0));
    assert_eq!(double_and_lost(&pool, &table, &items).await, (0, 0));
    assert_eq!(all_effects(&pool, &table).await, N as i64);
    teardown(&js, &t).await;
    drop_table(&pool, &table).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delivery_committed_but_never_acked_is_redelivered_and_answered_duplicate() {
    let _hooks = hooks::shared().await;
    let Some((pool, js, table)) = servers().await else {
        return;
    };
    let t = topology(&js, "crash", |t| t.ack_wait(Duration::from_secs(1))).await;
    let item = ids(1);
    publish(&js, &t.subjects[0], "m-crash", &Job::new(item)).await;

    // A first consumer pulls it, the handler commits, and the process
    // "dies": no ack is ever sent.
    let pull: PullConsumer = js
        .get_consumer_from_stream(&t.consumer, &t.stream)
        .await
        .unwrap();
    let mut batch = pull.fetch().max_messages(1).messages().await.unwrap();
    let raw = batch.next().await.expect("one message").unwrap();
    let info = raw.info().unwrap();
    let m = Message {
        stream: t.stream.clone(),
        consumer: t.consumer.clone(),
        subject: raw.subject.to_string(),
        message_id: "m-crash".into(),
        stream_sequence: info.stream_sequence,
        consumer_sequence: info.consumer_sequence,
        delivered: info.delivered as u32,
        body: raw.payload.to_vec(),
        headers: raw.headers.clone().unwrap_or_default(),
    };
    let first = act(&pool, &m, &Job::new(item), &table).await.unwrap();
    assert!(first.is_executed());
    drop((raw, batch));
    assert_eq!(effects(&pool, &table, item).await, 1, "committed once");

    // The consumer: after ack_wait the server delivers it again.
    let seen = Arc::new(Mutex::new(Vec::new()));
    let s = seen.clone();
    let handler = acting(&pool, &table);
    let consumer = Consumer::new(
        js.clone(),
        &t.stream,
        &t.consumer,
        move |m: Message, j: Job| {
            s.lock().unwrap().push((m.delivered, m.key()));
            handler(m, j)
        },
    )
    .spawn()
    .await
    .unwrap();
    until("the redelivery to be acked", Duration::from_secs(5), || {
        counts(&consumer).2 == 1
    })
    .await;
    let c = counts(&consumer);
    let redelivered = consumer.stats().redelivered();
    consumer.shutdown().await.unwrap();
    assert_eq!(c, (1, 0, 1, 0, 0, 0));
    assert_eq!(redelivered, 1);
    assert_eq!(
        *seen.lock().unwrap(),
        vec![(2, format!("{}:m-crash", t.stream))]
    );
    assert_eq!(effects(&pool, &table, item).await, 1, "still one effect");
    teardown(&js, &t).await;
    drop_table(&pool, &table).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retryable_failure_is_nakd_with_back_off_and_acts_once_when_it_heals() {
    let _hooks = hooks::shared().await;
    let Some((pool, js, table)) = servers().await else {
        return;
    };
    let t = topology(&js, "retry", |t| t.max_deliver(5)).await;
    let item = ids(1);
    let job = Job {
        fail_until: 2,
        ..Job::new(item)
    };
    publish(&js, &t.subjects[0], "m-flaky", &job).await;
    let begun = Instant::now();
    let consumer = Consumer::new(js.clone(), &t.stream, &t.consumer, acting(&pool, &table))
        .backoff(Duration::from_millis(150), Duration::from_secs(1))
        .spawn()
        .await
        .unwrap();
    assert_eq!(consumer.max_deliver(), 5, "read from the server");
    until(
        "the third delivery to succeed",
        Duration::from_secs(8),
        || counts(&consumer).1 == 1,
    )
    .await;
    let took = begun.elapsed();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let c = counts(&consumer);
    let redelivered = consumer.stats().redelivered();
    consumer.shutdown().await.unwrap();
    assert_eq!(c, (3, 1, 0, 2, 0, 0), "two naks, then the ack");
    assert_eq!(redelivered, 2);
    // Naks of 150 ms then 300 ms.
    assert!(
        took >= Duration::from_millis(450),
        "back-off honoured: {took:?}"
    );
    // The failed attempts rolled back: one effect, from the third delivery.
    let delivered: Vec<i32> = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "SELECT delivered FROM {table} WHERE item = $1"
    )))
    .bind(item)
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(delivered, vec![3]);
    teardown(&js, &t).await;
    drop_table(&pool, &table).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn non_retryable_unparsable_and_unkeyed_deliveries_are_dead_lettered_at_once() {
    let _hooks = hooks::shared().await;
    let Some((pool, js, table)) = servers().await else {
        return;
    };
    let t = topology(&js, "poison", |t| t).await;
    let subject = t.subjects[0].clone();
    let refused = ids(1);
    publish(
        &js,
        &subject,
        "m-refused",
        &Job {
            refuse: true,
            ..Job::new(refused)
        },
    )
    .await;
    Publisher::new(js.clone())
        .subject(&subject)
        .publish("jobs", "m-garbage", b"{not json")
        .await
        .unwrap();
    // No Nats-Msg-Id: it cannot be keyed.
    js.publish(subject.clone(), Job::new(ids(1)).bytes().into())
        .await
        .unwrap()
        .await
        .unwrap();

    let calls = Arc::new(AtomicUsize::new(0));
    let n = calls.clone();
    let handler = acting(&pool, &table);
    let consumer = Consumer::new(
        js.clone(),
        &t.stream,
        &t.consumer,
        move |m: Message, j: Job| {
            n.fetch_add(1, Ordering::SeqCst);
            handler(m, j)
        },
    )
    .backoff(Duration::from_millis(50), Duration::from_millis(100))
    .dead_letter_subject(&t.dead_letter_subject)
    .spawn()
    .await
    .unwrap();
    until("three dead letters", Duration::from_secs(5), || {
        counts(&consumer).4 == 3
    })
    .await;
    // Terminated: never delivered again.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let c = counts(&consumer);
    consumer.shutdown().await.unwrap();
    assert_eq!(c, (3, 0, 0, 0, 3, 0), "each terminated once, never retried");
    assert_eq!(calls.load(Ordering::SeqCst), 1, "only the refused job ran");
    assert_eq!(
        all_effects(&pool, &table).await,
        0,
        "the refusal rolled back"
    );

    let mut dead = read_all(&js, &t.dead_letter_stream).await;
    dead.sort_by(|a, b| a.message_id.cmp(&b.message_id));
    let ids_seen: Vec<_> = dead.iter().map(|d| d.message_id.as_deref()).collect();
    assert_eq!(ids_seen, vec![None, Some("m-garbage"), Some("m-refused")]);
    assert!(dead.iter().all(|d| d.delivered.as_deref() == Some("1")));
    assert!(dead[0].reason.as_deref().unwrap().contains("Nats-Msg-Id"));
    assert!(dead[1].reason.as_deref().unwrap().contains("unparsable"));
    assert!(dead[2].reason.as_deref().unwrap().contains("refused"));
    assert_eq!(dead[1].body, b"{not json");
    // The originals stay in the stream (terminated for this consumer only).
    assert_eq!(stored(&js, &t.stream).await, 3);
    teardown(&js, &t).await;
    drop_table(&pool, &table).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_deliver_bounds_the_redeliveries_of_a_failure_that_never_heals() {
    let _hooks = hooks::shared().await;
    let Some((pool, js, table)) = servers().await else {
        return;
    };
    let t = topology(&js, "bound", |t| t.max_deliver(3)).await;
    let item = ids(1);
    let job = Job {
        fail_until: u32::MAX,
        ..Job::new(item)
    };
    let ack = publish(&js, &t.subjects[0], "m-hopeless", &job).await;
    let consumer = Consumer::new(js.clone(), &t.stream, &t.consumer, acting(&pool, &table))
        .backoff(Duration::from_millis(50), Duration::from_millis(100))
        .dead_letter_subject(&t.dead_letter_subject)
        .spawn()
        .await
        .unwrap();
    until("the dead letter", Duration::from_secs(5), || {
        counts(&consumer).4 == 1
    })
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let c = counts(&consumer);
    consumer.shutdown().await.unwrap();
    assert_eq!(
        c,
        (3, 0, 0, 2, 1, 0),
        "3 deliveries: 2 naks, then the dead letter"
    );
    assert_eq!(effects(&pool, &table, item).await, 0);
    let dead = read_all(&js, &t.dead_letter_stream).await;
    assert_eq!(dead.len(), 1);
    assert_eq!(dead[0].message_id.as_deref(), Some("m-hopeless"));
    assert_eq!(dead[0].delivered.as_deref(), Some("3"));
    assert_eq!(dead[0].sequence, Some(ack.sequence.to_string()));
    assert!(
        dead[0]
            .reason
            .as_deref()
            .unwrap()
            .contains("gave up after 3 deliveries")
    );
    teardown(&js, &t).await;
    drop_table(&pool, &table).await;
}

/// A handler slower than `ack_wait`: `(received, redelivered, progress
/// acks, duplicates, effects)`.
async fn slow_handler(progress: Option<Duration>) -> Option<(u64, u64, u64, u64, i64)> {
    let (pool, js, table) = servers().await?;
    let t = topology(&js, "slow", |t| t.ack_wait(Duration::from_millis(800))).await;
    let item = ids(1);
    let job = Job {
        slow_ms: 2_500,
        ..Job::new(item)
    };
    publish(&js, &t.subjects[0], "m-slow", &job).await;
    let consumer = Consumer::new(js.clone(), &t.stream, &t.consumer, acting(&pool, &table))
        .progress_every(progress)
        .spawn()
        .await
        .unwrap();
    until("the delivery to be acked", Duration::from_secs(10), || {
        let (_, e, d, ..) = counts(&consumer);
        e + d >= 1
    })
    .await;
    // Whatever the server handed out again meanwhile is settled too.
    tokio::time::sleep(Duration::from_millis(3_000)).await;
    let s = consumer.stats();
    consumer.shutdown().await.unwrap();
    let out = (
        s.received(),
        s.redelivered(),
        s.progress_acks(),
        s.duplicates(),
        effects(&pool, &table, item).await,
    );
    assert_eq!(s.executed(), 1);
    teardown(&js, &t).await;
    drop_table(&pool, &table).await;
    Some(out)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn progress_acks_keep_a_slow_handler_s_delivery_from_being_handed_out_again() {
    let _hooks = hooks::shared().await;
    let Some((received, redelivered, progress, duplicates, effects)) =
        slow_handler(Some(Duration::from_millis(250))).await
    else {
        return;
    };
    assert_eq!((received, redelivered, duplicates), (1, 0, 0));
    assert!(
        progress >= 5,
        "a progress ack every 250 ms for 2.5 s: {progress}"
    );
    assert_eq!(effects, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn control_without_progress_acks_a_slow_handler_s_delivery_is_handed_out_again() {
    let _hooks = hooks::shared().await;
    let Some((received, redelivered, progress, duplicates, effects)) = slow_handler(None).await
    else {
        return;
    };
    assert_eq!(progress, 0);
    assert!(redelivered >= 1, "ack_wait ran out under the handler");
    assert_eq!(received, 1 + redelivered);
    assert_eq!(
        duplicates, redelivered,
        "each redelivery answered Duplicate"
    );
    assert_eq!(effects, 1, "the database decided");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_restarted_after_publishing_republishes_inside_the_window_and_nothing_is_stored_twice()
 {
    let _hooks = hooks::shared().await;
    let Some((pool, js, table)) = servers().await else {
        return;
    };
    let t = topology(&js, "restart", |t| t).await;
    let topic = t.subjects[0].clone();
    const N: usize = 12;
    let mut items = Vec::new();
    for _ in 0..N {
        let item = ids(1);
        let mut tx = pool.begin().await.unwrap();
        enqueue(
            &mut tx,
            &topic,
            &format!("job-{item}"),
            &Job::new(item).json(),
        )
        .await
        .unwrap();
        tx.commit().await.unwrap();
        items.push(item);
    }

    // Relay 1, in a runtime of its own: it publishes every message (the
    // stream acks them), then "crashes" before marking any outbox row.
    let (published_tx, published_rx) = std::sync::mpsc::channel::<()>();
    let (die_tx, die_rx) = std::sync::mpsc::channel::<()>();
    let url = nats_url();
    let (t1, topic1) = (t.clone(), topic.clone());
    let crashed = std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let js = nats::connect(&url).await.unwrap();
            let pool = idem_testkit::postgres(4).await.unwrap();
            let publisher = Publisher::new(js).expected_stream(&t1.stream);
            let route = publisher.route::<Postgres>();
            let relay = Relay::new(pool)
                .route(
                    topic1,
                    move |d: idem_runtime::outbox::Delivery<Postgres>, p: serde::de::IgnoredAny| {
                        let publish = route(d, p);
                        let published = published_tx.clone();
                        async move {
                            let _ = publish.await?;
                            let _ = published.send(());
                            // Dies here: the row is never marked.
                            std::future::pending::<Result<Outcome<()>, Error>>().await
                        }
                    },
                )
                .concurrency(N)
                .lease(Duration::from_secs(1))
                .poll_interval(Duration::from_millis(20))
                .spawn();
            tokio::task::spawn_blocking(move || die_rx.recv())
                .await
                .unwrap()
                .ok();
            std::mem::forget(relay);
        });
        // Dropping the runtime cancels every task: the crash.
        drop(rt);
    });
    for _ in 0..N {
        published_rx
            .recv_timeout(Duration::from_secs(10))
            .expect("relay 1 published");
    }
    die_tx.send(()).unwrap();
    crashed.join().unwrap();
    assert_eq!(stored(&js, &t.stream).await, N as u64);

    // Relay 2 takes over once the leases run out and publishes everything
    // again: every ack says duplicate, nothing new is stored.
    let duplicates = Arc::new(AtomicUsize::new(0));
    let d = duplicates.clone();
    let publisher = Publisher::new(js.clone()).expected_stream(&t.stream);
    let relay = Relay::new(pool.clone())
        .route(
            topic.clone(),
            move |delivery: idem_runtime::outbox::Delivery<Postgres>, _: serde::de::IgnoredAny| {
                let publisher = publisher.clone();
                let d = d.clone();
                async move {
                    let m = delivery.message();
                    let ack = publisher
                        .publish(&m.topic, &m.msg_id, m.payload.as_bytes())
                        .await?;
                    if ack.duplicate {
                        d.fetch_add(1, Ordering::SeqCst);
                    }
                    Ok::<_, Error>(Outcome::Executed(()))
                }
            },
        )
        .poll_interval(Duration::from_millis(50))
        .spawn();
    drained(&pool, &topic, Duration::from_secs(15)).await;
    let reclaimed = relay.stats().reclaimed();
    relay.shutdown().await;
    assert_eq!(reclaimed, N as u64, "every lease of relay 1 ran out");
    assert_eq!(
        duplicates.load(Ordering::SeqCst),
        N,
        "every republish acked duplicate"
    );
    assert_eq!(
        stored(&js, &t.stream).await,
        N as u64,
        "nothing stored twice"
    );

    let consumer = Consumer::new(js.clone(), &t.stream, &t.consumer, acting(&pool, &table))
        .spawn()
        .await
        .unwrap();
    until("every delivery acked", Duration::from_secs(10), || {
        counts(&consumer).1 >= N as u64
    })
    .await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let c = counts(&consumer);
    consumer.shutdown().await.unwrap();
    assert_eq!(c, (N as u64, N as u64, 0, 0, 0, 0));
    assert_eq!(double_and_lost(&pool, &table, &items).await, (0, 0));
    teardown(&js, &t).await;
    drop_table(&pool, &table).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_publish_ack_lost_past_the_duplicate_window_stores_a_second_copy_and_the_database_still_decides()
 {
    let _hooks = hooks::shared().await;
    let Some((pool, js, table)) = servers().await else {
        return;
    };
    let window = Duration::from_millis(500);
    let t = topology(&js, "window", |t| t.duplicate_window(window)).await;
    let topic = t.subjects[0].clone();
    const N: usize = 8;
    let mut items = Vec::new();
    for _ in 0..N {
        let item = ids(1);
        let mut tx = pool.begin().await.unwrap();
        enqueue(
            &mut tx,
            &topic,
            &format!("job-{item}"),
            &Job::new(item).json(),
        )
        .await
        .unwrap();
        tx.commit().await.unwrap();
        items.push(item);
    }
    // Every first publish's ack is "lost": the stream stored the message,
    // the relay sees an error and retries after a back-off longer than the
    // window.
    let attempts = Arc::new(Mutex::new(std::collections::HashMap::<String, u32>::new()));
    let seen = attempts.clone();
    let publisher = Publisher::new(js.clone()).expected_stream(&t.stream);
    let relay = Relay::new(pool.clone())
        .route(
            topic.clone(),
            move |delivery: idem_runtime::outbox::Delivery<Postgres>, _: serde::de::IgnoredAny| {
                let publisher = publisher.clone();
                let seen = seen.clone();
                async move {
                    let m = delivery.message();
                    let ack = publisher
                        .publish(&m.topic, &m.msg_id, m.payload.as_bytes())
                        .await?;
                    let n = {
                        let mut a = seen.lock().unwrap();
                        let n = a.entry(m.msg_id.clone()).or_default();
                        *n += 1;
                        *n
                    };
                    if n == 1 {
                        return Err(Error::retryable("publish ack lost (simulated)"));
                    }
                    assert!(!ack.duplicate, "past the window the stream forgot the id");
                    Ok(Outcome::Executed(()))
                }
            },
        )
        .backoff(Duration::from_millis(1_600), Duration::from_millis(1_600))
        .poll_interval(Duration::from_millis(50))
        .spawn();
    drained(&pool, &topic, Duration::from_secs(15)).await;
    let retried = relay.stats().retried();
    relay.shutdown().await;
    assert_eq!(retried, N as u64);
    assert_eq!(
        stored(&js, &t.stream).await,
        2 * N as u64,
        "two copies of each"
    );

    let consumer = Consumer::new(js.clone(), &t.stream, &t.consumer, acting(&pool, &table))
        .spawn()
        .await
        .unwrap();
    until("every copy acked", Duration::from_secs(10), || {
        let (_, e, d, ..) = counts(&consumer);
        e + d >= 2 * N as u64
    })
    .await;
    let c = counts(&consumer);
    consumer.shutdown().await.unwrap();
    assert_eq!(
        c,
        (2 * N as u64, N as u64, N as u64, 0, 0, 0),
        "the second copies answered Duplicate"
    );
    assert_eq!(double_and_lost(&pool, &table, &items).await, (0, 0));
    assert_eq!(all_effects(&pool, &table).await, N as i64);
    teardown(&js, &t).await;
    drop_table(&pool, &table).await;
}
