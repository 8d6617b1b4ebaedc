//! # Benchmark: outbox end-to-end throughput against `pgbench` running the same statements
//!
//! **idem side.** N coupons are created, each in its own transaction that
//! also enqueues its "deduct this coupon" message with
//! [`idem_runtime::outbox::enqueue`] (timed, but apart). Then a
//! [`Relay`](idem_runtime::outbox::Relay) is started on the run's own topic, routed to an
//! `#[idempotent(strategy = state_machine)]` handler whose body inserts the
//! ledger row; the clock runs from the relay's start until its counters
//! show N messages handled (read every millisecond, no query), then the
//! relay is shut down. The database is then checked: N messages `success`,
//! every coupon `USED` with exactly one ledger row.
//!
//! **pgbench side.** The physical limit of this database on this machine for
//! the same work: `pgbench -M prepared` with as many clients as the relay
//! has handlers, running the statements the relay and the handler issue per
//! message, on its own copies of the tables (same DDL, the outbox table
//! rendered from idem's own schema, the claim from idem's own
//! `Dialect::claim_sql`, the lock and transition from `Dialect::state_sql`):
//!
//! - script 1, one message (weight `batch`): `BEGIN`; `SELECT status … FOR
//!   UPDATE`; the ledger `INSERT`; the guarded `UPDATE` of the coupon; the
//!   outbox `UPDATE … SET status = 'success'`; `COMMIT` (the handler marks
//!   its own message, so the relay issues no fallback update);
//! - script 2, one claim (weight 1): `BEGIN`; `SET LOCAL synchronous_commit
//!   = off` (as the relay's claim); `UPDATE idem_outbox … FROM (SELECT … FOR
//!   UPDATE SKIP LOCKED LIMIT batch) … RETURNING`; `COMMIT`.
//!
//! so one claim per `batch` messages, the amortization the relay is
//! configured for. The message rate is script 1's tps.
//!
//! Each pgbench transaction works on a coupon and a message of its own, in
//! queue order: a per-client counter `k` (pgbench variables persist across
//! a client's transactions; `-D k=0` starts it) gives client `c` the ids
//! `c+1, c+1+C, c+1+2C, …`, so the C clients walk the queue together, the
//! way the relay's handlers do, and no transaction lands on a coupon that is
//! already `USED` (which `random(1, N)` would do, cheaply, distorting the
//! limit). Enough rows are created beforehand (sized from the rate seen so
//! far); afterwards the database is checked: as many coupons `USED`, ledger
//! rows and delivered messages as script-1 transactions, none twice.
//!
//! The two sides alternate, A B A B (after an unmeasured warm-up of each),
//! and the ratio idem/pgbench of the best runs is the result (target ≥ 0.7).
//! The idem runs also report where their statements went: claims per
//! message (from the statistics of the outbox's due index) and how busy the
//! handler slots were.
//!
//! ```text
//! cargo run --release -p idem-examples --bin bench_outbox
//! cargo run --release -p idem-examples --bin bench_outbox -- --messages 20000 --concurrency 16 --batch 16 --pgbench-seconds 10
//! ```
//!
//! `DATABASE_URL` defaults to `postgres://postgres@127.0.0.1:5432/test`
//! (pgbench gets the same URL). Other options: `--rounds R` (default 2),
//! `--pgbench PATH` (default `/usr/bin/pgbench`), `--no-warmup`,
//! `--show-scripts` (print the two pgbench scripts).
//!
//! Defaults: 16 handlers (the relay's default; on this 2-core machine the
//! work is bound by the WAL flush of each commit, not by the CPU, and
//! pgbench peaks around 16 clients), and batches of as many messages as
//! there are handlers: the relay never claims more than it has free
//! handlers, so a larger batch changes nothing on the idem side and would
//! only flatter pgbench's amortization.

mod args;

use args::Args;
use clap::Parser;
use idem_examples::bench::outbox::{
    BoxError, Commits, Rows, Setup, best, idem_run, median, pgbench_rows, pgbench_run,
    pgbench_scripts, prepare,
};
use sqlx::postgres::PgPoolOptions;
use std::process::ExitCode;

// ---- main ----------------------------------------------------------------------------

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

async fn run() -> Result<ExitCode, BoxError> {
    let opts = Args::parse().check()?;
    idem_examples::bench::warn_if_debug("bench_outbox");
    let Some(url) = idem_examples::bench::reachable_postgres().await else {
        return Ok(ExitCode::FAILURE);
    };
    if !std::path::Path::new(&opts.pgbench).exists() {
        eprintln!(
            "pgbench not found at {} (install postgresql-client, or pass --pgbench PATH)",
            opts.pgbench
        );
        return Ok(ExitCode::FAILURE);
    }
    let admin = PgPoolOptions::new()
        .max_connections(2)
        .connect(&url)
        .await?;
    prepare(&admin).await?;
    let setup = Setup {
        messages: opts.messages,
        concurrency: opts.concurrency,
        batch: opts.batch,
        pgbench: opts.pgbench.clone(),
    };
    let dir = std::env::temp_dir().join(format!("bench_outbox.{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;

    let c = opts.concurrency;
    println!(
        "outbox benchmark on PostgreSQL: {} messages per idem run, relay with {c} handlers and \
         batches of {}; pgbench -M prepared -c {c} -j {} for {} s, one claim per {} messages",
        opts.messages,
        opts.batch,
        c.min(2),
        opts.pgbench_seconds,
        opts.batch
    );
    println!(
        "per message: handler BEGIN, SELECT … FOR UPDATE, INSERT ledger, UPDATE coupon, \
         UPDATE outbox, COMMIT; per claim BEGIN, SET LOCAL synchronous_commit = off, \
         UPDATE … RETURNING, COMMIT"
    );

    if opts.show_scripts {
        let (message, claim) = pgbench_scripts(1);
        println!("pgbench script 1 (weight {}):\n{message}", opts.batch);
        println!("pgbench script 2 (weight 1):\n{claim}");
    }

    // The rate pgbench is expected to reach, to size its data.
    let mut expected = 20_000.0f64;
    if opts.warmup() {
        let r = idem_run(
            &admin,
            &url,
            &setup,
            opts.messages.min(2000),
            "warmup",
            Commits::PerMessage,
            Rows::Own,
        )
        .await?;
        let p = pgbench_run(
            &admin,
            &url,
            &setup,
            2,
            pgbench_rows(expected, 2, &setup),
            1,
            &dir,
        )
        .await?;
        expected = p.rate;
        println!(
            "warm-up (not counted): idem {:.0} msg/s, pgbench {:.0} msg/s",
            r.rate, p.rate
        );
    }

    println!();
    println!(
        "{:<11}{:>8}{:>11}{:>9}{:>11}{:>11}{:>10}{:>12}{:>7}",
        "run", "msg/s", "enqueue/s", "time", "claims/msg", "msgs/claim", "claim", "message", "busy"
    );
    let (mut idem_rates, mut pg_rates) = (Vec::new(), Vec::new());
    let mut last_idem = None;
    for round in 1..=opts.rounds {
        let r = idem_run(
            &admin,
            &url,
            &setup,
            opts.messages,
            &round.to_string(),
            Commits::PerMessage,
            Rows::Own,
        )
        .await?;
        println!(
            "{:<11}{:>8.0}{:>11.0}{:>8.2}s{:>11.3}{:>11.1}{:>8.2}ms{:>10.2}ms{:>6.0}%",
            format!("A{round} idem"),
            r.rate,
            opts.messages as f64 / r.enqueue.as_secs_f64(),
            r.drain.as_secs_f64(),
            r.claims_per_msg,
            1.0 / r.claims_per_msg,
            r.claim_period.as_secs_f64() * 1e3,
            r.handler_avg.as_secs_f64() * 1e3,
            r.utilization * 100.0
        );
        idem_rates.push(r.rate);
        last_idem = Some(r);
        let rows = pgbench_rows(expected, opts.pgbench_seconds, &setup);
        let p = pgbench_run(&admin, &url, &setup, opts.pgbench_seconds, rows, 1, &dir).await?;
        expected = expected.max(p.rate);
        println!(
            "{:<11}{:>8.0}{:>11}{:>8}s{:>11.3}{:>11.1}{:>8.2}ms{:>10.2}ms{:>7}",
            format!("B{round} pgbench"),
            p.rate,
            "-",
            opts.pgbench_seconds,
            p.claims as f64 / p.messages as f64,
            p.messages as f64 / p.claims.max(1) as f64,
            p.claim_latency_ms,
            p.message_latency_ms,
            "-"
        );
        pg_rates.push(p.rate);
    }
    let _ = std::fs::remove_dir_all(&dir);

    let (ib, pb) = (best(&idem_rates), best(&pg_rates));
    let (im, pm) = (median(idem_rates), median(pg_rates));
    println!();
    println!("idem     best {ib:>7.0} msg/s   median {im:>7.0} msg/s");
    println!("pgbench  best {pb:>7.0} msg/s   median {pm:>7.0} msg/s");
    if let Some(r) = last_idem {
        println!(
            "last idem run: {:.1} messages per claim (configured: up to {}), one claim every \
             {:.2} ms, {:.2} committed transactions per message, handler call {:.2} ms on \
             average, handler slots {:.0}% busy",
            1.0 / r.claims_per_msg,
            opts.batch,
            r.claim_period.as_secs_f64() * 1e3,
            r.commits_per_msg,
            r.handler_avg.as_secs_f64() * 1e3,
            r.utilization * 100.0
        );
    }
    println!("median ratio idem/pgbench: {:.2}", im / pm);
    println!("ratio idem/pgbench: {:.2}", ib / pb);
    Ok(ExitCode::SUCCESS)
}
