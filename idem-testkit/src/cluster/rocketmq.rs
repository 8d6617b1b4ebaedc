//! A RocketMQ cluster of the test's own: one name server and one broker
//! group (`broker-a`) of a master and, when asked for, a slave that
//! replicates it (same `brokerName`, `brokerId` 1, HA to the master), all
//! rocketmq-rust (the Rust re-implementation of Apache RocketMQ) on their
//! own ports on 127.0.0.1 and their own directory under `/dev/shm`
//! (memory: a rocketmq-rust broker refuses to start on a file system more
//! than 75% used, and no setting of its configuration lifts that), killed
//! and removed on drop, also when the test panics.
//!
//! The programs are `rocketmq-namesrv-rust` and `rocketmq-broker-rust` in
//! `$IDEM_ROCKETMQ_HOME/bin` when that is set, else in
//! `/opt/idem-brokers/rocketmq/bin` (where `.ci/run` installs them with
//! `cargo install`), else on the `PATH`. Missing: the test is skipped
//! locally, a failure when `CI=true` ([`super::need`]).
//!
//! Each server runs with a cleared environment (`PATH`; `HOME` and
//! `ROCKETMQ_HOME` its own directory, where the name server keeps its
//! `kvConfig.json` and the broker its store; `RUST_LOG=warn`) and logs to
//! a file of its own (stdout and stderr: the servers log on the console,
//! with ANSI colours). At `warn` a run's log stays a few kilobytes.
//!
//! The name server listens on 127.0.0.1 (`--bindAddress`); a broker binds
//! 127.0.0.1 (`brokerServerConfig.bindAddress`, also for its second
//! listener on `listenPort - 2`, the "fast" remoting port of RocketMQ)
//! and advertises 127.0.0.1 (`brokerIp1`, `brokerIp2`): without them it
//! registers its interface address. Its HA port (`haListenAddress`) and
//! its health probe (`ROCKETMQ_HEALTH_BIND_ADDR`: `GET /readyz`) are on
//! 127.0.0.1 too. The broker is configured by a TOML file (`-c
//! broker.toml`; rocketmq-rust also reads a Java `broker.conf`, whose keys
//! it maps to the TOML sections): `autoCreateTopicEnable`,
//! `autoCreateSubscriptionGroup`, `slaveReadEnable` on, `ASYNC_FLUSH`,
//! the master `ASYNC_MASTER`, the slave `SLAVE` with `haMasterAddress`
//! set to the master's HA port; commit log files of 16 MiB instead of
//! 1 GiB. The role is set twice, `store.brokerRole` and
//! `broker.brokerRole`: rocketmq-rust 1.0.0 has a field in each section,
//! the store acts on the first, but the broker starts its HA client (the
//! replication) and the slave's synchronisation of topics and consumer
//! offsets from the master only when the second says `SLAVE` (its
//! default is `ASYNC_MASTER`, and a Java `broker.conf`'s `brokerRole` is
//! mapped to the store's only). With the store's alone, the slave's
//! commit log stayed empty.
//!
//! Measured on the 2-core machine (rocketmq-rust 1.0.0, the
//! `rocketmq-client-rust` 1.0.0 lite pull consumer, `tests/rocketmq_broker.rs`):
//!
//! - A start (name server, master, slave) takes 0.3-0.7 s until each
//!   broker answers `/readyz`; a restart of the master on its store
//!   0.2-0.5 s.
//! - The slave replicates: its commit log holds the master's bytes, and
//!   its `consumerOffset.json` the master's committed offsets (copied
//!   every 10 s, the first time 10 s after its start: an offset committed
//!   within 10 s of a crash is not on the slave).
//! - **Reads from the slave do not work.** With the master killed
//!   (SIGKILL), a consumer is assigned the group's queues (the name server
//!   still routes the slave) but reads nothing for as long as it polls
//!   (10 s in the test, 30 s in a probe): the slave never builds its
//!   consume queues from the replicated commit log. Its log says, every
//!   10 s, `maybe ConsumeQueue was created just now. topic=… queueId=0
//!   maxPhysicOffset=-1 minLogicOffset=0.`, and its `store/consumequeue` is
//!   empty. In the source (rocketmq-store 1.0.0, also upstream in
//!   2026-08), the dispatch of the commit log to the consume queues
//!   (`reput`) wakes only on a notification that `put_message` sends; the
//!   replica's append (`append_replica_bytes`) sends none.
//! - With the master down, a send fails (`core.argument.invalid:
//!   Argument is invalid`, the client redacts the rest) for as long as
//!   it is down: one broker group, no other master.
//! - A commit with the master down goes to the slave (the client's
//!   `committed` then reads it back from the slave), and is lost: after
//!   the master's restart the group's offsets are the master's (none).
//! - After [`RocketMq::restart_master`] (same store, same ports), a
//!   producer started before the crash sends again at once (its first
//!   send after `/readyz` succeeded within 10 ms), and a consumer of the
//!   group that committed before the crash starts at the committed
//!   offsets: it reads the messages never committed (again, same queue
//!   and offset) and the new ones, within 1.3-1.6 s of the restart.
//!
//! [`RocketMq::create_topic`] creates a topic with N queues on every
//! broker of the group through the admin API (UpdateAndCreateTopic, on
//! the master and on the slave, which would otherwise learn it only at
//! its next synchronisation from the master) and waits until the name
//! server routes it. [`RocketMq::kill9_master`] kills the master with
//! SIGKILL; [`RocketMq::restart_master`] starts it again on the same
//! ports and the same store.
//!
//! The client is the `rocketmq-client-rust` crate, re-exported here as
//! [`client`], with [`model`] (`Message`, `MessageExt`) and [`runtime`];
//! its producers and consumers are built on a [`client_runtime`], and
//! [`RocketMq::client_options`] points them at the name server with
//! route and heartbeat intervals of 10 s, the least the client accepts
//! (the defaults, 30 s, would leave a client on a dead master's route for
//! up to 30 s).
//!
//! ```no_run
//! # async fn run() {
//! use idem_testkit::cluster::rocketmq::{RocketMq, client_runtime};
//! let Some(mut mq) = RocketMq::start_with_slave() else {
//!     return; // skipped: rocketmq-rust is not installed
//! };
//! mq.create_topic("orders", 4).await;
//! mq.kill9_master();
//! mq.restart_master();
//! # }
//! ```

pub use rocketmq_client_rust as client;
pub use rocketmq_model as model;
pub use rocketmq_runtime as runtime;

use super::{Proc, Scratch, free_port, installed, need, wait_port};
use rocketmq_client_rust::{
    ClientConfig, ClientOptions, ClientRuntime, ClientRuntimeConfig, DefaultMQAdminExt,
    DefaultMQProducer, TelemetryHandle, TopicAdmin,
};
use rocketmq_model::common::config::TopicConfig;
use rocketmq_runtime::{RuntimeConfig, RuntimeOwner};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::Command;
use std::sync::{Arc, LazyLock};
use std::time::{Duration, Instant};

/// `f`, boxed: the client's futures nest deep enough that a test's future
/// awaiting them inline overflows rustc's default query depth (128).
fn boxed<'a, T>(
    f: impl std::future::Future<Output = T> + Send + 'a,
) -> std::pin::Pin<Box<dyn std::future::Future<Output = T> + Send + 'a>> {
    Box::pin(f)
}

/// Where `.ci/run` installs rocketmq-rust (`cargo install
/// rocketmq-namesrv@1.0.0 rocketmq-broker@1.0.0 --root
/// /opt/idem-brokers/rocketmq`).
pub const ROCKETMQ_HOME: &str = "/opt/idem-brokers/rocketmq";
/// The name server's program, in `bin` of [`ROCKETMQ_HOME`].
pub const NAMESRV: &str = "rocketmq-namesrv-rust";
/// The broker's program, in `bin` of [`ROCKETMQ_HOME`].
pub const BROKER: &str = "rocketmq-broker-rust";
/// The broker group's name, master and slave.
pub const BROKER_NAME: &str = "broker-a";
/// The cluster's name.
pub const CLUSTER: &str = "IdemCluster";
/// How long a server may take to listen (name server) or to answer
/// `/readyz` (broker) after a start.
const READY_WITHIN: Duration = Duration::from_secs(60);
/// How long SIGTERM may take before a server is killed.
const TERMINATE_WITHIN: Duration = Duration::from_secs(15);
/// How long a created topic may take to show in the name server's route.
const TOPIC_WITHIN: Duration = Duration::from_secs(30);
/// The clients' route and heartbeat intervals: the least the client
/// accepts (its start fails with `core.configuration.invalid` below 10 s).
const CLIENT_INTERVAL_MS: u32 = 10_000;

/// The runtime every [`client_runtime`] runs on: built once per test
/// process and never dropped, so that clients outlive any one test's
/// Tokio runtime.
static CLIENT_OWNER: LazyLock<RuntimeOwner> = LazyLock::new(|| {
    RuntimeOwner::plan(RuntimeConfig {
        thread_name: "idem-rocketmq-client".to_owned(),
        ..RuntimeConfig::default()
    })
    .expect("a valid client runtime configuration")
    .build()
    .expect("build the client runtime")
});

/// A [`ClientRuntime`] for producers, consumers and admin clients (their
/// builders take one), named `scope`.
///
/// # Panics
///
/// When the client refuses the runtime (it never does with the defaults).
pub fn client_runtime(scope: &'static str) -> Arc<ClientRuntime> {
    ClientRuntime::try_new(
        CLIENT_OWNER.root_context().component(scope),
        ClientRuntimeConfig::default(),
        TelemetryHandle::noop(),
    )
    .expect("create a client runtime")
}

/// The two programs.
#[derive(Debug, Clone)]
struct Programs {
    namesrv: String,
    broker: String,
}

/// One broker of the group: its ports and its process.
#[derive(Debug)]
struct Node {
    /// `master` or `slave` (names its directory and logs).
    role: &'static str,
    broker_id: u8,
    /// Its remoting port; `port - 2` is its second ("fast") listener.
    port: u16,
    ha_port: u16,
    /// `ROCKETMQ_HEALTH_BIND_ADDR`'s port (`GET /readyz`).
    health_port: u16,
    /// The running broker (`None`: stopped).
    proc: Option<Proc>,
    /// Starts so far (names the log files).
    runs: usize,
}

impl Node {
    fn new(role: &'static str, broker_id: u8) -> Node {
        Node {
            role,
            broker_id,
            port: free_port_with_fast(),
            ha_port: free_port(),
            health_port: free_port(),
            proc: None,
            runs: 0,
        }
    }

    fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    fn pid(&self) -> Option<u32> {
        self.proc.as_ref().and_then(Proc::pid)
    }

    fn log_tail(&self, lines: usize) -> String {
        match &self.proc {
            Some(p) => p.log_tail(lines),
            None => format!(
                "--- {} broker on port {}: not running ---",
                self.role, self.port
            ),
        }
    }
}

/// A running RocketMQ name server and broker group (a master, and a slave
/// when asked for) of the test's own, killed (and its directory removed)
/// on drop.
#[derive(Debug)]
pub struct RocketMq {
    /// The running name server (`None`: stopped). The processes are
    /// dropped (killed) before `dir`.
    namesrv: Option<Proc>,
    namesrv_port: u16,
    master: Node,
    slave: Option<Node>,
    programs: Programs,
    dir: Scratch,
}

impl RocketMq {
    /// Starts a name server and a broker master, or `None` when
    /// rocketmq-rust is missing (skipped locally, a failure when
    /// `CI=true`).
    ///
    /// # Panics
    ///
    /// When a server does not come up within 60 s (its log tail is in the
    /// message).
    pub fn start() -> Option<RocketMq> {
        RocketMq::start_cluster(false)
    }

    /// Starts a name server, a broker master and its slave, or `None` when
    /// rocketmq-rust is missing.
    ///
    /// # Panics
    ///
    /// When a server does not come up within 60 s.
    pub fn start_with_slave() -> Option<RocketMq> {
        RocketMq::start_cluster(true)
    }

    fn start_cluster(with_slave: bool) -> Option<RocketMq> {
        let programs = programs();
        need(
            "rocketmq (rocketmq-rust)",
            &[&programs.namesrv, &programs.broker],
        )?;
        let begun = Instant::now();
        let mut mq = RocketMq {
            namesrv: None,
            namesrv_port: free_port(),
            master: Node::new("master", 0),
            slave: with_slave.then(|| Node::new("slave", 1)),
            programs,
            // Memory, not the disk: a rocketmq-rust broker refuses to
            // start when its store's file system is more than 75% used
            // (its `diskMaxUsedSpaceRatio`, which its configuration does
            // not lift), as a machine full of builds can be.
            dir: Scratch::in_memory("rocketmq"),
        };
        mq.spawn_namesrv();
        mq.spawn_broker(false);
        if mq.slave.is_some() {
            mq.spawn_broker(true);
        }
        eprintln!(
            "rocketmq: name server on {}, master on {}{} in {:?}",
            mq.namesrv_port,
            mq.master.port,
            mq.slave
                .as_ref()
                .map(|s| format!(", slave on {}", s.port))
                .unwrap_or_default(),
            begun.elapsed()
        );
        Some(mq)
    }

    /// The name server's address for a client, `127.0.0.1:<port>`.
    pub fn namesrv_addr(&self) -> String {
        format!("127.0.0.1:{}", self.namesrv_port)
    }

    /// The master's address, `127.0.0.1:<port>`.
    pub fn master_addr(&self) -> String {
        self.master.addr()
    }

    /// The slave's address, when there is a slave.
    pub fn slave_addr(&self) -> Option<String> {
        self.slave.as_ref().map(Node::addr)
    }

    /// The name server's process id, while it runs.
    pub fn namesrv_pid(&self) -> Option<u32> {
        self.namesrv.as_ref().and_then(Proc::pid)
    }

    /// The master's process id, while it runs.
    pub fn master_pid(&self) -> Option<u32> {
        self.master.pid()
    }

    /// The slave's process id, while it runs.
    pub fn slave_pid(&self) -> Option<u32> {
        self.slave.as_ref().and_then(Node::pid)
    }

    /// Client options for a producer or consumer of this cluster (their
    /// builders' `client_options`): the name server, and route and
    /// heartbeat intervals of 10 s.
    pub fn client_options(&self) -> ClientOptions {
        let config = ClientConfig::builder()
            .namesrv_addr(self.namesrv_addr())
            .poll_name_server_interval(CLIENT_INTERVAL_MS)
            .heartbeat_broker_interval(CLIENT_INTERVAL_MS)
            .build_unvalidated();
        ClientOptions::legacy(config)
    }

    /// A started producer of the group `group` on this cluster, with a
    /// send time-out of 3 s.
    ///
    /// # Panics
    ///
    /// When it does not start.
    pub async fn producer(&self, group: &str) -> DefaultMQProducer {
        boxed(self.start_producer(group)).await
    }

    async fn start_producer(&self, group: &str) -> DefaultMQProducer {
        let mut producer = DefaultMQProducer::builder(client_runtime("idem-rocketmq-producer"))
            .client_options(self.client_options())
            .producer_group(group)
            .name_server_addr(self.namesrv_addr())
            .send_msg_timeout(3000)
            .build();
        producer.start().await.expect("start the producer");
        producer
    }

    /// Creates the topic `name` with `queues` read and write queues on the
    /// master and the slave (admin UpdateAndCreateTopic), and waits until
    /// the name server routes all its queues.
    ///
    /// # Panics
    ///
    /// When a broker refuses it or the route does not show within 30 s.
    pub async fn create_topic(&self, name: &str, queues: u32) {
        boxed(self.create_topic_now(name, queues)).await
    }

    async fn create_topic_now(&self, name: &str, queues: u32) {
        let mut admin = DefaultMQAdminExt::new(client_runtime("idem-rocketmq-admin"));
        admin.set_namesrv_addr(self.namesrv_addr());
        admin.start().await.expect("start the admin client");
        let brokers = std::iter::once(self.master.addr()).chain(self.slave_addr());
        for addr in brokers {
            let config = TopicConfig::with_queues(name, queues, queues);
            if let Err(e) = admin
                .create_and_update_topic_config(addr.clone().into(), config)
                .await
            {
                panic!("create topic {name} on {addr}: {e}\n{}", self.log_tail(30));
            }
        }
        admin.shutdown().await;
        let mut producer = self.producer(&crate::unique("idem-route")).await;
        let deadline = Instant::now() + TOPIC_WITHIN;
        let mut shown = 0;
        while Instant::now() < deadline {
            shown = producer
                .fetch_publish_message_queues(name)
                .await
                .map_or(0, |q| q.len());
            if shown == queues as usize {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        producer.shutdown().await;
        assert_eq!(
            shown,
            queues as usize,
            "topic {name} shows {shown} of its {queues} queues after {TOPIC_WITHIN:?}\n{}",
            self.log_tail(30)
        );
    }

    /// Kills the master with SIGKILL (a crash: no flush, no
    /// unregistration).
    pub fn kill9_master(&mut self) {
        if let Some(mut p) = self.master.proc.take() {
            p.kill9();
        }
    }

    /// Starts the master again on the same ports and the same store
    /// (killing it first if it still runs) and waits until it answers
    /// `/readyz`.
    ///
    /// # Panics
    ///
    /// When it does not come back within 60 s.
    pub fn restart_master(&mut self) {
        self.kill9_master();
        let begun = Instant::now();
        self.spawn_broker(false);
        eprintln!(
            "rocketmq: master back on {} in {:?}",
            self.master.port,
            begun.elapsed()
        );
    }

    /// Stops every server with SIGTERM (brokers first), waiting up to 15 s
    /// for each before killing it.
    pub fn terminate(&mut self) {
        let brokers = self
            .slave
            .iter_mut()
            .chain(std::iter::once(&mut self.master));
        for node in brokers {
            if let Some(mut p) = node.proc.take() {
                p.terminate(TERMINATE_WITHIN);
            }
        }
        if let Some(mut p) = self.namesrv.take() {
            p.terminate(TERMINATE_WITHIN);
        }
    }

    /// The last `lines` lines of each server's current (or last) log.
    pub fn log_tail(&self, lines: usize) -> String {
        let namesrv = match &self.namesrv {
            Some(p) => p.log_tail(lines),
            None => format!("--- name server on {}: not running ---", self.namesrv_port),
        };
        let mut tail = format!("{namesrv}\n{}", self.master.log_tail(lines));
        if let Some(slave) = &self.slave {
            tail = format!("{tail}\n{}", slave.log_tail(lines));
        }
        tail
    }

    /// The master's log of its `run`-th start (1 is the first), whole,
    /// for a test that looks for a line in it.
    pub fn master_log(&self, run: usize) -> String {
        std::fs::read_to_string(self.dir.join(&format!("master-{run}.log"))).unwrap_or_default()
    }

    /// The slave's log (of its only start), whole.
    pub fn slave_log(&self) -> String {
        std::fs::read_to_string(self.dir.join("slave-1.log")).unwrap_or_default()
    }

    fn spawn_namesrv(&mut self) {
        let home = self.dir.join("namesrv");
        std::fs::create_dir_all(&home).expect("create the name server's directory");
        let mut cmd = server_command(&self.programs.namesrv, &home);
        cmd.arg("--listenPort")
            .arg(self.namesrv_port.to_string())
            .args(["--bindAddress", "127.0.0.1"])
            .arg("--rocketmqHome")
            .arg(&home)
            .arg("--kvConfigPath")
            .arg(home.join("kvConfig.json"));
        let log = self.dir.join("namesrv.log");
        let mut proc = Proc::spawn("rocketmq name server", cmd, log);
        if !wait_port(self.namesrv_port, READY_WITHIN) || !proc.running() {
            panic!(
                "the name server on {} did not listen within {READY_WITHIN:?}\n{}",
                self.namesrv_port,
                proc.log_tail(30)
            );
        }
        self.namesrv = Some(proc);
    }

    fn spawn_broker(&mut self, slave: bool) {
        let master_ha = self.master.ha_port;
        let namesrv = self.namesrv_addr();
        let node = if slave {
            self.slave.as_mut().expect("a slave")
        } else {
            &mut self.master
        };
        let home = self.dir.join(node.role);
        std::fs::create_dir_all(&home).expect("create the broker's directory");
        let config = home.join("broker.toml");
        std::fs::write(&config, broker_toml(node, &home, &namesrv, master_ha))
            .expect("write broker.toml");
        node.runs += 1;
        let mut cmd = server_command(&self.programs.broker, &home);
        cmd.env(
            "ROCKETMQ_HEALTH_BIND_ADDR",
            format!("127.0.0.1:{}", node.health_port),
        )
        .env("ROCKETMQ_SHUTDOWN_TIMEOUT_SECONDS", "5")
        .arg("-c")
        .arg(&config);
        let log = self.dir.join(&format!("{}-{}.log", node.role, node.runs));
        let name = format!("rocketmq {} broker", node.role);
        node.proc = Some(Proc::spawn(&name, cmd, log));
        wait_ready(node);
    }
}

/// A command running `program` with a cleared environment in `home`.
fn server_command(program: &str, home: &Path) -> Command {
    let mut cmd = Command::new(program);
    cmd.env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("HOME", home)
        .env("ROCKETMQ_HOME", home)
        .env("RUST_LOG", "warn")
        .current_dir(home);
    cmd
}

/// The broker's configuration file.
fn broker_toml(node: &Node, home: &Path, namesrv: &str, master_ha: u16) -> String {
    let store = home.join("store");
    let store = store.display();
    let (role, ha_master) = if node.broker_id == 0 {
        ("ASYNC_MASTER", String::new())
    } else {
        (
            "SLAVE",
            format!("haMasterAddress = \"127.0.0.1:{master_ha}\"\n"),
        )
    };
    format!(
        r#"[broker]
brokerIp1 = "127.0.0.1"
brokerIp2 = "127.0.0.1"
listenPort = {port}
namesrvAddr = "{namesrv}"
storePathRootDir = "{store}"
autoCreateTopicEnable = true
autoCreateSubscriptionGroup = true
slaveReadEnable = true
brokerRole = "{role}"

[broker.brokerServerConfig]
bindAddress = "127.0.0.1"

[broker.brokerIdentity]
brokerName = "{BROKER_NAME}"
brokerClusterName = "{CLUSTER}"
brokerId = {id}

[store]
brokerRole = "{role}"
flushDiskType = "ASYNC_FLUSH"
haListenAddress = "127.0.0.1"
haListenPort = {ha}
storePathRootDir = "{store}"
mappedFileSizeCommitLog = 16777216
{ha_master}"#,
        port = node.port,
        id = node.broker_id,
        ha = node.ha_port,
    )
}

/// Waits until the broker answers `GET /readyz` with 200.
fn wait_ready(node: &mut Node) {
    let deadline = Instant::now() + READY_WITHIN;
    loop {
        let exited = node.proc.as_mut().is_some_and(|p| !p.running());
        assert!(
            !exited,
            "the {} broker on {} exited at start\n{}",
            node.role,
            node.port,
            node.log_tail(40)
        );
        if readyz(node.health_port) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the {} broker on {} was not ready within {READY_WITHIN:?}\n{}",
            node.role,
            node.port,
            node.log_tail(40)
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Whether the health probe on `port` answers `GET /readyz` with 200.
fn readyz(port: u16) -> bool {
    let Ok(mut stream) = TcpStream::connect(("127.0.0.1", port)) else {
        return false;
    };
    let _ = stream.set_read_timeout(Some(Duration::from_secs(1)));
    let request = "GET /readyz HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n";
    if stream.write_all(request.as_bytes()).is_err() {
        return false;
    }
    let mut response = String::new();
    let _ = stream.read_to_string(&mut response);
    response.starts_with("HTTP/1.1 200")
}

/// A free port `p` whose `p - 2` is free too (a broker's second
/// listener).
fn free_port_with_fast() -> u16 {
    loop {
        let port = free_port();
        if port > 1026 && std::net::TcpListener::bind(("127.0.0.1", port - 2)).is_ok() {
            return port;
        }
    }
}

/// The programs: in `$IDEM_ROCKETMQ_HOME/bin`, else in [`ROCKETMQ_HOME`]
/// `/bin` where they exist, else on the `PATH`.
fn programs() -> Programs {
    let in_home = |home: &str| Programs {
        namesrv: format!("{home}/bin/{NAMESRV}"),
        broker: format!("{home}/bin/{BROKER}"),
    };
    if let Some(home) = crate::env_setting("IDEM_ROCKETMQ_HOME") {
        return in_home(&home);
    }
    let default = in_home(ROCKETMQ_HOME);
    if installed(&default.namesrv) && installed(&default.broker) {
        return default;
    }
    Programs {
        namesrv: NAMESRV.into(),
        broker: BROKER.into(),
    }
}
