//! A Patroni-managed PostgreSQL 15 cluster: one etcd, three
//! members each run by its own Patroni, and an haproxy that sends clients
//! to whichever member Patroni's REST API calls the primary. Failover is
//! Patroni's own: a test kills or freezes the leader
//! ([`Patroni::kill9_leader`], [`Patroni::sigstop_leader`]) and waits for
//! the new one ([`Patroni::wait_for_new_leader`]).
//!
//! - etcd (Debian's `etcd-server`, 3.4): one member on free client and
//!   peer ports, its data in the scratch folder, with its v2 API on
//!   (`--enable-v2`). It runs as the test's user; nothing of the machine's
//!   own etcd (if any) is touched. Patroni talks to it through the v2 API
//!   (`etcd:`), not `etcd3:`: Debian 12's Patroni 3.0.2 renews the leader
//!   key over etcd v3 with an unconditional put once its lease has expired
//!   (fixed in Patroni 3.0.3, patroni/patroni#2689), so a leader woken from
//!   a freeze longer than `ttl` overwrote the new leader's key here and two
//!   members ran as primaries (in 2 of 4 runs of `pg_patroni`). The v2
//!   API renews with a compare-and-swap on the key's value, which fails, and
//!   the woken leader demotes itself.
//! - Each member: `patroni {name}.yml` as the `postgres` system user, its
//!   REST API and PostgreSQL on free ports, its data directory in the
//!   scratch folder. PostgreSQL's settings: `fsync=off` (a SIGKILL loses
//!   nothing the kernel has; the standbys' copies are what counts),
//!   `wal_log_hints` for `pg_rewind`, small buffers, replication slots. The first member to
//!   take etcd's initialize key runs `initdb`; the others clone it with
//!   `pg_basebackup`. Timings: `ttl` [`TTL`] s, `loop_wait` [`LOOP_WAIT`]
//!   s, `retry_timeout` [`RETRY_TIMEOUT`] s (Patroni's rule: `loop_wait +
//!   2 × retry_timeout ≤ ttl`): a dead or frozen leader's lock expires
//!   within `ttl`, and a standby takes over a fraction of a second later.
//!   Patroni 3.0 takes these values; later releases raise a `ttl` below
//!   20 to 20.
//! - [`Mode`]: `synchronous_mode` (Patroni names one standby in
//!   `synchronous_standby_names` and promotes only that one), with or
//!   without `synchronous_mode_strict` (no commit without a synchronous
//!   standby), or off. Changed at run time with `PATCH /config`
//!   ([`Patroni::set_mode`]).
//! - haproxy (TCP mode, in the foreground): every member a server, checked
//!   every 200 ms with `option httpchk GET /primary` on the member's REST
//!   port (`http-check expect status 200`, `fall 2 rise 1`,
//!   `on-marked-down shutdown-sessions`). Patroni answers 200 there only
//!   while it holds the leader lock, so a frozen, demoted or lock-less
//!   primary gets no client through haproxy, and none of the old
//!   leader's sessions survive its being marked down.
//!
//! Everything is killed on drop (SIGKILL to every Patroni, postmaster and
//! PostgreSQL child, etcd and haproxy), also when the test fails or
//! panics; the scratch folder is removed after (kept with
//! `IDEM_KEEP_SCRATCH=1`).
//!
//! ```no_run
//! # async fn run() {
//! use idem_testkit::cluster::patroni::{Mode, Patroni};
//! let Some(cluster) = Patroni::start("my_test", Mode::Synchronous).await else {
//!     return; // skipped: Patroni, etcd, PostgreSQL 15 or haproxy is not installed
//! };
//! let pool = cluster.pool(8);
//! // … calls through `pool` …
//! let old = cluster.kill9_leader().await;
//! let took = cluster.wait_for_new_leader().await;
//! cluster.restart(old); // rejoins as a standby (pg_rewind)
//! # let _ = (pool, took);
//! # }
//! ```

mod config;
mod faults;
mod haproxy;
mod node;
mod rest;

use super::{Proc, Scratch, free_port, need, wait_port};
use config::{Member, patroni_yml};
use haproxy::haproxy_config;
use node::Node;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{Connection, PgConnection, PgPool};
use std::path::Path;
use std::process::Command;
use std::str::FromStr;
use std::sync::Mutex;
use std::time::{Duration, Instant};

pub use super::pg_standby::{BIN, HAPROXY};

/// Debian's `patroni`.
pub const PATRONI: &str = "/usr/bin/patroni";
/// Debian's `etcd-server`.
pub const ETCD: &str = "/usr/bin/etcd";
/// Members in the cluster.
pub const MEMBERS: usize = 3;
/// The leader lock's time to live, in seconds.
pub const TTL: u32 = 10;
/// Patroni's loop, in seconds.
pub const LOOP_WAIT: u32 = 1;
/// How long Patroni retries etcd and PostgreSQL before it gives up (and a
/// leader demotes itself), in seconds.
pub const RETRY_TIMEOUT: u32 = 4;
/// How long the cluster may take to be healthy (start-up, a mode change,
/// a member rejoining).
const HEALTHY_WITHIN: Duration = Duration::from_secs(90);

/// How the leader replicates (Patroni's dynamic configuration).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// `synchronous_mode: true`: a commit is acknowledged once the
    /// synchronous standby has flushed it, and only that standby may be
    /// promoted. With no standby left, the leader goes on alone
    /// (asynchronously).
    Synchronous,
    /// `synchronous_mode: true` and `synchronous_mode_strict: true`: as
    /// [`Mode::Synchronous`], but with no standby left commits wait.
    SynchronousStrict,
    /// `synchronous_mode: false`: acknowledged at the leader's flush; the
    /// newest commits can vanish with a dead leader.
    Asynchronous,
}

impl Mode {
    fn synchronous(self) -> bool {
        self != Mode::Asynchronous
    }
}

/// The cluster (see the [module](self)). Everything is killed on drop.
#[derive(Debug)]
pub struct Patroni {
    nodes: Vec<Node>,
    mode: Mutex<Mode>,
    etcd: Mutex<Proc>,
    haproxy: Mutex<Proc>,
    haproxy_port: u16,
    /// The member last killed or frozen, and when.
    fault: Mutex<Option<(usize, Instant)>>,
    // Dropped last: the processes above are gone by then.
    scratch: Scratch,
}

/// `n` distinct free ports.
fn free_ports(n: usize) -> Vec<u16> {
    let mut ports: Vec<u16> = Vec::with_capacity(n);
    while ports.len() < n {
        let p = free_port();
        if !ports.contains(&p) {
            ports.push(p);
        }
    }
    ports
}

impl Patroni {
    /// Starts etcd, the three members in `mode` and haproxy, and waits
    /// until the cluster is healthy (see [`Patroni::wait_healthy`]): about
    /// 10 s.
    ///
    /// `None` (skipped locally, a failure when `CI=true`) when Patroni,
    /// etcd, PostgreSQL 15's programs or haproxy are not installed.
    ///
    /// # Panics
    ///
    /// When a program does not start or the cluster is not healthy within
    /// 90 s (with the logs).
    pub async fn start(test: &str, mode: Mode) -> Option<Patroni> {
        need(
            test,
            &[
                PATRONI,
                ETCD,
                &format!("{BIN}/initdb"),
                &format!("{BIN}/postgres"),
                &format!("{BIN}/pg_ctl"),
                &format!("{BIN}/pg_basebackup"),
                &format!("{BIN}/pg_rewind"),
                &format!("{BIN}/pg_controldata"),
                &format!("{BIN}/pg_isready"),
                HAPROXY,
                "runuser",
            ],
        )?;
        let scratch = Scratch::new("patroni");
        let ports = free_ports(3 + 2 * MEMBERS);
        let (etcd_port, peer_port, haproxy_port) = (ports[0], ports[1], ports[2]);
        let scope = crate::unique("idem_patroni");

        let nodes: Vec<Node> = (0..MEMBERS)
            .map(|i| {
                Node::new(
                    format!("node{i}"),
                    ports[3 + 2 * i],
                    ports[4 + 2 * i],
                    scratch.path(),
                )
            })
            .collect();
        for n in &nodes {
            let yml = patroni_yml(&Member {
                scope: &scope,
                name: &n.name,
                pg_port: n.pg_port,
                rest_port: n.rest_port,
                etcd_port,
                data: &n.data,
                dir: scratch.path(),
                mode,
            });
            std::fs::write(n.config_path(), yml).expect("write patroni.yml");
        }
        // PostgreSQL refuses to run as root: the members' files are the
        // `postgres` user's (etcd, started next as the test's user, makes
        // its own data directory).
        scratch.chown("postgres");

        let mut cmd = Command::new(ETCD);
        cmd.arg("--name")
            .arg("etcd0")
            .arg("--data-dir")
            .arg(scratch.join("etcd"))
            .arg("--listen-client-urls")
            .arg(format!("http://127.0.0.1:{etcd_port}"))
            .arg("--advertise-client-urls")
            .arg(format!("http://127.0.0.1:{etcd_port}"))
            .arg("--listen-peer-urls")
            .arg(format!("http://127.0.0.1:{peer_port}"))
            .arg("--initial-advertise-peer-urls")
            .arg(format!("http://127.0.0.1:{peer_port}"))
            .arg("--initial-cluster")
            .arg(format!("etcd0=http://127.0.0.1:{peer_port}"))
            .arg("--initial-cluster-token")
            .arg(&scope)
            .arg("--initial-cluster-state")
            .arg("new")
            .arg("--enable-v2=true");
        let etcd = Proc::spawn("etcd", cmd, scratch.join("etcd.log"));

        let cfg = scratch.join("haproxy.cfg");
        let members: Vec<(String, u16, u16)> = nodes
            .iter()
            .map(|n| (n.name.clone(), n.pg_port, n.rest_port))
            .collect();
        std::fs::write(&cfg, haproxy_config(haproxy_port, &members)).expect("write haproxy.cfg");
        let mut cmd = Command::new(HAPROXY);
        cmd.arg("-db").arg("-f").arg(&cfg);
        let haproxy = Proc::spawn("haproxy", cmd, scratch.join("haproxy.log"));

        let cluster = Patroni {
            nodes,
            mode: Mutex::new(mode),
            etcd: Mutex::new(etcd),
            haproxy: Mutex::new(haproxy),
            haproxy_port,
            fault: Mutex::new(None),
            scratch,
        };
        assert!(
            wait_port(etcd_port, Duration::from_secs(20)),
            "etcd did not start\n{}",
            cluster.log_tails()
        );
        for n in &cluster.nodes {
            n.spawn();
        }
        assert!(
            wait_port(haproxy_port, Duration::from_secs(10)),
            "haproxy did not start\n{}",
            cluster.log_tails()
        );
        cluster.wait_healthy().await;
        Some(cluster)
    }

    /// The URL clients use: haproxy's port, database `postgres`.
    pub fn url(&self) -> String {
        format!(
            "postgres://postgres@127.0.0.1:{}/postgres",
            self.haproxy_port
        )
    }

    /// Member `i`'s own URL (no haproxy).
    ///
    /// # Panics
    ///
    /// When there is no member `i`.
    pub fn node_url(&self, i: usize) -> String {
        self.nodes[i].url()
    }

    /// Member `i`'s name (`node0`, …), its `application_name` on the
    /// leader.
    ///
    /// # Panics
    ///
    /// When there is no member `i`.
    pub fn node_name(&self, i: usize) -> &str {
        &self.nodes[i].name
    }

    /// A pool through haproxy of at most `max` connections, opened lazily.
    /// Connections are pinged before use (those haproxy shut when the
    /// leader went down are replaced); acquiring waits at most 5 s
    /// (`PoolTimedOut`, retryable).
    ///
    /// # Panics
    ///
    /// Never for the URL this cluster makes.
    pub fn pool(&self, max: u32) -> PgPool {
        let opts = PgConnectOptions::from_str(&self.url()).expect("a valid URL");
        PgPoolOptions::new()
            .max_connections(max)
            .acquire_timeout(Duration::from_secs(5))
            .test_before_acquire(true)
            .connect_lazy_with(opts)
    }

    /// The member whose Patroni answers `GET /primary` with 200 (it holds
    /// the leader lock and runs as the primary), if any.
    pub async fn leader(&self) -> Option<usize> {
        for (i, n) in self.nodes.iter().enumerate() {
            if rest::is(n.rest_port, "/primary").await {
                return Some(i);
            }
        }
        None
    }

    /// Whether member `i` runs as a streaming replica (`GET /replica`).
    ///
    /// # Panics
    ///
    /// When there is no member `i`.
    pub async fn is_replica(&self, i: usize) -> bool {
        rest::is(self.nodes[i].rest_port, "/replica").await
    }

    /// The mode the cluster was last set to.
    pub fn mode(&self) -> Mode {
        *self.mode.lock().expect("mode")
    }

    /// What keeps the cluster from being healthy right now, or `None`:
    /// every member's Patroni runs, one is the leader and the others are
    /// replicas streaming from it, the leader's
    /// `synchronous_standby_names` names a standby that is `sync` in
    /// [`Mode::Synchronous`] and [`Mode::SynchronousStrict`] (and is empty
    /// in [`Mode::Asynchronous`]), and haproxy leads to the leader.
    async fn unhealthy(&self) -> Option<String> {
        if let Some(n) = self.nodes.iter().find(|n| !n.running()) {
            return Some(format!("{} is not running", n.name));
        }
        let Some(leader) = self.leader().await else {
            return Some("no leader".into());
        };
        for (i, n) in self.nodes.iter().enumerate() {
            if i != leader && !rest::is(n.rest_port, "/replica").await {
                return Some(format!("{} is not a running replica", n.name));
            }
        }
        let (names, streaming, sync): (String, i64, i64) = match query(
            &self.nodes[leader].url(),
            "SELECT pg_catalog.current_setting('synchronous_standby_names'), \
             (SELECT COUNT(*) FROM pg_catalog.pg_stat_replication WHERE state = 'streaming'), \
             (SELECT COUNT(*) FROM pg_catalog.pg_stat_replication WHERE sync_state = 'sync')",
        )
        .await
        {
            Ok(row) => row,
            Err(e) => return Some(format!("the leader: {e}")),
        };
        if streaming < (MEMBERS - 1) as i64 {
            return Some(format!("{streaming} standbys stream"));
        }
        let mode = self.mode();
        if mode.synchronous() && (names.is_empty() || sync == 0) {
            return Some(format!(
                "no synchronous standby yet (synchronous_standby_names = '{names}')"
            ));
        }
        if !mode.synchronous() && !names.is_empty() {
            return Some(format!("still synchronous ('{names}')"));
        }
        match query::<(bool,)>(&self.url(), "SELECT pg_catalog.pg_is_in_recovery()").await {
            Ok((false,)) => None,
            Ok((true,)) => Some("haproxy leads to a standby".into()),
            Err(e) => Some(format!("through haproxy: {e}")),
        }
    }

    /// Waits until the cluster is healthy (see `unhealthy`: three members,
    /// two streaming standbys, the mode's synchronous standby, haproxy on
    /// the leader) on three checks in a row 0.6 s apart, and returns how
    /// long that took.
    ///
    /// # Panics
    ///
    /// When it is not within 90 s (with the logs).
    pub async fn wait_healthy(&self) -> Duration {
        let start = Instant::now();
        // Healthy on three checks in a row, over more than a Patroni loop:
        // a member rejoining may stream for a moment before its
        // `pg_rewind` stops it again.
        let mut in_a_row = 0;
        loop {
            let Some(why) = self.unhealthy().await else {
                in_a_row += 1;
                if in_a_row == 3 {
                    return start.elapsed();
                }
                tokio::time::sleep(Duration::from_millis(600)).await;
                continue;
            };
            in_a_row = 0;
            assert!(
                start.elapsed() < HEALTHY_WITHIN,
                "the cluster is not healthy after {HEALTHY_WITHIN:?}: {why}\n{}",
                self.log_tails()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Switches the cluster to `mode` through the leader's `PATCH /config`
    /// (`synchronous_mode`, `synchronous_mode_strict`), then waits until
    /// it is healthy in that mode.
    ///
    /// # Panics
    ///
    /// When there is no leader, the leader refuses the change, or the
    /// cluster is not healthy within 90 s.
    pub async fn set_mode(&self, mode: Mode) -> Duration {
        let start = Instant::now();
        let leader = self
            .leader()
            .await
            .unwrap_or_else(|| panic!("no leader to configure\n{}", self.log_tails()));
        let body = format!(
            "{{\"synchronous_mode\": {}, \"synchronous_mode_strict\": {}}}",
            mode.synchronous(),
            mode == Mode::SynchronousStrict
        );
        let answer = rest::request(
            self.nodes[leader].rest_port,
            "PATCH",
            "/config",
            Some(&body),
        )
        .await;
        assert!(
            matches!(answer, Some((200, _))),
            "PATCH /config {body}: {answer:?}\n{}",
            self.log_tails()
        );
        *self.mode.lock().expect("mode") = mode;
        self.wait_healthy().await;
        start.elapsed()
    }

    /// Waits (at most 30 s) until every standby has replayed everything the
    /// leader has written so far: for a test that sets up rows before it
    /// kills the leader of an asynchronous cluster.
    ///
    /// # Panics
    ///
    /// When there is no leader or the standbys do not catch up.
    pub async fn caught_up(&self) {
        let leader = self.leader_or_panic(self.leader().await);
        let opts = PgConnectOptions::from_str(&self.nodes[leader].url()).expect("a valid URL");
        let mut conn = PgConnection::connect_with(&opts)
            .await
            .unwrap_or_else(|e| panic!("the leader: {e}\n{}", self.log_tails()));
        let lsn: String = sqlx::query_scalar("SELECT pg_catalog.pg_current_wal_lsn()::text")
            .fetch_one(&mut conn)
            .await
            .expect("the leader's WAL position");
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let done: i64 = sqlx::query_scalar(
                "SELECT COUNT(*) FROM pg_catalog.pg_stat_replication \
                 WHERE replay_lsn >= $1::text::pg_lsn",
            )
            .bind(&lsn)
            .fetch_one(&mut conn)
            .await
            .expect("the standbys' replay positions");
            if done >= (MEMBERS - 1) as i64 {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "the standbys did not replay up to {lsn}\n{}",
                self.log_tails()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let _ = conn.close().await;
    }

    /// The last lines of every log (members, etcd, haproxy), for a failure
    /// message.
    pub fn log_tails(&self) -> String {
        let mut out = String::new();
        for n in &self.nodes {
            out.push_str(&n.log_tail(40));
            out.push('\n');
        }
        for p in [&self.etcd, &self.haproxy] {
            if let Ok(p) = p.lock() {
                out.push_str(&p.log_tail(15));
                out.push('\n');
            }
        }
        out
    }

    /// The scratch directory holding the data directories and the logs
    /// (kept after the test with `IDEM_KEEP_SCRATCH=1`).
    pub fn dir(&self) -> &Path {
        self.scratch.path()
    }
}

/// One row of `sql` on `url`, on a connection of its own; a frozen server
/// is an error after 2 s.
async fn query<T>(url: &str, sql: &'static str) -> Result<T, String>
where
    T: for<'r> sqlx::FromRow<'r, sqlx::postgres::PgRow> + Send + Unpin,
{
    let opts = PgConnectOptions::from_str(url).map_err(|e| e.to_string())?;
    let run = async {
        let mut conn = PgConnection::connect_with(&opts)
            .await
            .map_err(|e| e.to_string())?;
        let row = sqlx::query_as::<_, T>(sql)
            .fetch_one(&mut conn)
            .await
            .map_err(|e| e.to_string());
        let _ = conn.close().await;
        row
    };
    tokio::time::timeout(Duration::from_secs(2), run)
        .await
        .unwrap_or_else(|_| Err("no answer within 2 s".into()))
}

impl Drop for Patroni {
    fn drop(&mut self) {
        if let Ok(mut h) = self.haproxy.lock() {
            h.kill9();
        }
        for n in &self.nodes {
            n.kill9();
        }
        if let Ok(mut e) = self.etcd.lock() {
            e.kill9();
        }
        // The scratch, dropped right after, removes the data directories.
    }
}
