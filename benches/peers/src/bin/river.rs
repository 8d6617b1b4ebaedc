//! # bench_peers' River side: the coupon drain through River's Rust client
//!
//! The same coupon work as idem's side of `bench_peers` and the sqlxmq
//! side (`src/main.rs`), written the way a River user would write it, with
//! `riverqueue` 0.5 from crates.io (on sqlx 0.9):
//!
//! - **produce**: each coupon (`UNUSED`) and its `deduct_coupon` job in one
//!   transaction (River's `begin_postgres`, the coupon `INSERT`, then
//!   `client.insert(args).tx(&mut tx)`), `--concurrency` producers at once
//!   (timed apart: `enqueue_rate`); the client is not started yet;
//! - **drain**: the client started with one queue (`default`) of
//!   `max_workers = --concurrency` and a typed worker (`Worker<DeductCoupon>`):
//!   `BEGIN`; `SELECT status … FOR UPDATE` (a `USED` coupon completes the job
//!   without deducting); the ledger `INSERT`; `UPDATE … SET status =
//!   'USED'`; `WorkContext::job_complete_tx` (the job row set `completed` in
//!   that transaction), `COMMIT`: **completion is transactional**, the job
//!   and the deduction commit together. River's batch completer then finds
//!   the row already completed and leaves it. With `--noop` the worker
//!   returns `WorkOutcome::Complete` at once and the batch completer
//!   (10 ms batches) completes the job. The clock runs from `client.start()`
//!   until N `JobCompleted` events (River sends them once the completion is
//!   persisted; a subscription sized to N, so none is dropped);
//! - **check**: every coupon `USED` with exactly one ledger row, and every
//!   job row (River keeps them, 24 h by default) `completed`; with `--noop`
//!   only the latter.
//!
//! Settings: River's defaults (LISTEN/NOTIFY, leader election, maintenance
//! services, 25 attempts) except the queue's fetch pacing. River's default
//! `fetch_cooldown` (100 ms between two fetches of a queue; its docs: "Throughput
//! is limited by this value") caps a queue of 16 workers near 160 jobs/s, so
//! this uses the values of River's own benchmark (`riverqueue bench` in
//! `riverqueue-cli` 0.5): `with_fetch_cooldown(2 ms)` and
//! `with_fetch_poll_interval(20 ms)`. `--defaults` keeps River's 100 ms / 1 s
//! (measured: about 80 jobs/s at 16 workers). The CPU figure includes the
//! event subscription that counts completions (River's own benchmark
//! counts them the same way).
//! The pool has `--concurrency` + 10 connections (handlers, producers,
//! fetches, completer, notifier, leader).
//!
//! Everything lives in its own schema (`bench_peers_river`, dropped and
//! recreated; River's tables made there by `PostgresMigrator::with_schema`,
//! the client on `PostgresDatabase::with_schema`), so the shared database's
//! `public` schema is untouched.
//!
//! The last line of stdout is one JSON object (`rate`, `drain_s`,
//! `enqueue_rate`, `messages`, `concurrency`, `noop`, `cpu_us_per_msg`
//! — this process's user + system CPU over the drain per job — and the
//! fetch settings).
//!
//! ```text
//! cargo run --release --manifest-path benches/peers/Cargo.toml --bin river -- \
//!     --messages 20000 --concurrency 16 [--noop] [--defaults] [--url URL]
//! ```

#[path = "../shared.rs"]
mod shared;

use riverqueue::database::{PostgresDatabase, SchemaName, begin_postgres};
use riverqueue::migrate::PostgresMigrator;
use riverqueue::sqlx::{self, PgPool};
use riverqueue::{
    Client, EventKind, EventRecvError, Job, JobArgs, QueueConfig, SubscribeConfig, WorkContext,
    WorkOutcome, Worker, Workers,
};
use serde::{Deserialize, Serialize};
use shared::{BoxError, Figures, ORDER_OFFSET, Progress};
use std::num::NonZeroUsize;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

const PEER: &str = "river";
const SCHEMA: &str = "bench_peers_river";
/// River's own benchmark's queue pacing (`riverqueue-cli` 0.5).
const FETCH_COOLDOWN: Duration = Duration::from_millis(2);
const FETCH_POLL_INTERVAL: Duration = Duration::from_millis(20);

/// The job's arguments: "deduct this coupon for this order".
#[derive(Debug, Clone, Serialize, Deserialize, JobArgs)]
#[river(kind = "deduct_coupon")]
struct DeductCoupon {
    msg_id: String,
    coupon_id: i64,
    order_id: i64,
}

/// The typed worker; `pool` is `None` in `--noop` mode.
struct Deduct {
    pool: Option<PgPool>,
}

impl Worker<DeductCoupon> for Deduct {
    type Error = BoxError;

    /// The coupon's own state is the duplicate check, and the job
    /// completes in the deduction's transaction.
    async fn work(
        &self,
        context: WorkContext,
        job: Job<DeductCoupon>,
    ) -> Result<WorkOutcome, BoxError> {
        let Some(pool) = &self.pool else {
            return Ok(WorkOutcome::Complete);
        };
        let msg = &job.args;
        let mut tx = begin_postgres(pool).await?;
        let status: String =
            sqlx::query_scalar("SELECT status FROM coupon WHERE id = $1 FOR UPDATE")
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
        context.job_complete_tx(&mut tx).await?;
        tx.commit().await?;
        Ok(WorkOutcome::Complete)
    }
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let args = shared::parse_args(PEER)?;
    let (n, c) = (args.messages, args.concurrency);

    // A fresh schema with River's tables and the coupon tables.
    shared::reset_schema(&args.url, SCHEMA).await?;
    let schema = SchemaName::new(SCHEMA)?;
    let pool = shared::pool(&args.url, SCHEMA, c as u32 + 10).await?;
    PostgresMigrator::new(pool.clone())
        .with_schema(schema.clone())
        .migrate_up()
        .await?;
    shared::create_coupon_tables(&pool).await?;

    let mut queue = QueueConfig::new(c);
    if !args.defaults {
        queue = queue
            .with_fetch_cooldown(FETCH_COOLDOWN)
            .with_fetch_poll_interval(FETCH_POLL_INTERVAL);
    }
    let (cooldown, poll) = (
        queue
            .fetch_cooldown()
            .unwrap_or(riverqueue::FETCH_COOLDOWN_DEFAULT),
        queue.fetch_poll_interval(),
    );
    let mut workers = Workers::new();
    workers.add(Deduct {
        pool: (!args.noop).then(|| pool.clone()),
    })?;
    let client = Client::builder(PostgresDatabase::new(pool.clone()).with_schema(schema))
        .workers(workers)
        .queue(riverqueue::QUEUE_DEFAULT, queue)
        .build()?;

    // Produce.
    let next = Arc::new(AtomicU64::new(1));
    let started = Instant::now();
    let mut producers = Vec::new();
    for _ in 0..c {
        let (pool, client, next) = (pool.clone(), client.clone(), next.clone());
        producers.push(tokio::spawn(async move {
            loop {
                let id = next.fetch_add(1, Ordering::Relaxed) as i64;
                if id > n {
                    return Ok::<_, BoxError>(());
                }
                let mut tx = begin_postgres(&pool).await?;
                sqlx::query("INSERT INTO coupon (id, status) VALUES ($1, 'UNUSED')")
                    .bind(id)
                    .execute(&mut *tx)
                    .await?;
                client
                    .insert(DeductCoupon {
                        msg_id: id.to_string(),
                        coupon_id: id,
                        order_id: ORDER_OFFSET + id,
                    })
                    .tx(&mut tx)
                    .await?;
                tx.commit().await?;
            }
        }));
    }
    for t in producers {
        t.await??;
    }
    let enqueue = started.elapsed();
    shared::vacuum(&pool, "river_job").await?;

    // Drain: count completions from River's events.
    let mut events = client.subscribe_config(
        SubscribeConfig::new([EventKind::JobCompleted, EventKind::JobFailed])?
            .with_buffer_capacity(NonZeroUsize::new(n as usize + 1024).ok_or("n")?),
    )?;
    let done = Progress::new(n);
    let failed = Arc::new(AtomicU64::new(0));
    let counter = {
        let (done, failed) = (done.clone(), failed.clone());
        tokio::spawn(async move {
            loop {
                match events.recv().await {
                    Ok(e) if e.kind() == EventKind::JobCompleted => {
                        done.add(1);
                    }
                    Ok(e) => {
                        if failed.fetch_add(1, Ordering::Relaxed) < 5 {
                            eprintln!("river job failed (it will be retried): {e:?}");
                        }
                    }
                    Err(EventRecvError::Lagged(k)) => {
                        // Counted as completions; the database check decides.
                        eprintln!("river: the event receiver dropped {k} events");
                        done.add(k);
                    }
                    Err(_) => return,
                }
            }
        })
    };
    let cpu0 = shared::cpu_time();
    let started = Instant::now();
    let mut run = client.start()?;
    let drain = done.wait(PEER, started).await;
    let cpu = shared::cpu_time() - cpu0;
    run.stop().await?;
    counter.abort();
    let drain = drain?;

    // Check in the database.
    let (completed, jobs): (i64, i64) = sqlx::query_as(
        "SELECT COUNT(*) FILTER (WHERE state = 'completed'), COUNT(*) FROM river_job",
    )
    .fetch_one(&pool)
    .await?;
    let queue = (completed != n || jobs != n)
        .then(|| format!("{completed} of {jobs} jobs completed, {n} expected"));
    let figures = Figures {
        enqueue,
        drain,
        cpu,
    };
    let errors = failed.load(Ordering::Relaxed);
    let extra = serde_json::json!({
        "fetch_cooldown_ms": cooldown.as_secs_f64() * 1e3,
        "fetch_poll_interval_ms": poll.as_secs_f64() * 1e3,
        "transactional_completion": !args.noop,
    });
    shared::finish(PEER, pool, &args, queue, errors, &figures, extra).await
}
