//! Waiting on a condition, never on a clock: the tests' one way to let
//! something happen.

use std::future::Future;
use std::time::{Duration, Instant};

/// Checks `cond` every 50 ms until it holds; panics with "timed out
/// waiting for {what}" once `within` has passed (a generous deadline: the
/// condition, not the time, is what the test asserts).
pub async fn wait_for<F, Fut>(what: &str, within: Duration, mut cond: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let start = Instant::now();
    while !cond().await {
        assert!(start.elapsed() < within, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Waits until every outbox message of `topic` on `pool` (a `sqlx::Any`
/// pool on a database of `dialect`) is `success`: a relay has published
/// them all (at most `within`).
pub async fn published(
    pool: &sqlx::AnyPool,
    dialect: idem_runtime::Dialect,
    topic: &str,
    within: Duration,
) {
    wait_for("the outbox drained", within, || async move {
        let left: i64 = sqlx::query_scalar(crate::sql(
            dialect,
            "SELECT COUNT(*) FROM idem_outbox WHERE topic = ? AND status <> 'success'",
        ))
        .bind(topic)
        .fetch_one(pool)
        .await
        .expect("pending messages");
        left == 0
    })
    .await;
}
