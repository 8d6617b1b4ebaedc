//! Ordered against unordered relay throughput, side by side in one run,
//! on PostgreSQL: the same messages enqueued with an ordering key (1, 100
//! or 10,000 distinct keys, round robin) or without one, then drained by
//! one relay (16 handlers, batches of 64); the handler does no work of its
//! own, so the figures are the relay's: its claims, its ordering guard,
//! its success marks.
//!
//! Each round runs every mode, ordered and unordered in the reverse order
//! every other round; the rates are the best of the rounds. Prints
//! `ordered K keys: X msg/s, unordered Y msg/s, ordered/unordered R` per
//! key count.
//!
//! `cargo run --release -p idem-examples --bin bench_ordered [-- --messages 4000 --rounds 3 --keys 1,100,10000 --url URL]`

use clap::Parser;
use idem_runtime::Outcome;
use idem_runtime::outbox::{EnqueueOptions, Relay, enqueue_with};
use sqlx::PgPool;
use sqlx::postgres::PgPoolOptions;
use std::time::{Duration, Instant};

/// Ordered against unordered relay throughput.
#[derive(Debug, Clone, Parser)]
#[command(name = "bench_ordered", args_override_self = true)]
struct Args {
    /// Messages per mode and round.
    #[arg(long, value_name = "N", default_value_t = 4000)]
    messages: usize,
    /// Rounds, each running every mode.
    #[arg(long, value_name = "N", default_value_t = 3)]
    rounds: usize,
    /// The key counts, comma-separated.
    #[arg(
        long,
        value_name = "LIST",
        value_delimiter = ',',
        default_value = "1,100,10000"
    )]
    keys: Vec<usize>,
    /// PostgreSQL URL.
    #[arg(long, default_value = "postgres://postgres@127.0.0.1:5432/test")]
    url: String,
}

/// Enqueues `n` messages on `topic`, keyed round robin over `keys` keys
/// (`None`: no key), 200 to a transaction.
async fn produce(
    pool: &PgPool,
    topic: &str,
    n: usize,
    keys: Option<usize>,
) -> Result<(), idem_runtime::Error> {
    let payload = serde_json::json!({});
    for chunk in (0..n).collect::<Vec<_>>().chunks(200) {
        let mut tx = pool.begin().await?;
        for &i in chunk {
            let options = match keys {
                Some(k) => EnqueueOptions::new().ordering_key(format!("{topic}:{}", i % k)),
                None => EnqueueOptions::new(),
            };
            enqueue_with(&mut tx, topic, &format!("m-{i}"), &payload, &options).await?;
        }
        tx.commit().await?;
    }
    Ok(())
}

/// Drains `topic` with one relay; messages per second.
async fn drain(pool: &PgPool, topic: &str, n: usize) -> Result<f64, Box<dyn std::error::Error>> {
    let start = Instant::now();
    let relay = Relay::new(pool.clone())
        .route(topic.to_owned(), |_d, _m: serde_json::Value| async {
            Ok(Outcome::Executed(()))
        })
        .concurrency(16)
        .batch_size(64)
        .poll_interval(Duration::from_millis(10))
        .spawn();
    loop {
        let left: i64 = sqlx::query_scalar(
            "SELECT COUNT(*) FROM idem_outbox WHERE topic = $1 AND status = 'pending'",
        )
        .bind(topic)
        .fetch_one(pool)
        .await?;
        if left == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let rate = n as f64 / start.elapsed().as_secs_f64();
    relay.shutdown().await;
    Ok(rate)
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = Args::parse();
    let pool = PgPoolOptions::new()
        .max_connections(24)
        .connect(&args.url)
        .await?;
    idem_runtime::migrate(&pool).await?;
    let stamp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .as_micros();
    println!(
        "bench_ordered: {} messages per mode, {} rounds (best of), keys {:?}, {}",
        args.messages, args.rounds, args.keys, args.url
    );
    for &keys in &args.keys {
        let (mut ordered, mut unordered) = (0f64, 0f64);
        for round in 0..args.rounds {
            let modes = match round % 2 {
                0 => [Some(keys), None],
                _ => [None, Some(keys)],
            };
            for mode in modes {
                let topic = format!("bench_ordered.{stamp}.{keys}.{round}.{}", mode.is_some());
                produce(&pool, &topic, args.messages, mode).await?;
                let rate = drain(&pool, &topic, args.messages).await?;
                match mode {
                    Some(_) => ordered = ordered.max(rate),
                    None => unordered = unordered.max(rate),
                }
                sqlx::query("DELETE FROM idem_outbox WHERE topic = $1")
                    .bind(&topic)
                    .execute(&pool)
                    .await?;
            }
        }
        println!(
            "ordered {keys} keys: {ordered:.0} msg/s, unordered {unordered:.0} msg/s, ordered/unordered {:.2}",
            ordered / unordered
        );
    }
    Ok(())
}
