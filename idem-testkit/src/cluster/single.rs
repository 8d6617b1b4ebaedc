//! One database server of the test's own, PostgreSQL or MariaDB, on a
//! port and in a data directory of its own, for the tests that stop it
//! under a running service and start it again: [`Single::terminate`] (a
//! clean shutdown), [`Single::kill9`] (a crash), then [`Single::restart`]
//! on the same port and data. Everything is killed on drop and the
//! directory removed, also when the test fails.
//!
//! - PostgreSQL 15 (`initdb`, `postgres` from [`pg_standby::BIN`], as
//!   the `postgres` system user): trust authentication on 127.0.0.1,
//!   database `postgres`, the settings of [`pg_standby`]'s servers
//!   (`fsync=off` loses nothing a SIGKILL of the server can lose: the
//!   kernel has every write).
//! - MariaDB (`mariadb-install-db`, [`galera::MARIADBD`], as the `mysql`
//!   system user when the test runs as root): `root` without a password,
//!   database `test`; `innodb_flush_log_at_trx_commit=2`, each commit
//!   written to the kernel (a killed server loses no acknowledged commit;
//!   only a machine crash would).
//!
//! ```no_run
//! use idem_testkit::cluster::single::Single;
//! let Some(db) = Single::postgres("my_test") else {
//!     return; // skipped: PostgreSQL 15 is not installed
//! };
//! let url = db.url();
//! db.kill9();
//! db.restart();
//! # let _ = url;
//! ```
//!
//! [`pg_standby::BIN`]: super::pg_standby::BIN
//! [`pg_standby`]: super::pg_standby
//! [`galera::MARIADBD`]: super::galera::MARIADBD

use super::galera::{MARIADBD, running_as_root, system_user_exists};
use super::pg_standby::BIN;
use super::pg_standby::node::{initdb, instance_pids, run, server_command, wait_ready};
use super::{Proc, Scratch, free_port, need, wait_port};
use std::path::PathBuf;
use std::process::Command;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// How long a server may take to start (crash recovery included).
const START_WITHIN: Duration = Duration::from_secs(60);

/// Which server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Engine {
    /// PostgreSQL 15.
    Postgres,
    /// MariaDB.
    MariaDb,
}

/// A single server of the test's own (see the [module](self)).
#[derive(Debug)]
pub struct Single {
    engine: Engine,
    port: u16,
    data: PathBuf,
    /// The running server (`None`: stopped). Dropped before `scratch`.
    proc: Mutex<Option<Proc>>,
    /// The system user the server runs as (`None`: the current user).
    user: Option<&'static str>,
    /// Servers started so far (names the log files).
    runs: AtomicUsize,
    scratch: Scratch,
}

impl Single {
    /// A PostgreSQL server, started and accepting connections; `None`
    /// (skipped locally, a failure when `CI=true`) when PostgreSQL 15 is
    /// not installed. Blocks for a few seconds (`initdb`).
    ///
    /// # Panics
    ///
    /// When the server does not start (its log in the message).
    pub fn postgres(test: &str) -> Option<Single> {
        need(
            test,
            &[
                &format!("{BIN}/initdb"),
                &format!("{BIN}/postgres"),
                &format!("{BIN}/pg_isready"),
                "runuser",
            ],
        )?;
        let scratch = Scratch::new("pg-single");
        scratch.chown("postgres");
        let data = scratch.join("data");
        initdb(&data);
        let db = Single::new(Engine::Postgres, data, Some("postgres"), scratch);
        db.spawn();
        Some(db)
    }

    /// A MariaDB server with a database `test`, started and accepting
    /// connections; `None` (skipped locally, a failure when `CI=true`)
    /// when MariaDB is not installed.
    ///
    /// # Panics
    ///
    /// When the server does not start (its log in the message).
    pub fn mariadb(test: &str) -> Option<Single> {
        need(test, &[MARIADBD, "mariadb-install-db", "mariadb"])?;
        let user = running_as_root().then_some("mysql");
        if user.is_some() && !system_user_exists("mysql") {
            crate::unreachable(
                &format!("{test}: the `mysql` system user"),
                "missing (the server runs as it when the tests run as root)",
            );
            return None;
        }
        let scratch = Scratch::new("mariadb-single");
        let data = scratch.join("data");
        std::fs::create_dir_all(&data).expect("create the data directory");
        if let Some(user) = user {
            scratch.chown(user);
        }
        let mut install = Command::new("mariadb-install-db");
        install
            .arg("--no-defaults")
            .arg(format!("--datadir={}", data.display()))
            .arg("--auth-root-authentication-method=normal")
            .arg("--skip-test-db")
            .args(MARIADB_SETTINGS);
        if let Some(user) = user {
            install.arg(format!("--user={user}"));
        }
        run("mariadb-install-db", install);
        let db = Single::new(Engine::MariaDb, data, user, scratch);
        db.spawn();
        let out = db
            .client()
            .arg("-e")
            .arg("CREATE DATABASE IF NOT EXISTS test")
            .output()
            .expect("run mariadb");
        assert!(
            out.status.success(),
            "CREATE DATABASE test: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Some(db)
    }

    fn new(engine: Engine, data: PathBuf, user: Option<&'static str>, scratch: Scratch) -> Single {
        Single {
            engine,
            port: free_port(),
            data,
            proc: Mutex::new(None),
            user,
            runs: AtomicUsize::new(0),
            scratch,
        }
    }

    /// Which server it is.
    pub fn engine(&self) -> Engine {
        self.engine
    }

    /// Its URL: `postgres://postgres@127.0.0.1:{port}/postgres`, or
    /// `mysql://root@127.0.0.1:{port}/test`.
    pub fn url(&self) -> String {
        match self.engine {
            Engine::Postgres => format!("postgres://postgres@127.0.0.1:{}/postgres", self.port),
            Engine::MariaDb => format!("mysql://root@127.0.0.1:{}/test", self.port),
        }
    }

    /// Whether the server runs.
    pub fn running(&self) -> bool {
        self.proc
            .lock()
            .expect("proc")
            .as_mut()
            .is_some_and(Proc::running)
    }

    /// A clean shutdown, waited for. MariaDB: SIGTERM (running statements
    /// end with `1053`, sessions are closed). PostgreSQL: SIGTERM, a
    /// *smart* shutdown, which refuses new sessions (`57P03`) but waits
    /// for the open ones, a pool's included, to end by themselves; after
    /// 2 s SIGINT, the *fast* shutdown `pg_ctl stop` makes (open sessions
    /// ended with `57P01`). SIGKILL after 60 s.
    pub fn terminate(&self) {
        let mut guard = self.proc.lock().expect("proc");
        let Some(proc) = guard.as_mut() else { return };
        match self.engine {
            Engine::Postgres => {
                let pids = instance_pids(&self.data);
                if let Some(&postmaster) = pids.first() {
                    signal("TERM", postmaster);
                    if !exits(proc, Duration::from_secs(2)) {
                        signal("INT", postmaster);
                    }
                }
            }
            Engine::MariaDb => {
                if let Some(pid) = proc.pid() {
                    signal("TERM", pid);
                }
            }
        }
        exits(proc, Duration::from_secs(60));
        drop(guard);
        self.kill9();
    }

    /// SIGKILL to the server and, for PostgreSQL, every process it
    /// started, at once: a crash (no shutdown, no checkpoint).
    pub fn kill9(&self) {
        let Some(mut proc) = self.proc.lock().expect("proc").take() else {
            return;
        };
        // Only a running server: a dead one's pid file may name a process
        // that reused its pid.
        if self.engine == Engine::Postgres && proc.running() {
            let pids = instance_pids(&self.data);
            let _ = Command::new("kill")
                .arg("-9")
                .args(pids.iter().map(u32::to_string))
                .stderr(std::process::Stdio::null())
                .status();
        }
        proc.kill9();
    }

    /// Starts the server again (after [`terminate`](Self::terminate) or
    /// [`kill9`](Self::kill9); a running one is killed first) on the same
    /// port and data, and waits until it accepts connections (after its
    /// crash recovery).
    ///
    /// # Panics
    ///
    /// When it does not start.
    pub fn restart(&self) {
        self.kill9();
        self.spawn();
    }

    /// The last `lines` lines of the current run's log.
    pub fn log_tail(&self, lines: usize) -> String {
        match self.proc.lock().expect("proc").as_ref() {
            Some(p) => p.log_tail(lines),
            None => "--- the server is stopped ---".into(),
        }
    }

    /// Starts the server and waits until it accepts connections.
    fn spawn(&self) {
        let run = self.runs.fetch_add(1, Ordering::Relaxed);
        let log = self.scratch.join(&format!("run{run}.log"));
        let (name, cmd) = match self.engine {
            Engine::Postgres => (
                "postgres",
                server_command(&self.data, self.port, self.scratch.path(), &[]),
            ),
            Engine::MariaDb => ("mariadbd", self.mariadbd()),
        };
        *self.proc.lock().expect("proc") = Some(Proc::spawn(name, cmd, log));
        let ready = match self.engine {
            Engine::Postgres => wait_ready(self.port, START_WITHIN),
            Engine::MariaDb => self.wait_mariadb(),
        };
        assert!(
            ready,
            "{name} did not start on port {}\n{}",
            self.port,
            self.log_tail(40)
        );
    }

    fn mariadbd(&self) -> Command {
        let mut cmd = Command::new(MARIADBD);
        cmd.arg("--no-defaults")
            .arg(format!("--datadir={}", self.data.display()))
            .arg(format!("--port={}", self.port))
            .arg("--bind-address=127.0.0.1")
            .arg(format!(
                "--socket={}",
                self.scratch.join("mysqld.sock").display()
            ))
            .arg(format!(
                "--pid-file={}",
                self.scratch.join("mysqld.pid").display()
            ))
            .args(MARIADB_SETTINGS)
            .arg("--max-connections=200");
        if let Some(user) = self.user {
            cmd.arg(format!("--user={user}"));
        }
        cmd
    }

    /// Waits until MariaDB answers a ping (past its crash recovery).
    fn wait_mariadb(&self) -> bool {
        let deadline = Instant::now() + START_WITHIN;
        while Instant::now() < deadline {
            if !self.running() {
                return false;
            }
            if wait_port(self.port, Duration::from_millis(200))
                && self
                    .client()
                    .args(["-e", "SELECT 1"])
                    .output()
                    .is_ok_and(|o| o.status.success())
            {
                return true;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        false
    }

    fn client(&self) -> Command {
        let mut cmd = Command::new("mariadb");
        cmd.arg("--no-defaults")
            .args(["-h", "127.0.0.1", "-u", "root", "-N", "-B"])
            .arg(format!("-P{}", self.port));
        cmd
    }
}

/// A small, fast server that keeps every acknowledged commit through a
/// kill of the server (each commit written to the kernel).
const MARIADB_SETTINGS: [&str; 5] = [
    "--innodb-buffer-pool-size=32M",
    "--innodb-log-file-size=16M",
    "--innodb-flush-log-at-trx-commit=2",
    "--innodb-doublewrite=0",
    "--skip-name-resolve",
];

/// Sends `SIG{sig}` to `pid`.
fn signal(sig: &str, pid: u32) {
    let _ = Command::new("kill")
        .arg(format!("-{sig}"))
        .arg(pid.to_string())
        .stderr(std::process::Stdio::null())
        .status();
}

/// Waits up to `within` for `proc` to exit; whether it did.
fn exits(proc: &mut Proc, within: Duration) -> bool {
    let deadline = Instant::now() + within;
    while Instant::now() < deadline {
        if !proc.running() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    false
}

impl Drop for Single {
    fn drop(&mut self) {
        self.kill9();
        // The scratch, dropped right after, removes the data directory.
    }
}
