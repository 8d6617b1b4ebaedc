//! One server of the pair: its process, its settings, and the client
//! programs (`pg_isready`, `psql`) the harness asks it through.

use super::BIN;
use crate::cluster::{Proc, as_user, descendants};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// One server of the pair.
#[derive(Debug)]
pub(super) struct Node {
    pub(super) port: u16,
    pub(super) data: PathBuf,
    /// `runuser … postgres` (the server's processes are killed through
    /// the pid in `postmaster.pid`: `runuser` does not pass SIGKILL on).
    pub(super) proc: Mutex<Proc>,
}

impl Node {
    pub(super) fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    /// SIGKILL to the postmaster and every process it started, at once:
    /// what a machine crash leaves (no shutdown checkpoint, the WAL
    /// sender gone with it).
    pub(super) fn kill9(&self) {
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

    pub(super) fn log_tail(&self, lines: usize) -> String {
        self.proc
            .lock()
            .map(|p| p.log_tail(lines))
            .unwrap_or_default()
    }
}

/// The postmaster of the data directory `data` (from `postmaster.pid`)
/// and its children.
pub(in crate::cluster) fn instance_pids(data: &Path) -> Vec<u32> {
    let Some(postmaster) = std::fs::read_to_string(data.join("postmaster.pid"))
        .ok()
        .and_then(|s| s.lines().next().and_then(|l| l.trim().parse::<u32>().ok()))
    else {
        return Vec::new();
    };
    // The backends and auxiliary processes (and whatever they started).
    let mut pids = vec![postmaster];
    pids.extend(descendants(postmaster));
    pids
}

/// The settings both servers start with (`-c name=value`), and the port.
pub(in crate::cluster) fn server_command(
    data: &Path,
    port: u16,
    sockets: &Path,
    extra: &[String],
) -> Command {
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
pub(in crate::cluster) fn wait_ready(port: u16, within: Duration) -> bool {
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
pub(super) fn psql(port: u16, query: &str) -> String {
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

/// Runs `cmd` to completion; panics with its output when it fails.
pub(in crate::cluster) fn run(what: &str, mut cmd: Command) {
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

/// A new cluster's data directory in `data` (`initdb` as `postgres`, trust
/// authentication, UTF-8, no sync).
pub(in crate::cluster) fn initdb(data: &Path) {
    let mut initdb = as_user("postgres", &format!("{BIN}/initdb"));
    initdb
        .arg("-D")
        .arg(data)
        .args(["-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-sync"]);
    run("initdb", initdb);
}
