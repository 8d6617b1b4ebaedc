//! Whether a database has idem's tables at the version this release
//! needs: what a relay checks before it claims (see
//! [`Relay::spawn`](crate::outbox::Relay::spawn)).

use crate::Error;
use crate::backend::Backend;
use crate::backend::classify::{is_transient, pooler_error};
use sqlx::Pool;

/// The schema version this release creates, upgrades to and runs on
/// (`idem_runtime::migrate` brings a database to it; see
/// `idem_runtime::schema` for what each version holds).
pub const SCHEMA_VERSION: i64 = 4;

/// Checks that `pool`'s database has idem's tables at
/// [`SCHEMA_VERSION`] or later, and returns the version found.
///
/// A database without idem's tables, or with tables of an older version,
/// is an [`Error::Config`] naming the version found and the one expected
/// and telling to run `idem migrate` (or `idem_runtime::migrate`). A newer
/// version is accepted (a rolling upgrade migrates before every relay runs
/// the new release). A database that cannot be reached, or that answers
/// with an error a retry can get past (a failover's, a deadlock), is an
/// [`Error::Database`] (see [`Error::is_outage`]): nothing is known yet. A
/// connection pooler in transaction mode in front of the database without
/// idem's mode (see `idem_runtime::pooler`) is the [`Error::Config`] that
/// names it.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), idem_runtime::Error> {
/// let pool = sqlx::SqlitePool::connect("sqlite::memory:").await?;
/// let refused = idem_runtime::check_schema(&pool).await.unwrap_err();
/// assert!(refused.to_string().contains("idem migrate"), "{refused}");
/// idem_runtime::migrate(&pool).await?;
/// assert_eq!(idem_runtime::check_schema(&pool).await?, idem_runtime::SCHEMA_VERSION);
/// # Ok(()) }
/// ```
pub async fn check_schema<DB: Backend>(pool: &Pool<DB>) -> Result<i64, Error> {
    let mut conn = pool.acquire().await?;
    let found = DB::fetch_i64(
        &mut conn,
        "SELECT COALESCE(MAX(version), 0) FROM idem_schema_version",
    )
    .await;
    match found {
        Ok(version) if version >= SCHEMA_VERSION => Ok(version),
        Ok(version) => Err(Error::config(format!(
            "idem's tables are at schema version {version}, this release needs version \
             {SCHEMA_VERSION}: run `idem migrate` (or `idem_runtime::migrate(&pool)`) to upgrade \
             them, then start again"
        ))),
        // A connection pooler in transaction mode between idem and the
        // database: the Config error naming it, not "no tables".
        Err(e) if pooler_error(&e).is_some() => Err(Error::database(e)),
        // The server answered, but with an error a retry can get past (a
        // failover's 57P01, a deadlock): nothing is known yet.
        Err(e) if is_transient(&e) => Err(Error::Database(e)),
        // The server answered: no version table (no idem tables, or tables
        // of a release before versioning).
        Err(sqlx::Error::Database(e)) => Err(Error::config(format!(
            "this database has no idem schema version (found none, expected version \
             {SCHEMA_VERSION}; the server said: {e}): run `idem migrate` (or \
             `idem_runtime::migrate(&pool)`) to create idem's tables, then start again"
        ))),
        Err(e) => Err(Error::Database(e)),
    }
}
