//! A MariaDB Galera cluster of `n` nodes on this machine, each a `mariadbd`
//! with its own data directory, SQL port and Galera ports, for the tests of
//! idem on a multi-primary cluster (writes on every node, certification
//! conflicts, a node killed and rejoined).
//!
//! Start-up: `mariadb-install-db` fills node 0's directory, node 0
//! bootstraps the cluster (`--wsrep-new-cluster`), then the others join
//! from empty directories by state snapshot transfer (`rsync`). A node
//! killed with [`Galera::kill9`] and [`restart`](Galera::restart)ed
//! rejoins by incremental state transfer (IST) from a peer's cache, or by
//! a new snapshot. About 10–20 s for three nodes on a small machine.
//!
//! Run as root, the nodes run as the `mysql` system user (`--user=mysql`,
//! their directories given to it): the rsync daemon of a snapshot transfer
//! started as root switches to `nobody`, which cannot write the joiner's
//! directory.
//!
//! The test settings favour speed over durability: a 32 MiB buffer pool,
//! 8 MiB redo log, `innodb_flush_log_at_trx_commit=0`, no doublewrite,
//! one applier thread (`wsrep_slave_threads=1`), a 3 s failure detection
//! (`evs.suspect_timeout`), so that a killed node leaves the cluster (and
//! the writes on the others resume) within a few seconds.
//!
//! **Reads after writes on another node.** Galera applies a committed
//! write set on the other nodes asynchronously (certification is
//! synchronous, apply is not): with the default `wsrep_sync_wait = 0` a
//! read on node B right after a commit on node A may not see it yet. The
//! pools keep that default, as a deployment would: idem's correctness does
//! not depend on it (a stale read leads to a write that fails
//! certification with 1213, which is retryable, never to a second
//! effect). A test that counts effects reads through [`Galera::synced`]
//! (`wsrep_sync_wait = 1`: the read waits until the node has applied
//! everything committed before it).
//!
//! ```no_run
//! # async fn run() {
//! use idem_testkit::cluster::galera::Galera;
//! let Some(cluster) = Galera::start(3).await else {
//!     return; // skipped: Galera or MariaDB is not installed
//! };
//! let pool = cluster.pool(1, 4).await;
//! # let _ = pool;
//! # }
//! ```

use super::{Proc, Scratch, free_port, need, wait_port};
use sqlx::mysql::{MySqlConnectOptions, MySqlPoolOptions};
use sqlx::{ConnectOptions, MySqlConnection, MySqlPool};
use std::path::PathBuf;
use std::process::Command;
use std::str::FromStr;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// The server.
pub const MARIADBD: &str = "/usr/sbin/mariadbd";
/// The Galera provider (Debian's `galera-4`).
pub const PROVIDER: &str = "/usr/lib/galera/libgalera_smm.so";
/// How long a node may take to start, join and sync.
const JOIN_WITHIN: Duration = Duration::from_secs(120);

/// One node's ports and directory.
#[derive(Debug)]
struct Node {
    port: u16,
    gcomm: u16,
    ist: u16,
    sst: u16,
    datadir: PathBuf,
}

/// A running Galera cluster, torn down (every node killed, the directories
/// removed) on drop.
#[derive(Debug)]
pub struct Galera {
    /// The running servers (`None`: killed). Dropped before `dir`.
    procs: Mutex<Vec<Option<Proc>>>,
    nodes: Vec<Node>,
    /// Whether idem's tables were migrated (once, on the first pool).
    migrated: tokio::sync::OnceCell<()>,
    /// The system user the servers run as (`None`: the current user).
    user: Option<&'static str>,
    dir: Scratch,
    /// How long [`Galera::start`] took.
    started_in: Duration,
    /// Servers started so far (names the log files).
    runs: AtomicUsize,
}

impl Galera {
    /// Starts a cluster of `nodes` nodes and waits until every node is
    /// `Synced` in a cluster of that size, or `None` when a program is
    /// missing (skipped locally, a failure when `CI=true`).
    ///
    /// Runs the blocking start-up on tokio's blocking pool.
    ///
    /// # Panics
    ///
    /// When the cluster does not form (the nodes' log tails are in the
    /// message).
    pub async fn start(nodes: usize) -> Option<Galera> {
        tokio::task::spawn_blocking(move || Galera::start_blocking(nodes))
            .await
            .expect("the Galera start-up panicked")
    }

    /// [`Galera::start`], blocking the calling thread.
    ///
    /// # Panics
    ///
    /// When the cluster does not form.
    pub fn start_blocking(nodes: usize) -> Option<Galera> {
        need(
            "galera",
            &[
                MARIADBD,
                PROVIDER,
                "mariadb-install-db",
                "mariadb",
                "rsync",
                "wsrep_sst_rsync",
            ],
        )?;
        assert!(nodes >= 1, "a cluster needs a node");
        let begun = Instant::now();
        let user = running_as_root().then_some("mysql");
        if user.is_some() && !system_user_exists("mysql") {
            crate::unreachable(
                "galera: the `mysql` system user",
                "missing (the nodes run as it when the tests run as root)",
            );
            return None;
        }
        let dir = Scratch::new("galera");
        let nodes: Vec<Node> = (0..nodes)
            .map(|i| Node {
                port: free_port(),
                gcomm: free_port(),
                ist: free_port(),
                sst: free_port(),
                datadir: dir.join(&format!("n{i}")),
            })
            .collect();
        for n in &nodes {
            std::fs::create_dir_all(&n.datadir).expect("create a node's directory");
        }
        if let Some(user) = user {
            dir.chown(user);
        }
        let mut cluster = Galera {
            procs: Mutex::new((0..nodes.len()).map(|_| None).collect()),
            nodes,
            migrated: tokio::sync::OnceCell::new(),
            user,
            dir,
            started_in: Duration::ZERO,
            runs: AtomicUsize::new(0),
        };
        cluster.install(0);
        cluster.spawn(0, true);
        cluster.wait_synced(0, 1);
        cluster.client(0, "CREATE DATABASE IF NOT EXISTS test");
        for i in 1..cluster.nodes.len() {
            cluster.spawn(i, false);
        }
        for i in 1..cluster.nodes.len() {
            cluster.wait_synced(i, cluster.nodes.len());
        }
        cluster.started_in = begun.elapsed();
        eprintln!(
            "galera: {} nodes up in {:.1} s (ports {:?})",
            cluster.nodes.len(),
            cluster.started_in.as_secs_f64(),
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

    /// Node `i`'s URL (`root`, no password, database `test`).
    pub fn url(&self, i: usize) -> String {
        format!("mysql://root@127.0.0.1:{}/test", self.nodes[i].port)
    }

    /// A pool of at most `max` connections on node `i`, with idem's tables
    /// (migrated once for the cluster, on the first pool asked for; the
    /// DDL replicates to every node). Its acquire time-out is 5 s: while
    /// the node is down, callers fail after that (and reconnect once it is
    /// back).
    ///
    /// # Panics
    ///
    /// When the node cannot be reached or the migration fails.
    pub async fn pool(&self, i: usize, max: u32) -> MySqlPool {
        let opts = MySqlConnectOptions::from_str(&self.url(i)).expect("valid URL");
        let pool = MySqlPoolOptions::new()
            .max_connections(max)
            // Short: a pool on a killed node fails its callers in
            // seconds (a relay on it, a test shutting it down).
            .acquire_timeout(Duration::from_secs(5))
            .connect_with(opts)
            .await
            .unwrap_or_else(|e| panic!("galera node {i}: {e}\n{}", self.log_tail(i, 30)));
        self.migrated
            .get_or_init(|| async {
                idem_runtime::migrate(&pool)
                    .await
                    .expect("migrate idem's tables on the Galera cluster");
            })
            .await;
        self.synced(i).await;
        pool
    }

    /// A connection on node `i` whose reads wait until the node has applied
    /// every write set committed in the cluster before them
    /// (`wsrep_sync_wait = 1`): for counting effects written on other
    /// nodes.
    ///
    /// # Panics
    ///
    /// When the node cannot be reached.
    pub async fn synced(&self, i: usize) -> MySqlConnection {
        let mut conn = MySqlConnectOptions::from_str(&self.url(i))
            .expect("valid URL")
            .connect()
            .await
            .unwrap_or_else(|e| panic!("galera node {i}: {e}\n{}", self.log_tail(i, 30)));
        sqlx::query("SET SESSION wsrep_sync_wait = 1")
            .execute(&mut conn)
            .await
            .expect("set wsrep_sync_wait");
        sqlx::query("SELECT 1")
            .execute(&mut conn)
            .await
            .expect("a causal read");
        conn
    }

    /// Kills node `i` with SIGKILL (a crash). The others notice within a
    /// few seconds and carry on as a smaller primary component.
    pub fn kill9(&self, i: usize) {
        if let Some(mut p) = self.procs.lock().expect("procs")[i].take() {
            p.kill9();
        }
    }

    /// Starts node `i` again (after [`kill9`](Self::kill9)) and waits until
    /// it is `Synced` in the full cluster (joined by IST or SST).
    ///
    /// # Panics
    ///
    /// When it does not rejoin.
    ///
    /// Blocking: from a test on tokio's multi-thread runtime, call it in
    /// `tokio::task::block_in_place` so the other tasks keep running.
    pub fn restart(&self, i: usize) {
        self.kill9(i);
        self.spawn(i, false);
        self.wait_synced(i, self.nodes.len());
    }

    /// The last `lines` lines of node `i`'s log.
    pub fn log_tail(&self, i: usize, lines: usize) -> String {
        match &self.procs.lock().expect("procs")[i] {
            Some(p) => p.log_tail(lines),
            None => format!("--- galera node {i}: not running ---"),
        }
    }

    fn install(&self, i: usize) {
        let n = &self.nodes[i];
        let mut cmd = Command::new("mariadb-install-db");
        cmd.arg("--no-defaults")
            .arg(format!("--datadir={}", n.datadir.display()))
            .arg("--auth-root-authentication-method=normal")
            .arg("--skip-test-db")
            .args(INNODB);
        if let Some(user) = self.user {
            cmd.arg(format!("--user={user}"));
        }
        let out = cmd.output().expect("run mariadb-install-db");
        assert!(
            out.status.success(),
            "mariadb-install-db failed:\n{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }

    fn spawn(&self, i: usize, bootstrap: bool) {
        let n = &self.nodes[i];
        let peers: Vec<String> = self
            .nodes
            .iter()
            .map(|p| format!("127.0.0.1:{}", p.gcomm))
            .collect();
        let mut cmd = Command::new(MARIADBD);
        cmd.arg("--no-defaults")
            .arg(format!("--datadir={}", n.datadir.display()))
            .arg(format!("--port={}", n.port))
            .arg("--bind-address=127.0.0.1")
            .arg(format!("--socket={}", self.dir.join(&format!("n{i}.sock")).display()))
            .arg(format!("--pid-file={}", self.dir.join(&format!("n{i}.pid")).display()))
            .args(INNODB)
            .args([
                "--binlog-format=ROW",
                "--innodb-autoinc-lock-mode=2",
                "--default-storage-engine=InnoDB",
                "--max-connections=300",
                "--wsrep-on=ON",
                "--wsrep-cluster-name=idem-test",
                "--wsrep-slave-threads=1",
                "--wsrep-sst-method=rsync",
            ])
            .arg(format!("--wsrep-provider={PROVIDER}"))
            .arg(format!("--wsrep-cluster-address=gcomm://{}", peers.join(",")))
            .arg(format!("--wsrep-node-address=127.0.0.1:{}", n.gcomm))
            .arg(format!("--wsrep-node-name=n{i}"))
            .arg(format!("--wsrep-sst-receive-address=127.0.0.1:{}", n.sst))
            .arg(format!(
                "--wsrep-provider-options=gmcast.listen_addr=tcp://127.0.0.1:{};ist.recv_addr=127.0.0.1:{};\
                 gcache.size=64M;evs.suspect_timeout=PT3S;evs.inactive_timeout=PT5S",
                n.gcomm, n.ist
            ));
        if let Some(user) = self.user {
            cmd.arg(format!("--user={user}"));
        }
        if bootstrap {
            cmd.arg("--wsrep-new-cluster");
        }
        // A log per run: a restarted node's previous log stays.
        let run = self.runs.fetch_add(1, Ordering::Relaxed);
        let log = self.dir.join(&format!("n{i}-run{run}.log"));
        let proc = Proc::spawn(&format!("galera node {i}"), cmd, log);
        self.procs.lock().expect("procs")[i] = Some(proc);
    }

    /// Waits until node `i` answers, is `Synced` and sees `size` members.
    fn wait_synced(&self, i: usize, size: usize) {
        let deadline = Instant::now() + JOIN_WITHIN;
        let port = self.nodes[i].port;
        while Instant::now() < deadline {
            let running = self.procs.lock().expect("procs")[i]
                .as_mut()
                .is_some_and(Proc::running);
            if !running {
                break;
            }
            if wait_port(port, Duration::from_millis(200)) {
                let status = self.status(i);
                let get = |k: &str| status.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str());
                if get("wsrep_local_state_comment") == Some("Synced")
                    && get("wsrep_cluster_size") == Some(&size.to_string())
                    && get("wsrep_ready") == Some("ON")
                {
                    return;
                }
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let tails: Vec<String> = (0..self.nodes.len())
            .map(|n| self.log_tail(n, 40))
            .collect();
        panic!(
            "galera node {i} did not sync in a cluster of {size} within {JOIN_WITHIN:?}\n{}",
            tails.join("\n")
        );
    }

    /// Node `i`'s `wsrep_%` status variables (empty when it does not
    /// answer), read with the `mariadb` client (blocking).
    pub fn status(&self, i: usize) -> Vec<(String, String)> {
        let out = self
            .mariadb(i)
            .arg("-e")
            .arg("SHOW GLOBAL STATUS LIKE 'wsrep_%'")
            .output();
        let Ok(out) = out else { return Vec::new() };
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|l| l.split_once('\t'))
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    /// The sum over the running nodes of the numeric `wsrep_%` status
    /// variable `name` (e.g. `wsrep_local_cert_failures`,
    /// `wsrep_local_bf_aborts`).
    pub fn status_sum(&self, name: &str) -> u64 {
        (0..self.nodes.len())
            .filter(|&i| self.procs.lock().expect("procs")[i].is_some())
            .flat_map(|i| self.status(i))
            .filter(|(k, _)| k == name)
            .filter_map(|(_, v)| v.parse::<u64>().ok())
            .sum()
    }

    /// Runs `sql` on node `i` with the `mariadb` client.
    fn client(&self, i: usize, sql: &str) {
        let out = self
            .mariadb(i)
            .arg("-e")
            .arg(sql)
            .output()
            .expect("run mariadb");
        assert!(
            out.status.success(),
            "galera node {i}: `{sql}`: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    fn mariadb(&self, i: usize) -> Command {
        let mut cmd = Command::new("mariadb");
        cmd.arg("--no-defaults")
            .args(["-h", "127.0.0.1", "-u", "root", "-N", "-B"])
            .arg(format!("-P{}", self.nodes[i].port));
        cmd
    }
}

/// The InnoDB settings of a small, fast, not durable test server.
const INNODB: [&str; 5] = [
    "--innodb-buffer-pool-size=32M",
    "--innodb-log-file-size=8M",
    "--innodb-flush-log-at-trx-commit=0",
    "--innodb-doublewrite=0",
    "--skip-name-resolve",
];

pub(super) fn system_user_exists(user: &str) -> bool {
    Command::new("id")
        .arg("-u")
        .arg(user)
        .output()
        .is_ok_and(|o| o.status.success())
}

pub(super) fn running_as_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| o.stdout.starts_with(b"0\n"))
}

impl Drop for Galera {
    fn drop(&mut self) {
        if let Ok(mut procs) = self.procs.lock() {
            for p in procs.iter_mut() {
                if let Some(mut p) = p.take() {
                    p.kill9();
                }
            }
        }
    }
}
