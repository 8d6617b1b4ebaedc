//! `/metrics` (Prometheus text format) and `/health`.
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
//! | `idem_console_database_up` | | 1 when the database answered a ping during this scrape |
//!
//! The gauges are read at most once per sampling interval
//! ([`Console::sample_every`](crate::Console::sample_every), 2 s by
//! default), shared with the overview; `idem_outbox_success` is the
//! sampler's last count of the delivered messages, which on a large
//! outbox runs at most a tenth of the time.

use crate::Shared;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use idem_runtime::Backend;
use metrics::{Unit, describe_gauge, gauge};
use metrics_exporter_prometheus::PrometheusBuilder;
use sqlx::Connection;
use std::time::Duration;

const TEXT_FORMAT: &str = "text/plain; version=0.0.4; charset=utf-8";

pub(crate) async fn metrics<DB: Backend>(State(c): State<Shared<DB>>) -> Response {
    let stats = c.stats().await;
    let leases = c.leases().await;
    let local = PrometheusBuilder::new().build_recorder();
    // The figures may be one sampling interval old; whether the database
    // answers is asked now.
    let up = ping(&c).await.is_ok();
    metrics::with_local_recorder(&local, || {
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
            "1 when the database answered this scrape."
        );
        if let Ok(s) = &stats {
            for t in &s.topics {
                let topic = t.topic.clone();
                gauge!("idem_outbox_pending", "topic" => topic.clone()).set(t.pending as f64);
                gauge!("idem_outbox_failed", "topic" => topic.clone()).set(t.failed as f64);
                gauge!("idem_outbox_success", "topic" => topic.clone()).set(t.success as f64);
                gauge!("idem_outbox_oldest_pending_age_seconds", "topic" => topic)
                    .set(t.oldest_pending_age_secs.unwrap_or(0.0));
            }
        }
        if let Ok(l) = &leases {
            gauge!("idem_outbox_lease_holders").set(l.len() as f64);
        }
        gauge!("idem_console_database_up").set(if up { 1.0 } else { 0.0 });
    });
    if let Err(e) = stats.as_ref().map(|_| ()).and(leases.as_ref().map(|_| ())) {
        tracing::warn!(error = %e, "idem console: /metrics could not read the database");
    }
    let mut body = c
        .prometheus
        .as_ref()
        .map(|h| h.render())
        .unwrap_or_default();
    if !body.is_empty() && !body.ends_with('\n') {
        body.push('\n');
    }
    body += &local.handle().render();
    ([(header::CONTENT_TYPE, TEXT_FORMAT)], body).into_response()
}

/// Whether the database answers a ping within 3 s (why not, if not).
async fn ping<DB: Backend>(c: &Shared<DB>) -> Result<(), String> {
    let ping = async {
        let mut conn = c.pool.acquire().await?;
        conn.ping().await
    };
    match tokio::time::timeout(Duration::from_secs(3), ping).await {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => Err(e.to_string()),
        Err(_) => Err("no answer within 3s".into()),
    }
}

pub(crate) async fn health<DB: Backend>(State(c): State<Shared<DB>>) -> Response {
    let (status, db) = match ping(&c).await {
        Ok(()) => (StatusCode::OK, "up".to_string()),
        Err(e) => (StatusCode::SERVICE_UNAVAILABLE, format!("down: {e}")),
    };
    let body = serde_json::json!({
        "status": if status == StatusCode::OK { "ok" } else { "unavailable" },
        "database": db,
    });
    (status, axum::Json(body)).into_response()
}
