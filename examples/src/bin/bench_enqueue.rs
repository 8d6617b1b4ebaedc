//! Enqueue throughput with the relay's push wake-up on and off, side by
//! side in one run, on PostgreSQL: 1, 8 and 32 producers (a connection
//! each), every message its own enqueue-and-commit transaction, while a
//! relay of the same process drains the topic.
//!
//! - **push on**: the relay pushes; its notifier notifies after the
//!   producers' commits, coalesced, so their transactions never issue
//!   `NOTIFY` (and never take PostgreSQL's notification commit lock);
//! - **off**: nobody notifies, the relay polls;
//! - **in-tx** (for comparison): each producer's insert notifies in its
//!   own transaction, as a producer-only process does.
//!
//! Modes alternate within each round, push on and off in the reverse
//! order every other round; the rates are the best of the rounds. Prints
//! `enqueue N producers: push on X msg/s, off Y msg/s, on/off R` per
//! producer count (`IDEM_BENCH_VERBOSE=1` adds each run's claims and
//! transactions per message).
//!
//! `cargo run --release -p idem-examples --bin bench_enqueue [-- --messages 4000 --rounds 3 --producers 1,8,32 --url URL]`

use clap::Parser;
use idem_examples::bench::latency::enqueue_compare;
use sqlx::postgres::PgPoolOptions;

/// Enqueue throughput with push wake-up on and off.
#[derive(Debug, Clone, Parser)]
#[command(name = "bench_enqueue", args_override_self = true)]
struct Args {
    /// Messages per mode, round and producer count.
    #[arg(long, value_name = "N", default_value_t = 4000)]
    messages: usize,
    /// Rounds, each running every mode.
    #[arg(long, value_name = "N", default_value_t = 3)]
    rounds: usize,
    /// The producer counts, comma-separated.
    #[arg(
        long,
        value_name = "LIST",
        value_delimiter = ',',
        default_value = "1,8,32"
    )]
    producers: Vec<usize>,
    /// PostgreSQL URL.
    #[arg(long, default_value = "postgres://postgres@127.0.0.1:5432/test")]
    url: String,
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = Args::parse();
    let setup = PgPoolOptions::new()
        .max_connections(1)
        .connect(&args.url)
        .await?;
    idem_runtime::migrate(&setup).await?;
    setup.close().await;
    let stamp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .as_micros();
    println!(
        "bench_enqueue: {} messages per mode, {} rounds (best of), producers {:?}, {}",
        args.messages, args.rounds, args.producers, args.url
    );
    let rates = enqueue_compare(
        &args.url,
        &format!("bench_enqueue.{stamp}"),
        &args.producers,
        args.messages,
        args.rounds,
    )
    .await?;
    for r in rates {
        println!("{}", r.line());
    }
    Ok(())
}
