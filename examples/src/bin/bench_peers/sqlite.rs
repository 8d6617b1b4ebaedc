//! The embedded default: the same coupon drain on a SQLite file, by
//! idem's relay and by the anchor, a hand-written loop of the same
//! statements.

use crate::args::Args;
use crate::ratio;
use idem_examples::bench::cpu::{Cpu, per_message_us};
use idem_examples::bench::outbox::{BoxError, Commits, CouponState, DeductCoupon, ORDER_OFFSET};
use idem_runtime::outbox::{Relay, enqueue};
use idem_runtime::{Dialect, idempotent};
use idem_testkit::cluster::Scratch;
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions};
use sqlx::{AssertSqlSafe, Connection, Row, Sqlite, SqlitePool, Transaction};
use std::time::{Duration, Instant};

/// The SQLite variants: idem's relay (`true`) and, beside each, the
/// anchor, a hand-written sqlx loop running the same statements.
const VARIANTS: &[(&str, bool, Commits)] = &[
    ("idem per-message", true, Commits::PerMessage),
    ("sqlx loop per-message", false, Commits::PerMessage),
    ("idem batched 16", true, Commits::Batched(16)),
    ("sqlx loop batched 16", false, Commits::Batched(16)),
    ("idem batched 64", true, Commits::Batched(64)),
    ("sqlx loop batched 64", false, Commits::Batched(64)),
];

/// Runs every SQLite variant, best of `--rounds` each (rounds
/// interleaved, so that a busy moment does not favour one side): its
/// name and msg/s.
pub(crate) async fn variants(opts: &Args) -> Result<Vec<(&'static str, f64)>, BoxError> {
    let n = opts.sqlite_messages;
    let mut best = vec![0.0_f64; VARIANTS.len()];
    for round in 1..=opts.rounds {
        for (i, &(name, idem, commits)) in VARIANTS.iter().enumerate() {
            let Drained { rate, cpu } = match idem {
                true => {
                    let (c, ahead) = (opts.sqlite_concurrency, opts.sqlite_claim_ahead);
                    sqlite_run(n, c, ahead, opts.sqlite_connections, commits).await?
                }
                false => sqlite_loop(n, commits).await?,
            };
            println!(
                "  round {round}: SQLite {name:<22}{rate:>8.0} msg/s, CPU {:>5.0} µs/msg",
                per_message_us(cpu, n)
            );
            best[i] = best[i].max(rate);
        }
    }
    Ok(VARIANTS.iter().map(|v| v.0).zip(best).collect())
}

/// Prints the SQLite table: msg/s, the ratio to idem per-message, and
/// each idem mode's ratio to the loop of the same mode, with its target.
pub(crate) fn report(rows: &[(&str, f64)], handlers: usize) {
    if rows.is_empty() {
        return;
    }
    println!(
        "{:<28}{:>8}{:>12}{:>12}",
        format!("SQLite ({handlers} handlers)"),
        "msg/s",
        "/ per-msg",
        "/ loop"
    );
    let per = rows.first().map(|r| r.1);
    let anchor = |name: &str| {
        let looped = format!("sqlx loop {}", name.trim_start_matches("idem "));
        rows.iter().find(|r| r.0 == looped).map(|r| r.1)
    };
    for (name, rate) in rows {
        let to_loop = match name.starts_with("idem ") {
            true => ratio(*rate, anchor(name)),
            false => String::new(),
        };
        println!(
            "{name:<28}{rate:>8.0}{:>12}{to_loop:>12}",
            ratio(*rate, per)
        );
    }
    for (name, rate) in rows.iter().filter(|r| r.0.starts_with("idem ")) {
        if let Some(a) = anchor(name) {
            println!("SQLite {name} / sqlx loop: {:.2} (target ≥ 0.8)", rate / a);
        }
    }
}

/// One drain: messages per second, and the CPU this process spent in it
/// (the handlers, the relay or loop, and SQLite itself, which runs in
/// process), the file's fill left out.
struct Drained {
    rate: f64,
    cpu: Duration,
}

/// The topic of the SQLite runs.
const TOPIC: &str = "bench-peers.sqlite";

/// The handler of `bench_outbox`'s idem side, on SQLite (`BEGIN
/// IMMEDIATE` instead of `FOR UPDATE`).
#[idempotent(
    key = "bench-peers:{msg.msg_id}",
    strategy = state_machine,
    table = "bench_peers_coupon", id = msg.coupon_id,
    from = CouponState::Unused, to = CouponState::Used,
)]
async fn deduct(tx: &mut Transaction<'_, Sqlite>, msg: &DeductCoupon) -> Result<(), sqlx::Error> {
    sqlx::query("INSERT INTO bench_peers_ledger (coupon_id, order_id, msg_id) VALUES (?, ?, ?)")
        .bind(msg.coupon_id)
        .bind(msg.order_id)
        .bind(msg.msg_id.as_str())
        .execute(&mut **tx)
        .await?;
    Ok(())
}

/// A fresh SQLite file (WAL, sqlx's defaults otherwise) in `dir`, with
/// idem's tables, the bench tables, and `n` coupons and their messages on
/// [`TOPIC`] (filled untimed, 1000 to a transaction); `connections` at most.
async fn fresh(dir: &Scratch, n: i64, connections: u32) -> Result<SqlitePool, BoxError> {
    let opts = SqliteConnectOptions::new()
        .filename(dir.join("bench.db"))
        .create_if_missing(true)
        .journal_mode(SqliteJournalMode::Wal)
        .busy_timeout(Duration::from_secs(30));
    let pool = SqlitePoolOptions::new()
        .max_connections(connections)
        .connect_with(opts)
        .await?;
    idem_runtime::migrate(&pool).await?;
    sqlx::raw_sql(
        "CREATE TABLE bench_peers_coupon (id BIGINT PRIMARY KEY, status VARCHAR(16) NOT NULL); \
         CREATE TABLE bench_peers_ledger (coupon_id BIGINT NOT NULL, order_id BIGINT NOT NULL, \
                                          msg_id VARCHAR(64) NOT NULL); \
         CREATE INDEX idx_bench_peers_ledger_coupon ON bench_peers_ledger (coupon_id)",
    )
    .execute(&pool)
    .await?;
    for chunk in (1..=n).collect::<Vec<_>>().chunks(1000) {
        let mut tx = pool.begin().await?;
        for &id in chunk {
            sqlx::query("INSERT INTO bench_peers_coupon (id, status) VALUES (?, 'UNUSED')")
                .bind(id)
                .execute(&mut *tx)
                .await?;
            let msg = DeductCoupon {
                msg_id: id.to_string(),
                coupon_id: id,
                order_id: ORDER_OFFSET + id,
            };
            let _ = enqueue(&mut tx, TOPIC, &msg.msg_id, &serde_json::to_value(&msg)?).await?;
        }
        tx.commit().await?;
    }
    Ok(pool)
}

/// Checks that every message succeeded and every coupon was deducted
/// once, then closes the pool.
async fn verify(pool: SqlitePool, n: i64, what: &str) -> Result<(), BoxError> {
    let (success, used, ledger): (i64, i64, i64) = sqlx::query_as(
        "SELECT (SELECT COUNT(*) FROM idem_outbox WHERE status = 'success'), \
                (SELECT COUNT(*) FROM bench_peers_coupon WHERE status = 'USED'), \
                (SELECT COUNT(*) FROM bench_peers_ledger)",
    )
    .fetch_one(&pool)
    .await?;
    pool.close().await;
    if success != n || used != n || ledger != n {
        return Err(format!(
            "SQLite {what}: VERIFY FAILED: {success} of {n} messages success, {used} coupons \
             USED, {ledger} ledger rows"
        )
        .into());
    }
    Ok(())
}

/// The most a batched relay claims at once, as the loop claims.
const BATCHED_CLAIM: usize = 64;

/// Drains `n` messages on a fresh SQLite file (a pool of `connections`)
/// through a relay of `c` handlers claiming `ahead` messages beyond its
/// free slots (per message;
/// a batched relay claims up to [`BATCHED_CLAIM`]); the database is checked
/// afterwards. Returns messages per second and CPU.
async fn sqlite_run(
    n: i64,
    c: usize,
    ahead: usize,
    connections: u32,
    commits: Commits,
) -> Result<Drained, BoxError> {
    let dir = Scratch::new("bench-peers-sqlite");
    let pool = fresh(&dir, n, connections).await?;
    let topic = TOPIC;

    let cpu = Cpu::now();
    let started = Instant::now();
    let builder = Relay::new(pool.clone())
        .route(topic, |d, m: DeductCoupon| async move {
            deduct(d.source(), &m).await
        })
        .concurrency(c)
        .claim_ahead(ahead)
        .batch_size((c + ahead) as u32)
        .poll_interval(Duration::from_millis(5));
    let builder = match commits {
        Commits::PerMessage => builder,
        // One batch at a time (SQLite's write lock serializes them
        // anyway), claims of up to 64, as the loop's: batched 16 claims
        // four batches at once, the three beyond its slots ahead.
        Commits::Batched(k) => {
            let k = k as usize;
            builder
                .commit_batch(k)
                .concurrency(c.max(k))
                .claim_ahead(BATCHED_CLAIM)
                .batch_size(BATCHED_CLAIM as u32)
        }
    };
    let relay = builder.spawn();
    let drain = idem_examples::bench::outbox::drained(&relay, n, started).await?;
    let cpu = Cpu::now().since(&cpu).own;
    relay.shutdown().await;

    verify(pool, n, "run").await?;
    Ok(Drained {
        rate: n as f64 / drain.as_secs_f64(),
        cpu,
    })
}

/// A fixed statement, its `'static` lifetime kept visible to the `Send`
/// check of the spawned loop.
fn lit(s: &'static str) -> sqlx::SqlStr {
    sqlx::SqlSafeStr::into_sql_str(s)
}

/// The SQLite anchor: idem's own statements, as its relay and handler run
/// them on SQLite, in a hand-written loop on one connection (SQLite has
/// one writer: more connections only wait for it). Each round claims up to
/// 64 messages (`BEGIN IMMEDIATE`, the relay's claim query and lease
/// update), then runs their handlers' transactions: per message, or
/// `Batched(k)` messages to a transaction. Checked afterwards as the relay
/// runs are. Returns messages per second and CPU.
async fn sqlite_loop(n: i64, commits: Commits) -> Result<Drained, BoxError> {
    let dir = Scratch::new("bench-peers-sqlite-loop");
    let pool = fresh(&dir, n, 1).await?;
    let per_tx = match commits {
        Commits::PerMessage => 1,
        Commits::Batched(k) => k as usize,
    };
    let cpu = Cpu::now();
    let started = Instant::now();
    // On the runtime's workers, where the relay's tasks run: `main`'s own
    // thread (which `block_on` polls) is woken without them.
    tokio::spawn(drain_loop(pool.clone(), per_tx)).await??;
    let rate = n as f64 / started.elapsed().as_secs_f64();
    let cpu = Cpu::now().since(&cpu).own;
    verify(pool, n, "loop").await?;
    Ok(Drained { rate, cpu })
}

/// The loop of [`sqlite_loop`] on one connection of `pool`, `per_tx`
/// messages to a handlers' transaction, until nothing is left to claim.
async fn drain_loop(pool: SqlitePool, per_tx: usize) -> Result<(), BoxError> {
    let limit = per_tx.max(BATCHED_CLAIM) as i64;
    let claim = Dialect::Sqlite.claim_sql(1, false).claim;
    let state = Dialect::Sqlite.state_sql("bench_peers_coupon", "id", "status", None);
    let mut conn = pool.acquire().await?;
    loop {
        let mut tx = conn.begin_with(lit("BEGIN IMMEDIATE")).await?;
        let rows = sqlx::query(AssertSqlSafe(claim.as_str()))
            .bind(TOPIC)
            .bind(limit)
            .bind(0_i64)
            .fetch_all(&mut *tx)
            .await?;
        if rows.is_empty() {
            tx.rollback().await?;
            break;
        }
        let claimed: Vec<(i64, String)> = rows.iter().map(|r| (r.get(0), r.get(3))).collect();
        let ids = vec!["?"; claimed.len()].join(", ");
        let mut lease = sqlx::query(AssertSqlSafe(format!(
            "UPDATE idem_outbox SET lease_owner = ?, \
             locked_until = strftime('%Y-%m-%d %H:%M:%f', 'now', '+' || ? || ' seconds'), \
             attempts = attempts + 1, updated_at = strftime('%Y-%m-%d %H:%M:%f', 'now') \
             WHERE id IN ({ids})"
        )))
        .bind("loop#1")
        .bind(30.0_f64);
        for (id, _) in &claimed {
            lease = lease.bind(*id);
        }
        lease.execute(&mut *tx).await?;
        tx.commit().await?;
        for chunk in claimed.chunks(per_tx) {
            let mut tx = conn.begin_with(lit("BEGIN IMMEDIATE")).await?;
            for (id, payload) in chunk {
                let m: DeductCoupon = serde_json::from_str(payload)?;
                sqlx::query(lit("UPDATE idem_outbox SET status = 'success', \
                     updated_at = strftime('%Y-%m-%d %H:%M:%f', 'now'), lease_owner = NULL, \
                     locked_until = NULL WHERE id = ? AND status = 'pending' AND lease_owner = ?"))
                .bind(*id)
                .bind("loop#1")
                .execute(&mut *tx)
                .await?;
                let (status, _): (String, Option<String>) =
                    sqlx::query_as(AssertSqlSafe(state.lock.as_str()))
                        .bind(m.coupon_id)
                        .fetch_one(&mut *tx)
                        .await?;
                if status != "UNUSED" {
                    return Err(format!("coupon {} is {status}", m.coupon_id).into());
                }
                sqlx::query(lit(
                    "INSERT INTO bench_peers_ledger (coupon_id, order_id, msg_id) VALUES (?, ?, ?)",
                ))
                .bind(m.coupon_id)
                .bind(m.order_id)
                .bind(m.msg_id.as_str())
                .execute(&mut *tx)
                .await?;
                sqlx::query(AssertSqlSafe(state.transition.as_str()))
                    .bind("USED")
                    .bind(m.coupon_id)
                    .bind("UNUSED")
                    .execute(&mut *tx)
                    .await?;
            }
            tx.commit().await?;
        }
    }
    Ok(())
}
