//! A NATS JetStream cluster of `n` nodes on this machine, each a
//! `nats-server -js` with its own client port, cluster (route) port and
//! store directory, for the tests of the JetStream adapter across a
//! failover: a stream replicated on every node (R3 on three), its leader
//! killed with SIGKILL while messages flow, then started again.
//!
//! Start-up: every node starts at once with routes to the others; the
//! cluster is ready when every node answers a JetStream account request
//! (which needs the cluster's meta leader). About a second for three
//! nodes. A node killed with [`NatsCluster::kill9`] and
//! [`restart`](NatsCluster::restart)ed keeps its store directory and
//! catches up from the stream's new leader.
//!
//! [`NatsCluster::stream_leader`] asks the JetStream API
//! (`$JS.API.STREAM.INFO.<name>`, the stream's `cluster.leader`) which
//! node leads a stream.
//!
//! ```no_run
//! # async fn run() {
//! use idem_testkit::cluster::nats::NatsCluster;
//! let Some(cluster) = NatsCluster::start(3).await else {
//!     return; // skipped: nats-server is not installed
//! };
//! let js = cluster.connect().await;
//! let leader = cluster.stream_leader(&js, "ORDERS").await;
//! # let _ = leader;
//! # }
//! ```

use super::{Proc, Scratch, free_port, need, wait_port};
use idem_runtime::nats::async_nats::jetstream::Context;
use std::path::PathBuf;
use std::process::Command;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// The server, as Debian installs it.
pub const NATS_SERVER: &str = "/usr/sbin/nats-server";
/// How long a node may take to start and see the cluster's meta leader.
const READY_WITHIN: Duration = Duration::from_secs(30);

/// One node's ports and store.
#[derive(Debug)]
struct Node {
    port: u16,
    route: u16,
    store: PathBuf,
}

/// A running JetStream cluster, torn down (every node killed, the
/// directories removed) on drop.
#[derive(Debug)]
pub struct NatsCluster {
    /// The running servers (`None`: killed). Dropped before `dir`.
    procs: Mutex<Vec<Option<Proc>>>,
    nodes: Vec<Node>,
    dir: Scratch,
    started_in: Duration,
    /// Servers started so far (names the log files).
    runs: AtomicUsize,
}

impl NatsCluster {
    /// Starts a cluster of `nodes` nodes and waits until every node sees
    /// the meta leader, or `None` when nats-server is missing (skipped
    /// locally, a failure when `CI=true`).
    ///
    /// # Panics
    ///
    /// When the cluster does not form (the nodes' log tails are in the
    /// message).
    pub async fn start(nodes: usize) -> Option<NatsCluster> {
        need("nats cluster", &[NATS_SERVER])?;
        assert!(nodes >= 1, "a cluster needs a node");
        let begun = Instant::now();
        let dir = Scratch::new("nats");
        let nodes: Vec<Node> = (0..nodes)
            .map(|i| Node {
                port: free_port(),
                route: free_port(),
                store: dir.join(&format!("n{i}")),
            })
            .collect();
        let mut cluster = NatsCluster {
            procs: Mutex::new((0..nodes.len()).map(|_| None).collect()),
            nodes,
            dir,
            started_in: Duration::ZERO,
            runs: AtomicUsize::new(0),
        };
        for i in 0..cluster.nodes.len() {
            cluster.spawn(i);
        }
        for i in 0..cluster.nodes.len() {
            cluster.wait_ready(i).await;
        }
        cluster.wait_placement().await;
        cluster.started_in = begun.elapsed();
        eprintln!(
            "nats cluster: {} nodes up in {:.1} s (ports {:?})",
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

    /// Node `i`'s server name (`n{i}`), as the JetStream API reports
    /// leaders.
    pub fn name(&self, i: usize) -> String {
        format!("n{i}")
    }

    /// Node `i`'s client URL.
    pub fn url(&self, i: usize) -> String {
        format!("nats://127.0.0.1:{}", self.nodes[i].port)
    }

    /// Every node's client URL, comma-separated (what
    /// `idem_runtime::nats::connect` takes).
    pub fn urls(&self) -> String {
        (0..self.nodes.len())
            .map(|i| self.url(i))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// A JetStream context on the whole cluster (it reconnects to another
    /// node when its node dies).
    ///
    /// # Panics
    ///
    /// When no node can be reached.
    pub async fn connect(&self) -> Context {
        idem_runtime::nats::connect(&self.urls())
            .await
            .unwrap_or_else(|e| panic!("nats cluster: {e}\n{}", self.log_tails(20)))
    }

    /// A JetStream context on node `i` (it learns the others from the
    /// server, and reconnects to one of them when node `i` dies).
    ///
    /// # Panics
    ///
    /// When node `i` cannot be reached.
    pub async fn connect_node(&self, i: usize) -> Context {
        idem_runtime::nats::connect(&self.url(i))
            .await
            .unwrap_or_else(|e| panic!("nats node {i}: {e}\n{}", self.log_tail(i, 20)))
    }

    /// The node leading the durable `consumer` of `stream` (the consumer's
    /// own RAFT group, which need not be on the stream's leader), `None`
    /// while it has none or the API does not answer.
    pub async fn consumer_leader(
        &self,
        js: &Context,
        stream: &str,
        consumer: &str,
    ) -> Option<usize> {
        let c: idem_runtime::nats::async_nats::jetstream::consumer::PullConsumer =
            js.get_consumer_from_stream(consumer, stream).await.ok()?;
        let leader = c.cached_info().cluster.as_ref()?.leader.clone()?;
        (0..self.nodes.len()).find(|&i| self.name(i) == leader)
    }

    /// Asks the leader of `consumer` on `stream` to step down
    /// (`$JS.API.CONSUMER.LEADER.STEPDOWN.<stream>.<consumer>`): another
    /// replica is elected.
    ///
    /// # Errors
    ///
    /// The request's failure, or the server's error answer.
    pub async fn step_down_consumer(
        &self,
        js: &Context,
        stream: &str,
        consumer: &str,
    ) -> Result<(), String> {
        let reply = js
            .client()
            .request(
                format!("$JS.API.CONSUMER.LEADER.STEPDOWN.{stream}.{consumer}"),
                "".into(),
            )
            .await
            .map_err(|e| e.to_string())?;
        let text = String::from_utf8_lossy(&reply.payload);
        if text.contains("\"success\":true") {
            Ok(())
        } else {
            Err(text.into_owned())
        }
    }

    /// The node leading `stream` (its RAFT group's leader), `None` while
    /// it has none or the API does not answer.
    pub async fn stream_leader(&self, js: &Context, stream: &str) -> Option<usize> {
        let info = js.get_stream(stream).await.ok()?.get_info().await.ok()?;
        let leader = info.cluster?.leader?;
        (0..self.nodes.len()).find(|&i| self.name(i) == leader)
    }

    /// Kills node `i` with SIGKILL (a crash: nothing flushed).
    pub fn kill9(&self, i: usize) {
        if let Some(mut p) = self.procs.lock().expect("procs")[i].take() {
            p.kill9();
        }
    }

    /// Stops node `i` with SIGTERM (nats-server's orderly shutdown),
    /// waiting up to 30 s before killing it.
    pub fn terminate(&self, i: usize) {
        if let Some(mut p) = self.procs.lock().expect("procs")[i].take() {
            p.terminate(Duration::from_secs(30));
        }
    }

    /// Starts node `i` again (after [`kill9`](Self::kill9)) on its store
    /// and waits until it sees the meta leader.
    ///
    /// # Panics
    ///
    /// When it does not come back.
    pub async fn restart(&self, i: usize) {
        self.kill9(i);
        self.spawn(i);
        self.wait_ready(i).await;
    }

    /// The last `lines` lines of node `i`'s log.
    pub fn log_tail(&self, i: usize, lines: usize) -> String {
        match &self.procs.lock().expect("procs")[i] {
            Some(p) => p.log_tail(lines),
            None => format!("--- nats node {i}: not running ---"),
        }
    }

    fn log_tails(&self, lines: usize) -> String {
        (0..self.nodes.len())
            .map(|i| self.log_tail(i, lines))
            .collect::<Vec<_>>()
            .join("\n")
    }

    fn spawn(&self, i: usize) {
        let n = &self.nodes[i];
        let routes: Vec<String> = self
            .nodes
            .iter()
            .enumerate()
            .filter(|&(j, _)| j != i)
            .map(|(_, p)| format!("nats://127.0.0.1:{}", p.route))
            .collect();
        let mut cmd = Command::new(NATS_SERVER);
        cmd.args(["-a", "127.0.0.1", "-js"])
            .arg("-p")
            .arg(n.port.to_string())
            .arg("-n")
            .arg(self.name(i))
            .arg("-sd")
            .arg(&n.store);
        // One node is a plain server (JetStream without a cluster).
        if self.nodes.len() > 1 {
            cmd.args(["--cluster_name", "idem-test"])
                .arg("--cluster")
                .arg(format!("nats://127.0.0.1:{}", n.route))
                .arg("--routes")
                .arg(routes.join(","));
        }
        // A log per run: a restarted node's previous log stays.
        let run = self.runs.fetch_add(1, Ordering::Relaxed);
        let log = self.dir.join(&format!("n{i}-run{run}.log"));
        let proc = Proc::spawn(&format!("nats node {i}"), cmd, log);
        self.procs.lock().expect("procs")[i] = Some(proc);
    }

    /// Waits until the cluster places a stream on every node: a node that
    /// answers the JetStream API may still not count its peers as current,
    /// and a replicated stream declared then fails with "no suitable peers
    /// for placement" (seen in CI). So a throwaway in-memory stream with
    /// one replica per node is created (retried until it is) and deleted:
    /// what the tests declare next is then placed.
    async fn wait_placement(&self) {
        use idem_runtime::nats::async_nats::jetstream::stream::{Config, StorageType};
        let deadline = Instant::now() + READY_WITHIN;
        let name = format!("IDEM_READY_{}", std::process::id());
        let js = self.connect().await;
        let mut last = String::new();
        while Instant::now() < deadline {
            let config = Config {
                name: name.clone(),
                subjects: vec![format!("idem.ready.{}", std::process::id())],
                num_replicas: self.nodes.len(),
                storage: StorageType::Memory,
                ..Default::default()
            };
            match js.create_stream(config).await {
                Ok(_) => {
                    let _ = js.delete_stream(&name).await;
                    return;
                }
                Err(e) => last = e.to_string(),
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        panic!(
            "the nats cluster placed no {}-replica stream within {READY_WITHIN:?}: {last}\n{}",
            self.nodes.len(),
            self.log_tails(40)
        );
    }

    /// Waits until node `i` accepts clients and answers a JetStream
    /// account request (the meta leader is elected and reachable).
    async fn wait_ready(&self, i: usize) {
        let deadline = Instant::now() + READY_WITHIN;
        let port = self.nodes[i].port;
        while Instant::now() < deadline {
            let running = self.procs.lock().expect("procs")[i]
                .as_mut()
                .is_some_and(Proc::running);
            if !running {
                break;
            }
            let up =
                tokio::task::spawn_blocking(move || wait_port(port, Duration::from_millis(200)))
                    .await
                    .unwrap_or(false);
            if up
                && let Ok(js) = idem_runtime::nats::connect(&self.url(i)).await
                && let Ok(Ok(())) =
                    tokio::time::timeout(Duration::from_millis(500), jetstream_ready(&js)).await
            {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let exited = !self.procs.lock().expect("procs")[i]
            .as_mut()
            .is_some_and(Proc::running);
        let what = if exited {
            "exited before it was ready".to_string()
        } else {
            format!("was not ready within {READY_WITHIN:?}")
        };
        panic!("nats node {i} {what}\n{}", self.log_tails(40));
    }
}

/// Whether the server behind `js` serves the JetStream API: its answer to
/// `$JS.API.INFO` (the account's JetStream usage) is not an error. In a
/// cluster that needs the meta leader. (The raw request: async-nats'
/// typed account info expects fields that nats-server 2.9 does not send.)
///
/// # Errors
///
/// The request's failure, or the server's error answer.
pub async fn jetstream_ready(js: &Context) -> Result<(), String> {
    let reply = js
        .client()
        .request("$JS.API.INFO", "".into())
        .await
        .map_err(|e| e.to_string())?;
    let text = String::from_utf8_lossy(&reply.payload);
    if text.contains("account_info_response") && !text.contains("\"error\"") {
        Ok(())
    } else {
        Err(text.into_owned())
    }
}

impl Drop for NatsCluster {
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
