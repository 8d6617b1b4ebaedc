//! One Kafka-protocol broker of the test's own: `nisshi` (a Kafka-compatible
//! broker written in Rust, the successor of tansu) on its own port on
//! 127.0.0.1, its own directory under the temporary folder holding its
//! SQLite storage and its log, killed and removed on drop, also when the
//! test panics.
//!
//! The program is `IDEM_NISSHI` when set, else `/opt/idem-brokers/nisshi/bin/nisshi`
//! (where `.ci/run` installs it with `cargo install`), else `nisshi` on
//! the `PATH`. It runs with a cleared environment (only `PATH`, `HOME` and
//! `RUST_LOG=warn`) and an empty `.env` in its directory (it reads the
//! nearest `.env` up from its working directory), so that nothing of the
//! caller's environment configures it. It logs at `warn`: at `info` a
//! probe's log once grew to 7.6 GB.
//!
//! One broker, no cluster: every nisshi advertises node id 111. Its group
//! coordinator starts an empty group's first rebalance at once
//! (`--group-initial-rebalance-delay 0s`; nisshi's default of 3 s made
//! every first subscription of a group wait 3 s).
//!
//! Measured on the 2-core machine (nisshi 0.8.1, rdkafka 0.39):
//!
//! - A start takes 50-130 ms until the broker answers a metadata request;
//!   a restart on the existing SQLite file the same.
//! - [`KafkaBroker::terminate`] (SIGTERM) returns in about 50 ms; nisshi
//!   waits up to 5 s for its connections' tasks before it aborts them.
//! - A group member killed with SIGKILL: its partitions are on the
//!   surviving member a little under `session.timeout.ms` later (5.9-6.0 s
//!   with 6000 ms and `heartbeat.interval.ms` 1000; 2.95-2.98 s with 3000
//!   and 500; 2.1 s with 2000 and 300). nisshi has no lower bound of its
//!   own for the session time-out (its JoinGroup refuses only 0 and more
//!   than 30 min).
//!
//! [`KafkaBroker::kill9`] kills it with SIGKILL (a crash);
//! [`KafkaBroker::restart`] starts it again on the same port and the same
//! SQLite file: the records, the topics and the committed offsets are
//! still there, and a producer connected before the crash goes on.
//!
//! [`KafkaBroker::create_topic`] (async) creates a topic with the admin API
//! (CreateTopics) and waits for its metadata; the other methods block. A producer's first record
//! to an unknown topic also creates it, with 4 partitions (librdkafka's
//! producers ask for it in their metadata requests by default); a
//! consumer's subscription does not, even with
//! `allow.auto.create.topics=true`: it reads `UnknownTopicOrPartition`.
//!
//! The client is the `rdkafka` crate (librdkafka, built from its bundled
//! source by its own `configure` and `make`, without TLS and SASL),
//! re-exported here as [`rdkafka`].
//!
//! ```no_run
//! # async fn run() {
//! use idem_testkit::cluster::kafka::KafkaBroker;
//! let Some(mut broker) = KafkaBroker::start() else {
//!     return; // skipped: nisshi is not installed
//! };
//! broker.create_topic("orders", 3).await;
//! let producer: idem_testkit::cluster::kafka::rdkafka::producer::FutureProducer =
//!     broker.client_config().create().expect("producer");
//! broker.kill9();
//! broker.restart();
//! # let _ = producer;
//! # }
//! ```

pub use rdkafka;

use super::{Proc, Scratch, free_port, installed, need, wait_port};
use rdkafka::ClientConfig;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer};
use std::process::Command;
use std::time::{Duration, Instant};

/// Where `.ci/run` installs nisshi (`cargo install nisshi --root
/// /opt/idem-brokers/nisshi`).
pub const NISSHI: &str = "/opt/idem-brokers/nisshi/bin/nisshi";
/// How long the broker may take to answer a metadata request after a
/// start.
const READY_WITHIN: Duration = Duration::from_secs(30);
/// How long SIGTERM may take before the broker is killed.
const TERMINATE_WITHIN: Duration = Duration::from_secs(30);
/// How long a created topic may take to show all its partitions.
const TOPIC_WITHIN: Duration = Duration::from_secs(30);

/// A running nisshi broker of the test's own, killed (and its directory
/// removed) on drop.
#[derive(Debug)]
pub struct KafkaBroker {
    /// The running broker (`None`: stopped). Dropped before `dir`.
    proc: Option<Proc>,
    program: String,
    port: u16,
    dir: Scratch,
    /// Brokers started so far (names the log files).
    runs: usize,
    /// How long the last start took until the broker answered metadata.
    started_in: Duration,
}

impl KafkaBroker {
    /// Starts a broker on a free port and waits until it answers a
    /// metadata request, or `None` when nisshi is missing (skipped
    /// locally, a failure when `CI=true`).
    ///
    /// # Panics
    ///
    /// When the broker does not answer within 30 s (its log tail is in
    /// the message).
    pub fn start() -> Option<KafkaBroker> {
        let program = program();
        need("kafka broker (nisshi)", &[&program])?;
        let dir = Scratch::new("kafka");
        // nisshi reads `.env` from its working directory or the nearest
        // parent that has one: an empty one here stops the search.
        std::fs::write(dir.join(".env"), "").expect("write the broker's .env");
        let mut broker = KafkaBroker {
            proc: None,
            program,
            port: free_port(),
            dir,
            runs: 0,
            started_in: Duration::ZERO,
        };
        broker.spawn();
        eprintln!(
            "kafka broker: up on port {} in {:?}",
            broker.port, broker.started_in
        );
        Some(broker)
    }

    /// Its port on 127.0.0.1.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The running broker's process id (`None`: stopped), for a benchmark
    /// that counts its CPU time.
    pub fn pid(&self) -> Option<u32> {
        self.proc.as_ref().and_then(Proc::pid)
    }

    /// The bootstrap servers for a client, `127.0.0.1:<port>`.
    pub fn bootstrap(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// How long the last start (or restart) took until the broker
    /// answered a metadata request.
    pub fn started_in(&self) -> Duration {
        self.started_in
    }

    /// A client configuration for this broker: `bootstrap.servers`, IPv4,
    /// and reconnection back-offs of at most a second (librdkafka's
    /// default grows to 10 s, which a client would wait after a broker
    /// restart). Add the producer's or consumer's own settings to it.
    pub fn client_config(&self) -> ClientConfig {
        let mut config = ClientConfig::new();
        config
            .set("bootstrap.servers", self.bootstrap())
            .set("broker.address.family", "v4")
            .set("reconnect.backoff.ms", "50")
            .set("reconnect.backoff.max.ms", "1000");
        config
    }

    /// Creates the topic `name` with `partitions` partitions (replication
    /// factor 1) through the admin API's CreateTopics, and waits until its
    /// metadata shows every partition with a leader.
    ///
    /// # Panics
    ///
    /// When the creation fails (also when the topic exists already) or
    /// the partitions do not show within 30 s.
    pub async fn create_topic(&self, name: &str, partitions: i32) {
        let admin: AdminClient<DefaultClientContext> = self
            .client_config()
            .create()
            .expect("create the admin client");
        let topic = NewTopic::new(name, partitions, TopicReplication::Fixed(1));
        let options = AdminOptions::new().request_timeout(Some(Duration::from_secs(10)));
        let results = admin
            .create_topics([&topic], &options)
            .await
            .unwrap_or_else(|e| panic!("create topic {name}: {e}\n{}", self.log_tail(30)));
        for result in results {
            if let Err((topic, code)) = result {
                panic!("create topic {topic}: {code}\n{}", self.log_tail(30));
            }
        }
        let config = self.client_config();
        let name = name.to_owned();
        let expected = usize::try_from(partitions).unwrap_or(0);
        let shown = tokio::task::spawn_blocking(move || {
            let deadline = Instant::now() + TOPIC_WITHIN;
            loop {
                let shown = partitions_with_leader(&config, &name);
                if shown == expected || Instant::now() >= deadline {
                    return shown;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        })
        .await
        .expect("wait for the topic's metadata");
        assert_eq!(
            shown,
            expected,
            "topic {topic} shows {shown} of its {expected} partitions after {TOPIC_WITHIN:?}",
            topic = topic.name
        );
    }

    /// Stops it with SIGTERM, waiting up to 30 s before killing it.
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

    /// Starts it again on the same port and the same SQLite file (killing
    /// it first if it still runs) and waits until it answers a metadata
    /// request. What it had stored is still there.
    ///
    /// # Panics
    ///
    /// When it does not come back within 30 s.
    pub fn restart(&mut self) {
        self.kill9();
        self.spawn();
        eprintln!(
            "kafka broker: back on port {} in {:?}",
            self.port, self.started_in
        );
    }

    /// The last `lines` lines of the current (or last) run's log.
    pub fn log_tail(&self, lines: usize) -> String {
        match &self.proc {
            Some(p) => p.log_tail(lines),
            None => format!("--- kafka broker on port {}: not running ---", self.port),
        }
    }

    fn spawn(&mut self) {
        self.runs += 1;
        let listener = format!("tcp://127.0.0.1:{}", self.port);
        let mut cmd = Command::new(&self.program);
        cmd.env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .env("HOME", self.dir.path())
            .env("RUST_LOG", "warn")
            .current_dir(self.dir.path())
            .arg("broker")
            .args(["--cluster-id", "idem-test"])
            .args(["--listener-url", &listener])
            .args(["--advertised-listener-url", &listener])
            .args(["--storage-engine", "sqlite://broker.db"])
            .args(["--group-initial-rebalance-delay", "0s"]);
        let log = self.dir.join(&format!("run-{}.log", self.runs));
        self.proc = Some(Proc::spawn("nisshi", cmd, log));
        let begun = Instant::now();
        let deadline = begun + READY_WITHIN;
        let config = self.client_config();
        loop {
            let exited = self.proc.as_mut().is_some_and(|p| !p.running());
            assert!(
                !exited,
                "nisshi on port {} exited at start\n{}",
                self.port,
                self.log_tail(30)
            );
            let left = deadline.saturating_duration_since(Instant::now());
            assert!(
                !left.is_zero(),
                "nisshi on port {} did not answer metadata within {READY_WITHIN:?}\n{}",
                self.port,
                self.log_tail(30)
            );
            // A client made before the port listens would back off between
            // its connection attempts: one per attempt, once the port
            // accepts.
            if wait_port(self.port, left.min(Duration::from_millis(500)))
                && answers_metadata(&config, left.min(Duration::from_secs(5)))
            {
                break;
            }
        }
        self.started_in = begun.elapsed();
    }
}

/// The broker program: `IDEM_NISSHI`, else [`NISSHI`] where it exists,
/// else `nisshi` (on the `PATH`).
fn program() -> String {
    if let Some(p) = crate::env_setting("IDEM_NISSHI") {
        return p;
    }
    if installed(NISSHI) {
        return NISSHI.into();
    }
    "nisshi".into()
}

/// A consumer-type client (no group) for metadata requests: it never asks
/// the broker to create a topic.
fn metadata_client(config: &ClientConfig) -> Option<BaseConsumer> {
    let mut config = config.clone();
    config.set("allow.auto.create.topics", "false");
    config.create().ok()
}

/// Whether the broker answers a metadata request listing itself within
/// `within`.
fn answers_metadata(config: &ClientConfig, within: Duration) -> bool {
    metadata_client(config)
        .and_then(|c| c.fetch_metadata(None, within).ok())
        .is_some_and(|m| !m.brokers().is_empty())
}

/// How many partitions of `topic` the metadata shows with a leader (0
/// while the topic is unknown).
fn partitions_with_leader(config: &ClientConfig, topic: &str) -> usize {
    let Some(client) = metadata_client(config) else {
        return 0;
    };
    let Ok(metadata) = client.fetch_metadata(Some(topic), Duration::from_secs(5)) else {
        return 0;
    };
    metadata
        .topics()
        .iter()
        .filter(|t| t.name() == topic && t.error().is_none())
        .flat_map(|t| t.partitions())
        .filter(|p| p.error().is_none() && p.leader() >= 0)
        .count()
}
