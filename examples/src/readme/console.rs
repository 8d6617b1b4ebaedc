//! README, "The web console": the console inside an application, on an
//! admin port of its own, with the application's metrics recorder.

use sqlx::PgPool;

/// Serves the console of `pool` on `addr` in the background (requeues for
/// `token`); returns the address it listens on.
pub async fn serve_console(
    pool: PgPool,
    addr: &str,
    token: String,
) -> Result<std::net::SocketAddr, Box<dyn std::error::Error + Send + Sync>> {
    // README: console
    use idem_console::Console;
    use metrics_exporter_prometheus::PrometheusBuilder;

    // One recorder for the process: /metrics then carries the relay's and the
    // handlers' counters beside the outbox gauges the console reads from the database.
    let prometheus = PrometheusBuilder::new().install_recorder()?;
    let console = Console::new(pool.clone())
        .write_token(token)?                        // without it: read-only
        .prometheus(prometheus);
    let admin = tokio::net::TcpListener::bind(addr).await?;   // an admin port, not the app's
    let at = admin.local_addr()?;
    tokio::spawn(async move { axum::serve(admin, console.router()).await });
    // README: end
    Ok(at)
}

/// The application's router with the console merged in under `/ops/idem`
/// (requeues for `token`).
pub fn app_with_console(
    pool: PgPool,
    token: String,
) -> Result<axum::Router, Box<dyn std::error::Error + Send + Sync>> {
    // README: console-mounted
    use axum::{Router, routing::get};
    use idem_console::Console;

    let console = Console::new(pool)
        .write_token(token)?
        .mount_at("/ops/idem")?;                    // pages, forms, cookie: all under it
    let app = Router::new()
        .route("/", get(|| async { "the application" }))
        .merge(console.router());                   // the overview at /ops/idem/
    // README: end
    Ok(app)
}
