//! The embedded default: the same coupon drain on a SQLite file.

use idem_examples::bench::outbox::{BoxError, Commits, CouponState, DeductCoupon, ORDER_OFFSET};
use idem_runtime::idempotent;
use idem_runtime::outbox::{Relay, enqueue};
use idem_testkit::cluster::Scratch;
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions};
use sqlx::{Sqlite, Transaction};
use std::time::{Duration, Instant};

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

/// Drains `n` messages on a fresh SQLite file (WAL, sqlx's defaults
/// otherwise) through a relay of `c` handlers; the database is checked
/// afterwards. Returns messages per second.
pub(crate) async fn sqlite_run(n: i64, c: usize, commits: Commits) -> Result<f64, BoxError> {
    let dir = Scratch::new("bench-peers-sqlite");
    let opts = SqliteConnectOptions::new()
        .filename(dir.join("bench.db"))
        .create_if_missing(true)
        .journal_mode(SqliteJournalMode::Wal)
        .busy_timeout(Duration::from_secs(30));
    let pool = SqlitePoolOptions::new()
        .max_connections(c as u32 + 1)
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
    // Fill (untimed): coupons and their messages, 1000 to a transaction.
    let topic = "bench-peers.sqlite";
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
            let _ = enqueue(&mut tx, topic, &msg.msg_id, &serde_json::to_value(&msg)?).await?;
        }
        tx.commit().await?;
    }

    let started = Instant::now();
    let builder = Relay::new(pool.clone())
        .route(topic, |d, m: DeductCoupon| async move {
            deduct(d.source(), &m).await
        })
        .concurrency(c)
        .batch_size(c as u32)
        .poll_interval(Duration::from_millis(5));
    let builder = match commits {
        Commits::PerMessage => builder,
        // One batch at a time: SQLite's write lock serializes them anyway.
        Commits::Batched(k) => {
            let k = k as usize;
            builder
                .commit_batch(k)
                .concurrency(c.max(k))
                .batch_size(c.max(k) as u32)
        }
    };
    let relay = builder.spawn();
    let drain = idem_examples::bench::outbox::drained(&relay, n, started).await?;
    relay.shutdown().await;

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
            "SQLite run: VERIFY FAILED: {success} of {n} messages success, {used} coupons USED, \
             {ledger} ledger rows"
        )
        .into());
    }
    Ok(n as f64 / drain.as_secs_f64())
}
