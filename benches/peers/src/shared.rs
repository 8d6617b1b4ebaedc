//! # What bench_peers' river, graphile and apalis sides share
//!
//! `src/bin/river.rs`, `src/bin/graphile.rs` and `src/bin/apalis.rs`
//! include this file as a module (`#[path]`): the command line, the schema
//! reset, the coupon tables and their check, the handler's transaction of
//! the peers that complete a job after it, the drain's clock and CPU
//! meter, and the JSON line `bench_peers` reads. These peers are on sqlx
//! 0.9 (`sqlx09` here), the sqlxmq side (`src/main.rs`) on sqlx 0.8; it
//! keeps its own copy of these.

use sqlx09 as sqlx;
use sqlx09::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx09::{AssertSqlSafe, PgPool};
use std::str::FromStr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};
use tokio::sync::Notify;

pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Order ids are the coupon id plus this (as on idem's side).
pub const ORDER_OFFSET: i64 = 2_000_000_000;

#[derive(Debug, Clone)]
pub struct Args {
    pub url: String,
    pub messages: i64,
    pub concurrency: usize,
    /// Burn-down: the handler returns at once, no coupon work.
    pub noop: bool,
    /// The peer's untuned defaults instead of its documented fast path.
    pub defaults: bool,
}

/// `--url URL --messages N --concurrency C --noop --defaults`; `peer` names
/// the binary in `--help`.
pub fn parse_args(peer: &str) -> Result<Args, BoxError> {
    let mut a = Args {
        url: std::env::var("DATABASE_URL")
            .ok()
            .filter(|u| !u.is_empty())
            .unwrap_or_else(|| "postgres://postgres@127.0.0.1:5432/test".into()),
        messages: 20_000,
        concurrency: 16,
        noop: false,
        defaults: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or_else(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "--url" => a.url = value()?,
            "--messages" => a.messages = value()?.parse()?,
            "--concurrency" => a.concurrency = value()?.parse()?,
            "--noop" => a.noop = true,
            "--defaults" => a.defaults = true,
            "-h" | "--help" => {
                println!(
                    "usage: {peer} [--url URL] [--messages N (20000)] [--concurrency C (16)] \
                     [--noop (handlers return at once)] [--defaults ({peer}'s untuned defaults)]"
                );
                std::process::exit(0);
            }
            other => return Err(format!("unknown flag {other}").into()),
        }
    }
    if a.messages < 1 || a.concurrency < 1 {
        return Err("--messages and --concurrency must be at least 1".into());
    }
    Ok(a)
}

/// This process's user + system CPU time so far (`getrusage(RUSAGE_SELF)`).
pub fn cpu_time() -> Duration {
    // SAFETY: `getrusage` only writes the `rusage` it is handed, which is
    // plain old data (all-zero is a valid value).
    let ru = unsafe {
        let mut ru: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_SELF, &mut ru);
        ru
    };
    let tv = |t: libc::timeval| {
        Duration::from_secs(t.tv_sec as u64) + Duration::from_micros(t.tv_usec as u64)
    };
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

/// A pool whose connections have `schema` as their `search_path`: the
/// coupon tables (and the peer's, where it does not qualify them) live
/// there. All `size` connections are opened up front.
pub async fn pool(url: &str, schema: &str, size: u32) -> Result<PgPool, BoxError> {
    let opts = PgConnectOptions::from_str(url)?.options([("search_path", schema)]);
    Ok(PgPoolOptions::new()
        .max_connections(size)
        .min_connections(size)
        .acquire_timeout(Duration::from_secs(30))
        .connect_with(opts)
        .await?)
}

/// Drops and recreates `schema` (empty).
pub async fn reset_schema(url: &str, schema: &str) -> Result<(), BoxError> {
    let admin = PgPoolOptions::new().max_connections(1).connect(url).await?;
    sqlx::raw_sql(AssertSqlSafe(format!(
        "DROP SCHEMA IF EXISTS {schema} CASCADE; CREATE SCHEMA {schema}"
    )))
    .execute(&admin)
    .await?;
    admin.close().await;
    Ok(())
}

/// The coupon work's tables, in the pool's schema.
pub async fn create_coupon_tables(p: &PgPool) -> Result<(), BoxError> {
    sqlx::raw_sql(
        "CREATE TABLE coupon (id BIGINT PRIMARY KEY, status VARCHAR(16) NOT NULL); \
         CREATE TABLE ledger (coupon_id BIGINT NOT NULL, order_id BIGINT NOT NULL, \
                              msg_id VARCHAR(64) NOT NULL); \
         CREATE INDEX idx_ledger_coupon ON ledger (coupon_id)",
    )
    .execute(p)
    .await?;
    Ok(())
}

/// `VACUUM ANALYZE` of the coupon tables and the peer's `tables` after
/// the produce phase, before the drain (as the sqlxmq side does).
pub async fn vacuum(p: &PgPool, tables: &str) -> Result<(), BoxError> {
    sqlx::raw_sql(AssertSqlSafe(format!(
        "VACUUM ANALYZE coupon, ledger, {tables}"
    )))
    .execute(p)
    .await?;
    Ok(())
}

/// The coupon work in a transaction of the handler's own, for the peers
/// that complete a job after its handler returns (graphile_worker,
/// apalis): `BEGIN`; the coupon's status `FOR UPDATE` (a `USED` coupon is
/// left alone, so a job run again after a crash deducts nothing); the
/// ledger row; the coupon `USED`; `COMMIT`.
// River completes its job in this transaction, and writes its own.
#[allow(dead_code)]
pub async fn deduct_own_transaction(
    pool: &PgPool,
    coupon_id: i64,
    order_id: i64,
    msg_id: &str,
) -> Result<(), BoxError> {
    let mut tx = pool.begin().await?;
    let status: String = sqlx::query_scalar("SELECT status FROM coupon WHERE id = $1 FOR UPDATE")
        .bind(coupon_id)
        .fetch_one(&mut *tx)
        .await?;
    if status == "UNUSED" {
        sqlx::query("INSERT INTO ledger (coupon_id, order_id, msg_id) VALUES ($1, $2, $3)")
            .bind(coupon_id)
            .bind(order_id)
            .bind(msg_id)
            .execute(&mut *tx)
            .await?;
        sqlx::query("UPDATE coupon SET status = 'USED' WHERE id = $1 AND status = 'UNUSED'")
            .bind(coupon_id)
            .execute(&mut *tx)
            .await?;
    }
    tx.commit().await?;
    Ok(())
}

/// The run's end: the verdict, then the JSON line. `queue` is what the
/// peer's own tables say is wrong (`None`: every job completed); unless
/// `--noop` the coupons are checked too; the pool is closed. `Err` names
/// everything wrong and the handler errors counted (`errors`); `Ok` prints
/// the figures ([`report`]) with `extra` and `job_errors`.
pub async fn finish(
    peer: &str,
    pool: PgPool,
    args: &Args,
    queue: Option<String>,
    errors: u64,
    figures: &Figures,
    mut extra: serde_json::Value,
) -> Result<(), BoxError> {
    let mut wrong: Vec<String> = queue.into_iter().collect();
    if !args.noop
        && let Some(w) = check_coupons(&pool, args.messages).await?
    {
        wrong.push(w);
    }
    pool.close().await;
    if !wrong.is_empty() {
        return Err(format!(
            "{peer} run: VERIFY FAILED: {}; {errors} handler errors",
            wrong.join("; ")
        )
        .into());
    }
    if let Some(extra) = extra.as_object_mut() {
        extra.insert("job_errors".into(), errors.into());
    }
    report(peer, args, figures, extra);
    Ok(())
}

/// The coupon side of the check: `None` when every coupon of `n` is
/// `USED` with exactly one ledger row, else what is wrong.
pub async fn check_coupons(p: &PgPool, n: i64) -> Result<Option<String>, BoxError> {
    let (used, wrong, ledger): (i64, i64, i64) = sqlx::query_as(
        "SELECT (SELECT COUNT(*) FROM coupon WHERE status = 'USED'), \
                (SELECT COUNT(*) FROM coupon c WHERE c.status <> 'USED' \
                   OR (SELECT COUNT(*) FROM ledger l WHERE l.coupon_id = c.id) <> 1), \
                (SELECT COUNT(*) FROM ledger)",
    )
    .fetch_one(p)
    .await?;
    Ok((used != n || wrong != 0 || ledger != n).then(|| {
        format!(
            "{used} of {n} coupons USED, {wrong} not USED with exactly one ledger row, \
             {ledger} ledger rows"
        )
    }))
}

/// The drain's completion count, fed by the peer's own completion signal
/// (an event or hook): the waiter sleeps until the last job is counted
/// instead of polling, so the clock and the CPU meter see no busy loop.
pub struct Progress {
    done: AtomicU64,
    target: u64,
    reached: Notify,
}

impl Progress {
    pub fn new(n: i64) -> Arc<Self> {
        Arc::new(Self {
            done: AtomicU64::new(0),
            target: n as u64,
            reached: Notify::new(),
        })
    }

    /// Counts `k` more completed jobs.
    pub fn add(&self, k: u64) {
        if self.done.fetch_add(k, Ordering::Relaxed) + k >= self.target {
            self.reached.notify_one();
        }
    }

    /// Waits until all jobs are counted; the drain's time since `started`.
    /// Errs when no job completes for 60 s.
    pub async fn wait(&self, peer: &str, started: Instant) -> Result<Duration, BoxError> {
        let mut last = (0, Instant::now());
        loop {
            let k = self.done.load(Ordering::Relaxed);
            if k >= self.target {
                return Ok(started.elapsed());
            }
            if k != last.0 {
                last = (k, Instant::now());
            } else if last.1.elapsed() > Duration::from_secs(60) {
                return Err(
                    format!("{peer} stalled at {k} of {} jobs for 60 s", self.target).into(),
                );
            }
            let _ = tokio::time::timeout(Duration::from_millis(200), self.reached.notified()).await;
        }
    }
}

/// What one run measured.
pub struct Figures {
    pub enqueue: Duration,
    pub drain: Duration,
    /// CPU time of this process over the drain.
    pub cpu: Duration,
}

/// The summary on stderr and the JSON object on stdout's last line;
/// `extra` adds the peer's settings.
pub fn report(peer: &str, a: &Args, f: &Figures, extra: serde_json::Value) {
    let n = a.messages;
    let rate = n as f64 / f.drain.as_secs_f64();
    let enqueue_rate = n as f64 / f.enqueue.as_secs_f64();
    let cpu_us = f.cpu.as_secs_f64() * 1e6 / n as f64;
    eprintln!(
        "{peer}{}: {n} jobs drained in {:.2}s, {rate:.0} msg/s, {cpu_us:.0} µs CPU/msg; \
         enqueue {enqueue_rate:.0}/s",
        if a.noop { " (noop)" } else { "" },
        f.drain.as_secs_f64(),
    );
    let mut line = serde_json::json!({
        "peer": peer,
        "rate": rate,
        "drain_s": f.drain.as_secs_f64(),
        "enqueue_rate": enqueue_rate,
        "messages": n,
        "concurrency": a.concurrency,
        "noop": a.noop,
        "defaults": a.defaults,
        "cpu_us_per_msg": cpu_us,
    });
    if let (Some(line), serde_json::Value::Object(extra)) = (line.as_object_mut(), extra) {
        line.extend(extra);
    }
    println!("{line}");
}
