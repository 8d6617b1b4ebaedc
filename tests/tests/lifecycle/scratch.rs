//! Private databases for the lifecycle tests, each backend's own: a fresh
//! PostgreSQL schema (the pool's `search_path`), a fresh MariaDB database,
//! a fresh SQLite file; empty, so a test decides what idem tables it holds
//! (none, an older version, the current one) and may rename them away
//! without touching any other test's tables.

use idem_runtime::Backend;
use idem_testkit::{mysql_url, postgres_url, scratch_file, unique, unreachable};
use sqlx::mysql::{MySqlConnectOptions, MySqlPoolOptions};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions};
use sqlx::{Connection, MySql, Pool, Postgres, Sqlite};
use std::future::Future;
use std::str::FromStr;
use std::time::Duration;

/// A private, empty database of a backend; dropped with [`Scratch::drop`].
pub(crate) trait Scratch: Backend + Sized {
    /// A pool on a fresh, empty schema, and the schema's name; `None`:
    /// the server is down (skipped).
    fn scratch() -> impl Future<Output = Option<(Pool<Self>, String)>> + Send;

    /// Drops the schema made by [`Scratch::scratch`].
    fn drop(name: &str) -> impl Future<Output = ()> + Send;

    /// The statement renaming `from` to `to`.
    fn rename(from: &str, to: &str) -> String {
        format!("ALTER TABLE {from} RENAME TO {to}")
    }
}

fn name() -> String {
    unique("lc").replace('-', "_").to_lowercase()
}

impl Scratch for Postgres {
    async fn scratch() -> Option<(Pool<Self>, String)> {
        let opts = PgConnectOptions::from_str(&postgres_url()).expect("valid URL");
        let mut admin = match sqlx::PgConnection::connect_with(&opts).await {
            Ok(conn) => conn,
            Err(e) => {
                unreachable(&format!("PostgreSQL at {}", postgres_url()), e);
                return None;
            }
        };
        let schema = name();
        sqlx::raw_sql(sqlx::AssertSqlSafe(format!("CREATE SCHEMA {schema}")))
            .execute(&mut admin)
            .await
            .expect("create schema");
        let pool = PgPoolOptions::new()
            .max_connections(8)
            .acquire_timeout(Duration::from_secs(30))
            .connect_with(opts.options([("search_path", schema.as_str())]))
            .await
            .expect("pool on the schema");
        Some((pool, schema))
    }

    async fn drop(name: &str) {
        let opts = PgConnectOptions::from_str(&postgres_url()).expect("valid URL");
        let mut admin = sqlx::PgConnection::connect_with(&opts)
            .await
            .expect("connect");
        sqlx::raw_sql(sqlx::AssertSqlSafe(format!("DROP SCHEMA {name} CASCADE")))
            .execute(&mut admin)
            .await
            .expect("drop schema");
    }
}

impl Scratch for MySql {
    async fn scratch() -> Option<(Pool<Self>, String)> {
        let opts = MySqlConnectOptions::from_str(&mysql_url()).expect("valid URL");
        let mut admin = match sqlx::MySqlConnection::connect_with(&opts).await {
            Ok(conn) => conn,
            Err(e) => {
                unreachable(&format!("MariaDB at {}", mysql_url()), e);
                return None;
            }
        };
        let db = name();
        sqlx::raw_sql(sqlx::AssertSqlSafe(format!("CREATE DATABASE {db}")))
            .execute(&mut admin)
            .await
            .expect("create database");
        let pool = MySqlPoolOptions::new()
            .max_connections(8)
            .acquire_timeout(Duration::from_secs(30))
            .connect_with(opts.database(&db))
            .await
            .expect("pool on the database");
        Some((pool, db))
    }

    async fn drop(name: &str) {
        let opts = MySqlConnectOptions::from_str(&mysql_url()).expect("valid URL");
        let mut admin = sqlx::MySqlConnection::connect_with(&opts)
            .await
            .expect("connect");
        sqlx::raw_sql(sqlx::AssertSqlSafe(format!("DROP DATABASE {name}")))
            .execute(&mut admin)
            .await
            .expect("drop database");
    }

    fn rename(from: &str, to: &str) -> String {
        format!("RENAME TABLE {from} TO {to}")
    }
}

impl Scratch for Sqlite {
    async fn scratch() -> Option<(Pool<Self>, String)> {
        let db = name();
        let path = scratch_file(&format!("idem-test-{db}.db"));
        let opts = SqliteConnectOptions::new()
            .filename(&path)
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .busy_timeout(Duration::from_secs(30));
        let pool = SqlitePoolOptions::new()
            .max_connections(4)
            .connect_with(opts)
            .await
            .expect("open sqlite file");
        Some((pool, db))
    }

    // The file goes when the test's thread ends (`scratch_file`).
    async fn drop(_name: &str) {}
}
