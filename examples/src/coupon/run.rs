//! A whole run: the database, the workload, both handlers drained at
//! once under the same faults, the summary.

use super::BoxError;
use super::args::Args;
use super::drain::Drain;
use super::drain::Report;
use super::handlers::Handler;
use super::report::{Reference, Summary, print_summary};
use super::workload::{PRODUCERS, place_orders};
use idem_runtime::Backend;
use idem_runtime::Dialect;
use indicatif::{MultiProgress, ProgressDrawTarget};
use sqlx::any::AnyPoolOptions;
use sqlx::{Any, AnyConnection, AnyPool};
use std::collections::BTreeMap;
use std::io::IsTerminal;
use std::time::{Duration, Instant};

/// Runs the example with `opts`: `Ok(true)` when the `#[idempotent]`
/// handler neither double-deducted nor lost a deduction.
pub async fn run(opts: Args) -> Result<bool, BoxError> {
    opts.check()?;
    sqlx::any::install_default_drivers();
    let (url, location) = match idem_testkit::env_setting("DATABASE_URL").ok_or(()) {
        Ok(url) => (url.clone(), url),
        Err(_) => {
            // A fresh file each run.
            let path = std::env::temp_dir().join("idem-coupon-example.db");
            for suffix in ["", "-wal", "-shm"] {
                let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
            }
            let path = path.display().to_string();
            (format!("sqlite://{path}?mode=rwc"), path)
        }
    };
    let direct = connect(&url, 2 * PRODUCERS as u32 + 2)
        .await
        .map_err(|e| format!("cannot open {location}: {e}"))?;
    let dialect = <Any as Backend>::pool_dialect(&direct);
    let database = match dialect {
        Dialect::Postgres => "PostgreSQL",
        Dialect::MySql => "MariaDB/MySQL",
        _ => "SQLite",
    };
    idem_runtime::migrate(&direct).await?;

    // The fault-free reference: the same workload, the same relays, no
    // acknowledgement lost.
    let reference = if opts.no_reference || opts.lost_ack_rate == 0.0 {
        None
    } else {
        if !opts.json {
            println!("{database}: the fault-free reference drain first");
        }
        let (f, i) = drain_both(&url, &direct, dialect, database, &opts, 0.0).await?;
        Some(Reference {
            fault_version_elapsed_s: f.elapsed_s,
            idempotent_elapsed_s: i.elapsed_s,
        })
    };
    let (fault_version, idempotent) =
        drain_both(&url, &direct, dialect, database, &opts, opts.lost_ack_rate).await?;
    let drain_ratio = reference
        .as_ref()
        .map(|r| idempotent.elapsed_s / r.idempotent_elapsed_s);
    let target_met = drain_ratio.is_none_or(|r| r <= 1.5)
        && idempotent.over_two_attempts_without_failure == 0
        && idempotent.pending == 0;

    let ok = idempotent.double_deductions == 0 && idempotent.lost_deductions == 0;
    let summary = Summary {
        database: database.to_owned(),
        orders: opts.orders,
        relays: opts.relays,
        handlers_per_relay: opts.concurrency,
        lost_ack_rate: opts.lost_ack_rate,
        redelivery_rate: opts.redelivery_rate,
        reference,
        drain_ratio,
        target_met,
        lost_acks_by_kind: lost_acks_by_kind(dialect),
        fault_version,
        idempotent,
        ok,
    };
    if opts.json {
        println!("{}", serde_json::to_string(&summary)?);
    } else {
        print_summary(&summary, &location);
    }
    Ok(ok)
}

/// Places the orders of both handlers (fresh tables) and drains both at
/// once, losing `lost_ack_rate` of the commit acknowledgements.
async fn drain_both(
    url: &str,
    direct: &AnyPool,
    dialect: Dialect,
    database: &str,
    opts: &Args,
    lost_ack_rate: f64,
) -> Result<(Report, Report), BoxError> {
    // The same workload for both handlers, on their own tables and topics.
    if !opts.json {
        println!(
            "{database}: placing {} orders per handler, each committed with its deduction message",
            opts.orders
        );
    }
    let placing = Instant::now();
    // One after the other: on SQLite, one handler's `DROP TABLE` next to
    // the other's `CREATE INDEX` can fail on a connection whose schema is
    // out of date.
    let fault_messages = place_orders(direct, dialect, Handler::FaultVersion, opts).await?;
    let idem_messages = place_orders(direct, dialect, Handler::Idempotent, opts).await?;
    if !opts.json {
        println!(
            "placed in {:.1} s; draining both handlers at once, {} relays each, {:.0}% of \
             acknowledgements lost",
            placing.elapsed().as_secs_f64(),
            opts.relays,
            lost_ack_rate * 100.0
        );
    }

    // The peak: both handlers drained at once, under the same faults.
    let bars = MultiProgress::with_draw_target(if opts.json || !std::io::stderr().is_terminal() {
        ProgressDrawTarget::hidden()
    } else {
        ProgressDrawTarget::stderr()
    });
    if dialect == Dialect::Sqlite {
        idem_runtime::testing::set_lost_ack_rate(lost_ack_rate);
    }
    let started = Instant::now();
    let mut fault = Drain::start(
        url,
        dialect,
        Handler::FaultVersion,
        fault_messages,
        opts,
        lost_ack_rate,
        &bars,
    )
    .await?;
    let mut idem = Drain::start(
        url,
        dialect,
        Handler::Idempotent,
        idem_messages,
        opts,
        lost_ack_rate,
        &bars,
    )
    .await?;
    loop {
        let fault_done = fault.poll(direct, dialect).await?;
        let idem_done = idem.poll(direct, dialect).await?;
        if (fault_done && idem_done) || started.elapsed() >= opts.timeout() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    idem_runtime::testing::set_lost_ack_rate(0.0);
    Ok(tokio::try_join!(
        fault.finish(direct, dialect, opts.orders),
        idem.finish(direct, dialect, opts.orders),
    )?)
}

/// On SQLite, the `testing` hook's lost acknowledgements by kind, over
/// the whole process (both handlers, both drains).
fn lost_acks_by_kind(dialect: Dialect) -> Option<BTreeMap<String, u64>> {
    use idem_runtime::testing::{Kind, lost_acks_on};
    (dialect == Dialect::Sqlite).then(|| {
        Kind::ALL
            .iter()
            .map(|k| (format!("{k:?}").to_lowercase(), lost_acks_on(*k)))
            .collect()
    })
}

/// A pool on `url` (SQLite: write-ahead logging, so readers do not block
/// the writer, and a generous busy timeout, so writers wait their turn).
pub(super) async fn connect(url: &str, max: u32) -> Result<AnyPool, sqlx::Error> {
    connect_with_spares(url, max, 0).await
}

/// [`connect`], keeping at least `min` connections open: one a lost
/// acknowledgement closed is replaced in the background, not when the
/// next statement needs it.
pub(super) async fn connect_with_spares(
    url: &str,
    max: u32,
    min: u32,
) -> Result<AnyPool, sqlx::Error> {
    AnyPoolOptions::new()
        .max_connections(max)
        .min_connections(min)
        .acquire_timeout(Duration::from_secs(30))
        .after_connect(|conn, _| Box::pin(sqlite_settings(conn)))
        .connect(url)
        .await
}

async fn sqlite_settings(conn: &mut AnyConnection) -> Result<(), sqlx::Error> {
    if conn.backend_name() == "SQLite" {
        for pragma in [
            "PRAGMA journal_mode = WAL",
            "PRAGMA synchronous = NORMAL",
            "PRAGMA busy_timeout = 30000",
        ] {
            sqlx::query(pragma).execute(&mut *conn).await?;
        }
    }
    Ok(())
}
