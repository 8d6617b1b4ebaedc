//! Every metric idem reports is described: a relay's run (deliveries,
//! retries, dead letters, a batch), calls, and a consumer's counters, on
//! SQLite, then each name the recorder was given (by this test and any
//! other of the binary) has a description from
//! `idem_runtime::metrics::describe`, with a unit.

use crate::common::hooks;
use crate::recorder::recorded;
use idem_runtime::consume::{ConsumerStats, Counter};
use idem_runtime::outbox::{Relay, enqueue};
use idem_runtime::{Error, Outcome};
use metrics::Unit;
use std::time::Duration;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_reported_metric_is_described() {
    let _hooks = hooks::shared().await;
    let recorded = recorded();
    let pool = idem_testkit::sqlite(4).await;
    let mut tx = pool.begin().await.unwrap();
    for n in 0..4 {
        let topic = if n % 2 == 0 {
            "described.ok"
        } else {
            "described.failing"
        };
        let payload = serde_json::json!({ "n": n });
        enqueue(&mut tx, topic, &format!("m-{n}"), &payload)
            .await
            .unwrap();
    }
    // A producer retry: `idem_outbox_already_enqueued_total`.
    let again = enqueue(
        &mut tx,
        "described.ok",
        "m-0",
        &serde_json::json!({ "n": 0 }),
    )
    .await;
    assert!(!again.unwrap().is_new());
    tx.commit().await.unwrap();
    let relay =
        Relay::new(pool.clone())
            .route("described.ok", |_d, _m: serde_json::Value| async move {
                Ok::<_, Error>(Outcome::Executed(()))
            })
            .route(
                "described.failing",
                |_d, _m: serde_json::Value| async move {
                    Err::<Outcome<()>, _>(Error::retryable("down"))
                },
            )
            .backoff(Duration::from_millis(5), Duration::from_millis(10))
            .max_attempts(2)
            .commit_batch(2);
    while relay.run_once().await.unwrap() > 0 {}
    tokio::time::sleep(Duration::from_millis(30)).await;
    while relay.run_once().await.unwrap() > 0 {}
    let consumer = ConsumerStats::default();
    consumer.count(Counter::Received);
    consumer.acked(true);

    let names = recorded.names();
    for wanted in [
        "idem_outbox_handler_duration_seconds",
        "idem_outbox_attempts",
        "idem_outbox_retries_total",
        "idem_outbox_dead_letters_total",
        "idem_outbox_already_enqueued_total",
        "idem_relay_claims_total",
        "idem_relay_claimed_total",
        "idem_relay_batches_total",
        "idem_consumer_received_total",
        "idem_consumer_executed_total",
    ] {
        assert!(
            names.iter().any(|n| n == wanted),
            "{wanted} not reported: {names:?}"
        );
    }
    let undescribed: Vec<&String> = names
        .iter()
        .filter(|n| n.starts_with("idem_") && recorded.description(n).flatten().is_none())
        .collect();
    assert!(
        undescribed.is_empty(),
        "reported without a description or unit: {undescribed:?}"
    );
    let seconds = recorded.description("idem_outbox_handler_duration_seconds");
    assert_eq!(seconds, Some(Some(Unit::Seconds)));
}
