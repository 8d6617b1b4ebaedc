//! The archive (`idem-ops/src/archive.rs`) against the real servers: the
//! archiver under traffic and after a crash, finding archived records,
//! and archivers, relays and producers in other time zones. One test
//! binary, a module per file.
//!
//! Every archiver drains every expired row of the shared tables: the tests
//! that run one on a server hold [`exclusive`] for it, so that no other
//! test's archiver moves their rows (and nothing else that makes expired
//! rows runs in this binary).

mod archiver;
mod timezone;

use idem_runtime::Dialect;

/// One archiving test at a time per server (PostgreSQL, MariaDB): every
/// archiver drains every expired row of the shared tables, and the crash
/// test must see its own archivers stop half-way.
static SERVER: [tokio::sync::Mutex<()>; 2] = [
    tokio::sync::Mutex::const_new(()),
    tokio::sync::Mutex::const_new(()),
];

/// The turn of `d`'s server; `None` on SQLite, where each test has a
/// database file of its own.
async fn exclusive(d: Dialect) -> Option<tokio::sync::MutexGuard<'static, ()>> {
    match d {
        Dialect::Sqlite => None,
        d => Some(SERVER[d as usize].lock().await),
    }
}
