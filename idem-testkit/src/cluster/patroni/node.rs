//! One member: its Patroni (run as `postgres` through `runuser`), the
//! PostgreSQL that Patroni starts, and the signals a test sends to both.
//!
//! Patroni starts the postmaster in a session of its own (as `pg_ctl`
//! does), and every PostgreSQL child calls `setsid()` too: neither a
//! process group nor `runuser` reaches them. The member's processes are
//! found instead: `runuser` and its descendants (Patroni), and the
//! postmaster named in `postmaster.pid` (checked to be a `postgres`
//! process of this data directory) with its children.

use super::{BIN, PATRONI};
use crate::cluster::{Proc, as_user, descendants};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

/// One member of the cluster.
#[derive(Debug)]
pub(super) struct Node {
    /// `node0`, `node1`, … (Patroni's member name, the standby's
    /// `application_name`).
    pub(super) name: String,
    pub(super) pg_port: u16,
    pub(super) rest_port: u16,
    pub(super) data: PathBuf,
    config: PathBuf,
    dir: PathBuf,
    /// `runuser … patroni`; `None` once killed.
    proc: Mutex<Option<Proc>>,
    /// Patronis started so far (names the log files).
    runs: AtomicUsize,
}

/// Which of a member's processes a signal goes to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Part {
    /// Patroni (and `runuser` above it).
    Patroni,
    /// The postmaster and its children.
    Postgres,
    /// Both, the postmaster first (stopped, it forks no child the listing
    /// would miss).
    Both,
}

impl Node {
    /// A member named `name`: its data directory `dir/{name}`, its
    /// configuration `dir/{name}.yml` (written by the caller), its logs
    /// `dir/{name}*.log`.
    pub(super) fn new(name: String, pg_port: u16, rest_port: u16, dir: &Path) -> Node {
        Node {
            data: dir.join(&name),
            config: dir.join(format!("{name}.yml")),
            dir: dir.to_owned(),
            name,
            pg_port,
            rest_port,
            proc: Mutex::new(None),
            runs: AtomicUsize::new(0),
        }
    }

    pub(super) fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.pg_port)
    }

    /// Where its Patroni configuration goes.
    pub(super) fn config_path(&self) -> &Path {
        &self.config
    }

    /// Starts its Patroni (the first time, or again after a kill: it then
    /// rejoins with `pg_rewind`, or a new base backup if that fails). Its
    /// log is `{name}.log`, then `{name}-2.log`, ….
    pub(super) fn spawn(&self) {
        let run = self.runs.fetch_add(1, Ordering::Relaxed) + 1;
        let log = if run == 1 {
            self.dir.join(format!("{}.log", self.name))
        } else {
            self.dir.join(format!("{}-{run}.log", self.name))
        };
        let mut cmd = as_user("postgres", PATRONI);
        cmd.arg(&self.config);
        let proc = Proc::spawn(&self.name, cmd, log);
        if let Ok(mut slot) = self.proc.lock()
            && let Some(mut old) = slot.replace(proc)
        {
            old.kill9();
        }
    }

    /// Whether its Patroni runs (started and not killed).
    pub(super) fn running(&self) -> bool {
        self.proc
            .lock()
            .is_ok_and(|mut p| p.as_mut().is_some_and(Proc::running))
    }

    /// Sends `signal` (`STOP`, `CONT`, `KILL`) to `part` of the member.
    pub(super) fn signal(&self, signal: &str, part: Part) {
        let postmaster = self.postmaster();
        let mut pids = Vec::new();
        if part != Part::Patroni
            && let Some(pm) = postmaster
        {
            // Stopped first, it forks no child after the listing.
            if signal != "CONT" {
                send("STOP", &[pm]);
            }
            pids.push(pm);
            pids.extend(descendants(pm));
        }
        if part != Part::Postgres {
            let root = self
                .proc
                .lock()
                .ok()
                .and_then(|p| p.as_ref().and_then(Proc::pid));
            if let Some(root) = root {
                pids.push(root);
                pids.extend(descendants(root));
            }
        }
        send(signal, &pids);
    }

    /// SIGKILL to Patroni and PostgreSQL at once (a machine crash: no
    /// shutdown, no demotion), then reaps `runuser`. It stays dead until
    /// [`spawn`](Node::spawn)ed again.
    pub(super) fn kill9(&self) {
        self.signal("KILL", Part::Both);
        if let Ok(mut slot) = self.proc.lock()
            && let Some(mut p) = slot.take()
        {
            p.kill9();
        }
    }

    /// The running postmaster of this data directory, if any (the pid file
    /// of a dead one may name a process that reused the pid).
    fn postmaster(&self) -> Option<u32> {
        let pid = std::fs::read_to_string(self.data.join("postmaster.pid"))
            .ok()?
            .lines()
            .next()?
            .trim()
            .parse::<u32>()
            .ok()?;
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
        let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
        let ours = cmdline.starts_with(&format!("{BIN}/postgres"))
            && cmdline.contains(&*self.data.to_string_lossy());
        ours.then_some(pid)
    }

    pub(super) fn log_tail(&self, lines: usize) -> String {
        self.proc
            .lock()
            .ok()
            .and_then(|p| p.as_ref().map(|p| p.log_tail(lines)))
            .unwrap_or_else(|| format!("--- {} (not running) ---", self.name))
    }
}

/// `kill -<signal> pids…` (a process may have exited since the listing).
fn send(signal: &str, pids: &[u32]) {
    if pids.is_empty() {
        return;
    }
    let _ = Command::new("kill")
        .arg(format!("-{signal}"))
        .args(pids.iter().map(u32::to_string))
        .stderr(Stdio::null())
        .status();
}
