//! # bench_peers' apalis side: the coupon drain through apalis
//!
//! The same coupon work as idem's side of `bench_peers` and the sqlxmq
//! side (`src/main.rs`), written the way an apalis user would write it,
//! with `apalis` 1.0 and its PostgreSQL storage `apalis-postgres` 1.0 from
//! crates.io, on sqlx 0.9:
//!
//! - **produce**: each coupon (`UNUSED`) and its `deduct_coupon` task in one
//!   transaction (the coupon `INSERT`, then
//!   `apalis_postgres::queries::push_tasks(&mut *tx, ..)`, the storage's
//!   own insert run on the caller's connection), `--concurrency` producers
//!   at once (timed apart: `enqueue_rate`); the worker is not built yet;
//! - **drain**: one worker (`WorkerBuilder`) on a `PostgresStorage` of the
//!   queue `deduct_coupon`, `.concurrency(--concurrency)` (apalis's
//!   concurrency limit) and a function handler: `BEGIN`; `SELECT status …
//!   FOR UPDATE` (a `USED` coupon is left alone); the ledger `INSERT`;
//!   `UPDATE … SET status = 'USED'`; `COMMIT`; return `Ok(())`. apalis has
//!   **no transactional completion**: the handler's result goes to the
//!   storage as an event, and the storage writes completions (`status =
//!   'Done'`) in batches, one `UPDATE` per batch in a transaction of its
//!   own, the next time the worker polls it; a crash between the handler's
//!   commit and that write runs the task again (the `FOR UPDATE` status
//!   check makes that rerun harmless). With `--noop` the handler returns at
//!   once. The clock runs from `worker.run()` until it returns: the run is
//!   stopped (`WorkerContext::stop`) once N `Event::Success` events are
//!   counted (apalis emits one per handler result handed to the storage,
//!   before that result is written), and `run()` returns only after the
//!   storage has written the completions still pending, so the last one
//!   is persisted inside the clock;
//! - **check**: every coupon `USED` with exactly one ledger row, and every
//!   task row (apalis keeps them) `Done`; with `--noop` only the latter.
//!
//! Settings: apalis-postgres documents one throughput knob, `Config`'s
//! `batch_size` (tasks fetched per query, 10 by default; its docs say
//! bigger batches trade memory for fewer queue round trips): this uses
//! 100 (measured here, batches of 10 drain about 3× slower). And `.parallelize(tokio::spawn)`, apalis's worker
//! extension that runs each handler as a task of its own on the runtime:
//! without it every handler future is polled inside the worker's one task
//! (on one core). `--defaults` runs batches of 10 and no parallelize. The
//! rest are apalis's defaults: tasks marked `Running` as they start
//! (`lock_tasks`, written with the completions' batches), results
//! persisted (`persist_results`: that is the completion itself), a 30 s
//! heartbeat, and polling storage without LISTEN/NOTIFY (`with_pubsub`
//! off: the backlog is there before the worker starts). The pool has
//! `--concurrency` + 8 connections (handlers, producers, fetches,
//! completions, heartbeat).
//!
//! apalis-postgres 1.0 keeps its tables in a fixed schema, `apalis`: that
//! schema and `bench_peers_apalis` (the coupon tables) are dropped and
//! recreated, then `PostgresStorage::setup` runs apalis's migrations (the
//! extensions they create, `hstore` and `pgcrypto`, land in
//! `bench_peers_apalis`, first on the search path, unless the database has
//! them already), so the shared database's `public` schema is untouched.
//!
//! The last line of stdout is one JSON object (`rate`, `drain_s`,
//! `enqueue_rate`, `messages`, `concurrency`, `noop`, `cpu_us_per_msg`
//! — this process's user + system CPU over the drain per job — and the
//! settings used).
//!
//! ```text
//! cargo run --release --manifest-path benches/peers/Cargo.toml --bin apalis -- \
//!     --messages 20000 --concurrency 16 [--noop] [--defaults] [--url URL]
//! ```

#[path = "../shared.rs"]
mod shared;

use apalis::prelude::{
    Data, Event, EventListenerExt, ParallelizeExt, TaskBuilder, WorkerBuilder, WorkerBuilderExt,
    WorkerContext,
};
use apalis_postgres::{Config, PostgresStorage};
use serde::{Deserialize, Serialize};
use shared::{BoxError, Figures, ORDER_OFFSET, Progress};
use sqlx09 as sqlx;
use sqlx09::PgPool;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

const PEER: &str = "apalis";
const SCHEMA: &str = "bench_peers_apalis";
/// apalis-postgres 1.0's own schema (not configurable).
const APALIS_SCHEMA: &str = "apalis";
/// The pool's search path: the coupon tables, then `public` in case the
/// database already has `hstore` there.
const SEARCH_PATH: &str = "bench_peers_apalis,public";
const QUEUE: &str = "deduct_coupon";
/// Tasks per fetch: the fast path's and apalis-postgres's default.
const BATCH_SIZE: usize = 100;
const DEFAULT_BATCH_SIZE: usize = 10;

/// The handler's state (worker data): the pool, `None` with `--noop`.
#[derive(Debug, Clone)]
struct Coupons(Option<PgPool>);

/// The task's payload: "deduct this coupon for this order".
#[derive(Debug, Clone, Serialize, Deserialize)]
struct DeductCoupon {
    msg_id: String,
    coupon_id: i64,
    order_id: i64,
}

/// The handler. The coupon's own state is the duplicate check; the
/// deduction commits here, the task's completion after it returns.
async fn deduct_coupon(msg: DeductCoupon, coupons: Data<Coupons>) -> Result<(), BoxError> {
    let Coupons(pool) = &*coupons;
    match pool {
        Some(pool) => deduct(pool, &msg).await,
        None => Ok(()),
    }
}

async fn deduct(pool: &PgPool, msg: &DeductCoupon) -> Result<(), BoxError> {
    shared::deduct_own_transaction(pool, msg.coupon_id, msg.order_id, &msg.msg_id).await
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let args = shared::parse_args(PEER)?;
    let (n, c) = (args.messages, args.concurrency);
    let batch_size = if args.defaults {
        DEFAULT_BATCH_SIZE
    } else {
        BATCH_SIZE
    };

    // Fresh schemas: the coupon tables, then apalis's (its migrations).
    shared::reset_schema(&args.url, APALIS_SCHEMA).await?;
    shared::reset_schema(&args.url, SCHEMA).await?;
    let pool = shared::pool(&args.url, SEARCH_PATH, c as u32 + 8).await?;
    shared::create_coupon_tables(&pool).await?;
    PostgresStorage::setup(&pool).await?;

    // Produce.
    let next = Arc::new(AtomicU64::new(1));
    let started = Instant::now();
    let mut producers = Vec::new();
    for _ in 0..c {
        let (pool, next) = (pool.clone(), next.clone());
        producers.push(tokio::spawn(async move {
            loop {
                let id = next.fetch_add(1, Ordering::Relaxed) as i64;
                if id > n {
                    return Ok::<_, BoxError>(());
                }
                let task = TaskBuilder::new(serde_json::to_vec(&DeductCoupon {
                    msg_id: id.to_string(),
                    coupon_id: id,
                    order_id: ORDER_OFFSET + id,
                })?)
                .build();
                let mut tx = pool.begin().await?;
                sqlx::query("INSERT INTO coupon (id, status) VALUES ($1, 'UNUSED')")
                    .bind(id)
                    .execute(&mut *tx)
                    .await?;
                apalis_postgres::queries::push_tasks(&mut *tx, QUEUE, vec![task]).await?;
                tx.commit().await?;
            }
        }));
    }
    for t in producers {
        t.await??;
    }
    let enqueue = started.elapsed();
    shared::vacuum(&pool, "apalis.jobs").await?;

    // The worker: completions counted from its events.
    let done = Progress::new(n);
    let failed = Arc::new(AtomicU64::new(0));
    let storage = PostgresStorage::<DeductCoupon>::new(&pool)
        .with_config(Config::default().queue(QUEUE).batch_size(batch_size));
    let ctx = WorkerContext::new("bench-peers-apalis");
    let builder = WorkerBuilder::new(&ctx)
        .backend(storage)
        .data(Coupons((!args.noop).then(|| pool.clone())))
        .concurrency(c)
        .on_event({
            let (done, failed) = (done.clone(), failed.clone());
            move |_worker, event| match event {
                Event::Success(_) => done.add(1),
                Event::Error(e) => {
                    let before = failed.fetch_add(1, Ordering::Relaxed);
                    if before < 5 {
                        eprintln!("apalis task failed (it will be retried): {e}");
                    }
                }
                _ => {}
            }
        });
    type Run = Pin<Box<dyn Future<Output = Result<(), apalis::prelude::WorkerError>>>>;
    let run: Run = if args.defaults {
        Box::pin(builder.build(deduct_coupon).run())
    } else {
        Box::pin(builder.parallelize(tokio::spawn).build(deduct_coupon).run())
    };

    // Drain: stop the worker after N successes; `run()` returns once the
    // storage has written the last completions.
    let cpu0 = shared::cpu_time();
    let started = Instant::now();
    let (ran, counted) = tokio::join!(run, async {
        let counted = done.wait(PEER, started).await;
        ctx.stop()?;
        counted
    });
    let drain = started.elapsed();
    let cpu = shared::cpu_time() - cpu0;
    counted?;
    ran?;

    // Check in the database.
    let (completed, jobs): (i64, i64) =
        sqlx::query_as("SELECT COUNT(*) FILTER (WHERE status = 'Done'), COUNT(*) FROM apalis.jobs")
            .fetch_one(&pool)
            .await?;
    let queue = (completed != n || jobs != n)
        .then(|| format!("{completed} of {jobs} tasks Done, {n} expected"));
    let figures = Figures {
        enqueue,
        drain,
        cpu,
    };
    let errors = failed.load(Ordering::Relaxed);
    let extra = serde_json::json!({
        "batch_size": batch_size,
        "parallelize": !args.defaults,
        "lock_tasks": true,
        "transactional_completion": false,
    });
    shared::finish(PEER, pool, &args, queue, errors, &figures, extra).await
}
