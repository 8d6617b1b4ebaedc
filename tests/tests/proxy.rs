//! The fault-injection proxy (`idem_tests::proxy`): the article's "lost
//! commit acknowledgement", for real.
//!
//! Against the real servers: through the proxy, a `COMMIT` whose reply is
//! dropped fails on the client with an I/O error, while the row is in the
//! table (the server committed). Against fake servers on loopback: the
//! framing (messages split byte by byte), PostgreSQL's extended protocol,
//! MySQL's handshake packets, and what is and is not a `COMMIT`.

use std::collections::BTreeSet;
use std::time::Duration;

use idem_runtime::__private::Dialect;
use idem_tests::proxy::{FaultProxy, Protocol, upstream_of};
use idem_tests::{sql, unique, unreachable};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// Every test is bounded: a proxy bug must fail, not hang.
const LIMIT: Duration = Duration::from_secs(60);

/// Asserts that a commit failed the way a lost acknowledgement fails: an
/// I/O error, not an answer from the database.
fn assert_io_error(err: &sqlx::Error) {
    assert!(
        matches!(err, sqlx::Error::Io(_)),
        "expected an I/O error from the lost acknowledgement, got {err:?}"
    );
}

macro_rules! backend_tests {
    ($module:ident, $db:ty, $conn:ty, $dialect:expr, $url:expr, $what:literal) => {
        mod $module {
            use super::*;
            use sqlx::pool::PoolOptions;
            use sqlx::{AssertSqlSafe, Connection, Pool};

            type Db = $db;
            type Conn = $conn;
            const D: Dialect = $dialect;

            fn base_url() -> String {
                $url
            }

            /// A direct connection (not through the proxy), or `None`:
            /// skipped locally when the server is down.
            async fn direct() -> Option<Conn> {
                match Conn::connect(&base_url()).await {
                    Ok(c) => Some(c),
                    Err(e) => {
                        unreachable(&format!("{} at {}", $what, base_url()), e);
                        None
                    }
                }
            }

            async fn create_table(conn: &mut Conn) -> String {
                let table = unique("proxy");
                sqlx::query(AssertSqlSafe(format!(
                    "CREATE TABLE {table} (id BIGINT PRIMARY KEY)"
                )))
                .execute(&mut *conn)
                .await
                .expect("create table");
                table
            }

            async fn drop_table(conn: &mut Conn, table: &str) {
                sqlx::query(AssertSqlSafe(format!("DROP TABLE {table}")))
                    .execute(&mut *conn)
                    .await
                    .expect("drop table");
            }

            async fn ids_in(conn: &mut Conn, table: &str) -> BTreeSet<i64> {
                sqlx::query_scalar::<Db, i64>(AssertSqlSafe(format!("SELECT id FROM {table}")))
                    .fetch_all(&mut *conn)
                    .await
                    .expect("select ids")
                    .into_iter()
                    .collect()
            }

            fn insert(table: &str) -> AssertSqlSafe<String> {
                let text = sql(D, "INSERT INTO TABLE_NAME (id) VALUES (?)").0;
                AssertSqlSafe(text.replace("TABLE_NAME", table))
            }

            /// One single-row transaction on a pool through the proxy.
            async fn insert_one(pool: &Pool<Db>, table: &str, id: i64) -> Result<(), sqlx::Error> {
                let mut tx = pool.begin().await?;
                sqlx::query(insert(table))
                    .bind(id)
                    .execute(&mut *tx)
                    .await?;
                tx.commit().await
            }

            /// The acknowledgement of the COMMIT is lost: the client sees an
            /// I/O error, yet the server committed the row.
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn lost_ack_but_committed() {
                tokio::time::timeout(LIMIT, async {
                    let Some(mut direct) = direct().await else {
                        return;
                    };
                    let table = create_table(&mut direct).await;
                    let proxy = FaultProxy::for_url(&base_url(), 1.0)
                        .await
                        .expect("start proxy");

                    let mut conn = Conn::connect(&proxy.url(&base_url()))
                        .await
                        .expect("connect through the proxy");
                    let mut tx = conn.begin().await.expect("begin");
                    sqlx::query(insert(&table))
                        .bind(1_i64)
                        .execute(&mut *tx)
                        .await
                        .expect("insert");
                    let err = tx
                        .commit()
                        .await
                        .expect_err("the COMMIT's reply was dropped");
                    assert_io_error(&err);
                    drop(conn);

                    assert_eq!(proxy.commits_seen(), 1);
                    assert_eq!(proxy.acks_dropped(), 1);
                    // The server did commit.
                    assert_eq!(ids_in(&mut direct, &table).await, BTreeSet::from([1]));
                    drop_table(&mut direct, &table).await;
                })
                .await
                .expect("test timed out");
            }

            /// With the drop fraction at 0, the proxy is transparent.
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn no_drops_all_commit() {
                const N: i64 = 30;
                tokio::time::timeout(LIMIT, async {
                    let Some(mut direct) = direct().await else {
                        return;
                    };
                    let table = create_table(&mut direct).await;
                    let proxy = FaultProxy::for_url(&base_url(), 0.0)
                        .await
                        .expect("start proxy");
                    let pool: Pool<Db> = PoolOptions::new()
                        .max_connections(4)
                        .connect(&proxy.url(&base_url()))
                        .await
                        .expect("pool through the proxy");

                    let results = futures::future::join_all((0..N).map(|id| {
                        let (pool, table) = (pool.clone(), table.clone());
                        async move { insert_one(&pool, &table, id).await }
                    }))
                    .await;
                    for r in results {
                        r.expect("commit through a transparent proxy");
                    }
                    pool.close().await;

                    assert_eq!(proxy.commits_seen(), N as u64);
                    assert_eq!(proxy.acks_dropped(), 0);
                    assert_eq!(ids_in(&mut direct, &table).await, (0..N).collect());
                    drop_table(&mut direct, &table).await;
                })
                .await
                .expect("test timed out");
            }

            /// Half the acknowledgements lost: every commit the client saw
            /// fail is nevertheless in the table, as are all the others.
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn half_dropped_all_committed() {
                const N: i64 = 40;
                const WORKERS: i64 = 4;
                tokio::time::timeout(LIMIT, async {
                    let Some(mut direct) = direct().await else {
                        return;
                    };
                    let table = create_table(&mut direct).await;
                    let proxy = FaultProxy::for_url(&base_url(), 0.5)
                        .await
                        .expect("start proxy");
                    // A broken connection is discarded; the pool opens new ones.
                    let pool: Pool<Db> = PoolOptions::new()
                        .min_connections(0)
                        .max_connections(WORKERS as u32)
                        .test_before_acquire(true)
                        .connect(&proxy.url(&base_url()))
                        .await
                        .expect("pool through the proxy");

                    let workers = (0..WORKERS).map(|w| {
                        let (pool, table) = (pool.clone(), table.clone());
                        async move {
                            let mut outcome = Vec::new();
                            for id in (0..N).filter(|id| id % WORKERS == w) {
                                outcome.push((id, insert_one(&pool, &table, id).await));
                            }
                            outcome
                        }
                    });
                    let outcomes: Vec<_> = futures::future::join_all(workers)
                        .await
                        .into_iter()
                        .flatten()
                        .collect();
                    pool.close().await;

                    let mut failed = BTreeSet::new();
                    for (id, r) in outcomes {
                        if let Err(e) = r {
                            assert_io_error(&e);
                            failed.insert(id);
                        }
                    }
                    assert_eq!(proxy.commits_seen(), N as u64);
                    assert_eq!(failed.len() as u64, proxy.acks_dropped());
                    assert!(
                        !failed.is_empty(),
                        "0 of {N} acknowledgements dropped at 0.5"
                    );
                    assert!(
                        failed.len() < N as usize,
                        "all {N} acknowledgements dropped at 0.5"
                    );
                    // Committed, all of them: the failed ones included.
                    let present = ids_in(&mut direct, &table).await;
                    assert!(
                        failed.is_subset(&present),
                        "a commit reported failed was lost"
                    );
                    assert_eq!(present, (0..N).collect());
                    drop_table(&mut direct, &table).await;
                })
                .await
                .expect("test timed out");
            }

            /// The fraction can be changed while connections are open.
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn drop_fraction_is_adjustable() {
                tokio::time::timeout(LIMIT, async {
                    let Some(mut direct) = direct().await else {
                        return;
                    };
                    let table = create_table(&mut direct).await;
                    let proxy = FaultProxy::for_url(&base_url(), 0.0)
                        .await
                        .expect("start proxy");
                    let mut conn = Conn::connect(&proxy.url(&base_url()))
                        .await
                        .expect("connect through the proxy");
                    for id in 0..3_i64 {
                        let mut tx = conn.begin().await.expect("begin");
                        sqlx::query(insert(&table))
                            .bind(id)
                            .execute(&mut *tx)
                            .await
                            .expect("insert");
                        tx.commit().await.expect("commit while disabled");
                    }
                    proxy.set_drop_fraction(1.0);
                    let mut tx = conn.begin().await.expect("begin");
                    sqlx::query(insert(&table))
                        .bind(3_i64)
                        .execute(&mut *tx)
                        .await
                        .expect("insert");
                    assert_io_error(&tx.commit().await.expect_err("commit once enabled"));
                    drop(conn);
                    assert_eq!((proxy.commits_seen(), proxy.acks_dropped()), (4, 1));
                    assert_eq!(ids_in(&mut direct, &table).await, (0..4).collect());
                    drop_table(&mut direct, &table).await;
                })
                .await
                .expect("test timed out");
            }
        }
    };
}

backend_tests!(
    postgres,
    sqlx::Postgres,
    sqlx::PgConnection,
    Dialect::Postgres,
    idem_tests::postgres_url(),
    "PostgreSQL"
);
backend_tests!(
    mariadb,
    sqlx::MySql,
    sqlx::MySqlConnection,
    Dialect::MySql,
    idem_tests::mysql_url(),
    "MariaDB"
);

/// PostgreSQL: a `COMMIT` sent as a prepared statement (`sqlx::query`,
/// extended protocol: Parse, Bind, Execute, Sync) is found too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_commit_through_extended_protocol() {
    use sqlx::{AssertSqlSafe, Connection, PgConnection};
    tokio::time::timeout(LIMIT, async {
        let base = idem_tests::postgres_url();
        let mut direct = match PgConnection::connect(&base).await {
            Ok(c) => c,
            Err(e) => {
                unreachable(&format!("PostgreSQL at {base}"), e);
                return;
            }
        };
        let table = unique("proxy");
        sqlx::query(AssertSqlSafe(format!(
            "CREATE TABLE {table} (id BIGINT PRIMARY KEY)"
        )))
        .execute(&mut direct)
        .await
        .expect("create table");
        let proxy = FaultProxy::for_url(&base, 1.0).await.expect("start proxy");
        let mut conn = PgConnection::connect(&proxy.url(&base))
            .await
            .expect("connect");
        sqlx::query("BEGIN")
            .execute(&mut conn)
            .await
            .expect("begin");
        sqlx::query(AssertSqlSafe(format!(
            "INSERT INTO {table} (id) VALUES ($1)"
        )))
        .bind(7_i64)
        .execute(&mut conn)
        .await
        .expect("insert");
        let err = sqlx::query("COMMIT")
            .execute(&mut conn)
            .await
            .expect_err("the COMMIT's reply was dropped");
        assert_io_error(&err);
        drop(conn);
        assert_eq!((proxy.commits_seen(), proxy.acks_dropped()), (1, 1));
        let n: i64 = sqlx::query_scalar(AssertSqlSafe(format!("SELECT COUNT(*) FROM {table}")))
            .fetch_one(&mut direct)
            .await
            .expect("count");
        assert_eq!(n, 1, "the server committed");
        sqlx::query(AssertSqlSafe(format!("DROP TABLE {table}")))
            .execute(&mut direct)
            .await
            .expect("drop table");
    })
    .await
    .expect("test timed out");
}

// ---------------------------------------------------------------------------
// Fake servers: the framing, without a database.
// ---------------------------------------------------------------------------

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
