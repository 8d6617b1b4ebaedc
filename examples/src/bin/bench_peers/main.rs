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
//! - **sqlxmq**: the job queue a peer would pick, sqlxmq 0.6 from
//!   crates.io, running the same work in its own harness (`benches/peers`,
//!   built here on first use: it is its own workspace, since its sqlx 0.8
//!   and idem's sqlx 0.9 cannot share one lockfile's libsqlite3-sys);
//!
//! then the embedded default, the same drain on a SQLite file, each mode
//! beside its anchor: a hand-written sqlx loop running idem's own SQLite
//! statements (claim, lease, the handler's transaction) on one connection
//! (`--sqlite-only` runs just these). Each run is
//! checked in the database (every coupon `USED` with exactly one ledger
//! row). Printed: msg/s, and the ratios to pgbench and to sqlxmq; written:
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
mod scale;
mod sqlite;

use args::Args;
use chart::Bar;
use clap::Parser;
use idem_examples::bench::outbox::{
    BoxError, Commits, Rows, Setup, best, idem_run, pgbench_rows, pgbench_run, prepare,
};
use sqlx::postgres::PgPoolOptions;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// What one variant runs.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Variant {
    /// idem's relay, committing as given, the handlers writing the rows
    /// given.
    Idem(Commits, Rows),
    /// pgbench running the per-message statements.
    Pgbench,
    /// sqlxmq's runner (benches/peers).
    Sqlxmq,
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
    ("pgbench per-message", Variant::Pgbench),
    ("sqlxmq", Variant::Sqlxmq),
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

/// Builds benches/peers (release) and runs its sqlxmq drain; its last
/// stdout line is a JSON object with `rate`.
async fn sqlxmq_run(url: &str, opts: &Args) -> Result<f64, BoxError> {
    let manifest = workspace().join("benches/peers/Cargo.toml");
    let status = tokio::process::Command::new(std::env::var("CARGO").unwrap_or("cargo".into()))
        .args(["build", "--release", "--quiet", "--manifest-path"])
        .arg(&manifest)
        .status()
        .await?;
    if !status.success() {
        return Err(format!("cannot build {} ({status})", manifest.display()).into());
    }
    let migrations = sqlxmq_migrations(&manifest).await?;
    let out = tokio::process::Command::new(
        workspace().join("benches/peers/target/release/idem-bench-peers"),
    )
    .arg("--migrations")
    .arg(&migrations)
    .args(["--url", url])
    .args(["--messages", &opts.messages.to_string()])
    .args(["--concurrency", &opts.concurrency.to_string()])
    .args(["--min-concurrency", &opts.sqlxmq_min.to_string()])
    .stderr(std::process::Stdio::inherit())
    .output()
    .await?;
    if !out.status.success() {
        return Err(format!("the sqlxmq run failed ({})", out.status).into());
    }
    let stdout = String::from_utf8_lossy(&out.stdout);
    let last = stdout
        .lines()
        .last()
        .ok_or("no output from the sqlxmq run")?;
    let v: serde_json::Value = serde_json::from_str(last)?;
    v["rate"]
        .as_f64()
        .ok_or_else(|| format!("no rate in the sqlxmq run's output: {last}").into())
}

/// The `migrations` folder of the sqlxmq package the harness builds
/// against, from `cargo metadata` (sqlxmq ships its migrations in its crate
/// for users to apply).
async fn sqlxmq_migrations(manifest: &Path) -> Result<PathBuf, BoxError> {
    let out = tokio::process::Command::new(std::env::var("CARGO").unwrap_or("cargo".into()))
        .args(["metadata", "--format-version", "1", "--manifest-path"])
        .arg(manifest)
        .output()
        .await?;
    if !out.status.success() {
        return Err(format!(
            "cargo metadata for {} failed ({})",
            manifest.display(),
            out.status
        )
        .into());
    }
    let meta: serde_json::Value = serde_json::from_slice(&out.stdout)?;
    let sqlxmq = meta["packages"]
        .as_array()
        .and_then(|ps| ps.iter().find(|p| p["name"] == "sqlxmq"))
        .and_then(|p| p["manifest_path"].as_str())
        .ok_or("cargo metadata lists no sqlxmq package")?;
    Ok(Path::new(sqlxmq)
        .parent()
        .ok_or("sqlxmq's manifest has no folder")?
        .join("migrations"))
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
    let mut expected = 20_000.0f64;
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
            pgbench_rows(expected, 2, setup),
            &dir,
        )
        .await?;
        expected = p.rate;
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
                    (r.rate, Some((r.client_us, r.server_us)))
                }
                Variant::Pgbench => {
                    let n = pgbench_rows(expected, opts.pgbench_seconds, setup);
                    let p = pgbench_run(&admin, url, setup, opts.pgbench_seconds, n, &dir).await?;
                    expected = expected.max(p.rate);
                    (p.rate, Some((p.client_us, p.server_us)))
                }
                Variant::Sqlxmq if opts.no_sqlxmq => continue,
                Variant::Sqlxmq => (sqlxmq_run(url, opts).await?, None),
            };
            match cpu {
                Some((client, server)) => println!(
                    "  round {round}: {name:<26}{rate:>8.0} msg/s   CPU per message: client \
                     {client:>5.0} µs, server {server:>5.0} µs"
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

    let of = |label: &str| rows.iter().find(|r| r.0 == label).map(|r| r.1);
    let (pg, mq) = (of("pgbench per-message"), of("sqlxmq"));
    println!();
    println!(
        "{:<28}{:>8}{:>12}{:>12}",
        format!("PostgreSQL (best of {})", opts.rounds),
        "msg/s",
        "/ pgbench",
        "/ sqlxmq"
    );
    for (name, rate) in &rows {
        println!(
            "{name:<28}{rate:>8.0}{:>12}{:>12}",
            ratio(*rate, pg),
            ratio(*rate, mq)
        );
    }
    sqlite::report(&sqlite_rows, opts.sqlite_concurrency);
    if let (Some(i), Some(p)) = (of("idem per-message"), pg) {
        println!("idem per-message / pgbench: {:.2} (target ≥ 0.9)", i / p);
    }
    for b in ["idem batched 16", "idem batched 64"] {
        if let (Some(r), Some(p)) = (of(b), pg) {
            print!("{b} / pgbench: {:.2} (target ≥ 2.0)", r / p);
            if let Some(m) = mq {
                print!(", / sqlxmq: {:.2} (target ≥ 4)", r / m);
            }
            println!();
        }
    }

    for (batched, per) in [
        (HOT_BATCHED, HOT_PER_MESSAGE),
        (HOT_ROWS_BATCHED, HOT_ROWS_PER_MESSAGE),
    ] {
        if let (Some(b), Some(p)) = (of(batched), of(per)) {
            println!("{batched} / {per}: {:.2} (target ≥ 0.9)", b / p);
        }
    }

    if !opts.no_chart {
        write_chart(opts, &rows, &sqlite_rows)?;
    }
    Ok(())
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
