//! The fault proxy against fake servers on loopback, without a database:
//! the framing (messages split byte by byte), PostgreSQL's extended
//! protocol, MySQL's handshake packets, what is and is not a `COMMIT`,
//! closing on drop, and URL rewriting. The same proxy against the real
//! servers is tested in the integration tests (`tests/tests/backend/proxy.rs`).

use std::time::Duration;

use idem_testkit::proxy::{FaultProxy, Protocol, upstream_of};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// Every test is bounded: a proxy bug must fail, not hang.
const LIMIT: Duration = Duration::from_secs(60);

/// A PostgreSQL message: type byte, Int32 length (including itself), body.
fn pg_msg(tag: u8, body: &[u8]) -> Vec<u8> {
    let mut m = vec![tag];
    m.extend_from_slice(&(body.len() as u32 + 4).to_be_bytes());
    m.extend_from_slice(body);
    m
}

fn pg_query(sql: &str) -> Vec<u8> {
    pg_msg(b'Q', format!("{sql}\0").as_bytes())
}

const PG_READY_IDLE: &[u8] = b"Z\0\0\0\x05I";
const PG_READY_IN_TX: &[u8] = b"Z\0\0\0\x05T";

/// Writes `bytes` one at a time, so that every message is split across
/// reads on the proxy's side.
async fn write_bytewise(stream: &mut TcpStream, bytes: &[u8]) {
    for b in bytes {
        stream.write_all(&[*b]).await.expect("write");
        stream.flush().await.expect("flush");
        tokio::task::yield_now().await;
    }
}

/// Reads until EOF (or a reset): what the client got after a drop.
async fn read_rest(stream: &mut TcpStream) -> Vec<u8> {
    let mut rest = Vec::new();
    let _ = stream.read_to_end(&mut rest).await;
    rest
}

/// A fake PostgreSQL server for one connection: reads the startup message,
/// then answers every Query with `ReadyForQuery` (status `T`, or `I` after a
/// query containing "commit") and every Sync with `ReadyForQuery(I)`.
/// Returns the type bytes of the messages it received.
async fn fake_pg_server(listener: TcpListener) -> Vec<u8> {
    let (mut s, _) = listener.accept().await.expect("accept");
    let len = s.read_u32().await.expect("startup length") as usize;
    let mut startup = vec![0; len - 4];
    s.read_exact(&mut startup).await.expect("startup body");
    assert_eq!(
        &startup[..4],
        &196_608_u32.to_be_bytes(),
        "the startup message, not an SSLRequest"
    );
    let mut seen = Vec::new();
    loop {
        let Ok(tag) = s.read_u8().await else {
            return seen;
        };
        let Ok(len) = s.read_u32().await else {
            return seen;
        };
        let mut body = vec![0; len as usize - 4];
        if s.read_exact(&mut body).await.is_err() {
            return seen;
        }
        seen.push(tag);
        let reply = match tag {
            b'Q' if String::from_utf8_lossy(&body)
                .to_lowercase()
                .contains("commit") =>
            {
                PG_READY_IDLE
            }
            b'Q' => PG_READY_IN_TX,
            b'S' => PG_READY_IDLE,
            b'X' => return seen,
            _ => continue,
        };
        if s.write_all(reply).await.is_err() {
            return seen;
        }
    }
}

/// PostgreSQL through the proxy, byte by byte: an SSLRequest is refused by
/// the proxy, ordinary traffic passes, only real COMMITs count, and a COMMIT
/// through the extended protocol is dropped after the server replied.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fake_postgres_framing_and_extended_commit() {
    tokio::time::timeout(LIMIT, async {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let upstream = listener.local_addr().unwrap().to_string();
        let server = tokio::spawn(fake_pg_server(listener));
        let proxy = FaultProxy::start(Protocol::Postgres, &upstream, 0.0)
            .await
            .unwrap();
        let mut c = TcpStream::connect(proxy.addr()).await.unwrap();
        c.set_nodelay(true).unwrap();

        // SSLRequest: answered 'N' by the proxy itself.
        let mut ssl = 8_u32.to_be_bytes().to_vec();
        ssl.extend_from_slice(&80_877_103_u32.to_be_bytes());
        write_bytewise(&mut c, &ssl).await;
        assert_eq!(c.read_u8().await.unwrap(), b'N');

        let body = b"\0\x03\0\0user\0u\0\0";
        let mut startup = ((body.len() + 4) as u32).to_be_bytes().to_vec();
        startup.extend_from_slice(body);
        write_bytewise(&mut c, &startup).await;

        // Not commits: passed through, replies forwarded.
        for q in [
            "BEGIN",
            "SELECT 'COMMIT'",
            "COMMIT AND CHAIN",
            "COMMIT PREPARED 'x'",
            "END",
            "-- COMMIT",
        ] {
            write_bytewise(&mut c, &pg_query(q)).await;
            let mut reply = [0; 6];
            c.read_exact(&mut reply).await.unwrap();
        }
        assert_eq!(proxy.commits_seen(), 0, "none of those is a COMMIT");

        // Commits, all spellings, several messages in one write.
        let mut batch = Vec::new();
        for q in [
            "COMMIT",
            "commit;",
            "  Commit Work ; ",
            "COMMIT TRANSACTION",
        ] {
            batch.extend(pg_query(q));
        }
        c.write_all(&batch).await.unwrap();
        let mut replies = [0; 24];
        c.read_exact(&mut replies).await.unwrap();
        assert_eq!(&replies[..], PG_READY_IDLE.repeat(4).as_slice());
        assert_eq!(proxy.commits_seen(), 4);
        assert_eq!(proxy.acks_dropped(), 0);

        // The extended protocol: Parse of COMMIT into a named statement,
        // Bind, Execute, Sync — the drop is armed at the Execute.
        proxy.set_drop_fraction(1.0);
        let mut ext = pg_msg(b'P', b"sqlx_s_1\0 commit \0\0\0");
        ext.extend(pg_msg(b'B', b"\0sqlx_s_1\0\0\0\0\0\0\0"));
        ext.extend(pg_msg(b'E', b"\0\0\0\0\0"));
        ext.extend(pg_msg(b'S', b""));
        write_bytewise(&mut c, &ext).await;
        assert!(
            read_rest(&mut c).await.is_empty(),
            "the reply to COMMIT must be dropped"
        );
        assert_eq!(proxy.commits_seen(), 5);
        assert_eq!(proxy.acks_dropped(), 1);

        // The server received the whole COMMIT, Sync included.
        let seen = server.await.unwrap();
        assert!(
            seen.ends_with(b"PBES"),
            "server saw {:?}",
            String::from_utf8_lossy(&seen)
        );
    })
    .await
    .expect("test timed out");
}

/// A MySQL packet: 3-byte little-endian length, sequence id, payload.
fn my_packet(seq: u8, payload: &[u8]) -> Vec<u8> {
    let mut p = (payload.len() as u32).to_le_bytes()[..3].to_vec();
    p.push(seq);
    p.extend_from_slice(payload);
    p
}

fn com_query(sql: &str) -> Vec<u8> {
    let mut payload = vec![0x03];
    payload.extend_from_slice(sql.as_bytes());
    my_packet(0, &payload)
}

/// OK packet, sequence 1: header, 0 rows, no insert id, status, warnings.
const MY_OK: &[u8] = b"\x07\0\0\x01\0\0\0\x02\0\0\0";

/// A fake MySQL server for one connection: sends a greeting, answers the
/// handshake response and an auth-switch response, then answers every
/// command with OK. Returns the payloads of the commands it received.
async fn fake_mysql_server(listener: TcpListener) -> Vec<Vec<u8>> {
    let (mut s, _) = listener.accept().await.expect("accept");
    s.write_all(&my_packet(0, b"\x0afake-5.5\0")).await.unwrap();
    let mut commands = Vec::new();
    loop {
        let mut header = [0; 4];
        if s.read_exact(&mut header).await.is_err() {
            return commands;
        }
        let len = u32::from_le_bytes([header[0], header[1], header[2], 0]) as usize;
        let mut payload = vec![0; len];
        if s.read_exact(&mut payload).await.is_err() {
            return commands;
        }
        let reply = match header[3] {
            // Handshake response: ask for an auth switch.
            1 => my_packet(2, b"\xfemysql_native_password\0"),
            // Auth switch response: OK.
            3 => my_packet(4, b"\0\0\0\x02\0\0\0"),
            _ => {
                commands.push(payload);
                MY_OK.to_vec()
            }
        };
        if s.write_all(&reply).await.is_err() {
            return commands;
        }
    }
}

/// MySQL through the proxy, byte by byte: handshake packets that look like
/// `COM_QUERY COMMIT` are not commits (their sequence id is not 0), and a
/// real one is dropped after the server's OK.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fake_mysql_handshake_and_commit() {
    tokio::time::timeout(LIMIT, async {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let upstream = listener.local_addr().unwrap().to_string();
        let server = tokio::spawn(fake_mysql_server(listener));
        let proxy = FaultProxy::start(Protocol::MySql, &upstream, 1.0)
            .await
            .unwrap();
        let mut c = TcpStream::connect(proxy.addr()).await.unwrap();
        c.set_nodelay(true).unwrap();

        let greeting = my_packet(0, b"\x0afake-5.5\0");
        let mut got = vec![0; greeting.len()];
        c.read_exact(&mut got).await.unwrap();
        assert_eq!(got, greeting);

        // Handshake and auth-switch responses that read "\x03COMMIT".
        write_bytewise(&mut c, &my_packet(1, b"\x03COMMIT")).await;
        let mut switch = vec![0; 4 + 23];
        c.read_exact(&mut switch).await.unwrap();
        write_bytewise(&mut c, &my_packet(3, b"\x03COMMIT")).await;
        let mut ok = vec![0; 11];
        c.read_exact(&mut ok).await.unwrap();
        assert_eq!(
            proxy.commits_seen(),
            0,
            "handshake packets are not commands"
        );

        // Not commits.
        for q in ["SELECT 'COMMIT'", "COMMIT AND CHAIN", "ROLLBACK"] {
            write_bytewise(&mut c, &com_query(q)).await;
            let mut ok = vec![0; MY_OK.len()];
            c.read_exact(&mut ok).await.unwrap();
            assert_eq!(ok, MY_OK);
        }
        assert_eq!(proxy.commits_seen(), 0);

        write_bytewise(&mut c, &com_query(" commit ;")).await;
        assert!(
            read_rest(&mut c).await.is_empty(),
            "the OK to COMMIT must be dropped"
        );
        assert_eq!(proxy.commits_seen(), 1);
        assert_eq!(proxy.acks_dropped(), 1);
        let commands = server.await.unwrap();
        assert_eq!(
            commands.last().map(Vec::as_slice),
            Some(&b"\x03 commit ;"[..])
        );
    })
    .await
    .expect("test timed out");
}

/// Dropping the proxy closes its open connections and its port.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drop_closes_everything() {
    tokio::time::timeout(LIMIT, async {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let upstream = listener.local_addr().unwrap().to_string();
        let server = tokio::spawn(fake_mysql_server(listener));
        let proxy = FaultProxy::start(Protocol::MySql, &upstream, 0.0)
            .await
            .unwrap();
        let addr = proxy.addr();
        let mut c = TcpStream::connect(addr).await.unwrap();
        let mut greeting = vec![0; 14];
        c.read_exact(&mut greeting).await.unwrap();

        drop(proxy);
        assert!(
            read_rest(&mut c).await.is_empty(),
            "the connection is closed"
        );
        server.await.unwrap(); // the server's side was closed too
        assert!(
            TcpStream::connect(addr).await.is_err(),
            "nothing listens any more"
        );
    })
    .await
    .expect("test timed out");
}

#[tokio::test]
async fn url_rewriting() {
    let pg = FaultProxy::start(Protocol::Postgres, "127.0.0.1:5432", 0.0)
        .await
        .unwrap();
    let at = pg.addr();
    assert_eq!(
        pg.url("postgres://u:p%40ss@db.example:6543/test?sslmode=require&application_name=x"),
        format!("postgres://u:p%40ss@{at}/test?application_name=x&sslmode=disable")
    );
    assert_eq!(
        pg.url("postgresql://localhost"),
        format!("postgresql://{at}?sslmode=disable")
    );

    let my = FaultProxy::start(Protocol::MySql, "127.0.0.1:3306", 0.0)
        .await
        .unwrap();
    let at = my.addr();
    assert_eq!(
        my.url("mysql://root@127.0.0.1:3306/test?ssl-mode=REQUIRED&charset=utf8mb4"),
        format!("mysql://root@{at}/test?charset=utf8mb4&ssl-mode=disabled")
    );

    assert_eq!(
        upstream_of("postgres://u@127.0.0.1/test").as_deref(),
        Some("127.0.0.1:5432")
    );
    assert_eq!(
        upstream_of("mysql://a:b@c@host:3307/x?y=z").as_deref(),
        Some("host:3307")
    );
    assert_eq!(
        upstream_of("mariadb://[::1]/x").as_deref(),
        Some("[::1]:3306")
    );
    assert_eq!(upstream_of("sqlite://x.db"), None);
    assert_eq!(Protocol::of_url("postgresql://x"), Some(Protocol::Postgres));

    pg.set_drop_fraction(7.0);
    assert_eq!(pg.drop_fraction(), 1.0);
    pg.set_drop_fraction(f64::NAN);
    assert_eq!(pg.drop_fraction(), 0.0);
}
