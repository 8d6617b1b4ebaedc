//! The migration's primitives (the stores of the calls, the outbox and
//! the requests are in the backend module; those of archiving and the
//! operator's queries are in `idem-ops`).

use sqlx::{Database, Pool};
use std::future::Future;

/// The migration's two primitives, on the connection that holds the
/// migration's lock (see `idem_runtime::migrate`).
pub trait Migrate: Database {
    /// Runs one statement on a connection; returns the rows it changed.
    fn execute_on<'a>(
        conn: &'a mut Self::Connection,
        sql: &'a str,
    ) -> impl Future<Output = Result<u64, sqlx::Error>> + Send + 'a;

    /// Runs a query answering one integer on a connection.
    fn fetch_i64<'a>(
        conn: &'a mut Self::Connection,
        sql: &'a str,
    ) -> impl Future<Output = Result<i64, sqlx::Error>> + Send + 'a;

    /// Whether `table` (a plain identifier) exists and can be read.
    fn table_exists<'a>(
        pool: &'a Pool<Self>,
        table: &'a str,
    ) -> impl Future<Output = Result<bool, sqlx::Error>> + Send + 'a;
}
