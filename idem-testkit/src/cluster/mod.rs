//! Servers a test starts for itself: clusters and proxies on ports and data
//! directories of their own, torn down when the handle drops (also when the
//! test fails or panics).
//!
//! The pieces every harness shares are here: a [`Scratch`] directory, a
//! [`free_port`], a [`Proc`] (a child process killed on drop, with its log
//! file), [`wait_port`], and [`need`], the skip rule for a program that is
//! not installed (skipped locally, a failure when `CI=true`).
//!
//! Harnesses: [`galera::Galera`], a MariaDB Galera cluster; with the
//! `nats` feature, [`nats::NatsCluster`], a NATS JetStream cluster;
//! [`rabbitmq::RabbitCluster`], a RabbitMQ cluster (quorum queues);
//! [`pg_standby::PgStandby`], a PostgreSQL primary and a standby promoted
//! by hand; [`patroni::Patroni`], three PostgreSQL members managed by
//! Patroni over etcd; both behind haproxy; [`redis::RedisServer`], one
//! `redis-server` to stop and start again; [`single::Single`], one
//! PostgreSQL or MariaDB server to stop and start again under a service;
//! with the `kafka` feature, [`kafka::KafkaBroker`], one Kafka-protocol
//! broker (nisshi) to kill and start again on the same storage; with the
//! `rocketmq` feature, [`rocketmq::RocketMq`], a RocketMQ name server and
//! broker master (and slave) to kill and start again on the same store.

pub mod galera;
#[cfg(feature = "kafka")]
pub mod kafka;
#[cfg(feature = "nats")]
pub mod nats;

pub mod patroni;
pub mod pg_standby;
pub mod pgbouncer;
pub mod rabbitmq;
pub mod redis;
#[cfg(feature = "rocketmq")]
pub mod rocketmq;
pub mod single;

use std::collections::HashMap;
use std::fs::File;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A directory under the system's temporary folder, removed on drop.
#[derive(Debug)]
pub struct Scratch {
    path: PathBuf,
}

impl Scratch {
    /// A new empty directory named after `what` and a unique suffix.
    ///
    /// # Panics
    ///
    /// When the directory cannot be made.
    pub fn new(what: &str) -> Scratch {
        let path = std::env::temp_dir().join(crate::unique(&format!("idem-{what}")));
        std::fs::create_dir_all(&path).expect("create the scratch directory");
        Scratch { path }
    }

    /// A new empty directory under `/dev/shm` (memory, a file system of
    /// its own) when there is one, else as [`Scratch::new`]: for a server
    /// that refuses to start on a disk fuller than it likes, whatever the
    /// machine's builds have taken.
    pub fn in_memory(what: &str) -> Scratch {
        let shm = Path::new("/dev/shm");
        if !shm.is_dir() {
            return Scratch::new(what);
        }
        let path = shm.join(crate::unique(&format!("idem-{what}")));
        match std::fs::create_dir_all(&path) {
            Ok(()) => Scratch { path },
            Err(_) => Scratch::new(what),
        }
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// `name` inside the directory.
    pub fn join(&self, name: &str) -> PathBuf {
        self.path.join(name)
    }

    /// Gives the directory (recursively) to a system user, for servers that
    /// refuse to run as root (PostgreSQL).
    ///
    /// # Panics
    ///
    /// When `chown` fails.
    pub fn chown(&self, user: &str) {
        let ok = Command::new("chown")
            .arg("-R")
            .arg(format!("{user}:{user}"))
            .arg(&self.path)
            .status()
            .is_ok_and(|s| s.success());
        assert!(ok, "chown -R {user} {}", self.path.display());
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        if std::env::var_os("IDEM_KEEP_SCRATCH").is_none() {
            let _ = std::fs::remove_dir_all(&self.path);
        }
    }
}

/// A TCP port on 127.0.0.1 that was free a moment ago, below the kernel's
/// ephemeral range.
///
/// Below it, because a port handed out by the kernel (`bind` to port 0)
/// stays in the range the kernel also takes the local ports of outgoing
/// connections from: between this call and the server's own `bind`, a
/// connection (a cluster's nodes dialing each other, a test's clients)
/// could take it, and the server then exits with "address already in use"
/// (seen once in a loaded suite run, a NATS node). The search starts at a
/// place that differs per process and call, so that harnesses of
/// concurrent test processes seldom try the same ports.
///
/// # Panics
///
/// When no port can be bound.
pub fn free_port() -> u16 {
    use std::sync::atomic::{AtomicU32, Ordering};
    static CALLS: AtomicU32 = AtomicU32::new(0);
    let ephemeral_low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse::<u32>().ok())
        .unwrap_or(32768);
    // 10,000 ports below the range, not below 1024.
    let low = ephemeral_low.saturating_sub(10_000).max(1024);
    let span = ephemeral_low.saturating_sub(low).max(1);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    let seed = std::process::id()
        .wrapping_mul(7919)
        .wrapping_add(nanos)
        .wrapping_add(CALLS.fetch_add(1, Ordering::Relaxed).wrapping_mul(104_729));
    for i in 0..span {
        let port = low + (seed.wrapping_add(i) % span);
        let Ok(port) = u16::try_from(port) else {
            continue;
        };
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("bind a port")
        .port()
}

/// Waits until something accepts TCP connections on `port`, for at most
/// `within`. Returns whether it did.
pub fn wait_port(port: u16, within: Duration) -> bool {
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let deadline = Instant::now() + within;
    while Instant::now() < deadline {
        if TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    false
}

/// Whether `program` is on the `PATH` (or is an existing path).
pub fn installed(program: &str) -> bool {
    if program.contains('/') {
        return Path::new(program).exists();
    }
    std::env::var_os("PATH")
        .is_some_and(|paths| std::env::split_paths(&paths).any(|dir| dir.join(program).is_file()))
}

/// The skip rule for programs: `Some(())` when every one of `programs` is
/// installed; otherwise prints `SKIPPED: …` and returns `None` locally, and
/// panics when `CI=true` (`.ci/run` installs them).
pub fn need(test: &str, programs: &[&str]) -> Option<()> {
    let missing: Vec<&str> = programs.iter().copied().filter(|p| !installed(p)).collect();
    if missing.is_empty() {
        return Some(());
    }
    crate::unreachable(
        &format!("{test}: {}", missing.join(", ")),
        "not installed (Debian packages; .ci/run installs them)",
    );
    None
}

/// A server process the test started: killed (SIGKILL) and reaped on drop.
#[derive(Debug)]
pub struct Proc {
    name: String,
    child: Option<Child>,
    log: PathBuf,
}

impl Proc {
    /// Starts `cmd` with its stdout and stderr in `log`.
    ///
    /// # Panics
    ///
    /// When the log file cannot be made or the program cannot start.
    pub fn spawn(name: &str, mut cmd: Command, log: PathBuf) -> Proc {
        let out = File::create(&log).expect("create the log file");
        let err = out.try_clone().expect("clone the log file");
        let child = cmd
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .unwrap_or_else(|e| panic!("start {name} ({cmd:?}): {e}"));
        Proc {
            name: name.into(),
            child: Some(child),
            log,
        }
    }

    /// The process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Whether it is still running.
    pub fn running(&mut self) -> bool {
        self.child
            .as_mut()
            .is_some_and(|c| matches!(c.try_wait(), Ok(None)))
    }

    /// Kills it with SIGKILL (a crash: no shutdown, no flush) and reaps it.
    pub fn kill9(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Sends SIGTERM and waits up to `within` for it to exit, then kills it.
    pub fn terminate(&mut self, within: Duration) {
        if let Some(mut child) = self.child.take() {
            let _ = Command::new("kill")
                .arg("-TERM")
                .arg(child.id().to_string())
                .status();
            let deadline = Instant::now() + within;
            while Instant::now() < deadline {
                if !matches!(child.try_wait(), Ok(None)) {
                    return;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// The last `lines` lines of its log, for a failure message.
    pub fn log_tail(&self, lines: usize) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let all: Vec<&str> = text.lines().collect();
        let from = all.len().saturating_sub(lines);
        format!(
            "--- {} ({}) ---\n{}",
            self.name,
            self.log.display(),
            all[from..].join("\n")
        )
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.kill9();
    }
}

/// A command that runs `program` as the system user `user` (through
/// `runuser`, when the test runs as root; directly otherwise).
pub fn as_user(user: &str, program: &str) -> Command {
    let root = Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| o.stdout.starts_with(b"0\n"));
    if root {
        let mut cmd = Command::new("runuser");
        cmd.args(["-u", user, "--", program]);
        cmd
    } else {
        Command::new(program)
    }
}

/// Every descendant of `root` (children, their children, …), from `/proc`.
pub(crate) fn descendants(root: u32) -> Vec<u32> {
    let mut children: HashMap<u32, Vec<u32>> = HashMap::new();
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
            if let Some(ppid) = ppid {
                children.entry(ppid).or_default().push(pid);
            }
        }
    }
    let mut found = Vec::new();
    let mut todo = vec![root];
    while let Some(p) = todo.pop() {
        for &c in children.get(&p).map(Vec::as_slice).unwrap_or_default() {
            found.push(c);
            todo.push(c);
        }
    }
    found
}
