//! `/metrics` (Prometheus text format), `/metrics/database` and `/health`.
//!
//! With [`Console::database_gauges_apart`](crate::Console::database_gauges_apart),
//! the outbox gauges below (`idem_outbox_*`) are served at
//! `/metrics/database` alone and left out of `/metrics`, which keeps the
//! recorder's counters and the console's own health (`idem_console_*`).
//!
//! `/metrics` serves the counters of the recorder the console was given
//! ([`Console::prometheus`](crate::Console::prometheus): idem's counters,
//! see `idem_runtime`'s `metrics` module, and the console's own), then
//! gauges read from the database, put at each scrape into a recorder of
//! their own, so a topic that left the outbox leaves the output too:
//!
//! | gauge | labels | what |
//! |---|---|---|
//! | `idem_outbox_pending` | `topic` | pending messages |
//! | `idem_outbox_failed` | `topic` | dead-lettered messages |
//! | `idem_outbox_success` | `topic` | delivered messages not yet archived |
//! | `idem_outbox_oldest_pending_age_seconds` | `topic` | age of the oldest pending message (0: none) |
//! | `idem_outbox_lease_holders` | | relays holding leases on pending messages |
//! | `idem_console_database_up` | | 1 when the database answered this scrape (a ping and the gauges' reads) |
//! | `idem_console_stale` | | 1 when it did not: the outbox gauges above are the last known, not dropped |
//! | `idem_console_gauges_age_seconds` | | how long ago the outbox gauges were read |
//! | `idem_console_scrape_errors_total` | | scrapes that could not read the database (a counter) |
//!
//! The gauges are read at most once per sampling interval
//! ([`Console::sample_every`](crate::Console::sample_every), 2 s by
//! default), shared with the overview; `idem_outbox_success` is the
//! sampler's last count of the delivered messages, which on a large
//! outbox runs at most a tenth of the time.
//!
//! A scrape waits at most [`METRICS_BUDGET`] (5 s, under Prometheus's
//! default 10 s scrape timeout) for the database, each read at most
//! [`READ_TIMEOUT`](crate::read::READ_TIMEOUT) (3 s, acquiring a
//! connection included) and the ping 3 s, whatever the pool's own acquire
//! timeout: a database that is down or black-holed is reported as
//! `idem_console_database_up 0` in time.

use crate::Shared;
use crate::read::{RETRY_AFTER_SECS, answering};
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use idem_runtime::Operable;
use idem_runtime::outbox::admin::{LeaseHolder, OutboxStats};
use metrics::{Unit, counter, describe_counter, describe_gauge, gauge};
use metrics_exporter_prometheus::PrometheusBuilder;
use std::sync::atomic::Ordering;
use std::time::Duration;

const TEXT_FORMAT: &str = "text/plain; version=0.0.4; charset=utf-8";

/// The longest `/metrics` waits for the database (Prometheus's default
/// scrape timeout is 10 s): past it the scrape answers with the database
/// down and the last known gauges.
pub(crate) const METRICS_BUDGET: Duration = Duration::from_secs(5);

/// What one scrape read: the outbox figures (now, else the last known),
/// and whether the database answered.
struct Read {
    stats: Option<OutboxStats>,
    leases: Option<Vec<LeaseHolder>>,
    age: Option<Duration>,
    stale: bool,
}

/// Which series a page shows.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Part {
    /// The recorder's counters, the console's health, and the database
    /// gauges unless [`Console::database_gauges_apart`](crate::Console::database_gauges_apart).
    Process,
    /// The database gauges alone (`/metrics/database`).
    Database,
}

pub(crate) async fn metrics<DB: Operable>(State(c): State<Shared<DB>>) -> Response {
    let read = read(&c).await;
    let body = render(&c, &read, Part::Process);
    ([(header::CONTENT_TYPE, TEXT_FORMAT)], body).into_response()
}

/// `/metrics/database`: the gauges read from the database, the same
/// whichever console answers (see
/// [`Console::database_gauges_apart`](crate::Console::database_gauges_apart)).
pub(crate) async fn database<DB: Operable>(State(c): State<Shared<DB>>) -> Response {
    let read = read(&c).await;
    let body = render(&c, &read, Part::Database);
    ([(header::CONTENT_TYPE, TEXT_FORMAT)], body).into_response()
}

/// Reads the outbox figures for a scrape, within [`METRICS_BUDGET`].
async fn read<DB: Operable>(c: &Shared<DB>) -> Read {
    // The figures may be one sampling interval old; whether the database
    // answers is asked now, at the same time.
    let reads = tokio::time::timeout(METRICS_BUDGET, async {
        tokio::join!(c.stats(), c.leases())
    });
    let (reads, ping) = tokio::join!(reads, ping(c));
    let (fresh, failure) = match reads {
        Ok((Ok(stats), Ok(leases))) => (Some((stats, leases)), ping.err()),
        Ok((Err(e), _) | (_, Err(e))) => (None, Some(e.to_string())),
        Err(_) => (
            None,
            Some(format!("no answer within {}s", METRICS_BUDGET.as_secs())),
        ),
    };
    if let Some(e) = &failure {
        c.figures.scrape_errors.fetch_add(1, Ordering::Relaxed);
        tracing::warn!(error = %e, "idem console: /metrics could not read the database");
    }
    // The figures read now, else the last known ones, marked stale.
    let stale = failure.is_some();
    match fresh {
        Some((stats, leases)) => {
            let age = c.figures.backlog.last().map(|(_, age)| age);
            Read {
                stats: Some(stats),
                leases: Some(leases),
                age,
                stale,
            }
        }
        None => {
            let (stats, leases) = c.last_figures();
            let age = stats.as_ref().map(|(_, age)| *age);
            Read {
                stats: stats.map(|(s, _)| s),
                leases,
                age,
                stale,
            }
        }
    }
}

/// The text of `part` of a scrape that read `r`.
fn render<DB: Operable>(c: &Shared<DB>, r: &Read, part: Part) -> String {
    let database = match part {
        Part::Process => !c.database_gauges_apart,
        Part::Database => true,
    };
    let local = PrometheusBuilder::new().build_recorder();
    metrics::with_local_recorder(&local, || {
        describe();
        if database {
            database_gauges(r);
        }
        if part == Part::Process {
            gauge!("idem_console_database_up").set(if r.stale { 0.0 } else { 1.0 });
            gauge!("idem_console_stale").set(if r.stale { 1.0 } else { 0.0 });
            if let Some(age) = r.age {
                gauge!("idem_console_gauges_age_seconds").set(age.as_secs_f64());
            }
            let errors = c.figures.scrape_errors.load(Ordering::Relaxed);
            counter!("idem_console_scrape_errors_total").absolute(errors);
        }
    });
    let mut body = match (part, &c.prometheus) {
        (Part::Process, Some(h)) => h.render(),
        _ => String::new(),
    };
    if !body.is_empty() && !body.ends_with('\n') {
        body.push('\n');
    }
    body += &local.handle().render();
    body
}

/// The gauges read from the database, into the current recorder.
fn database_gauges(r: &Read) {
    if let Some(s) = &r.stats {
        for t in &s.topics {
            let topic = t.topic.clone();
            gauge!("idem_outbox_pending", "topic" => topic.clone()).set(t.pending as f64);
            gauge!("idem_outbox_failed", "topic" => topic.clone()).set(t.failed as f64);
            gauge!("idem_outbox_success", "topic" => topic.clone()).set(t.success as f64);
            gauge!("idem_outbox_oldest_pending_age_seconds", "topic" => topic)
                .set(t.oldest_pending_age_secs.unwrap_or(0.0));
        }
    }
    if let Some(l) = &r.leases {
        gauge!("idem_outbox_lease_holders").set(l.len() as f64);
    }
}

/// The HELP text and unit of each of the console's own series.
fn describe() {
    describe_gauge!(
        "idem_outbox_pending",
        Unit::Count,
        "Pending outbox messages, per topic."
    );
    describe_gauge!(
        "idem_outbox_failed",
        Unit::Count,
        "Dead-lettered outbox messages, per topic."
    );
    describe_gauge!(
        "idem_outbox_success",
        Unit::Count,
        "Delivered outbox messages not yet archived, per topic."
    );
    describe_gauge!(
        "idem_outbox_oldest_pending_age_seconds",
        Unit::Seconds,
        "Age of the topic's oldest pending outbox message (0 when none)."
    );
    describe_gauge!(
        "idem_outbox_lease_holders",
        Unit::Count,
        "Relays holding leases on pending messages."
    );
    describe_gauge!(
        "idem_console_database_up",
        "1 when the database answered this scrape: its ping and the gauges' reads."
    );
    describe_gauge!(
        "idem_console_stale",
        "1 when this scrape could not read the database: the outbox gauges are the last known."
    );
    describe_gauge!(
        "idem_console_gauges_age_seconds",
        Unit::Seconds,
        "How long ago the outbox gauges were read from the database."
    );
    describe_counter!(
        "idem_console_scrape_errors_total",
        "Scrapes of /metrics that could not read the database."
    );
}

/// Whether the database answers a ping within 3 s (why not, if not): the
/// pages' [`answering`].
async fn ping<DB: Operable>(c: &Shared<DB>) -> Result<(), String> {
    answering(&c.pool).await.map_err(|e| e.to_string())
}

pub(crate) async fn health<DB: Operable>(State(c): State<Shared<DB>>) -> Response {
    let (status, db) = match ping(&c).await {
        Ok(()) => (StatusCode::OK, "up".to_string()),
        Err(e) => (StatusCode::SERVICE_UNAVAILABLE, format!("down: {e}")),
    };
    let body = serde_json::json!({
        "status": if status == StatusCode::OK { "ok" } else { "unavailable" },
        "database": db,
    });
    let mut r = (status, axum::Json(body)).into_response();
    if status != StatusCode::OK {
        r.headers_mut()
            .insert(header::RETRY_AFTER, RETRY_AFTER_SECS.into());
    }
    r
}
