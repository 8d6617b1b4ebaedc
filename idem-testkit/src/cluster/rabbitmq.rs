//! A RabbitMQ cluster of `n` nodes on this machine, for the tests of the
//! AMQP adapter across a failover: a quorum queue replicated on every
//! node, its leader's node killed with SIGKILL while messages flow, then
//! started again.
//!
//! Each node is a `rabbitmq-server` of its own: node name
//! `idemrmq<pid>c<cluster>n<i>@localhost`, its own AMQP and distribution ports
//! (`RABBITMQ_NODE_PORT`, `RABBITMQ_DIST_PORT`), data, log and config
//! under one [`Scratch`] folder (`RABBITMQ_MNESIA_BASE`,
//! `RABBITMQ_LOG_BASE`, `RABBITMQ_CONFIG_FILE`,
//! `RABBITMQ_ENABLED_PLUGINS_FILE` with no plugin), and the cluster's own
//! Erlang cookie in a `.erlang.cookie` (mode 0400) under a `HOME` of its
//! own. `/etc/rabbitmq/rabbitmq-env.conf` is not read
//! (`RABBITMQ_CONF_ENV_FILE` points into the scratch folder), and nothing
//! under `/var/lib/rabbitmq` or `/root` is touched: the machine's own
//! broker keeps running beside it. The epmd on 4369 is shared.
//!
//! Start-up: every node boots as a cluster of one; nodes 1… then join
//! node 0 with `rabbitmqctl stop_app`, `join_cluster`, `start_app`.
//! Readiness is polled (the AMQP port, then `rabbitmqctl await_startup`).
//! Every `rabbitmqctl` call boots an Erlang VM (about a second of CPU):
//! three nodes take 30 s here on 2 busy cores, 90 s beside a build. A node killed with [`RabbitCluster::kill9`] and
//! [`restart`](RabbitCluster::restart)ed keeps its data directory and
//! rejoins the cluster.
//!
//! Teardown, on drop (also when the test panics): every node's beam
//! process is killed (the pid it wrote, then any process whose command line
//! still names the node), the child processes reaped, the folder removed.
//!
//! ```no_run
//! use idem_testkit::cluster::rabbitmq::RabbitCluster;
//! let Some(cluster) = RabbitCluster::start(3) else {
//!     return; // skipped: rabbitmq-server is not installed
//! };
//! let leader = cluster.quorum_leader(0, "orders");
//! # let _ = leader;
//! ```

use super::{Proc, Scratch, free_port, need, wait_port};
use std::path::PathBuf;
use std::process::{Command, Output};
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// The server, without Debian's wrapper (which would run it as the
/// `rabbitmq` user with that user's `HOME` and cookie).
pub const RABBITMQ_SERVER: &str = "/usr/lib/rabbitmq/bin/rabbitmq-server";
/// The control tool, without Debian's wrapper.
pub const RABBITMQCTL: &str = "/usr/lib/rabbitmq/bin/rabbitmqctl";
/// The quorum queue tool, without Debian's wrapper.
pub const RABBITMQ_QUEUES: &str = "/usr/lib/rabbitmq/bin/rabbitmq-queues";
/// How long a node may take to boot (or to restart and rejoin).
const READY_WITHIN: Duration = Duration::from_secs(90);

/// One node's name, ports and directory.
#[derive(Debug)]
struct Node {
    name: String,
    port: u16,
    dist: u16,
    dir: PathBuf,
}

/// A running RabbitMQ cluster, torn down (every node killed, the folder
/// removed) on drop.
#[derive(Debug)]
pub struct RabbitCluster {
    /// The running servers (`None`: killed). Dropped before `dir`.
    procs: Mutex<Vec<Option<Proc>>>,
    nodes: Vec<Node>,
    home: PathBuf,
    dir: Scratch,
    started_in: Duration,
    /// Servers started so far (names the log files).
    runs: AtomicUsize,
}

impl RabbitCluster {
    /// Starts `nodes` nodes, joins them into one cluster and waits until
    /// every node runs, or `None` when rabbitmq-server is missing (skipped
    /// locally, a failure when `CI=true`).
    ///
    /// Blocking (it runs `rabbitmqctl`): from async code call it in
    /// `tokio::task::spawn_blocking` or `block_in_place`.
    ///
    /// # Panics
    ///
    /// When a node does not boot or join (the logs' tails are in the
    /// message).
    pub fn start(nodes: usize) -> Option<RabbitCluster> {
        need(
            "rabbitmq cluster",
            &[RABBITMQ_SERVER, RABBITMQCTL, RABBITMQ_QUEUES],
        )?;
        assert!(nodes >= 1, "a cluster needs a node");
        let begun = Instant::now();
        let dir = Scratch::new("rabbitmq");
        let home = dir.join("home");
        std::fs::create_dir_all(&home).expect("create HOME");
        let cookie = home.join(".erlang.cookie");
        std::fs::write(&cookie, crate::unique("IDEMRMQCOOKIE").to_uppercase())
            .expect("write the cookie");
        set_mode(&cookie, 0o400);
        let me = std::process::id();
        // Several clusters of one test process (tests run in parallel)
        // need names of their own.
        static CLUSTERS: AtomicUsize = AtomicUsize::new(0);
        let c = CLUSTERS.fetch_add(1, Ordering::Relaxed);
        let nodes: Vec<Node> = (0..nodes)
            .map(|i| {
                let node_dir = dir.join(&format!("n{i}"));
                std::fs::create_dir_all(node_dir.join("mnesia")).expect("create mnesia dir");
                std::fs::create_dir_all(node_dir.join("log")).expect("create log dir");
                std::fs::write(node_dir.join("enabled_plugins"), "[].\n")
                    .expect("write enabled_plugins");
                std::fs::write(
                    node_dir.join("rabbitmq.conf"),
                    "log.console = true\nlog.console.level = info\nlog.file = false\n",
                )
                .expect("write rabbitmq.conf");
                Node {
                    name: format!("idemrmq{me}c{c}n{i}@localhost"),
                    port: free_port(),
                    dist: free_port(),
                    dir: node_dir,
                }
            })
            .collect();
        let mut cluster = RabbitCluster {
            procs: Mutex::new((0..nodes.len()).map(|_| None).collect()),
            nodes,
            home,
            dir,
            started_in: Duration::ZERO,
            runs: AtomicUsize::new(0),
        };
        for i in 0..cluster.nodes.len() {
            cluster.spawn(i);
        }
        for i in 0..cluster.nodes.len() {
            cluster.wait_ready(i);
        }
        let booted = begun.elapsed();
        let first = cluster.nodes[0].name.clone();
        for i in 1..cluster.nodes.len() {
            cluster.ctl_ok(i, &["stop_app"]);
            cluster.ctl_ok(i, &["join_cluster", &first]);
            // Returns once the broker runs again, now in the cluster.
            cluster.ctl_ok(i, &["start_app"]);
        }
        let running = cluster.ctl_ok(0, &["cluster_status", "--formatter", "json"]);
        for n in &cluster.nodes {
            assert!(
                running.contains(&n.name),
                "node {} is not in the cluster: {running}",
                n.name
            );
        }
        cluster.started_in = begun.elapsed();
        eprintln!(
            "rabbitmq cluster: {} nodes up in {:.1} s (booted in {:.1} s, then joined; AMQP ports {:?})",
            cluster.nodes.len(),
            cluster.started_in.as_secs_f64(),
            booted.as_secs_f64(),
            cluster.nodes.iter().map(|n| n.port).collect::<Vec<_>>()
        );
        Some(cluster)
    }

    /// The number of nodes (running or not).
    pub fn size(&self) -> usize {
        self.nodes.len()
    }

    /// How long the start-up took.
    pub fn started_in(&self) -> Duration {
        self.started_in
    }

    /// Node `i`'s Erlang node name (`idemrmq<pid>c<cluster>n<i>@localhost`), as
    /// RabbitMQ reports queue leaders.
    pub fn name(&self, i: usize) -> &str {
        &self.nodes[i].name
    }

    /// Node `i`'s AMQP URL (user `guest`, vhost `/`).
    pub fn url(&self, i: usize) -> String {
        format!("amqp://guest:guest@127.0.0.1:{}/%2f", self.nodes[i].port)
    }

    /// The node leading the quorum queue `queue`, asked through node
    /// `via` (`rabbitmq-queues quorum_status`); `None` while it has none
    /// or the node does not answer.
    pub fn quorum_leader(&self, via: usize, queue: &str) -> Option<usize> {
        let out = self.run(
            RABBITMQ_QUEUES,
            via,
            &["quorum_status", queue, "--formatter", "json"],
        );
        if !out.status.success() {
            return None;
        }
        let text = String::from_utf8_lossy(&out.stdout);
        // [{"Node Name":"…","Raft State":"leader",…},…]
        text.split('}').find_map(|member| {
            if !member.contains("\"leader\"") {
                return None;
            }
            (0..self.nodes.len()).find(|&i| member.contains(&format!("\"{}\"", self.nodes[i].name)))
        })
    }

    /// Kills node `i` with SIGKILL (a crash: nothing flushed) and reaps it.
    pub fn kill9(&self, i: usize) {
        self.kill_beam(i);
        if let Some(mut p) = self.procs.lock().expect("procs")[i].take() {
            p.kill9();
        }
    }

    /// Stops node `i` with SIGTERM (RabbitMQ's orderly shutdown: it closes
    /// its connections with `CONNECTION_FORCED`), waits up to 60 s for it
    /// to exit, then kills what is left.
    pub fn terminate(&self, i: usize) {
        if let Some(mut p) = self.procs.lock().expect("procs")[i].take() {
            let pids: Vec<u32> = std::fs::read_to_string(self.nodes[i].dir.join("pid"))
                .ok()
                .and_then(|s| s.trim().parse().ok())
                .into_iter()
                .collect();
            for pid in pids {
                let _ = Command::new("kill")
                    .args(["-TERM", &pid.to_string()])
                    .output();
            }
            p.terminate(Duration::from_secs(60));
        }
        self.kill_beam(i);
    }

    /// Node `i`'s AMQP port.
    pub fn port(&self, i: usize) -> u16 {
        self.nodes[i].port
    }

    /// Starts node `i` again (after [`kill9`](Self::kill9)) on its data
    /// directory and waits until it runs (it rejoins the cluster).
    ///
    /// # Panics
    ///
    /// When it does not come back.
    pub fn restart(&self, i: usize) {
        self.kill9(i);
        self.spawn(i);
        self.wait_ready(i);
    }

    /// Runs `rabbitmqctl -n <node i> args…` with the cluster's cookie and
    /// returns its output.
    pub fn ctl(&self, i: usize, args: &[&str]) -> Output {
        self.run(RABBITMQCTL, i, args)
    }

    /// The last `lines` lines of node `i`'s log.
    pub fn log_tail(&self, i: usize, lines: usize) -> String {
        match &self.procs.lock().expect("procs")[i] {
            Some(p) => p.log_tail(lines),
            None => format!("--- rabbitmq node {i}: not running ---"),
        }
    }

    fn log_tails(&self, lines: usize) -> String {
        (0..self.nodes.len())
            .map(|i| self.log_tail(i, lines))
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// The environment of every command about node `i`: the server's
    /// own settings and the cluster's `HOME` (its cookie).
    fn command(&self, program: &str, i: usize) -> Command {
        let n = &self.nodes[i];
        let mut cmd = Command::new(program);
        cmd.current_dir(&self.home)
            .env("HOME", &self.home)
            .env("LC_ALL", "C.UTF-8")
            .env(
                "RABBITMQ_CONF_ENV_FILE",
                self.dir.join("no-rabbitmq-env.conf"),
            )
            .env("RABBITMQ_NODENAME", &n.name)
            .env("RABBITMQ_NODE_IP_ADDRESS", "127.0.0.1")
            .env("RABBITMQ_NODE_PORT", n.port.to_string())
            .env("RABBITMQ_DIST_PORT", n.dist.to_string())
            .env("RABBITMQ_MNESIA_BASE", n.dir.join("mnesia"))
            .env("RABBITMQ_LOG_BASE", n.dir.join("log"))
            .env("RABBITMQ_CONFIG_FILE", n.dir.join("rabbitmq.conf"))
            .env(
                "RABBITMQ_ENABLED_PLUGINS_FILE",
                n.dir.join("enabled_plugins"),
            )
            .env("RABBITMQ_PID_FILE", n.dir.join("pid"))
            .env("ERL_EPMD_ADDRESS", "127.0.0.1");
        cmd
    }

    fn run(&self, program: &str, i: usize, args: &[&str]) -> Output {
        let mut cmd = self.command(program, i);
        cmd.arg("-n").arg(&self.nodes[i].name).args(args);
        cmd.output()
            .unwrap_or_else(|e| panic!("run {program} {args:?}: {e}"))
    }

    /// `rabbitmqctl -n <node i> args…`, which must succeed; its stdout.
    fn ctl_ok(&self, i: usize, args: &[&str]) -> String {
        let out = self.ctl(i, args);
        assert!(
            out.status.success(),
            "rabbitmqctl -n {} {args:?}: {}{}\n{}",
            self.nodes[i].name,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
            self.log_tails(30)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    fn spawn(&self, i: usize) {
        let _ = std::fs::remove_file(self.nodes[i].dir.join("pid"));
        let cmd = self.command(RABBITMQ_SERVER, i);
        // A log per run: a restarted node's previous log stays.
        let run = self.runs.fetch_add(1, Ordering::Relaxed);
        let log = self.dir.join(&format!("n{i}-run{run}.log"));
        let proc = Proc::spawn(&format!("rabbitmq node {i}"), cmd, log);
        self.procs.lock().expect("procs")[i] = Some(proc);
    }

    /// Polls `rabbitmqctl await_startup` until node `i` runs its broker
    /// (it fails at once while the node is not registered with epmd).
    fn wait_ready(&self, i: usize) {
        let deadline = Instant::now() + READY_WITHIN;
        while Instant::now() < deadline {
            let running = self.procs.lock().expect("procs")[i]
                .as_mut()
                .is_some_and(Proc::running);
            if !running {
                break;
            }
            // The AMQP listener opens last: poll the port (cheap) before
            // asking rabbitmqctl (about a second of CPU per call).
            if !wait_port(self.nodes[i].port, Duration::from_millis(500)) {
                continue;
            }
            if self
                .ctl(i, &["await_startup", "--timeout", "10"])
                .status
                .success()
            {
                return;
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        panic!(
            "rabbitmq node {i} ({}) was not ready within {READY_WITHIN:?}\n{}",
            self.nodes[i].name,
            self.log_tails(40)
        );
    }

    /// SIGKILLs node `i`'s beam: the pid in its pid file, and any process
    /// whose command line names the node (a beam whose pid file is not
    /// written yet, or a leftover).
    fn kill_beam(&self, i: usize) {
        let mut pids: Vec<u32> = std::fs::read_to_string(self.nodes[i].dir.join("pid"))
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .into_iter()
            .collect();
        let short = self.nodes[i].name.split('@').next().unwrap_or_default();
        pids.extend(processes_naming(short));
        for pid in pids {
            let _ = Command::new("kill")
                .args(["-KILL", &pid.to_string()])
                .output();
        }
    }
}

/// The processes whose command line has `word` as one of its arguments.
fn processes_naming(word: &str) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(|e| {
            let e = e.ok()?;
            let pid: u32 = e.file_name().to_str()?.parse().ok()?;
            let cmdline = std::fs::read(e.path().join("cmdline")).ok()?;
            cmdline
                .split(|&b| b == 0)
                .any(|arg| {
                    arg == word.as_bytes()
                        || arg
                            .strip_prefix(word.as_bytes())
                            .is_some_and(|r| r.starts_with(b"@"))
                })
                .then_some(pid)
        })
        .collect()
}

fn set_mode(path: &std::path::Path, mode: u32) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).expect("chmod");
}

impl Drop for RabbitCluster {
    fn drop(&mut self) {
        for i in 0..self.nodes.len() {
            self.kill_beam(i);
        }
        if let Ok(mut procs) = self.procs.lock() {
            for p in procs.iter_mut() {
                if let Some(mut p) = p.take() {
                    p.kill9();
                }
            }
        }
        // A beam started between the two passes (none should be).
        for i in 0..self.nodes.len() {
            self.kill_beam(i);
        }
    }
}
