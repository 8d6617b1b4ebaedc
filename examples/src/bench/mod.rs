//! What the benchmark binaries share: the PostgreSQL they measure, checked
//! before anything runs, and a warning when they are not built optimized.

pub mod cpu;
pub mod latency;
pub mod outbox;
pub mod records;

use sqlx::Connection;

/// The benchmarks' database: `DATABASE_URL`, default (also when set but
/// empty) the local PostgreSQL.
pub fn postgres_url() -> String {
    idem_testkit::env_setting("DATABASE_URL")
        .unwrap_or_else(|| "postgres://postgres@127.0.0.1:5432/test".into())
}

/// Warns on stderr when `bin` runs as a debug build.
pub fn warn_if_debug(bin: &str) {
    if cfg!(debug_assertions) {
        eprintln!(
            "warning: a debug build; measure with \
             `cargo run --release -p idem-examples --bin {bin}`"
        );
    }
}

/// The benchmark's PostgreSQL URL, after one plain connection succeeded;
/// otherwise the reason (refused, auth, …) is printed and `None` returned.
pub async fn reachable_postgres() -> Option<String> {
    let url = postgres_url();
    match sqlx::PgConnection::connect(&url).await {
        Ok(conn) => {
            let _ = conn.close().await;
            Some(url)
        }
        Err(e) => {
            eprintln!(
                "PostgreSQL at {url} is unreachable: {e}\n\
                 start it, or point DATABASE_URL at a PostgreSQL server"
            );
            None
        }
    }
}
