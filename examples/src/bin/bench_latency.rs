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
use idem_examples::bench::latency::{Steady, enqueue_times, line, run};
use idem_runtime::outbox::notify_on_enqueue;
use sqlx::postgres::PgPoolOptions;

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
    let steady = Steady {
        url: args.url.clone(),
        rate: args.rate,
        seconds: args.seconds,
        poll_ms: args.poll_ms,
    };
    let mut all = [Vec::new(), Vec::new()];
    for round in 0..args.rounds {
        for (m, push) in [true, false].into_iter().enumerate() {
            let mode = if push { "push on" } else { "push off" };
            let l = run(&steady, push, &format!("{stamp}.{round}.{m}")).await?;
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
