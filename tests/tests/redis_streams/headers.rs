//! Headers and ordering keys in stream entries: a message enqueued with
//! headers and an ordering key, forwarded by the relay with
//! `Publisher::route`, is an entry with the field `h.<name>` per header
//! and the field `ordering_key` (read back with `XRANGE`), and reaches the
//! consumer's handler with them (`Message::header`,
//! `Message::user_headers`, `Message::ordering_key`). Headers named like
//! idem's own fields (`msg_id`, `topic`, `payload`) cannot replace them.

use crate::common::hooks;
use crate::common::redis_streams::*;
use idem_runtime::outbox::{EnqueueOptions, Relay, enqueue_with};
use idem_runtime::redis_streams::{HEADER_FIELD_PREFIX, ORDERING_KEY_FIELD};
use std::sync::{Arc, Mutex};

/// Waits until the relay published every message of `topic`.
async fn drained(pool: &AnyPool, d: Dialect, topic: &str) {
    wait_for(
        "the relay to publish",
        Duration::from_secs(8),
        || async move {
            let left: i64 = sqlx::query_scalar(sql(
                d,
                "SELECT COUNT(*) FROM idem_outbox WHERE topic = ? AND status <> 'success'",
            ))
            .bind(topic)
            .fetch_one(pool)
            .await
            .expect("pending");
            left == 0
        },
    )
    .await;
}

/// The first `n` messages a consumer of `stream` hands its handler.
async fn handled(client: &redis::Client, stream: &str, n: usize) -> Vec<Message> {
    let seen: Arc<Mutex<Vec<Message>>> = Arc::default();
    let s = seen.clone();
    let consumer = Consumer::new(
        client.clone(),
        stream,
        "headers",
        move |m: Message, _: serde_json::Value| {
            s.lock().unwrap().push(m);
            async move { Ok::<_, Error>(Outcome::Executed(())) }
        },
    )
    .spawn()
    .await
    .expect("consumer");
    wait_for("the entries handled", Duration::from_secs(8), || {
        let len = seen.lock().unwrap().len();
        async move { len >= n }
    })
    .await;
    consumer.shutdown().await.expect("clean shutdown");
    seen.lock().unwrap().clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn headers_and_the_ordering_key_are_fields_and_idems_own_win() {
    let _hooks = hooks::shared().await;
    let Some(client) = shared_redis().await else {
        return;
    };
    let Some((pool, d)) = database("postgres").await else {
        return;
    };
    let topic = unique("idem_rs_headers");
    let options = EnqueueOptions::new()
        .ordering_key("order-42")
        .header("tenant", "acme")
        .header("msg_id", "forged")
        .header("topic", "forged")
        .header("payload", "forged");
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
        .route(topic.clone(), Publisher::new(client.clone()).route())
        .poll_interval(Duration::from_millis(20))
        .spawn();
    drained(&pool, d, &topic).await;
    relay.shutdown().await;

    // On the server: idem's fields, then the headers under `h.`.
    let stored = entries(&client, &topic).await;
    assert_eq!(stored.len(), 2);
    // (In either order: the relay publishes the two side by side.)
    let by_id = |id: &str| {
        stored
            .iter()
            .find(|e| field(e, "msg_id") == Some(id))
            .expect("the entry")
    };
    let keyed = by_id("h-1");
    assert_eq!(field(keyed, "topic"), Some(topic.as_str()));
    assert_eq!(field(keyed, "payload"), Some(r#"{"n":1}"#));
    assert_eq!(field(keyed, ORDERING_KEY_FIELD), Some("order-42"));
    let prefix = HEADER_FIELD_PREFIX;
    for (name, value) in [
        ("tenant", "acme"),
        ("msg_id", "forged"),
        ("topic", "forged"),
        ("payload", "forged"),
    ] {
        assert_eq!(field(keyed, &format!("{prefix}{name}")), Some(value));
    }
    assert_eq!(field(by_id("h-2"), "h.tenant"), Some("globex"));
    assert_eq!(field(by_id("h-2"), ORDERING_KEY_FIELD), None);

    // In the handler.
    let mut seen = handled(&client, &topic, 2).await;
    seen.sort_by(|a, b| a.msg_id.cmp(&b.msg_id));
    let (keyed, plain) = (&seen[0], &seen[1]);
    assert_eq!(keyed.msg_id, "h-1");
    assert_eq!(keyed.topic.as_deref(), Some(topic.as_str()));
    assert_eq!(keyed.body, br#"{"n":1}"#);
    assert_eq!(keyed.header("tenant"), Some(&b"acme"[..]));
    assert_eq!(keyed.header("msg_id"), Some(&b"forged"[..]));
    assert_eq!(keyed.ordering_key(), Some(&b"order-42"[..]));
    let names: Vec<&str> = keyed.user_headers().iter().map(|(n, _)| *n).collect();
    assert_eq!(names, ["msg_id", "payload", "tenant", "topic"]);
    assert_eq!(plain.header("tenant"), Some(&b"globex"[..]));
    assert_eq!(plain.ordering_key(), None);
    delete(&client, &[&topic, &format!("{topic}:dlq")]).await;
}
