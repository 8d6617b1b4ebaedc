//! One proxied connection: accepting, PostgreSQL's startup (encryption
//! requests answered `N`), then both directions copied as they are read,
//! with the client's `COMMIT`s armed and the server's replies dropped.

use std::io;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Notify;
use tokio::task::JoinSet;

use super::wire::{ClientInspector, Frame, Framer, Seen};
use super::{CommitFault, Protocol, REPLY_TIMEOUT, Shared};

pub(super) async fn accept_loop(listener: TcpListener, shared: Arc<Shared>) {
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

/// Returns once the path is not black-holed
/// ([`set_black_hole`](super::FaultProxy::set_black_hole)).
async fn through_the_hole(shared: &Shared) {
    while shared.black_hole.load(Ordering::SeqCst) {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

async fn proxy_connection(mut client: TcpStream, shared: Arc<Shared>) {
    let mut down = shared.down.subscribe();
    if *down.borrow() {
        // The server is down: the connection closes at once.
        return;
    }
    through_the_hole(&shared).await;
    let mut server = match TcpStream::connect(&shared.upstream).await {
        Ok(s) => s,
        Err(e) => {
            tracing::debug!("fault proxy: cannot reach {}: {e}", shared.upstream);
            return;
        }
    };
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    tokio::select! {
        ended = run_connection(&mut client, &mut server, &shared) => if let Err(e) = ended {
            tracing::debug!("fault proxy: connection ended: {e}");
        },
        _ = down.wait_for(|d| *d) => tracing::debug!("fault proxy: connection cut (the server is down)"),
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

    let up = client_to_server(
        &mut client_read,
        &mut server_write,
        inspector,
        leftover,
        &arm,
        shared,
    );
    let down = server_to_client(&mut server_read, &mut client_write, &arm, shared);
    tokio::try_join!(up, down).map(|_| ())
}

/// The client-to-server half: every chunk inspected for `COMMIT`s (the
/// scripted fault, the random drops arm the other half) and `BEGIN`s, then
/// forwarded.
async fn client_to_server(
    client_read: &mut (impl AsyncReadExt + Unpin),
    server_write: &mut (impl AsyncWriteExt + Unpin),
    mut inspector: ClientInspector,
    leftover: Vec<u8>,
    arm: &Arm,
    shared: &Shared,
) -> io::Result<()> {
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
                return Ok(());
            }
            &buf[..n]
        };
        let Seen {
            commits,
            begins,
            savepoints,
        } = inspector.feed(chunk);
        if savepoints > 0 {
            let hold = shared.savepoint_hold_ms.load(Ordering::SeqCst);
            if hold > 0 {
                arm.hold_ms.store(hold, Ordering::SeqCst);
            }
        }
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
            match scripted(shared, commits) {
                Some(CommitFault::Cut) => {
                    // Never forwarded: the server sees the connection
                    // close inside its transaction, and rolls back.
                    tracing::debug!("fault proxy: COMMIT cut; closing both connections");
                    return Err(io::Error::new(
                        io::ErrorKind::ConnectionAborted,
                        "COMMIT cut by the proxy's script",
                    ));
                }
                Some(CommitFault::Hold(hold)) => tokio::time::sleep(hold).await,
                Some(CommitFault::LoseAck) => arm.arm(),
                _ => {}
            }
            if !arm.is_armed() && (0..commits).any(|_| shared.draw_drop()) {
                // Armed before the COMMIT's last byte leaves: the
                // server's reply can only come after this.
                arm.arm();
            }
        }
        through_the_hole(shared).await;
        server_write.write_all(chunk).await?;
        pending.clear();
    }
}

/// The server-to-client half: replies forwarded, but those after an armed
/// `COMMIT` thrown away, and a held `BEGIN`'s reply held.
async fn server_to_client(
    server_read: &mut (impl AsyncReadExt + Unpin),
    client_write: &mut (impl AsyncWriteExt + Unpin),
    arm: &Arm,
    shared: &Shared,
) -> io::Result<std::convert::Infallible> {
    let mut buf = vec![0u8; 16 * 1024];
    let mut frames = Framer::new(shared.protocol, 1);
    let mut deadline: Option<tokio::time::Instant> = None;
    loop {
        let wait_until = deadline;
        let (sr, b) = (&mut *server_read, &mut buf);
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
            return Err(drop_ack(shared, "no reply to COMMIT within the time-out"));
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
        through_the_hole(shared).await;
        client_write.write_all(chunk).await?;
    }
}

/// The scripted fault of the `commits` `COMMIT`s of one chunk, if one of
/// them is the scripted one.
fn scripted(shared: &Shared, commits: u64) -> Option<CommitFault> {
    (0..commits).fold(None, |found, _| shared.script.on_commit().or(found))
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
