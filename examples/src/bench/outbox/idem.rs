//! The idem side: enqueue, then drain through a [`Relay`] into an
//! `#[idempotent]` handler, and check the database.

use super::{BoxError, COUPON, LEASE_SECS, LEDGER, ORDER_OFFSET, STOCK, Setup};
use crate::bench::cpu::{Cpu, per_message_us};
use idem_runtime::outbox::{Relay, RelayHandle, enqueue};
use idem_runtime::{State, idempotent};
use serde::{Deserialize, Serialize};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{PgPool, Postgres, Transaction};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// A coupon's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, State)]
pub enum CouponState {
    Unused,
    Used,
}

/// The message: "deduct this coupon for this order".
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct DeductCoupon {
    /// The message id (the idempotency key's part).
    pub msg_id: String,
    /// The coupon to deduct.
    pub coupon_id: i64,
    /// The order it pays for.
    pub order_id: i64,
}

/// The handler the relay drives: lock the coupon, a duplicate if `USED`,
/// the body (one ledger row), `UNUSED` → `USED`, the outbox message marked
/// `success`, commit — one transaction.
#[idempotent(
    key = "bench-outbox:{msg.msg_id}",
    strategy = state_machine,
    table = "bench_outbox_coupon", id = msg.coupon_id,
    from = CouponState::Unused, to = CouponState::Used,
)]
async fn deduct(tx: &mut Transaction<'_, Postgres>, msg: &DeductCoupon) -> Result<(), sqlx::Error> {
    sqlx::query(
        "INSERT INTO bench_outbox_ledger (coupon_id, order_id, msg_id) VALUES ($1, $2, $3)",
    )
    .bind(msg.coupon_id)
    .bind(msg.order_id)
    .bind(msg.msg_id.as_str())
    .execute(&mut **tx)
    .await?;
    Ok(())
}

/// [`deduct`] in a service with `rows` stock rows: each message also takes
/// one unit off the row its coupon falls on (scattered), last in the body,
/// after the message's own rows (the lock order `Relay::commit_batch`
/// documents). With one row every handler updates it; with several, the
/// handlers of one batch take several, in an order no two batches share:
/// concurrent batches wait on one another and deadlock.
#[idempotent(
    key = "bench-outbox:{msg.msg_id}",
    strategy = state_machine,
    table = "bench_outbox_coupon", id = msg.coupon_id,
    from = CouponState::Unused, to = CouponState::Used,
)]
async fn deduct_hot_rows(
    tx: &mut Transaction<'_, Postgres>,
    msg: &DeductCoupon,
    rows: i64,
) -> Result<(), sqlx::Error> {
    sqlx::query(
        "INSERT INTO bench_outbox_ledger (coupon_id, order_id, msg_id) VALUES ($1, $2, $3)",
    )
    .bind(msg.coupon_id)
    .bind(msg.order_id)
    .bind(msg.msg_id.as_str())
    .execute(&mut **tx)
    .await?;
    sqlx::query("UPDATE bench_outbox_stock SET units = units - 1 WHERE id = $1")
        .bind(stock_row(msg.coupon_id, rows))
        .execute(&mut **tx)
        .await?;
    Ok(())
}

/// The stock row (1 to `rows`) coupon `coupon` takes a unit off.
fn stock_row(coupon: i64, rows: i64) -> i64 {
    1 + coupon.wrapping_mul(7919).rem_euclid(rows.max(1))
}

/// Which rows the handlers write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rows {
    /// Each message its own coupon and ledger row: no two handlers touch
    /// one row.
    Own,
    /// Also one shared row, a stock counter every handler decrements
    /// (`deduct_hot_rows` on one row): the hot-row workload.
    Hot,
    /// Also one of this many stock rows, scattered by coupon
    /// (`deduct_hot_rows`): batches take several hot rows in varying order.
    HotRows(i64),
}

impl Rows {
    /// The stock rows.
    fn stock_rows(self) -> i64 {
        match self {
            Rows::HotRows(k) => k.max(1),
            _ => 1,
        }
    }
}
// ---- the idem side -------------------------------------------------------------------

/// One idem run.
#[derive(Debug, Clone)]
pub struct IdemRun {
    /// Time to enqueue the messages (with their coupons).
    pub enqueue: Duration,
    /// Time to drain them.
    pub drain: Duration,
    /// Messages per second through the relay.
    pub rate: f64,
    /// Claim statements per message (the due index's scans; approximate if
    /// something else uses `idem_outbox` at the same time).
    pub claims_per_msg: f64,
    /// Committed transactions per message, the database's count.
    pub commits_per_msg: f64,
    /// Mean time of one handler call (begin to commit).
    pub handler_avg: Duration,
    /// Mean time between two claims of the relay's loop (it claims, hands
    /// the batch out, claims again): in effect the time of one claim.
    pub claim_period: Duration,
    /// Share of the handler slots' time spent in handler calls.
    pub utilization: f64,
    /// How often a batch lost a conflict and halved the batch size
    /// (`Relay::commit_batch_shrinks`).
    pub shrinks: u64,
    /// CPU per message while draining: this process's (the relay, the
    /// client) and the rest of the machine's (the server, on an otherwise
    /// idle machine), µs.
    pub client_us: f64,
    pub server_us: f64,
}

/// Counters read from the statistics views.
#[derive(Debug, Clone, Copy)]
struct PgCounters {
    commits: i64,
    due_index_scans: i64,
}

async fn counters(pool: &PgPool) -> Result<PgCounters, BoxError> {
    // Backends flush their statistics when they go idle (at most once a
    // second) and when they exit: wait for that first.
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let (commits, due_index_scans): (i64, i64) = sqlx::query_as(
        "SELECT (SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()), \
                COALESCE((SELECT idx_scan FROM pg_stat_user_indexes \
                          WHERE indexrelname = 'idx_idem_outbox_pending' \
                            AND schemaname = current_schema()), 0)",
    )
    .fetch_one(pool)
    .await?;
    Ok(PgCounters {
        commits,
        due_index_scans,
    })
}

/// How the relay commits its handlers' work.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Commits {
    /// One transaction per message (the relay's default).
    PerMessage,
    /// Up to `n` messages' handler work in one transaction
    /// (`Relay::commit_batch(n)`).
    Batched(u32),
}

/// One idem run of `n` messages: enqueue them, drain them through a relay
/// committing as `commits` says, check the database. `run` names the run
/// (in the topic and in errors).
pub async fn idem_run(
    admin: &PgPool,
    url: &str,
    opts: &Setup,
    n: i64,
    run: &str,
    commits: Commits,
    rows: Rows,
) -> Result<IdemRun, BoxError> {
    let c = opts.concurrency;
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "TRUNCATE {LEDGER}, {COUPON}, {STOCK}; \
         INSERT INTO {STOCK} (id, units) SELECT g, {n} FROM generate_series(1, {}) g",
        rows.stock_rows()
    )))
    .execute(admin)
    .await?;
    let topic = format!(
        "bench-outbox.{}.{run}.{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)?
            .as_micros()
    );

    // Produce: each coupon and its message in one transaction, C at once.
    let pool = PgPoolOptions::new()
        .max_connections(c as u32 + 1)
        .min_connections(c as u32 + 1)
        .acquire_timeout(Duration::from_secs(30))
        .connect(url)
        .await?;
    let next = Arc::new(AtomicU64::new(1));
    let started = Instant::now();
    let mut producers = Vec::new();
    for _ in 0..c {
        let (pool, next, topic) = (pool.clone(), next.clone(), topic.clone());
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
                let mut tx = pool.begin().await?;
                sqlx::query("INSERT INTO bench_outbox_coupon (id, status) VALUES ($1, 'UNUSED')")
                    .bind(id)
                    .execute(&mut *tx)
                    .await?;
                let _ = enqueue(&mut tx, &topic, &msg.msg_id, &serde_json::to_value(&msg)?).await?;
                tx.commit().await?;
            }
        }));
    }
    for p in producers {
        p.await??;
    }
    let enqueue_time = started.elapsed();
    pool.close().await;
    // Fresh statistics, as pgbench's side gets them. (Without them the
    // planner may take a topic it has no statistics for as rare, and read
    // and sort all of its rows on every claim.)
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "VACUUM ANALYZE {COUPON}, {LEDGER}, idem_outbox"
    )))
    .execute(admin)
    .await?;

    let connect: PgConnectOptions = url.parse()?;
    let d = drain(admin, &connect, opts, &topic, n, commits, rows).await?;
    // Verify in the database.
    let (success, other, wrong, ledger, units): (i64, i64, i64, i64, i64) = sqlx::query_as(
        "SELECT \
           (SELECT COUNT(*) FROM idem_outbox WHERE topic = $1 AND status = 'success'), \
           (SELECT COUNT(*) FROM idem_outbox WHERE topic = $1 AND status <> 'success'), \
           (SELECT COUNT(*) FROM bench_outbox_coupon c WHERE c.status <> 'USED' \
              OR (SELECT COUNT(*) FROM bench_outbox_ledger d WHERE d.coupon_id = c.id) <> 1), \
           (SELECT COUNT(*) FROM bench_outbox_ledger), \
           (SELECT SUM(units)::BIGINT FROM bench_outbox_stock)",
    )
    .bind(&topic)
    .fetch_one(admin)
    .await?;
    let Drained {
        executed,
        duplicates,
        retried,
        dead,
        claimed,
        ..
    } = d;
    // The hot rows lost one unit per message in all, the others none.
    let units_left = match rows {
        Rows::Own => n,
        Rows::Hot | Rows::HotRows(_) => rows.stock_rows() * n - n,
    };
    if success != n
        || other != 0
        || wrong != 0
        || ledger != n
        || units != units_left
        || executed != n as u64
    {
        return Err(format!(
            "idem run {run}: VERIFY FAILED: {success} of {n} messages success, {other} not, \
             {wrong} coupons not USED with exactly one ledger row, {ledger} ledger rows, \
             {units} stock units left (expected {units_left}); \
             relay: {executed} executed, {duplicates} duplicates, {retried} retried, \
             {dead} dead-lettered, {claimed} claimed"
        )
        .into());
    }
    // Leave idem_outbox as it was: every run starts on the same table.
    sqlx::query("DELETE FROM idem_outbox WHERE topic = $1")
        .bind(&topic)
        .execute(admin)
        .await?;
    Ok(d.run(enqueue_time, n, c))
}

/// What [`drain`] saw.
#[derive(Debug, Clone)]
pub struct Drained {
    /// From the relay's start until `n` messages were handled.
    pub drain: Duration,
    /// The relay's counters when it was shut down.
    pub executed: u64,
    /// Deliveries that found the coupon `USED`.
    pub duplicates: u64,
    /// Attempts retried.
    pub retried: u64,
    /// Messages dead-lettered.
    pub dead: u64,
    /// Messages claimed.
    pub claimed: u64,
    /// Batches that lost a conflict (`Relay::commit_batch_shrinks`).
    pub shrinks: u64,
    /// CPU spent while draining (see [`Cpu`]).
    pub cpu: Cpu,
    handler_total: Duration,
    before: PgCounters,
    after: PgCounters,
}

impl Drained {
    /// Messages per second.
    pub fn rate(&self, n: i64) -> f64 {
        n as f64 / self.drain.as_secs_f64()
    }

    fn run(&self, enqueue: Duration, n: i64, c: usize) -> IdemRun {
        let claims = (self.after.due_index_scans - self.before.due_index_scans).max(1);
        IdemRun {
            enqueue,
            drain: self.drain,
            rate: self.rate(n),
            claims_per_msg: claims as f64 / n as f64,
            claim_period: self.drain / claims as u32,
            commits_per_msg: (self.after.commits - self.before.commits) as f64 / n as f64,
            handler_avg: self.handler_total / n as u32,
            utilization: self.handler_total.as_secs_f64() / (self.drain.as_secs_f64() * c as f64),
            shrinks: self.shrinks,
            client_us: per_message_us(self.cpu.own, n),
            server_us: per_message_us(self.cpu.rest(), n),
        }
    }
}

/// Drains `n` messages of `topic` (pending in `idem_outbox`, their coupons
/// `UNUSED` in `bench_outbox_coupon`, both where `connect`'s search path
/// finds them) through a relay into the `#[idempotent]` handler, then shuts
/// the relay down. `admin` reads the statistics (on the same schema).
pub async fn drain(
    admin: &PgPool,
    connect: &PgConnectOptions,
    opts: &Setup,
    topic: &str,
    n: i64,
    commits: Commits,
    rows: Rows,
) -> Result<Drained, BoxError> {
    let c = opts.concurrency;
    // Drain: the relay's own pool, C handlers plus the claiming loop.
    let pool = PgPoolOptions::new()
        .max_connections(c as u32 + 1)
        .min_connections(c as u32 + 1)
        .acquire_timeout(Duration::from_secs(30))
        .connect_with(connect.clone())
        .await?;
    // Every connection open before the statistics snapshot.
    let mut held = Vec::new();
    for _ in 0..=c {
        held.push(pool.acquire().await?);
    }
    drop(held);
    let before = counters(admin).await?;
    let handler_nanos = Arc::new(AtomicU64::new(0));
    let hn = handler_nanos.clone();
    let cpu = Cpu::now();
    let started = Instant::now();
    let builder = Relay::new(pool.clone())
        .route(topic.to_string(), move |d, m: DeductCoupon| {
            let hn = hn.clone();
            async move {
                let t = Instant::now();
                let r = match rows {
                    Rows::Own => deduct(d.source(), &m).await,
                    Rows::Hot | Rows::HotRows(_) => {
                        deduct_hot_rows(d.source(), &m, rows.stock_rows()).await
                    }
                };
                hn.fetch_add(t.elapsed().as_nanos() as u64, Ordering::Relaxed);
                r
            }
        })
        .batch_size(opts.batch)
        .concurrency(c)
        .poll_interval(Duration::from_millis(5))
        .lease(Duration::from_secs(LEASE_SECS));
    let builder = match commits {
        Commits::PerMessage => builder,
        // A batch takes one handler slot per message: room for as many
        // batches at once as per-message mode has handlers (one connection
        // each), claimed in one round.
        Commits::Batched(k) => builder
            .commit_batch(k as usize)
            .concurrency(c * k as usize)
            .batch_size((c as u32) * k),
    };
    // A clone shares the running relay's state (its batch size in force).
    let view = builder.clone();
    let relay = builder.spawn();
    let drain = drained(&relay, n, started).await?;
    let cpu = Cpu::now().since(&cpu);
    let (executed, duplicates, retried, dead, claimed) = {
        let s = relay.stats();
        (
            s.executed(),
            s.duplicates(),
            s.retried(),
            s.dead_lettered(),
            s.claimed(),
        )
    };
    let shrinks = view.commit_batch_shrinks();
    relay.shutdown().await;
    pool.close().await;
    let after = counters(admin).await?;

    Ok(Drained {
        drain,
        executed,
        duplicates,
        retried,
        dead,
        claimed,
        shrinks,
        cpu,
        handler_total: Duration::from_nanos(handler_nanos.load(Ordering::Relaxed)),
        before,
        after,
    })
}

/// Waits until `relay` has finished `n` messages (executed, duplicates or
/// dead letters); the time since `started`. An error when it makes no
/// progress for 60 s.
pub async fn drained(relay: &RelayHandle, n: i64, started: Instant) -> Result<Duration, BoxError> {
    let mut last = (0u64, Instant::now());
    loop {
        let s = relay.stats();
        let done = s.executed() + s.duplicates() + s.dead_lettered();
        if done >= n as u64 {
            return Ok(started.elapsed());
        }
        if done != last.0 {
            last = (done, Instant::now());
        } else if last.1.elapsed() > Duration::from_secs(60) {
            return Err(format!("relay stalled at {done} of {n} messages for 60 s").into());
        }
        // Often enough to time a drain of seconds to 0.2%; rarely enough
        // not to count in its CPU per message.
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}
