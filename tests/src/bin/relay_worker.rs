//! A relay process for the process-level tests
//! (`tests/clusters/processes.rs`): it drains one topic of the outbox into an `#[idempotent]` coupon handler
//! and logs every handler run (owner, start, end) so the tests can prove
//! that no message ever runs twice at the same time, across processes.
//!
//! Usage: relay_worker URL TOPIC OWNER LEASE_MS HANDLER_SLEEP_MS IDLE_EXIT_MS
//!
//! `RELAY_HOLD_FIRST_RUN=1` makes a message's first run (attempt 1) wait,
//! before its call, until the message is no longer pending: another
//! process must take it over (its lease runs out meanwhile) and settle it
//! while this run still goes on, so the two runs overlap by construction
//! rather than by the odds of a race. The wait gives up after 30 s.

// The tests' coupon and message (`tests/common/coupons.rs`), as the test
// processes write them.
#[path = "../../tests/common/coupons.rs"]
mod coupons;

use coupons::{CouponState, Deduct};
use idem_runtime::Dialect;
use idem_runtime::outbox::Relay;
use idem_runtime::{Backend, idempotent};
use idem_testkit::sql;
use sqlx::{Any, AnyPool, Transaction};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

static DIALECT: std::sync::OnceLock<Dialect> = std::sync::OnceLock::new();

fn d() -> Dialect {
    *DIALECT.get().expect("set at start")
}

#[idempotent(
    key = "coupon-deduct:{msg.coupon_id}:{msg.order_id}",
    strategy = state_machine,
    table = "idem_p_coupon",
    id = msg.coupon_id,
    from = CouponState::Unused,
    to = CouponState::Used,
)]
async fn deduct(tx: &mut Transaction<'_, Any>, msg: &Deduct) -> Result<(), sqlx::Error> {
    sqlx::query(sql(
        d(),
        "INSERT INTO idem_p_deduction (coupon_id, order_id) VALUES (?, ?)",
    ))
    .bind(msg.coupon_id)
    .bind(msg.order_id)
    .execute(&mut **tx)
    .await?;
    Ok(())
}

fn micros() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock")
        .as_micros() as i64
}

/// Waits until message `id` is no longer pending (another process settled
/// it), at most 30 s.
async fn wait_until_settled(pool: &AnyPool, id: i64) -> Result<(), idem_runtime::Error> {
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(30) {
        let status: String =
            sqlx::query_scalar(sql(d(), "SELECT status FROM idem_outbox WHERE id = ?"))
                .bind(id)
                .fetch_one(pool)
                .await?;
        if status != "pending" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    Ok(())
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let [_, url, topic, owner, lease_ms, sleep_ms, idle_exit_ms] = &args[..] else {
        eprintln!("usage: relay_worker URL TOPIC OWNER LEASE_MS HANDLER_SLEEP_MS IDLE_EXIT_MS");
        std::process::exit(2);
    };
    let num = |s: &str| s.parse::<u64>().expect("a number");
    let (lease, pause, idle_exit) = (num(lease_ms), num(sleep_ms), num(idle_exit_ms));
    // The protocol trace goes to IDEM_TRACE_FILE once the probe is in.
    idem_runtime::testing::install();
    sqlx::any::install_default_drivers();
    let pool = AnyPool::connect(url).await.expect("connect");
    DIALECT
        .set(<Any as Backend>::pool_dialect(&pool))
        .expect("once");
    let log_pool = pool.clone();
    let me = owner.clone();
    // `RELAY_COMMIT_BATCH=n` (n ≥ 2): batched commits (tests/outbox/batch.rs).
    // The execution log is then not written: the handler would write it on
    // its own connection while the batch holds SQLite's write lock.
    let commit_batch: usize = std::env::var("RELAY_COMMIT_BATCH")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(1);
    let hold_first_run = std::env::var("RELAY_HOLD_FIRST_RUN").is_ok_and(|v| v == "1");
    let relay = Relay::new(pool.clone())
        .route(topic.clone(), move |delivery, msg: Deduct| {
            let (log_pool, me) = (log_pool.clone(), me.clone());
            async move {
                let start = micros();
                // The handler's own time: makes overlapping runs visible.
                tokio::time::sleep(Duration::from_millis(pause)).await;
                if hold_first_run && delivery.message().attempts == 1 {
                    wait_until_settled(&log_pool, delivery.message().id).await?;
                }
                let outcome = deduct(delivery.source(), &msg).await;
                let end = micros();
                if commit_batch >= 2 {
                    return outcome;
                }
                sqlx::query(sql(d(), "INSERT INTO idem_p_exec_log (msg_id, owner, started_us, ended_us) VALUES (?, ?, ?, ?)"))
                    .bind(delivery.message().id)
                    .bind(&me)
                    .bind(start)
                    .bind(end)
                    .execute(&log_pool)
                    .await
                    .map_err(idem_runtime::Error::from)?;
                outcome
            }
        })
        .owner(owner.clone())
        .lease(Duration::from_millis(lease))
        .poll_interval(Duration::from_millis(20))
        .batch_size(if commit_batch >= 2 { 16 } else { 8 })
        .concurrency(if commit_batch >= 2 { 16 } else { 4 })
        .commit_batch(commit_batch)
        .spawn();
    // Exit once nothing of the topic has been pending for IDLE_EXIT_MS.
    let mut idle_since: Option<Instant> = None;
    loop {
        tokio::time::sleep(Duration::from_millis(50)).await;
        let pending: i64 = sqlx::query_scalar(sql(
            d(),
            "SELECT COUNT(*) FROM idem_outbox WHERE topic = ? AND status = 'pending'",
        ))
        .bind(topic)
        .fetch_one(&pool)
        .await
        .expect("count pending");
        if pending > 0 {
            idle_since = None;
        } else if idle_since.get_or_insert_with(Instant::now).elapsed()
            >= Duration::from_millis(idle_exit)
        {
            break;
        }
    }
    let executed = relay.stats().executed();
    relay.shutdown().await;
    println!("{owner}: executed {executed}");
}
