//! The cost of the claim's pause guard (`NOT EXISTS` over
//! `idem_topic_pause`, one primary-key probe per candidate row), side by
//! side in one run: the relay's claim statement as idem renders it, and
//! the same text with the guard cut out, on PostgreSQL and MariaDB.
//!
//! One topic holds `--messages` due messages (10,000), and
//! `idem_topic_pause` holds `--paused` other topics (100; the guard's
//! probe then looks up a populated index). Each claim picks `--limit` (64)
//! rows at the offset a relay picks under a backlog (a random one of the
//! first 8 multiples of the limit: `Relay::claim_spread`'s default), and
//! is rolled back, so every claim sees the same rows: PostgreSQL runs its
//! `UPDATE … RETURNING` (the lease written, then undone), MariaDB its
//! picking `SELECT` (where its guard sits). The two statements alternate
//! claim by claim, for `--claims` claims each per round; the rates are the
//! best of `--rounds`. Prints `guarded / unguarded` per database: 1.00 is
//! a free guard.
//!
//! `cargo run --release -p idem-examples --bin bench_pause [-- --messages 10000 --paused 100 --claims 2000 --rounds 3]`

use clap::Parser;
use idem_runtime::outbox::{admin, enqueue};
use idem_runtime::{Dialect, Operable};
use sqlx::{MySqlPool, PgPool};
use std::time::{Duration, Instant};

/// The guard as idem renders it into the claim (its text is checked to be
/// there: a renamed guard fails the run rather than measure nothing).
const GUARD: &str = "AND NOT EXISTS (SELECT 1 FROM idem_topic_pause z WHERE z.topic = q.topic)";

/// The claim's pause guard, guarded against unguarded.
#[derive(Debug, Clone, Parser)]
#[command(name = "bench_pause", args_override_self = true)]
struct Args {
    /// Due messages of the claimed topic.
    #[arg(long, value_name = "N", default_value_t = 10_000)]
    messages: usize,
    /// Other topics paused meanwhile.
    #[arg(long, value_name = "N", default_value_t = 100)]
    paused: usize,
    /// Rows per claim.
    #[arg(long, value_name = "N", default_value_t = 64)]
    limit: i64,
    /// Claims per statement and round.
    #[arg(long, value_name = "N", default_value_t = 2000)]
    claims: usize,
    /// Rounds.
    #[arg(long, value_name = "N", default_value_t = 3)]
    rounds: usize,
    /// PostgreSQL URL.
    #[arg(long, default_value = "postgres://postgres@127.0.0.1:5432/test")]
    postgres: String,
    /// MariaDB URL.
    #[arg(long, default_value = "mysql://root@127.0.0.1:3306/test")]
    mysql: String,
}

type BoxError = Box<dyn std::error::Error>;

/// The claim statement for one topic, and the same without the guard.
fn statements(dialect: Dialect) -> Result<(String, String), BoxError> {
    let guarded = dialect.claim_sql(1, false).claim;
    if guarded.matches(GUARD).count() != 1 {
        return Err(format!("the {dialect:?} claim has no pause guard to cut: {guarded}").into());
    }
    let unguarded = guarded.replace(GUARD, "");
    Ok((guarded, unguarded))
}

/// The relay's own offsets (`Relay::claim_spread`, default 8): `k × limit`
/// for a pseudo-random `k` below the spread (xorshift: no dependency, the
/// same sequence for both statements), within the due rows.
fn offsets(messages: usize, limit: i64) -> impl FnMut() -> i64 {
    const SPREAD: u64 = 8;
    let last = (messages as i64 - limit).max(0);
    let mut x = 0x9E37_79B9_7F4A_7C15u64;
    move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        ((x % SPREAD) as i64 * limit).min(last)
    }
}

/// Fills `topic` with `n` due messages and pauses `paused` other topics.
async fn fill<DB: Operable>(
    pool: &sqlx::Pool<DB>,
    topic: &str,
    n: usize,
    paused: usize,
) -> Result<(), BoxError> {
    for chunk in (0..n).collect::<Vec<_>>().chunks(500) {
        let mut tx = DB::begin(pool).await?;
        for &i in chunk {
            enqueue(&mut tx, topic, &format!("m-{i}"), &serde_json::json!({})).await?;
        }
        tx.commit().await?;
    }
    for i in 0..paused {
        admin::pause(pool, &format!("{topic}.other-{i}"), "bench", "bench_pause").await?;
    }
    Ok(())
}

/// Resumes the topics [`fill`] paused.
async fn clean<DB: Operable>(
    pool: &sqlx::Pool<DB>,
    topic: &str,
    paused: usize,
) -> Result<(), BoxError> {
    for i in 0..paused {
        admin::resume(pool, &format!("{topic}.other-{i}"), "bench_pause").await?;
    }
    Ok(())
}

/// PostgreSQL: `claims` claims of each statement, alternating, each
/// rolled back; (guarded, unguarded) claims per second.
async fn postgres_round(
    pool: &PgPool,
    (guarded, unguarded): (&str, &str),
    topic: &str,
    args: &Args,
) -> Result<(f64, f64), BoxError> {
    let mut next = offsets(args.messages, args.limit);
    let mut took = [Duration::ZERO; 2];
    for _ in 0..args.claims {
        let offset = next();
        for (k, sql) in [guarded, unguarded].into_iter().enumerate() {
            let mut tx = pool.begin().await?;
            let start = Instant::now();
            let rows = sqlx::query(sqlx::AssertSqlSafe(sql))
                .bind("bench_pause")
                .bind(30.0f64)
                .bind(topic)
                .bind(args.limit)
                .bind(offset)
                .fetch_all(&mut *tx)
                .await?;
            took[k] += start.elapsed();
            tx.rollback().await?;
            if rows.len() as i64 != args.limit {
                return Err(format!("a PostgreSQL claim took {} rows", rows.len()).into());
            }
        }
    }
    let rate = |d: Duration| args.claims as f64 / d.as_secs_f64();
    Ok((rate(took[0]), rate(took[1])))
}

/// MariaDB: as [`postgres_round`], with its picking `SELECT`.
async fn mysql_round(
    pool: &MySqlPool,
    (guarded, unguarded): (&str, &str),
    topic: &str,
    args: &Args,
) -> Result<(f64, f64), BoxError> {
    let mut next = offsets(args.messages, args.limit);
    let mut took = [Duration::ZERO; 2];
    for _ in 0..args.claims {
        let offset = next();
        for (k, sql) in [guarded, unguarded].into_iter().enumerate() {
            let mut tx = pool.begin().await?;
            let start = Instant::now();
            let ids: Vec<i64> = sqlx::query_scalar(sqlx::AssertSqlSafe(sql))
                .bind(topic)
                .bind(args.limit)
                .bind(offset)
                .fetch_all(&mut *tx)
                .await?;
            took[k] += start.elapsed();
            tx.rollback().await?;
            if ids.len() as i64 != args.limit {
                return Err(format!("a MariaDB claim took {} rows", ids.len()).into());
            }
        }
    }
    let rate = |d: Duration| args.claims as f64 / d.as_secs_f64();
    Ok((rate(took[0]), rate(took[1])))
}

fn report(db: &str, best: (f64, f64)) {
    println!(
        "{db}: guarded {:.0} claims/s, unguarded {:.0} claims/s, guarded/unguarded {:.3}",
        best.0,
        best.1,
        best.0 / best.1
    );
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), BoxError> {
    let args = Args::parse();
    let stamp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .as_micros();
    let topic = format!("bench_pause.{stamp}");
    println!(
        "bench_pause: {} due messages, {} other topics paused, {} rows per claim, {} claims per statement and round, {} rounds (best of)",
        args.messages, args.paused, args.limit, args.claims, args.rounds
    );

    let pg = PgPool::connect(&args.postgres).await?;
    idem_runtime::migrate(&pg).await?;
    fill(&pg, &topic, args.messages, args.paused).await?;
    sqlx::query("ANALYZE idem_outbox").execute(&pg).await?;
    let (g, u) = statements(Dialect::Postgres)?;
    let mut best = (0f64, 0f64);
    for _ in 0..args.rounds {
        let (a, b) = postgres_round(&pg, (&g, &u), &topic, &args).await?;
        best = (best.0.max(a), best.1.max(b));
    }
    clean(&pg, &topic, args.paused).await?;
    sqlx::query("DELETE FROM idem_outbox WHERE topic = $1")
        .bind(&topic)
        .execute(&pg)
        .await?;
    report("PostgreSQL", best);

    let my = MySqlPool::connect(&args.mysql).await?;
    idem_runtime::migrate(&my).await?;
    fill(&my, &topic, args.messages, args.paused).await?;
    let (g, u) = statements(Dialect::MySql)?;
    let mut best = (0f64, 0f64);
    for _ in 0..args.rounds {
        let (a, b) = mysql_round(&my, (&g, &u), &topic, &args).await?;
        best = (best.0.max(a), best.1.max(b));
    }
    clean(&my, &topic, args.paused).await?;
    sqlx::query("DELETE FROM idem_outbox WHERE topic = ?")
        .bind(&topic)
        .execute(&my)
        .await?;
    report("MariaDB", best);
    Ok(())
}
