//! Beginning a transaction that a cancelled caller cannot leave open.
//!
//! sqlx counts a transaction only once the server's reply to `BEGIN` has
//! arrived. A future dropped while `BEGIN` is in flight (a
//! `tokio::time::timeout`, a web framework dropping the request of a client
//! that hung up) would hand its pooled connection back with the server-side
//! transaction open and sqlx unaware of it: later autocommit writes on that
//! connection are never committed, reads see a frozen snapshot, locks stay
//! held.
//!
//! [`begin`] acquires the connection in the caller (cancelling there is
//! harmless), then runs the `BEGIN` in a task of its own, which always runs
//! to completion: if the caller is gone by then, the task drops the new
//! transaction, which rolls it back before the connection returns to the
//! pool. Every transaction idem opens on a pool starts here, through
//! [`Backend::begin`](crate::Backend::begin): handlers (and so the AMQP
//! consumer's), the relay's claim, `idem_runtime::migrate`, the `idem`
//! CLI. The archiver's batches, which set their isolation level on the
//! connection before `BEGIN`, close their connection instead unless the
//! batch finished (`CloseUnlessDone` in `backend.rs`).
//!
//! SQLite's driver already rolls back a `BEGIN` whose caller is gone: its
//! worker thread runs the statement to the end and hands the answer over
//! through a rendezvous, rolling back when nobody takes it. There the
//! `BEGIN` runs in the caller, without a task (one spawn and one wake-up
//! less per transaction). PostgreSQL's and MySQL's drivers do not, and
//! `Pool::begin` there is not cancellation-safe.

use sqlx::{Database, Pool, SqlSafeStr, Transaction};

/// Acquires a connection of `pool` and begins a transaction on it with
/// `statement` (`None`: the driver's `BEGIN`). Cancellation-safe: dropping
/// the returned future at any point leaves no transaction open on a pooled
/// connection.
pub(crate) async fn begin<DB: Database>(
    pool: &Pool<DB>,
    statement: Option<&'static str>,
) -> Result<Transaction<'static, DB>, sqlx::Error> {
    let conn = pool.acquire().await?;
    // `sqlx::Sqlite::NAME` (the feature may be off).
    if DB::NAME == "SQLite" {
        return Transaction::begin(conn, statement.map(SqlSafeStr::into_sql_str)).await;
    }
    // `Transaction::begin` is what `Pool::begin` runs on the connection it
    // acquired; it is the only way to a `Transaction<'static, _>` that owns
    // its pool connection.
    let task = tokio::spawn(Transaction::begin(
        conn,
        statement.map(SqlSafeStr::into_sql_str),
    ));
    match task.await {
        Ok(result) => result,
        Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
        // The runtime is shutting down: the task was dropped, and with it
        // the transaction (rolled back) or the connection.
        Err(_) => Err(sqlx::Error::WorkerCrashed),
    }
}
