//! A fault-injection TCP proxy: the article's "lost commit acknowledgement",
//! for real.
//!
//! [`FaultProxy`] listens on a loopback port and forwards each connection to
//! an upstream PostgreSQL or MariaDB/MySQL server. It watches the client's
//! stream for `COMMIT`; for a configurable fraction of them it forwards the
//! `COMMIT`, lets the server commit and reply, then throws the reply away and
//! closes both connections. The client sees an I/O error on commit while the
//! server has in fact committed.
//! It can take the server down as its clients see a restart
//! ([`FaultProxy::set_down`]: every connection closed, new ones refused).
//! It can also black-hole the path to the server
//! ([`FaultProxy::set_black_hole`]): nothing delivered either way, nothing
//! closed, until the hole is lifted.
//!
//! Only the framing of the two wire protocols is parsed, never their
//! contents beyond what finding a `COMMIT` needs, and bytes are forwarded as
//! soon as they are read (inspection happens before a chunk is written, so a
//! drop is armed before the server can see the whole `COMMIT`):
//!
//! - PostgreSQL: a `COMMIT` sent as a simple `Query` message (what sqlx's
//!   `Transaction::commit` sends), or through the extended protocol (a
//!   `Parse` of `COMMIT`, a `Bind` of that statement, an `Execute` of that
//!   portal). An `SSLRequest`/`GSSENCRequest` is answered `N` by the proxy
//!   itself: it cannot inspect an encrypted stream.
//! - MySQL/MariaDB: a `COMMIT` sent as `COM_QUERY` (sequence id 0, so a
//!   handshake packet can never be mistaken for one). A `COMMIT` sent as a
//!   prepared statement (`COM_STMT_EXECUTE`) is not recognised. A client
//!   that switches to TLS is passed through untouched.
//!
//! Besides the random drops, one fault can be scripted on the `n`-th
//! `COMMIT` from now ([`FaultProxy::fault_commit`]): its acknowledgement
//! lost, the `COMMIT` cut before the server has it, or held for a while.
//!
//! A dropped acknowledgement waits for the server's reply to the `COMMIT`
//! (PostgreSQL: `ReadyForQuery` with status idle; MySQL: the first `OK` or
//! `ERR` packet with sequence id 1), at most [`REPLY_TIMEOUT`], then closes.

use std::collections::hash_map::RandomState;
use std::hash::BuildHasher;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use tokio::net::TcpListener;

use tokio::task::JoinHandle;

mod connection;
mod wire;

use connection::accept_loop;

pub use crate::script::CommitFault;
use crate::script::Script;

/// How long a dropped acknowledgement waits for the server's reply to the
/// `COMMIT` before closing anyway (the commit's outcome is then unknown).
pub const REPLY_TIMEOUT: Duration = Duration::from_secs(5);

/// How many bytes of a client message are kept for inspection; a `COMMIT`
/// (and the names a `Bind` refers to) fit well within this.
const CAPTURE: usize = 1024;

/// The wire protocol spoken through the proxy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Protocol {
    /// PostgreSQL frontend/backend protocol 3.0.
    Postgres,
    /// MySQL/MariaDB client/server protocol.
    MySql,
}

impl Protocol {
    /// The protocol of a `postgres://`, `postgresql://` or `mysql://`/
    /// `mariadb://` URL.
    pub fn of_url(url: &str) -> Option<Protocol> {
        let scheme = url.split_once("://")?.0.to_ascii_lowercase();
        match scheme.as_str() {
            "postgres" | "postgresql" => Some(Protocol::Postgres),
            "mysql" | "mariadb" => Some(Protocol::MySql),
            _ => None,
        }
    }

    fn default_port(self) -> u16 {
        match self {
            Protocol::Postgres => 5432,
            Protocol::MySql => 3306,
        }
    }
}

/// The `host:port` a database URL points at (default port if none), e.g.
/// `127.0.0.1:5432` for `postgres://u@127.0.0.1/db`.
pub fn upstream_of(url: &str) -> Option<String> {
    let protocol = Protocol::of_url(url)?;
    let parts = UrlParts::parse(url)?;
    let hostport = parts
        .authority
        .rsplit_once('@')
        .map_or(parts.authority, |(_, h)| h);
    if hostport.is_empty() {
        return None;
    }
    // A port is present if the text after the last ':' is numeric and not
    // inside an IPv6 literal's brackets.
    let has_port = hostport.rsplit_once(':').is_some_and(|(_, p)| {
        !p.is_empty() && !p.contains(']') && p.bytes().all(|b| b.is_ascii_digit())
    });
    Some(if has_port {
        hostport.to_string()
    } else {
        format!("{hostport}:{}", protocol.default_port())
    })
}

/// What the proxy has seen and done so far, shared with its tasks.
struct Shared {
    protocol: Protocol,
    upstream: String,
    drop_fraction: AtomicU64,
    commits_seen: AtomicU64,
    acks_dropped: AtomicU64,
    draws: AtomicU64,
    seed: RandomState,
    /// How long to hold the reply to a `BEGIN`, in milliseconds (0: off).
    begin_hold_ms: AtomicU64,
    /// How long to hold the reply to a `SAVEPOINT`, in milliseconds (0: off).
    savepoint_hold_ms: AtomicU64,
    begins_seen: AtomicU64,
    begins_held: AtomicU64,
    /// Whether the path to the server is black-holed: nothing is
    /// delivered either way until it is lifted.
    black_hole: AtomicBool,
    /// Whether the server is down: every connection closed, new ones
    /// closed when accepted.
    down: tokio::sync::watch::Sender<bool>,
    /// The fault scripted on one `COMMIT` ([`FaultProxy::fault_commit`]).
    script: Script,
}

impl Shared {
    /// Whether to drop this commit's acknowledgement: a uniform draw in
    /// `[0, 1)` below the current drop fraction.
    fn draw_drop(&self) -> bool {
        let fraction = f64::from_bits(self.drop_fraction.load(Ordering::SeqCst));
        if fraction <= 0.0 {
            return false;
        }
        let n = self.draws.fetch_add(1, Ordering::Relaxed);
        let bits = self.seed.hash_one(n) >> 11; // 53 random bits
        (bits as f64 / (1u64 << 53) as f64) < fraction
    }
}

/// A loopback proxy that loses a fraction of `COMMIT` acknowledgements.
/// Dropping it stops accepting and closes every proxied connection.
pub struct FaultProxy {
    addr: SocketAddr,
    shared: Arc<Shared>,
    accept: JoinHandle<()>,
}

impl std::fmt::Debug for FaultProxy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FaultProxy")
            .field("addr", &self.addr)
            .field("drop_fraction", &self.drop_fraction())
            .field("commits_seen", &self.commits_seen())
            .field("acks_dropped", &self.acks_dropped())
            .finish()
    }
}

impl FaultProxy {
    /// Listens on `127.0.0.1:0` and forwards every connection to `upstream`
    /// (`host:port`), dropping the acknowledgement of `drop_fraction` of the
    /// `COMMIT`s (`0.0` none, `1.0` all). Must be called inside a Tokio
    /// runtime. The upstream is only connected to when a client connects.
    pub async fn start(
        protocol: Protocol,
        upstream: &str,
        drop_fraction: f64,
    ) -> io::Result<FaultProxy> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let shared = Arc::new(Shared {
            protocol,
            upstream: upstream.to_string(),
            drop_fraction: AtomicU64::new(clamp_fraction(drop_fraction).to_bits()),
            commits_seen: AtomicU64::new(0),
            acks_dropped: AtomicU64::new(0),
            draws: AtomicU64::new(0),
            seed: RandomState::new(),
            begin_hold_ms: AtomicU64::new(0),
            savepoint_hold_ms: AtomicU64::new(0),
            begins_seen: AtomicU64::new(0),
            begins_held: AtomicU64::new(0),
            black_hole: AtomicBool::new(false),
            down: tokio::sync::watch::Sender::new(false),
            script: Script::default(),
        });
        let accept = tokio::spawn(accept_loop(listener, shared.clone()));
        Ok(FaultProxy {
            addr,
            shared,
            accept,
        })
    }

    /// [`start`](Self::start) with the protocol and upstream taken from a
    /// database URL.
    pub async fn for_url(base_url: &str, drop_fraction: f64) -> io::Result<FaultProxy> {
        let bad = || {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("not a postgres:// or mysql:// URL with a host: {base_url}"),
            )
        };
        let protocol = Protocol::of_url(base_url).ok_or_else(bad)?;
        let upstream = upstream_of(base_url).ok_or_else(bad)?;
        FaultProxy::start(protocol, &upstream, drop_fraction).await
    }

    /// The proxy's listening address (`127.0.0.1:<port>`).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Changes the fraction of acknowledgements dropped, for commits seen
    /// from now on (clamped to `[0, 1]`; `0.0` disables, NaN counts as 0).
    pub fn set_drop_fraction(&self, fraction: f64) {
        self.shared
            .drop_fraction
            .store(clamp_fraction(fraction).to_bits(), Ordering::SeqCst);
    }

    /// The current drop fraction.
    pub fn drop_fraction(&self) -> f64 {
        f64::from_bits(self.shared.drop_fraction.load(Ordering::SeqCst))
    }

    /// How many `COMMIT`s were forwarded to the server (dropped or not).
    pub fn commits_seen(&self) -> u64 {
        self.shared.commits_seen.load(Ordering::SeqCst)
    }

    /// How many `COMMIT` replies were thrown away (each closing its
    /// connection). Incremented before the client's socket is closed, so a
    /// client that has seen its commit fail sees the count include it.
    pub fn acks_dropped(&self) -> u64 {
        self.shared.acks_dropped.load(Ordering::SeqCst)
    }

    /// Holds the server's reply to each `BEGIN` seen from now on for `hold`
    /// before forwarding it (`Duration::ZERO` disables; whole milliseconds).
    /// Replies to other statements that arrive with it wait too.
    pub fn set_begin_hold(&self, hold: Duration) {
        let ms = u64::try_from(hold.as_millis()).unwrap_or(u64::MAX);
        self.shared.begin_hold_ms.store(ms, Ordering::SeqCst);
    }

    /// Holds the server's reply to each `SAVEPOINT` seen from now on for
    /// `hold`, like [`FaultProxy::set_begin_hold`] for `BEGIN` (a nested
    /// transaction's begin); counted in [`FaultProxy::begins_held`].
    pub fn set_savepoint_hold(&self, hold: Duration) {
        let ms = u64::try_from(hold.as_millis()).unwrap_or(u64::MAX);
        self.shared.savepoint_hold_ms.store(ms, Ordering::SeqCst);
    }

    /// Black-holes the path to the server (`true`) or lifts the hole
    /// (`false`): while it lasts, connections are accepted but nothing is
    /// delivered either way, on open connections and new ones (which reach
    /// the server only once it is lifted), and nothing is closed: a server
    /// that went silent, a network that drops every packet. Bytes are held,
    /// not lost (as TCP retransmits them across a partition): once it is
    /// lifted, the connections go on where they were.
    pub fn set_black_hole(&self, on: bool) {
        self.shared.black_hole.store(on, Ordering::SeqCst);
    }

    /// Takes the server down (`true`) or brings it back (`false`), as its
    /// clients see a restart: while it is down, every proxied connection
    /// is closed at once (mid-statement, mid-transaction) and each new one
    /// is closed as soon as it is accepted, so the client reads an I/O
    /// error, never a reply; the server itself keeps running and rolls
    /// back what the closed connections left open.
    pub fn set_down(&self, down: bool) {
        self.shared.down.send_replace(down);
    }

    /// How many `BEGIN`s (and `START TRANSACTION`s) were forwarded.
    pub fn begins_seen(&self) -> u64 {
        self.shared.begins_seen.load(Ordering::SeqCst)
    }

    /// How many replies to a `BEGIN` were held. Incremented when the hold
    /// starts, before the reply reaches the client.
    pub fn begins_held(&self) -> u64 {
        self.shared.begins_held.load(Ordering::SeqCst)
    }

    /// Scripts `fault` on the `nth` `COMMIT` forwarded from now on (1: the
    /// next one), whatever the connection, replacing a scripted fault that
    /// has not fired. The receiver resolves when the fault fires (for
    /// [`CommitFault::LoseAck`], when the `COMMIT` leaves for the server,
    /// before its reply). Exact, where [`set_drop_fraction`](Self::set_drop_fraction)
    /// draws at random; the two add up.
    pub fn fault_commit(&self, nth: u64, fault: CommitFault) -> tokio::sync::oneshot::Receiver<()> {
        self.shared.script.arm(nth, fault)
    }

    /// Takes back the fault of [`fault_commit`](Self::fault_commit) if it
    /// has not fired.
    pub fn clear_commit_fault(&self) {
        self.shared.script.disarm();
    }

    /// How many faults scripted with [`fault_commit`](Self::fault_commit)
    /// fired.
    pub fn commit_faults(&self) -> u64 {
        self.shared.script.fired()
    }

    /// `base_url` with its `host:port` replaced by the proxy's, and TLS
    /// disabled (`sslmode=disable` for PostgreSQL, `ssl-mode=disabled` for
    /// MySQL). User, password, database and other parameters are kept;
    /// parameters naming a host, port, socket or TLS mode are removed.
    pub fn url(&self, base_url: &str) -> String {
        let parts = UrlParts::parse(base_url)
            .unwrap_or_else(|| panic!("not a URL of the form scheme://host/...: {base_url}"));
        let authority = match parts.authority.rsplit_once('@') {
            Some((userinfo, _)) => format!("{userinfo}@{}", self.addr),
            None => self.addr.to_string(),
        };
        let mut params: Vec<&str> = parts
            .query
            .split('&')
            .filter(|p| {
                let key = p.split_once('=').map_or(*p, |(k, _)| k);
                !p.is_empty()
                    && !matches!(
                        key.to_ascii_lowercase().as_str(),
                        "host" | "hostaddr" | "port" | "socket" | "sslmode" | "ssl-mode"
                    )
            })
            .collect();
        params.push(match self.shared.protocol {
            Protocol::Postgres => "sslmode=disable",
            Protocol::MySql => "ssl-mode=disabled",
        });
        format!(
            "{}://{authority}{}?{}",
            parts.scheme,
            parts.path,
            params.join("&")
        )
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        // The accept task owns the JoinSet of connection tasks: aborting it
        // drops the set, which aborts them all, closing their sockets.
        self.accept.abort();
    }
}

fn clamp_fraction(f: f64) -> f64 {
    if f.is_nan() { 0.0 } else { f.clamp(0.0, 1.0) }
}

/// `scheme://authority/path?query#fragment`, split (fragment dropped).
struct UrlParts<'a> {
    scheme: &'a str,
    authority: &'a str,
    path: &'a str,
    query: &'a str,
}

impl<'a> UrlParts<'a> {
    fn parse(url: &'a str) -> Option<UrlParts<'a>> {
        let (scheme, rest) = url.split_once("://")?;
        let rest = rest.split_once('#').map_or(rest, |(r, _)| r);
        let (before_query, query) = rest.split_once('?').unwrap_or((rest, ""));
        let (authority, path) = match before_query.find('/') {
            Some(i) => before_query.split_at(i),
            None => (before_query, ""),
        };
        Some(UrlParts {
            scheme,
            authority,
            path,
            query,
        })
    }
}
