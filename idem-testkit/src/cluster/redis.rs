//! One `redis-server` of the test's own, for the tests that stop it: its
//! own port on 127.0.0.1 and its own directory under the temporary folder,
//! no persistence (`--save ""`, `--appendonly no`; see below), killed and removed on
//! drop, also when the test panics. Never the machine's shared Redis.
//!
//! [`RedisServer::terminate`] stops it with SIGTERM (Redis's orderly
//! shutdown), [`RedisServer::kill9`] with SIGKILL (a crash);
//! [`RedisServer::restart`] starts it again on the same port and
//! directory, empty: nothing was saved. [`RedisServer::start_persistent`]
//! starts one with the append-only file on instead (`appendonly yes`,
//! `appendfsync always`: every write on disk before its reply), which a
//! restart, even after SIGKILL, reads back whole.
//!
//! ```no_run
//! use idem_testkit::cluster::redis::RedisServer;
//! let Some(mut redis) = RedisServer::start() else {
//!     return; // skipped: redis-server is not installed
//! };
//! let url = redis.url(); // redis://127.0.0.1:<port>/
//! redis.kill9();
//! redis.restart();
//! # let _ = url;
//! ```

use super::{Proc, Scratch, free_port, need};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::Command;
use std::time::{Duration, Instant};

/// The server, as Debian installs it (found on the `PATH`).
pub const REDIS_SERVER: &str = "redis-server";
/// How long the server may take to answer `PING` after a start.
const READY_WITHIN: Duration = Duration::from_secs(30);
/// How long SIGTERM may take before the server is killed.
const TERMINATE_WITHIN: Duration = Duration::from_secs(30);

/// A running `redis-server` of the test's own, killed (and its directory
/// removed) on drop.
#[derive(Debug)]
pub struct RedisServer {
    /// The running server (`None`: stopped). Dropped before `dir`.
    proc: Option<Proc>,
    port: u16,
    dir: Scratch,
    /// Servers started so far (names the log files).
    runs: usize,
    /// The append-only file on (every write fsynced before its reply).
    persistent: bool,
}

impl RedisServer {
    /// Starts a server on a free port and waits until it answers `PING`,
    /// or `None` when redis-server is missing (skipped locally, a failure
    /// when `CI=true`).
    ///
    /// # Panics
    ///
    /// When the server does not answer within 30 s (its log tail is in
    /// the message).
    pub fn start() -> Option<RedisServer> {
        RedisServer::start_with(false)
    }

    /// [`start`](Self::start), with the append-only file on
    /// (`appendonly yes`, `appendfsync always`): a [`restart`](Self::restart),
    /// also after [`kill9`](Self::kill9), finds every write it answered.
    ///
    /// # Panics
    ///
    /// As [`start`](Self::start).
    pub fn start_persistent() -> Option<RedisServer> {
        RedisServer::start_with(true)
    }

    fn start_with(persistent: bool) -> Option<RedisServer> {
        need("redis server", &[REDIS_SERVER])?;
        let mut server = RedisServer {
            proc: None,
            port: free_port(),
            dir: Scratch::new("redis"),
            runs: 0,
            persistent,
        };
        server.spawn();
        eprintln!("redis server: up on port {}", server.port);
        Some(server)
    }

    /// Its port on 127.0.0.1.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Its URL, `redis://127.0.0.1:<port>/`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// Whether it answers `PING` now.
    pub fn ping(&self) -> bool {
        ping(self.port)
    }

    /// Stops it with SIGTERM (an orderly shutdown: clients are
    /// disconnected), waiting up to 30 s before killing it.
    pub fn terminate(&mut self) {
        if let Some(mut p) = self.proc.take() {
            p.terminate(TERMINATE_WITHIN);
        }
    }

    /// Kills it with SIGKILL (a crash).
    pub fn kill9(&mut self) {
        if let Some(mut p) = self.proc.take() {
            p.kill9();
        }
    }

    /// Starts it again on the same port and directory (killing it first
    /// if it still runs) and waits until it answers `PING`. It starts
    /// empty (nothing was saved), unless it was started
    /// [persistent](Self::start_persistent).
    ///
    /// # Panics
    ///
    /// When it does not come back within 30 s.
    pub fn restart(&mut self) {
        self.kill9();
        self.spawn();
    }

    /// The last `lines` lines of the current (or last) run's log.
    pub fn log_tail(&self, lines: usize) -> String {
        match &self.proc {
            Some(p) => p.log_tail(lines),
            None => format!("--- redis server on port {}: not running ---", self.port),
        }
    }

    fn spawn(&mut self) {
        self.runs += 1;
        let mut cmd = Command::new(REDIS_SERVER);
        cmd.arg("--port")
            .arg(self.port.to_string())
            .args(["--bind", "127.0.0.1", "--protected-mode", "yes"])
            .arg("--dir")
            .arg(self.dir.path())
            .args(["--save", "", "--daemonize", "no"]);
        if self.persistent {
            cmd.args(["--appendonly", "yes", "--appendfsync", "always"]);
        } else {
            cmd.args(["--appendonly", "no"]);
        }
        cmd.args(["--logfile", ""]);
        let log = self.dir.join(&format!("run-{}.log", self.runs));
        self.proc = Some(Proc::spawn("redis-server", cmd, log));
        let start = Instant::now();
        while !self.ping() {
            let exited = self.proc.as_mut().is_some_and(|p| !p.running());
            assert!(
                !exited && start.elapsed() < READY_WITHIN,
                "redis-server on port {} did not start\n{}",
                self.port,
                self.log_tail(30)
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// Whether a Redis on 127.0.0.1:`port` answers `PING` with `+PONG`
/// within a second.
fn ping(port: u16) -> bool {
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let within = Duration::from_secs(1);
    let Ok(mut stream) = TcpStream::connect_timeout(&addr, within) else {
        return false;
    };
    let _ = stream.set_read_timeout(Some(within));
    let _ = stream.set_write_timeout(Some(within));
    let mut answer = [0u8; 7];
    stream.write_all(b"PING\r\n").is_ok()
        && stream.read_exact(&mut answer).is_ok()
        && &answer == b"+PONG\r\n"
}
