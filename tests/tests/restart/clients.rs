//! The HTTP side: clients that send `Idempotency-Key` requests and retry
//! the same key (same body) until it is answered, as the draft asks of a
//! client: after a `503` (the database is down), a `409` (the key's first
//! request is still in flight, or its lease has not run out yet), or a
//! connection error.

use crate::common::http;
use crate::{Duration, Instant};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

/// What the clients saw.
#[derive(Debug, Default)]
pub(crate) struct Seen {
    pub(crate) unavailable: AtomicU64,
    pub(crate) in_flight: AtomicU64,
    pub(crate) answered: AtomicU64,
}

impl Seen {
    pub(crate) fn get(c: &AtomicU64) -> u64 {
        c.load(Ordering::Relaxed)
    }
}

/// Sends order `order` under the key `key` to `{base}/orders` until it
/// is answered with a success (at most 120 s); panics on any other
/// answer.
async fn until_answered(base: &str, key: &str, order: i64, seen: &Seen) {
    let start = Instant::now();
    let client = http::client();
    loop {
        assert!(
            start.elapsed() < Duration::from_secs(120),
            "{key} unanswered after 120 s"
        );
        let sent = client
            .post(format!("{base}/orders"))
            .header("x-api-key", "caller-1")
            .header("content-type", "application/json")
            .header("idempotency-key", format!("\"{key}\""))
            .body(format!("{{\"id\":{order}}}"))
            .timeout(Duration::from_secs(30))
            .send()
            .await;
        let status = match sent {
            Ok(resp) if resp.status().is_success() => {
                seen.answered.fetch_add(1, Ordering::Relaxed);
                return;
            }
            Ok(resp) => resp.status().as_u16(),
            Err(_) => 0,
        };
        match status {
            503 => seen.unavailable.fetch_add(1, Ordering::Relaxed),
            409 => seen.in_flight.fetch_add(1, Ordering::Relaxed),
            0 => 0,
            other => panic!("{key}: answered {other}"),
        };
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// `clients` tasks sending the orders `orders` (each under its own key,
/// `{prefix}-{order}`), one after the other each.
pub(crate) fn send(
    base: &str,
    prefix: &str,
    orders: &[i64],
    clients: usize,
    seen: &Arc<Seen>,
) -> tokio::task::JoinSet<()> {
    let mut tasks = tokio::task::JoinSet::new();
    for part in orders.chunks(orders.len().div_ceil(clients).max(1)) {
        let (base, prefix, part, seen) = (
            base.to_owned(),
            prefix.to_owned(),
            part.to_vec(),
            seen.clone(),
        );
        tasks.spawn(async move {
            for order in part {
                until_answered(&base, &format!("{prefix}-{order}"), order, &seen).await;
            }
        });
    }
    tasks
}

/// Waits for every task of `tasks`; panics with the first that failed.
pub(crate) async fn join(mut tasks: tokio::task::JoinSet<()>) {
    while let Some(done) = tasks.join_next().await {
        done.expect("an HTTP client");
    }
}
