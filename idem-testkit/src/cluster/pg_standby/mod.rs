//! A PostgreSQL 15 primary and its streaming standby, each on a port and a
//! data directory of its own, behind an haproxy that sends clients to the
//! primary and, once the primary is down, to the standby: the failover a
//! test drives with [`PgStandby::kill9_primary`] and
//! [`PgStandby::promote`].
//!
//! - The primary: `wal_level=replica`, `synchronous_standby_names =
//!   'standby1'` in [`Replication::Synchronous`] (a commit is acknowledged
//!   once the standby has flushed its WAL; `synchronous_commit` keeps its
//!   default, `on`) or `''` in [`Replication::Asynchronous`] (acknowledged
//!   at the primary's own flush: the standby may lag behind), trust
//!   authentication on 127.0.0.1 (replication included), `fsync=off` and
//!   small buffers. `fsync=off` proves nothing less here: a SIGKILL of the
//!   server processes loses no write the kernel already has, only an
//!   operating system crash would, and the standby's copy is what counts.
//! - The standby: `pg_basebackup -R` of the primary, streaming as
//!   `application_name=standby1`, hot standby (connections are accepted
//!   and answer writes with `25006`, read-only transaction), with
//!   `synchronous_standby_names = ''`: once promoted it runs alone, as a
//!   manager such as Patroni (without `synchronous_mode_strict`) leaves a
//!   primary whose standby is gone. Otherwise every commit after the
//!   promotion would wait for a standby that never comes.
//! - haproxy (TCP mode, in the foreground) on a port of its own: the
//!   primary is the server, the standby the `backup`, checked every 200 ms
//!   (`fall 2 rise 1`, `on-marked-down shutdown-sessions`). The check is a
//!   TCP connect: enough here, since the killed primary stays dead. In
//!   production the check asks for the role — Patroni's REST endpoint
//!   (`option httpchk GET /primary`, port 8008) or a script running
//!   `SELECT pg_is_in_recovery()` — so that a node comes back as a
//!   primary only once it is one, and a demoted primary is never written
//!   to.
//!
//! Everything runs as the `postgres` system user (the server refuses root)
//! in a [`Scratch`] directory, and everything is killed on drop, also when
//! the test fails.
//!
//! ```no_run
//! # async fn run() {
//! use idem_testkit::cluster::pg_standby::{PgStandby, Replication};
//! let Some(cluster) = PgStandby::start("my_test", Replication::Synchronous) else {
//!     return; // skipped: PostgreSQL 15 or haproxy is not installed
//! };
//! cluster.migrate().await;
//! let pool = cluster.pool(8);
//! // … calls through `pool` …
//! cluster.kill9_primary();
//! cluster.promote().await;
//! # let _ = pool;
//! # }
//! ```

mod haproxy;
pub(super) mod node;

use super::{Proc, Scratch, as_user, free_port, need, wait_port};
use haproxy::haproxy_config;
use node::{Node, initdb, psql, run, server_command, wait_ready};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{Connection, PgConnection, PgPool};
use std::path::Path;
use std::process::Command;
use std::str::FromStr;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Where Debian's `postgresql-15` installs the server programs.
pub const BIN: &str = "/usr/lib/postgresql/15/bin";

/// The haproxy program (Debian's `haproxy`).
pub const HAPROXY: &str = "/usr/sbin/haproxy";

/// The standby's `application_name`, the one the primary waits for.
pub const STANDBY_NAME: &str = "standby1";

/// How the primary replicates to the standby.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Replication {
    /// `synchronous_standby_names = 'standby1'`: a commit is acknowledged
    /// once the standby has flushed it, so the promoted standby has every
    /// acknowledged commit.
    Synchronous,
    /// `synchronous_standby_names = ''`: a commit is acknowledged at the
    /// primary's flush; the commits the standby had not received when the
    /// primary died are gone after the promotion, acknowledged or not.
    Asynchronous,
}

/// A primary, its standby and the haproxy in front of them (see the
/// [module](self)). Everything is killed on drop.
#[derive(Debug)]
pub struct PgStandby {
    replication: Replication,
    primary: Node,
    standby: Node,
    haproxy: Mutex<Proc>,
    haproxy_port: u16,
    // Dropped last: the processes above are gone by then.
    scratch: Scratch,
}

impl PgStandby {
    /// Starts the primary, the standby (streaming, and for
    /// [`Replication::Synchronous`] the primary's synchronous standby) and
    /// haproxy. Blocks for a few seconds (`initdb`, `pg_basebackup`): call
    /// it before the test starts its tasks.
    ///
    /// `None` (skipped locally, a failure when `CI=true`) when PostgreSQL
    /// 15's programs or haproxy are not installed.
    ///
    /// # Panics
    ///
    /// When a server does not start or the standby does not stream (with
    /// the servers' logs).
    pub fn start(test: &str, replication: Replication) -> Option<PgStandby> {
        need(
            test,
            &[
                &format!("{BIN}/initdb"),
                &format!("{BIN}/postgres"),
                &format!("{BIN}/pg_basebackup"),
                &format!("{BIN}/pg_isready"),
                &format!("{BIN}/psql"),
                HAPROXY,
                "runuser",
            ],
        )?;
        let scratch = Scratch::new("pg-standby");
        scratch.chown("postgres");
        let sockets = scratch.path().to_owned();
        let (primary_data, standby_data) = (scratch.join("primary"), scratch.join("standby"));

        initdb(&primary_data);

        let sync_names = match replication {
            Replication::Synchronous => STANDBY_NAME,
            Replication::Asynchronous => "",
        };
        let primary_port = free_port();
        let cmd = server_command(
            &primary_data,
            primary_port,
            &sockets,
            &[format!("synchronous_standby_names={sync_names}")],
        );
        let primary = Node {
            port: primary_port,
            proc: Mutex::new(Proc::spawn("primary", cmd, scratch.join("primary.log"))),
            data: primary_data,
        };
        assert!(
            wait_ready(primary_port, Duration::from_secs(30)),
            "the primary did not start\n{}",
            primary.log_tail(30)
        );

        let mut backup = as_user("postgres", &format!("{BIN}/pg_basebackup"));
        backup
            .arg("-D")
            .arg(&standby_data)
            .args(["-h", "127.0.0.1", "-p", &primary_port.to_string()])
            .args([
                "-U",
                "postgres",
                "-R",
                "-X",
                "stream",
                "-c",
                "fast",
                "--no-sync",
            ]);
        run("pg_basebackup", backup);

        let standby_port = free_port();
        let cmd = server_command(
            &standby_data,
            standby_port,
            &sockets,
            &[
                "synchronous_standby_names=".into(),
                format!(
                    "primary_conninfo=host=127.0.0.1 port={primary_port} user=postgres \
                     application_name={STANDBY_NAME}"
                ),
            ],
        );
        let standby = Node {
            port: standby_port,
            proc: Mutex::new(Proc::spawn("standby", cmd, scratch.join("standby.log"))),
            data: standby_data,
        };
        assert!(
            wait_ready(standby_port, Duration::from_secs(30)),
            "the standby did not start\n{}",
            standby.log_tail(30)
        );

        let haproxy_port = free_port();
        let cfg = scratch.join("haproxy.cfg");
        std::fs::write(
            &cfg,
            haproxy_config(haproxy_port, primary_port, standby_port),
        )
        .expect("write haproxy.cfg");
        let mut cmd = Command::new(HAPROXY);
        cmd.arg("-db").arg("-f").arg(&cfg);
        let haproxy = Proc::spawn("haproxy", cmd, scratch.join("haproxy.log"));
        let cluster = PgStandby {
            replication,
            primary,
            standby,
            haproxy: Mutex::new(haproxy),
            haproxy_port,
            scratch,
        };
        assert!(
            wait_port(haproxy_port, Duration::from_secs(10)),
            "haproxy did not start\n{}",
            cluster.log_tails()
        );

        // The standby streams (and is the synchronous one when asked).
        let want = match replication {
            Replication::Synchronous => "streaming sync",
            Replication::Asynchronous => "streaming async",
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        let query = format!(
            "SELECT state || ' ' || sync_state FROM pg_catalog.pg_stat_replication \
             WHERE application_name = '{STANDBY_NAME}'"
        );
        while psql(primary_port, &query) != want {
            assert!(
                Instant::now() < deadline,
                "the standby does not stream ({want})\n{}",
                cluster.log_tails()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        Some(cluster)
    }

    /// How the primary replicates.
    pub fn replication(&self) -> Replication {
        self.replication
    }

    /// The URL clients use: haproxy's port, database `postgres`.
    pub fn url(&self) -> String {
        format!(
            "postgres://postgres@127.0.0.1:{}/postgres",
            self.haproxy_port
        )
    }

    /// The primary's own URL (no haproxy).
    pub fn primary_url(&self) -> String {
        self.primary.url()
    }

    /// The standby's own URL (no haproxy).
    pub fn standby_url(&self) -> String {
        self.standby.url()
    }

    /// A pool through haproxy of at most `max` connections, opened lazily
    /// (a client does not wait for a server to start). Its connections
    /// are pinged before use (sqlx's default), so those haproxy shut when
    /// the primary died are replaced; acquiring waits at most 5 s
    /// (`PoolTimedOut`, retryable).
    ///
    /// # Panics
    ///
    /// Never for the URL this cluster makes.
    pub fn pool(&self, max: u32) -> PgPool {
        let opts = PgConnectOptions::from_str(&self.url()).expect("a valid URL");
        PgPoolOptions::new()
            .max_connections(max)
            .acquire_timeout(Duration::from_secs(5))
            .test_before_acquire(true)
            .connect_lazy_with(opts)
    }

    /// Creates idem's tables on the primary (through haproxy), then waits
    /// until the standby has replayed them.
    ///
    /// # Panics
    ///
    /// When the migration fails.
    pub async fn migrate(&self) {
        let pool = self.pool(2);
        idem_runtime::migrate(&pool).await.expect("migrate idem");
        pool.close().await;
        self.caught_up().await;
    }

    /// Waits (at most 30 s) until the standby has replayed everything the
    /// primary has written so far: for a test that sets up rows on an
    /// asynchronous pair before it kills the primary.
    ///
    /// # Panics
    ///
    /// When the standby does not catch up.
    pub async fn caught_up(&self) {
        let mut primary = connect(&self.primary_url()).await;
        let lsn: String = sqlx::query_scalar("SELECT pg_catalog.pg_current_wal_lsn()::text")
            .fetch_one(&mut primary)
            .await
            .expect("the primary's WAL position");
        let _ = primary.close().await;
        let mut standby = connect(&self.standby_url()).await;
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let done: bool = sqlx::query_scalar(
                "SELECT pg_catalog.pg_last_wal_replay_lsn() >= $1::text::pg_lsn",
            )
            .bind(&lsn)
            .fetch_one(&mut standby)
            .await
            .expect("the standby's replay position");
            if done {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "the standby did not replay up to {lsn}\n{}",
                self.log_tails()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let _ = standby.close().await;
    }

    /// Kills the primary's processes with SIGKILL, all at once (a machine
    /// crash: no shutdown, the WAL sender gone too). It stays dead.
    pub fn kill9_primary(&self) {
        self.primary.kill9();
    }

    /// Promotes the standby (`SELECT pg_promote()`, which waits until it
    /// accepts writes) and returns how long that took.
    ///
    /// # Panics
    ///
    /// When the standby cannot be reached or does not finish its
    /// promotion within 30 s.
    pub async fn promote(&self) -> Duration {
        let start = Instant::now();
        let mut conn = connect(&self.standby_url()).await;
        let promoted: bool = sqlx::query_scalar("SELECT pg_catalog.pg_promote(true, 30)")
            .fetch_one(&mut conn)
            .await
            .unwrap_or_else(|e| panic!("pg_promote: {e}\n{}", self.log_tails()));
        assert!(
            promoted,
            "the standby did not promote\n{}",
            self.log_tails()
        );
        let _ = conn.close().await;
        start.elapsed()
    }

    /// Whether the server at `url` is a standby (`pg_is_in_recovery()`).
    ///
    /// # Panics
    ///
    /// When it cannot be reached.
    pub async fn in_recovery(url: &str) -> bool {
        let mut conn = connect(url).await;
        let r: bool = sqlx::query_scalar("SELECT pg_catalog.pg_is_in_recovery()")
            .fetch_one(&mut conn)
            .await
            .expect("pg_is_in_recovery()");
        let _ = conn.close().await;
        r
    }

    /// The last lines of every log (both servers, haproxy), for a failure
    /// message.
    pub fn log_tails(&self) -> String {
        let haproxy = self
            .haproxy
            .lock()
            .map(|p| p.log_tail(20))
            .unwrap_or_default();
        format!(
            "{}\n{}\n{haproxy}",
            self.primary.log_tail(30),
            self.standby.log_tail(30)
        )
    }

    /// The scratch directory holding the data directories and the logs
    /// (kept after the test with `IDEM_KEEP_SCRATCH=1`).
    pub fn dir(&self) -> &Path {
        self.scratch.path()
    }
}

/// One connection to `url` (a few tries: a server just started may still
/// be starting up).
async fn connect(url: &str) -> PgConnection {
    let opts = PgConnectOptions::from_str(url).expect("a valid URL");
    let mut last = None;
    for _ in 0..50 {
        match PgConnection::connect_with(&opts).await {
            Ok(c) => return c,
            Err(e) => last = Some(e),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("cannot connect to {url}: {last:?}");
}

impl Drop for PgStandby {
    fn drop(&mut self) {
        if let Ok(mut h) = self.haproxy.lock() {
            h.kill9();
        }
        self.primary.kill9();
        self.standby.kill9();
        // The scratch, dropped right after, removes the data directories.
    }
}
