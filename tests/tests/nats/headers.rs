//! Headers and ordering keys through JetStream: a message enqueued with
//! headers and an ordering key, forwarded by the relay with
//! `Publisher::route`, reaches the consumer's handler with every header
//! (`Message::header`, `Message::user_headers`) and the key
//! (`Message::ordering_key`, the `Idem-Ordering-Key` header); user headers
//! named like idem's own (`Idem-…`) or the server's (`Nats-…`) are not
//! carried: `Nats-Msg-Id` stays the outbox `msg_id` and `Idem-Topic` the
//! outbox topic.

use crate::common::hooks;
use crate::common::nats::*;
use idem_runtime::nats::{ORDERING_KEY_HEADER, TOPIC_HEADER};
use idem_runtime::outbox::{EnqueueOptions, Relay, enqueue_with};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn headers_and_the_ordering_key_reach_the_handler_and_idems_own_win() {
    let _hooks = hooks::shared().await;
    let Some((pool, js, table)) = servers().await else {
        return;
    };
    let t = topology(&js, "headers", |t| t).await;
    let topic = t.subjects[0].clone();
    let options = EnqueueOptions::new()
        .ordering_key("order-42")
        .header("Tenant", "acme")
        .header("trace-id", "t-1 with spaces")
        .header("Nats-Msg-Id", "forged")
        .header("idem-topic", "forged")
        .header("Nats-Rollup", "all");
    let plain = EnqueueOptions::new().header("Tenant", "globex");
    let mut tx = pool.begin().await.unwrap();
    for (msg_id, o) in [("h-1", &options), ("h-2", &plain)] {
        let m = enqueue_with(
            &mut tx,
            &topic,
            msg_id,
            &serde_json::json!({ "item": 1 }),
            o,
        )
        .await
        .unwrap();
        assert!(m.is_new());
    }
    tx.commit().await.unwrap();

    let publisher = Publisher::new(js.clone()).expected_stream(&t.stream);
    let relay = Relay::new(pool.clone())
        .route(topic.clone(), publisher.route())
        .poll_interval(Duration::from_millis(20))
        .spawn();
    drained(&pool, &topic, Duration::from_secs(8)).await;
    relay.shutdown().await;
    // Both stored: the forged `Nats-Rollup` purged nothing.
    assert_eq!(stored(&js, &t.stream).await, 2);

    let seen: Arc<Mutex<Vec<Message>>> = Arc::default();
    let s = seen.clone();
    let consumer = Consumer::new(
        js.clone(),
        &t.stream,
        &t.consumer,
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
    // Idem's own headers hold the outbox's values.
    assert_eq!(keyed.message_id, "h-1");
    assert_eq!(keyed.header("Nats-Msg-Id"), Some("h-1"));
    assert_eq!(keyed.header(TOPIC_HEADER), Some(topic.as_str()));
    assert_eq!(keyed.header("idem-topic"), None);
    assert_eq!(keyed.header("Nats-Rollup"), None);
    assert_eq!(keyed.header("Tenant"), Some("acme"));
    assert_eq!(keyed.header("trace-id"), Some("t-1 with spaces"));
    assert_eq!(keyed.ordering_key(), Some("order-42"));
    assert_eq!(keyed.header(ORDERING_KEY_HEADER), Some("order-42"));
    let user: Vec<(String, String)> = keyed.user_headers().into_iter().collect();
    assert_eq!(
        user,
        [
            ("Tenant".to_owned(), "acme".to_owned()),
            ("trace-id".to_owned(), "t-1 with spaces".to_owned()),
        ]
    );
    assert_eq!(plain.message_id, "h-2");
    assert_eq!(plain.header("Tenant"), Some("globex"));
    assert_eq!(plain.ordering_key(), None);
    teardown(&js, &t).await;
    drop_table(&pool, &table).await;
}
