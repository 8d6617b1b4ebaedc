//! A burst of concurrent calls.

use std::future::Future;
use std::sync::Arc;
use tokio::sync::Barrier;

/// Runs `n` calls at once: each is spawned, and one barrier releases them
/// together, the way a burst of redeliveries arrives. The results come
/// back in spawn order.
///
/// # Panics
///
/// When one of the calls panics.
pub async fn concurrently<F, Fut, T>(n: usize, f: F) -> Vec<T>
where
    F: Fn() -> Fut,
    Fut: Future<Output = T> + Send + 'static,
    T: Send + 'static,
{
    let barrier = Arc::new(Barrier::new(n));
    let tasks: Vec<_> = (0..n)
        .map(|_| {
            let b = barrier.clone();
            let fut = f();
            tokio::spawn(async move {
                b.wait().await;
                fut.await
            })
        })
        .collect();
    let mut out = Vec::with_capacity(n);
    for t in tasks {
        out.push(t.await.expect("task panicked"));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn all_run_and_results_keep_their_order() {
        let next = Arc::new(AtomicUsize::new(0));
        let out = concurrently(8, || {
            let i = next.fetch_add(1, Ordering::Relaxed);
            async move { i * 10 }
        })
        .await;
        assert_eq!(out, (0..8).map(|i| i * 10).collect::<Vec<_>>());
    }
}
