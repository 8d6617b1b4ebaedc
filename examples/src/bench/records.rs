//! The duplicate check as the record table grows: a `record`-strategy call
//! whose key exists (the claim `INSERT … ON CONFLICT DO NOTHING` and the
//! stored-result read), timed against a small and a large `idem_record`,
//! each in a schema of its own (selected by `search_path`, so the
//! runtime's statements run unchanged). Shared by `bench_archive` and
//! `bench_peers --scale`.

use idem_runtime::{Outcome, idempotent};
use serde::{Deserialize, Serialize};
use sqlx::postgres::PgPoolOptions;
use sqlx::{Executor, PgPool, Postgres, Transaction};
use std::time::{Duration, Instant};

/// The errors of a benchmark run.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The call's argument.
#[derive(Debug, Clone, Serialize)]
pub struct Notice {
    /// The key's part.
    pub id: i64,
}

/// The stored result.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Receipt {
    /// Always true.
    pub ok: bool,
}

/// The `record` handler whose duplicates are timed.
#[idempotent(key = "bench-rec:{n.id}", strategy = record, biz_type = "bench")]
pub async fn notify(
    _tx: &mut Transaction<'_, Postgres>,
    n: &Notice,
) -> Result<Receipt, sqlx::Error> {
    Ok(Receipt { ok: true })
}

/// A pool whose connections use `schema` (recreated empty, with idem's
/// tables migrated into it).
pub async fn schema_pool(url: &str, schema: &'static str) -> Result<PgPool, BoxError> {
    let admin = PgPool::connect(url).await?;
    admin
        .execute(sqlx::AssertSqlSafe(format!(
            "DROP SCHEMA IF EXISTS {schema} CASCADE; CREATE SCHEMA {schema}"
        )))
        .await?;
    admin.close().await;
    let pool = PgPoolOptions::new()
        .max_connections(4)
        .after_connect(move |conn, _| {
            Box::pin(async move {
                conn.execute(sqlx::AssertSqlSafe(format!("SET search_path = {schema}")))
                    .await?;
                Ok(())
            })
        })
        .connect(url)
        .await?;
    idem_runtime::migrate(&pool).await?;
    Ok(pool)
}

/// Drops `schema`.
pub async fn drop_schema(url: &str, schema: &str) -> Result<(), BoxError> {
    let admin = PgPool::connect(url).await?;
    admin
        .execute(sqlx::AssertSqlSafe(format!(
            "DROP SCHEMA IF EXISTS {schema} CASCADE"
        )))
        .await?;
    admin.close().await;
    Ok(())
}

/// Fills `pool`'s `idem_record` with `rows` records: the first through the
/// runtime (the real fingerprint and stored result), the rest in bulk with
/// the fingerprint their own payload would have. Returns the time taken.
pub async fn fill(pool: &PgPool, rows: i64) -> Result<Duration, BoxError> {
    let probe = notify(pool, &Notice { id: 1 }).await?;
    assert!(probe.is_executed());
    let result: Option<String> =
        sqlx::query_scalar("SELECT result FROM idem_record WHERE idempotency_key = 'bench-rec:1'")
            .fetch_one(pool)
            .await?;
    let started = Instant::now();
    let mut next = 2;
    while next <= rows {
        let end = (next + 200_000 - 1).min(rows);
        sqlx::query(
            "INSERT INTO idem_record (idempotency_key, biz_type, biz_no, fingerprint, result, expire_time) \
             SELECT 'bench-rec:' || g, 'bench', 'bench-rec:' || g, \
                    encode(sha256(convert_to('[{\"id\":' || g || '}]', 'UTF8')), 'hex'), $3, \
                    now() + interval '7 days' \
             FROM generate_series($1::bigint, $2::bigint) g",
        )
        .bind(next)
        .bind(end)
        .bind(&result)
        .execute(pool)
        .await?;
        next = end + 1;
    }
    // The table as it would be after a while in production: vacuumed
    // (hint bits set, the visibility map written) and its dirty pages
    // written out, so that the bulk load's own aftermath (a checkpoint
    // flushing gigabytes, the first reads setting hint bits) does not land
    // on the measured calls.
    sqlx::query("VACUUM ANALYZE idem_record")
        .execute(pool)
        .await?;
    sqlx::query("CHECKPOINT").execute(pool).await?;
    Ok(started.elapsed())
}

/// Latencies of one series of calls.
#[derive(Debug, Clone, Default)]
pub struct Lat(pub Vec<Duration>);

impl Lat {
    /// Mean, in milliseconds.
    pub fn mean(&self) -> f64 {
        self.0.iter().map(Duration::as_secs_f64).sum::<f64>() / self.0.len().max(1) as f64 * 1e3
    }

    /// 99th percentile, in milliseconds.
    pub fn p99(&mut self) -> f64 {
        self.0.sort_unstable();
        match self.0.len() {
            0 => 0.0,
            n => self.0[((n - 1) as f64 * 0.99) as usize].as_secs_f64() * 1e3,
        }
    }
}

/// `calls` duplicate checks on random existing keys among `rows`, one at
/// a time; each must answer the stored result.
pub async fn duplicates(pool: &PgPool, rows: i64, calls: u64, seed: u64) -> Result<Lat, BoxError> {
    let mut lat = Vec::with_capacity(calls as usize);
    let mut x = seed | 1;
    for _ in 0..calls {
        // xorshift: spread lookups over the whole table.
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let id = 1 + (x % rows as u64) as i64;
        let t = Instant::now();
        let outcome = notify(pool, &Notice { id }).await?;
        lat.push(t.elapsed());
        if outcome != Outcome::Duplicate(Some(Receipt { ok: true })) {
            return Err(format!("key {id}: {outcome:?}, not the stored duplicate").into());
        }
    }
    Ok(Lat(lat))
}

/// The duplicate check on a small and a large table, warmed, then in
/// `rounds` alternating rounds of `calls` each: all the latencies of each.
pub async fn compare(
    small: (&PgPool, i64),
    large: (&PgPool, i64),
    calls: u64,
    rounds: u64,
    mut each_round: impl FnMut(u64, &mut Lat, &mut Lat),
) -> Result<(Lat, Lat), BoxError> {
    // Warm both (index pages into the buffer cache, prepared statements).
    duplicates(small.0, small.1, calls, 7).await?;
    duplicates(large.0, large.1, calls, 7).await?;
    let (mut all_small, mut all_large) = (Vec::new(), Vec::new());
    for round in 1..=rounds {
        let mut s = duplicates(small.0, small.1, calls, round * 31).await?;
        let mut l = duplicates(large.0, large.1, calls, round * 31).await?;
        each_round(round, &mut s, &mut l);
        all_small.extend(s.0);
        all_large.extend(l.0);
    }
    Ok((Lat(all_small), Lat(all_large)))
}
