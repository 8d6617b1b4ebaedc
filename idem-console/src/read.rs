//! How long the console waits for the database at most: every page first
//! asks whether it answers ([`answering`]: a connection acquired and
//! pinged within [`READ_TIMEOUT`], the same bound on every page, whatever
//! the pool's own acquire timeout), so a database that is down or
//! black-holed answers 503 with `Retry-After` within it; then
//! [`READ_TIMEOUT`] for each read of a page or a scrape, [`SCAN_TIMEOUT`]
//! for those that scan a table and for the operator's writes (a requeue
//! of many messages, a discard that may wait on a row a relay locks), on
//! a database that just answered, each enforced by [`bounded`].

use idem_runtime::{Error, Operable};
use sqlx::{Connection, Pool};
use std::future::Future;
use std::time::Duration;

/// The longest one read of the console waits for the database: acquiring
/// a connection and running its statements. A database that does not
/// answer (black-holed) fails the read then, whatever the pool's own
/// acquire timeout, and the future is dropped (the statement abandoned).
pub(crate) const READ_TIMEOUT: Duration = Duration::from_secs(3);

/// The same for the reads that scan the outbox or the history tables
/// (the delivered counts, the archive page) and for the operator's
/// writes (requeue, retry now, discard, pause, resume), which the sampler
/// or a single operator runs, not every scrape: a database that does not
/// answer is caught before them, by [`answering`].
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

/// Seconds a page answered while the database does not answer tells the
/// client to wait (`Retry-After`).
pub(crate) const RETRY_AFTER_SECS: u64 = 5;

/// Whether the database answers: a connection acquired from `pool` and
/// pinged within [`READ_TIMEOUT`]. Every page that reads the database asks
/// first, so that an outage is seen within the same bound on every page
/// (a transient error: 503), not after the pool's acquire timeout or a
/// scan's bound.
pub(crate) async fn answering<DB: Operable>(pool: &Pool<DB>) -> Result<(), Error> {
    bounded(READ_TIMEOUT, async {
        let mut conn = pool.acquire().await?;
        conn.ping().await?;
        Ok(())
    })
    .await
}
