//! The RabbitMQ link's failure paths, against the real broker and
//! PostgreSQL: non-retryable failures land in the dead-letter queue at once;
//! retryable ones retry with back-off through the retry queue, boundedly;
//! the publisher reports missing exchanges and unroutable messages, then
//! recovers. Assertions count rows in the database and read the queues.

use crate::common::amqp::*;
use crate::common::hooks;
use lapin::BasicProperties;
use lapin::options::BasicPublishOptions;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn non_retryable_failures_are_dead_lettered_at_once() {
    let _hooks = hooks::shared().await;
    let Some((pool, conn)) = servers().await else {
        return;
    };
    let (t, exchange, topic) = topology(&conn, "poison").await;
    let publisher = Publisher::new(conn.clone(), &exchange);

    // Illegal state: the coupon was cancelled.
    let cancelled = coupon(&pool, "CANCELLED").await;
    publish_json(&publisher, &topic, "m-illegal", &cancelled).await;
    // Unparsable payload.
    publisher
        .publish(&topic, "m-garbage", b"{not json")
        .await
        .unwrap();
    // No message_id: cannot be keyed.
    let ch = conn.create_channel().await.unwrap();
    ch.basic_publish(
        exchange.as_str().into(),
        topic.as_str().into(),
        BasicPublishOptions::default(),
        serde_json::to_string(&coupon(&pool, "UNUSED").await)
            .unwrap()
            .as_bytes(),
        BasicProperties::default(),
    )
    .await
    .unwrap();
    let _ = ch.close(200, "OK".into()).await;

    let calls = Arc::new(AtomicUsize::new(0));
    let n = calls.clone();
    let handler = deducting(&pool);
    let consumer = Consumer::new(conn.clone(), &t.queue, move |m: Message, d: Deduct| {
        n.fetch_add(1, Ordering::SeqCst);
        handler(m, d)
    })
    .backoff(Duration::from_millis(50), Duration::from_millis(100))
    .spawn()
    .await
    .unwrap();
    let mut dead = take(&conn, &t.dead_letter_queue, 3, Duration::from_secs(5)).await;
    let c = counts(&consumer);
    consumer.shutdown().await.expect("clean shutdown");

    dead.sort_by(|a, b| a.message_id.cmp(&b.message_id));
    let ids: Vec<_> = dead.iter().map(|m| m.message_id.as_deref()).collect();
    assert_eq!(ids, vec![None, Some("m-garbage"), Some("m-illegal")]);
    assert!(
        dead.iter()
            .all(|m| m.death_reason.as_deref() == Some("rejected"))
    );
    assert_eq!(dead[1].body, b"{not json");
    assert_eq!(c, (0, 0, 0, 3, 0), "rejected once each, never retried");
    assert_eq!(
        calls.load(Ordering::SeqCst),
        1,
        "only the illegal-state message reached the handler"
    );
    assert_eq!(deductions(&pool, cancelled.coupon_id).await, 0);
    assert_eq!(status(&pool, cancelled.coupon_id).await, "CANCELLED");
    assert_eq!(ready(&conn, &t.queue).await, 0);
    assert_eq!(ready(&conn, &t.retry_queue).await, 0);
    teardown(&conn, &t).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retryable_failures_back_off_through_the_retry_queue_then_succeed() {
    let _hooks = hooks::shared().await;
    let Some((pool, conn)) = servers().await else {
        return;
    };
    let (t, exchange, topic) = topology(&conn, "flaky").await;
    let publisher = Publisher::new(conn.clone(), &exchange);
    let d = coupon(&pool, "UNUSED").await;
    publish_json(&publisher, &topic, "m-flaky", &d).await;

    // Fails twice (a downstream time-out), then runs the handler.
    let seen = Arc::new(Mutex::new(Vec::new()));
    let s = seen.clone();
    let handler = deducting(&pool);
    let started = Instant::now();
    let consumer = Consumer::new(conn.clone(), &t.queue, move |m: Message, d: Deduct| {
        let attempt = m.attempt;
        s.lock()
            .unwrap()
            .push((attempt, m.routing_key.clone(), started.elapsed()));
        let fut = handler(m, d);
        async move {
            if attempt < 3 {
                return Err(Error::retryable("downstream time-out"));
            }
            fut.await
        }
    })
    .max_attempts(5)
    .backoff(Duration::from_millis(200), Duration::from_secs(1))
    .spawn()
    .await
    .unwrap();
    until(
        "the third attempt to succeed",
        Duration::from_secs(8),
        || counts(&consumer).0 == 1,
    )
    .await;
    let c = counts(&consumer);
    consumer.shutdown().await.expect("clean shutdown");

    assert_eq!(c, (1, 0, 2, 0, 0));
    let seen = seen.lock().unwrap().clone();
    let attempts: Vec<_> = seen.iter().map(|(a, ..)| *a).collect();
    assert_eq!(attempts, vec![1, 2, 3]);
    // The original routing key survives the trip through the retry queue.
    assert!(seen.iter().all(|(_, rk, _)| rk == &topic), "{seen:?}");
    // Back-off: 200 ms after the first failure, 400 ms after the second.
    assert!(
        seen[1].2 - seen[0].2 >= Duration::from_millis(190),
        "{seen:?}"
    );
    assert!(
        seen[2].2 - seen[1].2 >= Duration::from_millis(390),
        "{seen:?}"
    );
    assert_eq!(deductions(&pool, d.coupon_id).await, 1);
    assert_eq!(status(&pool, d.coupon_id).await, "USED");
    for q in [&t.queue, &t.retry_queue, &t.dead_letter_queue] {
        assert_eq!(ready(&conn, q).await, 0, "{q}");
    }
    teardown(&conn, &t).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retryable_failures_forever_are_dead_lettered_after_max_attempts() {
    let _hooks = hooks::shared().await;
    let Some((pool, conn)) = servers().await else {
        return;
    };
    let (t, exchange, topic) = topology(&conn, "hopeless").await;
    let publisher = Publisher::new(conn.clone(), &exchange);
    let d = coupon(&pool, "UNUSED").await;
    publish_json(&publisher, &topic, "m-hopeless", &d).await;

    let calls = Arc::new(AtomicUsize::new(0));
    let n = calls.clone();
    let consumer = Consumer::new(conn.clone(), &t.queue, move |_m: Message, _d: Deduct| {
        n.fetch_add(1, Ordering::SeqCst);
        async move { Err::<Outcome<()>, _>(Error::retryable("still down")) }
    })
    .max_attempts(3)
    .backoff(Duration::from_millis(50), Duration::from_millis(100))
    .spawn()
    .await
    .unwrap();
    let dead = take(&conn, &t.dead_letter_queue, 1, Duration::from_secs(5)).await;
    let c = counts(&consumer);
    consumer.shutdown().await.expect("clean shutdown");

    assert_eq!(dead[0].message_id.as_deref(), Some("m-hopeless"));
    // Two failed attempts recorded by the retries; the third was rejected.
    assert_eq!(dead[0].attempts, Some(2));
    assert_eq!(dead[0].death_reason.as_deref(), Some("rejected"));
    assert_eq!(calls.load(Ordering::SeqCst), 3, "bounded attempts");
    assert_eq!(c, (0, 0, 2, 1, 0));
    assert_eq!(deductions(&pool, d.coupon_id).await, 0);
    assert_eq!(status(&pool, d.coupon_id).await, "UNUSED");
    assert_eq!(ready(&conn, &t.queue).await, 0);
    assert_eq!(ready(&conn, &t.retry_queue).await, 0);
    teardown(&conn, &t).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn publisher_reports_missing_exchanges_and_unroutable_messages_and_recovers() {
    let _hooks = hooks::shared().await;
    let Some(conn) = broker().await else { return };
    let exchange = unique("idem_q_noroute");
    let queue = format!("{exchange}.q");
    let publisher = Publisher::new(conn.clone(), &exchange);
    // No such exchange yet: the broker closes the channel (NOT_FOUND).
    let err = publisher.publish("t", "m-1", b"{}").await.unwrap_err();
    assert!(err.is_retryable(), "{err:#}");
    assert!(
        format!("{err:#}").contains("NOT_FOUND")
            || format!("{err:#}").contains("not found")
            || format!("{err:#}").contains("404"),
        "{err}"
    );

    let ch = conn.create_channel().await.unwrap();
    ch.exchange_declare(
        exchange.as_str().into(),
        lapin::ExchangeKind::Topic,
        Default::default(),
        FieldTable::default(),
    )
    .await
    .unwrap();
    // The exchange exists, no queue is bound: an error, not a silent drop.
    let err = publisher.publish("t", "m-2", b"{}").await.unwrap_err();
    assert!(err.is_retryable(), "{err:#}");
    assert!(format!("{err:#}").contains("unroutable"), "{err:#}");

    ch.queue_declare(
        queue.as_str().into(),
        QueueDeclareOptions::default(),
        FieldTable::default(),
    )
    .await
    .unwrap();
    ch.queue_bind(
        queue.as_str().into(),
        exchange.as_str().into(),
        "t".into(),
        Default::default(),
        FieldTable::default(),
    )
    .await
    .unwrap();
    // The same publisher reopened its channel and now delivers.
    publisher.publish("t", "m-3", b"{}").await.expect("routed");
    let got = take(&conn, &queue, 1, Duration::from_secs(2)).await;
    assert_eq!(got[0].message_id.as_deref(), Some("m-3"));

    let _ = ch
        .queue_delete(queue.as_str().into(), QueueDeleteOptions::default())
        .await;
    let _ = ch
        .exchange_delete(exchange.as_str().into(), ExchangeDeleteOptions::default())
        .await;
    let _ = ch.close(200, "OK".into()).await;
}
