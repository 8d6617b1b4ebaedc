//! Relay processes, for real: three relay processes on one database never
//! run the same message at the same time (asserted on a per-message
//! execution log), and a relay process killed with SIGKILL in the middle of
//! a run loses nothing once another one takes over its leases. Effects are
//! counted in the database: no double deduction, no lost one.

use idem_runtime::Backend;
use idem_runtime::Dialect;
use idem_testkit::{ids, sql};
use sqlx::{Any, AnyPool};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

const WORKER: &str = env!("CARGO_BIN_EXE_relay_worker");

async fn setup(pool: &AnyPool) -> Dialect {
    let d = <Any as Backend>::pool_dialect(pool);
    let mut tx = pool.begin().await.expect("begin");
    if d == Dialect::Postgres {
        sqlx::query("SELECT pg_advisory_xact_lock(77004)")
            .execute(&mut *tx)
            .await
            .expect("lock");
    }
    for stmt in [
        "CREATE TABLE IF NOT EXISTS idem_p_coupon (id BIGINT PRIMARY KEY, status VARCHAR(16) NOT NULL)",
        "CREATE TABLE IF NOT EXISTS idem_p_deduction (coupon_id BIGINT NOT NULL, order_id BIGINT NOT NULL)",
        "CREATE TABLE IF NOT EXISTS idem_p_exec_log (msg_id BIGINT NOT NULL, owner VARCHAR(64) NOT NULL, started_us BIGINT NOT NULL, ended_us BIGINT NOT NULL)",
    ] {
        sqlx::query(stmt)
            .execute(&mut *tx)
            .await
            .expect("create table");
    }
    tx.commit().await.expect("commit");
    d
}

/// `n` coupons, each with its deduction message, in one transaction.
async fn produce(pool: &AnyPool, d: Dialect, topic: &str, n: usize) -> Vec<i64> {
    let first = ids(n as i64);
    let mut tx = pool.begin().await.expect("begin");
    let mut coupons = Vec::with_capacity(n);
    for c in first..first + n as i64 {
        sqlx::query(sql(
            d,
            "INSERT INTO idem_p_coupon (id, status) VALUES (?, 'UNUSED')",
        ))
        .bind(c)
        .execute(&mut *tx)
        .await
        .expect("coupon");
        let payload = serde_json::json!({"coupon_id": c, "order_id": c + 1});
        let msg = idem_runtime::outbox::enqueue(&mut tx, topic, &format!("m-{c}"), &payload)
            .await
            .expect("enqueue");
        assert!(msg.is_new());
        coupons.push(c);
    }
    tx.commit().await.expect("commit");
    coupons
}

fn spawn_worker(
    url: &str,
    topic: &str,
    owner: &str,
    lease_ms: u64,
    sleep_ms: u64,
    idle_exit_ms: u64,
) -> Child {
    spawn_worker_batched(url, topic, owner, lease_ms, sleep_ms, idle_exit_ms, 1, None)
}

/// A relay worker with batched commits of `commit_batch` messages (1: off),
/// appending its protocol events to `trace` if given.
#[allow(clippy::too_many_arguments)]
fn spawn_worker_batched(
    url: &str,
    topic: &str,
    owner: &str,
    lease_ms: u64,
    sleep_ms: u64,
    idle_exit_ms: u64,
    commit_batch: usize,
    trace: Option<&std::path::Path>,
) -> Child {
    let mut worker = Command::new(WORKER);
    if let Some(path) = trace {
        worker.env("IDEM_TRACE_FILE", path);
    }
    worker
        .env("RELAY_COMMIT_BATCH", commit_batch.to_string())
        .args([
            url,
            topic,
            owner,
            &lease_ms.to_string(),
            &sleep_ms.to_string(),
            &idle_exit_ms.to_string(),
        ])
        .spawn()
        .expect("start relay_worker")
}

async fn wait_exit(mut children: Vec<Child>, limit: Duration) {
    let start = Instant::now();
    while !children.is_empty() {
        children.retain_mut(|c| c.try_wait().expect("wait").is_none());
        if start.elapsed() > limit {
            for c in &mut children {
                let _ = c.kill();
            }
            panic!("relay workers did not finish within {limit:?}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn count(pool: &AnyPool, d: Dialect, q: &'static str, topic: &str) -> i64 {
    sqlx::query_scalar(sql(d, q))
        .bind(topic)
        .fetch_one(pool)
        .await
        .expect("count")
}

/// Double and lost deductions among `coupons`, counted in the database.
async fn double_and_lost(pool: &AnyPool, d: Dialect, coupons: &[i64]) -> (usize, usize) {
    let (mut double, mut lost) = (0, 0);
    for c in coupons {
        let n: i64 = sqlx::query_scalar(sql(
            d,
            "SELECT COUNT(*) FROM idem_p_deduction WHERE coupon_id = ?",
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

/// Runs of one message that overlap in time, from the execution log.
async fn overlapping_runs(pool: &AnyPool, d: Dialect, topic: &str) -> usize {
    let rows: Vec<(i64, i64, i64)> = sqlx::query_as(sql(
        d,
        "SELECT l.msg_id, l.started_us, l.ended_us FROM idem_p_exec_log l \
         JOIN idem_outbox o ON o.id = l.msg_id WHERE o.topic = ? ORDER BY l.msg_id, l.started_us",
    ))
    .bind(topic)
    .fetch_all(pool)
    .await
    .expect("log");
    rows.windows(2)
        .filter(|w| w[0].0 == w[1].0 && w[1].1 < w[0].2)
        .count()
}

async fn three_relays(
    url: &str,
    lease_ms: u64,
    sleep_ms: u64,
) -> Option<(usize, usize, usize, i64)> {
    let pool = idem_testkit::any(url, 4).await?;
    let d = setup(&pool).await;
    let topic = format!("proc.three.{}", ids(1));
    let coupons = produce(&pool, d, &topic, 240).await;
    let workers = (0..3)
        .map(|i| {
            spawn_worker(
                url,
                &topic,
                &format!("w{i}-{}", ids(1)),
                lease_ms,
                sleep_ms,
                800,
            )
        })
        .collect();
    wait_exit(workers, Duration::from_secs(120)).await;
    let overlaps = overlapping_runs(&pool, d, &topic).await;
    let (double, lost) = double_and_lost(&pool, d, &coupons).await;
    let owners: i64 = count(
        &pool,
        d,
        "SELECT COUNT(DISTINCT l.owner) FROM idem_p_exec_log l JOIN idem_outbox o ON o.id = l.msg_id WHERE o.topic = ?",
        &topic,
    )
    .await;
    assert_eq!(
        count(
            &pool,
            d,
            "SELECT COUNT(*) FROM idem_outbox WHERE topic = ? AND status = 'success'",
            &topic
        )
        .await,
        240
    );
    Some((overlaps, double, lost, owners))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_relay_processes_never_run_a_message_twice_at_once() {
    let Some((overlaps, double, lost, owners)) =
        three_relays(&idem_testkit::postgres_url(), 30_000, 5).await
    else {
        return;
    };
    assert_eq!(
        overlaps, 0,
        "a message ran in two processes at the same time"
    );
    assert_eq!((double, lost), (0, 0));
    assert_eq!(owners, 3, "all three processes took a share of the work");
}

/// Control: with a lease far shorter than the handler, the lease runs out
/// while the handler still runs, so another process runs the same message
/// at the same time — and the execution-log check sees it. (The
/// deductions stay single: the handlers are idempotent.)
///
/// The overlap is forced, not left to a race: the first process holds
/// each message's first run until another process has settled the message
/// (`RELAY_HOLD_FIRST_RUN`), and the two others start only once it has
/// claimed. They never hold a run, so the drain always ends. (Three
/// processes whose runs all outlive a 1 ms lease can take each message
/// from one another forever: one such CI run was still draining after
/// 120 s.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn control_expired_leases_let_processes_overlap_and_the_log_shows_it() {
    let url = idem_testkit::postgres_url();
    let Some(pool) = idem_testkit::any(&url, 4).await else {
        return;
    };
    let d = setup(&pool).await;
    let topic = format!("proc.overlap.{}", ids(1));
    let n = 60;
    let coupons = produce(&pool, d, &topic, n).await;
    let mut slow = Command::new(WORKER);
    slow.env("RELAY_HOLD_FIRST_RUN", "1").args([
        url.as_str(),
        &topic,
        &format!("slow-{}", ids(1)),
        "1",
        "0",
        "800",
    ]);
    let mut workers = vec![slow.spawn().expect("start relay_worker")];
    let claimed = "SELECT COUNT(*) FROM idem_outbox WHERE topic = ? AND attempts > 0";
    let start = Instant::now();
    while count(&pool, d, claimed, &topic).await == 0 {
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "the holding process claimed nothing"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // Its held runs wait for the others however long they take to start:
    // a margin for its handlers to begin first costs nothing.
    tokio::time::sleep(Duration::from_millis(200)).await;
    for i in 0..2 {
        workers.push(spawn_worker(
            &url,
            &topic,
            &format!("fast{i}-{}", ids(1)),
            1,
            0,
            800,
        ));
    }
    wait_exit(workers, Duration::from_secs(120)).await;
    let overlaps = overlapping_runs(&pool, d, &topic).await;
    let (double, lost) = double_and_lost(&pool, d, &coupons).await;
    let success = "SELECT COUNT(*) FROM idem_outbox WHERE topic = ? AND status = 'success'";
    assert_eq!(count(&pool, d, success, &topic).await, n as i64);
    eprintln!("expired leases: {overlaps} overlapping runs of {n} messages");
    assert!(
        overlaps > 0,
        "the overlap check must catch concurrent runs of one message"
    );
    assert_eq!(
        (double, lost),
        (0, 0),
        "idempotency still holds the effect to one"
    );
}

async fn kill_mid_run_then_restart(url: &str) {
    kill_mid_run_then_restart_batched(url, 1).await;
}

/// SIGKILLs a relay worker mid-run (with batched commits of
/// `commit_batch` messages: mid-batch), restarts one, and counts.
async fn kill_mid_run_then_restart_batched(url: &str, commit_batch: usize) {
    let Some(pool) = idem_testkit::any(url, 4).await else {
        return;
    };
    let d = setup(&pool).await;
    let topic = format!("proc.kill.{}", ids(1));
    let coupons = produce(&pool, d, &topic, 150).await;
    // Both processes' protocol events, for the conformance check; the
    // victim's survive its SIGKILL (one write per event).
    let trace = Trace(std::env::temp_dir().join(format!("idem-trace-{}.jsonl", ids(1))));
    let success = "SELECT COUNT(*) FROM idem_outbox WHERE topic = ? AND status = 'success'";
    let mut a = spawn_worker_batched(
        url,
        &topic,
        &format!("victim-{}", ids(1)),
        1_500,
        15,
        60_000,
        commit_batch,
        Some(&trace.0),
    );
    let start = Instant::now();
    while count(&pool, d, success, &topic).await < 20 {
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "worker A made no progress"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    a.kill().expect("SIGKILL"); // Child::kill is SIGKILL on Unix: no shutdown, leases held.
    a.wait().expect("reap");
    let done_by_a = count(&pool, d, success, &topic).await;
    assert!(done_by_a < 150, "A was killed in the middle of the run");
    let b = spawn_worker_batched(
        url,
        &topic,
        &format!("restart-{}", ids(1)),
        1_500,
        0,
        2_000,
        commit_batch,
        Some(&trace.0),
    );
    wait_exit(vec![b], Duration::from_secs(120)).await;
    assert_eq!(
        count(&pool, d, success, &topic).await,
        150,
        "every message delivered"
    );
    let (double, lost) = double_and_lost(&pool, d, &coupons).await;
    eprintln!(
        "{d:?}: SIGKILL mid-run (commit_batch={commit_batch}): done_by_victim={done_by_a} double={double} lost={lost}"
    );
    assert_eq!((double, lost), (0, 0), "no double, no lost deduction");
    // The model checks both processes' trace, the victim's cut short.
    let mut events = idem_runtime::testing::trace::read_file(&trace.0, &topic).expect("trace");
    idem_runtime::testing::trace::sort(&mut events);
    let events = idem_model::trace::Event::from_values(&events).unwrap_or_else(|e| panic!("{e}"));
    let ids: Vec<i64> = sqlx::query_scalar(sql(d, "SELECT id FROM idem_outbox WHERE topic = ?"))
        .bind(&topic)
        .fetch_all(&pool)
        .await
        .expect("ids");
    let config = idem_model::trace::TraceConfig {
        max_attempts: 10,
        messages: Some(ids),
        complete: true,
        killed: true,
    };
    match idem_model::trace::check(&events, &config) {
        Ok(report) => {
            eprintln!("{d:?}: SIGKILL mid-run (commit_batch={commit_batch}) conforms: {report:?}")
        }
        Err(v) => panic!("the model refuses the trace: {v}"),
    }
}

/// A trace file, removed when dropped (also on a failed assertion).
struct Trace(std::path::PathBuf);

impl Drop for Trace {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_relay_killed_mid_run_loses_nothing() {
    kill_mid_run_then_restart(&idem_testkit::postgres_url()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_relay_killed_mid_run_loses_nothing() {
    kill_mid_run_then_restart(&idem_testkit::mysql_url()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_relay_killed_mid_run_loses_nothing() {
    kill_mid_run_then_restart(&idem_testkit::sqlite_url()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_batched_relay_killed_mid_batch_loses_nothing() {
    kill_mid_run_then_restart_batched(&idem_testkit::postgres_url(), 16).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_batched_relay_killed_mid_batch_loses_nothing() {
    kill_mid_run_then_restart_batched(&idem_testkit::mysql_url(), 16).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_batched_relay_killed_mid_batch_loses_nothing() {
    kill_mid_run_then_restart_batched(&idem_testkit::sqlite_url(), 16).await;
}
