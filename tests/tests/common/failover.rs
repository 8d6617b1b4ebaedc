//! What the failover tests share (`clusters/pg_failover.rs`: a standby
//! promoted by hand; `clusters/pg_patroni.rs`: Patroni's own failover): the
//! handlers and their tables (on each test's own cluster), the callers that
//! retry every retryable error until their call is acknowledged, the
//! control callers that give up on the first, and what both saw. The
//! callers make a [`CallFn`] ([`deduct_call`]).
#![allow(dead_code)]

use super::coupons::CouponState;
use futures::future::BoxFuture;
use idem_runtime::outbox::Delivery;
use idem_runtime::{Error, Outcome, idempotent};
use serde::{Deserialize, Serialize};
use sqlx::{PgConnection, PgPool, Postgres, Transaction};
use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

/// One idempotent call for a coupon, on a pool.
pub(crate) type CallFn =
    Arc<dyn Fn(PgPool, i64) -> BoxFuture<'static, Result<Outcome<()>, Error>> + Send + Sync>;

/// Each body's time inside its transaction: calls and deliveries are in
/// flight (some in their COMMIT) at the fault.
pub(crate) const BODY: Duration = Duration::from_millis(15);

/// The tables of the handlers below, created on each cluster (once).
pub(crate) const TABLES: [&str; 3] = [
    "CREATE TABLE idem_t_failover_coupon (id BIGINT PRIMARY KEY, status VARCHAR(16) NOT NULL)",
    "CREATE TABLE idem_t_failover_deduction (coupon_id BIGINT NOT NULL)",
    "CREATE TABLE idem_t_failover_parcel (parcel BIGINT NOT NULL, msg_id TEXT NOT NULL)",
];

/// The callers' message: a coupon to deduct.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Deduct {
    pub(crate) coupon_id: i64,
}

/// The relay's message: a parcel to ship.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Ship {
    pub(crate) parcel: i64,
}

#[idempotent(
    key = "failover-deduct:{msg.coupon_id}",
    strategy = state_machine,
    table = "idem_t_failover_coupon",
    id = msg.coupon_id,
    from = CouponState::Unused,
    to = CouponState::Used,
)]
pub(crate) async fn deduct(
    tx: &mut Transaction<'_, Postgres>,
    msg: &Deduct,
) -> Result<(), sqlx::Error> {
    sqlx::query("INSERT INTO idem_t_failover_deduction (coupon_id) VALUES ($1)")
        .bind(msg.coupon_id)
        .execute(&mut **tx)
        .await?;
    tokio::time::sleep(BODY).await;
    Ok(())
}

#[idempotent(key = "failover-ship:{d.topic}:{d.msg_id}", strategy = record, biz_type = "failover_ship")]
pub(crate) async fn ship(
    tx: &mut PgConnection,
    d: &Delivery<Postgres>,
    s: &Ship,
) -> Result<i64, sqlx::Error> {
    sqlx::query("INSERT INTO idem_t_failover_parcel (parcel, msg_id) VALUES ($1, $2)")
        .bind(s.parcel)
        .bind(&d.msg_id)
        .execute(&mut *tx)
        .await?;
    tokio::time::sleep(BODY).await;
    Ok(s.parcel)
}

/// The call the workers make: a coupon deducted.
pub(crate) fn deduct_call() -> CallFn {
    Arc::new(|pool, coupon| {
        Box::pin(async move { deduct(&pool, &Deduct { coupon_id: coupon }).await })
    })
}

/// Waits (30 s at most) until a third of the `calls` callers' calls and of
/// the relay's `messages` (counted by `executed`, its counter) are done,
/// the moment of the fault; how many of each were. `what` names the run,
/// `logs` the cluster's log tails, in the failure message.
pub(crate) async fn a_third_done(
    calls: &Calls,
    executed: impl Fn() -> u64,
    (callers, messages): (u64, u64),
    what: &str,
    logs: impl Fn() -> String,
) -> (u64, u64) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while calls.done.load(Ordering::Relaxed) < callers / 3 || executed() < messages / 3 {
        assert!(
            Instant::now() < deadline,
            "{what}: no progress before the fault\n{}",
            logs()
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    (calls.done.load(Ordering::Relaxed), executed())
}

/// What the callers saw.
#[derive(Debug, Default)]
pub(crate) struct Calls {
    /// Attempts, first tries included.
    pub attempts: AtomicU64,
    /// Retried errors by kind (and SQLSTATE or connection error): how
    /// many, the first and the last seen.
    pub retried: Mutex<BTreeMap<String, (u64, Instant, Instant)>>,
    /// Non-retryable errors (a misclassification: none expected).
    pub fatal: Mutex<Vec<String>>,
    /// Coupons whose call was acknowledged (`Executed` or `Duplicate`).
    pub acked: Mutex<Vec<i64>>,
    /// When the primary was killed or frozen (set by the test).
    pub fault: OnceLock<Instant>,
    /// The first acknowledgement of an attempt begun after the fault: the
    /// callers' time to recover.
    pub recovered: Mutex<Option<Instant>>,
    /// The control callers' coupons given up after an error.
    pub given_up: AtomicU64,
    /// Calls done (acknowledged or given up), for the fault's moment.
    pub done: AtomicU64,
}

/// The driver's error in `e`'s chain, if any (a handler body's error
/// wraps it).
pub(crate) fn sqlx_error<'a>(e: &'a (dyn std::error::Error + 'static)) -> Option<&'a sqlx::Error> {
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(c) = cur {
        if let Some(s) = c.downcast_ref::<sqlx::Error>() {
            return Some(s);
        }
        cur = c.source();
    }
    None
}

/// What the server or the driver said: `25006`, `io UnexpectedEof`, …
pub(crate) fn detail(e: &(dyn std::error::Error + 'static)) -> String {
    match sqlx_error(e) {
        Some(sqlx::Error::Database(db)) => db.code().map(|c| c.into_owned()).unwrap_or_default(),
        Some(sqlx::Error::Io(io)) => format!("io {:?}", io.kind()),
        Some(sqlx::Error::Protocol(_)) => "protocol".into(),
        Some(sqlx::Error::PoolTimedOut) => "pool_timed_out".into(),
        Some(other) => format!("{other}").chars().take(40).collect(),
        None => format!("{e}").chars().take(60).collect(),
    }
}

/// An error's kind with what the server or the driver said: `database:
/// 25006`, `commit_unknown: io UnexpectedEof`, …
pub(crate) fn describe(e: &Error) -> String {
    format!("{}: {}", e.kind(), detail(e))
}

impl Calls {
    fn retried_once(&self, kind: String) {
        let now = Instant::now();
        let mut retried = self.retried.lock().expect("retried");
        let seen = retried.entry(kind).or_insert((0, now, now));
        seen.0 += 1;
        seen.2 = now;
    }

    /// Calls `call` for `coupon`, retrying every retryable error until the
    /// call is acknowledged (for at most `limit`); with `give_up`, one try
    /// only.
    async fn run(&self, call: &CallFn, pool: &PgPool, coupon: i64, give_up: bool, limit: Duration) {
        let start = Instant::now();
        let mut wait = Duration::from_millis(20);
        loop {
            self.attempts.fetch_add(1, Ordering::Relaxed);
            let begun = Instant::now();
            match call(pool.clone(), coupon).await {
                Ok(Outcome::Executed(()) | Outcome::Duplicate(_)) => {
                    self.acked.lock().expect("acked").push(coupon);
                    if self.fault.get().is_some_and(|k| begun > *k) {
                        let now = Instant::now();
                        let mut first = self.recovered.lock().expect("recovered");
                        if first.is_none_or(|t| now < t) {
                            *first = Some(now);
                        }
                    }
                    break;
                }
                Err(_) if give_up => {
                    self.given_up.fetch_add(1, Ordering::Relaxed);
                    break;
                }
                Err(e) if e.is_retryable() => {
                    self.retried_once(describe(&e));
                    assert!(
                        start.elapsed() < limit,
                        "coupon {coupon} still failing after {limit:?}: {e}"
                    );
                    tokio::time::sleep(wait).await;
                    wait = (wait * 2).min(Duration::from_millis(200));
                }
                Err(e) => {
                    self.fatal
                        .lock()
                        .expect("fatal")
                        .push(format!("coupon {coupon}: {e:?}"));
                    break;
                }
            }
        }
        self.done.fetch_add(1, Ordering::Relaxed);
    }
}

/// Who calls, and how: `n` tasks taking coupons from a queue, each
/// retried for at most `limit` (or tried once, `give_up`).
#[derive(Clone)]
pub(crate) struct Workers {
    pub call: CallFn,
    pub pool: PgPool,
    pub calls: Arc<Calls>,
    pub limit: Duration,
}

impl Workers {
    /// Runs `n` tasks taking coupons from `queue`. The last quarter waits
    /// for the fault (`faulted`): callers are still at work when the
    /// primary goes, however fast they are next to the relay.
    pub(crate) fn spawn(
        &self,
        n: usize,
        queue: Vec<i64>,
        give_up: bool,
        faulted: &tokio::sync::watch::Receiver<bool>,
    ) -> Vec<tokio::task::JoinHandle<()>> {
        let gate = queue.len() * 3 / 4;
        let queue = Arc::new(Mutex::new(VecDeque::from_iter(
            queue.into_iter().enumerate(),
        )));
        (0..n)
            .map(|_| {
                let (w, queue) = (self.clone(), queue.clone());
                let mut faulted = faulted.clone();
                tokio::spawn(async move {
                    loop {
                        let next = queue.lock().expect("queue").pop_front();
                        let Some((n, coupon)) = next else { break };
                        if n >= gate {
                            faulted.wait_for(|k| *k).await.expect("the test runs");
                        }
                        w.calls
                            .run(&w.call, &w.pool, coupon, give_up, w.limit)
                            .await;
                    }
                })
            })
            .collect()
    }
}

/// A `SELECT COUNT(*)`-like query's answer.
pub(crate) async fn count(pool: &PgPool, query: &str) -> i64 {
    sqlx::query_scalar(sqlx::AssertSqlSafe(query.to_owned()))
        .fetch_one(pool)
        .await
        .unwrap_or_else(|e| panic!("{query}: {e}"))
}

/// What the new primary holds after a run.
#[derive(Debug)]
pub(crate) struct Counted {
    /// Retrying callers' coupons deducted more than once / never.
    pub(crate) double: i64,
    pub(crate) lost: i64,
    /// Control callers' coupons never deducted.
    pub(crate) given_up_lost: i64,
    /// Acknowledged calls whose deduction is not there.
    pub(crate) acked_missing: i64,
    /// Messages whose effect is there more than once / not at all.
    pub(crate) msg_double: i64,
    pub(crate) msg_lost: i64,
    /// The topic's outbox rows by status.
    pub(crate) success: i64,
    pub(crate) failed: i64,
    pub(crate) pending: i64,
}

/// Counts on `pool` the `calls` retrying callers' coupons from `first`,
/// the `give_up` control callers' after them, the `acked` ones, and the
/// messages of `topic` with their parcels.
pub(crate) async fn counted(
    pool: &PgPool,
    first: i64,
    (calls, give_up): (i64, i64),
    acked: &[i64],
    topic: &str,
) -> Counted {
    let per_coupon = |from: i64, to: i64, having: &str| {
        format!(
            "SELECT COUNT(*) FROM (SELECT c.id FROM idem_t_failover_coupon c \
             LEFT JOIN idem_t_failover_deduction d ON d.coupon_id = c.id \
             WHERE c.id BETWEEN {from} AND {to} GROUP BY c.id HAVING {having}) t"
        )
    };
    let (last, last_control) = (first + calls - 1, first + calls + give_up - 1);
    let acked_missing: i64 = sqlx::query_scalar(
        "SELECT COUNT(*) FROM unnest($1::bigint[]) a(id) \
         WHERE NOT EXISTS (SELECT 1 FROM idem_t_failover_deduction d WHERE d.coupon_id = a.id)",
    )
    .bind(acked)
    .fetch_one(pool)
    .await
    .expect("acknowledged calls");
    let per_msg = |having: &str| {
        format!(
            "SELECT COUNT(*) FROM (SELECT o.msg_id FROM idem_outbox o \
             LEFT JOIN idem_t_failover_parcel p ON p.msg_id = o.msg_id \
             WHERE o.topic = '{topic}' GROUP BY o.msg_id HAVING {having}) t"
        )
    };
    let status = |st: &str| {
        format!("SELECT COUNT(*) FROM idem_outbox WHERE topic = '{topic}' AND status = '{st}'")
    };
    Counted {
        double: count(pool, &per_coupon(first, last, "COUNT(d.coupon_id) > 1")).await,
        lost: count(pool, &per_coupon(first, last, "COUNT(d.coupon_id) = 0")).await,
        given_up_lost: count(
            pool,
            &per_coupon(last + 1, last_control, "COUNT(d.coupon_id) = 0"),
        )
        .await,
        acked_missing,
        msg_double: count(pool, &per_msg("COUNT(p.msg_id) > 1")).await,
        msg_lost: count(pool, &per_msg("COUNT(p.msg_id) = 0")).await,
        success: count(pool, &status("success")).await,
        failed: count(pool, &status("failed")).await,
        pending: count(pool, &status("pending")).await,
    }
}

/// Each kind of retried error: how many, and when (seconds after `fault`).
pub(crate) fn timeline(
    retried: &BTreeMap<String, (u64, Instant, Instant)>,
    fault: Instant,
) -> Vec<String> {
    let since = |t: Instant| t.saturating_duration_since(fault).as_secs_f64();
    retried
        .iter()
        .map(|(k, (n, first, last))| {
            format!("{k} x{n} at {:.2}-{:.2}s", since(*first), since(*last))
        })
        .collect()
}
