//! The databases a run can use, and how each injects its faults: SQLite
//! through its commit hook, PostgreSQL and MariaDB through the
//! [`FaultProxy`](crate::proxy::FaultProxy).

use sqlx::Pool;
use tokio::sync::oneshot;

#[cfg(any(feature = "postgres", feature = "mysql"))]
use crate::error::Error;
use crate::script::CommitFault;

/// A database `idem-test` runs handlers on: `sqlx::Sqlite` (feature
/// `sqlite`, the default), `sqlx::Postgres` (feature `postgres`),
/// `sqlx::MySql` (feature `mysql`). Sealed.
pub trait TestBackend: sealed::Open {}

impl<DB: sealed::Open> TestBackend for DB {}

pub(crate) mod sealed {
    use super::Fixture;
    use crate::error::Error;

    /// How a backend opens the run's pool with its faults.
    pub trait Open: idem_runtime::Backend + idem_runtime::Operable {
        /// The backend's name in reports.
        const LABEL: &'static str;

        /// Ends the lease relay `owner` holds on `topic`'s pending
        /// messages (its claims are named `owner#…`): any relay may claim
        /// them at once, as after the lease ran out. How many it ended.
        fn expire_lease(
            pool: &sqlx::Pool<Self>,
            topic: &str,
            owner: &str,
        ) -> impl std::future::Future<Output = Result<u64, sqlx::Error>>;

        /// Opens the pool (`url`, or SQLite's own temporary database when
        /// `None`) with room for `connections` at once.
        fn open(
            url: Option<&str>,
            connections: u32,
        ) -> impl std::future::Future<Output = Result<Fixture<Self>, Error>>;
    }
}

/// [`sealed::Open::expire_lease`] for a pool type, with its statement.
macro_rules! expire_lease {
    ($pool:ty, $sql:expr) => {
        async fn expire_lease(pool: &$pool, topic: &str, owner: &str) -> Result<u64, sqlx::Error> {
            let done = sqlx::query($sql)
                .bind(topic)
                .bind(format!("{owner}#%"))
                .execute(pool)
                .await?;
            Ok(done.rows_affected())
        }
    };
}

/// [`sealed::Open::expire_lease`]'s statement, `?` placeholders.
const EXPIRE_LEASE: &str = "UPDATE idem_outbox SET locked_until = NULL \
    WHERE topic = ? AND status = 'pending' AND lease_owner LIKE ?";

/// [`EXPIRE_LEASE`] with PostgreSQL's placeholders.
#[cfg(feature = "postgres")]
const EXPIRE_LEASE_PG: &str = "UPDATE idem_outbox SET locked_until = NULL \
    WHERE topic = $1 AND status = 'pending' AND lease_owner LIKE $2";

/// Where the faults are injected.
#[derive(Debug)]
pub(crate) enum Faults {
    /// SQLite's commit hook, on every connection of the pool.
    #[cfg(feature = "sqlite")]
    Hook(sqlite::Hook),
    /// The fault proxy every connection of the pool goes through.
    #[cfg(any(feature = "postgres", feature = "mysql"))]
    Proxy(crate::proxy::FaultProxy),
}

/// The run's pool and its faults.
#[derive(Debug)]
pub struct Fixture<DB: sqlx::Database> {
    pub(crate) pool: Pool<DB>,
    pub(crate) faults: Faults,
}

impl Faults {
    /// Scripts `fault` on the `nth` commit from now.
    pub(crate) fn arm(&self, nth: u64, fault: CommitFault) -> oneshot::Receiver<()> {
        match self {
            #[cfg(feature = "sqlite")]
            Faults::Hook(h) => h.script.arm(nth, fault),
            #[cfg(any(feature = "postgres", feature = "mysql"))]
            Faults::Proxy(p) => p.fault_commit(nth, fault),
        }
    }

    /// Takes back a scripted fault that has not fired.
    pub(crate) fn disarm(&self) {
        match self {
            #[cfg(feature = "sqlite")]
            Faults::Hook(h) => h.script.disarm(),
            #[cfg(any(feature = "postgres", feature = "mysql"))]
            Faults::Proxy(p) => p.clear_commit_fault(),
        }
    }

    /// How many commits were made so far (`COMMIT`s through the proxy).
    pub(crate) fn commits(&self) -> u64 {
        match self {
            #[cfg(feature = "sqlite")]
            Faults::Hook(h) => h.script.seen(),
            #[cfg(any(feature = "postgres", feature = "mysql"))]
            Faults::Proxy(p) => p.commits_seen(),
        }
    }

    /// Whether a fault that fires drops the caller's future (SQLite: the
    /// commit is on a worker thread, the caller never learns its outcome),
    /// rather than failing its commit with an I/O error (the proxy).
    pub(crate) fn drops_the_call(&self) -> bool {
        match self {
            #[cfg(feature = "sqlite")]
            Faults::Hook(_) => true,
            #[cfg(any(feature = "postgres", feature = "mysql"))]
            Faults::Proxy(_) => false,
        }
    }

    /// Waits until a commit a dropped call left in flight has ended.
    pub(crate) async fn settle(&self) -> Result<(), sqlx::Error> {
        match self {
            #[cfg(feature = "sqlite")]
            Faults::Hook(h) => h.settle().await,
            #[cfg(any(feature = "postgres", feature = "mysql"))]
            Faults::Proxy(_) => Ok(()),
        }
    }
}

#[cfg(feature = "sqlite")]
pub(crate) mod sqlite {
    //! SQLite: a fresh database file of the run's own in WAL mode (readers
    //! never wait for the writer, as on the servers), faults through the
    //! commit hook of every connection.

    use std::path::PathBuf;
    use std::str::FromStr;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU64, Ordering};

    use sqlx::sqlite::{
        SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous,
    };
    use sqlx::{Connection, Sqlite, SqlitePool};

    use super::{Faults, Fixture};

    /// How long a connection waits for the write lock: longer than any hold.
    const LOCK_WAIT: std::time::Duration = std::time::Duration::from_secs(30);
    use crate::error::Error;
    use crate::script::{CommitFault, Script};

    /// The commit hook's script, and the database file to remove.
    #[derive(Debug)]
    pub(crate) struct Hook {
        pub(crate) script: Arc<Script>,
        pool: SqlitePool,
        file: Option<PathBuf>,
    }

    impl Hook {
        /// Takes the write lock and gives it back: a commit in flight on a
        /// dropped call's connection has ended by then.
        pub(crate) async fn settle(&self) -> Result<(), sqlx::Error> {
            let mut conn = self.pool.acquire().await?;
            let tx = conn.begin_with("BEGIN IMMEDIATE").await?;
            tx.rollback().await
        }
    }

    impl Drop for Hook {
        fn drop(&mut self) {
            if let Some(file) = &self.file {
                for suffix in ["", "-wal", "-shm", "-journal"] {
                    let mut name = file.clone().into_os_string();
                    name.push(suffix);
                    let _ = std::fs::remove_file(name);
                }
            }
        }
    }

    /// A database file no other run uses.
    fn scratch_file() -> PathBuf {
        static SEQ: AtomicU64 = AtomicU64::new(0);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        let n = SEQ.fetch_add(1, Ordering::Relaxed);
        std::env::temp_dir().join(format!("idem-test-{}-{nanos}-{n}.db", std::process::id()))
    }

    /// What the hook does with a commit: `false` turns it into a rollback.
    fn on_commit(script: &Script) -> bool {
        match script.on_commit() {
            Some(CommitFault::Cut) => false,
            Some(CommitFault::Hold(hold)) => {
                // On the connection's worker thread, its write lock held.
                std::thread::sleep(hold);
                true
            }
            _ => true,
        }
    }

    impl super::sealed::Open for Sqlite {
        const LABEL: &'static str = "SQLite";

        async fn open(url: Option<&str>, connections: u32) -> Result<Fixture<Sqlite>, Error> {
            let (options, file) = match url {
                Some(url) => (
                    SqliteConnectOptions::from_str(url).map_err(Error::Database)?,
                    None,
                ),
                None => {
                    let file = scratch_file();
                    let options = SqliteConnectOptions::new()
                        .filename(&file)
                        .create_if_missing(true);
                    (options, Some(file))
                }
            };
            let options = options
                .journal_mode(SqliteJournalMode::Wal)
                // A scratch database: no fsync per commit (the faults are the
                // hook's, not the disk's).
                .synchronous(SqliteSynchronous::Off)
                .busy_timeout(LOCK_WAIT);
            let script = Arc::new(Script::default());
            let hook = script.clone();
            let pool = SqlitePoolOptions::new()
                .max_connections(connections)
                .after_connect(move |conn, _| {
                    let script = hook.clone();
                    Box::pin(async move {
                        conn.lock_handle()
                            .await?
                            .set_commit_hook(move || on_commit(&script));
                        Ok(())
                    })
                })
                // A connection whose commit the hook turned into a rollback
                // under a dropped call is left counting a transaction: closed.
                .after_release(|conn, _| Box::pin(async move { Ok(!conn.is_in_transaction()) }))
                .before_acquire(|conn, _| Box::pin(async move { Ok(!conn.is_in_transaction()) }))
                .connect_with(options)
                .await
                .map_err(Error::Database)?;
            let faults = Faults::Hook(Hook {
                script,
                pool: pool.clone(),
                file,
            });
            Ok(Fixture { pool, faults })
        }

        expire_lease!(SqlitePool, super::EXPIRE_LEASE);
    }
}

/// Opens a pool on a server through a fault proxy of the run's own.
#[cfg(any(feature = "postgres", feature = "mysql"))]
async fn through_proxy<DB: sqlx::Database>(
    url: Option<&str>,
    connections: u32,
) -> Result<(Pool<DB>, Faults), Error> {
    let url = url.ok_or_else(|| Error::Config("a PostgreSQL or MariaDB run needs a URL".into()))?;
    let proxy = crate::proxy::FaultProxy::for_url(url, 0.0)
        .await
        .map_err(|e| Error::Config(e.to_string()))?;
    let pool = sqlx::pool::PoolOptions::<DB>::new()
        .max_connections(connections)
        .acquire_timeout(std::time::Duration::from_secs(10))
        .connect(&proxy.url(url))
        .await
        .map_err(|source| Error::Unreachable {
            url: url.to_owned(),
            source,
        })?;
    Ok((pool, Faults::Proxy(proxy)))
}

#[cfg(feature = "postgres")]
impl sealed::Open for sqlx::Postgres {
    const LABEL: &'static str = "PostgreSQL";

    async fn open(url: Option<&str>, connections: u32) -> Result<Fixture<Self>, Error> {
        let (pool, faults) = through_proxy(url, connections).await?;
        Ok(Fixture { pool, faults })
    }

    expire_lease!(sqlx::PgPool, EXPIRE_LEASE_PG);
}

#[cfg(feature = "mysql")]
impl sealed::Open for sqlx::MySql {
    const LABEL: &'static str = "MariaDB/MySQL";

    async fn open(url: Option<&str>, connections: u32) -> Result<Fixture<Self>, Error> {
        let (pool, faults) = through_proxy(url, connections).await?;
        Ok(Fixture { pool, faults })
    }

    expire_lease!(sqlx::MySqlPool, EXPIRE_LEASE);
}
