//! # bench_peers' sqlxmq side: the coupon drain through sqlxmq
//!
//! The same coupon work as idem's side of `bench_peers` (and `bench_outbox`),
//! written the way a sqlxmq user would write it, with sqlxmq 0.6 from
//! crates.io:
//!
//! - **produce**: each coupon (`UNUSED`) and its "deduct this coupon" job in
//!   one transaction (`JobBuilder::spawn` on the transaction), `--concurrency`
//!   producers at once (timed apart);
//! - **drain**: a `JobRunnerOptions` runner (sqlxmq's `mq_poll`, LISTEN/NOTIFY
//!   wake-ups, its default keep-alive), each job handled in its own task:
//!   `BEGIN`; `SELECT status … FOR UPDATE` (the handler's own duplicate
//!   check: a `USED` coupon completes the job without deducting); the ledger
//!   `INSERT`; `UPDATE … SET status = 'USED'`; `complete_with_transaction`
//!   (sqlxmq's `mq_delete` of the job, then `COMMIT`: the job and the
//!   deduction commit together). The clock runs from the runner's start
//!   until N jobs completed;
//! - **check**: every coupon `USED` with exactly one ledger row, no job left.
//!
//! Everything lives in its own schema (`bench_peers_mq`, dropped and
//! recreated with sqlxmq's migrations, read from the sqlxmq package cargo
//! fetched: `--migrations DIR`), so the shared database's `public` schema
//! is untouched.
//!
//! The last line of stdout is one JSON object (`rate`, `drain_s`,
//! `enqueue_rate`, `messages`, `concurrency`, `min_concurrency`) for
//! `bench_peers` to read.
//!
//! ```text
//! cargo run --release --manifest-path benches/peers/Cargo.toml -- \
//!     --migrations ~/.cargo/registry/src/<index>/sqlxmq-0.6.0/migrations --messages 20000 --concurrency 16
//! ```

use serde::{Deserialize, Serialize};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{Executor, PgPool};
use sqlxmq::{CurrentJob, JobBuilder, JobRunnerOptions};
use std::str::FromStr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

const SCHEMA: &str = "bench_peers_mq";
const JOB: &str = "deduct_coupon";
/// Order ids are the coupon id plus this (as on idem's side).
const ORDER_OFFSET: i64 = 2_000_000_000;

/// sqlxmq's migrations (`*.up.sql`) as its crate ships them, in the
/// order of their timestamped names: its README asks users to apply them.
/// `dir` is the `migrations` folder of the sqlxmq package this harness
/// builds against (`bench_peers` finds it with `cargo metadata`).
fn migrations(dir: &std::path::Path) -> Result<Vec<String>, BoxError> {
    let mut files: Vec<_> = std::fs::read_dir(dir)
        .map_err(|e| format!("sqlxmq's migrations at {}: {e}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.to_string_lossy().ends_with(".up.sql"))
        .collect();
    files.sort();
    if files.is_empty() {
        return Err(format!("no *.up.sql in {}", dir.display()).into());
    }
    Ok(files
        .iter()
        .map(std::fs::read_to_string)
        .collect::<Result<_, _>>()?)
}

/// The job's payload: "deduct this coupon for this order".
#[derive(Debug, Clone, Serialize, Deserialize)]
struct DeductCoupon {
    msg_id: String,
    coupon_id: i64,
    order_id: i64,
}

#[derive(Debug, Clone)]
struct Args {
    url: String,
    messages: i64,
    concurrency: usize,
    /// sqlxmq's minimum concurrency: it polls again when fewer jobs run.
    min_concurrency: usize,
    /// The `migrations` folder of the sqlxmq package.
    migrations: std::path::PathBuf,
}

fn parse_args() -> Result<Args, BoxError> {
    let mut a = Args {
        url: std::env::var("DATABASE_URL")
            .ok()
            .filter(|u| !u.is_empty())
            .unwrap_or_else(|| "postgres://postgres@127.0.0.1:5432/test".into()),
        messages: 20_000,
        concurrency: 16,
        min_concurrency: 0,
        migrations: std::path::PathBuf::new(),
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or_else(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "--url" => a.url = value()?,
            "--messages" => a.messages = value()?.parse()?,
            "--concurrency" => a.concurrency = value()?.parse()?,
            "--min-concurrency" => a.min_concurrency = value()?.parse()?,
            "--migrations" => a.migrations = value()?.into(),
            "-h" | "--help" => {
                println!(
                    "usage: idem-bench-peers --migrations DIR (sqlxmq's) [--url URL] [--messages N] \
                     [--concurrency C] [--min-concurrency M (default C/2)]"
                );
                std::process::exit(0);
            }
            other => return Err(format!("unknown flag {other}").into()),
        }
    }
    if a.migrations.as_os_str().is_empty() {
        return Err("--migrations DIR (the sqlxmq package's migrations folder) is required".into());
    }
    if a.messages < 1 || a.concurrency < 2 {
        return Err("--messages must be at least 1 and --concurrency at least 2".into());
    }
    if a.min_concurrency == 0 {
        a.min_concurrency = a.concurrency / 2;
    }
    if a.min_concurrency >= a.concurrency {
        return Err("--min-concurrency must be below --concurrency".into());
    }
    Ok(a)
}

async fn pool(args: &Args, size: u32) -> Result<PgPool, BoxError> {
    let opts = PgConnectOptions::from_str(&args.url)?.options([("search_path", SCHEMA)]);
    Ok(PgPoolOptions::new()
        .max_connections(size)
        .min_connections(size)
        .acquire_timeout(Duration::from_secs(30))
        .connect_with(opts)
        .await?)
}

/// A fresh schema with sqlxmq's objects and the coupon tables.
async fn setup(args: &Args) -> Result<(), BoxError> {
    let admin = PgPoolOptions::new()
        .max_connections(1)
        .connect(&args.url)
        .await?;
    admin
        .execute(sqlx::raw_sql(&format!(
            "DROP SCHEMA IF EXISTS {SCHEMA} CASCADE; CREATE SCHEMA {SCHEMA}"
        )))
        .await?;
    admin.close().await;
    let p = pool(args, 1).await?;
    for m in migrations(&args.migrations)? {
        p.execute(sqlx::raw_sql(&m)).await?;
    }
    p.execute(sqlx::raw_sql(
        "CREATE TABLE coupon (id BIGINT PRIMARY KEY, status VARCHAR(16) NOT NULL); \
         CREATE TABLE ledger (coupon_id BIGINT NOT NULL, order_id BIGINT NOT NULL, \
                              msg_id VARCHAR(64) NOT NULL); \
         CREATE INDEX idx_ledger_coupon ON ledger (coupon_id)",
    ))
    .await?;
    p.close().await;
    Ok(())
}

/// The handler: the coupon's own state is the duplicate check, and the
/// job completes in the deduction's transaction.
async fn deduct(job: &mut CurrentJob) -> Result<(), BoxError> {
    let msg: DeductCoupon = job.json()?.ok_or("a job without payload")?;
    let mut tx = job.pool().begin().await?;
    let status: String = sqlx::query_scalar("SELECT status FROM coupon WHERE id = $1 FOR UPDATE")
        .bind(msg.coupon_id)
        .fetch_one(&mut *tx)
        .await?;
    if status == "UNUSED" {
        sqlx::query("INSERT INTO ledger (coupon_id, order_id, msg_id) VALUES ($1, $2, $3)")
            .bind(msg.coupon_id)
            .bind(msg.order_id)
            .bind(&msg.msg_id)
            .execute(&mut *tx)
            .await?;
        sqlx::query("UPDATE coupon SET status = 'USED' WHERE id = $1 AND status = 'UNUSED'")
            .bind(msg.coupon_id)
            .execute(&mut *tx)
            .await?;
    }
    job.complete_with_transaction(tx).await?;
    Ok(())
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let args = parse_args()?;
    let (n, c) = (args.messages, args.concurrency);
    setup(&args).await?;

    // Produce.
    let p = pool(&args, c as u32).await?;
    let next = Arc::new(AtomicU64::new(1));
    let started = Instant::now();
    let mut producers = Vec::new();
    for _ in 0..c {
        let (p, next) = (p.clone(), next.clone());
        producers.push(tokio::spawn(async move {
            loop {
                let id = next.fetch_add(1, Ordering::Relaxed) as i64;
                if id > n {
                    return Ok::<_, BoxError>(());
                }
                let msg = DeductCoupon {
                    msg_id: id.to_string(),
                    coupon_id: id,
                    order_id: ORDER_OFFSET + id,
                };
                let mut tx = p.begin().await?;
                sqlx::query("INSERT INTO coupon (id, status) VALUES ($1, 'UNUSED')")
                    .bind(id)
                    .execute(&mut *tx)
                    .await?;
                JobBuilder::new(JOB).set_json(&msg)?.spawn(&mut *tx).await?;
                tx.commit().await?;
            }
        }));
    }
    for t in producers {
        t.await??;
    }
    let enqueue = started.elapsed();
    p.close().await;
    let p = pool(&args, 1).await?;
    p.execute("VACUUM ANALYZE coupon, ledger, mq_msgs, mq_payloads")
        .await?;
    p.close().await;

    // Drain: handlers, the poller and the keep-alives share one pool; the
    // listener has its own connection.
    let p = pool(&args, c as u32 + 2).await?;
    let done = Arc::new(AtomicU64::new(0));
    let failed = Arc::new(AtomicU64::new(0));
    let (d, f) = (done.clone(), failed.clone());
    let started = Instant::now();
    let mut runner = JobRunnerOptions::new(&p, move |mut job| {
        let (d, f) = (d.clone(), f.clone());
        tokio::spawn(async move {
            match deduct(&mut job).await {
                Ok(()) => d.fetch_add(1, Ordering::Relaxed),
                Err(e) => {
                    eprintln!("sqlxmq job failed (it will be retried): {e}");
                    f.fetch_add(1, Ordering::Relaxed)
                }
            };
        });
    })
    .set_concurrency(args.min_concurrency, c)
    .run()
    .await?;
    let mut last = (0, Instant::now());
    let drain = loop {
        let k = done.load(Ordering::Relaxed);
        if k >= n as u64 {
            break started.elapsed();
        }
        if k != last.0 {
            last = (k, Instant::now());
        } else if last.1.elapsed() > Duration::from_secs(60) {
            return Err(format!("sqlxmq stalled at {k} of {n} jobs for 60 s").into());
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    };
    runner.stop().await;

    // Check in the database.
    let (used, wrong, ledger, left): (i64, i64, i64, i64) = sqlx::query_as(
        "SELECT (SELECT COUNT(*) FROM coupon WHERE status = 'USED'), \
                (SELECT COUNT(*) FROM coupon c WHERE c.status <> 'USED' \
                   OR (SELECT COUNT(*) FROM ledger l WHERE l.coupon_id = c.id) <> 1), \
                (SELECT COUNT(*) FROM ledger), \
                (SELECT COUNT(*) FROM mq_msgs WHERE id <> uuid_nil())",
    )
    .fetch_one(&p)
    .await?;
    p.close().await;
    if used != n || wrong != 0 || ledger != n || left != 0 {
        return Err(format!(
            "sqlxmq run: VERIFY FAILED: {used} of {n} coupons USED, {wrong} not USED with \
             exactly one ledger row, {ledger} ledger rows, {left} jobs left, {} job errors",
            failed.load(Ordering::Relaxed)
        )
        .into());
    }
    let rate = n as f64 / drain.as_secs_f64();
    eprintln!(
        "sqlxmq: {n} jobs drained in {:.2}s, {rate:.0} msg/s ({} job errors retried); \
         enqueue {:.0}/s",
        drain.as_secs_f64(),
        failed.load(Ordering::Relaxed),
        n as f64 / enqueue.as_secs_f64()
    );
    println!(
        "{}",
        serde_json::json!({
            "rate": rate,
            "drain_s": drain.as_secs_f64(),
            "enqueue_rate": n as f64 / enqueue.as_secs_f64(),
            "messages": n,
            "concurrency": c,
            "min_concurrency": args.min_concurrency,
        })
    );
    Ok(())
}
