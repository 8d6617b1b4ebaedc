//! The cost as the queue grows: the relay's claim statement and the drain
//! rate with a large backlog against a small one.
//!
//! Each queue lives in its own schema (`bench_peers_scale_small`,
//! `bench_peers_scale_large`, selected by `search_path`, as `bench_archive`
//! does), filled with `generate_series`: coupons `UNUSED` and their
//! messages pending in idem's own `idem_outbox`, due in id order. Then, in
//! alternating rounds, the relay's claim statement (`Dialect::claim_sql`,
//! bound as the relay binds it, in a transaction rolled back so the queue
//! stays as it was) is timed on each; then a relay drains `--scale-drain`
//! messages off each queue through the `#[idempotent]` handler.

use idem_examples::bench::outbox::{
    BoxError, COUPON, Commits, LEASE_SECS, LEDGER, ORDER_OFFSET, Rows, Setup, drain,
};
use idem_runtime::Dialect;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{Connection, PgPool};
use std::time::{Duration, Instant};

/// One queue's figures.
#[derive(Debug, Clone)]
pub(crate) struct Scaled {
    pub(crate) pending: i64,
    pub(crate) fill: Duration,
    pub(crate) claim_p50_ms: f64,
    pub(crate) claim_p90_ms: f64,
    pub(crate) drain_rate: f64,
}

const TOPIC: &str = "bench-peers.scale";

async fn fill(
    url: &str,
    schema: &str,
    rows: i64,
) -> Result<(PgPool, PgConnectOptions, Duration), BoxError> {
    let admin = PgPool::connect(url).await?;
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "DROP SCHEMA IF EXISTS {schema} CASCADE; CREATE SCHEMA {schema}"
    )))
    .execute(&admin)
    .await?;
    admin.close().await;
    let connect = url
        .parse::<PgConnectOptions>()?
        .options([("search_path", schema)]);
    let pool = PgPoolOptions::new()
        .max_connections(2)
        .connect_with(connect.clone())
        .await?;
    idem_runtime::migrate(&pool).await?;
    let started = Instant::now();
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "CREATE TABLE {COUPON} (id BIGINT PRIMARY KEY, status VARCHAR(16) NOT NULL); \
         CREATE TABLE {LEDGER} (coupon_id BIGINT NOT NULL, order_id BIGINT NOT NULL, \
                                msg_id VARCHAR(64) NOT NULL); \
         CREATE INDEX idx_{LEDGER}_coupon ON {LEDGER} (coupon_id)"
    )))
    .execute(&pool)
    .await?;
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "INSERT INTO {COUPON} (id, status) SELECT g, 'UNUSED' FROM generate_series(1, $1::bigint) g"
    )))
    .bind(rows)
    .execute(&pool)
    .await?;
    // Distinct due times in id order, as enqueue's `now()` gives them.
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "INSERT INTO idem_outbox (id, topic, msg_id, payload, next_attempt_at, created_at) \
         SELECT g, $2, g::text, \
           format('{{\"msg_id\":\"%s\",\"coupon_id\":%s,\"order_id\":%s}}', g, g, g + {ORDER_OFFSET}), \
           now() - interval '1 hour' + g * interval '1 microsecond', now() \
         FROM generate_series(1, $1::bigint) g"
    )))
    .bind(rows)
    .bind(TOPIC)
    .execute(&pool)
    .await?;
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "VACUUM ANALYZE {COUPON}, {LEDGER}, idem_outbox"
    )))
    .execute(&pool)
    .await?;
    Ok((pool, connect, started.elapsed()))
}

/// `k` claims of `batch` messages, each timed alone, each rolled back.
async fn claims(
    connect: &PgConnectOptions,
    batch: u32,
    k: usize,
) -> Result<Vec<Duration>, BoxError> {
    let claim = Dialect::Postgres.claim_sql(1, false).claim;
    let mut conn = sqlx::PgConnection::connect_with(connect).await?;
    let mut lat = Vec::with_capacity(k);
    for _ in 0..k {
        let mut tx = conn.begin().await?;
        // As the relay's claim transaction begins (PostgreSQL's claim
        // `begin`): without JIT, which otherwise compiles the statement on
        // every claim once the queue's estimate passes `jit_above_cost`
        // (the timed claim measured 20 ms at 10k pending, 277 ms at 1M).
        sqlx::raw_sql("SET LOCAL synchronous_commit = off; SET LOCAL jit = off")
            .execute(&mut *tx)
            .await?;
        let t = Instant::now();
        let rows = sqlx::query(sqlx::AssertSqlSafe(claim.as_str()))
            .bind("bench-peers-scale")
            .bind(LEASE_SECS as f64)
            .bind(TOPIC)
            .bind(i64::from(batch))
            .bind(0i64)
            .fetch_all(&mut *tx)
            .await?;
        lat.push(t.elapsed());
        if rows.len() != batch as usize {
            return Err(format!("a claim got {} of {batch} messages", rows.len()).into());
        }
        tx.rollback().await?;
    }
    conn.close().await?;
    Ok(lat)
}

fn quantile(v: &mut [Duration], q: f64) -> f64 {
    v.sort_unstable();
    v[((v.len() - 1) as f64 * q) as usize].as_secs_f64() * 1e3
}

/// Fills a small and a large queue, times the claim on both (alternating
/// rounds), drains `drain_n` off each and checks the database.
pub(crate) async fn scale(
    url: &str,
    setup: &Setup,
    small: i64,
    large: i64,
    drain_n: i64,
    k: usize,
) -> Result<[Scaled; 2], BoxError> {
    let mut queues = Vec::new();
    for (schema, rows) in [
        ("bench_peers_scale_small", small),
        ("bench_peers_scale_large", large),
    ] {
        let (pool, connect, took) = fill(url, schema, rows).await?;
        println!(
            "  {schema}: {rows} pending messages filled in {:.1}s",
            took.as_secs_f64()
        );
        queues.push((schema, rows, pool, connect, took, Vec::new()));
    }
    // Warm each (plans, buffer cache), then alternate.
    for q in &queues {
        claims(&q.3, setup.batch, k / 3 + 1).await?;
    }
    for _ in 0..3 {
        for q in &mut queues {
            let lat = claims(&q.3, setup.batch, k / 3 + 1).await?;
            q.5.extend(lat);
        }
    }
    let mut out = Vec::new();
    for (schema, rows, pool, connect, took, mut lat) in queues {
        let d = drain(
            &pool,
            &connect,
            setup,
            TOPIC,
            drain_n,
            Commits::PerMessage,
            Rows::Own,
        )
        .await?;
        // Drained: at least `drain_n`, each coupon once.
        let (success, used, ledger, twice): (i64, i64, i64, i64) =
            sqlx::query_as(sqlx::AssertSqlSafe(format!(
                "SELECT (SELECT COUNT(*) FROM idem_outbox WHERE status = 'success'), \
                    (SELECT COUNT(*) FROM {COUPON} WHERE status = 'USED'), \
                    (SELECT COUNT(*) FROM {LEDGER}), \
                    (SELECT COUNT(*) FROM (SELECT coupon_id FROM {LEDGER} GROUP BY coupon_id \
                       HAVING COUNT(*) > 1) t)"
            )))
            .fetch_one(&pool)
            .await?;
        if success < drain_n || used != success || ledger != success || twice != 0 {
            return Err(format!(
                "{schema}: VERIFY FAILED: {success} messages success (at least {drain_n} \
                 expected), {used} coupons USED, {ledger} ledger rows, {twice} coupons twice"
            )
            .into());
        }
        pool.close().await;
        let admin = PgPool::connect(url).await?;
        sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
            "DROP SCHEMA IF EXISTS {schema} CASCADE"
        )))
        .execute(&admin)
        .await?;
        admin.close().await;
        out.push(Scaled {
            pending: rows,
            fill: took,
            claim_p50_ms: quantile(&mut lat, 0.5),
            claim_p90_ms: quantile(&mut lat, 0.9),
            drain_rate: d.rate(drain_n),
        });
    }
    let large = out.pop().ok_or("no large queue")?;
    let small = out.pop().ok_or("no small queue")?;
    Ok([small, large])
}
