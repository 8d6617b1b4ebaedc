//! The front cache's figures as metrics, through the `metrics` facade: a
//! recorder installed by the test counts `idem_cache_hits_total`,
//! `idem_cache_misses_total` and `idem_cache_errors_total` on the real
//! Redis and on a closed port. The recorder is the test's thread's own, so
//! the other cache tests of the binary do not count in it.

use crate::{Deduct, deduct};
use idem_runtime::cache::RedisCache;
use idem_runtime::{Outcome, Source};
use idem_testkit::{ids, redis_up};
use metrics::{
    Counter, CounterFn, Gauge, Histogram, Key, KeyName, Metadata, Recorder, SharedString, Unit,
};
use sqlx::SqlitePool;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

const CALLS: u64 = 12;

/// Counters by name (the cache's counters have no labels).
#[derive(Debug, Default)]
struct Counters(Mutex<HashMap<String, Arc<Count>>>);

#[derive(Debug, Default)]
struct Count(AtomicU64);

impl CounterFn for Count {
    fn increment(&self, value: u64) {
        self.0.fetch_add(value, Ordering::Relaxed);
    }
    fn absolute(&self, value: u64) {
        self.0.fetch_max(value, Ordering::Relaxed);
    }
}

impl Counters {
    fn get(&self, name: &str) -> u64 {
        self.0
            .lock()
            .unwrap()
            .get(name)
            .map_or(0, |c| c.0.load(Ordering::Relaxed))
    }
}

impl Recorder for &'static Counters {
    fn describe_counter(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_gauge(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_histogram(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn register_counter(&self, key: &Key, _: &Metadata<'_>) -> Counter {
        let mut all = self.0.lock().unwrap();
        Counter::from_arc(all.entry(key.name().to_string()).or_default().clone())
    }
    fn register_gauge(&self, _: &Key, _: &Metadata<'_>) -> Gauge {
        Gauge::noop()
    }
    fn register_histogram(&self, _: &Key, _: &Metadata<'_>) -> Histogram {
        Histogram::noop()
    }
}

async fn coupons(pool: &SqlitePool) -> Vec<Deduct> {
    let first = ids(CALLS as i64);
    let mut all = Vec::new();
    for id in first..first + CALLS as i64 {
        sqlx::query("INSERT INTO coupon (id, status) VALUES (?, 'UNUSED')")
            .bind(id)
            .execute(pool)
            .await
            .unwrap();
        all.push(Deduct { coupon_id: id });
    }
    all
}

/// The recorder is this test's thread's own (`with_local_recorder`), on a
/// runtime whose tasks all run on that thread: the other tests of the
/// binary, on theirs, record nothing into it.
#[test]
fn hits_misses_and_errors_are_reported_as_metrics() {
    let counters: &'static Counters = Box::leak(Box::default());
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    metrics::with_local_recorder(&counters, || runtime.block_on(run(counters)));
}

async fn run(counters: &'static Counters) {
    let pool = idem_testkit::sqlite(2).await;
    for stmt in [
        "CREATE TABLE coupon (id INTEGER PRIMARY KEY, status TEXT NOT NULL)",
        "CREATE TABLE deduction (coupon_id INTEGER NOT NULL)",
    ] {
        sqlx::query(stmt).execute(&pool).await.unwrap();
    }

    if redis_up().await {
        let cache = RedisCache::new(&idem_testkit::redis_url())
            .unwrap()
            .prefix(format!("idem-test-prod-metrics:{}:", ids(1)))
            .ttl(Duration::from_secs(300))
            .timeout(Duration::from_secs(2));
        assert!(cache.ready(Duration::from_secs(5)).await);
        let msgs = coupons(&pool).await;
        for m in &msgs {
            let first = deduct(Source::from(&pool).cache(&cache), m).await.unwrap();
            assert!(first.is_executed());
        }
        for m in &msgs {
            let again = deduct(Source::from(&pool).cache(&cache), m).await.unwrap();
            assert_eq!(again, Outcome::Duplicate(None));
        }
        let figures = [
            counters.get("idem_cache_misses_total"),
            counters.get("idem_cache_hits_total"),
            counters.get("idem_cache_errors_total"),
        ];
        assert_eq!(figures, [CALLS, CALLS, 0], "misses, hits, errors");
    }

    // A closed port: every call's lookup and marker write fail, each
    // counted once.
    let before = counters.get("idem_cache_errors_total");
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    drop(listener);
    let cache = RedisCache::new(&format!("redis://{addr}/"))
        .unwrap()
        .timeout(Duration::from_millis(200));
    for m in &coupons(&pool).await {
        assert!(
            deduct(Source::from(&pool).cache(&cache), m)
                .await
                .unwrap()
                .is_executed()
        );
    }
    assert_eq!(counters.get("idem_cache_errors_total") - before, 2 * CALLS);
    assert!(counters.get("idem_cache_connect_errors_total") >= 1);
    assert_eq!(cache.stats().fall_throughs(), CALLS);
}
