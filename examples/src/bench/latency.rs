//! Enqueue→effect latency of the outbox relay on PostgreSQL, with the push
//! wake-up on and off (`bench_latency`, and the latency part of
//! `bench_peers`): a steady producer, one transaction per message, and a
//! relay polling at a fixed interval. A message's latency runs from just
//! before its producer's `COMMIT` to the start of its handler, both timed
//! in this process.

use idem_runtime::Outcome;
use idem_runtime::outbox::{Relay, enqueue};
use sqlx::PgPool;
use sqlx::postgres::PgPoolOptions;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The steady load.
#[derive(Debug, Clone)]
pub struct Steady {
    /// PostgreSQL URL.
    pub url: String,
    /// Messages per second the producer enqueues.
    pub rate: u32,
    /// Seconds of steady load.
    pub seconds: u64,
    /// The relay's poll interval, in milliseconds.
    pub poll_ms: u64,
}

/// When each message's producer was about to commit, by `msg_id`.
type Sent = Arc<Mutex<HashMap<String, Instant>>>;

/// One mode's run: a steady producer and a relay with push wake-up on or
/// off; the enqueue→effect latencies in microseconds, sorted.
pub async fn run(
    args: &Steady,
    push: bool,
    tag: &str,
) -> Result<Vec<u64>, Box<dyn std::error::Error>> {
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
    // The run's messages are scratch: leave the outbox as it was.
    sqlx::query("DELETE FROM idem_outbox WHERE topic = $1")
        .bind(&topic)
        .execute(&producer)
        .await?;
    relay_pool.close().await;
    producer.close().await;
    let mut l = latencies.lock().map(|l| l.clone()).unwrap_or_default();
    l.sort_unstable();
    Ok(l)
}

/// The `p`th percentile of `sorted` (microseconds), in milliseconds.
pub fn pct(sorted: &[u64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((sorted.len() as f64 - 1.0) * p / 100.0).round() as usize;
    sorted[i] as f64 / 1000.0
}

/// One mode's figures on a line.
pub fn line(mode: &str, l: &[u64]) -> String {
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
pub async fn enqueue_times(
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

/// How a run of [`enqueue_with_relay`] wakes its relay.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wakeup {
    /// The relay pushes: its notifier notifies after the producers'
    /// commits (the default with a pushing relay in the process).
    Push,
    /// The producers' own insert statements notify (a producer-only
    /// process); the relay polls.
    InTransaction,
    /// Nobody notifies; the relay polls.
    Off,
}

/// `n` enqueue-and-commit transactions from `producers` concurrent
/// producers (a connection each) while a relay drains the topic, woken as
/// `wakeup` says; the producers' rate (messages per second), once the
/// relay delivered every message.
pub async fn enqueue_with_relay(
    url: &str,
    topic: &str,
    producers: usize,
    n: usize,
    wakeup: Wakeup,
) -> Result<f64, Box<dyn std::error::Error>> {
    let relay_pool = PgPoolOptions::new().max_connections(4).connect(url).await?;
    let pool = PgPoolOptions::new()
        .max_connections(producers.max(1) as u32)
        .min_connections(producers.max(1) as u32)
        .connect(url)
        .await?;
    idem_runtime::outbox::notify_on_enqueue(wakeup != Wakeup::Off);
    let done = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let d = done.clone();
    let relay = Relay::new(relay_pool.clone())
        .route(topic.to_string(), move |_d, _m: serde_json::Value| {
            d.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            async move { Ok::<_, idem_runtime::Error>(Outcome::Executed(())) }
        })
        .poll_interval(Duration::from_millis(100))
        .push_wakeup(wakeup == Wakeup::Push)
        .spawn();
    // Let the relay start (and its listener listen).
    tokio::time::sleep(Duration::from_millis(300)).await;
    let xacts =
        "SELECT xact_commit FROM pg_catalog.pg_stat_database WHERE datname = current_database()";
    let before: i64 = sqlx::query_scalar(xacts).fetch_one(&pool).await?;
    let (_, rate) = enqueue_times(&pool, topic, n, producers)
        .await
        .map_err(|e| e as Box<dyn std::error::Error>)?;
    let start = Instant::now();
    while done.load(std::sync::atomic::Ordering::Relaxed) < n {
        if start.elapsed() > Duration::from_secs(60) {
            return Err("the relay did not deliver every message within 60 s".into());
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    if std::env::var_os("IDEM_BENCH_VERBOSE").is_some() {
        // The statistics collector flushes within a second.
        tokio::time::sleep(Duration::from_millis(1100)).await;
        let after: i64 = sqlx::query_scalar(xacts).fetch_one(&pool).await?;
        let s = relay.stats().snapshot();
        println!(
            "    {wakeup:?}: relay done {:?} after the producers, {} push wake-ups, {} claims, {:.2} transactions per message",
            start.elapsed().saturating_sub(Duration::from_millis(1100)),
            s.push_wakeups,
            s.claims,
            (after - before) as f64 / n as f64
        );
    }
    relay.shutdown().await;
    idem_runtime::outbox::notify_on_enqueue(true);
    sqlx::query("DELETE FROM idem_outbox WHERE topic = $1")
        .bind(topic)
        .execute(&pool)
        .await?;
    relay_pool.close().await;
    pool.close().await;
    Ok(rate)
}

/// The best enqueue rates of one producer count, by mode.
#[derive(Debug, Clone, Copy)]
pub struct EnqueueRates {
    /// Producers (a connection each).
    pub producers: usize,
    /// Push wake-up on (the relay's notifier notifies after the commits).
    pub push_on: f64,
    /// Nobody notifies; the relay polls.
    pub off: f64,
    /// Each producer's own statement notifies.
    pub in_tx: f64,
}

impl EnqueueRates {
    /// The line the issue asks for, with the in-transaction comparison.
    pub fn line(&self) -> String {
        format!(
            "enqueue {} producers: push on {:.0} msg/s, off {:.0} msg/s, on/off {:.2} (in-transaction NOTIFY {:.0} msg/s, {:.2} of off)",
            self.producers,
            self.push_on,
            self.off,
            self.push_on / self.off,
            self.in_tx,
            self.in_tx / self.off
        )
    }
}

/// Enqueue throughput with push on, off and in-transaction, for each of
/// `producers`: `rounds` rounds of `messages` messages per mode, the
/// modes' order reversed every other round (so that a drift of the
/// machine during a round weighs on both sides); the best rate of each.
/// Topics start with `prefix`.
pub async fn enqueue_compare(
    url: &str,
    prefix: &str,
    producers: &[usize],
    messages: usize,
    rounds: usize,
) -> Result<Vec<EnqueueRates>, Box<dyn std::error::Error>> {
    let mut out = Vec::new();
    for &p in producers {
        let mut best = [0.0f64; 3];
        for round in 0..rounds.max(1) {
            let order = match round % 2 {
                0 => [0, 1, 2],
                _ => [1, 0, 2],
            };
            for m in order {
                let (name, wakeup) = [
                    ("push on", Wakeup::Push),
                    ("off", Wakeup::Off),
                    ("in-tx", Wakeup::InTransaction),
                ][m];
                let topic = format!("{prefix}.{p}.{round}.{m}");
                let rate = enqueue_with_relay(url, &topic, p, messages, wakeup).await?;
                println!("  {p} producers, round {round}, {name}: {rate:.0} msg/s");
                best[m] = best[m].max(rate);
            }
        }
        out.push(EnqueueRates {
            producers: p,
            push_on: best[0],
            off: best[1],
            in_tx: best[2],
        });
    }
    Ok(out)
}
