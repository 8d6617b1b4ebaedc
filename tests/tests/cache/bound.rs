//! The front cache's documented bound and its figures, against network
//! faults and the real Redis: a Redis that accepts connections and never
//! answers (a TCP listener in the test that reads and never writes: the
//! network stand-in for a hung server), and a closed port. N concurrent
//! calls each finish within the configured bound (a lookup and a marker
//! write, connecting included) plus slack, and every call that fell
//! through is counted, per call; on the real Redis, hits and misses are
//! counted exactly. Every call's effect is counted in the database.

use crate::{Deduct, deduct};
use idem_runtime::cache::RedisCache;
use idem_runtime::{Outcome, Source};
use idem_testkit::{concurrently, ids, redis_up};
use sqlx::SqlitePool;
use sqlx::sqlite::{SqliteConnectOptions, SqlitePoolOptions};
use std::str::FromStr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};
use tokio::io::AsyncReadExt;

const CALLS: usize = 16;
const BOUND: Duration = Duration::from_millis(200);
/// A loaded 2-core machine: the slack over the documented bound.
const SLACK: Duration = Duration::from_secs(1);

/// One in-memory database per call: the calls share the cache, never a
/// database, so no call waits for another's write lock or fsync and the
/// database's part of each call is small and steady (a shared file
/// database made it vary by seconds under load, which is no property of
/// the cache).
async fn setup() -> Vec<SqlitePool> {
    let mut pools = Vec::with_capacity(CALLS);
    for _ in 0..CALLS {
        let opts = SqliteConnectOptions::from_str("sqlite::memory:").expect("valid URL");
        // One connection that lives as long as the pool: it is the database.
        let pool = SqlitePoolOptions::new()
            .min_connections(1)
            .max_connections(1)
            .idle_timeout(None)
            .max_lifetime(None)
            .connect_with(opts)
            .await
            .expect("open an in-memory database");
        idem_runtime::migrate(&pool).await.expect("migrate");
        for stmt in [
            "CREATE TABLE coupon (id INTEGER PRIMARY KEY, status TEXT NOT NULL)",
            "CREATE TABLE deduction (coupon_id INTEGER NOT NULL)",
        ] {
            sqlx::query(stmt).execute(&pool).await.unwrap();
        }
        pools.push(pool);
    }
    pools
}

/// A fresh coupon in each call's database.
async fn coupons(pools: &[SqlitePool]) -> Vec<i64> {
    let first = ids(pools.len() as i64);
    let mut all = Vec::with_capacity(pools.len());
    for (i, pool) in pools.iter().enumerate() {
        let id = first + i as i64;
        sqlx::query("INSERT INTO coupon (id, status) VALUES (?, 'UNUSED')")
            .bind(id)
            .execute(pool)
            .await
            .unwrap();
        all.push(id);
    }
    all
}

async fn deductions(pools: &[SqlitePool]) -> i64 {
    let mut n = 0;
    for pool in pools {
        n += sqlx::query_scalar::<_, i64>("SELECT COUNT(*) FROM deduction")
            .fetch_one(pool)
            .await
            .unwrap();
    }
    n
}

/// `CALLS` concurrent calls, one per coupon (call `i` on database `i`),
/// released together; each call's outcome and duration.
async fn burst(
    pools: &[SqlitePool],
    cache: Option<&RedisCache>,
    coupons: &[i64],
) -> Vec<(Outcome<()>, Duration)> {
    let next = AtomicUsize::new(0);
    concurrently(coupons.len(), || {
        let i = next.fetch_add(1, Ordering::Relaxed);
        let (pool, cache, msg) = (
            pools[i].clone(),
            cache.cloned(),
            Deduct {
                coupon_id: coupons[i],
            },
        );
        async move {
            let start = Instant::now();
            let source = match &cache {
                Some(c) => Source::from(&pool).cache(c),
                None => Source::from(&pool),
            };
            let outcome = deduct(source, &msg).await.expect("the database answers");
            (outcome, start.elapsed())
        }
    })
    .await
}

/// A "Redis" that accepts every connection and never answers: it reads
/// whatever it is sent and keeps the socket open.
async fn silent_redis() -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut buf = [0u8; 4096];
                while matches!(socket.read(&mut buf).await, Ok(n) if n > 0) {}
            });
        }
    });
    format!("redis://{addr}/")
}

/// A port nothing listens on.
async fn closed_port() -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    drop(listener);
    format!("redis://{addr}/")
}

/// The fault case: a baseline burst without cache (what the database
/// alone costs), then a burst through the faulty cache. Each call takes at
/// most the baseline's slowest call, plus the bound twice (its lookup, and
/// its marker write after the commit), plus slack; each fell through
/// once (its lookup) and failed twice (lookup and write), counted per
/// call; every deduction happened once.
async fn faulty_cache_stays_within_its_bound(url: String) -> RedisCache {
    let pools = setup().await;
    let baseline = coupons(&pools).await;
    let without = burst(&pools, None, &baseline).await;
    let slowest_db = without.iter().map(|(_, d)| *d).max().unwrap();

    let cache = RedisCache::new(&url).unwrap().timeout(BOUND);
    let ids = coupons(&pools).await;
    let with = burst(&pools, Some(&cache), &ids).await;
    let limit = slowest_db + BOUND * 2 + SLACK;
    for (i, (outcome, took)) in with.iter().enumerate() {
        assert!(outcome.is_executed(), "call {i}: {outcome:?}");
        assert!(
            *took <= limit,
            "call {i} took {took:?}: more than the bound allows ({limit:?}: the database's \
             {slowest_db:?} + 2 × {BOUND:?} + {SLACK:?})"
        );
    }
    assert_eq!(deductions(&pools).await, 2 * CALLS as i64);
    let s = cache.stats();
    let n = CALLS as u64;
    assert_eq!(s.fall_throughs(), n, "one fall-through per call");
    assert_eq!(
        s.errors(),
        2 * n,
        "a failed lookup and a failed write per call"
    );
    assert_eq!(s.hits(), 0);
    assert_eq!(s.misses(), 0);
    assert_eq!(s.writes(), 0);
    cache
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_that_never_answers_costs_each_call_at_most_the_bound() {
    let started = Instant::now();
    let cache = faulty_cache_stays_within_its_bound(silent_redis().await).await;
    // Connection attempts are not calls: a few at most, one a second.
    let attempts = cache.stats().connect_errors();
    assert!(
        attempts <= started.elapsed().as_secs() + 1,
        "{attempts} connection attempts counted"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_closed_port_costs_each_call_at_most_the_bound() {
    let started = Instant::now();
    let cache = faulty_cache_stays_within_its_bound(closed_port().await).await;
    let attempts = cache.stats().connect_errors();
    assert!(attempts >= 1, "the failed connection attempt is counted");
    assert!(
        attempts <= started.elapsed().as_secs() + 1,
        "{attempts} connection attempts counted"
    );
}

/// The real Redis: first calls miss (and write their marker), second calls
/// hit; nothing falls through, nothing is deducted twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_real_redis_counts_hits_and_misses() {
    if !redis_up().await {
        return;
    }
    let pools = setup().await;
    // A bound generous enough for the first connection on a loaded machine.
    let cache = RedisCache::new(&idem_testkit::redis_url())
        .unwrap()
        .prefix(format!("idem-test-prod:{}:", ids(1)))
        .ttl(Duration::from_secs(300))
        .timeout(Duration::from_secs(2));
    let ids = coupons(&pools).await;
    let first = burst(&pools, Some(&cache), &ids).await;
    assert!(first.iter().all(|(o, _)| o.is_executed()), "{first:?}");
    let again = burst(&pools, Some(&cache), &ids).await;
    assert!(
        again.iter().all(|(o, _)| *o == Outcome::Duplicate(None)),
        "{again:?}"
    );
    assert_eq!(deductions(&pools).await, CALLS as i64);
    let s = cache.stats();
    let n = CALLS as u64;
    let figures = [
        s.misses(),
        s.writes(),
        s.hits(),
        s.fall_throughs(),
        s.errors(),
    ];
    assert_eq!(
        figures,
        [n, n, n, 0, 0],
        "misses, writes, hits, fall-throughs, errors"
    );
}
