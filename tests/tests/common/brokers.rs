//! What the RabbitMQ and NATS tests share (`amqp/`, `nats/`), beside their
//! own helpers (`amqp.rs`, `nats.rs`, which re-export these): waiting for
//! the relay to publish a topic, or for a condition, and reading a counter.

use sqlx::PgPool;
use std::time::{Duration, Instant};

/// Waits for `cond` (at most `within`).
pub(crate) async fn until(what: &str, within: Duration, mut cond: impl FnMut() -> bool) {
    let start = Instant::now();
    while !cond() {
        assert!(start.elapsed() < within, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Waits until the relay has published every message of `topic` (each
/// outbox row `success`), at most `within`.
pub(crate) async fn drained(pool: &PgPool, topic: &str, within: Duration) {
    let start = Instant::now();
    loop {
        let pending: i64 = sqlx::query_scalar(
            "SELECT COUNT(*) FROM idem_outbox WHERE topic = $1 AND status <> 'success'",
        )
        .bind(topic)
        .fetch_one(pool)
        .await
        .unwrap();
        if pending == 0 {
            break;
        }
        assert!(
            start.elapsed() < within,
            "the relay did not drain {topic}: {pending} left"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
