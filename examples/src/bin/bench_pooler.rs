//! The cost of transaction-pooling mode (`idem_runtime::pooler`) on a
//! direct connection to PostgreSQL, side by side in one run: the same
//! `record` calls with the mode off (named statements, prepared once per
//! connection and cached) and on (the unnamed statement, parsed on every
//! run), alternating in rounds, each round on a fresh pool (an empty
//! statement cache, so no round reuses the other mode's statements).
//!
//! Each call is a new key (BEGIN, the record insert, the body's insert,
//! the result stored, COMMIT); then every key is called again (a
//! duplicate: BEGIN, the record read, COMMIT).
//!
//! `cargo run --release -p idem-examples --bin bench_pooler [-- --calls N --concurrency C --rounds R --url URL]`

use clap::Parser;
use idem_runtime::{idempotent, pooler};
use sqlx::postgres::PgPoolOptions;
use sqlx::{PgPool, Postgres, Transaction};
use std::sync::Arc;
use std::time::{Duration, Instant};

#[derive(Debug, Clone, serde::Serialize)]
struct Notice {
    id: i64,
}

#[idempotent(key = "bench-pooler:{n.id}", strategy = record, biz_type = "bench_pooler", biz_no = n.id, ttl = "1d")]
async fn notify(tx: &mut Transaction<'_, Postgres>, n: &Notice) -> Result<i64, sqlx::Error> {
    sqlx::query("INSERT INTO bench_pooler_sent (id) VALUES ($1)")
        .persistent(pooler::persistent())
        .bind(n.id)
        .execute(&mut **tx)
        .await?;
    Ok(n.id)
}

/// The cost of transaction-pooling mode on a direct connection.
#[derive(Debug, Clone, Parser)]
#[command(name = "bench_pooler", args_override_self = true)]
struct Args {
    /// Calls per round and mode (new keys; then as many duplicates).
    #[arg(long, value_name = "N", default_value_t = 2000)]
    calls: usize,
    /// Concurrent callers (and pool connections).
    #[arg(long, value_name = "C", default_value_t = 8)]
    concurrency: usize,
    /// Rounds, each running both modes.
    #[arg(long, value_name = "R", default_value_t = 3)]
    rounds: usize,
    /// PostgreSQL URL.
    #[arg(long, default_value = "postgres://postgres@127.0.0.1:5432/test")]
    url: String,
}

/// Runs `calls` calls of ids `base..` on `c` workers; returns the seconds.
async fn burst(pool: &PgPool, base: i64, calls: usize, c: usize) -> f64 {
    let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let start = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..c {
        let (pool, next) = (pool.clone(), next.clone());
        tasks.push(tokio::spawn(async move {
            loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                if i >= calls {
                    break;
                }
                let n = Notice {
                    id: base + i as i64,
                };
                let _ = notify(&pool, &n).await.expect("call");
            }
        }));
    }
    for t in tasks {
        t.await.expect("worker");
    }
    start.elapsed().as_secs_f64()
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = Args::parse();
    let setup = PgPoolOptions::new()
        .max_connections(2)
        .connect(&args.url)
        .await?;
    idem_runtime::migrate(&setup).await?;
    sqlx::query("CREATE TABLE IF NOT EXISTS bench_pooler_sent (id BIGINT NOT NULL)")
        .execute(&setup)
        .await?;
    let stamp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .as_micros() as i64;
    let mut base = stamp * 1000;
    // [mode][executions, duplicates] seconds.
    let mut total = [[0.0f64; 2]; 2];
    println!(
        "bench_pooler: {} calls per round and mode, {} concurrent, {} rounds, {}",
        args.calls, args.concurrency, args.rounds, args.url
    );
    for round in 0..args.rounds {
        for (m, on) in [false, true].into_iter().enumerate() {
            pooler::transaction_mode(on);
            let pool = PgPoolOptions::new()
                .max_connections(args.concurrency as u32)
                .acquire_timeout(Duration::from_secs(30))
                .connect(&args.url)
                .await?;
            let exec = burst(&pool, base, args.calls, args.concurrency).await;
            let dup = burst(&pool, base, args.calls, args.concurrency).await;
            pool.close().await;
            base += args.calls as i64;
            total[m][0] += exec;
            total[m][1] += dup;
            println!(
                "round {round} mode {:>3}: executions {:>7.0}/s, duplicates {:>7.0}/s",
                if on { "on" } else { "off" },
                args.calls as f64 / exec,
                args.calls as f64 / dup
            );
        }
    }
    let rate = |m: usize, k: usize| (args.calls * args.rounds) as f64 / total[m][k];
    println!(
        "total: executions off {:.0}/s, on {:.0}/s ({:+.1}%); duplicates off {:.0}/s, on {:.0}/s ({:+.1}%)",
        rate(0, 0),
        rate(1, 0),
        (rate(1, 0) / rate(0, 0) - 1.0) * 100.0,
        rate(0, 1),
        rate(1, 1),
        (rate(1, 1) / rate(0, 1) - 1.0) * 100.0
    );
    Ok(())
}
