//! The fault proxy's scripted faults against a fake PostgreSQL server, no
//! database needed: the `n`-th `COMMIT` from now loses its reply, is cut
//! before the server has it, or is held; the others pass.

use std::time::{Duration, Instant};

use idem_test::CommitFault;
use idem_test::proxy::{FaultProxy, Protocol};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// Every test is bounded: a proxy bug must fail, not hang.
const LIMIT: Duration = Duration::from_secs(30);
const READY_IDLE: &[u8] = b"Z\0\0\0\x05I";

fn query(sql: &str) -> Vec<u8> {
    let body = format!("{sql}\0");
    let mut m = vec![b'Q'];
    m.extend_from_slice(&(body.len() as u32 + 4).to_be_bytes());
    m.extend_from_slice(body.as_bytes());
    m
}

/// A fake server for one connection: reads the startup message, then
/// answers every query `ReadyForQuery(I)`. Returns the queries it got.
async fn fake_server(listener: TcpListener) -> Vec<String> {
    let (mut s, _) = listener.accept().await.expect("accept");
    let len = s.read_u32().await.expect("startup length") as usize;
    let mut startup = vec![0; len - 4];
    s.read_exact(&mut startup).await.expect("startup body");
    let mut seen = Vec::new();
    loop {
        let (Ok(_tag), Ok(len)) = (s.read_u8().await, s.read_u32().await) else {
            return seen;
        };
        let mut body = vec![0; len as usize - 4];
        if s.read_exact(&mut body).await.is_err() {
            return seen;
        }
        seen.push(
            String::from_utf8_lossy(&body)
                .trim_end_matches('\0')
                .to_owned(),
        );
        if s.write_all(READY_IDLE).await.is_err() {
            return seen;
        }
    }
}

/// A client through a new proxy to a new fake server, past the startup.
async fn connect() -> (FaultProxy, TcpStream, tokio::task::JoinHandle<Vec<String>>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let upstream = listener.local_addr().unwrap().to_string();
    let server = tokio::spawn(fake_server(listener));
    let proxy = FaultProxy::start(Protocol::Postgres, &upstream, 0.0)
        .await
        .unwrap();
    let mut c = TcpStream::connect(proxy.addr()).await.unwrap();
    let body = b"\0\x03\0\0user\0u\0\0";
    let mut startup = ((body.len() + 4) as u32).to_be_bytes().to_vec();
    startup.extend_from_slice(body);
    c.write_all(&startup).await.unwrap();
    (proxy, c, server)
}

/// Sends `sql` and reads the reply: `None` when the proxy closed instead.
async fn ask(c: &mut TcpStream, sql: &str) -> Option<Vec<u8>> {
    c.write_all(&query(sql)).await.ok()?;
    let mut reply = vec![0; READY_IDLE.len()];
    c.read_exact(&mut reply).await.ok()?;
    Some(reply)
}

#[tokio::test]
async fn the_second_commit_loses_its_reply_after_the_server_has_it() {
    tokio::time::timeout(LIMIT, async {
        let (proxy, mut c, server) = connect().await;
        let mut fired = proxy.fault_commit(2, CommitFault::LoseAck);
        assert_eq!(ask(&mut c, "BEGIN").await.as_deref(), Some(READY_IDLE));
        assert_eq!(ask(&mut c, "COMMIT").await.as_deref(), Some(READY_IDLE));
        assert!(fired.try_recv().is_err(), "not on the first COMMIT");
        assert_eq!(
            ask(&mut c, "COMMIT").await,
            None,
            "the reply is thrown away"
        );
        assert!(fired.try_recv().is_ok());
        let seen = server.await.unwrap();
        assert_eq!(
            seen,
            ["BEGIN", "COMMIT", "COMMIT"],
            "the server had the COMMIT"
        );
        assert_eq!((proxy.commit_faults(), proxy.acks_dropped()), (1, 1));
    })
    .await
    .expect("test time-out");
}

#[tokio::test]
async fn a_cut_commit_never_reaches_the_server() {
    tokio::time::timeout(LIMIT, async {
        let (proxy, mut c, server) = connect().await;
        let _fired = proxy.fault_commit(1, CommitFault::Cut);
        assert_eq!(
            ask(&mut c, "INSERT INTO t VALUES (1)").await.as_deref(),
            Some(READY_IDLE)
        );
        assert_eq!(ask(&mut c, "COMMIT").await, None);
        let seen = server.await.unwrap();
        assert_eq!(
            seen,
            ["INSERT INTO t VALUES (1)"],
            "the COMMIT was never forwarded"
        );
        assert_eq!(proxy.commit_faults(), 1);
    })
    .await
    .expect("test time-out");
}

#[tokio::test]
async fn a_held_commit_goes_on_after_its_hold_and_a_cleared_fault_never_fires() {
    tokio::time::timeout(LIMIT, async {
        let (proxy, mut c, _server) = connect().await;
        let _fired = proxy.fault_commit(1, CommitFault::Hold(Duration::from_millis(300)));
        let start = Instant::now();
        assert_eq!(ask(&mut c, "COMMIT").await.as_deref(), Some(READY_IDLE));
        assert!(start.elapsed() >= Duration::from_millis(300));
        let _fired = proxy.fault_commit(1, CommitFault::Cut);
        proxy.clear_commit_fault();
        assert_eq!(ask(&mut c, "COMMIT").await.as_deref(), Some(READY_IDLE));
        assert_eq!((proxy.commit_faults(), proxy.commits_seen()), (1, 2));
    })
    .await
    .expect("test time-out");
}

#[tokio::test]
async fn a_run_on_a_closed_port_is_unreachable() {
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let url = format!("postgres://postgres@127.0.0.1:{port}/test");
    let run = idem_test::ActsOnce::postgres("nothing", &url, |n| n)
        .call(|_, _| async { Ok::<_, sqlx::Error>(idem_runtime::Outcome::Executed(())) })
        .effect(|_, _| async { Ok(1) })
        .run()
        .await;
    let err = run.expect_err("nothing listens there");
    assert!(err.is_unreachable(), "{err}");
}
