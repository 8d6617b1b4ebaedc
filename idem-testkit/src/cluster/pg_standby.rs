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

use super::{Proc, Scratch, as_user, free_port, need, wait_port};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{Connection, PgConnection, PgPool};
use std::path::{Path, PathBuf};
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

/// One server of the pair.
#[derive(Debug)]
struct Node {
    port: u16,
    data: PathBuf,
    /// `runuser … postgres` (the server's processes are killed through
    /// the pid in `postmaster.pid`: `runuser` does not pass SIGKILL on).
    proc: Mutex<Proc>,
}

impl Node {
    fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    /// SIGKILL to the postmaster and every process it started, at once:
    /// what a machine crash leaves (no shutdown checkpoint, the WAL
    /// sender gone with it).
    fn kill9(&self) {
        let Ok(mut proc) = self.proc.lock() else {
            return;
        };
        // Only a running server: the pid file of a dead one may name a
        // process that reused the pid.
        if !proc.running() {
            return;
        }
        let mut pids = instance_pids(&self.data);
        pids.extend(proc.pid());
        // A child may have exited since the listing.
        let _ = Command::new("kill")
            .arg("-9")
            .args(pids.iter().map(u32::to_string))
            .stderr(std::process::Stdio::null())
            .status();
        proc.kill9();
    }

    fn log_tail(&self, lines: usize) -> String {
        self.proc
            .lock()
            .map(|p| p.log_tail(lines))
            .unwrap_or_default()
    }
}

/// The postmaster of the data directory `data` (from `postmaster.pid`)
/// and its children.
fn instance_pids(data: &Path) -> Vec<u32> {
    let Some(postmaster) = std::fs::read_to_string(data.join("postmaster.pid"))
        .ok()
        .and_then(|s| s.lines().next().and_then(|l| l.trim().parse::<u32>().ok()))
    else {
        return Vec::new();
    };
    let mut pids = vec![postmaster];
    if let Ok(entries) = std::fs::read_dir("/proc") {
        for entry in entries.flatten() {
            let Some(pid) = entry
                .file_name()
                .to_str()
                .and_then(|s| s.parse::<u32>().ok())
            else {
                continue;
            };
            // `pid (comm) state ppid …`; the name may hold spaces.
            let ppid = std::fs::read_to_string(entry.path().join("stat"))
                .ok()
                .and_then(|s| {
                    let rest = s.rsplit_once(')')?.1.to_owned();
                    rest.split_whitespace().nth(1)?.parse::<u32>().ok()
                });
            if ppid == Some(postmaster) {
                pids.push(pid);
            }
        }
    }
    pids
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

/// Runs `cmd` to completion; panics with its output when it fails.
fn run(what: &str, mut cmd: Command) {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("{what}: cannot start ({cmd:?}): {e}"));
    assert!(
        out.status.success(),
        "{what} failed ({}):\n{}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The settings both servers start with (`-c name=value`), and the port.
fn server_command(data: &Path, port: u16, sockets: &Path, extra: &[String]) -> Command {
    let mut cmd = as_user("postgres", &format!("{BIN}/postgres"));
    cmd.arg("-D").arg(data).arg("-p").arg(port.to_string());
    let mut settings = vec![
        "listen_addresses=127.0.0.1".to_owned(),
        format!("unix_socket_directories={}", sockets.display()),
        "wal_level=replica".into(),
        "max_wal_senders=4".into(),
        "max_replication_slots=4".into(),
        "hot_standby=on".into(),
        "fsync=off".into(),
        "full_page_writes=off".into(),
        "shared_buffers=16MB".into(),
        "max_connections=100".into(),
        // The standby's reconnect after the promotion is of no interest.
        "wal_retrieve_retry_interval=200ms".into(),
        "log_min_messages=warning".into(),
        "log_line_prefix=%m [%p] %a ".into(),
    ];
    settings.extend_from_slice(extra);
    for s in settings {
        cmd.arg("-c").arg(s);
    }
    cmd
}

/// Waits until the server on `port` accepts connections (past its start
/// up), for at most `within`.
fn wait_ready(port: u16, within: Duration) -> bool {
    let deadline = Instant::now() + within;
    while Instant::now() < deadline {
        let ok = Command::new(format!("{BIN}/pg_isready"))
            .args(["-q", "-h", "127.0.0.1", "-p", &port.to_string(), "-t", "1"])
            .status()
            .is_ok_and(|s| s.success());
        if ok {
            return true;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    false
}

/// A single-value query through `psql` (empty on failure).
fn psql(port: u16, query: &str) -> String {
    Command::new(format!("{BIN}/psql"))
        .args([
            "-XAtq",
            "-h",
            "127.0.0.1",
            "-p",
            &port.to_string(),
            "-U",
            "postgres",
            "-d",
            "postgres",
            "-c",
            query,
        ])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_default()
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

        let mut initdb = as_user("postgres", &format!("{BIN}/initdb"));
        initdb.arg("-D").arg(&primary_data).args([
            "-U",
            "postgres",
            "--auth=trust",
            "-E",
            "UTF8",
            "--no-sync",
        ]);
        run("initdb", initdb);

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

/// haproxy in TCP mode: the primary, then the standby as the backup.
///
/// `retries 0`: a connection the dead primary refuses fails at once, and
/// the client retries on its own; haproxy's own retries wait a turn-around
/// of `min(timeout connect, 1 s)` each and stay on the dead server (its
/// backup takes only new connections once it is marked down), so with
/// them every client stalls a second or two in its connect.
fn haproxy_config(port: u16, primary: u16, standby: u16) -> String {
    format!(
        "global\n\
         \x20   maxconn 512\n\
         defaults\n\
         \x20   mode tcp\n\
         \x20   timeout connect 1s\n\
         \x20   timeout client 1h\n\
         \x20   timeout server 1h\n\
         \x20   retries 0\n\
         listen postgres\n\
         \x20   bind 127.0.0.1:{port}\n\
         \x20   default-server inter 200ms fall 2 rise 1 on-marked-down shutdown-sessions\n\
         \x20   server primary 127.0.0.1:{primary} check\n\
         \x20   server standby 127.0.0.1:{standby} check backup\n"
    )
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
