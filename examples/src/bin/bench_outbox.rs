//! # Benchmark: outbox end-to-end throughput against `pgbench` running the same statements
//!
//! **idem side.** N coupons are created, each in its own transaction that
//! also enqueues its "deduct this coupon" message with
//! [`idem_runtime::outbox::enqueue`] (timed, but apart). Then a
//! [`Relay`] is started on the run's own topic, routed to an
//! `#[idempotent(strategy = state_machine)]` handler whose body inserts the
//! ledger row; the clock runs from the relay's start until its counters
//! show N messages handled (read every millisecond, no query), then the
//! relay is shut down. The database is then checked: N messages `success`,
//! every coupon `USED` with exactly one ledger row.
//!
//! **pgbench side.** The physical limit of this database on this machine for
//! the same work: `pgbench -M prepared` with as many clients as the relay
//! has handlers, running the statements the relay and the handler issue per
//! message, on its own copies of the tables (same DDL, the outbox table
//! rendered from idem's own schema, the claim from idem's own
//! `Dialect::claim_sql`, the lock and transition from `Dialect::state_sql`):
//!
//! - script 1, one message (weight `batch`): `BEGIN`; `SELECT status … FOR
//!   UPDATE`; the ledger `INSERT`; the guarded `UPDATE` of the coupon; the
//!   outbox `UPDATE … SET status = 'success'`; `COMMIT` (the handler marks
//!   its own message, so the relay issues no fallback update);
//! - script 2, one claim (weight 1): `BEGIN`; `SET LOCAL synchronous_commit
//!   = off` (as the relay's claim); `UPDATE idem_outbox … FROM (SELECT … FOR
//!   UPDATE SKIP LOCKED LIMIT batch) … RETURNING`; `COMMIT`.
//!
//! so one claim per `batch` messages, the amortization the relay is
//! configured for. The message rate is script 1's tps.
//!
//! Each pgbench transaction works on a coupon and a message of its own, in
//! queue order: a per-client counter `k` (pgbench variables persist across
//! a client's transactions; `-D k=0` starts it) gives client `c` the ids
//! `c+1, c+1+C, c+1+2C, …`, so the C clients walk the queue together, the
//! way the relay's handlers do, and no transaction lands on a coupon that is
//! already `USED` (which `random(1, N)` would do, cheaply, distorting the
//! limit). Enough rows are created beforehand (sized from the rate seen so
//! far); afterwards the database is checked: as many coupons `USED`, ledger
//! rows and delivered messages as script-1 transactions, none twice.
//!
//! The two sides alternate, A B A B (after an unmeasured warm-up of each),
//! and the ratio idem/pgbench of the best runs is the result (target ≥ 0.7).
//! The idem runs also report where their statements went: claims per
//! message (from the statistics of the outbox's due index) and how busy the
//! handler slots were.
//!
//! ```text
//! cargo run --release -p idem-examples --bin bench_outbox
//! cargo run --release -p idem-examples --bin bench_outbox -- --messages 20000 --concurrency 16 --batch 16 --pgbench-seconds 10
//! ```
//!
//! `DATABASE_URL` defaults to `postgres://postgres@127.0.0.1:5432/test`
//! (pgbench gets the same URL). Other options: `--rounds R` (default 2),
//! `--pgbench PATH` (default `/usr/bin/pgbench`), `--no-warmup`,
//! `--show-scripts` (print the two pgbench scripts).
//!
//! Defaults: 16 handlers (the relay's default; on this 2-core machine the
//! work is bound by the WAL flush of each commit, not by the CPU, and
//! pgbench peaks around 16 clients), and batches of as many messages as
//! there are handlers: the relay never claims more than it has free
//! handlers, so a larger batch changes nothing on the idem side and would
//! only flatter pgbench's amortization.

use idem_runtime::__private::Dialect;
use idem_runtime::outbox::{Relay, enqueue};
use idem_runtime::{State, idempotent};
use serde::{Deserialize, Serialize};
use sqlx::postgres::PgPoolOptions;
use sqlx::{PgPool, Postgres, Transaction};
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The idem side's tables (the outbox is idem's own `idem_outbox`).
const COUPON: &str = "bench_outbox_coupon";
const LEDGER: &str = "bench_outbox_ledger";
/// The pgbench side's tables.
const PGB_COUPON: &str = "bench_outbox_pgb_coupon";
const PGB_LEDGER: &str = "bench_outbox_pgb_ledger";
const PGB_OUTBOX: &str = "bench_outbox_pgb_outbox";
/// The lease both sides claim with (the relay's default).
const LEASE_SECS: u64 = 30;
/// Order ids are the coupon id plus this.
const ORDER_OFFSET: i64 = 2_000_000_000;

#[derive(Debug, Clone, Copy, PartialEq, Eq, State)]
enum CouponState {
    Unused,
    Used,
}

/// The message: "deduct this coupon for this order".
#[derive(Debug, Clone, Serialize, Deserialize)]
struct DeductCoupon {
    msg_id: String,
    coupon_id: i64,
    order_id: i64,
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

struct Options {
    messages: i64,
    concurrency: usize,
    batch: u32,
    pgbench_seconds: u32,
    rounds: usize,
    pgbench: String,
    warmup: bool,
    show_scripts: bool,
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

fn best(v: &[f64]) -> f64 {
    v.iter().copied().fold(f64::NAN, f64::max)
}

// ---- the idem side -------------------------------------------------------------------

/// One idem run.
struct IdemRun {
    enqueue: Duration,
    drain: Duration,
    /// Messages per second through the relay.
    rate: f64,
    /// Claim statements per message (the due index's scans; approximate if
    /// something else uses `idem_outbox` at the same time).
    claims_per_msg: f64,
    /// Committed transactions per message, the database's count.
    commits_per_msg: f64,
    /// Mean time of one handler call (begin to commit).
    handler_avg: Duration,
    /// Mean time between two claims of the relay's loop (it claims, hands
    /// the batch out, claims again): in effect the time of one claim.
    claim_period: Duration,
    /// Share of the handler slots' time spent in handler calls.
    utilization: f64,
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
                          WHERE indexrelname = 'idx_idem_outbox_pending'), 0)",
    )
    .fetch_one(pool)
    .await?;
    Ok(PgCounters {
        commits,
        due_index_scans,
    })
}

async fn idem_run(
    admin: &PgPool,
    url: &str,
    opts: &Options,
    n: i64,
    run: &str,
) -> Result<IdemRun, BoxError> {
    let c = opts.concurrency;
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!("TRUNCATE {LEDGER}, {COUPON}")))
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
                enqueue(&mut tx, &topic, &msg.msg_id, &serde_json::to_value(&msg)?).await?;
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

    // Drain: the relay's own pool, C handlers plus the claiming loop.
    let pool = PgPoolOptions::new()
        .max_connections(c as u32 + 1)
        .min_connections(c as u32 + 1)
        .acquire_timeout(Duration::from_secs(30))
        .connect(url)
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
    let started = Instant::now();
    let relay = Relay::new(pool.clone())
        .route(topic.clone(), move |d, m: DeductCoupon| {
            let hn = hn.clone();
            async move {
                let t = Instant::now();
                let r = deduct(d.source(), &m).await;
                hn.fetch_add(t.elapsed().as_nanos() as u64, Ordering::Relaxed);
                r
            }
        })
        .batch_size(opts.batch)
        .concurrency(c)
        .poll_interval(Duration::from_millis(5))
        .lease(Duration::from_secs(LEASE_SECS))
        .spawn();
    let mut last = (0u64, Instant::now());
    let drain = loop {
        let s = relay.stats();
        let done = s.executed.load(Ordering::Relaxed)
            + s.duplicates.load(Ordering::Relaxed)
            + s.dead_lettered.load(Ordering::Relaxed);
        if done >= n as u64 {
            break started.elapsed();
        }
        if done != last.0 {
            last = (done, Instant::now());
        } else if last.1.elapsed() > Duration::from_secs(60) {
            return Err(format!("relay stalled at {done} of {n} messages for 60 s").into());
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    };
    let (executed, duplicates, retried, dead, claimed) = {
        let s = relay.stats();
        (
            s.executed.load(Ordering::Relaxed),
            s.duplicates.load(Ordering::Relaxed),
            s.retried.load(Ordering::Relaxed),
            s.dead_lettered.load(Ordering::Relaxed),
            s.claimed.load(Ordering::Relaxed),
        )
    };
    relay.shutdown().await;
    pool.close().await;
    let after = counters(admin).await?;

    // Verify in the database.
    let (success, other, wrong, ledger): (i64, i64, i64, i64) = sqlx::query_as(
        "SELECT \
           (SELECT COUNT(*) FROM idem_outbox WHERE topic = $1 AND status = 'success'), \
           (SELECT COUNT(*) FROM idem_outbox WHERE topic = $1 AND status <> 'success'), \
           (SELECT COUNT(*) FROM bench_outbox_coupon c WHERE c.status <> 'USED' \
              OR (SELECT COUNT(*) FROM bench_outbox_ledger d WHERE d.coupon_id = c.id) <> 1), \
           (SELECT COUNT(*) FROM bench_outbox_ledger)",
    )
    .bind(&topic)
    .fetch_one(admin)
    .await?;
    if success != n || other != 0 || wrong != 0 || ledger != n || executed != n as u64 {
        return Err(format!(
            "idem run {run}: VERIFY FAILED: {success} of {n} messages success, {other} not, \
             {wrong} coupons not USED with exactly one ledger row, {ledger} ledger rows; \
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
    let handler_total = Duration::from_nanos(handler_nanos.load(Ordering::Relaxed));
    let claims = (after.due_index_scans - before.due_index_scans).max(1);
    Ok(IdemRun {
        enqueue: enqueue_time,
        drain,
        rate: n as f64 / drain.as_secs_f64(),
        claims_per_msg: claims as f64 / n as f64,
        claim_period: drain / claims as u32,
        commits_per_msg: (after.commits - before.commits) as f64 / n as f64,
        handler_avg: handler_total / n as u32,
        utilization: handler_total.as_secs_f64() / (drain.as_secs_f64() * c as f64),
    })
}

// ---- the pgbench side ----------------------------------------------------------------

/// One pgbench run.
struct PgbenchRun {
    /// Script-1 transactions (messages) per second.
    rate: f64,
    messages: i64,
    claims: i64,
    /// Mean latency of script 1 (one message) and script 2 (one claim).
    message_latency_ms: f64,
    claim_latency_ms: f64,
}

/// Replaces the numbered placeholders `$1`, `$2`, … of `sql` by pgbench
/// variables, highest number first (so `$1` does not eat into `$10`).
fn pgbench_vars(sql: &str, vars: &[&str]) -> String {
    let mut s = sql.to_string();
    for (i, v) in vars.iter().enumerate().rev() {
        s = s.replace(&format!("${}", i + 1), &format!(":{v}"));
    }
    s
}

/// The relay's and the handler's PostgreSQL statements, on the pgbench
/// tables, with pgbench variables for their parameters.
fn pgbench_scripts() -> (String, String) {
    let pg = Dialect::Postgres;
    let state = pg.state_sql(PGB_COUPON, "id", "status", None);
    let lock = pgbench_vars(&state.lock, &["id"]);
    let transition = pgbench_vars(&state.transition, &["to", "id", "from"]);
    // idem-runtime's `outbox_success` (not public), first in the handler's
    // transaction as there, on the pgbench outbox table. Its lease fence
    // (topic, owner, attempt) is left out: pgbench's rows are not claimed,
    // and the fence only adds filters on the row the id already found.
    let success = format!(
        "UPDATE {PGB_OUTBOX} SET status = 'success', \
         updated_at = now(), lease_owner = NULL, locked_until = NULL \
         WHERE id = :id AND status = 'pending'"
    );
    let message = format!(
        "-- one message: the handler's transaction\n\
         \\set k :k + 1\n\
         \\set id (:k - 1) * :nclients + :client_id + 1\n\
         \\set order :id + {ORDER_OFFSET}\n\
         BEGIN;\n\
         {success};\n\
         {lock};\n\
         INSERT INTO {PGB_LEDGER} (coupon_id, order_id, msg_id) VALUES (:id, :order, :id);\n\
         {transition};\n\
         COMMIT;\n"
    );
    let claim = pgbench_vars(
        &pg.claim_sql(1).claim,
        &["owner", "lease", "topic", "batch"],
    )
    .replace("idem_outbox", PGB_OUTBOX);
    let claim = format!(
        "-- one claim of up to :batch messages\nBEGIN;\nSET LOCAL synchronous_commit = off;\n{claim};\nCOMMIT;\n"
    );
    (message, claim)
}

/// Recreates the pgbench side's data: `rows` coupons and pending messages,
/// ids 1..=rows, due in id order.
async fn pgbench_fill(admin: &PgPool, rows: i64, topic: &str) -> Result<(), BoxError> {
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "TRUNCATE {PGB_LEDGER}, {PGB_COUPON}, {PGB_OUTBOX}"
    )))
    .execute(admin)
    .await?;
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "INSERT INTO {PGB_COUPON} (id, status) SELECT g, 'UNUSED' FROM generate_series(1, $1::bigint) g"
    )))
    .bind(rows)
    .execute(admin)
    .await?;
    // Distinct due times in id order, as enqueue's `now()` gives them (equal
    // times would make every claim sort the whole queue on `id`).
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "INSERT INTO {PGB_OUTBOX} (id, topic, msg_id, payload, next_attempt_at, created_at) \
         SELECT g, $2, g::text, \
           format('{{\"msg_id\":\"%s\",\"coupon_id\":%s,\"order_id\":%s}}', g, g, g + {ORDER_OFFSET}), \
           now() - interval '1 hour' + g * interval '1 microsecond', now() \
         FROM generate_series(1, $1::bigint) g"
    )))
    .bind(rows)
    .bind(topic)
    .execute(admin)
    .await?;
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "VACUUM ANALYZE {PGB_COUPON}, {PGB_LEDGER}, {PGB_OUTBOX}"
    )))
    .execute(admin)
    .await?;
    Ok(())
}

/// Transactions, tps and mean latency (ms) of the `n`-th `SQL script`
/// section of pgbench's report:
///
/// ```text
///  - 12345 transactions (98.4% of total, tps = 1234.567890)
///  - number of failed transactions: 0 (0.000%)
///  - latency average = 9.876 ms
/// ```
fn script_stats(out: &str, n: usize) -> Option<(i64, f64, f64)> {
    let section = out.split("SQL script ").nth(n)?;
    let line = section.lines().find(|l| l.contains(" transactions ("))?;
    let count = line
        .trim()
        .trim_start_matches("- ")
        .split(' ')
        .next()?
        .parse()
        .ok()?;
    let tps = line
        .split("tps = ")
        .nth(1)?
        .trim_end_matches(')')
        .trim()
        .parse()
        .ok()?;
    let latency = section
        .lines()
        .find_map(|l| l.split("latency average = ").nth(1))?
        .trim_end_matches("ms")
        .trim()
        .parse()
        .ok()?;
    Some((count, tps, latency))
}

async fn pgbench_run(
    admin: &PgPool,
    url: &str,
    opts: &Options,
    seconds: u32,
    rows: i64,
    dir: &std::path::Path,
) -> Result<PgbenchRun, BoxError> {
    let c = opts.concurrency;
    let topic = format!("bench-outbox.pgbench.{}", std::process::id());
    pgbench_fill(admin, rows, &topic).await?;
    let (message, claim) = pgbench_scripts();
    let (mpath, cpath) = (dir.join("message.sql"), dir.join("claim.sql"));
    std::fs::write(&mpath, message)?;
    std::fs::write(&cpath, claim)?;
    let out = tokio::process::Command::new(&opts.pgbench)
        .args(["-n", "-M", "prepared"])
        .args(["-c", &c.to_string(), "-j", &c.min(2).to_string()])
        .args(["-T", &seconds.to_string()])
        .args(["-D", "k=0", "-D", &format!("nclients={c}")])
        .args(["-D", "from=UNUSED", "-D", "to=USED"])
        .args([
            "-D",
            "owner=pgbench-relay",
            "-D",
            &format!("lease={LEASE_SECS}"),
        ])
        .args([
            "-D",
            &format!("topic={topic}"),
            "-D",
            &format!("batch={}", opts.batch),
        ])
        .arg("-f")
        .arg(format!("{}@{}", mpath.display(), opts.batch))
        .arg("-f")
        .arg(format!("{}@1", cpath.display()))
        .arg(url)
        .output()
        .await
        .map_err(|e| format!("cannot run {}: {e}", opts.pgbench))?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    if !out.status.success() || stderr.contains("aborted") {
        return Err(format!("pgbench failed ({}):\n{stdout}\n{stderr}", out.status).into());
    }
    let (Some((messages, rate, message_latency_ms)), Some((claims, _, claim_latency_ms))) =
        (script_stats(&stdout, 1), script_stats(&stdout, 2))
    else {
        return Err(format!("cannot parse pgbench's output:\n{stdout}").into());
    };
    if !stdout.contains("(without initial connection time)") {
        return Err(format!("no tps line in pgbench's output:\n{stdout}").into());
    }

    // Verify: every script-1 transaction deducted its own coupon, once.
    let (used, ledger, twice, success): (i64, i64, i64, i64) =
        sqlx::query_as(sqlx::AssertSqlSafe(format!(
            "SELECT \
               (SELECT COUNT(*) FROM {PGB_COUPON} WHERE status = 'USED'), \
               (SELECT COUNT(*) FROM {PGB_LEDGER}), \
               (SELECT COUNT(*) FROM (SELECT coupon_id FROM {PGB_LEDGER} \
                  GROUP BY coupon_id HAVING COUNT(*) > 1) d), \
               (SELECT COUNT(*) FROM {PGB_OUTBOX} WHERE status = 'success')"
        )))
        .fetch_one(admin)
        .await?;
    // A client's transaction in flight when `-T` runs out may commit without
    // pgbench counting it: at most one per client beyond the count.
    let consistent = used == ledger && ledger == success && twice == 0;
    if !consistent || used < messages || used > messages + c as i64 {
        let hint = if messages > rows - c as i64 {
            format!(" (it ran out of the {rows} rows created for it)")
        } else {
            String::new()
        };
        return Err(format!(
            "pgbench run: VERIFY FAILED{hint}: {messages} message transactions, but {used} \
             coupons USED, {ledger} ledger rows ({twice} coupons twice), {success} messages \
             success"
        )
        .into());
    }
    Ok(PgbenchRun {
        rate,
        messages,
        claims,
        message_latency_ms,
        claim_latency_ms,
    })
}

/// Rows to create for a pgbench run: what the rate seen so far needs, with
/// room to spare.
fn pgbench_rows(expected_rate: f64, seconds: u32, opts: &Options) -> i64 {
    ((expected_rate * f64::from(seconds) * 1.6) as i64 + 2000).max(opts.messages)
}

// ---- main ----------------------------------------------------------------------------

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
    let opts = parse_args()?;
    idem_examples::bench::warn_if_debug("bench_outbox");
    let Some(url) = idem_examples::bench::reachable_postgres().await else {
        return Ok(ExitCode::FAILURE);
    };
    if !std::path::Path::new(&opts.pgbench).exists() {
        eprintln!(
            "pgbench not found at {} (install postgresql-client, or pass --pgbench PATH)",
            opts.pgbench
        );
        return Ok(ExitCode::FAILURE);
    }
    let admin = PgPoolOptions::new()
        .max_connections(2)
        .connect(&url)
        .await?;
    idem_runtime::migrate(&admin).await?;
    // Messages of earlier runs that were interrupted: pending rows of a
    // topic nobody routes would be scanned by every claim.
    sqlx::query("DELETE FROM idem_outbox WHERE topic LIKE 'bench-outbox.%'")
        .execute(&admin)
        .await?;

    // Fresh bench tables. The pgbench outbox is idem's own DDL, renamed.
    let mut ddl = vec![
        format!(
            "DROP TABLE IF EXISTS {LEDGER}, {COUPON}, {PGB_LEDGER}, {PGB_COUPON}, {PGB_OUTBOX}"
        ),
        format!("CREATE TABLE {COUPON} (id BIGINT PRIMARY KEY, status VARCHAR(16) NOT NULL)"),
        format!("CREATE TABLE {PGB_COUPON} (id BIGINT PRIMARY KEY, status VARCHAR(16) NOT NULL)"),
    ];
    for ledger in [LEDGER, PGB_LEDGER] {
        ddl.push(format!(
            "CREATE TABLE {ledger} (coupon_id BIGINT NOT NULL, order_id BIGINT NOT NULL, \
             msg_id VARCHAR(64) NOT NULL)"
        ));
        ddl.push(format!(
            "CREATE INDEX idx_{ledger}_coupon ON {ledger} (coupon_id)"
        ));
    }
    ddl.extend(
        Dialect::Postgres
            .schema()
            .iter()
            .filter(|s| {
                s.contains("idem_outbox") && !s.contains("advisory") && !s.contains("history")
            })
            .map(|s| s.replace("idem_outbox", PGB_OUTBOX)),
    );
    for stmt in ddl {
        sqlx::raw_sql(sqlx::AssertSqlSafe(stmt))
            .execute(&admin)
            .await?;
    }
    let dir = std::env::temp_dir().join(format!("bench_outbox.{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;

    let c = opts.concurrency;
    println!(
        "outbox benchmark on PostgreSQL: {} messages per idem run, relay with {c} handlers and \
         batches of {}; pgbench -M prepared -c {c} -j {} for {} s, one claim per {} messages",
        opts.messages,
        opts.batch,
        c.min(2),
        opts.pgbench_seconds,
        opts.batch
    );
    println!(
        "per message: handler BEGIN, SELECT … FOR UPDATE, INSERT ledger, UPDATE coupon, \
         UPDATE outbox, COMMIT; per claim BEGIN, SET LOCAL synchronous_commit = off, \
         UPDATE … RETURNING, COMMIT"
    );

    if opts.show_scripts {
        let (message, claim) = pgbench_scripts();
        println!("pgbench script 1 (weight {}):\n{message}", opts.batch);
        println!("pgbench script 2 (weight 1):\n{claim}");
    }

    // The rate pgbench is expected to reach, to size its data.
    let mut expected = 20_000.0f64;
    if opts.warmup {
        let r = idem_run(&admin, &url, &opts, opts.messages.min(2000), "warmup").await?;
        let p = pgbench_run(
            &admin,
            &url,
            &opts,
            2,
            pgbench_rows(expected, 2, &opts),
            &dir,
        )
        .await?;
        expected = p.rate;
        println!(
            "warm-up (not counted): idem {:.0} msg/s, pgbench {:.0} msg/s",
            r.rate, p.rate
        );
    }

    println!();
    println!(
        "{:<11}{:>8}{:>11}{:>9}{:>11}{:>11}{:>10}{:>12}{:>7}",
        "run", "msg/s", "enqueue/s", "time", "claims/msg", "msgs/claim", "claim", "message", "busy"
    );
    let (mut idem_rates, mut pg_rates) = (Vec::new(), Vec::new());
    let mut last_idem = None;
    for round in 1..=opts.rounds {
        let r = idem_run(&admin, &url, &opts, opts.messages, &round.to_string()).await?;
        println!(
            "{:<11}{:>8.0}{:>11.0}{:>8.2}s{:>11.3}{:>11.1}{:>8.2}ms{:>10.2}ms{:>6.0}%",
            format!("A{round} idem"),
            r.rate,
            opts.messages as f64 / r.enqueue.as_secs_f64(),
            r.drain.as_secs_f64(),
            r.claims_per_msg,
            1.0 / r.claims_per_msg,
            r.claim_period.as_secs_f64() * 1e3,
            r.handler_avg.as_secs_f64() * 1e3,
            r.utilization * 100.0
        );
        idem_rates.push(r.rate);
        last_idem = Some(r);
        let rows = pgbench_rows(expected, opts.pgbench_seconds, &opts);
        let p = pgbench_run(&admin, &url, &opts, opts.pgbench_seconds, rows, &dir).await?;
        expected = expected.max(p.rate);
        println!(
            "{:<11}{:>8.0}{:>11}{:>8}s{:>11.3}{:>11.1}{:>8.2}ms{:>10.2}ms{:>7}",
            format!("B{round} pgbench"),
            p.rate,
            "-",
            opts.pgbench_seconds,
            p.claims as f64 / p.messages as f64,
            p.messages as f64 / p.claims.max(1) as f64,
            p.claim_latency_ms,
            p.message_latency_ms,
            "-"
        );
        pg_rates.push(p.rate);
    }
    let _ = std::fs::remove_dir_all(&dir);

    let (ib, pb) = (best(&idem_rates), best(&pg_rates));
    let (im, pm) = (median(idem_rates), median(pg_rates));
    println!();
    println!("idem     best {ib:>7.0} msg/s   median {im:>7.0} msg/s");
    println!("pgbench  best {pb:>7.0} msg/s   median {pm:>7.0} msg/s");
    if let Some(r) = last_idem {
        println!(
            "last idem run: {:.1} messages per claim (configured: up to {}), one claim every \
             {:.2} ms, {:.2} committed transactions per message, handler call {:.2} ms on \
             average, handler slots {:.0}% busy",
            1.0 / r.claims_per_msg,
            opts.batch,
            r.claim_period.as_secs_f64() * 1e3,
            r.commits_per_msg,
            r.handler_avg.as_secs_f64() * 1e3,
            r.utilization * 100.0
        );
    }
    println!("median ratio idem/pgbench: {:.2}", im / pm);
    println!("ratio idem/pgbench: {:.2}", ib / pb);
    Ok(ExitCode::SUCCESS)
}

fn parse_args() -> Result<Options, BoxError> {
    let mut opts = Options {
        messages: 20_000,
        concurrency: 16,
        batch: 0,
        pgbench_seconds: 10,
        rounds: 2,
        pgbench: "/usr/bin/pgbench".into(),
        warmup: true,
        show_scripts: false,
    };
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut value = || -> Result<String, BoxError> {
            args.next()
                .ok_or_else(|| format!("{arg} needs a value").into())
        };
        match arg.as_str() {
            "--messages" => opts.messages = value()?.parse()?,
            "--concurrency" => opts.concurrency = value()?.parse()?,
            "--batch" => opts.batch = value()?.parse()?,
            "--pgbench-seconds" => opts.pgbench_seconds = value()?.parse()?,
            "--rounds" => opts.rounds = value()?.parse()?,
            "--pgbench" => opts.pgbench = value()?,
            "--no-warmup" => opts.warmup = false,
            "--show-scripts" => opts.show_scripts = true,
            "-h" | "--help" => {
                println!(
                    "usage: bench_outbox [--messages N] [--concurrency C] [--batch B] \
                     [--pgbench-seconds S] [--rounds R] [--pgbench PATH] [--no-warmup] [--show-scripts]\n\
                     DATABASE_URL defaults to postgres://postgres@127.0.0.1:5432/test"
                );
                std::process::exit(0);
            }
            other => return Err(format!("unknown argument `{other}` (try --help)").into()),
        }
    }
    if opts.batch == 0 {
        // The relay claims at most as many messages as it has free handlers.
        opts.batch = opts.concurrency as u32;
    }
    if opts.messages < 1 || opts.concurrency < 1 || opts.pgbench_seconds < 1 || opts.rounds < 1 {
        return Err(
            "--messages, --concurrency, --pgbench-seconds and --rounds must be at least 1".into(),
        );
    }
    Ok(opts)
}
