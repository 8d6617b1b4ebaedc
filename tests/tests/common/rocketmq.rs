//! What the RocketMQ tests share (`rocketmq/`): the database on each
//! backend, the coupon tables, the two handlers (a state machine and a
//! record), a fan-out consumer of both, and what reads the broker back
//! (a topic's messages, such as its dead letters).
#![allow(dead_code, unused_imports)]

pub(crate) use idem_runtime::rocketmq::{
    self, Consumer, ConsumerHandle, DEAD_REASON_PROPERTY, KeyFrom, Message, Publisher,
};
pub(crate) use idem_runtime::{Backend, Dialect, Error, Outcome, idempotent};
pub(crate) use idem_testkit::{ids, sql, unique, wait_for};
pub(crate) use serde::{Deserialize, Serialize};
pub(crate) use sqlx::{Any, AnyPool, Transaction};
pub(crate) use std::time::{Duration, Instant};

/// A coupon's state, stored as `UNUSED`, `USED`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, idem_runtime::State)]
pub(crate) enum CouponState {
    Unused,
    Used,
}

/// "Use coupon `coupon_id`": the record's payload.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub(crate) struct Use {
    pub(crate) coupon_id: i64,
    /// The handlers fail (retryable) on attempts up to this one.
    #[serde(default)]
    pub(crate) fail_attempts: u32,
    /// The handlers take this long (ms) before their write.
    #[serde(default)]
    pub(crate) slow_ms: u64,
}

/// The database of `backend` (`postgres`, `mysql`, `sqlite`) with idem's
/// tables and the coupon tables, or `None` (skipped).
pub(crate) async fn database(backend: &str) -> Option<(AnyPool, Dialect)> {
    let url = match backend {
        "postgres" => idem_testkit::postgres_url(),
        "mysql" => idem_testkit::mysql_url(),
        _ => idem_testkit::sqlite_url(),
    };
    let pool = idem_testkit::any(&url, 8).await?;
    let d = <Any as Backend>::pool_dialect(&pool);
    for ddl in [
        "CREATE TABLE IF NOT EXISTS idem_r_coupon (id BIGINT PRIMARY KEY, status VARCHAR(16) NOT NULL)",
        "CREATE TABLE IF NOT EXISTS idem_r_use (coupon_id BIGINT NOT NULL, msg_id VARCHAR(128) NOT NULL, \
         owner VARCHAR(32) NOT NULL, queue_id INT NOT NULL, queue_offset BIGINT NOT NULL, attempt INT NOT NULL)",
        "CREATE TABLE IF NOT EXISTS idem_r_award (coupon_id BIGINT NOT NULL, owner VARCHAR(32) NOT NULL)",
    ] {
        sqlx::query(ddl).execute(&pool).await.expect("create table");
    }
    Some((pool, d))
}

/// `n` unused coupons.
pub(crate) async fn coupons(pool: &AnyPool, d: Dialect, n: usize) -> Vec<i64> {
    let first = ids(n as i64);
    let mut tx = pool.begin().await.expect("begin");
    for c in first..first + n as i64 {
        sqlx::query(sql(
            d,
            "INSERT INTO idem_r_coupon (id, status) VALUES (?, 'UNUSED')",
        ))
        .bind(c)
        .execute(&mut *tx)
        .await
        .expect("coupon");
    }
    tx.commit().await.expect("commit");
    (first..first + n as i64).collect()
}

/// The state machine: the coupon from UNUSED to USED, one `idem_r_use`
/// row written with it.
#[idempotent(
    key = "rocketmq-use:{m.topic}:{m.msg_id}",
    strategy = state_machine,
    table = "idem_r_coupon",
    id = u.coupon_id,
    from = CouponState::Unused,
    to = CouponState::Used,
)]
pub(crate) async fn use_coupon(
    tx: &mut Transaction<'_, Any>,
    m: &Message,
    u: &Use,
    d: Dialect,
    owner: &str,
) -> Result<(), Error> {
    effect(u).await?;
    sqlx::query(sql(
        d,
        "INSERT INTO idem_r_use (coupon_id, msg_id, owner, queue_id, queue_offset, attempt) VALUES (?, ?, ?, ?, ?, ?)",
    ))
    .bind(u.coupon_id)
    .bind(&m.msg_id)
    .bind(owner)
    .bind(m.queue_id)
    .bind(m.queue_offset)
    .bind(m.attempt as i32)
    .execute(&mut **tx)
    .await?;
    fail(m, u)
}

/// The record: one `idem_r_award` row per coupon.
#[idempotent(
    key = "rocketmq-award:{m.topic}:{m.msg_id}",
    strategy = record,
    biz_type = "rocketmq_award",
    fingerprint = [u.coupon_id],
)]
pub(crate) async fn award(
    tx: &mut Transaction<'_, Any>,
    m: &Message,
    u: &Use,
    d: Dialect,
    owner: &str,
) -> Result<(), Error> {
    effect(u).await?;
    sqlx::query(sql(
        d,
        "INSERT INTO idem_r_award (coupon_id, owner) VALUES (?, ?)",
    ))
    .bind(u.coupon_id)
    .bind(owner)
    .execute(&mut **tx)
    .await?;
    fail(m, u)
}

async fn effect(u: &Use) -> Result<(), Error> {
    if u.slow_ms > 0 {
        tokio::time::sleep(Duration::from_millis(u.slow_ms)).await;
    }
    Ok(())
}

fn fail(m: &Message, u: &Use) -> Result<(), Error> {
    if m.attempt <= u.fail_attempts {
        return Err(Error::retryable(format!(
            "downstream unavailable (attempt {})",
            m.attempt
        )));
    }
    Ok(())
}

/// A fan-out consumer of `topic` in `group`: the state machine and the
/// record, each acting once, as `owner`.
pub(crate) fn consumer(
    namesrv: &str,
    group: &str,
    topic: &str,
    pool: &AnyPool,
    d: Dialect,
    owner: &str,
) -> Consumer {
    let (p1, p2) = (pool.clone(), pool.clone());
    let (o1, o2) = (owner.to_owned(), owner.to_owned());
    Consumer::fan_out(namesrv, group, topic)
        .subscribe("use", move |m: Message, u: Use| {
            let (pool, owner) = (p1.clone(), o1.clone());
            async move { use_coupon(&pool, &m, &u, d, &owner).await }
        })
        .subscribe("award", move |m: Message, u: Use| {
            let (pool, owner) = (p2.clone(), o2.clone());
            async move { award(&pool, &m, &u, d, &owner).await }
        })
        .backoff(Duration::from_millis(50), Duration::from_millis(200))
        .commit_interval(Duration::from_millis(100))
}

/// Publishes one `Use` per coupon (message id `m-{coupon}`), `copies`
/// times each.
pub(crate) async fn publish(
    p: &Publisher,
    topic: &str,
    coupons: &[i64],
    copies: usize,
    with: impl Fn(i64) -> Use,
) {
    for _ in 0..copies {
        for c in coupons {
            let body = serde_json::to_vec(&with(*c)).unwrap();
            p.publish(topic, &format!("m-{c}"), &body)
                .await
                .expect("publish");
        }
    }
}

/// `(received, executed, duplicates, retried, dead, settle_failed)`.
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

/// Up to `expect` messages of `topic` read from its start by a group of
/// their own: (body, the named property). Waits up to 60 s: three times
/// the client's rebalance interval (20 s), so that a first rebalance that
/// finds no queue (the group's heartbeat not yet at the broker) is
/// followed by another within the wait.
pub(crate) async fn read_topic(
    cluster: &idem_testkit::cluster::rocketmq::RocketMq,
    topic: &str,
    property: &str,
    expect: usize,
) -> Vec<(Vec<u8>, String)> {
    let out = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let o = out.clone();
    let prop = property.to_owned();
    let reader = Consumer::new(
        cluster.namesrv_addr(),
        unique("idem_r_reader"),
        topic,
        move |m: Message, _: serde::de::IgnoredAny| {
            let v = m.property(&prop).unwrap_or_default().to_owned();
            o.lock().unwrap().push((m.body.clone(), v));
            async move { Ok::<_, Error>(Outcome::Executed(())) }
        },
    )
    .key_from(KeyFrom::msg_id())
    .client_options(cluster.client_options())
    .spawn()
    .await
    .expect("a reader");
    let start = Instant::now();
    while out.lock().unwrap().len() < expect && start.elapsed() < Duration::from_secs(60) {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    reader.shutdown().await.expect("reader shutdown");
    out.lock().unwrap().clone()
}
/// Per coupon of `coupons`: (status, `idem_r_use` rows, `idem_r_award` rows).
pub(crate) async fn effects(
    pool: &AnyPool,
    d: Dialect,
    coupons: &[i64],
) -> Vec<(i64, String, i64, i64)> {
    let mut out = Vec::with_capacity(coupons.len());
    for c in coupons {
        let status: String =
            sqlx::query_scalar(sql(d, "SELECT status FROM idem_r_coupon WHERE id = ?"))
                .bind(c)
                .fetch_one(pool)
                .await
                .expect("coupon");
        let uses: i64 = sqlx::query_scalar(sql(
            d,
            "SELECT COUNT(*) FROM idem_r_use WHERE coupon_id = ?",
        ))
        .bind(c)
        .fetch_one(pool)
        .await
        .expect("uses");
        let awards: i64 = sqlx::query_scalar(sql(
            d,
            "SELECT COUNT(*) FROM idem_r_award WHERE coupon_id = ?",
        ))
        .bind(c)
        .fetch_one(pool)
        .await
        .expect("awards");
        out.push((*c, status, uses, awards));
    }
    out
}

/// Coupons of `coupons` with both effects done (used and awarded).
pub(crate) async fn done(pool: &AnyPool, d: Dialect, coupons: &[i64]) -> usize {
    let (lo, hi) = (coupons[0], coupons[coupons.len() - 1]);
    let used: i64 = sqlx::query_scalar(sql(
        d,
        "SELECT COUNT(*) FROM idem_r_coupon WHERE id BETWEEN ? AND ? AND status = 'USED'",
    ))
    .bind(lo)
    .bind(hi)
    .fetch_one(pool)
    .await
    .expect("used");
    let awarded: i64 = sqlx::query_scalar(sql(
        d,
        "SELECT COUNT(DISTINCT coupon_id) FROM idem_r_award WHERE coupon_id BETWEEN ? AND ?",
    ))
    .bind(lo)
    .bind(hi)
    .fetch_one(pool)
    .await
    .expect("awarded");
    used.min(awarded) as usize
}

/// Asserts every coupon used once and awarded once: nothing doubled,
/// nothing lost.
pub(crate) async fn assert_once(pool: &AnyPool, d: Dialect, coupons: &[i64]) {
    for (c, status, uses, awards) in effects(pool, d, coupons).await {
        assert_eq!(
            (status.as_str(), uses, awards),
            ("USED", 1, 1),
            "coupon {c}: (status, uses, awards)"
        );
    }
}
