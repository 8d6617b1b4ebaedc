//! Enqueue→effect latency of the outbox relay on PostgreSQL, with the push
//! wake-up (`LISTEN`/`NOTIFY`) on and off, side by side in one run: a
//! steady producer (default 200 messages/s, one transaction each) and a
//! relay polling every 100 ms, alternating the two modes in rounds.
//!
//! The latency of a message runs from just before its producer's
//! `COMMIT` to the start of its handler (the effect), both timed in this
//! process (`Instant`). Then the cost of the notification on `enqueue`
//! itself: sequential enqueue-and-commit transactions with
//! `notify_on_enqueue` on and off, alternating in rounds.
//!
//! `cargo run --release -p idem-examples --bin bench_latency [-- --rate 200 --seconds 10 --rounds 2 --poll-ms 100 --enqueues 2000 --enqueue-rounds 5 --enqueue-concurrency 1 --url URL]`

use clap::Parser;
use idem_runtime::Outcome;
use idem_runtime::outbox::{Relay, enqueue, notify_on_enqueue};
use sqlx::PgPool;
use sqlx::postgres::PgPoolOptions;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Enqueue→effect latency with push wake-up on and off.
#[derive(Debug, Clone, Parser)]
#[command(name = "bench_latency", args_override_self = true)]
struct Args {
    /// Messages per second the producer enqueues (one transaction each).
    #[arg(long, value_name = "R", default_value_t = 200)]
    rate: u32,
    /// Seconds of steady load per mode and round.
    #[arg(long, value_name = "S", default_value_t = 10)]
    seconds: u64,
    /// Rounds, each running both modes.
    #[arg(long, value_name = "N", default_value_t = 2)]
    rounds: usize,
    /// The relay's poll interval, in milliseconds.
    #[arg(long, value_name = "MS", default_value_t = 100)]
    poll_ms: u64,
    /// Sequential enqueues per mode and round for the enqueue cost (0:
    /// skip it).
    #[arg(long, value_name = "N", default_value_t = 2000)]
    enqueues: usize,
    /// Rounds of the enqueue cost, each running both modes.
    #[arg(long, value_name = "N", default_value_t = 5)]
    enqueue_rounds: usize,
    /// Concurrent producers (and connections) for the enqueue cost.
    #[arg(long, value_name = "C", default_value_t = 1)]
    enqueue_concurrency: usize,
    /// PostgreSQL URL.
    #[arg(long, default_value = "postgres://postgres@127.0.0.1:5432/test")]
    url: String,
}

/// When each message's producer was about to commit, by `msg_id`.
type Sent = Arc<Mutex<HashMap<String, Instant>>>;

/// One mode's run: the latencies in microseconds, sorted.
async fn run(args: &Args, push: bool, tag: &str) -> Result<Vec<u64>, Box<dyn std::error::Error>> {
    let topic = format!("bench_latency.{tag}");
    let sent: Sent = Arc::default();
    let latencies: Arc<Mutex<Vec<u64>>> = Arc::default();
    let relay_pool = PgPoolOptions::new()
        .max_connections(8)
        .connect(&args.url)
        .await?;
    let producer = PgPoolOptions::new()
        .max_connections(8)
        .connect(&args.url)
        .await?;
    let (s, l) = (sent.clone(), latencies.clone());
    let relay = Relay::new(relay_pool.clone())
        .route(topic.clone(), move |d, _m: serde_json::Value| {
            let at = s.lock().ok().and_then(|mut m| m.remove(&d.msg_id));
            if let (Some(at), Ok(mut l)) = (at, l.lock()) {
                l.push(at.elapsed().as_micros() as u64);
            }
            async move { Ok::<_, idem_runtime::Error>(Outcome::Executed(())) }
        })
        .poll_interval(Duration::from_millis(args.poll_ms))
        .push_wakeup(push)
        .spawn();
    // Let the relay start (and its listener listen).
    tokio::time::sleep(Duration::from_millis(500)).await;
    let total = args.rate as u64 * args.seconds;
    let mut tick = tokio::time::interval(Duration::from_secs(1) / args.rate);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    let mut producers = tokio::task::JoinSet::new();
    for n in 0..total {
        tick.tick().await;
        let (pool, sent, topic) = (producer.clone(), sent.clone(), topic.clone());
        producers.spawn(async move {
            let msg_id = format!("m-{n}");
            let mut tx = pool.begin().await?;
            enqueue(&mut tx, &topic, &msg_id, &serde_json::json!({ "n": n })).await?;
            if let Ok(mut s) = sent.lock() {
                s.insert(msg_id, Instant::now());
            }
            tx.commit().await?;
            Ok::<_, idem_runtime::Error>(())
        });
        while let Some(done) = producers.try_join_next() {
            done??;
        }
    }
    while let Some(done) = producers.join_next().await {
        done??;
    }
    let start = Instant::now();
    while latencies.lock().map(|l| l.len() as u64).unwrap_or(0) < total {
        if start.elapsed() > Duration::from_secs(60) {
            return Err("the relay did not deliver every message within 60 s".into());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    relay.shutdown().await;
    relay_pool.close().await;
    producer.close().await;
    let mut l = latencies.lock().map(|l| l.clone()).unwrap_or_default();
    l.sort_unstable();
    Ok(l)
}

fn pct(sorted: &[u64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((sorted.len() as f64 - 1.0) * p / 100.0).round() as usize;
    sorted[i] as f64 / 1000.0
}

fn line(mode: &str, l: &[u64]) -> String {
    let mean = l.iter().sum::<u64>() as f64 / l.len().max(1) as f64 / 1000.0;
    format!(
        "{mode:<10} n={:>5}  p50 {:>7.2} ms  p90 {:>7.2} ms  p99 {:>7.2} ms  max {:>7.2} ms  mean {:>7.2} ms",
        l.len(),
        pct(l, 50.0),
        pct(l, 90.0),
        pct(l, 99.0),
        pct(l, 100.0),
        mean
    )
}

/// `n` enqueue-and-commit transactions on `c` workers (sequential on
/// each); the time of each, in microseconds, and the rate per second.
async fn enqueue_times(
    pool: &PgPool,
    topic: &str,
    n: usize,
    c: usize,
) -> Result<(Vec<u64>, f64), Box<dyn std::error::Error + Send + Sync>> {
    let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let start = Instant::now();
    let mut workers = tokio::task::JoinSet::new();
    for _ in 0..c.max(1) {
        let (pool, topic, next) = (pool.clone(), topic.to_string(), next.clone());
        workers.spawn(async move {
            let mut times = Vec::new();
            loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                if i >= n {
                    return Ok::<_, idem_runtime::Error>(times);
                }
                let start = Instant::now();
                let mut tx = pool.begin().await?;
                enqueue(
                    &mut tx,
                    &topic,
                    &format!("e-{i}"),
                    &serde_json::json!({ "i": i }),
                )
                .await?;
                tx.commit().await?;
                times.push(start.elapsed().as_micros() as u64);
            }
        });
    }
    let mut times = Vec::with_capacity(n);
    while let Some(done) = workers.join_next().await {
        times.extend(done??);
    }
    Ok((times, n as f64 / start.elapsed().as_secs_f64()))
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = Args::parse();
    let setup = PgPoolOptions::new()
        .max_connections(2)
        .connect(&args.url)
        .await?;
    idem_runtime::migrate(&setup).await?;
    let stamp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .as_micros();
    println!(
        "bench_latency: {} msg/s for {} s per mode and round, {} rounds, poll {} ms, {}",
        args.rate, args.seconds, args.rounds, args.poll_ms, args.url
    );
    let mut all = [Vec::new(), Vec::new()];
    for round in 0..args.rounds {
        for (m, push) in [true, false].into_iter().enumerate() {
            let mode = if push { "push on" } else { "push off" };
            let l = run(&args, push, &format!("{stamp}.{round}.{m}")).await?;
            println!("round {round} {}", line(mode, &l));
            all[m].extend(l);
        }
    }
    for l in &mut all {
        l.sort_unstable();
    }
    println!("all rounds:");
    println!("  {}", line("push on", &all[0]));
    println!("  {}", line("push off", &all[1]));

    if args.enqueues > 0 {
        let pool = PgPoolOptions::new()
            .max_connections(args.enqueue_concurrency.max(1) as u32)
            .connect(&args.url)
            .await?;
        let mut all = [Vec::new(), Vec::new()];
        let mut rates = [0.0f64; 2];
        let rounds = args.enqueue_rounds.max(1);
        for round in 0..rounds {
            for (m, on) in [true, false].into_iter().enumerate() {
                notify_on_enqueue(on);
                let topic = format!("bench_latency.enqueue.{stamp}.{round}.{m}");
                let (mut t, rate) =
                    enqueue_times(&pool, &topic, args.enqueues, args.enqueue_concurrency)
                        .await
                        .map_err(|e| e as Box<dyn std::error::Error>)?;
                t.sort_unstable();
                println!(
                    "enqueue round {round} {}  {rate:.0}/s",
                    line(if on { "notify on" } else { "notify off" }, &t)
                );
                rates[m] += rate / rounds as f64;
                all[m].extend(t);
            }
        }
        notify_on_enqueue(true);
        for l in &mut all {
            l.sort_unstable();
        }
        println!(
            "enqueue + commit, {} concurrent, all rounds:",
            args.enqueue_concurrency
        );
        println!("  {}  {:.0}/s", line("notify on", &all[0]), rates[0]);
        println!("  {}  {:.0}/s", line("notify off", &all[1]), rates[1]);
        // The bench's messages: delivered by nobody, removed.
        sqlx::query("DELETE FROM idem_outbox WHERE topic LIKE $1")
            .bind(format!("bench_latency.%{stamp}%"))
            .execute(&pool)
            .await?;
        pool.close().await;
    }
    sqlx::query("DELETE FROM idem_outbox WHERE topic LIKE $1")
        .bind(format!("bench_latency.{stamp}.%"))
        .execute(&setup)
        .await?;
    Ok(())
}
