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
