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
use idem_runtime::archive::Archiver;
use idem_runtime::{Outcome, idempotent};
use serde::{Deserialize, Serialize};
use sqlx::postgres::PgPoolOptions;
use sqlx::{Executor, PgPool, Postgres, Transaction};
use std::time::{Duration, Instant};

#[derive(Debug, Clone, Serialize)]
struct Notice {
    id: i64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Receipt {
    ok: bool,
}

#[idempotent(key = "bench-rec:{n.id}", strategy = record, biz_type = "bench")]
async fn notify(_tx: &mut Transaction<'_, Postgres>, n: &Notice) -> Result<Receipt, sqlx::Error> {
    Ok(Receipt { ok: true })
}

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

async fn schema_pool(url: &str, schema: &'static str) -> Result<PgPool, sqlx::Error> {
    PgPoolOptions::new()
        .max_connections(4)
        .after_connect(move |conn, _| {
            Box::pin(async move {
                conn.execute(sqlx::AssertSqlSafe(format!("SET search_path = {schema}")))
                    .await?;
                Ok(())
            })
        })
        .connect(url)
        .await
}

/// A schema with idem's tables holding `rows` records: the first through
/// the runtime (so the fingerprint is the real one), the rest in bulk.
async fn fill(pool: &PgPool, schema: &str, rows: i64) -> Result<(), Box<dyn std::error::Error>> {
    let probe = notify(pool, &Notice { id: 1 }).await?;
    assert!(probe.is_executed());
    let (fingerprint, result): (String, Option<String>) = sqlx::query_as(
        "SELECT fingerprint, result FROM idem_record WHERE idempotency_key = 'bench-rec:1'",
    )
    .fetch_one(pool)
    .await?;
    // Keys 2..=rows get the fingerprint their own payload would have.
    let _ = fingerprint;
    let started = Instant::now();
    let mut next = 2;
    while next <= rows {
        let end = (next + 200_000 - 1).min(rows);
        sqlx::query(
            "INSERT INTO idem_record (idempotency_key, biz_type, biz_no, fingerprint, result, expire_time) \
             SELECT 'bench-rec:' || g, 'bench', 'bench-rec:' || g, \
                    encode(sha256(convert_to('[{\"id\":' || g || '}]', 'UTF8')), 'hex'), $3, \
                    now() + interval '7 days' \
             FROM generate_series($1::bigint, $2::bigint) g",
        )
        .bind(next)
        .bind(end)
        .bind(&result)
        .execute(pool)
        .await?;
        next = end + 1;
    }
    sqlx::query("ANALYZE idem_record").execute(pool).await?;
    println!(
        "{schema}: {rows} records in {:.1}s",
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

struct Lat(Vec<Duration>);

impl Lat {
    fn mean(&self) -> f64 {
        self.0.iter().map(Duration::as_secs_f64).sum::<f64>() / self.0.len() as f64 * 1e3
    }
    fn p99(&mut self) -> f64 {
        self.0.sort_unstable();
        self.0[((self.0.len() - 1) as f64 * 0.99) as usize].as_secs_f64() * 1e3
    }
}

/// `calls` duplicate checks on random existing keys, one at a time.
async fn duplicates(pool: &PgPool, rows: i64, calls: u64, seed: u64) -> Lat {
    let mut lat = Vec::with_capacity(calls as usize);
    let mut x = seed | 1;
    for _ in 0..calls {
        // xorshift: spread lookups over the whole table.
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let id = 1 + (x % rows as u64) as i64;
        let t = Instant::now();
        let outcome = notify(pool, &Notice { id }).await.expect("duplicate check");
        lat.push(t.elapsed());
        assert_eq!(
            outcome,
            Outcome::Duplicate(Some(Receipt { ok: true })),
            "key {id}"
        );
    }
    Lat(lat)
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = Args::parse();
    let (large, small) = (args.large as i64, args.small as i64);
    let (calls, rounds) = (args.calls, args.rounds);
    let archive = args.archive as i64;
    let url = idem_examples::bench::postgres_url();
    let admin = match PgPool::connect(&url).await {
        Ok(p) => p,
        Err(e) => {
            eprintln!("bench_archive needs PostgreSQL at {url}: {e}");
            std::process::exit(1);
        }
    };
    for schema in ["bench_rec_small", "bench_rec_large"] {
        admin
            .execute(sqlx::AssertSqlSafe(format!(
                "DROP SCHEMA IF EXISTS {schema} CASCADE; CREATE SCHEMA {schema}"
            )))
            .await?;
    }
    let small_pool = schema_pool(&url, "bench_rec_small").await?;
    let large_pool = schema_pool(&url, "bench_rec_large").await?;
    idem_runtime::migrate(&small_pool).await?;
    idem_runtime::migrate(&large_pool).await?;
    fill(&small_pool, "bench_rec_small", small).await?;
    fill(&large_pool, "bench_rec_large", large).await?;
    // Warm both (index pages into the buffer cache, prepared statements).
    duplicates(&small_pool, small, calls / 3, 7).await;
    duplicates(&large_pool, large, calls / 3, 7).await;
    let (mut all_small, mut all_large) = (Vec::new(), Vec::new());
    for round in 1..=rounds {
        let mut s = duplicates(&small_pool, small, calls, round * 31).await;
        let mut l = duplicates(&large_pool, large, calls, round * 31).await;
        println!(
            "round {round}: {small} records mean {:.3} ms p99 {:.3} ms | {large} records mean {:.3} ms p99 {:.3} ms",
            s.mean(),
            s.p99(),
            l.mean(),
            l.p99()
        );
        all_small.extend(s.0);
        all_large.extend(l.0);
    }
    let (mut s, mut l) = (Lat(all_small), Lat(all_large));
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
        admin
            .execute(sqlx::AssertSqlSafe(format!(
                "DROP SCHEMA IF EXISTS {schema} CASCADE"
            )))
            .await?;
    }
    Ok(())
}
