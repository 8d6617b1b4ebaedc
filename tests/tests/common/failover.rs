//! What the failover targets share (`pg_failover.rs`: a standby promoted by
//! hand; `pg_patroni.rs`: Patroni's own failover): the callers that retry
//! every retryable error until their call is acknowledged, the control
//! callers that give up on the first, and what both saw.
//!
//! Each target includes this file with `#[path]` and passes its own call
//! (its handler, on its own tables) as a [`CallFn`].
#![allow(dead_code)]

use futures::future::BoxFuture;
use idem_runtime::{Error, Outcome};
use sqlx::PgPool;
use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

/// One idempotent call for a coupon, on a pool.
pub(crate) type CallFn =
    Arc<dyn Fn(PgPool, i64) -> BoxFuture<'static, Result<Outcome<()>, Error>> + Send + Sync>;

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
