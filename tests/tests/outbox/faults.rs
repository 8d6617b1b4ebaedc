//! End to end under real faults, on every backend: orders and their
//! deduction messages are produced together, relays drain them through
//! connections that lose commit acknowledgements (a TCP proxy in front of
//! PostgreSQL and MariaDB that lets the server commit and then drops the
//! reply; the `testing` hook on SQLite), while producer retries and two
//! concurrent relays add redeliveries. Counted in the database: no double
//! deduction, no lost one, every message delivered.
//!
//! The control runs the incident's handler — deduction committed, outbox
//! status updated afterwards, no idempotency — through the same faults and
//! catches it double-deducting.

use crate::common::coupons::{CouponState, Deduct};
use crate::common::hooks;
use idem_runtime::Dialect;
use idem_runtime::outbox::Relay;
use idem_runtime::{Backend, Error, idempotent};
use idem_testkit::proxy::FaultProxy;
use idem_testkit::{ids, sql};
use sqlx::{Any, AnyPool, Transaction};
use std::time::{Duration, Instant};

const ORDERS: i64 = 150;
const LOSS: f64 = 0.25;

/// The dialect of a pool (each test uses its own topic and id range).
fn dialect_for(pool: &AnyPool) -> Dialect {
    <Any as Backend>::pool_dialect(pool)
}

#[idempotent(
    key = "coupon-deduct:{msg.coupon_id}:{msg.order_id}",
    strategy = state_machine,
    table = "idem_x_coupon",
    id = msg.coupon_id,
    from = CouponState::Unused,
    to = CouponState::Used,
)]
async fn deduct(tx: &mut Transaction<'_, Any>, msg: &Deduct) -> Result<(), sqlx::Error> {
    // PostgreSQL numbers its placeholders; MariaDB and SQLite take `?`.
    let d = if tx.backend_name() == "PostgreSQL" {
        Dialect::Postgres
    } else {
        Dialect::Sqlite
    };
    sqlx::query(sql(
        d,
        "INSERT INTO idem_x_deduction (coupon_id, order_id) VALUES (?, ?)",
    ))
    .bind(msg.coupon_id)
    .bind(msg.order_id)
    .execute(&mut **tx)
    .await?;
    Ok(())
}

/// The incident's handler: the deduction commits in its own transaction
/// and the message is marked afterwards; no state check.
async fn deduct_without_idempotency(
    pool: &AnyPool,
    outbox_id: i64,
    msg: &Deduct,
) -> Result<(), Error> {
    let d = dialect_for(pool);
    let mut tx = pool.begin().await?;
    sqlx::query(sql(
        d,
        "INSERT INTO idem_x_deduction (coupon_id, order_id) VALUES (?, ?)",
    ))
    .bind(msg.coupon_id)
    .bind(msg.order_id)
    .execute(&mut *tx)
    .await?;
    sqlx::query(sql(
        d,
        "UPDATE idem_x_coupon SET status = 'USED' WHERE id = ?",
    ))
    .bind(msg.coupon_id)
    .execute(&mut *tx)
    .await?;
    // A lost acknowledgement surfaces here; the relay retries the message.
    idem_runtime::testing::commit(tx)
        .await
        .map_err(Error::CommitUnknown)?;
    sqlx::query(sql(
        d,
        "UPDATE idem_outbox SET status = 'success' WHERE id = ? AND status = 'pending'",
    ))
    .bind(outbox_id)
    .execute(pool)
    .await?;
    Ok(())
}

struct Faults {
    proxy: Option<FaultProxy>,
}

impl Faults {
    fn on(&self) {
        match &self.proxy {
            Some(p) => p.set_drop_fraction(LOSS),
            None => idem_runtime::testing::set_lost_ack_rate(LOSS),
        }
    }
    fn off(&self) {
        match &self.proxy {
            Some(p) => p.set_drop_fraction(0.0),
            None => idem_runtime::testing::set_lost_ack_rate(0.0),
        }
    }
    fn injected(&self) -> u64 {
        match &self.proxy {
            Some(p) => p.acks_dropped(),
            None => idem_runtime::testing::lost_acks(),
        }
    }
}

/// A direct pool (for setup and counting) and a lossy one (for the relays).
async fn pools(url: &str, lossy_server: bool) -> Option<(AnyPool, AnyPool, Faults)> {
    let direct = idem_testkit::any(url, 4).await?;
    let (lossy, proxy) = if lossy_server {
        let proxy = FaultProxy::for_url(url, 0.0).await.expect("start proxy");
        (idem_testkit::any(&proxy.url(url), 8).await?, Some(proxy))
    } else {
        (direct.clone(), None)
    };
    let d = dialect_for(&direct);
    let mut tx = direct.begin().await.expect("begin");
    if d == Dialect::Postgres {
        sqlx::query("SELECT pg_advisory_xact_lock(77005)")
            .execute(&mut *tx)
            .await
            .expect("lock");
    }
    for stmt in [
        "CREATE TABLE IF NOT EXISTS idem_x_coupon (id BIGINT PRIMARY KEY, status VARCHAR(16) NOT NULL)",
        "CREATE TABLE IF NOT EXISTS idem_x_deduction (coupon_id BIGINT NOT NULL, order_id BIGINT NOT NULL)",
    ] {
        sqlx::query(stmt)
            .execute(&mut *tx)
            .await
            .expect("create table");
    }
    tx.commit().await.expect("commit");
    Some((direct, lossy, Faults { proxy }))
}

/// Orders with their deduction messages; every third one enqueued twice
/// (a producer retry under another message id).
async fn produce(pool: &AnyPool, topic: &str) -> (Vec<i64>, i64) {
    let d = dialect_for(pool);
    let first = ids(ORDERS);
    let mut messages = 0;
    let mut tx = pool.begin().await.expect("begin");
    for c in first..first + ORDERS {
        sqlx::query(sql(
            d,
            "INSERT INTO idem_x_coupon (id, status) VALUES (?, 'UNUSED')",
        ))
        .bind(c)
        .execute(&mut *tx)
        .await
        .expect("coupon");
        let payload = serde_json::json!({"coupon_id": c, "order_id": c + 1});
        for copy in 0..if c % 3 == 0 { 2 } else { 1 } {
            let msg =
                idem_runtime::outbox::enqueue(&mut tx, topic, &format!("m-{c}-{copy}"), &payload)
                    .await
                    .expect("enqueue");
            assert!(msg.is_new());
            messages += 1;
        }
    }
    tx.commit().await.expect("commit");
    ((first..first + ORDERS).collect(), messages)
}

async fn count(pool: &AnyPool, q: &'static str, topic: &str) -> i64 {
    sqlx::query_scalar(sql(dialect_for(pool), q))
        .bind(topic)
        .fetch_one(pool)
        .await
        .expect("count")
}

async fn double_and_lost(pool: &AnyPool, coupons: &[i64]) -> (usize, usize) {
    let (mut double, mut lost) = (0, 0);
    for c in coupons {
        let n: i64 = sqlx::query_scalar(sql(
            dialect_for(pool),
            "SELECT COUNT(*) FROM idem_x_deduction WHERE coupon_id = ?",
        ))
        .bind(*c)
        .fetch_one(pool)
        .await
        .expect("count");
        double += usize::from(n > 1);
        lost += usize::from(n == 0);
    }
    (double, lost)
}

fn relay(lossy: &AnyPool, topic: &str, owner: &str, idempotent: bool) -> Relay<Any> {
    let relay = Relay::new(lossy.clone());
    let relay = if idempotent {
        relay.route(topic.to_string(), |d, m: Deduct| async move {
            deduct(d.source(), &m).await
        })
    } else {
        relay.route(topic.to_string(), |d, m: Deduct| async move {
            deduct_without_idempotency(d.pool(), d.message().id, &m).await?;
            Ok(idem_runtime::Outcome::Executed(()))
        })
    };
    relay
        .owner(format!("{owner}-{}", ids(1)))
        .lease(Duration::from_millis(1_000))
        .backoff(Duration::from_millis(5), Duration::from_millis(50))
        .max_attempts(100)
        .poll_interval(Duration::from_millis(10))
        .batch_size(16)
        .concurrency(4)
}

/// Runs two relays until nothing of `topic` is pending; returns (double,
/// lost, injected faults).
async fn run(url: &str, server: bool, idempotent: bool) -> Option<(usize, usize, u64)> {
    let (direct, lossy, faults) = pools(url, server).await?;
    let topic = format!(
        "faults.{}.{}",
        if idempotent { "idem" } else { "naive" },
        ids(1)
    );
    let (coupons, messages) = produce(&direct, &topic).await;
    faults.on();
    let relays = [
        relay(&lossy, &topic, "a", idempotent).spawn(),
        relay(&lossy, &topic, "b", idempotent).spawn(),
    ];
    let start = Instant::now();
    while count(
        &direct,
        "SELECT COUNT(*) FROM idem_outbox WHERE topic = ? AND status = 'pending'",
        &topic,
    )
    .await
        > 0
    {
        assert!(
            start.elapsed() < Duration::from_secs(90),
            "the outbox did not drain"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    faults.off();
    for r in relays {
        r.shutdown().await;
    }
    assert_eq!(
        count(
            &direct,
            "SELECT COUNT(*) FROM idem_outbox WHERE topic = ? AND status = 'success'",
            &topic
        )
        .await,
        messages,
        "every message delivered, none dead-lettered"
    );
    let (double, lost) = double_and_lost(&direct, &coupons).await;
    Some((double, lost, faults.injected()))
}

async fn idempotent_under_faults(url: &str, server: bool) {
    let Some((double, lost, injected)) = run(url, server, true).await else {
        return;
    };
    assert!(injected > 0, "faults were injected");
    assert_eq!(
        (double, lost),
        (0, 0),
        "no double, no lost deduction under {injected} lost acknowledgements"
    );
}

async fn control_catches_the_incident(url: &str, server: bool) {
    let Some((double, lost, injected)) = run(url, server, false).await else {
        return;
    };
    assert!(injected > 0);
    assert_eq!(lost, 0);
    assert!(
        double > 0,
        "the retry after a lost acknowledgement must double-deduct without idempotency"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_lost_acks_and_redeliveries_no_double_no_lost() {
    let _hooks = hooks::shared().await;
    idempotent_under_faults(&idem_testkit::postgres_url(), true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_control_incident_handler_double_deducts() {
    let _hooks = hooks::shared().await;
    control_catches_the_incident(&idem_testkit::postgres_url(), true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_lost_acks_and_redeliveries_no_double_no_lost() {
    let _hooks = hooks::shared().await;
    idempotent_under_faults(&idem_testkit::mysql_url(), true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_control_incident_handler_double_deducts() {
    let _hooks = hooks::shared().await;
    control_catches_the_incident(&idem_testkit::mysql_url(), true).await;
}

/// SQLite has no network to lose an acknowledgement on: the `testing`
/// hook loses it in-process. Both SQLite cases run in one test, since the
/// hook is process-wide (and no other test of the binary that commits
/// through idem runs meanwhile: `common::hooks`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_lost_acks_and_redeliveries_no_double_no_lost_and_control() {
    let _hooks = hooks::exclusive().await;
    let url = idem_testkit::sqlite_url();
    idempotent_under_faults(&url, false).await;
    control_catches_the_incident(&url, false).await;
}
