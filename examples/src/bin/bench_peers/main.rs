//! # Benchmark: idem beside its peers, on the same PostgreSQL in one run
//!
//! The coupon work of `bench_outbox` — deduct a coupon once per "deduct
//! this coupon" message: the coupon's state under a row lock, one ledger
//! row, `UNUSED` → `USED`, the message marked done, one transaction — run
//! by each variant of [`VARIANTS`] on the same PostgreSQL, one after the
//! other, with the same message count and concurrency:
//!
//! - **idem per-message**: `bench_outbox`'s idem side (enqueue N coupons
//!   and messages, then a [`Relay`](idem_runtime::outbox::Relay) drains
//!   them into an `#[idempotent(strategy = state_machine)]` handler, one
//!   commit per message);
//! - **idem batched 16 / 64**: the same with `Relay::commit_batch(n)`: n
//!   handlers' calls in one transaction, one commit;
//! - **pgbench per-message**: `bench_outbox`'s pgbench side, the physical
//!   limit of the per-message design: `pgbench -M prepared` running the
//!   relay's and the handler's statements for `--pgbench-seconds`;
//! - **pgbench batched 64**: the same statements, 64 messages' worth in one
//!   transaction, and one claim per 64 × handlers messages: the limit of
//!   `commit_batch(64)`. A pgbench run whose clients ran past the coupons
//!   created for it (one client running ahead on a busy machine) says so
//!   and runs again on twice the rows;
//! - **idem hot row per-message / batched 16**: the same service where
//!   every message also takes one unit off one shared stock counter (one
//!   row every handler updates, last in its body): batches meet each other
//!   on that row, and `commit_batch` must not fall behind per-message;
//! - **idem 10 hot rows per-message / batched 16**: an order service whose
//!   messages each take one unit off one of 10 stock rows (scattered by
//!   coupon), so every batch takes several hot rows in an order no other
//!   batch shares: batches wait on one another and deadlock, and each such
//!   conflict must cost no attempt and little time (`--hot-only` runs just
//!   the hot-row variants);
//! - **sqlxmq, River, graphile_worker, apalis**: the job queues a peer
//!   would pick (sqlxmq 0.6, River's Rust client `riverqueue`,
//!   `graphile_worker`, apalis with `apalis-postgres`, from crates.io),
//!   each running the same work in its own harness (`benches/peers`, built
//!   here on first use: it is its own workspace, since the peers' sqlx 0.8
//!   and idem's sqlx 0.9 cannot share one lockfile's libsqlite3-sys), then
//!   River's, graphile_worker's and apalis's no-op burn-down (jobs that do
//!   nothing), the figure their own benchmarks publish (`--no-peers` leaves
//!   them all out);
//!
//! then the embedded default, the same drain on a SQLite file, each mode
//! beside its anchor: a hand-written sqlx loop running idem's own SQLite
//! statements (claim, lease, the handler's transaction) on one connection,
//! in a task on the runtime's workers as the relay's handlers run, claiming
//! 64 messages at a time; idem's relay, per message, has 4 handlers
//! (`--sqlite-concurrency`) and claims up to 64 too: 60 ahead of them
//! (`--sqlite-claim-ahead`, `Relay::claim_ahead`); batched, one batch at a
//! time, it claims up to 64 as well (batched 16: four batches, three of
//! them ahead). `--sqlite-only` runs just these. Each run is
//! checked in the database (every coupon `USED` with exactly one ledger
//! row). Printed: msg/s, the ratios to both pgbench runs and to the fastest
//! peer, CPU µs per message (on SQLite each side's, in its round lines:
//! the whole cost, SQLite runs in process), and each target met or missed;
//! written:
//! the chart `docs/bench.svg`. Then the enqueue→effect latency at a light
//! steady load (`--latency-rate`, 200 msg/s, for `--latency-seconds`),
//! push wake-up on and off (`bench_latency` measures it at length), and
//! the enqueue throughput of 8 and 32 producers with push on and off
//! (`bench_enqueue` at length); then the HTTP layer's anchor: `wrk`
//! (Debian's package) against one axum handler, plain and behind the
//! `Idempotency-Key` layer, with new keys and with replays
//! (`--http-seconds`, `--http-only`).
//!
//! `--scale` adds the cost as the queue grows: the p50 of the relay's
//! claim statement and the drain rate with 1M pending messages against 10k
//! and the duplicate check (a `record` call whose key exists) with 10M
//! records against 10k (`--scale-records`); `--scale-only` runs just that
//! (the 1M queue fills in a minute or so, the 10M records in a few).
//!
//! ```text
//! cargo run --release -p idem-examples --bin bench_peers
//! cargo run --release -p idem-examples --bin bench_peers -- --messages 5000 --pgbench-seconds 5
//! cargo run --release -p idem-examples --bin bench_peers -- --scale-only
//! ```

mod args;
mod chart;
mod http;
mod peer;
mod scale;
mod sqlite;

use args::Args;
use chart::Bar;
use clap::Parser;
use idem_examples::bench::outbox::{
    BoxError, Commits, Rows, Setup, best, idem_run, pgbench_rows, pgbench_run, prepare,
};
use peer::Peer;
use sqlx::postgres::PgPoolOptions;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// What one variant runs.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Variant {
    /// idem's relay, committing as given, the handlers writing the rows
    /// given.
    Idem(Commits, Rows),
    /// pgbench running the handlers' statements, this many messages per
    /// transaction.
    Pgbench(u32),
    /// A job queue's own harness (benches/peers); `true`: its no-op
    /// burn-down (jobs that do nothing).
    Peer(Peer, bool),
}

/// The PostgreSQL variants, in the order they run.
const VARIANTS: &[(&str, Variant)] = &[
    (
        "idem per-message",
        Variant::Idem(Commits::PerMessage, Rows::Own),
    ),
    (
        "idem batched 16",
        Variant::Idem(Commits::Batched(16), Rows::Own),
    ),
    (
        "idem batched 64",
        Variant::Idem(Commits::Batched(64), Rows::Own),
    ),
    ("pgbench per-message", Variant::Pgbench(1)),
    ("pgbench batched 64", Variant::Pgbench(64)),
    ("sqlxmq", Variant::Peer(Peer::Sqlxmq, false)),
    ("River", Variant::Peer(Peer::River, false)),
    ("graphile_worker", Variant::Peer(Peer::Graphile, false)),
    ("apalis", Variant::Peer(Peer::Apalis, false)),
    ("River no-op", Variant::Peer(Peer::River, true)),
    ("graphile_worker no-op", Variant::Peer(Peer::Graphile, true)),
    ("apalis no-op", Variant::Peer(Peer::Apalis, true)),
    (
        HOT_PER_MESSAGE,
        Variant::Idem(Commits::PerMessage, Rows::Hot),
    ),
    (HOT_BATCHED, Variant::Idem(Commits::Batched(16), Rows::Hot)),
    (
        HOT_ROWS_PER_MESSAGE,
        Variant::Idem(Commits::PerMessage, Rows::HotRows(10)),
    ),
    (
        HOT_ROWS_BATCHED,
        Variant::Idem(Commits::Batched(16), Rows::HotRows(10)),
    ),
];

/// The hot-row variants: every handler also decrements one shared stock
/// counter.
const HOT_PER_MESSAGE: &str = "idem hot row per-message";
const HOT_BATCHED: &str = "idem hot row batched 16";
/// The order service: each message takes one unit off one of 10 stock
/// rows, so concurrent batches take them in varying order (and deadlock).
const HOT_ROWS_PER_MESSAGE: &str = "idem 10 hot rows per-message";
const HOT_ROWS_BATCHED: &str = "idem 10 hot rows batched 16";

#[tokio::main]
async fn main() -> ExitCode {
    match run().await {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

/// The workspace root (the examples crate's parent).
fn workspace() -> PathBuf {
    let examples = Path::new(env!("CARGO_MANIFEST_DIR"));
    examples.parent().unwrap_or(examples).to_path_buf()
}

fn ratio(a: f64, b: Option<f64>) -> String {
    match b {
        Some(b) if b > 0.0 => format!("{:.2}×", a / b),
        _ => "-".into(),
    }
}

async fn run() -> Result<ExitCode, BoxError> {
    let opts = Args::parse().check()?;
    idem_examples::bench::warn_if_debug("bench_peers");
    if opts.sqlite_only {
        let rows = sqlite::variants(&opts).await?;
        sqlite::report(&rows, opts.sqlite_concurrency);
        return Ok(ExitCode::SUCCESS);
    }
    let Some(url) = idem_examples::bench::reachable_postgres().await else {
        return Ok(ExitCode::FAILURE);
    };
    let setup = Setup {
        messages: opts.messages,
        concurrency: opts.concurrency,
        batch: opts.batch,
        pgbench: opts.pgbench.clone(),
    };
    if opts.http_only {
        http::run(&opts, &url).await?;
        return Ok(ExitCode::SUCCESS);
    }
    if !opts.scale_only {
        peers(&opts, &setup, &url).await?;
        if opts.latency_seconds > 0 {
            latency(&opts, &url).await?;
        }
        if opts.enqueue_messages > 0 {
            enqueue(&opts, &url).await?;
        }
        if opts.http_seconds > 0 {
            http::run(&opts, &url).await?;
        }
    }
    if opts.scale {
        let c = opts.concurrency;
        println!();
        println!(
            "cost as the queue grows: {} vs {} pending messages; the relay's claim of {} \
             ({} claims timed, rolled back), then {} messages drained off each ({c} handlers)",
            opts.scale_large, opts.scale_small, opts.batch, opts.scale_claims, opts.scale_drain
        );
        let [s, l] = scale::scale(
            &url,
            &setup,
            opts.scale_small,
            opts.scale_large,
            opts.scale_drain,
            opts.scale_claims,
        )
        .await?;
        println!(
            "{:>10}{:>10}{:>12}{:>12}{:>12}",
            "pending", "fill", "claim p50", "claim p90", "drain msg/s"
        );
        for q in [&s, &l] {
            println!(
                "{:>10}{:>9.1}s{:>10.3}ms{:>10.3}ms{:>12.0}",
                q.pending,
                q.fill.as_secs_f64(),
                q.claim_p50_ms,
                q.claim_p90_ms,
                q.drain_rate
            );
        }
        println!(
            "ratio {}/{}: claim p50 {:.2}, drain time per message {:.2} (target ≤ 1.2)",
            l.pending,
            s.pending,
            l.claim_p50_ms / s.claim_p50_ms,
            s.drain_rate / l.drain_rate
        );
        if opts.scale_records > 0 {
            records(
                &url,
                opts.scale_small,
                opts.scale_records,
                opts.scale_record_calls,
            )
            .await?;
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// The duplicate check with `large` records against `small`, in
/// alternating rounds (as `bench_archive` measures it).
async fn records(url: &str, small: i64, large: i64, calls: u64) -> Result<(), BoxError> {
    use idem_examples::bench::records::{compare, drop_schema, fill, schema_pool};
    println!();
    println!(
        "the duplicate check as the record table grows: {large} vs {small} records, \
         {calls} checks per table in each of 3 alternating rounds"
    );
    let (ss, ls) = ("bench_peers_rec_small", "bench_peers_rec_large");
    let small_pool = schema_pool(url, ss).await.map_err(|e| e.to_string())?;
    let large_pool = schema_pool(url, ls).await.map_err(|e| e.to_string())?;
    for (pool, rows) in [(&small_pool, small), (&large_pool, large)] {
        let took = fill(pool, rows).await.map_err(|e| e.to_string())?;
        println!("  {rows} records filled in {:.1}s", took.as_secs_f64());
    }
    let (mut s, mut l) = compare(
        (&small_pool, small),
        (&large_pool, large),
        calls,
        3,
        |_, _, _| {},
    )
    .await
    .map_err(|e| e.to_string())?;
    println!(
        "  {small} records: mean {:.3} ms, p99 {:.3} ms; {large} records: mean {:.3} ms, p99 {:.3} ms",
        s.mean(),
        s.p99(),
        l.mean(),
        l.p99()
    );
    println!(
        "ratio {large}/{small}: mean {:.2}, p99 {:.2} (target ≤ 1.2)",
        l.mean() / s.mean(),
        l.p99() / s.p99()
    );
    small_pool.close().await;
    large_pool.close().await;
    for schema in [ss, ls] {
        drop_schema(url, schema).await.map_err(|e| e.to_string())?;
    }
    Ok(())
}

/// Enqueue→effect latency at a light steady load, push wake-up on and
/// off (the relay polling every 100 ms), side by side.
async fn latency(opts: &Args, url: &str) -> Result<(), BoxError> {
    use idem_examples::bench::latency::{Steady, line, run};
    let steady = Steady {
        url: url.to_string(),
        rate: opts.latency_rate,
        seconds: opts.latency_seconds,
        poll_ms: 100,
    };
    println!();
    println!(
        "enqueue→effect latency: {} msg/s for {} s per mode, the relay polling every 100 ms",
        steady.rate, steady.seconds
    );
    let stamp = std::process::id();
    for push in [true, false] {
        let mode = if push { "push on" } else { "push off" };
        let l = run(&steady, push, &format!("peers.{stamp}.{push}"))
            .await
            .map_err(|e| e.to_string())?;
        println!("  {}", line(mode, &l));
    }
    println!("  (target: p50 ≤ 10 ms with push wake-up)");
    Ok(())
}

/// Enqueue throughput with push wake-up on and off, and each producer's
/// statement notifying, best of `--rounds` (`bench_enqueue` at length).
async fn enqueue(opts: &Args, url: &str) -> Result<(), BoxError> {
    use idem_examples::bench::latency::enqueue_compare;
    println!();
    println!(
        "enqueue throughput: {} messages per mode and round, a transaction each, a relay draining",
        opts.enqueue_messages
    );
    let prefix = format!("peers.enqueue.{}", std::process::id());
    let rates = enqueue_compare(
        url,
        &prefix,
        &opts.enqueue_producers,
        opts.enqueue_messages,
        opts.rounds,
    )
    .await
    .map_err(|e| e.to_string())?;
    for r in &rates {
        println!("{}", r.line());
    }
    println!("  (target: on/off ≥ 0.95 at 8 and 32 producers)");
    Ok(())
}

async fn peers(opts: &Args, setup: &Setup, url: &str) -> Result<(), BoxError> {
    let c = opts.concurrency;
    if !Path::new(&opts.pgbench).exists() {
        return Err(format!(
            "pgbench not found at {} (install postgresql-client, or pass --pgbench PATH)",
            opts.pgbench
        )
        .into());
    }
    let admin = PgPoolOptions::new().max_connections(2).connect(url).await?;
    prepare(&admin).await?;
    let dir = std::env::temp_dir().join(format!("bench_peers.{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    println!(
        "peers on PostgreSQL: {} messages per run, {c} handlers / clients, claims of {}; \
         pgbench -M prepared for {} s; sqlxmq concurrency {}..{c}",
        opts.messages, opts.batch, opts.pgbench_seconds, opts.sqlxmq_min
    );
    // The pgbench rates seen so far (per message, batched), to size its
    // rows.
    let mut expected = [20_000.0f64, 80_000.0];
    if !opts.no_warmup {
        let r = idem_run(
            &admin,
            url,
            setup,
            opts.messages.min(2000),
            "warmup",
            Commits::PerMessage,
            Rows::Own,
        )
        .await?;
        let p = pgbench_run(
            &admin,
            url,
            setup,
            2,
            pgbench_rows(expected[0], 2, setup),
            1,
            &dir,
        )
        .await?;
        expected[0] = p.rate;
        println!(
            "warm-up (not counted): idem {:.0} msg/s, pgbench {:.0} msg/s",
            r.rate, p.rate
        );
    }

    let mut runs: Vec<(&str, Vec<f64>)> = Vec::new();
    for round in 1..=opts.rounds {
        for &(name, v) in VARIANTS {
            if opts.hot_only && !matches!(v, Variant::Idem(_, Rows::Hot | Rows::HotRows(_))) {
                continue;
            }
            // msg/s, and CPU µs per message: the client's, the rest's.
            let (rate, cpu) = match v {
                Variant::Idem(commits, rows) => {
                    let r =
                        idem_run(&admin, url, setup, opts.messages, name, commits, rows).await?;
                    if r.shrinks > 0 {
                        println!(
                            "  round {round}: {name}: {} batches lost a conflict (size halved)",
                            r.shrinks
                        );
                    }
                    (r.rate, Some((r.client_us, Some(r.server_us))))
                }
                Variant::Pgbench(per_tx) => {
                    // Sized on the fastest rate of this kind seen so far.
                    let seen = &mut expected[usize::from(per_tx > 1)];
                    let n = pgbench_rows(*seen, opts.pgbench_seconds, setup);
                    let p = pgbench_run(&admin, url, setup, opts.pgbench_seconds, n, per_tx, &dir)
                        .await?;
                    *seen = seen.max(p.rate);
                    (p.rate, Some((p.client_us, Some(p.server_us))))
                }
                Variant::Peer(Peer::Sqlxmq, _) if opts.no_sqlxmq => continue,
                Variant::Peer(_, _) if opts.no_peers => continue,
                Variant::Peer(peer, noop) => {
                    let r = peer::run(url, opts, peer, noop).await?;
                    (r.rate, r.cpu_us.map(|us| (us, None)))
                }
            };
            match cpu {
                Some((client, Some(server))) => println!(
                    "  round {round}: {name:<26}{rate:>8.0} msg/s   CPU per message: client \
                     {client:>5.0} µs, server {server:>5.0} µs"
                ),
                Some((client, None)) => println!(
                    "  round {round}: {name:<26}{rate:>8.0} msg/s   CPU per message: client \
                     {client:>5.0} µs (its drain)"
                ),
                None => println!("  round {round}: {name:<26}{rate:>8.0} msg/s"),
            }
            match runs.iter_mut().find(|r| r.0 == name) {
                Some(r) => r.1.push(rate),
                None => runs.push((name, vec![rate])),
            }
        }
    }
    let rows: Vec<(&str, f64)> = runs.iter().map(|(n, v)| (*n, best(v))).collect();
    let _ = std::fs::remove_dir_all(&dir);
    admin.close().await;

    let sqlite_rows = match opts.hot_only {
        true => Vec::new(),
        false => sqlite::variants(opts).await?,
    };

    report(opts, &rows, &sqlite_rows);
    if !opts.no_chart {
        write_chart(opts, &rows, &sqlite_rows)?;
    }
    Ok(())
}

/// The peers that run the coupon work (not their no-op burn-downs).
const COUPON_PEERS: [&str; 4] = ["sqlxmq", "River", "graphile_worker", "apalis"];

/// Prints the best rates and each target's ratio.
fn report(opts: &Args, rows: &[(&str, f64)], sqlite_rows: &[(&str, f64)]) {
    let of = |label: &str| rows.iter().find(|r| r.0 == label).map(|r| r.1);
    let (pg, pg64) = (of("pgbench per-message"), of("pgbench batched 64"));
    let peer = COUPON_PEERS
        .iter()
        .filter_map(|p| of(p).map(|r| (*p, r)))
        .max_by(|a, b| a.1.total_cmp(&b.1));
    println!();
    println!(
        "{:<28}{:>8}{:>14}{:>14}{:>20}",
        format!("PostgreSQL (best of {})", opts.rounds),
        "msg/s",
        "/ pgbench 1",
        "/ pgbench 64",
        format!("/ {}", peer.map_or("best peer", |p| p.0)),
    );
    for (name, rate) in rows {
        println!(
            "{name:<28}{rate:>8.0}{:>14}{:>14}{:>20}",
            ratio(*rate, pg),
            ratio(*rate, pg64),
            ratio(*rate, peer.map(|p| p.1))
        );
    }
    sqlite::report(sqlite_rows, opts.sqlite_concurrency);
    let line = |what: &str, a: Option<f64>, b: Option<f64>, target: f64| {
        if let (Some(a), Some(b)) = (a, b) {
            let met = if a / b >= target { "met" } else { "MISSED" };
            println!("{what}: {:.2} (target ≥ {target}: {met})", a / b);
        }
    };
    line(
        "idem per-message / pgbench per-message",
        of("idem per-message"),
        pg,
        0.9,
    );
    line(
        "idem batched 64 / pgbench batched 64",
        of("idem batched 64"),
        pg64,
        0.8,
    );
    if let Some((name, rate)) = peer {
        for mode in ["idem per-message", "idem batched 64"] {
            line(
                &format!("{mode} / {name} (the fastest peer)"),
                of(mode),
                Some(rate),
                1.0,
            );
        }
    }
    for (batched, per) in [
        (HOT_BATCHED, HOT_PER_MESSAGE),
        (HOT_ROWS_BATCHED, HOT_ROWS_PER_MESSAGE),
    ] {
        line(&format!("{batched} / {per}"), of(batched), of(per), 0.9);
    }
}

/// Writes the chart of the PostgreSQL and SQLite rows (`--chart`, or
/// `docs/bench.svg`).
fn write_chart(
    opts: &Args,
    rows: &[(&str, f64)],
    sqlite_rows: &[(&str, f64)],
) -> Result<(), BoxError> {
    let mut bars: Vec<Bar> = rows
        .iter()
        .map(|(name, rate)| Bar {
            group: "PostgreSQL".into(),
            label: (*name).into(),
            rate: *rate,
        })
        .collect();
    bars.extend(sqlite_rows.iter().map(|(name, rate)| Bar {
        group: format!("SQLite, {} handlers", opts.sqlite_concurrency),
        label: (*name).into(),
        rate: *rate,
    }));
    let path = opts
        .chart
        .clone()
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace().join("docs/bench.svg"));
    let note = format!(
        "coupon deduction per message, {} messages, {} handlers, best of {} rounds; made by: \
         cargo run --release -p idem-examples --bin bench_peers -- --rounds {}",
        opts.messages, opts.concurrency, opts.rounds, opts.rounds
    );
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent)?;
    }
    std::fs::write(
        &path,
        chart::svg("idem and its peers: messages per second", &note, &bars),
    )?;
    println!("chart: {}", path.display());
    Ok(())
}
