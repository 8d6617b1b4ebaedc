//! What the NATS JetStream tests share (`nats/`): the server and database,
//! a handler whose effects land in a table of each test's own, topologies
//! and stream readers. Each module uses only part of it.
#![allow(dead_code, unused_imports)]

pub(crate) use super::brokers::{drained, until};
pub(crate) use futures::StreamExt;
pub(crate) use idem_runtime::nats::async_nats::jetstream::{self, Context};
pub(crate) use idem_runtime::nats::{
    self, Consumer, ConsumerHandle, DEAD_DELIVERED_HEADER, DEAD_REASON_HEADER,
    DEAD_SEQUENCE_HEADER, Message, Publisher, Topology,
};
pub(crate) use idem_runtime::{Error, Outcome, idempotent};
pub(crate) use idem_testkit::{ids, unique};
pub(crate) use serde::{Deserialize, Serialize};
pub(crate) use sqlx::{PgPool, Postgres, Transaction};
pub(crate) use std::sync::atomic::{AtomicUsize, Ordering};
pub(crate) use std::sync::{Arc, Mutex};
pub(crate) use std::time::{Duration, Instant};

pub(crate) fn nats_url() -> String {
    idem_testkit::env_setting("IDEM_TEST_NATS_URL")
        .unwrap_or_else(|| "nats://127.0.0.1:4222".into())
}

/// A JetStream context on the local nats-server, or `None` (skipped).
pub(crate) async fn server() -> Option<Context> {
    let url = nats_url();
    let js = match nats::connect(&url).await {
        Ok(js) => js,
        Err(e) => {
            idem_testkit::unreachable(&format!("nats-server at {url}"), e);
            return None;
        }
    };
    // Connected, but without JetStream the tests cannot run either.
    if let Err(e) = idem_testkit::cluster::nats::jetstream_ready(&js).await {
        idem_testkit::unreachable(&format!("JetStream on the nats-server at {url}"), e);
        return None;
    }
    Some(js)
}

/// Both servers, or `None` (skipped), and a table of this test's own for
/// the handler's effects.
pub(crate) async fn servers() -> Option<(PgPool, Context, String)> {
    let js = server().await?;
    let pool = idem_testkit::postgres(8).await?;
    let table = effects_table(&pool).await;
    Some((pool, js, table))
}

/// A fresh effects table: one row per effect of [`act`].
pub(crate) async fn effects_table(pool: &PgPool) -> String {
    let table = unique("idem_n_effect");
    let ddl = format!(
        "CREATE TABLE {table} (item BIGINT NOT NULL, message_id VARCHAR(128) NOT NULL, \
         stream_sequence BIGINT NOT NULL, delivered INT NOT NULL)"
    );
    sqlx::query(sqlx::AssertSqlSafe(ddl))
        .execute(pool)
        .await
        .expect("create the effects table");
    table
}

pub(crate) async fn drop_table(pool: &PgPool, table: &str) {
    let _ = sqlx::query(sqlx::AssertSqlSafe(format!("DROP TABLE IF EXISTS {table}")))
        .execute(pool)
        .await;
}

/// A job: one effect on `item`, with the failure the test wants.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub(crate) struct Job {
    pub item: i64,
    /// The body fails (retryable, after its write) on deliveries up to this.
    #[serde(default)]
    pub fail_until: u32,
    /// The body refuses (non-retryable).
    #[serde(default)]
    pub refuse: bool,
    /// The body takes this long (ms) before its write.
    #[serde(default)]
    pub slow_ms: u64,
}

impl Job {
    pub(crate) fn new(item: i64) -> Self {
        Job {
            item,
            ..Job::default()
        }
    }

    pub(crate) fn json(&self) -> serde_json::Value {
        serde_json::to_value(self).unwrap()
    }

    pub(crate) fn bytes(&self) -> Vec<u8> {
        serde_json::to_vec(self).unwrap()
    }
}

/// The handler under test: one row in `table` per effect, keyed by the
/// delivery's stream and `Nats-Msg-Id`.
#[idempotent(
    key = "mq:{m.stream}:{m.message_id}",
    strategy = record,
    biz_type = "nats_test",
    fingerprint = [job],
)]
pub async fn act(
    tx: &mut Transaction<'_, Postgres>,
    m: &Message,
    job: &Job,
    table: &str,
) -> Result<(), Error> {
    if job.slow_ms > 0 {
        tokio::time::sleep(Duration::from_millis(job.slow_ms)).await;
    }
    let insert = format!(
        "INSERT INTO {table} (item, message_id, stream_sequence, delivered) VALUES ($1, $2, $3, $4)"
    );
    sqlx::query(sqlx::AssertSqlSafe(insert))
        .bind(job.item)
        .bind(&m.message_id)
        .bind(m.stream_sequence as i64)
        .bind(m.delivered as i32)
        .execute(&mut **tx)
        .await?;
    if m.delivered <= job.fail_until {
        return Err(Error::retryable(format!(
            "downstream unavailable (delivery {})",
            m.delivered
        )));
    }
    if job.refuse {
        return Err(Error::permanent("downstream refused the job"));
    }
    Ok(())
}

pub(crate) type HandlerFuture =
    std::pin::Pin<Box<dyn std::future::Future<Output = Result<Outcome<()>, Error>> + Send>>;

/// The consumer closure for [`act`] on `table`.
pub(crate) fn acting(
    pool: &PgPool,
    table: &str,
) -> impl Fn(Message, Job) -> HandlerFuture + Send + Sync + 'static {
    let pool = pool.clone();
    let table = table.to_string();
    move |m: Message, job: Job| {
        let pool = pool.clone();
        let table = table.clone();
        Box::pin(async move { act(&pool, &m, &job, &table).await })
    }
}

/// Effects of `item`.
pub(crate) async fn effects(pool: &PgPool, table: &str, item: i64) -> i64 {
    sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "SELECT COUNT(*) FROM {table} WHERE item = $1"
    )))
    .bind(item)
    .fetch_one(pool)
    .await
    .expect("count effects")
}

/// All effects in `table`.
pub(crate) async fn all_effects(pool: &PgPool, table: &str) -> i64 {
    sqlx::query_scalar(sqlx::AssertSqlSafe(format!("SELECT COUNT(*) FROM {table}")))
        .fetch_one(pool)
        .await
        .expect("count effects")
}

/// `(items with two or more effects, items of `items` with none)`.
pub(crate) async fn double_and_lost(pool: &PgPool, table: &str, items: &[i64]) -> (i64, i64) {
    let rows: Vec<(i64, i64)> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "SELECT item, COUNT(*) FROM {table} GROUP BY item"
    )))
    .fetch_all(pool)
    .await
    .expect("effects per item");
    let double = rows.iter().filter(|(_, n)| *n > 1).count() as i64;
    let seen: std::collections::HashSet<i64> = rows.iter().map(|(i, _)| *i).collect();
    let lost = items.iter().filter(|i| !seen.contains(i)).count() as i64;
    (double, lost)
}

/// A fresh topology (unique stream, subject and consumer names) with
/// `tune` applied, declared (twice: the second is a no-op). A stream of
/// the same name left by an earlier run is deleted first.
pub(crate) async fn topology(
    js: &Context,
    name: &str,
    tune: impl FnOnce(Topology) -> Topology,
) -> Topology {
    let stream = unique(&format!("IDEM_N_{name}"));
    let subject = format!("idem.{}.jobs", stream.to_lowercase());
    let t = tune(Topology::new(&stream, &subject, "worker"));
    for s in [&t.stream, &t.dead_letter_stream] {
        let _ = js.delete_stream(s).await;
    }
    t.declare(js).await.expect("declare the topology");
    t.declare(js).await.expect("declare the topology twice");
    t
}

/// Deletes a test's streams (the consumer goes with its stream).
pub(crate) async fn teardown(js: &Context, t: &Topology) {
    for s in [&t.stream, &t.dead_letter_stream] {
        let _ = js.delete_stream(s).await;
    }
}

/// The messages stored in `stream`.
pub(crate) async fn stored(js: &Context, stream: &str) -> u64 {
    js.get_stream(stream)
        .await
        .expect("the stream")
        .get_info()
        .await
        .expect("stream info")
        .state
        .messages
}

/// Publishes `job` with `Nats-Msg-Id` = `msg_id`; the stream's ack.
pub(crate) async fn publish(
    js: &Context,
    subject: &str,
    msg_id: &str,
    job: &Job,
) -> jetstream::publish::PublishAck {
    Publisher::new(js.clone())
        .subject(subject)
        .publish("jobs", msg_id, &job.bytes())
        .await
        .expect("publish")
}

/// A message read from a stream (a dead-letter stream).
#[derive(Debug)]
pub(crate) struct Stored {
    pub message_id: Option<String>,
    pub delivered: Option<String>,
    pub reason: Option<String>,
    pub sequence: Option<String>,
    pub body: Vec<u8>,
}

/// Every message in `stream`, read by sequence through the stream's
/// `get_raw_message` (nothing acked, nothing consumed).
pub(crate) async fn read_all(js: &Context, stream: &str) -> Vec<Stored> {
    let s = js.get_stream(stream).await.expect("the stream");
    let info = s.get_info().await.expect("stream info");
    let mut out = Vec::new();
    if info.state.messages == 0 {
        return out;
    }
    for seq in info.state.first_sequence..=info.state.last_sequence {
        let Ok(m) = s.get_raw_message(seq).await else {
            continue;
        };
        let h = |name: &str| m.headers.get(name).map(|v| v.as_str().to_string());
        out.push(Stored {
            message_id: h("Nats-Msg-Id"),
            delivered: h(DEAD_DELIVERED_HEADER),
            reason: h(DEAD_REASON_HEADER),
            sequence: h(DEAD_SEQUENCE_HEADER),
            body: m.payload.to_vec(),
        });
    }
    out
}

/// `(received, executed, duplicates, retried, dead_lettered, settle_failed)`.
pub(crate) fn counts(h: &ConsumerHandle) -> (u64, u64, u64, u64, u64, u64) {
    let s = h.stats();
    (
        s.received(),
        s.executed(),
        s.duplicates(),
        s.retried(),
        s.dead_lettered(),
        s.settle_failed(),
    )
}
