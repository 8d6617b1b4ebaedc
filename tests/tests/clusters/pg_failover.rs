//! A real PostgreSQL failover under load: a primary and its standby on
//! ports of their own behind haproxy (`idem_testkit::cluster::pg_standby`),
//! idem's calls and a relay running through haproxy, the primary killed
//! with SIGKILL mid-run, the standby promoted a second later. Clients see
//! refused connections, then the read-only standby (`25006`), then the new
//! primary.
//!
//! - Calls: coupons deducted (`state_machine`) by workers that retry each
//!   message until it is `Executed` or `Duplicate`, on every retryable
//!   error (`CommitUnknown` included), as a broker consumer or an outbox
//!   would.
//! - A relay drains an outbox of messages handled by a `record` handler
//!   that marks its message in its own transaction.
//!
//! With a synchronous standby, counted in the database of the promoted
//! standby: every coupon deducted exactly once (double 0, lost 0), every
//! acknowledged call's effect there, every message's effect exactly once,
//! every outbox row a `success`, no dead letter, no message that waited
//! out its lease.
//!
//! Controls: in the same run, callers that treat an error as final lose
//! the effects of their messages (the test sees loss); and the same
//! harness with an asynchronous standby reports how many acknowledged
//! effects vanished with the primary (not asserted: often 0 in a run).
//!
//! What the real failover showed: the relay's bookkeeping of an attempt
//! that failed under the dead primary (four tries within 120 ms) gave up
//! and left the message to wait out its lease (`reclaimed` 5 of 240, the
//! drain 30 s instead of 2). The bookkeeping now retries transient errors
//! for half the lease; the regression test on the shared server,
//! `{postgres,mariadb}::bookkeeping_refused_by_a_read_only_window_is_retried_not_left_to_the_lease`,
//! failed before the fix (PostgreSQL and MariaDB, whose read-only answer
//! is `1792`).
//!
//! Also seen, and harmless: the relay's claim commits with
//! `synchronous_commit = off` (the PostgreSQL backend's claim prelude), so
//! a claim the old primary acknowledged may be missing on the promoted
//! standby. That attempt's bookkeeping then finds the message no longer
//! held (`stale`, 1 to 6 a run; 0 in three runs with the prelude removed)
//! and the message is claimed again; the handler's outbox update is fenced
//! by the lease, so nothing runs twice in the database.

use crate::common::failover::{
    Calls, Counted, Ship, TABLES, Workers, a_third_done, count, counted, deduct_call, ship,
    timeline,
};

use idem_runtime::idempotent;
use idem_runtime::outbox::{Delivery, Relay};
use idem_testkit::cluster::pg_standby::{PgStandby, Replication};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

/// Coupons deducted by the retrying callers.
const CALLS: i64 = 240;
/// Coupons of the control callers, who give up on the first error.
const GIVE_UP_CALLS: i64 = 60;
const CALL_WORKERS: usize = 6;
const GIVE_UP_WORKERS: usize = 2;
/// Messages the relay drains.
const MESSAGES: i64 = 240;
/// Between the kill and the promotion: clients meet the dead primary,
/// then haproxy's switch to the read-only standby.
const PROMOTE_AFTER: Duration = Duration::from_millis(1200);
/// The relay's lease with the synchronous standby: a message left to it
/// would hold up the drain this long (and be counted in `reclaimed`).
const LEASE: Duration = Duration::from_secs(30);
/// With the asynchronous standby: a delivery whose success the standby
/// never received is pending under its lease on the new primary, and is
/// delivered again once it runs out.
const ASYNC_LEASE: Duration = Duration::from_secs(5);
const TOPIC: &str = "pgf.ship";

async fn setup(cluster: &PgStandby) {
    let pool = cluster.pool(2);
    for ddl in TABLES {
        sqlx::query(ddl).execute(&pool).await.expect("create table");
    }
    sqlx::query(
        "INSERT INTO idem_t_failover_coupon (id, status) \
         SELECT g, 'UNUSED' FROM generate_series(1, $1::bigint) g",
    )
    .bind(CALLS + GIVE_UP_CALLS)
    .execute(&pool)
    .await
    .expect("coupons");
    let mut tx = pool.begin().await.expect("begin");
    for n in 1..=MESSAGES {
        idem_runtime::outbox::enqueue(
            &mut tx,
            TOPIC,
            &format!("ship-{n}"),
            &serde_json::json!({ "parcel": n }),
        )
        .await
        .expect("enqueue");
    }
    tx.commit().await.expect("commit the outbox");
    pool.close().await;
    // An asynchronous standby too has every row the run starts from.
    cluster.caught_up().await;
}

/// What one run measured, read on the promoted standby.
#[derive(Debug)]
struct Figures {
    /// Retrying callers' coupons deducted more than once / never.
    double: i64,
    lost: i64,
    /// Acknowledged calls whose deduction is not on the new primary.
    acked_missing: i64,
    /// Control callers' coupons never deducted.
    given_up_lost: i64,
    /// Messages whose effect is there more than once / not at all.
    msg_double: i64,
    msg_lost: i64,
    /// Outbox rows by status.
    success: i64,
    failed: i64,
    pending: i64,
    /// Relay counters.
    executed: u64,
    landed: u64,
    reclaimed: u64,
    fatal: Vec<String>,
    commit_unknown: u64,
    read_only: u64,
}

async fn failover(test: &str, replication: Replication, lease: Duration) -> Option<Figures> {
    let started = Instant::now();
    let cluster = PgStandby::start(test, replication)?;
    cluster.migrate().await;
    setup(&cluster).await;
    let setup_time = started.elapsed();

    let call_pool = cluster.pool((CALL_WORKERS + GIVE_UP_WORKERS) as u32);
    let relay_pool = cluster.pool(10);
    let relay = Relay::new(relay_pool.clone())
        .route(
            TOPIC,
            |d, s: Ship| async move { ship(d.source(), &d, &s).await },
        )
        .concurrency(6)
        .batch_size(6)
        .lease(lease)
        .poll_interval(Duration::from_millis(50))
        .backoff(Duration::from_millis(50), Duration::from_millis(500))
        .owner(format!("pgf-{test}"))
        .spawn();
    let calls = Arc::new(Calls::default());
    let callers = Workers {
        call: deduct_call(),
        pool: call_pool.clone(),
        calls: calls.clone(),
        limit: Duration::from_secs(60),
    };
    let (kill, killed_rx) = tokio::sync::watch::channel(false);
    let mut tasks = callers.spawn(CALL_WORKERS, (1..=CALLS).collect(), false, &killed_rx);
    tasks.extend(callers.spawn(
        GIVE_UP_WORKERS,
        (CALLS + 1..=CALLS + GIVE_UP_CALLS).collect(),
        true,
        &killed_rx,
    ));

    // The kill, once a third of the calls and of the messages are done.
    let total = (CALLS + GIVE_UP_CALLS) as u64;
    let at_kill = a_third_done(
        &calls,
        || relay.stats().executed(),
        (total, MESSAGES as u64),
        test,
        || cluster.log_tails(),
    )
    .await;
    cluster.kill9_primary();
    let killed = Instant::now();
    calls.fault.set(killed).expect("killed once");
    kill.send_replace(true);
    tokio::time::sleep(PROMOTE_AFTER).await;
    let standby_before = PgStandby::in_recovery(&cluster.standby_url()).await;
    let promote_time = cluster.promote().await;
    let promoted = killed.elapsed();

    for t in tasks {
        t.await.expect("a caller panicked");
    }
    let calls_done = killed.elapsed();
    let new_primary = sqlx::postgres::PgPoolOptions::new()
        .max_connections(2)
        .connect(&cluster.standby_url())
        .await
        .expect("the new primary");
    let drain_deadline = Instant::now() + Duration::from_secs(60);
    while count(
        &new_primary,
        "SELECT COUNT(*) FROM idem_outbox WHERE status = 'pending'",
    )
    .await
        > 0
    {
        assert!(
            Instant::now() < drain_deadline,
            "the outbox did not drain after the failover\n{}",
            cluster.log_tails()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let drained = killed.elapsed();
    let s = relay.stats();
    let recovered = calls
        .recovered
        .lock()
        .expect("recovered")
        .map(|t| t.saturating_duration_since(killed));
    // The relay's failed attempts, by their recorded error.
    let relay_errors: Vec<(String, i64)> = sqlx::query_as(
        "SELECT left(last_error, 48), COUNT(*) FROM idem_outbox \
         WHERE last_error IS NOT NULL GROUP BY 1 ORDER BY 1",
    )
    .fetch_all(&new_primary)
    .await
    .expect("the relay's errors");
    let relay_line = format!(
        "claimed={} reclaimed={} lost_claims={} recovered={} executed={} duplicates={} retried={} dead_lettered={} stale={} landed={}",
        s.claimed(),
        s.reclaimed(),
        s.lost_claims(),
        s.recovered(),
        s.executed(),
        s.duplicates(),
        s.retried(),
        s.dead_lettered(),
        s.stale(),
        s.landed(),
    );
    let (executed, landed, reclaimed) = (s.executed(), s.landed(), s.reclaimed());
    relay.shutdown().await;

    let acked: Vec<i64> = calls.acked.lock().expect("acked").clone();
    let Counted {
        double,
        lost,
        given_up_lost,
        acked_missing,
        msg_double,
        msg_lost,
        success,
        failed,
        pending,
    } = counted(&new_primary, 1, (CALLS, GIVE_UP_CALLS), &acked, TOPIC).await;
    let retried = calls.retried.lock().expect("retried").clone();
    let sum = |pred: &dyn Fn(&str) -> bool| -> u64 {
        retried
            .iter()
            .filter(|(k, _)| pred(k))
            .map(|(_, n)| n.0)
            .sum()
    };
    // Each kind: how many, and when (seconds after the kill).
    let timeline = timeline(&retried, killed);
    let commit_unknown = sum(&|k| k.starts_with("commit_unknown"));
    let read_only = sum(&|k| k.contains("25006"));
    let fatal = calls.fatal.lock().expect("fatal").clone();

    eprintln!(
        "pg_failover ({replication:?}): setup {setup_time:.1?}; at the kill {}/{total} calls and {}/{MESSAGES} messages done; \
         standby in recovery before promote={standby_before}; promoted {promoted:.2?} after the kill (pg_promote {promote_time:.2?}); \
         first call acknowledged {recovered:.2?}, calls done {calls_done:.2?}, outbox drained {drained:.2?} after the kill",
        at_kill.0, at_kill.1
    );
    eprintln!(
        "pg_failover ({replication:?}): calls: attempts={} acked={} retried=[{}] commit_unknown={commit_unknown} read_only_25006={read_only} fatal={}",
        calls.attempts.load(Ordering::Relaxed),
        acked.len(),
        timeline.join(", "),
        fatal.len()
    );
    eprintln!(
        "pg_failover ({replication:?}): double={double} lost={lost} acked_missing={acked_missing} | control (no retry): given_up={} lost={given_up_lost} | \
         relay: msg_double={msg_double} msg_lost={msg_lost} success={success} failed={failed} pending={pending}; {relay_line}; attempts' errors {relay_errors:?}",
        calls.given_up.load(Ordering::Relaxed),
    );
    new_primary.close().await;
    Some(Figures {
        double,
        lost,
        acked_missing,
        given_up_lost,
        msg_double,
        msg_lost,
        success,
        failed,
        pending,
        executed,
        landed,
        reclaimed,
        fatal,
        commit_unknown,
        read_only,
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn synchronous_standby_failover_loses_and_doubles_nothing() {
    let Some(f) = failover("pg_failover sync", Replication::Synchronous, LEASE).await else {
        return;
    };
    assert!(
        f.fatal.is_empty(),
        "misclassified as permanent: {:?}",
        f.fatal
    );
    assert_eq!((f.double, f.lost, f.acked_missing), (0, 0, 0), "{f:?}");
    assert_eq!((f.msg_double, f.msg_lost), (0, 0), "{f:?}");
    assert_eq!((f.success, f.failed, f.pending), (MESSAGES, 0, 0), "{f:?}");
    assert_eq!(f.reclaimed, 0, "a message waited out its lease: {f:?}");
    // Each message executed once, or landed (its commit, acknowledgement
    // lost with the primary, was on the standby).
    assert!(f.executed + f.landed >= MESSAGES as u64, "{f:?}");
    // The control: callers that take an error as final lose effects.
    assert!(f.given_up_lost > 0, "the control lost nothing: {f:?}");
    let _ = (f.commit_unknown, f.read_only);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn asynchronous_standby_failover_control() {
    let Some(f) = failover("pg_failover async", Replication::Asynchronous, ASYNC_LEASE).await
    else {
        return;
    };
    // Reported, not asserted: how many acknowledged deductions and relay
    // deliveries the asynchronous standby never received (often 0 in a
    // run; the commits of the last milliseconds before the kill).
    eprintln!(
        "pg_failover (Asynchronous): acknowledged calls missing after the promotion: {}; \
         relay deliveries executed beyond one per message: {}",
        f.acked_missing,
        f.executed.saturating_sub(MESSAGES as u64)
    );
    assert!(
        f.fatal.is_empty(),
        "misclassified as permanent: {:?}",
        f.fatal
    );
    assert_eq!((f.double, f.msg_double), (0, 0), "{f:?}");
    assert_eq!((f.failed, f.pending), (0, 0), "{f:?}");
}

/// The relay's bookkeeping through a read-only window, on the shared
/// servers: every connection of the relay's pool answers writes as a
/// standby or a read-only replica does (PostgreSQL `25006`, MariaDB
/// `1792`; set on each acquire while the window lasts) for a second,
/// opened by the handler's first attempt. The failed attempt's
/// bookkeeping is refused for the whole window; it must be retried past it
/// (the attempt put back and retried), not left to the lease. Before the
/// fix (four tries within 120 ms), the message waited out its lease and
/// was counted `reclaimed`.
macro_rules! read_only_window {
    ($module:ident, $db:ty, $dialect:expr, $pool:expr, $on:literal, $off:literal) => {
        mod $module {
            use super::*;
            use idem_runtime::Dialect;
            use idem_testkit::sql;
            use sqlx::{Executor, Pool};
            use std::sync::atomic::AtomicBool;
            type Db = $db;
            const D: Dialect = $dialect;

            #[idempotent(key = "pgf-ro:{d.topic}:{d.msg_id}", strategy = record, biz_type = "pgf_ro")]
            async fn ship(tx: &mut <$db as sqlx::Database>::Connection, d: &Delivery<Db>, s: &Ship) -> Result<i64, sqlx::Error> {
                sqlx::query(sql(D, "INSERT INTO idem_t_failover_parcel (parcel, msg_id) VALUES (?, ?)"))
                    .bind(s.parcel)
                    .bind(&d.msg_id)
                    .execute(&mut *tx)
                    .await?;
                Ok(s.parcel)
            }

            async fn scalar(pool: &Pool<Db>, q: &'static str, bind: String) -> i64 {
                sqlx::query_scalar(sql(D, q)).bind(bind).fetch_one(pool).await.expect("count")
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn bookkeeping_refused_by_a_read_only_window_is_retried_not_left_to_the_lease() {
                let Some(base): Option<Pool<Db>> = $pool else { return };
                sqlx::query("CREATE TABLE IF NOT EXISTS idem_t_failover_parcel (parcel BIGINT NOT NULL, msg_id VARCHAR(64) NOT NULL)")
                    .execute(&base)
                    .await
                    .expect("create table");
                let read_only = Arc::new(AtomicBool::new(false));
                let mode = |read_only: &AtomicBool| if read_only.load(Ordering::SeqCst) { $on } else { $off };
                let (on_connect, on_acquire) = (read_only.clone(), read_only.clone());
                let pool = sqlx::pool::PoolOptions::<Db>::new()
                    .max_connections(4)
                    .after_connect(move |conn, _| {
                        let set = mode(&on_connect);
                        Box::pin(async move {
                            conn.execute(set).await?;
                            Ok(())
                        })
                    })
                    .before_acquire(move |conn, _| {
                        let set = mode(&on_acquire);
                        Box::pin(async move {
                            conn.execute(set).await?;
                            Ok(true)
                        })
                    })
                    .connect_with((*base.connect_options()).clone())
                    .await
                    .expect("the relay's pool");
                let topic = format!("pgf.ro.{}.{}", stringify!($module), idem_testkit::ids(1));
                let parcel = idem_testkit::ids(1);
                let mut tx = <Db as idem_runtime::Backend>::begin(&base).await.expect("begin");
                idem_runtime::outbox::enqueue(&mut tx, &topic, "ro-1", &serde_json::json!({ "parcel": parcel }))
                    .await
                    .expect("enqueue");
                tx.commit().await.expect("commit");

                let first = Arc::new(AtomicBool::new(true));
                let relay = Relay::new(pool.clone())
                    .route(topic.clone(), {
                        let (read_only, first) = (read_only.clone(), first.clone());
                        move |d, s: Ship| {
                            if first.swap(false, Ordering::SeqCst) {
                                // The window opens under the first attempt.
                                read_only.store(true, Ordering::SeqCst);
                                let read_only = read_only.clone();
                                tokio::spawn(async move {
                                    tokio::time::sleep(Duration::from_secs(1)).await;
                                    read_only.store(false, Ordering::SeqCst);
                                });
                            }
                            async move { ship(d.source(), &d, &s).await }
                        }
                    })
                    // Long enough for the window, short enough that the
                    // broken version's wait for it is seconds, not a minute.
                    .lease(Duration::from_secs(8))
                    .poll_interval(Duration::from_millis(20))
                    .backoff(Duration::from_millis(20), Duration::from_millis(50))
                    .spawn();
                let pending = "SELECT COUNT(*) FROM idem_outbox WHERE topic = ? AND status = 'pending'";
                let deadline = Instant::now() + Duration::from_secs(30);
                while scalar(&base, pending, topic.clone()).await > 0 {
                    assert!(Instant::now() < deadline, "the message was never delivered");
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                let s = relay.stats();
                let (retried, reclaimed, executed) = (
                    s.retried(),
                    s.reclaimed(),
                    s.executed(),
                );
                relay.shutdown().await;
                let (status, attempts, last_error): (String, i32, Option<String>) =
                    sqlx::query_as(sql(D, "SELECT status, attempts, last_error FROM idem_outbox WHERE topic = ?"))
                        .bind(&topic)
                        .fetch_one(&base)
                        .await
                        .expect("the message");
                let effects: i64 = sqlx::query_scalar(sql(D, "SELECT COUNT(*) FROM idem_t_failover_parcel WHERE parcel = ?"))
                    .bind(parcel)
                    .fetch_one(&base)
                    .await
                    .expect("count");
                eprintln!(
                    "read-only window ({}): status={status} attempts={attempts} retried={retried} reclaimed={reclaimed} executed={executed} effects={effects} last_error={last_error:?}",
                    stringify!($module)
                );
                assert_eq!((status.as_str(), effects), ("success", 1));
                assert_eq!(reclaimed, 0, "the failed attempt was left to its lease");
                assert_eq!((retried, attempts), (1, 2), "put back once, then delivered");
                let last_error = last_error.unwrap_or_default().to_lowercase();
                assert!(last_error.contains("read-only") || last_error.contains("read only"), "{last_error}");
            }
        }
    };
}

idem_testkit::for_each_backend!(read_only_window;
    postgres(2) => (
        "SET default_transaction_read_only = on",
        "SET default_transaction_read_only = off"
    ),
    mariadb(2) => (
        "SET SESSION TRANSACTION READ ONLY",
        "SET SESSION TRANSACTION READ WRITE"
    ),
);
