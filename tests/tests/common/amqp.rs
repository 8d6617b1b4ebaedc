//! What the RabbitMQ tests share (`amqp/`): the broker and database, the
//! coupon handler, topologies and queue readers. Each module uses only part
//! of it.
#![allow(dead_code)]

pub(crate) use super::brokers::{drained, until};
pub(crate) use super::coupons::{CouponState, Deduct};
pub(crate) use idem_runtime::amqp::{
    self, ATTEMPTS_HEADER, Consumer, ConsumerHandle, Message, Publisher, Topology, lapin,
};
pub(crate) use idem_runtime::{Error, Outcome, idempotent};
pub(crate) use idem_testkit::{ids, unique};
pub(crate) use lapin::Connection;
pub(crate) use lapin::options::{
    BasicGetOptions, ExchangeDeleteOptions, QueueDeclareOptions, QueueDeleteOptions,
};
pub(crate) use lapin::types::{AMQPValue, FieldTable};
pub(crate) use sqlx::{PgPool, Postgres, Transaction};
pub(crate) use std::sync::atomic::{AtomicUsize, Ordering};
pub(crate) use std::sync::{Arc, Mutex};
pub(crate) use std::time::{Duration, Instant};

pub(crate) fn amqp_url() -> String {
    std::env::var("IDEM_TEST_AMQP_URL")
        .unwrap_or_else(|_| "amqp://guest:guest@127.0.0.1:5672/%2f".into())
}

/// A connection to the local RabbitMQ, or `None` (skipped).
pub(crate) async fn broker() -> Option<Arc<Connection>> {
    match amqp::connect(&amqp_url()).await {
        Ok(c) => Some(c),
        Err(e) => {
            idem_testkit::unreachable(&format!("RabbitMQ at {}", amqp_url()), e);
            None
        }
    }
}

/// PostgreSQL with this file's tables.
pub(crate) async fn database() -> Option<PgPool> {
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
pub(crate) async fn servers() -> Option<(PgPool, Arc<Connection>)> {
    let conn = broker().await?;
    let pool = database().await?;
    Some((pool, conn))
}

#[idempotent(
    key = "mq:{m.queue}:{m.message_id}",
    strategy = state_machine,
    table = "idem_q_coupon",
    id = d.coupon_id,
    from = CouponState::Unused,
    to = CouponState::Used,
)]
pub async fn deduct(
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
pub(crate) async fn coupon(pool: &PgPool, status: &str) -> Deduct {
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

pub(crate) async fn deductions(pool: &PgPool, coupon: i64) -> i64 {
    sqlx::query_scalar("SELECT COUNT(*) FROM idem_q_deduction WHERE coupon_id = $1")
        .bind(coupon)
        .fetch_one(pool)
        .await
        .expect("count")
}

pub(crate) async fn status(pool: &PgPool, coupon: i64) -> String {
    sqlx::query_scalar("SELECT status FROM idem_q_coupon WHERE id = $1")
        .bind(coupon)
        .fetch_one(pool)
        .await
        .expect("status")
}

pub(crate) type HandlerFuture =
    std::pin::Pin<Box<dyn std::future::Future<Output = Result<Outcome<()>, Error>> + Send>>;

/// The consumer closure for `deduct`.
pub(crate) fn deducting(
    pool: &PgPool,
) -> impl Fn(Message, Deduct) -> HandlerFuture + Send + Sync + 'static {
    let pool = pool.clone();
    move |m: Message, d: Deduct| {
        let pool = pool.clone();
        Box::pin(async move { deduct(&pool, &m, &d).await })
    }
}

/// A fresh topology (unique names) bound to a fresh exchange.
pub(crate) async fn topology(conn: &Connection, name: &str) -> (Topology, String, String) {
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
pub(crate) async fn teardown(conn: &Connection, t: &Topology) {
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
pub(crate) async fn ready(conn: &Connection, queue: &str) -> u32 {
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
pub(crate) struct Taken {
    pub message_id: Option<String>,
    pub attempts: Option<i64>,
    pub death_reason: Option<String>,
    pub body: Vec<u8>,
}

/// Takes `n` messages from `queue` (acknowledged), waiting up to `within`;
/// then checks nothing more arrives for a moment.
pub(crate) async fn take(conn: &Connection, queue: &str, n: usize, within: Duration) -> Vec<Taken> {
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

/// `(executed, duplicates, retried, dead_lettered, settle_failed)`.
pub(crate) fn counts(h: &ConsumerHandle) -> (u64, u64, u64, u64, u64) {
    let s = h.stats();
    (
        s.executed(),
        s.duplicates(),
        s.retried(),
        s.dead_lettered(),
        s.settle_failed(),
    )
}

pub(crate) async fn publish_json(p: &Publisher, topic: &str, msg_id: &str, d: &Deduct) {
    p.publish(topic, msg_id, serde_json::to_string(d).unwrap().as_bytes())
        .await
        .expect("publish");
}
