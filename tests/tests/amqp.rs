//! The RabbitMQ link against the real broker and PostgreSQL: outbox →
//! relay + publisher → exchange → consumer → `#[idempotent]` handler.
//! Duplicate publishes and a consumer that dies between its commit and its
//! ack give one effect; non-retryable failures land in the dead-letter
//! queue at once; retryable ones retry with back-off through the retry
//! queue, boundedly. Assertions count rows in the database and read the
//! queues.

use idem_runtime::amqp::{
    self, ATTEMPTS_HEADER, Consumer, ConsumerHandle, Message, Publisher, Topology, lapin,
};
use idem_runtime::outbox::Relay;
use idem_runtime::{Error, Outcome, State, idempotent};
use idem_testkit::{ids, unique};
use lapin::options::{
    BasicGetOptions, BasicPublishOptions, ExchangeDeleteOptions, QueueDeclareOptions,
    QueueDeleteOptions,
};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{BasicProperties, Connection};
use serde::{Deserialize, Serialize};
use sqlx::{PgPool, Postgres, Transaction};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

fn amqp_url() -> String {
    std::env::var("IDEM_TEST_AMQP_URL")
        .unwrap_or_else(|_| "amqp://guest:guest@127.0.0.1:5672/%2f".into())
}

/// A connection to the local RabbitMQ, or `None` (skipped).
async fn broker() -> Option<Arc<Connection>> {
    match amqp::connect(&amqp_url()).await {
        Ok(c) => Some(c),
        Err(e) => {
            idem_testkit::unreachable(&format!("RabbitMQ at {}", amqp_url()), e);
            None
        }
    }
}

/// PostgreSQL with this file's tables.
async fn database() -> Option<PgPool> {
    let pool = idem_testkit::postgres(8).await?;
    let mut tx = pool.begin().await.expect("begin");
    sqlx::query("SELECT pg_advisory_xact_lock(77011)")
        .execute(&mut *tx)
        .await
        .expect("lock");
    for stmt in [
        "CREATE TABLE IF NOT EXISTS idem_q_coupon (id BIGINT PRIMARY KEY, status VARCHAR(16) NOT NULL)",
        "CREATE TABLE IF NOT EXISTS idem_q_deduction (coupon_id BIGINT NOT NULL, order_id BIGINT NOT NULL, message_id VARCHAR(128) NOT NULL)",
    ] {
        sqlx::query(stmt)
            .execute(&mut *tx)
            .await
            .expect("create table");
    }
    tx.commit().await.expect("commit");
    Some(pool)
}

/// Both servers, or `None` (skipped).
async fn servers() -> Option<(PgPool, Arc<Connection>)> {
    let conn = broker().await?;
    let pool = database().await?;
    Some((pool, conn))
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, State)]
pub enum CouponState {
    Unused,
    Used,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Deduct {
    pub coupon_id: i64,
    pub order_id: i64,
}

#[idempotent(
    key = "mq:{m.queue}:{m.message_id}",
    strategy = state_machine,
    table = "idem_q_coupon",
    id = d.coupon_id,
    from = CouponState::Unused,
    to = CouponState::Used,
)]
async fn deduct(
    tx: &mut Transaction<'_, Postgres>,
    m: &Message,
    d: &Deduct,
) -> Result<(), sqlx::Error> {
    sqlx::query(
        "INSERT INTO idem_q_deduction (coupon_id, order_id, message_id) VALUES ($1, $2, $3)",
    )
    .bind(d.coupon_id)
    .bind(d.order_id)
    .bind(&m.message_id)
    .execute(&mut **tx)
    .await?;
    Ok(())
}

/// A coupon in `status`, and its deduction payload.
async fn coupon(pool: &PgPool, status: &str) -> Deduct {
    let id = ids(1);
    sqlx::query("INSERT INTO idem_q_coupon (id, status) VALUES ($1, $2)")
        .bind(id)
        .bind(status)
        .execute(pool)
        .await
        .expect("insert coupon");
    Deduct {
        coupon_id: id,
        order_id: id + 1,
    }
}

async fn deductions(pool: &PgPool, coupon: i64) -> i64 {
    sqlx::query_scalar("SELECT COUNT(*) FROM idem_q_deduction WHERE coupon_id = $1")
        .bind(coupon)
        .fetch_one(pool)
        .await
        .expect("count")
}

async fn status(pool: &PgPool, coupon: i64) -> String {
    sqlx::query_scalar("SELECT status FROM idem_q_coupon WHERE id = $1")
        .bind(coupon)
        .fetch_one(pool)
        .await
        .expect("status")
}

type HandlerFuture =
    std::pin::Pin<Box<dyn std::future::Future<Output = Result<Outcome<()>, Error>> + Send>>;

/// The consumer closure for `deduct`.
fn deducting(pool: &PgPool) -> impl Fn(Message, Deduct) -> HandlerFuture + Send + Sync + 'static {
    let pool = pool.clone();
    move |m: Message, d: Deduct| {
        let pool = pool.clone();
        Box::pin(async move { deduct(&pool, &m, &d).await })
    }
}

/// A fresh topology (unique names) bound to a fresh exchange.
async fn topology(conn: &Connection, name: &str) -> (Topology, String, String) {
    let queue = unique(&format!("idem_q_{name}"));
    let exchange = format!("{queue}.ex");
    let routing_key = format!("coupon.deduct.{queue}");
    let t = Topology::new(&queue).bind(&exchange, &routing_key);
    t.declare(conn).await.expect("declare topology");
    // Declaring again is a no-op.
    t.declare(conn).await.expect("declare topology twice");
    (t, exchange, routing_key)
}

/// Deletes a test's queues and exchanges.
async fn teardown(conn: &Connection, t: &Topology) {
    let ch = conn.create_channel().await.expect("channel");
    for q in [&t.queue, &t.retry_queue, &t.dead_letter_queue] {
        let _ = ch
            .queue_delete(q.as_str().into(), QueueDeleteOptions::default())
            .await;
    }
    for (ex, _) in &t.bindings {
        let _ = ch
            .exchange_delete(ex.as_str().into(), ExchangeDeleteOptions::default())
            .await;
    }
    let _ = ch
        .exchange_delete(
            t.dead_letter_exchange.as_str().into(),
            ExchangeDeleteOptions::default(),
        )
        .await;
    let _ = ch.close(200, "OK".into()).await;
}

/// Messages ready in `queue` (not counting unacknowledged ones).
async fn ready(conn: &Connection, queue: &str) -> u32 {
    let ch = conn.create_channel().await.expect("channel");
    let q = ch
        .queue_declare(
            queue.into(),
            QueueDeclareOptions {
                passive: true,
                ..QueueDeclareOptions::default()
            },
            FieldTable::default(),
        )
        .await
        .expect("passive declare");
    let _ = ch.close(200, "OK".into()).await;
    q.message_count()
}

/// A message taken from a queue.
#[derive(Debug)]
struct Taken {
    message_id: Option<String>,
    attempts: Option<i64>,
    death_reason: Option<String>,
    body: Vec<u8>,
}

/// Takes `n` messages from `queue` (acknowledged), waiting up to `within`;
/// then checks nothing more arrives for a moment.
async fn take(conn: &Connection, queue: &str, n: usize, within: Duration) -> Vec<Taken> {
    let ch = conn.create_channel().await.expect("channel");
    let start = Instant::now();
    let mut out = Vec::new();
    while out.len() < n && start.elapsed() < within {
        match ch
            .basic_get(queue.into(), BasicGetOptions { no_ack: true })
            .await
            .expect("basic.get")
        {
            Some(m) => {
                let headers = m.properties.headers().clone().unwrap_or_default();
                let attempts = headers.inner().get(ATTEMPTS_HEADER).and_then(|v| match v {
                    AMQPValue::LongInt(i) => Some(i64::from(*i)),
                    AMQPValue::LongLongInt(i) => Some(*i),
                    _ => None,
                });
                let death_reason = match headers.inner().get("x-death") {
                    Some(AMQPValue::FieldArray(a)) => a.as_slice().first().and_then(|d| match d {
                        AMQPValue::FieldTable(t) => match t.inner().get("reason") {
                            Some(AMQPValue::LongString(s)) => Some(s.to_string()),
                            _ => None,
                        },
                        _ => None,
                    }),
                    _ => None,
                };
                out.push(Taken {
                    message_id: m.properties.message_id().as_ref().map(|s| s.to_string()),
                    attempts,
                    death_reason,
                    body: m.delivery.data.clone(),
                });
            }
            None => tokio::time::sleep(Duration::from_millis(25)).await,
        }
    }
    assert_eq!(out.len(), n, "messages in {queue}: {out:?}");
    tokio::time::sleep(Duration::from_millis(150)).await;
    let extra = ch
        .basic_get(queue.into(), BasicGetOptions { no_ack: true })
        .await
        .expect("basic.get");
    assert!(extra.is_none(), "more than {n} messages in {queue}");
    let _ = ch.close(200, "OK".into()).await;
    out
}

/// Waits for `cond` (at most `within`).
async fn until(what: &str, within: Duration, mut cond: impl FnMut() -> bool) {
    let start = Instant::now();
    while !cond() {
        assert!(start.elapsed() < within, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn load(c: &std::sync::atomic::AtomicU64) -> u64 {
    c.load(Ordering::Relaxed)
}

/// `(executed, duplicates, retried, dead_lettered, settle_failed)`.
fn counts(h: &ConsumerHandle) -> (u64, u64, u64, u64, u64) {
    let s = h.stats();
    (
        load(&s.executed),
        load(&s.duplicates),
        load(&s.retried),
        load(&s.dead_lettered),
        load(&s.settle_failed),
    )
}

async fn publish_json(p: &Publisher, topic: &str, msg_id: &str, d: &Deduct) {
    p.publish(topic, msg_id, serde_json::to_string(d).unwrap().as_bytes())
        .await
        .expect("publish");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outbox_relay_broker_consumer_end_to_end_one_effect_per_coupon() {
    let Some((pool, conn)) = servers().await else {
        return;
    };
    let (t, exchange, topic) = topology(&conn, "e2e").await;
    const N: usize = 24;
    const DUPLICATED: usize = 8;

    // Producer: each coupon and its deduction message commit together.
    let mut coupons = Vec::new();
    for _ in 0..N {
        let d = coupon(&pool, "UNUSED").await;
        let mut tx = pool.begin().await.unwrap();
        idem_runtime::outbox::enqueue(
            &mut tx,
            &topic,
            &format!("order-{}", d.order_id),
            &serde_json::to_value(&d).unwrap(),
        )
        .await
        .unwrap();
        tx.commit().await.unwrap();
        coupons.push(d);
    }

    // Forwarder: the relay publishes each message with publisher confirms.
    let publisher = Publisher::new(conn.clone(), &exchange);
    let relay = Relay::new(pool.clone())
        .route(topic.clone(), publisher.route())
        .poll_interval(Duration::from_millis(20))
        .spawn();
    let start = Instant::now();
    loop {
        let pending: i64 = sqlx::query_scalar(
            "SELECT COUNT(*) FROM idem_outbox WHERE topic = $1 AND status <> 'success'",
        )
        .bind(&topic)
        .fetch_one(&pool)
        .await
        .unwrap();
        if pending == 0 {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(8),
            "relay did not drain"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(load(&relay.stats().executed), N as u64);
    relay.shutdown().await;

    // The same messages published again (a republish after a lost confirm):
    // same message_id.
    for d in &coupons[..DUPLICATED] {
        publish_json(&publisher, &topic, &format!("order-{}", d.order_id), d).await;
    }

    let consumer = Consumer::new(conn.clone(), &t.queue, deducting(&pool))
        .prefetch(8)
        .spawn()
        .await
        .expect("consumer");
    let total = (N + DUPLICATED) as u64;
    until("every delivery acked", Duration::from_secs(8), || {
        let (e, d, ..) = counts(&consumer);
        e + d >= total
    })
    .await;
    let c = counts(&consumer);
    consumer.shutdown().await.expect("clean shutdown");
    assert_eq!(c, (N as u64, DUPLICATED as u64, 0, 0, 0));

    for d in &coupons {
        assert_eq!(
            deductions(&pool, d.coupon_id).await,
            1,
            "coupon {}",
            d.coupon_id
        );
        assert_eq!(status(&pool, d.coupon_id).await, "USED");
    }
    // Everything acknowledged: nothing left, nothing dead-lettered.
    assert_eq!(ready(&conn, &t.queue).await, 0);
    assert_eq!(ready(&conn, &t.dead_letter_queue).await, 0);
    teardown(&conn, &t).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consumer_dying_between_commit_and_ack_gets_a_redelivery_answered_duplicate() {
    let Some((pool, conn)) = servers().await else {
        return;
    };
    let (t, exchange, topic) = topology(&conn, "crash").await;
    let d = coupon(&pool, "UNUSED").await;
    let publisher = Publisher::new(conn.clone(), &exchange);
    publish_json(&publisher, &topic, "m-crash", &d).await;

    // Consumer 1 on its own connection: the handler commits, then the
    // process "dies" (its connection closes) before the ack goes out.
    let doomed = amqp::connect(&amqp_url()).await.expect("second connection");
    let handler = deducting(&pool);
    let kill = doomed.clone();
    let first_outcome = Arc::new(Mutex::new(None));
    let seen = first_outcome.clone();
    let c1 = Consumer::new(doomed.clone(), &t.queue, move |m: Message, d: Deduct| {
        let fut = handler(m, d);
        let kill = kill.clone();
        let seen = seen.clone();
        async move {
            let r = fut.await;
            *seen.lock().unwrap() = Some(format!("{r:?}"));
            kill.close(200, "simulated crash".into())
                .await
                .expect("close");
            r
        }
    })
    .spawn()
    .await
    .expect("consumer 1");
    until("consumer 1 to die", Duration::from_secs(5), || {
        c1.is_finished()
    })
    .await;
    let c = counts(&c1);
    let _ = c1.shutdown().await; // its connection failed: an error is expected
    assert_eq!(
        first_outcome.lock().unwrap().as_deref(),
        Some("Ok(Executed(()))")
    );
    assert_eq!(c, (0, 0, 0, 0, 1), "the ack could not be sent");
    assert_eq!(deductions(&pool, d.coupon_id).await, 1, "committed once");

    // Consumer 2: the broker redelivers; the handler answers Duplicate.
    let redelivered = Arc::new(Mutex::new(Vec::new()));
    let r = redelivered.clone();
    let handler = deducting(&pool);
    let c2 = Consumer::new(conn.clone(), &t.queue, move |m: Message, d: Deduct| {
        r.lock().unwrap().push((m.redelivered, m.key()));
        handler(m, d)
    })
    .spawn()
    .await
    .expect("consumer 2");
    until("the redelivery to be acked", Duration::from_secs(5), || {
        counts(&c2).1 == 1
    })
    .await;
    let c = counts(&c2);
    c2.shutdown().await.expect("clean shutdown");
    assert_eq!(c, (0, 1, 0, 0, 0));
    assert_eq!(
        *redelivered.lock().unwrap(),
        vec![(true, format!("{}:m-crash", t.queue))]
    );
    assert_eq!(deductions(&pool, d.coupon_id).await, 1, "still one effect");
    assert_eq!(status(&pool, d.coupon_id).await, "USED");
    assert_eq!(ready(&conn, &t.queue).await, 0, "acked");
    assert_eq!(ready(&conn, &t.dead_letter_queue).await, 0);
    teardown(&conn, &t).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn non_retryable_failures_are_dead_lettered_at_once() {
    let Some((pool, conn)) = servers().await else {
        return;
    };
    let (t, exchange, topic) = topology(&conn, "poison").await;
    let publisher = Publisher::new(conn.clone(), &exchange);

    // Illegal state: the coupon was cancelled.
    let cancelled = coupon(&pool, "CANCELLED").await;
    publish_json(&publisher, &topic, "m-illegal", &cancelled).await;
    // Unparsable payload.
    publisher
        .publish(&topic, "m-garbage", b"{not json")
        .await
        .unwrap();
    // No message_id: cannot be keyed.
    let ch = conn.create_channel().await.unwrap();
    ch.basic_publish(
        exchange.as_str().into(),
        topic.as_str().into(),
        BasicPublishOptions::default(),
        serde_json::to_string(&coupon(&pool, "UNUSED").await)
            .unwrap()
            .as_bytes(),
        BasicProperties::default(),
    )
    .await
    .unwrap();
    let _ = ch.close(200, "OK".into()).await;

    let calls = Arc::new(AtomicUsize::new(0));
    let n = calls.clone();
    let handler = deducting(&pool);
    let consumer = Consumer::new(conn.clone(), &t.queue, move |m: Message, d: Deduct| {
        n.fetch_add(1, Ordering::SeqCst);
        handler(m, d)
    })
    .backoff(Duration::from_millis(50), Duration::from_millis(100))
    .spawn()
    .await
    .unwrap();
    let mut dead = take(&conn, &t.dead_letter_queue, 3, Duration::from_secs(5)).await;
    let c = counts(&consumer);
    consumer.shutdown().await.expect("clean shutdown");

    dead.sort_by(|a, b| a.message_id.cmp(&b.message_id));
    let ids: Vec<_> = dead.iter().map(|m| m.message_id.as_deref()).collect();
    assert_eq!(ids, vec![None, Some("m-garbage"), Some("m-illegal")]);
    assert!(
        dead.iter()
            .all(|m| m.death_reason.as_deref() == Some("rejected"))
    );
    assert_eq!(dead[1].body, b"{not json");
    assert_eq!(c, (0, 0, 0, 3, 0), "rejected once each, never retried");
    assert_eq!(
        calls.load(Ordering::SeqCst),
        1,
        "only the illegal-state message reached the handler"
    );
    assert_eq!(deductions(&pool, cancelled.coupon_id).await, 0);
    assert_eq!(status(&pool, cancelled.coupon_id).await, "CANCELLED");
    assert_eq!(ready(&conn, &t.queue).await, 0);
    assert_eq!(ready(&conn, &t.retry_queue).await, 0);
    teardown(&conn, &t).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retryable_failures_back_off_through_the_retry_queue_then_succeed() {
    let Some((pool, conn)) = servers().await else {
        return;
    };
    let (t, exchange, topic) = topology(&conn, "flaky").await;
    let publisher = Publisher::new(conn.clone(), &exchange);
    let d = coupon(&pool, "UNUSED").await;
    publish_json(&publisher, &topic, "m-flaky", &d).await;

    // Fails twice (a downstream time-out), then runs the handler.
    let seen = Arc::new(Mutex::new(Vec::new()));
    let s = seen.clone();
    let handler = deducting(&pool);
    let started = Instant::now();
    let consumer = Consumer::new(conn.clone(), &t.queue, move |m: Message, d: Deduct| {
        let attempt = m.attempt;
        s.lock()
            .unwrap()
            .push((attempt, m.routing_key.clone(), started.elapsed()));
        let fut = handler(m, d);
        async move {
            if attempt < 3 {
                return Err(Error::retryable("downstream time-out"));
            }
            fut.await
        }
    })
    .max_attempts(5)
    .backoff(Duration::from_millis(200), Duration::from_secs(1))
    .spawn()
    .await
    .unwrap();
    until(
        "the third attempt to succeed",
        Duration::from_secs(8),
        || counts(&consumer).0 == 1,
    )
    .await;
    let c = counts(&consumer);
    consumer.shutdown().await.expect("clean shutdown");

    assert_eq!(c, (1, 0, 2, 0, 0));
    let seen = seen.lock().unwrap().clone();
    let attempts: Vec<_> = seen.iter().map(|(a, ..)| *a).collect();
    assert_eq!(attempts, vec![1, 2, 3]);
    // The original routing key survives the trip through the retry queue.
    assert!(seen.iter().all(|(_, rk, _)| rk == &topic), "{seen:?}");
    // Back-off: 200 ms after the first failure, 400 ms after the second.
    assert!(
        seen[1].2 - seen[0].2 >= Duration::from_millis(190),
        "{seen:?}"
    );
    assert!(
        seen[2].2 - seen[1].2 >= Duration::from_millis(390),
        "{seen:?}"
    );
    assert_eq!(deductions(&pool, d.coupon_id).await, 1);
    assert_eq!(status(&pool, d.coupon_id).await, "USED");
    for q in [&t.queue, &t.retry_queue, &t.dead_letter_queue] {
        assert_eq!(ready(&conn, q).await, 0, "{q}");
    }
    teardown(&conn, &t).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retryable_failures_forever_are_dead_lettered_after_max_attempts() {
    let Some((pool, conn)) = servers().await else {
        return;
    };
    let (t, exchange, topic) = topology(&conn, "hopeless").await;
    let publisher = Publisher::new(conn.clone(), &exchange);
    let d = coupon(&pool, "UNUSED").await;
    publish_json(&publisher, &topic, "m-hopeless", &d).await;

    let calls = Arc::new(AtomicUsize::new(0));
    let n = calls.clone();
    let consumer = Consumer::new(conn.clone(), &t.queue, move |_m: Message, _d: Deduct| {
        n.fetch_add(1, Ordering::SeqCst);
        async move { Err::<Outcome<()>, _>(Error::retryable("still down")) }
    })
    .max_attempts(3)
    .backoff(Duration::from_millis(50), Duration::from_millis(100))
    .spawn()
    .await
    .unwrap();
    let dead = take(&conn, &t.dead_letter_queue, 1, Duration::from_secs(5)).await;
    let c = counts(&consumer);
    consumer.shutdown().await.expect("clean shutdown");

    assert_eq!(dead[0].message_id.as_deref(), Some("m-hopeless"));
    // Two failed attempts recorded by the retries; the third was rejected.
    assert_eq!(dead[0].attempts, Some(2));
    assert_eq!(dead[0].death_reason.as_deref(), Some("rejected"));
    assert_eq!(calls.load(Ordering::SeqCst), 3, "bounded attempts");
    assert_eq!(c, (0, 0, 2, 1, 0));
    assert_eq!(deductions(&pool, d.coupon_id).await, 0);
    assert_eq!(status(&pool, d.coupon_id).await, "UNUSED");
    assert_eq!(ready(&conn, &t.queue).await, 0);
    assert_eq!(ready(&conn, &t.retry_queue).await, 0);
    teardown(&conn, &t).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn publisher_reports_missing_exchanges_and_unroutable_messages_and_recovers() {
    let Some(conn) = broker().await else { return };
    let exchange = unique("idem_q_noroute");
    let queue = format!("{exchange}.q");
    let publisher = Publisher::new(conn.clone(), &exchange);
    // No such exchange yet: the broker closes the channel (NOT_FOUND).
    let err = publisher.publish("t", "m-1", b"{}").await.unwrap_err();
    assert!(err.is_retryable(), "{err}");
    assert!(
        err.to_string().contains("NOT_FOUND")
            || err.to_string().contains("not found")
            || err.to_string().contains("404"),
        "{err}"
    );

    let ch = conn.create_channel().await.unwrap();
    ch.exchange_declare(
        exchange.as_str().into(),
        lapin::ExchangeKind::Topic,
        Default::default(),
        FieldTable::default(),
    )
    .await
    .unwrap();
    // The exchange exists, no queue is bound: an error, not a silent drop.
    let err = publisher.publish("t", "m-2", b"{}").await.unwrap_err();
    assert!(err.is_retryable(), "{err}");
    assert!(err.to_string().contains("unroutable"), "{err}");

    ch.queue_declare(
        queue.as_str().into(),
        QueueDeclareOptions::default(),
        FieldTable::default(),
    )
    .await
    .unwrap();
    ch.queue_bind(
        queue.as_str().into(),
        exchange.as_str().into(),
        "t".into(),
        Default::default(),
        FieldTable::default(),
    )
    .await
    .unwrap();
    // The same publisher reopened its channel and now delivers.
    publisher.publish("t", "m-3", b"{}").await.expect("routed");
    let got = take(&conn, &queue, 1, Duration::from_secs(2)).await;
    assert_eq!(got[0].message_id.as_deref(), Some("m-3"));

    let _ = ch
        .queue_delete(queue.as_str().into(), QueueDeleteOptions::default())
        .await;
    let _ = ch
        .exchange_delete(exchange.as_str().into(), ExchangeDeleteOptions::default())
        .await;
    let _ = ch.close(200, "OK".into()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prefetch_bounds_concurrency_and_shutdown_finishes_in_flight_work() {
    let Some((pool, conn)) = servers().await else {
        return;
    };
    let (t, exchange, topic) = topology(&conn, "drain").await;
    let publisher = Publisher::new(conn.clone(), &exchange);
    const N: usize = 8;
    let mut coupons = Vec::new();
    for i in 0..N {
        let d = coupon(&pool, "UNUSED").await;
        publish_json(&publisher, &topic, &format!("m-{i}"), &d).await;
        coupons.push(d);
    }

    let in_flight = Arc::new(AtomicUsize::new(0));
    let max_in_flight = Arc::new(AtomicUsize::new(0));
    let started = Arc::new(AtomicUsize::new(0));
    let (f, mx, s) = (in_flight.clone(), max_in_flight.clone(), started.clone());
    let handler = deducting(&pool);
    let consumer = Consumer::new(conn.clone(), &t.queue, move |m: Message, d: Deduct| {
        s.fetch_add(1, Ordering::SeqCst);
        let now = f.fetch_add(1, Ordering::SeqCst) + 1;
        mx.fetch_max(now, Ordering::SeqCst);
        let fut = handler(m, d);
        let f = f.clone();
        async move {
            // A slow handler: shutdown must wait for it.
            tokio::time::sleep(Duration::from_millis(150)).await;
            let r = fut.await;
            f.fetch_sub(1, Ordering::SeqCst);
            r
        }
    })
    .prefetch(2)
    .spawn()
    .await
    .unwrap();
    until("a few handlers to start", Duration::from_secs(5), || {
        started.load(Ordering::SeqCst) >= 3
    })
    .await;
    let stats = consumer.stats();
    consumer.shutdown().await.expect("clean shutdown");
    // Every handler that started finished, committed and was acked; the
    // rest is still in the queue (prefetched but unstarted work requeued).
    let started = started.load(Ordering::SeqCst);
    assert!((3..N).contains(&started), "started {started}");
    assert_eq!(load(&stats.executed) as usize, started, "acked");
    assert_eq!(load(&stats.settle_failed), 0);
    let mut done = 0;
    for d in &coupons {
        done += deductions(&pool, d.coupon_id).await;
    }
    assert_eq!(done as usize, started, "committed");
    // The broker requeues the prefetched, unstarted deliveries on close.
    let start = Instant::now();
    while (ready(&conn, &t.queue).await as usize) < N - started {
        assert!(start.elapsed() < Duration::from_secs(2), "messages lost");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(ready(&conn, &t.queue).await as usize, N - started);
    assert!(
        max_in_flight.load(Ordering::SeqCst) <= 2,
        "prefetch 2 bounds the handlers in flight"
    );
    assert_eq!(in_flight.load(Ordering::SeqCst), 0, "none left running");
    teardown(&conn, &t).await;
}
