//! # The coupon double-deduction incident, replayed at peak
//!
//! *Async Idempotency in Practice* opens with a promotion during which some
//! users lost two coupons for one order. Each order committed together with
//! its "deduct the coupon" message in a local message table (an outbox); a
//! poller delivered the messages. At peak, a commit acknowledgement was
//! lost: the deduction had committed, the application saw a time-out, and
//! the message was delivered again. Retries are how the pipeline heals, so
//! duplicate deliveries are not a bug to remove but a fact to survive.
//!
//! This example replays that peak with idem's own outbox and relay. It
//! places `--orders` orders (default 500), each with an `UNUSED` coupon and
//! its deduction message enqueued **in the order's transaction**, then
//! drains the outbox with relays. Every duplicate comes from a real
//! mechanism:
//!
//! - **lost acknowledgements**: on PostgreSQL and MariaDB the relays'
//!   connections go through a fault proxy that forwards `COMMIT`, lets the
//!   server commit, then throws the reply away and closes the connection
//!   (`--lost-ack-rate` of all commits, default 0.2: the handlers' and the
//!   relays' claims alike); on SQLite, which has no network, idem's
//!   `testing` hook commits the handler's transaction and then reports the
//!   same error. A failed attempt goes back to the relay, which retries it
//!   with back-off — unless the message is already `success`: the relay's
//!   bookkeeping never overwrites a success, so an attempt whose commit in
//!   fact landed (with the message marked in the same transaction) is not
//!   retried. A claim whose acknowledgement is lost holds its messages until
//!   the lease (3 s) expires; then a relay claims them again;
//! - **concurrent redelivery**: `--relays` relays (default 3) drain each
//!   topic at once, and for `--redelivery-rate` of the orders (default 0.3)
//!   the producer published the message a second time under a new message
//!   id (a producer retry), right after the first: two messages, one
//!   coupon, delivered side by side.
//!
//! Two handlers consume the same workload, each on its own tables and
//! topic, through the same relay machinery and the same kind of lossy
//! connections, both at the same time:
//!
//! - **the article's fault version**, written by hand: the coupon's status
//!   is read *outside* the transaction; then `BEGIN`, the deduction (ledger
//!   row, coupon `USED`), the outbox message marked `success`, `COMMIT`. A
//!   failed commit is returned as an error, for the relay to retry. Two
//!   deliveries of one order running at once both read `UNUSED`, and both
//!   deduct: the row lock only serializes the double deduction;
//! - **`deduct_coupon`**, an `#[idempotent(strategy = state_machine)]`
//!   handler: the attribute reads the coupon's state under a row lock
//!   (SQLite: `BEGIN IMMEDIATE`), runs the body (one ledger row), flips the
//!   coupon `UNUSED` → `USED` and marks the message, all in one
//!   transaction. A delivery that finds the coupon `USED` answers
//!   `Outcome::Duplicate` without running the body.
//!
//! The fault version double-deducts a fair share of the producer-retried
//! orders; the `#[idempotent]` handler deducts every coupon exactly once.
//!
//! ## The output
//!
//! The two handlers side by side, counted in the database where possible:
//!
//! - *messages*: outbox rows (orders plus producer retries);
//! - *deliveries*: the attempts recorded in the outbox (each claim by a
//!   relay is one), and how many times the handler actually ran;
//! - *lost acks*: commit acknowledgements thrown away on the handler's
//!   connections, on its deduction `COMMIT` and on the relays' claims;
//! - *double deductions*: coupons with more than one ledger row;
//! - *lost deductions*: coupons with no ledger row although not all of
//!   their messages were dead-lettered (a message marked `success`, or
//!   still pending when the run stopped, with nothing deducted);
//! - *dead-lettered*: messages the relay gave up on (status `failed`);
//! - *throughput*: messages settled (success or dead-lettered) per second,
//!   from the relays' start until nothing of the topic is pending (both
//!   handlers share the machine and the database while they run).
//!
//! `--json` prints the same as one JSON object on stdout. A progress bar is
//! drawn on stderr when it is a terminal (not with `--json`).
//!
//! ```text
//! cargo run -p idem-examples --bin coupon              # SQLite, in a temporary file
//! DATABASE_URL=postgres://postgres@127.0.0.1:5432/test cargo run -p idem-examples --bin coupon
//! DATABASE_URL=mysql://root@127.0.0.1:3306/test cargo run -p idem-examples --bin coupon
//! ```
//!
//! One handler serves the three databases: it runs on `sqlx::Any`, and the
//! database is chosen at run time by the URL. Only the placeholders of the
//! hand-written SQL differ (see [`sql`]).
//!
//! The process exits with status 1 if the `#[idempotent]` handler deducts a
//! coupon twice or loses a deduction, and with status 2 on a setup error.

use idem_runtime::__private::Dialect;
use idem_runtime::outbox::{Delivery, Relay, RelayHandle};
use idem_runtime::{Backend, Error, Outcome, State, idempotent};
use idem_tests::proxy::FaultProxy;
use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};
use serde::{Deserialize, Serialize};
use sqlx::any::AnyPoolOptions;
use sqlx::{Any, AnyConnection, AnyPool, AssertSqlSafe, Transaction};
use std::collections::{HashMap, HashSet};
use std::io::IsTerminal;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// The lifecycle of a coupon, stored as `UNUSED` / `USED` in its `status`
/// column.
#[derive(Debug, Clone, Copy, PartialEq, Eq, State)]
enum CouponState {
    Unused,
    Used,
}

/// The message an order enqueues: "deduct this coupon for this order".
#[derive(Debug, Clone, Serialize, Deserialize)]
struct DeductCoupon {
    msg_id: String,
    order_id: i64,
    coupon_id: i64,
}

// ---- the #[idempotent] handler ---------------------------------------------

/// Deducts a coupon, once, however many times and however concurrently the
/// message (or a copy of it) is delivered.
///
/// The body only writes the ledger row. The attribute wraps it: `SELECT
/// status … FOR UPDATE` (SQLite: `BEGIN IMMEDIATE`), `Duplicate` if the
/// coupon is already `USED`, the body, then `UPDATE example_idem_coupon SET
/// status = 'USED' WHERE id = ? AND status = 'UNUSED'` (which must change
/// one row), the outbox message marked `success`, and the commit — one
/// transaction.
#[idempotent(
    key = "coupon-deduct:{msg.msg_id}",
    strategy = state_machine,
    table = "example_idem_coupon", id = msg.coupon_id, state_column = "status",
    from = CouponState::Unused, to = CouponState::Used,
)]
async fn deduct_coupon(
    tx: &mut Transaction<'_, Any>,
    msg: &DeductCoupon,
) -> Result<(), sqlx::Error> {
    let dialect = <Any as Backend>::conn_dialect(&**tx);
    sqlx::query(sql(
        dialect,
        "INSERT INTO example_idem_deduction (coupon_id, order_id, msg_id) VALUES (?, ?, ?)",
    ))
    .bind(msg.coupon_id)
    .bind(msg.order_id)
    .bind(msg.msg_id.as_str())
    .execute(&mut **tx)
    .await?;
    Ok(())
}

// ---- the article's fault version, by hand --------------------------------------

/// The article's "production fault version" as a relay handler: the state
/// check runs outside the transaction ("Query OUTSIDE transaction!
/// Concurrent retries read stale snapshot"), so two deliveries of one
/// order running at once both read `UNUSED` and both deduct.
async fn consume_coupon_msg_fault_version(
    d: &Delivery<Any>,
    msg: &DeductCoupon,
) -> Result<Outcome<()>, Error> {
    let pool = d.pool();
    let dialect = <Any as Backend>::pool_dialect(pool);

    // Query OUTSIDE the transaction.
    let status: String = sqlx::query_scalar(sql(
        dialect,
        "SELECT status FROM example_fault_coupon WHERE id = ?",
    ))
    .bind(msg.coupon_id)
    .fetch_one(pool)
    .await?;
    if status != CouponState::Unused.as_str() {
        // "Duplicate message, coupon already deducted": the relay marks
        // the message delivered.
        return Ok(Outcome::Duplicate(None));
    }

    // ERROR: the business operation is separated from the state check.
    let mut tx = pool.begin().await?;
    sqlx::query(sql(
        dialect,
        "INSERT INTO example_fault_deduction (coupon_id, order_id, msg_id) VALUES (?, ?, ?)",
    ))
    .bind(msg.coupon_id)
    .bind(msg.order_id)
    .bind(msg.msg_id.as_str())
    .execute(&mut *tx)
    .await?;
    sqlx::query(sql(
        dialect,
        "UPDATE example_fault_coupon SET status = ? WHERE id = ?",
    ))
    .bind(CouponState::Used.as_str())
    .bind(msg.coupon_id)
    .execute(&mut *tx)
    .await?;
    sqlx::query(sql(
        dialect,
        "UPDATE idem_outbox SET status = 'success' WHERE id = ?",
    ))
    .bind(d.message().id)
    .execute(&mut *tx)
    .await?;
    // On a server, the proxy loses this acknowledgement; on SQLite, the
    // `testing` hook does, exactly as for idempotent calls. Either way the
    // commit failed as far as this handler knows, and it says so: the
    // relay retries the message if it is still pending.
    idem_runtime::testing::commit(tx)
        .await
        .map_err(Error::CommitUnknown)?;
    Ok(Outcome::Executed(()))
}

// ---- SQL in two placeholder styles -------------------------------------------

/// The statement `text`, written with `?` placeholders (MariaDB, SQLite),
/// for `dialect`: PostgreSQL numbers its placeholders, `$1, $2, …`. No
/// statement here has a `?` inside a string literal, so renumbering every
/// `?` is safe. Only constant text goes in: the result is safe SQL.
fn sql(dialect: Dialect, text: &'static str) -> AssertSqlSafe<String> {
    AssertSqlSafe(placeholders(dialect, text))
}

/// [`sql`] for a statement on one handler's tables: `{t}` stands for the
/// table prefix (`example_fault` or `example_idem`).
fn table_sql(dialect: Dialect, h: Handler, text: &'static str) -> AssertSqlSafe<String> {
    AssertSqlSafe(placeholders(dialect, &text.replace("{t}", h.tables())))
}

fn placeholders(dialect: Dialect, text: &str) -> String {
    if dialect != Dialect::Postgres {
        return text.to_owned();
    }
    let mut out = String::with_capacity(text.len() + 8);
    let mut n = 0;
    for c in text.chars() {
        if c == '?' {
            n += 1;
            out.push('$');
            out.push_str(&n.to_string());
        } else {
            out.push(c);
        }
    }
    out
}

// ---- the two handlers under test ------------------------------------------------

/// One handler under test, with its own tables and outbox topic.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Handler {
    FaultVersion,
    Idempotent,
}

impl Handler {
    fn title(self) -> &'static str {
        match self {
            Handler::FaultVersion => "fault version",
            Handler::Idempotent => "#[idempotent]",
        }
    }

    fn topic(self) -> &'static str {
        match self {
            Handler::FaultVersion => "example.coupon-deduct.fault",
            Handler::Idempotent => "example.coupon-deduct.idem",
        }
    }

    /// The prefix of its tables: `<prefix>_coupon`, `_order`, `_deduction`.
    fn tables(self) -> &'static str {
        match self {
            Handler::FaultVersion => "example_fault",
            Handler::Idempotent => "example_idem",
        }
    }
}

/// Handler-side counts, taken in the route: how often the handler ran, and
/// how often its commit failed with the outcome unknown (a lost
/// acknowledgement).
#[derive(Default)]
struct Tally {
    runs: AtomicU64,
    commit_unknown: AtomicU64,
}

impl Tally {
    fn record<T>(&self, result: &Result<Outcome<T>, Error>) {
        self.runs.fetch_add(1, Ordering::Relaxed);
        if let Err(Error::CommitUnknown(_)) = result {
            self.commit_unknown.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// A relay for `h`, with settings for a short run: small batches, a lease
/// of a few seconds (a claim whose acknowledgement is lost holds its
/// messages that long), quick polling and back-off.
fn relay_for(h: Handler, pool: AnyPool, n: usize, opts: &Options, tally: Arc<Tally>) -> Relay<Any> {
    let relay = Relay::new(pool)
        .owner(format!("{}-relay-{n}", h.tables()))
        .batch_size(16)
        .concurrency(opts.concurrency)
        .lease(Duration::from_secs(3))
        .poll_interval(Duration::from_millis(20))
        .backoff(Duration::from_millis(20), Duration::from_millis(500))
        .max_attempts(10);
    match h {
        // `d.source()`: the handler marks the message in its transaction.
        Handler::Idempotent => relay.route(h.topic(), move |d, msg: DeductCoupon| {
            let tally = tally.clone();
            async move {
                let result = deduct_coupon(d.source(), &msg).await;
                tally.record(&result);
                result
            }
        }),
        Handler::FaultVersion => relay.route(h.topic(), move |d, msg: DeductCoupon| {
            let tally = tally.clone();
            async move {
                let result = consume_coupon_msg_fault_version(&d, &msg).await;
                tally.record(&result);
                result
            }
        }),
    }
}

// ---- the workload -------------------------------------------------------------

const SCHEMA: &[&str] = &[
    "DROP TABLE IF EXISTS {t}_deduction",
    "DROP TABLE IF EXISTS {t}_order",
    "DROP TABLE IF EXISTS {t}_coupon",
    "CREATE TABLE {t}_coupon (id BIGINT PRIMARY KEY, status VARCHAR(16) NOT NULL)",
    "CREATE TABLE {t}_order (id BIGINT PRIMARY KEY, coupon_id BIGINT NOT NULL)",
    // No key: a double deduction must be able to show up as a second row.
    "CREATE TABLE {t}_deduction (
        coupon_id BIGINT NOT NULL,
        order_id BIGINT NOT NULL,
        msg_id VARCHAR(64) NOT NULL
    )",
    "CREATE INDEX {t}_deduction_coupon ON {t}_deduction (coupon_id)",
];

/// Order-placing tasks per handler.
const PRODUCERS: i64 = 4;

/// Whether the producer of `order` published its message a second time.
/// A golden-ratio sequence: the same orders for both handlers, spread
/// evenly, `rate` of them.
fn producer_retried(order: i64, rate: f64) -> bool {
    (order as f64 * 0.618_033_988_749_895).fract() < rate
}

/// Fresh tables for `h` and its coupons, then the orders, placed by
/// [`PRODUCERS`] tasks at once. Returns the number of messages.
async fn place_orders(
    pool: &AnyPool,
    dialect: Dialect,
    h: Handler,
    opts: &Options,
) -> Result<i64, BoxError> {
    for stmt in SCHEMA {
        sqlx::query(table_sql(dialect, h, stmt))
            .execute(pool)
            .await?;
    }
    sqlx::query(sql(dialect, "DELETE FROM idem_outbox WHERE topic = ?"))
        .bind(h.topic())
        .execute(pool)
        .await?;

    let mut tx = pool.begin().await?;
    for coupon_id in 1..=opts.orders {
        sqlx::query(table_sql(
            dialect,
            h,
            "INSERT INTO {t}_coupon (id, status) VALUES (?, ?)",
        ))
        .bind(coupon_id)
        .bind(CouponState::Unused.as_str())
        .execute(&mut *tx)
        .await?;
    }
    tx.commit().await?;

    let mut producers = tokio::task::JoinSet::new();
    for first in 1..=PRODUCERS.min(opts.orders) {
        let (pool, orders, rate) = (pool.clone(), opts.orders, opts.redelivery_rate);
        producers.spawn(async move {
            let mut messages = 0;
            for order_id in (first..=orders).step_by(PRODUCERS as usize) {
                messages += place_order(&pool, dialect, h, order_id, rate).await?;
            }
            Ok::<i64, BoxError>(messages)
        });
    }
    let mut messages = 0;
    while let Some(placed) = producers.join_next().await {
        messages += placed??;
    }
    Ok(messages)
}

/// One order: the order row and its deduction message commit in one
/// transaction. A producer retry enqueues the message again, under
/// another id. Returns the number of messages enqueued.
async fn place_order(
    pool: &AnyPool,
    dialect: Dialect,
    h: Handler,
    order_id: i64,
    redelivery_rate: f64,
) -> Result<i64, BoxError> {
    let msg = DeductCoupon {
        msg_id: format!("order-{order_id}"),
        order_id,
        coupon_id: order_id,
    };
    let mut tx = pool.begin().await?;
    sqlx::query(table_sql(
        dialect,
        h,
        "INSERT INTO {t}_order (id, coupon_id) VALUES (?, ?)",
    ))
    .bind(msg.order_id)
    .bind(msg.coupon_id)
    .execute(&mut *tx)
    .await?;
    let payload = serde_json::to_value(&msg)?;
    idem_runtime::outbox::enqueue(&mut tx, h.topic(), &msg.msg_id, &payload).await?;
    tx.commit().await?;
    if !producer_retried(order_id, redelivery_rate) {
        return Ok(1);
    }

    // The producer did not trust its first publication and sent the
    // message again, under a new id.
    let again = DeductCoupon {
        msg_id: format!("order-{order_id}-retry"),
        ..msg
    };
    let mut tx = pool.begin().await?;
    let payload = serde_json::to_value(&again)?;
    idem_runtime::outbox::enqueue(&mut tx, h.topic(), &again.msg_id, &payload).await?;
    tx.commit().await?;
    Ok(2)
}

// ---- one handler's relays -----------------------------------------------------

/// What one handler's run produced, as printed and as JSON.
#[derive(Debug, Default, Serialize)]
struct Report {
    handler: &'static str,
    orders: i64,
    /// Outbox rows: orders plus producer retries.
    messages: i64,
    /// Attempts recorded in the outbox (each claim is one).
    deliveries: i64,
    /// Times the handler ran.
    handler_runs: u64,
    /// Attempts answered `Executed` / `Duplicate` (the relays' counters).
    executed: u64,
    duplicates: u64,
    /// Failed attempts put back for a retry.
    retried: u64,
    /// Failed attempts whose message was already `success` (the commit had
    /// landed): the relay leaves it alone.
    failed_after_commit: u64,
    /// Acknowledgements lost on this handler's connections.
    lost_acks: u64,
    /// … of which on the handler's own commit.
    lost_acks_on_handler_commit: u64,
    ledger_rows: i64,
    double_deductions: i64,
    lost_deductions: i64,
    dead_lettered: i64,
    /// Messages still pending when the run stopped (0 unless timed out).
    pending: i64,
    elapsed_s: f64,
    messages_per_s: f64,
}

/// One handler being drained: its relays, their lossy connections, and
/// its progress.
struct Drain {
    h: Handler,
    messages: i64,
    /// On a server, this handler's own proxy; on SQLite, `None` (the
    /// process-wide `testing` hook).
    proxy: Option<FaultProxy>,
    tally: Arc<Tally>,
    /// The relays (kept for their counters) and their running tasks.
    relays: Vec<(Relay<Any>, RelayHandle)>,
    pools: Vec<AnyPool>,
    bar: ProgressBar,
    started: Instant,
    /// Set when nothing of the topic is pending any more.
    elapsed: Option<Duration>,
}

impl Drain {
    /// Starts `opts.relays` relays on `h`'s topic, as several instances of
    /// the consumer would run, each with its own pool. On a server their
    /// connections go through a fault proxy.
    async fn start(
        url: &str,
        dialect: Dialect,
        h: Handler,
        messages: i64,
        opts: &Options,
        bars: &MultiProgress,
    ) -> Result<Drain, BoxError> {
        let proxy = match dialect {
            Dialect::Sqlite => None,
            _ => Some(FaultProxy::for_url(url, opts.lost_ack_rate).await?),
        };
        let relay_url = proxy
            .as_ref()
            .map_or_else(|| url.to_owned(), |p| p.url(url));
        let tally = Arc::new(Tally::default());
        let bar = bars.add(progress_bar(h, messages));
        let started = Instant::now();
        let mut relays = Vec::new();
        let mut pools = Vec::new();
        for n in 1..=opts.relays {
            let pool = connect(&relay_url, opts.concurrency as u32 + 2).await?;
            let relay = relay_for(h, pool.clone(), n, opts, tally.clone());
            relays.push((relay.clone(), relay.spawn()));
            pools.push(pool);
        }
        Ok(Drain {
            h,
            messages,
            proxy,
            tally,
            relays,
            pools,
            bar,
            started,
            elapsed: None,
        })
    }

    /// Acknowledgements lost so far on this handler's connections (on
    /// SQLite the hook only touches the handler's own commits).
    fn lost_acks(&self) -> u64 {
        match &self.proxy {
            Some(proxy) => proxy.acks_dropped(),
            None => self.tally.commit_unknown.load(Ordering::Relaxed),
        }
    }

    /// Updates the progress; true once every message is settled
    /// (delivered, or dead-lettered).
    async fn poll(&mut self, direct: &AnyPool, dialect: Dialect) -> Result<bool, sqlx::Error> {
        if self.elapsed.is_some() {
            return Ok(true);
        }
        let settled: i64 = sqlx::query_scalar(sql(
            dialect,
            "SELECT COUNT(*) FROM idem_outbox WHERE topic = ? AND status <> 'pending'",
        ))
        .bind(self.h.topic())
        .fetch_one(direct)
        .await?;
        self.bar.set_position(settled as u64);
        self.bar
            .set_message(format!("{} lost acks", self.lost_acks()));
        if settled < self.messages {
            return Ok(false);
        }
        self.elapsed = Some(self.started.elapsed());
        // Idle relays still claim, and commit, every poll: stop losing
        // acknowledgements that would only inflate the count.
        if let Some(proxy) = &self.proxy {
            proxy.set_drop_fraction(0.0);
        }
        self.bar.finish();
        Ok(true)
    }

    /// Stops the relays, all at once (each finishes the messages it has in
    /// hand), and counts the result.
    async fn finish(
        self,
        direct: &AnyPool,
        dialect: Dialect,
        orders: i64,
    ) -> Result<Report, BoxError> {
        let elapsed = self.elapsed.unwrap_or_else(|| self.started.elapsed());
        let mut stopping = tokio::task::JoinSet::new();
        let mut relays = Vec::new();
        for (relay, running) in self.relays {
            stopping.spawn(running.shutdown());
            relays.push(relay);
        }
        while stopping.join_next().await.is_some() {}
        for pool in self.pools {
            pool.close().await;
        }
        self.bar.finish();

        let mut r = Report {
            handler: self.h.title(),
            orders,
            handler_runs: self.tally.runs.load(Ordering::Relaxed),
            lost_acks_on_handler_commit: self.tally.commit_unknown.load(Ordering::Relaxed),
            elapsed_s: elapsed.as_secs_f64(),
            ..Report::default()
        };
        r.lost_acks = match &self.proxy {
            Some(proxy) => proxy.acks_dropped(),
            None => r.lost_acks_on_handler_commit,
        };
        for relay in &relays {
            let s = relay.stats();
            r.executed += s.executed.load(Ordering::Relaxed);
            r.duplicates += s.duplicates.load(Ordering::Relaxed);
            r.retried += s.retried.load(Ordering::Relaxed);
            r.failed_after_commit += s.stale.load(Ordering::Relaxed);
        }
        count_damage(direct, dialect, self.h, &mut r).await?;
        r.messages_per_s = (r.messages - r.pending) as f64 / r.elapsed_s;
        Ok(r)
    }
}

/// Counts, in the database, what the deliveries left behind.
async fn count_damage(
    pool: &AnyPool,
    dialect: Dialect,
    h: Handler,
    r: &mut Report,
) -> Result<(), BoxError> {
    // The messages: status, attempts, and the coupon each one is about.
    let rows: Vec<(String, String, i32)> = sqlx::query_as(sql(
        dialect,
        "SELECT payload, status, attempts FROM idem_outbox WHERE topic = ?",
    ))
    .bind(h.topic())
    .fetch_all(pool)
    .await?;
    // coupon -> whether every message about it was dead-lettered
    let mut all_dead: HashMap<i64, bool> = HashMap::new();
    for (payload, status, attempts) in &rows {
        let msg: DeductCoupon = serde_json::from_str(payload)?;
        r.messages += 1;
        r.deliveries += i64::from(*attempts);
        match status.as_str() {
            "failed" => r.dead_lettered += 1,
            "pending" => r.pending += 1,
            _ => {}
        }
        *all_dead.entry(msg.coupon_id).or_insert(true) &= status == "failed";
    }

    r.ledger_rows = sqlx::query_scalar(table_sql(dialect, h, "SELECT COUNT(*) FROM {t}_deduction"))
        .fetch_one(pool)
        .await?;
    r.double_deductions = sqlx::query_scalar(table_sql(
        dialect,
        h,
        "SELECT COUNT(*) FROM (SELECT coupon_id FROM {t}_deduction \
         GROUP BY coupon_id HAVING COUNT(*) > 1) AS twice",
    ))
    .fetch_one(pool)
    .await?;

    // Lost: a coupon with no ledger row although not all of its messages
    // were dead-lettered.
    let deducted: HashSet<i64> = sqlx::query_scalar(table_sql(
        dialect,
        h,
        "SELECT DISTINCT coupon_id FROM {t}_deduction",
    ))
    .fetch_all(pool)
    .await?
    .into_iter()
    .collect();
    let coupons: Vec<i64> = sqlx::query_scalar(table_sql(dialect, h, "SELECT id FROM {t}_coupon"))
        .fetch_all(pool)
        .await?;
    r.lost_deductions = coupons
        .iter()
        .filter(|c| !deducted.contains(c) && !all_dead.get(c).copied().unwrap_or(false))
        .count() as i64;
    Ok(())
}

fn progress_bar(h: Handler, messages: i64) -> ProgressBar {
    let bar = ProgressBar::new(messages as u64);
    bar.set_style(
        ProgressStyle::with_template(
            "{prefix:>14} [{bar:32}] {pos:>5}/{len} messages settled, {msg} ({elapsed})",
        )
        .expect("valid template")
        .progress_chars("=> "),
    );
    bar.set_prefix(h.title());
    bar.set_message("0 lost acks");
    bar
}

// ---- output -------------------------------------------------------------------------

/// The whole run, as printed and as the `--json` object.
#[derive(Serialize)]
struct Summary {
    database: String,
    orders: i64,
    relays: usize,
    handlers_per_relay: usize,
    lost_ack_rate: f64,
    redelivery_rate: f64,
    fault_version: Report,
    idempotent: Report,
    /// The `#[idempotent]` handler neither double-deducted nor lost.
    ok: bool,
}

fn print_summary(s: &Summary, location: &str) {
    let (f, i) = (&s.fault_version, &s.idempotent);
    println!();
    println!("coupon deduction at peak on {} ({location})", s.database);
    println!(
        "{} orders and {} producer retries, {} relays x {} handlers, {:.0}% of COMMIT \
         acknowledgements lost",
        s.orders,
        f.messages - s.orders,
        s.relays,
        s.handlers_per_relay,
        s.lost_ack_rate * 100.0
    );
    println!();
    let row = |label: &str, a: String, b: String| println!("{label:<40}{a:>16}{b:>16}");
    row("", "fault version".into(), "#[idempotent]".into());
    let num = |label: &str, a: i64, b: i64| row(label, a.to_string(), b.to_string());
    let cnt = |label: &str, a: u64, b: u64| row(label, a.to_string(), b.to_string());
    num(
        "messages (orders + producer retries)",
        f.messages,
        i.messages,
    );
    num(
        "deliveries (attempts in the outbox)",
        f.deliveries,
        i.deliveries,
    );
    cnt("  handler runs", f.handler_runs, i.handler_runs);
    cnt("  executed", f.executed, i.executed);
    cnt("  duplicate (already deducted)", f.duplicates, i.duplicates);
    cnt("  failed, retried by the relay", f.retried, i.retried);
    cnt(
        "  failed after the commit landed",
        f.failed_after_commit,
        i.failed_after_commit,
    );
    cnt("lost acks (injected faults)", f.lost_acks, i.lost_acks);
    cnt(
        "  on the handler's COMMIT",
        f.lost_acks_on_handler_commit,
        i.lost_acks_on_handler_commit,
    );
    cnt(
        "  on the relays' claims",
        f.lost_acks.saturating_sub(f.lost_acks_on_handler_commit),
        i.lost_acks.saturating_sub(i.lost_acks_on_handler_commit),
    );
    num("ledger rows", f.ledger_rows, i.ledger_rows);
    num(
        "double deductions",
        f.double_deductions,
        i.double_deductions,
    );
    num("lost deductions", f.lost_deductions, i.lost_deductions);
    num("dead-lettered", f.dead_lettered, i.dead_lettered);
    if f.pending + i.pending > 0 {
        num("still pending (timed out)", f.pending, i.pending);
    }
    row(
        "throughput (messages/s)",
        format!("{:.0}", f.messages_per_s),
        format!("{:.0}", i.messages_per_s),
    );
    row(
        "elapsed",
        format!("{:.1} s", f.elapsed_s),
        format!("{:.1} s", i.elapsed_s),
    );
    println!();

    if f.double_deductions > 0 {
        println!(
            "fault version: {} of {} coupons deducted more than once. Two deliveries of one \
             order ran at the same time; both read UNUSED outside the transaction, and the \
             row lock only serialized the two deductions.",
            f.double_deductions, f.orders
        );
    } else {
        println!(
            "fault version: no double deduction this time. The race is still there (the \
             state is read outside the transaction); no two deliveries of an order overlapped."
        );
    }
    if f.lost_acks_on_handler_commit > 0 {
        println!(
            "               {} deductions committed and lost their acknowledgement. The \
             message was marked success in the same transaction, so the relay's bookkeeping \
             found it delivered and did not retry it.",
            f.lost_acks_on_handler_commit
        );
    }
    if s.ok {
        println!(
            "#[idempotent]: every coupon deducted exactly once under {} lost acknowledgements; \
             {} deliveries found the coupon already USED and answered Duplicate.",
            i.lost_acks, i.duplicates
        );
    } else {
        println!(
            "#[idempotent]: FAILED: {} double deductions, {} lost deductions.",
            i.double_deductions, i.lost_deductions
        );
    }
    if f.pending + i.pending > 0 {
        println!(
            "The run stopped after --timeout with messages still pending: their coupons count \
             as lost deductions."
        );
    }
}

// ---- main ---------------------------------------------------------------------------

type BoxError = Box<dyn std::error::Error + Send + Sync>;

struct Options {
    orders: i64,
    relays: usize,
    concurrency: usize,
    lost_ack_rate: f64,
    redelivery_rate: f64,
    timeout: Duration,
    json: bool,
}

#[tokio::main]
async fn main() -> ExitCode {
    match run().await {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(2)
        }
    }
}

async fn run() -> Result<bool, BoxError> {
    let opts = parse_args()?;
    sqlx::any::install_default_drivers();
    let (url, location) = match std::env::var("DATABASE_URL") {
        Ok(url) => (url.clone(), url),
        Err(_) => {
            // A fresh file each run.
            let path = std::env::temp_dir().join("idem-coupon-example.db");
            for suffix in ["", "-wal", "-shm"] {
                let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
            }
            let path = path.display().to_string();
            (format!("sqlite://{path}?mode=rwc"), path)
        }
    };
    let direct = connect(&url, 2 * PRODUCERS as u32 + 2)
        .await
        .map_err(|e| format!("cannot open {location}: {e}"))?;
    let dialect = <Any as Backend>::pool_dialect(&direct);
    let database = match dialect {
        Dialect::Postgres => "PostgreSQL",
        Dialect::MySql => "MariaDB/MySQL",
        _ => "SQLite",
    };
    idem_runtime::migrate(&direct).await?;

    // The same workload for both handlers, on their own tables and topics.
    if !opts.json {
        println!(
            "{database}: placing {} orders per handler, each committed with its deduction message",
            opts.orders
        );
    }
    let placing = Instant::now();
    let (fault_messages, idem_messages) = tokio::try_join!(
        place_orders(&direct, dialect, Handler::FaultVersion, &opts),
        place_orders(&direct, dialect, Handler::Idempotent, &opts),
    )?;
    if !opts.json {
        println!(
            "placed in {:.1} s; draining both handlers at once, {} relays each",
            placing.elapsed().as_secs_f64(),
            opts.relays
        );
    }

    // The peak: both handlers drained at once, under the same faults.
    let bars = MultiProgress::with_draw_target(if opts.json || !std::io::stderr().is_terminal() {
        ProgressDrawTarget::hidden()
    } else {
        ProgressDrawTarget::stderr()
    });
    if dialect == Dialect::Sqlite {
        idem_runtime::testing::set_lost_ack_rate(opts.lost_ack_rate);
    }
    let started = Instant::now();
    let mut fault = Drain::start(
        &url,
        dialect,
        Handler::FaultVersion,
        fault_messages,
        &opts,
        &bars,
    )
    .await?;
    let mut idem = Drain::start(
        &url,
        dialect,
        Handler::Idempotent,
        idem_messages,
        &opts,
        &bars,
    )
    .await?;
    loop {
        let fault_done = fault.poll(&direct, dialect).await?;
        let idem_done = idem.poll(&direct, dialect).await?;
        if (fault_done && idem_done) || started.elapsed() >= opts.timeout {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    idem_runtime::testing::set_lost_ack_rate(0.0);
    let (fault_version, idempotent) = tokio::try_join!(
        fault.finish(&direct, dialect, opts.orders),
        idem.finish(&direct, dialect, opts.orders),
    )?;

    let ok = idempotent.double_deductions == 0 && idempotent.lost_deductions == 0;
    let summary = Summary {
        database: database.to_owned(),
        orders: opts.orders,
        relays: opts.relays,
        handlers_per_relay: opts.concurrency,
        lost_ack_rate: opts.lost_ack_rate,
        redelivery_rate: opts.redelivery_rate,
        fault_version,
        idempotent,
        ok,
    };
    if opts.json {
        println!("{}", serde_json::to_string(&summary)?);
    } else {
        print_summary(&summary, &location);
    }
    Ok(ok)
}

/// A pool on `url` (SQLite: write-ahead logging, so readers do not block
/// the writer, and a generous busy timeout, so writers wait their turn).
async fn connect(url: &str, max: u32) -> Result<AnyPool, sqlx::Error> {
    AnyPoolOptions::new()
        .max_connections(max)
        .acquire_timeout(Duration::from_secs(30))
        .after_connect(|conn, _| Box::pin(sqlite_settings(conn)))
        .connect(url)
        .await
}

async fn sqlite_settings(conn: &mut AnyConnection) -> Result<(), sqlx::Error> {
    if conn.backend_name() == "SQLite" {
        for pragma in [
            "PRAGMA journal_mode = WAL",
            "PRAGMA synchronous = NORMAL",
            "PRAGMA busy_timeout = 30000",
        ] {
            sqlx::query(pragma).execute(&mut *conn).await?;
        }
    }
    Ok(())
}

const USAGE: &str = "usage: coupon [--orders N] [--relays R] [--concurrency C] \
[--lost-ack-rate F] [--redelivery-rate F] [--timeout SECS] [--json]

  --orders N            orders, each with a coupon and a message (default 500)
  --relays R            relays draining each topic at once (default 3)
  --concurrency C       handlers running at once per relay (default 8)
  --lost-ack-rate F     fraction of COMMIT acknowledgements lost (default 0.2)
  --redelivery-rate F   fraction of orders whose message the producer
                        publishes twice (default 0.3)
  --timeout SECS        stop draining after this long (default 120)
  --json                print the summary as one JSON object

DATABASE_URL selects the database (postgres://, mysql://); default: SQLite
in a temporary file.";

fn parse_args() -> Result<Options, BoxError> {
    let mut opts = Options {
        orders: 500,
        relays: 3,
        concurrency: 8,
        lost_ack_rate: 0.2,
        redelivery_rate: 0.3,
        timeout: Duration::from_secs(120),
        json: false,
    };
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut value = || -> Result<String, BoxError> {
            args.next()
                .ok_or_else(|| format!("{arg} needs a value").into())
        };
        match arg.as_str() {
            "--orders" => opts.orders = value()?.parse()?,
            "--relays" => opts.relays = value()?.parse()?,
            "--concurrency" => opts.concurrency = value()?.parse()?,
            "--lost-ack-rate" => opts.lost_ack_rate = value()?.parse()?,
            "--redelivery-rate" => opts.redelivery_rate = value()?.parse()?,
            "--timeout" => opts.timeout = Duration::from_secs_f64(value()?.parse()?),
            "--json" => opts.json = true,
            "-h" | "--help" => {
                println!("{USAGE}");
                std::process::exit(0);
            }
            other => return Err(format!("unknown argument `{other}` (try --help)").into()),
        }
    }
    if opts.orders < 1 || opts.relays < 1 || opts.concurrency < 1 {
        return Err("--orders, --relays and --concurrency must be at least 1".into());
    }
    for (name, rate) in [
        ("--lost-ack-rate", opts.lost_ack_rate),
        ("--redelivery-rate", opts.redelivery_rate),
    ] {
        if !(0.0..=1.0).contains(&rate) {
            return Err(format!("{name} must be between 0 and 1").into());
        }
    }
    Ok(opts)
}
