//! Running behind a connection pooler in transaction mode (pgbouncer
//! `pool_mode = transaction`, and poolers that work the same way).
//!
//! Such a pooler lends a server connection to a client for one
//! transaction only (for an autocommit statement: up to its `Sync`), then
//! hands it to another client. Two things of sqlx's PostgreSQL driver
//! break there:
//!
//! - **Named prepared statements.** By default sqlx prepares every query
//!   as a named statement (`sqlx_s_1`, `sqlx_s_2`, …) on the server
//!   connection it happens to have, and executes it by name later, maybe
//!   on another server connection: `prepared statement "sqlx_s_3" does not
//!   exist` (`26000`), `… already exists` (`42P05`), or worse, another
//!   client's `sqlx_s_3` — a different statement — runs in its place.
//! - **Two round trips per statement.** Even an unnamed statement is sent
//!   in two batches (parse and describe, then bind and execute), each
//!   ending in a `Sync`: outside a transaction the pooler may run the two
//!   halves on different server connections.
//!
//! In transaction-pooling mode ([`transaction_mode`]) idem therefore
//! prepares every statement it issues as the unnamed statement (sqlx's
//! `.persistent(false)`) and runs the statements it would otherwise run
//! in autocommit on a pool (the relay's bookkeeping and state reads, the
//! operator's queries, record look-ups) inside `BEGIN … COMMIT` on
//! PostgreSQL. Everything else idem does already runs in transactions,
//! and idem keeps no session state: the migration's lock is a
//! transaction-level advisory lock (`pg_advisory_xact_lock`), the claim's
//! `SET LOCAL` ends with its transaction, and idem uses no `LISTEN`, no
//! temporary tables and no session-level `SET`.
//!
//! The mode is **process-wide**: sqlx offers no way to tell from a pool
//! how it reaches its server, and a call inside the caller's transaction
//! ([`CallerTx`](crate::CallerTx), [`outbox::enqueue`](crate::outbox::enqueue))
//! has no pool at all. Unnamed statements are always correct, only
//! slower (each statement is parsed again), so a process that also talks
//! to a database directly loses speed there, never correctness. Turn it
//! on with [`transaction_mode`]`(true)`, with the environment variable
//! [`ENV`] (`IDEM_TRANSACTION_POOLING=1`, read once, on first use) or,
//! for the `idem` CLI, with `--transaction-pooling`.
//!
//! pgbouncer itself needs `ignore_startup_parameters = extra_float_digits`
//! in `pgbouncer.ini`: sqlx sends that parameter when it connects, and
//! pgbouncer refuses unknown ones (`08P01 unsupported startup parameter`,
//! which idem also reports as an [`Error::Config`](crate::Error::Config)
//! saying so).
//!
//! Your own statements need the same care: prepare them with
//! `.persistent(false)` (or [`persistent`]`()`, which follows the mode),
//! and run them inside transactions — inside a handler body they always
//! are.
//!
//! ```
//! use idem_runtime::pooler;
//!
//! // At start-up, before the first call, relay or migration:
//! pooler::transaction_mode(true);
//! assert!(pooler::transaction_mode_enabled());
//!
//! // Your own statements, correct through the pooler and fast without it:
//! let q = sqlx::query::<sqlx::Postgres>("INSERT INTO sent (user_id) VALUES ($1)")
//!     .bind(7_i64)
//!     .persistent(pooler::persistent());
//! # let _ = q;
//! # pooler::transaction_mode(false);
//! ```
//!
//! Without the mode, the errors a pooler in transaction mode causes
//! (`26000`, `42P05`, and pgbouncer's `08P01` protocol errors about
//! prepared statements) are an [`Error::Config`](crate::Error::Config)
//! that names the pooler and this option, not a retryable database error.

use crate::backend::dialect::Dialect;
use std::sync::atomic::{AtomicU8, Ordering};

/// The environment variable that turns the mode on: `1`, `true`, `yes` or
/// `on` (any case); anything else, or unset, leaves it off. Read once, the
/// first time idem asks; [`transaction_mode`] overrides it.
pub const ENV: &str = "IDEM_TRANSACTION_POOLING";

const UNSET: u8 = 0;
const OFF: u8 = 1;
const ON: u8 = 2;

static MODE: AtomicU8 = AtomicU8::new(UNSET);

/// Turns transaction-pooling mode on or off for the whole process (see the
/// [module documentation](self)). Call it before the first call, relay or
/// migration, before the pools open their connections: sqlx looks a
/// statement up in a connection's cache before it looks at
/// `.persistent(…)`, so a connection that already holds idem's statements
/// as named ones keeps running them by name. Overrides [`ENV`].
///
/// ```
/// idem_runtime::pooler::transaction_mode(true);
/// assert!(idem_runtime::pooler::transaction_mode_enabled());
/// # idem_runtime::pooler::transaction_mode(false);
/// ```
pub fn transaction_mode(on: bool) {
    MODE.store(if on { ON } else { OFF }, Ordering::Relaxed);
}

/// Whether transaction-pooling mode is on: set by [`transaction_mode`],
/// else read (once) from [`ENV`].
pub fn transaction_mode_enabled() -> bool {
    match MODE.load(Ordering::Relaxed) {
        ON => true,
        OFF => false,
        _ => {
            let on = std::env::var(ENV).is_ok_and(|v| env_is_on(&v));
            // A concurrent `transaction_mode` wins over the environment.
            let _ = MODE.compare_exchange(
                UNSET,
                if on { ON } else { OFF },
                Ordering::Relaxed,
                Ordering::Relaxed,
            );
            MODE.load(Ordering::Relaxed) == ON
        }
    }
}

/// The value for sqlx's `.persistent(…)` on a statement: `false` (the
/// unnamed statement, parsed on every run) in transaction-pooling mode,
/// `true` (a named statement, prepared once per connection and cached)
/// otherwise. idem passes it on every statement it prepares; pass it on
/// yours.
///
/// ```
/// let q = sqlx::query::<sqlx::Postgres>("SELECT 1")
///     .persistent(idem_runtime::pooler::persistent());
/// # let _ = q;
/// ```
pub fn persistent() -> bool {
    !transaction_mode_enabled()
}

/// Whether a statement idem would run in autocommit on a pool of
/// `dialect` runs inside a transaction instead: in transaction-pooling
/// mode, on PostgreSQL (whose driver's two round trips per statement a
/// pooler may split; MariaDB's and SQLite's statements stay as they are).
/// An operations crate running its own statements on idem's pools asks
/// this, as idem's stores do.
pub fn wrap_autocommit(dialect: Dialect) -> bool {
    dialect == Dialect::Postgres && transaction_mode_enabled()
}

fn env_is_on(v: &str) -> bool {
    matches!(
        v.trim().to_ascii_lowercase().as_str(),
        "1" | "true" | "yes" | "on"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn env_values() {
        for on in ["1", "true", "TRUE", " yes ", "On"] {
            assert!(env_is_on(on), "{on}");
        }
        for off in ["", "0", "false", "no", "off", "2", "enabled"] {
            assert!(!env_is_on(off), "{off}");
        }
    }
}
