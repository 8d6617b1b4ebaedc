//! What the Redis Streams tests share (`redis_streams/`, and the consumer
//! process `src/bin/redis_streams_consumer.rs`): the database on each
//! backend, the coupon tables, the two handlers (a state machine and a
//! record), the fan-out consumer running them, and what reads Redis back
//! (the dead-letter stream, the pending entries).
#![allow(dead_code, unused_imports)]

pub(crate) use idem_runtime::redis_streams::redis;
pub(crate) use idem_runtime::redis_streams::{
    self, Consumer, ConsumerHandle, DEAD_REASON_FIELD, Message, Publisher, Start,
};
pub(crate) use idem_runtime::{Backend, Dialect, Error, Outcome, idempotent};
pub(crate) use idem_testkit::{ids, sql, unique, wait_for};
pub(crate) use serde::{Deserialize, Serialize};
pub(crate) use sqlx::{Any, AnyPool, Transaction};
pub(crate) use std::time::{Duration, Instant};

use redis::aio::MultiplexedConnection;

/// A coupon's state, stored as `UNUSED`, `USED`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, idem_runtime::State)]
pub(crate) enum CouponState {
    Unused,
    Used,
}

/// "Use coupon `coupon_id`": the entry's payload.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub(crate) struct Use {
    pub(crate) coupon_id: i64,
    /// The handlers fail (retryable) on tries up to this one; `u32::MAX`:
    /// always.
    #[serde(default)]
    pub(crate) fail_attempts: u32,
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
        "CREATE TABLE IF NOT EXISTS idem_rs_coupon (id BIGINT PRIMARY KEY, status VARCHAR(16) NOT NULL)",
        "CREATE TABLE IF NOT EXISTS idem_rs_use (coupon_id BIGINT NOT NULL, msg_id VARCHAR(128) NOT NULL, \
         owner VARCHAR(32) NOT NULL, entry_id VARCHAR(64) NOT NULL, attempt INT NOT NULL)",
        "CREATE TABLE IF NOT EXISTS idem_rs_award (coupon_id BIGINT NOT NULL, owner VARCHAR(32) NOT NULL)",
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
            "INSERT INTO idem_rs_coupon (id, status) VALUES (?, 'UNUSED')",
        ))
        .bind(c)
        .execute(&mut *tx)
        .await
        .expect("coupon");
    }
    tx.commit().await.expect("commit");
    (first..first + n as i64).collect()
}

/// The state machine: the coupon from UNUSED to USED, one `idem_rs_use`
/// row written with it.
#[idempotent(
    key = "rs-use:{m.stream}:{m.msg_id}",
    strategy = state_machine,
    table = "idem_rs_coupon",
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
    sqlx::query(sql(
        d,
        "INSERT INTO idem_rs_use (coupon_id, msg_id, owner, entry_id, attempt) VALUES (?, ?, ?, ?, ?)",
    ))
    .bind(u.coupon_id)
    .bind(&m.msg_id)
    .bind(owner)
    .bind(&m.entry_id)
    .bind(m.attempt as i32)
    .execute(&mut **tx)
    .await?;
    fail(m, u)
}

/// The record: one `idem_rs_award` row per coupon.
#[idempotent(
    key = "rs-award:{m.stream}:{m.msg_id}",
    strategy = record,
    biz_type = "rs_award",
    fingerprint = [u.coupon_id],
)]
pub(crate) async fn award(
    tx: &mut Transaction<'_, Any>,
    m: &Message,
    u: &Use,
    d: Dialect,
    owner: &str,
) -> Result<(), Error> {
    sqlx::query(sql(
        d,
        "INSERT INTO idem_rs_award (coupon_id, owner) VALUES (?, ?)",
    ))
    .bind(u.coupon_id)
    .bind(owner)
    .execute(&mut **tx)
    .await?;
    fail(m, u)
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

/// A fan-out consumer of `stream` in `group`: the state machine and the
/// record, each acting once, as `owner` (also its name in the group).
/// Entries are claimed after 1 s idle.
pub(crate) fn consumer(
    client: &redis::Client,
    stream: &str,
    group: &str,
    pool: &AnyPool,
    d: Dialect,
    owner: &str,
) -> Consumer {
    let (p1, p2) = (pool.clone(), pool.clone());
    let (o1, o2) = (owner.to_owned(), owner.to_owned());
    Consumer::fan_out(client.clone(), stream, group)
        .subscribe("use", move |m: Message, u: Use| {
            let (pool, owner) = (p1.clone(), o1.clone());
            async move { use_coupon(&pool, &m, &u, d, &owner).await }
        })
        .subscribe("award", move |m: Message, u: Use| {
            let (pool, owner) = (p2.clone(), o2.clone());
            async move { award(&pool, &m, &u, d, &owner).await }
        })
        .name(owner)
        .backoff(Duration::from_millis(50), Duration::from_millis(200))
        .claim_after(Duration::from_secs(1))
}

/// Per coupon of `coupons`: (status, `idem_rs_use` rows, `idem_rs_award` rows).
pub(crate) async fn effects(
    pool: &AnyPool,
    d: Dialect,
    coupons: &[i64],
) -> Vec<(i64, String, i64, i64)> {
    let mut out = Vec::with_capacity(coupons.len());
    for c in coupons {
        let status: String =
            sqlx::query_scalar(sql(d, "SELECT status FROM idem_rs_coupon WHERE id = ?"))
                .bind(c)
                .fetch_one(pool)
                .await
                .expect("coupon");
        let uses: i64 = sqlx::query_scalar(sql(
            d,
            "SELECT COUNT(*) FROM idem_rs_use WHERE coupon_id = ?",
        ))
        .bind(c)
        .fetch_one(pool)
        .await
        .expect("uses");
        let awards: i64 = sqlx::query_scalar(sql(
            d,
            "SELECT COUNT(*) FROM idem_rs_award WHERE coupon_id = ?",
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
        "SELECT COUNT(*) FROM idem_rs_coupon WHERE id BETWEEN ? AND ? AND status = 'USED'",
    ))
    .bind(lo)
    .bind(hi)
    .fetch_one(pool)
    .await
    .expect("used");
    let awarded: i64 = sqlx::query_scalar(sql(
        d,
        "SELECT COUNT(DISTINCT coupon_id) FROM idem_rs_award WHERE coupon_id BETWEEN ? AND ?",
    ))
    .bind(lo)
    .bind(hi)
    .fetch_one(pool)
    .await
    .expect("awarded");
    used.min(awarded) as usize
}

/// `(doubled, lost)`: coupons of `coupons` with an effect done more than
/// once, and with one not done.
pub(crate) async fn doubled_and_lost(
    pool: &AnyPool,
    d: Dialect,
    coupons: &[i64],
) -> (usize, usize) {
    let e = effects(pool, d, coupons).await;
    let doubled = e.iter().filter(|(_, _, u, a)| *u > 1 || *a > 1).count();
    let lost = e
        .iter()
        .filter(|(_, s, u, a)| s != "USED" || *u == 0 || *a == 0)
        .count();
    (doubled, lost)
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

/// The shared Redis (`IDEM_TEST_REDIS_URL`), or `None` (skipped locally,
/// a failure with `CI=true`).
pub(crate) async fn shared_redis() -> Option<redis::Client> {
    if !idem_testkit::redis_up().await {
        return None;
    }
    Some(redis_streams::client(&idem_testkit::redis_url()).expect("redis url"))
}

/// A plain connection, for the test's own commands.
pub(crate) async fn connection(client: &redis::Client) -> MultiplexedConnection {
    client
        .get_multiplexed_async_connection()
        .await
        .expect("a Redis connection")
}

/// Writes one `Use` per coupon (message id `m-{coupon}`), `copies` times
/// each, through the publisher (a copy: the relay's retry after a lost
/// reply).
pub(crate) async fn publish(
    p: &Publisher,
    stream: &str,
    coupons: &[i64],
    copies: usize,
    with: impl Fn(i64) -> Use,
) {
    for _ in 0..copies {
        for c in coupons {
            let body = serde_json::to_vec(&with(*c)).unwrap();
            p.publish(stream, &format!("m-{c}"), &body)
                .await
                .expect("publish");
        }
    }
}

/// `XADD stream * fields…`, written by hand (entries no publisher writes).
pub(crate) async fn add_raw(client: &redis::Client, stream: &str, fields: &[(&str, &str)]) {
    let mut conn = connection(client).await;
    let mut cmd = redis::cmd("XADD");
    cmd.arg(stream).arg("*");
    for (n, v) in fields {
        cmd.arg(*n).arg(*v);
    }
    let _: String = cmd.query_async(&mut conn).await.expect("XADD");
}

/// The entries of `stream`, each as its fields (`XRANGE - +`).
pub(crate) async fn entries(client: &redis::Client, stream: &str) -> Vec<Vec<(String, String)>> {
    let mut conn = connection(client).await;
    let v: Vec<(String, Vec<(String, String)>)> = redis::cmd("XRANGE")
        .arg(stream)
        .arg("-")
        .arg("+")
        .query_async(&mut conn)
        .await
        .expect("XRANGE");
    v.into_iter().map(|(_, fields)| fields).collect()
}

/// The field `name` of an entry read by [`entries`].
pub(crate) fn field<'a>(entry: &'a [(String, String)], name: &str) -> Option<&'a str> {
    entry
        .iter()
        .find(|(n, _)| n == name)
        .map(|(_, v)| v.as_str())
}

/// Entries of `stream` pending in `group` (read, not acknowledged).
pub(crate) async fn pending(client: &redis::Client, stream: &str, group: &str) -> i64 {
    let mut conn = connection(client).await;
    let v: redis::Value = redis::cmd("XPENDING")
        .arg(stream)
        .arg(group)
        .query_async(&mut conn)
        .await
        .expect("XPENDING");
    match v {
        redis::Value::Array(items) => match items.first() {
            Some(redis::Value::Int(n)) => *n,
            _ => 0,
        },
        _ => 0,
    }
}

/// Deletes the test's keys from the shared Redis.
pub(crate) async fn delete(client: &redis::Client, keys: &[&str]) {
    let mut conn = connection(client).await;
    let _: i64 = redis::cmd("DEL")
        .arg(keys)
        .query_async(&mut conn)
        .await
        .expect("DEL");
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

/// Lets the first `after` entries' handlers return; every later one
/// blocks for good after its commit, holding its entry unacknowledged
/// (the killed consumer process: committed-but-unacknowledged entries
/// at the kill, forced, not timed).
#[derive(Debug)]
pub(crate) struct Hold {
    after: usize,
    passed: std::sync::atomic::AtomicUsize,
}

impl Hold {
    pub(crate) fn new(after: usize) -> std::sync::Arc<Hold> {
        std::sync::Arc::new(Hold {
            after,
            passed: Default::default(),
        })
    }

    /// Returns for the first `after` calls, never after.
    pub(crate) async fn pass(&self) {
        let n = self
            .passed
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst)
            + 1;
        if n > self.after {
            std::future::pending::<()>().await;
        }
    }
}

/// The plain effect, without idem: the coupon used, a use and an award
/// row written, whatever was done before (the control's handler).
pub(crate) async fn plain_effect(
    pool: &AnyPool,
    d: Dialect,
    m: &Message,
    u: &Use,
    owner: &str,
) -> Result<(), Error> {
    let mut tx = pool.begin().await?;
    sqlx::query(sql(
        d,
        "UPDATE idem_rs_coupon SET status = 'USED' WHERE id = ?",
    ))
    .bind(u.coupon_id)
    .execute(&mut *tx)
    .await?;
    sqlx::query(sql(
        d,
        "INSERT INTO idem_rs_use (coupon_id, msg_id, owner, entry_id, attempt) VALUES (?, ?, ?, ?, ?)",
    ))
    .bind(u.coupon_id)
    .bind(&m.msg_id)
    .bind(owner)
    .bind(&m.entry_id)
    .bind(m.attempt as i32)
    .execute(&mut *tx)
    .await?;
    sqlx::query(sql(
        d,
        "INSERT INTO idem_rs_award (coupon_id, owner) VALUES (?, ?)",
    ))
    .bind(u.coupon_id)
    .bind(owner)
    .execute(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(())
}

/// The consumer of the kill scenario, as `owner`, eight entries in
/// flight: the two idempotent handlers (fan-out), or with `plain` the
/// control's handler without idem; with `hold`, each entry's handler
/// passes it after its last commit.
#[allow(clippy::too_many_arguments)]
pub(crate) fn kill_scenario_consumer(
    client: &redis::Client,
    stream: &str,
    group: &str,
    pool: &AnyPool,
    d: Dialect,
    owner: &str,
    plain: bool,
    hold: Option<std::sync::Arc<Hold>>,
) -> Consumer {
    let (p1, p2) = (pool.clone(), pool.clone());
    let (o1, o2) = (owner.to_owned(), owner.to_owned());
    let built = if plain {
        Consumer::new(client.clone(), stream, group, move |m: Message, u: Use| {
            let (pool, owner, hold) = (p1.clone(), o1.clone(), hold.clone());
            async move {
                plain_effect(&pool, d, &m, &u, &owner).await?;
                if let Some(h) = hold {
                    h.pass().await;
                }
                Ok::<_, Error>(Outcome::Executed(()))
            }
        })
    } else {
        Consumer::fan_out(client.clone(), stream, group)
            .subscribe("use", move |m: Message, u: Use| {
                let (pool, owner) = (p1.clone(), o1.clone());
                async move { use_coupon(&pool, &m, &u, d, &owner).await }
            })
            .subscribe("award", move |m: Message, u: Use| {
                let (pool, owner, hold) = (p2.clone(), o2.clone(), hold.clone());
                async move {
                    let done = award(&pool, &m, &u, d, &owner).await?;
                    if let Some(h) = hold {
                        h.pass().await;
                    }
                    Ok::<_, Error>(done)
                }
            })
    };
    built
        .name(owner)
        .max_in_flight(8)
        .claim_after(Duration::from_secs(1))
}
