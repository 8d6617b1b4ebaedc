//! Duplicate rejection through the Redis front cache against the database
//! path, side by side in one run, on PostgreSQL.
//!
//! Every coupon is deducted once first; then the same messages are
//! redelivered (all duplicates) by C concurrent workers for a fixed time,
//! alternating between the two paths in several rounds:
//!
//! - database path: `deduct(&pool, &msg)` — BEGIN, the state read under
//!   a row lock, USED → Duplicate, COMMIT;
//! - cache path: `deduct(Source::from(&pool).cache(&cache), &msg)` — one
//!   Redis GET answers the duplicate.
//!
//! Prints rejections per second and p50/p99 latency for each, and the
//! throughput ratio (target: the cache path at least 5x the database path).
//!
//! `cargo run --release -p idem-examples --bin bench_cache [-- --coupons N --concurrency C --seconds S --rounds R]`

use clap::Parser;
use idem_runtime::cache::RedisCache;
use idem_runtime::{Outcome, Source, State, idempotent};
use sqlx::postgres::PgPoolOptions;
use sqlx::{PgPool, Postgres, Transaction};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

#[derive(Debug, Clone, Copy, PartialEq, Eq, State)]
enum CouponState {
    Unused,
    Used,
}

#[derive(Debug, Clone)]
struct Deduct {
    coupon_id: i64,
}

#[idempotent(
    key = "bench-cache:{msg.coupon_id}",
    strategy = state_machine,
    table = "bench_cache_coupon",
    id = msg.coupon_id,
    from = CouponState::Unused,
    to = CouponState::Used,
)]
async fn deduct(tx: &mut Transaction<'_, Postgres>, msg: &Deduct) -> Result<(), sqlx::Error> {
    sqlx::query("INSERT INTO bench_cache_deduction (coupon_id) VALUES ($1)")
        .bind(msg.coupon_id)
        .execute(&mut **tx)
        .await?;
    Ok(())
}

/// Duplicate rejection through the Redis front cache against the database
/// path.
#[derive(Debug, Clone, Parser)]
#[command(name = "bench_cache", args_override_self = true)]
struct Args {
    /// Coupons, each deducted once before the duplicates.
    #[arg(long, value_name = "N", default_value_t = 2000)]
    coupons: u64,
    /// Concurrent workers.
    #[arg(long, value_name = "C", default_value_t = 8)]
    concurrency: u64,
    /// Seconds per path and round.
    #[arg(long, value_name = "S", default_value_t = 3)]
    seconds: u64,
    /// Rounds.
    #[arg(long, value_name = "R", default_value_t = 3)]
    rounds: u64,
}

#[derive(Default)]
struct Run {
    ops: u64,
    latencies: Vec<Duration>,
    elapsed: Duration,
}

impl Run {
    fn rate(&self) -> f64 {
        self.ops as f64 / self.elapsed.as_secs_f64()
    }
    fn quantile(&mut self, q: f64) -> Duration {
        self.latencies.sort_unstable();
        let i = ((self.latencies.len() as f64 - 1.0) * q).round() as usize;
        self.latencies.get(i).copied().unwrap_or_default()
    }
}

async fn measure(
    pool: &PgPool,
    cache: Option<&RedisCache>,
    coupons: i64,
    concurrency: u64,
    seconds: u64,
) -> Run {
    let stop = Arc::new(AtomicBool::new(false));
    let start = Instant::now();
    let mut workers = Vec::new();
    for w in 0..concurrency {
        let (pool, cache, stop) = (pool.clone(), cache.cloned(), stop.clone());
        workers.push(tokio::spawn(async move {
            let mut run = Run::default();
            let mut i = w as i64;
            while !stop.load(Ordering::Relaxed) {
                let msg = Deduct {
                    coupon_id: 1 + i % coupons,
                };
                i += concurrency as i64;
                let t = Instant::now();
                let source = match &cache {
                    Some(c) => Source::from(&pool).cache(c),
                    None => Source::from(&pool),
                };
                let outcome = deduct(source, &msg).await.expect("duplicate call");
                run.latencies.push(t.elapsed());
                assert_eq!(
                    outcome,
                    Outcome::Duplicate(None),
                    "every call is a duplicate"
                );
                run.ops += 1;
            }
            run
        }));
    }
    tokio::time::sleep(Duration::from_secs(seconds)).await;
    stop.store(true, Ordering::Relaxed);
    let mut total = Run::default();
    for w in workers {
        let r = w.await.expect("worker");
        total.ops += r.ops;
        total.latencies.extend(r.latencies);
    }
    total.elapsed = start.elapsed();
    total
}

#[tokio::main]
async fn main() {
    let args = Args::parse();
    let coupons = args.coupons as i64;
    let (concurrency, seconds, rounds) = (args.concurrency, args.seconds, args.rounds);
    let url = idem_examples::bench::postgres_url();
    let redis_url =
        idem_testkit::env_setting("REDIS_URL").unwrap_or_else(|| "redis://127.0.0.1:6379/".into());
    let pool = match PgPoolOptions::new()
        .max_connections(concurrency as u32 + 2)
        .connect(&url)
        .await
    {
        Ok(p) => p,
        Err(e) => {
            eprintln!("bench_cache needs PostgreSQL at {url}: {e}");
            std::process::exit(1);
        }
    };
    idem_runtime::migrate(&pool).await.expect("migrate");
    for stmt in [
        "DROP TABLE IF EXISTS bench_cache_coupon",
        "DROP TABLE IF EXISTS bench_cache_deduction",
        "CREATE TABLE bench_cache_coupon (id BIGINT PRIMARY KEY, status VARCHAR(16) NOT NULL)",
        "CREATE TABLE bench_cache_deduction (coupon_id BIGINT NOT NULL)",
    ] {
        sqlx::query(stmt).execute(&pool).await.expect("setup");
    }
    sqlx::query("INSERT INTO bench_cache_coupon SELECT g, 'UNUSED' FROM generate_series(1, $1) g")
        .bind(coupons)
        .execute(&pool)
        .await
        .expect("coupons");
    let cache = RedisCache::new(&redis_url)
        .expect("redis url")
        .prefix(format!("bench-cache:{}:", std::process::id()));
    // The first delivery of every message executes and warms the cache.
    for id in 1..=coupons {
        let o = deduct(Source::from(&pool).cache(&cache), &Deduct { coupon_id: id })
            .await
            .expect("deduct");
        assert!(o.is_executed());
    }
    if cache.stats().writes() != coupons as u64 {
        eprintln!("bench_cache needs Redis at {redis_url}: markers were not written");
        std::process::exit(1);
    }
    println!(
        "duplicate rejection, {coupons} coupons, {concurrency} workers, {rounds} rounds of {seconds}s per path"
    );
    let (mut db_all, mut cache_all) = (Run::default(), Run::default());
    for round in 1..=rounds {
        let mut db = measure(&pool, None, coupons, concurrency, seconds).await;
        let mut ca = measure(&pool, Some(&cache), coupons, concurrency, seconds).await;
        println!(
            "round {round}: database {:>8.0}/s p99 {:>7.2} ms | cache {:>8.0}/s p99 {:>7.2} ms",
            db.rate(),
            db.quantile(0.99).as_secs_f64() * 1e3,
            ca.rate(),
            ca.quantile(0.99).as_secs_f64() * 1e3,
        );
        for (all, r) in [(&mut db_all, db), (&mut cache_all, ca)] {
            all.ops += r.ops;
            all.elapsed += r.elapsed;
            all.latencies.extend(r.latencies);
        }
    }
    let deductions: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM bench_cache_deduction")
        .fetch_one(&pool)
        .await
        .expect("count");
    assert_eq!(deductions, coupons, "exactly one deduction per coupon");
    println!(
        "database path: {:>8.0} rejections/s  p50 {:.2} ms  p99 {:.2} ms",
        db_all.rate(),
        db_all.quantile(0.50).as_secs_f64() * 1e3,
        db_all.quantile(0.99).as_secs_f64() * 1e3
    );
    println!(
        "cache path:    {:>8.0} rejections/s  p50 {:.2} ms  p99 {:.2} ms",
        cache_all.rate(),
        cache_all.quantile(0.50).as_secs_f64() * 1e3,
        cache_all.quantile(0.99).as_secs_f64() * 1e3
    );
    println!("cache errors during the run: {}", cache.stats().errors());
    println!(
        "ratio cache/database throughput: {:.1}x",
        cache_all.rate() / db_all.rate()
    );
    println!(
        "ratio database/cache p99 latency: {:.1}x",
        db_all.quantile(0.99).as_secs_f64() / cache_all.quantile(0.99).as_secs_f64()
    );
}
