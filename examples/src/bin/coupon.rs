//! # The coupon double-deduction incident, replayed
//!
//! *Async Idempotency in Practice* tells of a promotion during which some
//! users lost two coupons for one order. The order and its "deduct the
//! coupon" message were committed together in a local message table (an
//! outbox); a commit acknowledgement was lost, the message stayed pending,
//! the poller delivered it again, and the handler deducted again. Retries
//! are how the pipeline heals, so every message is delivered more than once
//! sooner or later — often several times at once.
//!
//! This example replays it. It places one order per coupon, each with its
//! deduction message enqueued in the order's own transaction, then delivers
//! every message several times concurrently (the original delivery plus the
//! redeliveries), and lets two handlers consume them, each on its own set
//! of coupons:
//!
//! - **the article's fault version**, written by hand: the coupon's state is
//!   read *outside* the transaction, so redeliveries running at the same
//!   time all read `UNUSED`, and all of them deduct;
//! - **`deduct_coupon`**, an `#[idempotent(strategy = state_machine)]`
//!   handler: the attribute locks the coupon row, checks its state, runs the
//!   body (one ledger insert), flips the coupon `UNUSED` → `USED` and marks
//!   the outbox message delivered, all in one transaction. A redelivery finds
//!   the coupon `USED` and answers `Outcome::Duplicate` without running the
//!   body.
//!
//! The database then counts the damage: coupons with more than one ledger
//! row (double deductions), coupons with none (lost deductions), and
//! messages still pending.
//!
//! ```text
//! cargo run -p idem-examples --bin coupon              # SQLite, in a temporary file
//! DATABASE_URL=postgres://postgres@127.0.0.1:5432/test cargo run -p idem-examples --bin coupon
//! DATABASE_URL=mysql://root@127.0.0.1:3306/test cargo run -p idem-examples --bin coupon
//! ```
//!
//! Options: `--coupons N` (default 200), `--deliveries D` (each message is
//! delivered D times, default 4), `--concurrency C` (deliveries in flight,
//! default 16).
//!
//! One handler serves the three databases: it runs on `sqlx::Any`, and the
//! database is chosen at run time by the URL. The only thing that differs
//! is how the body's own SQL writes its placeholders (see [`sql`]).
//!
//! The process exits with status 1 if the idempotent handler ever deducts a
//! coupon twice, loses a deduction, or leaves a message pending.

use idem_runtime::{Outcome, Source, State, idempotent};
use serde::{Deserialize, Serialize};
use sqlx::any::AnyPoolOptions;
use sqlx::{Any, AnyConnection, AnyPool, AssertSqlSafe, Transaction};
use std::borrow::Cow;
use std::fmt::Write as _;
use std::future::Future;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::Semaphore;
use tokio::task::JoinSet;

/// The lifecycle of a coupon, stored as `UNUSED` / `USED` in its `status`
/// column.
#[derive(Debug, Clone, Copy, PartialEq, Eq, State)]
enum CouponState {
    Unused,
    Used,
}

/// The message the order transaction enqueues: "deduct this coupon for this
/// order". `msg_id` is stable across redeliveries, so it identifies the
/// action.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct DeductCoupon {
    msg_id: String,
    coupon_id: i64,
    order_id: i64,
}

// ---- the idempotent handler ------------------------------------------------

/// Deducts a coupon, once, however many times the message is delivered.
///
/// The body only records the deduction in the ledger. The attribute wraps
/// it: `SELECT status … FOR UPDATE` (SQLite: `BEGIN IMMEDIATE`), a
/// duplicate if the coupon is already `USED`, the body, then `UPDATE
/// example_coupon SET status = 'USED' WHERE id = ? AND status = 'UNUSED'`
/// (which must change one row) and the outbox update, in one transaction.
#[idempotent(
    key = "coupon-deduct:{msg.msg_id}",
    strategy = state_machine,
    table = "example_coupon", id = msg.coupon_id, state_column = "status",
    from = CouponState::Unused, to = CouponState::Used,
)]
async fn deduct_coupon(
    tx: &mut Transaction<'_, Any>,
    msg: &DeductCoupon,
) -> Result<(), sqlx::Error> {
    let insert = sql(
        tx.backend_name(),
        "INSERT INTO example_deduction (coupon_id, order_id, msg_id) VALUES (?, ?, ?)",
    );
    sqlx::query(insert)
        .bind(msg.coupon_id)
        .bind(msg.order_id)
        .bind(msg.msg_id.as_str())
        .execute(&mut **tx)
        .await?;
    Ok(())
}

/// One delivery through the idempotent handler. `Source::outbox` makes it
/// mark the message delivered in the handler's own transaction.
async fn deliver_idem(pool: AnyPool, outbox_id: i64, msg: Arc<DeductCoupon>) -> Delivery {
    match deduct_coupon(Source::outbox(&pool, outbox_id), &msg).await {
        Ok(Outcome::Executed(())) => Delivery::Executed,
        Ok(Outcome::Duplicate(_)) => Delivery::Duplicate,
        Err(e) => Delivery::Failed {
            retryable: e.is_retryable(),
            error: e.to_string(),
        },
    }
}

// ---- the article's fault version, by hand ------------------------------------

/// The article's "production fault version": the state check runs outside
/// the transaction, so concurrent redeliveries all read `UNUSED`, and the
/// row lock taken by the `UPDATE` only serializes the double deduction.
async fn deduct_coupon_fault_version(
    pool: &AnyPool,
    outbox_id: i64,
    msg: &DeductCoupon,
) -> Result<Delivery, sqlx::Error> {
    // Query OUTSIDE the transaction: concurrent retries read a stale state.
    let mut conn = pool.acquire().await?;
    let status: String = sqlx::query_scalar(sql(
        conn.backend_name(),
        "SELECT status FROM example_coupon WHERE id = ?",
    ))
    .bind(msg.coupon_id)
    .fetch_one(&mut *conn)
    .await?;
    drop(conn);
    if status != CouponState::Unused.as_str() {
        // "Duplicate message, coupon already deducted."
        return Ok(Delivery::Duplicate);
    }

    // The business operation, separated from the check.
    let mut tx = pool.begin().await?;
    let db = tx.backend_name().to_owned();
    sqlx::query(sql(
        &db,
        "INSERT INTO example_deduction (coupon_id, order_id, msg_id) VALUES (?, ?, ?)",
    ))
    .bind(msg.coupon_id)
    .bind(msg.order_id)
    .bind(msg.msg_id.as_str())
    .execute(&mut *tx)
    .await?;
    sqlx::query(sql(
        &db,
        "UPDATE example_coupon SET status = ? WHERE id = ?",
    ))
    .bind(CouponState::Used.as_str())
    .bind(msg.coupon_id)
    .execute(&mut *tx)
    .await?;
    sqlx::query(sql(
        &db,
        "UPDATE idem_outbox SET status = 'success' WHERE id = ?",
    ))
    .bind(outbox_id)
    .execute(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(Delivery::Executed)
}

/// One delivery through the fault version.
async fn deliver_fault(pool: AnyPool, outbox_id: i64, msg: Arc<DeductCoupon>) -> Delivery {
    match deduct_coupon_fault_version(&pool, outbox_id, &msg).await {
        Ok(d) => d,
        Err(e) => Delivery::Failed {
            retryable: idem_runtime::is_transient(&e),
            error: e.to_string(),
        },
    }
}

// ---- SQL in two placeholder styles --------------------------------------------

/// The statement `text`, written with `?` placeholders (MariaDB, SQLite),
/// for the database `backend` (`AnyConnection::backend_name`): PostgreSQL
/// numbers its placeholders, `$1, $2, …`. None of the statements here has a
/// `?` inside a string literal, so renumbering every `?` is safe, and the
/// result is still a `'static` text with only the placeholders changed.
fn sql(backend: &str, text: &'static str) -> AssertSqlSafe<Cow<'static, str>> {
    if backend != "PostgreSQL" {
        return AssertSqlSafe(Cow::Borrowed(text));
    }
    let mut out = String::with_capacity(text.len() + 8);
    let mut n = 0;
    for c in text.chars() {
        if c == '?' {
            n += 1;
            let _ = write!(out, "${n}");
        } else {
            out.push(c);
        }
    }
    AssertSqlSafe(Cow::Owned(out))
}

// ---- the scenario ----------------------------------------------------------------

/// One handler under test, with its own coupons and its own outbox topic.
struct Variant {
    title: &'static str,
    topic: &'static str,
    first_coupon: i64,
}

/// How one delivery ended.
enum Delivery {
    Executed,
    Duplicate,
    Failed { error: String, retryable: bool },
}

/// What the relay saw, and what the database holds afterwards.
#[derive(Default)]
struct Summary {
    coupons: i64,
    deliveries: u64,
    executed: u64,
    duplicates: u64,
    retried: u64,
    failed: u64,
    first_error: Option<String>,
    ledger_rows: i64,
    double: i64,
    lost: i64,
    pending: i64,
    elapsed: Duration,
}

struct Options {
    coupons: i64,
    deliveries: u32,
    concurrency: usize,
}

const SCHEMA: &[&str] = &[
    "DROP TABLE IF EXISTS example_deduction",
    "DROP TABLE IF EXISTS example_order",
    "DROP TABLE IF EXISTS example_coupon",
    "CREATE TABLE example_coupon (id BIGINT PRIMARY KEY, status VARCHAR(16) NOT NULL)",
    "CREATE TABLE example_order (id BIGINT PRIMARY KEY, coupon_id BIGINT NOT NULL)",
    // No key: a double deduction must be able to show up as a second row.
    "CREATE TABLE example_deduction (
        coupon_id BIGINT NOT NULL,
        order_id BIGINT NOT NULL,
        msg_id VARCHAR(64) NOT NULL
    )",
    "CREATE INDEX idx_example_deduction_coupon ON example_deduction (coupon_id)",
];

/// Issues the variant's coupons, then places one order per coupon: the
/// order row and its deduction message commit in one transaction.
async fn place_orders(pool: &AnyPool, db: &str, v: &Variant, n: i64) -> Result<(), BoxError> {
    let last = v.first_coupon + n - 1;
    let mut tx = pool.begin().await?;
    for coupon_id in v.first_coupon..=last {
        sqlx::query(sql(
            db,
            "INSERT INTO example_coupon (id, status) VALUES (?, ?)",
        ))
        .bind(coupon_id)
        .bind(CouponState::Unused.as_str())
        .execute(&mut *tx)
        .await?;
    }
    tx.commit().await?;

    for coupon_id in v.first_coupon..=last {
        let msg = DeductCoupon {
            msg_id: format!("msg-{coupon_id:07}"),
            coupon_id,
            order_id: 500_000_000 + coupon_id,
        };
        let mut tx = pool.begin().await?;
        sqlx::query(sql(
            db,
            "INSERT INTO example_order (id, coupon_id) VALUES (?, ?)",
        ))
        .bind(msg.order_id)
        .bind(coupon_id)
        .execute(&mut *tx)
        .await?;
        let payload = serde_json::to_value(&msg)?;
        idem_runtime::outbox::enqueue(&mut tx, v.topic, &msg.msg_id, &payload).await?;
        tx.commit().await?;
    }
    Ok(())
}

/// The relay: reads the pending messages of `topic` and delivers each one
/// `deliveries` times, the copies of a message next to each other so they
/// run at the same time, at most `concurrency` deliveries in flight. A
/// delivery that fails with a transient error (deadlock, busy database) is
/// retried, as a relay would.
async fn relay<F, Fut>(
    pool: &AnyPool,
    db: &str,
    topic: &str,
    opts: &Options,
    deliver: F,
) -> Result<Summary, BoxError>
where
    F: Fn(AnyPool, i64, Arc<DeductCoupon>) -> Fut + Copy + Send + 'static,
    Fut: Future<Output = Delivery> + Send + 'static,
{
    let pending: Vec<(i64, String)> = sqlx::query_as(sql(
        db,
        "SELECT id, payload FROM idem_outbox WHERE topic = ? AND status = 'pending' ORDER BY id",
    ))
    .bind(topic)
    .fetch_all(pool)
    .await?;

    let started = Instant::now();
    let slots = Arc::new(Semaphore::new(opts.concurrency));
    let mut tasks = JoinSet::new();
    for (outbox_id, payload) in pending {
        let msg: Arc<DeductCoupon> = Arc::new(serde_json::from_str(&payload)?);
        for _ in 0..opts.deliveries {
            let (pool, msg, slots) = (pool.clone(), msg.clone(), slots.clone());
            tasks.spawn(async move {
                let _slot = slots.acquire_owned().await.expect("semaphore open");
                let mut retried = 0;
                loop {
                    match deliver(pool.clone(), outbox_id, msg.clone()).await {
                        Delivery::Failed {
                            retryable: true, ..
                        } if retried < 10 => {
                            retried += 1;
                            tokio::time::sleep(Duration::from_millis(5 * retried)).await;
                        }
                        outcome => return (outcome, retried),
                    }
                }
            });
        }
    }

    let mut s = Summary::default();
    while let Some(done) = tasks.join_next().await {
        let (outcome, retried) = done?;
        s.deliveries += 1;
        s.retried += retried;
        match outcome {
            Delivery::Executed => s.executed += 1,
            Delivery::Duplicate => s.duplicates += 1,
            Delivery::Failed { error, .. } => {
                s.failed += 1;
                s.first_error.get_or_insert(error);
            }
        }
    }
    s.elapsed = started.elapsed();
    Ok(s)
}

/// Counts, in the database, what the deliveries left behind.
async fn count_damage(
    pool: &AnyPool,
    db: &str,
    v: &Variant,
    n: i64,
    s: &mut Summary,
) -> Result<(), sqlx::Error> {
    let (first, last) = (v.first_coupon, v.first_coupon + n - 1);
    let count = |text: &'static str| {
        sqlx::query_scalar::<_, i64>(sql(db, text))
            .bind(first)
            .bind(last)
            .fetch_one(pool)
    };
    s.coupons = n;
    s.ledger_rows =
        count("SELECT COUNT(*) FROM example_deduction WHERE coupon_id BETWEEN ? AND ?").await?;
    s.double = count(
        "SELECT COUNT(*) FROM (SELECT coupon_id FROM example_deduction \
         WHERE coupon_id BETWEEN ? AND ? GROUP BY coupon_id HAVING COUNT(*) > 1) AS twice",
    )
    .await?;
    s.lost = count(
        "SELECT COUNT(*) FROM example_coupon c WHERE c.id BETWEEN ? AND ? \
         AND NOT EXISTS (SELECT 1 FROM example_deduction d WHERE d.coupon_id = c.id)",
    )
    .await?;
    s.pending = sqlx::query_scalar(sql(
        db,
        "SELECT COUNT(*) FROM idem_outbox WHERE topic = ? AND status = 'pending'",
    ))
    .bind(v.topic)
    .fetch_one(pool)
    .await?;
    Ok(())
}

fn print_summary(db: &str, where_: &str, opts: &Options, fault: &Summary, idem: &Summary) {
    println!();
    println!(
        "coupon deduction on {db} ({where_}): {} coupons per handler, \
         each message delivered {} times, {} deliveries in flight",
        opts.coupons, opts.deliveries, opts.concurrency
    );
    println!();
    println!("{:<28}{:>20}{:>20}", "", "fault version", "#[idempotent]");
    println!(
        "{:<28}{:>20}{:>20}",
        "", "(by hand, article)", "state_machine"
    );
    let row = |label: &str, a: String, b: String| println!("{label:<28}{a:>20}{b:>20}");
    row(
        "coupons",
        fault.coupons.to_string(),
        idem.coupons.to_string(),
    );
    row(
        "deliveries",
        fault.deliveries.to_string(),
        idem.deliveries.to_string(),
    );
    row(
        "executed",
        fault.executed.to_string(),
        idem.executed.to_string(),
    );
    row(
        "duplicates",
        fault.duplicates.to_string(),
        idem.duplicates.to_string(),
    );
    row(
        "retried (transient errors)",
        fault.retried.to_string(),
        idem.retried.to_string(),
    );
    row("failed", fault.failed.to_string(), idem.failed.to_string());
    row(
        "ledger rows",
        fault.ledger_rows.to_string(),
        idem.ledger_rows.to_string(),
    );
    row(
        "double deductions",
        fault.double.to_string(),
        idem.double.to_string(),
    );
    row(
        "lost deductions",
        fault.lost.to_string(),
        idem.lost.to_string(),
    );
    row(
        "outbox still pending",
        fault.pending.to_string(),
        idem.pending.to_string(),
    );
    row(
        "elapsed",
        format!("{:.0} ms", fault.elapsed.as_secs_f64() * 1e3),
        format!("{:.0} ms", idem.elapsed.as_secs_f64() * 1e3),
    );
    println!();
    for (name, s) in [("fault version", fault), ("#[idempotent]", idem)] {
        if let Some(e) = &s.first_error {
            println!(
                "{name}: {} deliveries failed; the first error: {e}",
                s.failed
            );
        }
    }
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

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
    sqlx::any::install_default_drivers();
    let (url, where_) = match std::env::var("DATABASE_URL") {
        Ok(url) => (url.clone(), url),
        Err(_) => {
            let path = std::env::temp_dir().join("idem-coupon-example.db");
            let path = path.display().to_string();
            (format!("sqlite://{path}?mode=rwc"), path)
        }
    };
    let pool = AnyPoolOptions::new()
        .max_connections(opts.concurrency as u32 + 2)
        .acquire_timeout(Duration::from_secs(60))
        .after_connect(|conn, _| Box::pin(sqlite_settings(conn)))
        .connect(&url)
        .await
        .map_err(|e| format!("cannot open {where_}: {e}"))?;
    let db = pool.acquire().await?.backend_name().to_owned();
    // sqlx's MySQL driver serves MariaDB as well.
    let db_name = if db == "MySQL" { "MariaDB/MySQL" } else { &db };

    // idem's own tables (the outbox), then this example's, fresh each run.
    idem_runtime::migrate(&pool).await?;
    for stmt in SCHEMA {
        sqlx::query(*stmt).execute(&pool).await?;
    }
    let fault = Variant {
        title: "fault version",
        topic: "example.coupon-deduct.fault",
        first_coupon: 1,
    };
    let idem = Variant {
        title: "#[idempotent]",
        topic: "example.coupon-deduct.idem",
        first_coupon: 1 + opts.coupons,
    };
    sqlx::query(sql(&db, "DELETE FROM idem_outbox WHERE topic IN (?, ?)"))
        .bind(fault.topic)
        .bind(idem.topic)
        .execute(&pool)
        .await?;

    println!(
        "placing {} orders per handler on {db_name}; each order commits with its message",
        opts.coupons
    );
    place_orders(&pool, &db, &fault, opts.coupons).await?;
    place_orders(&pool, &db, &idem, opts.coupons).await?;

    println!("delivering through the {} …", fault.title);
    let mut fault_sum = relay(&pool, &db, fault.topic, &opts, deliver_fault).await?;
    println!("delivering through the {} handler …", idem.title);
    let mut idem_sum = relay(&pool, &db, idem.topic, &opts, deliver_idem).await?;
    count_damage(&pool, &db, &fault, opts.coupons, &mut fault_sum).await?;
    count_damage(&pool, &db, &idem, opts.coupons, &mut idem_sum).await?;

    print_summary(db_name, &where_, &opts, &fault_sum, &idem_sum);

    if opts.deliveries == 1 {
        println!("fault version: each message was delivered once, so there was nothing to race.");
    } else if fault_sum.double > 0 {
        println!(
            "fault version: {} of {} coupons were deducted more than once: concurrent \
             redeliveries all read UNUSED outside the transaction.",
            fault_sum.double, opts.coupons
        );
    } else {
        println!(
            "fault version: no double deduction in this run. The race is still there (the \
             state is read outside the transaction); this time no two deliveries of a \
             message read the state before the first one committed{}.",
            if db == "SQLite" {
                " (SQLite runs one writer at a time, which narrows the window)"
            } else {
                ""
            }
        );
    }
    let idem_ok = idem_sum.double == 0 && idem_sum.lost == 0 && idem_sum.pending == 0;
    if idem_ok {
        println!(
            "#[idempotent]: every coupon deducted exactly once, every message delivered; \
             {} redeliveries answered Duplicate.",
            idem_sum.duplicates
        );
        Ok(ExitCode::SUCCESS)
    } else {
        println!(
            "#[idempotent]: FAILED: {} double deductions, {} lost deductions, \
             {} messages pending.",
            idem_sum.double, idem_sum.lost, idem_sum.pending
        );
        Ok(ExitCode::FAILURE)
    }
}

/// SQLite only: write-ahead logging, so readers do not block the writer,
/// and a generous busy timeout, so concurrent writers wait their turn.
async fn sqlite_settings(conn: &mut AnyConnection) -> Result<(), sqlx::Error> {
    if conn.backend_name() == "SQLite" {
        sqlx::query("PRAGMA journal_mode = WAL")
            .execute(&mut *conn)
            .await?;
        sqlx::query("PRAGMA busy_timeout = 30000")
            .execute(&mut *conn)
            .await?;
    }
    Ok(())
}

fn parse_args() -> Result<Options, BoxError> {
    let mut opts = Options {
        coupons: 200,
        deliveries: 4,
        concurrency: 16,
    };
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut value = || -> Result<String, BoxError> {
            args.next()
                .ok_or_else(|| format!("{arg} needs a value").into())
        };
        match arg.as_str() {
            "--coupons" => opts.coupons = value()?.parse()?,
            "--deliveries" => opts.deliveries = value()?.parse()?,
            "--concurrency" => opts.concurrency = value()?.parse()?,
            "-h" | "--help" => {
                println!(
                    "usage: coupon [--coupons N] [--deliveries D] [--concurrency C]\n\
                     DATABASE_URL selects the database (default: SQLite in a temporary file)"
                );
                std::process::exit(0);
            }
            other => return Err(format!("unknown argument `{other}` (try --help)").into()),
        }
    }
    if opts.coupons < 1 || opts.deliveries < 1 || opts.concurrency < 1 {
        return Err("--coupons, --deliveries and --concurrency must be at least 1".into());
    }
    Ok(opts)
}
