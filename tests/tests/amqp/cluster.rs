//! The RabbitMQ link across a cluster failover: a 3-node cluster of its
//! own ([`RabbitCluster`]), a quorum queue, the relay publishing outbox
//! messages with publisher confirms, and the AMQP consumer running an
//! `#[idempotent]` handler on PostgreSQL that acks after its commit. Mid-run
//! the quorum queue's leader node is killed with SIGKILL, and started again
//! later.
//!
//! The fault is forced, not timed. Consumer 1 is connected to the leader's
//! node; after `PASS` deliveries its handler still commits but holds its
//! answer (no ack), so when that node dies, up to a prefetch of committed
//! messages is certainly redelivered to consumer 2 (on another node). The
//! leader is killed once `KILL_AT` messages are committed, the second half of
//! the outbox is enqueued while it is down, and it is restarted once
//! `RESTART_AT` are committed. Whatever the timing, the database must show
//! every message's effect once (double 0, lost 0) and every outbox message
//! `success`, and nothing left in the queue.
//!
//! The control runs the same scenario with a plain insert (no
//! `#[idempotent]`): the forced redeliveries must show as doubles.

// Not every helper of the shared file is used here.
use crate::common::amqp::*;
use crate::common::hooks;
use idem_runtime::outbox::Relay;
use idem_testkit::cluster::rabbitmq::RabbitCluster;
use lapin::options::{ExchangeDeclareOptions, QueueBindOptions};
use tokio::sync::watch;

/// Outbox messages per run, enqueued in two halves.
const M: i64 = 300;
/// Deliveries consumer 1 answers before it starts holding its answers.
const PASS: u64 = 40;
/// Committed messages (distinct) before the leader's node is killed.
const KILL_AT: i64 = 100;
/// Committed messages (distinct) before it is started again.
const RESTART_AT: i64 = 225;
const PREFETCH: u16 = 16;
const WITHIN: Duration = Duration::from_secs(60);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// The `#[idempotent]` handler.
    Idempotent,
    /// The control: the same insert without the macro.
    Plain,
}

/// The effect: one row per handled message.
#[idempotent(key = "mq:{m.queue}:{m.message_id}", strategy = record, biz_type = "amqp_cluster")]
async fn apply(
    tx: &mut Transaction<'_, Postgres>,
    m: &Message,
    table: &str,
) -> Result<(), sqlx::Error> {
    insert(&mut **tx, m, table).await
}

async fn insert<'e>(
    db: impl sqlx::PgExecutor<'e>,
    m: &Message,
    table: &str,
) -> Result<(), sqlx::Error> {
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "INSERT INTO {table} (message_id, redelivered) VALUES ($1, $2)"
    )))
    .bind(&m.message_id)
    .bind(m.redelivered)
    .execute(db)
    .await?;
    Ok(())
}

async fn effect(pool: &PgPool, kind: Kind, table: &str, m: &Message) -> Result<Outcome<()>, Error> {
    match kind {
        Kind::Idempotent => apply(pool, m, table).await,
        Kind::Plain => {
            insert(pool, m, table).await?;
            Ok(Outcome::Executed(()))
        }
    }
}

/// What a run's consumers share: the effect, and consumer 1's hold.
struct Side {
    pool: PgPool,
    kind: Kind,
    table: String,
    /// Handler calls, both consumers.
    calls: AtomicUsize,
    /// Of those, deliveries with the AMQP `redelivered` flag (the
    /// consumer's stats do not count them for AMQP).
    flagged: AtomicUsize,
    /// Consumer 1's answered calls.
    passed: AtomicUsize,
    /// Consumer 1's calls committed and holding their answer.
    held: AtomicUsize,
    release: watch::Sender<bool>,
}

type Handler = Box<dyn Fn(Message, serde_json::Value) -> HandlerFuture + Send + Sync>;

/// The handler of consumer 1 (`holds`: after `PASS` answers, commit and
/// hold) or consumer 2.
fn handler(side: &Arc<Side>, holds: bool) -> Handler {
    let side = side.clone();
    Box::new(move |m: Message, _: serde_json::Value| {
        let side = side.clone();
        Box::pin(async move {
            side.calls.fetch_add(1, Ordering::Relaxed);
            if m.redelivered {
                side.flagged.fetch_add(1, Ordering::Relaxed);
            }
            let r = effect(&side.pool, side.kind, &side.table, &m).await;
            if holds && r.is_ok() && side.passed.fetch_add(1, Ordering::Relaxed) as u64 >= PASS {
                side.held.fetch_add(1, Ordering::Relaxed);
                let mut released = side.release.subscribe();
                let _ = released.wait_for(|r| *r).await;
            }
            r
        })
    })
}

async fn distinct(pool: &PgPool, table: &str) -> i64 {
    sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "SELECT COUNT(DISTINCT message_id) FROM {table}"
    )))
    .fetch_one(pool)
    .await
    .expect("count")
}

async fn pending(pool: &PgPool, topic: &str) -> i64 {
    sqlx::query_scalar("SELECT COUNT(*) FROM idem_outbox WHERE topic = $1 AND status <> 'success'")
        .bind(topic)
        .fetch_one(pool)
        .await
        .expect("count pending")
}

/// Waits until `cond` holds, polling every 50 ms; panics after `WITHIN`
/// with the cluster's logs.
macro_rules! wait_until {
    ($cluster:expr, $what:expr, $cond:expr) => {{
        let start = Instant::now();
        loop {
            if $cond {
                break;
            }
            if start.elapsed() > WITHIN {
                let tails: Vec<String> = (0..$cluster.size())
                    .map(|i| $cluster.log_tail(i, 15))
                    .collect();
                panic!("timed out waiting for {}\n{}", $what, tails.join("\n"));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }};
}

async fn enqueue(pool: &PgPool, topic: &str, queue: &str, range: std::ops::Range<i64>) {
    let mut tx = pool.begin().await.expect("begin");
    for k in range {
        idem_runtime::outbox::enqueue(
            &mut tx,
            topic,
            &format!("{queue}-{k}"),
            &serde_json::json!({ "n": k }),
        )
        .await
        .expect("enqueue");
    }
    tx.commit().await.expect("commit");
}

/// A run's figures.
#[derive(Debug)]
struct Figures {
    leader: String,
    killed_after: i64,
    double: i64,
    lost: i64,
    held: usize,
    /// Handler calls beyond one per message.
    redelivered: u64,
    /// Deliveries with the AMQP `redelivered` flag.
    flagged: u64,
    /// Consumer 2's `Duplicate` answers.
    duplicates: u64,
    publish_retries: i64,
    took: Duration,
}

async fn run(cluster: &RabbitCluster, pool: &PgPool, kind: Kind) -> Figures {
    let begun = Instant::now();
    let queue = unique("idem_rmqc");
    let exchange = format!("{queue}.ex");
    let topic = format!("{queue}.deduct");
    let table = format!("{queue}_effect");
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "CREATE TABLE {table} (message_id VARCHAR(128) NOT NULL, redelivered BOOLEAN NOT NULL)"
    )))
    .execute(pool)
    .await
    .expect("create table");

    // The quorum queue, declared through node 0.
    let admin = amqp::connect(&cluster.url(0))
        .await
        .expect("connect node 0");
    let ch = admin.create_channel().await.expect("channel");
    ch.exchange_declare(
        exchange.as_str().into(),
        lapin::ExchangeKind::Topic,
        ExchangeDeclareOptions {
            durable: true,
            ..ExchangeDeclareOptions::default()
        },
        FieldTable::default(),
    )
    .await
    .expect("declare exchange");
    let mut args = FieldTable::default();
    args.insert(
        "x-queue-type".into(),
        AMQPValue::LongString("quorum".into()),
    );
    ch.queue_declare(queue.as_str().into(), QueueDeclareOptions::durable(), args)
        .await
        .expect("declare quorum queue");
    ch.queue_bind(
        queue.as_str().into(),
        exchange.as_str().into(),
        topic.as_str().into(),
        QueueBindOptions::default(),
        FieldTable::default(),
    )
    .await
    .expect("bind");
    let _ = ch.close(200, "OK".into()).await;
    let _ = admin.close(200, "OK".into()).await;

    let asked = Instant::now();
    let leader = loop {
        if let Some(l) = tokio::task::block_in_place(|| cluster.quorum_leader(0, &queue)) {
            break l;
        }
        assert!(asked.elapsed() < WITHIN, "no leader for {queue}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let (a, b) = ((leader + 1) % 3, (leader + 2) % 3);
    let leader_name = cluster.name(leader).to_string();

    // The publisher and consumer 2 on the surviving nodes; consumer 1 on
    // the leader's node, dying with it.
    let on_a = amqp::connect(&cluster.url(a)).await.expect("connect");
    let on_b = amqp::connect(&cluster.url(b)).await.expect("connect");
    let on_leader = amqp::connect(&cluster.url(leader)).await.expect("connect");

    enqueue(pool, &topic, &queue, 0..M / 2).await;
    let publisher = Publisher::new(on_a.clone(), &exchange);
    let relay = Relay::new(pool.clone())
        .route(topic.clone(), publisher.route())
        .poll_interval(Duration::from_millis(20))
        .backoff(Duration::from_millis(50), Duration::from_millis(500))
        .spawn();

    let side = Arc::new(Side {
        pool: pool.clone(),
        kind,
        table: table.clone(),
        calls: AtomicUsize::new(0),
        flagged: AtomicUsize::new(0),
        passed: AtomicUsize::new(0),
        held: AtomicUsize::new(0),
        release: watch::channel(false).0,
    });
    let c1 = Consumer::new(on_leader.clone(), &queue, handler(&side, true))
        .prefetch(PREFETCH)
        .spawn()
        .await
        .expect("consumer 1");
    wait_until!(
        cluster,
        "consumer 1 to hold a committed message",
        side.held.load(Ordering::Relaxed) >= 1
    );
    let c2 = Consumer::new(on_b.clone(), &queue, handler(&side, false))
        .prefetch(PREFETCH)
        .backoff(Duration::from_millis(50), Duration::from_millis(500))
        .spawn()
        .await
        .expect("consumer 2");

    wait_until!(
        cluster,
        format!("{KILL_AT} committed"),
        distinct(pool, &table).await >= KILL_AT
    );
    let killed_after = distinct(pool, &table).await;
    let held = side.held.load(Ordering::Relaxed);
    tokio::task::block_in_place(|| cluster.kill9(leader));
    side.release.send_replace(true);

    // The second half is published while the leader's node is down.
    enqueue(pool, &topic, &queue, M / 2..M).await;
    wait_until!(
        cluster,
        format!("{RESTART_AT} committed with node {leader} down"),
        distinct(pool, &table).await >= RESTART_AT
    );
    tokio::task::block_in_place(|| cluster.restart(leader));

    wait_until!(
        cluster,
        "every message committed and every outbox message success",
        distinct(pool, &table).await == M && pending(pool, &topic).await == 0
    );
    // The redeliveries drain: nothing ready in the queue, twice in a row.
    wait_until!(cluster, "the queue to drain", {
        let empty = ready(&on_a, &queue).await == 0;
        tokio::time::sleep(Duration::from_millis(300)).await;
        empty && ready(&on_a, &queue).await == 0
    });
    let stats2 = c2.stats();
    c2.shutdown().await.expect("consumer 2 shutdown");
    relay.shutdown().await;
    assert_eq!(ready(&on_a, &queue).await, 0, "messages left in {queue}");
    // Neither end reconnects: consumer 1 stopped with its connection, and
    // a publisher on that connection fails (retryably) until the
    // application connects again.
    wait_until!(
        cluster,
        "consumer 1 to stop with its node",
        c1.is_finished()
    );
    let _ = c1.shutdown().await;
    let dead = Publisher::new(on_leader.clone(), &exchange)
        .publish(&topic, &format!("{queue}-dead"), b"{}")
        .await;
    assert!(
        dead.as_ref().is_err_and(Error::is_retryable),
        "a publish on the dead node's connection: {dead:?}"
    );

    let double: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "SELECT COALESCE(SUM(n - 1), 0)::BIGINT FROM (SELECT COUNT(*) AS n FROM {table} GROUP BY message_id) c"
    )))
    .fetch_one(pool)
    .await
    .expect("doubles");
    let lost: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "SELECT COUNT(*) FROM idem_outbox o WHERE o.topic = $1 \
         AND NOT EXISTS (SELECT 1 FROM {table} e WHERE e.message_id = o.msg_id)"
    )))
    .bind(&topic)
    .fetch_one(pool)
    .await
    .expect("lost");
    let (outbox, success, attempts): (i64, i64, i64) = sqlx::query_as(
        "SELECT COUNT(*), COUNT(*) FILTER (WHERE status = 'success'), COALESCE(SUM(attempts), 0)::BIGINT \
         FROM idem_outbox WHERE topic = $1",
    )
    .bind(&topic)
    .fetch_one(pool)
    .await
    .expect("outbox");
    assert_eq!((outbox, success), (M, M), "outbox messages success");
    // Counted: the run's table goes (kept when an assertion above failed).
    sqlx::query(sqlx::AssertSqlSafe(format!("DROP TABLE {table}")))
        .execute(pool)
        .await
        .expect("drop table");

    let _ = on_a.close(200, "OK".into()).await;
    let _ = on_b.close(200, "OK".into()).await;
    Figures {
        leader: leader_name,
        killed_after,
        double,
        lost,
        held,
        redelivered: side.calls.load(Ordering::Relaxed) as u64 - M as u64,
        flagged: side.flagged.load(Ordering::Relaxed) as u64,
        duplicates: stats2.duplicates(),
        publish_retries: attempts - M,
        took: begun.elapsed(),
    }
}

fn print(what: &str, f: &Figures) {
    eprintln!(
        "{what}: {M} messages, leader {} killed after {}, double {}, lost {}, \
         redelivered {} ({} held committed at the kill, {} flagged, {} answered Duplicate), \
         publish retries {}, {:.1} s",
        f.leader,
        f.killed_after,
        f.double,
        f.lost,
        f.redelivered,
        f.held,
        f.flagged,
        f.duplicates,
        f.publish_retries,
        f.took.as_secs_f64()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn quorum_leader_killed_mid_run_double_0_lost_0_and_the_plain_control_doubles() {
    let _hooks = hooks::shared().await;
    let _servers = hooks::own_servers().await;
    let begun = Instant::now();
    let Some(cluster) = tokio::task::block_in_place(|| RabbitCluster::start(3)) else {
        return;
    };
    let Some(pool) = idem_testkit::postgres(8).await else {
        return;
    };

    let f = run(&cluster, &pool, Kind::Idempotent).await;
    print("amqp cluster", &f);
    assert_eq!(f.double, 0, "doubles: {f:?}");
    assert_eq!(f.lost, 0, "lost: {f:?}");
    assert!(
        f.redelivered >= f.held as u64 && f.held >= 1,
        "the held messages are redelivered: {f:?}"
    );

    // The control: the same forced redeliveries, without the macro.
    let c = run(&cluster, &pool, Kind::Plain).await;
    print("amqp cluster control (plain insert)", &c);
    assert_eq!(c.lost, 0, "lost: {c:?}");
    assert!(
        c.double >= 1,
        "the control must double the redelivered messages: {c:?}"
    );
    eprintln!(
        "amqp cluster: total {:.1} s (cluster start {:.1} s)",
        begun.elapsed().as_secs_f64(),
        cluster.started_in().as_secs_f64()
    );
}
