//! `idem serve`: the web console of [`idem_console`], on its own.

use crate::Fail;
use crate::opt::{LogFormat, ServeArgs};
use idem_console::Console;
use metrics_exporter_prometheus::PrometheusBuilder;
use sqlx::AnyPool;

pub(crate) async fn run(pool: &AnyPool, args: ServeArgs) -> Result<(), Fail> {
    init_logging(args.log_format);
    // The console's own counters (requeues, refused writes) land here; the
    // outbox gauges are read from the database.
    let prometheus = PrometheusBuilder::new()
        .install_recorder()
        .map_err(|e| Fail {
            code: 3,
            msg: format!("cannot install the metrics recorder: {e}"),
        })?;
    let mut console = Console::new(pool.clone())
        .prometheus(prometheus)
        .outbox_retention(args.outbox_retention)
        .mount_at(&args.path_prefix)
        .map_err(|e| Fail::usage(e.to_string()))?;
    for host in &args.allowed_hosts {
        console = console
            .allowed_host(host)
            .map_err(|e| Fail::usage(e.to_string()))?;
    }
    for origin in &args.public_origins {
        console = console
            .public_origin(origin)
            .map_err(|e| Fail::usage(e.to_string()))?;
    }
    let writable = match args.write_token.as_deref().map(str::trim) {
        Some(token) if !token.is_empty() => {
            console = console
                .write_token(token)
                .map_err(|e| Fail::usage(e.to_string()))?;
            true
        }
        _ => false,
    };
    // Every page reads idem's tables: without them, say so now rather
    // than answer each page with the database's "no such table".
    let missing: Vec<&str> = idem_runtime::existing_tables(pool)
        .await?
        .into_iter()
        .filter_map(|(table, exists)| (!exists).then_some(table))
        .collect();
    if !missing.is_empty() {
        return Err(Fail::usage(format!(
            "the database has no {} table{}: run `idem migrate` on it first",
            missing.join(", "),
            if missing.len() > 1 { "s" } else { "" }
        )));
    }
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .map_err(|e| Fail::usage(format!("cannot listen on {}: {e}", args.listen)))?;
    let addr = listener.local_addr().unwrap_or(args.listen);
    let prefix = args.path_prefix.trim_end_matches('/');
    eprintln!(
        "idem: console on http://{addr}{prefix}/ ({}); Ctrl-C stops it",
        if writable {
            "requeues allowed after signing in with the write token"
        } else {
            "read-only: no write token"
        }
    );
    if !addr.ip().is_loopback() {
        eprintln!(
            "idem: warning: {addr} is reachable from other machines and the console speaks plain \
             HTTP; put it behind a TLS proxy"
        );
    }
    // With the peers' addresses: the sign-in back-off is per client.
    let app = console
        .router()
        .into_make_service_with_connect_info::<std::net::SocketAddr>();
    axum::serve(listener, app)
        .with_graceful_shutdown(stopped())
        .await
        .map_err(|e| Fail {
            code: 3,
            msg: format!("the console stopped: {e}"),
        })?;
    eprintln!("idem: console stopped");
    Ok(())
}

/// The console's events (its requeues, refused sign-ins, the runtime's
/// warnings) on stderr, filtered by `RUST_LOG` (default `info`).
fn init_logging(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let fmt = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(false);
    // A subscriber set already (a test harness): keep it.
    let _ = match format {
        LogFormat::Text => fmt.try_init(),
        LogFormat::Json => fmt.json().try_init(),
    };
}

/// Ctrl-C or SIGTERM.
async fn stopped() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {}
        () = term => {}
    }
}
