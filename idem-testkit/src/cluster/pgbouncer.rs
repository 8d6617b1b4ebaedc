//! pgbouncer in front of the local PostgreSQL, on a port of its own: the
//! connection pooler most PostgreSQL deployments put between the
//! application and the server.
//!
//! [`PgBouncer::start`] writes a configuration into a [`Scratch`]
//! directory (the database `test` of the local server at
//! `127.0.0.1:5432`, user `postgres`, `auth_type = trust`), starts
//! `/usr/sbin/pgbouncer` in the foreground as a [`Proc`] (as the system
//! user `postgres` when the test runs as root: pgbouncer refuses to run as
//! root) and waits for its port. Dropping the handle kills it.
//!
//! In [`PoolMode::Transaction`] a client holds a server connection only
//! for the length of a transaction (an autocommit statement: until its
//! `Sync`); with a server pool smaller than the client pool, consecutive
//! statements of one client really do land on different server
//! connections, which is what breaks named prepared statements and
//! session state.

use super::{Proc, Scratch, free_port, installed, need, wait_port};
use std::process::Command;
use std::time::Duration;

/// pgbouncer's program, as Debian installs it.
pub const PROGRAM: &str = "/usr/sbin/pgbouncer";

/// When a client gives its server connection back to pgbouncer's pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PoolMode {
    /// At the end of each transaction (`pool_mode = transaction`).
    Transaction,
    /// When the client disconnects (`pool_mode = session`).
    Session,
}

impl PoolMode {
    fn name(self) -> &'static str {
        match self {
            PoolMode::Transaction => "transaction",
            PoolMode::Session => "session",
        }
    }
}

/// A running pgbouncer, killed on drop (its directory removed after it).
#[derive(Debug)]
pub struct PgBouncer {
    // Declared before `dir`: the process dies before its directory goes.
    proc: Proc,
    port: u16,
    pool_size: u32,
    mode: PoolMode,
    _dir: Scratch,
}

impl PgBouncer {
    /// Starts pgbouncer in `mode` with `pool_size` server connections
    /// (`default_pool_size`) to the local PostgreSQL's database `test`.
    /// `None` when pgbouncer is not installed (the skip rule of [`need`]:
    /// `SKIPPED` locally, a panic with `CI=true`).
    ///
    /// The upstream is `IDEM_TEST_PGBOUNCER_UPSTREAM` (`host:port`),
    /// default `127.0.0.1:5432`.
    ///
    /// # Panics
    ///
    /// When pgbouncer does not start listening within 10 s (with its log).
    pub fn start(test: &str, mode: PoolMode, pool_size: u32) -> Option<PgBouncer> {
        need(test, &[PROGRAM])?;
        let upstream = crate::env_setting("IDEM_TEST_PGBOUNCER_UPSTREAM")
            .unwrap_or_else(|| "127.0.0.1:5432".into());
        let (host, upstream_port) = upstream
            .rsplit_once(':')
            .unwrap_or((upstream.as_str(), "5432"));
        let dir = Scratch::new("pgbouncer");
        let port = free_port();
        let users = dir.join("users.txt");
        let config = format!(
            "[databases]\n\
             test = host={host} port={upstream_port} dbname=test user=postgres\n\
             \n\
             [pgbouncer]\n\
             listen_addr = 127.0.0.1\n\
             listen_port = {port}\n\
             unix_socket_dir =\n\
             auth_type = trust\n\
             auth_file = {users}\n\
             pool_mode = {mode}\n\
             default_pool_size = {pool_size}\n\
             min_pool_size = 0\n\
             reserve_pool_size = 0\n\
             max_client_conn = 500\n\
             max_db_connections = {pool_size}\n\
             ignore_startup_parameters = extra_float_digits\n\
             server_reset_query = DISCARD ALL\n\
             server_lifetime = 3600\n\
             logfile =\n\
             pidfile =\n\
             log_connections = 0\n\
             log_disconnections = 0\n\
             admin_users = postgres\n",
            users = users.display(),
            mode = mode.name(),
        );
        std::fs::write(dir.join("pgbouncer.ini"), config).expect("write pgbouncer.ini");
        std::fs::write(&users, "\"postgres\" \"\"\n").expect("write the auth file");
        let root = Command::new("id")
            .arg("-u")
            .output()
            .is_ok_and(|o| o.stdout.starts_with(b"0\n"));
        let mut cmd = Command::new(PROGRAM);
        if root {
            // pgbouncer refuses to run as root; `-u` drops to the user
            // itself, so the process the test kills is pgbouncer (not a
            // `runuser` whose child would outlive it).
            dir.chown("postgres");
            cmd.args(["-u", "postgres"]);
        }
        cmd.arg(dir.join("pgbouncer.ini"));
        let mut proc = Proc::spawn("pgbouncer", cmd, dir.join("pgbouncer.log"));
        if !wait_port(port, Duration::from_secs(10)) || !proc.running() {
            panic!(
                "pgbouncer did not start on port {port}\n{}",
                proc.log_tail(30)
            );
        }
        Some(PgBouncer {
            proc,
            port,
            pool_size,
            mode,
            _dir: dir,
        })
    }

    /// Whether pgbouncer is installed here.
    pub fn installed() -> bool {
        installed(PROGRAM)
    }

    /// The port it listens on (127.0.0.1).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Its server pool's size: at most this many connections to PostgreSQL.
    pub fn pool_size(&self) -> u32 {
        self.pool_size
    }

    /// Its pool mode.
    pub fn mode(&self) -> PoolMode {
        self.mode
    }

    /// The URL of the database `test` through it.
    pub fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/test", self.port)
    }

    /// The last `lines` lines of its log, for a failure message.
    pub fn log_tail(&self, lines: usize) -> String {
        self.proc.log_tail(lines)
    }
}
