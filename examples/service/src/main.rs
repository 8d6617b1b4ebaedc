//! A complete service on idem, on embedded SQLite:
//!
//! - `POST /orders` behind the Idempotency-Key layer: a client's retry
//!   gets the stored answer; the order (an `#[idempotent]` record) and its
//!   coupon's deduction message commit in the request's transaction;
//! - a relay delivering the deductions to an `#[idempotent]` state
//!   machine;
//! - logs through `tracing-subscriber` (`RUST_LOG`, `LOG_FORMAT=json`);
//! - traces over OTLP/HTTP when `OTEL_EXPORTER_OTLP_ENDPOINT` is set (an
//!   OpenTelemetry collector, `http://localhost:4318`): each request's
//!   `idempotent_request` span continues the caller's `traceparent`, the
//!   message enqueued carries it, and the relay's `outbox_delivery` span
//!   (`process coupon.deduct` in the collector) and the handler's
//!   `idempotent` span are in the same trace; flushed
//!   at shutdown;
//! - Prometheus metrics at `GET /metrics`, idem's described;
//! - `GET /healthz` for a readiness probe: 503 once the relay ended;
//! - graceful shutdown on SIGTERM or Ctrl-C: the HTTP server stops
//!   accepting and finishes its requests, then the relay finishes its
//!   messages within `SHUTDOWN_GRACE_SECS` (default 20), and the process
//!   exits 0. A message whose handler was cut off at the deadline is
//!   delivered again after the restart, and acts once.
//!
//! ```sh
//! cargo run -p idem-example-service
//! curl -i -X POST localhost:3000/orders -H 'content-type: application/json' \
//!   -H 'x-api-key: demo' -H 'idempotency-key: k1' -d '{"order_id":1,"coupon_id":7}'
//! ```
//!
//! Settings (environment): `DATABASE_URL` (default
//! `sqlite://idem-service.db?mode=rwc`), `BIND` (default `127.0.0.1:3000`;
//! the address it listens on is printed as `listening on ADDR`),
//! `DEDUCT_WORK_MS` (a simulated downstream call per deduction, default 0),
//! `OTEL_EXPORTER_OTLP_ENDPOINT` and the exporter's other standard
//! variables (`OTEL_SERVICE_NAME`, default `idem-example-service`).

mod app;

use app::App;
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_sdk::trace::SdkTracerProvider;
use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tracing_subscriber::filter::LevelFilter;
use tracing_subscriber::layer::SubscriberExt as _;
use tracing_subscriber::util::SubscriberInitExt as _;
use tracing_subscriber::{EnvFilter, Layer as _};

#[tokio::main]
async fn main() -> ExitCode {
    let traces = match init_tracing() {
        Ok(traces) => traces,
        Err(e) => {
            eprintln!("the trace exporter: {e}");
            return ExitCode::FAILURE;
        }
    };
    let code = match run().await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(error = %e, "the service failed");
            ExitCode::FAILURE
        }
    };
    // The spans still in the batch processor go out before the exit.
    if let Some(provider) = traces
        && let Err(e) = provider.shutdown()
    {
        eprintln!("flushing the traces: {e}");
    }
    code
}

/// Logs to stderr, filtered by `RUST_LOG` (default `info`), as JSON lines
/// with `LOG_FORMAT=json`; and, when `OTEL_EXPORTER_OTLP_ENDPOINT` is set,
/// the spans at info level and above to that collector (the provider,
/// to shut down at exit).
fn init_tracing() -> Result<Option<SdkTracerProvider>, Box<dyn std::error::Error>> {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let fmt = tracing_subscriber::fmt::layer().with_writer(std::io::stderr);
    let fmt = match std::env::var("LOG_FORMAT").as_deref() {
        Ok("json") => fmt.json().with_filter(filter).boxed(),
        _ => fmt.with_filter(filter).boxed(),
    };
    let provider = match std::env::var_os("OTEL_EXPORTER_OTLP_ENDPOINT") {
        Some(_) => Some(otlp()?),
        None => None,
    };
    let traces = provider.as_ref().map(|p| {
        tracing_opentelemetry::layer()
            .with_tracer(p.tracer("idem-example-service"))
            .with_filter(LevelFilter::INFO)
    });
    tracing_subscriber::registry()
        .with(fmt)
        .with(traces)
        .try_init()?;
    Ok(provider)
}

/// A tracer provider exporting over OTLP/HTTP (protobuf) in batches, to
/// the endpoint and with the settings of the standard `OTEL_EXPORTER_OTLP_*`
/// variables.
fn otlp() -> Result<SdkTracerProvider, Box<dyn std::error::Error>> {
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .build()?;
    let name = setting("OTEL_SERVICE_NAME", "idem-example-service");
    let resource = opentelemetry_sdk::Resource::builder()
        .with_service_name(name)
        .build();
    Ok(SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_resource(resource)
        .build())
}

fn setting(name: &str, default: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| default.to_owned())
}

async fn run() -> Result<(), Box<dyn std::error::Error>> {
    let prometheus = metrics_exporter_prometheus::PrometheusBuilder::new().install_recorder()?;
    idem_runtime::metrics::describe();

    let url = setting("DATABASE_URL", "sqlite://idem-service.db?mode=rwc");
    let pool = sqlx::sqlite::SqlitePoolOptions::new()
        .max_connections(8)
        .connect(&url)
        .await?;
    idem_runtime::migrate(&pool).await?;
    for table in app::TABLES {
        sqlx::query(table).execute(&pool).await?;
    }

    let work = Duration::from_millis(setting("DEDUCT_WORK_MS", "0").parse()?);
    let relay = Arc::new(Mutex::new(Some(app::relay(&pool, work))));
    let router = app::router(
        &pool,
        App {
            relay: relay.clone(),
            prometheus,
        },
    );

    let listener = tokio::net::TcpListener::bind(setting("BIND", "127.0.0.1:3000")).await?;
    // On stdout, for whoever started the service (its test reads it).
    println!("listening on {}", listener.local_addr()?);
    axum::serve(listener, router)
        .with_graceful_shutdown(stop_signal())
        .await?;
    tracing::info!("HTTP server stopped: no request in flight");

    let grace = Duration::from_secs(setting("SHUTDOWN_GRACE_SECS", "20").parse()?);
    let relay = relay.lock().expect("relay").take().expect("the relay runs");
    let report = relay.shutdown_within(grace).await?;
    tracing::info!(
        finished = report.finished,
        abandoned = ?report.abandoned,
        elapsed = ?report.elapsed,
        "relay stopped"
    );
    pool.close().await;
    Ok(())
}

/// SIGTERM (what an orchestrator sends) or Ctrl-C.
async fn stop_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {}
        _ = term => {}
    }
    tracing::info!("stop signal received: draining");
}
