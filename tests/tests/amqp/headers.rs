//! Headers and ordering keys through RabbitMQ: a message enqueued with
//! headers and an ordering key, forwarded by the relay with
//! `Publisher::route`, reaches the consumer's handler with every header
//! (`Message::header`, `Message::user_headers`) and the key
//! (`Message::ordering_key`, the `x-idem-ordering-key` header); user
//! headers named like idem's own (`x-idem-…`) or RabbitMQ's (`CC`) are not
//! carried, and idem's `x-idem-topic` keeps the outbox topic.

use crate::common::amqp::*;
use crate::common::hooks;
use idem_runtime::amqp::{ORDERING_KEY_HEADER, TOPIC_HEADER};
use idem_runtime::outbox::{EnqueueOptions, Relay, enqueue_with};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn headers_and_the_ordering_key_reach_the_handler_and_idems_own_win() {
    let _hooks = hooks::shared().await;
    let Some((pool, conn)) = servers().await else {
        return;
    };
    let (t, exchange, topic) = topology(&conn, "headers").await;
    let options = EnqueueOptions::new()
        .ordering_key("order-42")
        .header("tenant", "acme")
        .header("trace-id", "t-1 with spaces")
        .header("x-idem-topic", "forged")
        .header("X-Idem-Attempts", "7")
        .header("CC", "elsewhere");
    let plain = EnqueueOptions::new().header("tenant", "globex");
    let mut tx = pool.begin().await.unwrap();
    for (msg_id, o) in [("h-1", &options), ("h-2", &plain)] {
        let m = enqueue_with(&mut tx, &topic, msg_id, &serde_json::json!({ "n": 1 }), o)
            .await
            .unwrap();
        assert!(m.is_new());
    }
    tx.commit().await.unwrap();

    let relay = Relay::new(pool.clone())
        .route(
            topic.clone(),
            Publisher::new(conn.clone(), &exchange).route(),
        )
        .poll_interval(Duration::from_millis(20))
        .spawn();
    drained(&pool, &topic, Duration::from_secs(8)).await;
    relay.shutdown().await;

    let seen: Arc<Mutex<Vec<Message>>> = Arc::default();
    let s = seen.clone();
    let consumer = Consumer::new(
        conn.clone(),
        &t.queue,
        move |m: Message, _: serde_json::Value| {
            s.lock().unwrap().push(m);
            async move { Ok::<_, Error>(Outcome::Executed(())) }
        },
    )
    .spawn()
    .await
    .expect("consumer");
    until("both deliveries", Duration::from_secs(8), || {
        seen.lock().unwrap().len() >= 2
    })
    .await;
    consumer.shutdown().await.expect("clean shutdown");

    let mut seen = seen.lock().unwrap().clone();
    seen.sort_by(|a, b| a.message_id.cmp(&b.message_id));
    let (keyed, plain) = (&seen[0], &seen[1]);
    assert_eq!(keyed.message_id, "h-1");
    assert_eq!(keyed.header("tenant").as_deref(), Some("acme"));
    assert_eq!(keyed.header("trace-id").as_deref(), Some("t-1 with spaces"));
    assert_eq!(keyed.ordering_key().as_deref(), Some("order-42"));
    assert_eq!(
        keyed.header(ORDERING_KEY_HEADER).as_deref(),
        Some("order-42")
    );
    // Idem's own header keeps the topic; the forged ones never arrived.
    assert_eq!(keyed.header(TOPIC_HEADER).as_deref(), Some(topic.as_str()));
    assert_eq!(keyed.header("X-Idem-Attempts"), None);
    assert_eq!(keyed.header("CC"), None);
    assert_eq!(keyed.attempt, 1);
    let user: Vec<(String, String)> = keyed.user_headers().into_iter().collect();
    assert_eq!(
        user,
        [
            ("tenant".to_owned(), "acme".to_owned()),
            ("trace-id".to_owned(), "t-1 with spaces".to_owned()),
        ]
    );
    assert_eq!(plain.message_id, "h-2");
    assert_eq!(plain.header("tenant").as_deref(), Some("globex"));
    assert_eq!(plain.ordering_key(), None);
    assert_eq!(ready(&conn, &t.dead_letter_queue).await, 0);
    teardown(&conn, &t).await;
}
