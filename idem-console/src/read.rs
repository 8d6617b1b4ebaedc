//! How long a read of the console waits for the database at most:
//! [`READ_TIMEOUT`] for the reads of a page or a scrape, [`SCAN_TIMEOUT`]
//! for those that scan a table, each enforced by [`bounded`].

use idem_runtime::Error;
use std::future::Future;
use std::time::Duration;

/// The longest one read of the console waits for the database: acquiring
/// a connection and running its statements. A database that does not
/// answer (black-holed) fails the read then, whatever the pool's own
/// acquire timeout, and the future is dropped (the statement abandoned).
pub(crate) const READ_TIMEOUT: Duration = Duration::from_secs(3);

/// The same for the reads that scan the outbox or the history tables
/// (the delivered counts, the archive page), which the sampler or a
/// single operator runs, not every scrape.
pub(crate) const SCAN_TIMEOUT: Duration = Duration::from_secs(60);

/// `read`, failed when it takes longer than `limit`.
pub(crate) async fn bounded<T>(
    limit: Duration,
    read: impl Future<Output = Result<T, Error>>,
) -> Result<T, Error> {
    match tokio::time::timeout(limit, read).await {
        Ok(r) => r,
        Err(_) => Err(Error::Database(sqlx::Error::Io(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            format!("the database did not answer within {limit:?}"),
        )))),
    }
}
