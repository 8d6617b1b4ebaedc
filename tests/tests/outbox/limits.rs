//! Per-topic limits (`Relay::topic_limit`) on every backend: a topic
//! limited to 2 at once and 25 a second never runs more than 2 of its
//! messages at once; while its handlers hang, another topic drains in
//! full (the limited topic takes neither the handler slots nor the
//! claims); released, it starts its messages at 25 a second (measured
//! from the handlers' start times, within 10%).

use crate::common::hooks;
use crate::common::relay::*;

/// Messages of each topic.
const N: usize = 40;

/// The limited topic's rate, per second.
const RATE: f64 = 25.0;

macro_rules! limit_tests {
    ($module:ident, $db:ty, $dialect:expr, $pool:expr) => {
        mod $module {
            #![allow(dead_code)]
            relay_fixtures!($module, $db, $dialect, $pool);
            use super::{N, RATE};
            use idem_runtime::outbox::TopicLimit;
            use std::sync::atomic::{AtomicBool, AtomicUsize};
            use std::sync::{Arc, Mutex};

            /// What the limited topic's handlers saw.
            #[derive(Default)]
            struct Seen {
                running: AtomicUsize,
                peak: AtomicUsize,
                starts: Mutex<Vec<Instant>>,
                release: AtomicBool,
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn a_limited_topic_keeps_its_limits_and_leaves_the_others_their_throughput() {
                let _hooks = hooks::shared().await;
                let Some(pool) = pool().await else { return };
                let (slow, fast) = (topic("limited"), topic("free"));
                let mut coupons = Vec::new();
                for _ in 0..N {
                    produce(&pool, &slow, 1).await;
                    coupons.push(produce(&pool, &fast, 1).await);
                }
                let seen = Arc::new(Seen::default());
                let s = seen.clone();
                let relay = Relay::new(pool.clone())
                    .route(slow.clone(), move |d, m: Deduct| {
                        let s = s.clone();
                        async move {
                            s.starts.lock().unwrap().push(Instant::now());
                            let now = s.running.fetch_add(1, Ordering::SeqCst) + 1;
                            s.peak.fetch_max(now, Ordering::SeqCst);
                            while !s.release.load(Ordering::SeqCst) {
                                tokio::time::sleep(Duration::from_millis(5)).await;
                            }
                            let done = deduct(d.source(), &m).await;
                            s.running.fetch_sub(1, Ordering::SeqCst);
                            done
                        }
                    })
                    .route(fast.clone(), |d, m: Deduct| async move {
                        deduct(d.source(), &m).await
                    })
                    .topic_limit(
                        slow.clone(),
                        TopicLimit::new().concurrency(2).per_second(RATE),
                    )
                    .concurrency(8)
                    .poll_interval(Duration::from_millis(10))
                    .spawn();
                // The limited topic's handlers hang: the other drains.
                drained(&pool, &fast).await;
                for coupon in coupons {
                    assert_eq!(
                        deductions(&pool, coupon).await,
                        1,
                        "the free topic acts once"
                    );
                }
                assert_eq!(
                    seen.starts.lock().unwrap().len(),
                    2,
                    "limited messages started while 2 hung"
                );
                assert_eq!(by_status(&pool, &slow, "pending").await, N as i64);
                seen.release.store(true, Ordering::SeqCst);
                drained(&pool, &slow).await;
                relay.shutdown().await;
                assert_eq!(by_status(&pool, &slow, "success").await, N as i64);
                assert!(
                    seen.peak.load(Ordering::SeqCst) <= 2,
                    "{} at once",
                    seen.peak.load(Ordering::SeqCst)
                );
                // The rate, from the starts after the release (the first
                // two started before it).
                let starts = seen.starts.lock().unwrap().clone();
                let after = &starts[2..];
                let span = after.last().unwrap().duration_since(after[0]).as_secs_f64();
                let rate = (after.len() - 1) as f64 / span;
                eprintln!(
                    "{}: {rate:.2} messages a second, limited to {RATE}",
                    stringify!($module)
                );
                assert!(
                    (rate - RATE).abs() <= RATE * 0.1,
                    "{rate:.2} a second, limited to {RATE}"
                );
            }
        }
    };
}

idem_testkit::for_each_backend!(limit_tests);
