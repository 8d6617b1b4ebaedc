//! What the web console's live figures cost on a large outbox, on
//! PostgreSQL: `outbox::admin::stats` (every message counted, a scan of the
//! table) against `outbox::admin::backlog` (pending and failed messages
//! only, through the status index), side by side in alternating rounds on
//! one outbox that holds `--delivered` delivered messages beside a backlog
//! of `--pending` and `--failed`. The console reads the backlog every
//! sampling interval and the full counts at most a tenth of its time.
//!
//! The outbox lives in a schema of its own (`bench_console`), dropped at
//! the end.
//!
//! `cargo run --release -p idem-examples --bin bench_console [-- --delivered N --pending N --failed N --rounds R]`

use clap::Parser;
use idem_examples::bench::records::{BoxError, drop_schema, schema_pool};
use idem_runtime::outbox::admin;
use std::time::{Duration, Instant};

/// The console's figures on a large outbox: the full counts against the
/// backlog alone.
#[derive(Debug, Clone, Parser)]
#[command(name = "bench_console", args_override_self = true)]
struct Args {
    /// Delivered messages the outbox retains.
    #[arg(long, value_name = "N", default_value_t = 2_000_000)]
    delivered: i64,
    /// Pending messages.
    #[arg(long, value_name = "N", default_value_t = 2_000)]
    pending: i64,
    /// Dead letters.
    #[arg(long, value_name = "N", default_value_t = 200)]
    failed: i64,
    /// Reads of each, alternating.
    #[arg(long, value_name = "R", default_value_t = 15)]
    rounds: usize,
}

fn median(mut d: Vec<Duration>) -> Duration {
    d.sort();
    d[d.len() / 2]
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let args = Args::parse();
    idem_examples::bench::warn_if_debug("bench_console");
    let Some(url) = idem_examples::bench::reachable_postgres().await else {
        std::process::exit(1);
    };
    let pool = schema_pool(&url, "bench_console").await?;
    let started = Instant::now();
    let mut next = 1;
    while next <= args.delivered {
        let end = (next + 500_000 - 1).min(args.delivered);
        // Eight topics, delivered over the last days (250 ms apart).
        sqlx::query(
            "INSERT INTO idem_outbox (topic, msg_id, payload, status, attempts, \
                                      next_attempt_at, created_at, updated_at) \
             SELECT 'topic-' || (g % 8), 'd' || g, '{\"n\":' || g || '}', 'success', 1, t, t, t \
             FROM generate_series($1::bigint, $2::bigint) g, \
                  LATERAL (SELECT now() - ($3 - g) * interval '250 ms' AS t) at",
        )
        .bind(next)
        .bind(end)
        .bind(args.delivered)
        .execute(&pool)
        .await?;
        next = end + 1;
    }
    for (status, prefix, n) in [("pending", "p", args.pending), ("failed", "f", args.failed)] {
        sqlx::query(
            "INSERT INTO idem_outbox (topic, msg_id, payload, status, attempts) \
             SELECT 'topic-' || (g % 8), $2 || g, '{}', $1, 0 FROM generate_series(1, $3::bigint) g",
        )
        .bind(status)
        .bind(prefix)
        .bind(n)
        .execute(&pool)
        .await?;
    }
    sqlx::query("VACUUM ANALYZE idem_outbox")
        .execute(&pool)
        .await?;
    println!(
        "outbox: {} delivered, {} pending, {} failed, filled in {:.1}s",
        args.delivered,
        args.pending,
        args.failed,
        started.elapsed().as_secs_f64()
    );

    let (mut full, mut open) = (Vec::new(), Vec::new());
    for round in 0..args.rounds + 1 {
        let t = Instant::now();
        let s = admin::stats(&pool, None).await?;
        let took_full = t.elapsed();
        let t = Instant::now();
        let b = admin::backlog(&pool, None).await?;
        let took_open = t.elapsed();
        // The two agree on the backlog, and it is the one filled in.
        assert_eq!(
            (s.totals.pending, s.totals.failed),
            (args.pending, args.failed)
        );
        assert_eq!(
            (b.totals.pending, b.totals.failed),
            (args.pending, args.failed)
        );
        assert_eq!(s.totals.success, args.delivered);
        if round > 0 {
            // The first round warms the cache.
            full.push(took_full);
            open.push(took_open);
        }
    }
    let (full, open) = (median(full), median(open));
    println!(
        "admin::stats   (every message):     median {:>9.3} ms",
        full.as_secs_f64() * 1e3
    );
    println!(
        "admin::backlog (pending and failed): median {:>9.3} ms",
        open.as_secs_f64() * 1e3
    );
    println!(
        "ratio stats / backlog: {:.0}×; the console reads the backlog every 2 s and counts \
         every message every {:.1} s",
        full.as_secs_f64() / open.as_secs_f64().max(1e-9),
        (full.as_secs_f64() * 10.0).max(2.0)
    );
    pool.close().await;
    drop_schema(&url, "bench_console").await?;
    Ok(())
}
