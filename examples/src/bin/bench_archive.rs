//! Record lifecycle benchmark on PostgreSQL, in one run:
//!
//! 1. The duplicate check (a `record`-strategy call whose key exists: the
//!    claim `INSERT … ON CONFLICT DO NOTHING` and the stored-result read)
//!    against an `idem_record` of 10k rows and one of 1M rows, side by
//!    side in alternating rounds: mean and p99 latency, and the ratio
//!    large/small (target: at most 1.2 — a unique-index lookup should not
//!    care about table size).
//! 2. The archiver moving expired records to history: rows per second.
//!
//! Each table lives in its own schema (`bench_rec_small`, `bench_rec_large`,
//! selected by `search_path`), so the runtime's own statements run
//! unchanged.
//!
//! `cargo run --release -p idem-examples --bin bench_archive [-- --large N --small N --calls N --rounds R --archive N]`

use clap::Parser;
use idem_examples::bench::records::{BoxError, Lat, compare, drop_schema, fill, schema_pool};
use idem_runtime::archive::Archiver;
use std::time::Instant;

/// Record lifecycle on PostgreSQL: the duplicate check against a small and
/// a large record table, and the archiver's rate.
#[derive(Debug, Clone, Parser)]
#[command(name = "bench_archive", args_override_self = true)]
struct Args {
    /// Records in the large table.
    #[arg(long, value_name = "N", default_value_t = 1_000_000)]
    large: u64,
    /// Records in the small table.
    #[arg(long, value_name = "N", default_value_t = 10_000)]
    small: u64,
    /// Duplicate checks per table and round.
    #[arg(long, value_name = "N", default_value_t = 3000)]
    calls: u64,
    /// Rounds.
    #[arg(long, value_name = "R", default_value_t = 3)]
    rounds: u64,
    /// Expired records the archiver moves.
    #[arg(long, value_name = "N", default_value_t = 200_000)]
    archive: u64,
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let args = Args::parse();
    let (large, small) = (args.large as i64, args.small as i64);
    let (calls, rounds) = (args.calls, args.rounds);
    let archive = args.archive as i64;
    let Some(url) = idem_examples::bench::reachable_postgres().await else {
        std::process::exit(1);
    };
    let small_pool = schema_pool(&url, "bench_rec_small").await?;
    let large_pool = schema_pool(&url, "bench_rec_large").await?;
    for (pool, schema, rows) in [
        (&small_pool, "bench_rec_small", small),
        (&large_pool, "bench_rec_large", large),
    ] {
        let took = fill(pool, rows).await?;
        println!("{schema}: {rows} records in {:.1}s", took.as_secs_f64());
    }
    let (mut s, mut l) = compare(
        (&small_pool, small),
        (&large_pool, large),
        calls,
        rounds,
        |round, s: &mut Lat, l: &mut Lat| {
            println!(
                "round {round}: {small} records mean {:.3} ms p99 {:.3} ms | {large} records mean {:.3} ms p99 {:.3} ms",
                s.mean(),
                s.p99(),
                l.mean(),
                l.p99()
            );
        },
    )
    .await?;
    println!(
        "duplicate check, {small} records: mean {:.3} ms, p99 {:.3} ms",
        s.mean(),
        s.p99()
    );
    println!(
        "duplicate check, {large} records: mean {:.3} ms, p99 {:.3} ms",
        l.mean(),
        l.p99()
    );
    println!(
        "ratio {large}/{small} mean latency: {:.2}",
        l.mean() / s.mean()
    );
    println!(
        "ratio {large}/{small} p99 latency: {:.2}",
        l.p99() / s.p99()
    );

    // The archiver: expire `archive` records of the large table, move them.
    sqlx::query(
        // create_time moves back too: expire_time must stay after it.
        "UPDATE idem_record SET expire_time = now() - interval '1 second', \
         create_time = LEAST(create_time, now() - interval '2 seconds') \
         WHERE id IN (SELECT id FROM idem_record ORDER BY id LIMIT $1)",
    )
    .bind(archive)
    .execute(&large_pool)
    .await?;
    let archiver = Archiver::new(large_pool.clone()).batch_size(2000);
    let started = Instant::now();
    let report = archiver.run_once(|_| {}).await?;
    let secs = started.elapsed().as_secs_f64();
    let history: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM idem_record_history")
        .fetch_one(&large_pool)
        .await?;
    assert_eq!(report.records as i64, archive, "every expired record moved");
    assert_eq!(history, archive, "exactly once each");
    println!(
        "archiver: {} records in {} batches, {:.1}s, {:.0} rows/s",
        report.records,
        report.batches,
        secs,
        report.records as f64 / secs
    );
    for schema in ["bench_rec_small", "bench_rec_large"] {
        drop_schema(&url, schema).await?;
    }
    Ok(())
}
