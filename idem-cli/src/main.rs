//! `idem`: the operator's tool for idem's tables — the data-repair scripts
//! prepared in advance, so an incident is a command, not an improvised
//! `UPDATE`.
//!
//! One binary serves PostgreSQL, MariaDB / MySQL and SQLite (through
//! `sqlx::Any`; the URL's scheme picks the database).
//!
//! Exit codes: 0 success, 1 not found (`record show`, `outbox show`,
//! `request`), 2 usage or
//! configuration error, 3 database error.
// The doc comments of opt.rs are also the `--help` text, where a URL is
// written bare.
#![allow(rustdoc::bare_urls)]

use clap::Parser;
use opt::{Cli, Command, OutboxCommand, RecordCommand};
use output::{Out, human};
use sqlx::any::AnyPoolOptions;
use sqlx::{AnyConnection, AnyPool, Connection};
use std::process::ExitCode;
use std::time::Duration;

mod cmd;
mod opt;
mod output;
mod redact;

use redact::redact;

/// A failure: its message and exit code.
#[derive(Debug)]
pub(crate) struct Fail {
    code: u8,
    msg: String,
}

impl Fail {
    /// Not found (`record show`): exit code 1.
    pub(crate) fn not_found(msg: String) -> Self {
        Fail { code: 1, msg }
    }

    pub(crate) fn usage(msg: impl Into<String>) -> Self {
        Fail {
            code: 2,
            msg: msg.into(),
        }
    }
}

impl From<sqlx::Error> for Fail {
    fn from(e: sqlx::Error) -> Self {
        Fail {
            code: 3,
            msg: format!("database error: {e}"),
        }
    }
}

impl From<idem_runtime::Error> for Fail {
    /// A configuration error (e.g. a pooler in transaction mode without
    /// `--transaction-pooling`) is exit code 2; any other is 3.
    fn from(e: idem_runtime::Error) -> Self {
        let code = match e {
            idem_runtime::Error::Config { .. } => 2,
            _ => 3,
        };
        Fail {
            code,
            msg: e.to_string(),
        }
    }
}

impl From<serde_json::Error> for Fail {
    fn from(e: serde_json::Error) -> Self {
        Fail {
            code: 3,
            msg: format!("cannot write JSON: {e}"),
        }
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("idem: cannot start the async runtime: {e}");
            return ExitCode::from(3);
        }
    };
    match rt.block_on(run(cli)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(f) => {
            eprintln!("idem: {}", f.msg);
            ExitCode::from(f.code)
        }
    }
}

async fn run(cli: Cli) -> Result<(), Fail> {
    if cli.transaction_pooling {
        idem_runtime::pooler::transaction_mode(true);
    }
    let Some(url) = setting(cli.database_url.as_deref()) else {
        let why = if std::env::var_os("DATABASE_URL").is_some() {
            " (DATABASE_URL is set but empty, which counts as unset)"
        } else {
            ""
        };
        return Err(Fail::usage(format!(
            "no database URL{why}: pass --database-url or set DATABASE_URL"
        )));
    };
    let connections = match &cli.command {
        Command::Serve(args) => args.connections,
        _ => 2,
    };
    let pool = connect(url, cli.connect_timeout, connections).await?;
    let out = Out { json: cli.json };
    let result = match cli.command {
        Command::Migrate => cmd::migrate::run(&pool, url, out).await,
        Command::Outbox(OutboxCommand::Stats { topic }) => {
            cmd::outbox::stats(&pool, topic.as_deref(), out).await
        }
        Command::Outbox(OutboxCommand::List {
            status,
            topic,
            limit,
        }) => cmd::outbox::list(&pool, status, topic.as_deref(), limit, out).await,
        Command::Outbox(OutboxCommand::Requeue(args)) => {
            cmd::outbox::requeue(&pool, args, out).await
        }
        Command::Outbox(other) => cmd::actions::run(&pool, other, out).await,
        Command::Processes => cmd::request::processes(&pool, out).await,
        Command::Request(args) => cmd::request::show(&pool, &args.key, &args.caller, out).await,
        Command::Archive(args) => cmd::archive::run(&pool, args, out).await,
        Command::Record(RecordCommand::Show { key, biz_type }) => {
            cmd::record::show(&pool, &key, biz_type.as_deref(), out).await
        }
        Command::Serve(args) => cmd::serve::run(&pool, args).await,
    };
    pool.close().await;
    result
}

/// A setting's value, trimmed; `None` when absent, empty or blank:
/// `DATABASE_URL=` (set but empty, common in shells, `.env` and CI files)
/// means unset, not a URL of no characters. (clap hands an empty
/// variable over as an empty value.)
fn setting(value: Option<&str>) -> Option<&str> {
    value.map(str::trim).filter(|v| !v.is_empty())
}

async fn connect(url: &str, timeout: Duration, connections: u32) -> Result<AnyPool, Fail> {
    sqlx::any::install_default_drivers();
    let shown = redact(url);
    let cannot = |e: String| Fail {
        code: 3,
        msg: format!("cannot connect to {shown}: {e}"),
    };
    // One direct attempt first: a refused connection or a bad URL fails at
    // once, where a pool would keep retrying until its time-out.
    match tokio::time::timeout(timeout, AnyConnection::connect(url)).await {
        Err(_) => return Err(cannot(format!("no answer within {}", human(timeout)))),
        Ok(Err(e)) => return Err(cannot(e.to_string())),
        Ok(Ok(conn)) => {
            let _ = conn.close().await;
        }
    }
    AnyPoolOptions::new()
        .max_connections(connections)
        .acquire_timeout(timeout)
        .after_connect(|conn, _| {
            Box::pin(async move {
                if conn.backend_name() == "SQLite" {
                    sqlx::query("PRAGMA busy_timeout = 30000")
                        .execute(&mut *conn)
                        .await?;
                }
                Ok(())
            })
        })
        .connect(url)
        .await
        .map_err(|e| cannot(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_settings_are_unset() {
        assert_eq!(setting(None), None);
        assert_eq!(setting(Some("")), None);
        assert_eq!(setting(Some(" \t")), None);
        assert_eq!(setting(Some(" sqlite://a.db ")), Some("sqlite://a.db"));
    }
}
