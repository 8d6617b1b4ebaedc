//! A consumer process killed (SIGKILL) mid-run, on PostgreSQL. It runs
//! the two handlers with eight entries in flight; the first ten entries'
//! handlers return and are acknowledged, every later one blocks after its
//! commit (`Hold`), so that at the kill the process holds eight entries
//! committed but not acknowledged: forced, not timed. A survivor started
//! after the kill claims them with `XAUTOCLAIM` once idle for a second,
//! answers `Duplicate` for each, and handles the rest: every coupon used
//! and awarded once. The control runs the same scenario with a handler
//! without idem (the same consumer, the check removed): the claimed
//! entries act twice.

use crate::common::hooks;
use crate::common::redis_streams::*;
use std::process::{Child, Command};

const CONSUMER: &str = env!("CARGO_BIN_EXE_redis_streams_consumer");
/// Entries the killed process acknowledges before it holds the rest.
const HOLD_AFTER: usize = 10;
/// Entries in flight in the killed process: held at the kill.
const IN_FLIGHT: usize = 8;

/// Killed on drop, also when the test fails.
struct Process(Child);

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

async fn awards_by(pool: &AnyPool, d: Dialect, owner: &str, coupons: &[i64]) -> i64 {
    sqlx::query_scalar(sql(
        d,
        "SELECT COUNT(*) FROM idem_rs_award WHERE owner = ? AND coupon_id BETWEEN ? AND ?",
    ))
    .bind(owner)
    .bind(coupons[0])
    .bind(coupons[coupons.len() - 1])
    .fetch_one(pool)
    .await
    .expect("awards")
}

/// What a run came to.
#[derive(Debug)]
struct Run {
    entries: usize,
    /// Coupons the killed process applied (committed).
    applied_by_killed: i64,
    /// Entries the killed process held pending at the kill.
    pending_at_kill: i64,
    /// Entries the survivor claimed.
    claimed: u64,
    /// Entries the survivor answered `Duplicate`.
    duplicates: u64,
    doubled: usize,
    lost: usize,
}

async fn killed(plain: bool) -> Option<Run> {
    let client = shared_redis().await?;
    let (pool, d) = database("postgres").await?;
    let stream = unique(if plain {
        "idem_rs_kill_plain"
    } else {
        "idem_rs_kill"
    });
    let group = "effects";
    let coupons = coupons(&pool, d, 60).await;
    publish(&Publisher::new(client.clone()), &stream, &coupons, 1, |c| {
        Use {
            coupon_id: c,
            ..Use::default()
        }
    })
    .await;
    let mut process = Command::new(CONSUMER);
    process.args([
        idem_testkit::redis_url().as_str(),
        stream.as_str(),
        group,
        idem_testkit::postgres_url().as_str(),
        "killed",
        &HOLD_AFTER.to_string(),
    ]);
    if plain {
        process.arg("plain");
    }
    let mut consumer = Process(process.spawn().expect("start the consumer process"));
    // Forced: the first ten acknowledged, then eight committed and held.
    let held = (HOLD_AFTER + IN_FLIGHT) as i64;
    wait_for(
        "the process holding eight committed entries",
        Duration::from_secs(60),
        || {
            let (pool, coupons, client, stream) = (&pool, &coupons, &client, &stream);
            async move {
                awards_by(pool, d, "killed", coupons).await >= held
                    && pending(client, stream, group).await >= IN_FLIGHT as i64
            }
        },
    )
    .await;
    consumer.0.kill().expect("SIGKILL");
    consumer.0.wait().expect("reaped");
    let applied_by_killed = awards_by(&pool, d, "killed", &coupons).await;
    let pending_at_kill = pending(&client, &stream, group).await;
    let survivor =
        kill_scenario_consumer(&client, &stream, group, &pool, d, "survivor", plain, None)
            .spawn()
            .await
            .expect("survivor");
    wait_for("every entry handled", Duration::from_secs(60), || {
        let (pool, coupons, client, stream) = (&pool, &coupons, &client, &stream);
        async move {
            done(pool, d, coupons).await == coupons.len()
                && pending(client, stream, group).await == 0
        }
    })
    .await;
    let c = counts(&survivor);
    let claimed = survivor.claimed();
    survivor.shutdown().await.expect("clean shutdown");
    delete(&client, &[&stream, &format!("{stream}:dlq")]).await;
    let (doubled, lost) = doubled_and_lost(&pool, d, &coupons).await;
    let run = Run {
        entries: coupons.len(),
        applied_by_killed,
        pending_at_kill,
        claimed,
        duplicates: c.2,
        doubled,
        lost,
    };
    eprintln!(
        "redis streams, consumer killed{}: {run:?}; survivor (received, executed, duplicates, retried, dead, settle_failed) = {c:?}",
        if plain { " (control, no idem)" } else { "" }
    );
    Some(run)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_consumer_s_entries_are_claimed_and_answered_duplicate() {
    let _one = hooks::shared().await;
    let _servers = hooks::own_servers().await;
    let Some(r) = killed(false).await else {
        return;
    };
    assert_eq!((r.doubled, r.lost), (0, 0), "(doubled, lost): {r:?}");
    assert!(r.pending_at_kill >= IN_FLIGHT as i64, "{r:?}");
    assert!(
        r.applied_by_killed >= (HOLD_AFTER + IN_FLIGHT) as i64,
        "{r:?}"
    );
    assert!(r.claimed as usize <= r.entries, "{r:?}");
    assert!(
        r.claimed >= IN_FLIGHT as u64,
        "the held entries claimed: {r:?}"
    );
    assert_eq!(
        r.duplicates, r.claimed,
        "every claimed entry had committed: answered Duplicate: {r:?}"
    );
}

/// The control: the same kill without idem acts twice on the claimed
/// entries (the scenario catches a naive consumer).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn control_without_idem_the_claimed_entries_act_twice() {
    let _one = hooks::shared().await;
    let _servers = hooks::own_servers().await;
    let Some(r) = killed(true).await else {
        return;
    };
    assert!(r.doubled > 0, "doubled effects without idem: {r:?}");
    assert_eq!(r.doubled as u64, r.claimed, "{r:?}");
    assert_eq!(r.lost, 0, "{r:?}");
}
