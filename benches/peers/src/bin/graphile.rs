//! # bench_peers' graphile side: the coupon drain through graphile_worker
//!
//! The same coupon work as idem's side of `bench_peers` and the sqlxmq
//! side (`src/main.rs`), written the way a graphile_worker user would write
//! it, with `graphile_worker` 0.14 (the Rust port of Graphile Worker) from
//! crates.io, on sqlx 0.9:
//!
//! - **produce**: each coupon (`UNUSED`) and its `deduct_coupon` job in one
//!   transaction (the coupon `INSERT`, then
//!   `worker.create_utils().with_executor(&mut tx).add_job(..)`),
//!   `--concurrency` producers at once (timed apart: `enqueue_rate`); the
//!   worker is initialised (its migrations ran) but not running yet;
//! - **drain**: `worker.run()` with `concurrency(--concurrency)` and a typed
//!   `TaskHandler`: `BEGIN`; `SELECT status … FOR UPDATE` (a `USED` coupon
//!   is left alone); the ledger `INSERT`; `UPDATE … SET status = 'USED'`;
//!   `COMMIT`; return `Ok(())`. graphile_worker has **no transactional
//!   completion**: the handler commits its own transaction and the worker
//!   completes (deletes) the job afterwards, so a crash between the two
//!   runs the job again (the `FOR UPDATE` status check makes that rerun
//!   harmless). With `--noop` the handler returns at once. The clock runs
//!   from `worker.run()` until N `JobComplete` hooks (graphile_worker emits
//!   them once the completion is persisted, batched or not);
//! - **check**: every coupon `USED` with exactly one ledger row, and no job
//!   left in `_private_jobs` (graphile_worker deletes completed jobs); with
//!   `--noop` only the latter.
//!
//! Settings: the "throughput-oriented worker" of graphile_worker's
//! worker-options guide, its documented fast path for job bursts:
//! `poll_interval(500 ms)`, `complete_job_batch_delay(5 ms)` and
//! `fail_job_batch_delay(5 ms)` (completions written in batches),
//! `local_queue(LocalQueueConfig::default().with_size(100).with_ttl(60 s))`
//! (jobs fetched 100 at a time into the process). `--defaults` runs its
//! plain defaults instead (1 s poll, one completion statement per job, one
//! fetch per job): there each job slot fetches once per wake-up (a poll
//! tick or an insert NOTIFY) and then waits for the next one, so a backlog
//! enqueued before the worker starts drains at about `--concurrency` jobs
//! per poll interval (16/s here). LISTEN/NOTIFY wake-ups are on (its
//! default); OS signal listeners are off (the run stops itself). The pool
//! (passed with `pg_pool`) has `--concurrency` + 8 connections.
//!
//! Everything lives in its own schema (`bench_peers_graphile`, dropped and
//! recreated; graphile_worker's tables made there by `init()` through
//! `WorkerOptions::schema`), so the shared database's `public` schema is
//! untouched.
//!
//! The last line of stdout is one JSON object (`rate`, `drain_s`,
//! `enqueue_rate`, `messages`, `concurrency`, `noop`, `cpu_us_per_msg`
//! — this process's user + system CPU over the drain per job — and the
//! settings used).
//!
//! ```text
//! cargo run --release --manifest-path benches/peers/Cargo.toml --bin graphile -- \
//!     --messages 20000 --concurrency 16 [--noop] [--defaults] [--url URL]
//! ```

#[path = "../shared.rs"]
mod shared;

use graphile_worker::{
    IntoTaskHandlerResult, JobComplete, JobFail, JobSpec, LocalQueueConfig, TaskHandler,
    WorkerContext, WorkerOptions,
};
use serde::{Deserialize, Serialize};
use shared::{BoxError, Figures, ORDER_OFFSET, Progress};
use sqlx09 as sqlx;
use sqlx09::PgPool;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

const PEER: &str = "graphile";
const SCHEMA: &str = "bench_peers_graphile";
/// The worker-options guide's throughput-oriented settings.
const POLL_INTERVAL: Duration = Duration::from_millis(500);
const BATCH_DELAY: Duration = Duration::from_millis(5);
const LOCAL_QUEUE_SIZE: usize = 100;
const LOCAL_QUEUE_TTL: Duration = Duration::from_secs(60);

/// The handler's state (a worker extension): the pool, `None` with `--noop`.
#[derive(Debug, Clone)]
struct Coupons(Option<PgPool>);

/// The job's payload: "deduct this coupon for this order".
#[derive(Debug, Clone, Serialize, Deserialize)]
struct DeductCoupon {
    msg_id: String,
    coupon_id: i64,
    order_id: i64,
}

impl TaskHandler for DeductCoupon {
    const IDENTIFIER: &'static str = "deduct_coupon";

    /// The coupon's own state is the duplicate check; the deduction
    /// commits here, the job's completion after the handler returns.
    async fn run(self, ctx: WorkerContext) -> impl IntoTaskHandlerResult {
        let Some(Coupons(Some(pool))) = ctx.get_ext::<Coupons>() else {
            return Ok(());
        };
        deduct(pool, &self).await.map_err(|e| e.to_string())
    }
}

async fn deduct(pool: &PgPool, msg: &DeductCoupon) -> Result<(), BoxError> {
    shared::deduct_own_transaction(pool, msg.coupon_id, msg.order_id, &msg.msg_id).await
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let args = shared::parse_args(PEER)?;
    let (n, c) = (args.messages, args.concurrency);

    // A fresh schema with the coupon tables; `init()` adds graphile's.
    shared::reset_schema(&args.url, SCHEMA).await?;
    let pool = shared::pool(&args.url, SCHEMA, c as u32 + 8).await?;
    shared::create_coupon_tables(&pool).await?;

    let done = Progress::new(n);
    let failed = Arc::new(AtomicU64::new(0));
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let mut options = WorkerOptions::default()
        .schema(SCHEMA)
        .concurrency(c)
        .pg_pool(pool.clone())
        .define_job::<DeductCoupon>()
        .add_extension(Coupons((!args.noop).then(|| pool.clone())))
        .listen_os_shutdown_signals(false)
        .shutdown_signal(async move {
            let _ = stopped.await;
        })
        .on(JobComplete, {
            let done = done.clone();
            move |_ctx| {
                let done = done.clone();
                async move {
                    done.add(1);
                }
            }
        })
        .on(JobFail, {
            let failed = failed.clone();
            move |ctx| {
                let failed = failed.clone();
                async move {
                    if failed.fetch_add(1, Ordering::Relaxed) < 5 {
                        eprintln!(
                            "graphile job {} failed (will retry: {}): {}",
                            ctx.job.id(),
                            ctx.will_retry,
                            ctx.error
                        );
                    }
                }
            }
        });
    if !args.defaults {
        options = options
            .poll_interval(POLL_INTERVAL)
            .complete_job_batch_delay(BATCH_DELAY)
            .fail_job_batch_delay(BATCH_DELAY)
            .local_queue(
                LocalQueueConfig::default()
                    .with_size(LOCAL_QUEUE_SIZE)
                    .with_ttl(LOCAL_QUEUE_TTL),
            );
    }
    let worker = options.init().await?;

    // Produce.
    let next = Arc::new(AtomicU64::new(1));
    let started = Instant::now();
    let mut producers = Vec::new();
    for _ in 0..c {
        let (pool, utils, next) = (pool.clone(), worker.create_utils(), next.clone());
        producers.push(tokio::spawn(async move {
            loop {
                let id = next.fetch_add(1, Ordering::Relaxed) as i64;
                if id > n {
                    return Ok::<_, BoxError>(());
                }
                let mut tx = pool.begin().await?;
                sqlx::query("INSERT INTO coupon (id, status) VALUES ($1, 'UNUSED')")
                    .bind(id)
                    .execute(&mut *tx)
                    .await?;
                utils
                    .clone()
                    .with_executor(&mut tx)
                    .add_job(
                        DeductCoupon {
                            msg_id: id.to_string(),
                            coupon_id: id,
                            order_id: ORDER_OFFSET + id,
                        },
                        JobSpec::default(),
                    )
                    .await?;
                tx.commit().await?;
            }
        }));
    }
    for t in producers {
        t.await??;
    }
    let enqueue = started.elapsed();
    shared::vacuum(&pool, "_private_jobs").await?;

    // Drain.
    let cpu0 = shared::cpu_time();
    let started = Instant::now();
    let (ran, drained) = tokio::join!(worker.run(), async {
        let drained = done.wait(PEER, started).await;
        let cpu = shared::cpu_time() - cpu0;
        let _ = stop.send(());
        drained.map(|d| (d, cpu))
    });
    let (drain, cpu) = drained?;
    ran?;

    // Check in the database.
    let left: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM _private_jobs")
        .fetch_one(&pool)
        .await?;
    let queue = (left != 0).then(|| format!("{left} jobs left"));
    let figures = Figures {
        enqueue,
        drain,
        cpu,
    };
    let errors = failed.load(Ordering::Relaxed);
    let extra = serde_json::json!({
        "poll_interval_ms": if args.defaults { 1000.0 } else { POLL_INTERVAL.as_secs_f64() * 1e3 },
        "complete_job_batch_delay_ms":
            if args.defaults { None } else { Some(BATCH_DELAY.as_secs_f64() * 1e3) },
        "local_queue_size": if args.defaults { None } else { Some(LOCAL_QUEUE_SIZE) },
        "transactional_completion": false,
    });
    shared::finish(PEER, pool, &args, queue, errors, &figures, extra).await
}
