//! # Benchmark: `#[idempotent(strategy = state_machine)]` against the same code by hand
//!
//! Two coupon-deduction handlers on PostgreSQL doing the same work per call:
//!
//! - **by hand**: the article's *fixed* code with plain sqlx — `BEGIN`;
//!   `SELECT status … FOR UPDATE`; a duplicate if the coupon is `USED`;
//!   insert the ledger row; `UPDATE … SET status = 'USED' WHERE id = $1 AND
//!   status = 'UNUSED'` (which must change one row); `COMMIT`;
//! - **`#[idempotent]`**: a `state_machine` handler whose body is the ledger
//!   insert; the attribute does the rest (key, lock, check, transition,
//!   commit).
//!
//! Each round deducts M fresh `UNUSED` coupons per handler, each once, with
//! C concurrent workers; after each slice, every message of the slice is
//! delivered again (all duplicates, timed apart). The two handlers take
//! turns in short slices (AB BA AB …, each handler on its own coupons), so
//! warm-up, drift and the load of other processes hit both alike; an
//! unmeasured warm-up slice of each comes first. At the end the database is
//! checked: every coupon of both handlers is `USED` with exactly one ledger
//! row, so the numbers measure a working thing.
//!
//! ```text
//! cargo run --release -p idem-examples --bin bench_state_machine
//! cargo run --release -p idem-examples --bin bench_state_machine -- --ops 5000 --concurrency 8 --rounds 3
//! ```
//!
//! `DATABASE_URL` defaults to `postgres://postgres@127.0.0.1:5432/test`.
//! Other options: `--slice S` (coupons per turn, default 500),
//! `--no-duplicates` (skip the duplicate passes).

use clap::Parser;
use idem_runtime::{Outcome, State, idempotent};
use sqlx::postgres::PgPoolOptions;
use sqlx::{PgPool, Postgres, Transaction};
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

#[derive(Debug, Clone, Copy, PartialEq, Eq, State)]
enum CouponState {
    Unused,
    Used,
}

struct DeductCoupon {
    msg_id: String,
    coupon_id: i64,
    order_id: i64,
}

// ---- (a) the article's fixed code, by hand -----------------------------------

async fn deduct_by_hand(pool: &PgPool, msg: &DeductCoupon) -> Result<Outcome<()>, BoxError> {
    let mut tx = pool.begin().await?;
    let status: String =
        sqlx::query_scalar("SELECT status FROM example_bench_coupon WHERE id = $1 FOR UPDATE")
            .bind(msg.coupon_id)
            .fetch_one(&mut *tx)
            .await?;
    if status == "USED" {
        tx.commit().await?;
        return Ok(Outcome::Duplicate(None));
    }
    if status != "UNUSED" {
        return Err(format!("coupon {} is {status}", msg.coupon_id).into());
    }
    sqlx::query(
        "INSERT INTO example_bench_deduction (coupon_id, order_id, msg_id) VALUES ($1, $2, $3)",
    )
    .bind(msg.coupon_id)
    .bind(msg.order_id)
    .bind(msg.msg_id.as_str())
    .execute(&mut *tx)
    .await?;
    let rows = sqlx::query(
        "UPDATE example_bench_coupon SET status = 'USED' WHERE id = $1 AND status = 'UNUSED'",
    )
    .bind(msg.coupon_id)
    .execute(&mut *tx)
    .await?
    .rows_affected();
    if rows != 1 {
        return Err(format!(
            "coupon {}: the transition changed {rows} rows",
            msg.coupon_id
        )
        .into());
    }
    tx.commit().await?;
    Ok(Outcome::Executed(()))
}

// ---- (b) the same with #[idempotent] --------------------------------------------

#[idempotent(
    key = "bench-deduct:{msg.msg_id}",
    strategy = state_machine,
    table = "example_bench_coupon", id = msg.coupon_id,
    from = CouponState::Unused, to = CouponState::Used,
)]
async fn deduct_with_idem(
    tx: &mut Transaction<'_, Postgres>,
    msg: &DeductCoupon,
) -> Result<(), sqlx::Error> {
    sqlx::query(
        "INSERT INTO example_bench_deduction (coupon_id, order_id, msg_id) VALUES ($1, $2, $3)",
    )
    .bind(msg.coupon_id)
    .bind(msg.order_id)
    .bind(msg.msg_id.as_str())
    .execute(&mut **tx)
    .await?;
    Ok(())
}

// ---- the harness -------------------------------------------------------------------

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Variant {
    Hand,
    Idem,
}

impl Variant {
    fn name(self) -> &'static str {
        match self {
            Variant::Hand => "hand-written",
            Variant::Idem => "#[idempotent]",
        }
    }

    async fn deduct(self, pool: &PgPool, msg: &DeductCoupon) -> Result<Outcome<()>, BoxError> {
        match self {
            Variant::Hand => deduct_by_hand(pool, msg).await,
            Variant::Idem => Ok(deduct_with_idem(pool, msg).await?),
        }
    }
}

/// `#[idempotent(strategy = state_machine)]` against the same code by hand.
#[derive(Debug, Clone, Parser)]
#[command(
    name = "bench_state_machine",
    args_override_self = true,
    after_help = "DATABASE_URL defaults to postgres://postgres@127.0.0.1:5432/test"
)]
struct Options {
    /// Deductions per handler and round.
    #[arg(long, value_name = "M", default_value_t = 5000)]
    ops: i64,
    /// Concurrent workers.
    #[arg(long, value_name = "C", default_value_t = 8)]
    concurrency: usize,
    /// Measured rounds.
    #[arg(long, value_name = "R", default_value_t = 3)]
    rounds: usize,
    /// Coupons per turn of one handler.
    #[arg(long, value_name = "S", default_value_t = 500)]
    slice: i64,
    /// Skip the duplicate passes.
    #[arg(long)]
    no_duplicates: bool,
}

impl Options {
    /// Whether each slice is followed by a duplicate pass.
    fn duplicates(&self) -> bool {
        !self.no_duplicates
    }

    fn check(self) -> Result<Self, BoxError> {
        if self.ops < 1 || self.concurrency < 1 || self.rounds < 1 || self.slice < 1 {
            return Err("--ops, --concurrency, --rounds and --slice must be at least 1".into());
        }
        Ok(self)
    }
}

/// Time and outcomes of one pass over a batch of messages.
#[derive(Default, Clone, Copy)]
struct Pass {
    elapsed: Duration,
    executed: usize,
    duplicates: usize,
}

/// Runs every message of `batch` once through `variant`, `concurrency`
/// workers pulling from a shared counter.
async fn run_pass(
    pool: &PgPool,
    variant: Variant,
    batch: &Arc<Vec<DeductCoupon>>,
    concurrency: usize,
) -> Result<Pass, BoxError> {
    let next = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let mut workers = Vec::with_capacity(concurrency);
    for _ in 0..concurrency {
        let (pool, batch, next) = (pool.clone(), batch.clone(), next.clone());
        workers.push(tokio::spawn(async move {
            let (mut executed, mut duplicates) = (0, 0);
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(msg) = batch.get(i) else { break };
                match variant.deduct(&pool, msg).await? {
                    Outcome::Executed(()) => executed += 1,
                    Outcome::Duplicate(_) => duplicates += 1,
                }
            }
            Ok::<_, BoxError>((executed, duplicates))
        }));
    }
    let mut pass = Pass::default();
    for w in workers {
        let (e, d) = w.await??;
        pass.executed += e;
        pass.duplicates += d;
    }
    pass.elapsed = started.elapsed();
    Ok(pass)
}

/// Ops and time, summed over slices.
#[derive(Default, Clone, Copy)]
struct Tally {
    ops: usize,
    time: Duration,
}

impl Tally {
    fn add(&mut self, ops: usize, time: Duration) {
        self.ops += ops;
        self.time += time;
    }

    fn rate(self) -> f64 {
        self.ops as f64 / self.time.as_secs_f64()
    }
}

/// One slice of one variant: deduct every coupon once (all must execute),
/// then, optionally, deliver every message again (all must be duplicates).
async fn run_slice(
    pool: &PgPool,
    variant: Variant,
    batch: Arc<Vec<DeductCoupon>>,
    opts: &Options,
) -> Result<(Duration, Option<Duration>), BoxError> {
    let n = batch.len();
    let first = run_pass(pool, variant, &batch, opts.concurrency).await?;
    if first.executed != n {
        let e = format!(
            "{}: {} of {n} deliveries executed",
            variant.name(),
            first.executed
        );
        return Err(e.into());
    }
    if !opts.duplicates() {
        return Ok((first.elapsed, None));
    }
    let again = run_pass(pool, variant, &batch, opts.concurrency).await?;
    if again.duplicates != n {
        let e = format!(
            "{}: {} of {n} redeliveries were duplicates",
            variant.name(),
            again.duplicates
        );
        return Err(e.into());
    }
    Ok((first.elapsed, Some(again.elapsed)))
}

/// The coupons: each variant deducts from its own id space, handing out
/// fresh ids in order.
struct Coupons {
    next: [i64; 2],
}

/// Where each variant's ids start.
const FIRST_ID: [i64; 2] = [1, 1_000_000_001];

impl Coupons {
    fn take(&mut self, variant: Variant, n: i64) -> Arc<Vec<DeductCoupon>> {
        let first = self.next[variant as usize];
        self.next[variant as usize] += n;
        Arc::new(
            (first..first + n)
                .map(|coupon_id| DeductCoupon {
                    msg_id: format!("bench-{coupon_id}"),
                    coupon_id,
                    order_id: 2_000_000_000 + coupon_id,
                })
                .collect(),
        )
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

#[tokio::main]
async fn main() -> ExitCode {
    match run().await {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn run() -> Result<ExitCode, BoxError> {
    let opts = Options::parse().check()?;
    idem_examples::bench::warn_if_debug("bench_state_machine");
    let Some(url) = idem_examples::bench::reachable_postgres().await else {
        return Ok(ExitCode::FAILURE);
    };
    let pool = PgPoolOptions::new()
        .max_connections(opts.concurrency as u32)
        .min_connections(opts.concurrency as u32)
        .acquire_timeout(Duration::from_secs(30))
        .connect(&url)
        .await?;

    // Fresh tables, and every coupon of the run created up front, so the
    // table has the same size for every measured slice.
    let warmup = opts.ops.min(500);
    let per_variant = warmup + opts.ops * opts.rounds as i64;
    for stmt in [
        "DROP TABLE IF EXISTS example_bench_deduction",
        "DROP TABLE IF EXISTS example_bench_coupon",
        "CREATE TABLE example_bench_coupon (id BIGINT PRIMARY KEY, status VARCHAR(16) NOT NULL)",
        "CREATE TABLE example_bench_deduction (
            coupon_id BIGINT NOT NULL,
            order_id BIGINT NOT NULL,
            msg_id VARCHAR(64) NOT NULL
        )",
        "CREATE INDEX idx_example_bench_deduction_coupon ON example_bench_deduction (coupon_id)",
    ] {
        sqlx::query(stmt).execute(&pool).await?;
    }
    for first in FIRST_ID {
        sqlx::query(
            "INSERT INTO example_bench_coupon (id, status) \
             SELECT g, 'UNUSED' FROM generate_series($1::bigint, $2::bigint) AS g",
        )
        .bind(first)
        .bind(first + per_variant - 1)
        .execute(&pool)
        .await?;
    }
    sqlx::raw_sql("VACUUM ANALYZE example_bench_coupon")
        .execute(&pool)
        .await?;

    println!(
        "state_machine benchmark on PostgreSQL: {} deductions per handler and round, \
         {} workers, {} rounds{}",
        opts.ops,
        opts.concurrency,
        opts.rounds,
        if opts.duplicates() {
            ", each slice followed by a duplicate pass"
        } else {
            ""
        }
    );
    println!(
        "the two handlers alternate in slices of {} coupons (AB BA AB …)",
        opts.slice
    );
    let mut coupons = Coupons { next: FIRST_ID };
    for variant in [Variant::Hand, Variant::Idem] {
        let batch = coupons.take(variant, warmup);
        run_slice(&pool, variant, batch, &opts).await?;
    }

    // Per variant: first deliveries and redeliveries.
    let mut deduct = [Tally::default(); 2];
    let mut dup = [Tally::default(); 2];
    let mut pair_ratios = Vec::new();
    let mut turn = 0usize;
    println!();
    println!(
        "{:<7}{:>22}{:>22}{:>9}",
        "round", "hand-written ops/s", "#[idempotent] ops/s", "ratio"
    );
    for round in 0..opts.rounds {
        let mut round_deduct = [Tally::default(); 2];
        let mut left = opts.ops;
        while left > 0 {
            let n = left.min(opts.slice);
            left -= n;
            // Alternate which handler goes first, so drift hits both alike.
            let order = if turn.is_multiple_of(2) {
                [Variant::Hand, Variant::Idem]
            } else {
                [Variant::Idem, Variant::Hand]
            };
            turn += 1;
            let mut slice_time = [Duration::ZERO; 2];
            for variant in order {
                let v = variant as usize;
                let batch = coupons.take(variant, n);
                let (first, again) = run_slice(&pool, variant, batch, &opts).await?;
                slice_time[v] = first;
                round_deduct[v].add(n as usize, first);
                deduct[v].add(n as usize, first);
                if let Some(again) = again {
                    dup[v].add(n as usize, again);
                }
            }
            // Same n for both: the ratio of rates is the ratio of times.
            pair_ratios.push(slice_time[0].as_secs_f64() / slice_time[1].as_secs_f64());
        }
        let [h, i] = round_deduct;
        println!(
            "{:<7}{:>22.0}{:>22.0}{:>9.2}",
            round + 1,
            h.rate(),
            i.rate(),
            i.rate() / h.rate()
        );
    }

    // Verify in the database: every coupon USED, with exactly one ledger row.
    for variant in [Variant::Hand, Variant::Idem] {
        let (first, last) = (
            FIRST_ID[variant as usize],
            coupons.next[variant as usize] - 1,
        );
        let (wrong, rows): (i64, i64) = sqlx::query_as(
            "SELECT \
               (SELECT COUNT(*) FROM example_bench_coupon c WHERE c.id BETWEEN $1 AND $2 \
                 AND (c.status <> 'USED' OR (SELECT COUNT(*) FROM example_bench_deduction d \
                 WHERE d.coupon_id = c.id) <> 1)), \
               (SELECT COUNT(*) FROM example_bench_deduction WHERE coupon_id BETWEEN $1 AND $2)",
        )
        .bind(first)
        .bind(last)
        .fetch_one(&pool)
        .await?;
        let n = last - first + 1;
        if wrong != 0 || rows != n {
            println!(
                "VERIFY FAILED: {}: {wrong} of {n} coupons are not USED with exactly one \
                 ledger row ({rows} ledger rows)",
                variant.name()
            );
            return Ok(ExitCode::FAILURE);
        }
        println!(
            "verified {}: {n} coupons USED, {rows} ledger rows, one per coupon",
            variant.name()
        );
    }

    let [hand, idem] = deduct;
    println!();
    println!(
        "deduct     hand-written {:>7.0} ops/s   #[idempotent] {:>7.0} ops/s",
        hand.rate(),
        idem.rate()
    );
    if opts.duplicates() {
        let [dh, di] = dup;
        println!(
            "duplicate  hand-written {:>7.0} ops/s   #[idempotent] {:>7.0} ops/s   ratio {:.2}",
            dh.rate(),
            di.rate(),
            di.rate() / dh.rate()
        );
    }
    println!(
        "median ratio of {} paired slices: {:.2}",
        pair_ratios.len(),
        median(pair_ratios)
    );
    println!("ratio idem/hand-written: {:.2}", idem.rate() / hand.rate());
    Ok(ExitCode::SUCCESS)
}
