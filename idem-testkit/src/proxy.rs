//! A fault-injection TCP proxy: the article's "lost commit acknowledgement",
//! for real.
//!
//! [`FaultProxy`] listens on a loopback port and forwards each connection to
//! an upstream PostgreSQL or MariaDB/MySQL server. It watches the client's
//! stream for `COMMIT`; for a configurable fraction of them it forwards the
//! `COMMIT`, lets the server commit and reply, then throws the reply away and
//! closes both connections. The client sees an I/O error on commit while the
//! server has in fact committed.
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
//! A dropped acknowledgement waits for the server's reply to the `COMMIT`
//! (PostgreSQL: `ReadyForQuery` with status idle; MySQL: the first `OK` or
//! `ERR` packet with sequence id 1), at most [`REPLY_TIMEOUT`], then closes.

use std::collections::HashMap;
use std::collections::hash_map::RandomState;
use std::hash::BuildHasher;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Notify;
use tokio::task::{JoinHandle, JoinSet};

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
    begins_seen: AtomicU64,
    begins_held: AtomicU64,
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
            begins_seen: AtomicU64::new(0),
            begins_held: AtomicU64::new(0),
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

    /// How many `BEGIN`s (and `START TRANSACTION`s) were forwarded.
    pub fn begins_seen(&self) -> u64 {
        self.shared.begins_seen.load(Ordering::SeqCst)
    }

    /// How many replies to a `BEGIN` were held. Incremented when the hold
    /// starts, before the reply reaches the client.
    pub fn begins_held(&self) -> u64 {
        self.shared.begins_held.load(Ordering::SeqCst)
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

async fn accept_loop(listener: TcpListener, shared: Arc<Shared>) {
    let mut connections = JoinSet::new();
    loop {
        while connections.try_join_next().is_some() {}
        match listener.accept().await {
            Ok((client, _)) => {
                connections.spawn(proxy_connection(client, shared.clone()));
            }
            Err(e) => {
                tracing::debug!("fault proxy: accept failed: {e}");
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
    }
}

/// The state of one connection's pending drop: set (before the `COMMIT` is
/// forwarded) by the client-to-server half, acted on by the other half.
struct Arm {
    armed: AtomicBool,
    notify: Notify,
    /// Milliseconds to hold the reply of a `BEGIN` that left (0: none).
    hold_ms: AtomicU64,
}

impl Arm {
    fn arm(&self) {
        self.armed.store(true, Ordering::SeqCst);
        self.notify.notify_one();
    }

    fn is_armed(&self) -> bool {
        self.armed.load(Ordering::SeqCst)
    }
}

async fn proxy_connection(mut client: TcpStream, shared: Arc<Shared>) {
    let mut server = match TcpStream::connect(&shared.upstream).await {
        Ok(s) => s,
        Err(e) => {
            tracing::debug!("fault proxy: cannot reach {}: {e}", shared.upstream);
            return;
        }
    };
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    if let Err(e) = run_connection(&mut client, &mut server, &shared).await {
        tracing::debug!("fault proxy: connection ended: {e}");
    }
    // Both sockets are closed when dropped here.
}

async fn run_connection(
    client: &mut TcpStream,
    server: &mut TcpStream,
    shared: &Shared,
) -> io::Result<()> {
    let (mut client_read, mut client_write) = client.split();
    let (mut server_read, mut server_write) = server.split();

    // PostgreSQL's untyped startup phase first: TLS requests are refused
    // here, and the startup message forwarded.
    let mut inspector = ClientInspector::new(shared.protocol);
    let mut leftover = Vec::new();
    if shared.protocol == Protocol::Postgres {
        match pg_startup(&mut client_read, &mut client_write, &mut server_write).await? {
            Startup::Normal(rest) => leftover = rest,
            Startup::Passthrough(rest) => {
                leftover = rest;
                inspector.passthrough = true;
            }
            Startup::Closed => return Ok(()),
        }
    }

    let arm = Arm {
        armed: AtomicBool::new(false),
        notify: Notify::new(),
        hold_ms: AtomicU64::new(0),
    };

    let client_to_server = async {
        let mut buf = vec![0u8; 16 * 1024];
        // The bytes that followed PostgreSQL's startup message come first.
        let mut pending = leftover;
        loop {
            let chunk: &[u8] = if !pending.is_empty() {
                &pending
            } else {
                let n = client_read.read(&mut buf).await?;
                if n == 0 {
                    // The client is done: let the server see EOF, and let
                    // the other half drain whatever it still says.
                    let _ = server_write.shutdown().await;
                    return Ok::<(), io::Error>(());
                }
                &buf[..n]
            };
            let Seen { commits, begins } = inspector.feed(chunk);
            if begins > 0 {
                shared.begins_seen.fetch_add(begins, Ordering::SeqCst);
                let hold = shared.begin_hold_ms.load(Ordering::SeqCst);
                if hold > 0 {
                    // Set before the BEGIN's last byte leaves: the server's
                    // reply can only come after this.
                    arm.hold_ms.store(hold, Ordering::SeqCst);
                }
            }
            if commits > 0 {
                shared.commits_seen.fetch_add(commits, Ordering::SeqCst);
                tracing::trace!("fault proxy: {commits} COMMIT(s) from the client");
                if !arm.is_armed() && (0..commits).any(|_| shared.draw_drop()) {
                    // Armed before the COMMIT's last byte leaves: the
                    // server's reply can only come after this.
                    arm.arm();
                }
            }
            server_write.write_all(chunk).await?;
            pending.clear();
        }
    };

    let server_to_client = async {
        let mut buf = vec![0u8; 16 * 1024];
        let mut frames = Framer::new(shared.protocol, 1);
        let mut deadline: Option<tokio::time::Instant> = None;
        loop {
            let wait_until = deadline;
            let (sr, b) = (&mut server_read, &mut buf);
            let read = async move {
                match wait_until {
                    Some(d) => match tokio::time::timeout_at(d, sr.read(b)).await {
                        Ok(r) => r.map(Some),
                        Err(_) => Ok(None), // timed out waiting for the reply
                    },
                    None => sr.read(b).await.map(Some),
                }
            };
            let n = tokio::select! {
                r = read => r?,
                _ = arm.notify.notified(), if deadline.is_none() => {
                    deadline = Some(tokio::time::Instant::now() + REPLY_TIMEOUT);
                    continue;
                }
            };
            let armed = arm.is_armed();
            if armed && deadline.is_none() {
                deadline = Some(tokio::time::Instant::now() + REPLY_TIMEOUT);
            }
            let Some(n) = n else {
                return Err::<std::convert::Infallible, _>(drop_ack(
                    shared,
                    "no reply to COMMIT within the time-out",
                ));
            };
            if n == 0 {
                if armed {
                    return Err(drop_ack(shared, "server closed before replying to COMMIT"));
                }
                // The server is gone: end the whole connection.
                let _ = client_write.shutdown().await;
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "server closed",
                ));
            }
            let chunk = &buf[..n];
            let mut replied = false;
            let mut begin_replied = false;
            let holding = arm.hold_ms.load(Ordering::SeqCst) > 0;
            frames.feed(chunk, |frame| {
                if armed && is_commit_reply(shared.protocol, frame) {
                    replied = true;
                }
                if holding && is_reply_end(shared.protocol, frame) {
                    begin_replied = true;
                }
            });
            if begin_replied && !armed {
                let hold = arm.hold_ms.swap(0, Ordering::SeqCst);
                shared.begins_held.fetch_add(1, Ordering::SeqCst);
                tracing::debug!("fault proxy: holding the reply to BEGIN for {hold} ms");
                tokio::time::sleep(Duration::from_millis(hold)).await;
            }
            if armed {
                // Everything read after the COMMIT left is thrown away.
                if replied {
                    return Err(drop_ack(shared, "COMMIT acknowledgement dropped"));
                }
                continue;
            }
            client_write.write_all(chunk).await?;
        }
    };

    tokio::try_join!(client_to_server, server_to_client).map(|_| ())
}

/// Counts a dropped acknowledgement; the error ends the connection.
fn drop_ack(shared: &Shared, why: &str) -> io::Error {
    shared.acks_dropped.fetch_add(1, Ordering::SeqCst);
    tracing::debug!("fault proxy: {why}; closing both connections");
    io::Error::new(io::ErrorKind::ConnectionAborted, why.to_string())
}

/// Whether a server frame ends the reply to a command: PostgreSQL's
/// `ReadyForQuery`, MySQL's first `OK` or `ERR` packet (sequence id 1).
fn is_reply_end(protocol: Protocol, frame: &Frame<'_>) -> bool {
    match protocol {
        Protocol::Postgres => frame.tag == b'Z',
        Protocol::MySql => frame.tag == 1 && matches!(frame.body.first(), Some(0x00) | Some(0xFF)),
    }
}

/// Whether a server frame is the end of the reply to a `COMMIT`.
fn is_commit_reply(protocol: Protocol, frame: &Frame<'_>) -> bool {
    match protocol {
        // ReadyForQuery, transaction status idle.
        Protocol::Postgres => frame.tag == b'Z' && frame.body.first() == Some(&b'I'),
        // The first packet of a command's reply is sequence 1: OK or ERR.
        Protocol::MySql => frame.tag == 1 && matches!(frame.body.first(), Some(0x00) | Some(0xFF)),
    }
}

enum Startup {
    /// The startup message was forwarded; these bytes followed it.
    Normal(Vec<u8>),
    /// A cancel request or an unknown protocol: copy without inspecting.
    Passthrough(Vec<u8>),
    /// The client closed first.
    Closed,
}

const PG_SSL_REQUEST: u32 = 80_877_103;
const PG_GSSENC_REQUEST: u32 = 80_877_104;
const PG_PROTOCOL_3: u32 = 196_608;

/// Reads PostgreSQL's untyped messages (Int32 length including itself, then
/// the body): TLS/GSS encryption requests are answered `N`, and the startup
/// message is forwarded.
async fn pg_startup(
    client_read: &mut (impl AsyncReadExt + Unpin),
    client_write: &mut (impl AsyncWriteExt + Unpin),
    server_write: &mut (impl AsyncWriteExt + Unpin),
) -> io::Result<Startup> {
    let mut buf: Vec<u8> = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        // Parse as many complete untyped messages as the buffer holds.
        while buf.len() >= 8 {
            let len = u32::from_be_bytes(buf[0..4].try_into().unwrap()) as usize;
            let code = u32::from_be_bytes(buf[4..8].try_into().unwrap());
            if !(8..=1 << 20).contains(&len) {
                // Not a startup message we understand: stop inspecting.
                server_write.write_all(&buf).await?;
                return Ok(Startup::Passthrough(Vec::new()));
            }
            if buf.len() < len {
                break;
            }
            if len == 8 && (code == PG_SSL_REQUEST || code == PG_GSSENC_REQUEST) {
                // No encryption through the proxy: the client goes on in
                // plain text (or gives up if it requires TLS).
                client_write.write_all(b"N").await?;
                buf.drain(..8);
                continue;
            }
            server_write.write_all(&buf[..len]).await?;
            let rest = buf.split_off(len);
            return Ok(if code == PG_PROTOCOL_3 {
                Startup::Normal(rest)
            } else {
                Startup::Passthrough(rest)
            });
        }
        let n = client_read.read(&mut chunk).await?;
        if n == 0 {
            if !buf.is_empty() {
                server_write.write_all(&buf).await?;
            }
            return Ok(Startup::Closed);
        }
        buf.extend_from_slice(&chunk[..n]);
    }
}

/// One complete frame, as seen by a [`Framer`]: `tag` is PostgreSQL's
/// message type byte or MySQL's sequence id; `body` is the payload's first
/// bytes (up to the capture limit), `len` its full length.
struct Frame<'a> {
    tag: u8,
    len: usize,
    body: &'a [u8],
}

/// Splits a byte stream into frames without holding bytes back: the caller
/// forwards every chunk it feeds; the framer remembers where frames start
/// and keeps each body's first `capture` bytes.
struct Framer {
    protocol: Protocol,
    header: [u8; 5],
    header_len: usize,
    tag: u8,
    len: usize,
    remaining: usize,
    in_body: bool,
    capture: usize,
    body: Vec<u8>,
}

impl Framer {
    fn new(protocol: Protocol, capture: usize) -> Framer {
        Framer {
            protocol,
            header: [0; 5],
            header_len: 0,
            tag: 0,
            len: 0,
            remaining: 0,
            in_body: false,
            capture,
            body: Vec::with_capacity(capture.min(CAPTURE)),
        }
    }

    fn header_size(&self) -> usize {
        match self.protocol {
            Protocol::Postgres => 5, // type byte + Int32 length
            Protocol::MySql => 4,    // 3-byte length + sequence id
        }
    }

    fn feed(&mut self, mut data: &[u8], mut on_frame: impl FnMut(&Frame<'_>)) {
        loop {
            if !self.in_body {
                let need = self.header_size() - self.header_len;
                if data.is_empty() {
                    return;
                }
                let take = need.min(data.len());
                self.header[self.header_len..self.header_len + take].copy_from_slice(&data[..take]);
                self.header_len += take;
                data = &data[take..];
                if self.header_len < self.header_size() {
                    return;
                }
                let h = self.header;
                (self.tag, self.len) = match self.protocol {
                    Protocol::Postgres => {
                        let len = u32::from_be_bytes([h[1], h[2], h[3], h[4]]) as usize;
                        (h[0], len.saturating_sub(4))
                    }
                    Protocol::MySql => (h[3], u32::from_le_bytes([h[0], h[1], h[2], 0]) as usize),
                };
                self.header_len = 0;
                self.remaining = self.len;
                self.in_body = true;
                self.body.clear();
            }
            let take = self.remaining.min(data.len());
            let keep = take.min(self.capture.saturating_sub(self.body.len()));
            self.body.extend_from_slice(&data[..keep]);
            self.remaining -= take;
            data = &data[take..];
            if self.remaining > 0 {
                return;
            }
            self.in_body = false;
            on_frame(&Frame {
                tag: self.tag,
                len: self.len,
                body: &self.body,
            });
        }
    }
}

/// Finds the `COMMIT`s in the client's stream (after PostgreSQL's startup).
struct ClientInspector {
    protocol: Protocol,
    framer: Framer,
    /// A TLS stream or an unknown protocol: nothing more is inspected.
    passthrough: bool,
    /// MySQL: whether the next packet is the handshake response.
    first_packet: bool,
    /// MySQL: the previous packet had the maximum length, so this one
    /// continues it.
    continuation: bool,
    /// PostgreSQL: prepared statement name -> what its query is.
    statements: HashMap<Vec<u8>, Kind>,
    /// PostgreSQL: portal name -> what its statement is.
    portals: HashMap<Vec<u8>, Kind>,
}

/// What a statement is, as far as the proxy cares.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Commit,
    Begin,
    Other,
}

impl Kind {
    fn of_sql(sql: &[u8]) -> Kind {
        if is_commit_sql(sql) {
            Kind::Commit
        } else if is_begin_sql(sql) {
            Kind::Begin
        } else {
            Kind::Other
        }
    }
}

/// The statements of interest completed in a chunk of the client's stream.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Seen {
    commits: u64,
    begins: u64,
}

impl Seen {
    fn add(&mut self, kind: Kind) {
        match kind {
            Kind::Commit => self.commits += 1,
            Kind::Begin => self.begins += 1,
            Kind::Other => {}
        }
    }
}

impl ClientInspector {
    fn new(protocol: Protocol) -> ClientInspector {
        ClientInspector {
            protocol,
            framer: Framer::new(protocol, CAPTURE),
            passthrough: false,
            first_packet: true,
            continuation: false,
            statements: HashMap::new(),
            portals: HashMap::new(),
        }
    }

    /// Inspects a chunk of the client's stream; returns how many `COMMIT`s
    /// and `BEGIN`s were completed in it.
    fn feed(&mut self, chunk: &[u8]) -> Seen {
        let mut seen = Seen::default();
        if self.passthrough {
            return seen;
        }
        let mut frames = std::mem::replace(&mut self.framer, Framer::new(self.protocol, 0));
        frames.feed(chunk, |frame| seen.add(self.on_frame(frame)));
        self.framer = frames;
        seen
    }

    fn on_frame(&mut self, frame: &Frame<'_>) -> Kind {
        if self.passthrough {
            return Kind::Other;
        }
        match self.protocol {
            Protocol::Postgres => self.on_pg_message(frame),
            Protocol::MySql => self.on_mysql_packet(frame),
        }
    }

    fn on_mysql_packet(&mut self, frame: &Frame<'_>) -> Kind {
        const CLIENT_SSL: u32 = 0x0800;
        const COM_QUERY: u8 = 0x03;
        let continuation = std::mem::replace(&mut self.continuation, frame.len == 0xFF_FFFF);
        if std::mem::replace(&mut self.first_packet, false) {
            // The handshake response (or SSL request): if the client asks
            // for TLS, the rest of the stream is opaque.
            if frame.body.len() >= 4 {
                let caps = u32::from_le_bytes(frame.body[0..4].try_into().unwrap());
                if caps & CLIENT_SSL != 0 {
                    self.passthrough = true;
                }
            }
            return Kind::Other;
        }
        // Commands start a new sequence (id 0); handshake and
        // authentication packets never have sequence id 0.
        if !continuation
            && frame.tag == 0
            && frame.len == frame.body.len()
            && frame.body.first() == Some(&COM_QUERY)
        {
            Kind::of_sql(&frame.body[1..])
        } else {
            Kind::Other
        }
    }

    fn on_pg_message(&mut self, frame: &Frame<'_>) -> Kind {
        let complete = frame.len == frame.body.len();
        let mut fields = frame.body.split(|&b| b == 0);
        match frame.tag {
            // Query: SQL text, NUL-terminated.
            b'Q' => {
                // A simple query also destroys the unnamed portal.
                self.portals.remove(&b""[..]);
                if complete {
                    Kind::of_sql(fields.next().unwrap_or_default())
                } else {
                    Kind::Other
                }
            }
            // Parse: statement name, query, parameter types.
            b'P' => {
                let name = fields.next().unwrap_or_default().to_vec();
                // A query cut off by the capture limit is too long to be
                // COMMIT; a BEGIN that long is not worth holding.
                let kind = if complete {
                    Kind::of_sql(fields.next().unwrap_or_default())
                } else {
                    Kind::Other
                };
                self.statements.insert(name, kind);
                Kind::Other
            }
            // Bind: portal name, statement name, ...
            b'B' => {
                let portal = fields.next().unwrap_or_default().to_vec();
                let statement = fields.next().unwrap_or_default();
                let kind = self
                    .statements
                    .get(statement)
                    .copied()
                    .unwrap_or(Kind::Other);
                self.portals.insert(portal, kind);
                Kind::Other
            }
            // Execute: portal name, row limit.
            b'E' => {
                let portal = fields.next().unwrap_or_default();
                self.portals.get(portal).copied().unwrap_or(Kind::Other)
            }
            // Close: 'S' statement / 'P' portal, then the name.
            b'C' => {
                if let Some((&kind, rest)) = frame.body.split_first() {
                    let name = rest.split(|&b| b == 0).next().unwrap_or_default();
                    match kind {
                        b'S' => {
                            self.statements.remove(name);
                        }
                        b'P' => {
                            self.portals.remove(name);
                        }
                        _ => {}
                    }
                }
                Kind::Other
            }
            _ => Kind::Other,
        }
    }
}

/// Whether SQL text is a plain `COMMIT` (case-insensitive, surrounding
/// white space and one trailing `;` allowed; `COMMIT WORK` and
/// `COMMIT TRANSACTION` too, but not `COMMIT AND CHAIN` or
/// `COMMIT PREPARED`).
fn is_commit_sql(sql: &[u8]) -> bool {
    let Ok(text) = std::str::from_utf8(sql) else {
        return false;
    };
    let text = text.trim();
    let text = text.strip_suffix(';').unwrap_or(text).trim_end();
    let mut words = text.split_ascii_whitespace();
    let first = words
        .next()
        .is_some_and(|w| w.eq_ignore_ascii_case("COMMIT"));
    match (first, words.next(), words.next()) {
        (true, None, _) => true,
        (true, Some(w), None) => {
            w.eq_ignore_ascii_case("WORK") || w.eq_ignore_ascii_case("TRANSACTION")
        }
        _ => false,
    }
}

/// Whether SQL text opens a transaction: `BEGIN` or `START TRANSACTION`,
/// with any modifiers (`BEGIN IMMEDIATE`, `BEGIN ISOLATION LEVEL …`,
/// `START TRANSACTION READ ONLY`), case-insensitive, one trailing `;`.
fn is_begin_sql(sql: &[u8]) -> bool {
    let Ok(text) = std::str::from_utf8(sql) else {
        return false;
    };
    let text = text.trim();
    let text = text.strip_suffix(';').unwrap_or(text).trim_end();
    if text.contains(';') {
        return false;
    }
    let mut words = text.split_ascii_whitespace();
    match words.next() {
        Some(w) if w.eq_ignore_ascii_case("BEGIN") => true,
        Some(w) if w.eq_ignore_ascii_case("START") => words
            .next()
            .is_some_and(|w| w.eq_ignore_ascii_case("TRANSACTION")),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn begin_statements() {
        for sql in [
            "BEGIN",
            "begin;",
            " BEGIN IMMEDIATE ",
            "BEGIN ISOLATION LEVEL SERIALIZABLE",
            "START TRANSACTION",
            "start transaction read only;",
        ] {
            assert!(is_begin_sql(sql.as_bytes()), "{sql}");
            assert_eq!(Kind::of_sql(sql.as_bytes()), Kind::Begin, "{sql}");
        }
        for sql in [
            "COMMIT",
            "BEGINS",
            "START",
            "SELECT 1",
            "BEGIN; COMMIT",
            "DO $$ BEGIN END $$",
        ] {
            assert!(!is_begin_sql(sql.as_bytes()), "{sql}");
        }
        assert_eq!(Kind::of_sql(b"COMMIT"), Kind::Commit);
    }
}
