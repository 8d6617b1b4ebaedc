//! The RabbitMQ link against the real broker and PostgreSQL: outbox →
//! relay + publisher → exchange → consumer → `#[idempotent]` handler.
//! Duplicate publishes and a consumer that dies between its commit and its
//! ack give one effect; prefetch bounds the consumer's concurrency and a
//! shutdown finishes the work in flight. Assertions count rows in the
//! database and read the queues. The failure paths are in
//! `amqp/failures.rs`.

use crate::common::amqp::*;
use crate::common::hooks;
use idem_runtime::outbox::Relay;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outbox_relay_broker_consumer_end_to_end_one_effect_per_coupon() {
    let _hooks = hooks::shared().await;
    let Some((pool, conn)) = servers().await else {
        return;
    };
    let (t, exchange, topic) = topology(&conn, "e2e").await;
    const N: usize = 24;
    const DUPLICATED: usize = 8;

    // Producer: each coupon and its deduction message commit together.
    let mut coupons = Vec::new();
    for _ in 0..N {
        let d = coupon(&pool, "UNUSED").await;
        let mut tx = pool.begin().await.unwrap();
        let msg = idem_runtime::outbox::enqueue(
            &mut tx,
            &topic,
            &format!("order-{}", d.order_id),
            &serde_json::to_value(&d).unwrap(),
        )
        .await
        .unwrap();
        assert!(msg.is_new());
        tx.commit().await.unwrap();
        coupons.push(d);
    }

    // Forwarder: the relay publishes each message with publisher confirms.
    let publisher = Publisher::new(conn.clone(), &exchange);
    let relay = Relay::new(pool.clone())
        .route(topic.clone(), publisher.route())
        .poll_interval(Duration::from_millis(20))
        .spawn();
    drained(&pool, &topic, Duration::from_secs(8)).await;
    assert_eq!(relay.stats().executed(), N as u64);
    relay.shutdown().await;

    // The same messages published again (a republish after a lost confirm):
    // same message_id.
    for d in &coupons[..DUPLICATED] {
        publish_json(&publisher, &topic, &format!("order-{}", d.order_id), d).await;
    }

    let consumer = Consumer::new(conn.clone(), &t.queue, deducting(&pool))
        .prefetch(8)
        .spawn()
        .await
        .expect("consumer");
    let total = (N + DUPLICATED) as u64;
    until("every delivery acked", Duration::from_secs(8), || {
        let (e, d, ..) = counts(&consumer);
        e + d >= total
    })
    .await;
    let c = counts(&consumer);
    consumer.shutdown().await.expect("clean shutdown");
    assert_eq!(c, (N as u64, DUPLICATED as u64, 0, 0, 0));

    for d in &coupons {
        assert_eq!(
            deductions(&pool, d.coupon_id).await,
            1,
            "coupon {}",
            d.coupon_id
        );
        assert_eq!(status(&pool, d.coupon_id).await, "USED");
    }
    // Everything acknowledged: nothing left, nothing dead-lettered.
    assert_eq!(ready(&conn, &t.queue).await, 0);
    assert_eq!(ready(&conn, &t.dead_letter_queue).await, 0);
    teardown(&conn, &t).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consumer_dying_between_commit_and_ack_gets_a_redelivery_answered_duplicate() {
    let _hooks = hooks::shared().await;
    let Some((pool, conn)) = servers().await else {
        return;
    };
    let (t, exchange, topic) = topology(&conn, "crash").await;
    let d = coupon(&pool, "UNUSED").await;
    let publisher = Publisher::new(conn.clone(), &exchange);
    publish_json(&publisher, &topic, "m-crash", &d).await;

    // Consumer 1 on its own connection: the handler commits, then the
    // process "dies" (its connection closes) before the ack goes out.
    let doomed = amqp::connect(&amqp_url()).await.expect("second connection");
    let handler = deducting(&pool);
    let kill = doomed.clone();
    let first_outcome = Arc::new(Mutex::new(None));
    let seen = first_outcome.clone();
    let c1 = Consumer::new(doomed.clone(), &t.queue, move |m: Message, d: Deduct| {
        let fut = handler(m, d);
        let kill = kill.clone();
        let seen = seen.clone();
        async move {
            let r = fut.await;
            *seen.lock().unwrap() = Some(format!("{r:?}"));
            kill.close(200, "simulated crash".into())
                .await
                .expect("close");
            r
        }
    })
    .spawn()
    .await
    .expect("consumer 1");
    until("consumer 1 to die", Duration::from_secs(5), || {
        c1.is_finished()
    })
    .await;
    let c = counts(&c1);
    let _ = c1.shutdown().await; // its connection failed: an error is expected
    assert_eq!(
        first_outcome.lock().unwrap().as_deref(),
        Some("Ok(Executed(()))")
    );
    assert_eq!(c, (0, 0, 0, 0, 1), "the ack could not be sent");
    assert_eq!(deductions(&pool, d.coupon_id).await, 1, "committed once");

    // Consumer 2: the broker redelivers; the handler answers Duplicate.
    let redelivered = Arc::new(Mutex::new(Vec::new()));
    let r = redelivered.clone();
    let handler = deducting(&pool);
    let c2 = Consumer::new(conn.clone(), &t.queue, move |m: Message, d: Deduct| {
        r.lock().unwrap().push((m.redelivered, m.key()));
        handler(m, d)
    })
    .spawn()
    .await
    .expect("consumer 2");
    until("the redelivery to be acked", Duration::from_secs(5), || {
        counts(&c2).1 == 1
    })
    .await;
    let c = counts(&c2);
    c2.shutdown().await.expect("clean shutdown");
    assert_eq!(c, (0, 1, 0, 0, 0));
    assert_eq!(
        *redelivered.lock().unwrap(),
        vec![(true, format!("{}:m-crash", t.queue))]
    );
    assert_eq!(deductions(&pool, d.coupon_id).await, 1, "still one effect");
    assert_eq!(status(&pool, d.coupon_id).await, "USED");
    assert_eq!(ready(&conn, &t.queue).await, 0, "acked");
    assert_eq!(ready(&conn, &t.dead_letter_queue).await, 0);
    teardown(&conn, &t).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prefetch_bounds_concurrency_and_shutdown_finishes_in_flight_work() {
    let _hooks = hooks::shared().await;
    let Some((pool, conn)) = servers().await else {
        return;
    };
    let (t, exchange, topic) = topology(&conn, "drain").await;
    let publisher = Publisher::new(conn.clone(), &exchange);
    const N: usize = 8;
    let mut coupons = Vec::new();
    for i in 0..N {
        let d = coupon(&pool, "UNUSED").await;
        publish_json(&publisher, &topic, &format!("m-{i}"), &d).await;
        coupons.push(d);
    }

    let in_flight = Arc::new(AtomicUsize::new(0));
    let max_in_flight = Arc::new(AtomicUsize::new(0));
    let started = Arc::new(AtomicUsize::new(0));
    let (f, mx, s) = (in_flight.clone(), max_in_flight.clone(), started.clone());
    let handler = deducting(&pool);
    let consumer = Consumer::new(conn.clone(), &t.queue, move |m: Message, d: Deduct| {
        s.fetch_add(1, Ordering::SeqCst);
        let now = f.fetch_add(1, Ordering::SeqCst) + 1;
        mx.fetch_max(now, Ordering::SeqCst);
        let fut = handler(m, d);
        let f = f.clone();
        async move {
            // A slow handler: shutdown must wait for it.
            tokio::time::sleep(Duration::from_millis(150)).await;
            let r = fut.await;
            f.fetch_sub(1, Ordering::SeqCst);
            r
        }
    })
    .prefetch(2)
    .spawn()
    .await
    .unwrap();
    until("a few handlers to start", Duration::from_secs(5), || {
        started.load(Ordering::SeqCst) >= 3
    })
    .await;
    let stats = consumer.stats();
    consumer.shutdown().await.expect("clean shutdown");
    // Every handler that started finished, committed and was acked; the
    // rest is still in the queue (prefetched but unstarted work requeued).
    let started = started.load(Ordering::SeqCst);
    assert!((3..N).contains(&started), "started {started}");
    assert_eq!(stats.executed() as usize, started, "acked");
    assert_eq!(stats.settle_failed(), 0);
    let mut done = 0;
    for d in &coupons {
        done += deductions(&pool, d.coupon_id).await;
    }
    assert_eq!(done as usize, started, "committed");
    // The broker requeues the prefetched, unstarted deliveries on close.
    let start = Instant::now();
    while (ready(&conn, &t.queue).await as usize) < N - started {
        assert!(start.elapsed() < Duration::from_secs(2), "messages lost");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(ready(&conn, &t.queue).await as usize, N - started);
    assert!(
        max_in_flight.load(Ordering::SeqCst) <= 2,
        "prefetch 2 bounds the handlers in flight"
    );
    assert_eq!(in_flight.load(Ordering::SeqCst), 0, "none left running");
    teardown(&conn, &t).await;
}
